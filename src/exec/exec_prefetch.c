/*
 * exec_prefetch.c - prefetch(n): a background thread pulls from the input
 * into a bounded queue of chunks so the consumer rarely waits.
 *
 * The producer thread (started by the first next()) pulls a chunk sized to
 * ~500 us of the input's work (exec_tune.c) whenever the queue has room
 * for it: `queued + k <= limit` elements, or the queue is empty; and while
 * the pipeline's buffers are under the RAM budget (an empty queue may
 * always take one chunk). The consumer takes up to max elements from the
 * head chunks. prefetch(n) has a fixed limit of n elements (chunks of at
 * most n); prefetch(auto) starts with two chunks and grows on the
 * autotuner's rule. Wake-ups: each side signals the other only when it is
 * waiting, and the consumer wakes the producer only once half of the
 * buffer is free (or all of it), so hand-offs happen per chunk, never per
 * element. An input error or EOF is delivered after every queued element.
 *
 * Saving a position (exec_state.h) stops the producer thread (a chunk it
 * was pulling is queued with what it got) and writes the queue and the
 * input; the next next() starts a thread again. A restore queues the
 * saved elements as one chunk.
 *
 * Lock order: one lock. It is not held while calling the input's next().
 * The tuner registry lock is taken before it by the cancellation wake-up
 * and never while holding it.
 */
#include "exec_ops.h"
#include "exec_state.h"
#include "exec_tune.h"

#include <stdlib.h>

typedef struct pf_chunk {
	struct pf_chunk *next;
	cwi_chunk elems; /* v[pos..n) queued */
	size_t pos;
	size_t bytes;
} pf_chunk;

#define PF_MAX_CHUNKS 64

typedef struct prefetch_iter {
	cwi_iter base;
	cwi_iter *input;
	const cwi_node *node;
	cwi_pipeline *pl;
	cwi_stats *stats;
	bool autosize;  /* n = auto */
	size_t fixed_n; /* n >= 1 */
	cwi_tune_op tune;
	cwi_sizer sizer;
	atomic_bool halt;

	pthread_mutex_t lock;
	pthread_cond_t cv_prod, cv_cons;
	pthread_t thread;
	bool started, stop, cancel;
	bool prod_waiting, cons_waiting;
	pf_chunk *head, *tail, *spare;
	size_t queued;  /* elements */
	size_t limit;   /* elements */
	size_t nchunks; /* auto: the limit in chunks of kmax */
	size_t kmax;
	bool end;
	cachew_err end_rv;
	bool was_full;  /* since the last tuning step */
	int64_t bytes;  /* of queued chunks */
	uint64_t produced, produced_bytes; /* totals, for bytes per element */

	/* Consumer thread only. */
	uint64_t wait_ns;
	cwi_tune_clock clock;
} prefetch_iter;

static void
pf_publish(prefetch_iter *p)
{
	if (p->stats == NULL)
		return;
	atomic_store_explicit(&p->stats->buffer_limit, (int64_t)p->limit,
	    memory_order_relaxed);
	atomic_store_explicit(&p->stats->buffered, (int64_t)p->queued,
	    memory_order_relaxed);
}

/* Elements the producer asks for next. (lock held) */
static size_t
pf_chunk_size(prefetch_iter *p)
{
	size_t k = cwi_sizer_chunk(&p->sizer);

	if (p->autosize) {
		/* The limit follows the largest chunk, never shrinking, so the
		 * queue never holds more than it shows. */
		if (k > p->kmax) {
			p->kmax = k;
			p->limit = p->nchunks * p->kmax;
			pf_publish(p);
		}
	} else if (k > p->fixed_n) {
		k = p->fixed_n;
	}
	return k;
}

static bool
pf_has_room(const prefetch_iter *p, size_t k)
{
	if (p->queued == 0)
		return true;
	return p->queued + k <= p->limit && cwi_tune_bytes_ok(&p->tune);
}

static pf_chunk *
pf_chunk_get(prefetch_iter *p)
{
	pf_chunk *c = p->spare;
	if (c != NULL) {
		p->spare = c->next;
		c->next = NULL;
		return c;
	}
	return calloc(1, sizeof(*c));
}

static void
pf_chunk_put(prefetch_iter *p, pf_chunk *c)
{
	c->elems.n = 0;
	c->pos = 0;
	c->bytes = 0;
	c->next = p->spare;
	p->spare = c;
}

