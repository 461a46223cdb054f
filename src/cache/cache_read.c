/*
 * cache_read.c - reading one chunk of a cache, verified against its
 * manifest (docs/cache-format.md, "What a reader checks").
 *
 * The chunk is read sequentially through cwi_file (local paths and s3://
 * alike), one record at a time. A stored record (format 2) is read into a
 * buffer of its own from the recycled large-buffer pool and hashed with
 * XXH3 as it arrives; a zstd record is decompressed (zstd verifies its
 * content checksum). Every element is then decoded and checked against
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
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
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

/* Reads exactly len bytes (the caller checked they lie within the size
 * the manifest gives). */
static cachew_err
read_exact(cwi_cache_reader *rd, void *dst, size_t len, read_hash how)
{
	size_t done = 0, got;
	int fd = cwi_file_fd(rd->f);
	cachew_err rv;

	/* Ask for the next window while this one is decoded. */
	if (fd >= 0 && rd->pos + len + READAHEAD_BYTES / 2 >= rd->ra_end &&
	    rd->ra_end < rd->want_bytes) {
		uint64_t from = rd->ra_end > rd->pos ? rd->ra_end : rd->pos;
		rd->ra_end = from + len + READAHEAD_BYTES;
		(void)posix_fadvise(fd, (off_t)from, (off_t)(rd->ra_end - from),
		    POSIX_FADV_WILLNEED);
	}
	/* In pieces that stay in the core's cache between the copy out of
	 * the page cache and the hash: hashing a whole frame after reading
	 * it read it all back from memory (a quarter of cache_get's time). */
	while (done < len) {
		size_t want = len - done < READ_PIECE ? len - done : READ_PIECE;

		rv = cwi_file_read(rd->f, (uint8_t *)dst + done, want, &got);
		if (rv != CACHEW_OK)
			return rv;
		if (got == 0)
			return cwi_fail(CACHEW_ECORRUPT,
			    "%s: truncated: the file ends at byte %llu, the "
			    "manifest says %llu bytes",
			    rd->path, (unsigned long long)(rd->pos + done),
			    (unsigned long long)rd->want_bytes);
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
    const cwi_cache_manifest *m, size_t index)
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
	if (rv == CACHEW_ENOENT)
		rv = cwi_fail(CACHEW_ECORRUPT, "%s: the chunk file is missing",
		    rd->path);
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
	rv = cwi_file_read(rd->f, &extra, 1, &got);
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
load_frame_v1(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at)
{
	cachew_err rv = grow_buf(rd, (size_t)r->clen + CWI_CHUNK_REC1_SIZE);

	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->buf, (size_t)r->clen + CWI_CHUNK_REC1_SIZE,
		    HASH_FILE);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(rd->hdr, rd->buf + r->clen, CWI_CHUNK_REC1_SIZE);
	return cwi_chunk_frame_decode(rd->dctx, rd->path, at, r, rd->buf,
	    rd->pend);
}

/* Format 2: whether the payload just read has the XXH3 its header
 * gives; the error names the chunk, the record and its bytes. */
static cachew_err
check_payload(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at)
{
	if (XXH3_64bits_digest(&rd->content) == r->hash)
		return CACHEW_OK;
	return cwi_fail(CACHEW_ECORRUPT,
	    "%s: record %u (%s, %u bytes from byte %llu): XXH3 of its "
	    "payload differs from its header's: the bytes are damaged",
	    rd->path, rd->records,
	    r->kind == CWI_CHUNK_REC_STORED ? "stored" : "zstd", r->clen,
	    (unsigned long long)(at + rd->rec_size));
}

/* Format 2, a stored record: its bytes go into a buffer that its elements
 * then share (no copy after the one out of the page cache), hashed with
 * XXH3 piece by piece as they arrive, while they are in the core's cache.
 * The next record header is read apart: it belongs to the skeleton. */
static cachew_err
load_stored(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at)
{
	cwi_buffer *buf = NULL;
	cachew_err rv = cwi_buffer_alloc(&buf, r->clen, false);

	if (rv != CACHEW_OK)
		return rv;
	(void)XXH3_64bits_reset(&rd->content);
	rv = read_exact(rd, buf->data, r->clen, HASH_CONTENT);
	if (rv == CACHEW_OK)
		rv = check_payload(rd, r, at);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
	if (rv == CACHEW_OK)
		rv = cwi_chunk_stored_decode(buf, rd->path, at, r, rd->pend);
	cwi_buffer_unref(buf);
	return rv;
}

/* Format 2, a zstd record: the frame (hashed as it arrives, then
 * decompressed, which checks its content checksum), then the next record
 * header. */
static cachew_err
load_frame_v2(cwi_cache_reader *rd, const cwi_chunk_rec *r, uint64_t at)
{
	cachew_err rv = grow_buf(rd, r->clen);

	(void)XXH3_64bits_reset(&rd->content);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->buf, r->clen, HASH_CONTENT);
	if (rv == CACHEW_OK)
		rv = check_payload(rd, r, at);
	if (rv == CACHEW_OK)
		rv = read_exact(rd, rd->hdr, rd->rec_size, HASH_FILE);
	if (rv != CACHEW_OK)
		return rv;
	return cwi_chunk_frame_decode(rd->dctx, rd->path, at, r, rd->buf,
	    rd->pend);
}

/* Reads, verifies and decodes the next record into rd->pend. */
static cachew_err
load_record(cwi_cache_reader *rd)
{
	uint64_t at = rd->pos - rd->rec_size;
	cwi_chunk_rec r;
	char why[256];
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
	if (r.nelem > rd->pend_cap) {
		cwi_element **p = realloc(rd->pend, r.nelem * sizeof(*p));
		if (p == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		rd->pend = p;
		rd->pend_cap = r.nelem;
	}
	if (rd->version == CWI_CHUNK_VERSION_1)
		rv = load_frame_v1(rd, &r, at);
	else if (r.kind == CWI_CHUNK_REC_STORED)
		rv = load_stored(rd, &r, at);
	else
		rv = load_frame_v2(rd, &r, at);
	if (rv != CACHEW_OK)
		return rv;
	for (uint32_t i = 0; i < r.nelem; i++) {
		if (!cwi_cache_spec_match(rd->spec, rd->ncomp, rd->pend[i], why,
			sizeof(why))) {
			for (uint32_t k = 0; k < r.nelem; k++)
				cwi_element_release(rd->pend[k]);
			return cwi_fail(CACHEW_ECORRUPT,
			    "%s: record at byte %llu: element %u does not match "
			    "the manifest's spec: %s",
			    rd->path, (unsigned long long)at, i, why);
		}
	}
	rd->npend = r.nelem;
	rd->ipend = 0;
	rd->records++;
	rd->elements += r.nelem;
	rd->ubytes += r.ulen;
	return CACHEW_OK;
}

cachew_err
cwi_cache_reader_next(cwi_cache_reader *rd, cwi_chunk *out, size_t max)
{
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
		rv = load_record(rd);
		if (rv == CACHEW_EOF) {
			rd->eof = true;
			return rv;
		}
		if (rv != CACHEW_OK)
			return corrupt(rd, rv);
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
