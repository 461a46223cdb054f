/*
 * autocache.h - autocaching: where (if anywhere) to cache a job's pipeline.
 *
 * The candidates are every `autocache` marker of the pipeline and the
 * pipeline end. For each the policy estimates the epoch time of computing
 * everything, of reading a cache there (at the read rate measured on the
 * actual cache storage by cwi_cache_probe, plus the compute after the
 * candidate), and the one-time cost of writing it (the PUT pass: compute
 * plus write overhead), and picks the cheapest total over the epochs still
 * to run. A candidate downstream of a random operator is never cached
 * unless the user allows frozen randomness; one that does not fit the
 * cache root's capacity is never chosen. docs/autocaching.md explains the
 * model and compares it with Cachew's rule.
 *
 * Everything here is pure: measurements in, decision out; no clock, no
 * I/O, no locks. The dispatcher, the embedded mode and `cachew sim
 * autocache` call the same functions. Only cwi_autocache_plan allocates.
 *
 * Policies (cwi_ac_parse spellings):
 * - "default": the cost model above, deciding after profile_batches
 *   batches of the first pass and revisiting when a measurement drifts
 *   more than `drift` (25%) from what the decision assumed. While it
 *   profiles, the first pass also writes every eligible candidate
 *   (speculatively), so the chosen cache is complete at the end of the
 *   first pass instead of one pass later; the other writes are abandoned
 *   at the decision.
 * - "cachew": Cachew's published rule: after 300 batches of PROFILE,
 *   compare compute time (per-row time x rows), the full cache's read
 *   time from a static offline table of read time vs row size, and each
 *   source cache's table read time plus the compute after it; pick the
 *   cheapest once, never revisit; the next pass writes (PUT), later ones
 *   read (GET). No write cost, no remaining-epoch count, no measured
 *   storage.
 * - "compute", "source", "full": fixed choices (the simulator's baselines);
 *   "source" is the first eligible marker. They still never cache
 *   downstream of a random operator without permission.
 *
 * Thread safety: plans are immutable once built; a cwi_ac_job is used by
 * one thread at a time; everything else is a pure function.
 */
#ifndef CWI_AUTOCACHE_H
#define CWI_AUTOCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachew.h"

#include "../graph/graph.h"

/* Candidates per pipeline (markers plus the end). A pipeline with more
 * markers is refused by cwi_autocache_plan: the job then just computes. */
#define CWI_AC_MAX_CANDIDATES 16

/* ---- configuration ------------------------------------------------------ */

typedef enum cwi_ac_kind {
	CWI_AC_DEFAULT = 0, /* "default": our cost model */
	CWI_AC_CACHEW,      /* "cachew": the original rule */
	CWI_AC_FIX_COMPUTE, /* "compute" */
	CWI_AC_FIX_SOURCE,  /* "source": the first eligible marker */
	CWI_AC_FIX_FULL     /* "full": the pipeline end */
} cwi_ac_kind;

typedef struct cwi_ac_config {
	cwi_ac_kind kind;
	bool allow_frozen_random; /* the user accepts caching downstream of
				   * a random operator (one draw, replayed) */
	uint32_t profile_batches; /* decide after this many batches of the
				   * first pass (default 100, cachew 300) */
	double drift;             /* revisit when a measurement moves more
				   * than this fraction (0.25); default only */
} cwi_ac_config;

/* Fills c with the defaults of the "default" policy. */
void cwi_ac_config_default(cwi_ac_config *c);

/* Sets c->kind from "default", "cachew", "compute", "source" or "full",
 * and profile_batches to that policy's default (300 for "cachew"), leaving
 * the other fields. CACHEW_EINVAL with cachew_errmsg() naming the spelling
 * on anything else. */
cachew_err cwi_ac_parse(cwi_ac_config *c, const char *spec);

/* The canonical spelling of kind ("default", "cachew", ...). */
const char *cwi_ac_kind_name(cwi_ac_kind kind);

/* ---- candidates --------------------------------------------------------- */

typedef struct cwi_ac_candidate {
	const cwi_node *node; /* the marker or the last node; borrowed from
			       * the graph the plan was built from */
	int index;            /* the node's row in pipeline order: the "idx"
			       * of the workers' "idx:op" counters */
	bool full;            /* the pipeline end (a marker that is the end
			       * is one candidate, full) */
	bool random_upstream; /* a random operator feeds it */
	char random_op[64];   /* the first such operator, e.g. "shuffle" or
			       * "map/uniform"; "" when none */
} cwi_ac_candidate;

