/*
 * exec_state.h - saving and restoring an iterator's position (resumable
 * iteration, docs/design.md "Saving and restoring a position").
 *
 * A position is a msgpack document. Each iterator of the tree writes its
 * own state, [op name, ended, body], where body is what the op's save
 * writes (normally an array of counters, buffered elements and the states
 * of its inputs, recursively). Everything an iterator derives from the
 * pipeline seed and its epoch (a file order, a reshuffle, a random
 * function's stream) is not saved: restore creates the iterator tree with
 * the same seed and epochs, then each op's restore sets its position. So
 * restore runs on a freshly created tree, before its first next(): no op
 * has started a thread yet.
 *
 * The reader checks every count against a limit and the bytes present and
 * keeps its first failure ("iterator state: shuffle: buffer: ... at byte
 * 120"); ops may chain its calls and test once. Nothing is trusted: a
 * decoded position outside what the op's node allows is refused.
 */
#ifndef CWI_EXEC_STATE_H
#define CWI_EXEC_STATE_H

#include "exec.h"
#include "exec_split.h"
#include "../core/value_msgpack.h"

/* The version of the document's layout (cachew_iterator_save). */
#define CWI_STATE_VERSION 1

typedef struct cwi_state_writer {
	cwi_strbuf sb; /* sb.oom is sticky: checked once at the end */
} cwi_state_writer;

void cwi_sw_array(cwi_state_writer *w, size_t n);
void cwi_sw_uint(cwi_state_writer *w, uint64_t v);
void cwi_sw_int(cwi_state_writer *w, int64_t v);
void cwi_sw_bool(cwi_state_writer *w, bool v);
void cwi_sw_str(cwi_state_writer *w, const char *s);
/* One element in the element codec's form (after an array header the
 * caller wrote: cwi_sr_elements reads them back). */
cachew_err cwi_sw_element(cwi_state_writer *w, const cwi_element *e);
/* An array of n elements, each in the element codec's form. Errors as
 * cwi_element_encode, through cwi_fail. */
cachew_err cwi_sw_elements(
    cwi_state_writer *w, cwi_element *const *v, size_t n);

typedef struct cwi_state_reader {
	cwi_mp_cursor c;
	const char *op; /* the op whose state is being read, for messages */
	cachew_err err; /* first failure; CACHEW_OK while none */
	char errmsg[512];
} cwi_state_reader;

void cwi_sr_init(cwi_state_reader *r, const void *buf, size_t len);
/* Records a failure (the first one is kept) and returns false. */
bool cwi_sr_fail(cwi_state_reader *r, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);
/* The reader's first failure (CACHEW_ECORRUPT unless told otherwise). */
static inline cachew_err
cwi_sr_error(const cwi_state_reader *r)
{
	return r->err != CACHEW_OK ? r->err : CACHEW_EINTERNAL;
}
/* Each getter returns false (recording why, naming `what`) once the
 * reader failed or when the next item is not what it wants. */
bool cwi_sr_array(cwi_state_reader *r, const char *what, uint64_t n);
bool cwi_sr_count(
    cwi_state_reader *r, const char *what, uint64_t *n, uint64_t max);
bool cwi_sr_uint(
    cwi_state_reader *r, const char *what, uint64_t *v, uint64_t max);
bool cwi_sr_int(cwi_state_reader *r, const char *what, int64_t *v,
    int64_t min, int64_t max);
bool cwi_sr_bool(cwi_state_reader *r, const char *what, bool *v);
/* A string of at most cap - 1 bytes, copied NUL-terminated into buf. */
bool cwi_sr_str(cwi_state_reader *r, const char *what, char *buf, size_t cap);
/* An array of elements (cwi_sw_elements), appended to out. */
bool cwi_sr_elements(cwi_state_reader *r, const char *what, cwi_chunk *out);

/* Passes over one item, whatever it holds (an input's state that the
 * restored iterator does not need). */
