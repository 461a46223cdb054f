/*
 * cache_store.c - cache roots, the files of a cache directory, locks,
 * lookups and bad markers (docs/cache-format.md, "Directory layout",
 * "Locks" and "Bad caches").
 *
 * Local roots (a local disk or a shared file system mounted everywhere)
 * use flock(2) on <cache>/.lock: a writer holds it exclusively for its
 * whole life, a reader shared while a chunk is open, and a remover tries
 * it exclusively without waiting and skips the cache when it cannot have
 * it. S3 roots have no locks (docs/cache-format.md says what that means).
 * No lock of this file is held across a call into other code.
 */
#include "cache_int.h"

#include "../io/io_policy.h"
#include "../io/io_put.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- small utilities ---------------------------------------------------- */

uint64_t
cwi_cache_random64(void)
{
	uint64_t x;

	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) == (ssize_t)sizeof(x))
		return x;
	return cwi_mix64(cwi_now_ns() ^ ((uint64_t)getpid() << 32) ^
	    (uint64_t)time(NULL));
}

cachew_err
cwi_cache_fp_parse(const char *hex, cachew_fingerprint *out)
{
	uint64_t part[2] = {0, 0};

	if (hex == NULL || strlen(hex) != 32)
		return cwi_fail(CACHEW_EINVAL,
		    "'%.64s' is not a fingerprint (32 hex digits)",
		    hex != NULL ? hex : "(null)");
	for (unsigned i = 0; i < 32; i++) {
		char c = hex[i];
		unsigned v;
		if (c >= '0' && c <= '9')
			v = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v = (unsigned)(c - 'A' + 10);
		else
			return cwi_fail(CACHEW_EINVAL,
			    "'%s' is not a fingerprint (32 hex digits)", hex);
		part[i / 16] = part[i / 16] << 4 | v;
	}
	out->hi = part[0];
	out->lo = part[1];
	return CACHEW_OK;
}

static cachew_err
errno_err(int err)
{
	switch (err) {
	case ENOENT:
	case ENOTDIR:
		return CACHEW_ENOENT;
	case ENOMEM:
		return CACHEW_ENOMEM;
	default:
		return CACHEW_EIO;
	}
}

cachew_err
cwi_cache_mkdirs(const char *dir)
{
	char *p = cwi_strdup(dir);
	cachew_err rv = CACHEW_OK;

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, 0755) != 0 && errno != EEXIST) {
			rv = cwi_fail(errno_err(errno), "%s: cannot create "
						      "directory: %s",
			    p, strerror(errno));
			break;
		}
		*s = c;
		if (c == '\0')
			break;
	}
	free(p);
	return rv;
}

cachew_err
cwi_cache_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return cwi_fail(errno_err(errno), "%s: %s", dir, strerror(errno));
	if (fsync(fd) != 0 && errno != EINVAL) {
		int e = errno;
		close(fd);
		return cwi_fail(CACHEW_EIO, "%s: fsync of the directory failed: %s",
		    dir, strerror(e));
	}
	close(fd);
	return CACHEW_OK;
}

/* ---- roots and paths ---------------------------------------------------- */

/* A root's path as given, checked and without trailing '/'; nothing is
 * created. */
