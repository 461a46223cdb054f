/*
 * dispatcher_int.h - internals shared by the files of the dispatcher's
 * state machine; dispatcher_state.h stays its interface to
 * dispatcher_server.c and the tests.
 *
 * The state is split by the invariant each part keeps, around the structs
 * below (zstd's zstd_compress_*.c around zstd_compress_internal.h):
 *   dispatcher_state.c   workers, datasets, jobs, clients and tasks (the
 *                        registry), the events log, and the entry point
 *                        of every message;
 *   dispatcher_ledger.c  a distributed_epoch job's splits: every unit is
 *                        delivered once per epoch (struct split_ledger);
 *   dispatcher_policy.c  how many workers each job gets: what feeds the
 *                        pure policies of src/policy/ and what applies
 *                        their decisions (struct job_sizing);
 *   dispatcher_coord.c   coordinated reads: a job's round schedule, which
 *                        every consumer must agree on at every round
 *                        (struct coord_schedule);
 *   dispatcher_pass.c    autocaching passes: a plan goes to one job, its
 *                        end is queued once (struct job_pass);
 *   dispatcher_planner.c the autocaching planner's state lines, kept
 *                        here so that the journal and the snapshot carry
 *                        them (one line per key, never removed);
 *   dispatcher_fns.c     user functions: a job's tasks go only to workers
 *                        with every plugin function its graph needs;
 *   dispatcher_counters.c  a job's counters: its tasks' operator rows
 *                        (the dropped ones' kept) and what its clients
 *                        received, exact once its data is done;
 *   dispatcher_status.c  snapshots: the status reply and a task's
 *                        counters for the policy engine (reads only).
 *
 * Layout: workers, datasets, jobs and tasks live in vectors of pointers
 * kept in id order (ids only grow, new entries are appended, removal keeps
 * the order), so every scan, reply and event comes out in a reproducible
 * order, and a lookup by id is a binary search (cwi_vec_find). Each job
 * and each worker also holds its own tasks, in id order: a heartbeat, a
 * job's view or its task list touch only those. Scans over every job or
 * task cost each one a constant (issue 18 measured 2,000 iterators of
 * one embedded dispatcher at 1.26 cores idle and 225 s to create when a
 * reconcile scanned every task per job); a job's splits are indexed by
 * split id.
 *
 * Thread safety: none, as dispatcher_state.h says: every function here runs
 * inside one call on the dispatcher, under the caller's lock.
 */
#ifndef CWI_DISPATCHER_INT_H
#define CWI_DISPATCHER_INT_H

#include "dispatcher_state.h"
#include "../../graph/graph.h"

#define NS_PER_MS 1000000ull

/* ---- the state ----------------------------------------------------------- */

/* A line of the autocaching planner's state (dispatcher_autocache.h):
 * text without its '\n', malloc'd; its first key_len bytes name it. */
typedef struct planner_line {
	char *text;
	size_t len, key_len;
} planner_line;

/* Entries of a vec are structs whose first member is their uint64_t id,
 * in increasing id order. */
typedef struct vec {
	void **v;
	size_t n, cap;
} vec;

/* An entry's id. */
uint64_t cwi_vec_entry_id(const void *p);
/* Appends p (whose id is above every entry's); false when out of memory. */
bool cwi_vec_push(vec *v, void *p);
/* Removes p, keeping the order (no-op when it is not there). */
void cwi_vec_remove(vec *v, const void *p);
/* The index of the entry with that id, or v->n. */
size_t cwi_vec_index(const vec *v, uint64_t id);
/* The entry with that id, or NULL. */
void *cwi_vec_find(const vec *v, uint64_t id);
/* cwi_vec_find for ids looked up in rising order: *hint (0 at first) is
 * where the last one was found plus one, and a lookup from there gallops
 * forward, so a heartbeat's tasks (in the order the worker got them) cost
 * one or two probes each rather than a search of every task. */
void *cwi_vec_find_near(const vec *v, uint64_t id, size_t *hint);

