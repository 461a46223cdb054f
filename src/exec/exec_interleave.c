/*
 * exec_interleave.c - interleave(fn, cycle, block, parallel, deterministic):
 * opens a sequence (a flat-map function) per input element and takes
 * `block` elements in turn from `cycle` open sequences.
 *
 * Order, exactly as tf.data's InterleaveDatasetOp: a cursor walks the cycle
 * positions. At an open position it takes the next element (after `block`
 * of them it moves on); when that sequence is exhausted it closes it and
 * moves on. At an empty position it pulls the next input element and opens
 * its sequence there, staying put; once the input is exhausted empty
 * positions are skipped. The end comes when the input and every sequence
 * are exhausted. A sequence's cachew_op_ctx index is its input element's
 * index.
 *
 * Parallel form (parallel=N or auto): the consumer still walks the cycle
 * and pulls the input itself (input elements are usually file names), but
 * workers open the sequences and read them ahead, in chunks sized to
 * ~500 us of work, into per-position buffers of at most slot_limit
 * elements, preferring the positions the cursor reaches first. With
 * deterministic=true the consumer waits for the position at the cursor,
 * so the order is the sequential one (if no worker is reading that
 * position, the consumer reads it itself instead of paying a wake-up);
 * with deterministic=false it moves to any position with data instead of
 * waiting (or opens a new sequence).
 * Errors of a sequence are kept after its elements and reported when the
 * consumer reaches them, so the first failure in output order is the one
 * reported.
 *
 * Slot fields: open, busy, eof, err, errmsg, buf, pos and bytes are under
 * `lock`; the sequence itself (ctx, seq, seq_open, input) belongs to
 * whoever set busy (a worker, or the consumer when no worker is ours), and
 * to the consumer while the slot is not open.
 *
 * Saving a position (exec_state.h) keeps workers off the positions
 * (`pausing`) and waits for those being read; each position's element,
 * read count, offset (a built-in file function's) and read-ahead buffer
 * are then still. A restore reopens each sequence from its element, seeks
 * or reads past what it had read, and puts the buffer back, which either
 * form hands out first.
 *
 * Lock order: one lock, not held while calling the input's next() or the
 * flat-map function. The tuner registry lock is taken before it by the
 * cancellation wake-up and never while holding it.
 */
#include "exec_ops.h"
#include "exec_state.h"
#include "exec_tune.h"

#include <stdlib.h>

typedef struct ilv_slot {
	/* The sequence: owned by the reader (see above). seq_open sits in a
	 * word of its own, apart from the flags under `lock`. */
	cwi_element *input; /* until its sequence opens */
	cwi_element *opener; /* then: the element that opened it (a save
			      * reopens the sequence from it) */
	uint64_t index;     /* input element index */
	uint64_t read;      /* elements read from the sequence */
	bool seq_open;      /* flat_close pending */
	cachew_op_ctx ctx;
	void *seq;
	/* Under `lock` (parallel form). */
	bool open;          /* the position holds a sequence */
	bool busy;          /* a worker reads it */
	bool eof;           /* nothing follows buf */
	cachew_err err;     /* follows buf */
	char *errmsg;
	cwi_chunk buf;      /* read ahead: v[pos..n) */
	size_t pos;
	size_t bytes;       /* of v[pos..n) */
} ilv_slot;

#define ILV_ANY SIZE_MAX

typedef struct ilv_iter {
	cwi_iter base;
	cwi_iter *input;
	const cwi_node *node;
	cwi_pipeline *pl;
	uint64_t epoch; /* the iterator's (random streams draw from it) */
	cwi_stats *stats;
	size_t cycle, block;
	bool parallel, deterministic, autoscale;
	ilv_slot *slots;

	/* The cursor (consumer thread; under `lock` when parallel). */
	size_t cur, block_index, num_open;
	bool input_end;
	cachew_err pending; /* the input failed after elements delivered */
	uint64_t next_index;
	cwi_chunk inbuf;

	/* Parallel form. */
	cwi_tune_op tune;
	bool attached;
	cwi_sizer sizer;
	_Atomic uint64_t busy_ns;
	pthread_mutex_t lock;
	pthread_cond_t cv_ready, cv_work, cv_park;
	cwi_crew crew;
	bool started, stop, cancel;
	bool pausing; /* a save waits for the positions being read */
	bool consumer_waiting;
	size_t wait_slot; /* the position the consumer waits on, or ILV_ANY */
	int idle;
	size_t slot_limit;
	int64_t buffered;
	cwi_chunk scratch; /* the consumer's, when it reads itself */
	uint64_t wait_ns;  /* consumer thread only */
	cwi_tune_clock clock;
} ilv_iter;

