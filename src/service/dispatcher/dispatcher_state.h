/*
 * dispatcher_state.h - the dispatcher's state machine: workers, datasets,
 * jobs, clients, tasks and split leases, with no I/O, no threads and no
 * clock of its own.
 *
 * A server loop decodes a request (service_proto.h), calls the function
 * for that message with the current time, encodes the reply it filled, and
 * calls cwi_dispatcher_tick() now and then so silent workers and clients
 * time out. Tests drive the same functions with a clock they advance by
 * hand, so every timeout and race is reproducible.
 *
 * What it decides (docs/protocol.md, "Dispatcher rules", gives the why):
 * - Workers register and heartbeat; one silent for worker_timeout_ns is
 *   dead: its tasks go and every split it leased that no client has
 *   acknowledged returns to the pending pool, to be leased again.
 * - Datasets are known by fingerprint: the same graph gets the same id.
 * - Jobs are shared by name (and iteration) or private; a job ends when all
 *   its clients released it or timed out, and its workers go back to the
 *   pool.
 * - Each job gets tasks (one per worker) from a per-job worker count
 *   decision (cwi_worker_count_fn: by default all workers, or a fixed
 *   number), re-evaluated whenever workers or jobs change. A task removed
 *   from a running job takes no new leases and finishes its leased splits
 *   before it goes.
 * - distributed_epoch: the dataset's split units are grouped into splits
 *   (about splits_per_worker per worker), leased several at a time; a
 *   split is done when a client acknowledges it; the epoch is done when
 *   every split is. parallel_epochs: each task reads everything.
 * - Coordinated reads (num_consumers > 0): every consumer reads round r
 *   from the same task, the (r mod n)-th of the n tasks serving r in task
 *   id order (tf.data service's round-robin reads). Tasks join or leave the
 *   schedule at a round announced to every consumer first (block_round).
 * - The policy engine (config.autoscale): each job has a scaler
 *   (src/policy/scale.h) fed one sample per decision interval from its
 *   clients' heartbeats and its workers' task reports; weighted fair share
 *   over the running jobs, in creation order, turns what they want into
 *   what they get; the sum of what they want, within the pool bounds, is
 *   the pool target a provisioner turns into workers.
 * - Every state change is one JSON line in the events log.
 *
 * Thread safety: none inside. The caller serialises every call on one
 * dispatcher (one lock around each call). Event callbacks run inside the
 * call that caused them and must not call back into the dispatcher.
 */
#ifndef CWI_DISPATCHER_STATE_H
#define CWI_DISPATCHER_STATE_H

#include <stdio.h>

#include "../service_proto.h"
#include "../../policy/scale.h"

typedef struct cwi_dispatcher cwi_dispatcher;

/* What a worker count decision sees of a job. */
typedef struct cwi_job_view {
	uint64_t job_id;
	const char *name; /* NULL: private */
	cwi_processing_mode processing_mode;
	cwi_worker_policy worker_policy;
	uint32_t num_workers;       /* asked for with CWI_WORKERS_FIXED */
	uint32_t num_consumers;
	uint32_t clients;
	uint32_t tasks;             /* tasks that are not being removed */
	uint32_t workers_available; /* live workers that are not draining */
	uint64_t batch_time_ns;     /* mean over clients; 0 = not reported */
	uint64_t wait_time_ns;      /* mean over clients */
	double elements_per_s;      /* the job's delivery rate */
} cwi_job_view;

/* Returns how many workers a job should have now. Called with the caller's
 * lock held: pure, fast, no I/O, no calls into the dispatcher. The answer
 * is capped at workers_available. */
typedef uint32_t (*cwi_worker_count_fn)(void *ctx, const cwi_job_view *job);

/* The default decision: every available worker for CWI_WORKERS_ALL,
 * num_workers for CWI_WORKERS_FIXED. ctx is unused. */
