/*
 * exec_map.c - map(fn, parallel, deterministic): applies a map function to
 * every element, inline (parallel <= 1) or on worker threads (parallel=N
 * or auto).
 *
 * The parallel form. Workers pull chunks of input themselves, under
 * in_lock (the upstream iterator is single-threaded), and number them: a
 * sequence number `seq` and the input index of the first element (the
 * index that seeds cachew_op_ctx, so results are the same at any
 * parallelism). They apply the function outside every lock and leave the
 * chunk in a reorder ring indexed by seq (deterministic) or in a FIFO of
 * completed chunks (deterministic=false). The consumer hands out elements
 * from the chunk at next_out (or the FIFO head). At most `limit` chunks
 * are in flight (reserved by a worker and not yet fully handed out): that
 * bounds memory and, since seqs in flight are consecutive, lets the ring
 * have `limit` entries. Chunk sizes follow the measured cost per element
 * (exec_tune.c). Hand-offs: a worker signals the consumer only when it is
 * waiting; the consumer wakes idle workers only when half of the in-flight
 * room is free. A function that, with its input, costs less than ~200 ns
 * per element runs inline: the consumer runs the chunks itself through the
 * same ring (exec_tune.h explains why), and workers resume when the cost
 * rises.
 *
 * Errors: a function failure ends its chunk after the results before it
 * and stops further input pulls; the chunk keeps the message, which goes
 * to cwi_pipeline_fail when the consumer reaches it, so earlier elements
 * are delivered first and the pipeline reports the first failure in input
 * order. An input error or EOF ends the sequence after the chunks pulled
 * before it.
 *
 * Saving a position (exec_state.h): the consumer sets `pausing`, which
 * keeps workers from reserving chunks, and waits until none is being
 * worked on (`working`); the completed results in output order are then
 * the state's elements, next_index the index after them, and the input is
 * saved under in_lock. A restore makes the saved results the first
 * completed chunk.
 *
 * Lock order: in_lock and lock are never held together. in_lock is held
 * across the input's next() (which may block); neither is held while the
 * map function runs. The tuner registry lock is taken before `lock` by
 * the cancellation wake-up and never while holding either.
 */
#include "exec_ops.h"
#include "exec_state.h"
#include "exec_tune.h"

#include <stdlib.h>

/* ---- inline map ---------------------------------------------------------- */

typedef struct map_iter {
	cwi_iter base;
	cwi_iter *input;
	cachew_op_ctx ctx;
	uint64_t index; /* elements seen at the input */
	/* Results a parallel map had computed when its state was saved:
	 * handed out first (restored.v[pos..n)). */
	cwi_chunk restored;
	size_t pos;
} map_iter;

/* Applies the function to out->v[n0..n) in place. An element dropped by
 * an ignore_errors above (cwi_iter_drop) leaves no result; on another
 * failure the results before it stay and the rest of the chunk is
 * released (exec.h). */
static cachew_err
map_apply_chunk(map_iter *m, cwi_chunk *out, size_t n0)
{
	cwi_iter *it = &m->base;
	size_t w = n0;
	cachew_err rv;

	for (size_t i = n0; i < out->n; i++) {
		cwi_element *res = NULL;
		cwi_op_ctx_at(&m->ctx, m->index++);
		rv = m->ctx.fn->def.map(&m->ctx, out->v[i], &res);
		if (rv == CACHEW_OK && res != NULL) {
			out->v[w++] = res;
			continue;
		}
		/* v[i] was consumed either way. */
		cwi_element_release(res);
		if (rv != CACHEW_OK && cwi_iter_drop(it, &m->ctx, rv))
			continue;
		if (rv == CACHEW_OK)
			rv = cachew_op_ctx_fail(&m->ctx, "returned no element");
		for (size_t j = i + 1; j < out->n; j++)
			cwi_element_release(out->v[j]);
		out->n = w;
		return cwi_fn_failed(&m->ctx, it->node, it->pl, rv);
	}
	out->n = w;
	return CACHEW_OK;
}