/* ---- sequences ------------------------------------------------------------ */

static void
slot_open_seq(ilv_iter *m, ilv_slot *s, cachew_err *err, char **msg)
{
	cachew_err rv;

	cwi_op_ctx_init(&s->ctx, m->node, m->pl, m->epoch);
	cwi_op_ctx_at(&s->ctx, s->index);
	s->seq = NULL;
	rv = m->node->fn->def.flat_open(&s->ctx, s->input, &s->seq);
	cwi_element_release(s->opener);
	s->opener = s->input;
	s->input = NULL;
	if (rv != CACHEW_OK) {
		*err = cwi_fn_errcode(rv);
		*msg = cwi_fn_errmsg(m->node, &s->ctx, rv);
		return;
	}
	s->seq_open = true;
}

/* Reads up to k elements into dst (room reserved). Sets *eof at the end of
 * the sequence and *err / *msg when it fails; what came before stays. */
static size_t
slot_read_seq(ilv_iter *m, ilv_slot *s, cwi_chunk *dst, size_t k, bool *eof,
    cachew_err *err, char **msg)
{
	size_t got = 0;

	while (got < k) {
		cwi_element *e = NULL;
		cachew_err rv = m->node->fn->def.flat_next(&s->ctx, s->seq, &e);
		if (rv == CACHEW_EOF) {
			*eof = true;
			break;
		}
		if (rv != CACHEW_OK || e == NULL) {
			cwi_element_release(e);
			*err = cwi_fn_errcode(rv);
			*msg = cwi_fn_errmsg(m->node, &s->ctx, rv);
			break;
		}
		cwi_chunk_push(dst, e);
		got++;
	}
	s->read += got;
	return got;
}

static void
slot_close_seq(ilv_iter *m, ilv_slot *s)
{
	if (s->seq_open && m->node->fn->def.flat_close != NULL)
		m->node->fn->def.flat_close(s->seq);
	s->seq_open = false;
	s->seq = NULL;
}

/* Gives the empty position s the input element in m->inbuf. */
static void
slot_assign(ilv_iter *m, ilv_slot *s)
{
	s->input = m->inbuf.v[0];
	m->inbuf.n = 0;
	s->index = m->next_index++;
	s->read = 0;
	s->open = true;
	s->eof = false;
	s->err = CACHEW_OK;
	m->num_open++;
}

/* Empties an exhausted position (its sequence is closed). */
static void
slot_reset(ilv_iter *m, ilv_slot *s)
{
	s->open = false;
	s->eof = false;
	cwi_element_release(s->opener);
	s->opener = NULL;
	s->buf.n = 0;
	s->pos = 0;
	s->bytes = 0;
	m->num_open--;
}

static void
advance(ilv_iter *m)
{
	m->block_index = 0;
	m->cur = (m->cur + 1) % m->cycle;
}

/* Hands over the error of slot s (its elements are delivered). */
static cachew_err
slot_fail(ilv_iter *m, ilv_slot *s)
{
	if (s->errmsg != NULL) {
		cwi_pipeline_fail(m->pl, s->err, "%s", s->errmsg);
		free(s->errmsg);
		s->errmsg = NULL;
	}
	return s->err;
}

/* ---- sequential form -------------------------------------------------------------- */