uint32_t cwi_worker_count_default(void *ctx, const cwi_job_view *job);

typedef struct cwi_dispatcher_config {
	uint64_t worker_timeout_ns;     /* silent this long = dead (10 s) */
	uint64_t client_timeout_ns;     /* silent this long = gone (10 s) */
	uint32_t worker_heartbeat_ms;   /* told to workers (1000) */
	uint32_t client_heartbeat_ms;   /* told to clients (500) */
	uint32_t splits_per_worker;     /* splits per worker per epoch (8) */
	uint32_t max_lease;             /* splits in one lease reply (4) */
	uint32_t lease_size;            /* what task defs tell workers (4) */
	uint32_t lease_retry_ms;        /* none pending yet: ask after (100) */
	uint32_t coord_round_margin;    /* rounds between announcing a
					 * schedule change and it (16) */
	uint32_t max_finished_jobs;     /* finished jobs kept for status (16) */
	uint32_t max_consumers;         /* num_consumers limit (1024) */
	/* The worker count decision every new job starts with (NULL: the
	 * default); cwi_dispatcher_set_worker_count changes one job's. */
	cwi_worker_count_fn worker_count;
	void *worker_count_ctx;
	/* The policy engine. Off (false): every job's count comes from
	 * worker_count, as above. On: a job whose count no
	 * cwi_dispatcher_set_worker_count replaced gets a scaler with its
	 * own scale_policy, else fixed:num_workers for CWI_WORKERS_FIXED,
	 * else `scale` (from cwi_dispatcher_config_default: "model"), and
	 * fair share decides its count. */
	bool autoscale;
	cwi_scale_config scale;
	uint64_t decision_interval_ns; /* one sample per job (500 ms) */
	uint32_t min_workers;          /* pool target bounds (0) */
	uint32_t max_workers;          /* (0: none) */
	/* The pool target falls only after this many intervals that all
	 * asked for less (4), so a job's next epoch (a new job) finds its
	 * workers still there. */
	uint32_t pool_down_intervals;
	/* Events: each line (one JSON object, no newline) goes to event_fn
	 * and/or, followed by '\n', to event_file (flushed per line). */
	void (*event_fn)(void *ctx, const char *line, size_t len);
	void *event_ctx;
	FILE *event_file;
	/* Autocaching: frees the planner's context of a pass whose end was
	 * never taken (cwi_dispatcher_take_pass_ends). NULL: not needed. */
	void (*pass_free)(void *ctx);
	/* Data-path secrets (docs/security.md): with task_secrets, a task's
	 * secret is the SipHash-2-4, under task_key, of its id and the
	 * state's lineage (the same after a replay, unguessable without the
	 * key); its worker serves only requests that carry it. Without: 0,
	 * which workers do not check. */
	bool task_secrets;
	uint8_t task_key[16];
} cwi_dispatcher_config;

/* Fills cfg with the defaults named above (no events). */
void cwi_dispatcher_config_default(cwi_dispatcher_config *cfg);

/* A new, empty dispatcher. cfg is copied (event_file stays the caller's,
 * and must outlive the dispatcher); zero fields take their defaults.
 * CACHEW_ENOMEM. */
cachew_err cwi_dispatcher_create(cwi_dispatcher **out,
    const cwi_dispatcher_config *cfg);
void cwi_dispatcher_destroy(cwi_dispatcher *d);

/*
 * One function per request. Each takes the decoded request and the current
 * time (any monotonic nanosecond clock; it only has to go forward), fills
 * the reply, which it initialises itself and the caller frees with
 * cwi_pmsg_body_free (even after an error), and returns CACHEW_OK or an
 * error with a message for an error reply:
 * CACHEW_ENOENT for an unknown (or timed-out) worker, task, dataset, job
 * or client, CACHEW_EINVAL for a request that contradicts the state
 * (another dataset under an existing job name, a bad consumer index, a
 * split id out of range), CACHEW_EEXIST for a consumer index already
 * taken, CACHEW_ENOMEM. A call that fails with anything but
 * CACHEW_ENOMEM changes nothing.
 */
