/*
 * exec_state.c - the writer and reader of iterator states (exec_state.h)
 * and the wrapper's part of every iterator's state: [op, ended, body].
 */
#include "exec_state.h"
#include "../core/element_codec.h"

#include <stdarg.h>
#include <stdio.h>

/* ---- writer ----------------------------------------------------------- */

void
cwi_sw_array(cwi_state_writer *w, size_t n)
{
	cwi_msgpack_put_array(&w->sb, n);
}

void
cwi_sw_uint(cwi_state_writer *w, uint64_t v)
{
	cwi_msgpack_put_uint(&w->sb, v);
}

void
cwi_sw_int(cwi_state_writer *w, int64_t v)
{
	cwi_msgpack_put_int(&w->sb, v);
}

void
cwi_sw_bool(cwi_state_writer *w, bool v)
{
	cwi_msgpack_put_uint(&w->sb, v ? 1 : 0);
}

void
cwi_sw_str(cwi_state_writer *w, const char *s)
{
	cwi_msgpack_put_str(&w->sb, s, strlen(s));
}

cachew_err
cwi_sw_element(cwi_state_writer *w, const cwi_element *e)
{
	cachew_err rv = cwi_element_encode(e, &w->sb);

	if (rv != CACHEW_OK)
		return cwi_fail(rv, "iterator state: a buffered element "
				    "cannot be encoded: %s",
		    cwi_errmsg_get());
	return CACHEW_OK;
}

cachew_err
cwi_sw_elements(cwi_state_writer *w, cwi_element *const *v, size_t n)
{
	cachew_err rv = CACHEW_OK;

	cwi_msgpack_put_array(&w->sb, n);
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++)
		rv = cwi_sw_element(w, v[i]);
	return rv;
}

/* ---- reader ------------------------------------------------------------ */

void
cwi_sr_init(cwi_state_reader *r, const void *buf, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->c.buf = buf;
	r->c.len = len;
}

bool
cwi_sr_fail(cwi_state_reader *r, cachew_err err, const char *fmt, ...)
{
	char what[384];
	va_list ap;

	if (r->err != CACHEW_OK)
		return false;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	r->err = err;
	snprintf(r->errmsg, sizeof(r->errmsg),
	    "iterator state: %s%s%s at byte %zu", r->op != NULL ? r->op : "",
	    r->op != NULL ? ": " : "", what, r->c.pos);
	return false;
}

/* A failure to read `what`: the bytes end, or are of another type. */
static bool
sr_bad(cwi_state_reader *r, const char *what, const char *wanted)
{
	if (r->c.pos >= r->c.len)
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: the state ends where %s was expected", what, wanted);
	return cwi_sr_fail(r, CACHEW_ECORRUPT,
	    "%s: expected %s, found byte 0x%02x", what, wanted,
	    r->c.buf[r->c.pos]);
}

bool
cwi_sr_count(cwi_state_reader *r, const char *what, uint64_t *n, uint64_t max)
{
	size_t at = r->c.pos;

	if (r->err != CACHEW_OK)
		return false;
	if (!cwi_mp_get_array(&r->c, n))
		return sr_bad(r, what, "an array");
	/* Every item takes a byte at least. */
	if (*n > max || *n > r->c.len - r->c.pos) {
		r->c.pos = at;
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: %llu items, more than %s", what,
		    (unsigned long long)*n,
		    *n > max ? "allowed" : "the bytes left hold");
	}
	return true;
}

bool
cwi_sr_array(cwi_state_reader *r, const char *what, uint64_t n)
{
	size_t at = r->c.pos;
	uint64_t got;

	if (r->err != CACHEW_OK)
		return false;
	if (!cwi_mp_get_array(&r->c, &got))
		return sr_bad(r, what, "an array");
	if (got != n) {
		r->c.pos = at;
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: an array of %llu items, expected %llu", what,
		    (unsigned long long)got, (unsigned long long)n);
	}
	return true;
}

bool
cwi_sr_uint(cwi_state_reader *r, const char *what, uint64_t *v, uint64_t max)
{
	size_t at = r->c.pos;

	if (r->err != CACHEW_OK)
		return false;
	if (!cwi_mp_get_uint(&r->c, v))
		return sr_bad(r, what, "an unsigned integer");
	if (*v > max) {
		r->c.pos = at;
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: %llu is over its limit %llu", what,
		    (unsigned long long)*v, (unsigned long long)max);
	}
	return true;
}

