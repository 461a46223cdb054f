/*
 * op_cache.c - the cache operators (docs/cache.md):
 *
 *   cache_put(root)              passes elements through and writes them to
 *                                the cache of its input's fingerprint,
 *                                committed at the end of a complete pass;
 *   cache_get(root, fingerprint) reads a complete cache: a splittable
 *                                source, one chunk file = one split unit;
 *   cache(root)                  tf.data's cache: reads the cache of its
 *                                input when one is complete (the input is
 *                                never started), else computes and writes.
 *
 * Writing never fails a job: a writer that cannot start or fails (disk
 * full, capacity, I/O) is logged at WARN and aborted, and the data keeps
 * flowing. A pass cut short (an upstream error, an iterator destroyed
 * before the end: `take` downstream) aborts the writer, so nothing becomes
 * visible. Reading verifies every frame before its elements are yielded;
 * on a mismatch the cache is marked bad, cache_get fails with
 * CACHEW_ECORRUPT naming the file, and cache() recomputes: it starts its
 * input, skips the elements already yielded (they were good) and goes on,
 * so the job never sees a bad or duplicated element.
 *
 * The reader runs N threads over a ring of records ahead of the consumer
 * (bounded by RD_RING records and RD_AHEAD_BYTES of payload). Claims are
 * serial: one thread at a time walks the chunks' skeletons in the read
 * order (cwi_cache_reader_claim: a record header, then the next), and
 * the loads of the claimed records (pread, XXH3, decode) run on all the
 * threads at once, each into its record's ring entry; the consumer drains
 * the ring in sequence, so the order within and across chunks is the
 * written one. Why records and not chunks: with a thread per chunk, the
 * thread of the next chunk stopped after its 8 MiB queue while the
 * consumer drained the current 64 MiB chunk, so reading was one stream;
 * and a queue of a whole chunk per thread cost 2-3x the RSS and fresh
 * pages for every buffer.
 *
 * Lock order: a reader's lock only; it is never held while reading a
 * file, calling the store or calling into another iterator. The tuner
 * registry lock is taken before it by the cancellation wake-up.
 */
#include "cache.h"

#include "../exec/exec_state.h"
#include "../exec/exec_tune.h"
#include "../io/io_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>

/* Elements skipped at a time when a restored read resumes. */
#define RD_BATCH 256u
/* Records read ahead of the consumer, at most: a ring of them. */
#define RD_RING 32u
/* Payload bytes read ahead of the consumer before the readers wait (one
 * record always): a few 1 MiB frames, well under the RAM budget, few
 * enough that their buffers come back to the large-buffer cache warm. */
#define RD_AHEAD_BYTES (8u << 20)
/* Reader threads of threads=auto: decoding runs at several hundred MB/s
 * per thread, so more than this only competes with the consumer. */
#define RD_AUTO_MAX 4
/* level=auto compresses this much of the first elements at zstd level 1
 * and writes at level -1 (zstd stores such blocks raw, at several GB/s
 * both ways) when that saves under 10%: decoded photographs save about
 * 5% at level 1 for ten times the CPU of level -1, on both the write and
 * every later read. Smaller samples are too little to judge. */
#define LEVEL_SAMPLE_BYTES (256u << 10)
#define LEVEL_SAMPLE_MIN 4096u
/* Bounds of the writer's queue of elements not yet written. */
#define PUT_QUEUE_MIN (8u << 20)
#define PUT_QUEUE_MAX (64u << 20)

/* ---- shared helpers ------------------------------------------------------- */

/* A read failure that means the cache itself is bad (the store has then
 * marked it bad already), rather than storage that cannot be reached, a
 * cache removed or replaced meanwhile (ENOENT) or the process out of
 * memory. */
static bool
is_corruption(cachew_err rv)
{
	return rv == CACHEW_ECORRUPT;
}

static bool
fp_parse(const char *hex, cachew_fingerprint *out)
{
	bool ok = cwi_cache_fp_parse(hex, out) == CACHEW_OK;

	cwi_clear_errmsg();
	return ok;
}

/* Appends up to `room` payload bytes of e to buf. */
static size_t
sample_element(const cwi_element *e, uint8_t *buf, size_t room)
{
	size_t len = 0;

	for (uint32_t c = 0; c < e->n && len < room; c++) {
		const cwi_tensor *t = &e->comp[c];
		int64_t numel = cwi_tensor_numel(t);
		const uint8_t *d;
		size_t n;

		for (int64_t i = 0; i < numel && len < room; i++) {
			if (t->dtype == CACHEW_BYTES) {
				d = cwi_tensor_str(t, i, &n);
			} else {
				d = cwi_tensor_data(t);
				n = cwi_tensor_nbytes(t);
				i = numel;
			}
			if (n > room - len)
				n = room - len;
			memcpy(buf + len, d, n);
			len += n;
		}
	}
	return len;
}

/* The zstd level of level=auto for data that starts with v[first..n). */
static int
auto_level(const cwi_chunk *v, size_t first)
{
	uint8_t *buf = malloc(LEVEL_SAMPLE_BYTES), *dst = NULL;
	size_t len = 0, bound, z;
	int level = 1;

	for (size_t i = first; buf != NULL && v != NULL && i < v->n &&
			       len < LEVEL_SAMPLE_BYTES; i++)
		len += sample_element(v->v[i], buf + len,
		    LEVEL_SAMPLE_BYTES - len);
	if (len >= LEVEL_SAMPLE_MIN) {
		bound = ZSTD_compressBound(len);
		dst = malloc(bound);
		z = dst != NULL ? ZSTD_compress(dst, bound, buf, len, 1) : 0;
		if (dst != NULL && !ZSTD_isError(z) && z * 10 > len * 9)
			level = -1;
	}
	free(dst);
	free(buf);
	return level;
}

/* The writer options of a node's parameters; level=auto looks at the
 * first elements to write (v[first..n), v may be NULL). */
static cwi_cache_writer_opts
writer_opts(const cwi_node *node, const cwi_chunk *v, size_t first)
{
	cwi_cache_writer_opts o = {0};
	int64_t threads = cwi_node_int(node, "threads");
	int64_t level = cwi_node_int(node, "level");

	o.chunk_bytes = (uint64_t)cwi_node_int(node, "chunk_bytes");
	/* A chunk holds whole frames: small chunks need small frames to be
	 * split at all (a few frames per chunk). */
	o.frame_bytes = CWI_CACHE_FRAME_BYTES;
	if (o.chunk_bytes / 4 < o.frame_bytes)
		o.frame_bytes = o.chunk_bytes / 4 > 1024
				    ? (size_t)(o.chunk_bytes / 4)
				    : 1024;
	o.zstd_level = level == CACHEW_AUTO ? auto_level(v, first) : (int)level;
	o.threads = threads == CACHEW_AUTO ? 0 : (int)threads;
	return o;
}

/* ---- writing: the pass-through half of cache_put and cache ---------------- */

