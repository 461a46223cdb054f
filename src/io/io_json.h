/*
 * io_json.h - replies in JSON from outside services (the GCS JSON API's
 * listings, the Kubernetes API server's Scale and Status objects), read
 * with jansson, Debian's libjansson.
 *
 * Why jansson rather than json-c: it is strict by default (one RFC 8259
 * document and nothing after it, UTF-8 validated, integers that do not
 * fit in 64 bits refused instead of saturated), it rejects duplicate keys
 * on request, it refuses "\u0000" inside strings, it reads a buffer of
 * given length without a terminating NUL, its nesting is capped
 * (JSON_PARSER_MAX_DEPTH, 2048), and its errors carry line, column and
 * byte offset. Values have exact types, so a field of the wrong type is
 * seen as such rather than converted.
 *
 * Thread safety: jansson keeps no mutable global state after its hash
 * seed is set (once, atomically); a parsed document belongs to its caller.
 */
#ifndef CWI_IO_JSON_H
#define CWI_IO_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Parses body[0, len) (NUL not required) as one JSON document. Returns a
 * new reference (json_decref when done), or NULL with the reason in why:
 * "line L, column C (byte B): <jansson's text>". */
json_t *cwi_json_parse(const char *body, size_t len, char *why,
    size_t whylen);

/*
 * The member at `path` (member names joined by '.', as "status.replicas")
 * of the object `root`, borrowed from root. NULL when a member on the way
 * is absent (why says which) or is not an object, or when the member is
 * not of `type` (why names the field and the type found). *absent is set
 * when the only problem is that the member (or an object on its way) is
 * missing, so optional fields can be told from wrong ones. A JSON integer
 * is accepted where JSON_INTEGER is asked and a true or false where
 * JSON_TRUE is asked.
 */
json_t *cwi_json_member(json_t *root, const char *path, json_type type,
    bool *absent, char *why, size_t whylen);

/* The JSON type's name as a reply's reader says it ("a string", ...). */
const char *cwi_json_type_name(const json_t *v);

#endif /* CWI_IO_JSON_H */
