/*
 * cache_write.c - the cache writer: elements in, verified chunk files and
 * a manifest out (docs/cache-format.md, "Writing a cache").
 *
 * The producer (cwi_cache_writer_add) batches references to elements into
 * jobs of about one frame each and queues them; `threads` encoder threads
 * take jobs, encode and compress them into records (one zstd frame each)
 * and put them on a done list ordered by sequence number. Whichever
 * encoder finds the oldest unwritten job done takes the write token and
 * appends records in order to the current chunk file, rotating chunks at
 * chunk_bytes: so chunk i holds a contiguous run of elements and frames
 * keep the order of the add calls. Hand-offs move whole jobs (a frame of
 * elements), never single elements: a wake-up costs microseconds here.
 *
 * Memory: a job's element bytes count against queue_bytes from the add
 * that queues it until its records are written; the producer blocks while
 * the count is over the bound.
 *
 * Local chunk files are written under a temporary name, fsynced, renamed;
 * the directory is fsynced before and after the manifest is renamed into
 * place. The writer holds the cache's lock file exclusively from create to
 * commit or abort. S3 chunks are built in memory and PUT whole.
 *
 * Lock order: w->lock only. File I/O runs outside it, by the token holder.
 */
#include "cache_int.h"

#include "../io/io_put.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct wrec {
	size_t len; /* bytes in job->out: record header + frame */
	uint32_t nelem;
	uint32_t ulen;
} wrec;

typedef struct wjob {
	struct wjob *next;
	uint64_t seq;
	cwi_element **v;
	size_t n, cap;
	size_t raw; /* bytes counted against the queue bound */
	cwi_strbuf out;
	wrec *recs;
	size_t nrecs, recs_cap;
} wjob;

typedef struct chunk_out {
	bool open;
	char *name;
	char *tmp_path; /* local */
	int fd;
	cwi_strbuf mem; /* S3: the whole chunk */
	uint64_t bytes, elements, ubytes;
	uint32_t records;
	uint64_t flushed; /* local: bytes handed to writeback */
	XXH64_state_t hash;
} chunk_out;

struct cwi_cache_writer {
	cwi_cache_root *root;
	cachew_fingerprint fp;
	char *pipeline;
	char *dir;
	int lockfd;
	bool owns_dir; /* took the directory: an abort empties it */
	uint64_t cache_id; /* this writer's id, in its chunk headers */
	cwi_unit_range *part_units; /* part writers: a copy of the opts' */
	cwi_cache_writer_opts o;

	/* Producer-owned. */
	wjob *open;
	uint64_t next_seq;
	uint64_t added;
	size_t ncomp;
	cwi_cache_spec spec[CACHEW_MAX_COMPONENTS];
	bool committed;

	pthread_mutex_t lock;
	pthread_cond_t cv_work;  /* encoders: a job was queued, or stop */
	pthread_cond_t cv_space; /* producer and commit: a job was written */
	wjob *qhead, *qtail;     /* queued, not yet taken */
	wjob *done;              /* encoded, ascending seq */
	uint64_t next_write;
	bool writing;            /* the write token is taken */
	size_t queued;
	bool stop;
	cachew_err err; /* sticky */
	char *errmsg;
	pthread_t *threads;
	int nthreads;

	/* Owned by the write token holder (after the threads stop: commit). */
	chunk_out cur;
	cwi_cache_chunk_info *chunks;
	size_t nchunks, chunks_cap;
	uint64_t chunk_bytes_total;
	uint64_t others_bytes; /* capacity: what the other caches hold */
	bool others_known;
};

/* ---- errors ------------------------------------------------------------- */

/* Records the first error (message from this thread's errmsg); w->lock
 * held. */
static void
set_err(cwi_cache_writer *w, cachew_err rv)
{
	if (w->err != CACHEW_OK)
		return;
	w->err = rv;
	w->errmsg = cwi_strdup(cachew_errmsg());
	pthread_cond_broadcast(&w->cv_space);
	pthread_cond_broadcast(&w->cv_work);
}

static cachew_err
sticky(cwi_cache_writer *w)
{
	return cwi_fail(w->err, "%s",
	    w->errmsg != NULL ? w->errmsg : "cache writer failed");
}

/* ---- jobs --------------------------------------------------------------- */

static void
job_free(wjob *j)
{
	if (j == NULL)
		return;
	for (size_t i = 0; i < j->n; i++)
		cwi_element_release(j->v[i]);
	free(j->v);
	cwi_strbuf_free(&j->out);
	free(j->recs);
	free(j);
}