typedef struct worker {
	uint64_t id;
	char *address;
	char *build;
	uint32_t cores;
	uint64_t memory_bytes;
	uint64_t last_seen_ns;
	double cpu_use;
	bool draining;
	bool direct; /* serves its uncoordinated distributed_epoch tasks
		      * on the requester's thread (worker_register) */
	uint32_t ntasks;
	vec tasks; /* its tasks, in id order (not owned) */
	cwi_fn_ident *fns; /* its user functions (worker_register) */
	size_t nfns;
	char *owner; /* the identity that registered it (NULL: none) */
} worker;

typedef struct dataset {
	uint64_t id;
	cachew_fingerprint fp;
	uint8_t *graph;
	size_t graph_len;
	/* The split source's units, or none (!splittable): the pipeline
	 * then runs whole, as one unit (dataset_register). */
	uint64_t split_units;
	bool splittable;
	uint64_t last_used_ns; /* registered or given a job */
	bool in_use; /* a job refers to it (gc_datasets' mark) */
	cwi_fn_ident *needs; /* the user functions its graph names */
	size_t nneeds;
	/* The identities that registered it (dispatcher_owner.c): a job of
	 * it is another's only by registering the same graph. Not known
	 * for a dataset a snapshot brought (tenants_known false: any
	 * identity, as before snapshots kept owners of datasets). */
	char **tenants;
	size_t ntenants;
	bool tenants_known;
} dataset;

enum { SPLIT_PENDING = 0, SPLIT_LEASED, SPLIT_ACKED, SPLIT_RECOVERING };

/* split.group of a split never leased in an exactly-once job. */
#define NO_GROUP UINT64_MAX

/* One split of a job's ledger (dispatcher_ledger.c). */
typedef struct split {
	uint8_t state;
	bool delivered;     /* the lessee sent its last element */
	uint32_t acks;      /* acknowledgements, duplicates included */
	uint32_t part_acks; /* clients in `ackers` */
	uint32_t ackers_cap;
	uint32_t lease;     /* leases so far: the current one's number */
	/* Clients that acknowledged their part of this lease, when it was
	 * read by several (parts > 1): each counts once, so that an ack
	 * resent after a lost reply cannot complete the split early. */
	uint64_t *ackers;
	uint64_t orphan_ns; /* when its lessee went, delivered but unacked */
	uint64_t task_id;   /* lessee; 0 once the task is gone */
	uint64_t worker_id; /* lessee's worker */
	/* Exactly once (dispatcher_recover.c): the group the split was first
	 * leased in, by its first split's id (NO_GROUP: not leased yet); a
	 * group is leased whole, always with the same ranges, so a replay
	 * yields the same elements. On the group's first split: its size,
	 * the element ranges clients reported received (a replay leaves
	 * them out), and the element count when a client saw its end. */
	uint64_t group;
	uint32_t gsize;
	bool total_known;
	uint64_t total;
	cwi_rset skip;
	uint64_t recov_task; /* RECOVERING: the task that went */
	/* Parts of a split read by several clients: how many the first
	 * part ack said, and parts credited to clients that left the job
	 * while it was leased (their acknowledgements will not come). */
	uint32_t parts_need;
	uint32_t credits;
} split;

/* Exactly once: a task that went with groups leased (its worker died or
 * was slow, it ended, a client could not read it). Its groups wait in
 * RECOVERING until every client that was in the job then has stopped
 * reading it and said what it received of them. */
typedef struct recovery {
	uint64_t task_id;
	uint64_t *await; /* client ids yet to report */
	size_t nawait;
} recovery;

typedef struct client {
	uint64_t id;
	uint64_t nonce; /* its join request's (0: none) */
	int64_t consumer_index;
	uint64_t last_seen_ns;
	uint64_t batch_time_ns;
	uint64_t wait_time_ns;
	/* Of its last heartbeat's interval, the share spent waiting for
	 * data (0..1): live only, not journaled (0 until it reports). */
	double wait_fraction;
	double buffer_fill;
	uint64_t round;
	uint64_t told_target; /* block_round in its last reply */
	uint64_t elements_received, bytes_received; /* as it last said */
	bool ready;           /* acknowledged the pending change's round */
	/* heartbeats since the job's last scale sample */
	uint64_t acc_batches, acc_elapsed_ns, acc_wait_ns;
	double acc_fill;
	uint32_t acc_reports;
} client;

