/*
 * worker_task_int.h - what the parts of a worker task share (internal to
 * src/service/worker). A task delivers in one of three ways, each in its
 * own file around this struct, as libuv keeps one file per handle type
 * beside a shared base:
 *   - worker_task.c: the base (creation, references, stop, reports), the
 *     runner thread that leases splits and queues their elements, and the
 *     stream delivery of queued elements to get_elements requests;
 *   - worker_coord.c: coordinated rounds (num_consumers > 0): the ring of
 *     rounds formed from the queue and the end round;
 *   - worker_direct.c: direct tasks, whose lease pipeline runs on the
 *     thread that sends the get_elements (the embedded worker's);
 *   - worker_stats.c: the task's operator counters (summed over its
 *     leases, reported, and answered to task_stats).
 * worker_task.h explains the model and the locking.
 */
#ifndef CWI_WORKER_TASK_INT_H
#define CWI_WORKER_TASK_INT_H

#include "worker_task.h"
#include "../service_payload.h"

/* Defaults of a get_elements reply when the client leaves them open. */
#define REPLY_MAX_ELEMENTS 1024u
#define REPLY_MAX_BYTES ((uint64_t)8 << 20)
/* Operator rows a task keeps of its pipeline. */
#define MAX_ROWS 64

typedef struct q_entry {
	cwi_element *e; /* NULL: the end of lease `lease` */
	uint32_t lease;
	uint32_t tail;  /* exactly once: 0, or grouping operator tail-1's */
	uint64_t bytes;
	uint64_t index; /* exactly once: the element's number in its group */
} q_entry;

typedef struct lease_rec {
	uint64_t *split_ids;
	uint32_t *split_leases; /* each split's lease number (cwi_split) */
	size_t nsplits;
	uint64_t *clients; /* clients that received elements of it */
	size_t nclients, capclients;
	uint64_t group; /* exactly once: the group it is (split_lease_reply) */
	uint64_t total; /* ... and its elements, skipped ones included */
} lease_rec;

typedef struct pending_end {
	uint64_t split_id;
	uint32_t parts;
	uint32_t lease;
} pending_end;

typedef struct client_rec {
	uint64_t id;
	uint64_t seq; /* next reply number */
	pending_end *ends;
	size_t nends, capends;
} client_rec;

typedef struct held_req {
	cwi_request *r;
	cwi_msg_get_elements m;
	bool remote; /* the client is in another process: may compress */
	uint64_t expire_ns; /* answer with no elements then (0: never) */
} held_req;

/* Coordinated reads: a split whose end marker was met while a round was
 * formed, after `pos` of the round's elements. */
typedef struct coord_end {
	uint64_t split_id;
	uint32_t pos;
	uint32_t lease;
} coord_end;

/* One round of a coordinated task: element i goes to consumer i. */
typedef struct round_slot {
	cwi_element **e; /* ncons elements, then ncons taken flags */
	uint8_t *taken;
	uint32_t ntaken;
	uint64_t bytes; /* payload plus bookkeeping, for the queue bound */
	coord_end *ends;
	size_t nends;
} round_slot;

/* One operator row of a task's pipeline, with its own strings. */
typedef struct task_row {
	char name[48];
	char detail[80];
	cachew_op_stats s; /* name and detail unset */
} task_row;

/* Why a request got no reply: *err is CACHEW_OK when it must wait; else
 * the error, with `proto` set when it is the request's own fault (a
 * protocol error reply with msg) rather than the task's (a failure with
 * the task's message). */
typedef struct reply_status {
	cachew_err err;
	bool proto;
	bool pipeline; /* err is the task's pipeline's own (proto only) */
	bool compress; /* the reply's elements are to be compressed */
	char msg[256];
} reply_status;

struct cwi_wtask {
	atomic_uint refs;
	uint64_t id, job_id;
	uint64_t secret; /* its def's: requests must carry it (0: none) */
	cwi_processing_mode mode;
	uint32_t lease_size;
	uint64_t lease_seq; /* lease requests so far (the runner's) */
	uint64_t seed;
	uint64_t epoch; /* the job's: lease pipelines run with it */
	cachew_options *lease_opts; /* the worker's, with this epoch */
	const cwi_wtask_env *env;
	cachew_dataset *root;
	cwi_split_plan *plan;
	/* The component names of the task's output by its spec (one
	 * reference; NULL: the spec is not known or names nothing, or its
	 * names cannot travel): what its data replies tell the client. */
	cwi_names *spec_names;
	/* Exactly once (task_def.exactly_once): leases are numbered groups
	 * that keep their tails and leave out their `skip` ranges; replies
	 * carry runs. */
	bool exactly_once;

