/*
 * service_proto.h - the messages of the service protocol: one C struct per
 * message, a canonical msgpack encoder and a bounded decoder for hostile
 * input. docs/protocol.md ("Messages") specifies the wire form field by
 * field; this header is its C mirror.
 *
 * A message header is one msgpack map. Its first entry is "v", the
 * protocol version (CWI_PROTO_VERSION), its second "t", the message type
 * as a string ("worker_heartbeat"); every other key is a field of that
 * type, in any order.
 * Element payloads of the data path are not part of the header: the
 * transport attaches them as its element list, and the get_elements reply
 * only says how many there are and where splits end.
 *
 * Forward compatibility: a decoder ignores keys it does not know, and an
 * optional field that is absent takes its documented default (the encoder
 * leaves out optional fields that hold their default). A missing required
 * field, a field of the wrong type or a value over a limit is
 * CACHEW_EPROTO with a message naming the message type and the field path
 * ("service message worker_heartbeat: tasks[2].ops[0].name: expected a
 * string"); another protocol version is CACHEW_EPROTO too.
 *
 * Bounds: the decoder checks every string, bin and container length against
 * the field's limit and against the bytes that remain before it allocates,
 * and stops when what it allocated exceeds a small multiple of the input
 * size, so a message can never make it allocate more than
 * CWI_PROTO_EXPANSION times its own size plus a constant.
 *
 * Thread safety: the functions keep no state; a message struct is owned by
 * one thread at a time.
 */
#ifndef CWI_SERVICE_PROTO_H
#define CWI_SERVICE_PROTO_H

#include "../core/core.h"

/* The protocol version every header carries in "v". Bumped on any change a
 * peer of the previous version could misread; added optional fields do not
 * need a bump. */
#define CWI_PROTO_VERSION 1

/* Limits a decoder enforces (an encoder refuses to write past them too, so
 * a peer never sends what the other side must refuse). */
#define CWI_PROTO_MAX_HEADER (64u << 20)  /* bytes of one header */
#define CWI_PROTO_MAX_NAME 4096u          /* addresses, job and op names */
#define CWI_PROTO_MAX_ERRMSG 65536u       /* the error message's text */
#define CWI_PROTO_MAX_GRAPH (32u << 20)   /* a dataset's graph blob, as
					   * decoded (journals and snapshots
					   * of earlier versions may hold
					   * graphs this large) */
/* The largest graph a client registers: a dataset_register must fit the
 * dispatcher's 1 MiB control messages (CWI_TRANSPORT_MAX_MSG_CONTROL), with
 * 64 KiB left for its other fields. */
#define CWI_PROTO_MAX_GRAPH_SENT ((1u << 20) - (64u << 10))
#define CWI_PROTO_MAX_TASKS 65536u        /* tasks in one message */
#define CWI_PROTO_MAX_OPS 4096u           /* operator counters of a task */
#define CWI_PROTO_MAX_SPLITS (1u << 20)   /* split ids or splits in a list */
#define CWI_PROTO_MAX_STATUS (1u << 20)   /* entries of a status list */
#define CWI_PROTO_MAX_DEPTH 32u           /* nesting of skipped values */
#define CWI_PROTO_MAX_POLICY 64u          /* a scale policy's spelling */
#define CWI_PROTO_MAX_REASON 512u         /* a decision's reason line */
#define CWI_PROTO_MAX_FUNCTIONS 65536u    /* a worker's user functions */
#define CWI_PROTO_MAX_FN_NAME 63u         /* a function's or plugin's name,
					   * a plugin's version */
#define CWI_PROTO_FN_HASH 32u             /* a plugin's hash: hex digits */
#define CWI_PROTO_MAX_TOKEN 256u          /* the envelope's "k" */
#define CWI_PROTO_MAX_IDENTITY 64u        /* the envelope's "i" */
/* A component name on the wire: the cache manifest's rule (1 to 255
 * bytes, no control character), so a name a manifest gave a worker always
 * travels; at most CACHEW_MAX_COMPONENTS of them in a list. */
#define CWI_PROTO_MAX_COMPONENT_NAME CWI_COMPONENT_NAME_MAX
/* Decoded structs may take at most this many times the input's size (plus
 * CWI_PROTO_EXPANSION_SLACK bytes). */
#define CWI_PROTO_EXPANSION 16u
#define CWI_PROTO_EXPANSION_SLACK 65536u

/* "No round": the default of end_round and block_round. */
#define CWI_ROUND_NONE UINT64_MAX

