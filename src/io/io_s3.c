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
#include <expat.h>
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

/*
 * A page is read with expat (Debian's libexpat), a streaming parser: the
 * reply is never held as a tree, only the text of the one element being
 * read. Why expat rather than libxml2: five elements are wanted
 * (ListBucketResult/Contents/{Key,Size,ETag}, IsTruncated,
 * NextContinuationToken), which a SAX reader takes in one pass; expat has
 * no network or file access to turn off, carries billion-laughs
 * protection, and is fuzzed continuously upstream. A page with a DOCTYPE
 * is refused outright (S3 sends none), so no entity is ever declared.
 */

/* S3 keys are at most 1024 bytes; continuation tokens are opaque but
 * short. A longer text is a broken reply, not a key. */
#define S3_TEXT_MAX 8192u
/* ListBucketResult > Contents > Key is 3 deep; Owner > ID is 4. */
#define S3_DEPTH_MAX 16u

typedef enum s3_field {
	S3_NONE,
	S3_KEY,
	S3_SIZE,
	S3_ETAG,
	S3_TRUNCATED,
	S3_TOKEN,
} s3_field;

static const char *const s3_field_name[] = {
    "", "Key", "Size", "ETag", "IsTruncated", "NextContinuationToken",
};

typedef struct s3_page {
	XML_Parser xp;
	const char *display, *bucket;
	cwi_io_entry **v;
	size_t *n, *cap;
	cachew_err rv;          /* the first failure; parsing stops there */
	unsigned depth;
	size_t contents;        /* <Contents> seen, for messages */
	bool in_contents;
	s3_field field;         /* whose text is being read */
	cwi_strbuf text;
	char *key, *etag;       /* of the current <Contents> */
	int64_t size;
	bool have_size;
	char *truncated, *token;
} s3_page;

static void
s3_stop(s3_page *p, cachew_err rv)
{
	if (p->rv == CACHEW_OK)
		p->rv = rv;
	XML_StopParser(p->xp, XML_FALSE);
}

/* The field an element opens at this depth, or S3_NONE. */
static s3_field
s3_field_of(const s3_page *p, const char *name)
{
	if (p->depth == 3 && p->in_contents) {
		if (strcmp(name, "Key") == 0)
			return S3_KEY;
		if (strcmp(name, "Size") == 0)
			return S3_SIZE;
		if (strcmp(name, "ETag") == 0)
			return S3_ETAG;
	} else if (p->depth == 2) {
		if (strcmp(name, "IsTruncated") == 0)
			return S3_TRUNCATED;
		if (strcmp(name, "NextContinuationToken") == 0)
			return S3_TOKEN;
	}
	return S3_NONE;
}

static void XMLCALL
s3_on_start(void *arg, const XML_Char *name, const XML_Char **attrs)
{
	s3_page *p = arg;

	(void)attrs;
	/* Expat may still call back after a stop. */
	if (p->rv != CACHEW_OK)
		return;
	if (p->field != S3_NONE) {
		s3_stop(p, cwi_fail(CACHEW_EPROTO, "%s: listing: <%s> holds an "
		    "element <%.64s>", p->display, s3_field_name[p->field], name));
		return;
	}
	if (++p->depth > S3_DEPTH_MAX) {
		s3_stop(p, cwi_fail(CACHEW_EPROTO, "%s: listing: elements nested "
		    "deeper than %u", p->display, S3_DEPTH_MAX));
		return;
	}
	if (p->depth == 1 && strcmp(name, "ListBucketResult") != 0) {
		s3_stop(p, cwi_fail(CACHEW_EPROTO, "%s: the listing is <%.64s>, "
		    "not a <ListBucketResult>", p->display, name));
		return;
	}
	if (p->depth == 2 && strcmp(name, "Contents") == 0) {
		p->in_contents = true;
		p->contents++;
		p->have_size = false;
		p->size = -1;
		return;
	}
	p->field = s3_field_of(p, name);
	cwi_strbuf_free(&p->text);
	cwi_strbuf_init(&p->text);
}

static void XMLCALL
s3_on_text(void *arg, const XML_Char *s, int len)
{
	s3_page *p = arg;

	if (p->rv != CACHEW_OK)
		return;
	if (p->field == S3_NONE || len <= 0)
		return;
	if (p->text.len + (size_t)len > S3_TEXT_MAX) {
		s3_stop(p, cwi_fail(CACHEW_EPROTO, "%s: listing: <%s> of "
		    "<Contents> #%zu longer than %u bytes", p->display,
		    s3_field_name[p->field], p->contents, S3_TEXT_MAX));
		return;
	}
	cwi_strbuf_append(&p->text, s, (size_t)len);
}

/* The end of <Contents>: its object becomes an entry. */
static cachew_err
s3_contents_done(s3_page *p)
{
	char *url;
	cachew_err rv;

	if (p->key == NULL)
		return cwi_fail(CACHEW_EPROTO, "%s: listing: <Contents> #%zu has "
		    "no <Key>", p->display, p->contents);
	url = cwi_asprintf("s3://%s/%s", p->bucket, p->key);
	rv = url != NULL ? cwi_io_entry_push(p->v, p->n, p->cap, url, p->size,
			       p->etag)
			 : cwi_fail(CACHEW_ENOMEM, "out of memory");
	free(url);
	free(p->key);
	free(p->etag);
	p->key = p->etag = NULL;
	return rv;
}

