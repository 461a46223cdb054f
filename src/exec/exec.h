/*
 * exec.h - the executor: pull-based iterators that move chunks of elements.
 *
 * Contract of cwi_iter_ops.next(it, out, max):
 *   - appends between 1 and `max` elements to `out` and returns CACHEW_OK
 *     (the caller has reserved room for `max` more), or
 *   - returns CACHEW_EOF at the end of the sequence, or
 *   - returns an error, after recording the reason with cwi_pipeline_fail().
 * With EOF or an error, the elements appended in that call are those that
 * came before the end or the failure: the wrapper delivers them first and
 * reports the end or error on the following call, as tf.data does.
 * An op may return fewer than `max` elements at any time; consumers that
 * need an exact count (batch) loop. cwi_iter_next() reserves room for `max`
 * elements in `out`, so request bounded amounts (a few thousand at most).
 * The cwi_iter_next() wrapper makes EOF and errors sticky and keeps the
 * per-node counters, so ops never do.
 *
 * Elements move with ownership: what next() appends belongs to the caller.
 * Iterators are used by one thread at a time; an op that runs its own
 * threads (parallel map, prefetch, interleave) hides them behind next().
 */
#ifndef CWI_EXEC_H
#define CWI_EXEC_H

#include "../core/options.h"
#include "../graph/graph.h"

#include <pthread.h>

/* ---- statistics -------------------------------------------------------- */

typedef struct cwi_stats {
	const cwi_node *node;
	const char *name;
	const char *detail;
	int index;
	_Atomic uint64_t elements;
	_Atomic uint64_t bytes;
	_Atomic uint64_t busy_ns;
	_Atomic uint64_t wait_ns;
	_Atomic int parallelism;
	_Atomic int64_t buffer_limit;
	_Atomic int64_t buffered;
	_Atomic uint64_t dropped; /* ignore_errors: elements dropped below it */
	_Atomic uint64_t cache_hit_bytes; /* of bytes, read from a cache */
} cwi_stats;

static inline void
cwi_stat_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* A contiguous range [begin, end) of a splittable source's split units. */
typedef struct cwi_unit_range {
	uint64_t begin, end;
} cwi_unit_range;

/* ---- pipeline: what all iterators of one cachew_iterator share -------- */

typedef struct cwi_pipeline {
	cwi_opts opts;        /* resolved: threads >= 1, ram_budget > 0 */
	uint64_t seed;        /* resolved pipeline seed */
	uint64_t job_seed;    /* the seed of the whole run: == seed, except in
			       * a lease, whose seed derives from it
			       * (cwi_split_lease_seed) */
	atomic_bool cancelled; /* set when the iterator is destroyed */

	pthread_mutex_t lock; /* protects err, errmsg */
	cachew_err err;
	char errmsg[1024];

	cwi_stats *stats; /* one row per node, pipeline order */
	size_t nstats;

	/* Distributed execution (a worker running a lease of splits): the
	 * split source node reads only these unit ranges, in order. NULL
	 * split_node: every source reads its whole input. */
	const cwi_node *split_node;
	const cwi_unit_range *split_ranges;
	size_t nsplit_ranges;

	/* Thread and RAM budgets of the threaded operators (exec_tune.c),
	 * created by the first of them; guarded by exec_tune.c's lock. */
	struct cwi_tuner *tuner;

	/* A lease that keeps its tails (cwi_iterator_create_lease_tails):
	 * the grouping operators named here (batch, padded_batch) hold the
	 * partial group at the end of their input instead of emitting or
	 * dropping it; NULL otherwise. */
	struct cwi_tails *tails;
} cwi_pipeline;

/* Where a grouping operator puts the partial group it holds at the end of
 * its input: the pipeline's slot for node, or NULL when the pipeline keeps
 * no tails for it (then it emits or drops the group as always). Locks
 * nothing: the slot belongs to the node's iterator until EOF. */
cwi_chunk *cwi_pipeline_tail_slot(cwi_pipeline *pl, const cwi_node *node);