static cachew_err
root_parse(cwi_cache_root **out, const char *root, uint64_t capacity_bytes)
{
	cwi_cache_root *r;
	size_t len;

	*out = NULL;
	if (root == NULL || *root == '\0')
		return cwi_fail(CACHEW_EINVAL, "cache root: no path given");
	if (strncmp(root, "file://", 7) == 0)
		root += 7;
	if (cwi_io_is_remote(root) && strncmp(root, "s3://", 5) != 0)
		return cwi_fail(CACHEW_ENOTSUP,
		    "cache root %s: only local directories and s3://bucket/"
		    "prefix are supported",
		    root);
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	len = strlen(root);
	while (len > 1 && root[len - 1] == '/')
		len--;
	r->path = cwi_strndup(root, len);
	r->s3 = strncmp(root, "s3://", 5) == 0;
	r->capacity = capacity_bytes;
	if (r->path == NULL) {
		free(r);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if (r->s3 && (len <= 5 || strchr(r->path + 5, '/') == r->path + 5)) {
		cwi_cache_root_close(r);
		return cwi_fail(CACHEW_EINVAL, "cache root %s: no bucket", root);
	}
	*out = r;
	return CACHEW_OK;
}

cachew_err
cwi_cache_root_open(
    cwi_cache_root **out, const char *root, uint64_t capacity_bytes)
{
	cwi_cache_root *r;
	cachew_err rv = root_parse(&r, root, capacity_bytes);

	if (rv != CACHEW_OK)
		return rv;
	/* A root a confined worker only reads (cache_get under an
	 * --allow-read directory) is not created. */
	if (!r->s3 && cwi_io_may_write(r->path)) {
		rv = cwi_cache_mkdirs(r->path);
		if (rv != CACHEW_OK) {
			cwi_cache_root_close(r);
			return rv;
		}
	}
	*out = r;
	return CACHEW_OK;
}

void
cwi_cache_root_close(cwi_cache_root *r)
{
	if (r == NULL)
		return;
	free(r->path);
	free(r);
}

const char *
cwi_cache_root_path(const cwi_cache_root *r)
{
	return r->path;
}

char *
cwi_cache_dir_path(const cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char hex[33];
	char *p;

	cachew_fingerprint_hex(fp, hex);
	p = cwi_asprintf("%s/%s", r->path, hex);
	if (p == NULL)
		cwi_fail(CACHEW_ENOMEM, "out of memory");
	return p;
}

char *
cwi_cache_file_path(const cwi_cache_root *r, const cachew_fingerprint *fp,
    const char *name)
{
	char hex[33];
	char *p;

	cachew_fingerprint_hex(fp, hex);
	p = cwi_asprintf("%s/%s/%s", r->path, hex, name);
	if (p == NULL)
		cwi_fail(CACHEW_ENOMEM, "out of memory");
	return p;
}

/* ---- whole small files -------------------------------------------------- */

void
cwi_cache_io_opts(cwi_io_opts *o)
{
	cwi_io_opts_default(o);
	o->regular_only = true;
}

static cachew_err
read_small_opts(const char *path, size_t limit, const cwi_io_opts *io,
    cwi_buffer **out, size_t *len)
{
	cwi_file *f = NULL;
	cwi_buffer *b = NULL;
	size_t total = 0, got;
	int64_t size;
	cachew_err rv;

	rv = cwi_file_open(&f, path, io);
	if (rv != CACHEW_OK)
		return rv;
	size = cwi_file_size(f);
	if (size > (int64_t)limit) {
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: %lld bytes is over the limit of %zu", path,
		    (long long)size, limit);
		goto done;
	}
	/* One byte more than the limit tells an oversized stream of
	 * unknown size. */
	rv = cwi_buffer_alloc(&b, size >= 0 ? (size_t)size + 1 : limit + 1,
	    false);
	if (rv != CACHEW_OK)
		goto done;
	do {
		rv = cwi_file_read(f, b->data + total, b->size - total, &got);
		total += got;
	} while (rv == CACHEW_OK && got > 0 && total < b->size);
	if (rv == CACHEW_OK && total > limit)
		rv = cwi_fail(CACHEW_ECORRUPT, "%s: over the limit of %zu bytes",
		    path, limit);
	if (rv == CACHEW_OK && size >= 0 && total != (size_t)size)
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: changed size while it was read", path);
done:
	cwi_file_close(f);
	if (rv != CACHEW_OK) {
		cwi_buffer_unref(b);
		return rv;
	}
	b->size = total;
	*out = b;
	*len = total;
	return CACHEW_OK;
}

cachew_err
cwi_cache_read_small(const char *path, size_t limit, cwi_buffer **out,
    size_t *len)
{
	cwi_io_opts io;

	cwi_cache_io_opts(&io);
	return read_small_opts(path, limit, &io, out, len);
}

static cachew_err
write_all(int fd, const char *path, const void *data, size_t len)
{
	const uint8_t *p = data;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return cwi_fail(errno_err(errno), "%s: write failed: %s",
			    path, strerror(errno));
		p += n;
		len -= (size_t)n;
	}
	return CACHEW_OK;
}

