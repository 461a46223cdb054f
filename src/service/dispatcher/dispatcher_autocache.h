/*
 * dispatcher_autocache.h - the dispatcher's autocaching: which pipeline
 * each pass (job iteration) of a dataset runs, and what it learns.
 *
 * Per dataset fingerprint the dispatcher moves through the modes of
 * src/policy/autocache.h at pass boundaries:
 *   PROFILE  the first pass of a pipeline that has no decision: it runs as
 *            registered and its per-operator counters are the profile;
 *   PUT      the pipeline with cache_put(root, write_id) at the chosen
 *            point: every lease writes a part, and when the pass ends with
 *            every split acknowledged the parts are committed;
 *   GET      cache_get(root, fp) in place of everything up to the point,
 *            split by cache chunk;
 *   COMPUTE  as registered, for good.
 * A pipeline whose chosen point (or any eligible candidate) is already
 * cached starts in GET at once, whoever wrote the cache. Decisions,
 * profiles and storage measurements are the planner's state: lines of
 * text (below) that the dispatcher journals after every call and gives
 * back at a restart (dispatcher_planner.c), so a restarted dispatcher or
 * a new job with the same fingerprint reuses them.
 *
 * Decisions are the pure functions of src/policy/autocache.h. What runs
 * here does I/O (probing the storage, committing caches), so the caller
 * calls it outside its own state lock.
 *
 * Thread safety: every call is safe from any thread (one internal lock,
 * held across the I/O of one call).
 */
#ifndef CWI_DISPATCHER_AUTOCACHE_H
#define CWI_DISPATCHER_AUTOCACHE_H

#include "../../policy/autocache.h"

typedef struct cwi_dcache_config {
	const char *root;          /* cache root (a directory or s3://...) */
	uint64_t capacity_bytes;   /* 0: unbounded */
	const char *policy;        /* "default", "cachew", "compute",
				    * "source", "full" (NULL: default) */
	bool allow_frozen_random;  /* cache after random operators */
	double default_epochs;     /* passes expected when the client does
				    * not say (10) */
	uint64_t probe_bytes;      /* bytes the storage probe writes (64 MiB) */
} cwi_dcache_config;

typedef struct cwi_dcache cwi_dcache;

/* Opens the cache root; the planner starts with an empty state
 * (cwi_dcache_load gives it one). CACHEW_EINVAL for a bad policy; root
 * errors; CACHEW_ENOMEM. */
cachew_err cwi_dcache_create(cwi_dcache **out, const cwi_dcache_config *cfg);
void cwi_dcache_destroy(cwi_dcache *dc);

/* What one pass of a dataset runs. */
typedef struct cwi_dcache_pass {
	cwi_ac_mode mode;
	uint8_t *graph;     /* msgpack graph the workers run (owned) */
	size_t graph_len;
	uint64_t units;     /* split units of its source */
	uint64_t write_id;  /* PUT: the distributed write's id; else 0 */
	int candidate;      /* the point read or written; -1: none */
	/* The estimated pass time of this mode over that of the dataset's
	 * previous pass (0: unknown): a job that carries its worker count
	 * over from the previous pass scales it by this. */
	double worker_scale;
	char event[512];    /* what was decided, for the events log */
} cwi_dcache_pass;

void cwi_dcache_pass_free(cwi_dcache_pass *p);

/* The pass that a new iteration of the dataset `graph` (its worker part as
 * registered: msgpack, `units` split units) runs now. epochs_left counts
 * this pass and the ones after it (0: unknown, the configured default).
 * A pipeline the policy cannot plan (too many markers) computes. */
cachew_err cwi_dcache_pass_start(cwi_dcache *dc, const uint8_t *graph,
    size_t graph_len, uint64_t units, double epochs_left,
    cwi_dcache_pass *pass);

/* A pass ended. complete: every split was acknowledged (only then is a
 * PUT committed; an incomplete one is abandoned). ops: the per-operator
 * counters of the pass summed over its tasks (names "idx:op"), used by a
 * PROFILE pass; parallelism: the workers it ran on. Writes what happened
 * to event (may be NULL). Errors of committing or probing are not
 * returned: they move the dataset to COMPUTE with the reason in event. */
void cwi_dcache_pass_end(cwi_dcache *dc, const uint8_t *graph,
    size_t graph_len, const cwi_dcache_pass *pass, bool complete,
    const cwi_ac_counter *ops, size_t nops, double parallelism,
    char *event, size_t event_size);

/* One line per dataset known: "fp mode choice reason". */
cachew_err cwi_dcache_describe(cwi_dcache *dc, cwi_strbuf *sb);

/*
 * The planner's state as text (docs/journal.md, "The planner's state"):
 * one line per fact, each ending in '\n', the storage line first, then
 * one line per dataset in the order the planner first met them:
 *   storage read_mb_per_s=R read_rows_per_s=S write_mb_per_s=W
 *   dataset fp=HEX decided=0|1 choice=NAME candidate=K failed=0|1
 *       epochs=E compute_s=C cache_s=X n=N p0=rows,bytes,up_ns,after_ns
 *       ... put_failures=F last=MODE|none reason=TEXT
 * (a dataset line is one line). HEX is the fingerprint in 32 lowercase
 * hex digits; `reason` is last and runs to the end of the line. A line
 * is named by its key, "storage" or "dataset fp=HEX": a later line with
 * the same key replaces it, and none is ever removed.
 */
#define CWI_DCACHE_LINE_MAX 4096     /* a line's bytes, '\n' included */
#define CWI_DCACHE_MAX_DATASETS 4096 /* dataset lines */

/* Appends the whole state to sb. CACHEW_ENOMEM. */
cachew_err cwi_dcache_save(cwi_dcache *dc, cwi_strbuf *sb);
/* Takes in lines of the state (as cwi_dcache_save writes them; a line
 * replaces the planner's of the same key). CACHEW_ECORRUPT naming the
 * line that is not one (nothing of the text is taken then);
 * CACHEW_ENOMEM. */
cachew_err cwi_dcache_load(cwi_dcache *dc, const char *text, size_t len);
/* Reads a state file of an earlier version (<work_dir>/autocache.state,
 * which those rewrote after every change), for the dispatcher's import
 * into its journal: *found false when there is none. A line that does
 * not parse is skipped with a warning naming it. CACHEW_EIO naming the
 * file; CACHEW_ENOMEM. */
cachew_err cwi_dcache_import(cwi_dcache *dc, const char *path, bool *found);
/* Checks that line (len bytes, no '\n') is a line of the state and sets
 * *key_len to the length of its key. CACHEW_ECORRUPT saying what is
 * wrong. Pure: for the journal's and the snapshot's readers. */
cachew_err cwi_dcache_line_check(const char *line, size_t len,
    size_t *key_len);

#endif /* CWI_DISPATCHER_AUTOCACHE_H */
