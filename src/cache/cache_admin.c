/*
 * cache_admin.c - managing the caches under a root: list, verify, remove,
 * gc (least recently read first) and the usage the capacity check needs.
 *
 * Removal takes the cache's lock exclusively without waiting: a cache that
 * a writer or a reader holds is skipped (gc) or refused (rm). The manifest
 * goes first, so a removal cut short leaves a partial cache, never a
 * complete one with chunks missing.
 */
#include "cache_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

const char *
cwi_cache_state_name(cwi_cache_state s)
{
	switch (s) {
	case CWI_CACHE_COMPLETE:
		return "complete";
	case CWI_CACHE_WRITING:
		return "writing";
	case CWI_CACHE_PARTIAL:
		return "partial";
	case CWI_CACHE_BAD:
		return "bad";
	}
	return "?";
}

void
cwi_cache_entries_free(cwi_cache_entry *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].pipeline);
		free(v[i].reason);
	}
	free(v);
}

/* ---- enumerating caches ------------------------------------------------- */

typedef struct found {
	cachew_fingerprint fp;
	uint64_t bytes;
} found;

static bool
hex_name(const char *s, size_t len, cachew_fingerprint *fp)
{
	char hex[33];

	if (len != 32)
		return false;
	for (size_t i = 0; i < 32; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	memcpy(hex, s, 32);
	hex[32] = '\0';
	return cwi_cache_fp_parse(hex, fp) == CACHEW_OK;
}

static cachew_err
found_push(found **v, size_t *n, size_t *cap, const cachew_fingerprint *fp,
    uint64_t bytes)
{
	if (*n == *cap) {
		size_t nc = *cap ? 2 * *cap : 16;
		found *p = realloc(*v, nc * sizeof(*p));
		if (p == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		*v = p;
		*cap = nc;
	}
	(*v)[(*n)++] = (found){.fp = *fp, .bytes = bytes};
	return CACHEW_OK;
}

static int
found_cmp(const void *a, const void *b)
{
	const found *x = a, *y = b;

	if (x->fp.hi != y->fp.hi)
		return x->fp.hi < y->fp.hi ? -1 : 1;
	if (x->fp.lo != y->fp.lo)
		return x->fp.lo < y->fp.lo ? -1 : 1;
	return 0;
}

/* S3: one listing of every object under the root, grouped by cache. */
static cachew_err
enum_s3(cwi_cache_root *r, found **v, size_t *n, size_t *cap)
{
	cwi_io_entry *e = NULL;
	size_t ne = 0, plen = strlen(r->path) + 1;
	char *pat = cwi_asprintf("%s/*/*", r->path);
	cachew_err rv;

	if (pat == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_io_list(pat, NULL, &e, &ne);
	free(pat);
	for (size_t i = 0; rv == CACHEW_OK && i < ne; i++) {
		cachew_fingerprint fp;
		const char *rest = e[i].url + plen, *slash;
		uint64_t size = e[i].size > 0 ? (uint64_t)e[i].size : 0;
		if (strlen(e[i].url) <= plen ||
		    (slash = strchr(rest, '/')) == NULL ||
		    !hex_name(rest, (size_t)(slash - rest), &fp))
			continue;
		/* Listings come sorted: a cache's objects are adjacent. */
		if (*n > 0 && (*v)[*n - 1].fp.hi == fp.hi &&
		    (*v)[*n - 1].fp.lo == fp.lo)
			(*v)[*n - 1].bytes += size;
		else
			rv = found_push(v, n, cap, &fp, size);
	}
	cwi_io_entries_free(e, ne);
	return rv;
}

/* Every cache directory under the root with its size on storage, sorted
 * by fingerprint. */
static cachew_err
enum_caches(cwi_cache_root *r, found **out, size_t *nout)
{
	found *v = NULL;
	size_t n = 0, cap = 0;
	cachew_err rv = CACHEW_OK;

	*out = NULL;
	*nout = 0;
	if (r->s3) {
		rv = enum_s3(r, &v, &n, &cap);
	} else {
		DIR *d = opendir(r->path);
		struct dirent *de;
		if (d == NULL)
			return cwi_fail(errno == ENOENT ? CACHEW_ENOENT : CACHEW_EIO,
			    "cache root %s: %s", r->path, strerror(errno));
		while (rv == CACHEW_OK && (de = readdir(d)) != NULL) {
			cachew_fingerprint fp;
			uint64_t bytes = 0;
			char *dir;
			if (!hex_name(de->d_name, strlen(de->d_name), &fp))
				continue;
			dir = cwi_cache_dir_path(r, &fp);
			if (dir == NULL) {
				rv = CACHEW_ENOMEM;
				break;
			}
			rv = cwi_cache_dir_bytes(r, dir, &bytes);
			free(dir);
			if (rv == CACHEW_ENOENT) { /* removed meanwhile */
				rv = CACHEW_OK;
				continue;
			}
			if (rv == CACHEW_OK)
				rv = found_push(&v, &n, &cap, &fp, bytes);
		}
		closedir(d);
	}
	if (rv != CACHEW_OK) {
		free(v);
		return rv;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), found_cmp);
	*out = v;
	*nout = n;
	return CACHEW_OK;
}

cachew_err
cwi_cache_usage(cwi_cache_root *r, const cachew_fingerprint *skip,
    uint64_t *bytes)
{
	found *v = NULL;
	size_t n = 0;
	cachew_err rv = enum_caches(r, &v, &n);

	*bytes = 0;
	for (size_t i = 0; i < n; i++)
		if (skip == NULL || v[i].fp.hi != skip->hi ||
		    v[i].fp.lo != skip->lo)
			*bytes += v[i].bytes;
	free(v);
	return rv;
}

/* ---- list --------------------------------------------------------------- */

/* A cache without a manifest: being written (its lock is held) or left
 * by a dead writer. */
static cwi_cache_state
probe_partial(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char *dir;
	int fd = -1;
	cachew_err rv;

	if (r->s3)
		return CWI_CACHE_PARTIAL;
	dir = cwi_cache_dir_path(r, fp);
	if (dir == NULL)
		return CWI_CACHE_PARTIAL;
	rv = cwi_cache_lock(dir, LOCK_EX, false, &fd);
	cwi_cache_unlock(fd);
	free(dir);
	return rv == CACHEW_EEXIST ? CWI_CACHE_WRITING : CWI_CACHE_PARTIAL;
}

static cachew_err
describe(cwi_cache_root *r, const found *f, cwi_cache_entry *e)
{
	char *path = NULL;
	cwi_buffer *b = NULL;
	cwi_cache_manifest *m = NULL;
	size_t len = 0;
	cachew_err rv;

	memset(e, 0, sizeof(*e));
	e->fp = f->fp;
	e->bytes = f->bytes;
	e->last_read_unix = cwi_cache_last_read(r, &f->fp);
	e->reason = cwi_cache_bad_reason(r, &f->fp);
	if (e->reason != NULL) {
		e->state = CWI_CACHE_BAD;
		return CACHEW_OK;
	}
	path = cwi_cache_file_path(r, &f->fp, CWI_CACHE_FILE_MANIFEST);
	if (path == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_cache_read_small(path, CWI_CACHE_MAX_MANIFEST_BYTES, &b, &len);
	if (rv == CACHEW_OK)
		rv = cwi_cache_manifest_decode(b->data, len, &m);
	if (rv == CACHEW_OK) {
		e->state = CWI_CACHE_COMPLETE;
		e->pipeline = m->pipeline;
		m->pipeline = NULL;
		e->elements = m->elements;
		e->created_unix = m->created_unix;
	} else if (rv == CACHEW_ENOENT) {
		e->state = probe_partial(r, &f->fp);
		rv = CACHEW_OK;
	} else if (rv == CACHEW_ECORRUPT) {
		/* Listing reports; a lookup marks. */
		e->state = CWI_CACHE_BAD;
		e->reason = cwi_strdup(cachew_errmsg());
		rv = CACHEW_OK;
	}
	cwi_cache_manifest_free(m);
	cwi_buffer_unref(b);
	free(path);
	return rv;
}

cachew_err
cwi_cache_list(cwi_cache_root *r, cwi_cache_entry **out, size_t *nout)
{
	found *f = NULL;
	cwi_cache_entry *v = NULL;
	size_t n = 0;
	cachew_err rv;

	*out = NULL;
	*nout = 0;
	rv = enum_caches(r, &f, &n);
	if (rv != CACHEW_OK)
		return rv;
	v = calloc(n + 1, sizeof(*v));
	if (v == NULL) {
		free(f);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		rv = describe(r, &f[i], &v[i]);
		if (rv != CACHEW_OK) {
			cwi_cache_entries_free(v, i + 1);
			free(f);
			return rv;
		}
	}
	free(f);
	*out = v;
	*nout = n;
	return CACHEW_OK;
}

/* ---- verify, remove, gc ------------------------------------------------- */

cachew_err
cwi_cache_verify(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	cwi_cache_manifest *m = NULL;
	cwi_chunk c = {0};
	cachew_err rv = cwi_cache_lookup(r, fp, &m);

	for (size_t i = 0; rv == CACHEW_OK && i < m->nchunks; i++) {
		cwi_cache_reader *rd = NULL;
		rv = cwi_cache_reader_open(&rd, r, m, i, true);
		while (rv == CACHEW_OK) {
			rv = cwi_cache_reader_next(rd, &c, 256);
			cwi_chunk_clear(&c);
		}
		if (rv == CACHEW_EOF)
			rv = CACHEW_OK;
		cwi_cache_reader_close(rd);
	}
	cwi_chunk_free(&c);
	cwi_cache_manifest_free(m);
	return rv;
}

/* Removes a cache whose lock can be had at once; CACHEW_EEXIST when it is
 * in use. */
static cachew_err
remove_unlocked(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char *dir = cwi_cache_dir_path(r, fp);
	int fd = -1;
	cachew_err rv;

	if (dir == NULL)
		return CACHEW_ENOMEM;
	if (!r->s3) {
		rv = cwi_cache_lock(dir, LOCK_EX, false, &fd);
		/* A directory without a lock file: nobody holds it. */
		if (rv == CACHEW_ENOENT && access(dir, F_OK) == 0)
			rv = cwi_cache_lock(dir, LOCK_EX, true, &fd);
		if (rv != CACHEW_OK) {
			free(dir);
			return rv;
		}
	}
	rv = cwi_cache_clear_dir(r, dir, false);
	cwi_cache_unlock(fd);
	free(dir);
	return rv;
}

cachew_err
cwi_cache_remove(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char hex[33];
	found *f = NULL;
	size_t n = 0;
	bool present = false;
	cachew_err rv;

	cachew_fingerprint_hex(fp, hex);
	rv = enum_caches(r, &f, &n);
	for (size_t i = 0; rv == CACHEW_OK && i < n; i++)
		present |= f[i].fp.hi == fp->hi && f[i].fp.lo == fp->lo;
	free(f);
	if (rv != CACHEW_OK)
		return rv;
	if (!present)
		return cwi_fail(CACHEW_ENOENT, "no cache %s in %s", hex, r->path);
	rv = remove_unlocked(r, fp);
	if (rv == CACHEW_EEXIST)
		return cwi_fail(CACHEW_EIO,
		    "cache %s/%s is being read or written: not removed", r->path,
		    hex);
	if (rv == CACHEW_ENOENT)
		return cwi_fail(CACHEW_ENOENT, "no cache %s in %s", hex, r->path);
	if (rv == CACHEW_OK)
		cwi_log(CACHEW_LOG_INFO, "cache", "removed %s/%s", r->path, hex);
	return rv;
}

typedef struct victim {
	cwi_cache_entry *e;
	int rank;     /* bad and partial first */
	int64_t when; /* last read, else created */
} victim;

static int
victim_cmp(const void *a, const void *b)
{
	const victim *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank - y->rank;
	if (x->when != y->when)
		return x->when < y->when ? -1 : 1;
	return found_cmp(&(found){.fp = x->e->fp}, &(found){.fp = y->e->fp});
}

cachew_err
cwi_cache_gc(cwi_cache_root *r, uint64_t max_bytes, uint64_t *freed_bytes)
{
	cwi_cache_entry *v = NULL;
	victim *order = NULL;
	uint64_t total = 0, freed = 0;
	size_t n = 0, nv = 0;
	cachew_err rv;

	if (freed_bytes != NULL)
		*freed_bytes = 0;
	rv = cwi_cache_list(r, &v, &n);
	if (rv != CACHEW_OK)
		return rv;
	order = calloc(n + 1, sizeof(*order));
	if (order == NULL) {
		cwi_cache_entries_free(v, n);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		total += v[i].bytes;
		/* S3 has no locks: a partial cache may be a live write. */
		if (v[i].state == CWI_CACHE_WRITING ||
		    (r->s3 && v[i].state == CWI_CACHE_PARTIAL))
			continue;
		order[nv].e = &v[i];
		order[nv].rank = v[i].state == CWI_CACHE_COMPLETE ? 1 : 0;
		order[nv].when = v[i].last_read_unix != 0 ? v[i].last_read_unix
							  : v[i].created_unix;
		nv++;
	}
	qsort(order, nv, sizeof(*order), victim_cmp);
	for (size_t i = 0; i < nv && total > max_bytes; i++) {
		cwi_cache_entry *e = order[i].e;
		char hex[33];
		rv = remove_unlocked(r, &e->fp);
		if (rv == CACHEW_EEXIST || rv == CACHEW_ENOENT) {
			rv = CACHEW_OK; /* in use, or already gone */
			continue;
		}
		if (rv != CACHEW_OK)
			break;
		cachew_fingerprint_hex(&e->fp, hex);
		cwi_log(CACHEW_LOG_INFO, "cache", "gc: evicted %s/%s (%s, %llu bytes)",
		    r->path, hex, cwi_cache_state_name(e->state),
		    (unsigned long long)e->bytes);
		total -= e->bytes;
		freed += e->bytes;
	}
	free(order);
	cwi_cache_entries_free(v, n);
	if (freed_bytes != NULL)
		*freed_bytes = freed;
	return rv;
}