/* Records the first failure of the pipeline (later ones are ignored) and
 * returns err. The message should start with the operator's name. */
cachew_err cwi_pipeline_fail(cwi_pipeline *pl, cachew_err err,
    const char *fmt, ...) CACHEW_PRINTF(3, 4);

static inline bool
cwi_pipeline_cancelled(const cwi_pipeline *pl)
{
	return atomic_load_explicit(&pl->cancelled, memory_order_relaxed);
}

/* The stats row of a node (NULL for nodes outside the graph). */
cwi_stats *cwi_pipeline_stats(cwi_pipeline *pl, const cwi_node *node);

/* ---- iterators ----------------------------------------------------------- */

/* What an ignore_errors above an iterator asks of the functions below it:
 * an element whose function fails with a data error (cwi_err_is_data) is
 * dropped, counted in `stats` (the ignore_errors row's `dropped`) and,
 * with `log`, logged as a warning, instead of failing the pipeline. Owned
 * by the ignore_errors iterator, which outlives its inputs. */
typedef struct cwi_drop {
	cwi_stats *stats; /* may be NULL */
	bool log;
} cwi_drop;

struct cwi_iter_args {
	cwi_pipeline *pl;
	uint64_t epoch; /* the epoch option, or what repeat passes for each
			 * repetition; reshuffles, per-epoch file orders
			 * and random functions draw from it */
	const cwi_drop *drop; /* the nearest ignore_errors above, or NULL */
};

struct cwi_state_writer;
struct cwi_state_reader;

typedef struct cwi_iter_ops {
	cachew_err (*next)(cwi_iter *it, cwi_chunk *out, size_t max);
	/* Stops the op's threads, destroys its inputs, frees it. */
	void (*destroy)(cwi_iter *it);
	/* Resumable iteration (exec_state.h); NULL: the op cannot save its
	 * position (CACHEW_ENOTSUP naming it). save writes the op's body:
	 * its own position and its inputs' states (cwi_iter_save), leaving
	 * the iterator as it was (iteration may go on). restore reads what
	 * save wrote into an iterator just created, before its first next(). */
	cachew_err (*save)(cwi_iter *it, struct cwi_state_writer *w);
	cachew_err (*restore)(cwi_iter *it, struct cwi_state_reader *r);
} cwi_iter_ops;

struct cwi_iter {
	const cwi_iter_ops *ops;
	cwi_pipeline *pl;
	const cwi_node *node;
	cwi_stats *stats; /* may be NULL */
	cachew_err done;  /* sticky EOF or error */
	cachew_err pending; /* EOF or error to report after the elements
			     * delivered with it */
	bool async;       /* consumer time in next() is wait, not busy;
			   * an op may set it in create or in next() (the
			   * wrapper reads it after the call) */
	bool cache_hit;   /* its elements come from a cache (not its
			   * input): their bytes count as cache hits too;
			   * set like async */
	uint64_t epoch;
	const cwi_drop *drop; /* args->drop when it was created */
};

/* Creates the iterator of a node (and, through the op, of its inputs). */
cachew_err cwi_iter_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args);
/* Pulls up to max elements (see the contract above). Reserves room in out
 * itself. */
cachew_err cwi_iter_next(cwi_iter *it, cwi_chunk *out, size_t max);
void cwi_iter_destroy(cwi_iter *it);

/* ---- operator functions --------------------------------------------------- */

struct cachew_op_ctx {
	const cwi_fn *fn;
	void *state;
	uint64_t base_seed; /* derived from (pipeline seed, node, epoch) */
	uint64_t index;     /* element index at the op's input */
	cwi_rng rng;
	bool rng_started;
	uint64_t max_element_bytes; /* the pipeline's option (0: default) */
	char errmsg[512];
};

/* What an operator may allocate for one element: the pipeline's
 * max_element_bytes option. */