typedef struct put_pass {
	const cwi_node *node;  /* the cache_put or cache node */
	cwi_cache_root *root;  /* NULL: pass through only */
	bool own_root;         /* opened (and closed) by the pass itself */
	uint64_t capacity;     /* of the root (put_policy); 0: no bound */
	int64_t ram_budget;    /* the pipeline's (bytes, > 0) */
	/* cache_put(write_id=W) running on a lease of a split pipeline: this
	 * lease writes one part of write W, covering these units. */
	uint64_t part_write_id;
	const cwi_unit_range *part_units;
	size_t npart_units;
	cwi_cache_writer *w;   /* NULL: not writing */
	bool started;          /* writer creation was attempted */
	uint64_t elements;     /* handed to the writer */
} put_pass;

static void
put_warn(put_pass *p, const char *what, cachew_err rv)
{
	char hex[33];
	const char *msg = cwi_errmsg_get();

	cachew_fingerprint_hex(cwi_node_fp(p->node), hex);
	cwi_log(CACHEW_LOG_WARN, "cache",
	    "%s: not caching %s under %s: %s: %s; passing the data through "
	    "uncached", p->node->op->name, hex,
	    p->root != NULL ? cwi_cache_root_path(p->root) : "?", what,
	    msg[0] != '\0' ? msg : cachew_strerror(rv));
}

static cwi_cache_root *put_root_open(const cwi_node *node, uint64_t capacity);

/* The component names the manifest records (one reference, or NULL): the
 * dataset's spec's; where the spec is not known (after a user function),
 * the names the first element carries, which a function gives with
 * cachew_element_set_name and the iterator keeps. */
static cwi_names *
put_names(const cwi_node *node, const cwi_chunk *v, size_t first)
{
	if (node->spec.known)
		return cwi_spec_names(&node->spec);
	if (v != NULL && first < v->n)
		return cwi_names_ref(v->v[first]->names);
	return NULL;
}

/* Starts the writer with the first elements pulled, v[first..n) (an
 * iterator that is created and destroyed unused writes nothing). */
static void
put_begin(put_pass *p, const cwi_chunk *v, size_t first)
{
	const cwi_node *node = p->node;
	cwi_cache_writer_opts o;
	cwi_strbuf sb;
	char *pipeline = NULL;
	size_t len;
	cachew_err rv;

	p->started = true;
	if (p->own_root)
		p->root = put_root_open(node, p->capacity);
	if (p->root == NULL)
		return;
	o = writer_opts(node, v, first);
	o.names = put_names(node, v, first);
	o.part_write_id = p->part_write_id;
	o.part_units = p->part_units;
	o.npart_units = p->npart_units;
	/* The writer's token holder stops for each chunk's fsync and for
	 * storage that is briefly busy: a queue of a few tens of MB lets the
	 * pipeline run on meanwhile (8 MB, the writer's default for two
	 * threads, is 50 ms of W2 at 2 threads). */
	o.queue_bytes = (size_t)(p->ram_budget / 16);
	if (o.queue_bytes > PUT_QUEUE_MAX)
		o.queue_bytes = PUT_QUEUE_MAX;
	if (o.queue_bytes < PUT_QUEUE_MIN)
		o.queue_bytes = PUT_QUEUE_MIN;
	cwi_strbuf_init(&sb);
	rv = cwi_node_to_string(node->inputs[0], &sb);
	if (rv == CACHEW_OK)
		rv = cwi_strbuf_finish(&sb, &pipeline, &len);
	else
		cwi_strbuf_free(&sb);
	if (rv == CACHEW_OK)
		rv = cwi_cache_writer_create(
		    &p->w, p->root, cwi_node_fp(node), pipeline, &o);
	cachew_free(pipeline);
	cwi_names_unref(o.names);
	if (rv == CACHEW_EEXIST) {
		char hex[33];
		cachew_fingerprint_hex(cwi_node_fp(node), hex);
		cwi_log(CACHEW_LOG_INFO, "cache",
		    "%s: %s under %s is complete or being written: passing "
		    "through", node->op->name, hex, cwi_cache_root_path(p->root));
		cwi_clear_errmsg();
	} else if (rv != CACHEW_OK) {
		put_warn(p, "cannot start the writer", rv);
	}
	if (rv != CACHEW_OK)
		p->w = NULL;
}

/* Hands out->v[first..n) to the writer (which takes its own references). */
static void
put_add(put_pass *p, const cwi_chunk *out, size_t first)
{
	cachew_err rv;

	if (out->n == first)
		return;
	if (!p->started)
		put_begin(p, out, first);
	if (p->w == NULL)
		return;
	rv = cwi_cache_writer_add(p->w, out->v + first, out->n - first);
	if (rv != CACHEW_OK) {
		put_warn(p, "write failed", rv);
		cwi_cache_writer_destroy(p->w);
		p->w = NULL;
		return;
	}
	p->elements += out->n - first;
}

/* The end of the pass: `end` is CACHEW_EOF for a complete pass (commit),
 * anything else aborts the write. */
static void
put_finish(put_pass *p, cachew_err end)
{
	cachew_err rv;
	char hex[33];

	/* An empty input still makes a (complete, empty) cache. */
	if (!p->started && end == CACHEW_EOF)
		put_begin(p, NULL, 0);
	if (p->w == NULL)
		return;
	if (end == CACHEW_EOF) {
		rv = cwi_cache_writer_commit(p->w);
		cachew_fingerprint_hex(cwi_node_fp(p->node), hex);
		if (rv != CACHEW_OK)
			put_warn(p, "commit failed", rv);
		else
			cwi_log(CACHEW_LOG_INFO, "cache",
			    "%s: cached %llu elements %sas %s under %s",
			    p->node->op->name, (unsigned long long)p->elements,
			    p->part_write_id != 0 ? "in a part " : "", hex,
			    cwi_cache_root_path(p->root));
	}
	cwi_cache_writer_destroy(p->w);
	p->w = NULL;
}

/* The capacity of a writing node's root: its parameter, and in a confined
 * worker (io_policy.h) at most the worker's for that root, which must be
 * one of its cache roots. Unlike a full disk this fails the pipeline: a
 * warning in the worker's log would hide the reason from its user. */
static cachew_err
put_policy(const cwi_node *node, uint64_t *capacity)
{
	uint64_t limit = 0;
	cachew_err rv;

	*capacity = (uint64_t)cwi_node_int(node, "capacity");
	rv = cwi_io_check_cache_root(cwi_node_str(node, "root"), &limit);
	if (rv == CACHEW_OK && limit != 0 &&
	    (*capacity == 0 || *capacity > limit))
		*capacity = limit;
	return rv;
}

/* Opens the root of a writing node; a failure only disables caching. */
static cwi_cache_root *
put_root_open(const cwi_node *node, uint64_t capacity)
{
	cwi_cache_root *r = NULL;
	cachew_err rv = cwi_cache_root_open(&r, cwi_node_str(node, "root"),
	    capacity);
	char hex[33];

	if (rv == CACHEW_OK)
		return r;
	cachew_fingerprint_hex(cwi_node_fp(node), hex);
	cwi_log(CACHEW_LOG_WARN, "cache",
	    "%s: not caching %s: cannot open the cache root %s: %s; passing "
	    "the data through uncached", node->op->name, hex,
	    cwi_node_str(node, "root"), cwi_errmsg_get());
	return NULL;
}

/* ---- reading: records decoded ahead by reader threads -------------------- */

