/*
 * exec_tune.c - budgets, crews, chunk sizing and autotuning shared by the
 * threaded operators (parallel map, prefetch, parallel interleave).
 *
 * Autotuning algorithm. There is no tuner thread: each auto operator's
 * consumer checks, from its next(), whether CWI_TUNE_INTERVAL_NS (30 ms)
 * has passed (one clock read), and if so looks at the interval's counters:
 *
 *   parallel=auto (map, interleave): wait = fraction of the interval the
 *   consumer spent blocked on the operator; util = workers' busy time /
 *   (interval x workers).
 *     - wait > 5 % and util > 60 %: the workers are the bottleneck: take
 *       one thread from the pipeline's budget (if any is left) and add a
 *       worker.
 *     - wait < 1 % and util < 40 % with more than one worker: the workers
 *       idle on a full output buffer (or on a slow input): give one back.
 *     - an operator that holds no thread at all (the budget went to other
 *       auto operators) works inline in its consumer and asks for a
 *       thread at every interval.
 *   The first next() starts one worker. The sum of the threads of all
 *   auto operators never exceeds the `threads` option; explicit
 *   parallel=N takes N threads outside that budget.
 *
 *   prefetch(auto): the buffer starts at two chunks. If in an interval the
 *   consumer waited more than 2 % of the time while the buffer had been
 *   full at some point, the producer is bursty rather than slow, and a
 *   larger buffer absorbs the bursts: the buffer doubles, up to 64 chunks
 *   and half of the RAM budget (tf.data's prefetch autotuner doubles on
 *   the same full-then-empty signal). It never shrinks.
 *
 *   With the `autotune` option off, parallel=auto means one thread per
 *   budget thread still free when the operator starts, and prefetch(auto)
 *   a buffer of two chunks.
 *
 *   RAM: every buffer accounts the bytes of the elements it holds in the
 *   pipeline's total; producers stop adding chunks while the total is over
 *   `ram_budget`, except into an empty buffer (progress over precision).
 *
 * Chunk sizing: producers measure the time per element (input pull plus
 * the function) as a moving average and size chunks to ~500 us of work,
 * between 1 and 1024 elements: an expensive function (spin_us(1000)) is
 * spread one element at a time, a cheap one (add) amortises each hand-off
 * over 1024. Below ~200 ns per element no chunk size helps: an element
 * allocated on one thread and freed on another costs 50-130 ns in glibc's
 * allocator alone (measured: 11 ns on one thread), so parallel map runs
 * such chunks on its consumer thread (same order, same seeds) until the
 * cost rises above ~400 ns.
 *
 * Lock order: tuners_lock, then an operator's lock (the cancellation
 * wake-up). Operators never call into the registry while holding their
 * own locks.
 */
#include "exec_tune.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- registry ----------------------------------------------------------- */

/*
 * The tuner of one pipeline (pl->tuner), created by its first threaded
 * operator and freed with its last. tuners_lock guards every tuner.
 */
struct cwi_tuner {
	cwi_pipeline *pl;
	unsigned refs;
	int threads_free;
	int64_t ram_budget;
	_Atomic int64_t bytes;
	cwi_tune_op *ops;
};

static pthread_mutex_t tuners_lock = PTHREAD_MUTEX_INITIALIZER;