cachew_err cwi_dispatcher_worker_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_register *req, cwi_msg_worker_register_reply *rep);
cachew_err cwi_dispatcher_worker_heartbeat(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_heartbeat *req, cwi_msg_worker_heartbeat_reply *rep);
/* The start orders of job_id's tasks on worker_id (rep->start), as its
 * next heartbeat reply would give them; none for an unknown job. */
cachew_err cwi_dispatcher_job_starts(cwi_dispatcher *d, uint64_t job_id,
    uint64_t worker_id, cwi_msg_worker_heartbeat_reply *rep);
cachew_err cwi_dispatcher_worker_deregister(cwi_dispatcher *d,
    uint64_t now_ns, const cwi_msg_worker_deregister *req);
cachew_err cwi_dispatcher_dataset_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_dataset_register *req, cwi_msg_dataset_register_reply *rep);
cachew_err cwi_dispatcher_job_get_or_create(cwi_dispatcher *d,
    uint64_t now_ns, const cwi_msg_job_get_or_create *req,
    cwi_msg_job_get_or_create_reply *rep);
cachew_err cwi_dispatcher_client_heartbeat(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_client_heartbeat *req, cwi_msg_client_heartbeat_reply *rep);
cachew_err cwi_dispatcher_split_lease(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_split_lease *req, cwi_msg_split_lease_reply *rep);
/* Whether a split_lease request handled now would get nothing but
 * retry_ms: every split of an epoch not over is leased elsewhere (false
 * for a request that would fail, or end its task). Changes nothing: the
 * server holds such a request, and hands it to cwi_dispatcher_handle
 * again once this turns false (docs/protocol.md, "Held leases"). */
bool cwi_dispatcher_lease_waits(cwi_dispatcher *d,
    const cwi_msg_split_lease *req);
/* rep (may be NULL) says whether the job's data is now all acknowledged. */
cachew_err cwi_dispatcher_split_ack(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_split_ack *req, cwi_msg_ok *rep);
cachew_err cwi_dispatcher_job_release(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_job_release *req);
/* A task's counters at a lease's end; a task the dispatcher no longer has
 * is ENOENT (the worker drops the counters). */
cachew_err cwi_dispatcher_task_counters(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_task_counters *req);
/* Scaling decisions made since the process started, counted by the
 * policy's kind ("model", "cachew", "fixed": its spelling before any ':'),
 * what the decision did: "up", "down" (the count wanted moved), "settled"
 * or "unsettled" (the count stayed, the policy's convergence changed), and
 * the kind of its reason (cwi_scale_why). The reason text is not a label:
 * it carries numbers. Each kind of reason belongs to one or two policies
 * (23 pairs, "restored" with each) and takes one to three of the four
 * outcomes: 96 rows hold every pair with all four. */
#define CWI_SCALE_TALLIES 96
typedef struct cwi_scale_tally {
	char policy[16];
	char decision[12];
	cwi_scale_why why;
	uint64_t n;
} cwi_scale_tally;

/* What /metrics shows beyond the status reply: the scaling decisions and
 * each job's operator rows (summed over its tasks, as its clients get
 * them). Free with cwi_dispatcher_metrics_free. */
typedef struct cwi_dispatcher_metrics {
	cwi_scale_tally scale[CWI_SCALE_TALLIES];
	size_t nscale;
	struct cwi_job_ops {
		uint64_t job_id;
		cwi_op_counters *ops;
		size_t nops;
	} *jobs;
	size_t njobs;
} cwi_dispatcher_metrics;

/* Fills *m (zeroed first); ENOMEM leaves what was filled to free. */
cachew_err cwi_dispatcher_metrics_get(const cwi_dispatcher *d,
    cwi_dispatcher_metrics *m);