static cachew_err
ilv_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	ilv_iter *m = (ilv_iter *)it;
	size_t got = 0;
	cachew_err rv;

	if (m->pending != CACHEW_OK)
		return m->pending;
	while (got < max) {
		ilv_slot *s = &m->slots[m->cur];
		if (s->open && s->pos < s->buf.n) {
			/* Read ahead by a parallel interleave whose state
			 * was restored here. */
			size_t t = m->block - m->block_index;
			if (t > max - got)
				t = max - got;
			if (t > s->buf.n - s->pos)
				t = s->buf.n - s->pos;
			memcpy(out->v + out->n, s->buf.v + s->pos,
			    t * sizeof(*out->v));
			out->n += t;
			s->pos += t;
			got += t;
			m->block_index += t;
			if (s->pos == s->buf.n)
				s->pos = s->buf.n = 0;
			if (m->block_index == m->block)
				advance(m);
		} else if (s->open && !s->eof && s->err == CACHEW_OK) {
			size_t want = m->block - m->block_index, n;
			if (want > max - got)
				want = max - got;
			n = slot_read_seq(
			    m, s, out, want, &s->eof, &s->err, &s->errmsg);
			if (s->eof || s->err != CACHEW_OK)
				slot_close_seq(m, s);
			got += n;
			m->block_index += n;
			if (m->block_index == m->block)
				advance(m);
		} else if (s->open && s->err != CACHEW_OK) {
			if (got > 0)
				break;
			return slot_fail(m, s);
		} else if (s->open) {
			slot_reset(m, s);
			advance(m);
		} else if (!m->input_end) {
			rv = cwi_iter_next(m->input, &m->inbuf, 1);
			if (rv == CACHEW_EOF) {
				m->input_end = true;
				continue;
			}
			if (rv != CACHEW_OK) {
				if (got == 0)
					return rv;
				m->pending = rv;
				break;
			}
			slot_assign(m, s);
			slot_open_seq(m, s, &s->err, &s->errmsg);
			if (s->err != CACHEW_OK)
				s->eof = true;
		} else if (m->num_open == 0) {
			break;
		} else {
			advance(m);
		}
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

/* ---- parallel form: workers ------------------------------------------------------------ */

static void
ilv_publish(ilv_iter *m)
{
	if (m->stats == NULL)
		return;
	atomic_store_explicit(&m->stats->parallelism,
	    m->crew.active > 0			  ? m->crew.active
		: !m->started && !m->autoscale ? m->crew.cap
					       : 1,
	    memory_order_relaxed);
	atomic_store_explicit(&m->stats->buffer_limit,
	    (int64_t)(m->cycle * m->slot_limit), memory_order_relaxed);
	atomic_store_explicit(
	    &m->stats->buffered, m->buffered, memory_order_relaxed);
}

static bool
slot_wants_work(const ilv_iter *m, const ilv_slot *s)
{
	size_t avail = s->buf.n - s->pos;

	if (!s->open || s->busy || s->eof || s->err != CACHEW_OK || m->pausing)
		return false;
	return avail < m->slot_limit &&
	    (avail == 0 || cwi_tune_bytes_ok(&m->tune));
}

/* The position to read next, nearest to the cursor first, or -1. */
static long
ilv_pick(const ilv_iter *m)
{
	for (size_t i = 0; i < m->cycle; i++) {
		size_t j = (m->cur + i) % m->cycle;
		if (slot_wants_work(m, &m->slots[j]))
			return (long)j;
	}
	return -1;
}

/* Opens (if needed) and reads ahead slot j. Called with `lock` held and
 * slot_wants_work() true; returns with it held. A worker adds its time to
 * the node's busy time; the consumer's is timed by the wrapper. */
static void
ilv_fill(ilv_iter *m, size_t j, cwi_chunk *scratch, bool worker)
{
	ilv_slot *s = &m->slots[j];
	size_t k = cwi_sizer_chunk(&m->sizer), avail, n = 0, bytes = 0;
	cachew_err err = CACHEW_OK;
	char *msg = NULL;
	bool eof = false;
	uint64_t t0, dt;

	if (2 * k > m->slot_limit) {
		m->slot_limit = 2 * k; /* never shrinks: buffers fit */
		ilv_publish(m);
	}
	avail = s->buf.n - s->pos;
	if (k > m->slot_limit - avail)
		k = m->slot_limit - avail;
	/* Make room for k more now: the consumer only takes from the front
	 * meanwhile, so the append below cannot need more. */
	if (s->pos > 0) {
		memmove(s->buf.v, s->buf.v + s->pos, avail * sizeof(*s->buf.v));
		s->buf.n = avail;
		s->pos = 0;
	}
	if (cwi_chunk_reserve(&s->buf, k) != CACHEW_OK) {
		s->err = CACHEW_ENOMEM;
		s->errmsg = cwi_asprintf("interleave: out of memory");
		s->eof = true;
		if (m->consumer_waiting)
			pthread_cond_signal(&m->cv_ready);
		return;
	}
	s->busy = true;
	pthread_mutex_unlock(&m->lock);

	t0 = cwi_now_ns();
	if (!s->seq_open)
		slot_open_seq(m, s, &err, &msg);
	scratch->n = 0;
	if (err == CACHEW_OK && cwi_chunk_reserve(scratch, k) != CACHEW_OK) {
		err = CACHEW_ENOMEM;
		msg = cwi_asprintf("interleave: out of memory");
	}
	if (err == CACHEW_OK)
		n = slot_read_seq(m, s, scratch, k, &eof, &err, &msg);
	if (eof || err != CACHEW_OK)
		slot_close_seq(m, s);
	dt = cwi_now_ns() - t0;
	cwi_sizer_update(&m->sizer, n + (err != CACHEW_OK), dt);
	atomic_fetch_add_explicit(&m->busy_ns, dt, memory_order_relaxed);
	if (m->stats != NULL && worker)
		cwi_stat_add(&m->stats->busy_ns, dt);
	for (size_t i = 0; i < n; i++)
		bytes += cwi_element_nbytes(scratch->v[i]);

	pthread_mutex_lock(&m->lock);
	if (n > 0) {
		memcpy(s->buf.v + s->buf.n, scratch->v, n * sizeof(*s->buf.v));
		s->buf.n += n;
		scratch->n = 0;
	}
	s->bytes += bytes;
	m->buffered += (int64_t)n;
	cwi_tune_bytes_add(&m->tune, (int64_t)bytes);
	if (err != CACHEW_OK) {
		s->err = err;
		s->errmsg = msg;
		s->eof = true;
	} else if (eof) {
		s->eof = true;
	}
	s->busy = false;
	ilv_publish(m);
	if (m->consumer_waiting &&
	    (m->wait_slot == ILV_ANY || m->wait_slot == j)) {
		/* Signal unlocked: the consumer wakes to a free lock. */
		pthread_mutex_unlock(&m->lock);
		pthread_cond_signal(&m->cv_ready);
		pthread_mutex_lock(&m->lock);
	}
}

static void *
ilv_worker(void *arg)
{
	cwi_crew_member *w = arg;
	ilv_iter *m = w->op;
	cwi_chunk scratch = {0};

	pthread_mutex_lock(&m->lock);
	while (!m->stop && !m->cancel) {
		long j;
		if (w->id >= m->crew.active) {
			pthread_cond_wait(&m->cv_park, &m->lock);
			continue;
		}
		j = ilv_pick(m);
		if (j < 0) {
			m->idle++;
			pthread_cond_wait(&m->cv_work, &m->lock);
			m->idle--;
			continue;
		}
		ilv_fill(m, (size_t)j, &scratch, true);
	}
	pthread_mutex_unlock(&m->lock);
	cwi_chunk_free(&scratch);
	return NULL;
}

/* ---- parallel form: the consumer ---------------------------------------------------------- */

/* deterministic=false: another position to go to instead of waiting: one
 * with data (or an end to deliver), else an empty one to open. */
static long
ilv_other(const ilv_iter *m)
{
	long empty = -1;

	for (size_t i = 1; i < m->cycle; i++) {
		size_t j = (m->cur + i) % m->cycle;
		const ilv_slot *s = &m->slots[j];
		if (s->open && (s->buf.n > s->pos ||
				   (!s->busy && (s->eof || s->err != CACHEW_OK))))
			return (long)j;
		if (!s->open && !m->input_end && empty < 0)
			empty = (long)j;
	}
	return empty;
}

/* Moves up to t elements of s into out. (lock held) */
static void
ilv_take_from(ilv_iter *m, ilv_slot *s, cwi_chunk *out, size_t t)
{
	size_t avail = s->buf.n - s->pos, half = m->slot_limit / 2;
	size_t dec = avail == t ? s->bytes : (size_t)(s->bytes * t / avail);

	memcpy(out->v + out->n, s->buf.v + s->pos, t * sizeof(*out->v));
	out->n += t;
	s->pos += t;
	s->bytes -= dec;
	m->buffered -= (int64_t)t;
	cwi_tune_bytes_add(&m->tune, -(int64_t)dec);
	if (s->pos == s->buf.n) {
		s->pos = 0;
		s->buf.n = 0;
	}
	/* Wake readers once, when the position falls below half. */
	if (m->idle > 0 && avail > half && avail - t <= half &&
	    slot_wants_work(m, s))
		pthread_cond_broadcast(&m->cv_work);
}

static void
ilv_wait(ilv_iter *m, size_t slot)
{
	uint64_t t0;

	if (m->idle > 0 && ilv_pick(m) >= 0)
		pthread_cond_broadcast(&m->cv_work);
	t0 = cwi_now_ns();
	m->consumer_waiting = true;
	m->wait_slot = slot;
	pthread_cond_wait(&m->cv_ready, &m->lock);
	m->consumer_waiting = false;
	m->wait_ns += cwi_now_ns() - t0;
}

/* The sequential walk over read-ahead buffers. (lock held) */
static cachew_err
ilv_take(ilv_iter *m, cwi_chunk *out, size_t max)
{
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		ilv_slot *s = &m->slots[m->cur];
		size_t avail = s->buf.n - s->pos;
		long other;

		if (s->open && avail > 0) {
			size_t t = m->block - m->block_index;
			if (t > max - got)
				t = max - got;
			if (t > avail)
				t = avail;
			ilv_take_from(m, s, out, t);
			got += t;
			m->block_index += t;
			if (m->block_index == m->block)
				advance(m);
		} else if (s->open && !s->busy && s->err != CACHEW_OK) {
			if (got > 0)
				break;
			return slot_fail(m, s);
		} else if (s->open && !s->busy && s->eof) {
			slot_reset(m, s);
			advance(m);
		} else if (s->open) {
			if (got > 0)
				break;
			if (m->cancel)
				return CACHEW_ECANCELED;
			if (!m->deterministic && (other = ilv_other(m)) >= 0) {
				m->cur = (size_t)other;
				m->block_index = 0;
			} else if (!s->busy) {
				/* Nobody reads the position we need (a sequence
				 * just opened, or no thread of the budget is
				 * ours): read it here rather than wait for a
				 * wake-up. */
				ilv_fill(m, m->cur, &m->scratch, false);
			} else {
				ilv_wait(m, m->deterministic ? m->cur : ILV_ANY);
			}
		} else if (!m->input_end) {
			pthread_mutex_unlock(&m->lock);
			rv = cwi_iter_next(m->input, &m->inbuf, 1);
			pthread_mutex_lock(&m->lock);
			if (rv == CACHEW_EOF) {
				m->input_end = true;
				continue;
			}
			if (rv != CACHEW_OK) {
				if (got == 0)
					return rv;
				m->pending = rv;
				break;
			}
			slot_assign(m, s);
			if (m->idle > 0)
				pthread_cond_signal(&m->cv_work);
		} else if (m->num_open == 0) {
			break;
		} else {
			advance(m);
		}
	}
	ilv_publish(m);
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
ilv_tune(ilv_iter *m)
{
	cwi_tune_sample s;
	uint64_t dt, dwait, dbusy;
	int d, before;

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
		pthread_mutex_lock(&m->lock);
		before = m->crew.active;
		(void)cwi_crew_set(&m->crew, before + 1, ilv_worker, m);
		pthread_cond_broadcast(&m->cv_park);
		ilv_publish(m);
		pthread_mutex_unlock(&m->lock);
		if (m->crew.active == before)
			cwi_tune_give_threads(&m->tune, 1);
	} else if (d < 0 && m->crew.active > 1) {
		pthread_mutex_lock(&m->lock);
		m->crew.active--;
		ilv_publish(m);
		pthread_mutex_unlock(&m->lock);
		cwi_tune_give_threads(&m->tune, 1);
	}
}

