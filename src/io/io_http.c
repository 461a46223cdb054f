/*
 * io_http.c - the HTTP engine under every remote scheme: one streaming GET
 * per file driven through a curl multi handle from cwi_file_read(), bounded
 * retries with exponential backoff and jitter, and resume with a Range
 * request from the last byte received when a transfer breaks.
 *
 * Streaming: curl hands body data to write_body(), which copies it into the
 * caller's buffer; what does not fit goes to a spill buffer of at most one
 * network read, and the next piece pauses the transfer until the caller
 * reads again. So a file never holds more than one read beyond the caller's
 * buffer, and bytes are copied once, from curl's receive buffer into the
 * caller's block.
 *
 * Connection reuse: the multi handle owns curl's connection and DNS caches.
 * Each thread keeps one idle (multi, easy) pair; opening takes it, closing
 * gives it back, so the files a reader opens one after another go over one
 * kept-alive connection. A thread's pair is freed when the thread exits.
 *
 * Consistency of a resumed transfer: the first response fixes the object's
 * identity (ETag, else Last-Modified, and total size). A resume asks for
 * "bytes=<received>-" with If-Match on a strong ETag, and checks that the
 * 206's Content-Range starts at the byte asked for and that the identity is
 * unchanged; if not, the read fails with CACHEW_ECORRUPT rather than
 * splice two versions of the object.
 *
 * Trust: https peers are verified against libcurl's default CA store, or
 * the PEM file named by CACHEW_CA_BUNDLE (else CURL_CA_BUNDLE), read when
 * a file is opened, for private CAs and loopback tests.
 *
 * Confinement: in a confined process (io_policy.h) a URL the pipeline
 * names is checked at every connection: the address a socket is about to
 * connect to (CURLOPT_OPENSOCKETFUNCTION: a refused private address is
 * never connected to, whatever DNS answered), and before each request,
 * redirects included, the URL and the address of the connection it goes
 * over (CURLOPT_PREREQFUNCTION, which also sees reused connections). A
 * refusal ends the transfer at once, without retries.
 *
 * No locks: the per-thread pairs are thread-local; curl_global_init runs
 * once under pthread_once.
 */
#include "io.h"
#include "io_policy.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>

/* The most error-body bytes kept for a message. */
#define ERRBODY_MAX 1024
/* The longest backoff between two attempts. */
#define BACKOFF_CAP_MS 10000

typedef struct http_conn {
	CURLM *multi;
	CURL *easy;
} http_conn;

typedef struct http_file {
	cwi_file base;
	cwi_http_req req;
	cwi_io_opts opts;
	http_conn *conn;
	bool attached;    /* easy is in the multi: an attempt is running */
	bool paused;      /* write_body paused the transfer */
	bool done;        /* the range is complete (spill may hold the tail) */
	cachew_err err;   /* sticky final error */
	/* The range: absolute offsets [off, end), end UINT64_MAX = to EOF. */
	uint64_t off, end;
	uint64_t net;     /* absolute offset of the next byte from the net */
	/* Identity fixed by the first good response. */
	bool have_identity;
	char etag[256];
	char modified[64];
	/* The current attempt's response. */
	long status;
	char reason[96];
	char a_etag[256];
	char a_modified[64];
	int64_t a_total;  /* from Content-Range or Content-Length, -1 unknown */
	int64_t a_start;  /* Content-Range first byte, -1 none */
	bool a_headers;   /* the final response's headers are in */
	bool a_ok;        /* 200/206: the body is the object's bytes */
	bool a_range;     /* this attempt sent a Range header */
	bool a_complete;  /* write_body stopped at `end` */
	uint64_t skip;    /* bytes of a 200 body before the wanted ones */
	uint64_t a_net0;  /* net when the attempt started */
	struct curl_slist *a_headers_list;
	struct curl_slist *connect_to; /* opts.connect_to as a curl list */
	/* The PEM file of CAs that verify https peers (CURLOPT_CAINFO), from
	 * the environment at open, or NULL for libcurl's default store. */
	char *ca_bundle;
	const char *ca_bundle_var; /* the variable that named it */
	cwi_strbuf errbody;
	char errbuf[CURL_ERROR_SIZE];
	char errmsg[512]; /* the final error's message, for sticky returns */
	/* Why a confined process refused this attempt's peer or redirect
	 * (io_policy.h); "" when it did not. */
	char refused[512];
	int fails;        /* consecutive attempts without progress */
	int attempts;
	cwi_rng rng;
	/* The caller's buffer during cwi_file_read. */
	uint8_t *dst;
	size_t cap, got;
	/* Received but not yet delivered: [spill_off, spill_len). */
	uint8_t *spill;
	size_t spill_off, spill_len, spill_cap;
} http_file;