void cwi_dispatcher_metrics_free(cwi_dispatcher_metrics *m);
/* A snapshot of everything, in id order. */
cachew_err cwi_dispatcher_status(cwi_dispatcher *d, uint64_t now_ns,
    cwi_msg_status_reply *rep);
/* What a tenant that is not an admin may see of a status: only the jobs
 * `identity` owns, their tasks and datasets, the workers without their
 * addresses, and how many jobs and tasks of others are left out
 * (dispatcher_owner.c). */
void cwi_dispatcher_status_redact(const cwi_dispatcher *d,
    const char *identity, cwi_msg_status_reply *st);

/* Dispatches any request to the function above and fills *rep (initialised
 * here; free with cwi_pmsg_free) with its reply: CWI_MSG_OK for requests
 * without one, CWI_MSG_ERROR (code and message) when the call failed, in
 * which case the error is also returned. A reply or data-path message
 * sent to the dispatcher is CACHEW_EPROTO. */
cachew_err cwi_dispatcher_handle(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_pmsg *req, cwi_pmsg *rep);

/* Times out silent workers and clients (and what follows from that: splits
 * released, tasks moved, jobs finished). Call it at least once per
 * heartbeat interval; extra calls are cheap. */
void cwi_dispatcher_tick(cwi_dispatcher *d, uint64_t now_ns);
/* At most every 0.5 s of now_ns, a job_sample event per running job (its
 * tasks, wanted and granted workers, rate, client wait, cache mode), what
 * `cachew plot` draws; no-op without an events log. Not a state change:
 * nothing journals it and a replayed state need not repeat it, so the
 * server's ticker calls it beside cwi_dispatcher_tick, not inside it. */
void cwi_dispatcher_sample_jobs(cwi_dispatcher *d, uint64_t now_ns);

/* Replaces a job's worker count decision (fn NULL: the default) and
 * applies it at once. CACHEW_ENOENT for an unknown or finished job. */
cachew_err cwi_dispatcher_set_worker_count(cwi_dispatcher *d,
    uint64_t now_ns, uint64_t job_id, cwi_worker_count_fn fn, void *ctx);

/* The number of workers every running job together wants (their
 * policies' decisions, summed), within [min_workers, max_workers], as of
 * the last decision interval: what a provisioner should run. min_workers
 * when autoscale is off. */
uint32_t cwi_dispatcher_pool_target(const cwi_dispatcher *d);

/* Runs one decision interval now: a sample per job to its scaler, fair
 * share, the pool target, tasks added or removed. cwi_dispatcher_tick
 * calls it every decision_interval_ns; tests call it to step. No-op when
 * autoscale is off. */
void cwi_dispatcher_decide(cwi_dispatcher *d, uint64_t now_ns);

/* Per-operator counters a task's worker last reported (for the policy
 * engine). Borrowed: valid until the next call on d. CACHEW_ENOENT for an
 * unknown task. */
cachew_err cwi_dispatcher_task_ops(const cwi_dispatcher *d, uint64_t task_id,
    const cwi_op_counters **ops, size_t *nops);

/*
 * Autocaching passes. The planner (dispatcher_autocache.h) does I/O, so it
 * runs outside the caller's lock; the state machine only carries its
 * plans. A new job of a distributed_epoch dataset is a pass: the caller
 * asks cwi_dispatcher_job_wants_pass whether a request would create one,
 * plans it with the lock released, then offers the plan to the next
 * cwi_dispatcher_handle / _job_get_or_create, which gives it to the job
 * it creates. When the pass's data is done (every split acknowledged) or
 * the job ends before that, the pass end is queued for
 * cwi_dispatcher_take_pass_ends.
 */
