/*
 * exec_split.h - splitting a pipeline for distributed_epoch: the split
 * plan (which source is split, which operators run per lease on the
 * workers, which run on the client over the stream of their output), the
 * grouping of split units into splits, lease iterators and their seeds,
 * and the helpers the splittable sources use to read only a lease.
 *
 * Terms. A splittable source has `units` split units (elements of range,
 * from_list and from_tensors, files of the file sources, chunks of
 * cache_get), numbered in the source's own read order. A split is a
 * contiguous range of units; a lease is a list of unit ranges that a worker
 * runs as ONE pipeline instance (cwi_iterator_create_lease). Everything in
 * the worker part therefore happens within a lease:
 *   - batch/padded_batch make partial batches at each lease end, and
 *     drop_remainder=true drops each lease's remainder (as tf.data service
 *     does at each worker's end);
 *   - shuffle's buffer holds elements of one lease only; what mixes an
 *     epoch is the split order: the dispatcher hands a job whose worker
 *     part holds a shuffle its splits in a seeded order (a buffered
 *     shuffle of the splits through the shuffle's buffer, as tf.data
 *     service's shuffle split provider) and cuts it finer
 *     (dispatcher_ledger.c, "shuffled order"); other jobs get split
 *     order;
 *   - interleave cycles through the files of one lease;
 *   - random functions draw from the lease's seed (cwi_split_lease_seed),
 *     the epoch and the element's index within the lease, so a lease
 *     replayed on another worker at the same epoch yields the same
 *     elements in the same order (with the default deterministic=true of
 *     map and interleave), and a shuffle reshuffles by the epoch too.
 * Not per lease: list_files(shuffle=true) orders its files by the job's
 * seed (pl->job_seed) and the epoch, and its split unit i is the i-th file
 * of that order, so the leases of an epoch partition one permutation.
 * A lease of every unit in order, starting at unit 0, yields exactly what
 * the plain in-process run yields at the same epoch.
 *
 * Pipelines without a split source. A pipeline whose top chain (root down
 * through one-input operators) does not end at a splittable source ends at
 * a join (zip, concatenate, or an operator reading one source through
 * several inputs) or at a source that cannot be split. Its plan has no
 * split source: the join (or source) and everything below it is ONE unit,
 * unit 0, and the worker part (it, plus the per-lease operators above it)
 * runs whole in each lease of that unit. So:
 *   - parallel_epochs: each worker runs the whole worker part, as it does
 *     for a split source (a lease of every unit);
 *   - distributed_epoch: the job has one split of one unit; one worker
 *     runs the worker part whole, exactly the in-process run (lease seed
 *     = the job's seed), and the others get no split. The inputs of a
 *     join are not split on their own: zip pairs its inputs' i-th
 *     elements, which splits of each input taken separately would not
 *     keep aligned, and concatenate's order and the per-lease operators
 *     above it would need a lease to span several sources. Such a job
 *     therefore gets one worker's throughput.
 * The client part above it is as for a split source (take, skip, ...).
 *
 * The client tail. Asked for (CWI_SPLIT_CLIENT_TAIL), a plan moves the
 * trailing run at the top of the worker part of operators that widen
 * their elements element-wise (map(normalize) or map(cast) whose output
 * dtype is wider than their input's, u8 -> f32: 4x the bytes), with any
 * prefetch above them, into the client part: the workers then send the
 * narrower elements (W2's normalize: 0.9 GB on the wire instead of 3.6 GB
 * for 6,000 images) and the client widens them. That gives the same bytes
 * because the functions are built in (the same code on every process),
 * deterministic (no seed, so nothing depends on the lease) and
 * element-wise (a batch stitched from the tails of leases is widened as a
 * whole one would be); every node keeps its fingerprint (the client part
 * is rebuilt over a placeholder carrying the narrower worker part's
 * fingerprint and seed fingerprint). Only a run at the very top moves:
 * a per-lease operator above it (filter, shuffle, batch) would have to
 * move too, and shuffle's per-lease buffer or batch's per-lease cut would
 * then differ. The worker part is another pipeline then (its top is the
 * narrower one), so its fingerprint, its dataset on the dispatcher and the
 * caches autocaching makes of its output are those of the narrower
 * elements, never mixed with the wider ones'.
 *
 * Thread safety: a plan is immutable once made; the functions are safe
 * from any thread.
 */