static cachew_err
job_push_rec(wjob *j, size_t len, uint32_t nelem, uint32_t ulen)
{
	if (j->nrecs == j->recs_cap) {
		size_t cap = j->recs_cap ? 2 * j->recs_cap : 2;
		wrec *r = realloc(j->recs, cap * sizeof(*r));
		if (r == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		j->recs = r;
		j->recs_cap = cap;
	}
	j->recs[j->nrecs++] = (wrec){.len = len, .nelem = nelem, .ulen = ulen};
	return CACHEW_OK;
}

static cachew_err
flush_frame(cwi_cache_writer *w, ZSTD_CCtx *cctx, cwi_strbuf *frame,
    uint32_t nelem, wjob *j)
{
	size_t before = j->out.len;
	cachew_err rv;

	rv = cwi_chunk_frame_encode(cctx, w->o.chunk_version, w->o.zstd_level,
	    frame->data, frame->len, nelem, &j->out);
	if (rv == CACHEW_OK)
		rv = job_push_rec(j, j->out.len - before, nelem,
		    (uint32_t)frame->len);
	frame->len = 0;
	return rv;
}

/* Encodes a job's elements into frames of about frame_bytes (a frame
 * ends after the element that reaches the target) and compresses each
 * into a record. Releases the elements. */
static cachew_err
encode_job(cwi_cache_writer *w, ZSTD_CCtx *cctx, cwi_strbuf *frame, wjob *j)
{
	uint32_t nelem = 0;
	cachew_err rv = CACHEW_OK;

	frame->len = 0;
	for (size_t i = 0; i < j->n; i++) {
		rv = cwi_element_encode(j->v[i], frame);
		if (rv != CACHEW_OK)
			break;
		nelem++;
		if (frame->len >= w->o.frame_bytes) {
			rv = flush_frame(w, cctx, frame, nelem, j);
			if (rv != CACHEW_OK)
				break;
			nelem = 0;
		}
	}
	if (rv == CACHEW_OK && nelem > 0)
		rv = flush_frame(w, cctx, frame, nelem, j);
	for (size_t i = 0; i < j->n; i++)
		cwi_element_release(j->v[i]);
	j->n = 0;
	/* A strbuf keeps its capacity: a huge frame is not kept for the
	 * life of the thread. */
	if (frame->cap > 4 * (w->o.frame_bytes + 4096)) {
		cwi_strbuf_free(frame);
		cwi_strbuf_init(frame);
	}
	return rv;
}

/* ---- chunk files -------------------------------------------------------- */

/* Appends len bytes to the chunk; the first `hashed` of them go into the
 * manifest's hash of the chunk (all of them in format 1, only the record
 * header of a record in format 2: the skeleton). */
static cachew_err
chunk_write(cwi_cache_writer *w, const void *data, size_t len, size_t hashed)
{
	chunk_out *c = &w->cur;
	const uint8_t *p = data;

	XXH64_update(&c->hash, data, hashed);
	c->bytes += len;
	if (w->root->s3) {
		cwi_strbuf_append(&c->mem, data, len);
		if (c->mem.oom)
			return cwi_fail(CACHEW_ENOMEM,
			    "cache: out of memory building chunk %s", c->name);
		return CACHEW_OK;
	}
	while (len > 0) {
		ssize_t n = write(c->fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return cwi_fail(CACHEW_EIO, "%s: write failed: %s",
			    c->tmp_path, strerror(errno));
		p += n;
		len -= (size_t)n;
	}
	/* Start writeback of what is written so far, so that the fsync at
	 * the end of the chunk has little left to do. */
	if (c->bytes - c->flushed >= (8u << 20)) {
		(void)sync_file_range(c->fd, (off64_t)c->flushed,
		    (off64_t)(c->bytes - c->flushed), SYNC_FILE_RANGE_WRITE);
		c->flushed = c->bytes;
	}
	return CACHEW_OK;
}

static cachew_err
chunk_start(cwi_cache_writer *w)
{
	chunk_out *c = &w->cur;
	uint8_t hdr[CWI_CHUNK_HEADER_SIZE];
	cwi_chunk_header h = {.version = w->o.chunk_version,
	    .cache_id = w->cache_id, .index = (uint32_t)w->nchunks};

	memset(c, 0, sizeof(*c));
	c->fd = -1;
	cwi_strbuf_init(&c->mem);
	XXH64_reset(&c->hash, 0);
	/* A part writer's chunks carry the write's id in their names, so the
	 * commit can remove what crashed or replayed parts left. */
	if (w->o.part_write_id != 0)
		c->name = cwi_asprintf(CWI_CACHE_PART_PREFIX
		    "%016llx-%016llx-%06zu.cwc",
		    (unsigned long long)w->o.part_write_id,
		    (unsigned long long)w->cache_id, w->nchunks);
	else
		c->name = cwi_asprintf("chunk-%06zu-%016llx.cwc", w->nchunks,
		    (unsigned long long)w->cache_id);
	if (c->name == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->open = true;
	if (!w->root->s3) {
		c->tmp_path = cwi_asprintf("%s/" CWI_CACHE_TMP_PREFIX "%s-%ld",
		    w->dir, c->name, (long)getpid());
		if (c->tmp_path == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		c->fd = open(c->tmp_path,
		    O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (c->fd < 0)
			return cwi_fail(CACHEW_EIO, "%s: cannot create: %s",
			    c->tmp_path, strerror(errno));
	}
	cwi_chunk_header_put(hdr, &h);
	return chunk_write(w, hdr, sizeof(hdr), sizeof(hdr));
}

/* Drops the current chunk's temporary file (abort). */
static void
chunk_discard(cwi_cache_writer *w)
{
	chunk_out *c = &w->cur;

	if (c->fd >= 0)
		close(c->fd);
	if (c->tmp_path != NULL)
		(void)unlink(c->tmp_path);
	free(c->tmp_path);
	free(c->name);
	cwi_strbuf_free(&c->mem);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static cachew_err
chunk_push_info(cwi_cache_writer *w)
{
	chunk_out *c = &w->cur;
	cwi_cache_chunk_info *ci;

	if (w->nchunks == w->chunks_cap) {
		size_t cap = w->chunks_cap ? 2 * w->chunks_cap : 8;
		ci = realloc(w->chunks, cap * sizeof(*ci));
		if (ci == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		w->chunks = ci;
		w->chunks_cap = cap;
	}
	ci = &w->chunks[w->nchunks++];
	ci->name = c->name;
	ci->elements = c->elements;
	ci->bytes = c->bytes;
	ci->xxh64 = XXH64_digest(&c->hash);
	ci->writer_id = w->cache_id;
	ci->index = (uint32_t)(w->nchunks - 1);
	c->name = NULL;
	w->chunk_bytes_total += c->bytes;
	return CACHEW_OK;
}

/* Writes the trailer, makes the chunk durable under its final name. */
static cachew_err
chunk_finish(cwi_cache_writer *w)
{
	chunk_out *c = &w->cur;
	uint8_t tr[CWI_CHUNK_TRAILER_SIZE];
	cwi_chunk_trailer t = {.records = c->records, .elements = c->elements,
	    .ubytes = c->ubytes};
	char *path = NULL;
	cachew_err rv;

	cwi_chunk_trailer_put(tr, &t);
	rv = chunk_write(w, tr, sizeof(tr), sizeof(tr));
	if (rv != CACHEW_OK)
		return rv;
	path = cwi_asprintf("%s/%s", w->dir, c->name);
	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (w->root->s3) {
		rv = cwi_io_put(path, c->mem.data, c->mem.len, NULL);
		cwi_strbuf_free(&c->mem);
	} else {
		/* A part's chunks are made durable by the commit, once for
		 * the whole write, off the workers' data path. */
		if (w->o.part_write_id == 0 && fsync(c->fd) != 0)
			rv = cwi_fail(CACHEW_EIO, "%s: fsync failed: %s",
			    c->tmp_path, strerror(errno));
		if (close(c->fd) != 0 && rv == CACHEW_OK)
			rv = cwi_fail(CACHEW_EIO, "%s: close failed: %s",
			    c->tmp_path, strerror(errno));
		c->fd = -1;
		if (rv == CACHEW_OK && rename(c->tmp_path, path) != 0)
			rv = cwi_fail(CACHEW_EIO, "%s: rename failed: %s",
			    c->tmp_path, strerror(errno));
		if (rv == CACHEW_OK) {
			free(c->tmp_path);
			c->tmp_path = NULL;
		}
	}
	free(path);
	if (rv == CACHEW_OK)
		rv = chunk_push_info(w);
	if (rv == CACHEW_OK)
		c->open = false;
	return rv;
}

/* ---- capacity ----------------------------------------------------------- */

/* What the root holds besides this writer's own files. A part writer
 * shares its cache's directory with the other parts of its write and with
 * the parts of writes that never committed (a client may start any number
 * of them): those count too, or such parts could fill the storage one
 * part at a time, each within the capacity on its own. */
static cachew_err
others_usage(cwi_cache_writer *w, uint64_t *bytes)
{
	uint64_t all = 0, mine;
	cachew_err rv;

	if (w->o.part_write_id == 0)
		return cwi_cache_usage(w->root, &w->fp, bytes);
	rv = cwi_cache_usage(w->root, NULL, &all);
	mine = w->chunk_bytes_total + (w->cur.open ? w->cur.bytes : 0);
	*bytes = all > mine ? all - mine : 0;
	return rv;
}

/* Keeps the root within its capacity before `more` bytes are appended:
 * evicts other caches when needed, fails with CACHEW_ENOMEM when even that
 * is not enough. */
static cachew_err
check_capacity(cwi_cache_writer *w, uint64_t more)
{
	uint64_t cap = w->root->capacity, mine, freed = 0;
	cachew_err rv;

	if (cap == 0)
		return CACHEW_OK;
	mine = w->chunk_bytes_total + (w->cur.open ? w->cur.bytes : 0) + more;
	if (!w->others_known) {
		rv = others_usage(w, &w->others_bytes);
		if (rv != CACHEW_OK)
			return rv;
		w->others_known = true;
	}
	if (mine <= cap && w->others_bytes <= cap - mine)
		return CACHEW_OK;
	if (mine <= cap) {
		/* gc cannot evict this cache: its lock is held. */
		rv = cwi_cache_gc(w->root, cap - mine, &freed);
		if (rv != CACHEW_OK)
			return rv;
		rv = others_usage(w, &w->others_bytes);
		if (rv != CACHEW_OK)
			return rv;
		if (w->others_bytes <= cap - mine)
			return CACHEW_OK;
	}
	return cwi_fail(CACHEW_ENOMEM,
	    "cache root %s: capacity of %llu bytes exceeded: the cache %s "
	    "needs at least %llu bytes and the other caches hold %llu that "
	    "cannot be evicted",
	    w->root->path, (unsigned long long)cap, w->dir,
	    (unsigned long long)mine, (unsigned long long)w->others_bytes);
}

/* Appends a job's records in order, rotating chunks. */
static cachew_err
write_job(cwi_cache_writer *w, wjob *j)
{
	size_t off = 0;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < j->nrecs; i++) {
		const wrec *r = &j->recs[i];
		chunk_out *c = &w->cur;
		if (c->open && c->records > 0 &&
		    c->bytes + r->len + CWI_CHUNK_TRAILER_SIZE >
			w->o.chunk_bytes) {
			rv = chunk_finish(w);
			if (rv != CACHEW_OK)
				return rv;
			w->others_known = false; /* re-measure per chunk */
		}
		rv = check_capacity(w, r->len + CWI_CHUNK_TRAILER_SIZE +
			(c->open ? 0 : CWI_CHUNK_HEADER_SIZE));
		if (rv != CACHEW_OK)
			return rv;
		if (!c->open) {
			rv = chunk_start(w);
			if (rv != CACHEW_OK)
				return rv;
		}
		rv = chunk_write(w, j->out.data + off, r->len,
		    w->o.chunk_version == CWI_CHUNK_VERSION_1
			? r->len
			: CWI_CHUNK_REC2_SIZE);
		if (rv != CACHEW_OK)
			return rv;
		off += r->len;
		c->records++;
		c->elements += r->nelem;
		c->ubytes += r->ulen;
	}
	return CACHEW_OK;
}

/* ---- threads ------------------------------------------------------------ */

static void
done_insert(cwi_cache_writer *w, wjob *j)
{
	wjob **pp = &w->done;

	while (*pp != NULL && (*pp)->seq < j->seq)
		pp = &(*pp)->next;
	j->next = *pp;
	*pp = j;
}

/* Writes every done job that is next in order, unless another thread
 * holds the write token. w->lock held; released during I/O. */
static void
write_ready(cwi_cache_writer *w)
{
	if (w->writing)
		return;
	w->writing = true;
	while (w->done != NULL && w->done->seq == w->next_write) {
		wjob *j = w->done;
		cachew_err rv = CACHEW_OK;
		bool failed = w->err != CACHEW_OK;

		w->done = j->next;
		pthread_mutex_unlock(&w->lock);
		if (!failed)
			rv = write_job(w, j);
		pthread_mutex_lock(&w->lock);
		if (rv != CACHEW_OK)
			set_err(w, rv);
		w->queued -= j->raw;
		w->next_write++;
		job_free(j);
		pthread_cond_broadcast(&w->cv_space);
	}
	w->writing = false;
}

static void *
encoder_main(void *arg)
{
	cwi_cache_writer *w = arg;
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	cwi_strbuf frame;
	bool ok = cctx != NULL;

	cwi_strbuf_init(&frame);
	if (ok) {
		ok = !ZSTD_isError(
			ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)) &&
		    !ZSTD_isError(ZSTD_CCtx_setParameter(cctx,
			ZSTD_c_contentSizeFlag, 1));
	}
	pthread_mutex_lock(&w->lock);
	if (!ok)
		set_err(w, cwi_fail(CACHEW_ENOMEM,
			       "cache: cannot set up a zstd compressor"));
	for (;;) {
		wjob *j;
		cachew_err rv = CACHEW_OK;

		while (!w->stop && w->qhead == NULL)
			pthread_cond_wait(&w->cv_work, &w->lock);
		if (w->qhead == NULL)
			break;
		j = w->qhead;
		w->qhead = j->next;
		if (w->qhead == NULL)
			w->qtail = NULL;
		bool failed = w->err != CACHEW_OK;
		pthread_mutex_unlock(&w->lock);
		if (!failed)
			rv = encode_job(w, cctx, &frame, j);
		pthread_mutex_lock(&w->lock);
		if (rv != CACHEW_OK)
			set_err(w, rv);
		done_insert(w, j);
		write_ready(w);
	}
	pthread_mutex_unlock(&w->lock);
	ZSTD_freeCCtx(cctx);
	cwi_strbuf_free(&frame);
	return NULL;
}

/* Stops and joins the encoder threads after they drain the queue. */
static void
stop_threads(cwi_cache_writer *w)
{
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cv_work);
	pthread_mutex_unlock(&w->lock);
	for (int i = 0; i < w->nthreads; i++)
		pthread_join(w->threads[i], NULL);
	w->nthreads = 0;
}

/* ---- producer ----------------------------------------------------------- */

/* Hands the open job to the encoders, first waiting while the queue is
 * over its memory bound. */
static cachew_err
submit(cwi_cache_writer *w)
{
	wjob *j = w->open;

	w->open = NULL;
	if (j == NULL || j->n == 0) {
		job_free(j);
		return CACHEW_OK;
	}
	pthread_mutex_lock(&w->lock);
	while (w->err == CACHEW_OK && w->queued > 0 &&
	    w->queued + j->raw > w->o.queue_bytes)
		pthread_cond_wait(&w->cv_space, &w->lock);
	if (w->err != CACHEW_OK) {
		pthread_mutex_unlock(&w->lock);
		job_free(j);
		return sticky(w);
	}
	j->seq = w->next_seq++;
	w->queued += j->raw;
	if (w->qtail != NULL)
		w->qtail->next = j;
	else
		w->qhead = j;
	w->qtail = j;
	pthread_cond_signal(&w->cv_work);
	pthread_mutex_unlock(&w->lock);
	return CACHEW_OK;
}

/* Folds e into the element spec: same component count, dtypes and ranks
 * as the first element; a dimension that differs becomes -1. */
static cachew_err
spec_merge(cwi_cache_writer *w, const cwi_element *e)
{
	char got[128];

	if (w->added == 0) {
		if (e->n == 0 || e->n > CACHEW_MAX_COMPONENTS)
			return cwi_fail(CACHEW_ETYPE,
			    "cache: an element has %u components", e->n);
		w->ncomp = e->n;
		for (uint32_t i = 0; i < e->n; i++) {
			w->spec[i].dtype = (cachew_dtype)e->comp[i].dtype;
			w->spec[i].rank = e->comp[i].rank;
			memcpy(w->spec[i].shape, e->comp[i].shape,
			    sizeof(w->spec[i].shape));
		}
		return CACHEW_OK;
	}
	if (e->n != w->ncomp)
		return cwi_fail(CACHEW_ETYPE,
		    "cache %s: element %llu has %u components, the earlier ones "
		    "%zu",
		    w->dir, (unsigned long long)w->added, e->n, w->ncomp);
	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];
		cwi_cache_spec *s = &w->spec[i];
		if (t->dtype != s->dtype || t->rank != s->rank)
			return cwi_fail(CACHEW_ETYPE,
			    "cache %s: element %llu: component %u is %s, the "
			    "earlier ones are %s with %u dimensions",
			    w->dir, (unsigned long long)w->added, i,
			    cwi_tensor_spec_str(t, got, sizeof(got)),
			    cachew_dtype_name(s->dtype), s->rank);
		for (unsigned d = 0; d < t->rank; d++)
			if (s->shape[d] != t->shape[d])
				s->shape[d] = -1;
	}
	return CACHEW_OK;
}

/* What an element counts against the frame target and the queue bound:
 * its payload plus an allowance for the encoding's headers. */
static size_t
element_cost(const cwi_element *e)
{
	size_t n = 0;

	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];
		n += cwi_tensor_nbytes(t) + 32 + 9 * (size_t)t->rank;
		if (t->dtype == CACHEW_BYTES)
			n += 2 * (size_t)cwi_tensor_numel(t);
	}
	return n;
}

