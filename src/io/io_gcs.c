/*
 * io_gcs.c - gs://bucket/object: Google Cloud Storage. Objects are read
 * from <endpoint>/<bucket>/<object> (the XML API's download path, which
 * takes Range), listings come from the JSON API
 * <endpoint>/storage/v1/b/<bucket>/o?prefix=...&pageToken=....
 *
 * Environment: GOOGLE_OAUTH_ACCESS_TOKEN (sent as "Authorization: Bearer";
 * without it requests are anonymous, which public buckets allow) and
 * CACHEW_GCS_ENDPOINT (default https://storage.googleapis.com).
 */
#include "io.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>

#define LIST_PAGE_MAX (16u << 20)
/* Nesting allowed in a listing before it is rejected as malformed. */
#define JSON_MAX_DEPTH 32

static const char *
gcs_endpoint(size_t *len)
{
	const char *ep = getenv("CACHEW_GCS_ENDPOINT");

	if (ep == NULL || *ep == '\0')
		ep = "https://storage.googleapis.com";
	*len = strlen(ep);
	while (*len > 0 && ep[*len - 1] == '/')
		(*len)--;
	return ep;
}

static cachew_err
gcs_req(const char *url_tail_fmt_done, cwi_http_req *req)
{
	const char *token = getenv("GOOGLE_OAUTH_ACCESS_TOKEN");
	char *hdr;

	req->url = cwi_strdup(url_tail_fmt_done);
	if (req->url == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (token != NULL && *token != '\0') {
		struct curl_slist *l;
		hdr = cwi_asprintf("Authorization: Bearer %s", token);
		l = hdr != NULL ? curl_slist_append(NULL, hdr) : NULL;
		free(hdr);
		if (l == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		req->headers = l;
	}
	return CACHEW_OK;
}

cachew_err
cwi_gcs_request(const char *url, cwi_http_req *req)
{
	char *bucket = NULL, *object = NULL, *full = NULL;
	size_t eplen;
	const char *ep = gcs_endpoint(&eplen);
	cwi_strbuf sb;
	cachew_err rv;

	memset(req, 0, sizeof(*req));
	rv = cwi_io_split_bucket(url, 5, &bucket, &object);
	if (rv != CACHEW_OK)
		return rv;
	if (*object == '\0') {
		rv = cwi_fail(CACHEW_EINVAL, "%s: no object name after the bucket",
		    url);
		goto done;
	}
	cwi_strbuf_init(&sb);
	cwi_strbuf_append(&sb, ep, eplen);
	cwi_strbuf_puts(&sb, "/");
	cwi_io_urlencode(&sb, bucket, false);
	cwi_strbuf_puts(&sb, "/");
	cwi_io_urlencode(&sb, object, true);
	rv = cwi_strbuf_finish(&sb, &full, NULL);
	if (rv == CACHEW_OK)
		rv = gcs_req(full, req);
done:
	free(full);
	free(bucket);
	free(object);
	return rv;
}

/* ---- a minimal JSON reader for listing pages ----------------------------- */

typedef struct json_cur {
	const char *p, *end;
	bool bad;
} json_cur;

static void
json_ws(json_cur *c)
{
	while (c->p < c->end &&
	       (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
		c->p++;
}

static bool
json_eat(json_cur *c, char ch)
{
	json_ws(c);
	if (c->p < c->end && *c->p == ch) {
		c->p++;
		return true;
	}
	return false;
}

/* Reads a string into a heap copy (escapes decoded; \u to '?' outside
 * ASCII). NULL with c->bad on malformed input or ENOMEM. */
static char *
json_string(json_cur *c)
{
	cwi_strbuf sb;
	char *out = NULL;

	json_ws(c);
	if (c->p >= c->end || *c->p != '"') {
		c->bad = true;
		return NULL;
	}
	c->p++;
	cwi_strbuf_init(&sb);
	while (c->p < c->end && *c->p != '"') {
		char ch = *c->p++;
		if (ch == '\\') {
			if (c->p >= c->end)
				break;
			ch = *c->p++;
			switch (ch) {
			case 'n': ch = '\n'; break;
			case 't': ch = '\t'; break;
			case 'r': ch = '\r'; break;
			case 'b': ch = '\b'; break;
			case 'f': ch = '\f'; break;
			case 'u': {
				unsigned v = 0;
				for (int k = 0; k < 4; k++) {
					char h = c->p < c->end ? *c->p++ : 'x';
					v <<= 4;
					if (h >= '0' && h <= '9')
						v |= (unsigned)(h - '0');
					else if (h >= 'a' && h <= 'f')
						v |= (unsigned)(h - 'a' + 10);
					else if (h >= 'A' && h <= 'F')
						v |= (unsigned)(h - 'A' + 10);
					else
						c->bad = true;
				}
				ch = v > 0 && v < 128 ? (char)v : '?';
				break;
			}
			default: break; /* \" \\ \/ */
			}
		}
		cwi_strbuf_append(&sb, &ch, 1);
	}
	if (c->p >= c->end || c->bad) {
		c->bad = true;
		cwi_strbuf_free(&sb);
		return NULL;
	}
	c->p++;
	if (cwi_strbuf_finish(&sb, &out, NULL) != CACHEW_OK)
		c->bad = true;
	return out;
}

static void
json_skip(json_cur *c, int depth)
{
	json_ws(c);
	if (c->p >= c->end || depth > JSON_MAX_DEPTH) {
		c->bad = true;
		return;
	}
	if (*c->p == '"') {
		free(json_string(c));
	} else if (*c->p == '{' || *c->p == '[') {
		char close = *c->p == '{' ? '}' : ']';
		bool obj = close == '}';
		c->p++;
		if (json_eat(c, close))
			return;
		do {
			if (obj) {
				free(json_string(c));
				if (!json_eat(c, ':'))
					c->bad = true;
			}
			if (!c->bad)
				json_skip(c, depth + 1);
		} while (!c->bad && json_eat(c, ','));
		if (!c->bad && !json_eat(c, close))
			c->bad = true;
	} else {
		/* number, true, false, null */
		const char *s = c->p;
		while (c->p < c->end && *c->p != ',' && *c->p != '}' &&
		       *c->p != ']' && *c->p != ' ' && *c->p != '\n')
			c->p++;
		if (c->p == s)
			c->bad = true;
	}
}

/* A scalar value as text: strings decoded, numbers as written. */
static char *
json_scalar(json_cur *c)
{
	const char *s;

	json_ws(c);
	if (c->p < c->end && *c->p == '"')
		return json_string(c);
	s = c->p;
	json_skip(c, 0);
	return c->bad ? NULL : cwi_strndup(s, (size_t)(c->p - s));
}

static cachew_err
gcs_parse_item(json_cur *c, const char *bucket, cwi_io_entry **v, size_t *n,
    size_t *cap)
{
	char *name = NULL, *size = NULL, *etag = NULL, *url;
	cachew_err rv = CACHEW_OK;

	if (!json_eat(c, '{')) {
		c->bad = true;
		return CACHEW_OK;
	}
	if (!json_eat(c, '}')) {
		do {
			char *k = json_string(c);
			char **slot = NULL;
			if (k == NULL || !json_eat(c, ':')) {
				free(k);
				c->bad = true;
				break;
			}
			if (strcmp(k, "name") == 0)
				slot = &name;
			else if (strcmp(k, "size") == 0)
				slot = &size;
			else if (strcmp(k, "etag") == 0)
				slot = &etag;
			free(k);
			if (slot != NULL) {
				free(*slot);
				*slot = json_scalar(c);
			} else {
				json_skip(c, 1);
			}
		} while (!c->bad && json_eat(c, ','));
		if (!c->bad && !json_eat(c, '}'))
			c->bad = true;
	}
	if (!c->bad && name != NULL) {
		url = cwi_asprintf("gs://%s/%s", bucket, name);
		rv = url != NULL
		    ? cwi_io_entry_push(v, n, cap, url,
			  size != NULL ? strtoll(size, NULL, 10) : -1, etag)
		    : cwi_fail(CACHEW_ENOMEM, "out of memory");
		free(url);
	}
	free(name);
	free(size);
	free(etag);
	return rv;
}

/* One page: {"items": [{"name":..., "size":"12", "etag":...}, ...],
 * "nextPageToken": "..."}; other keys are skipped. */
static cachew_err
gcs_parse_page(const char *display, const char *bucket, const char *body,
    size_t len, cwi_io_entry **v, size_t *n, size_t *cap, char **token)
{
	json_cur c = {body, body + len, false};
	cachew_err rv = CACHEW_OK;

	*token = NULL;
	if (!json_eat(&c, '{'))
		c.bad = true;
	if (!c.bad && !json_eat(&c, '}')) {
		do {
			char *k = json_string(&c);
			if (k == NULL || !json_eat(&c, ':')) {
				free(k);
				c.bad = true;
				break;
			}
			if (strcmp(k, "items") == 0) {
				if (!json_eat(&c, '['))
					c.bad = true;
				else if (!json_eat(&c, ']')) {
					do
						rv = gcs_parse_item(&c, bucket, v, n, cap);
					while (rv == CACHEW_OK && !c.bad &&
					    json_eat(&c, ','));
					if (!c.bad && !json_eat(&c, ']'))
						c.bad = true;
				}
			} else if (strcmp(k, "nextPageToken") == 0) {
				free(*token);
				*token = json_string(&c);
			} else {
				json_skip(&c, 1);
			}
			free(k);
		} while (rv == CACHEW_OK && !c.bad && json_eat(&c, ','));
	}
	if (rv == CACHEW_OK && c.bad)
		rv = cwi_fail(CACHEW_EPROTO,
		    "%s: malformed JSON in the listing near byte %zu", display,
		    (size_t)(c.p - body));
	if (rv != CACHEW_OK) {
		free(*token);
		*token = NULL;
	}
	return rv;
}

cachew_err
cwi_gcs_list(const char *bucket, const char *prefix, const cwi_io_opts *opts,
    cwi_io_entry **v, size_t *n, size_t *cap)
{
	char *token = NULL, *display;
	size_t eplen;
	const char *ep = gcs_endpoint(&eplen);
	cachew_err rv = CACHEW_OK;

	display = cwi_asprintf("gs://%s/%s", bucket, prefix);
	if (display == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (;;) {
		cwi_http_req req = {0};
		cwi_strbuf q;
		char *url = NULL, *body = NULL, *next = NULL;
		size_t len = 0;

		cwi_strbuf_init(&q);
		cwi_strbuf_append(&q, ep, eplen);
		cwi_strbuf_puts(&q, "/storage/v1/b/");
		cwi_io_urlencode(&q, bucket, false);
		cwi_strbuf_puts(&q, "/o?prefix=");
		cwi_io_urlencode(&q, prefix, false);
		if (token != NULL) {
			cwi_strbuf_puts(&q, "&pageToken=");
			cwi_io_urlencode(&q, token, false);
		}
		rv = cwi_strbuf_finish(&q, &url, NULL);
		if (rv == CACHEW_OK) {
			rv = gcs_req(url, &req);
			if (rv == CACHEW_OK)
				rv = cwi_http_get_small(display, &req,
				    LIST_PAGE_MAX, opts, &body, &len);
			else
				cwi_http_req_free(&req);
		}
		if (rv == CACHEW_OK)
			rv = gcs_parse_page(display, bucket, body, len, v, n, cap,
			    &next);
		free(url);
		free(body);
		free(token);
		token = next;
		if (rv != CACHEW_OK || token == NULL || *token == '\0')
			break;
	}
	free(token);
	free(display);
	return rv;
}