typedef struct cwi_ac_plan {
	size_t nnodes; /* nodes in pipeline order: inputs before a node,
			* each node once (the executor's stats rows) */
	size_t ncand;  /* >= 1; the last one is the pipeline end */
	cwi_ac_candidate cand[CWI_AC_MAX_CANDIDATES];
	/* upstream[i * ncand + k]: node i is candidate k's node or feeds it. */
	uint8_t *upstream;
} cwi_ac_plan;

/* Builds the plan of the pipeline ending at `end`: its candidates in
 * pipeline order, each with whether a random operator (an operator
 * flagged CWI_OPF_RANDOM, or a map/filter/flat_map whose function is
 * CACHEW_OP_RANDOM) is at or upstream of it. CACHEW_EINVAL naming the
 * limit when there are more than CWI_AC_MAX_CANDIDATES candidates;
 * CACHEW_ENOMEM. The plan borrows the graph: keep `end` alive while the
 * plan is used. Free with cwi_autocache_plan_free (NULL is a no-op). */
cachew_err cwi_autocache_plan(const cwi_node *end, cwi_ac_plan **out);
void cwi_autocache_plan_free(cwi_ac_plan *p);

/* ---- measurements ------------------------------------------------------- */

/* What is known at one candidate. Per-row figures are per row of this
 * candidate's output; busy time is summed over threads (CPU-like time of
 * one pipeline copy), so a pass takes rows * ns / parallelism. */
typedef struct cwi_ac_point {
	double rows;          /* rows per epoch here */
	double row_bytes;     /* mean bytes per row here (what a cache
			       * stores and reads back, uncompressed) */
	double up_ns;         /* compute per row up to and including here */
	double after_ns;      /* compute after here, per row of here */
	bool cached;          /* a complete cache of this point exists
			       * (found by fingerprint) */
	bool writing;         /* a write of this point started with the
			       * current pass and is still going */
} cwi_ac_point;

/* The cache storage, as cwi_cache_probe measured it (one reader/writer),
 * and the root's capacity as the dispatcher accounts for it. */
typedef struct cwi_ac_storage {
	double read_mb_per_s;    /* per reader, MB = 1e6 bytes */
	double read_rows_per_s;  /* per reader; bounds small rows (per-row
				  * overhead). 0: no bound */
	double write_mb_per_s;   /* per writer */
	double read_mb_per_s_max; /* all readers together (a shared file
				   * system's limit); 0: no limit */
	uint64_t capacity_bytes; /* 0: unbounded */
	uint64_t used_bytes;     /* held by caches that will not be evicted
				  * for this one */
} cwi_ac_storage;

typedef struct cwi_ac_inputs {
	size_t n;                  /* candidates, as in the plan */
	cwi_ac_point point[CWI_AC_MAX_CANDIDATES];
	const cwi_ac_candidate *cand; /* the plan's candidates (random_upstream,
				       * full); borrowed */
	cwi_ac_storage storage;
	double parallelism;        /* pipeline copies running: the workers
				    * (each reads and writes for itself) */
	double epochs_after;       /* passes still to run after the current
				    * one */
	double current_left;       /* fraction of the current pass still to
				    * run (0 between passes) */
} cwi_ac_inputs;

/* Fills in->point[k].rows, row_bytes, up_ns and after_ns from per-operator
 * counters. Each counter's name is "idx:op" or "idx:op/detail" (the
 * workers' heartbeat form); counters with the same idx (from several
 * tasks) are added. epoch_fraction (0, 1] is the fraction of a pass the
 * counters cover, to scale elements to rows per epoch. Leaves cached,
 * writing and the other fields alone. CACHEW_EINVAL naming the counter for
 * a name without a valid index or an index outside the plan, or when a
 * candidate produced no elements yet (nothing to measure). */
typedef struct cwi_ac_counter {
	const char *name;
	uint64_t elements;
	uint64_t bytes;
	uint64_t busy_ns;
} cwi_ac_counter;
cachew_err cwi_autocache_measure(const cwi_ac_plan *plan,
    const cwi_ac_counter *ops, size_t nops, double epoch_fraction,
    cwi_ac_inputs *in);

