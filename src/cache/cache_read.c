/*
 * cache_read.c - reading one chunk of a cache, verified against its
 * manifest (docs/cache-format.md, "What a reader checks").
 *
 * A record is claimed, then loaded. The claims walk the chunk in file
 * order, one at a time: a record header, then the one after its payload
 * (the skeleton). A stored record (format 2) of a local file is loaded
 * apart, by any thread, with pread(2) at its offset, so that several
 * threads read one chunk (op_cache.c); its bytes go into a buffer of
 * their own from the recycled large-buffer pool and are hashed with XXH3
 * as they arrive. Any other record (a zstd frame, which zstd's content
 * checksum also covers; format 1; a remote file, read in order through
 * cwi_file) is read and verified by its claim. Every element is then decoded and checked against
 * the spec, and only then are the record's elements handed out, as
 * zero-copy slices of the buffer read (stored) or decompressed (zstd); so
 * a damaged record never yields an element. The record headers and the
 * trailer carry their own checksums, the element counts and sizes are
 * checked against the trailer and the manifest, and the XXH64 the
 * manifest gives is compared at the end: of the whole file in format 1,
 * of its skeleton (header, record headers, trailer) in format 2, whose
 * record headers carry each payload's hash. A stored record's bytes are
 * so hashed once, right after the copy out of the page cache, and never
 * copied again: cache_get of 224x224x3 crops took 3.4x the CPU of `cat`
 * in format 1 (zstd copying raw blocks, its checksum, and the file's
 * XXH64 over every byte).
 */
#include "cache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <unistd.h>

/* A shared lock conflicts only with a writer taking a directory over or a
 * remover, both brief when the cache is complete: retry a little. */
#define LOCK_TRIES 50
#define LOCK_WAIT_NS 2000000ull
/* Local files: how far ahead of the reader the kernel is asked to read.
 * The default readahead (128-256 KiB) leaves a fast disk idle while a
 * frame is decoded; 8 MiB windows keep it busy. */
#define READAHEAD_BYTES (8u << 20)
/* Bytes read and hashed at a time: well inside a core's L2. */
#define READ_PIECE (128u << 10)

struct cwi_cache_reader {
	cwi_cache_root *root;
	cachew_fingerprint fp;
	char *path;
	cwi_file *f;
	int lockfd;
	size_t ncomp;
	cwi_cache_spec *spec;
	uint64_t want_elements, want_bytes, want_xxh64;
	uint64_t cache_id;    /* the chunk header's: its writer's id */
	uint64_t manifest_id; /* the manifest's, to tell a replaced cache */
	uint32_t index;

	uint32_t version;     /* the chunk format, from its header */
	size_t rec_size;      /* its record header size */
	XXH64_state_t hash;   /* the manifest's: whole file, or skeleton */
	XXH3_state_t content; /* a format 2 record's payload */
	uint64_t pos; /* bytes read from the file */
	uint64_t ra_end; /* local: readahead requested up to here */
	bool no_willneed; /* opened with willneed false */
	uint64_t elements, ubytes;
	uint32_t records;
	ZSTD_DCtx *dctx;
	uint8_t *buf; /* format 1: a frame plus the next record header;
		       * format 2: a zstd frame */
	size_t cap;
	uint8_t hdr[CWI_CHUNK_REC_MAX_SIZE]; /* the next record header */

	cwi_element **pend; /* decoded, verified, not yet handed out */
	size_t npend, ipend, pend_cap;
	bool eof;
	cachew_err err;
	char *errmsg;
};

/* Records a defect: sticky, and the cache is marked bad. */
static cachew_err
corrupt(cwi_cache_reader *rd, cachew_err rv)
{
	rd->err = rv;
	free(rd->errmsg);
	rd->errmsg = cwi_strdup(cachew_errmsg());
	if (rv == CACHEW_ECORRUPT && rd->errmsg != NULL) {
		(void)cwi_cache_mark_bad(rd->root, &rd->fp, rd->errmsg);
		(void)cwi_fail(rv, "%s", rd->errmsg);
	}
	return rv;
}