cachew_err
cwi_cache_writer_add(cwi_cache_writer *w, cwi_element *const *v, size_t n)
{
	cachew_err rv;

	if (w->committed)
		return cwi_fail(CACHEW_ECLOSED, "cache writer: already committed");
	pthread_mutex_lock(&w->lock);
	rv = w->err;
	pthread_mutex_unlock(&w->lock);
	if (rv != CACHEW_OK)
		return sticky(w);
	for (size_t i = 0; i < n; i++) {
		wjob *j = w->open;
		rv = spec_merge(w, v[i]);
		if (rv != CACHEW_OK)
			goto fail;
		if (j == NULL) {
			j = calloc(1, sizeof(*j));
			if (j == NULL) {
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				goto fail;
			}
			cwi_strbuf_init(&j->out);
			w->open = j;
		}
		if (j->n == j->cap) {
			size_t cap = j->cap ? 2 * j->cap : 64;
			cwi_element **nv = realloc(j->v, cap * sizeof(*nv));
			if (nv == NULL) {
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				goto fail;
			}
			j->v = nv;
			j->cap = cap;
		}
		cwi_element_retain(v[i]);
		j->v[j->n++] = v[i];
		j->raw += element_cost(v[i]);
		w->added++;
		if (j->raw >= w->o.frame_bytes) {
			rv = submit(w);
			if (rv != CACHEW_OK)
				return rv;
		}
	}
	return CACHEW_OK;
fail:
	pthread_mutex_lock(&w->lock);
	set_err(w, rv);
	pthread_mutex_unlock(&w->lock);
	return rv;
}

