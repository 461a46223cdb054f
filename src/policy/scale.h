/*
 * scale.h - autoscaling and fair share: pure policy functions.
 *
 * A scaler turns a stream of job observations (a client heartbeat merged
 * with the workers' latest reports, every ~500 ms) into a worker count for
 * that job. It has no clock, no I/O and no locks: the dispatcher, the
 * embedded mode and the simulator (`cachew sim`) feed it the same samples
 * and get the same decisions. docs/policies.md explains each policy.
 *
 * Policies (cwi_scale_parse spellings):
 * - "model" (the default): estimates each worker's throughput and the
 *   consumer's demand (its rate when it never waits), jumps to the smallest
 *   count that meets demand with headroom, confirms with one probe step
 *   (judged by the client's extra waiting, not its batch time, and only
 *   once the client's buffer has stopped hiding a shortfall; watched for
 *   probe_watch_ns), then keeps Cachew's drift re-check.
 * - "cachew": Cachew's published rule, faithfully: windows of
 *   window_batches batches (discarding discard_epoch at an epoch start and
 *   discard_change after each change); with r = 1 - T_new/T_prev add one
 *   worker while r > improve, else settle on the smaller count; then every
 *   drift_every-th sample is compared with the settled one and a
 *   drift_factor change in batch time or client queue moves the count by
 *   one. One worker per step, at least min_step_batches batches per step.
 * - "fixed:N": always N.
 * - "hpa:P": Kubernetes' horizontal pod autoscaler at P% CPU:
 *   ceil(workers * utilisation / (P/100)), with its 10% tolerance.
 *
 * Thread safety: a cwi_scaler is used by one thread at a time.
 */
#ifndef CWI_SCALE_H
#define CWI_SCALE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachew.h"

typedef enum cwi_scale_kind {
	CWI_SCALE_MODEL = 0,
	CWI_SCALE_CACHEW,
	CWI_SCALE_FIXED,
	CWI_SCALE_HPA
} cwi_scale_kind;

typedef struct cwi_scale_config {
	cwi_scale_kind kind;
	uint32_t fixed;            /* fixed:N */
	double hpa_target;         /* hpa:80 -> 0.80 */
	uint32_t min_workers;      /* 1 */
	uint32_t max_workers;      /* UINT32_MAX: bounded by the pool */
	uint64_t cooldown_ns;      /* at least this between changes (0) */
	uint32_t window_batches;   /* batches per measurement window (500) */
	uint32_t discard_epoch;    /* batches ignored at an epoch start (200) */
	uint32_t discard_change;   /* batches ignored after a change (150) */
	uint32_t min_step_batches; /* batches per scaling step (650) */
	double improve;            /* cachew: add while r > this (0.07) */
	uint32_t drift_every;      /* re-check every this many samples (21) */
	double drift_factor;       /* a change by this factor is drift (1.4) */
	double headroom;           /* model: demand x (1 + headroom) (0.10) */
	/* "model" only: a measurement window also ends once it has lasted
	 * window_max_ns and holds min_window_batches batches, and a discard
	 * once it has lasted discard_max_ns, so a slow start (one worker at
	 * 1.6 batches/s) decides in about a minute rather than after 700
	 * batches. 0 means by batches only, as "cachew" always does. */
	uint64_t window_max_ns;      /* 60 s */
	uint32_t min_window_batches; /* 50 */
	uint64_t discard_max_ns;     /* 30 s */
	/* "model" only: the probe at fewer workers lasts at least
	 * probe_min_ns (besides the window's batches), so a handful of
	 * heartbeats cannot decide it. When the client's buffer drains
	 * during the probe (elements buffered at the larger count hide a
	 * shortfall), the probe is judged on the batches after the client
	 * first waits; if it has not waited after probe_max_ns of draining
	 * the evidence is ambiguous and the larger count wins. A kept probe
	 * is judged again every window until probe_watch_ns have passed
	 * since the step down (a removed worker first delivers the splits
	 * it leased). */
	uint64_t probe_min_ns;       /* 10 s */
	uint64_t probe_max_ns;       /* 300 s */
	uint64_t probe_watch_ns;     /* 120 s */
} cwi_scale_config;

/* Fills c with the defaults above for the "model" policy. */
void cwi_scale_config_default(cwi_scale_config *c);

/* Sets c->kind (and fixed / hpa_target) from "model", "cachew",
 * "fixed:N" (N >= 1) or "hpa:P" (1 <= P <= 100), leaving the other fields.
 * CACHEW_EINVAL with cachew_errmsg() naming the spelling on anything else. */
cachew_err cwi_scale_parse(cwi_scale_config *c, const char *spec);

/* Writes the canonical spelling of c's policy ("model", "fixed:4", ...)
 * into buf (NUL-terminated, truncated to size). */
void cwi_scale_name(const cwi_scale_config *c, char *buf, size_t size);

/* One observation of a job. Counts are deltas since the previous sample
 * of the same job; rates and fractions are over that interval. */
typedef struct cwi_scale_sample {
	uint64_t now_ns;       /* any monotonic clock; goes forward */
	uint64_t batches;      /* batches each client consumed (mean over
				* the job's clients) since the last sample */
	uint64_t elapsed_ns;   /* the time those batches took */
	uint64_t wait_ns;      /* of elapsed_ns, time clients waited for
				* data (mean over clients) */
	double buffer_fill;    /* client buffer occupancy 0..1 (mean) */
	bool epoch_start;      /* a new epoch began since the last sample */
	uint32_t workers;      /* workers serving the job during the interval */
	double worker_busy;    /* mean fraction of the interval the workers'
				* pipelines produced rather than stalled on a
				* full output queue (0..1; < 0: unknown) */
	double worker_cpu;     /* mean CPU utilisation of the workers, as a
				* fraction of their cores (0..1; < 0: unknown) */
} cwi_scale_sample;