/* One record of the read order, in ring[seq % RD_RING]. */
typedef struct rd_rec {
	cwi_element **v;  /* its elements; v[pos..n) not yet taken */
	size_t n, pos;
	size_t bytes;     /* their decoded bytes */
	size_t payload;   /* its bytes in the file: the read-ahead bound */
	bool done;        /* loaded, or the end or a failure: err says */
	cachew_err err;   /* CACHEW_OK: v holds it; CACHEW_EOF: the end */
	char *errmsg;
} rd_rec;

/* An open chunk: closed once it was claimed to its end and every load of
 * its records returned (a load uses its descriptor and names). */
typedef struct rd_open {
	cwi_cache_reader *rd;
	unsigned loads;   /* claimed records not loaded yet */
	bool drained;     /* claimed to its trailer (or failed) */
} rd_open;

typedef struct get_read {
	cwi_pipeline *pl;
	cwi_stats *stats;
	cwi_cache_root *root;    /* borrowed */
	cwi_cache_manifest *m;   /* owned */
	/* A reader held open (never read) from start to end: the store's
	 * shared lock lives while a reader is open, and the reader threads
	 * may all be between chunks while the consumer drains, when gc
	 * could otherwise remove the cache mid-read. */
	cwi_cache_reader *pin;
	cachew_err pin_err;      /* the pin found the first chunk corrupt */
	size_t *order;           /* chunk indices in read order */
	size_t norder;
	pthread_t *tids;
	int nthreads, started;
	cwi_tune_op tune;
	bool attached;

	pthread_mutex_t lock;
	pthread_cond_t cv_work, cv_cons;
	rd_rec ring[RD_RING];
	uint64_t next_seq;       /* the next record to claim */
	uint64_t cons_seq;       /* the record the consumer drains */
	size_t ahead;            /* payload bytes of [cons_seq, next_seq) */
	rd_open *cur;            /* the chunk claims read; NULL: open next */
	size_t next_pos;         /* the next position of order to open */
	bool claiming;           /* a thread is claiming: claims are serial */
	bool finished;           /* the end or a failure was claimed */
	bool stop, cancel;
	bool cons_waiting;
	int work_waiting;
	char errmsg[1024];       /* consumer: the failure rd_take returned */
	/* The manifest's names (borrowed from m) when the node's spec was
	 * not known at build (the cache did not exist yet, or a user
	 * function came before `cache`): the elements then carry them
	 * themselves, since the iterator has no spec to name them from. */
	cwi_names *names;
} get_read;

static void
rd_rec_clear(rd_rec *r)
{
	for (size_t i = r->pos; i < r->n; i++)
		cwi_element_release(r->v[i]);
	free(r->v);
	free(r->errmsg);
	memset(r, 0, sizeof(*r));
}

/* The chunk of the next position, opened after every earlier one (claims
 * are serial): a reader that finds a chunk corrupt marks the whole cache
 * bad, after which no chunk can be opened, so opening in order keeps
 * every element before the first defect readable (and the reported error
 * the defect itself, not "marked bad"). (lock not held; g->claiming) */