static cachew_err
ilv_start(ilv_iter *m)
{
	int n = m->crew.cap;
	cachew_err rv;

	if (m->autoscale)
		n = cwi_tune_take_threads(
		    &m->tune, m->pl->opts.autotune ? 1 : m->crew.cap);
	pthread_mutex_lock(&m->lock);
	rv = cwi_crew_set(&m->crew, n, ilv_worker, m);
	m->started = true;
	ilv_publish(m);
	pthread_mutex_unlock(&m->lock);
	if (m->autoscale && m->crew.active < n)
		cwi_tune_give_threads(&m->tune, n - m->crew.active);
	m->clock.t0 = cwi_now_ns();
	if (rv != CACHEW_OK)
		return cwi_pipeline_fail(m->pl, rv, "interleave(%s): %s",
		    m->node->fn->name, cwi_errmsg_get());
	return CACHEW_OK;
}

static cachew_err
pilv_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	ilv_iter *m = (ilv_iter *)it;
	cachew_err rv;

	if (m->pending != CACHEW_OK)
		return m->pending;
	if (!m->started) {
		rv = ilv_start(m);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (m->autoscale && m->pl->opts.autotune)
		ilv_tune(m);
	pthread_mutex_lock(&m->lock);
	rv = ilv_take(m, out, max);
	pthread_mutex_unlock(&m->lock);
	return rv;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static void
ilv_wake(void *arg)
{
	ilv_iter *m = arg;

	pthread_mutex_lock(&m->lock);
	m->cancel = true;
	pthread_cond_broadcast(&m->cv_ready);
	pthread_cond_broadcast(&m->cv_work);
	pthread_cond_broadcast(&m->cv_park);
	pthread_mutex_unlock(&m->lock);
}

static void
ilv_free(ilv_iter *m)
{
	for (size_t i = 0; m->slots != NULL && i < m->cycle; i++) {
		ilv_slot *s = &m->slots[i];
		slot_close_seq(m, s);
		cwi_element_release(s->input);
		cwi_element_release(s->opener);
		for (size_t j = s->pos; j < s->buf.n; j++)
			cwi_element_release(s->buf.v[j]);
		free(s->buf.v);
		free(s->errmsg);
	}
	free(m->slots);
	cwi_chunk_free(&m->inbuf);
	cwi_chunk_free(&m->scratch);
	if (m->parallel) {
		cwi_crew_free(&m->crew);
		pthread_cond_destroy(&m->cv_park);
		pthread_cond_destroy(&m->cv_work);
		pthread_cond_destroy(&m->cv_ready);
		pthread_mutex_destroy(&m->lock);
	}
	free(m);
}

static void
ilv_destroy(cwi_iter *it)
{
	ilv_iter *m = (ilv_iter *)it;

	if (m->parallel) {
		cwi_tune_cancel(m->pl);
		pthread_mutex_lock(&m->lock);
		m->stop = true;
		pthread_cond_broadcast(&m->cv_ready);
		pthread_cond_broadcast(&m->cv_work);
		pthread_cond_broadcast(&m->cv_park);
		pthread_mutex_unlock(&m->lock);
		cwi_crew_join(&m->crew);
	}
	cwi_iter_destroy(m->input);
	if (m->attached)
		cwi_tune_detach(&m->tune);
	ilv_free(m);
}

/* ---- saving and restoring --------------------------------------------------------------------- */

/* Keeps workers off the positions and waits for those being read, so
 * that each position's sequence, count and buffer hold still. */
static void
ilv_quiesce(ilv_iter *m, bool pause)
{
	bool busy = true;

	if (!m->parallel)
		return;
	pthread_mutex_lock(&m->lock);
	m->pausing = pause;
	while (pause && busy && !m->cancel) {
		busy = false;
		for (size_t i = 0; i < m->cycle; i++)
			busy = busy || m->slots[i].busy;
		if (busy)
			ilv_wait(m, ILV_ANY);
	}
	if (!pause && m->idle > 0)
		pthread_cond_broadcast(&m->cv_work);
	pthread_mutex_unlock(&m->lock);
}

/* A position: closed [], or [index, read, ended, position in the
 * sequence (a built-in file function's offset, else 0), opener (none when
 * ended), read ahead]. */
static cachew_err
ilv_save_slot(ilv_iter *m, const ilv_slot *s, cwi_state_writer *w)
{
	const cwi_element *opener = s->opener != NULL ? s->opener : s->input;
	cachew_err rv;

	if (!s->open) {
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	if (s->err != CACHEW_OK)
		return cwi_fail(s->err, "%s", s->errmsg != NULL ? s->errmsg
		    : "interleave: a sequence failed");
	if (!s->eof && opener == NULL)
		return cwi_fail(CACHEW_EINTERNAL,
		    "interleave(%s): an open position without its element",
		    m->node->fn->name);
	cwi_sw_array(w, 6);
	cwi_sw_uint(w, s->index);
	cwi_sw_uint(w, s->read);
	cwi_sw_bool(w, s->eof);
	cwi_sw_uint(w, s->seq_open && m->node->fn->resume != NULL
		? m->node->fn->resume->tell(s->seq) : 0);
	cwi_sw_array(w, s->eof ? 0 : 1);
	rv = s->eof ? CACHEW_OK : cwi_sw_element(w, opener);
	if (rv == CACHEW_OK)
		rv = cwi_sw_elements(w, s->buf.v + s->pos, s->buf.n - s->pos);
	return rv;
}

/* [cursor, block index, input ended, next index, positions, input]. */
static cachew_err
ilv_save(cwi_iter *it, cwi_state_writer *w)
{
	ilv_iter *m = (ilv_iter *)it;
	cachew_err rv = CACHEW_OK;

	if (m->pending != CACHEW_OK)
		return cwi_fail(m->pending, "interleave: the input failed (%s)",
		    m->pl->errmsg);
	ilv_quiesce(m, true);
	cwi_sw_array(w, 6);
	cwi_sw_uint(w, m->cur);
	cwi_sw_uint(w, m->block_index);
	cwi_sw_bool(w, m->input_end);
	cwi_sw_uint(w, m->next_index);
	cwi_sw_array(w, m->cycle);
	for (size_t i = 0; i < m->cycle && rv == CACHEW_OK; i++)
		rv = ilv_save_slot(m, &m->slots[i], w);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(m->input, w);
	ilv_quiesce(m, false);
	return rv;
}

/* Reopens the sequence of s from its element and seeks to pos (a
 * built-in file function) or reads past what it had read. */
static cachew_err
ilv_reopen(ilv_iter *m, ilv_slot *s, uint64_t read, uint64_t pos,
    cwi_state_reader *r)
{
	cwi_chunk skip = {0};
	cachew_err err = CACHEW_OK;
	char *msg = NULL;
	bool eof = false;

	slot_open_seq(m, s, &err, &msg);
	if (err == CACHEW_OK && s->read < read) {
		cachew_err rv = cwi_seq_seek(m->node->fn, s->seq, pos, r);
		if (rv == CACHEW_OK)
			s->read = read;
		else if (rv != CACHEW_ENOTSUP)
			return rv;
	}
	while (err == CACHEW_OK && !eof && s->read < read) {
		uint64_t k = read - s->read;
		if (k > 256)
			k = 256;
		if (cwi_chunk_reserve(&skip, (size_t)k) != CACHEW_OK) {
			err = CACHEW_ENOMEM;
			break;
		}
		slot_read_seq(m, s, &skip, (size_t)k, &eof, &err, &msg);
		cwi_chunk_clear(&skip);
	}
	cwi_chunk_free(&skip);
	if (err == CACHEW_OK && s->read < read)
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "the sequence of element %llu ends after %llu elements, "
		    "the state says %llu were read",
		    (unsigned long long)s->index,
		    (unsigned long long)s->read, (unsigned long long)read);
	else if (err != CACHEW_OK)
		cwi_sr_fail(r, err, "%s", msg != NULL ? msg
					  : cachew_strerror(err));
	free(msg);
	if (eof) {
		slot_close_seq(m, s);
		s->eof = true;
	}
	return r->err;
}

static cachew_err
ilv_restore_slot(ilv_iter *m, ilv_slot *s, cwi_state_reader *r)
{
	uint64_t n = 0, read = 0, pos = 0;
	cwi_chunk opener = {0};

	if (!cwi_sr_count(r, "position", &n, 6))
		return cwi_sr_error(r);
	if (n == 0)
		return CACHEW_OK;
	if (n != 6) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "position: an array of %llu items, expected 0 or 6",
		    (unsigned long long)n);
		return cwi_sr_error(r);
	}
	if (!cwi_sr_uint(r, "index", &s->index, UINT64_MAX) ||
	    !cwi_sr_uint(r, "read", &read, UINT64_MAX) ||
	    !cwi_sr_bool(r, "ended", &s->eof) ||
	    !cwi_sr_uint(r, "sequence position", &pos, UINT64_MAX) ||
	    !cwi_sr_elements(r, "opener", &opener)) {
		cwi_chunk_free(&opener);
		return cwi_sr_error(r);
	}
	s->open = true;
	m->num_open++;
	if (opener.n != (s->eof ? 0u : 1u)) {
		cwi_chunk_free(&opener);
		cwi_sr_fail(r, CACHEW_ECORRUPT, "%zu opening elements for a "
						"sequence %s",
		    opener.n, s->eof ? "that ended" : "still open");
		return cwi_sr_error(r);
	}
	if (!s->eof) {
		s->input = opener.v[0];
		opener.n = 0;
		if (ilv_reopen(m, s, read, pos, r) != CACHEW_OK) {
			cwi_chunk_free(&opener);
			return cwi_sr_error(r);
		}
	}
	cwi_chunk_free(&opener);
	s->read = read;
	if (!cwi_sr_elements(r, "read ahead", &s->buf))
		return cwi_sr_error(r);
	for (size_t i = 0; i < s->buf.n; i++)
		s->bytes += cwi_element_nbytes(s->buf.v[i]);
	m->buffered += (int64_t)s->buf.n;
	if (m->parallel)
		cwi_tune_bytes_add(&m->tune, (int64_t)s->bytes);
	return CACHEW_OK;
}