/* Which hash the bytes read go into. */
typedef enum read_hash {
	HASH_FILE,    /* the manifest's XXH64 (format 1: every byte) */
	HASH_CONTENT, /* a format 2 payload's XXH3 */
} read_hash;

static void
hash_piece(cwi_cache_reader *rd, read_hash how, const void *p, size_t len)
{
	if (how == HASH_FILE)
		XXH64_update(&rd->hash, p, len);
	else
		(void)XXH3_64bits_update(&rd->content, p, len);
}

/* Asks the kernel for the next window of a local file while this one
 * is decoded; len is what is about to be read at rd->pos. */
static void
read_ahead(cwi_cache_reader *rd, uint64_t len)
{
	int fd = cwi_file_fd(rd->f);
	uint64_t from;

	if (fd < 0 || rd->no_willneed ||
	    rd->pos + len + READAHEAD_BYTES / 2 < rd->ra_end ||
	    rd->ra_end >= rd->want_bytes)
		return;
	from = rd->ra_end > rd->pos ? rd->ra_end : rd->pos;
	rd->ra_end = from + len + READAHEAD_BYTES;
	(void)posix_fadvise(fd, (off_t)from, (off_t)(rd->ra_end - from),
	    POSIX_FADV_WILLNEED);
}

/* One read of up to len bytes at byte off. A local file is read with
 * pread(2) at off, so that loads on several threads and the claims share
 * its descriptor; a remote one is read in order (off is then its own
 * position: remote records are all read by claims, one at a time). */
static cachew_err
read_some(cwi_cache_reader *rd, void *dst, size_t len, uint64_t off,
    size_t *got)
{
	int fd = cwi_file_fd(rd->f);
	ssize_t n;

	if (fd < 0)
		return cwi_file_read(rd->f, dst, len, got);
	do
		n = pread(fd, dst, len, (off_t)off);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		*got = 0;
		return cwi_fail(CACHEW_EIO,
		    "%s: read failed at byte offset %llu: %s", rd->path,
		    (unsigned long long)off, strerror(errno));
	}
	*got = (size_t)n;
	return CACHEW_OK;
}

static cachew_err
truncated(const cwi_cache_reader *rd, uint64_t at)
{
	return cwi_fail(CACHEW_ECORRUPT,
	    "%s: truncated: the file ends at byte %llu, the manifest says %llu "
	    "bytes",
	    rd->path, (unsigned long long)at,
	    (unsigned long long)rd->want_bytes);
}

/* Reads exactly len bytes at rd->pos (the caller checked they lie within
 * the size the manifest gives). */
static cachew_err
read_exact(cwi_cache_reader *rd, void *dst, size_t len, read_hash how)
{
	size_t done = 0, got;
	cachew_err rv;

	read_ahead(rd, len);
	/* In pieces that stay in the core's cache between the copy out of
	 * the page cache and the hash: hashing a whole frame after reading
	 * it read it all back from memory (a quarter of cache_get's time). */
	while (done < len) {
		size_t want = len - done < READ_PIECE ? len - done : READ_PIECE;

		rv = read_some(rd, (uint8_t *)dst + done, want, rd->pos + done,
		    &got);
		if (rv != CACHEW_OK)
			return rv;
		if (got == 0)
			return truncated(rd, rd->pos + done);
		hash_piece(rd, how, (uint8_t *)dst + done, got);
		done += got;
	}
	rd->pos += len;
	return CACHEW_OK;
}

static cachew_err
grow_buf(cwi_cache_reader *rd, size_t need)
{
	uint8_t *p;

	if (need <= rd->cap)
		return CACHEW_OK;
	p = realloc(rd->buf, need);
	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "%s: out of memory for %zu bytes",
		    rd->path, need);
	rd->buf = p;
	rd->cap = need;
	return CACHEW_OK;
}

/* The current manifest's cache id, to tell a replaced cache from a
 * damaged chunk header. */
static bool
current_cache_id(cwi_cache_reader *rd, uint64_t *id)
{
	cwi_cache_manifest *m = NULL;
	bool ok = cwi_cache_lookup(rd->root, &rd->fp, &m) == CACHEW_OK;

	if (ok)
		*id = m->cache_id;
	cwi_cache_manifest_free(m);
	return ok;
}