static cachew_err
rd_open_next(get_read *g)
{
	rd_open *o = calloc(1, sizeof(*o));
	cachew_err rv;

	if (o == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	/* Several loaders: the kernel's readahead serves them better
	 * (cwi_cache_reader_open). */
	rv = cwi_cache_reader_open(&o->rd, g->root, g->m,
	    g->order[g->next_pos], g->nthreads < 2);
	if (rv != CACHEW_OK) {
		free(o);
		return rv;
	}
	g->next_pos++;
	g->cur = o;
	return CACHEW_OK;
}

/* One fewer load, or the claims' end, of o: closes it when both are
 * over. (lock held) Returns the reader to close (lock not held). */
static cwi_cache_reader *
rd_open_release(rd_open *o, bool load_done)
{
	cwi_cache_reader *rd;

	if (load_done)
		o->loads--;
	else
		o->drained = true;
	if (!o->drained || o->loads > 0)
		return NULL;
	rd = o->rd;
	free(o);
	return rd;
}

/* Claims the next record of the read order, opening the chunks in turn:
 * CACHEW_OK (*from its chunk), CACHEW_EOF after the last chunk's trailer,
 * or a failure. (lock not held; g->claiming) */
static cachew_err
rd_claim(get_read *g, cwi_cache_rec_job *job, rd_open **from)
{
	cwi_cache_reader *done;
	cachew_err rv;

	for (;;) {
		if (g->cur == NULL) {
			if (g->next_pos >= g->norder)
				return CACHEW_EOF;
			rv = rd_open_next(g);
			if (rv != CACHEW_OK)
				return rv;
		}
		rv = cwi_cache_reader_claim(g->cur->rd, job);
		if (rv == CACHEW_OK) {
			*from = g->cur;
			return CACHEW_OK;
		}
		pthread_mutex_lock(&g->lock);
		done = rd_open_release(g->cur, false);
		g->cur = NULL;
		pthread_mutex_unlock(&g->lock);
		cwi_cache_reader_close(done);
		if (rv != CACHEW_EOF)
			return rv;
	}
}

/* Loads a claimed record into r's elements. (lock not held) */
static cachew_err
rd_load(rd_open *from, cwi_cache_rec_job *job, rd_rec *r)
{
	cwi_element **v = calloc(job->nelem, sizeof(*v));
	cachew_err rv;

	if (v == NULL) {
		cwi_cache_rec_job_discard(job);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	rv = cwi_cache_reader_load(from->rd, job, v);
	if (rv != CACHEW_OK) {
		free(v);
		return rv;
	}
	r->v = v;
	r->n = job->nelem;
	for (size_t i = 0; i < r->n; i++)
		r->bytes += cwi_element_nbytes(v[i]);
	return CACHEW_OK;
}

/* Whether a reader thread may claim: one claim at a time, at most
 * RD_RING records and RD_AHEAD_BYTES of payload ahead of the consumer
 * (one record always, however large). (lock held) */
static bool
rd_may_claim(const get_read *g)
{
	return !g->claiming && !g->finished &&
	    g->next_seq - g->cons_seq < RD_RING &&
	    (g->ahead < RD_AHEAD_BYTES || g->next_seq == g->cons_seq);
}

/* Claims one record and loads it into its ring entry; the next claim may
 * start as soon as this one is made, so the loads of consecutive records
 * run on several threads. (lock held on entry and return) */
static void
rd_step(get_read *g)
{
	uint64_t seq = g->next_seq, t0 = cwi_now_ns();
	rd_rec *r = &g->ring[seq % RD_RING];
	cwi_cache_rec_job job;
	cwi_cache_reader *done = NULL;
	rd_open *from = NULL;
	cachew_err rv;

	g->claiming = true;
	pthread_mutex_unlock(&g->lock);
	rv = rd_claim(g, &job, &from);
	pthread_mutex_lock(&g->lock);
	g->claiming = false;
	g->next_seq++;
	if (rv == CACHEW_OK) {
		from->loads++;
		r->payload = job.clen;
		g->ahead += job.clen;
		/* One waiting thread claims next (it passes the turn on in
		 * turn): a broadcast woke every thread for one claim. */
		if (g->work_waiting > 0 && rd_may_claim(g))
			pthread_cond_signal(&g->cv_work);
		pthread_mutex_unlock(&g->lock);
		rv = rd_load(from, &job, r);
		pthread_mutex_lock(&g->lock);
		done = rd_open_release(from, true);
	} else {
		g->finished = true;
	}
	if (rv != CACHEW_OK && rv != CACHEW_EOF) {
		const char *m = cwi_errmsg_get();
		r->errmsg = cwi_strdup(m[0] != '\0' ? m : cachew_strerror(rv));
	}
	r->err = rv;
	r->done = true;
	if (rv != CACHEW_OK)
		g->finished = true;
	else
		cwi_tune_bytes_add(&g->tune, (int64_t)r->bytes);
	if (g->stats != NULL)
		cwi_stat_add(&g->stats->busy_ns, cwi_now_ns() - t0);
	/* The consumer waits for the record at cons_seq only. */
	if (g->cons_waiting && seq == g->cons_seq)
		pthread_cond_signal(&g->cv_cons);
	if (done != NULL) {
		pthread_mutex_unlock(&g->lock);
		cwi_cache_reader_close(done);
		pthread_mutex_lock(&g->lock);
	}
}

static void *
rd_main(void *arg)
{
	get_read *g = arg;

	pthread_mutex_lock(&g->lock);
	while (!g->stop && !g->cancel) {
		if (rd_may_claim(g)) {
			rd_step(g);
			continue;
		}
		g->work_waiting++;
		pthread_cond_wait(&g->cv_work, &g->lock);
		g->work_waiting--;
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

static void
rd_wake(void *arg)
{
	get_read *g = arg;

	pthread_mutex_lock(&g->lock);
	g->cancel = true;
	pthread_cond_broadcast(&g->cv_work);
	pthread_cond_broadcast(&g->cv_cons);
	pthread_mutex_unlock(&g->lock);
}

static cachew_err
rd_start(get_read *g)
{
	pthread_mutex_lock(&g->lock);
	while (g->started < g->nthreads) {
		if (pthread_create(&g->tids[g->started], NULL, rd_main, g) != 0)
			break;
		g->started++;
	}
	pthread_mutex_unlock(&g->lock);
	if (g->started == 0)
		return cwi_pipeline_fail(g->pl, CACHEW_ENOMEM,
		    "cache: cannot start a reader thread");
	if (g->stats != NULL)
		atomic_store_explicit(&g->stats->parallelism, g->started,
		    memory_order_relaxed);
	return CACHEW_OK;
}

/* Gives out->v[first..n) the manifest's names (rd_init says when). The
 * reader's elements are new, so this is a reference each; a shared one
 * is cloned (a shared element is immutable). ENOMEM leaves one unnamed. */
static void
rd_name(const get_read *g, cwi_chunk *out, size_t first)
{
	for (size_t i = first; g->names != NULL && i < out->n; i++) {
		cwi_element *e = out->v[i], *c;
		if (e->n != g->names->n || e->names == g->names)
			continue;
		if (!cwi_element_unique(e)) {
			c = cwi_element_clone(e);
			if (c == NULL)
				continue;
			cwi_element_release(e);
			out->v[i] = e = c;
		}
		cwi_element_set_names(e, g->names);
	}
}

/* Moves up to max elements in read order into out. CACHEW_EOF after the
 * last chunk; a read failure is returned (with its message in g->errmsg)
 * once every element before it was delivered. */
static cachew_err
rd_take(get_read *g, cwi_chunk *out, size_t max)
{
	cachew_err rv = CACHEW_OK;
	size_t got = 0;
	bool wake = false;

	if (g->pin_err != CACHEW_OK)
		return g->pin_err;
	if (g->norder == 0)
		return CACHEW_EOF;
	if (g->started == 0) {
		rv = rd_start(g);
		if (rv != CACHEW_OK)
			return rv;
	}
	pthread_mutex_lock(&g->lock);
	while (got < max) {
		rd_rec *r = &g->ring[g->cons_seq % RD_RING];
		size_t take;

		if (r->done && r->err == CACHEW_OK) {
			take = r->n - r->pos;
			if (take > max - got)
				take = max - got;
			memcpy(out->v + out->n, r->v + r->pos,
			    take * sizeof(*out->v));
			out->n += take;
			r->pos += take;
			got += take;
			if (r->pos == r->n) {
				cwi_tune_bytes_add(&g->tune, -(int64_t)r->bytes);
				g->ahead -= r->payload;
				rd_rec_clear(r);
				g->cons_seq++;
				wake = true;
			}
			continue;
		}
		if (got > 0)
			break;
		if (r->done) {
			rv = r->err;
			if (rv != CACHEW_EOF)
				snprintf(g->errmsg, sizeof(g->errmsg), "%s",
				    r->errmsg != NULL ? r->errmsg
						      : cachew_strerror(rv));
			break;
		}
		if (g->cancel) {
			rv = CACHEW_ECANCELED;
			break;
		}
		if (wake && g->work_waiting > 0) {
			pthread_cond_signal(&g->cv_work);
			wake = false;
		}
		g->cons_waiting = true;
		pthread_cond_wait(&g->cv_cons, &g->lock);
		g->cons_waiting = false;
	}
	wake = wake && g->work_waiting > 0;
	pthread_mutex_unlock(&g->lock);
	if (wake)
		pthread_cond_signal(&g->cv_work);
	rd_name(g, out, out->n - got);
	return rv;
}

/* The read order: every chunk, or the pipeline's split unit ranges when
 * this node is its split source. */
static cachew_err
rd_order(get_read *g, const cwi_node *node)
{
	const cwi_pipeline *pl = g->pl;
	size_t nchunks = g->m->nchunks, n = 0;

	if (pl->split_node != node) {
		g->order = calloc(nchunks > 0 ? nchunks : 1, sizeof(size_t));
		if (g->order == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		for (size_t i = 0; i < nchunks; i++)
			g->order[i] = i;
		g->norder = nchunks;
		return CACHEW_OK;
	}
	for (size_t r = 0; r < pl->nsplit_ranges; r++) {
		const cwi_unit_range *u = &pl->split_ranges[r];
		if (u->begin > u->end || u->end > nchunks)
			return cwi_fail(CACHEW_EINVAL,
			    "split range [%llu, %llu) is outside the "
			    "cache's %zu chunks",
			    (unsigned long long)u->begin,
			    (unsigned long long)u->end, nchunks);
		n += (size_t)(u->end - u->begin);
	}
	g->order = calloc(n > 0 ? n : 1, sizeof(size_t));
	if (g->order == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t r = 0; r < pl->nsplit_ranges; r++)
		for (uint64_t u = pl->split_ranges[r].begin;
		     u < pl->split_ranges[r].end; u++)
			g->order[g->norder++] = (size_t)u;
	return CACHEW_OK;
}

/* Prepares reading manifest m (taking it) from root; threads as the node's
 * `threads` parameter says. The reader threads start at the first take. */
static cachew_err
rd_init(get_read *g, const cwi_node *node, cwi_pipeline *pl,
    cwi_cache_root *root, cwi_cache_manifest *m)
{
	int64_t threads = cwi_node_int(node, "threads");
	cachew_err rv;

	memset(g, 0, sizeof(*g));
	g->pl = pl;
	g->stats = cwi_pipeline_stats(pl, node);
	g->root = root;
	g->m = m;
	g->names = node->spec.known ? NULL : m->names;
	cwi_mutex_init(&g->lock);
	pthread_cond_init(&g->cv_work, NULL);
	pthread_cond_init(&g->cv_cons, NULL);
	rv = rd_order(g, node);
	if (rv != CACHEW_OK)
		return rv;
	if (threads == CACHEW_AUTO) {
		threads = pl->opts.threads > 0 ? pl->opts.threads : 1;
		if (threads > RD_AUTO_MAX)
			threads = RD_AUTO_MAX;
	}
	if (threads < 1)
		threads = 1;
	/* Not bounded by the chunks: the threads share a chunk's records. */
	if (g->norder == 0)
		threads = 1;
	g->nthreads = (int)threads;
	g->tids = calloc((size_t)threads, sizeof(pthread_t));
	if (g->tids == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_tune_attach(&g->tune, pl, rd_wake, g);
	if (rv != CACHEW_OK)
		return rv;
	g->attached = true;
	/* The pin opens the first chunk to read: a defect found there (the
	 * cache is then marked bad) is the first thing the consumer gets;
	 * other failures are left for the reader thread to report. */
	if (g->norder > 0) {
		rv = cwi_cache_reader_open(&g->pin, root, m, g->order[0],
		    g->nthreads < 2);
		if (rv == CACHEW_ECORRUPT) {
			g->pin_err = rv;
			snprintf(g->errmsg, sizeof(g->errmsg), "%s",
			    cwi_errmsg_get());
		}
		if (rv != CACHEW_OK)
			g->pin = NULL;
		cwi_clear_errmsg();
	}
	return CACHEW_OK;
}

/* Stops the reader threads and frees everything (also after a failed
 * rd_init). Call cwi_tune_cancel(pl) first when the pipeline is being
 * destroyed. */
static void
rd_fini(get_read *g)
{
	pthread_mutex_lock(&g->lock);
	g->stop = true;
	pthread_cond_broadcast(&g->cv_work);
	pthread_cond_broadcast(&g->cv_cons);
	pthread_mutex_unlock(&g->lock);
	for (int i = 0; i < g->started; i++)
		pthread_join(g->tids[i], NULL);
	for (size_t i = 0; i < RD_RING; i++)
		rd_rec_clear(&g->ring[i]);
	/* The threads are joined: no load is left, only the chunk claims
	 * stopped in. */
	if (g->cur != NULL) {
		cwi_cache_reader_close(g->cur->rd);
		free(g->cur);
	}
	cwi_cache_reader_close(g->pin);
	if (g->attached)
		cwi_tune_detach(&g->tune);
	free(g->tids);
	free(g->order);
	cwi_cache_manifest_free(g->m);
	pthread_cond_destroy(&g->cv_cons);
	pthread_cond_destroy(&g->cv_work);
	pthread_mutex_destroy(&g->lock);
	memset(g, 0, sizeof(*g));
}

/* ---- resuming (exec_state.h) ---------------------------------------------------- */

/* Passes over the first n elements of a read: where a restored read
 * resumes. The chunks before are decoded again (a chunk's frames are only
 * found by reading it). */
static cachew_err
rd_skip(get_read *g, uint64_t n, cwi_state_reader *r)
{
	cwi_chunk skip = {0};
	cachew_err rv = CACHEW_OK;
	uint64_t left = n;

	while (left > 0 && rv == CACHEW_OK) {
		size_t k = left < RD_BATCH ? (size_t)left : RD_BATCH;
		rv = cwi_chunk_reserve(&skip, k);
		if (rv == CACHEW_OK)
			rv = rd_take(g, &skip, k);
		left -= skip.n;
		cwi_chunk_clear(&skip);
	}
	cwi_chunk_free(&skip);
	if (rv == CACHEW_EOF)
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "the cache holds %llu elements, the state says %llu were "
		    "read", (unsigned long long)(n - left),
		    (unsigned long long)n);
	else if (rv != CACHEW_OK)
		cwi_sr_fail(r, rv, "reading the cache: %s",
		    g->errmsg[0] != '\0' ? g->errmsg : cachew_strerror(rv));
	return rv == CACHEW_OK ? CACHEW_OK : cwi_sr_error(r);
}

/* A restored pass writes no cache: the elements before the save are not
 * in it (a later complete pass writes it). */
static void
put_disable(put_pass *p)
{
	char hex[33];

	cachew_fingerprint_hex(cwi_node_fp(p->node), hex);
	cwi_log(CACHEW_LOG_INFO, "cache",
	    "%s: a restored pass does not write the cache %s (it would miss "
	    "the elements before the saved position)",
	    p->node->op->name, hex);
	p->started = true;
}

/* ---- cache_put ---------------------------------------------------------------- */

typedef struct put_iter {
	cwi_iter base;
	cwi_iter *input;
	put_pass pass;
} put_iter;

static cachew_err
put_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	put_iter *p = (put_iter *)it;
	size_t first = out->n;
	cachew_err rv;

	rv = cwi_iter_next(p->input, out, max);
	if (rv == CACHEW_OK)
		put_add(&p->pass, out, first);
	else
		put_finish(&p->pass, rv);
	return rv;
}

static void
put_destroy(cwi_iter *it)
{
	put_iter *p = (put_iter *)it;

	/* Before EOF this aborts: a pass cut short leaves no cache. */
	put_finish(&p->pass, CACHEW_ECANCELED);
	if (p->pass.own_root)
		cwi_cache_root_close(p->pass.root);
	cwi_iter_destroy(p->input);
	free(p);
}

/* [input]: the write itself is not resumed (put_disable). */
static cachew_err
put_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	return cwi_iter_save(((put_iter *)it)->input, w);
}

static cachew_err
put_restore(cwi_iter *it, cwi_state_reader *r)
{
	put_iter *p = (put_iter *)it;

	if (!cwi_sr_array(r, "cache_put", 1))
		return cwi_sr_error(r);
	put_disable(&p->pass);
	return cwi_iter_restore(p->input, r);
}

static const cwi_iter_ops put_iter_ops = {
    .next = put_next,
    .destroy = put_destroy,
    .save = put_save,
    .restore = put_restore,
};

static cachew_err
put_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	put_iter *p = calloc(1, sizeof(*p));
	cachew_err rv;

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	p->base.ops = &put_iter_ops;
	p->pass.node = node;
	p->pass.ram_budget = args->pl->opts.ram_budget;
	p->pass.own_root = true;
	rv = put_policy(node, &p->pass.capacity);
	if (rv != CACHEW_OK) {
		free(p);
		return rv;
	}
	/* Only a lease writes a part: the whole input in one process is
	 * the whole cache, written by one writer as always. */
	if (cwi_node_int(node, "write_id") != 0 && args->pl->split_node != NULL &&
	    args->pl->nsplit_ranges > 0) {
		p->pass.part_write_id = (uint64_t)cwi_node_int(node, "write_id");
		p->pass.part_units = args->pl->split_ranges;
		p->pass.npart_units = args->pl->nsplit_ranges;
	}
	rv = cwi_iter_create(&p->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(p);
		return rv;
	}
	*out = &p->base;
	return CACHEW_OK;
}

/* ---- cache_get ---------------------------------------------------------------- */

typedef struct get_iter {
	cwi_iter base;
	cwi_cache_root *root;
	cachew_fingerprint fp;
	get_read rd;
	bool rd_ready;
	uint64_t yielded; /* elements delivered */
} get_iter;

/* Reports a read failure of cache_get. A corrupt cache was marked bad by
 * the reader that found it. */
static cachew_err
get_failed(get_iter *g, cachew_err rv)
{
	const char *root = cwi_cache_root_path(g->root);
	char hex[33];

	cachew_fingerprint_hex(&g->fp, hex);
	if (is_corruption(rv))
		return cwi_pipeline_fail(g->base.pl, CACHEW_ECORRUPT,
		    "cache_get: cache %s under %s is corrupt and was marked "
		    "bad (cache_get cannot recompute it; cache(root) would): "
		    "%s", hex, root, g->rd.errmsg);
	if (rv == CACHEW_ENOENT)
		return cwi_pipeline_fail(g->base.pl, CACHEW_ENOENT,
		    "cache_get: cache %s under %s can no longer be read "
		    "(removed, replaced or marked bad meanwhile): %s", hex,
		    root, g->rd.errmsg);
	return cwi_pipeline_fail(g->base.pl, rv,
	    "cache_get: reading cache %s under %s: %s", hex, root,
	    g->rd.errmsg);
}

static cachew_err
get_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	get_iter *g = (get_iter *)it;
	size_t first = out->n;
	cachew_err rv = rd_take(&g->rd, out, max);

	g->yielded += out->n - first;
	if (rv == CACHEW_OK || rv == CACHEW_EOF || rv == CACHEW_ECANCELED)
		return rv;
	if (rv == CACHEW_ENOMEM && g->rd.started == 0)
		return rv; /* rd_start reported it */
	return get_failed(g, rv);
}

static void
get_free(get_iter *g)
{
	if (g->rd_ready)
		rd_fini(&g->rd);
	cwi_cache_root_close(g->root);
	free(g);
}

static void
get_destroy(cwi_iter *it)
{
	get_iter *g = (get_iter *)it;

	cwi_tune_cancel(g->base.pl);
	get_free(g);
}

/* [elements delivered]: a restore reads past them. */
static cachew_err
get_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	cwi_sw_uint(w, ((get_iter *)it)->yielded);
	return CACHEW_OK;
}