typedef struct job job;

typedef struct task {
	uint64_t id;
	job *job;
	worker *w;
	cwi_task_state state;
	uint64_t start_round;
	uint64_t end_round;
	uint64_t nleased;   /* its splits not acknowledged (the ledger's) */
	uint64_t elements;
	uint64_t bytes;
	uint64_t rate_at_ns;
	double elements_per_s;
	double bytes_per_s;
	cwi_op_counters *ops;
	size_t nops;
	uint64_t ops_leases; /* finished leases ops sums */
	/* run and stall time: last reported, and growth since the job's
	 * last scale sample */
	uint64_t run_ns, stall_ns;
	uint64_t acc_run_ns, acc_stall_ns;
	/* Exactly once: its last lease request's number and the group it
	 * got (NO_GROUP: none), so that the same request sent again gets
	 * the same group (cwi_ledger_lease_again). */
	uint64_t lease_seq;
	uint64_t lease_group;
	uint64_t hb_seen; /* the last worker heartbeat that reported it */
} task;

/* The split ledger of a distributed_epoch job: its invariant is that every
 * split unit is delivered once per epoch (see the top of this file). splits
 * NULL: no ledger (parallel_epochs, an empty dataset, a finished job). */
struct split_ledger {
	split *splits;         /* indexed by split id */
	uint64_t nsplits, nunits, units_per_split;
	uint64_t *ring;        /* the pending pool */
	uint64_t ring_head, ring_len;
	uint64_t npending, nleased, nacked;
	uint64_t nrecovering; /* exactly once: waiting for clients' reports */
	/* At least the leased splits whose task went (task_id 0) or that
	 * have credits: what the tick's orphan scan looks for. 0 skips the
	 * scan, which scanned every split of every job 20 times a second
	 * (W9); each scan counts them again. */
	uint64_t orphan_hint;
	/* A worker part with a shuffle (dispatcher_ledger.c, "shuffled
	 * order"): the pool is put in a seeded order, a buffered shuffle of
	 * the splits through a window of shuffle_buffer units, at the first
	 * lease of a worker that is not direct (shuffle_pending until then);
	 * the key
	 * is a function of the job's seed, its shuffles' seeds and, if one
	 * reshuffles each iteration, its epoch. Not in a snapshot, which
	 * holds what it is a function of (cwi_ledger_shuffle_loaded). */
	bool shuffle_pending;
	uint64_t shuffle_key, shuffle_buffer;
};

/* How many workers a job gets: its worker count decision (count_fn), or
 * with the policy engine (autoscale) its scaler's want and fair share's
 * grant. */
struct job_sizing {
	cwi_worker_count_fn count_fn; /* NULL: the policy engine decides */
	void *count_ctx;
	uint32_t target;       /* the decision last applied */
	bool target_set;
	/* Policy engine (autoscale): NULL scaler = not autoscaled. */
	cwi_scaler *scaler;
	char scale_name[32];   /* the policy's canonical spelling */
	double weight;
	uint32_t want;         /* the scaler's decision */
	uint32_t granted;      /* fair share's answer */
	bool settled;
	bool epoch_start;      /* the next sample starts an epoch */
	uint64_t sample_ns;    /* the current sample began */
	char reason[192];
};

/* Coordinated reads (num_consumers > 0): the job's round schedule. */
struct coord_schedule {
	uint64_t target;       /* pending schedule change, or NONE */
	bool published;        /* a client has been sent the task list */
};

/* Autocaching: the pass this job runs (graph NULL: the dataset's graph, no
 * planner). */
struct job_pass {
	uint8_t *graph;
	size_t graph_len;
	uint64_t units;
	double worker_scale;   /* > 0: scale a carried-over count */
	void *ctx;             /* the planner's until the end is queued */
	bool ended;
	char cache_mode[12];
	char cache_reason[512];
};

