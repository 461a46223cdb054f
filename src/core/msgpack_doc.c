/*
 * msgpack_doc.c - fixed-shape msgpack documents with a sticky, named
 * error (msgpack_doc.h).
 */
#include "msgpack_doc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

void
cwi_mp_doc_init(cwi_mp_doc *d, const char *what, const uint8_t *buf,
    size_t len)
{
	memset(d, 0, sizeof(*d));
	d->c.buf = buf;
	d->c.len = buf != NULL ? len : 0;
	d->what = what;
}

static size_t
enter(cwi_mp_doc *d, const char *name, uint64_t index, bool indexed)
{
	size_t mark = d->depth;

	if (d->depth < CWI_MP_DOC_DEPTH) {
		d->path[d->depth].name = name;
		d->path[d->depth].index = index;
		d->path[d->depth].indexed = indexed;
	}
	d->depth++;
	return mark;
}

size_t
cwi_mp_doc_enter(cwi_mp_doc *d, const char *name)
{
	return enter(d, name, 0, false);
}

size_t
cwi_mp_doc_enter_at(cwi_mp_doc *d, const char *name, uint64_t index)
{
	return enter(d, name, index, true);
}

void
cwi_mp_doc_leave(cwi_mp_doc *d, size_t mark)
{
	d->depth = mark;
}

bool
cwi_mp_doc_fail(cwi_mp_doc *d, cachew_err rv, const char *field,
    const char *fmt, ...)
{
	char text[256];
	cwi_strbuf where;
	va_list ap;

	if (d->rv != CACHEW_OK)
		return false;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	cwi_strbuf_init(&where);
	for (size_t i = 0; i < d->depth && i < CWI_MP_DOC_DEPTH; i++) {
		const cwi_mp_doc_step *s = &d->path[i];
		cwi_strbuf_printf(&where, "%s%s", where.len > 0 ? "." : "",
		    s->name);
		if (s->indexed)
			cwi_strbuf_printf(&where, "[%" PRIu64 "]", s->index);
	}
	if (field != NULL)
		cwi_strbuf_printf(&where, "%s%s", where.len > 0 ? "." : "",
		    field);
	d->rv = rv;
	snprintf(d->msg, sizeof(d->msg), "%s: %.300s%s%s (at byte %zu)",
	    d->what, where.len > 0 && !where.oom ? where.data : "",
	    where.len > 0 ? ": " : "", text, d->c.pos);
	cwi_strbuf_free(&where);
	return false;
}

cachew_err
cwi_mp_doc_error(const cwi_mp_doc *d)
{
	if (d->rv == CACHEW_OK)
		return CACHEW_OK;
	return cwi_fail(d->rv, "%s", d->msg);
}

/* The failure of a getter: the item there is not what it wants. */
static bool
bad_item(cwi_mp_doc *d, const char *field, const char *want)
{
	if (d->c.pos >= d->c.len)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "truncated: %s expected", want);
	return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
	    "%s expected, found type byte 0x%02x", want, d->c.buf[d->c.pos]);
}

bool
cwi_mp_doc_array(cwi_mp_doc *d, const char *field, uint64_t max,
    uint64_t *n)
{
	*n = 0;
	if (d->rv != CACHEW_OK)
		return false;
	if (!cwi_mp_get_array(&d->c, n))
		return bad_item(d, field, "an array");
	/* Every item takes at least one byte. */
	if (*n > d->c.len - d->c.pos) {
		uint64_t claimed = *n;
		*n = 0;
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " items claimed, %zu bytes left", claimed,
		    d->c.len - d->c.pos);
	}
	if (*n > max) {
		uint64_t claimed = *n;
		*n = 0;
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " items, the limit is %" PRIu64, claimed, max);
	}
	return true;
}

bool
cwi_mp_doc_record(cwi_mp_doc *d, const char *field, uint64_t n)
{
	uint64_t got;

	if (!cwi_mp_doc_array(d, field, UINT64_MAX, &got))
		return false;
	if (got != n)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " fields, %" PRIu64 " expected", got, n);
	return true;
}

bool
cwi_mp_doc_nil(cwi_mp_doc *d)
{
	if (d->rv != CACHEW_OK || d->c.pos >= d->c.len ||
	    d->c.buf[d->c.pos] != 0xc0)
		return false;
	d->c.pos++;
	return true;
}

bool
cwi_mp_doc_u64(cwi_mp_doc *d, const char *field, uint64_t lo, uint64_t hi,
    uint64_t *v)
{
	uint64_t x;

	*v = 0;
	if (d->rv != CACHEW_OK)
		return false;
	if (!cwi_mp_get_uint(&d->c, &x))
		return bad_item(d, field, "an unsigned integer");
	if (x < lo || x > hi)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " is not in %" PRIu64 "..%" PRIu64, x, lo, hi);
	*v = x;
	return true;
}

bool
cwi_mp_doc_u32(cwi_mp_doc *d, const char *field, uint32_t lo, uint32_t hi,
    uint32_t *v)
{
	uint64_t x;
	bool ok = cwi_mp_doc_u64(d, field, lo, hi, &x);

	*v = (uint32_t)x;
	return ok;
}