static cachew_err
read_header(cwi_cache_reader *rd)
{
	uint8_t h[CWI_CHUNK_HEADER_SIZE];
	cwi_chunk_header ch;
	uint64_t now;
	int64_t size = cwi_file_size(rd->f);
	cachew_err rv;

	if (size >= 0 && (uint64_t)size != rd->want_bytes)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: %lld bytes, the manifest says %llu", rd->path,
		    (long long)size, (unsigned long long)rd->want_bytes);
	if (rd->want_bytes < CWI_CHUNK_MIN_SIZE)
		return cwi_fail(CACHEW_ECORRUPT, "%s: the manifest's size %llu is "
						 "too small",
		    rd->path, (unsigned long long)rd->want_bytes);
	rv = read_exact(rd, h, sizeof(h), HASH_FILE);
	if (rv == CACHEW_OK)
		rv = cwi_chunk_header_parse(h, rd->path, &ch);
	if (rv != CACHEW_OK)
		return rv;
	rd->version = ch.version;
	rd->rec_size = cwi_chunk_rec_size(ch.version);
	rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
	if (rv != CACHEW_OK)
		return rv;
	if (ch.cache_id != rd->cache_id) {
		if (current_cache_id(rd, &now) && now != rd->manifest_id)
			return cwi_fail(CACHEW_ENOENT,
			    "%s: the cache was replaced since it was looked up",
			    rd->path);
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the chunk belongs to another cache (id %016llx, the "
		    "manifest says %016llx)",
		    rd->path, (unsigned long long)ch.cache_id,
		    (unsigned long long)rd->cache_id);
	}
	if (ch.index != rd->index)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: holds chunk %u, the manifest lists it as chunk %u",
		    rd->path, ch.index, rd->index);
	return CACHEW_OK;
}