bool
cwi_sr_int(cwi_state_reader *r, const char *what, int64_t *v, int64_t min,
    int64_t max)
{
	size_t at = r->c.pos;

	if (r->err != CACHEW_OK)
		return false;
	if (!cwi_mp_get_int(&r->c, v))
		return sr_bad(r, what, "an integer");
	if (*v < min || *v > max) {
		r->c.pos = at;
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: %lld is outside [%lld, %lld]", what, (long long)*v,
		    (long long)min, (long long)max);
	}
	return true;
}

bool
cwi_sr_bool(cwi_state_reader *r, const char *what, bool *v)
{
	uint64_t u = 0;

	if (!cwi_sr_uint(r, what, &u, 1))
		return false;
	*v = u != 0;
	return true;
}

bool
cwi_sr_str(cwi_state_reader *r, const char *what, char *buf, size_t cap)
{
	size_t at = r->c.pos, off, len;

	if (r->err != CACHEW_OK)
		return false;
	if (!cwi_mp_get_str(&r->c, &off, &len))
		return sr_bad(r, what, "a string");
	if (len >= cap) {
		r->c.pos = at;
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s: a string of %zu bytes, longer than %zu", what, len,
		    cap - 1);
	}
	memcpy(buf, r->c.buf + off, len);
	buf[len] = '\0';
	return true;
}

bool
cwi_sr_elements(cwi_state_reader *r, const char *what, cwi_chunk *out)
{
	uint64_t n;
	cachew_err rv;

	if (!cwi_sr_count(r, what, &n, UINT32_MAX))
		return false;
	rv = cwi_chunk_reserve(out, (size_t)n);
	if (rv != CACHEW_OK)
		return cwi_sr_fail(r, rv, "%s: out of memory for %llu elements",
		    what, (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		cwi_element *e = NULL;
		size_t at = r->c.pos;
		rv = cwi_element_decode(NULL, r->c.buf, r->c.len, &r->c.pos,
		    &e);
		if (rv != CACHEW_OK) {
			r->c.pos = at;
			return cwi_sr_fail(r, rv, "%s: element %llu: %s", what,
			    (unsigned long long)i, cwi_errmsg_get());
		}
		cwi_chunk_push(out, e);
	}
	return true;
}

/* The size of the item header at buf[0] (len >= 1 bytes): the bytes of
 * the header itself in *hdr, the payload bytes that follow in *payload,
 * the items it contains in *items. False for a byte msgpack leaves
 * unused. */
static bool
mp_header(const uint8_t *buf, size_t len, size_t *hdr, uint64_t *payload,
    uint64_t *items)
{
	uint8_t b = buf[0];
	size_t w = 0;
	uint64_t n = 0;

	*payload = 0;
	*items = 0;
	*hdr = 1;
	if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
		return true;
	if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
		*items = (uint64_t)(b & 0x0f) * ((b & 0xf0) == 0x80 ? 2 : 1);
		return true;
	}
	if ((b & 0xe0) == 0xa0) {
		*payload = b & 0x1f;
		return true;
	}
	switch (b) {
	case 0xcc: case 0xd0: *payload = 1; return true;
	case 0xcd: case 0xd1: *payload = 2; return true;
	case 0xca: case 0xce: case 0xd2: *payload = 4; return true;
	case 0xcb: case 0xcf: case 0xd3: *payload = 8; return true;
	case 0xd4: *payload = 2; return true;
	case 0xd5: *payload = 3; return true;
	case 0xd6: *payload = 5; return true;
	case 0xd7: *payload = 9; return true;
	case 0xd8: *payload = 17; return true;
	case 0xc4: case 0xd9: w = 1; break;
	case 0xc5: case 0xda: case 0xdc: case 0xde: w = 2; break;
	case 0xc6: case 0xdb: case 0xdd: case 0xdf: w = 4; break;
	case 0xc7: w = 1; break;
	case 0xc8: w = 2; break;
	case 0xc9: w = 4; break;
	default: return false;
	}
	if (len < 1 + w)
		return false;
	for (size_t i = 0; i < w; i++)
		n = n << 8 | buf[1 + i];
	*hdr = 1 + w;
	if (b == 0xdc || b == 0xdd)
		*items = n;
	else if (b == 0xde || b == 0xdf)
		*items = 2 * n;
	else if (b >= 0xc7 && b <= 0xc9)
		*payload = n + 1; /* the ext type byte, then the data */
	else
		*payload = n;
	return true;
}

