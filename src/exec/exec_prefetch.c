/*
 * exec_prefetch.c - prefetch(n): a background thread pulls from the input
 * into a bounded queue of chunks so the consumer rarely waits.
 *
 * The producer thread (started by the first next()) opens a chunk sized to
 * ~500 us of the input's work (exec_tune.c) whenever the queue has room
 * for it: `queued + k <= limit` elements, or the queue is empty; and while
 * the pipeline's buffers are under the RAM budget (an empty queue may
 * always take one chunk). The open chunk is linked at the tail of the
 * queue from the start: the producer calls the input unlocked into a
 * private scratch chunk and, under the lock, appends what each call
 * returned to the open chunk, so the consumer may take an element as soon
 * as the input call that made it returns. Publishing only full chunks held
 * up to k-1 finished elements from the consumer for as long as the input
 * then stalled (a filter that rarely passes, a source that blocks), for
 * ever behind an endless filter. The consumer takes up to max elements
 * from the head chunks and never recycles the open chunk; the producer
 * closes it when it holds k elements, at the input's end or error, or when
 * stopped.
 *
 * prefetch(n) has a fixed limit of n elements (chunks of at most n);
 * prefetch(auto) starts with two chunks and grows on the autotuner's rule.
 *
 * Wake-ups stay per chunk, never per element or per input call (a blocking
 * wake-up costs 5-50 us on these machines): each side signals the other
 * only when it is waiting; the producer signals a waiting consumer when it
 * has closed a chunk (once the next one is open, so that the consumer
 * wakes to it), and the consumer wakes the producer only once half of the
 * buffer is free (or all of it). Elements appended to the open chunk
 * are not signalled, so a consumer that finds the queue empty waits at
 * most PF_HOLD_NS and takes whatever arrived meanwhile; only if nothing
 * did is it "hungry": it then waits untimed and the producer signals it on
 * its next append of any size. Where that append is the one that closes
 * the chunk anyway (the input filled the last chunk in one call, as an
 * inline map does, or one element is missing) the consumer is hungry at
 * once: it costs no wake-up more and saves arming a timer per wait. A
 * sparse input thus costs the consumer at most one timed-out wait and one
 * wake-up per element it waited for; a dense one is woken once per chunk,
 * as before. An input error or EOF is delivered after every queued
 * element.
 *
 * Saving a position (exec_state.h) stops the producer thread (the chunk it
 * was filling is closed with what it got) and writes the queue and the
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

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

typedef struct pf_chunk {
	struct pf_chunk *next;
	cwi_chunk elems; /* v[pos..n) queued */
	size_t pos;
	size_t bytes;
} pf_chunk;

#define PF_MAX_CHUNKS 64

/* How long a consumer facing an empty queue waits for the open chunk to
 * fill before taking what it holds: four times the chunk target, so that
 * a dense input's chunk closes (and signals) first even on a busy machine,
 * while a sparse input's elements reach the consumer within 2 ms. */
#define PF_HOLD_NS (4 * (uint64_t)CWI_CHUNK_TARGET_NS)

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
	bool cons_hungry; /* waits untimed: signal it on any append */
	pf_chunk *head, *tail, *spare;
	pf_chunk *open; /* the tail chunk the producer fills, or NULL */
	size_t open_k;  /* the elements it is to hold */
	size_t fill_calls; /* input calls that filled the last closed chunk */
	size_t queued;  /* elements */
	size_t limit;   /* elements */
	size_t nchunks; /* auto: the limit in chunks of kmax */
	size_t kmax;
	bool end;
	cachew_err end_rv;
	bool was_full;  /* since the last tuning step */
	int64_t bytes;  /* of queued chunks */
	uint64_t produced, produced_bytes; /* totals, for bytes per element */

	/* Producer thread only: what one input call returned. */
	cwi_chunk scratch;

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

/* Opens a chunk for k elements at the tail of the queue (its storage
 * reserved now, so appends never move it under the consumer); NULL on
 * ENOMEM. (lock held) */