static cachew_err
map_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	map_iter *m = (map_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	if (m->pos < m->restored.n) {
		while (out->n - n0 < max && m->pos < m->restored.n)
			cwi_chunk_push(out, m->restored.v[m->pos++]);
		return CACHEW_OK;
	}
	/* Below an ignore_errors a whole chunk may be dropped: pull again
	 * (next() returns at least one element or the end). */
	while (out->n == n0) {
		rv = cwi_iter_next(m->input, out, max);
		if (rv != CACHEW_OK)
			return rv;
		rv = map_apply_chunk(m, out, n0);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

static void
map_destroy(cwi_iter *it)
{
	map_iter *m = (map_iter *)it;
	cwi_iter_destroy(m->input);
	for (size_t i = m->pos; i < m->restored.n; i++)
		cwi_element_release(m->restored.v[i]);
	free(m->restored.v);
	free(m);
}

/* [index, results computed and not yet handed out, input]: the index (of
 * the input element after them) seeds the function's random stream. The
 * parallel form writes the same shape, so a state moves between
 * parallelisms. */
static cachew_err
map_save(cwi_iter *it, cwi_state_writer *w)
{
	map_iter *m = (map_iter *)it;

	cachew_err rv;

	cwi_sw_array(w, 3);
	cwi_sw_uint(w, m->index);
	rv = cwi_sw_elements(w, m->restored.v + m->pos,
	    m->restored.n - m->pos);
	if (rv != CACHEW_OK)
		return rv;
	return cwi_iter_save(m->input, w);
}

/* Reads [index, computed elements, ...] up to the input's state. */
static bool
map_restore_head(cwi_state_reader *r, uint64_t *index, cwi_chunk *done)
{
	return cwi_sr_array(r, "map", 3) &&
	    cwi_sr_uint(r, "index", index, UINT64_MAX) &&
	    cwi_sr_elements(r, "computed", done);
}

static cachew_err
map_restore(cwi_iter *it, cwi_state_reader *r)
{
	map_iter *m = (map_iter *)it;

	if (!map_restore_head(r, &m->index, &m->restored))
		return cwi_sr_error(r);
	m->pos = 0;
	return cwi_iter_restore(m->input, r);
}

static const cwi_iter_ops map_iter_ops = {
    .next = map_next,
    .destroy = map_destroy,
    .save = map_save,
    .restore = map_restore,
};

/* ---- parallel map: state --------------------------------------------------- */

/* Elements per chunk when the consumer runs the function itself. */
#define PMAP_INLINE_CHUNK 256

typedef struct map_chunk {
	struct map_chunk *next; /* FIFO of completed chunks, or spares */
	uint64_t seq;
	uint64_t index0;  /* input index of elems.v[0] */
	cwi_chunk elems;  /* results; v[pos..n) not yet handed out */
	size_t pos;
	size_t bytes;
	cachew_err err;   /* the function failed after elems.n results */
	char *errmsg;
} map_chunk;

typedef struct pmap_iter {
	cwi_iter base;
	cwi_iter *input;
	const cwi_node *node;
	cwi_pipeline *pl;
	uint64_t epoch;    /* the iterator's (random streams draw from it) */
	cwi_stats *stats;
	bool deterministic;
	bool autoscale; /* parallel=auto */
	cwi_tune_op tune;
	cwi_sizer sizer;
	cachew_op_ctx ctx; /* the consumer's, when it works itself */
	atomic_bool halt;  /* stop or cancel, for loops outside `lock` */
	_Atomic uint64_t busy_ns;

	pthread_mutex_t in_lock;
	uint64_t next_seq;   /* in_lock */
	uint64_t next_index; /* in_lock */
	bool in_done;        /* in_lock: the input returned EOF or an error */
	size_t in_bytes;     /* in_lock: bytes of an input element, 0: unknown */

	pthread_mutex_t lock;
	pthread_cond_t cv_ready; /* consumer: a chunk completed */
	pthread_cond_t cv_work;  /* workers: room for another chunk */
	pthread_cond_t cv_park;  /* workers beyond crew.active */
	cwi_crew crew;
	bool started, stop, cancel;
	bool pausing;     /* a save waits for the chunks being worked on */
	size_t working;   /* chunks reserved and not yet deposited */
	bool inline_mode; /* the consumer runs the chunks (cheap function) */
	bool consumer_waiting;
	int idle;         /* workers waiting on cv_work */
	size_t inflight;  /* chunks reserved and not fully handed out */
	size_t limit;     /* most chunks in flight; ring entries */
	map_chunk *pool;  /* limit chunks */
	map_chunk **ring; /* deterministic: ring[seq % limit] */
	uint64_t next_out;
	map_chunk *done_head, *done_tail; /* deterministic=false */
	map_chunk *spare;
	bool input_end;   /* the input ended: no chunk will follow */
	cachew_err input_rv;
	bool failed;      /* a completed chunk carries a function error */
	size_t kmax;      /* largest chunk so far */
	int64_t buffered; /* completed elements not yet handed out */

	/* Consumer thread only. */
	uint64_t wait_ns;
	cwi_tune_clock clock;
} pmap_iter;

static void
pmap_publish(pmap_iter *m)
{
	cwi_stats *s = m->stats;
	if (s == NULL)
		return;
	/* Before the first next(), a fixed parallel=N shows N. */
	atomic_store_explicit(&s->parallelism,
	    m->inline_mode			    ? 1
		: m->crew.active > 0		    ? m->crew.active
		: !m->started && !m->autoscale ? m->crew.cap
					       : 1,
	    memory_order_relaxed);
	atomic_store_explicit(&s->buffer_limit,
	    (int64_t)(m->limit * (m->kmax > 0 ? m->kmax : 1)),
	    memory_order_relaxed);
	atomic_store_explicit(&s->buffered, m->buffered, memory_order_relaxed);
}

/* May a worker start another chunk? (lock held) */
static bool
pmap_can_start(const pmap_iter *m)
{
	return !m->stop && !m->cancel && !m->pausing && !m->input_end &&
	    !m->failed &&
	    m->inflight < m->limit &&
	    (m->inflight == 0 || cwi_tune_bytes_ok(&m->tune));
}

/* ---- parallel map: the work ------------------------------------------------- */

/*
 * Input bytes a chunk holds at most, beyond its first element. Chunks
 * amortise a hand-off over elements that cost less than one; an element
 * of a MiB costs more to touch than a hand-off, so grouping such
 * elements only multiplies the memory a chunk holds: W2's normalize,
 * hinted at 100 us per element, took its first chunks 5 batches at a
 * time, each 5 x 38.5 MB of f32 output, on each worker: half of the
 * pipeline's 300 MiB peak RSS at 2 threads. Until an element has been
 * seen, a chunk is one element.
 */
#define PMAP_CHUNK_BYTES ((size_t)1 << 20)

/* Pulls up to a chunk of input into c. Returns the input's code; *ended
 * tells whether this call saw the input end. */
static cachew_err
pmap_pull(pmap_iter *m, map_chunk *c, size_t kmax, bool *ended,
    uint64_t *pull_ns)
{
	cachew_err rv = CACHEW_OK;
	uint64_t t0;
	size_t k, bytes = 0;

	*ended = false;
	pthread_mutex_lock(&m->in_lock);
	if (m->in_done || atomic_load(&m->halt)) {
		pthread_mutex_unlock(&m->in_lock);
		return CACHEW_OK;
	}
	k = cwi_sizer_chunk(&m->sizer);
	if (k > kmax)
		k = kmax;
	if (m->in_bytes == 0)
		k = 1;
	else if (k > 1 && m->in_bytes > PMAP_CHUNK_BYTES / k)
		k = PMAP_CHUNK_BYTES / m->in_bytes > 1
			? PMAP_CHUNK_BYTES / m->in_bytes : 1;
	t0 = cwi_now_ns();
	while (c->elems.n < k && rv == CACHEW_OK && !atomic_load(&m->halt))
		rv = cwi_iter_next(m->input, &c->elems, k - c->elems.n);
	*pull_ns = cwi_now_ns() - t0;
	for (size_t i = 0; i < c->elems.n; i++)
		bytes += cwi_element_nbytes(c->elems.v[i]);
	if (c->elems.n > 0)
		m->in_bytes = bytes / c->elems.n > 0 ? bytes / c->elems.n : 1;
	c->index0 = m->next_index;
	m->next_index += c->elems.n;
	if (c->elems.n > 0)
		c->seq = m->next_seq++;
	if (rv != CACHEW_OK) {
		m->in_done = true;
		*ended = true;
	}
	pthread_mutex_unlock(&m->in_lock);
	return rv;
}

/* Applies the function to every element of c, in place. A worker adds its
 * time to the node's busy time; the consumer's is counted by the wrapper
 * (pmap_next). */
static void
pmap_apply(pmap_iter *m, cachew_op_ctx *ctx, map_chunk *c, uint64_t pull_ns,
    bool worker)
{
	const cwi_fn *fn = m->node->fn;
	size_t n = c->elems.n, done = 0, kept = 0, bytes = 0;
	uint64_t t0 = cwi_now_ns(), dt;

	for (; done < n; done++) {
		cwi_element *res = NULL;
		cachew_err rv;

		cwi_op_ctx_at(ctx, c->index0 + done);
		rv = fn->def.map(ctx, c->elems.v[done], &res);
		if (rv != CACHEW_OK || res == NULL) {
			/* The function released its input. */
			cwi_element_release(res);
			if (rv != CACHEW_OK && cwi_iter_drop(&m->base, ctx, rv))
				continue;
			for (size_t j = done + 1; j < n; j++)
				cwi_element_release(c->elems.v[j]);
			c->err = cwi_fn_errcode(rv);
			c->errmsg = cwi_fn_errmsg(m->node, ctx, c->err);
			break;
		}
		c->elems.v[kept++] = res;
		/* What the consumer runs it takes at once: no RAM held. */
		if (worker)
			bytes += cwi_element_nbytes(res);
	}
	c->elems.n = kept;
	dt = cwi_now_ns() - t0;
	c->bytes = bytes;
	cwi_sizer_update(&m->sizer, done + (c->err != CACHEW_OK), dt + pull_ns);
	atomic_fetch_add_explicit(&m->busy_ns, dt, memory_order_relaxed);
	if (m->stats != NULL && worker)
		cwi_stat_add(&m->stats->busy_ns, dt);
}

static bool
pmap_ready(const pmap_iter *m)
{
	if (m->deterministic)
		return m->ring[m->next_out % m->limit] != NULL;
	return m->done_head != NULL;
}

static bool
pmap_finished(const pmap_iter *m)
{
	return m->input_end && m->inflight == 0;
}

/* Takes the completed chunk c into the ring or FIFO; true if the consumer
 * waits for it (to be signalled once the lock is released). (lock held) */
static bool
pmap_deposit(
    pmap_iter *m, map_chunk *c, size_t pulled, cachew_err in_rv, bool ended)
{
	/* No chunk follows; inflight reaching 0 then marks the end. */
	if (ended) {
		m->input_end = true;
		m->input_rv = in_rv;
	}
	if (pulled == 0) {
		m->inflight--;
		c->next = m->spare;
		m->spare = c;
	} else {
		m->buffered += (int64_t)c->elems.n;
		if (pulled > m->kmax)
			m->kmax = pulled;
		cwi_tune_bytes_add(&m->tune, (int64_t)c->bytes);
		if (c->err != CACHEW_OK)
			m->failed = true;
		if (m->deterministic) {
			m->ring[c->seq % m->limit] = c;
		} else {
			c->next = NULL;
			if (m->done_tail != NULL)
				m->done_tail->next = c;
			else
				m->done_head = c;
			m->done_tail = c;
		}
	}
	m->working--;
	pmap_publish(m);
	return m->consumer_waiting && (pmap_ready(m) || pmap_finished(m) ||
	    (m->pausing && m->working == 0));
}

/* Reserves, pulls, applies and deposits one chunk of at most kmax
 * elements. Called with `lock` held and pmap_can_start() true; returns
 * with it held. */
static void
pmap_run(pmap_iter *m, cachew_op_ctx *ctx, size_t kmax, bool worker)
{
	map_chunk *c = m->spare;
	uint64_t pull_ns = 0;
	cachew_err rv;
	size_t pulled;
	bool ended;

	m->spare = c->next;
	c->next = NULL;
	m->inflight++;
	m->working++;
	pthread_mutex_unlock(&m->lock);

	rv = pmap_pull(m, c, kmax, &ended, &pull_ns);
	pulled = c->elems.n;
	if (pulled > 0)
		pmap_apply(m, ctx, c, pull_ns, worker);

	pthread_mutex_lock(&m->lock);
	if (pmap_deposit(m, c, pulled, rv, ended)) {
		/* Signal unlocked: the consumer then wakes to a free lock. */
		pthread_mutex_unlock(&m->lock);
		pthread_cond_signal(&m->cv_ready);
		pthread_mutex_lock(&m->lock);
	}
}

static void *
pmap_worker(void *arg)
{
	cwi_crew_member *w = arg;
	pmap_iter *m = w->op;
	cachew_op_ctx ctx;

	cwi_op_ctx_init(&ctx, m->node, m->pl, m->epoch);
	pthread_mutex_lock(&m->lock);
	while (!m->stop && !m->cancel) {
		if (w->id >= m->crew.active) {
			pthread_cond_wait(&m->cv_park, &m->lock);
			continue;
		}
		if (m->inline_mode || !pmap_can_start(m)) {
			m->idle++;
			pthread_cond_wait(&m->cv_work, &m->lock);
			m->idle--;
			continue;
		}
		pmap_run(m, &ctx, CWI_CHUNK_MAX, true);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* ---- parallel map: the consumer ----------------------------------------------- */

/* Removes the fully handed-out chunk c. (lock held) */
static void
pmap_pop(pmap_iter *m, map_chunk *c)
{
	if (m->deterministic) {
		m->ring[m->next_out % m->limit] = NULL;
		m->next_out++;
	} else {
		m->done_head = c->next;
		if (m->done_head == NULL)
			m->done_tail = NULL;
	}
	cwi_tune_bytes_add(&m->tune, -(int64_t)c->bytes);
	c->elems.n = 0;
	c->pos = 0;
	c->bytes = 0;
	c->next = m->spare;
	m->spare = c;
	m->inflight--;
	if (m->idle > 0 && !m->inline_mode && m->inflight <= m->limit / 2)
		pthread_cond_broadcast(&m->cv_work);
}

static map_chunk *
pmap_head(pmap_iter *m)
{
	if (m->deterministic)
		return m->ring[m->next_out % m->limit];
	return m->done_head;
}

/* Moves up to max elements into out. On a function error returns it with
 * the message in *msg (the caller reports it unlocked). (lock held) */
static cachew_err
pmap_take(pmap_iter *m, cwi_chunk *out, size_t max, char **msg)
{
	size_t got = 0;

	for (;;) {
		map_chunk *c = pmap_head(m);
		if (c != NULL) {
			size_t take = c->elems.n - c->pos;
			if (take > max - got)
				take = max - got;
			memcpy(out->v + out->n, c->elems.v + c->pos,
			    take * sizeof(*out->v));
			out->n += take;
			c->pos += take;
			got += take;
			m->buffered -= (int64_t)take;
			if (c->pos == c->elems.n) {
				if (c->err != CACHEW_OK) {
					if (got > 0)
						break;
					*msg = c->errmsg;
					c->errmsg = NULL;
					return c->err;
				}
				pmap_pop(m, c);
			}
			if (got == max)
				break;
			continue;
		}
		if (got > 0)
			break;
		if (m->cancel)
			return CACHEW_ECANCELED;
		if (pmap_finished(m))
			return m->input_rv;
		if ((m->inline_mode || m->crew.active == 0) &&
		    pmap_can_start(m)) {
			/* A cheap function, or no thread of the budget is
			 * ours: work inline, in chunks small enough to stay
			 * in cache between the input, the function and the
			 * consumer. */
			pmap_run(m, &m->ctx, max > PMAP_INLINE_CHUNK ? max
								: PMAP_INLINE_CHUNK,
			    false);
			continue;
		}
		if (m->idle > 0 && !m->inline_mode && pmap_can_start(m))
			pthread_cond_broadcast(&m->cv_work);
		uint64_t t0 = cwi_now_ns();
		m->consumer_waiting = true;
		pthread_cond_wait(&m->cv_ready, &m->lock);
		m->consumer_waiting = false;
		m->wait_ns += cwi_now_ns() - t0;
	}
	pmap_publish(m);
	return CACHEW_OK;
}

static cachew_err
pmap_start(pmap_iter *m)
{
	cachew_err rv;
	int n = m->crew.cap;

	if (m->autoscale)
		n = cwi_tune_take_threads(
		    &m->tune, m->pl->opts.autotune ? 1 : m->crew.cap);
	pthread_mutex_lock(&m->lock);
	rv = cwi_crew_set(&m->crew, n, pmap_worker, m);
	m->started = true;
	pmap_publish(m);
	pthread_mutex_unlock(&m->lock);
	if (m->autoscale && m->crew.active < n)
		cwi_tune_give_threads(&m->tune, n - m->crew.active);
	m->clock.t0 = cwi_now_ns();
	if (rv != CACHEW_OK)
		return cwi_pipeline_fail(m->pl, rv, "map(%s): %s",
		    m->node->fn->name, cwi_errmsg_get());
	return CACHEW_OK;
}

/* The autotuner's step (exec_tune.c), from the consumer, unlocked. */
static void
pmap_tune(pmap_iter *m)
{
	cwi_tune_sample s;
	uint64_t dt, dwait, dbusy;
	int d;

	if (!cwi_tune_clock_due(&m->clock, cwi_now_ns(), m->wait_ns,
		atomic_load_explicit(&m->busy_ns, memory_order_relaxed), &dt,
		&dwait, &dbusy))
		return;
	s.interval_ns = dt;
	s.wait_ns = dwait;
	s.busy_ns = dbusy;
	s.workers = m->crew.active;
	d = cwi_tune_workers_rule(&s);
	if (d > 0 && m->crew.active < m->crew.cap &&
	    cwi_tune_take_threads(&m->tune, 1) == 1) {
		int before;
		pthread_mutex_lock(&m->lock);
		before = m->crew.active;
		(void)cwi_crew_set(&m->crew, before + 1, pmap_worker, m);
		pthread_cond_broadcast(&m->cv_park);
		pmap_publish(m);
		pthread_mutex_unlock(&m->lock);
		if (m->crew.active == before)
			cwi_tune_give_threads(&m->tune, 1);
	} else if (d < 0 && m->crew.active > 1) {
		pthread_mutex_lock(&m->lock);
		m->crew.active--;
		pmap_publish(m);
		pthread_mutex_unlock(&m->lock);
		cwi_tune_give_threads(&m->tune, 1);
	}
}

static cachew_err
pmap_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	pmap_iter *m = (pmap_iter *)it;
	char *msg = NULL;
	cachew_err rv;

	if (!m->started) {
		rv = pmap_start(m);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (m->autoscale && m->pl->opts.autotune)
		pmap_tune(m);
	pthread_mutex_lock(&m->lock);
	if (cwi_sizer_inline(&m->sizer, m->inline_mode) != m->inline_mode) {
		m->inline_mode = !m->inline_mode;
		if (!m->inline_mode && m->idle > 0)
			pthread_cond_broadcast(&m->cv_work);
	}
	rv = pmap_take(m, out, max, &msg);
	/* The wrapper reads this after the call: the consumer's time here is
	 * wait while workers do the work, and the map's own work inline. */
	it->async = !m->inline_mode && m->crew.active > 0;
	pthread_mutex_unlock(&m->lock);
	if (msg != NULL)
		cwi_pipeline_fail(m->pl, rv, "%s", msg);
	free(msg);
	return rv;
}

static void
pmap_wake(void *arg)
{
	pmap_iter *m = arg;

	pthread_mutex_lock(&m->lock);
	m->cancel = true;
	atomic_store(&m->halt, true);
	pthread_cond_broadcast(&m->cv_ready);
	pthread_cond_broadcast(&m->cv_work);
	pthread_cond_broadcast(&m->cv_park);
	pthread_mutex_unlock(&m->lock);
}

static void
pmap_free(pmap_iter *m)
{
	for (size_t i = 0; m->pool != NULL && i < m->limit; i++) {
		map_chunk *c = &m->pool[i];
		for (size_t j = c->pos; j < c->elems.n; j++)
			cwi_element_release(c->elems.v[j]);
		free(c->elems.v);
		free(c->errmsg);
	}
	free(m->pool);
	free(m->ring);
	cwi_crew_free(&m->crew);
	pthread_cond_destroy(&m->cv_park);
	pthread_cond_destroy(&m->cv_work);
	pthread_cond_destroy(&m->cv_ready);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->in_lock);
	free(m);
}

static void
pmap_destroy(cwi_iter *it)
{
	pmap_iter *m = (pmap_iter *)it;

	cwi_tune_cancel(m->pl);
	pthread_mutex_lock(&m->lock);
	m->stop = true;
	atomic_store(&m->halt, true);
	pthread_cond_broadcast(&m->cv_ready);
	pthread_cond_broadcast(&m->cv_work);
	pthread_cond_broadcast(&m->cv_park);
	pthread_mutex_unlock(&m->lock);
	cwi_crew_join(&m->crew);
	cwi_iter_destroy(m->input);
	cwi_tune_detach(&m->tune);
	pmap_free(m);
}

/* ---- parallel map: saving and restoring ------------------------------------ */

/* Stops workers from starting chunks and waits for those under way, so
 * that every chunk pulled is deposited. (lock held) */
static void
pmap_quiesce(pmap_iter *m)
{
	m->pausing = true;
	while (m->working > 0 && !m->cancel) {
		m->consumer_waiting = true;
		pthread_cond_wait(&m->cv_ready, &m->lock);
		m->consumer_waiting = false;
	}
}

/* The completed results in output order, as one array. (lock held) */
static cachew_err
pmap_save_results(pmap_iter *m, cwi_state_writer *w)
{
	size_t total = 0;
	cachew_err rv = CACHEW_OK;

	for (int pass = 0; pass < 2; pass++) {
		uint64_t seq = m->next_out;
		map_chunk *c = m->deterministic ? m->ring[seq % m->limit]
						: m->done_head;
		if (pass == 1)
			cwi_sw_array(w, total);
		while (c != NULL && rv == CACHEW_OK) {
			if (c->err != CACHEW_OK)
				return cwi_fail(c->err, "%s", c->errmsg);
			for (size_t i = c->pos; pass == 1 && i < c->elems.n &&
			    rv == CACHEW_OK; i++)
				rv = cwi_sw_element(w, c->elems.v[i]);
			total += c->elems.n - c->pos;
			if (m->deterministic) {
				seq++;
				c = seq < m->next_out + m->limit
				    ? m->ring[seq % m->limit] : NULL;
			} else {
				c = c->next;
			}
		}
	}
	return rv;
}

static cachew_err
pmap_save(cwi_iter *it, cwi_state_writer *w)
{
	pmap_iter *m = (pmap_iter *)it;
	cachew_err rv;

	pthread_mutex_lock(&m->lock);
	pmap_quiesce(m);
	if (m->cancel) {
		rv = cwi_fail(CACHEW_ECANCELED, "map: cancelled");
	} else {
		cwi_sw_array(w, 3);
		/* Workers are idle: next_index is stable. */
		cwi_sw_uint(w, m->next_index);
		rv = pmap_save_results(m, w);
	}
	pthread_mutex_unlock(&m->lock);
	if (rv == CACHEW_OK) {
		pthread_mutex_lock(&m->in_lock);
		rv = cwi_iter_save(m->input, w);
		pthread_mutex_unlock(&m->in_lock);
	}
	pthread_mutex_lock(&m->lock);
	m->pausing = false;
	if (m->idle > 0)
		pthread_cond_broadcast(&m->cv_work);
	pthread_mutex_unlock(&m->lock);
	return rv;
}

/* The saved results become the first completed chunk. */
static cachew_err
pmap_restore(cwi_iter *it, cwi_state_reader *r)
{
	pmap_iter *m = (pmap_iter *)it;
	map_chunk *c = m->spare;

	if (!cwi_sr_array(r, "map", 3) ||
	    !cwi_sr_uint(r, "index", &m->next_index, UINT64_MAX) ||
	    !cwi_sr_elements(r, "computed", &c->elems)) {
		/* What was read before the failure goes: the spare chunk
		 * must come back empty, or the next pull would map it. */
		cwi_chunk_clear(&c->elems);
		return cwi_sr_error(r);
	}
	if (c->elems.n > 0) {
		m->spare = c->next;
		c->next = NULL;
		c->seq = m->next_seq++;
		c->pos = 0;
		c->bytes = 0;
		for (size_t i = 0; i < c->elems.n; i++)
			c->bytes += cwi_element_nbytes(c->elems.v[i]);
		m->inflight++;
		m->buffered += (int64_t)c->elems.n;
		cwi_tune_bytes_add(&m->tune, (int64_t)c->bytes);
		if (m->deterministic) {
			m->ring[c->seq % m->limit] = c;
		} else {
			m->done_head = m->done_tail = c;
		}
	}
	return cwi_iter_restore(m->input, r);
}

static const cwi_iter_ops pmap_iter_ops = {
    .next = pmap_next,
    .destroy = pmap_destroy,
    .save = pmap_save,
    .restore = pmap_restore,
};

static cachew_err
pmap_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args,
    int64_t parallel)
{
	pmap_iter *m = calloc(1, sizeof(*m));
	int cap;
	cachew_err rv;

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->base.ops = &pmap_iter_ops;
	m->base.async = true;
	m->node = node;
	m->pl = args->pl;
	m->epoch = args->epoch;
	m->stats = cwi_pipeline_stats(args->pl, node);
	m->deterministic = cwi_node_bool(node, "deterministic") &&
	    args->pl->opts.deterministic;
	m->autoscale = parallel == CACHEW_AUTO;
	cap = m->autoscale ? (int)args->pl->opts.threads : (int)parallel;
	if (cap < 1)
		cap = 1;
	cwi_op_ctx_init(&m->ctx, node, args->pl, args->epoch);
	cwi_sizer_init(&m->sizer, node->fn->def.cost_ns);
	atomic_init(&m->halt, false);
	atomic_init(&m->busy_ns, 0);
	cwi_mutex_init(&m->in_lock);
	cwi_mutex_init(&m->lock);
	pthread_cond_init(&m->cv_ready, NULL);
	pthread_cond_init(&m->cv_work, NULL);
	pthread_cond_init(&m->cv_park, NULL);
	m->limit = 2 * (size_t)cap + 2;
	m->pool = calloc(m->limit, sizeof(*m->pool));
	m->ring = calloc(m->limit, sizeof(*m->ring));
	rv = m->pool != NULL && m->ring != NULL
		 ? cwi_crew_init(&m->crew, cap)
		 : cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv != CACHEW_OK) {
		pmap_free(m);
		return rv;
	}
	for (size_t i = 0; i < m->limit; i++) {
		m->pool[i].next = m->spare;
		m->spare = &m->pool[i];
	}
	rv = cwi_tune_attach(&m->tune, args->pl, pmap_wake, m);
	if (rv != CACHEW_OK) {
		pmap_free(m);
		return rv;
	}
	rv = cwi_iter_create(&m->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		cwi_tune_detach(&m->tune);
		pmap_free(m);
		return rv;
	}
	pmap_publish(m);
	*out = &m->base;
	return CACHEW_OK;
}

/* ---- operator -------------------------------------------------------------------- */

static cachew_err
map_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	int64_t parallel = cwi_node_int(node, "parallel");
	map_iter *m;
	cachew_err rv;

	if (parallel == CACHEW_AUTO || parallel > 1)
		return pmap_create(out, node, args, parallel);
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->base.ops = &map_iter_ops;
	cwi_op_ctx_init(&m->ctx, node, args->pl, args->epoch);
	rv = cwi_iter_create(&m->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(m);
		return rv;
	}
	*out = &m->base;
	return CACHEW_OK;
}

static const cwi_param_spec map_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the map function"},
    {.name = "parallel", .type = CWI_P_INT,
	.flags = CWI_PF_PERF | CWI_PF_AUTO, .def_int = 1, .min = 0,
	.max = 1024, .help = "threads: 1 = inline, N, or auto"},
    {.name = "deterministic", .type = CWI_P_BOOL, .def_int = 1,
	.help = "keep input order under parallelism"},
};

const cwi_dataset_op cwi_op_map = {
    .name = "map",
    .doc = "applies a map function to every element",
    .params = map_params,
    .nparams = sizeof(map_params) / sizeof(map_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_MAP,
    .iter_create = map_create,
    .saves = "the results computed and not yet returned (a parallel map "
	"stops its workers to save them), the input index after them, and the "
	"input",
    .infer = cwi_infer_map,
};