/* Takes the shared lock and checks the cache still exists. */
static cachew_err
lock_cache(cwi_cache_reader *rd)
{
	char *dir, *manifest, *bad;
	cachew_err rv = CACHEW_OK;

	if (rd->root->s3)
		return CACHEW_OK;
	dir = cwi_cache_dir_path(rd->root, &rd->fp);
	if (dir == NULL)
		return CACHEW_ENOMEM;
	for (int i = 0; i < LOCK_TRIES; i++) {
		rv = cwi_cache_lock(dir, LOCK_SH, true, &rd->lockfd);
		if (rv != CACHEW_EEXIST)
			break;
		cwi_sleep_ns(LOCK_WAIT_NS);
	}
	if (rv == CACHEW_EEXIST || rv == CACHEW_ENOENT) {
		rv = cwi_fail(CACHEW_ENOENT,
		    "%s: the cache is being removed or rewritten", dir);
		goto done;
	}
	if (rv != CACHEW_OK)
		goto done;
	manifest = cwi_asprintf("%s/" CWI_CACHE_FILE_MANIFEST, dir);
	if (manifest == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	if (access(manifest, F_OK) != 0)
		rv = cwi_fail(CACHEW_ENOENT, "%s: the cache was removed", dir);
	free(manifest);
	bad = rv == CACHEW_OK ? cwi_cache_bad_reason(rd->root, &rd->fp) : NULL;
	if (bad != NULL)
		rv = cwi_fail(CACHEW_ENOENT, "%s: the cache was marked bad: %s",
		    dir, bad);
	free(bad);
done:
	free(dir);
	return rv;
}

cachew_err
cwi_cache_reader_open(cwi_cache_reader **out, cwi_cache_root *r,
    const cwi_cache_manifest *m, size_t index, bool willneed)
{
	cwi_cache_reader *rd;
	const cwi_cache_chunk_info *ci;
	cwi_io_opts io;
	cachew_err rv;

	*out = NULL;
	if (index >= m->nchunks)
		return cwi_fail(CACHEW_ERANGE,
		    "cache reader: chunk %zu of a cache of %zu chunks", index,
		    m->nchunks);
	ci = &m->chunks[index];
	rd = calloc(1, sizeof(*rd));
	if (rd == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rd->root = r;
	rd->no_willneed = !willneed;
	rd->fp = m->fp;
	rd->lockfd = -1;
	rd->ncomp = m->ncomponents;
	rd->want_elements = ci->elements;
	rd->want_bytes = ci->bytes;
	rd->want_xxh64 = ci->xxh64;
	rd->cache_id = ci->writer_id;
	rd->manifest_id = m->cache_id;
	rd->index = ci->index;
	XXH64_reset(&rd->hash, 0);
	rd->path = cwi_cache_file_path(r, &m->fp, ci->name);
	rd->spec = calloc(m->ncomponents + 1, sizeof(*rd->spec));
	rd->dctx = ZSTD_createDCtx();
	if (rd->path == NULL || rd->spec == NULL || rd->dctx == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if (m->ncomponents > 0)
		memcpy(rd->spec, m->spec, m->ncomponents * sizeof(*rd->spec));
	rv = lock_cache(rd);
	if (rv != CACHEW_OK)
		goto fail;
	if (!r->s3 || index == 0)
		cwi_cache_touch_last_read(r, &m->fp);
	cwi_cache_io_opts(&io);
	rv = cwi_file_open(&rd->f, rd->path, &io);
	if (rv == CACHEW_ENOENT) {
		/* Chunk names carry the writer's cache id: a cache removed
		 * or rewritten since the lookup lacks the old names, and is
		 * not damaged (marking it bad would hide the new one). */
		uint64_t now;
		if (!current_cache_id(rd, &now) || now != rd->manifest_id)
			rv = cwi_fail(CACHEW_ENOENT, "%s: the cache was "
			    "replaced or removed since it was looked up",
			    rd->path);
		else
			rv = cwi_fail(CACHEW_ECORRUPT,
			    "%s: the chunk file is missing", rd->path);
	}
	else if (rv == CACHEW_EINVAL) /* not a regular file: damage */
		rv = cwi_fail(CACHEW_ECORRUPT, "%s", cwi_errmsg_get());
	/* Read front to back once: Linux then doubles its readahead window
	 * for the file, besides the WILLNEED windows read_exact asks for. */
	if (rv == CACHEW_OK && cwi_file_fd(rd->f) >= 0)
		(void)posix_fadvise(cwi_file_fd(rd->f), 0, 0,
		    POSIX_FADV_SEQUENTIAL);
	if (rv == CACHEW_OK)
		rv = read_header(rd);
	if (rv != CACHEW_OK) {
		if (rv == CACHEW_ECORRUPT)
			corrupt(rd, rv);
		goto fail;
	}
	*out = rd;
	return CACHEW_OK;
fail:
	cwi_cache_reader_close(rd);
	return rv;
}

/* The trailer: the counts, the size and the manifest's XXH64 (of the whole
 * file, or of its skeleton). */
static cachew_err
finish(cwi_cache_reader *rd)
{
	uint8_t tr[CWI_CHUNK_TRAILER_SIZE], extra;
	uint64_t at = rd->pos - rd->rec_size;
	cwi_chunk_trailer t;
	size_t got = 0;
	cachew_err rv = CACHEW_OK;

	/* The record header read in its place is the trailer's start
	 * (format 1) or the whole trailer (format 2). */
	memcpy(tr, rd->hdr, rd->rec_size);
	if (rd->want_bytes - rd->pos != CWI_CHUNK_TRAILER_SIZE - rd->rec_size)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the trailer at byte %llu is not at the end of the %llu "
		    "bytes the manifest gives",
		    rd->path, (unsigned long long)at,
		    (unsigned long long)rd->want_bytes);
	if (rd->rec_size < CWI_CHUNK_TRAILER_SIZE)
		rv = read_exact(rd, tr + rd->rec_size,
		    CWI_CHUNK_TRAILER_SIZE - rd->rec_size, HASH_FILE);
	if (rv == CACHEW_OK)
		rv = cwi_chunk_trailer_parse(tr, rd->path, at, &t);
	if (rv != CACHEW_OK)
		return rv;
	if (t.records != rd->records || t.elements != rd->elements ||
	    t.ubytes != rd->ubytes)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the trailer counts %u records and %llu elements, the "
		    "file holds %u and %llu",
		    rd->path, t.records, (unsigned long long)t.elements,
		    rd->records, (unsigned long long)rd->elements);
	if (rd->elements != rd->want_elements)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: %llu elements, the manifest says %llu", rd->path,
		    (unsigned long long)rd->elements,
		    (unsigned long long)rd->want_elements);
	rv = read_some(rd, &extra, 1, rd->pos, &got);
	if (rv != CACHEW_OK)
		return rv;
	if (got != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: bytes after the trailer (the manifest says %llu bytes)",
		    rd->path, (unsigned long long)rd->want_bytes);
	if (XXH64_digest(&rd->hash) != rd->want_xxh64)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: XXH64 of the %s differs from the manifest's",
		    rd->path,
		    rd->version == CWI_CHUNK_VERSION_1 ? "file"
						       : "chunk's skeleton");
	return CACHEW_EOF;
}