/* Pulls one chunk of k elements (unlocked). */
static cachew_err
pf_pull(prefetch_iter *p, pf_chunk *c, size_t k)
{
	cachew_err rv = CACHEW_OK;
	uint64_t t0 = cwi_now_ns();

	while (c->elems.n < k && rv == CACHEW_OK && !atomic_load(&p->halt))
		rv = cwi_iter_next(p->input, &c->elems, k - c->elems.n);
	cwi_sizer_update(&p->sizer, c->elems.n, cwi_now_ns() - t0);
	for (size_t i = 0; i < c->elems.n; i++)
		c->bytes += cwi_element_nbytes(c->elems.v[i]);
	return rv;
}

static void *
pf_main(void *arg)
{
	prefetch_iter *p = arg;

	pthread_mutex_lock(&p->lock);
	while (!p->stop && !p->cancel) {
		size_t k = pf_chunk_size(p);
		pf_chunk *c;
		cachew_err rv;

		if (!pf_has_room(p, k)) {
			p->prod_waiting = true;
			pthread_cond_wait(&p->cv_prod, &p->lock);
			p->prod_waiting = false;
			continue;
		}
		c = pf_chunk_get(p);
		pthread_mutex_unlock(&p->lock);
		rv = c != NULL ? pf_pull(p, c, k)
			       : cwi_pipeline_fail(p->pl, CACHEW_ENOMEM,
				     "prefetch: out of memory");
		pthread_mutex_lock(&p->lock);
		if (c != NULL && c->elems.n > 0) {
			if (p->tail != NULL)
				p->tail->next = c;
			else
				p->head = c;
			p->tail = c;
			p->queued += c->elems.n;
			p->bytes += (int64_t)c->bytes;
			p->produced += c->elems.n;
			p->produced_bytes += c->bytes;
			cwi_tune_bytes_add(&p->tune, (int64_t)c->bytes);
			if (p->queued >= p->limit)
				p->was_full = true;
		} else if (c != NULL) {
			pf_chunk_put(p, c);
		}
		if (rv != CACHEW_OK) {
			p->end = true;
			p->end_rv = rv;
		}
		pf_publish(p);
		if (p->end)
			break;
		if (p->cons_waiting) {
			/* Signal unlocked: the consumer wakes to a free lock. */
			pthread_mutex_unlock(&p->lock);
			pthread_cond_signal(&p->cv_cons);
			pthread_mutex_lock(&p->lock);
		}
	}
	if (p->cons_waiting)
		pthread_cond_signal(&p->cv_cons);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* Sets *wake_producer when the producer waits and now has room (to be
 * signalled unlocked). (lock held) */
static cachew_err
pf_take(prefetch_iter *p, cwi_chunk *out, size_t max, bool *wake_producer)
{
	size_t got = 0;
	cachew_err rv = CACHEW_OK;

	for (;;) {
		pf_chunk *c = p->head;
		if (c != NULL) {
			size_t take = c->elems.n - c->pos;
			if (take > max - got)
				take = max - got;
			memcpy(out->v + out->n, c->elems.v + c->pos,
			    take * sizeof(*out->v));
			out->n += take;
			c->pos += take;
			got += take;
			p->queued -= take;
			if (c->pos == c->elems.n) {
				p->head = c->next;
				if (p->head == NULL)
					p->tail = NULL;
				p->bytes -= (int64_t)c->bytes;
				cwi_tune_bytes_add(&p->tune, -(int64_t)c->bytes);
				pf_chunk_put(p, c);
			}
			if (got == max)
				break;
			continue;
		}
		if (got > 0)
			break;
		if (p->end) {
			rv = p->end_rv;
			break;
		}
		if (p->cancel) {
			rv = CACHEW_ECANCELED;
			break;
		}
		if (p->prod_waiting)
			pthread_cond_signal(&p->cv_prod);
		uint64_t t0 = cwi_now_ns();
		p->cons_waiting = true;
		pthread_cond_wait(&p->cv_cons, &p->lock);
		p->cons_waiting = false;
		p->wait_ns += cwi_now_ns() - t0;
	}
	*wake_producer = p->prod_waiting &&
	    (p->queued == 0 || p->queued <= p->limit / 2);
	pf_publish(p);
	return rv;
}

/* The autotuner's step for prefetch(auto) (exec_tune.c), unlocked. */
static void
pf_tune(prefetch_iter *p)
{
	cwi_tune_buffer_sample s;
	uint64_t dt, dwait, dbusy;
	int64_t per, cap;

	if (!cwi_tune_clock_due(
		&p->clock, cwi_now_ns(), p->wait_ns, 0, &dt, &dwait, &dbusy))
		return;
	pthread_mutex_lock(&p->lock);
	s.interval_ns = dt;
	s.wait_ns = dwait;
	s.was_full = p->was_full;
	p->was_full = false;
	if (cwi_tune_buffer_rule(&s) && p->nchunks < PF_MAX_CHUNKS) {
		/* Half of the RAM budget at most, at the bytes per element
		 * seen so far. */
		per = p->produced > 0
			  ? (int64_t)(p->produced_bytes / p->produced)
			  : 0;
		cap = per > 0 ? cwi_tune_ram_budget(&p->tune) / 2 / per
			      : INT64_MAX;
		if ((int64_t)(2 * p->nchunks * p->kmax) <= cap) {
			p->nchunks *= 2;
			p->limit = p->nchunks * p->kmax;
			pf_publish(p);
			if (p->prod_waiting)
				pthread_cond_signal(&p->cv_prod);
		}
	}
	pthread_mutex_unlock(&p->lock);
}

static cachew_err
pf_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	prefetch_iter *p = (prefetch_iter *)it;
	cachew_err rv;

	if (!p->started && !p->end) {
		pthread_mutex_lock(&p->lock);
		if (pthread_create(&p->thread, NULL, pf_main, p) != 0) {
			pthread_mutex_unlock(&p->lock);
			return cwi_pipeline_fail(p->pl, CACHEW_ENOMEM,
			    "prefetch: cannot start a thread");
		}
		p->started = true;
		pthread_mutex_unlock(&p->lock);
		p->clock.t0 = cwi_now_ns();
	}
	if (p->autosize && p->pl->opts.autotune)
		pf_tune(p);
	bool wake = false;
	pthread_mutex_lock(&p->lock);
	rv = pf_take(p, out, max, &wake);
	pthread_mutex_unlock(&p->lock);
	if (wake)
		pthread_cond_signal(&p->cv_prod);
	return rv;
}