cachew_err
cwi_cache_put_file(const cwi_cache_root *r, const char *dir,
    const char *name, const void *data, size_t len, bool durable)
{
	char *tmp = NULL, *path = NULL;
	int fd = -1;
	cachew_err rv;

	path = cwi_asprintf("%s/%s", dir, name);
	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (r->s3) {
		rv = cwi_io_put(path, data, len, NULL);
		free(path);
		return rv;
	}
	tmp = cwi_asprintf("%s/" CWI_CACHE_TMP_PREFIX "%s-%ld-%016llx", dir,
	    name, (long)getpid(), (unsigned long long)cwi_cache_random64());
	if (tmp == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rv = cwi_fail(errno_err(errno), "%s: cannot create: %s", tmp,
		    strerror(errno));
		goto done;
	}
	rv = write_all(fd, tmp, data, len);
	if (rv == CACHEW_OK && durable && fsync(fd) != 0)
		rv = cwi_fail(CACHEW_EIO, "%s: fsync failed: %s", tmp,
		    strerror(errno));
	if (close(fd) != 0 && rv == CACHEW_OK)
		rv = cwi_fail(CACHEW_EIO, "%s: close failed: %s", tmp,
		    strerror(errno));
	fd = -1;
	if (rv == CACHEW_OK && rename(tmp, path) != 0)
		rv = cwi_fail(errno_err(errno), "%s: rename to %s failed: %s",
		    tmp, name, strerror(errno));
	if (rv == CACHEW_OK && durable)
		rv = cwi_cache_fsync_dir(dir);
done:
	if (rv != CACHEW_OK && tmp != NULL)
		(void)unlink(tmp);
	free(tmp);
	free(path);
	return rv;
}

cachew_err
cwi_cache_unlink(const cwi_cache_root *r, const char *path)
{
	if (r->s3)
		return cwi_io_delete(path, NULL);
	if (unlink(path) != 0 && errno != ENOENT)
		return cwi_fail(errno_err(errno), "%s: cannot remove: %s", path,
		    strerror(errno));
	return CACHEW_OK;
}

/* ---- locks -------------------------------------------------------------- */

cachew_err
cwi_cache_lock(const char *dir, int op, bool create, int *out)
{
	char *path = cwi_asprintf("%s/" CWI_CACHE_FILE_LOCK, dir);
	cachew_err rv = CACHEW_OK;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	*out = -1;
	/* A remover unlinks the lock file while holding it; whoever opened
	 * the old file meanwhile finds it unlinked after locking and tries
	 * the new one. A few rounds settle any race. */
	for (int round = 0; round < 16; round++) {
		struct stat a, b;
		int fd = open(path,
		    O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
		if (fd < 0 && op == LOCK_SH && (errno == EROFS || errno == EACCES)) {
			fd = open(path, O_RDONLY | O_CLOEXEC);
			/* A read-only store without a lock file (ENOENT: the
			 * open that could not create it said EROFS), or with
			 * one this process cannot open: nobody can write or
			 * remove what this process reads. */
			if (fd < 0 && (errno == ENOENT || errno == EROFS ||
					  errno == EACCES))
				goto done;
		}
		if (fd < 0) {
			rv = cwi_fail(errno_err(errno), "%s: %s", path,
			    strerror(errno));
			goto done;
		}
		if (flock(fd, op | LOCK_NB) != 0) {
			int e = errno;
			close(fd);
			if (e == EWOULDBLOCK)
				rv = cwi_fail(CACHEW_EEXIST,
				    "%s: the cache is in use by another writer, "
				    "reader or remover",
				    dir);
			else
				rv = cwi_fail(CACHEW_EIO, "%s: flock failed: %s",
				    path, strerror(e));
			goto done;
		}
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
		    a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
			*out = fd;
			goto done;
		}
		close(fd);
	}
	rv = cwi_fail(CACHEW_EIO, "%s: the lock file keeps being replaced",
	    path);
done:
	free(path);
	return rv;
}

void
cwi_cache_unlock(int fd)
{
	if (fd >= 0)
		close(fd);
}

/* ---- directory contents ------------------------------------------------- */

