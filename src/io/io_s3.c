/*
 * io_s3.c - s3://bucket/key: Amazon S3 and S3-compatible stores. Requests
 * are signed with AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4,
 * "aws:amz:<region>:s3") with the x-amz-content-sha256 header of an empty
 * body; globs are expanded with ListObjectsV2, page by page.
 *
 * Environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
 * (sent as x-amz-security-token), AWS_REGION (then AWS_DEFAULT_REGION,
 * default us-east-1), AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (a custom
 * endpoint, addressed path-style unless CACHEW_S3_ADDRESSING=virtual).
 */
#include "io.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>

/* SHA-256 of the empty body: every request here is a GET. */
#define EMPTY_SHA256                                                          \
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/* A ListObjectsV2 page of 1000 keys is about 350 KB of XML. */
#define LIST_PAGE_MAX (16u << 20)

static const char *
env_nonempty(const char *name)
{
	const char *v = getenv(name);
	return v != NULL && *v != '\0' ? v : NULL;
}

static const char *
s3_region(void)
{
	const char *r = env_nonempty("AWS_REGION");
	if (r == NULL)
		r = env_nonempty("AWS_DEFAULT_REGION");
	return r != NULL ? r : "us-east-1";
}

/* Appends the URL of the bucket (no trailing slash) to sb. */
static void
s3_bucket_url(cwi_strbuf *sb, const char *bucket)
{
	const char *ep = env_nonempty("AWS_ENDPOINT_URL_S3");
	const char *style = env_nonempty("CACHEW_S3_ADDRESSING");
	const char *region = s3_region();

	if (ep == NULL)
		ep = env_nonempty("AWS_ENDPOINT_URL");
	if (ep == NULL) {
		if (strcmp(region, "us-east-1") == 0)
			cwi_strbuf_printf(sb, "https://%s.s3.amazonaws.com", bucket);
		else
			cwi_strbuf_printf(sb, "https://%s.s3.%s.amazonaws.com",
			    bucket, region);
		return;
	}
	size_t eplen = strlen(ep);
	while (eplen > 0 && ep[eplen - 1] == '/')
		eplen--;
	if (style != NULL && strcmp(style, "virtual") == 0) {
		/* scheme://bucket.host[:port] */
		const char *host = strstr(ep, "://");
		size_t scheme = host != NULL ? (size_t)(host - ep) + 3 : 0;
		cwi_strbuf_append(sb, ep, scheme);
		cwi_strbuf_printf(sb, "%s.", bucket);
		cwi_strbuf_append(sb, ep + scheme, eplen - scheme);
		return;
	}
	cwi_strbuf_append(sb, ep, eplen);
	cwi_strbuf_printf(sb, "/%s", bucket);
}

/* Credentials, region and signing headers; url_tail completes the URL
 * after the bucket ("/key" or "?list-type=2..."). */