	pthread_t runner;
	bool runner_started;
	atomic_bool stop;
	bool poked; /* cwi_wtask_poke since the runner last waited */

	pthread_mutex_t lock;
	pthread_cond_t space; /* the runner waits for queue room */
	q_entry *q;
	size_t qhead, qlen, qcap;
	uint64_t qbytes;
	lease_rec *leases; /* indexed by lease number */
	size_t nleases, capleases;
	held_req *held;
	size_t nheld, capheld;
	client_rec *clients;
	size_t nclients, capclients;
	bool produced_all; /* the runner finished (or failed) */
	cachew_err failed;
	/* failed came from the lease pipeline itself (a corrupt file): it
	 * fails wherever its split goes, so clients get it as an error;
	 * other failures (the dispatcher unreachable) look like a worker
	 * gone, and the splits go elsewhere. */
	bool failed_pipeline;
	char errmsg[512];
	size_t qelems; /* elements (not lease ends) in the queue */

	/* Coordinated reads (ncons > 0): rounds formed from the queue, the
	 * oldest one not yet taken by every consumer first. */
	uint32_t ncons;
	round_slot *slots;
	size_t shead, nslots, capslots;
	uint64_t slot_base;  /* task_round of slots[shead] */
	uint64_t slot_bytes; /* held in formed rounds */
	uint64_t end_slot;   /* the first round that could not be formed */
	coord_end *end_ends; /* the splits that end with the end round */
	size_t nend_ends, capend_ends;
	uint8_t *end_served; /* per consumer: got the end round */
	uint32_t nend_served;
	uint64_t dropped;    /* elements of the incomplete last round */

	cwi_zstd_pool *zstd;
	atomic_bool compress_logged;
	/* zstd level: CWI_PAYLOAD_ZSTD_LEVEL, or the fastest level while the
	 * payloads do not compress (re-tried every ZSTD_RETRY frames). */
	atomic_int zlevel;
	atomic_uint zframes;
	/* delivered, cumulative */
	uint64_t elements, bytes;
	/* splits whose ends were handed out since the last report */
	uint64_t *delivered;
	size_t ndelivered, capdelivered;
	/* The autoscaler's busy signal: when the runner started and ended,
	 * and how long it waited for queue room (under lock). */
	uint64_t start_ns, end_ns, stall_ns;
	/* operator counters summed over finished leases (worker_stats.c;
	 * t->lock) */
	task_row *ops;
	size_t nops;
	uint64_t ops_leases; /* leases summed in ops */
	/* The ops_leases of the ops the dispatcher last took in a heartbeat
	 * (0: none, as there are none before a lease ends): a heartbeat
	 * leaves out rows it already has, which were most of an idle
	 * task's report. */
	uint64_t ops_leases_acked;

	/* Direct (worker_direct.c): no runner; the thread that sends a
	 * get_elements runs the lease pipeline, one at a time (pull_lock). */
	bool inline_run;
	pthread_mutex_t pull_lock;
	bool detached; /* the worker is gone (pull_lock) */
	cachew_iterator *pull_it; /* the lease being pulled, or NULL */
	uint64_t *pull_splits;    /* its splits */
	size_t pull_nsplits;
	uint64_t pull_group;      /* exactly once: its group, */
	uint64_t pull_next;       /* the next element's number, */
	cwi_rset pull_skip;       /* and what it leaves out */
};


/* Exactly once: numbers a lease's elements, leaves out its skip ranges
 * and, after its pipeline ended, hands out the tails it kept. */
typedef struct lease_feed {
	cachew_iterator *it;
	const cwi_rset *skip; /* NULL: none */
	uint64_t next;        /* the next element's number in the group */
	size_t tail_k;        /* next grouping operator to take tails of */
	cwi_chunk tails;      /* taken, not yet handed out */
	size_t tails_pos;
	uint32_t tails_of;    /* their tail number (k + 1) */
} lease_feed;

/* Opens the lease iterator for t (tails kept when exactly once). */
cachew_err cwi_wtask_lease_open(cwi_wtask *t, cachew_iterator **it,
    const cachew_options *opts, const cwi_unit_range *ranges, size_t n);
/* The next element of the lease with its number and tail, skipping what
 * the lease leaves out: CACHEW_OK, CACHEW_EOF after the last tail, or the
 * pipeline's error. */
cachew_err cwi_wtask_feed_next(cwi_wtask *t, lease_feed *f, cwi_element **e,
    uint64_t *index, uint32_t *tail);