struct job {
	uint64_t id;
	char *name;
	/* The identity that created it (NULL: none, a dispatcher without
	 * tokens); its clients all have it (dispatcher_owner.c). */
	char *owner;
	uint64_t iteration;
	dataset *ds;
	cwi_processing_mode mode;
	cwi_compression compression;
	uint64_t seed;
	uint64_t epoch; /* its first client's (job_get_or_create) */
	cwi_worker_policy policy;
	uint32_t num_workers;
	uint32_t num_consumers;
	client *clients;
	size_t nclients, capclients;
	vec tasks; /* its tasks, in id order (not owned) */
	bool data_done;
	bool any_task_done; /* parallel_epochs: the pass is ending */
	bool finished;
	/* What its clients received, as they last said (those gone
	 * included): exact once every client released the job. */
	uint64_t elements, bytes;
	/* The operator counters of its tasks that were dropped, summed by
	 * name (cwi_counters_retire). */
	cwi_op_counters *ops_done;
	size_t nops_done;
	struct split_ledger ledger; /* distributed_epoch */
	struct job_sizing sizing;
	struct coord_schedule coord;
	struct job_pass pass;
	/* Exactly once (uncoordinated distributed_epoch): groups, replays
	 * without repeats, tails stitched by the clients. */
	bool exactly_once;
	recovery *recovs;
	size_t nrecovs, caprecovs;
};

struct cwi_dispatcher {
	cwi_dispatcher_config cfg;
	/* Recovery (docs/journal.md): the state's lineage, made when a
	 * dispatcher starts empty and kept across restarts that load its
	 * journal, and the incarnation, counted up at every start of that
	 * lineage. Workers and clients echo the lineage; a message from
	 * another lineage names ids this state never gave out. */
	uint64_t lineage;
	uint64_t incarnation;
	bool quiet; /* replaying a journal: no events (not saved) */
	uint64_t replay_diverged; /* replayed requests that failed */
	vec workers, datasets, jobs, tasks;
	/* The live workers by address (dispatcher_state.c): a registration
	 * looks up the worker it replaces, and the owner check the worker
	 * whose address it claims, without comparing every worker's. */
	struct worker_addrs *addrs;
	uint64_t next_worker_id, next_dataset_id, next_job_id;
	uint64_t next_client_id, next_task_id;
	uint64_t now; /* the current call's clock, for events */
	uint64_t hb_seq; /* worker heartbeats answered (task.hb_seen) */
	uint64_t nclients; /* clients of every job */
	cwi_strbuf ev;
	/* policy engine */
	uint64_t next_decision_ns;
	uint32_t pool_target;
	uint32_t *pool_recent; /* the last pool_down_intervals raw targets */
	uint32_t npool_recent;
	uint64_t next_sample_ns; /* the next job_sample events */
	/* Events are written but not flushed until it is cleared (the
	 * samples of every job go out in one write, not one each). */
	bool ev_hold;
	/* scaling decisions so far (cwi_dispatcher_metrics); not saved */
	cwi_scale_tally scale_tally[CWI_SCALE_TALLIES];
	size_t nscale_tally;
	/* autocaching */
	cwi_job_pass *offered;  /* the next job created takes it */
	cwi_pass_end *pass_ends; /* queued for take_pass_ends */
	size_t npass_ends, cappass_ends;
	/* the planner's state lines: the storage line first when there is
	 * one, then one per dataset (dispatcher_planner.c) */
	struct planner_line *planner;
	size_t nplanner, capplanner;
};

#define WORKER(d, i) ((worker *)(d)->workers.v[i])
#define DATASET(d, i) ((dataset *)(d)->datasets.v[i])
#define JOB(d, i) ((job *)(d)->jobs.v[i])
#define TASK(d, i) ((task *)(d)->tasks.v[i])
/* The i-th task of a job or a worker. */
#define OWN_TASK(o, i) ((task *)(o)->tasks.v[i])