/* The kind of a decision's reason: a fixed set, so a bounded label
 * (cachew_scale_decisions_total{reason}); the reason's text carries the
 * numbers. */
typedef enum cwi_scale_why {
	CWI_WHY_RESTORED = 0, /* recovered from the journal: the text is
			       * the one before the restart */
	CWI_WHY_START,        /* the first count (cachew, hpa; model:
			       * measure) */
	CWI_WHY_FIXED,        /* fixed:N */
	CWI_WHY_BOUND,        /* at min_workers or max_workers */
	CWI_WHY_SEARCH,       /* cachew: first batch time: one more */
	CWI_WHY_GAIN,         /* cachew: the last worker paid: one more */
	CWI_WHY_NO_GAIN,      /* cachew: it did not (or was not granted):
			       * settle */
	CWI_WHY_DEMAND,       /* model: the demand's estimate needs this
			       * many (estimate, confirm, re-estimate) */
	CWI_WHY_SATURATED,    /* model: more workers did not help */
	CWI_WHY_PROBE,        /* model: trying a count */
	CWI_WHY_PROBE_KEPT,   /* model: the probe held */
	CWI_WHY_PROBE_REJECTED, /* model: the probe failed or was
				 * ambiguous: back */
	CWI_WHY_NO_WAIT,      /* model: the client never waits: probe */
	CWI_WHY_GRANTED,      /* model: fewer were granted than asked */
	CWI_WHY_DRIFT,        /* the settled count's batch time drifted */
	CWI_WHY_CPU,          /* hpa: CPU utilisation */
	CWI_WHY_N
} cwi_scale_why;

/* The label value of w ("restored", "start", ..., "cpu"; static). */
const char *cwi_scale_why_name(cwi_scale_why w);

typedef struct cwi_scale_decision {
	uint32_t workers; /* the count the job should have now */
	bool changed;     /* differs from the previous decision */
	bool settled;     /* the policy considers the count converged */
	cwi_scale_why why; /* the kind of reason */
	char reason[192]; /* one line for the events log and status */
} cwi_scale_decision;

typedef struct cwi_scaler cwi_scaler;

/* A scaler for one job starting at `initial` workers (clamped to the
 * bounds). cfg is copied. CACHEW_ENOMEM; CACHEW_EINVAL for bounds with
 * min_workers > max_workers. */
cachew_err cwi_scaler_create(cwi_scaler **out, const cwi_scale_config *cfg,
    uint32_t initial);
void cwi_scaler_destroy(cwi_scaler *s);

/* Feeds one sample and fills *dec with the decision that follows (which
 * may be the previous count). Never fails: a sample it cannot use (zero
 * elapsed time) is ignored; one without batches adds its time to the
 * current window (the client waited) and leaves the decision as it was. */
void cwi_scaler_observe(cwi_scaler *s, const cwi_scale_sample *smp,
    cwi_scale_decision *dec);

/* The current decision without feeding a sample. */
uint32_t cwi_scaler_target(const cwi_scaler *s);

/* Decision windows completed so far: measurement windows for "cachew"
 * and "model", evaluations (every 15 s of sample time) for "hpa", none
 * for "fixed". The simulator counts convergence in these. */
uint32_t cwi_scaler_windows(const cwi_scaler *s);

/* Restarts measuring from `workers` (clamped), as after a cache mode
 * change: the next windows are new (discard_change applies), earlier
 * estimates are dropped. Cachew's own rule resets to one worker instead;
 * "model" carries the count over. */
void cwi_scaler_reset(cwi_scaler *s, uint32_t workers);

/* Caps the scaler's notion of the count it has (fair share or the pool
 * gave it fewer workers than it asked for): its measurements are then
 * attributed to `granted` workers. */
void cwi_scaler_granted(cwi_scaler *s, uint32_t granted);

/*
 * Saving and loading a scaler whole (the dispatcher's snapshot): its
 * configuration and every part of its state, as one msgpack array, so
 * that a loaded scaler decides exactly as the saved one would have.
 * cwi_scaler_encode appends to sb (a cwi_strbuf: its oom flag says
 * whether memory ran out). cwi_scaler_decode reads one from d
 * (msgpack_doc.h) into *out (the caller's, destroy with
 * cwi_scaler_destroy) and checks every field, its bounds and its
 * configuration as cwi_scaler_create does; false with the error recorded
 * in d (the field named) and *out NULL otherwise.
 */
struct cwi_strbuf;
struct cwi_mp_doc;
void cwi_scaler_encode(const cwi_scaler *s, struct cwi_strbuf *sb);
bool cwi_scaler_decode(struct cwi_mp_doc *d, cwi_scaler **out);

/*
 * Weighted max-min fair share. n jobs want want[i] workers (0: none) with
 * weight[i] > 0; total workers exist. Fills got[i] <= want[i] so that no
 * job can get more without taking from a job whose got/weight is not
 * larger. No job with want >= 1 starves: while total >= the number of such
 * jobs each gets at least one; with fewer workers than jobs, the first
 * `total` of them in index order (the dispatcher orders by job age) get
 * one each. Workers nobody wants stay unassigned. Deterministic: ties
 * break by index.
 */
void cwi_fair_share(const uint32_t *want, const double *weight, size_t n,
    uint32_t total, uint32_t *got);

#endif /* CWI_SCALE_H */
