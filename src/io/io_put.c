/*
 * io_put.c - PUT and DELETE of whole S3 objects, for the cache store's S3
 * roots (docs/cache-format.md, section 8).
 *
 * Requests are signed like reads (io_s3.c builds URL, credentials and
 * headers; libcurl signs with CURLOPT_AWS_SIGV4). A PUT body is sent as
 * UNSIGNED-PAYLOAD: hashing it would mean a second pass over up to a chunk
 * of 64 MiB, and its integrity is the cache format's business (checksums
 * in every frame and in the manifest). Each call uses its own easy handle:
 * a PUT happens once per chunk, so connection reuse would not pay.
 *
 * Retries: transport errors that may pass (connect, timeout, reset) and
 * HTTP 408, 429 and 5xx are retried up to opts->max_retries times with a
 * doubling, jittered backoff, like reads; the whole body is resent.
 */
#include "io_put.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* Bytes of an error response kept for the message. */
#define ERRBODY_MAX 512

typedef struct put_body {
	const uint8_t *data;
	size_t len, pos;
} put_body;

static size_t
read_body(char *dst, size_t size, size_t nitems, void *ctx)
{
	put_body *b = ctx;
	size_t n = size * nitems;

	if (n > b->len - b->pos)
		n = b->len - b->pos;
	memcpy(dst, b->data + b->pos, n);
	b->pos += n;
	return n;
}

static int
seek_body(void *ctx, curl_off_t offset, int origin)
{
	put_body *b = ctx;

	if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > b->len)
		return CURL_SEEKFUNC_FAIL;
	b->pos = (size_t)offset;
	return CURL_SEEKFUNC_OK;
}

static size_t
keep_errbody(char *data, size_t size, size_t nitems, void *ctx)
{
	cwi_strbuf *sb = ctx;
	size_t n = size * nitems;

	if (sb->len < ERRBODY_MAX)
		cwi_strbuf_append(sb, data,
		    n < ERRBODY_MAX - sb->len ? n : ERRBODY_MAX - sb->len);
	return n;
}

/* The request's headers with the payload hash of this body. */
static cachew_err
put_headers(const cwi_http_req *req, bool has_body, struct curl_slist **out)
{
	struct curl_slist *l = NULL, *n;

	for (const struct curl_slist *h = req->headers; h != NULL; h = h->next) {
		if (strncasecmp(h->data, "x-amz-content-sha256:", 21) == 0)
			continue;
		n = curl_slist_append(l, h->data);
		if (n == NULL)
			goto oom;
		l = n;
	}
	n = curl_slist_append(l, has_body
		? "x-amz-content-sha256: UNSIGNED-PAYLOAD"
		: "x-amz-content-sha256: "
		  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	if (n == NULL)
		goto oom;
	l = n;
	/* No "Expect: 100-continue" round trip before a body. */
	n = curl_slist_append(l, "Expect:");
	if (n == NULL)
		goto oom;
	*out = n;
	return CACHEW_OK;
oom:
	curl_slist_free_all(l);
	return cwi_fail(CACHEW_ENOMEM, "out of memory");
}

static bool
retryable(CURLcode rc, long status)
{
	if (rc != CURLE_OK)
		return rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
		    rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
		    rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE ||
		    rc == CURLE_COULDNT_RESOLVE_HOST;
	return status == 408 || status == 429 || status >= 500;
}

/* One attempt; *status is the HTTP status (0 if none). */
static CURLcode
attempt(const cwi_http_req *req, struct curl_slist *hdrs, const char *method,
    put_body *body, const cwi_io_opts *opts, cwi_strbuf *errbody,
    char *errbuf, long *status)
{
	struct curl_slist *connect_to = NULL;
	const char *ca = getenv("CACHEW_CA_BUNDLE");
	CURL *e = curl_easy_init();
	CURLcode rc;

	*status = 0;
	if (e == NULL)
		return CURLE_OUT_OF_MEMORY;
	if (ca == NULL || *ca == '\0')
		ca = getenv("CURL_CA_BUNDLE");
	curl_easy_setopt(e, CURLOPT_URL, req->url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
	    (long)opts->connect_timeout_ms);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)opts->low_speed_secs);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep_errbody);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, errbody);
	if (req->sigv4 != NULL) {
		curl_easy_setopt(e, CURLOPT_AWS_SIGV4, req->sigv4);
		curl_easy_setopt(e, CURLOPT_USERNAME, req->user);
		curl_easy_setopt(e, CURLOPT_PASSWORD, req->secret);
	}
	if (opts->connect_to != NULL &&
	    (connect_to = curl_slist_append(NULL, opts->connect_to)) != NULL)
		curl_easy_setopt(e, CURLOPT_CONNECT_TO, connect_to);
	if (ca != NULL && *ca != '\0')
		curl_easy_setopt(e, CURLOPT_CAINFO, ca);
	if (body != NULL) {
		body->pos = 0;
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, read_body);
		curl_easy_setopt(e, CURLOPT_READDATA, body);
		curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, seek_body);
		curl_easy_setopt(e, CURLOPT_SEEKDATA, body);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
		    (curl_off_t)body->len);
	} else {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	}
	rc = curl_easy_perform(e);
	if (rc == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
	curl_easy_cleanup(e);
	curl_slist_free_all(connect_to);
	return rc;
}