cachew_err
cwi_cache_list_dir(const cwi_cache_root *r, const char *dir, char ***names,
    uint64_t **sizes, size_t *n)
{
	size_t cap = 0;
	cachew_err rv = CACHEW_OK;

	*names = NULL;
	*sizes = NULL;
	*n = 0;
	if (r->s3) {
		cwi_io_entry *v = NULL;
		size_t nv = 0;
		char *pat = cwi_asprintf("%s/*", dir);
		if (pat == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		rv = cwi_io_list(pat, NULL, &v, &nv);
		free(pat);
		if (rv != CACHEW_OK)
			return rv;
		*names = calloc(nv + 1, sizeof(char *));
		*sizes = calloc(nv + 1, sizeof(uint64_t));
		if (*names == NULL || *sizes == NULL) {
			cwi_io_entries_free(v, nv);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		for (size_t i = 0; i < nv; i++) {
			(*names)[i] = v[i].url;
			(*sizes)[i] = v[i].size > 0 ? (uint64_t)v[i].size : 0;
			v[i].url = NULL;
		}
		*n = nv;
		cwi_io_entries_free(v, nv);
		return CACHEW_OK;
	}
	DIR *d = opendir(dir);
	struct dirent *de;
	if (d == NULL)
		return cwi_fail(errno_err(errno), "%s: %s", dir, strerror(errno));
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		char *p;
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		p = cwi_asprintf("%s/%s", dir, de->d_name);
		if (p == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			break;
		}
		if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
			free(p);
			continue;
		}
		if (*n == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			char **nn = realloc(*names, ncap * sizeof(char *));
			uint64_t *ns = nn != NULL
			    ? realloc(*sizes, ncap * sizeof(uint64_t))
			    : NULL;
			if (nn != NULL)
				*names = nn;
			if (ns == NULL) {
				free(p);
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				break;
			}
			*sizes = ns;
			cap = ncap;
		}
		(*names)[*n] = p;
		(*sizes)[*n] = (uint64_t)st.st_size;
		(*n)++;
	}
	closedir(d);
	return rv;
}

void
cwi_cache_names_free(char **names, uint64_t *sizes, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(sizes);
}

static bool
is_named(const char *path, const char *name)
{
	const char *base = strrchr(path, '/');
	return strcmp(base != NULL ? base + 1 : path, name) == 0;
}