bool
cwi_sr_skip(cwi_state_reader *r, const char *what)
{
	uint64_t pending = 1;

	if (r->err != CACHEW_OK)
		return false;
	while (pending > 0) {
		size_t left = r->c.len - r->c.pos, hdr;
		uint64_t payload, items;

		if (left == 0 || !mp_header(r->c.buf + r->c.pos, left, &hdr,
				     &payload, &items) ||
		    payload > left - hdr)
			return sr_bad(r, what, "a msgpack item");
		r->c.pos += hdr + (size_t)payload;
		pending--;
		/* Every item takes a byte at least. */
		if (items + pending > r->c.len - r->c.pos)
			return cwi_sr_fail(r, CACHEW_ECORRUPT,
			    "%s: %llu items, more than the bytes left hold",
			    what, (unsigned long long)items);
		pending += items;
	}
	return true;
}

void
cwi_sw_unit_cursor(cwi_state_writer *w, const cwi_unit_cursor *c)
{
	cwi_sw_array(w, 2);
	cwi_sw_uint(w, c->i);
	cwi_sw_uint(w, c->next);
}

bool
cwi_sr_unit_cursor(cwi_state_reader *r, cwi_unit_cursor *c)
{
	uint64_t i = 0, next = 0;

	if (!cwi_sr_array(r, "lease cursor", 2) ||
	    !cwi_sr_uint(r, "lease range", &i, c->n) ||
	    !cwi_sr_uint(r, "lease unit", &next, UINT64_MAX))
		return false;
	if (i < c->n && (next < c->ranges[i].begin || next > c->ranges[i].end))
		return cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "lease unit %llu is outside range %llu, [%llu, %llu)",
		    (unsigned long long)next, (unsigned long long)i,
		    (unsigned long long)c->ranges[i].begin,
		    (unsigned long long)c->ranges[i].end);
	c->i = (size_t)i;
	c->next = next;
	return true;
}

/* ---- iterators ----------------------------------------------------------- */

