/*
 * io.h - the file abstraction every file source reads through: local paths
 * (and file:// URLs), http://, https://, s3://bucket/key and gs://bucket/
 * object, behind one sequential reader with optional byte ranges, plus the
 * listing that expands remote globs. docs/remote.md describes the
 * behaviour users see (environment, retries, errors).
 *
 * Errors: every fallible call returns a cachew_err and records the detail
 * with cwi_fail() (this thread's cachew_errmsg()), naming the path or URL
 * the user gave, and for remote failures the HTTP status and curl's error
 * text. Mapping: a missing file or object (ENOENT, HTTP 404) is
 * CACHEW_ENOENT; bad URLs, missing credentials CACHEW_EINVAL; an object
 * that changed while it was read (a resume found another ETag or size)
 * CACHEW_ECORRUPT; everything else CACHEW_EIO (CACHEW_ETIMEDOUT when the
 * last attempt timed out).
 */
#ifndef CWI_IO_H
#define CWI_IO_H

#include "../core/core.h"

/* Options of remote reads. cwi_io_opts_default() fills them from the
 * environment (docs/remote.md); NULL wherever opts are taken means those
 * defaults. */
typedef struct cwi_io_opts {
	int max_retries;      /* attempts after the first without progress */
	int backoff_ms;       /* first retry delay; doubles, capped, jittered */
	int connect_timeout_ms;
	int low_speed_secs;   /* abort an attempt stalled this long (retried) */
	long recv_buffer;     /* CURLOPT_BUFFERSIZE */
	int s3_max_keys;      /* ListObjectsV2 page size (1..1000) */
	/* Local paths: only a regular file opens; a FIFO, a device or a
	 * socket named like one fails (CACHEW_EINVAL) and never blocks the
	 * open. For what must be a file: cache chunks, read_file. */
	bool regular_only;
	/* Test hooks: a fixed x-amz-date ("20130524T000000Z") so that a
	 * signature can be compared with AWS's documented examples, and a
	 * curl CONNECT_TO entry ("host:port:127.0.0.1:port") that routes a
	 * virtual host to a loopback server. NULL in normal use. */
	const char *amz_date;
	const char *connect_to;
} cwi_io_opts;

void cwi_io_opts_default(cwi_io_opts *opts);

/* True for the URLs served by the remote backends (http, https, s3, gs). */
bool cwi_io_is_remote(const char *path);
/* True for the remote URLs whose patterns can be listed (s3://, gs://). */
bool cwi_io_can_list(const char *path);

/*
 * A file open for sequential reading. One thread at a time; a file may move
 * between threads between calls. Remote files hold one HTTP transfer at a
 * time and never buffer more than one network read beyond what the caller
 * asked for.
 */
typedef struct cwi_file cwi_file;

/* Opens `path` (a local path, file://, http(s)://, s3:// or gs:// URL) for
 * reading from its start. A remote open sends the request and waits for
 * the response headers, so a missing object fails here (CACHEW_ENOENT). */
cachew_err cwi_file_open(
    cwi_file **out, const char *path, const cwi_io_opts *opts);
/* Opens bytes [offset, offset + length) of `path`; length UINT64_MAX
 * means to the end. A range past the end reads as empty. */
cachew_err cwi_file_open_range(cwi_file **out, const char *path,
    uint64_t offset, uint64_t length, const cwi_io_opts *opts);
/* Reads up to len bytes into buf, filling it unless the end comes first.
 * *got == 0 with CACHEW_OK is the end of the file (or range). Remote reads
 * retry and resume by themselves; an error is final. */
cachew_err cwi_file_read(cwi_file *f, void *buf, size_t len, size_t *got);
/* The size of the whole file or object in bytes, or -1 when the server did
 * not say (chunked responses). */
int64_t cwi_file_size(const cwi_file *f);
/* The path or URL as given to open; borrowed from f. */
const char *cwi_file_path(const cwi_file *f);
/* Closes f; NULL is a no-op. A remote file's connection is kept by the
 * calling thread for the next open to the same host. */
void cwi_file_close(cwi_file *f);

/* Reads the whole of `path` into *out (a new buffer of *len bytes). */
cachew_err cwi_file_read_all(const char *path, const cwi_io_opts *opts,
    cwi_buffer **out, size_t *len);
/* The same, for a file of at most max bytes: a larger one is
 * CACHEW_ERANGE, found before anything is allocated when its size is
 * known, else after max + 1 bytes. */
cachew_err cwi_file_read_max(const char *path, const cwi_io_opts *opts,
    size_t max, cwi_buffer **out, size_t *len);

/* An object found by a listing. */
typedef struct cwi_io_entry {
	char *url;    /* "s3://bucket/key" */
	int64_t size; /* bytes, -1 if unknown */
	char *etag;   /* the store's version tag (may be NULL) */
} cwi_io_entry;

/* Lists the objects matching `pattern` ("s3://bucket/dir/train-*",
 * "gs://bucket/a?.txt"): the prefix before the first glob character is
 * listed page by page and the keys are matched with fnmatch(3), '*' not
 * crossing '/'. A pattern without glob characters lists that one object if
 * it exists. Results come sorted by URL. An empty match is CACHEW_OK with
 * *n == 0. Free with cwi_io_entries_free. */