/* Format 1: the frame and the next record header in one read, hashed
 * whole into the file's XXH64. */
static cachew_err
load_frame_v1(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at,
    cwi_element **out)
{
	cachew_err rv = grow_buf(rd, (size_t)r->clen + CWI_CHUNK_REC1_SIZE);

	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->buf, (size_t)r->clen + CWI_CHUNK_REC1_SIZE,
		    HASH_FILE);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(rd->hdr, rd->buf + r->clen, CWI_CHUNK_REC1_SIZE);
	return cwi_chunk_frame_decode(rd->dctx, rd->path, at, r, rd->buf, out);
}

/* Format 2: whether a payload has the XXH3 its header gives; the error
 * names the chunk, the record and its bytes. */
static cachew_err
check_payload(const cwi_cache_reader *rd, uint64_t digest,
    const cwi_chunk_rec *r, uint32_t record, uint64_t at)
{
	if (digest == r->hash)
		return CACHEW_OK;
	return cwi_fail(CACHEW_ECORRUPT,
	    "%s: record %u (%s, %u bytes from byte %llu): XXH3 of its "
	    "payload differs from its header's: the bytes are damaged",
	    rd->path, record,
	    r->kind == CWI_CHUNK_REC_STORED ? "stored" : "zstd", r->clen,
	    (unsigned long long)(at + rd->rec_size));
}

/* Format 2, a stored record read by the claim (a remote file): its bytes
 * go into a buffer that its elements then share (no copy after the one
 * out of the page cache), hashed with XXH3 piece by piece as they arrive,
 * while they are in the core's cache. The next record header is read
 * apart: it belongs to the skeleton. */
static cachew_err
load_stored(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at,
    cwi_element **out)
{
	cwi_buffer *buf = NULL;
	cachew_err rv = cwi_buffer_alloc(&buf, r->clen, false);

	if (rv != CACHEW_OK)
		return rv;
	(void)XXH3_64bits_reset(&rd->content);
	rv = read_exact(rd, buf->data, r->clen, HASH_CONTENT);
	if (rv == CACHEW_OK)
		rv = check_payload(rd, XXH3_64bits_digest(&rd->content), r,
		    rd->records, at);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
	if (rv == CACHEW_OK)
		rv = cwi_chunk_stored_decode(buf, rd->path, at, r, out);
	cwi_buffer_unref(buf);
	return rv;
}

/* Format 2, a zstd record: the frame (hashed as it arrives, then
 * decompressed, which checks its content checksum), then the next record
 * header. */
static cachew_err
load_frame_v2(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at,
    cwi_element **out)
{
	cachew_err rv = grow_buf(rd, r->clen);

	(void)XXH3_64bits_reset(&rd->content);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->buf, r->clen, HASH_CONTENT);
	if (rv == CACHEW_OK)
		rv = check_payload(rd, XXH3_64bits_digest(&rd->content), r,
		    rd->records, at);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
	if (rv != CACHEW_OK)
		return rv;
	return cwi_chunk_frame_decode(rd->dctx, rd->path, at, r, rd->buf, out);
}

/* Every element of a decoded record matches the manifest's spec; else
 * they are all released. */