void cwi_wtask_feed_free(lease_feed *f);
/* Appends count consecutive elements from `index` of a group of `splits`
 * splits (or, end, the group's end at `index`) to a reply's run list,
 * extending its last run when they follow it; false on ENOMEM. Every run
 * says its group's split count: a client saving its position records it
 * for the groups it has part of. */
bool cwi_wtask_run_add(cwi_run **runs, size_t *n, size_t *cap,
    uint64_t group, uint32_t splits, uint64_t index, uint32_t count,
    uint32_t tail, bool end);


/* ---- worker_stats.c: the task's operator counters ------------------------ */

/* Adds a finished lease's operator counters to the task's (takes
 * t->lock). */
void cwi_wtask_add_stats(cwi_wtask *t, cachew_iterator *it);
/* Sends the task's counters to the dispatcher (task_counters), waiting for
 * its reply: called by a runner between a lease's end and the queueing of
 * its end marker, so that the dispatcher has a lease's counters before
 * any client can acknowledge its splits. A failure costs only metrics (it
 * is logged at debug level). */
void cwi_wtask_send_counters(cwi_wtask *t);
/* Fills a report's ops and ops_leases (t->lock held); false on ENOMEM. */
bool cwi_wtask_report_ops(const cwi_wtask *t, cwi_task_report *rep);
/* Frees the task's counters (at its end). */
void cwi_wtask_stats_free(cwi_wtask *t);
/* Records that a split's end was handed out (t->lock held); false on
 * ENOMEM. */
bool cwi_wtask_add_delivered(cwi_wtask *t, uint64_t split_id);
/* Leases the task's next splits from the dispatcher (retrying while the
 * task runs); *rep is the split_lease_reply. */
cachew_err cwi_wtask_lease_splits(cwi_wtask *t, cwi_pmsg *rep);
/* The unit ranges of a lease reply's splits (malloc'd), or NULL. */
cwi_unit_range *cwi_wtask_lease_ranges(const cwi_msg_split_lease_reply *lr);
/* Encodes rep as msg's header (rep is freed). */
cachew_err cwi_wtask_set_header(cwi_msg *msg, cwi_pmsg *rep);
/* A client's record, created on first use (t->lock held); NULL on
 * ENOMEM. */
client_rec *cwi_wtask_client_get(cwi_wtask *t, uint64_t id);
/* Sets st to the request's own error (proto), with a message. */
void cwi_wtask_status_fail(reply_status *st, cachew_err err,
    const char *fmt, ...) CACHEW_PRINTF(3, 4);
/* Starts rep, the reply to m carrying count elements for client c: the
 * fields every delivery mode sets (task, c's next seq, round, and
 * compression, which st->compress records: zstd when m asks for it, the
 * client is remote and there is a payload). */
void cwi_wtask_reply_init(cwi_pmsg *rep, const cwi_wtask *t, client_rec *c,
    const cwi_msg_get_elements *m, bool remote, uint32_t count,
    reply_status *st);
/* Encodes rep as msg's header (rep is freed, its split ends with it) and
 * returns msg; NULL with st->err set (msg destroyed) on failure. A reply
 * with elements tells t's component names (cwi_wtask_reply_names). */
cwi_msg *cwi_wtask_reply_finish(const cwi_wtask *t, cwi_msg *msg,
    cwi_pmsg *rep, reply_status *st);
/* The component names a data reply whose elements msg holds tells its
 * client (one reference, or NULL): the task's spec's, else, where the
 * spec is not known at the worker either, those the first element
 * carries (an operator such as cache_get named it). Names that cannot
 * travel (cwi_names_ok) are not told. */
cwi_names *cwi_wtask_reply_names(const cwi_wtask *t, const cwi_msg *msg);

/* Coordinated (worker_coord.c), t->lock held. The reply to a coordinated
 * request: consumer i's element of the task's round m->task_round, formed
 * first if needed; end_of_task from the first round that could not be
 * formed on. NULL with st->err == CACHEW_OK when the round needs elements
 * that are not queued yet; CACHEW_ENOMEM fails the task (a round half
 * formed cannot be repaired). */
cwi_msg *cwi_wtask_coord_reply(cwi_wtask *t, const cwi_msg_get_elements *m,
    bool remote, reply_status *st);
/* Frees the rounds still held and the end round's records (at the task's
 * end). */
void cwi_wtask_rounds_free(cwi_wtask *t);

#endif /* CWI_WORKER_TASK_INT_H */