typedef enum cwi_msg_type {
	CWI_MSG_NONE = 0,
	CWI_MSG_ERROR,                 /* any request -> error reply */
	CWI_MSG_OK,                    /* reply without fields */
	CWI_MSG_WORKER_REGISTER,       /* worker -> dispatcher */
	CWI_MSG_WORKER_REGISTER_REPLY,
	CWI_MSG_WORKER_HEARTBEAT,      /* worker -> dispatcher */
	CWI_MSG_WORKER_HEARTBEAT_REPLY,
	CWI_MSG_WORKER_DEREGISTER,     /* worker -> dispatcher; reply ok */
	CWI_MSG_DATASET_REGISTER,      /* client -> dispatcher */
	CWI_MSG_DATASET_REGISTER_REPLY,
	CWI_MSG_JOB_GET_OR_CREATE,     /* client -> dispatcher */
	CWI_MSG_JOB_GET_OR_CREATE_REPLY,
	CWI_MSG_CLIENT_HEARTBEAT,      /* client -> dispatcher */
	CWI_MSG_CLIENT_HEARTBEAT_REPLY,
	CWI_MSG_SPLIT_LEASE,           /* worker -> dispatcher */
	CWI_MSG_SPLIT_LEASE_REPLY,
	CWI_MSG_SPLIT_ACK,             /* client -> dispatcher; reply ok */
	CWI_MSG_JOB_RELEASE,           /* client -> dispatcher; reply ok */
	CWI_MSG_STATUS,                /* anyone -> dispatcher */
	CWI_MSG_STATUS_REPLY,
	CWI_MSG_GET_ELEMENTS,          /* client -> worker (data path) */
	CWI_MSG_GET_ELEMENTS_REPLY,    /* header; elements ride alongside */
	CWI_MSG_TASK_STATS,            /* client -> worker: a task's rows */
	CWI_MSG_TASK_STATS_REPLY,
	CWI_MSG_TASK_COUNTERS,         /* worker -> dispatcher; reply ok */
	CWI_MSG_NTYPES
} cwi_msg_type;

/* Enumerations travel as strings (the names in the comments). */
typedef enum cwi_processing_mode {
	CWI_MODE_DISTRIBUTED_EPOCH = 0, /* "distributed_epoch" (default) */
	CWI_MODE_PARALLEL_EPOCHS        /* "parallel_epochs" */
} cwi_processing_mode;

typedef enum cwi_compression {
	CWI_COMPRESSION_NONE = 0, /* "none" (default) */
	CWI_COMPRESSION_ZSTD,     /* "zstd" */
	CWI_COMPRESSION_AUTO      /* "auto": only when the link is the limit */
} cwi_compression;

typedef enum cwi_worker_policy {
	CWI_WORKERS_ALL = 0, /* "all": every live worker (default) */
	CWI_WORKERS_FIXED    /* "fixed": num_workers of them */
} cwi_worker_policy;

typedef enum cwi_task_state {
	CWI_TASK_ACTIVE = 0, /* "active": takes leases, in the schedule */
	CWI_TASK_STARTING,   /* "starting": coordinated, waits for its round */
	CWI_TASK_REMOVING    /* "removing": finishes its leased splits */
} cwi_task_state;

/* ---- control messages ---------------------------------------------------- */

/* The reply to a request that succeeded without a reply of its own. A
 * split_ack's says whether the job's data is all acknowledged (so the
 * client may end the epoch without waiting for its tasks' ends). */
typedef struct cwi_msg_ok {
	bool job_finished;
} cwi_msg_ok;

/* The reply to any request that failed. code is a cachew_err value. */
typedef struct cwi_msg_error {
	int64_t code;
	char *message;
	/* The code and message are a task's pipeline's own, as the plain
	 * executor gives them (a direct task's get_elements); otherwise the
	 * error is the request's or the server's. */
	bool pipeline;
	/* From a dispatcher: its lineage, so that a peer told an id is
	 * unknown can tell a restart without its state (another lineage)
	 * from an id it dropped. 0: not said. */
	uint64_t lineage;
} cwi_msg_error;

/* A user function (not built in) a worker can run, and the plugin build
 * it came from (docs/graph-format.md, section 2). */
typedef struct cwi_fn_info {
	char *name;
	char *plugin;         /* NULL: of no plugin (registered from C) */
	char *plugin_version; /* NULL: the plugin does not say */
	char *plugin_hash;    /* the plugin file's XXH3-128, 32 hex digits */
} cwi_fn_info;