uint64_t cwi_pipeline_max_element(const cwi_pipeline *pl);
static inline uint64_t
cwi_op_ctx_max_element(const cachew_op_ctx *ctx)
{
	return ctx->max_element_bytes > 0 ? ctx->max_element_bytes
					  : (uint64_t)CWI_MAX_ELEMENT_BYTES;
}
/* Checks an allocation an operator sizes from a parameter or an input
 * before making it: CACHEW_OK when bytes is within the pipeline's
 * max_element_bytes, else CACHEW_ERANGE with "<what> would take N bytes,
 * over max_element_bytes (M)" as the element's error (ctx) or the
 * pipeline's failure (pl, naming node). what is printf-style. */
cachew_err cwi_op_ctx_check_bytes(cachew_op_ctx *ctx, uint64_t bytes,
    const char *what, ...) CACHEW_PRINTF(3, 4);
cachew_err cwi_pipeline_check_bytes(cwi_pipeline *pl, const cwi_node *node,
    uint64_t bytes, const char *what, ...) CACHEW_PRINTF(4, 5);

/* Prepares a context for calls of node->fn in an iterator created at
 * `epoch` (its cwi_iter_args.epoch): the function's random streams are
 * those of (pipeline seed, node, epoch, element index). */
void cwi_op_ctx_init(cachew_op_ctx *ctx, const cwi_node *node,
    cwi_pipeline *pl, uint64_t epoch);

static inline void
cwi_op_ctx_at(cachew_op_ctx *ctx, uint64_t index)
{
	ctx->index = index;
	ctx->rng_started = false;
	ctx->errmsg[0] = '\0';
}

/* Records a function's failure in the pipeline ("map(add): <reason>
 * (element 17)") and returns the error to report. */
cachew_err cwi_fn_failed(cachew_op_ctx *ctx, const cwi_node *node,
    cwi_pipeline *pl, cachew_err rv);

/* Runs a map function on one element. On failure records the error in the
 * pipeline and returns it; `in` is consumed either way. */
static inline cachew_err
cwi_apply_map(cachew_op_ctx *ctx, const cwi_node *node, cwi_pipeline *pl,
    cwi_element *in, cwi_element **out)
{
	cachew_err rv;

	*out = NULL;
	rv = ctx->fn->def.map(ctx, in, out);
	if (rv == CACHEW_OK && *out == NULL)
		rv = cachew_op_ctx_fail(ctx, "returned no element");
	if (rv != CACHEW_OK)
		return cwi_fn_failed(ctx, node, pl, rv);
	return CACHEW_OK;
}

/* Whether a function's failure on one element is about that element's
 * data: CACHEW_ECORRUPT (corrupt input, a decode failure), CACHEW_ETYPE,
 * CACHEW_ERANGE and CACHEW_EOP (a function refused the element). Other
 * codes (I/O, memory, cancellation, bad parameters, internal errors)
 * are never dropped by ignore_errors. */
bool cwi_err_is_data(cachew_err rv);

/* Below an ignore_errors (it->drop set) and rv a data error: counts and
 * (when asked) logs the element that ctx's function failed on, and
 * returns true: the caller drops it and goes on. False otherwise: the
 * caller fails as it would without ignore_errors. Thread safe (parallel
 * map workers call it). */
bool cwi_iter_drop(const cwi_iter *it, const cachew_op_ctx *ctx,
    cachew_err rv);

/* Runs it's filter function on in; *keep is set on success. With
 * may_drop, an element the function fails on with a data error below an
 * ignore_errors is dropped (*keep false, CACHEW_OK; cwi_iter_drop). */
cachew_err cwi_apply_filter(cachew_op_ctx *ctx, const cwi_iter *it,
    bool may_drop, const cwi_element *in, bool *keep);

/* Flat-map sequences opened from a function op (interleave, flat_map and
 * the file sources share this). */
typedef struct cwi_seq {
	const cwi_fn *fn;
	cachew_op_ctx ctx;
	void *state;
	bool open;
	bool eof;
	/* What reopens it where it was (exec_state.h): the element that
	 * opened it (a reference), its index and the elements it yielded. */
	cwi_element *in;
	uint64_t index;
	uint64_t yielded;
} cwi_seq;