#ifndef CWI_EXEC_SPLIT_H
#define CWI_EXEC_SPLIT_H

#include "exec.h"

/* ---- the plan --------------------------------------------------------- */

/* Grouping operators of a worker part whose tails are stitched; a chain
 * with more keeps its leases' partial groups. */
#define CWI_SPLIT_MAX_GROUPS 8

/*
 * A pipeline cut in two. The worker part is the longest chain from the
 * bottom of the top chain (the split source, or the unit of a pipeline
 * without one) up through operators that are correct per lease (map,
 * filter, flat_map, interleave, batch, padded_batch, unbatch, shuffle,
 * prefetch, autocache); the client part starts at the first other
 * operator (take, skip, shard, repeat, enumerate, zip, cache_put, cache,
 * tfrecord_write, any operator not known to be per-lease) and holds
 * everything after it.
 */
typedef struct cwi_split_plan {
	cwi_node *root;         /* the whole pipeline (a reference) */
	const cwi_node *source; /* the split source, in root's graph; NULL:
				 * none, the worker part is one unit */
	cwi_node *worker;       /* top of the worker part (in root's graph);
				 * == root when the client part is empty */
	const cwi_node *boundary; /* first operator that is not per lease
				 * (the client part's first but for a client
				 * tail below it), or NULL */
	size_t nworker;         /* operators of the worker part, source
				 * included */
	size_t nclient;         /* operators of the client part, the
				 * client tail included */
	uint64_t units;         /* split units of the source (0..2^64-1);
				 * 1 without a source */
	const char *unit_kind;  /* "elements", "files", "chunks" or
				 * "pipeline" (no source) */
	cachew_fingerprint worker_fp; /* == worker->fp */
	char why[192];          /* why the boundary runs on the client */
	char whole[256];        /* without a source: why (names the join or
				 * the source that cannot be split) */
	/* The grouping operators of the worker part (batch, padded_batch),
	 * source first: the ones whose last, partial group of a lease the
	 * client stitches (cwi_split_stitch_graph). None when an operator
	 * above the first one cannot run on the client (a per-lease cache
	 * write): then every lease ends with its own partial groups. */
	const cwi_node *groups[CWI_SPLIT_MAX_GROUPS];
	size_t ngroups;
	/* The client tail (see above): the operators of the run that may
	 * move, counted from the top of the whole worker part (0: none), and
	 * how many did move into the client part (ntail == ncandidate when
	 * asked for, else 0). tail_why says what the run does to the
	 * elements, for `cachew explain` ("map(normalize): u8 -> f32 (image)"). */
	size_t ncandidate;
	size_t ntail;
	char tail_why[256];
} cwi_split_plan;

/* Flags of cwi_split_plan_create_for. */
#define CWI_SPLIT_CLIENT_TAIL 0x1u /* move the client tail (see above) */

/* Plans root: every pipeline has a plan, with a split source when root
 * is a chain over one splittable source, else without one (see "Pipelines
 * without a split source" above). Counting units may read file listings
 * (errors of the source, e.g. CACHEW_ENOENT for a pattern that matches
 * nothing). Takes a reference on root. */
cachew_err cwi_split_plan_create(cwi_split_plan **out, cwi_node *root);
/* As cwi_split_plan_create, with flags (CWI_SPLIT_CLIENT_TAIL: the client
 * moves the client tail out of the worker part; a remote service's client
 * does, the embedded service and the workers themselves do not: a worker
 * plans the worker part it was sent, whose top is already the narrower
 * one). */
cachew_err cwi_split_plan_create_for(cwi_split_plan **out, cwi_node *root,
    unsigned flags);
/* Whether root's plan has a split source (a chain over one splittable
 * source), from the graph's shape alone: nothing is read. */
bool cwi_split_possible(const cwi_node *root);
/* Why the implicit default (the embedded service) leaves root to the
 * plain executor, or NULL when it takes it; from the graph alone:
 *   - it cannot be split (!cwi_split_possible);
 *   - it holds a cache operator, whose in-process semantics (the first
 *     full pass fills the cache, a corrupt chunk is recomputed, the
 *     manifest names the cached pipeline) are the plain executor's;
 *   - it holds a repeat, which runs on the client and would open the
 *     service's stream again, a new job, for every pass (0.3 ms each:
 *     range(10) | repeat() | batch(4) ran 440 times slower).
 * The output is the same either way: the embedded service yields the
 * plain executor's elements. */