/* ---- decisions ---------------------------------------------------------- */

typedef enum cwi_ac_choice {
	CWI_AC_CHOICE_COMPUTE = 0,
	CWI_AC_CHOICE_SOURCE, /* a cache at a marker before the end */
	CWI_AC_CHOICE_FULL    /* a cache at the pipeline end */
} cwi_ac_choice;

const char *cwi_ac_choice_name(cwi_ac_choice c); /* "compute", ... */

typedef struct cwi_ac_estimate {
	bool eligible;    /* may be chosen */
	char why_not[96]; /* when not: "random upstream (shuffle)", "needs
			   * 3.1 GB, 1.2 GB free of 4.0 GB", ... */
	double epoch_s;   /* a pass in steady state: compute, or GET here */
	double put_s;     /* the PUT pass (compute + write); 0 if cached */
	double total_s;   /* from now to the last pass (INFINITY when not
			   * eligible) */
	double bytes;     /* the cache's size */
} cwi_ac_estimate;

typedef struct cwi_ac_decision {
	cwi_ac_choice choice;
	int candidate;                /* index into the plan; -1: compute */
	cwi_ac_estimate compute;      /* the COMPUTE option */
	cwi_ac_estimate cache[CWI_AC_MAX_CANDIDATES];
	size_t n;                     /* entries of cache[] */
	char reason[640];             /* for the decision log and status */
} cwi_ac_decision;

/* Our rule. Per candidate k (rows r, bytes b, P = parallelism):
 *   compute pass C   = r_end * up_end / P
 *   GET pass     G_k = r*max(b/read, 1/rows_per_s)/P (or the aggregate
 *                      limit, whichever is slower) + r*after/P
 *   write        W_k = r*b / write / P;  PUT pass = C + W_k
 *   total: compute        (current_left + epochs_after)*C
 *          k cached       (current_left + epochs_after)*G_k
 *          k being written current_left*(C+W_k) + epochs_after*G_k
 *          otherwise      current_left*C + (C+W_k) + (epochs_after-1)*G_k
 * (a cache is read only by passes after the one that writes it, so with
 * epochs_after <= 1 an unwritten cache never pays; the rest of the
 * current pass is counted as computing for it, which is what it does
 * outside GET). The cheapest total
 * wins; ties go to computing, then to the earlier candidate. Not eligible:
 * random upstream (unless allowed), not fitting capacity, no pass left to
 * read it. Fills every estimate and a reason naming the choice, the
 * runner-up and anything excluded. */
void cwi_autocache_decide(const cwi_ac_config *cfg, const cwi_ac_inputs *in,
    cwi_ac_decision *out);

/* Cachew's rule on the same inputs (its own estimates): compute
 * C = r_end * up_end, full = r_end * table(b_end), source at marker k =
 * r_k * table(b_k) + r_k * after_k, all divided by parallelism; the
 * cheapest wins. Ignores the measured storage, write cost, capacity,
 * remaining epochs and existing caches, as Cachew did; the random guard
 * and capacity are still applied (a system rule, not a policy one). */
void cwi_autocache_decide_cachew(const cwi_ac_config *cfg,
    const cwi_ac_inputs *in, cwi_ac_decision *out);

/* The static offline table Cachew's rule uses: read time in microseconds
 * per row of row_bytes, interpolated linearly between measured sizes
 * (docs/autocaching.md prints it). */
double cwi_autocache_table_us(double row_bytes);

/* True when a measurement in `now` is more than cfg->drift away (relative)
 * from `assumed` (what the last decision used): a candidate's rows, row
 * bytes, up_ns or after_ns, or the storage's read, rows/s or write rate.
 * Worker count and epoch progress are not drift (the autoscaler changes
 * them; the model scales with them). why (may be NULL) gets the first
 * drifted measurement, e.g. "read_mb_per_s 400 -> 250 (-38%)". */
bool cwi_autocache_drifted(const cwi_ac_config *cfg,
    const cwi_ac_inputs *assumed, const cwi_ac_inputs *now, char *why,
    size_t why_size);

/* ---- a job's modes ------------------------------------------------------ */

typedef enum cwi_ac_mode {
	CWI_AC_PROFILE = 0, /* "profile": computing and measuring (default:
			     * also writing every eligible candidate) */
	CWI_AC_PUT,         /* "put": computing and writing the chosen cache */
	CWI_AC_GET,         /* "get": reading the chosen cache */
	CWI_AC_COMPUTE      /* "compute": computing, no cache */
} cwi_ac_mode;