static cachew_err
get_restore(cwi_iter *it, cwi_state_reader *r)
{
	get_iter *g = (get_iter *)it;

	if (!cwi_sr_array(r, "cache_get", 1) ||
	    !cwi_sr_uint(r, "delivered", &g->yielded, UINT64_MAX))
		return cwi_sr_error(r);
	return rd_skip(&g->rd, g->yielded, r);
}

static const cwi_iter_ops get_iter_ops = {
    .next = get_next,
    .destroy = get_destroy,
    .save = get_save,
    .restore = get_restore,
};

/* Opens the root of a cache_get node and finds its manifest; errors
 * through cwi_fail, without the operator's name (the caller adds it). */
static cachew_err
get_lookup(const cwi_node *node, cwi_cache_root **root,
    cachew_fingerprint *fp, cwi_cache_manifest **m)
{
	const char *path = cwi_node_str(node, "root");
	const char *hex = cwi_node_str(node, "fingerprint");
	cachew_err rv;

	*root = NULL;
	*m = NULL;
	if (!fp_parse(hex, fp))
		return cwi_fail(CACHEW_EINVAL,
		    "fingerprint '%s' is not 32 hex digits", hex);
	rv = cwi_io_check_read(path);
	if (rv == CACHEW_OK)
		rv = cwi_cache_root_open(root, path, 0);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_cache_lookup(*root, fp, m);
	if (rv == CACHEW_ENOENT)
		rv = cwi_fail(CACHEW_ENOENT,
		    "no complete cache %s under %s (write one with cache_put "
		    "or cache; `cachew cache ls %s` lists the caches there)",
		    hex, path, path);
	else if (rv == CACHEW_ECORRUPT)
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "cache %s under %s is corrupt and was marked bad: %s", hex,
		    path, cwi_errmsg_get());
	if (rv != CACHEW_OK) {
		cwi_cache_root_close(*root);
		*root = NULL;
	}
	return rv;
}