static void
pf_wake(void *arg)
{
	prefetch_iter *p = arg;

	pthread_mutex_lock(&p->lock);
	p->cancel = true;
	atomic_store(&p->halt, true);
	pthread_cond_broadcast(&p->cv_prod);
	pthread_cond_broadcast(&p->cv_cons);
	pthread_mutex_unlock(&p->lock);
}

static void
pf_free_list(pf_chunk *c)
{
	while (c != NULL) {
		pf_chunk *next = c->next;
		for (size_t i = c->pos; i < c->elems.n; i++)
			cwi_element_release(c->elems.v[i]);
		free(c->elems.v);
		free(c);
		c = next;
	}
}

static void
pf_free(prefetch_iter *p)
{
	pf_free_list(p->head);
	pf_free_list(p->spare);
	pthread_cond_destroy(&p->cv_cons);
	pthread_cond_destroy(&p->cv_prod);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

static void
pf_destroy(cwi_iter *it)
{
	prefetch_iter *p = (prefetch_iter *)it;
	bool started;

	cwi_tune_cancel(p->pl);
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	atomic_store(&p->halt, true);
	started = p->started;
	pthread_cond_broadcast(&p->cv_prod);
	pthread_cond_broadcast(&p->cv_cons);
	pthread_mutex_unlock(&p->lock);
	if (started)
		pthread_join(p->thread, NULL);
	cwi_iter_destroy(p->input);
	cwi_tune_detach(&p->tune);
	pf_free(p);
}

/* Stops the producer (a chunk it was pulling is queued with what it got)
 * so that the queue and the input hold still; the next next() starts it
 * again. */
static void
pf_quiesce(prefetch_iter *p)
{
	bool started;

	pthread_mutex_lock(&p->lock);
	started = p->started;
	p->stop = true;
	atomic_store(&p->halt, true);
	pthread_cond_broadcast(&p->cv_prod);
	pthread_mutex_unlock(&p->lock);
	if (started)
		pthread_join(p->thread, NULL);
	pthread_mutex_lock(&p->lock);
	p->started = false;
	p->stop = false;
	atomic_store(&p->halt, p->cancel);
	pthread_mutex_unlock(&p->lock);
}

/* [queued elements, input]. */
static cachew_err
pf_save(cwi_iter *it, cwi_state_writer *w)
{
	prefetch_iter *p = (prefetch_iter *)it;
	cachew_err rv = CACHEW_OK;

	pf_quiesce(p);
	if (p->end && p->end_rv != CACHEW_EOF)
		return cwi_fail(p->end_rv, "prefetch: the input failed (%s)",
		    p->pl->errmsg);
	cwi_sw_array(w, 2);
	cwi_sw_array(w, p->queued);
	for (pf_chunk *c = p->head; c != NULL && rv == CACHEW_OK; c = c->next)
		for (size_t i = c->pos; i < c->elems.n && rv == CACHEW_OK; i++)
			rv = cwi_sw_element(w, c->elems.v[i]);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(p->input, w);
	return rv;
}

/* The saved elements become the first queued chunk. */
static cachew_err
pf_restore(cwi_iter *it, cwi_state_reader *r)
{
	prefetch_iter *p = (prefetch_iter *)it;
	pf_chunk *c = pf_chunk_get(p);

	if (c == NULL) {
		cwi_sr_fail(r, CACHEW_ENOMEM, "out of memory");
		return cwi_sr_error(r);
	}
	if (!cwi_sr_array(r, "prefetch", 2) ||
	    !cwi_sr_elements(r, "queued", &c->elems)) {
		cwi_chunk_clear(&c->elems);
		pf_chunk_put(p, c);
		return cwi_sr_error(r);
	}
	if (c->elems.n == 0) {
		pf_chunk_put(p, c);
	} else {
		for (size_t i = 0; i < c->elems.n; i++)
			c->bytes += cwi_element_nbytes(c->elems.v[i]);
		p->head = p->tail = c;
		p->queued = c->elems.n;
		p->bytes = (int64_t)c->bytes;
		cwi_tune_bytes_add(&p->tune, (int64_t)c->bytes);
		pf_publish(p);
	}
	return cwi_iter_restore(p->input, r);
}

static const cwi_iter_ops pf_iter_ops = {
    .next = pf_next,
    .destroy = pf_destroy,
    .save = pf_save,
    .restore = pf_restore,
};

static cachew_err
pf_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	prefetch_iter *p = calloc(1, sizeof(*p));
	int64_t n = cwi_node_int(node, "n");
	cachew_err rv;

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	p->base.ops = &pf_iter_ops;
	p->node = node;
	p->pl = args->pl;
	p->stats = cwi_pipeline_stats(args->pl, node);
	p->autosize = n == CACHEW_AUTO;
	p->fixed_n = n >= 1 ? (size_t)n : 1;
	cwi_sizer_init(&p->sizer, 0);
	atomic_init(&p->halt, false);
	cwi_mutex_init(&p->lock);
	pthread_cond_init(&p->cv_prod, NULL);
	pthread_cond_init(&p->cv_cons, NULL);
	p->nchunks = 2;
	p->kmax = 1;
	p->limit = p->autosize ? p->nchunks * p->kmax : p->fixed_n;
	rv = cwi_tune_attach(&p->tune, args->pl, pf_wake, p);
	if (rv != CACHEW_OK) {
		pf_free(p);
		return rv;
	}
	rv = cwi_iter_create(&p->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		cwi_tune_detach(&p->tune);
		pf_free(p);
		return rv;
	}
	pf_publish(p);
	*out = &p->base;
	return CACHEW_OK;
}

static const cwi_param_spec pf_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_AUTO | CWI_PF_PERF,
	.def_int = CACHEW_AUTO, .min = 1, .max = INT32_MAX,
	.help = "elements to buffer, or auto"},
};

const cwi_dataset_op cwi_op_prefetch = {
    .name = "prefetch",
    .doc = "produces elements ahead of the consumer on a background thread",
    .params = pf_params,
    .nparams = sizeof(pf_params) / sizeof(pf_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_PASSTHROUGH | CWI_OPF_ASYNC,
    .iter_create = pf_create,
    .saves = "the queued elements (its thread stops to save them and starts "
	"again), and the input",
};