static inline bool
job_coordinated(const job *j)
{
	return j->num_consumers > 0;
}

/* ---- ownership (dispatcher_owner.c) --------------------------------------- */

/* Whether two identities are the same (NULL and "" are the empty one). */
bool cwi_owner_same(const char *a, const char *b);
/* CACHEW_EPERM when req names a job, client or worker of another identity
 * than req->identity ("job 3 belongs to another tenant"). */
cachew_err cwi_owner_check(const cwi_dispatcher *d, const cwi_pmsg *req);
/* After req succeeded with rep: the job it created and the worker it
 * registered take req's identity. Out of memory it stays empty, which
 * no authenticated peer matches: the job is lost to its tenant, never
 * opened to another. */
void cwi_owner_record(cwi_dispatcher *d, const cwi_pmsg *req,
    const cwi_pmsg *rep);

/* A task's data-path secret (0 without cfg.task_secrets). */
uint64_t cwi_owner_task_secret(const cwi_dispatcher *d, uint64_t task_id);

/* ---- the registry and the events log (dispatcher_state.c) ---------------- */

worker *cwi_disp_find_worker(const cwi_dispatcher *d, uint64_t id);
task *cwi_disp_find_task(const cwi_dispatcher *d, uint64_t id);
job *cwi_disp_find_job(const cwi_dispatcher *d, uint64_t id);
/* The address index must be rebuilt (the workers were replaced whole). */
void cwi_disp_addrs_stale(cwi_dispatcher *d);
/* The live worker registered with that address, or NULL. */
worker *cwi_disp_find_worker_by_address(const cwi_dispatcher *d,
    const char *address);
dataset *cwi_disp_find_dataset(const cwi_dispatcher *d, uint64_t id);
/* The running job of that name and iteration, or NULL. */
job *cwi_disp_find_named_job(const cwi_dispatcher *d, const char *name,
    uint64_t iteration);
/* Live workers that are not draining. */
uint32_t cwi_disp_workers_available(const cwi_dispatcher *d);
/* The client heartbeat interval to tell clients now: the configured one,
 * stretched with the number of clients (dispatcher_state.c). */
uint32_t cwi_disp_client_interval_ms(const cwi_dispatcher *d);

/* One event line: begin, fields, end (which writes it). */
void cwi_disp_ev_begin(cwi_dispatcher *d, const char *name);
void cwi_disp_ev_u64(cwi_dispatcher *d, const char *key, uint64_t v);
void cwi_disp_ev_i64(cwi_dispatcher *d, const char *key, int64_t v);
void cwi_disp_ev_str(cwi_dispatcher *d, const char *key, const char *s);
void cwi_disp_ev_ids(cwi_dispatcher *d, const char *key, const uint64_t *ids,
    size_t n);
void cwi_disp_ev_end(cwi_dispatcher *d);
/* Whether anyone reads events (else lists for them are not built). */
bool cwi_disp_events_on(const cwi_dispatcher *d);
/* Begins an event about task t (task, job and worker ids). */
void cwi_disp_task_event(cwi_dispatcher *d, const char *name, const task *t);
/* Forgets a task (its splits stay with its worker: cwi_ledger_task_gone). */
void cwi_disp_task_drop(cwi_dispatcher *d, task *t, const char *reason);
/* Every job's task count to its decision (fair share first). */
void cwi_disp_reconcile(cwi_dispatcher *d);

/* Frees every worker, dataset, job, task and queued pass end and resets
 * the counters and the policy engine's state: d is as
 * cwi_dispatcher_create made it but for its lineage and incarnation (a
 * snapshot that failed to load). */
void cwi_disp_clear(cwi_dispatcher *d);

/* Ends j's epoch if every split is acknowledged (dispatcher_state.c). */
void cwi_disp_epoch_check(cwi_dispatcher *d, job *j);

/* ---- exactly once (dispatcher_recover.c) --------------------------------- */

