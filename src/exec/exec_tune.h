/*
 * exec_tune.h - what the threaded operators of src/exec (parallel map,
 * prefetch, parallel interleave) share: the per-pipeline budgets (threads
 * of parallel=auto operators, bytes held in buffers), cancellation
 * wake-ups, worker crews, the chunk sizer, the autotune rules and the text
 * of operator-function errors reported later than they happen.
 *
 * Thread safety: the registry functions (cwi_tune_*) are thread safe. A
 * crew is driven under its operator's lock. A sizer is thread safe. The
 * rule functions are pure.
 */
#ifndef CWI_EXEC_TUNE_H
#define CWI_EXEC_TUNE_H

#include "exec.h"

/* ---- per-pipeline budgets and cancellation ------------------------------ */

typedef struct cwi_tuner cwi_tuner;

/* One threaded operator instance, as the pipeline's tuner knows it. Embed
 * it in the iterator; it must stay attached until the iterator's threads
 * are joined. */
typedef struct cwi_tune_op {
	cwi_tuner *tuner;
	struct cwi_tune_op *next;
	/* Called on pipeline cancellation with the registry lock held: must
	 * only take the operator's own lock, set its cancel flag and wake its
	 * waiters. */
	void (*wake)(void *arg);
	void *arg;
	int threads;          /* budget threads held (registry lock) */
	_Atomic int64_t bytes; /* bytes this operator holds in buffers */
} cwi_tune_op;

/* Registers op with the pipeline's tuner (creating it for the first
 * operator). CACHEW_ENOMEM on failure. */
cachew_err cwi_tune_attach(cwi_tune_op *op, cwi_pipeline *pl,
    void (*wake)(void *arg), void *arg);
/* Unregisters op, returning its threads and bytes to the budgets. */
void cwi_tune_detach(cwi_tune_op *op);
/* Takes up to n threads from the pipeline's budget for parallel=auto
 * operators; returns how many were granted (possibly 0). */
int cwi_tune_take_threads(cwi_tune_op *op, int n);
void cwi_tune_give_threads(cwi_tune_op *op, int n);
/* Accounts bytes entering (delta > 0) or leaving an operator's buffers. */
void cwi_tune_bytes_add(cwi_tune_op *op, int64_t delta);
/* True while all buffers of the pipeline together hold less than the
 * RAM budget. Producers that hold nothing may always produce one chunk, so
 * a pipeline over budget slows down but never deadlocks. */
bool cwi_tune_bytes_ok(const cwi_tune_op *op);
int64_t cwi_tune_ram_budget(const cwi_tune_op *op);
/* If the pipeline is cancelled, wakes every registered operator (their
 * threads may be blocked on each other). Each destroy calls this first:
 * the iterator tree is destroyed top-down, so the first threaded operator
 * destroyed releases every thread below it. Call without operator locks. */
void cwi_tune_cancel(cwi_pipeline *pl);

/* ---- locks ------------------------------------------------------------------ */

/* Initialises an operator lock that spins briefly before sleeping: the
 * executor's critical sections are a few dozen instructions, and sleeping
 * on a contended lock costs a futex wake-up (5-50 us here). */
void cwi_mutex_init(pthread_mutex_t *mu);

/* ---- worker crews ---------------------------------------------------------- */

typedef struct cwi_crew_member {
	void *op;
	int id; /* 0-based: a member parks while id >= crew active */
	pthread_t tid;
} cwi_crew_member;

typedef struct cwi_crew {
	cwi_crew_member *members; /* cap entries */
	int cap;                  /* most threads it may ever run */
	int spawned;              /* threads started (joined at the end) */
	int active;               /* threads that may work; the rest park */
} cwi_crew;

cachew_err cwi_crew_init(cwi_crew *c, int cap);
/* Sets the active count to n (<= cap), starting threads as needed. The
 * caller holds its operator's lock and wakes parked members itself.
 * CACHEW_ENOMEM when no thread could be started for n > 0; otherwise
 * active is what could be started. */
cachew_err cwi_crew_set(cwi_crew *c, int n, void *(*main)(void *), void *op);
/* Joins the started threads: the caller has told them to stop and holds
 * no lock. */
void cwi_crew_join(cwi_crew *c);
void cwi_crew_free(cwi_crew *c);

/* ---- chunk sizing ------------------------------------------------------------- */