static cachew_err
s3_send(const char *url, const char *method, const void *data, size_t len,
    const cwi_io_opts *opts_in)
{
	cwi_io_opts opts;
	cwi_http_req req;
	struct curl_slist *hdrs = NULL;
	put_body body = {.data = data, .len = len};
	cwi_strbuf errbody;
	char errbuf[CURL_ERROR_SIZE];
	cwi_rng rng = {.state = cwi_now_ns()};
	uint64_t backoff_ns;
	cachew_err rv;

	if (strncmp(url, "s3://", 5) != 0)
		return cwi_fail(CACHEW_ENOTSUP,
		    "%s: only s3:// objects can be written", url);
	if (opts_in != NULL)
		opts = *opts_in;
	else
		cwi_io_opts_default(&opts);
	memset(&req, 0, sizeof(req));
	rv = cwi_s3_request(url, &opts, &req);
	if (rv != CACHEW_OK) {
		cwi_http_req_free(&req);
		return rv;
	}
	rv = put_headers(&req, data != NULL, &hdrs);
	if (rv != CACHEW_OK) {
		cwi_http_req_free(&req);
		return rv;
	}
	cwi_strbuf_init(&errbody);
	backoff_ns = (uint64_t)(opts.backoff_ms > 0 ? opts.backoff_ms : 1) * 1000000u;
	for (int attempt_no = 0;; attempt_no++) {
		long status;
		CURLcode rc;

		errbuf[0] = '\0';
		errbody.len = 0;
		rc = attempt(&req, hdrs, method, data != NULL ? &body : NULL,
		    &opts, &errbody, errbuf, &status);
		if (rc == CURLE_OK && status >= 200 && status < 300)
			break;
		/* Deleting what is not there is what was asked. */
		if (rc == CURLE_OK && status == 404 && data == NULL)
			break;
		if (attempt_no < opts.max_retries && retryable(rc, status)) {
			uint64_t wait = backoff_ns / 2 +
			    cwi_rng_below(&rng, backoff_ns / 2 + 1);
			cwi_sleep_ns(wait);
			if (backoff_ns < 8000000000ull)
				backoff_ns *= 2;
			continue;
		}
		if (rc != CURLE_OK)
			rv = cwi_fail(rc == CURLE_OPERATION_TIMEDOUT ? CACHEW_ETIMEDOUT
								     : CACHEW_EIO,
			    "%s: %s failed after %d attempts: %s", url, method,
			    attempt_no + 1,
			    errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc));
		else
			rv = cwi_fail(CACHEW_EIO, "%s: %s failed: HTTP %ld: %.*s",
			    url, method, status, (int)errbody.len,
			    errbody.data != NULL ? errbody.data : "");
		break;
	}
	cwi_strbuf_free(&errbody);
	curl_slist_free_all(hdrs);
	cwi_http_req_free(&req);
	return rv;
}

cachew_err
cwi_io_put(const char *url, const void *data, size_t len,
    const cwi_io_opts *opts)
{
	static const uint8_t empty[1];

	return s3_send(url, "PUT", data != NULL ? data : empty, len, opts);
}

cachew_err
cwi_io_delete(const char *url, const cwi_io_opts *opts)
{
	return s3_send(url, "DELETE", NULL, 0, opts);
}