static cachew_err
check_spec(const cwi_cache_reader *rd, uint64_t at, cwi_element **v,
    uint32_t n)
{
	char why[256];

	for (uint32_t i = 0; i < n; i++) {
		if (cwi_cache_spec_match(rd->spec, rd->ncomp, v[i], why,
			sizeof(why)))
			continue;
		for (uint32_t k = 0; k < n; k++) {
			cwi_element_release(v[k]);
			v[k] = NULL;
		}
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: element %u does not match the "
		    "manifest's spec: %s",
		    rd->path, (unsigned long long)at, i, why);
	}
	return CACHEW_OK;
}

/* A claimed record the claim reads itself: its elements into job->els. */
static cachew_err
claim_load(cwi_cache_reader *rd, const cwi_chunk_rec *r,
    cwi_cache_rec_job *job)
{
	cwi_element **els = calloc(r->nelem, sizeof(*els));
	cachew_err rv;

	if (els == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rd->version == CWI_CHUNK_VERSION_1)
		rv = load_frame_v1(rd, r, job->at, els);
	else if (r->kind == CWI_CHUNK_REC_STORED)
		rv = load_stored(rd, r, job->at, els);
	else
		rv = load_frame_v2(rd, r, job->at, els);
	if (rv == CACHEW_OK)
		rv = check_spec(rd, job->at, els, r->nelem);
	if (rv != CACHEW_OK) {
		free(els);
		return rv;
	}
	job->els = els;
	return CACHEW_OK;
}

/* Whether the byte at off of a local file is in the page cache: a read of
 * it that may not wait for the disk (RWF_NOWAIT) gets it. A kernel or
 * file system without RWF_NOWAIT says yes (the loads then read, as they
 * did before it was asked). */
static bool
byte_cached(int fd, uint64_t off)
{
	char c;
	struct iovec v = {.iov_base = &c, .iov_len = 1};
	ssize_t n = preadv2(fd, &v, 1, (off_t)off, RWF_NOWAIT);

	return n == 1 || (n < 0 && errno != EAGAIN);
}

/* Payloads claims read (claim_read_payload), for tests. */
static atomic_uint_fast64_t claimed_payloads;

uint64_t
cwi_cache_claimed_payloads(void)
{
	return atomic_load(&claimed_payloads);
}

/*
 * A stored payload a claim reads itself (into job->payload, unhashed: the
 * load hashes and decodes it). Two loads reading the records they claimed
 * at once, each with its own preads at its own offsets, show the kernel
 * two interleaved positions of one file: its readahead then issued 2 MiB
 * requests instead of cat's 3.5 MiB and the read of a cold file swung
 * 890-1,870 MB/s (cat 1,550-1,980). Read by the claim, in file order,
 * the file is one stream again, as cat's (1,680-1,970 MB/s). Only when
 * the record's last byte is not in the page cache: a warm read leaves
 * the copying to the loads, which share it (the claim copying every
 * record capped two threads at 4.6 GB/s instead of 7.5-8.9).
 */
static cachew_err
claim_read_payload(cwi_cache_reader *rd, const cwi_chunk_rec *r,
    cwi_cache_rec_job *job)
{
	size_t done = 0, got;
	cachew_err rv = cwi_buffer_alloc(&job->payload, r->clen, false);

	atomic_fetch_add_explicit(&claimed_payloads, 1, memory_order_relaxed);

	while (rv == CACHEW_OK && done < r->clen) {
		rv = read_some(rd, job->payload->data + done, r->clen - done,
		    rd->pos + done, &got);
		if (rv == CACHEW_OK && got == 0)
			rv = truncated(rd, rd->pos + done);
		done += got;
	}
	if (rv != CACHEW_OK) {
		cwi_buffer_unref(job->payload);
		job->payload = NULL;
	}
	return rv;
}

/* Claims the next record (or reads the trailer: CACHEW_EOF). A stored
 * record of a local file is only skipped here: the claim reads the record
 * header after it, and its payload is left to a load, which may run on
 * another thread while this one claims the next record. */
