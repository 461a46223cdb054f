/*
 * exec_puller.c - the pulling thread of cachew_iterator_next_timeout
 * (exec_puller.h says why and what it guarantees).
 *
 * States, under p->lock: idle (!requested); pulling (requested, !ready:
 * the thread owns p->chunk and runs the pull unlocked); done (requested,
 * ready: the result waits for a caller, who swaps the chunk out and makes
 * it idle). A hand-off costs a wake-up (5-50 us here) per pull, not per
 * element: the iterator asks for up to 256 elements per pull while pulls
 * are cheap (exec_iter.c).
 */
#include "exec_puller.h"

#include <stdlib.h>

struct cwi_puller {
	pthread_mutex_t lock;
	pthread_cond_t work; /* the thread waits for a request or stop */
	pthread_cond_t done; /* callers wait for a result or cancel */
	pthread_t thread;
	cwi_pull_fn fn;
	void *arg;
	bool requested, ready, stop, canceled;
	cwi_chunk chunk; /* the pull's elements */
	cachew_err result;
};

static void *
puller_main(void *arg)
{
	cwi_puller *p = arg;
	cachew_err rv;

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		if (!p->requested || p->ready) {
			pthread_cond_wait(&p->work, &p->lock);
			continue;
		}
		pthread_mutex_unlock(&p->lock);
		rv = p->fn(p->arg, &p->chunk);
		pthread_mutex_lock(&p->lock);
		p->result = rv;
		p->ready = true;
		pthread_cond_broadcast(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

cachew_err
cwi_puller_create(cwi_puller **out, cwi_pull_fn fn, void *arg)
{
	cwi_puller *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "iterator: out of memory");
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work, NULL);
	cwi_cond_init_monotonic(&p->done);
	p->fn = fn;
	p->arg = arg;
	if (pthread_create(&p->thread, NULL, puller_main, p) != 0) {
		pthread_cond_destroy(&p->done);
		pthread_cond_destroy(&p->work);
		pthread_mutex_destroy(&p->lock);
		free(p);
		return cwi_fail(CACHEW_ENOMEM,
		    "iterator: cannot start the thread that waits with a "
		    "timeout");
	}
	*out = p;
	return CACHEW_OK;
}

cachew_err
cwi_puller_wait(cwi_puller *p, uint64_t timeout_ns, cwi_chunk *got,
    cachew_err *result)
{
	uint64_t deadline = timeout_ns == UINT64_MAX ? UINT64_MAX
						     : cwi_now_ns() + timeout_ns;
	cwi_chunk swap;

	pthread_mutex_lock(&p->lock);
	if (!p->requested && !p->canceled) {
		p->requested = true;
		pthread_cond_signal(&p->work);
	}
	while (!p->ready && !p->canceled) {
		uint64_t now;

		if (deadline == UINT64_MAX) {
			pthread_cond_wait(&p->done, &p->lock);
			continue;
		}
		now = cwi_now_ns();
		if (now >= deadline)
			break;
		(void)cwi_cond_wait_ns(&p->done, &p->lock, deadline - now);
	}
	if (p->canceled) {
		pthread_mutex_unlock(&p->lock);
		return CACHEW_ECANCELED;
	}
	if (!p->ready) {
		pthread_mutex_unlock(&p->lock);
		return CACHEW_ETIMEDOUT;
	}
	swap = *got;
	*got = p->chunk;
	p->chunk = swap;
	p->chunk.n = 0;
	*result = p->result;
	p->ready = false;
	p->requested = false;
	pthread_mutex_unlock(&p->lock);
	return CACHEW_OK;
}

bool
cwi_puller_pending(cwi_puller *p)
{
	bool pending;

	pthread_mutex_lock(&p->lock);
	pending = p->requested;
	pthread_mutex_unlock(&p->lock);
	return pending;
}

void
cwi_puller_cancel(cwi_puller *p)
{
	pthread_mutex_lock(&p->lock);
	p->canceled = true;
	pthread_cond_broadcast(&p->done);
	pthread_mutex_unlock(&p->lock);
}

void
cwi_puller_destroy(cwi_puller *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_signal(&p->work);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	/* A result nobody took: its elements are still ours. */
	cwi_chunk_free(&p->chunk);
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->work);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