/* ---- global init and the per-thread handle pairs ---------------------------- */

static pthread_once_t http_once = PTHREAD_ONCE_INIT;
static pthread_key_t http_key;
static CURLcode http_init_rv = CURLE_FAILED_INIT;

static void
conn_free(http_conn *c)
{
	if (c == NULL)
		return;
	if (c->easy != NULL)
		curl_easy_cleanup(c->easy);
	if (c->multi != NULL)
		curl_multi_cleanup(c->multi);
	free(c);
}

static void
conn_key_destroy(void *p)
{
	conn_free(p);
}

static void
http_init(void)
{
	http_init_rv = curl_global_init(CURL_GLOBAL_DEFAULT);
	if (http_init_rv == CURLE_OK &&
	    pthread_key_create(&http_key, conn_key_destroy) != 0)
		http_init_rv = CURLE_FAILED_INIT;
}

static cachew_err
conn_take(http_conn **out)
{
	http_conn *c;

	pthread_once(&http_once, http_init);
	if (http_init_rv != CURLE_OK)
		return cwi_fail(CACHEW_EIO, "libcurl initialisation failed: %s",
		    curl_easy_strerror(http_init_rv));
	c = pthread_getspecific(http_key);
	if (c != NULL) {
		(void)pthread_setspecific(http_key, NULL);
		*out = c;
		return CACHEW_OK;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->multi = curl_multi_init();
	c->easy = curl_easy_init();
	if (c->multi == NULL || c->easy == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory for a curl handle");
	}
	*out = c;
	return CACHEW_OK;
}

static void
conn_give_back(http_conn *c)
{
	if (c == NULL)
		return;
	if (pthread_getspecific(http_key) == NULL &&
	    pthread_setspecific(http_key, c) == 0)
		return;
	conn_free(c);
}

/* ---- requests ------------------------------------------------------------------ */

void
cwi_http_req_free(cwi_http_req *req)
{
	free(req->url);
	curl_slist_free_all(req->headers);
	free(req->sigv4);
	free(req->user);
	free(req->secret);
	memset(req, 0, sizeof(*req));
}

static bool
status_ok(long status)
{
	return status == 200 || status == 206;
}

static bool
status_retryable(long status)
{
	return status >= 500 || status == 429 || status == 408;
}

static bool
curl_retryable(CURLcode rc)
{
	switch (rc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_PARTIAL_FILE:
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_GOT_NOTHING:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_COULDNT_RESOLVE_HOST:
		return true;
	default:
		return false;
	}
}

/* Copies a header value (trimmed) into dst. */
static void
header_value(const char *v, size_t len, char *dst, size_t cap)
{
	while (len > 0 && (*v == ' ' || *v == '\t')) {
		v++;
		len--;
	}
	while (len > 0 && (v[len - 1] == '\r' || v[len - 1] == '\n' ||
			      v[len - 1] == ' ' || v[len - 1] == '\t'))
		len--;
	if (len >= cap)
		len = cap - 1;
	memcpy(dst, v, len);
	dst[len] = '\0';
}

static bool
header_is(const char *line, size_t len, const char *name, const char **value,
    size_t *vlen)
{
	size_t n = strlen(name);

	if (len <= n || strncasecmp(line, name, n) != 0 || line[n] != ':')
		return false;
	*value = line + n + 1;
	*vlen = len - n - 1;
	return true;
}

static void
parse_status_line(http_file *h, const char *line, size_t len)
{
	char buf[160];
	const char *sp;

	header_value(line, len, buf, sizeof(buf));
	h->status = 0;
	h->reason[0] = '\0';
	h->a_etag[0] = h->a_modified[0] = '\0';
	h->a_total = h->a_start = -1;
	sp = strchr(buf, ' ');
	if (sp == NULL)
		return;
	h->status = strtol(sp + 1, NULL, 10);
	sp = strchr(sp + 1, ' ');
	if (sp != NULL)
		snprintf(h->reason, sizeof(h->reason), "%s", sp + 1);
}

/* "bytes 100-199/1000" -> start 100, total 1000 ("*": -1). */
static void
parse_content_range(http_file *h, const char *v, size_t vlen)
{
	char buf[128];
	char *p, *slash;

	header_value(v, vlen, buf, sizeof(buf));
	if (strncasecmp(buf, "bytes ", 6) != 0)
		return;
	p = buf + 6;
	h->a_start = strtoll(p, NULL, 10);
	slash = strchr(p, '/');
	if (slash != NULL && slash[1] != '*')
		h->a_total = strtoll(slash + 1, NULL, 10);
}

static cachew_err
identity_check(http_file *h)
{
	if (!h->have_identity) {
		snprintf(h->etag, sizeof(h->etag), "%s", h->a_etag);
		snprintf(h->modified, sizeof(h->modified), "%s", h->a_modified);
		h->base.size = h->a_total;
		h->have_identity = true;
		return CACHEW_OK;
	}
	if (h->etag[0] != '\0' && h->a_etag[0] != '\0' &&
	    strcmp(h->etag, h->a_etag) != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the object changed while it was read (ETag %s, now %s "
		    "at byte %llu)",
		    h->base.path, h->etag, h->a_etag,
		    (unsigned long long)h->net);
	if (h->etag[0] == '\0' && h->modified[0] != '\0' &&
	    h->a_modified[0] != '\0' && strcmp(h->modified, h->a_modified) != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the object changed while it was read (Last-Modified "
		    "%s, now %s)",
		    h->base.path, h->modified, h->a_modified);
	if (h->base.size >= 0 && h->a_total >= 0 && h->base.size != h->a_total)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the object changed while it was read (%lld bytes, now "
		    "%lld)",
		    h->base.path, (long long)h->base.size, (long long)h->a_total);
	return CACHEW_OK;
}

/* The final response's headers are in: decide what its body is. */
static cachew_err
headers_done(http_file *h)
{
	h->a_headers = true;
	if (h->status == 412)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: the object changed while it was read (HTTP 412 on "
		    "resuming at byte %llu with If-Match %s)",
		    h->base.path, (unsigned long long)h->net, h->etag);
	if (!status_ok(h->status))
		return CACHEW_OK; /* an error response: judged at the end */
	if (h->status == 206) {
		if (h->a_start < 0 || (uint64_t)h->a_start != h->net)
			return cwi_fail(CACHEW_EPROTO,
			    "%s: asked for bytes from %llu, the server sent a "
			    "range from %lld",
			    h->base.path, (unsigned long long)h->net,
			    (long long)h->a_start);
		h->skip = 0;
	} else {
		/* 200: the whole object, whatever Range asked. */
		h->skip = h->net;
	}
	h->a_ok = true;
	return identity_check(h);
}

static size_t
write_header(char *data, size_t size, size_t nitems, void *ctx)
{
	http_file *h = ctx;
	size_t len = size * nitems;
	const char *v;
	size_t vlen;

	if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) {
		parse_status_line(h, data, len);
	} else if (len <= 2 && (data[0] == '\r' || data[0] == '\n')) {
		/* The end of a response's headers; 1xx and redirects are
		 * followed by another response. */
		if (h->status >= 200 && (h->status < 300 || h->status >= 400 ||
					    h->status == 304)) {
			cachew_err rv = headers_done(h);
			if (rv != CACHEW_OK) {
				h->err = rv;
				return 0;
			}
		}
	} else if (header_is(data, len, "etag", &v, &vlen)) {
		header_value(v, vlen, h->a_etag, sizeof(h->a_etag));
	} else if (header_is(data, len, "last-modified", &v, &vlen)) {
		header_value(v, vlen, h->a_modified, sizeof(h->a_modified));
	} else if (header_is(data, len, "content-range", &v, &vlen)) {
		parse_content_range(h, v, vlen);
	} else if (header_is(data, len, "content-length", &v, &vlen) &&
		   h->status == 200) {
		char buf[32];
		header_value(v, vlen, buf, sizeof(buf));
		h->a_total = strtoll(buf, NULL, 10);
	}
	return len;
}

static bool
spill_empty(const http_file *h)
{
	return h->spill_off == h->spill_len;
}

static size_t
write_body(char *data, size_t size, size_t nitems, void *ctx)
{
	http_file *h = ctx;
	size_t len = size * nitems, n = len, room;
	const char *p = data;

	if (!h->a_ok) {
		/* An error response: keep its start for the message. */
		if (h->errbody.len < ERRBODY_MAX)
			cwi_strbuf_append(&h->errbody, data,
			    len < ERRBODY_MAX - h->errbody.len
				? len
				: ERRBODY_MAX - h->errbody.len);
		return len;
	}
	if (!spill_empty(h)) {
		h->paused = true;
		return CURL_WRITEFUNC_PAUSE;
	}
	if (h->skip > 0) {
		size_t s = h->skip < n ? (size_t)h->skip : n;
		h->skip -= s;
		p += s;
		n -= s;
	}
	if (h->end != UINT64_MAX && n > h->end - h->net)
		n = (size_t)(h->end - h->net);
	room = h->cap - h->got;
	if (n <= room) {
		memcpy(h->dst + h->got, p, n);
		h->got += n;
	} else {
		if (room > 0)
			memcpy(h->dst + h->got, p, room);
		h->got += room;
		if (n - room > h->spill_cap) {
			uint8_t *s = realloc(h->spill, n - room);
			if (s == NULL) {
				h->err = cwi_fail(CACHEW_ENOMEM, "out of memory");
				return 0;
			}
			h->spill = s;
			h->spill_cap = n - room;
		}
		memcpy(h->spill, p + room, n - room);
		h->spill_off = 0;
		h->spill_len = n - room;
	}
	h->net += n;
	if (h->end != UINT64_MAX && h->net >= h->end) {
		/* All wanted bytes are in: stop a server that sends more. */
		h->a_complete = true;
		return len == n ? len : 0;
	}
	return len;
}

/* ---- attempts ---------------------------------------------------------------- */

static cachew_err
add_header(struct curl_slist **list, const char *text)
{
	struct curl_slist *l = curl_slist_append(*list, text);

	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	*list = l;
	return CACHEW_OK;
}

static cachew_err
attempt_headers(http_file *h)
{
	char line[400];
	cachew_err rv = CACHEW_OK;

	curl_slist_free_all(h->a_headers_list);
	h->a_headers_list = NULL;
	for (struct curl_slist *s = h->req.headers; s != NULL && rv == CACHEW_OK;
	     s = s->next)
		rv = add_header(&h->a_headers_list, s->data);
	h->a_range = h->net > 0 || h->end != UINT64_MAX;
	if (rv == CACHEW_OK && h->a_range) {
		if (h->end != UINT64_MAX)
			snprintf(line, sizeof(line), "Range: bytes=%llu-%llu",
			    (unsigned long long)h->net,
			    (unsigned long long)(h->end - 1));
		else
			snprintf(line, sizeof(line), "Range: bytes=%llu-",
			    (unsigned long long)h->net);
		rv = add_header(&h->a_headers_list, line);
	}
	/* A weak ETag does not identify bytes: If-Match would always fail. */
	if (rv == CACHEW_OK && h->have_identity && h->etag[0] == '"') {
		snprintf(line, sizeof(line), "If-Match: %s", h->etag);
		rv = add_header(&h->a_headers_list, line);
	}
	if (rv == CACHEW_OK && h->opts.amz_date != NULL) {
		snprintf(line, sizeof(line), "X-Amz-Date: %s", h->opts.amz_date);
		rv = add_header(&h->a_headers_list, line);
	}
	return rv;
}

/* ---- confinement -------------------------------------------------------------- */

/* The URL of the request curl is making: a redirect's target once it
 * follows one. */
static const char *
current_url(http_file *h)
{
	char *url = NULL;

	(void)curl_easy_getinfo(h->conn->easy, CURLINFO_EFFECTIVE_URL, &url);
	return url != NULL ? url : h->req.url;
}

/* Keeps the refusal's message, naming the URL the pipeline gave when a
 * redirect led elsewhere. */
static void
note_refusal(http_file *h)
{
	if (strcmp(current_url(h), h->req.url) != 0)
		snprintf(h->refused, sizeof(h->refused), "%s: redirected: %s",
		    h->base.path, cwi_errmsg_get());
	else
		snprintf(h->refused, sizeof(h->refused), "%s",
		    cwi_errmsg_get());
}

static curl_socket_t
open_socket(void *ctx, curlsocktype purpose, struct curl_sockaddr *a)
{
	http_file *h = ctx;

	if (purpose == CURLSOCKTYPE_IPCXN &&
	    cwi_io_check_peer(current_url(h), &a->addr) != CACHEW_OK) {
		note_refusal(h);
		return CURL_SOCKET_BAD;
	}
	return socket(a->family, a->socktype, a->protocol);
}

static int
before_request(void *ctx, char *peer_ip, char *local_ip, int peer_port,
    int local_port)
{
	http_file *h = ctx;
	const char *url = current_url(h);

	(void)local_ip;
	(void)peer_port;
	(void)local_port;
	if (cwi_io_check_read(url) != CACHEW_OK ||
	    cwi_io_check_peer_text(url, peer_ip) != CACHEW_OK) {
		note_refusal(h);
		return CURL_PREREQFUNC_ABORT;
	}
	return CURL_PREREQFUNC_OK;
}

static cachew_err
attempt_start(http_file *h)
{
	CURL *e = h->conn->easy;
	CURLcode rc = CURLE_OK;
	cachew_err rv;

	rv = attempt_headers(h);
	if (rv != CACHEW_OK)
		return rv;
	h->status = 0;
	h->reason[0] = '\0';
	h->a_headers = h->a_ok = h->a_complete = false;
	h->skip = 0;
	h->a_net0 = h->net;
	h->errbody.len = 0;
	h->errbuf[0] = '\0';
	h->refused[0] = '\0';
	h->attempts++;
	curl_easy_reset(e);
#define SET(opt, val)                                                         \
	do {                                                                  \
		if (rc == CURLE_OK)                                           \
			rc = curl_easy_setopt(e, opt, val);                   \
	} while (0)
	SET(CURLOPT_URL, h->req.url);
	SET(CURLOPT_HTTPHEADER, h->a_headers_list);
	SET(CURLOPT_WRITEFUNCTION, write_body);
	SET(CURLOPT_WRITEDATA, h);
	SET(CURLOPT_HEADERFUNCTION, write_header);
	SET(CURLOPT_HEADERDATA, h);
	SET(CURLOPT_ERRORBUFFER, h->errbuf);
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_BUFFERSIZE, h->opts.recv_buffer);
	SET(CURLOPT_CONNECTTIMEOUT_MS, (long)h->opts.connect_timeout_ms);
	SET(CURLOPT_LOW_SPEED_LIMIT, 1L);
	SET(CURLOPT_LOW_SPEED_TIME, (long)h->opts.low_speed_secs);
	SET(CURLOPT_TCP_KEEPALIVE, 1L);
	SET(CURLOPT_PROTOCOLS_STR, "http,https");
	/* Redirects only for plain URLs: a signed request is for one host. */
	SET(CURLOPT_FOLLOWLOCATION, h->req.sigv4 == NULL ? 1L : 0L);
	SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	SET(CURLOPT_MAXREDIRS, 8L);
	if (h->req.sigv4 != NULL) {
		SET(CURLOPT_AWS_SIGV4, h->req.sigv4);
		SET(CURLOPT_USERNAME, h->req.user);
		SET(CURLOPT_PASSWORD, h->req.secret);
	}
	if (h->req.pipeline_host && cwi_io_confined()) {
		SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
		SET(CURLOPT_OPENSOCKETDATA, h);
		SET(CURLOPT_PREREQFUNCTION, before_request);
		SET(CURLOPT_PREREQDATA, h);
	}
#undef SET
	if (h->connect_to != NULL && rc == CURLE_OK)
		rc = curl_easy_setopt(e, CURLOPT_CONNECT_TO, h->connect_to);
	if (h->ca_bundle != NULL && rc == CURLE_OK)
		rc = curl_easy_setopt(e, CURLOPT_CAINFO, h->ca_bundle);
	if (rc != CURLE_OK)
		return cwi_fail(CACHEW_EIO, "%s: curl setup failed: %s",
		    h->base.path, curl_easy_strerror(rc));
	if (curl_multi_add_handle(h->conn->multi, e) != CURLM_OK)
		return cwi_fail(CACHEW_EIO, "%s: curl_multi_add_handle failed",
		    h->base.path);
	h->attached = true;
	return CACHEW_OK;
}

static void
attempt_detach(http_file *h)
{
	if (h->attached)
		(void)curl_multi_remove_handle(h->conn->multi, h->conn->easy);
	h->attached = false;
	h->paused = false;
}

/* A printable extract of an error body: S3's and GCS's XML <Code> and
 * <Message>, else the start of its first line. */
static void
errbody_summary(http_file *h, char *out, size_t cap)
{
	char body[ERRBODY_MAX + 1];
	size_t n = h->errbody.len < ERRBODY_MAX ? h->errbody.len : ERRBODY_MAX;
	const char *code, *msg;
	size_t o = 0;

	out[0] = '\0';
	if (n == 0)
		return;
	memcpy(body, h->errbody.data, n);
	body[n] = '\0';
	code = strstr(body, "<Code>");
	msg = strstr(body, "<Message>");
	if (code != NULL) {
		char *e = strstr(code + 6, "</");
		if (e != NULL)
			*e = '\0';
		o = (size_t)snprintf(out, cap, ": %.60s", code + 6);
		if (msg != NULL && o < cap) {
			e = strstr(msg + 9, "</");
			if (e != NULL)
				*e = '\0';
			snprintf(out + o, cap - o, " (%.100s)", msg + 9);
		}
		return;
	}
	body[strcspn(body, "\r\n")] = '\0';
	if (strlen(body) > 160)
		body[160] = '\0';
	for (char *p = body; *p != '\0'; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '?';
	if (body[0] != '\0')
		snprintf(out, cap, ": %.160s", body);
}

/* What to do about a certificate failure: name the CA bundle in use, or
 * the variable that sets one. Empty for other errors. */
static void
tls_hint(const http_file *h, CURLcode rc, char *out, size_t cap)
{
	out[0] = '\0';
	if (rc == CURLE_PEER_FAILED_VERIFICATION && h->ca_bundle == NULL)
		snprintf(out, cap,
		    " (not trusted by the default CA store; set "
		    "CACHEW_CA_BUNDLE to the PEM file of the server's CA)");
	else if (rc == CURLE_PEER_FAILED_VERIFICATION)
		snprintf(out, cap,
		    " (not trusted by the CA bundle %.200s from %s)",
		    h->ca_bundle, h->ca_bundle_var);
	else if (rc == CURLE_SSL_CACERT_BADFILE && h->ca_bundle != NULL)
		snprintf(out, cap, " (cannot use the CA bundle %.200s from %s)",
		    h->ca_bundle, h->ca_bundle_var);
}

/* Full jitter over the upper half of an exponential delay. */
static uint64_t
backoff_ns(http_file *h)
{
	uint64_t ms = (uint64_t)h->opts.backoff_ms;
	int shift = h->fails - 1 < 16 ? h->fails - 1 : 16;

	ms <<= shift > 0 ? shift : 0;
	if (ms > BACKOFF_CAP_MS)
		ms = BACKOFF_CAP_MS;
	ms = ms / 2 + cwi_rng_below(&h->rng, ms / 2 + 1);
	return ms * 1000000ull;
}

/* The attempt ended with curl's code rc: the range is done, a new attempt
 * is started, or the returned error is final. */
static cachew_err
attempt_end(http_file *h, CURLcode rc)
{
	char why[1024], body[200];
	cachew_err final = CACHEW_EIO;
	bool retry;

	attempt_detach(h);
	if (h->err != CACHEW_OK)
		return h->err;
	/* A refusal is final: the next attempt would meet the same rule. */
	if (rc != CURLE_OK && h->refused[0] != '\0')
		return cwi_fail(CACHEW_EINVAL, "%s", h->refused);
	if (h->a_complete)
		rc = CURLE_OK; /* write_body stopped a longer body at `end` */
	if (rc == CURLE_OK && h->a_ok) {
		uint64_t want = h->end;
		if (h->base.size >= 0 && (uint64_t)h->base.size < want)
			want = (uint64_t)h->base.size;
		if (h->a_complete || want == UINT64_MAX || h->net >= want) {
			h->done = true;
			return CACHEW_OK;
		}
		snprintf(why, sizeof(why),
		    "the response ended at byte %llu of %llu",
		    (unsigned long long)h->net, (unsigned long long)want);
		retry = true;
	} else if (rc == CURLE_OK && h->status == 416 && h->a_range) {
		/* A range past the end reads as empty; but a resume short
		 * of the size the first response gave means the object
		 * shrank (a server that ignores If-Match), not its end. */
		if (h->net > h->off && h->base.size >= 0 &&
		    h->net < (uint64_t)h->base.size)
			return cwi_fail(CACHEW_ECORRUPT,
			    "%s: the object changed while it was read (HTTP "
			    "416 on resuming at byte %llu of %lld)",
			    h->base.path, (unsigned long long)h->net,
			    (long long)h->base.size);
		h->done = true;
		return CACHEW_OK;
	} else if (rc == CURLE_OK) {
		errbody_summary(h, body, sizeof(body));
		snprintf(why, sizeof(why), "HTTP %ld%s%s%s", h->status,
		    h->reason[0] != '\0' ? " " : "", h->reason, body);
		retry = status_retryable(h->status);
		if (h->status == 404)
			final = CACHEW_ENOENT;
	} else {
		char hint[300];
		tls_hint(h, rc, hint, sizeof(hint));
		snprintf(why, sizeof(why), "curl error %d (%s)%s%s%s", (int)rc,
		    curl_easy_strerror(rc), h->errbuf[0] != '\0' ? ": " : "",
		    h->errbuf, hint);
		retry = curl_retryable(rc);
		if (rc == CURLE_OPERATION_TIMEDOUT)
			final = CACHEW_ETIMEDOUT;
	}
	if (h->net > h->a_net0)
		h->fails = 0; /* progress renews the budget */
	if (retry)
		h->fails++;
	if (!retry)
		return cwi_fail(final, "%s: %s", h->base.path, why);
	if (h->fails > h->opts.max_retries)
		return cwi_fail(final,
		    "%s: %s (gave up after %d attempts, %d in a row without "
		    "progress, at byte %llu)",
		    h->base.path, why, h->attempts, h->fails,
		    (unsigned long long)h->net);
	cwi_log(CACHEW_LOG_WARN, "io", "%s: %s; retrying from byte %llu",
	    h->base.path, why, (unsigned long long)h->net);
	cwi_sleep_ns(backoff_ns(h));
	return attempt_start(h);
}

static bool
pump_enough(const http_file *h, bool want_headers)
{
	return want_headers ? h->a_ok : h->got == h->cap;
}

/* Runs the transfer until the good response's headers are in
 * (want_headers) or the caller's buffer is full, the range is done, or a
 * final error. */
static cachew_err
pump(http_file *h, bool want_headers)
{
	CURLM *multi = h->conn->multi;

	while (h->err == CACHEW_OK && !h->done && !pump_enough(h, want_headers)) {
		CURLMsg *m;
		CURLMcode mc;
		CURLcode rc = CURLE_OK;
		bool ended = false;
		int running = 0, left;

		if (h->paused) {
			/* Delivers what curl held back, through write_body. */
			h->paused = false;
			(void)curl_easy_pause(h->conn->easy, CURLPAUSE_CONT);
			continue;
		}
		mc = curl_multi_perform(multi, &running);
		if (mc != CURLM_OK) {
			h->err = cwi_fail(CACHEW_EIO, "%s: curl: %s", h->base.path,
			    curl_multi_strerror(mc));
			break;
		}
		while ((m = curl_multi_info_read(multi, &left)) != NULL) {
			if (m->msg == CURLMSG_DONE && m->easy_handle == h->conn->easy) {
				rc = m->data.result;
				ended = true;
			}
		}
		if (ended) {
			cachew_err rv = attempt_end(h, rc);
			if (rv != CACHEW_OK)
				h->err = rv;
			continue;
		}
		if (pump_enough(h, want_headers) || h->paused || h->err != CACHEW_OK)
			continue;
		if (running > 0)
			(void)curl_multi_poll(multi, NULL, 0, 250, NULL);
	}
	if (h->err != CACHEW_OK) {
		attempt_detach(h);
		snprintf(h->errmsg, sizeof(h->errmsg), "%s", cwi_errmsg_get());
	}
	return h->err;
}

/* ---- the cwi_file backend ------------------------------------------------------ */

static cachew_err
http_read(cwi_file *f, void *buf, size_t len, size_t *got)
{
	http_file *h = (http_file *)f;
	size_t s = h->spill_len - h->spill_off;
	cachew_err rv = CACHEW_OK;

	if (h->err != CACHEW_OK && s == 0)
		return cwi_fail(h->err, "%s", h->errmsg);
	h->dst = buf;
	h->cap = len;
	h->got = 0;
	if (s > 0) {
		if (s > len)
			s = len;
		memcpy(h->dst, h->spill + h->spill_off, s);
		h->spill_off += s;
		h->got = s;
	}
	if (h->got < h->cap && h->err == CACHEW_OK && !h->done)
		rv = pump(h, false);
	*got = h->got;
	h->dst = NULL;
	h->cap = h->got = 0;
	/* Bytes that came before a failure are delivered first. */
	return *got > 0 ? CACHEW_OK : rv;
}

static void
http_close(cwi_file *f)
{
	http_file *h = (http_file *)f;

	attempt_detach(h);
	conn_give_back(h->conn);
	cwi_http_req_free(&h->req);
	curl_slist_free_all(h->a_headers_list);
	curl_slist_free_all(h->connect_to);
	free(h->ca_bundle);
	cwi_strbuf_free(&h->errbody);
	free(h->spill);
	free(h->base.path);
	free(h);
}

static const cwi_file_ops http_ops = {
    .read = http_read,
    .close = http_close,
};

/* CACHEW_CA_BUNDLE, else the conventional CURL_CA_BUNDLE; an empty value
 * counts as unset. Copied: the environment may change while h is open. */
static cachew_err
ca_bundle_from_env(http_file *h)
{
	static const char *const vars[] = {"CACHEW_CA_BUNDLE", "CURL_CA_BUNDLE"};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (v == NULL || v[0] == '\0')
			continue;
		h->ca_bundle = cwi_strdup(v);
		if (h->ca_bundle == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		h->ca_bundle_var = vars[i];
		return CACHEW_OK;
	}
	return CACHEW_OK;
}

cachew_err
cwi_http_open(cwi_file **out, const char *display, cwi_http_req *req,
    uint64_t offset, uint64_t length, const cwi_io_opts *opts)
{
	http_file *h = calloc(1, sizeof(*h));
	cachew_err rv;

	if (h == NULL) {
		cwi_http_req_free(req);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	h->base.ops = &http_ops;
	h->base.fd = -1;
	h->base.size = -1;
	h->req = *req;
	memset(req, 0, sizeof(*req));
	h->opts = *opts;
	h->off = h->net = offset;
	h->end = length == UINT64_MAX || length > UINT64_MAX - offset
	    ? UINT64_MAX
	    : offset + length;
	h->rng.state = cwi_now_ns() ^ (uint64_t)(uintptr_t)h;
	cwi_strbuf_init(&h->errbody);
	h->base.path = cwi_strdup(display);
	if (h->base.path == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if (opts->connect_to != NULL) {
		h->connect_to = curl_slist_append(NULL, opts->connect_to);
		if (h->connect_to == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto fail;
		}
	}
	rv = ca_bundle_from_env(h);
	if (rv != CACHEW_OK)
		goto fail;
	rv = conn_take(&h->conn);
	if (rv != CACHEW_OK)
		goto fail;
	if (h->end != UINT64_MAX && h->net >= h->end) {
		h->done = true; /* an empty range needs no request */
		*out = &h->base;
		return CACHEW_OK;
	}
	rv = attempt_start(h);
	if (rv == CACHEW_OK)
		rv = pump(h, true);
	if (rv != CACHEW_OK)
		goto fail;
	*out = &h->base;
	return CACHEW_OK;
fail:
	http_close(&h->base);
	return rv;
}

cachew_err
cwi_http_get_small(const char *display, cwi_http_req *req, size_t limit,
    const cwi_io_opts *opts, char **body, size_t *len)
{
	cwi_file *f = NULL;
	cwi_strbuf sb;
	char chunk[16384];
	cachew_err rv;

	rv = cwi_http_open(&f, display, req, 0, UINT64_MAX, opts);
	if (rv != CACHEW_OK)
		return rv;
	cwi_strbuf_init(&sb);
	for (;;) {
		size_t got;
		rv = cwi_file_read(f, chunk, sizeof(chunk), &got);
		if (rv != CACHEW_OK || got == 0)
			break;
		if (sb.len + got > limit) {
			rv = cwi_fail(CACHEW_ERANGE,
			    "%s: the response is larger than %zu bytes", display,
			    limit);
			break;
		}
		cwi_strbuf_append(&sb, chunk, got);
	}
	cwi_file_close(f);
	if (rv != CACHEW_OK) {
		cwi_strbuf_free(&sb);
		return rv;
	}
	return cwi_strbuf_finish(&sb, body, len);
}