cachew_err
cwi_cache_clear_dir(const cwi_cache_root *r, const char *dir, bool keep_lock)
{
	char **names = NULL, *manifest;
	uint64_t *sizes = NULL;
	size_t n = 0;
	cachew_err rv;

	manifest = cwi_asprintf("%s/" CWI_CACHE_FILE_MANIFEST, dir);
	if (manifest == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_cache_unlink(r, manifest);
	free(manifest);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_cache_list_dir(r, dir, &names, &sizes, &n);
	if (rv == CACHEW_ENOENT)
		return CACHEW_OK;
	for (size_t i = 0; rv == CACHEW_OK && i < n; i++) {
		if (is_named(names[i], CWI_CACHE_FILE_LOCK))
			continue;
		rv = cwi_cache_unlink(r, names[i]);
	}
	cwi_cache_names_free(names, sizes, n);
	if (rv != CACHEW_OK || keep_lock || r->s3)
		return rv;
	/* The lock file goes last, while still held, then the directory (a
	 * writer that just created a new lock file keeps it: ENOTEMPTY). */
	char *lock = cwi_asprintf("%s/" CWI_CACHE_FILE_LOCK, dir);
	if (lock == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_cache_unlink(r, lock);
	free(lock);
	if (rv == CACHEW_OK && rmdir(dir) != 0 && errno != ENOENT &&
	    errno != ENOTEMPTY && errno != EEXIST)
		rv = cwi_fail(CACHEW_EIO, "%s: cannot remove: %s", dir,
		    strerror(errno));
	return rv;
}

cachew_err
cwi_cache_dir_bytes(const cwi_cache_root *r, const char *dir, uint64_t *bytes)
{
	char **names = NULL;
	uint64_t *sizes = NULL;
	size_t n = 0;
	cachew_err rv = cwi_cache_list_dir(r, dir, &names, &sizes, &n);

	*bytes = 0;
	for (size_t i = 0; i < n; i++)
		*bytes += sizes[i];
	cwi_cache_names_free(names, sizes, n);
	return rv;
}

/* ---- lookup and bad markers ---------------------------------------------- */

cachew_err
cwi_cache_mark_bad(cwi_cache_root *r, const cachew_fingerprint *fp,
    const char *reason)
{
	char *dir = cwi_cache_dir_path(r, fp);
	size_t len = strlen(reason);
	cachew_err rv;

	if (dir == NULL)
		return CACHEW_ENOMEM;
	if (len > CWI_CACHE_MAX_REASON)
		len = CWI_CACHE_MAX_REASON;
	cwi_log(CACHEW_LOG_WARN, "cache", "%s: marked bad: %.*s", dir,
	    (int)len, reason);
	/* Not fsynced: a marker lost in a crash costs one more detection of
	 * the same damage, never a bad read. */
	rv = cwi_cache_put_file(r, dir, CWI_CACHE_FILE_BAD, reason, len, false);
	free(dir);
	return rv;
}

char *
cwi_cache_bad_reason(const cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char *path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_BAD), *s = NULL;
	cwi_buffer *b = NULL;
	size_t len = 0;
	cachew_err rv;

	if (path == NULL)
		return NULL;
	if (!r->s3 && access(path, F_OK) != 0) {
		free(path);
		return NULL;
	}
	rv = cwi_cache_read_small(path, CWI_CACHE_MAX_REASON, &b, &len);
	if (rv == CACHEW_OK)
		s = cwi_strndup((const char *)b->data, len);
	else if (rv != CACHEW_ENOENT)
		s = cwi_strdup("unreadable BAD marker");
	cwi_buffer_unref(b);
	free(path);
	return s;
}

cachew_err
cwi_cache_lookup(cwi_cache_root *r, const cachew_fingerprint *fp,
    cwi_cache_manifest **out)
{
	char *path = NULL, *reason = NULL, hex[33];
	cwi_cache_manifest *m = NULL;
	cwi_buffer *b = NULL;
	size_t len = 0;
	cachew_err rv;

	*out = NULL;
	cachew_fingerprint_hex(fp, hex);
	reason = cwi_cache_bad_reason(r, fp);
	if (reason != NULL) {
		cwi_log(CACHEW_LOG_INFO, "cache",
		    "%s/%s is marked bad and is not used: %s", r->path, hex,
		    reason);
		rv = cwi_fail(CACHEW_ENOENT, "%s/%s: the cache is marked bad: %s",
		    r->path, hex, reason);
		free(reason);
		return rv;
	}
	path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_MANIFEST);
	if (path == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_cache_read_small(path, CWI_CACHE_MAX_MANIFEST_BYTES, &b, &len);
	if (rv == CACHEW_ENOENT) {
		rv = cwi_fail(CACHEW_ENOENT, "no cache of %s in %s", hex,
		    r->path);
		goto done;
	}
	if (rv == CACHEW_OK)
		rv = cwi_cache_manifest_decode(b->data, len, &m);
	if (rv == CACHEW_OK && (m->fp.hi != fp->hi || m->fp.lo != fp->lo))
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "the manifest is that of another fingerprint");
	if (rv == CACHEW_ECORRUPT) {
		reason = cwi_asprintf("%s: %s", path, cachew_errmsg());
		if (reason != NULL)
			(void)cwi_cache_mark_bad(r, fp, reason);
		rv = cwi_fail(CACHEW_ECORRUPT, "%s",
		    reason != NULL ? reason : "manifest is corrupt");
		free(reason);
	}
	if (rv != CACHEW_OK) {
		cwi_cache_manifest_free(m);
		goto done;
	}
	*out = m;
done:
	cwi_buffer_unref(b);
	free(path);
	return rv;
}

/* The reads of a build: one attempt, short timeouts (cache.h). */
static void
peek_io_opts(cwi_io_opts *o)
{
	cwi_cache_io_opts(o);
	o->max_retries = 0;
	if (o->connect_timeout_ms > CWI_CACHE_PEEK_CONNECT_MS)
		o->connect_timeout_ms = CWI_CACHE_PEEK_CONNECT_MS;
	if (o->low_speed_secs > CWI_CACHE_PEEK_STALL_SECS)
		o->low_speed_secs = CWI_CACHE_PEEK_STALL_SECS;
}