static cachew_err
ilv_restore(cwi_iter *it, cwi_state_reader *r)
{
	ilv_iter *m = (ilv_iter *)it;
	uint64_t cur = 0, block_index = 0;

	if (!cwi_sr_array(r, "interleave", 6) ||
	    !cwi_sr_uint(r, "cursor", &cur, m->cycle - 1) ||
	    !cwi_sr_uint(r, "block index", &block_index, m->block - 1) ||
	    !cwi_sr_bool(r, "input ended", &m->input_end) ||
	    !cwi_sr_uint(r, "next index", &m->next_index, UINT64_MAX) ||
	    !cwi_sr_array(r, "positions", m->cycle))
		return cwi_sr_error(r);
	m->cur = (size_t)cur;
	m->block_index = (size_t)block_index;
	for (size_t i = 0; i < m->cycle; i++)
		if (ilv_restore_slot(m, &m->slots[i], r) != CACHEW_OK)
			return cwi_sr_error(r);
	if (m->parallel)
		ilv_publish(m);
	return cwi_iter_restore(m->input, r);
}

static const cwi_iter_ops ilv_iter_ops = {
    .next = ilv_next,
    .destroy = ilv_destroy,
    .save = ilv_save,
    .restore = ilv_restore,
};

static const cwi_iter_ops pilv_iter_ops = {
    .next = pilv_next,
    .destroy = ilv_destroy,
    .save = ilv_save,
    .restore = ilv_restore,
};

