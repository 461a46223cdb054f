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
 * profiles and storage measurements persist in a state file (key=value
 * lines, rewritten atomically), so a restarted dispatcher or a new job with
 * the same fingerprint reuses them.
 *
 * Decisions are the pure functions of src/policy/autocache.h. What runs
 * here does I/O (probing the storage, committing caches, the state file),
 * so the caller calls it outside its own state lock.
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
	const char *state_path;    /* persistence (NULL: memory only) */
	double default_epochs;     /* passes expected when the client does
				    * not say (10) */
	uint64_t probe_bytes;      /* bytes the storage probe writes (64 MiB) */
} cwi_dcache_config;

typedef struct cwi_dcache cwi_dcache;

/* Opens the cache root and loads the state file (a missing file is an
 * empty state; a damaged line is skipped with a warning naming it).
 * CACHEW_EINVAL for a bad policy; root errors; CACHEW_ENOMEM. */
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

#endif /* CWI_DISPATCHER_AUTOCACHE_H */