static cachew_err
get_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	get_iter *g = calloc(1, sizeof(*g));
	cwi_cache_manifest *m = NULL;
	cachew_err rv;

	if (g == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	g->base.ops = &get_iter_ops;
	g->base.async = true;
	g->base.cache_hit = true;
	rv = get_lookup(node, &g->root, &g->fp, &m);
	if (rv == CACHEW_OK) {
		g->rd_ready = true;
		rv = rd_init(&g->rd, node, args->pl, g->root, m);
	}
	if (rv != CACHEW_OK) {
		if (!g->rd_ready)
			cwi_cache_manifest_free(m);
		get_free(g);
		return rv;
	}
	*out = &g->base;
	return CACHEW_OK;
}

static cachew_err
get_split_units(const cwi_node *node, uint64_t *units)
{
	cwi_cache_root *root;
	cwi_cache_manifest *m;
	cachew_fingerprint fp;
	cachew_err rv = get_lookup(node, &root, &fp, &m);

	if (rv != CACHEW_OK)
		return cwi_fail(rv, "cache_get: %s", cwi_errmsg_get());
	*units = m->nchunks;
	cwi_cache_manifest_free(m);
	cwi_cache_root_close(root);
	return CACHEW_OK;
}

static cachew_err
get_validate(cwi_node *node)
{
	cachew_fingerprint fp;

	if (!fp_parse(cwi_node_str(node, "fingerprint"), &fp))
		return cwi_fail(CACHEW_EINVAL,
		    "cache_get: fingerprint '%s' is not 32 hex digits (as "
		    "`cachew cache ls` or `cachew run --json` print it)",
		    cwi_node_str(node, "fingerprint"));
	return CACHEW_OK;
}

/* The spec and cardinality of a cache that exists when the node is built:
 * its manifest's (names included), so that a mismatch downstream is
 * refused at build and the elements are named. A cache that does not
 * exist yet, or cannot be read now (slow or unreachable storage: the
 * read makes one short attempt, cwi_cache_peek), leaves both unknown;
 * the run reports what is wrong with it as it always did. An empty
 * cache has a cardinality of 0 and no spec to give. */
static cachew_err
get_infer(cwi_node *node)
{
	cwi_cache_manifest *m = NULL;
	cachew_fingerprint fp;
	cachew_err rv;

	if (!fp_parse(cwi_node_str(node, "fingerprint"), &fp))
		return CACHEW_OK;
	rv = cwi_cache_peek(cwi_node_str(node, "root"), &fp, &m);
	if (rv != CACHEW_OK) {
		cwi_clear_errmsg();
		return CACHEW_OK;
	}
	node->card = (int64_t)m->elements; /* < 2^63: decoded */
	rv = CACHEW_OK;
	if (m->ncomponents > 0)
		rv = cwi_spec_init(&node->spec, (uint32_t)m->ncomponents);
	for (size_t i = 0; rv == CACHEW_OK && i < m->ncomponents; i++) {
		cwi_comp_spec *c = &node->spec.comp[i];
		c->dtype = (uint8_t)m->spec[i].dtype;
		c->rank = (uint8_t)m->spec[i].rank;
		memcpy(c->shape, m->spec[i].shape, sizeof(c->shape));
		if (m->names != NULL)
			rv = cwi_comp_spec_name(c, m->names->name[i]);
	}
	cwi_cache_manifest_free(m);
	return rv;
}