static pf_chunk *
pf_open(prefetch_iter *p, size_t k)
{
	pf_chunk *c = pf_chunk_get(p);

	if (c == NULL)
		return NULL;
	if (cwi_chunk_reserve(&c->elems, k) != CACHEW_OK) {
		pf_chunk_put(p, c);
		return NULL;
	}
	if (p->tail != NULL)
		p->tail->next = c;
	else
		p->head = c;
	p->tail = c;
	p->open = c;
	p->open_k = k;
	return c;
}

/* Moves what one input call returned (bytes in total) to the open chunk,
 * where the consumer sees it. (lock held) */
static void
pf_append(prefetch_iter *p, pf_chunk *c, cwi_chunk *in, size_t bytes)
{
	if (in->n == 0)
		return;
	assert(c->elems.n + in->n <= c->elems.cap);
	memcpy(c->elems.v + c->elems.n, in->v, in->n * sizeof(*in->v));
	c->elems.n += in->n;
	c->bytes += bytes;
	p->queued += in->n;
	p->bytes += (int64_t)bytes;
	p->produced += in->n;
	p->produced_bytes += bytes;
	cwi_tune_bytes_add(&p->tune, (int64_t)bytes);
	if (p->queued >= p->limit)
		p->was_full = true;
	in->n = 0;
	pf_publish(p);
}

/* Fills the open chunk c towards k elements, one input call at a time:
 * the lock is released around each call and each call's elements are
 * appended at once. wake: a waiting consumer is owed a signal (the last
 * chunk closed), sent at the first unlock, so that it wakes to this chunk
 * already open. Returns the input's end or error, or CACHEW_OK when the
 * chunk is full or the thread is asked to stop. (lock held) */
static cachew_err
pf_fill(prefetch_iter *p, pf_chunk *c, size_t k, bool wake)
{
	cwi_chunk *in = &p->scratch;
	cachew_err rv = CACHEW_OK;
	uint64_t busy_ns = 0;
	size_t have = 0, calls = 0;

	while (have < k && rv == CACHEW_OK && !atomic_load(&p->halt)) {
		size_t bytes = 0;
		uint64_t t0;

		pthread_mutex_unlock(&p->lock);
		/* Signal unlocked: the consumer wakes to a free lock. */
		if (wake)
			pthread_cond_signal(&p->cv_cons);
		t0 = cwi_now_ns();
		rv = cwi_iter_next(p->input, in, k - have);
		busy_ns += cwi_now_ns() - t0;
		calls++;
		for (size_t i = 0; i < in->n; i++)
			bytes += cwi_element_nbytes(in->v[i]);
		pthread_mutex_lock(&p->lock);
		have += in->n;
		wake = in->n > 0 && p->cons_hungry;
		pf_append(p, c, in, bytes);
	}
	/* A wake-up still owed is paid by pf_main once the chunk is closed. */
	cwi_sizer_update(&p->sizer, have, busy_ns);
	if (have == k)
		p->fill_calls = calls;
	return rv;
}

/* Closes the open chunk c, the tail; unlinks it if the consumer took all
 * of it or nothing came, as the consumer only recycles chunks it empties
 * and must not meet an empty one. Walking the queue is rare: a chunk that
 * got elements and was emptied is the only one (the consumer takes chunks
 * in order and recycles each other one it empties); one that got nothing
 * ends the input or stops the thread. (lock held) */
static void
pf_close(prefetch_iter *p, pf_chunk *c)
{
	pf_chunk **link = &p->head, *prev = NULL;

	p->open = NULL;
	if (c->pos < c->elems.n)
		return;
	while (*link != c) {
		prev = *link;
		link = &prev->next;
	}
	assert(c->next == NULL && p->tail == c);
	*link = NULL;
	p->tail = prev;
	p->bytes -= (int64_t)c->bytes;
	cwi_tune_bytes_add(&p->tune, -(int64_t)c->bytes);
	pf_chunk_put(p, c);
}