typedef struct cwi_msg_worker_register {
	char *address;         /* the worker's data listener (tcp://h:p) */
	uint32_t cores;        /* CPU cores it may use */
	uint64_t memory_bytes; /* RAM it may use; 0 = unknown */
	char *build;           /* software version, for the status; optional */
	/* The worker serves its uncoordinated distributed_epoch tasks
	 * directly: a get_elements runs the task's pipeline on the thread
	 * that sends it (an in-process worker on the inproc transport). */
	bool direct;
	/* Its user functions: the dispatcher gives it only tasks whose
	 * graphs need no other (absent: none). */
	cwi_fn_info *functions;
	size_t nfunctions;
} cwi_msg_worker_register;

typedef struct cwi_msg_worker_register_reply {
	uint64_t worker_id;
	uint32_t heartbeat_interval_ms;
	uint32_t worker_timeout_ms; /* silent this long = dead */
	/* The dispatcher's lineage (docs/journal.md): echoed in every
	 * later request that names the ids this reply gave. */
	uint64_t lineage;
} cwi_msg_worker_register_reply;

/* Cumulative counters of one operator of a task's pipeline. */
typedef struct cwi_op_counters {
	char *name;        /* the node's operator name and index */
	uint64_t elements; /* produced */
	uint64_t bytes;    /* produced */
	uint64_t busy_ns;  /* time spent computing */
	uint64_t wait_ns;  /* time spent waiting for input */
	uint64_t buffered; /* elements in its output buffer now */
	char *detail;      /* e.g. the map function; task_stats rows only */
	int64_t node;      /* index in the task's pipeline order; task_stats
			    * rows only (heartbeats: the name's prefix) */
	int64_t parallelism;  /* threads (summed over a job's tasks) */
	int64_t buffer_limit; /* elements it may buffer */
	uint64_t dropped;     /* ignore_errors: elements dropped below it */
	uint64_t cache_hit_bytes; /* of bytes, read from a cache */
} cwi_op_counters;

typedef struct cwi_task_report {
	uint64_t task_id;
	bool done;                 /* delivered everything it will deliver */
	uint64_t elements;         /* delivered to clients, cumulative */
	uint64_t bytes;            /* delivered to clients, cumulative */
	uint64_t *splits_delivered; /* last element sent since last report */
	size_t nsplits_delivered;
	cwi_op_counters *ops;
	size_t nops;
	/* Cumulative since the task started: how long its pipeline has run
	 * (wall clock; 0 = not measured) and, of that, how long it waited
	 * for room in the task's full output queue. The dispatcher's
	 * worker_busy is 1 - d(stall_ns)/d(run_ns). */
	uint64_t run_ns;
	uint64_t stall_ns;
	/* How many finished leases ops sums: of two reports of a task, the
	 * dispatcher keeps the ops of the one that counts more (a heartbeat
	 * built before a task_counters may arrive after it). */
	uint64_t ops_leases;
} cwi_task_report;