/* ---- cache -------------------------------------------------------------------- */

typedef struct cache_iter {
	cwi_iter base;
	cwi_iter_args args;     /* to start the input after a bad read */
	cwi_cache_root *root;   /* NULL: could not open: compute only */
	bool reading;
	get_read rd;
	cwi_iter *input;        /* computing */
	put_pass pass;
	uint64_t yielded;       /* elements delivered while reading */
	uint64_t delivered;     /* elements delivered, however */
	uint64_t skip;          /* recomputed elements still to drop */
	cwi_chunk scratch;
} cache_iter;

/* Switches from a failed read to computing (a corrupt cache was marked bad
 * by the reader that found it): starts the input and arranges to skip
 * what was yielded. */
static cachew_err
cache_recompute(cache_iter *c, cachew_err why)
{
	const cwi_node *node = c->base.node;
	char hex[33];
	cachew_err rv;

	cachew_fingerprint_hex(cwi_node_fp(node), hex);
	cwi_log(CACHEW_LOG_WARN, "cache",
	    "cache: reading %s under %s failed after %llu elements (%s%s); "
	    "recomputing from the input", hex, cwi_cache_root_path(c->root),
	    (unsigned long long)c->yielded,
	    is_corruption(why) ? "marked bad: " : "", c->rd.errmsg);
	rd_fini(&c->rd);
	c->reading = false;
	c->base.async = false;
	c->base.cache_hit = false;
	c->skip = c->yielded;
	rv = cwi_iter_create(&c->input, node->inputs[0], &c->args);
	if (rv != CACHEW_OK)
		c->input = NULL;
	return rv;
}

/* Pulls and drops the elements the read already yielded, writing them to
 * the replacement cache. */
static cachew_err
cache_skip(cache_iter *c)
{
	while (c->skip > 0) {
		size_t k = c->skip < RD_BATCH ? (size_t)c->skip : RD_BATCH;
		cachew_err rv;

		if (cwi_pipeline_cancelled(c->base.pl))
			return CACHEW_ECANCELED;
		c->scratch.n = 0;
		rv = cwi_iter_next(c->input, &c->scratch, k);
		if (rv != CACHEW_OK) {
			if (rv == CACHEW_EOF) {
				/* The input now yields fewer elements than
				 * the cache held (a non-deterministic input):
				 * what was yielded stands. */
				cwi_log(CACHEW_LOG_WARN, "cache",
				    "cache: the recomputed input ended %llu "
				    "elements before the point the cache was "
				    "read to", (unsigned long long)c->skip);
			}
			put_finish(&c->pass, rv);
			return rv;
		}
		put_add(&c->pass, &c->scratch, 0);
		c->skip -= c->scratch.n;
		cwi_chunk_clear(&c->scratch);
	}
	return CACHEW_OK;
}

static cachew_err
cache_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	cache_iter *c = (cache_iter *)it;
	size_t first = out->n;
	cachew_err rv;

	if (c->reading) {
		rv = rd_take(&c->rd, out, max);
		if (rv == CACHEW_OK) {
			c->yielded += out->n - first;
			c->delivered += out->n - first;
		}
		if (rv == CACHEW_OK || rv == CACHEW_EOF ||
		    rv == CACHEW_ECANCELED ||
		    (rv == CACHEW_ENOMEM && c->rd.started == 0))
			return rv;
		rv = cache_recompute(c, rv);
		if (rv != CACHEW_OK)
			return rv;
	}
	rv = cache_skip(c);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_iter_next(c->input, out, max);
	if (rv == CACHEW_OK) {
		c->delivered += out->n - first;
		put_add(&c->pass, out, first);
	} else {
		put_finish(&c->pass, rv);
	}
	return rv;
}

static void
cache_free(cache_iter *c)
{
	if (c->reading)
		rd_fini(&c->rd);
	put_finish(&c->pass, CACHEW_ECANCELED);
	cwi_iter_destroy(c->input);
	cwi_chunk_free(&c->scratch);
	cwi_cache_root_close(c->root);
	free(c);
}

static void
cache_destroy(cwi_iter *it)
{
	cache_iter *c = (cache_iter *)it;

	cwi_tune_cancel(c->base.pl);
	cache_free(c);
}

/* [elements delivered, the input's state when computing]. The cache holds
 * what the input yields, in order, so a position is a count of either. */
static cachew_err
cache_save(cwi_iter *it, cwi_state_writer *w)
{
	cache_iter *c = (cache_iter *)it;
	bool computing = !c->reading && c->skip == 0;

	cwi_sw_array(w, 2);
	cwi_sw_uint(w, c->delivered);
	if (!computing) {
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	cwi_sw_array(w, 1);
	return cwi_iter_save(c->input, w);
}

/* A restore may find the cache complete where the run had computed, or
 * gone where it had read: the count of elements is what carries over. */
static cachew_err
cache_restore(cwi_iter *it, cwi_state_reader *r)
{
	cache_iter *c = (cache_iter *)it;
	uint64_t n = 0;

	if (!cwi_sr_array(r, "cache", 2) ||
	    !cwi_sr_uint(r, "delivered", &c->delivered, UINT64_MAX) ||
	    !cwi_sr_count(r, "input", &n, 1))
		return cwi_sr_error(r);
	if (c->reading) {
		if (n == 1 && !cwi_sr_skip(r, "input state"))
			return cwi_sr_error(r);
		c->yielded = c->delivered;
		return rd_skip(&c->rd, c->delivered, r);
	}
	if (n == 0) {
		/* Computing where the run read: the pass drops (and caches)
		 * the elements delivered before. */
		c->yielded = c->skip = c->delivered;
		return CACHEW_OK;
	}
	put_disable(&c->pass);
	return cwi_iter_restore(c->input, r);
}

static const cwi_iter_ops cache_iter_ops = {
    .next = cache_next,
    .destroy = cache_destroy,
    .save = cache_save,
    .restore = cache_restore,
};

/* Finds a complete cache of the node's input: true with *m to read it. */
static bool
cache_find(cache_iter *c, const cwi_node *node, cwi_cache_manifest **m)
{
	cachew_err rv;
	char hex[33];

	if (c->root == NULL)
		return false;
	rv = cwi_cache_lookup(c->root, cwi_node_fp(node), m);
	if (rv == CACHEW_OK)
		return true;
	cachew_fingerprint_hex(cwi_node_fp(node), hex);
	if (rv != CACHEW_ENOENT)
		cwi_log(CACHEW_LOG_WARN, "cache",
		    "cache: cannot use the cache %s under %s (%s): computing",
		    hex, cwi_cache_root_path(c->root), cwi_errmsg_get());
	cwi_clear_errmsg();
	*m = NULL;
	return false;
}

static cachew_err
cache_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	cache_iter *c = calloc(1, sizeof(*c));
	cwi_cache_manifest *m = NULL;
	cachew_err rv;

	if (cwi_node_value(node, "root") == NULL) {
		free(c);
		return cwi_mem_cache_create(out, node, args);
	}
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->base.ops = &cache_iter_ops;
	c->args = *args;
	c->pass.node = node;
	c->pass.ram_budget = args->pl->opts.ram_budget;
	rv = put_policy(node, &c->pass.capacity);
	if (rv != CACHEW_OK) {
		free(c);
		return rv;
	}
	c->root = put_root_open(node, c->pass.capacity);
	c->pass.root = c->root;
	if (cache_find(c, node, &m)) {
		/* A complete cache: the input is not even started. */
		c->reading = true;
		c->base.async = true;
		c->base.cache_hit = true;
		rv = rd_init(&c->rd, node, args->pl, c->root, m);
	} else {
		rv = cwi_iter_create(&c->input, node->inputs[0], args);
	}
	if (rv != CACHEW_OK) {
		cache_free(c);
		return rv;
	}
	*out = &c->base;
	return CACHEW_OK;
}