/* The end of a field's element: its text goes where it belongs. */
static cachew_err
s3_field_done(s3_page *p)
{
	s3_field f = p->field;
	char **slot = f == S3_KEY ? &p->key : f == S3_ETAG ? &p->etag
	    : f == S3_TRUNCATED ? &p->truncated : &p->token;
	char *text;

	p->field = S3_NONE;
	if (cwi_strbuf_finish(&p->text, &text, NULL) != CACHEW_OK)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_strbuf_init(&p->text);
	if (f == S3_SIZE) {
		bool ok = !p->have_size && cwi_io_parse_size(text, &p->size);
		cachew_err rv = ok ? CACHEW_OK
		    : cwi_fail(CACHEW_EPROTO, "%s: listing: <Size> \"%.40s\" of "
		      "<Contents> #%zu is %s", p->display, text, p->contents,
		      p->have_size ? "its second" : "not a byte count");
		p->have_size = true;
		free(text);
		return rv;
	}
	if (*slot != NULL || (f == S3_KEY && *text == '\0')) {
		const char *what = *slot != NULL ? "a second" : "an empty";
		free(text);
		if (!p->in_contents)
			return cwi_fail(CACHEW_EPROTO, "%s: listing: %s <%s>",
			    p->display, what, s3_field_name[f]);
		return cwi_fail(CACHEW_EPROTO, "%s: listing: %s <%s> in "
		    "<Contents> #%zu", p->display, what, s3_field_name[f],
		    p->contents);
	}
	*slot = text;
	return CACHEW_OK;
}

static void XMLCALL
s3_on_end(void *arg, const XML_Char *name)
{
	s3_page *p = arg;
	cachew_err rv = CACHEW_OK;

	if (p->rv != CACHEW_OK)
		return;
	if (p->field != S3_NONE)
		rv = s3_field_done(p);
	else if (p->depth == 2 && p->in_contents &&
	    strcmp(name, "Contents") == 0) {
		p->in_contents = false;
		rv = s3_contents_done(p);
	}
	p->depth--;
	if (rv != CACHEW_OK)
		s3_stop(p, rv);
}

static void XMLCALL
s3_on_doctype(void *arg, const XML_Char *name, const XML_Char *sysid,
    const XML_Char *pubid, int has_internal_subset)
{
	s3_page *p = arg;

	(void)name;
	(void)sysid;
	(void)pubid;
	(void)has_internal_subset;
	s3_stop(p, cwi_fail(CACHEW_EPROTO, "%s: listing: a DOCTYPE "
	    "declaration (a ListObjectsV2 reply has none)", p->display));
}

/* After the whole page: is there another one? */
static cachew_err
s3_page_next(s3_page *p, char **token)
{
	if (p->truncated == NULL || strcmp(p->truncated, "false") == 0)
		return CACHEW_OK;
	if (strcmp(p->truncated, "true") != 0)
		return cwi_fail(CACHEW_EPROTO, "%s: listing: <IsTruncated> is "
		    "\"%.40s\", not true or false", p->display, p->truncated);
	if (p->token == NULL || *p->token == '\0')
		return cwi_fail(CACHEW_EPROTO, "%s: a truncated listing without "
		    "a NextContinuationToken", p->display);
	*token = p->token;
	p->token = NULL;
	return CACHEW_OK;
}

cachew_err
cwi_s3_parse_page(const char *display, const char *bucket, const char *xml,
    size_t len, cwi_io_entry **v, size_t *n, size_t *cap, char **token)
{
	s3_page p = {.display = display, .bucket = bucket, .v = v, .n = n,
	    .cap = cap};
	cachew_err rv;

	*token = NULL;
	if (len > LIST_PAGE_MAX)
		return cwi_fail(CACHEW_EPROTO, "%s: a listing page of %zu bytes "
		    "(at most %u)", display, len, LIST_PAGE_MAX);
	p.xp = XML_ParserCreate("UTF-8");
	if (p.xp == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_strbuf_init(&p.text);
	XML_SetUserData(p.xp, &p);
	XML_SetElementHandler(p.xp, s3_on_start, s3_on_end);
	XML_SetCharacterDataHandler(p.xp, s3_on_text);
	XML_SetStartDoctypeDeclHandler(p.xp, s3_on_doctype);
	if (XML_Parse(p.xp, xml, (int)len, XML_TRUE) != XML_STATUS_OK &&
	    p.rv == CACHEW_OK)
		p.rv = cwi_fail(CACHEW_EPROTO, "%s: the listing is not XML: %s "
		    "at line %lu, column %lu", display,
		    XML_ErrorString(XML_GetErrorCode(p.xp)),
		    (unsigned long)XML_GetCurrentLineNumber(p.xp),
		    (unsigned long)XML_GetCurrentColumnNumber(p.xp));
	rv = p.rv == CACHEW_OK ? s3_page_next(&p, token) : p.rv;
	XML_ParserFree(p.xp);
	cwi_strbuf_free(&p.text);
	free(p.key);
	free(p.etag);
	free(p.truncated);
	free(p.token);
	return rv;
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
			rv = cwi_s3_parse_page(display, bucket, body, len, v, n,
			    cap, &next);
		if (rv == CACHEW_OK)
			rv = cwi_io_token_check(display, token, next);
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