typedef struct cwi_msg_worker_heartbeat {
	uint64_t worker_id;
	double cpu_use; /* cores busy, averaged since the last heartbeat */
	bool draining;  /* take no new splits or tasks; finish leased ones */
	/* Every task the worker holds, running or done, until told to stop. */
	cwi_task_report *tasks;
	size_t ntasks;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_worker_heartbeat;

/* What a worker needs to run a task. */
typedef struct cwi_task_def {
	uint64_t task_id;
	uint64_t job_id;
	uint64_t dataset_id;
	cachew_fingerprint fingerprint;
	uint8_t *graph; /* canonical msgpack graph (docs/graph-format.md) */
	size_t graph_len;
	cwi_processing_mode processing_mode;
	cwi_compression compression;
	uint32_t num_consumers; /* > 0: coordinated reads (rounds) */
	uint32_t lease_size;    /* splits to ask for per lease request */
	uint64_t seed;          /* the job's pipeline seed (leases derive
				 * theirs from it) */
	uint64_t epoch;         /* the job's epoch (lease pipelines run
				 * with it, as the `epoch` option) */
	/* Exactly-once delivery (distributed_epoch): number each lease's
	 * elements, keep its tails for the client to stitch, leave out the
	 * lease's `skip` ranges, and describe replies with `runs`. */
	bool exactly_once;
	/* The task's data-path secret (cwi_task_info.secret): serve
	 * get_elements and task_stats only with it, when not 0. */
	uint64_t secret;
} cwi_task_def;

typedef struct cwi_msg_worker_heartbeat_reply {
	cwi_task_def *start; /* tasks to start (not in the heartbeat) */
	size_t nstart;
	uint64_t *stop; /* reported tasks to drop at once */
	size_t nstop;
} cwi_msg_worker_heartbeat_reply;

typedef struct cwi_msg_worker_deregister {
	uint64_t worker_id;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_worker_deregister;

typedef struct cwi_msg_dataset_register {
	cachew_fingerprint fingerprint;
	uint8_t *graph;
	size_t graph_len;
	/* The units of the split source (0..2^64-1) when splittable; else
	 * the pipeline has none and runs whole, as one unit. One wire field,
	 * `split_units`: the count, or -1 for not splittable. */
	uint64_t split_units;
	bool splittable;
} cwi_msg_dataset_register;

typedef struct cwi_msg_dataset_register_reply {
	uint64_t dataset_id;
	bool created; /* false: the fingerprint was known */
} cwi_msg_dataset_register_reply;

typedef struct cwi_msg_job_get_or_create {
	uint64_t dataset_id;
	char *job_name;     /* NULL: a private job */
	uint64_t iteration; /* with job_name: which pass of a named job */
	cwi_processing_mode processing_mode;
	uint32_t num_consumers; /* 0: uncoordinated */
	int64_t consumer_index; /* coordinated: 0..num_consumers-1, else -1 */
	cwi_worker_policy worker_policy;
	uint32_t num_workers; /* for CWI_WORKERS_FIXED */
	cwi_compression compression;
	uint64_t client_id; /* a retry: the id a previous reply gave; else 0 */
	/* Random, made once per join (0: none): a request sent again whose
	 * reply was lost (a dispatcher restart) finds the client it made
	 * instead of making another. */
	uint64_t nonce;
	uint64_t seed;      /* pipeline seed; the job's first client sets it */
	/* The epoch its data is for (the client's `epoch` option plus the
	 * repetitions before this pass): reshuffles and per-epoch file
	 * orders draw from it as in-process; the first client sets it. */
	uint64_t epoch;
	/* Autoscaling (the job's first client sets them): the policy
	 * ("model", "cachew", "fixed:N", "hpa:P"; NULL: the dispatcher's),
	 * the fair-share weight (0: 1) and bounds (0: none). */
	char *scale_policy;
	double weight;
	uint32_t min_workers;
	uint32_t max_workers;
	/* Exactly-once delivery and batches stitched across leases (the
	 * job's first client sets it; false: the at-least-once bookkeeping
	 * of older clients, or the `exactly_once=false` debug option). */
	bool exactly_once;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
	/* Resuming a saved position (cachew_iterator_restore; a private,
	 * uncoordinated, exactly-once job only): the layout the position was
	 * saved under (the units and units per split its job reply gave;
	 * resume_units_per_split 0: no resume) and what the client had of
	 * each group it had elements of. The new job's ledger cuts the units
	 * the same way, acknowledges the groups received whole and forms the
	 * others again, with their received ranges as their skip. */
	uint64_t resume_units;
	uint64_t resume_units_per_split;
	struct cwi_progress *resume;
	size_t nresume;
} cwi_msg_job_get_or_create;

typedef struct cwi_msg_job_get_or_create_reply {
	uint64_t job_id;
	uint64_t client_id;
	bool created; /* false: joined an existing named job */
	cwi_processing_mode processing_mode; /* the job's, which wins */
	uint32_t num_consumers;
	cwi_compression compression;
	uint32_t heartbeat_interval_ms;
	/* The dispatcher's lineage (docs/journal.md): echoed in every
	 * later request that names the ids this reply gave. */
	uint64_t lineage;
	/* distributed_epoch: the job's split layout (its units and units per
	 * split), which a saved position records; 0 when the job has none. */
	uint64_t units;
	uint64_t units_per_split;
} cwi_msg_job_get_or_create_reply;

typedef struct cwi_msg_client_heartbeat {
	uint64_t job_id;
	uint64_t client_id;
	uint64_t batch_time_ns; /* mean time per batch since the last one */
	uint64_t batches;       /* batches consumed since the last one */
	uint64_t wait_time_ns;  /* time spent waiting for data since then */
	double buffer_fill;     /* client buffer occupancy, 0..1 */
	uint64_t round;         /* coordinated: the next round it will read */
	uint64_t *acked_splits; /* splits received completely since then */
	size_t nacked_splits;
	/* Elements (and their payload bytes) of the job this client took
	 * from the service, cumulative: the job's counters in the status. */
	uint64_t elements_received;
	uint64_t bytes_received;
	/* Exactly once: tasks this client stopped reading since its last
	 * heartbeat (stop_tasks, or failed_tasks), and what it received of
	 * the groups they served it; tasks whose data requests failed (the
	 * dispatcher takes them from the job and replays their groups). */
	uint64_t *stopped_tasks;
	size_t nstopped_tasks;
	uint64_t *failed_tasks;
	size_t nfailed_tasks;
	struct cwi_progress *progress;
	size_t nprogress;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_client_heartbeat;

/* What one client received of a group (a lease's elements, numbered from
 * 0): ranges[2i] <= index < ranges[2i+1], ascending and disjoint; `ended`
 * when it received the group's end, after `total` elements in all;
 * `splits`: the group's split count (0: not told; a resume needs it). */
typedef struct cwi_progress {
	uint64_t group;
	uint64_t *ranges;
	size_t nranges;
	bool ended;
	uint64_t total;
	uint32_t splits;
} cwi_progress;

/* A task a client reads from. */
typedef struct cwi_task_info {
	uint64_t task_id;
	uint64_t worker_id;
	char *address;        /* the worker's data listener */
	cwi_task_state state; /* removing: read it to its end, expect no more */
	uint64_t start_round; /* coordinated: first round it serves */
	uint64_t end_round;   /* coordinated: first round it does not serve */
	/* Served directly (its worker registered `direct`): read it by
	 * get_elements calls from the consuming thread, one at a time, with
	 * the client's executor settings; keep no requests in flight. */
	bool direct;
	/* The task's data-path secret, given only to its job's clients: sent
	 * in get_elements and task_stats (0: the dispatcher has none). */
	uint64_t secret;
} cwi_task_info;

typedef struct cwi_msg_client_heartbeat_reply {
	bool job_finished; /* no more data: read the tasks to their end */
	cwi_task_info *tasks; /* in task id order */
	size_t ntasks;
	uint64_t block_round; /* coordinated: read no round >= this yet */
	uint64_t splits_total;
	uint64_t splits_acked;
	/* The worker part's operator counters summed over the job's tasks,
	 * those that ended included (as their workers last reported them:
	 * every finished lease's once the job's data is all acknowledged). */
	cwi_op_counters *ops;
	size_t nops;
	/* Exactly once: tasks gone from the job (their worker died or was
	 * slow, or a client could not read them): stop reading them, then
	 * name them in the next heartbeat's stopped_tasks with progress. */
	uint64_t *stop_tasks;
	size_t nstop_tasks;
	/* How often to heartbeat from now on (0: as before): the dispatcher
	 * stretches it when it has many clients. */
	uint32_t heartbeat_interval_ms;
} cwi_msg_client_heartbeat_reply;

typedef struct cwi_msg_split_lease {
	uint64_t worker_id;
	uint64_t task_id;
	uint32_t max_splits;
	/* The task's lease request number (1, 2, ...; 0: not told): a
	 * request sent again (its reply was lost, a dispatcher restart) has
	 * the same number and gets the same lease, not another one. */
	uint64_t seq;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_split_lease;

/* Split split_id covers units [begin, end) of the dataset's split source. */
typedef struct cwi_split {
	uint64_t split_id;
	uint64_t begin;
	uint64_t end;
	/* Which lease of the split this is (1, 2, ...; 0: not told): its
	 * split ends and acks carry it back, so that a part acknowledged for
	 * an earlier lease does not count for this one. */
	uint32_t lease;
} cwi_split;

typedef struct cwi_msg_split_lease_reply {
	cwi_split *splits;
	size_t nsplits;
	bool end_of_splits; /* no more for this task, ever */
	uint32_t retry_ms;  /* none now: ask again after this long */
	/* Exactly once: the group these splits form (the id of its first
	 * split; a group is always leased whole, with the same ranges), and
	 * the element ranges of it already delivered, to leave out:
	 * skip[2i] <= index < skip[2i+1]. */
	uint64_t group;
	uint64_t *skip;
	size_t nskip;
} cwi_msg_split_lease_reply;

typedef struct cwi_msg_split_ack {
	uint64_t job_id;
	uint64_t client_id;
	uint64_t *split_ids;
	size_t nsplit_ids;
	/* parts[i]: how many clients share split_ids[i] (the split end's
	 * parts); absent or 0 means 1. Either empty or nsplit_ids long. */
	uint64_t *parts;
	size_t nparts;
	/* leases[i]: the lease of split_ids[i] the part belongs to (the
	 * split end's lease); absent or 0: not told. Either empty or
	 * nsplit_ids long. */
	uint64_t *leases;
	size_t nleases;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_split_ack;

typedef struct cwi_msg_job_release {
	uint64_t job_id;
	uint64_t client_id;
	/* The client's final counts (client_heartbeat's). */
	uint64_t elements_received;
	uint64_t bytes_received;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_job_release;

typedef struct cwi_msg_status {
	uint8_t unused_; /* no fields */
} cwi_msg_status;

typedef struct cwi_worker_status {
	uint64_t worker_id;
	char *address;
	uint32_t cores;
	bool draining;
	uint64_t heartbeat_age_ms;
	double cpu_use;
	uint32_t tasks;
} cwi_worker_status;

typedef struct cwi_dataset_status {
	uint64_t dataset_id;
	cachew_fingerprint fingerprint;
	uint64_t split_units; /* as in cwi_msg_dataset_register */
	bool splittable;
} cwi_dataset_status;

typedef struct cwi_job_status {
	uint64_t job_id;
	char *name; /* NULL: private */
	uint64_t iteration;
	uint64_t dataset_id;
	cwi_processing_mode processing_mode;
	uint32_t num_consumers;
	uint32_t clients;
	uint32_t tasks;
	uint32_t target_workers;
	uint64_t units_per_split;
	uint64_t splits_total;
	uint64_t splits_pending;
	uint64_t splits_leased;
	uint64_t splits_acked;
	uint64_t elements; /* received by its clients, as they report */
	uint64_t bytes;
	double elements_per_s;
	double bytes_per_s;
	uint64_t batch_time_ns; /* mean over its clients */
	/* Mean over its clients of the share of their time spent waiting
	 * for data (0..1, by their last heartbeats): the input-bound signal
	 * a person reads. */
	double client_wait;
	bool data_done;         /* every split acked (or every task done) */
	bool finished;          /* every client gone */
	/* Autoscaling (absent when the dispatcher does not autoscale). */
	char *scale_policy;     /* canonical spelling ("fixed:2") */
	double weight;          /* fair-share weight */
	uint32_t want;          /* what the policy asks for */
	uint32_t granted;       /* what fair share gave it */
	bool settled;           /* the policy considers the count converged */
	char *reason;           /* the last decision's reason */
	/* Autocaching (absent when the dispatcher has no cache root). */
	char *cache_mode;       /* "profile", "put", "get", "compute" */
	char *cache_reason;     /* what the planner decided and why */
	/* From its tasks' operator rows (those done included): the
	 * operator whose own work per thread took longest, and that time's
	 * share of the sum over its operators (0..1); NULL/0 before any
	 * row. cache_hit_bytes: the sum of its rows' (cache_get, cache
	 * reading its cache, the in-memory cache replaying). */
	char *slowest_op;
	double slowest_op_share;
	uint64_t cache_hit_bytes;
} cwi_job_status;

typedef struct cwi_task_status {
	uint64_t task_id;
	uint64_t job_id;
	uint64_t worker_id;
	cwi_task_state state;
	uint64_t splits_leased;
	uint64_t elements;
	uint64_t bytes;
	double elements_per_s;
} cwi_task_status;

typedef struct cwi_msg_status_reply {
	uint64_t time_ns; /* the dispatcher's clock */
	cwi_worker_status *workers;
	size_t nworkers;
	cwi_dataset_status *datasets;
	size_t ndatasets;
	cwi_job_status *jobs;
	size_t njobs;
	cwi_task_status *tasks;
	size_t ntasks;
	/* The pool (absent when the dispatcher does not autoscale): the
	 * workers every job together wants within the dispatcher's bounds,
	 * and what its provisioner did about it. */
	uint32_t pool_target;
	char *provisioner;          /* "static", "process", "kubernetes" */
	uint32_t provisioner_running;
	uint64_t provisioner_requests;
	uint64_t provisioner_failures;
	char *provisioner_error;    /* the last action's error, if any */
	/* Recovery (docs/journal.md): the state's lineage, its starts so
	 * far, and what its journal holds (absent: no journal). */
	uint64_t lineage;
	uint64_t incarnation;
	char *journal;
	/* To a token that is not an admin's: how many jobs (and their
	 * tasks) of other identities the lists leave out. */
	uint64_t other_jobs;
	uint64_t other_tasks;
} cwi_msg_status_reply;

/* ---- data path ----------------------------------------------------------- */

typedef struct cwi_msg_get_elements {
	uint64_t task_id;
	uint64_t client_id;
	int64_t consumer_index; /* coordinated: this consumer; else -1 */
	uint64_t round;         /* coordinated: the round asked for */
	uint32_t max_elements;  /* 0: the worker's default */
	uint64_t max_bytes;     /* 0: the worker's default */
	cwi_compression compression; /* what the client accepts */
	/* Coordinated: which of the task's rounds, counted from 0 in the
	 * order every consumer reads them from this task (the worker forms
	 * its rounds by this index; `round` is informative). */
	uint64_t task_round;
	/* A direct task's lease pipeline runs with the client's executor
	 * settings, as it would in the client's process (exec set): */
	bool exec;
	uint64_t epoch;
	int64_t threads;
	int64_t ram_budget;
	int64_t max_element_bytes; /* 0: the worker's */
	bool deterministic;
	bool autotune;
	/* The longest the worker may hold the request while it has nothing
	 * to send before it answers with no elements (0: no limit): the
	 * client's request times out after its service timeout, which a
	 * slow epoch's end (every split leased elsewhere) must not reach. */
	uint32_t wait_ms;
	/* The task's secret (cwi_task_info.secret): a worker whose task has
	 * one serves only requests that carry it. */
	uint64_t secret;
} cwi_msg_get_elements;

/* "Split split_id ended after the first `after` elements of this reply." */
typedef struct cwi_split_end {
	uint64_t split_id;
	uint32_t after;
	/* How many clients received elements of the split's lease (each gets
	 * this end); the split is done when that many acks came. 0 means 1. */
	uint32_t parts;
	uint32_t lease; /* the split's lease (cwi_split.lease), 0: not told */
} cwi_split_end;

/* Exactly once: `n` consecutive elements of a reply are elements from..
 * from+n-1 of group `group`; tail > 0: they are the partial group that
 * grouping operator tail-1 of the pipeline held at the lease's end (the
 * client stitches them), else the pipeline's output. */
typedef struct cwi_run {
	uint64_t group;
	uint64_t from;
	uint32_t n;
	uint32_t tail;
	/* The group ends with this run: it has from + n elements in all
	 * (n may be 0: the end alone). */
	bool end;
	/* The group's split count (the next group in split order is group +
	 * splits): on every run since resumable iteration (a client saving
	 * its position records it for groups it has part of), on the end
	 * run only before (0 elsewhere). */
	uint32_t splits;
} cwi_run;

typedef struct cwi_msg_get_elements_reply {
	uint64_t task_id;
	uint64_t seq;      /* this reply's number in the task's stream to the
			    * client, from 0, so split ends order across
			    * pipelined replies */
	uint32_t elements; /* how many the transport attached */
	cwi_split_end *split_ends; /* ascending `after` */
	size_t nsplit_ends;
	bool end_of_task; /* nothing follows */
	uint64_t round;
	cwi_compression compression; /* of the attached payloads */
	uint64_t task_round;   /* coordinated: the request's, echoed */
	/* Payload bytes the task still held ready after this reply (queued
	 * and, coordinated, in rounds not yet taken by every consumer): the
	 * client's sign that the worker is ahead of the link. */
	uint64_t queued_bytes;
	/* A direct task with nothing to deliver yet (every split is leased
	 * elsewhere): ask again after this many ms. */
	uint32_t retry_ms;
	/* Exactly once: what the elements are, in order (they add up to
	 * `elements`). */
	cwi_run *runs;
	size_t nruns;
	/* The component names of the worker part's output as the worker
	 * knows them (one reference; NULL: not told, which is what a worker
	 * before names sends). On the wire a list with one string per
	 * component, "" for an unnamed one; the client gives them to the
	 * elements only where its own spec of that output has no names (a
	 * cache whose manifest it could not read at build). */
	cwi_names *names;
} cwi_msg_get_elements_reply;

/* A task's operator rows, live (the lease pipeline being read) or of its
 * last lease; busy: a get_elements is running it, no rows were taken. */
typedef struct cwi_msg_task_stats {
	uint64_t task_id;
	uint64_t secret; /* the task's (cwi_task_info.secret) */
} cwi_msg_task_stats;

typedef struct cwi_msg_task_stats_reply {
	cwi_op_counters *ops;
	size_t nops;
	bool busy;
} cwi_msg_task_stats_reply;

/* A task's operator counters summed over its finished leases, sent by
 * its worker when a lease ends, before the lease's end goes to any
 * client: once every split of a job is acknowledged, the dispatcher has
 * every finished lease's counters. */
typedef struct cwi_msg_task_counters {
	uint64_t worker_id;
	uint64_t task_id;
	uint64_t ops_leases; /* how many finished leases ops sums */
	cwi_op_counters *ops;
	size_t nops;
	/* The dispatcher lineage the ids above came from (the register or
	 * job reply's); 0: not known. Another lineage is refused. */
	uint64_t lineage;
} cwi_msg_task_counters;

/* ---- the envelope -------------------------------------------------------- */

typedef struct cwi_pmsg {
	cwi_msg_type type;
	/* The envelope's optional entries after "v" and "t" (any message):
	 * "k", the sender's token (a secret: never logged or journaled),
	 * and "i", the identity the dispatcher's server layer found for
	 * that token, which it sets (overwriting whatever a peer sent)
	 * before the state machine sees the request. NULL: absent. */
	char *token;
	char *identity;
	union {
		cwi_msg_error error;
		cwi_msg_ok ok;
		cwi_msg_worker_register worker_register;
		cwi_msg_worker_register_reply worker_register_reply;
		cwi_msg_worker_heartbeat worker_heartbeat;
		cwi_msg_worker_heartbeat_reply worker_heartbeat_reply;
		cwi_msg_worker_deregister worker_deregister;
		cwi_msg_dataset_register dataset_register;
		cwi_msg_dataset_register_reply dataset_register_reply;
		cwi_msg_job_get_or_create job_get_or_create;
		cwi_msg_job_get_or_create_reply job_get_or_create_reply;
		cwi_msg_client_heartbeat client_heartbeat;
		cwi_msg_client_heartbeat_reply client_heartbeat_reply;
		cwi_msg_split_lease split_lease;
		cwi_msg_split_lease_reply split_lease_reply;
		cwi_msg_split_ack split_ack;
		cwi_msg_job_release job_release;
		cwi_msg_status status;
		cwi_msg_status_reply status_reply;
		cwi_msg_get_elements get_elements;
		cwi_msg_get_elements_reply get_elements_reply;
		cwi_msg_task_stats task_stats;
		cwi_msg_task_stats_reply task_stats_reply;
		cwi_msg_task_counters task_counters;
	} u;
} cwi_pmsg;

/* The wire name of a type ("worker_heartbeat"), "?" for an invalid one. */
const char *cwi_msg_type_name(cwi_msg_type type);

/* The wire names of the enumerations; "?" for invalid values. */
const char *cwi_processing_mode_name(cwi_processing_mode mode);
const char *cwi_compression_name(cwi_compression c);
const char *cwi_worker_policy_name(cwi_worker_policy p);
const char *cwi_task_state_name(cwi_task_state s);
/* Parses a wire name; CACHEW_EINVAL (errmsg set) for an unknown one. */
cachew_err cwi_processing_mode_parse(const char *s, cwi_processing_mode *out);
cachew_err cwi_compression_parse(const char *s, cwi_compression *out);

/* Sets m to an empty message of `type` with every optional field at its
 * default (end_round CWI_ROUND_NONE, consumer_index -1, ...). */
void cwi_pmsg_init(cwi_pmsg *m, cwi_msg_type type);
/* The same for a bare body (a member of cwi_pmsg.u) of `type`. */
void cwi_pmsg_body_init(cwi_msg_type type, void *body);
/* Frees what a message owns (every pointer in it is heap memory owned by
 * the message, freed with free(), the envelope's token and identity
 * included) and resets it to CWI_MSG_NONE. */
void cwi_pmsg_free(cwi_pmsg *m);
void cwi_pmsg_body_free(cwi_msg_type type, void *body);

/* Sets m's token to a copy of `token` (NULL: none), replacing any;
 * CACHEW_ENOMEM when the copy fails. */
cachew_err cwi_pmsg_set_token(cwi_pmsg *m, const char *token);

/* Appends the header encoding of m (its envelope's "k" and "i" included
 * when set) to out. CACHEW_ERANGE (errmsg names the
 * field) when a field exceeds its limit, CACHEW_EINVAL for an invalid type
 * or enumeration value, CACHEW_ENOMEM when out ran out of memory. */
cachew_err cwi_pmsg_encode(const cwi_pmsg *m, cwi_strbuf *out);
cachew_err cwi_pmsg_body_encode(cwi_msg_type type, const void *body,
    cwi_strbuf *out);

/* Decodes the header in buf (exactly len bytes: trailing bytes are an
 * error) into *out, which the caller then frees with cwi_pmsg_free. Any
 * defect is CACHEW_EPROTO with a message that names the message type and
 * field; CACHEW_ENOMEM when memory runs out. *out is CWI_MSG_NONE after a
 * failure. */
cachew_err cwi_pmsg_decode(const uint8_t *buf, size_t len, cwi_pmsg *out);

/* Coordinated reads: the task that serves `round` to every consumer. The
 * tasks whose [start_round, end_round) holds the round, in task id order,
 * take rounds in turn: task k serves round r when k == r mod (their
 * count). CACHEW_ENOENT when no task serves the round yet (the client
 * waits for a heartbeat that brings one). */
cachew_err cwi_coord_round_task(const cwi_task_info *tasks, size_t ntasks,
    uint64_t round, uint64_t *task_id);

#endif /* CWI_SERVICE_PROTO_H */