/* Work per hand-off between threads. A blocking wake-up costs 5-50 us
 * here, and with more runnable threads than cores a hand-off measured
 * 50-80 us of a worker's time (waking the consumer, which then preempts
 * a lock holder). map(spin_us, us=50, parallel=2) on 2 idle cores: 1.82x
 * the inline speed with 150 us chunks, 1.93x with 500 us; with other load
 * on the cores 150 us chunks lost a third of the throughput. */
#define CWI_CHUNK_TARGET_NS 500000u
#define CWI_CHUNK_MAX 1024u

/* Moving one element between threads costs 50-130 ns here (mostly the
 * allocator: an element malloc'd on one thread and freed on another),
 * more than a cheap function and its input cost in total. A parallel
 * operator whose measured cost per element stays below the first bound
 * runs its chunks on the consumer thread; above the second it uses its
 * workers again. */
#define CWI_INLINE_BELOW_NS 200u
#define CWI_INLINE_ABOVE_NS 400u

/* An estimate of the cost of one element (moving average), from which the
 * chunk size follows. */
typedef struct cwi_sizer {
	_Atomic uint64_t cost; /* ns per element x 256; 0 = not measured */
} cwi_sizer;

/* hint_ns: the function's declared cost (0 = unknown: start with 1). */
void cwi_sizer_init(cwi_sizer *s, double hint_ns);
void cwi_sizer_update(cwi_sizer *s, size_t n, uint64_t ns);
/* Elements per chunk, 1..CWI_CHUNK_MAX. */
size_t cwi_sizer_chunk(const cwi_sizer *s);
/* Whether a parallel operator should run inline given its current mode
 * (the hysteresis of CWI_INLINE_BELOW_NS / CWI_INLINE_ABOVE_NS). */
bool cwi_sizer_inline(const cwi_sizer *s, bool now_inline);

/* ---- autotune rules (pure) ---------------------------------------------------- */

#define CWI_TUNE_INTERVAL_NS 30000000u /* 30 ms */

/* What a parallel operator's consumer saw during one interval. */
typedef struct cwi_tune_sample {
	uint64_t interval_ns;
	uint64_t wait_ns; /* consumer blocked on the operator */
	uint64_t busy_ns; /* workers' own work, summed over workers */
	int workers;      /* active workers during the interval */
} cwi_tune_sample;

/* +1: add a worker, -1: remove one, 0: keep. */
int cwi_tune_workers_rule(const cwi_tune_sample *s);

/* What a prefetch consumer saw during one interval. */
typedef struct cwi_tune_buffer_sample {
	uint64_t interval_ns;
	uint64_t wait_ns; /* consumer blocked on an empty buffer */
	bool was_full;    /* the buffer reached its limit */
} cwi_tune_buffer_sample;

/* True: double the buffer (the caller applies its caps). */
bool cwi_tune_buffer_rule(const cwi_tune_buffer_sample *s);

/* The interval bookkeeping of one auto operator's consumer. */
typedef struct cwi_tune_clock {
	uint64_t t0;
	uint64_t wait0;
	uint64_t busy0;
} cwi_tune_clock;

/* True once per interval: fills *s with the deltas since the last time
 * and restarts the interval. */
bool cwi_tune_clock_due(cwi_tune_clock *c, uint64_t now, uint64_t wait_ns,
    uint64_t busy_ns, uint64_t *dt, uint64_t *dwait, uint64_t *dbusy);

/* ---- deferred function errors -------------------------------------------------- */

/* The message an operator-function failure is reported with, as
 * cwi_apply_map formats it: "map(add): <reason> (element 17)". Parallel
 * operators keep it with the failing chunk and hand it to
 * cwi_pipeline_fail only when the consumer reaches that point, so the
 * pipeline reports the first failure in element order. Returns a heap
 * string (free()) or NULL on ENOMEM. */
char *cwi_fn_errmsg(
    const cwi_node *node, const cachew_op_ctx *ctx, cachew_err rv);
/* The code a failing function's result maps to (EOF and OK become EOP). */
static inline cachew_err
cwi_fn_errcode(cachew_err rv)
{
	return rv == CACHEW_OK || rv == CACHEW_EOF ? CACHEW_EOP : rv;
}

#endif /* CWI_EXEC_TUNE_H */