static cachew_err
ilv_init_parallel(ilv_iter *m, const cwi_iter_args *args, int64_t parallel)
{
	int64_t cap = parallel == CACHEW_AUTO ? args->pl->opts.threads : parallel;
	cachew_err rv;

	/* A position is read by one worker at a time: more than `cycle`
	 * workers would only wait. */
	if (cap > (int64_t)m->cycle)
		cap = (int64_t)m->cycle;
	if (cap < 1)
		cap = 1;
	m->autoscale = parallel == CACHEW_AUTO;
	m->base.async = true;
	m->deterministic = cwi_node_bool(m->node, "deterministic") &&
	    args->pl->opts.deterministic;
	cwi_sizer_init(&m->sizer, m->node->fn->def.cost_ns);
	atomic_init(&m->busy_ns, 0);
	cwi_mutex_init(&m->lock);
	pthread_cond_init(&m->cv_ready, NULL);
	pthread_cond_init(&m->cv_work, NULL);
	pthread_cond_init(&m->cv_park, NULL);
	m->parallel = true;
	m->slot_limit = 2;
	rv = cwi_crew_init(&m->crew, (int)cap);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_tune_attach(&m->tune, args->pl, ilv_wake, m);
	if (rv != CACHEW_OK)
		return rv;
	m->attached = true;
	return CACHEW_OK;
}