typedef struct cwi_job_pass {
	uint8_t *graph;   /* what the workers run (the job takes it) */
	size_t graph_len;
	uint64_t units;   /* its split units */
	char mode[12];    /* "profile", "put", "get" or "compute" */
	double worker_scale; /* > 0: a worker count carried over from the
			      * dataset's previous pass (a named job's
			      * previous iteration) is scaled by this */
	char event[512];  /* what the planner decided, for events and status */
	void *ctx;        /* the planner's (the job takes it) */
} cwi_job_pass;

/* True when req would create a job of a distributed_epoch dataset (no job
 * of that name and iteration exists): then *graph (a copy: free()) and
 * *len, *units are the dataset's. False (nothing allocated) otherwise or
 * when out of memory. */
bool cwi_dispatcher_job_wants_pass(const cwi_dispatcher *d,
    const cwi_msg_job_get_or_create *req, uint8_t **graph, size_t *len,
    uint64_t *units);

/* The next job created takes p (its graph and ctx are set to NULL then);
 * NULL withdraws an offer. Call with the same lock held as the request
 * that should take it, and withdraw after it. */
void cwi_dispatcher_offer_pass(cwi_dispatcher *d, cwi_job_pass *p);

typedef struct cwi_pass_end {
	uint64_t job_id;
	void *ctx;               /* the planner's: now the taker's */
	bool complete;           /* every split was acknowledged */
	cwi_op_counters *ops;    /* the pass's tasks' last counters, all
				  * tasks' concatenated (names "idx:op") */
	size_t nops;
	uint32_t workers;        /* tasks that ran it */
} cwi_pass_end;

/* The pass ends queued since the last call (*out: free with
 * cwi_dispatcher_pass_ends_free, which leaves ctx alone). */
size_t cwi_dispatcher_take_pass_ends(cwi_dispatcher *d, cwi_pass_end **out);
void cwi_dispatcher_pass_ends_free(cwi_pass_end *v, size_t n);

/* Records what autocaching did for a job: an "autocache" event line, and
 * the job's cache mode and reason in status. Unknown jobs are ignored. */
void cwi_dispatcher_autocache_event(cwi_dispatcher *d, uint64_t now_ns,
    uint64_t job_id, const char *mode, const char *text);

/*
 * Snapshots (dispatcher_snapshot.c; docs/snapshot-format.md): the whole
 * state as one msgpack document, for a journal that replays the calls
 * made since.
 * A dispatcher that loaded a snapshot answers every further call as the
 * one that saved it would have, except for what the file's top comment
 * lists (a job's worker count function set with
 * cwi_dispatcher_set_worker_count goes back to the configuration's; the
 * autocaching planner's ctx is NULL).
 */
/* The whole state as one msgpack document (*buf malloc'd, the caller
 * frees; *len its length). Reads d only. CACHEW_ENOMEM. */
cachew_err cwi_dispatcher_snapshot_save(const cwi_dispatcher *d,
    uint8_t **buf, size_t *len);
/* Loads a snapshot into d, which must be fresh from cwi_dispatcher_create
 * (with the configuration the process runs with) and empty (else
 * CACHEW_EINVAL). CACHEW_ECORRUPT, with a message naming the field's path
 * and byte offset, for anything malformed, out of range or inconsistent;
 * CACHEW_ENOMEM. On failure d is empty again, as created (its lineage
 * and incarnation as they were). buf is only read. */
cachew_err cwi_dispatcher_snapshot_load(cwi_dispatcher *d, const uint8_t *buf,
    size_t len);

/*
 * Recovery (dispatcher_journal.c, docs/journal.md). The server journals
 * every call that changes the state as a record built here, and a restart
 * applies them again in order. Each builder fills out (cleared first) and
 * returns CACHEW_ENOMEM when it could not.
 */
cachew_err cwi_jrec_request(cwi_strbuf *out, uint64_t now, const uint8_t *req,
    size_t len);
cachew_err cwi_jrec_pass_request(cwi_strbuf *out, uint64_t now,
    const uint8_t *req, size_t len, const cwi_job_pass *p);