/* ---- operator tables ------------------------------------------------------------ */

#define P_ROOT(h)                                                             \
	{.name = "root", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,         \
	    .help = h}
#define P_THREADS(h)                                                          \
	{.name = "threads", .type = CWI_P_INT,                                \
	    .flags = CWI_PF_AUTO | CWI_PF_PERF, .def_int = CACHEW_AUTO,       \
	    .min = 1, .max = 64, .help = h}
#define P_WRITE_PARAMS                                                        \
	{.name = "chunk_bytes", .type = CWI_P_INT, .flags = CWI_PF_PERF,      \
	    .def_int = CWI_CACHE_CHUNK_BYTES, .min = 4096,                    \
	    .max = (int64_t)1 << 40,                                          \
	    .help = "target size of a chunk file (one split when read)"},     \
	    {.name = "capacity", .type = CWI_P_INT, .flags = CWI_PF_PERF,     \
		.def_int = 0, .min = 0, .max = INT64_MAX,                     \
		.help = "bytes all caches under root may use (0: no "         \
			"limit); a write evicts least recently read caches "  \
			"first, else is abandoned with a warning"},           \
	    {.name = "level", .type = CWI_P_INT,                              \
		.flags = CWI_PF_AUTO | CWI_PF_PERF, .def_int = CACHEW_AUTO,   \
		.min = -7, .max = 19,                                         \
		.help = "zstd level, or auto: 1, or -1 (stored nearly raw, "  \
			"10x faster both ways) when the first 256 KiB "       \
			"compress by under 10% (decoded pixels)"}

static const cwi_param_spec put_params[] = {
    P_ROOT("cache root: a directory (created if missing), a shared file "
	   "system path or s3://bucket/prefix"),
    P_THREADS("encoder threads of the writer, or auto (2)"),
    P_WRITE_PARAMS,
    {.name = "write_id", .type = CWI_P_INT, .flags = CWI_PF_PERF,
	.def_int = 0, .min = 0, .max = INT64_MAX,
	.help = "non-zero: a distributed write; each lease of the service "
		"writes one part and whoever set the id (the dispatcher) "
		"commits the cache once every split is delivered "
		"(docs/cache-format.md 6.1)"},
};

static const cwi_param_spec cache_params[] = {
    {.name = "root", .type = CWI_P_STR, .flags = CWI_PF_OPTIONAL,
	.help = "cache root: a directory (created if missing), a shared "
		"file system path or s3://bucket/prefix; absent: cache in "
		"memory"},
    P_THREADS("reader threads (reading) or encoder threads (writing), or "
	      "auto"),
    P_WRITE_PARAMS,
    {.name = "memory_limit", .type = CWI_P_INT,
	.flags = CWI_PF_OPTIONAL | CWI_PF_PERF, .min = 1, .max = INT64_MAX,
	.help = "without a root: bytes the in-memory cache may hold (absent: "
		"the ram_budget option); a pass past it fails with ENOMEM"},
};

/* cache_get's root is a location, not data: leave it out of the
 * fingerprint. */
static const cwi_param_spec get_params[] = {
    {.name = "root", .type = CWI_P_STR,
	.flags = CWI_PF_REQUIRED | CWI_PF_PERF,
	.help = "cache root the cache lives under (not fingerprinted: a "
		"cache holds the same data wherever it is)"},
    {.name = "fingerprint", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the cache: the fingerprint of the cached pipeline, 32 hex "
		"digits"},
    P_THREADS("reader threads loading records ahead (several share a "
	      "chunk), or auto (the pipeline's threads, at most 4)"),
};

const cwi_dataset_op cwi_op_cache_put = {
    .name = "cache_put",
    .doc = "passes elements through and writes them to the cache of the "
	   "input's fingerprint under root, made visible at the end of a "
	   "complete pass (a pass cut short, or a write failure, writes "
	   "nothing and never fails the job)",
    .params = put_params,
    .nparams = sizeof(put_params) / sizeof(put_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_PASSTHROUGH,
    .iter_create = put_create,
    .saves = "the input; a restored pass passes through without writing "
	"(the cache would miss the elements before the position)",
};

const cwi_dataset_op cwi_op_cache_get = {
    .name = "cache_get",
    .doc = "reads the complete cache of a fingerprint under root, verifying "
	   "every frame, in written order; one chunk file is one split "
	   "(a missing cache is ENOENT, a corrupt one is marked bad and "
	   "ECORRUPT)",
    .params = get_params,
    .nparams = sizeof(get_params) / sizeof(get_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_SPLITTABLE | CWI_OPF_ASYNC |
		CWI_OPF_FP_PARAM,
    .validate = get_validate,
    .infer = get_infer,
    .iter_create = get_create,
    .split_units = get_split_units,
    .saves = "the count of elements delivered: a restore reads past them",
    .note = "Element spec and cardinality: when the cache exists as the "
	"pipeline is built, its manifest's spec (with the component names "
	"the cached dataset had) and its element count, so elements come "
	"out named and a mismatch downstream is refused at build; when it "
	"does not exist yet, or its manifest cannot be read then (damaged, "
	"marked bad, or storage that does not answer in one short attempt), "
	"both are unknown (`spec=?`) and the run reports what is wrong as "
	"before (docs/cache.md).",
};

const cwi_dataset_op cwi_op_cache = {
    .name = "cache",
    .doc = "tf.data's cache: reads the complete cache of the input's "
	   "fingerprint under root without starting the input, else passes "
	   "the input through and writes it at the end of a complete pass; "
	   "a corrupt cache is marked bad and recomputed; without a root, "
	   "caches in memory",
    .params = cache_params,
    .nparams = sizeof(cache_params) / sizeof(cache_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_PASSTHROUGH,
    .iter_create = cache_create,
    .saves = "the count of elements delivered and, computing, the input: a "
	"restore reads past them in a complete cache, or resumes (or "
	"recomputes) "
	"the input and then writes no cache",
    .note = "Without a root (`cache()`), tf.data's in-memory cache: the "
	"elements are kept (by reference) with the dataset, so every "
	"iterator of it shares them; the first pass read to its end fills "
	"the cache and later passes (a new iterator, the next repetition "
	"under repeat) read memory without starting the input. A pass cut "
	"short is discarded, as in tf.data; while one pass fills it, others "
	"compute. memory_limit (default: the ram_budget option) bounds it: "
	"a pass past it fails with ENOMEM. Through the service it runs in "
	"the client part, whose graph each iterator builds anew: there the "
	"cache serves the repetitions of one iterator (repeat), not later "
	"iterators.",
};
