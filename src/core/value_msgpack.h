/*
 * value_msgpack.h - the msgpack codec of values (cwi_value), shared by the
 * graph format (docs/graph-format.md) and the wire protocol.
 *
 * Mapping: nil, bool, int (every width; a uint64 above INT64_MAX is
 * refused), float32/float64 (floats are always written as float64), str,
 * array (a list), map (string keys, written sorted) and ext type 1, whose
 * payload is one msgpack array: a tuple, the list written with
 * parentheses. bin and every other ext type are refused. Every NaN
 * decodes as the quiet NaN the pipeline syntax writes as `nan`.
 *
 * The encoder is canonical: the smallest header for every length and
 * integer, so equal values give equal bytes.
 */
#ifndef CWI_VALUE_MSGPACK_H
#define CWI_VALUE_MSGPACK_H

#include "core.h"

/* The msgpack ext type that marks a tuple. */
#define CWI_MSGPACK_EXT_TUPLE 1

/* Appends the canonical encoding of v to out. CACHEW_ERANGE for a value
 * nested deeper than CWI_VALUE_MAX_DEPTH or a string or container too
 * large for msgpack; CACHEW_ENOMEM when out ran out of memory. */
cachew_err cwi_value_to_msgpack(const cwi_value *v, cwi_strbuf *out);

/* Decodes one value from the first bytes of buf (len bytes) into *out and
 * stores the number of bytes it took in *used (which may be less than len).
 * Containers may nest max_depth levels (a scalar is depth 0). Hostile input
 * is expected: every length and count is checked against the bytes that
 * remain before anything is allocated. Errors are CACHEW_EPARSE with
 * "msgpack: <what> at byte <offset>" (CACHEW_ENOMEM when memory runs out);
 * *out is left NIL on failure. */
cachew_err cwi_value_from_msgpack(const uint8_t *buf, size_t len,
    size_t *used, cwi_value *out, unsigned max_depth);

/* Header writers for encoders that stream a document around values. */
void cwi_msgpack_put_array(cwi_strbuf *sb, size_t n);
void cwi_msgpack_put_map(cwi_strbuf *sb, size_t n);
void cwi_msgpack_put_str(cwi_strbuf *sb, const char *s, size_t len);
void cwi_msgpack_put_int(cwi_strbuf *sb, int64_t i);

/* Writers of the msgpack types values do not use, for binary documents
 * (element payloads, docs/cache-format.md). put_uint picks the smallest
 * unsigned encoding (a positive fixint up to 127). put_bin writes the
 * smallest bin header for len (bin8/16/32) then the bytes;
 * put_bin_header writes the header alone, for a payload appended next. */
void cwi_msgpack_put_uint(cwi_strbuf *sb, uint64_t u);
void cwi_msgpack_put_bin(cwi_strbuf *sb, const void *data, size_t len);
void cwi_msgpack_put_bin_header(cwi_strbuf *sb, size_t len);
/* Bytes that put_bin_header writes for len: 2, 3 or 5. */
static inline size_t
cwi_msgpack_bin_header_size(size_t len)
{
	return len <= 0xff ? 2 : len <= 0xffff ? 3 : 5;
}

/*
 * A bounded cursor over msgpack bytes, for decoders of fixed document
 * shapes that need bin payloads in place (the element codec). Each getter
 * reads one item of the named type at c->pos and advances past it, or
 * returns false with c->pos unchanged when the bytes there are not that
 * type or are truncated; the caller words the error. Nothing allocates;
 * counts and lengths are only checked against the bytes that remain where
 * the function says so.
 */
typedef struct cwi_mp_cursor {
	const uint8_t *buf;
	size_t len;
	size_t pos;
} cwi_mp_cursor;

/* An array header; *n is the declared count, not checked. */
bool cwi_mp_get_array(cwi_mp_cursor *c, uint64_t *n);
/* A non-negative integer in any encoding. */
bool cwi_mp_get_uint(cwi_mp_cursor *c, uint64_t *v);
/* An integer in any encoding that fits int64_t. */
bool cwi_mp_get_int(cwi_mp_cursor *c, int64_t *v);
/* A bin (bin8/16/32) whose payload lies within the input: *off is its
 * offset in c->buf and *len its length. */
bool cwi_mp_get_bin(cwi_mp_cursor *c, size_t *off, size_t *len);
/* A str (fixstr/str8/16/32) within the input, like cwi_mp_get_bin. */
bool cwi_mp_get_str(cwi_mp_cursor *c, size_t *off, size_t *len);

#endif /* CWI_VALUE_MSGPACK_H */