static cachew_err
s3_req(const char *display, const char *bucket, const char *url_tail,
    const cwi_io_opts *opts, cwi_http_req *req)
{
	const char *id = env_nonempty("AWS_ACCESS_KEY_ID");
	const char *secret = env_nonempty("AWS_SECRET_ACCESS_KEY");
	const char *token = env_nonempty("AWS_SESSION_TOKEN");
	struct curl_slist *l;
	cwi_strbuf sb;
	char *hdr;
	cachew_err rv;

	(void)opts;
	memset(req, 0, sizeof(*req));
	if (id == NULL || secret == NULL)
		return cwi_fail(CACHEW_EINVAL,
		    "%s: no AWS credentials: set AWS_ACCESS_KEY_ID and "
		    "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
		    "temporary ones)",
		    display);
	cwi_strbuf_init(&sb);
	s3_bucket_url(&sb, bucket);
	cwi_strbuf_puts(&sb, url_tail);
	rv = cwi_strbuf_finish(&sb, &req->url, NULL);
	if (rv != CACHEW_OK)
		return rv;
	req->sigv4 = cwi_asprintf("aws:amz:%s:s3", s3_region());
	req->user = cwi_strdup(id);
	req->secret = cwi_strdup(secret);
	if (req->sigv4 == NULL || req->user == NULL || req->secret == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l = curl_slist_append(NULL, "x-amz-content-sha256: " EMPTY_SHA256);
	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	req->headers = l;
	if (token != NULL) {
		hdr = cwi_asprintf("x-amz-security-token: %s", token);
		l = hdr != NULL ? curl_slist_append(req->headers, hdr) : NULL;
		free(hdr);
		if (l == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		req->headers = l;
	}
	return CACHEW_OK;
}

cachew_err
cwi_s3_request(const char *url, const cwi_io_opts *opts, cwi_http_req *req)
{
	char *bucket = NULL, *key = NULL, *tail = NULL;
	cwi_strbuf sb;
	cachew_err rv;

	rv = cwi_io_split_bucket(url, 5, &bucket, &key);
	if (rv != CACHEW_OK)
		return rv;
	if (*key == '\0') {
		rv = cwi_fail(CACHEW_EINVAL, "%s: no object key after the bucket",
		    url);
		goto done;
	}
	cwi_strbuf_init(&sb);
	cwi_strbuf_puts(&sb, "/");
	cwi_io_urlencode(&sb, key, true);
	rv = cwi_strbuf_finish(&sb, &tail, NULL);
	if (rv == CACHEW_OK)
		rv = s3_req(url, bucket, tail, opts, req);
done:
	free(bucket);
	free(key);
	free(tail);
	return rv;
}

/* ---- ListObjectsV2 ------------------------------------------------------------ */

/* The text of the first <tag>...</tag> in [s, end), or NULL. */
static const char *
xml_find(const char *s, const char *end, const char *tag, size_t *len,
    const char **after)
{
	char open[64], close[64];
	size_t ol, cl;
	const char *a, *b;

	ol = (size_t)snprintf(open, sizeof(open), "<%s>", tag);
	cl = (size_t)snprintf(close, sizeof(close), "</%s>", tag);
	a = memmem(s, (size_t)(end - s), open, ol);
	if (a == NULL)
		return NULL;
	a += ol;
	b = memmem(a, (size_t)(end - a), close, cl);
	if (b == NULL)
		return NULL;
	*len = (size_t)(b - a);
	if (after != NULL)
		*after = b + cl;
	return a;
}

/* Decodes the five XML entities and numeric references; NULL on ENOMEM. */
static char *
xml_text(const char *s, size_t len)
{
	char *out = malloc(len + 1), *o = out;
	size_t i = 0;

	if (out == NULL)
		return NULL;
	while (i < len) {
		static const struct {
			const char *ent;
			char c;
		} ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'},
		    {"&quot;", '"'}, {"&apos;", '\''}};
		bool done = false;
		if (s[i] == '&') {
			for (size_t k = 0; k < 5 && !done; k++) {
				size_t el = strlen(ents[k].ent);
				if (len - i >= el && memcmp(s + i, ents[k].ent, el) == 0) {
					*o++ = ents[k].c;
					i += el;
					done = true;
				}
			}
			if (!done && len - i > 3 && s[i + 1] == '#') {
				char *e;
				bool hex = s[i + 2] == 'x';
				unsigned long v = strtoul(s + i + 2 + hex, &e, hex ? 16 : 10);
				if (e < s + len && *e == ';' && v > 0 && v < 128) {
					*o++ = (char)v;
					i = (size_t)(e - s) + 1;
					done = true;
				}
			}
		}
		if (!done)
			*o++ = s[i++];
	}
	*o = '\0';
	return out;
}

/* Adds the <Contents> of one page; sets *token to the next continuation
 * token (NULL on the last page). */
static cachew_err
s3_parse_page(const char *display, const char *bucket, const char *xml,
    size_t len, cwi_io_entry **v, size_t *n, size_t *cap, char **token)
{
	const char *end = xml + len, *p = xml, *c, *f;
	size_t clen, flen;
	cachew_err rv = CACHEW_OK;

	*token = NULL;
	if (memmem(xml, len, "<ListBucketResult", 17) == NULL)
		return cwi_fail(CACHEW_EPROTO,
		    "%s: the listing is not a ListBucketResult", display);
	while (rv == CACHEW_OK &&
	       (c = xml_find(p, end, "Contents", &clen, &p)) != NULL) {
		char *key = NULL, *etag = NULL, *url = NULL;
		int64_t size = -1;
		f = xml_find(c, c + clen, "Key", &flen, NULL);
		if (f == NULL)
			continue;
		key = xml_text(f, flen);
		f = xml_find(c, c + clen, "ETag", &flen, NULL);
		if (f != NULL)
			etag = xml_text(f, flen);
		f = xml_find(c, c + clen, "Size", &flen, NULL);
		if (f != NULL && flen < 24) {
			char num[24];
			memcpy(num, f, flen);
			num[flen] = '\0';
			size = strtoll(num, NULL, 10);
		}
		url = key != NULL ? cwi_asprintf("s3://%s/%s", bucket, key) : NULL;
		rv = url != NULL ? cwi_io_entry_push(v, n, cap, url, size, etag)
				 : cwi_fail(CACHEW_ENOMEM, "out of memory");
		free(key);
		free(etag);
		free(url);
	}
	if (rv != CACHEW_OK)
		return rv;
	f = xml_find(xml, end, "IsTruncated", &flen, NULL);
	if (f == NULL || flen != 4 || memcmp(f, "true", 4) != 0)
		return CACHEW_OK;
	f = xml_find(xml, end, "NextContinuationToken", &flen, NULL);
	if (f == NULL || flen == 0)
		return cwi_fail(CACHEW_EPROTO,
		    "%s: a truncated listing without a NextContinuationToken",
		    display);
	*token = xml_text(f, flen);
	return *token != NULL ? CACHEW_OK
			      : cwi_fail(CACHEW_ENOMEM, "out of memory");
}

cachew_err
cwi_s3_list(const char *bucket, const char *prefix, const cwi_io_opts *opts,
    cwi_io_entry **v, size_t *n, size_t *cap)
{
	char *token = NULL, *display;
	cachew_err rv = CACHEW_OK;

	display = cwi_asprintf("s3://%s/%s", bucket, prefix);
	if (display == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (;;) {
		cwi_http_req req;
		cwi_strbuf q;
		char *tail = NULL, *body = NULL, *next = NULL;
		size_t len = 0;

		/* The query in SigV4 canonical form (names sorted, values
		 * percent-encoded), so curl signs it as it is sent. */
		cwi_strbuf_init(&q);
		cwi_strbuf_puts(&q, "?");
		if (token != NULL) {
			cwi_strbuf_puts(&q, "continuation-token=");
			cwi_io_urlencode(&q, token, false);
			cwi_strbuf_puts(&q, "&");
		}
		cwi_strbuf_printf(&q, "list-type=2&max-keys=%d&prefix=",
		    opts->s3_max_keys > 0 && opts->s3_max_keys <= 1000
			? opts->s3_max_keys
			: 1000);
		cwi_io_urlencode(&q, prefix, false);
		rv = cwi_strbuf_finish(&q, &tail, NULL);
		if (rv == CACHEW_OK) {
			rv = s3_req(display, bucket, tail, opts, &req);
			if (rv == CACHEW_OK)
				rv = cwi_http_get_small(display, &req,
				    LIST_PAGE_MAX, opts, &body, &len);
			else
				cwi_http_req_free(&req);
		}
		if (rv == CACHEW_OK)
			rv = s3_parse_page(display, bucket, body, len, v, n, cap,
			    &next);
		free(tail);
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