/* Task t of an exactly-once job goes: its leased groups wait for the job's
 * clients' reports (RECOVERING). CACHEW_ENOMEM leaves them leased to a
 * task that is gone: they are released at once, as before exactly once. */
void cwi_recover_task_gone(cwi_dispatcher *d, job *j, const task *t);
/* A client left the job: no report will come from it. */
void cwi_recover_client_gone(cwi_dispatcher *d, job *j, uint64_t client_id);
/* Splits credited to departed clients that nobody acknowledged within
 * `grace` of the departure (the leaver read them whole) are done. */
void cwi_recover_tick(cwi_dispatcher *d, job *j, uint64_t grace);
/* Checks a heartbeat's exactly-once fields before any is applied. */
cachew_err cwi_recover_check(const job *j,
    const cwi_msg_client_heartbeat *req);
/* Applies them: tasks the client could not read go (their groups into
 * recovery), its progress merges into recovering groups, and each task it
 * stopped reading stops waiting for it. */
void cwi_recover_report(cwi_dispatcher *d, job *j, const client *c,
    const cwi_msg_client_heartbeat *req);
/* The tasks client c must stop reading and report on. */
cachew_err cwi_recover_stop_list(const job *j, const client *c,
    cwi_msg_client_heartbeat_reply *rep);
/* Frees a job's recoveries and its groups' skip sets. */
void cwi_recover_free(job *j);

/* ---- user functions (dispatcher_fns.c) ----------------------------------- */

/* The functions a registering worker reports into w->fns; EINVAL naming
 * a malformed one, ENOMEM. */
cachew_err cwi_fns_of_worker(worker *w, const cwi_msg_worker_register *req);
/* The user functions ds's graph names into ds->needs; EPARSE for a graph
 * that does not decode (cwi_graph_user_fns), ENOMEM. */
cachew_err cwi_fns_of_dataset(dataset *ds);
/* Whether w has every function ds needs (the same plugin builds). */
bool cwi_fns_worker_can_run(const worker *w, const dataset *ds);
/* Live workers, not draining, that can run ds. */
uint32_t cwi_fns_workers_for(const cwi_dispatcher *d, const dataset *ds);
/* A new job of ds: CACHEW_ENOTSUP when live workers exist and none can
 * run it, naming the function, its plugin and the workers; OK otherwise
 * (with no live worker, the job waits for one). */
cachew_err cwi_fns_check_job(const cwi_dispatcher *d, const dataset *ds);

/* ---- the split ledger (dispatcher_ledger.c) ------------------------------ */

/* Splits job j's units (the pass's, or the dataset's) into its ledger, all
 * pending. CACHEW_ENOMEM (the caller frees what was made). */
cachew_err cwi_ledger_init(cwi_dispatcher *d, job *j);
/* A job j loaded from a snapshot: its ledger's shuffled order again (key,
 * window, and pending when no split was leased yet), which a snapshot
 * does not hold: it is a function of what it does hold. */
void cwi_ledger_shuffle_loaded(job *j);
/* Resumes a saved position in job j's new ledger (r->resume_units_per_split
 * != 0): cuts the units as the saved job did, acknowledges the groups the
 * client received whole and forms the others again (their splits, their
 * received ranges as skip, first in the pool); counts[0] and [1] get how
 * many of each. CACHEW_EINVAL names what does not fit (another input,
 * groups out of range or overlapping, bad ranges); CACHEW_ENOMEM. The
 * caller frees the job on failure. */
cachew_err cwi_ledger_resume(job *j, const cwi_msg_job_get_or_create *r,
    uint64_t counts[2]);
/* Frees the splits and the pool; the counts stay for status. */
void cwi_ledger_free(struct split_ledger *l);

/* Fills a lease reply for task t (of a distributed_epoch job, max_splits 0:
 * the most): splits, or end_of_splits, or retry_ms. CACHEW_ENOMEM. */
/* A lease request sent again (the same seq as t's last): fills rep with
 * the group t got then when it is still t's, whole and leased, and
 * returns true; false (rep untouched) otherwise. Changes nothing. */