cachew_err
cwi_tune_attach(cwi_tune_op *op, cwi_pipeline *pl, void (*wake)(void *arg),
    void *arg)
{
	cwi_tuner *t;

	pthread_mutex_lock(&tuners_lock);
	t = pl->tuner;
	if (t == NULL) {
		t = calloc(1, sizeof(*t));
		if (t == NULL) {
			pthread_mutex_unlock(&tuners_lock);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		t->pl = pl;
		t->threads_free = pl->opts.threads > 0
				      ? (int)(pl->opts.threads > 4096
						  ? 4096
						  : pl->opts.threads)
				      : 1;
		t->ram_budget = pl->opts.ram_budget > 0 ? pl->opts.ram_budget
							: INT64_MAX;
		atomic_init(&t->bytes, 0);
		pl->tuner = t;
	}
	t->refs++;
	op->tuner = t;
	op->wake = wake;
	op->arg = arg;
	op->threads = 0;
	atomic_init(&op->bytes, 0);
	op->next = t->ops;
	t->ops = op;
	pthread_mutex_unlock(&tuners_lock);
	return CACHEW_OK;
}

void
cwi_tune_detach(cwi_tune_op *op)
{
	cwi_tuner *t = op->tuner;

	if (t == NULL)
		return;
	pthread_mutex_lock(&tuners_lock);
	for (cwi_tune_op **p = &t->ops; *p != NULL; p = &(*p)->next) {
		if (*p == op) {
			*p = op->next;
			break;
		}
	}
	t->threads_free += op->threads;
	op->threads = 0;
	atomic_fetch_sub(&t->bytes, atomic_load(&op->bytes));
	if (--t->refs == 0) {
		t->pl->tuner = NULL;
		free(t);
	}
	op->tuner = NULL;
	pthread_mutex_unlock(&tuners_lock);
}

int
cwi_tune_take_threads(cwi_tune_op *op, int n)
{
	int got;

	pthread_mutex_lock(&tuners_lock);
	got = n < op->tuner->threads_free ? n : op->tuner->threads_free;
	if (got < 0)
		got = 0;
	op->tuner->threads_free -= got;
	op->threads += got;
	pthread_mutex_unlock(&tuners_lock);
	return got;
}

void
cwi_tune_give_threads(cwi_tune_op *op, int n)
{
	pthread_mutex_lock(&tuners_lock);
	if (n > op->threads)
		n = op->threads;
	op->threads -= n;
	op->tuner->threads_free += n;
	pthread_mutex_unlock(&tuners_lock);
}

void
cwi_tune_bytes_add(cwi_tune_op *op, int64_t delta)
{
	atomic_fetch_add_explicit(&op->bytes, delta, memory_order_relaxed);
	atomic_fetch_add_explicit(&op->tuner->bytes, delta, memory_order_relaxed);
}

bool
cwi_tune_bytes_ok(const cwi_tune_op *op)
{
	return atomic_load_explicit(&op->tuner->bytes, memory_order_relaxed) <
	    op->tuner->ram_budget;
}

int64_t
cwi_tune_ram_budget(const cwi_tune_op *op)
{
	return op->tuner->ram_budget;
}

void
cwi_tune_cancel(cwi_pipeline *pl)
{
	cwi_tuner *t;

	if (!cwi_pipeline_cancelled(pl))
		return;
	pthread_mutex_lock(&tuners_lock);
	t = pl->tuner;
	for (cwi_tune_op *op = t != NULL ? t->ops : NULL; op != NULL;
	     op = op->next)
		op->wake(op->arg);
	pthread_mutex_unlock(&tuners_lock);
}

/* ---- locks ---------------------------------------------------------------- */

void
cwi_mutex_init(pthread_mutex_t *mu)
{
	pthread_mutexattr_t attr;

	pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
	pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
	pthread_mutex_init(mu, &attr);
	pthread_mutexattr_destroy(&attr);
}

/* ---- crews ---------------------------------------------------------------- */

cachew_err
cwi_crew_init(cwi_crew *c, int cap)
{
	memset(c, 0, sizeof(*c));
	if (cap < 1)
		cap = 1;
	c->members = calloc((size_t)cap, sizeof(*c->members));
	if (c->members == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->cap = cap;
	return CACHEW_OK;
}

cachew_err
cwi_crew_set(cwi_crew *c, int n, void *(*main)(void *), void *op)
{
	if (n > c->cap)
		n = c->cap;
	if (n < 0)
		n = 0;
	/* Members read `active` under the operator's lock, which the caller
	 * holds: set it before a new member can look. */
	c->active = n;
	while (c->spawned < n) {
		cwi_crew_member *m = &c->members[c->spawned];
		m->op = op;
		m->id = c->spawned;
		if (pthread_create(&m->tid, NULL, main, m) != 0)
			break;
		c->spawned++;
	}
	if (c->active > c->spawned)
		c->active = c->spawned;
	if (n > 0 && c->active == 0)
		return cwi_fail(CACHEW_ENOMEM, "cannot start a thread");
	return CACHEW_OK;
}

void
cwi_crew_join(cwi_crew *c)
{
	for (int i = 0; i < c->spawned; i++)
		pthread_join(c->members[i].tid, NULL);
	c->spawned = 0;
	c->active = 0;
}

void
cwi_crew_free(cwi_crew *c)
{
	free(c->members);
	c->members = NULL;
	c->cap = 0;
}

/* ---- chunk sizing -------------------------------------------------------------- */

void
cwi_sizer_init(cwi_sizer *s, double hint_ns)
{
	uint64_t c = 0;
	if (hint_ns > 0 && hint_ns < 1e12)
		c = (uint64_t)(hint_ns * 256.0);
	atomic_init(&s->cost, c);
}

void
cwi_sizer_update(cwi_sizer *s, size_t n, uint64_t ns)
{
	uint64_t sample, old, cost;

	if (n == 0)
		return;
	sample = ns >= UINT64_MAX / 256 ? UINT64_MAX / 4 : ns * 256 / n;
	if (sample == 0)
		sample = 1;
	old = atomic_load_explicit(&s->cost, memory_order_relaxed);
	/* A lost update between workers only delays the average. */
	cost = old == 0 ? sample : old - old / 4 + sample / 4;
	atomic_store_explicit(&s->cost, cost, memory_order_relaxed);
}

size_t
cwi_sizer_chunk(const cwi_sizer *s)
{
	uint64_t c = atomic_load_explicit(&s->cost, memory_order_relaxed);
	uint64_t k;

	if (c == 0)
		return 1; /* measure one element before committing to more */
	k = (uint64_t)CWI_CHUNK_TARGET_NS * 256 / c;
	if (k < 1)
		k = 1;
	if (k > CWI_CHUNK_MAX)
		k = CWI_CHUNK_MAX;
	return (size_t)k;
}

bool
cwi_sizer_inline(const cwi_sizer *s, bool now_inline)
{
	uint64_t c = atomic_load_explicit(&s->cost, memory_order_relaxed);

	if (c == 0)
		return now_inline;
	if (now_inline)
		return c <= (uint64_t)CWI_INLINE_ABOVE_NS * 256;
	return c < (uint64_t)CWI_INLINE_BELOW_NS * 256;
}

/* ---- rules ------------------------------------------------------------------------ */

int
cwi_tune_workers_rule(const cwi_tune_sample *s)
{
	double wait, util;

	if (s->interval_ns == 0)
		return 0;
	if (s->workers <= 0)
		return 1;
	wait = (double)s->wait_ns / (double)s->interval_ns;
	util = (double)s->busy_ns / ((double)s->interval_ns * s->workers);
	if (wait > 0.05 && util > 0.6)
		return 1;
	if (wait < 0.01 && util < 0.4 && s->workers > 1)
		return -1;
	return 0;
}

bool
cwi_tune_buffer_rule(const cwi_tune_buffer_sample *s)
{
	if (s->interval_ns == 0)
		return false;
	return s->was_full && (double)s->wait_ns > 0.02 * (double)s->interval_ns;
}

bool
cwi_tune_clock_due(cwi_tune_clock *c, uint64_t now, uint64_t wait_ns,
    uint64_t busy_ns, uint64_t *dt, uint64_t *dwait, uint64_t *dbusy)
{
	if (now - c->t0 < CWI_TUNE_INTERVAL_NS)
		return false;
	*dt = now - c->t0;
	*dwait = wait_ns - c->wait0;
	*dbusy = busy_ns - c->busy0;
	c->t0 = now;
	c->wait0 = wait_ns;
	c->busy0 = busy_ns;
	return true;
}

/* ---- errors --------------------------------------------------------------------------- */

char *
cwi_fn_errmsg(const cwi_node *node, const cachew_op_ctx *ctx, cachew_err rv)
{
	rv = cwi_fn_errcode(rv);
	return cwi_asprintf("%s(%s): %s (element %llu)", node->op->name,
	    node->fn->name,
	    ctx->errmsg[0] != '\0' ? ctx->errmsg : cachew_strerror(rv),
	    (unsigned long long)ctx->index);
}