cachew_err
cwi_iter_save(cwi_iter *it, cwi_state_writer *w)
{
	const char *name = it->node->op->name;
	cachew_err bad = it->done != CACHEW_OK ? it->done : it->pending;
	bool ended = bad == CACHEW_EOF;

	if (bad != CACHEW_OK && !ended)
		return cwi_fail(bad,
		    "%s: the iterator failed (%s): there is no position to "
		    "save",
		    name, it->pl->errmsg[0] != '\0' ? it->pl->errmsg
						    : cachew_strerror(bad));
	if (!ended && it->ops->save == NULL)
		return cwi_fail(CACHEW_ENOTSUP,
		    "%s: this operator cannot save its position", name);
	cwi_sw_array(w, 3);
	cwi_sw_str(w, name);
	cwi_sw_bool(w, ended);
	if (ended) {
		/* Its end is all there is to know. */
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	return it->ops->save(it, w);
}

cachew_err
cwi_iter_restore(cwi_iter *it, cwi_state_reader *r)
{
	const char *name = it->node->op->name, *outer = r->op;
	char found[64];
	bool ended = false;
	cachew_err rv;

	if (!cwi_sr_array(r, "operator state", 3) ||
	    !cwi_sr_str(r, "operator name", found, sizeof(found)))
		return cwi_sr_error(r);
	if (strcmp(found, name) != 0) {
		/* Pass-through operators (prefetch, cache) keep their
		 * input's fingerprint: the tree tells them apart. */
		cwi_sr_fail(r, CACHEW_EINVAL,
		    "the state is of another pipeline: expected the state of "
		    "%s, found that of %s", name, found);
		return cwi_sr_error(r);
	}
	r->op = name;
	if (!cwi_sr_bool(r, "ended", &ended)) {
		r->op = outer;
		return cwi_sr_error(r);
	}
	if (ended) {
		if (!cwi_sr_array(r, "state of an ended iterator", 0)) {
			r->op = outer;
			return cwi_sr_error(r);
		}
		it->done = CACHEW_EOF;
		r->op = outer;
		return CACHEW_OK;
	}
	if (it->ops->restore == NULL) {
		cwi_sr_fail(r, CACHEW_ENOTSUP,
		    "this operator cannot restore a position");
		r->op = outer;
		return cwi_sr_error(r);
	}
	rv = it->ops->restore(it, r);
	if (rv != CACHEW_OK && r->err == CACHEW_OK)
		cwi_sr_fail(r, rv, "%s", cwi_errmsg_get()[0] != '\0'
					     ? cwi_errmsg_get()
					     : cachew_strerror(rv));
	r->op = outer;
	return rv != CACHEW_OK ? cwi_sr_error(r) : CACHEW_OK;
}

cachew_err
cwi_iter_recreate(cwi_iter **slot, const cwi_node *node,
    const cwi_iter_args *args, cwi_state_reader *r)
{
	cachew_err rv;

	cwi_iter_destroy(*slot);
	*slot = NULL;
	rv = cwi_iter_create(slot, node, args);
	if (rv != CACHEW_OK) {
		cwi_sr_fail(r, rv, "%s: cannot create the iterator: %s",
		    node->op->name, args->pl->errmsg);
		return cwi_sr_error(r);
	}
	return cwi_iter_restore(*slot, r);
}

/* ---- flat-map sequences --------------------------------------------------- */

/* The most elements a restore skips to reach a sequence's position. */
#define SEQ_SKIP_CHUNK 256

cachew_err
cwi_seq_save(const cwi_seq *s, cwi_state_writer *w)
{
	if (!s->open) {
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	cwi_sw_array(w, 5);
	cwi_sw_uint(w, s->index);
	cwi_sw_uint(w, s->yielded);
	cwi_sw_bool(w, s->eof);
	cwi_sw_uint(w, s->fn->resume != NULL && !s->eof
		? s->fn->resume->tell(s->state) : 0);
	return cwi_sw_elements(w, &s->in, 1);
}

cachew_err
cwi_seq_seek(const cwi_fn *fn, void *seq, uint64_t pos, cwi_state_reader *r)
{
	char err[512] = "";
	cachew_err rv;

	if (fn->resume == NULL)
		return CACHEW_ENOTSUP;
	rv = fn->resume->seek(seq, pos, err, sizeof(err));
	if (rv != CACHEW_OK && rv != CACHEW_ENOTSUP) {
		cwi_sr_fail(r, rv, "%s: %s", fn->name, err);
		return cwi_sr_error(r);
	}
	return rv;
}

/* Reopens the sequence from the element that opened it and passes over
 * the elements it had yielded: a function's sequence is a pure function
 * of its element and index, so the same elements come again. */
static cachew_err
seq_skip(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    uint64_t yielded, cwi_state_reader *r)
{
	cwi_chunk tmp = {0};
	cachew_err rv = CACHEW_OK;

	while (s->yielded < yielded) {
		uint64_t left = yielded - s->yielded;
		rv = cwi_seq_next(s, node, pl, &tmp,
		    left < SEQ_SKIP_CHUNK ? (size_t)left : SEQ_SKIP_CHUNK);
		cwi_chunk_clear(&tmp);
		if (rv != CACHEW_OK)
			break;
	}
	cwi_chunk_free(&tmp);
	if (rv == CACHEW_EOF)
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "%s(%s): the sequence of element %llu ends after %llu "
		    "elements, but the state says %llu were yielded",
		    node->op->name, node->fn->name,
		    (unsigned long long)s->index,
		    (unsigned long long)s->yielded,
		    (unsigned long long)yielded);
	else if (rv != CACHEW_OK)
		cwi_sr_fail(r, rv, "%s", pl->errmsg);
	return rv == CACHEW_OK ? CACHEW_OK : cwi_sr_error(r);
}

cachew_err
cwi_seq_restore(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    uint64_t epoch, cwi_state_reader *r)
{
	uint64_t n = 0, index = 0, yielded = 0, pos = 0;
	cwi_chunk in = {0};
	bool eof = false;
	cachew_err rv;

	cwi_seq_close(s);
	if (!cwi_sr_count(r, "sequence", &n, 5))
		return cwi_sr_error(r);
	if (n == 0)
		return CACHEW_OK;
	if (n != 5) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "sequence: an array of %llu items, expected 0 or 5",
		    (unsigned long long)n);
		return cwi_sr_error(r);
	}
	if (!cwi_sr_uint(r, "sequence index", &index, UINT64_MAX) ||
	    !cwi_sr_uint(r, "sequence yielded", &yielded, UINT64_MAX) ||
	    !cwi_sr_bool(r, "sequence ended", &eof) ||
	    !cwi_sr_uint(r, "sequence position", &pos, UINT64_MAX) ||
	    !cwi_sr_elements(r, "sequence element", &in))
		goto fail;
	if (in.n != 1) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "sequence: %zu opening elements, expected 1", in.n);
		goto fail;
	}
	rv = cwi_seq_open(s, node, pl, epoch, in.v[0], index);
	if (rv != CACHEW_OK) {
		cwi_sr_fail(r, rv, "%s", pl->errmsg);
		goto fail;
	}
	cwi_chunk_free(&in);
	rv = eof ? CACHEW_ENOTSUP : cwi_seq_seek(s->fn, s->state, pos, r);
	if (rv == CACHEW_OK)
		s->yielded = yielded;
	else if (rv != CACHEW_ENOTSUP ||
	    seq_skip(s, node, pl, yielded, r) != CACHEW_OK)
		return cwi_sr_error(r);
	s->eof = s->eof || eof;
	return CACHEW_OK;
fail:
	cwi_chunk_free(&in);
	return cwi_sr_error(r);
}