bool
cwi_mp_doc_i64(cwi_mp_doc *d, const char *field, int64_t lo, int64_t hi,
    int64_t *v)
{
	int64_t x;

	*v = 0;
	if (d->rv != CACHEW_OK)
		return false;
	if (!cwi_mp_get_int(&d->c, &x))
		return bad_item(d, field, "an integer");
	if (x < lo || x > hi)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRId64 " is not in %" PRId64 "..%" PRId64, x, lo, hi);
	*v = x;
	return true;
}

bool
cwi_mp_doc_bool(cwi_mp_doc *d, const char *field, bool *v)
{
	*v = false;
	if (d->rv != CACHEW_OK)
		return false;
	if (d->c.pos >= d->c.len ||
	    (d->c.buf[d->c.pos] != 0xc2 && d->c.buf[d->c.pos] != 0xc3))
		return bad_item(d, field, "a bool");
	*v = d->c.buf[d->c.pos++] == 0xc3;
	return true;
}

bool
cwi_mp_doc_f64(cwi_mp_doc *d, const char *field, double *v)
{
	uint64_t bits = 0;

	*v = 0;
	if (d->rv != CACHEW_OK)
		return false;
	if (d->c.len - d->c.pos < 9 || d->c.buf[d->c.pos] != 0xcb)
		return bad_item(d, field, "a float64");
	for (unsigned i = 1; i <= 8; i++)
		bits = (bits << 8) | d->c.buf[d->c.pos + i];
	d->c.pos += 9;
	memcpy(v, &bits, sizeof(*v));
	return true;
}

/* A str of at most max bytes without NUL, in place. */
static bool
str_at(cwi_mp_doc *d, const char *field, size_t max, size_t *off,
    size_t *len)
{
	*off = *len = 0;
	if (d->rv != CACHEW_OK)
		return false;
	if (!cwi_mp_get_str(&d->c, off, len))
		return bad_item(d, field, "a string");
	if (*len > max)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%zu bytes, the limit is %zu", *len, max);
	if (memchr(d->c.buf + *off, '\0', *len) != NULL)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "a NUL byte inside the string");
	return true;
}

bool
cwi_mp_doc_text(cwi_mp_doc *d, const char *field, char *buf, size_t max)
{
	size_t off, len;

	buf[0] = '\0';
	if (!str_at(d, field, max, &off, &len))
		return false;
	memcpy(buf, d->c.buf + off, len);
	buf[len] = '\0';
	return true;
}

bool
cwi_mp_doc_strdup(cwi_mp_doc *d, const char *field, size_t max,
    bool nullable, char **s)
{
	size_t off, len;

	*s = NULL;
	if (nullable && cwi_mp_doc_nil(d))
		return true;
	if (!str_at(d, field, max, &off, &len))
		return false;
	*s = malloc(len + 1);
	if (*s == NULL)
		return cwi_mp_doc_fail(d, CACHEW_ENOMEM, field, "out of memory");
	memcpy(*s, d->c.buf + off, len);
	(*s)[len] = '\0';
	return true;
}

bool
cwi_mp_doc_bindup(cwi_mp_doc *d, const char *field, size_t max,
    bool nullable, uint8_t **p, size_t *len)
{
	size_t off;

	*p = NULL;
	*len = 0;
	if (nullable && cwi_mp_doc_nil(d))
		return true;
	if (d->rv != CACHEW_OK)
		return false;
	if (!cwi_mp_get_bin(&d->c, &off, len))
		return bad_item(d, field, "a bin");
	if (*len > max) {
		size_t n = *len;
		*len = 0;
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%zu bytes, the limit is %zu", n, max);
	}
	*p = malloc(*len > 0 ? *len : 1);
	if (*p == NULL) {
		*len = 0;
		return cwi_mp_doc_fail(d, CACHEW_ENOMEM, field, "out of memory");
	}
	memcpy(*p, d->c.buf + off, *len);
	return true;
}

bool
cwi_mp_doc_end(cwi_mp_doc *d)
{
	if (d->rv != CACHEW_OK)
		return false;
	if (d->c.pos != d->c.len)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, NULL,
		    "%zu bytes after the end of the document",
		    d->c.len - d->c.pos);
	return true;
}

/* ---- writers ------------------------------------------------------------- */

void
cwi_msgpack_put_nil(cwi_strbuf *sb)
{
	uint8_t b = 0xc0;

	cwi_strbuf_append(sb, &b, 1);
}

void
cwi_msgpack_put_bool(cwi_strbuf *sb, bool v)
{
	uint8_t b = v ? 0xc3 : 0xc2;

	cwi_strbuf_append(sb, &b, 1);
}

void
cwi_msgpack_put_f64(cwi_strbuf *sb, double v)
{
	uint8_t b[9];
	uint64_t bits;

	memcpy(&bits, &v, sizeof(bits));
	b[0] = 0xcb;
	for (unsigned i = 0; i < 8; i++)
		b[1 + i] = (uint8_t)(bits >> (56 - 8 * i));
	cwi_strbuf_append(sb, b, sizeof(b));
}

void
cwi_msgpack_put_cstr(cwi_strbuf *sb, const char *s)
{
	if (s == NULL)
		cwi_msgpack_put_nil(sb);
	else
		cwi_msgpack_put_str(sb, s, strlen(s));
}