bool cwi_ledger_lease_again(cwi_dispatcher *d, task *t,
    cwi_msg_split_lease_reply *rep);
cachew_err cwi_ledger_lease(cwi_dispatcher *d, task *t, uint32_t max_splits,
    cwi_msg_split_lease_reply *rep);
/* Whether a lease for t now gets nothing but retry_ms. Changes nothing. */
bool cwi_ledger_lease_waits(const cwi_dispatcher *d, const task *t);
/* Task t's worker says it sent the last element of these splits. */
void cwi_ledger_delivered(struct split_ledger *l, const task *t,
    const uint64_t *ids, size_t n);
/* Task t is forgotten: the splits it holds become orphans at `now`. */
void cwi_ledger_task_gone(struct split_ledger *l, const task *t,
    uint64_t now);

/* Releases (back to the front of the pool, one split_released event)
 * the leased, unacknowledged splits: of a worker that is gone (reason
 * NULL: it deregistered, and a job that is not coordinated keeps what it
 * delivered), of a coordinated task whose rounds are read, delivered ones
 * when a client of a shared job leaves, and orphans past their grace. */
void cwi_ledger_release_worker(cwi_dispatcher *d, job *j, uint64_t worker_id,
    const char *reason);
void cwi_ledger_release_task(cwi_dispatcher *d, job *j, const task *t);
void cwi_ledger_release_delivered(cwi_dispatcher *d, job *j);
void cwi_ledger_release_orphans(cwi_dispatcher *d, job *j, uint64_t now);

/* Checks acknowledgements before any is applied (split ids in range, room
 * for each client's part): EINVAL, ENOMEM; then cwi_ledger_ack cannot
 * fail. ids[n]; parts (clients that read each split) and leases (the
 * lease each was read under, 0 unknown) may be NULL. */
cachew_err cwi_ledger_acks_check(const job *j, const uint64_t *ids,
    const uint64_t *parts, size_t n);
void cwi_ledger_ack(cwi_dispatcher *d, job *j, uint64_t client_id,
    const uint64_t *ids, const uint64_t *parts, const uint64_t *leases,
    size_t n);

/* ---- how many workers a job gets (dispatcher_policy.c) ------------------- */

/* What a worker count decision sees of job j; avail is
 * cwi_disp_workers_available(d), counted once by the caller. */
void cwi_sizing_job_view(const cwi_dispatcher *d, const job *j,
    uint32_t avail, cwi_job_view *v);
/* Job j's target now (its count function's, or fair share's grant),
 * capped at the available workers, with a job_target event when it
 * changed; *v is the view it was decided on. */
uint32_t cwi_sizing_target(cwi_dispatcher *d, job *j, uint32_t avail,
    cwi_job_view *v);
/* The mean share of time job j's clients spent waiting for data, over
 * those that reported batches or waits (0..1). */
double cwi_job_client_wait(const job *j);
/* The interval of cwi_dispatcher_sample_jobs. */
#define CWI_DISP_SAMPLE_NS 500000000ull
/* Weighted fair share of the available workers over the autoscaled jobs
 * (no-op when autoscale is off); `tell`: a job granted less than it wants
 * tells its scaler (once per decision interval). */
void cwi_sizing_share(cwi_dispatcher *d, bool tell);
/* What a client's heartbeat and a task's report add to the next sample. */
void cwi_sizing_client_report(client *c, const cwi_msg_client_heartbeat *req);
void cwi_sizing_task_busy(task *t, const cwi_task_report *r);
/* The scale configuration a job request asks for, checked (EINVAL). */
cachew_err cwi_sizing_check(const cwi_dispatcher *d,
    const cwi_msg_job_get_or_create *r, cwi_scale_config *c);
/* Gives a new job its scaler (autoscale on): carried over from the
 * previous pass of a named job, or new. EINVAL, ENOMEM. */
cachew_err cwi_sizing_init(cwi_dispatcher *d, job *j,
    const cwi_msg_job_get_or_create *r);

/* ---- coordinated reads (dispatcher_coord.c) ------------------------------ */