bool cwi_sr_skip(cwi_state_reader *r, const char *what);

/* A lease's unit cursor (exec_split.h): [range index, next unit]; restore
 * checks it against the cursor's ranges, which the iterator got again
 * from its lease. */
void cwi_sw_unit_cursor(cwi_state_writer *w, const cwi_unit_cursor *c);
bool cwi_sr_unit_cursor(cwi_state_reader *r, cwi_unit_cursor *c);

/* Writes the state of it and, through its op, of its inputs. An op that
 * cannot save is CACHEW_ENOTSUP naming it, and an iterator that failed is
 * its error; the message goes through cwi_fail (the pipeline's own error
 * is untouched: a save that fails leaves the iterator usable). */
cachew_err cwi_iter_save(cwi_iter *it, cwi_state_writer *w);
/* Sets a freshly created iterator (no next() yet) to the state at the
 * reader's position; errors are recorded in the reader. */
cachew_err cwi_iter_restore(cwi_iter *it, cwi_state_reader *r);
/* Replaces *slot (destroyed) by a new iterator of node at epoch args, then
 * restores it from r: what an op that creates inputs per epoch or per
 * element (repeat, interleave) does. Errors are recorded in r. */
cachew_err cwi_iter_recreate(cwi_iter **slot, const cwi_node *node,
    const cwi_iter_args *args, cwi_state_reader *r);

/* A flat-map sequence (cwi_seq): closed, or [index, yielded, ended,
 * position, the element that opened it]. Restore reopens it from that
 * element and seeks to the position (a built-in file function,
 * cwi_fn.resume) or else passes over what it had yielded (the function's
 * output is a pure function of its element and index). Errors are
 * recorded in r. */
cachew_err cwi_seq_save(const cwi_seq *s, cwi_state_writer *w);
cachew_err cwi_seq_restore(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    uint64_t epoch, cwi_state_reader *r);
/* Moves seq, a sequence of fn just opened, to pos (cwi_seq_resume):
 * CACHEW_OK, CACHEW_ENOTSUP when it cannot (read past instead), or an
 * error recorded in r. */
cachew_err cwi_seq_seek(const cwi_fn *fn, void *seq, uint64_t pos,
    cwi_state_reader *r);

/*
 * The plain executor's whole position: the elements pulled and not yet
 * handed out, then the root's state. The caller writes what identifies the
 * run around it (src/front: the document header; the service's worker: its
 * lease). Restore runs on an iterator created over the same graph with the
 * same seed, epoch and (for a lease) ranges, before its first next().
 * A service client's iterator saves the same way: its client part's
 * states, down to the stream's (cwi_stream_ops.save), which holds the
 * service's side; restore runs on an iterator whose stream waits for it
 * (service/client: the job is joined with the saved position).
 */
cachew_err cwi_exec_iterator_save(cachew_iterator *it, cwi_state_writer *w);
cachew_err cwi_exec_iterator_restore(cachew_iterator *it, cwi_state_reader *r);

/* What identifies the run of a plain-executor iterator: its pipeline seed
 * (resolved), job seed and the options that change the data. */
typedef struct cwi_exec_run {
	cachew_fingerprint fp; /* the dataset's */
	uint64_t seed, job_seed;
	int64_t epoch;
	bool deterministic;
} cwi_exec_run;

void cwi_exec_iterator_run(const cachew_iterator *it, cwi_exec_run *out);
/* True for the iterators of a service client (cwi_iterator_create_owned),
 * whose position lives on the service. */
bool cwi_exec_iterator_is_service(const cachew_iterator *it);
/* cwi_exec_iterator_create with the given pipeline and job seeds (those of
 * a saved run); opts' seed is ignored. */
cachew_err cwi_exec_iterator_create_seeded(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts, uint64_t seed,
    uint64_t job_seed);

#endif /* CWI_EXEC_STATE_H */