static void *
pf_main(void *arg)
{
	prefetch_iter *p = arg;
	bool wake = false; /* the consumer waits for a chunk just closed */

	pthread_mutex_lock(&p->lock);
	while (!p->stop && !p->cancel) {
		size_t k = pf_chunk_size(p);
		pf_chunk *c;
		cachew_err rv;

		if (!pf_has_room(p, k)) {
			if (wake)
				pthread_cond_signal(&p->cv_cons);
			wake = false;
			p->prod_waiting = true;
			pthread_cond_wait(&p->cv_prod, &p->lock);
			p->prod_waiting = false;
			continue;
		}
		c = pf_open(p, k);
		if (c != NULL) {
			rv = pf_fill(p, c, k, wake);
			pf_close(p, c);
		} else {
			pthread_mutex_unlock(&p->lock);
			rv = cwi_pipeline_fail(
			    p->pl, CACHEW_ENOMEM, "prefetch: out of memory");
			pthread_mutex_lock(&p->lock);
		}
		if (rv != CACHEW_OK) {
			p->end = true;
			p->end_rv = rv;
		}
		pf_publish(p);
		if (p->end)
			break;
		wake = p->cons_waiting;
	}
	if (p->cons_waiting)
		pthread_cond_signal(&p->cv_cons);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* Whether the consumer may take an element now. (lock held) */
static bool
pf_any(const prefetch_iter *p)
{
	return p->head != NULL && p->head->pos < p->head->elems.n;
}

/* Waits for the producer (lock held). Not hungry: at most PF_HOLD_NS,
 * as elements appended to the open chunk are not signalled; returns
 * whether the consumer is now hungry (it timed out on an empty queue).
 * Hungry: untimed, the producer signals its next append. */
static bool
pf_wait(prefetch_iter *p, bool hungry)
{
	uint64_t t0 = cwi_now_ns();

	/* Waiting hungry costs a signal per append, the timed wait a timer
	 * (~5-10 us of CPU here per wait). The append that fills the open
	 * chunk signals anyway: hungry is free when the input fills a chunk
	 * in one call (an inline map: the last chunk took one) or one
	 * element is missing (chunks of one: inputs slower than the chunk
	 * target). Inputs that return parts (parallel maps, interleave) get
	 * the timed wait. */
	if (p->fill_calls <= 1 ||
	    (p->open != NULL && p->open->elems.n + 1 >= p->open_k))
		hungry = true;
	p->cons_waiting = true;
	p->cons_hungry = hungry;
	if (hungry)
		pthread_cond_wait(&p->cv_cons, &p->lock);
	else if (cwi_cond_wait_ns(&p->cv_cons, &p->lock, PF_HOLD_NS) ==
		     ETIMEDOUT &&
	    !pf_any(p))
		hungry = true;
	p->cons_waiting = false;
	p->cons_hungry = false;
	p->wait_ns += cwi_now_ns() - t0;
	return hungry;
}

/* Sets *wake_producer when the producer waits and now has room (to be
 * signalled unlocked). (lock held) */
static cachew_err
pf_take(prefetch_iter *p, cwi_chunk *out, size_t max, bool *wake_producer)
{
	size_t got = 0;
	cachew_err rv = CACHEW_OK;
	bool hungry = false;

	for (;;) {
		pf_chunk *c = p->head;
		if (pf_any(p)) {
			size_t take = c->elems.n - c->pos;
			if (take > max - got)
				take = max - got;
			memcpy(out->v + out->n, c->elems.v + c->pos,
			    take * sizeof(*out->v));
			out->n += take;
			c->pos += take;
			got += take;
			p->queued -= take;
			/* The producer still appends to the open chunk. */
			if (c->pos == c->elems.n && c != p->open) {
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
		hungry = pf_wait(p, hungry);
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
	cwi_chunk_free(&p->scratch);
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

/* Stops the producer (the chunk it was filling is closed with what it got)
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
	cwi_cond_init_monotonic(&p->cv_cons);
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