const char *cwi_split_local_reason(const cwi_node *root);
/* NULL is a no-op. */
void cwi_split_plan_destroy(cwi_split_plan *p);

/* Appends a description of the plan (for `cachew explain`):
 *   split source: list_files (3 files)
 *     (or "none, the worker part runs whole as one unit (<why>)")
 *   worker part:  <canonical string>  fp=<hex>
 *   client part:  service_stream(...) | take(n=5)   (or "none")
 *   client tail:  <the run> runs on the client: <why>  (only with one)
 *   boundary:     take: <why>   (only with one)
 */
cachew_err cwi_split_plan_describe(const cwi_split_plan *p, cwi_strbuf *sb);

/* For `cachew explain`: plans root as a remote service's client does
 * (with the client tail moved) and appends its description, or one
 * line "split: <why not>" when its units cannot be counted. Fails only
 * with CACHEW_ENOMEM. */
cachew_err cwi_split_explain(cwi_node *root, cwi_strbuf *sb);

/* Cuts units [0, nunits) into min(nunits, target_splits) contiguous splits
 * whose sizes differ by at most one, in unit order. *out (free with free)
 * is NULL when nunits == 0. target_splits 0 is CACHEW_EINVAL. */
cachew_err cwi_split_group(uint64_t nunits, uint64_t target_splits,
    cwi_unit_range **out, size_t *n);

/* ---- the client part --------------------------------------------------- */

/*
 * Where the client part's elements come from: the elements of the worker
 * part, from the service. open() is called once per iterator of the
 * placeholder, with the epoch the client part runs it at (a client-side
 * repeat passes its repetition); next() follows the contract of
 * cwi_iter_ops.next (appends 1..max elements to out, which has room for
 * them, and returns CACHEW_OK; or returns CACHEW_EOF; or an error with a
 * reason written into err); close() ends the stream. The calls come from
 * the thread that iterates the client part (or a prefetch thread of it),
 * one at a time per stream.
 */
typedef struct cwi_stream_ops {
	cachew_err (*open)(void *ctx, uint64_t epoch, void **stream, char *err,
	    size_t errlen);
	cachew_err (*next)(void *stream, cwi_chunk *out, size_t max, char *err,
	    size_t errlen);
	void (*close)(void *stream);
	/* Resumable iteration (exec_state.h), from the thread that iterates
	 * the stream, between next() calls: save writes the stream's
	 * position (what it received and still holds) as one item; restore
	 * sets a stream just opened, before its first next(), to a saved
	 * one (errors recorded in the reader). NULL: the stream cannot
	 * (CACHEW_ENOTSUP). */
	cachew_err (*save)(void *stream, struct cwi_state_writer *w);
	cachew_err (*restore)(void *stream, struct cwi_state_reader *r);
	/* Optional, from any thread (cachew_iterator_cancel, with the
	 * executor's tuner lock held: take only the stream's own lock):
	 * makes a next() blocked on the stream, and every later one, return
	 * CACHEW_ECANCELED promptly. NULL: next() returns on its own. */
	void (*cancel)(void *stream);
} cwi_stream_ops;

typedef struct cwi_stream_source {
	const cwi_stream_ops *ops;
	void *ctx;
} cwi_stream_source;

/*
 * Builds the client part as a graph whose source is a placeholder node,
 * `service_stream(fingerprint="<worker part fp>")`, that reads `src`. The
 * placeholder stands for the worker part: it carries its fingerprint and
 * seed fingerprint, so every client operator keeps the fingerprint and the
 * seeds it has in the whole pipeline (a client-side shuffle or a one-lease
 * run yields what the in-process run yields). The placeholder's operator is
 * internal and never registered: no pipeline string or serialized graph can
 * name it, and the client graph is never sent anywhere. `src` is borrowed:
 * it must outlive every iterator of the graph; NULL builds a graph that
 * can be printed but not iterated (CACHEW_EINVAL). With an empty client
 * part the result is the placeholder alone. *out is a new reference.
 */
cachew_err cwi_split_client_graph(const cwi_split_plan *p,
    const cwi_stream_source *src, cwi_node **out);

/* ---- stitching the tails of leases -------------------------------------- */

