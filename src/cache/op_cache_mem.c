/*
 * op_cache_mem.c - cache() without a root: tf.data's in-memory cache
 * (Dataset.cache() with no filename).
 *
 * The elements live in a store that hangs off the dataset node
 * (cwi_node.op_state), so every iterator of the dataset shares it, as
 * tf.data's memory cache belongs to the dataset: the first pass that
 * reads the input to its end fills it; the passes after it (a new
 * iterator, or the next repetition under repeat) read the elements from
 * memory (references: no copy) without starting the input. A pass cut
 * short (its iterator destroyed before the end) discards what it
 * gathered, as tf.data discards a partially read first epoch. While one
 * iterator fills the store, others pass their input through without
 * filling. The store holds at most memory_limit bytes (0: the pipeline's
 * ram_budget); a pass that would go over fails with CACHEW_ENOMEM naming
 * both, rather than exhausting the machine.
 *
 * Lock order: store_lock (creating the store) before store->lock; neither
 * is held while the input runs.
 */
#include "cache_int.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct mem_store {
	pthread_mutex_t lock;
	bool complete;     /* elements hold a whole pass */
	bool filling;      /* an iterator is filling it */
	cwi_chunk elements;
	uint64_t bytes;
} mem_store;

static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;

static void
store_free(void *arg)
{
	mem_store *s = arg;

	cwi_chunk_free(&s->elements);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* The node's store, created on first use; NULL on ENOMEM. */
static mem_store *
store_of(const cwi_node *node)
{
	cwi_node *n = (cwi_node *)node; /* op_state is its mutable part */
	mem_store *s = atomic_load(&n->op_state);

	if (s != NULL)
		return s;
	pthread_mutex_lock(&store_lock);
	s = atomic_load(&n->op_state);
	if (s == NULL) {
		s = calloc(1, sizeof(*s));
		if (s != NULL) {
			pthread_mutex_init(&s->lock, NULL);
			n->op_state_free = store_free;
			atomic_store(&n->op_state, s);
		}
	}
	pthread_mutex_unlock(&store_lock);
	return s;
}

typedef enum mem_mode {
	MEM_READ, /* from the complete store */
	MEM_FILL, /* the input, gathered into `fill` */
	MEM_PASS  /* the input only (another fills, or a restored pass) */
} mem_mode;

typedef struct mem_iter {
	cwi_iter base;
	mem_store *store;
	mem_mode mode;
	cwi_iter *input;
	uint64_t index;    /* elements delivered */
	uint64_t limit;    /* bytes the store may hold */
	cwi_chunk fill;    /* MEM_FILL: the elements so far (references) */
	uint64_t fill_bytes;
} mem_iter;

static cachew_err
mem_read(mem_iter *m, cwi_chunk *out, size_t max)
{
	size_t got = 0;

	/* A complete store never changes: read without the lock. */
	while (got < max && m->index < m->store->elements.n) {
		cwi_element *e = m->store->elements.v[m->index++];
		cwi_element_retain(e);
		cwi_chunk_push(out, e);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

/* Makes the gathered pass the store's: later passes read it. */
static void
mem_publish(mem_iter *m)
{
	mem_store *s = m->store;

	pthread_mutex_lock(&s->lock);
	cwi_chunk_free(&s->elements);
	s->elements = m->fill;
	s->bytes = m->fill_bytes;
	s->complete = true;
	s->filling = false;
	pthread_mutex_unlock(&s->lock);
	memset(&m->fill, 0, sizeof(m->fill));
	m->mode = MEM_PASS;
}

static cachew_err
mem_gather(mem_iter *m, const cwi_chunk *out, size_t n0)
{
	cwi_iter *it = &m->base;

	for (size_t i = n0; i < out->n; i++) {
		m->fill_bytes += cwi_element_nbytes(out->v[i]);
		if (m->fill_bytes > m->limit)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "cache: the in-memory cache (cache() without a "
			    "root) would hold over %llu bytes after %llu "
			    "elements, past its memory_limit of %llu bytes: "
			    "give a larger memory_limit, or a root to cache "
			    "on disk",
			    (unsigned long long)m->fill_bytes - 1,
			    (unsigned long long)m->fill.n + 1,
			    (unsigned long long)m->limit);
		if (cwi_chunk_reserve(&m->fill, 1) != CACHEW_OK)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "cache: out of memory");
		cwi_element_retain(out->v[i]);
		cwi_chunk_push(&m->fill, out->v[i]);
	}
	return CACHEW_OK;
}

static cachew_err
mem_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	mem_iter *m = (mem_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	if (m->mode == MEM_READ)
		return mem_read(m, out, max);
	rv = cwi_iter_next(m->input, out, max);
	m->index += out->n - n0;
	if (m->mode != MEM_FILL)
		return rv;
	if (rv == CACHEW_OK || rv == CACHEW_EOF) {
		cachew_err grv = mem_gather(m, out, n0);
		if (grv != CACHEW_OK)
			return grv;
	}
	if (rv == CACHEW_EOF)
		mem_publish(m);
	return rv;
}

/* Gives the store back unfilled (a pass cut short, or failed). */
static void
mem_abandon(mem_iter *m)
{
	if (m->mode != MEM_FILL)
		return;
	pthread_mutex_lock(&m->store->lock);
	m->store->filling = false;
	pthread_mutex_unlock(&m->store->lock);
	cwi_chunk_free(&m->fill);
	m->mode = MEM_PASS;
}

static void
mem_destroy(cwi_iter *it)
{
	mem_iter *m = (mem_iter *)it;

	mem_abandon(m);
	cwi_iter_destroy(m->input);
	free(m);
}

/* [elements delivered, reading from memory, the input (or nil)]. */
static cachew_err
mem_save(cwi_iter *it, cwi_state_writer *w)
{
	mem_iter *m = (mem_iter *)it;

	cwi_sw_array(w, 3);
	cwi_sw_uint(w, m->index);
	cwi_sw_bool(w, m->mode == MEM_READ);
	if (m->mode == MEM_READ) {
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	return cwi_iter_save(m->input, w);
}

/* Skips n elements of the input (a restored read position whose store
 * this process does not hold). */
static cachew_err
mem_skip_input(mem_iter *m, uint64_t n)
{
	cwi_chunk c = {0};
	cachew_err rv = CACHEW_OK;

	while (n > 0 && rv == CACHEW_OK) {
		size_t k = n < 1024 ? (size_t)n : 1024;
		rv = cwi_iter_next(m->input, &c, k);
		n -= c.n;
		cwi_chunk_clear(&c);
	}
	cwi_chunk_free(&c);
	return rv == CACHEW_EOF ? CACHEW_OK : rv;
}

/* A restored pass never fills the store: what it delivered before the
 * save is not in this iterator's hands. */
static cachew_err
mem_restore(cwi_iter *it, cwi_state_reader *r)
{
	mem_iter *m = (mem_iter *)it;
	bool reading = false;
	uint64_t index = 0;

	if (!cwi_sr_array(r, "cache", 3) ||
	    !cwi_sr_uint(r, "index", &index, UINT64_MAX) ||
	    !cwi_sr_bool(r, "reading", &reading))
		return cwi_sr_error(r);
	mem_abandon(m);
	m->index = index;
	if (!reading && m->mode != MEM_READ)
		return cwi_iter_restore(m->input, r);
	if (!reading) {
		/* Saved while a pass computed; a pass completed the store
		 * since (this iterator has no input): read on from memory,
		 * which holds that pass's elements. */
		if (!cwi_sr_skip(r, "input state"))
			return cwi_sr_error(r);
		return CACHEW_OK;
	}
	if (!cwi_sr_array(r, "no input", 0))
		return cwi_sr_error(r);
	if (m->mode == MEM_READ)
		return CACHEW_OK;
	return mem_skip_input(m, index);
}

static const cwi_iter_ops mem_iter_ops = {
    .next = mem_next,
    .destroy = mem_destroy,
    .save = mem_save,
    .restore = mem_restore,
};

cachew_err
cwi_mem_cache_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	mem_iter *m = calloc(1, sizeof(*m));
	int64_t limit = cwi_node_int(node, "memory_limit");
	cachew_err rv = CACHEW_OK;

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->base.ops = &mem_iter_ops;
	m->limit = limit > 0 ? (uint64_t)limit
			     : (uint64_t)args->pl->opts.ram_budget;
	m->store = store_of(node);
	if (m->store == NULL) {
		free(m);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&m->store->lock);
	if (m->store->complete) {
		m->mode = MEM_READ;
	} else if (!m->store->filling) {
		m->mode = MEM_FILL;
		m->store->filling = true;
	} else {
		m->mode = MEM_PASS;
	}
	pthread_mutex_unlock(&m->store->lock);
	m->base.cache_hit = m->mode == MEM_READ;
	if (m->mode != MEM_READ)
		rv = cwi_iter_create(&m->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		mem_abandon(m);
		free(m);
		return rv;
	}
	*out = &m->base;
	return CACHEW_OK;
}
