/*
 * io_open.c - the front of src/io: options from the environment, the
 * scheme dispatch of cwi_file_open, whole-file reads, and the listing that
 * expands s3:// and gs:// globs.
 */
#include "io.h"
#include "io_policy.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>

static int
env_int(const char *name, int def, int min, int max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (s == NULL || *s == '\0')
		return def;
	v = strtol(s, &end, 10);
	if (*end != '\0' || v < min || v > max)
		return def;
	return (int)v;
}

void
cwi_io_opts_default(cwi_io_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->max_retries = env_int("CACHEW_IO_RETRIES", 8, 0, 1000);
	o->backoff_ms = env_int("CACHEW_IO_BACKOFF_MS", 200, 0, 60000);
	o->connect_timeout_ms =
	    env_int("CACHEW_IO_CONNECT_TIMEOUT_MS", 10000, 1, 600000);
	o->low_speed_secs = env_int("CACHEW_IO_STALL_SECS", 30, 1, 3600);
	o->recv_buffer = 512 * 1024; /* CURL_MAX_READ_SIZE */
	o->s3_max_keys = 1000;
}

static bool
has_prefix(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

bool
cwi_io_is_remote(const char *path)
{
	return has_prefix(path, "http://") || has_prefix(path, "https://") ||
	    cwi_io_can_list(path);
}

bool
cwi_io_can_list(const char *path)
{
	return has_prefix(path, "s3://") || has_prefix(path, "gs://");
}

cachew_err
cwi_file_open_range(cwi_file **out, const char *path, uint64_t offset,
    uint64_t length, const cwi_io_opts *opts)
{
	cwi_http_req req = {0};
	cwi_io_opts defaults;
	cachew_err rv;

	if (opts == NULL) {
		cwi_io_opts_default(&defaults);
		opts = &defaults;
	}
	rv = cwi_io_check_read(path);
	if (rv != CACHEW_OK)
		return rv;
	if (has_prefix(path, "file://"))
		return cwi_local_open(out, path + 7, offset, length,
		    opts->regular_only);
	if (has_prefix(path, "http://") || has_prefix(path, "https://")) {
		req.url = cwi_strdup(path);
		if (req.url == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		req.pipeline_host = true;
		rv = CACHEW_OK;
	} else if (has_prefix(path, "s3://")) {
		rv = cwi_s3_request(path, opts, &req);
	} else if (has_prefix(path, "gs://")) {
		rv = cwi_gcs_request(path, &req);
	} else if (strstr(path, "://") != NULL) {
		return cwi_fail(CACHEW_ENOTSUP,
		    "%s: unsupported URL scheme (supported: file, http, https, "
		    "s3, gs)",
		    path);
	} else {
		return cwi_local_open(out, path, offset, length,
		    opts->regular_only);
	}
	if (rv != CACHEW_OK) {
		cwi_http_req_free(&req);
		return rv;
	}
	return cwi_http_open(out, path, &req, offset, length, opts);
}

cachew_err
cwi_file_open(cwi_file **out, const char *path, const cwi_io_opts *opts)
{
	return cwi_file_open_range(out, path, 0, UINT64_MAX, opts);
}

cachew_err
cwi_file_read(cwi_file *f, void *buf, size_t len, size_t *got)
{
	*got = 0;
	if (len == 0)
		return CACHEW_OK;
	return f->ops->read(f, buf, len, got);
}

int64_t
cwi_file_size(const cwi_file *f)
{
	return f->size;
}

const char *
cwi_file_path(const cwi_file *f)
{
	return f->path;
}

int
cwi_file_fd(const cwi_file *f)
{
	return f->fd;
}

void
cwi_file_close(cwi_file *f)
{
	if (f != NULL)
		f->ops->close(f);
}

cachew_err
cwi_file_read_all(const char *path, const cwi_io_opts *opts,
    cwi_buffer **out, size_t *len)
{
	return cwi_file_read_max(path, opts, SIZE_MAX, out, len);
}

/* A file of known size is read in one allocation of that size (a file that
 * grew since is read up to it); otherwise the buffer doubles to the end. */
cachew_err
cwi_file_read_max(const char *path, const cwi_io_opts *opts, size_t max,
    cwi_buffer **out, size_t *len)
{
	cwi_file *f = NULL;
	cwi_buffer *b = NULL;
	size_t total = 0;
	bool known;
	cachew_err rv;

	rv = cwi_file_open(&f, path, opts);
	if (rv != CACHEW_OK)
		return rv;
	/* procfs and sysfs report size 0 for files that have contents: read
	 * those like a stream of unknown length. */
	known = f->size > 0;
	if (known && (uint64_t)f->size > max) {
		rv = cwi_fail(CACHEW_ERANGE, "%s: %lld bytes, over the limit of "
		    "%zu", path, (long long)f->size, max);
		goto fail;
	}
	for (;;) {
		size_t got;
		if (!known && total > max) {
			rv = cwi_fail(CACHEW_ERANGE, "%s: more than %zu bytes, "
			    "over the limit", path, max);
			goto fail;
		}
		if (b == NULL || (total == b->size && !known)) {
			size_t cap = b == NULL ? (known ? (size_t)f->size : 65536)
					       : 2 * b->size;
			/* A stream reads at most one byte past the limit
			 * (total <= max here). */
			if (!known && cap > max && max < SIZE_MAX)
				cap = max + 1;
			cwi_buffer *nb;
			rv = cwi_buffer_alloc(&nb, cap, false);
			if (rv != CACHEW_OK) {
				rv = cwi_fail(rv, "%s: out of memory for %zu bytes",
				    path, cap);
				goto fail;
			}
			if (total > 0)
				memcpy(nb->data, b->data, total);
			cwi_buffer_unref(b);
			b = nb;
		}
		if (total == b->size)
			break;
		rv = cwi_file_read(f, b->data + total, b->size - total, &got);
		if (rv != CACHEW_OK)
			goto fail;
		if (got == 0)
			break;
		total += got;
	}
	cwi_file_close(f);
	*out = b;
	*len = total;
	return CACHEW_OK;
fail:
	cwi_buffer_unref(b);
	cwi_file_close(f);
	return rv;
}

/* ---- listing ---------------------------------------------------------------- */

void
cwi_io_entries_free(cwi_io_entry *v, size_t n)
{
	if (v == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		free(v[i].url);
		free(v[i].etag);
	}
	free(v);
}

bool
cwi_io_parse_size(const char *s, int64_t *size)
{
	int64_t n = 0;

	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9' || n > (INT64_MAX - (*s - '0')) / 10)
			return false;
		n = n * 10 + (*s - '0');
	}
	*size = n;
	return true;
}

cachew_err
cwi_io_entry_push(cwi_io_entry **v, size_t *n, size_t *cap, const char *url,
    int64_t size, const char *etag)
{
	cwi_io_entry *e;

	if (*n == *cap) {
		size_t ncap = *cap != 0 ? *cap * 2 : 64;
		cwi_io_entry *nv = realloc(*v, ncap * sizeof(**v));
		if (nv == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		*v = nv;
		*cap = ncap;
	}
	e = &(*v)[*n];
	e->url = cwi_strdup(url);
	e->etag = etag != NULL ? cwi_strdup(etag) : NULL;
	e->size = size;
	if (e->url == NULL || (etag != NULL && e->etag == NULL)) {
		free(e->url);
		free(e->etag);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	(*n)++;
	return CACHEW_OK;
}

cachew_err
cwi_io_split_bucket(
    const char *url, size_t scheme_len, char **bucket, char **key)
{
	const char *b = url + scheme_len;
	const char *slash = strchr(b, '/');
	size_t blen = slash != NULL ? (size_t)(slash - b) : strlen(b);

	*bucket = *key = NULL;
	if (blen == 0)
		return cwi_fail(CACHEW_EINVAL, "%s: no bucket name", url);
	/* Letters, digits, '.', '-' and '_' (S3's and GCS's names, legacy
	 * ones included): the name goes into a host name or a path, where
	 * ':', '#', '@' or '?' would send the request, signed with the
	 * process's credentials, to another host. */
	if (blen > 255 || strspn(b, "abcdefghijklmnopqrstuvwxyz"
				    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") <
			      blen)
		return cwi_fail(CACHEW_EINVAL, "%s: '%.*s' is not a bucket "
		    "name (letters, digits, '.', '-', '_')", url,
		    (int)(blen > 255 ? 255 : blen), b);
	*bucket = cwi_strndup(b, blen);
	*key = cwi_strdup(slash != NULL ? slash + 1 : "");
	if (*bucket == NULL || *key == NULL) {
		free(*bucket);
		free(*key);
		*bucket = *key = NULL;
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

cachew_err
cwi_io_token_check(const char *display, const char *prev, const char *next)
{
	if (prev != NULL && next != NULL && strcmp(prev, next) == 0)
		return cwi_fail(CACHEW_EPROTO, "%s: the listing gave the "
		    "same continuation token twice ('%.64s'): it would never "
		    "end", display, next);
	return CACHEW_OK;
}

void
cwi_io_urlencode(cwi_strbuf *sb, const char *s, bool keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";

	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		    (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
		    c == '~' || (keep_slash && c == '/')) {
			cwi_strbuf_append(sb, s, 1);
		} else {
			char e[3] = {'%', hex[c >> 4], hex[c & 15]};
			cwi_strbuf_append(sb, e, 3);
		}
	}
}

static int
entry_cmp(const void *a, const void *b)
{
	return strcmp(((const cwi_io_entry *)a)->url,
	    ((const cwi_io_entry *)b)->url);
}

cachew_err
cwi_io_list(const char *pattern, const cwi_io_opts *opts, cwi_io_entry **out,
    size_t *nout)
{
	bool s3 = has_prefix(pattern, "s3://");
	size_t scheme_len = 5; /* "s3://" or "gs://" */
	cwi_io_entry *v = NULL;
	size_t n = 0, cap = 0, keep = 0, key_at;
	char *bucket = NULL, *key = NULL, *prefix = NULL;
	cwi_io_opts defaults;
	cachew_err rv;

	*out = NULL;
	*nout = 0;
	if (!cwi_io_can_list(pattern))
		return cwi_fail(CACHEW_ENOTSUP,
		    "%s: only s3:// and gs:// URLs can be listed", pattern);
	if (opts == NULL) {
		cwi_io_opts_default(&defaults);
		opts = &defaults;
	}
	rv = cwi_io_check_glob(pattern);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_io_split_bucket(pattern, scheme_len, &bucket, &key);
	if (rv != CACHEW_OK)
		return rv;
	prefix = cwi_strndup(key, strcspn(key, "*?["));
	if (prefix == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	rv = s3 ? cwi_s3_list(bucket, prefix, opts, &v, &n, &cap)
		: cwi_gcs_list(bucket, prefix, opts, &v, &n, &cap);
	if (rv != CACHEW_OK)
		goto done;
	/* Keep the keys the pattern matches; '*' stays within a "directory"
	 * as in a local glob. */
	key_at = scheme_len + strlen(bucket) + 1;
	for (size_t i = 0; i < n; i++) {
		const char *k = strlen(v[i].url) >= key_at ? v[i].url + key_at : "";
		if (fnmatch(key, k, FNM_PATHNAME) == 0) {
			cwi_io_entry t = v[keep];
			v[keep++] = v[i];
			v[i] = t;
		}
	}
	for (size_t i = keep; i < n; i++) {
		free(v[i].url);
		free(v[i].etag);
	}
	n = keep;
	/* A confined process reads only what the pattern's own prefix
	 * allows; a key with a dot segment would lead out of it. */
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++)
		rv = cwi_io_check_read(v[i].url);
	if (rv != CACHEW_OK)
		goto done;
	if (n > 1)
		qsort(v, n, sizeof(*v), entry_cmp);
	*out = v;
	*nout = n;
	v = NULL;
done:
	cwi_io_entries_free(v, n);
	free(bucket);
	free(key);
	free(prefix);
	return rv;
}