/*
 * The stitch graph of grouping operator k of a plan (k < p->ngroups): the
 * worker part's operators from p->groups[k] up to, not including,
 * p->groups[k + 1] (for the last one: up to the top of the worker part),
 * the same operators with the same parameters, over a placeholder that
 * reads `src`. Run over tail elements of groups[k] (and the stitched
 * output of the segment below, which are that operator's input too), it
 * yields what the worker part would have made of them in one lease; its
 * output is groups[k + 1]'s input (or the worker part's output). `src` is
 * borrowed as in cwi_split_client_graph. *out is a new reference.
 */
cachew_err cwi_split_stitch_graph(const cwi_split_plan *p, size_t k,
    const cwi_stream_source *src, cwi_node **out);
/* The group size of p->groups[k] (its `n`). */
uint64_t cwi_split_group_n(const cwi_split_plan *p, size_t k);

/* ---- leases ------------------------------------------------------------- */

/* The seed a lease's pipeline runs with: `seed` (the job's resolved
 * pipeline seed) itself for a lease whose first unit is 0, so that one
 * lease of everything is the in-process run, else a seed derived from
 * (seed, first unit of the lease). Distinct leases of one epoch start at
 * distinct units, so their random streams differ; a replayed lease gets the
 * same seed. */
uint64_t cwi_split_lease_seed(
    uint64_t seed, const cwi_unit_range *ranges, size_t nranges);

/*
 * Creates an iterator that runs `root` (normally a plan's worker part) for
 * one lease: split_node (a splittable source of root's graph, normally the
 * plan's source) reads only `ranges`, in the order given, and the pipeline
 * seed is cwi_split_lease_seed(seed, ranges, nranges); opts' seed and
 * service are ignored (a lease always runs on the local executor). The
 * ranges are copied. A NULL split_node (a plan without a split source)
 * makes root one unit, unit 0: the lease runs it whole when its ranges
 * hold unit 0, and yields nothing when they hold no unit. CACHEW_EINVAL
 * when split_node is not a splittable node of root's graph or a range has
 * begin > end; a range beyond the source's units (beyond unit 0 without a
 * split node) fails the creation with CACHEW_ERANGE (the input changed
 * since the plan was made). Defined in exec_iter.c.
 */
cachew_err cwi_iterator_create_lease(cachew_iterator **out, cwi_node *root,
    const cachew_options *opts, const cwi_node *split_node,
    const cwi_unit_range *ranges, size_t nranges, uint64_t seed);

/* ---- for the splittable sources ---------------------------------------- */

/* In a source's iter_create: when the pipeline splits at node, sets
 * *split, and *ranges and *n to the lease's unit ranges (possibly none)
 * after checking them against the source's `units` (CACHEW_ERANGE through
 * cwi_fail otherwise); when it does not, clears *split (read everything). */
cachew_err cwi_split_source_ranges(const cwi_iter_args *args,
    const cwi_node *node, uint64_t units, bool *split,
    const cwi_unit_range **ranges, size_t *n);

/* File sources: keeps only the lease's paths, in lease order (a
 * NULL-terminated array as cwi_paths_expand makes; the old one is freed).
 * No-op when the pipeline does not split at node. */
cachew_err cwi_split_select_paths(const cwi_iter_args *args,
    const cwi_node *node, char ***paths, size_t *n);

/* The split units of a file source: the number of paths its "files"
 * parameter expands to (cwi_paths_expand). */
cachew_err cwi_split_units_files(const cwi_node *node, uint64_t *units);

/* Walks the units of a lease in order. */
typedef struct cwi_unit_cursor {
	const cwi_unit_range *ranges;
	size_t n, i;
	uint64_t next; /* next unit of ranges[i] */
} cwi_unit_cursor;

static inline void
cwi_unit_cursor_init(
    cwi_unit_cursor *c, const cwi_unit_range *ranges, size_t n)
{
	c->ranges = ranges;
	c->n = n;
	c->i = 0;
	c->next = n > 0 ? ranges[0].begin : 0;
}

/* The next unit of the lease; false after the last one. */
static inline bool
cwi_unit_cursor_next(cwi_unit_cursor *c, uint64_t *unit)
{
	while (c->i < c->n && c->next >= c->ranges[c->i].end) {
		c->i++;
		if (c->i < c->n)
			c->next = c->ranges[c->i].begin;
	}
	if (c->i == c->n)
		return false;
	*unit = c->next++;
	return true;
}

#endif /* CWI_EXEC_SPLIT_H */