cachew_err
cwi_cache_peek(const char *root, const cachew_fingerprint *fp,
    cwi_cache_manifest **out)
{
	cwi_cache_root *r = NULL;
	cwi_cache_manifest *m = NULL;
	cwi_buffer *b = NULL;
	char *path = NULL, *bad = NULL;
	cwi_io_opts io;
	size_t len = 0;
	cachew_err rv;

	*out = NULL;
	peek_io_opts(&io);
	/* A confined worker (io_policy.h) builds only what it may read. */
	rv = cwi_io_check_read(root);
	if (rv == CACHEW_OK)
		rv = root_parse(&r, root, 0);
	if (rv != CACHEW_OK)
		return rv;
	path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_MANIFEST);
	bad = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_BAD);
	if (path == NULL || bad == NULL) {
		rv = CACHEW_ENOMEM;
		goto done;
	}
	rv = read_small_opts(path, CWI_CACHE_MAX_MANIFEST_BYTES, &io, &b, &len);
	if (rv == CACHEW_OK)
		rv = cwi_cache_manifest_decode(b->data, len, &m);
	if (rv == CACHEW_OK && (m->fp.hi != fp->hi || m->fp.lo != fp->lo))
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: the manifest is that of another fingerprint", path);
	cwi_buffer_unref(b);
	b = NULL;
	/* A cache marked bad is not one (cwi_cache_lookup); a marker that
	 * cannot be read counts as one. */
	if (rv == CACHEW_OK &&
	    (r->s3 || access(bad, F_OK) == 0 || errno != ENOENT)) {
		cachew_err brv = read_small_opts(bad, CWI_CACHE_MAX_REASON,
		    &io, &b, &len);
		if (brv != CACHEW_ENOENT)
			rv = cwi_fail(CACHEW_ENOENT, "%s: the cache is marked bad",
			    bad);
		cwi_buffer_unref(b);
	}
	if (rv == CACHEW_OK)
		*out = m;
	else
		cwi_cache_manifest_free(m);
done:
	free(bad);
	free(path);
	cwi_cache_root_close(r);
	return rv;
}

/* ---- last read ---------------------------------------------------------- */

void
cwi_cache_touch_last_read(const cwi_cache_root *r,
    const cachew_fingerprint *fp)
{
	char *path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_LAST_READ), *dir;
	time_t now = time(NULL);
	struct stat st;
	int fd;

	if (path == NULL)
		return;
	if (r->s3) {
		/* No mtime to set: the object holds the time. */
		char body[32];
		int n = snprintf(body, sizeof(body), "%lld\n", (long long)now);
		int64_t last = cwi_cache_last_read(r, fp);
		dir = cwi_cache_dir_path(r, fp);
		if (dir != NULL && now - last >= CWI_CACHE_LAST_READ_PERIOD)
			(void)cwi_cache_put_file(r, dir, CWI_CACHE_FILE_LAST_READ, body,
			    (size_t)n, false);
		free(dir);
		free(path);
		return;
	}
	if (stat(path, &st) == 0 &&
	    now - st.st_mtime < CWI_CACHE_LAST_READ_PERIOD &&
	    st.st_mtime <= now) {
		free(path);
		return;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		(void)futimens(fd, NULL);
		close(fd);
	}
	free(path);
}

int64_t
cwi_cache_last_read(const cwi_cache_root *r, const cachew_fingerprint *fp)
{
	char *path = cwi_cache_file_path(r, fp, CWI_CACHE_FILE_LAST_READ);
	int64_t t = 0;

	if (path == NULL)
		return 0;
	if (r->s3) {
		cwi_buffer *b = NULL;
		size_t len = 0;
		if (cwi_cache_read_small(path, 31, &b, &len) == CACHEW_OK) {
			char s[32];
			memcpy(s, b->data, len);
			s[len] = '\0';
			t = strtoll(s, NULL, 10);
		}
		cwi_buffer_unref(b);
	} else {
		struct stat st;
		if (stat(path, &st) == 0)
			t = (int64_t)st.st_mtime;
	}
	free(path);
	return t;
}