cachew_err cwi_io_list(const char *pattern, const cwi_io_opts *opts,
    cwi_io_entry **out, size_t *n);
void cwi_io_entries_free(cwi_io_entry *v, size_t n);

/* ---- between the backends (io_open.c, io_local.c, io_http.c, io_s3.c,
 * io_gcs.c) ------------------------------------------------------------- */

/* A backend's operations (local files, HTTP transfers). */
typedef struct cwi_file_ops {
	cachew_err (*read)(cwi_file *f, void *buf, size_t len, size_t *got);
	void (*close)(cwi_file *f);
} cwi_file_ops;

/* The common head of every backend's file object. */
struct cwi_file {
	const cwi_file_ops *ops;
	char *path;   /* as given to open */
	int64_t size; /* whole object, -1 unknown */
	int fd;       /* local files: the descriptor; else -1 */
};

/* Opens a local path (no scheme) for [offset, offset + length);
 * regular_only as in cwi_io_opts. */
cachew_err cwi_local_open(cwi_file **out, const char *path, uint64_t offset,
    uint64_t length, bool regular_only);
/* The descriptor of a local file, -1 for remote ones. */
int cwi_file_fd(const cwi_file *f);

struct curl_slist;

/* One remote object as an HTTP request: what the scheme backends produce
 * and the HTTP engine streams. */
typedef struct cwi_http_req {
	char *url;                  /* the http(s) URL to GET */
	struct curl_slist *headers; /* fixed extra headers (auth, sha256) */
	char *sigv4;                /* "aws:amz:REGION:s3", or NULL */
	char *user, *secret;        /* SigV4 credentials */
	/* The host comes from the pipeline (an http(s) URL), not from the
	 * operator's endpoint (S3, GCS): a confined process checks every
	 * address it connects to and every redirect (io_policy.h). */
	bool pipeline_host;
} cwi_http_req;

void cwi_http_req_free(cwi_http_req *req);
/* Opens a transfer of req (taken over, also on failure) for bytes
 * [offset, offset + length) of the object; `display` names it in errors. */
cachew_err cwi_http_open(cwi_file **out, const char *display,
    cwi_http_req *req, uint64_t offset, uint64_t length,
    const cwi_io_opts *opts);
/* GETs a small response (a listing page) of at most `limit` bytes into a
 * NUL-terminated heap string; with the same retries. */
cachew_err cwi_http_get_small(const char *display, cwi_http_req *req,
    size_t limit, const cwi_io_opts *opts, char **body, size_t *len);

cachew_err cwi_s3_request(const char *url, const cwi_io_opts *opts,
    cwi_http_req *req);
cachew_err cwi_s3_list(const char *bucket, const char *prefix,
    const cwi_io_opts *opts, cwi_io_entry **v, size_t *n, size_t *cap);
cachew_err cwi_gcs_request(const char *url, cwi_http_req *req);
cachew_err cwi_gcs_list(const char *bucket, const char *prefix,
    const cwi_io_opts *opts, cwi_io_entry **v, size_t *n, size_t *cap);
/* One listing page of len bytes (outside input, NUL not required): its
 * objects are appended to *v as s3:// or gs:// URLs in `bucket`, and
 * *token is set to the next page's token (heap), or NULL on the last
 * page. A malformed page fails with CACHEW_EPROTO naming the element or
 * field (`display` names the listing); entries appended before the
 * failure stay in *v for the caller to free. */
cachew_err cwi_s3_parse_page(const char *display, const char *bucket,
    const char *xml, size_t len, cwi_io_entry **v, size_t *n, size_t *cap,
    char **token);
cachew_err cwi_gcs_parse_page(const char *display, const char *bucket,
    const char *body, size_t len, cwi_io_entry **v, size_t *n, size_t *cap,
    char **token);

/* Helpers shared by the backends (io_open.c). */
/* Splits "s3://bucket/key" after its scheme into heap bucket and key. */
cachew_err cwi_io_split_bucket(
    const char *url, size_t scheme_len, char **bucket, char **key);
/* Appends s percent-encoded (RFC 3986 unreserved kept; '/' kept when
 * keep_slash) to sb. */
void cwi_io_urlencode(cwi_strbuf *sb, const char *s, bool keep_slash);
/* A listing page's token for the next page (next) against the token that
 * asked for this page (prev, NULL for the first): CACHEW_EPROTO naming
 * the listing when it is the same one, a store that would be asked for
 * the same page forever. */
cachew_err cwi_io_token_check(
    const char *display, const char *prev, const char *next);
/* An object size as a listing writes it: decimal digits only, at most
 * INT64_MAX; false for anything else (empty, a sign, spaces). */
bool cwi_io_parse_size(const char *s, int64_t *size);
/* Appends an entry (copies url and etag). */
cachew_err cwi_io_entry_push(cwi_io_entry **v, size_t *n, size_t *cap,
    const char *url, int64_t size, const char *etag);

#endif /* CWI_IO_H */