cachew_err cwi_jrec_tick(cwi_strbuf *out, uint64_t now);
cachew_err cwi_jrec_autocache(cwi_strbuf *out, uint64_t now, uint64_t job_id,
    const char *mode, const char *text);
/* The autocaching planner's state (dispatcher_autocache.h, its lines)
 * is part of the state: text is the planner's whole state
 * (cwi_dcache_save); the record holds the lines of it that d does not
 * hold yet. *changed false (nothing built) when there are none.
 * CACHEW_ECORRUPT when a line of text is not a planner line (nothing
 * built); CACHEW_ENOMEM. */
cachew_err cwi_jrec_planner(cwi_strbuf *out, uint64_t now,
    const cwi_dispatcher *d, const char *text, size_t len, bool *changed);
/* d's copy of the planner's state, as cwi_dcache_save writes it
 * (appended to out). CACHEW_ENOMEM. */
cachew_err cwi_dispatcher_planner_text(const cwi_dispatcher *d,
    cwi_strbuf *out);
/* first_id: no id below it is given out from this start on (ids of a
 * lineage that started empty continue those of the work dir's earlier
 * ones: the server's ids file); 0 or 1: no bound. */
cachew_err cwi_jrec_start(cwi_strbuf *out, uint64_t now, uint64_t lineage,
    uint64_t incarnation, const cwi_dispatcher_config *cfg,
    uint64_t first_id);
/* The largest id given out so far (of any kind; 0: none), and a floor
 * for those given out from now on. */
uint64_t cwi_dispatcher_max_id(const cwi_dispatcher *d);
void cwi_dispatcher_ids_from(cwi_dispatcher *d, uint64_t first);
/* A checkpoint: the configuration and the whole state (the journal's
 * snapshot payload), and its load into a fresh dispatcher. */
cachew_err cwi_dispatcher_checkpoint_save(const cwi_dispatcher *d,
    cwi_strbuf *out);
cachew_err cwi_dispatcher_checkpoint_load(cwi_dispatcher *d,
    const uint8_t *buf, size_t len);
/* The configuration d runs with (defaults resolved). */
const cwi_dispatcher_config *cwi_dispatcher_config_of(const cwi_dispatcher *d);
/* Replayed requests that failed (the state had diverged). */
uint64_t cwi_dispatcher_replay_diverged(const cwi_dispatcher *d);
/* Applies one record to d: CACHEW_ECORRUPT naming what is wrong with it,
 * CACHEW_ENOMEM. A recorded request that fails now (the state is not the
 * one it met) is logged and counted (cwi_dispatcher_replay_diverged). */
cachew_err cwi_dispatcher_apply_record(cwi_dispatcher *d, const uint8_t *rec,
    size_t len);
/* While quiet, no events are written (a replay's were, the first time). */
void cwi_dispatcher_quiet(cwi_dispatcher *d, bool quiet);
/* The clock of the last call (a restart continues from it), and its
 * setting: every call sets it first, so between calls it is no state but
 * where the clock was (a status request or a refused one moves it and
 * has no record). */
uint64_t cwi_dispatcher_clock(const cwi_dispatcher *d);
void cwi_dispatcher_set_clock(cwi_dispatcher *d, uint64_t now);
/* Frees the pass ends nobody took (their planner context included). */
void cwi_dispatcher_drop_pass_ends(cwi_dispatcher *d);
/* The state's lineage (random, made with the empty state and kept by
 * recovery) and incarnation (starts of the lineage so far, from 1). */
uint64_t cwi_dispatcher_lineage(const cwi_dispatcher *d);
uint64_t cwi_dispatcher_incarnation(const cwi_dispatcher *d);
/* A new state takes its journal's lineage (0: keeps its own). */
void cwi_dispatcher_set_lineage(cwi_dispatcher *d, uint64_t lineage);

#endif /* CWI_DISPATCHER_STATE_H */