static cachew_err
claim_record(cwi_cache_reader *rd, cwi_cache_rec_job *job)
{
	uint64_t at = rd->pos - rd->rec_size;
	cwi_chunk_rec r;
	bool trailer;
	cachew_err rv;

	rv = cwi_chunk_rec_parse(rd->hdr, rd->version, rd->path, at, &r,
	    &trailer);
	if (rv != CACHEW_OK)
		return rv;
	if (trailer)
		return finish(rd);
	/* The payload and at least the trailer after it must fit in the
	 * size the manifest gives. */
	if (r.clen > rd->want_bytes - rd->pos ||
	    rd->want_bytes - rd->pos - r.clen < CWI_CHUNK_TRAILER_SIZE)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the record at byte %llu overruns the file", rd->path,
		    (unsigned long long)at);
	if (r.nelem > rd->want_elements - rd->elements)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: more elements than the manifest's %llu", rd->path,
		    (unsigned long long)rd->want_elements);
	*job = (cwi_cache_rec_job){.at = at, .payload_at = rd->pos,
	    .hash = r.hash, .clen = r.clen, .ulen = r.ulen, .nelem = r.nelem,
	    .record = rd->records};
	if (cwi_file_fd(rd->f) >= 0 && rd->version != CWI_CHUNK_VERSION_1 &&
	    r.kind == CWI_CHUNK_REC_STORED) {
		read_ahead(rd, (uint64_t)r.clen + rd->rec_size);
		if (rd->no_willneed && r.clen > 0 &&
		    !byte_cached(cwi_file_fd(rd->f), rd->pos + r.clen - 1))
			rv = claim_read_payload(rd, &r, job);
		if (rv == CACHEW_OK) {
			rd->pos += r.clen;
			rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
		}
		if (rv != CACHEW_OK)
			cwi_cache_rec_job_discard(job);
	} else {
		rv = claim_load(rd, &r, job);
	}
	if (rv != CACHEW_OK)
		return rv;
	rd->records++;
	rd->elements += r.nelem;
	rd->ubytes += r.ulen;
	return CACHEW_OK;
}

cachew_err
cwi_cache_reader_claim(cwi_cache_reader *rd, cwi_cache_rec_job *job)
{
	cachew_err rv;

	memset(job, 0, sizeof(*job));
	if (rd->err != CACHEW_OK)
		return cwi_fail(rd->err, "%s",
		    rd->errmsg != NULL ? rd->errmsg : "cache reader failed");
	if (rd->eof)
		return CACHEW_EOF;
	rv = claim_record(rd, job);
	if (rv == CACHEW_EOF)
		rd->eof = true;
	else if (rv != CACHEW_OK)
		return corrupt(rd, rv);
	return rv;
}

/* A stored payload read at its offset into a buffer its elements then
 * share, hashed piece by piece while the piece is in the core's cache;
 * only rd's immutable fields and the descriptor are used, so loads of
 * one chunk run on several threads at once. */
static cachew_err
load_claimed(cwi_cache_reader *rd, const cwi_cache_rec_job *job,
    cwi_element **out)
{
	cwi_chunk_rec r = {.clen = job->clen, .ulen = job->ulen,
	    .nelem = job->nelem, .kind = CWI_CHUNK_REC_STORED,
	    .hash = job->hash};
	XXH3_state_t st;
	cwi_buffer *buf = job->payload;
	size_t done = 0, got;
	cachew_err rv = CACHEW_OK;

	(void)XXH3_64bits_reset(&st);
	if (buf != NULL) { /* read by the claim */
		(void)XXH3_64bits_update(&st, buf->data, job->clen);
		done = job->clen;
	} else {
		rv = cwi_buffer_alloc(&buf, job->clen, false);
		if (rv != CACHEW_OK)
			return rv;
	}
	while (rv == CACHEW_OK && done < job->clen) {
		size_t want = job->clen - done < READ_PIECE ? job->clen - done
							    : READ_PIECE;
		rv = read_some(rd, buf->data + done, want,
		    job->payload_at + done, &got);
		if (rv == CACHEW_OK && got == 0)
			rv = truncated(rd, job->payload_at + done);
		if (rv == CACHEW_OK)
			(void)XXH3_64bits_update(&st, buf->data + done, got);
		done += got;
	}
	if (rv == CACHEW_OK)
		rv = check_payload(rd, XXH3_64bits_digest(&st), &r, job->record,
		    job->at);
	if (rv == CACHEW_OK)
		rv = cwi_chunk_stored_decode(buf, rd->path, job->at, &r, out);
	if (rv == CACHEW_OK)
		rv = check_spec(rd, job->at, out, job->nelem);
	cwi_buffer_unref(buf);
	return rv;
}

