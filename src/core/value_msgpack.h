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

#endif /* CWI_VALUE_MSGPACK_H */