static cachew_err
ilv_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	int64_t parallel = cwi_node_int(node, "parallel");
	ilv_iter *m = calloc(1, sizeof(*m));
	cachew_err rv = CACHEW_OK;

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->node = node;
	m->pl = args->pl;
	m->epoch = args->epoch;
	m->stats = cwi_pipeline_stats(args->pl, node);
	m->cycle = (size_t)cwi_node_int(node, "cycle");
	m->block = (size_t)cwi_node_int(node, "block");
	m->base.ops = &ilv_iter_ops;
	m->slots = calloc(m->cycle, sizeof(*m->slots));
	if (m->slots == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv == CACHEW_OK)
		rv = cwi_chunk_reserve(&m->inbuf, 1);
	if (rv == CACHEW_OK && (parallel == CACHEW_AUTO || parallel > 1)) {
		m->base.ops = &pilv_iter_ops;
		rv = ilv_init_parallel(m, args, parallel);
	}
	if (rv == CACHEW_OK)
		rv = cwi_iter_create(&m->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		if (m->attached)
			cwi_tune_detach(&m->tune);
		ilv_free(m);
		return rv;
	}
	if (m->parallel)
		ilv_publish(m);
	*out = &m->base;
	return CACHEW_OK;
}

static const cwi_param_spec ilv_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the flat-map function that opens a sequence per element"},
    {.name = "cycle", .type = CWI_P_INT, .def_int = 4, .min = 1,
	.max = 65536, .help = "sequences open at once"},
    {.name = "block", .type = CWI_P_INT, .def_int = 1, .min = 1,
	.max = INT32_MAX, .help = "consecutive elements taken from each"},
    {.name = "parallel", .type = CWI_P_INT,
	.flags = CWI_PF_PERF | CWI_PF_AUTO, .def_int = 1, .min = 0,
	.max = 1024, .help = "threads reading ahead: 1 = inline, N, or auto"},
    {.name = "deterministic", .type = CWI_P_BOOL, .def_int = 1,
	.help = "keep the sequential order under parallelism"},
};

const cwi_dataset_op cwi_op_interleave = {
    .name = "interleave",
    .doc = "takes blocks of elements in turn from the sequences a flat-map "
	   "function opens for `cycle` input elements at a time",
    .params = ilv_params,
    .nparams = sizeof(ilv_params) / sizeof(ilv_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_FLAT,
    .iter_create = ilv_create,
    .saves = "the cycle: each open position's element, index, elements "
	"read (and, for a file function, the offset of the next) and "
	"read-ahead buffer (a restore reopens the sequences and seeks, or reads "
	"past what they yielded), the cursor and block count, and the input",
    .infer = cwi_infer_flat,
};