/* ---- create, commit, destroy -------------------------------------------- */

static bool
manifest_present(const cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char *path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_MANIFEST), *bad;
	bool present;

	if (path == NULL)
		return false;
	if (r->s3) {
		cwi_file *f = NULL;
		present = cwi_file_open(&f, path, NULL) == CACHEW_OK;
		cwi_file_close(f);
	} else {
		present = access(path, F_OK) == 0;
	}
	free(path);
	if (!present)
		return false;
	bad = cwi_cache_bad_reason(r, fp);
	free(bad);
	return bad == NULL;
}

/* Creates the cache directory and takes its lock (op LOCK_EX or
 * LOCK_SH) into w->lockfd. */
static cachew_err
lock_dir(cwi_cache_writer *w, int op)
{
	cachew_err rv;

	for (int round = 0;; round++) {
		rv = cwi_cache_mkdirs(w->dir);
		if (rv == CACHEW_OK)
			rv = cwi_cache_lock(w->dir, op, true, &w->lockfd);
		/* A remover took the directory away between the two. */
		if (rv != CACHEW_ENOENT || round == 8)
			return rv;
	}
}

/* Local: creates the directory and takes its lock, then clears what a
 * dead writer or a bad cache left. */
static cachew_err
take_dir(cwi_cache_writer *w)
{
	cachew_err rv;

	if (w->root->s3) {
		w->owns_dir = true;
		return cwi_cache_clear_dir(w->root, w->dir, true);
	}
	rv = lock_dir(w, LOCK_EX);
	if (rv == CACHEW_EEXIST)
		return cwi_fail(CACHEW_EEXIST,
		    "cache %s is being written, read or removed by another "
		    "writer",
		    w->dir);
	if (rv != CACHEW_OK)
		return rv;
	if (manifest_present(w->root, &w->fp)) {
		/* Finished by another writer since the first look. */
		cwi_cache_unlock(w->lockfd);
		w->lockfd = -1;
		return cwi_fail(CACHEW_EEXIST, "cache %s already exists", w->dir);
	}
	w->owns_dir = true;
	return cwi_cache_clear_dir(w->root, w->dir, true);
}