const char *cwi_ac_mode_name(cwi_ac_mode m);

/* The autocaching state of one job. The dispatcher owns one per job and
 * drives it from its decision loop:
 *   cwi_ac_job_start        when the job starts (knows which caches exist)
 *   cwi_ac_job_batches      as client batches are reported; true once
 *                           profile_batches were seen in PROFILE: decide
 *   cwi_ac_job_decide       with inputs measured so far
 *   cwi_ac_job_pass_end     when a pass (epoch) ends, with whether the
 *                           cache being written committed
 *   cwi_ac_job_observe      with fresh inputs now and then (default
 *                           revisits on drift; cachew never does)
 * mode is what workers run now; target the candidate they cache or read
 * (-1: none); writes the candidates written in this pass (several while
 * "default" profiles); event says what the last call changed, for the
 * events log ("" when nothing).
 *
 * In GET the upstream of the cache does not run, so its up_ns cannot be
 * measured: the dispatcher copies what it cannot measure in the current
 * mode from j->assumed before calling cwi_ac_job_observe, and persists
 * j->assumed with the job's fingerprint so a later job (which starts in
 * GET on an existing cache) has a profile. */
typedef struct cwi_ac_job {
	cwi_ac_config cfg;
	cwi_ac_mode mode;
	int target;            /* candidate read (GET) or written (PUT);
				* -1: none */
	int pending;           /* candidate to PUT when this pass ends; -1 */
	uint32_t writes;       /* bit k: candidate k is written this pass */
	bool decided;          /* a decision was made */
	uint64_t batches;      /* batches seen in PROFILE */
	double epoch_s;        /* estimated pass time of the current mode
				* (0: unknown, before a decision) */
	double worker_scale;   /* at the last mode change: new pass time /
				* old pass time (1 when unknown); scale the
				* job's worker count by it */
	cwi_ac_inputs assumed; /* what the last decision used (n = 0: none
				* yet) */
	cwi_ac_decision last;  /* the last decision */
	char event[768];
} cwi_ac_job;

/* Starts a job on a plan. cached[k] (may be NULL) says a complete cache of
 * candidate k exists: the job then reads it at once (GET at the eligible
 * cached candidate nearest the end, the least compute after it), as
 * Cachew did; otherwise it starts in PROFILE. Under "default" the PROFILE
 * pass writes every eligible candidate; under fixed policies the job
 * starts in PUT at its candidate (or COMPUTE), without profiling. */
void cwi_ac_job_start(cwi_ac_job *j, const cwi_ac_config *cfg,
    const cwi_ac_plan *plan, const bool *cached);

/* Counts batches; true when the job is in PROFILE, has not decided, and
 * has now seen profile_batches. */
bool cwi_ac_job_batches(cwi_ac_job *j, uint64_t batches);

/* Decides with the job's policy and moves the job on: a cached choice ->
 * GET; a choice being written (default's speculative writes) -> PUT for
 * the rest of the pass, the other writes abandoned; a choice not being
 * written -> the rest of the pass computes and the next one writes; COMPUTE
 * -> COMPUTE. Records the inputs as the assumption for drift. */
void cwi_ac_job_decide(cwi_ac_job *j, const cwi_ac_inputs *in);

/* A pass ended. committed: the cache of `target` written during it is now
 * complete (false when the write was abandoned: capacity, I/O error).
 * PUT that committed -> GET; PUT that did not -> COMPUTE (the reason
 * logged); a pending PUT (j->pending) -> PUT; PROFILE without a decision
 * (a pass shorter than profile_batches) stays PROFILE: the dispatcher
 * should rather decide first with what the pass measured, so default's
 * speculative writes (complete now) are counted as cached. */
void cwi_ac_job_pass_end(cwi_ac_job *j, bool committed);

/* Fresh measurements. Under "default", when decided and the inputs have
 * drifted from the assumption, decides again (the current cache counts as
 * cached) and returns true if the choice changed. Cachew's rule and the
 * fixed policies never revisit: false. */
bool cwi_ac_job_observe(cwi_ac_job *j, const cwi_ac_inputs *in);

#endif /* CWI_AUTOCACHE_H */