/* A new task's place in its coordinated job's schedule: at once, or
 * STARTING until an announced round. */
void cwi_sched_place(task *t);
/* Announces a schedule change (a task starting or removing) at a round
 * every consumer is told; no-op when one is pending. */
void cwi_sched_open(cwi_dispatcher *d, job *j);
/* A consumer's heartbeat: acknowledges the announced round, or moves the
 * change further out when it read past it. */
void cwi_sched_heartbeat(cwi_dispatcher *d, job *j, client *c);
/* Commits the pending change once every consumer is ready, and drops the
 * ended tasks every consumer has read past (releasing what they held). */
void cwi_sched_update(cwi_dispatcher *d, job *j);

/* ---- autocaching passes (dispatcher_pass.c) ------------------------------ */

/* A new distributed_epoch job j takes the pass on offer (if any). */
void cwi_pass_take(cwi_dispatcher *d, job *j);
/* Queues the end of j's pass (once; complete: every split acknowledged). */
void cwi_pass_finish(cwi_dispatcher *d, job *j, bool complete);
/* Frees what job j holds of its pass (the planner's ctx included). */
void cwi_pass_free(const cwi_dispatcher *d, job *j);
/* Frees the pass ends nobody took (the planner's ctx included). */
void cwi_pass_ends_drop(cwi_dispatcher *d);

/* ---- the planner's state (dispatcher_planner.c) -------------------------- */

/* Appends one line of a snapshot (len bytes, no '\n'), which must be a
 * planner line whose key is not there yet, the storage line only first.
 * CACHEW_ECORRUPT saying why; CACHEW_ENOMEM. */
cachew_err cwi_planner_load_line(cwi_dispatcher *d, const char *line,
    size_t len);
/* Takes in a record's lines (each ending in '\n'), all checked before
 * any is taken: a line replaces the one of its key, or is added.
 * CACHEW_ECORRUPT naming the line; CACHEW_ENOMEM. */
cachew_err cwi_planner_merge(cwi_dispatcher *d, const char *text, size_t len);
/* Appends to out the lines of text (the planner's whole state, as
 * cwi_dcache_save writes it) that d does not hold as they are, each
 * with its '\n'. CACHEW_ECORRUPT naming a line of those that is not a
 * planner line; CACHEW_ENOMEM. */
cachew_err cwi_planner_diff(const cwi_dispatcher *d, const char *text,
    size_t len, cwi_strbuf *out);
/* Frees every line. */
void cwi_planner_clear(cwi_dispatcher *d);

/* ---- counters (dispatcher_counters.c) ------------------------------------ */

/* A task report's operator counters, kept unless older than the task's
 * (fewer finished leases). ENOMEM (the old ones stay). */
cachew_err cwi_counters_task_ops(task *t, const cwi_op_counters *ops,
    size_t nops, uint64_t ops_leases);
/* A task is dropped: its counters stay with its job (metrics only: on
 * ENOMEM they are lost). */
void cwi_counters_retire(job *j, const task *t);
/* Frees the counters a job kept of its dropped tasks. */
void cwi_counters_job_free(job *j);
/* A client's cumulative received counts (client_heartbeat, job_release):
 * their growth goes to its job's. */
void cwi_counters_received(job *j, client *c, uint64_t elements,
    uint64_t bytes);
/* Job j's operator counters into a client heartbeat reply: its tasks' (as
 * their workers last reported them), the dropped ones' included, summed
 * by operator. ENOMEM. */
cachew_err cwi_counters_job_ops(const job *j,
    cwi_msg_client_heartbeat_reply *rep);
/* From job j's operator counters (cwi_counters_job_ops): the operator
 * whose own work per thread took longest (*slowest, heap, NULL before any
 * busy row) with that time's share of the sum over its operators, and the
 * bytes its cache_get operators produced. ENOMEM. */
cachew_err cwi_counters_job_summary(const job *j, char **slowest,
    double *share, uint64_t *cache_hit_bytes);

#endif /* CWI_DISPATCHER_INT_H */