/* A part writer shares the directory with the other parts of its write:
 * a shared lock keeps gc and rm away (and excludes a single writer, which
 * takes it exclusively), and nothing is cleared. */
static cachew_err
take_dir_part(cwi_cache_writer *w)
{
	cachew_err rv;

	if (w->root->s3)
		return CACHEW_OK;
	rv = lock_dir(w, LOCK_SH);
	if (rv == CACHEW_EEXIST)
		return cwi_fail(CACHEW_EEXIST,
		    "cache %s is being written or removed by a single writer",
		    w->dir);
	return rv;
}

static cachew_err
apply_opts(cwi_cache_writer *w, const cwi_cache_writer_opts *opts)
{
	if (opts != NULL)
		w->o = *opts;
	cwi_names_ref(w->o.names); /* destroy drops it */
	if (w->o.part_write_id != 0) {
		if (w->o.npart_units == 0 || w->o.npart_units > (1u << 20))
			return cwi_fail(CACHEW_EINVAL,
			    "cache writer: a part needs 1 to 2^20 unit "
			    "ranges, not %zu",
			    w->o.npart_units);
		w->part_units = calloc(w->o.npart_units, sizeof(*w->part_units));
		if (w->part_units == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		for (size_t i = 0; i < w->o.npart_units; i++) {
			if (w->o.part_units[i].begin >= w->o.part_units[i].end)
				return cwi_fail(CACHEW_EINVAL,
				    "cache writer: unit range %zu is empty", i);
			w->part_units[i] = w->o.part_units[i];
		}
		w->o.part_units = w->part_units;
	}
	if (w->o.chunk_bytes == 0)
		w->o.chunk_bytes = CWI_CACHE_CHUNK_BYTES;
	if (w->o.frame_bytes == 0)
		w->o.frame_bytes = CWI_CACHE_FRAME_BYTES;
	if (w->o.threads <= 0)
		w->o.threads = 2;
	if (w->o.frame_bytes > CWI_CACHE_MAX_FRAME_BYTES / 2)
		return cwi_fail(CACHEW_ERANGE,
		    "cache writer: frame_bytes %zu is over the limit of %u",
		    w->o.frame_bytes, CWI_CACHE_MAX_FRAME_BYTES / 2);
	if (w->o.threads > 256)
		return cwi_fail(CACHEW_ERANGE,
		    "cache writer: %d threads is over the limit of 256",
		    w->o.threads);
	if (w->o.zstd_level != CWI_CHUNK_LEVEL_AUTO &&
	    (w->o.zstd_level < ZSTD_minCLevel() ||
		w->o.zstd_level > ZSTD_maxCLevel()))
		return cwi_fail(CACHEW_ERANGE,
		    "cache writer: zstd level %d is outside [%d, %d]",
		    w->o.zstd_level, ZSTD_minCLevel(), ZSTD_maxCLevel());
	if (w->o.chunk_version == 0)
		w->o.chunk_version = CWI_CHUNK_VERSION;
	if (w->o.chunk_version != CWI_CHUNK_VERSION_1 &&
	    w->o.chunk_version != CWI_CHUNK_VERSION_2)
		return cwi_fail(CACHEW_EINVAL,
		    "cache writer: chunk format version %u is not one this "
		    "writer knows (1 or 2)",
		    w->o.chunk_version);
	if (w->o.queue_bytes == 0)
		w->o.queue_bytes = 4 * w->o.frame_bytes * (size_t)w->o.threads;
	return CACHEW_OK;
}

cachew_err
cwi_cache_writer_create(cwi_cache_writer **out, cwi_cache_root *r,
    const cachew_fingerprint *fp, const char *pipeline,
    const cwi_cache_writer_opts *opts)
{
	cwi_cache_writer *w = calloc(1, sizeof(*w));
	cachew_err rv;

	*out = NULL;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	w->root = r;
	w->fp = *fp;
	w->lockfd = -1;
	w->cur.fd = -1;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cv_work, NULL);
	pthread_cond_init(&w->cv_space, NULL);
	rv = apply_opts(w, opts);
	if (rv != CACHEW_OK)
		goto fail;
	w->pipeline = cwi_strdup(pipeline != NULL ? pipeline : "");
	w->dir = cwi_cache_dir_path(r, fp);
	if (w->pipeline == NULL || w->dir == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	/* The common case, a complete cache, costs no lock. */
	if (manifest_present(r, fp)) {
		rv = cwi_fail(CACHEW_EEXIST, "cache %s already exists", w->dir);
		goto fail;
	}
	rv = w->o.part_write_id != 0 ? take_dir_part(w) : take_dir(w);
	if (rv != CACHEW_OK)
		goto fail;
	w->cache_id = cwi_cache_random64();
	w->threads = calloc((size_t)w->o.threads, sizeof(pthread_t));
	if (w->threads == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < w->o.threads; i++) {
		if (pthread_create(&w->threads[i], NULL, encoder_main, w) != 0) {
			rv = cwi_fail(CACHEW_ENOMEM,
			    "cache writer: cannot start a thread");
			goto fail;
		}
		w->nthreads++;
	}
	*out = w;
	return CACHEW_OK;
fail:
	/* Nothing was written: destroy only unlocks (and removes the
	 * directory when this writer took it). */
	cwi_cache_writer_destroy(w);
	return rv;
}

cachew_err
cwi_cache_writer_commit(cwi_cache_writer *w)
{
	cwi_cache_manifest m;
	cwi_strbuf sb;
	cachew_err rv;

	if (w->committed)
		return cwi_fail(CACHEW_ECLOSED, "cache writer: already committed");
	rv = submit(w);
	if (rv != CACHEW_OK)
		return rv;
	pthread_mutex_lock(&w->lock);
	while (w->err == CACHEW_OK && w->next_write < w->next_seq)
		pthread_cond_wait(&w->cv_space, &w->lock);
	rv = w->err;
	pthread_mutex_unlock(&w->lock);
	if (rv != CACHEW_OK)
		return sticky(w);
	stop_threads(w);
	/* The threads are gone: this thread owns the chunk state now. */
	if (w->cur.open)
		rv = chunk_finish(w);
	if (rv == CACHEW_OK && !w->root->s3 && w->o.part_write_id == 0)
		rv = cwi_cache_fsync_dir(w->dir); /* the chunks' renames */
	if (rv != CACHEW_OK)
		goto fail;
	memset(&m, 0, sizeof(m));
	m.fp = w->fp;
	m.pipeline = w->pipeline;
	m.writer_version = CACHEW_VERSION_NUMBER;
	m.cache_id = w->cache_id;
	m.created_unix = (int64_t)time(NULL);
	m.elements = w->added;
	m.bytes = w->chunk_bytes_total;
	m.ncomponents = w->ncomp;
	m.spec = w->spec;
	/* An empty cache has no components to name. */
	m.names = w->ncomp > 0 ? w->o.names : NULL;
	m.nchunks = w->nchunks;
	m.chunks = w->chunks;
	m.units = w->part_units;
	m.nunits = w->part_units != NULL ? w->o.npart_units : 0;
	cwi_strbuf_init(&sb);
	rv = cwi_cache_manifest_encode(&m, &sb);
	if (rv == CACHEW_OK && w->o.part_write_id != 0) {
		char name[64];
		snprintf(name, sizeof(name),
		    CWI_CACHE_PART_PREFIX "%016llx-%016llx" CWI_CACHE_PART_SUFFIX,
		    (unsigned long long)w->o.part_write_id,
		    (unsigned long long)w->cache_id);
		rv = cwi_cache_put_file(w->root, w->dir, name, sb.data, sb.len,
		    false);
	} else if (rv == CACHEW_OK) {
		rv = cwi_cache_put_file(w->root, w->dir, CWI_CACHE_FILE_MANIFEST,
		    sb.data, sb.len, true);
	}
	cwi_strbuf_free(&sb);
	if (rv != CACHEW_OK)
		goto fail;
	w->committed = true;
	cwi_cache_unlock(w->lockfd);
	w->lockfd = -1;
	cwi_log(CACHEW_LOG_INFO, "cache",
	    "%s: wrote %s%llu elements in %zu chunks, %llu bytes", w->dir,
	    w->o.part_write_id != 0 ? "a part of " : "",
	    (unsigned long long)w->added, w->nchunks,
	    (unsigned long long)w->chunk_bytes_total);
	return CACHEW_OK;
fail:
	pthread_mutex_lock(&w->lock);
	set_err(w, rv);
	pthread_mutex_unlock(&w->lock);
	return rv;
}

/* Removes everything this writer wrote (abort). */
static void
abort_files(cwi_cache_writer *w)
{
	chunk_discard(w);
	for (size_t i = 0; i < w->nchunks; i++) {
		char *path = cwi_asprintf("%s/%s", w->dir, w->chunks[i].name);
		if (path != NULL)
			(void)cwi_cache_unlink(w->root, path);
		free(path);
	}
	/* The directory was emptied when this writer took it: what is left
	 * is its own, the lock file included. A part writer shares it. */
	if (w->o.part_write_id == 0)
		(void)cwi_cache_clear_dir(w->root, w->dir, false);
}

void
cwi_cache_writer_destroy(cwi_cache_writer *w)
{
	char *saved;

	if (w == NULL)
		return;
	/* Cleaning up must not replace the message of the failure that
	 * led here. */
	saved = cwi_strdup(cachew_errmsg());
	if (w->nthreads > 0) {
		pthread_mutex_lock(&w->lock);
		if (!w->committed && w->err == CACHEW_OK)
			w->err = CACHEW_ECANCELED; /* encoders drop the rest */
		pthread_mutex_unlock(&w->lock);
		stop_threads(w);
	}
	job_free(w->open);
	while (w->qhead != NULL) {
		wjob *j = w->qhead;
		w->qhead = j->next;
		job_free(j);
	}
	while (w->done != NULL) {
		wjob *j = w->done;
		w->done = j->next;
		job_free(j);
	}
	if (!w->committed && (w->owns_dir || w->o.part_write_id != 0))
		abort_files(w);
	cwi_cache_unlock(w->lockfd);
	for (size_t i = 0; i < w->nchunks; i++)
		free(w->chunks[i].name);
	free(w->chunks);
	free(w->cur.name);
	free(w->cur.tmp_path);
	cwi_strbuf_free(&w->cur.mem);
	free(w->threads);
	free(w->part_units);
	cwi_names_unref(w->o.names);
	free(w->pipeline);
	free(w->dir);
	free(w->errmsg);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cv_work);
	pthread_cond_destroy(&w->cv_space);
	free(w);
	if (saved != NULL)
		(void)cwi_fail(CACHEW_OK, "%s", saved);
	free(saved);
}