cachew_err cwi_seq_open(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    uint64_t epoch, const cwi_element *in, uint64_t index);
/* Appends up to max elements; CACHEW_EOF when the sequence ends. */
cachew_err cwi_seq_next(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    cwi_chunk *out, size_t max);
void cwi_seq_close(cwi_seq *s);

/* ---- iterators for the service ----------------------------------------- */

/* The plain executor's iterator of ds: what cachew_iterator_create runs
 * for `service=local` (src/front decides). The caller's cwi_clear_errmsg
 * and argument checks are done; errors are the pipeline's own. */
cachew_err cwi_exec_iterator_create(
    cachew_iterator **out, cachew_dataset *ds, const cachew_options *opts);

/* Marks it as the user's (cachew_iterator_create, _restore): its end
 * frees the large buffers kept for reuse; the library's own iterators
 * (a worker's lease, a stitched run) leave them to the running pipeline. */
void cwi_iterator_mark_user(cachew_iterator *it);

/* A fresh random pipeline seed (getrandom, else clock and pid). */
uint64_t cwi_fresh_seed(void);
/* Creates an iterator of ds with the given pipeline seed that calls
 * release(arg) when it is destroyed, last (the service client keeps its
 * session state alive this way). On failure release(arg) has been called.
 * opts' seed and service are ignored. */
cachew_err cwi_iterator_create_owned(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, uint64_t seed, void (*release)(void *arg),
    void *arg);
/* Rows of a part of the pipeline that runs elsewhere (a service client's
 * worker part), shown by cachew_iterator_stats before the iterator's own
 * rows (whose node indexes then follow theirs). fn copies up to cap rows
 * (strings it owns, valid while the iterator lives) and returns how many
 * there are, and sets *hide to how many of the iterator's own first rows
 * to leave out (a hand-off row that is no operator of the user's); called
 * with the release arg of cwi_iterator_create_owned. */
typedef size_t (*cwi_part_stats_fn)(void *arg, cachew_op_stats *out,
    size_t cap, size_t *hide);
void cwi_iterator_set_part_stats(cachew_iterator *it, cwi_part_stats_fn fn);
/* The elements it yields take the names of ds's components (a service
 * client runs its client part, whose spec starts at the stream from the
 * workers: the names are those of the pipeline the user built). */
void cwi_iterator_set_names(cachew_iterator *it, const cachew_dataset *ds);
/*
 * A lease iterator (cwi_iterator_create_lease) that keeps its tails: the
 * grouping nodes groups[0..ngroups) (batch or padded_batch nodes of root's
 * chain, normally a split plan's, exec_split.h) hold the elements of their
 * last, partial group when their input ends, whatever their
 * drop_remainder, instead of emitting a short group. After the iterator
 * returned CACHEW_EOF, cwi_iterator_take_tails hands them out: what the
 * service's client stitches across leases, so that every batch is full but
 * one per epoch, as in-process (docs/protocol.md, "Exactly once").
 */
cachew_err cwi_iterator_create_lease_tails(cachew_iterator **out,
    cwi_node *root, const cachew_options *opts, const cwi_node *split_node,
    const cwi_unit_range *ranges, size_t nranges, uint64_t seed,
    const cwi_node *const *groups, size_t ngroups);
/* Moves the tail held for groups[k] (its elements in input order) to the
 * end of out; none when the node's input ended on a group boundary, or
 * the iterator keeps no tails. CACHEW_ENOMEM. */
cachew_err cwi_iterator_take_tails(cachew_iterator *it, size_t k,
    cwi_chunk *out);
/* Appends up to max elements of it to out (room for them reserved by the
 * caller), pulling no more than that from its pipeline: what an inline
 * worker task hands a client whose take() wants exactly max. CACHEW_EOF
 * or the pipeline's error once nothing is left before it. */
cachew_err cwi_iterator_next_chunk(cachew_iterator *it, cwi_chunk *out,
    size_t max);

#endif /* CWI_EXEC_H */