cachew_err
cwi_cache_reader_load(cwi_cache_reader *rd, cwi_cache_rec_job *job,
    cwi_element **out)
{
	char *msg;
	cachew_err rv;

	if (job->els != NULL) {
		memcpy(out, job->els, job->nelem * sizeof(*out));
		free(job->els);
		job->els = NULL;
		return CACHEW_OK;
	}
	rv = load_claimed(rd, job, out);
	job->payload = NULL; /* its reference went with the elements */
	if (rv != CACHEW_ECORRUPT)
		return rv;
	/* Marking the cache bad logs and writes a file: keep the message. */
	msg = cwi_strdup(cachew_errmsg());
	if (msg == NULL)
		return rv;
	(void)cwi_cache_mark_bad(rd->root, &rd->fp, msg);
	rv = cwi_fail(rv, "%s", msg);
	free(msg);
	return rv;
}

void
cwi_cache_rec_job_discard(cwi_cache_rec_job *job)
{
	if (job == NULL)
		return;
	if (job->payload != NULL) {
		cwi_buffer_unref(job->payload);
		job->payload = NULL;
	}
	if (job->els == NULL)
		return;
	for (uint32_t i = 0; i < job->nelem; i++)
		cwi_element_release(job->els[i]);
	free(job->els);
	job->els = NULL;
}

/* Records a failure of a load as sticky, without marking the cache bad a
 * second time (the load did). */
static cachew_err
load_failed(cwi_cache_reader *rd, cachew_err rv)
{
	rd->err = rv;
	free(rd->errmsg);
	rd->errmsg = cwi_strdup(cachew_errmsg());
	return rv;
}

cachew_err
cwi_cache_reader_next(cwi_cache_reader *rd, cwi_chunk *out, size_t max)
{
	cwi_cache_rec_job job;
	size_t k;
	cachew_err rv;

	if (rd->err != CACHEW_OK)
		return cwi_fail(rd->err, "%s",
		    rd->errmsg != NULL ? rd->errmsg : "cache reader failed");
	if (rd->eof)
		return CACHEW_EOF;
	if (max == 0)
		return CACHEW_OK;
	if (rd->ipend == rd->npend) {
		rv = cwi_cache_reader_claim(rd, &job);
		if (rv != CACHEW_OK)
			return rv;
		if (job.nelem > rd->pend_cap) {
			cwi_element **p = realloc(rd->pend,
			    job.nelem * sizeof(*p));
			if (p == NULL) {
				cwi_cache_rec_job_discard(&job);
				return load_failed(rd, cwi_fail(CACHEW_ENOMEM,
				    "out of memory"));
			}
			rd->pend = p;
			rd->pend_cap = job.nelem;
		}
		rv = cwi_cache_reader_load(rd, &job, rd->pend);
		if (rv != CACHEW_OK)
			return load_failed(rd, rv);
		rd->npend = job.nelem;
		rd->ipend = 0;
	}
	k = rd->npend - rd->ipend;
	if (k > max)
		k = max;
	rv = cwi_chunk_reserve(out, k);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(out->v + out->n, rd->pend + rd->ipend, k * sizeof(*out->v));
	out->n += k;
	rd->ipend += k;
	return CACHEW_OK;
}

void
cwi_cache_reader_close(cwi_cache_reader *rd)
{
	if (rd == NULL)
		return;
	for (size_t i = rd->ipend; i < rd->npend; i++)
		cwi_element_release(rd->pend[i]);
	free(rd->pend);
	cwi_file_close(rd->f);
	cwi_cache_unlock(rd->lockfd);
	ZSTD_freeDCtx(rd->dctx);
	free(rd->buf);
	free(rd->spec);
	free(rd->path);
	free(rd->errmsg);
	free(rd);
}
