/*
 * io_gcs.c - gs://bucket/object: Google Cloud Storage. Objects are read
 * from <endpoint>/<bucket>/<object> (the XML API's download path, which
 * takes Range), listings come from the JSON API
 * <endpoint>/storage/v1/b/<bucket>/o?prefix=...&pageToken=..., read with
 * jansson (io_json.h): a page that is not one JSON object, or whose
 * items, name, size, etag or nextPageToken has the wrong type, fails with
 * CACHEW_EPROTO naming the field (items[3].size, ...).
 *
 * Environment: GOOGLE_OAUTH_ACCESS_TOKEN (sent as "Authorization: Bearer";
 * without it requests are anonymous, which public buckets allow) and
 * CACHEW_GCS_ENDPOINT (default https://storage.googleapis.com).
 */
#include "io.h"
#include "io_json.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>

#define LIST_PAGE_MAX (16u << 20)

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

/* ---- listing pages ------------------------------------------------------------- */

/* A GCS object size: the JSON API sends a uint64 as a decimal string; an
 * integer is taken too. -1 when absent; false when it is neither. */
static bool
gcs_size(json_t *item, int64_t *size, char *why, size_t whylen)
{
	bool absent;
	json_t *v = json_object_get(item, "size");

	*size = -1;
	if (v == NULL)
		return true;
	if (json_is_integer(v)) {
		*size = json_integer_value(v);
		if (*size >= 0)
			return true;
		snprintf(why, whylen, "size %lld is negative",
		    (long long)*size);
		return false;
	}
	v = cwi_json_member(item, "size", JSON_STRING, &absent, why, whylen);
	if (v == NULL)
		return false;
	if (!cwi_io_parse_size(json_string_value(v), size)) {
		snprintf(why, whylen, "size \"%.40s\" is not a byte count",
		    json_string_value(v));
		return false;
	}
	return true;
}

/* One element of "items": {"name": ..., "size": "12", "etag": ...}. */
static cachew_err
gcs_parse_item(const char *display, const char *bucket, json_t *item,
    size_t index, cwi_io_entry **v, size_t *n, size_t *cap)
{
	char why[200];
	bool absent;
	json_t *name, *etag;
	int64_t size;
	char *url;
	cachew_err rv;

	if (!json_is_object(item))
		return cwi_fail(CACHEW_EPROTO, "%s: listing items[%zu] is %s, "
		    "not an object", display, index, cwi_json_type_name(item));
	name = cwi_json_member(item, "name", JSON_STRING, &absent, why,
	    sizeof(why));
	if (name == NULL)
		goto bad;
	if (json_string_length(name) == 0) {
		snprintf(why, sizeof(why), "name is empty");
		goto bad;
	}
	etag = cwi_json_member(item, "etag", JSON_STRING, &absent, why,
	    sizeof(why));
	if (etag == NULL && !absent)
		goto bad;
	if (!gcs_size(item, &size, why, sizeof(why)))
		goto bad;
	url = cwi_asprintf("gs://%s/%s", bucket, json_string_value(name));
	if (url == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_io_entry_push(v, n, cap, url, size,
	    etag != NULL ? json_string_value(etag) : NULL);
	free(url);
	return rv;
bad:
	return cwi_fail(CACHEW_EPROTO, "%s: listing items[%zu]: %s", display,
	    index, why);
}

cachew_err
cwi_gcs_parse_page(const char *display, const char *bucket, const char *body,
    size_t len, cwi_io_entry **v, size_t *n, size_t *cap, char **token)
{
	char why[200];
	bool absent;
	json_t *root, *items, *next;
	cachew_err rv = CACHEW_OK;

	*token = NULL;
	root = cwi_json_parse(body, len, why, sizeof(why));
	if (root == NULL)
		return cwi_fail(CACHEW_EPROTO, "%s: the listing is not JSON: %s",
		    display, why);
	items = cwi_json_member(root, "items", JSON_ARRAY, &absent, why,
	    sizeof(why));
	if (items == NULL && !absent) {
		rv = cwi_fail(CACHEW_EPROTO, "%s: listing: %s", display, why);
		goto done;
	}
	for (size_t i = 0; items != NULL && i < json_array_size(items); i++) {
		rv = gcs_parse_item(display, bucket, json_array_get(items, i), i,
		    v, n, cap);
		if (rv != CACHEW_OK)
			goto done;
	}
	next = cwi_json_member(root, "nextPageToken", JSON_STRING, &absent,
	    why, sizeof(why));
	if (next == NULL && !absent)
		rv = cwi_fail(CACHEW_EPROTO, "%s: listing: %s", display, why);
	else if (next != NULL && json_string_length(next) > 0 &&
	    (*token = cwi_strdup(json_string_value(next))) == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
done:
	json_decref(root);
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
			rv = cwi_gcs_parse_page(display, bucket, body, len, v, n,
			    cap, &next);
		if (rv == CACHEW_OK)
			rv = cwi_io_token_check(display, token, next);
		free(url);
		free(body);
		free(token);
		token = next;
		if (rv != CACHEW_OK || token == NULL)
			break;
	}
	free(token);
	free(display);
	return rv;
}
