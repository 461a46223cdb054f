/*
 * msgpack_doc.h - reading and writing documents of a fixed shape (arrays
 * of known fields, nested) in msgpack, for state that is saved and loaded
 * whole: the dispatcher's snapshot and the scalers inside it.
 *
 * The reader is a cursor (value_msgpack.h) with a sticky error: the first
 * field that is missing, of the wrong type or out of its bounds records a
 * CACHEW_ECORRUPT message naming the document, the path of the field
 * ("jobs[2].ledger.splits[17].gsize") and its byte offset; every later read
 * fails at once and yields zero, so a decoder may read a run of fields and
 * check once. Counts are checked against the bytes that remain (every item
 * takes at least one byte) and a caller's limit before they are returned,
 * so nothing a hostile document claims is allocated unchecked.
 *
 * Thread safety: a cwi_mp_doc is used by one thread at a time.
 */
#ifndef CWI_MSGPACK_DOC_H
#define CWI_MSGPACK_DOC_H

#include "core.h"
#include "value_msgpack.h"

#include <stdarg.h>

/* One step of the path to where the reader is: a field, or an item of
 * an array field. Names are borrowed (string literals). */
typedef struct cwi_mp_doc_step {
	const char *name;
	uint64_t index;
	bool indexed;
} cwi_mp_doc_step;

#define CWI_MP_DOC_DEPTH 16

typedef struct cwi_mp_doc {
	cwi_mp_cursor c;
	const char *what; /* the document's name, first in every message */
	/* Where the reader is ("jobs[2].ledger"): kept as steps and only
	 * written out for a message, as it changes at every item. */
	cwi_mp_doc_step path[CWI_MP_DOC_DEPTH];
	size_t depth;
	cachew_err rv;    /* the first failure; CACHEW_OK while none */
	char msg[640];
} cwi_mp_doc;

void cwi_mp_doc_init(cwi_mp_doc *d, const char *what, const uint8_t *buf,
    size_t len);
/* Enters field `name` (a string literal), or item `index` of array field
 * `name`; returns the depth before, for cwi_mp_doc_leave. Steps beyond
 * CWI_MP_DOC_DEPTH are not shown. */
size_t cwi_mp_doc_enter(cwi_mp_doc *d, const char *name);
size_t cwi_mp_doc_enter_at(cwi_mp_doc *d, const char *name, uint64_t index);
void cwi_mp_doc_leave(cwi_mp_doc *d, size_t mark);
/* Records a failure of `field` (under the current path; NULL: the path
 * itself) unless one is recorded; returns false. rv CACHEW_ECORRUPT
 * for what the document says, CACHEW_ENOMEM when memory ran out. */
bool cwi_mp_doc_fail(cwi_mp_doc *d, cachew_err rv, const char *field,
    const char *fmt, ...) CACHEW_PRINTF(4, 5);
/* Sets this thread's error message from the recorded failure and returns
 * its code (CACHEW_OK when none). */
cachew_err cwi_mp_doc_error(const cwi_mp_doc *d);

/* Getters: each reads the next item as `field`. */
/* An array of exactly n items (a record of n fields). */
bool cwi_mp_doc_record(cwi_mp_doc *d, const char *field, uint64_t n);
/* An array of at most max items (and no more than the bytes left). */
bool cwi_mp_doc_array(cwi_mp_doc *d, const char *field, uint64_t max,
    uint64_t *n);
/* nil: true and the cursor moves past it; anything else: false and the
 * cursor stays (no error recorded). */
bool cwi_mp_doc_nil(cwi_mp_doc *d);
bool cwi_mp_doc_u64(cwi_mp_doc *d, const char *field, uint64_t lo,
    uint64_t hi, uint64_t *v);
bool cwi_mp_doc_u32(cwi_mp_doc *d, const char *field, uint32_t lo,
    uint32_t hi, uint32_t *v);
bool cwi_mp_doc_i64(cwi_mp_doc *d, const char *field, int64_t lo,
    int64_t hi, int64_t *v);
bool cwi_mp_doc_bool(cwi_mp_doc *d, const char *field, bool *v);
/* A float64, any bits (NaN included); the caller checks its range. */
bool cwi_mp_doc_f64(cwi_mp_doc *d, const char *field, double *v);
/* A str of at most max bytes without NUL into buf[max + 1]. */
bool cwi_mp_doc_text(cwi_mp_doc *d, const char *field, char *buf,
    size_t max);
/* A str of at most max bytes without NUL, malloc'd into *s; nil gives
 * NULL when `nullable`. */
bool cwi_mp_doc_strdup(cwi_mp_doc *d, const char *field, size_t max,
    bool nullable, char **s);
/* A bin of at most max bytes, malloc'd into *p (*len its length); nil
 * gives NULL, 0 when `nullable`. */
bool cwi_mp_doc_bindup(cwi_mp_doc *d, const char *field, size_t max,
    bool nullable, uint8_t **p, size_t *len);
/* The document must end here. */
bool cwi_mp_doc_end(cwi_mp_doc *d);

/* Writers for the same documents (value_msgpack.h has the others). */
void cwi_msgpack_put_nil(cwi_strbuf *sb);
void cwi_msgpack_put_bool(cwi_strbuf *sb, bool b);
/* Every bit of d (NaN payloads included), as float64. */
void cwi_msgpack_put_f64(cwi_strbuf *sb, double d);
/* A NUL-terminated string, or nil for NULL. */
void cwi_msgpack_put_cstr(cwi_strbuf *sb, const char *s);

/* A range set (core.h) as one flat array of its bounds, from0, to0, from1,
 * ...; the reader wants the canonical form cwi_rset_add keeps (ascending,
 * non-empty ranges that neither overlap nor touch), at most max_ranges of
 * them, into an empty *s. */
void cwi_rset_put_msgpack(cwi_strbuf *sb, const cwi_rset *s);
bool cwi_rset_get_msgpack(cwi_mp_doc *d, const char *field,
    uint64_t max_ranges, cwi_rset *s);

#endif /* CWI_MSGPACK_DOC_H */
