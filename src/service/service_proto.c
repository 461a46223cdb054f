/*
 * service_proto.c - the service messages' codec (see service_proto.h and
 * docs/protocol.md).
 *
 * Every message body is described once, by a schema: a table of fields
 * (wire key, type, offset in the C struct, limit, default). One encoder,
 * one decoder, one initialiser and one destructor walk the tables, so a
 * field added to a struct and its table is encoded, decoded, bounded and
 * freed the same way as every other.
 *
 * The decoder reads msgpack directly from the input instead of building a
 * cwi_value tree first: it needs bin (the graph blob), which the value
 * codec refuses, it must skip unknown keys without allocating, and it can
 * then name the exact field that is wrong.
 */
#include "service_proto.h"
#include "../core/value_msgpack.h"

#include <stdio.h>
#include <stdlib.h>

_Static_assert(sizeof(cwi_processing_mode) == sizeof(int) &&
	sizeof(cwi_compression) == sizeof(int) &&
	sizeof(cwi_worker_policy) == sizeof(int) &&
	sizeof(cwi_task_state) == sizeof(int),
    "enumeration fields are stored as int");

/* ---- schemas ------------------------------------------------------------- */

typedef enum ftype {
	F_U64,  /* uint64_t */
	F_U32,  /* uint32_t */
	F_I64,  /* int64_t */
	F_F64,  /* double */
	F_BOOL, /* bool */
	F_STR,  /* char *, NUL-terminated, no NUL inside */
	F_BIN,  /* uint8_t * at off, size_t length at off_n */
	F_ENUM, /* an int-sized enum, written as its name */
	F_FP,   /* cachew_fingerprint, written as 32 hex digits */
	F_U64S, /* uint64_t * at off, size_t count at off_n */
	F_OBJS, /* array of `sub` structs at off, size_t count at off_n */
	/* A unit count: uint64_t at off, bool "has one" at off_n; an
	 * integer on the wire, -1 for none (the default), else 0..2^64-1. */
	F_UNITS,
	/* Component names: cwi_names * at off (one reference, NULL: none);
	 * a list of strings on the wire, "" for an unnamed component. */
	F_NAMES
} ftype;

#define F_REQ 1u /* required: absence is an error */

typedef struct schema schema;

typedef struct field {
	const char *key;
	uint8_t type;
	uint8_t flags;
	size_t off;
	size_t off_n;
	uint32_t max;         /* string/bin length, array count */
	int64_t def;          /* integers, bools, enums: the default */
	const schema *sub;    /* F_OBJS */
	const char *const *names; /* F_ENUM */
	unsigned nnames;
} field;

struct schema {
	const char *name; /* the message type or item name */
	size_t size;
	const field *fields;
	size_t nfields;
};

#define OFF(T, m) offsetof(T, m)
#define U64(T, m, fl) {#m, F_U64, fl, OFF(T, m), 0, 0, 0, NULL, NULL, 0}
#define U64D(T, m, d) \
	{#m, F_U64, 0, OFF(T, m), 0, 0, (int64_t)(d), NULL, NULL, 0}
#define U32(T, m, fl) {#m, F_U32, fl, OFF(T, m), 0, 0, 0, NULL, NULL, 0}
#define I64D(T, m, d) {#m, F_I64, 0, OFF(T, m), 0, 0, d, NULL, NULL, 0}
#define F64(T, m) {#m, F_F64, 0, OFF(T, m), 0, 0, 0, NULL, NULL, 0}
#define BOOL(T, m) {#m, F_BOOL, 0, OFF(T, m), 0, 0, 0, NULL, NULL, 0}
#define STR(T, m, fl, mx) {#m, F_STR, fl, OFF(T, m), 0, mx, 0, NULL, NULL, 0}
#define BIN(T, m, fl, mx) \
	{#m, F_BIN, fl, OFF(T, m), OFF(T, m##_len), mx, 0, NULL, NULL, 0}
#define ENUM(T, m, nm) \
	{#m, F_ENUM, 0, OFF(T, m), 0, 0, 0, NULL, nm, \
	    (unsigned)(sizeof(nm) / sizeof(nm[0]))}
#define FP(T, m) {#m, F_FP, F_REQ, OFF(T, m), 0, 0, 0, NULL, NULL, 0}
#define U64S(T, m, fl, mx) \
	{#m, F_U64S, fl, OFF(T, m), OFF(T, n##m), mx, 0, NULL, NULL, 0}
#define OBJS(T, m, fl, mx, sc) \
	{#m, F_OBJS, fl, OFF(T, m), OFF(T, n##m), mx, 0, &sc, NULL, 0}
#define UNITS(T, m, has) \
	{#m, F_UNITS, 0, OFF(T, m), OFF(T, has), 0, 0, NULL, NULL, 0}
#define NAMES(T, m) \
	{#m, F_NAMES, 0, OFF(T, m), 0, CACHEW_MAX_COMPONENTS, 0, NULL, NULL, 0}
#define SCHEMA(nm, T, f) \
	{nm, sizeof(T), f, sizeof(f) / sizeof(f[0])}

static const char *const mode_names[] = {"distributed_epoch",
    "parallel_epochs"};
static const char *const compression_names[] = {"none", "zstd", "auto"};
static const char *const policy_names[] = {"all", "fixed"};
static const char *const task_state_names[] = {"active", "starting",
    "removing"};

static const field f_error[] = {
    {"code", F_I64, F_REQ, OFF(cwi_msg_error, code), 0, 0, 0, NULL, NULL, 0},
    STR(cwi_msg_error, message, F_REQ, CWI_PROTO_MAX_ERRMSG),
    BOOL(cwi_msg_error, pipeline),
    U64(cwi_msg_error, lineage, 0),
};

/* The envelope's optional entries, at offsets of cwi_pmsg itself. */
static const field f_envelope[] = {
    {"k", F_STR, 0, OFF(cwi_pmsg, token), 0, CWI_PROTO_MAX_TOKEN, 0, NULL,
	NULL, 0},
    {"i", F_STR, 0, OFF(cwi_pmsg, identity), 0, CWI_PROTO_MAX_IDENTITY, 0,
	NULL, NULL, 0},
};
static const schema s_envelope = SCHEMA("envelope", cwi_pmsg, f_envelope);

static const field f_ok[] = {
    BOOL(cwi_msg_ok, job_finished),
};

static const field f_fn_info[] = {
    STR(cwi_fn_info, name, F_REQ, CWI_PROTO_MAX_FN_NAME),
    STR(cwi_fn_info, plugin, 0, CWI_PROTO_MAX_FN_NAME),
    STR(cwi_fn_info, plugin_version, 0, CWI_PROTO_MAX_FN_NAME),
    STR(cwi_fn_info, plugin_hash, 0, CWI_PROTO_FN_HASH),
};
static const schema s_fn_info = SCHEMA("fn_info", cwi_fn_info, f_fn_info);

static const field f_worker_register[] = {
    STR(cwi_msg_worker_register, address, F_REQ, CWI_PROTO_MAX_NAME),
    U32(cwi_msg_worker_register, cores, F_REQ),
    U64(cwi_msg_worker_register, memory_bytes, 0),
    STR(cwi_msg_worker_register, build, 0, CWI_PROTO_MAX_NAME),
    BOOL(cwi_msg_worker_register, direct),
    OBJS(cwi_msg_worker_register, functions, 0, CWI_PROTO_MAX_FUNCTIONS,
	s_fn_info),
};

static const field f_worker_register_reply[] = {
    U64(cwi_msg_worker_register_reply, worker_id, F_REQ),
    U32(cwi_msg_worker_register_reply, heartbeat_interval_ms, F_REQ),
    U32(cwi_msg_worker_register_reply, worker_timeout_ms, 0),
    U64(cwi_msg_worker_register_reply, lineage, 0),
};

static const field f_op_counters[] = {
    STR(cwi_op_counters, name, F_REQ, CWI_PROTO_MAX_NAME),
    U64(cwi_op_counters, elements, 0),
    U64(cwi_op_counters, bytes, 0),
    U64(cwi_op_counters, busy_ns, 0),
    U64(cwi_op_counters, wait_ns, 0),
    U64(cwi_op_counters, buffered, 0),
    STR(cwi_op_counters, detail, 0, CWI_PROTO_MAX_NAME),
    I64D(cwi_op_counters, node, 0),
    I64D(cwi_op_counters, parallelism, 0),
    I64D(cwi_op_counters, buffer_limit, 0),
    U64(cwi_op_counters, dropped, 0),
    U64(cwi_op_counters, cache_hit_bytes, 0),
};
static const schema s_op_counters = SCHEMA("op_counters", cwi_op_counters,
    f_op_counters);

static const field f_task_report[] = {
    U64(cwi_task_report, task_id, F_REQ),
    BOOL(cwi_task_report, done),
    U64(cwi_task_report, elements, 0),
    U64(cwi_task_report, bytes, 0),
    U64S(cwi_task_report, splits_delivered, 0, CWI_PROTO_MAX_SPLITS),
    OBJS(cwi_task_report, ops, 0, CWI_PROTO_MAX_OPS, s_op_counters),
    U64(cwi_task_report, run_ns, 0),
    U64(cwi_task_report, stall_ns, 0),
    U64(cwi_task_report, ops_leases, 0),
};
static const schema s_task_report = SCHEMA("task_report", cwi_task_report,
    f_task_report);

static const field f_worker_heartbeat[] = {
    U64(cwi_msg_worker_heartbeat, worker_id, F_REQ),
    F64(cwi_msg_worker_heartbeat, cpu_use),
    BOOL(cwi_msg_worker_heartbeat, draining),
    OBJS(cwi_msg_worker_heartbeat, tasks, 0, CWI_PROTO_MAX_TASKS,
	s_task_report),
    U64(cwi_msg_worker_heartbeat, lineage, 0),
};

static const field f_task_def[] = {
    U64(cwi_task_def, task_id, F_REQ),
    U64(cwi_task_def, job_id, F_REQ),
    U64(cwi_task_def, dataset_id, F_REQ),
    FP(cwi_task_def, fingerprint),
    BIN(cwi_task_def, graph, F_REQ, CWI_PROTO_MAX_GRAPH),
    ENUM(cwi_task_def, processing_mode, mode_names),
    ENUM(cwi_task_def, compression, compression_names),
    U32(cwi_task_def, num_consumers, 0),
    U32(cwi_task_def, lease_size, 0),
    U64(cwi_task_def, seed, 0),
    U64(cwi_task_def, epoch, 0),
    BOOL(cwi_task_def, exactly_once),
    U64(cwi_task_def, secret, 0),
};
static const schema s_task_def = SCHEMA("task_def", cwi_task_def,
    f_task_def);

static const field f_worker_heartbeat_reply[] = {
    OBJS(cwi_msg_worker_heartbeat_reply, start, 0, CWI_PROTO_MAX_TASKS,
	s_task_def),
    U64S(cwi_msg_worker_heartbeat_reply, stop, 0, CWI_PROTO_MAX_TASKS),
};

static const field f_worker_deregister[] = {
    U64(cwi_msg_worker_deregister, worker_id, F_REQ),
    U64(cwi_msg_worker_deregister, lineage, 0),
};

static const field f_dataset_register[] = {
    FP(cwi_msg_dataset_register, fingerprint),
    BIN(cwi_msg_dataset_register, graph, F_REQ, CWI_PROTO_MAX_GRAPH),
    UNITS(cwi_msg_dataset_register, split_units, splittable),
};

static const field f_dataset_register_reply[] = {
    U64(cwi_msg_dataset_register_reply, dataset_id, F_REQ),
    BOOL(cwi_msg_dataset_register_reply, created),
};

static const field f_progress[] = {
    U64(cwi_progress, group, F_REQ),
    U64S(cwi_progress, ranges, 0, CWI_PROTO_MAX_SPLITS),
    BOOL(cwi_progress, ended),
    U64(cwi_progress, total, 0),
    U32(cwi_progress, splits, 0),
};
static const schema s_progress = SCHEMA("progress", cwi_progress,
    f_progress);

static const field f_job_get_or_create[] = {
    U64(cwi_msg_job_get_or_create, dataset_id, F_REQ),
    STR(cwi_msg_job_get_or_create, job_name, 0, CWI_PROTO_MAX_NAME),
    U64(cwi_msg_job_get_or_create, iteration, 0),
    ENUM(cwi_msg_job_get_or_create, processing_mode, mode_names),
    U32(cwi_msg_job_get_or_create, num_consumers, 0),
    I64D(cwi_msg_job_get_or_create, consumer_index, -1),
    ENUM(cwi_msg_job_get_or_create, worker_policy, policy_names),
    U32(cwi_msg_job_get_or_create, num_workers, 0),
    ENUM(cwi_msg_job_get_or_create, compression, compression_names),
    U64(cwi_msg_job_get_or_create, client_id, 0),
    U64(cwi_msg_job_get_or_create, seed, 0),
    U64(cwi_msg_job_get_or_create, epoch, 0),
    STR(cwi_msg_job_get_or_create, scale_policy, 0, CWI_PROTO_MAX_POLICY),
    F64(cwi_msg_job_get_or_create, weight),
    U32(cwi_msg_job_get_or_create, min_workers, 0),
    U32(cwi_msg_job_get_or_create, max_workers, 0),
    BOOL(cwi_msg_job_get_or_create, exactly_once),
    U64(cwi_msg_job_get_or_create, lineage, 0),
    U64(cwi_msg_job_get_or_create, nonce, 0),
    U64(cwi_msg_job_get_or_create, resume_units, 0),
    U64(cwi_msg_job_get_or_create, resume_units_per_split, 0),
    OBJS(cwi_msg_job_get_or_create, resume, 0, CWI_PROTO_MAX_SPLITS,
	s_progress),
};

static const field f_job_get_or_create_reply[] = {
    U64(cwi_msg_job_get_or_create_reply, job_id, F_REQ),
    U64(cwi_msg_job_get_or_create_reply, client_id, F_REQ),
    BOOL(cwi_msg_job_get_or_create_reply, created),
    ENUM(cwi_msg_job_get_or_create_reply, processing_mode, mode_names),
    U32(cwi_msg_job_get_or_create_reply, num_consumers, 0),
    ENUM(cwi_msg_job_get_or_create_reply, compression, compression_names),
    U32(cwi_msg_job_get_or_create_reply, heartbeat_interval_ms, 0),
    U64(cwi_msg_job_get_or_create_reply, lineage, 0),
    U64(cwi_msg_job_get_or_create_reply, units, 0),
    U64(cwi_msg_job_get_or_create_reply, units_per_split, 0),
};

static const field f_client_heartbeat[] = {
    U64(cwi_msg_client_heartbeat, job_id, F_REQ),
    U64(cwi_msg_client_heartbeat, client_id, F_REQ),
    U64(cwi_msg_client_heartbeat, batch_time_ns, 0),
    U64(cwi_msg_client_heartbeat, wait_time_ns, 0),
    U64(cwi_msg_client_heartbeat, batches, 0),
    F64(cwi_msg_client_heartbeat, buffer_fill),
    U64(cwi_msg_client_heartbeat, round, 0),
    U64S(cwi_msg_client_heartbeat, acked_splits, 0, CWI_PROTO_MAX_SPLITS),
    U64S(cwi_msg_client_heartbeat, stopped_tasks, 0, CWI_PROTO_MAX_TASKS),
    U64S(cwi_msg_client_heartbeat, failed_tasks, 0, CWI_PROTO_MAX_TASKS),
    OBJS(cwi_msg_client_heartbeat, progress, 0, CWI_PROTO_MAX_SPLITS,
	s_progress),
    U64(cwi_msg_client_heartbeat, elements_received, 0),
    U64(cwi_msg_client_heartbeat, bytes_received, 0),
    U64(cwi_msg_client_heartbeat, lineage, 0),
};

static const field f_task_info[] = {
    U64(cwi_task_info, task_id, F_REQ),
    U64(cwi_task_info, worker_id, F_REQ),
    STR(cwi_task_info, address, F_REQ, CWI_PROTO_MAX_NAME),
    ENUM(cwi_task_info, state, task_state_names),
    U64(cwi_task_info, start_round, 0),
    U64D(cwi_task_info, end_round, CWI_ROUND_NONE),
    BOOL(cwi_task_info, direct),
    U64(cwi_task_info, secret, 0),
};
static const schema s_task_info = SCHEMA("task_info", cwi_task_info,
    f_task_info);

static const field f_client_heartbeat_reply[] = {
    BOOL(cwi_msg_client_heartbeat_reply, job_finished),
    OBJS(cwi_msg_client_heartbeat_reply, tasks, 0, CWI_PROTO_MAX_TASKS,
	s_task_info),
    U64D(cwi_msg_client_heartbeat_reply, block_round, CWI_ROUND_NONE),
    U64(cwi_msg_client_heartbeat_reply, splits_total, 0),
    U64(cwi_msg_client_heartbeat_reply, splits_acked, 0),
    OBJS(cwi_msg_client_heartbeat_reply, ops, 0, CWI_PROTO_MAX_OPS,
	s_op_counters),
    U64S(cwi_msg_client_heartbeat_reply, stop_tasks, 0, CWI_PROTO_MAX_TASKS),
    U32(cwi_msg_client_heartbeat_reply, heartbeat_interval_ms, 0),
};

static const field f_task_stats[] = {
    U64(cwi_msg_task_stats, task_id, F_REQ),
    U64(cwi_msg_task_stats, secret, 0),
};

static const field f_task_stats_reply[] = {
    OBJS(cwi_msg_task_stats_reply, ops, 0, CWI_PROTO_MAX_OPS, s_op_counters),
    BOOL(cwi_msg_task_stats_reply, busy),
};

static const field f_task_counters[] = {
    U64(cwi_msg_task_counters, worker_id, F_REQ),
    U64(cwi_msg_task_counters, task_id, F_REQ),
    U64(cwi_msg_task_counters, ops_leases, 0),
    OBJS(cwi_msg_task_counters, ops, 0, CWI_PROTO_MAX_OPS, s_op_counters),
    U64(cwi_msg_task_counters, lineage, 0),
};

static const field f_split_lease[] = {
    U64(cwi_msg_split_lease, worker_id, F_REQ),
    U64(cwi_msg_split_lease, task_id, F_REQ),
    U32(cwi_msg_split_lease, max_splits, F_REQ),
    U64(cwi_msg_split_lease, lineage, 0),
    U64(cwi_msg_split_lease, seq, 0),
};

static const field f_split[] = {
    U64(cwi_split, split_id, F_REQ),
    U64(cwi_split, begin, F_REQ),
    U64(cwi_split, end, F_REQ),
    U32(cwi_split, lease, 0),
};
static const schema s_split = SCHEMA("split", cwi_split, f_split);

static const field f_split_lease_reply[] = {
    OBJS(cwi_msg_split_lease_reply, splits, 0, CWI_PROTO_MAX_SPLITS, s_split),
    BOOL(cwi_msg_split_lease_reply, end_of_splits),
    U32(cwi_msg_split_lease_reply, retry_ms, 0),
    U64(cwi_msg_split_lease_reply, group, 0),
    U64S(cwi_msg_split_lease_reply, skip, 0, CWI_PROTO_MAX_SPLITS),
};

static const field f_split_ack[] = {
    U64(cwi_msg_split_ack, job_id, F_REQ),
    U64(cwi_msg_split_ack, client_id, F_REQ),
    U64S(cwi_msg_split_ack, split_ids, F_REQ, CWI_PROTO_MAX_SPLITS),
    U64S(cwi_msg_split_ack, parts, 0, CWI_PROTO_MAX_SPLITS),
    U64S(cwi_msg_split_ack, leases, 0, CWI_PROTO_MAX_SPLITS),
    U64(cwi_msg_split_ack, lineage, 0),
};

static const field f_job_release[] = {
    U64(cwi_msg_job_release, job_id, F_REQ),
    U64(cwi_msg_job_release, client_id, F_REQ),
    U64(cwi_msg_job_release, elements_received, 0),
    U64(cwi_msg_job_release, bytes_received, 0),
    U64(cwi_msg_job_release, lineage, 0),
};

static const field f_worker_status[] = {
    U64(cwi_worker_status, worker_id, F_REQ),
    STR(cwi_worker_status, address, F_REQ, CWI_PROTO_MAX_NAME),
    U32(cwi_worker_status, cores, 0),
    BOOL(cwi_worker_status, draining),
    U64(cwi_worker_status, heartbeat_age_ms, 0),
    F64(cwi_worker_status, cpu_use),
    U32(cwi_worker_status, tasks, 0),
};
static const schema s_worker_status = SCHEMA("worker_status",
    cwi_worker_status, f_worker_status);

static const field f_dataset_status[] = {
    U64(cwi_dataset_status, dataset_id, F_REQ),
    FP(cwi_dataset_status, fingerprint),
    UNITS(cwi_dataset_status, split_units, splittable),
};
static const schema s_dataset_status = SCHEMA("dataset_status",
    cwi_dataset_status, f_dataset_status);

static const field f_job_status[] = {
    U64(cwi_job_status, job_id, F_REQ),
    STR(cwi_job_status, name, 0, CWI_PROTO_MAX_NAME),
    U64(cwi_job_status, iteration, 0),
    U64(cwi_job_status, dataset_id, F_REQ),
    ENUM(cwi_job_status, processing_mode, mode_names),
    U32(cwi_job_status, num_consumers, 0),
    U32(cwi_job_status, clients, 0),
    U32(cwi_job_status, tasks, 0),
    U32(cwi_job_status, target_workers, 0),
    U64(cwi_job_status, units_per_split, 0),
    U64(cwi_job_status, splits_total, 0),
    U64(cwi_job_status, splits_pending, 0),
    U64(cwi_job_status, splits_leased, 0),
    U64(cwi_job_status, splits_acked, 0),
    U64(cwi_job_status, elements, 0),
    U64(cwi_job_status, bytes, 0),
    F64(cwi_job_status, elements_per_s),
    F64(cwi_job_status, bytes_per_s),
    U64(cwi_job_status, batch_time_ns, 0),
    BOOL(cwi_job_status, data_done),
    BOOL(cwi_job_status, finished),
    STR(cwi_job_status, scale_policy, 0, CWI_PROTO_MAX_POLICY),
    F64(cwi_job_status, weight),
    U32(cwi_job_status, want, 0),
    U32(cwi_job_status, granted, 0),
    BOOL(cwi_job_status, settled),
    STR(cwi_job_status, reason, 0, CWI_PROTO_MAX_REASON),
    STR(cwi_job_status, cache_mode, 0, CWI_PROTO_MAX_POLICY),
    STR(cwi_job_status, cache_reason, 0, CWI_PROTO_MAX_REASON),
    F64(cwi_job_status, client_wait),
    STR(cwi_job_status, slowest_op, 0, CWI_PROTO_MAX_NAME),
    F64(cwi_job_status, slowest_op_share),
    U64(cwi_job_status, cache_hit_bytes, 0),
};
static const schema s_job_status = SCHEMA("job_status", cwi_job_status,
    f_job_status);

static const field f_task_status[] = {
    U64(cwi_task_status, task_id, F_REQ),
    U64(cwi_task_status, job_id, F_REQ),
    U64(cwi_task_status, worker_id, F_REQ),
    ENUM(cwi_task_status, state, task_state_names),
    U64(cwi_task_status, splits_leased, 0),
    U64(cwi_task_status, elements, 0),
    U64(cwi_task_status, bytes, 0),
    F64(cwi_task_status, elements_per_s),
};
static const schema s_task_status = SCHEMA("task_status", cwi_task_status,
    f_task_status);

static const field f_status_reply[] = {
    U64(cwi_msg_status_reply, time_ns, F_REQ),
    OBJS(cwi_msg_status_reply, workers, 0, CWI_PROTO_MAX_STATUS,
	s_worker_status),
    OBJS(cwi_msg_status_reply, datasets, 0, CWI_PROTO_MAX_STATUS,
	s_dataset_status),
    OBJS(cwi_msg_status_reply, jobs, 0, CWI_PROTO_MAX_STATUS, s_job_status),
    OBJS(cwi_msg_status_reply, tasks, 0, CWI_PROTO_MAX_STATUS,
	s_task_status),
    U32(cwi_msg_status_reply, pool_target, 0),
    STR(cwi_msg_status_reply, provisioner, 0, CWI_PROTO_MAX_NAME),
    U32(cwi_msg_status_reply, provisioner_running, 0),
    U64(cwi_msg_status_reply, provisioner_requests, 0),
    U64(cwi_msg_status_reply, provisioner_failures, 0),
    STR(cwi_msg_status_reply, provisioner_error, 0, CWI_PROTO_MAX_ERRMSG),
    U64(cwi_msg_status_reply, lineage, 0),
    U64(cwi_msg_status_reply, incarnation, 0),
    STR(cwi_msg_status_reply, journal, 0, CWI_PROTO_MAX_ERRMSG),
    U64(cwi_msg_status_reply, other_jobs, 0),
    U64(cwi_msg_status_reply, other_tasks, 0),
};

static const field f_get_elements[] = {
    U64(cwi_msg_get_elements, task_id, F_REQ),
    U64(cwi_msg_get_elements, client_id, 0),
    I64D(cwi_msg_get_elements, consumer_index, -1),
    U64(cwi_msg_get_elements, round, 0),
    U32(cwi_msg_get_elements, max_elements, 0),
    U64(cwi_msg_get_elements, max_bytes, 0),
    ENUM(cwi_msg_get_elements, compression, compression_names),
    U64(cwi_msg_get_elements, task_round, 0),
    BOOL(cwi_msg_get_elements, exec),
    U64(cwi_msg_get_elements, epoch, 0),
    I64D(cwi_msg_get_elements, threads, 0),
    I64D(cwi_msg_get_elements, ram_budget, 0),
    I64D(cwi_msg_get_elements, max_element_bytes, 0),
    BOOL(cwi_msg_get_elements, deterministic),
    BOOL(cwi_msg_get_elements, autotune),
    U32(cwi_msg_get_elements, wait_ms, 0),
    U64(cwi_msg_get_elements, secret, 0),
};

static const field f_split_end[] = {
    U64(cwi_split_end, split_id, F_REQ),
    U32(cwi_split_end, after, F_REQ),
    U32(cwi_split_end, parts, 0),
    U32(cwi_split_end, lease, 0),
};
static const schema s_split_end = SCHEMA("split_end", cwi_split_end,
    f_split_end);

static const field f_run[] = {
    U64(cwi_run, group, F_REQ),
    U64(cwi_run, from, F_REQ),
    U32(cwi_run, n, F_REQ),
    U32(cwi_run, tail, 0),
    BOOL(cwi_run, end),
    U32(cwi_run, splits, 0),
};
static const schema s_run = SCHEMA("run", cwi_run, f_run);

static const field f_get_elements_reply[] = {
    U64(cwi_msg_get_elements_reply, task_id, F_REQ),
    U64(cwi_msg_get_elements_reply, seq, F_REQ),
    U32(cwi_msg_get_elements_reply, elements, F_REQ),
    OBJS(cwi_msg_get_elements_reply, split_ends, 0, CWI_PROTO_MAX_SPLITS,
	s_split_end),
    BOOL(cwi_msg_get_elements_reply, end_of_task),
    U64(cwi_msg_get_elements_reply, round, 0),
    ENUM(cwi_msg_get_elements_reply, compression, compression_names),
    U64(cwi_msg_get_elements_reply, task_round, 0),
    U64(cwi_msg_get_elements_reply, queued_bytes, 0),
    U32(cwi_msg_get_elements_reply, retry_ms, 0),
    OBJS(cwi_msg_get_elements_reply, runs, 0, CWI_PROTO_MAX_SPLITS, s_run),
    NAMES(cwi_msg_get_elements_reply, names),
};

/* Indexed by cwi_msg_type. A body without fields has nfields 0. */
static const schema msg_schemas[CWI_MSG_NTYPES] = {
    [CWI_MSG_NONE] = {"none", 0, NULL, 0},
    [CWI_MSG_ERROR] = SCHEMA("error", cwi_msg_error, f_error),
    [CWI_MSG_OK] = SCHEMA("ok", cwi_msg_ok, f_ok),
    [CWI_MSG_WORKER_REGISTER] = SCHEMA("worker_register",
	cwi_msg_worker_register, f_worker_register),
    [CWI_MSG_WORKER_REGISTER_REPLY] = SCHEMA("worker_register_reply",
	cwi_msg_worker_register_reply, f_worker_register_reply),
    [CWI_MSG_WORKER_HEARTBEAT] = SCHEMA("worker_heartbeat",
	cwi_msg_worker_heartbeat, f_worker_heartbeat),
    [CWI_MSG_WORKER_HEARTBEAT_REPLY] = SCHEMA("worker_heartbeat_reply",
	cwi_msg_worker_heartbeat_reply, f_worker_heartbeat_reply),
    [CWI_MSG_WORKER_DEREGISTER] = SCHEMA("worker_deregister",
	cwi_msg_worker_deregister, f_worker_deregister),
    [CWI_MSG_DATASET_REGISTER] = SCHEMA("dataset_register",
	cwi_msg_dataset_register, f_dataset_register),
    [CWI_MSG_DATASET_REGISTER_REPLY] = SCHEMA("dataset_register_reply",
	cwi_msg_dataset_register_reply, f_dataset_register_reply),
    [CWI_MSG_JOB_GET_OR_CREATE] = SCHEMA("job_get_or_create",
	cwi_msg_job_get_or_create, f_job_get_or_create),
    [CWI_MSG_JOB_GET_OR_CREATE_REPLY] = SCHEMA("job_get_or_create_reply",
	cwi_msg_job_get_or_create_reply, f_job_get_or_create_reply),
    [CWI_MSG_CLIENT_HEARTBEAT] = SCHEMA("client_heartbeat",
	cwi_msg_client_heartbeat, f_client_heartbeat),
    [CWI_MSG_CLIENT_HEARTBEAT_REPLY] = SCHEMA("client_heartbeat_reply",
	cwi_msg_client_heartbeat_reply, f_client_heartbeat_reply),
    [CWI_MSG_SPLIT_LEASE] = SCHEMA("split_lease", cwi_msg_split_lease,
	f_split_lease),
    [CWI_MSG_SPLIT_LEASE_REPLY] = SCHEMA("split_lease_reply",
	cwi_msg_split_lease_reply, f_split_lease_reply),
    [CWI_MSG_SPLIT_ACK] = SCHEMA("split_ack", cwi_msg_split_ack,
	f_split_ack),
    [CWI_MSG_JOB_RELEASE] = SCHEMA("job_release", cwi_msg_job_release,
	f_job_release),
    [CWI_MSG_STATUS] = {"status", sizeof(cwi_msg_status), NULL, 0},
    [CWI_MSG_STATUS_REPLY] = SCHEMA("status_reply", cwi_msg_status_reply,
	f_status_reply),
    [CWI_MSG_GET_ELEMENTS] = SCHEMA("get_elements", cwi_msg_get_elements,
	f_get_elements),
    [CWI_MSG_GET_ELEMENTS_REPLY] = SCHEMA("get_elements_reply",
	cwi_msg_get_elements_reply, f_get_elements_reply),
    [CWI_MSG_TASK_STATS] = SCHEMA("task_stats", cwi_msg_task_stats,
	f_task_stats),
    [CWI_MSG_TASK_STATS_REPLY] = SCHEMA("task_stats_reply",
	cwi_msg_task_stats_reply, f_task_stats_reply),
    [CWI_MSG_TASK_COUNTERS] = SCHEMA("task_counters", cwi_msg_task_counters,
	f_task_counters),
};

static const schema *
schema_of(cwi_msg_type type)
{
	if ((unsigned)type >= CWI_MSG_NTYPES || type == CWI_MSG_NONE)
		return NULL;
	return &msg_schemas[type];
}

const char *
cwi_msg_type_name(cwi_msg_type type)
{
	const schema *s = schema_of(type);
	return s != NULL ? s->name : "?";
}

static const char *
enum_name(const char *const *names, unsigned n, int v)
{
	return v >= 0 && (unsigned)v < n ? names[v] : "?";
}

const char *
cwi_processing_mode_name(cwi_processing_mode mode)
{
	return enum_name(mode_names, 2, (int)mode);
}

const char *
cwi_compression_name(cwi_compression c)
{
	return enum_name(compression_names, 3, (int)c);
}

const char *
cwi_worker_policy_name(cwi_worker_policy p)
{
	return enum_name(policy_names, 2, (int)p);
}

const char *
cwi_task_state_name(cwi_task_state s)
{
	return enum_name(task_state_names, 3, (int)s);
}

static int
enum_find(const char *const *names, unsigned n, const char *s, size_t len)
{
	for (unsigned i = 0; i < n; i++)
		if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0)
			return (int)i;
	return -1;
}

cachew_err
cwi_processing_mode_parse(const char *s, cwi_processing_mode *out)
{
	int v = enum_find(mode_names, 2, s, strlen(s));

	if (v < 0)
		return cwi_fail(CACHEW_EINVAL, "processing mode '%s' is not "
					       "distributed_epoch or "
					       "parallel_epochs",
		    s);
	*out = (cwi_processing_mode)v;
	return CACHEW_OK;
}

cachew_err
cwi_compression_parse(const char *s, cwi_compression *out)
{
	int v = enum_find(compression_names, 3, s, strlen(s));

	if (v < 0)
		return cwi_fail(CACHEW_EINVAL, "compression '%s' is not none, "
					       "zstd or auto",
		    s);
	*out = (cwi_compression)v;
	return CACHEW_OK;
}

/* ---- field access -------------------------------------------------------- */

#define AT(base, off, T) ((T *)(void *)((char *)(base) + (off)))
#define CAT(base, off, T) \
	((const T *)(const void *)((const char *)(base) + (off)))

static void
obj_init(const schema *s, void *body)
{
	memset(body, 0, s->size);
	for (size_t i = 0; i < s->nfields; i++) {
		const field *f = &s->fields[i];
		if (f->def == 0)
			continue;
		switch (f->type) {
		case F_U64:
			*AT(body, f->off, uint64_t) = (uint64_t)f->def;
			break;
		case F_I64:
			*AT(body, f->off, int64_t) = f->def;
			break;
		default:
			break;
		}
	}
}

static void
obj_free(const schema *s, void *body)
{
	for (size_t i = 0; i < s->nfields; i++) {
		const field *f = &s->fields[i];
		switch (f->type) {
		case F_STR:
			free(*AT(body, f->off, char *));
			break;
		case F_BIN:
			free(*AT(body, f->off, uint8_t *));
			break;
		case F_U64S:
			free(*AT(body, f->off, uint64_t *));
			break;
		case F_NAMES:
			cwi_names_unref(*AT(body, f->off, cwi_names *));
			break;
		case F_OBJS: {
			char *items = *AT(body, f->off, char *);
			size_t n = *AT(body, f->off_n, size_t);
			for (size_t k = 0; items != NULL && k < n; k++)
				obj_free(f->sub, items + k * f->sub->size);
			free(items);
			break;
		}
		default:
			break;
		}
	}
	obj_init(s, body);
}

void
cwi_pmsg_body_init(cwi_msg_type type, void *body)
{
	const schema *s = schema_of(type);

	if (s != NULL)
		obj_init(s, body);
}

void
cwi_pmsg_body_free(cwi_msg_type type, void *body)
{
	const schema *s = schema_of(type);

	if (s != NULL && body != NULL)
		obj_free(s, body);
}

void
cwi_pmsg_init(cwi_pmsg *m, cwi_msg_type type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	cwi_pmsg_body_init(type, &m->u);
}

void
cwi_pmsg_free(cwi_pmsg *m)
{
	if (m == NULL)
		return;
	cwi_pmsg_body_free(m->type, &m->u);
	free(m->token);
	free(m->identity);
	memset(m, 0, sizeof(*m));
}

cachew_err
cwi_pmsg_set_token(cwi_pmsg *m, const char *token)
{
	char *copy = NULL;

	if (token != NULL && (copy = cwi_strdup(token)) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	free(m->token);
	m->token = copy;
	return CACHEW_OK;
}

/* ---- encoder ------------------------------------------------------------- */

static void
put_byte(cwi_strbuf *sb, uint8_t b)
{
	cwi_strbuf_append(sb, &b, 1);
}

static void
put_be(cwi_strbuf *sb, uint8_t tag, uint64_t x, unsigned nbytes)
{
	uint8_t b[9];

	b[0] = tag;
	for (unsigned i = 0; i < nbytes; i++)
		b[1 + i] = (uint8_t)(x >> (8 * (nbytes - 1 - i)));
	cwi_strbuf_append(sb, b, 1 + nbytes);
}

static void
put_uint(cwi_strbuf *sb, uint64_t u)
{
	if (u <= (uint64_t)INT64_MAX)
		cwi_msgpack_put_int(sb, (int64_t)u);
	else
		put_be(sb, 0xcf, u, 8);
}

static void
put_f64(cwi_strbuf *sb, double d)
{
	uint64_t bits;

	memcpy(&bits, &d, sizeof(bits));
	put_be(sb, 0xcb, bits, 8);
}

static void
put_bin(cwi_strbuf *sb, const uint8_t *data, size_t len)
{
	if (len <= 0xff)
		put_be(sb, 0xc4, len, 1);
	else if (len <= 0xffff)
		put_be(sb, 0xc5, len, 2);
	else
		put_be(sb, 0xc6, len, 4);
	if (len > 0)
		cwi_strbuf_append(sb, data, len);
}

static void
put_key(cwi_strbuf *sb, const char *key)
{
	cwi_msgpack_put_str(sb, key, strlen(key));
}

/* Whether an optional field holds its default, so the encoder leaves it
 * out (the decoder restores the default). */
static bool
is_default(const field *f, const void *body)
{
	switch (f->type) {
	case F_U64:
		return *CAT(body, f->off, uint64_t) == (uint64_t)f->def;
	case F_U32:
		return *CAT(body, f->off, uint32_t) == (uint32_t)f->def;
	case F_I64:
		return *CAT(body, f->off, int64_t) == f->def;
	case F_F64:
		return *CAT(body, f->off, double) == 0.0;
	case F_BOOL:
		return !*CAT(body, f->off, bool);
	case F_STR:
		return *CAT(body, f->off, char *) == NULL;
	case F_NAMES:
		return *CAT(body, f->off, cwi_names *) == NULL;
	case F_ENUM:
		return *CAT(body, f->off, int) == 0;
	case F_BIN:
	case F_U64S:
	case F_OBJS:
		return *CAT(body, f->off_n, size_t) == 0;
	case F_UNITS:
		return !*CAT(body, f->off_n, bool);
	default:
		return false;
	}
}

static cachew_err enc_obj(const schema *s, const void *body, cwi_strbuf *sb,
    const char *msg, const cwi_pmsg *env);

static cachew_err
enc_fail_range(const char *msg, const schema *s, const field *f, size_t n,
    uint32_t max)
{
	return cwi_fail(CACHEW_ERANGE, "service message %s: %s.%s: %zu "
				       "exceeds the limit of %u",
	    msg, s->name, f->key, n, max);
}

/* The encoder refuses what the decoder would, so a peer never sends names
 * the other side must refuse. */
static cachew_err
enc_names(const schema *s, const field *f, const cwi_names *names,
    cwi_strbuf *sb, const char *msg)
{
	if (names->n > f->max)
		return enc_fail_range(msg, s, f, names->n, f->max);
	if (!cwi_names_ok(names))
		return cwi_fail(CACHEW_EINVAL, "service message %s: %s.%s: a "
		    "name is not 1 to %u bytes without control characters, "
		    "or two components share one",
		    msg, s->name, f->key, CWI_PROTO_MAX_COMPONENT_NAME);
	cwi_msgpack_put_array(sb, names->n);
	for (uint32_t i = 0; i < names->n; i++) {
		const char *a = names->name[i];
		cwi_msgpack_put_str(sb, a != NULL ? a : "",
		    a != NULL ? strlen(a) : 0);
	}
	return CACHEW_OK;
}

static cachew_err
enc_field(const schema *s, const field *f, const void *body, cwi_strbuf *sb,
    const char *msg)
{
	switch (f->type) {
	case F_U64:
		put_uint(sb, *CAT(body, f->off, uint64_t));
		return CACHEW_OK;
	case F_U32:
		put_uint(sb, *CAT(body, f->off, uint32_t));
		return CACHEW_OK;
	case F_I64:
		cwi_msgpack_put_int(sb, *CAT(body, f->off, int64_t));
		return CACHEW_OK;
	case F_UNITS:
		if (*CAT(body, f->off_n, bool))
			put_uint(sb, *CAT(body, f->off, uint64_t));
		else
			cwi_msgpack_put_int(sb, -1);
		return CACHEW_OK;
	case F_F64:
		put_f64(sb, *CAT(body, f->off, double));
		return CACHEW_OK;
	case F_BOOL:
		put_byte(sb, *CAT(body, f->off, bool) ? 0xc3 : 0xc2);
		return CACHEW_OK;
	case F_STR: {
		const char *str = *CAT(body, f->off, char *);
		size_t len = str != NULL ? strlen(str) : 0;
		if (len > f->max)
			return enc_fail_range(msg, s, f, len, f->max);
		cwi_msgpack_put_str(sb, str != NULL ? str : "", len);
		return CACHEW_OK;
	}
	case F_BIN: {
		size_t len = *CAT(body, f->off_n, size_t);
		if (len > f->max)
			return enc_fail_range(msg, s, f, len, f->max);
		put_bin(sb, *CAT(body, f->off, uint8_t *), len);
		return CACHEW_OK;
	}
	case F_ENUM: {
		int v = *CAT(body, f->off, int);
		if (v < 0 || (unsigned)v >= f->nnames)
			return cwi_fail(CACHEW_EINVAL,
			    "service message %s: %s.%s: invalid value %d", msg,
			    s->name, f->key, v);
		cwi_msgpack_put_str(sb, f->names[v], strlen(f->names[v]));
		return CACHEW_OK;
	}
	case F_FP: {
		char hex[33];
		cachew_fingerprint_hex(CAT(body, f->off, cachew_fingerprint),
		    hex);
		cwi_msgpack_put_str(sb, hex, 32);
		return CACHEW_OK;
	}
	case F_U64S: {
		const uint64_t *v = *CAT(body, f->off, uint64_t *);
		size_t n = *CAT(body, f->off_n, size_t);
		if (n > f->max)
			return enc_fail_range(msg, s, f, n, f->max);
		cwi_msgpack_put_array(sb, n);
		for (size_t i = 0; i < n; i++)
			put_uint(sb, v[i]);
		return CACHEW_OK;
	}
	case F_NAMES:
		return enc_names(s, f, *CAT(body, f->off, cwi_names *), sb,
		    msg);
	case F_OBJS: {
		const char *items = *CAT(body, f->off, char *);
		size_t n = *CAT(body, f->off_n, size_t);
		if (n > f->max)
			return enc_fail_range(msg, s, f, n, f->max);
		cwi_msgpack_put_array(sb, n);
		for (size_t i = 0; i < n; i++) {
			cachew_err rv = enc_obj(f->sub,
			    items + i * f->sub->size, sb, msg, NULL);
			if (rv != CACHEW_OK)
				return rv;
		}
		return CACHEW_OK;
	}
	default:
		return cwi_fail(CACHEW_EINTERNAL, "service message %s: field "
						  "type %d",
		    msg, f->type);
	}
}

static size_t
enc_count(const schema *s, const void *body)
{
	size_t n = 0;

	for (size_t i = 0; i < s->nfields; i++)
		if ((s->fields[i].flags & F_REQ) != 0 ||
		    !is_default(&s->fields[i], body))
			n++;
	return n;
}

static cachew_err
enc_fields(const schema *s, const void *body, cwi_strbuf *sb, const char *msg)
{
	for (size_t i = 0; i < s->nfields; i++) {
		const field *f = &s->fields[i];
		if ((f->flags & F_REQ) == 0 && is_default(f, body))
			continue;
		put_key(sb, f->key);
		cachew_err rv = enc_field(s, f, body, sb, msg);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* Writes the map of a struct; with `env` (a message's top level) the
 * envelope first: "v", "t", then the envelope's "k" and "i" when set. */
static cachew_err
enc_obj(const schema *s, const void *body, cwi_strbuf *sb, const char *msg,
    const cwi_pmsg *env)
{
	size_t n = enc_count(s, body);
	cachew_err rv;

	if (env != NULL)
		n += 2 + enc_count(&s_envelope, env);
	cwi_msgpack_put_map(sb, n);
	if (env != NULL) {
		put_key(sb, "v");
		cwi_msgpack_put_int(sb, CWI_PROTO_VERSION);
		put_key(sb, "t");
		cwi_msgpack_put_str(sb, msg, strlen(msg));
		rv = enc_fields(&s_envelope, env, sb, msg);
		if (rv != CACHEW_OK)
			return rv;
	}
	return enc_fields(s, body, sb, msg);
}

static cachew_err
enc_message(cwi_msg_type type, const void *body, const cwi_pmsg *env,
    cwi_strbuf *out)
{
	const schema *s = schema_of(type);
	size_t start = out->len;
	cachew_err rv;

	if (s == NULL)
		return cwi_fail(CACHEW_EINVAL, "service message: invalid "
					       "type %d",
		    (int)type);
	rv = enc_obj(s, body, out, s->name, env);
	if (rv == CACHEW_OK && out->oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv == CACHEW_OK && out->len - start > CWI_PROTO_MAX_HEADER)
		rv = cwi_fail(CACHEW_ERANGE, "service message %s: %zu bytes "
					     "exceed the limit of %u",
		    s->name, out->len - start, CWI_PROTO_MAX_HEADER);
	if (rv != CACHEW_OK && !out->oom)
		out->len = start;
	return rv;
}

cachew_err
cwi_pmsg_body_encode(cwi_msg_type type, const void *body, cwi_strbuf *out)
{
	static const cwi_pmsg no_envelope;

	return enc_message(type, body, &no_envelope, out);
}

cachew_err
cwi_pmsg_encode(const cwi_pmsg *m, cwi_strbuf *out)
{
	return enc_message(m->type, &m->u, m, out);
}

/* ---- decoder ------------------------------------------------------------- */

#define PATH_DEPTH 32 /* deeper fields are named by their ancestors */

typedef struct reader {
	const uint8_t *buf;
	size_t len;
	size_t pos;
	size_t budget;    /* bytes the decoded structs may still take */
	const char *msg;  /* the message type's name, for errors */
	/* The field being decoded ("tasks[2].ops[0].name"), as keys and
	 * indexes: written out only when a message fails, since formatting
	 * it for every field cost more than decoding it (the embedded
	 * service decodes two headers per call of a direct task). */
	struct {
		const char *key; /* NULL: an index */
		size_t index;
	} path[PATH_DEPTH];
	size_t depth;
} reader;

static cachew_err
rd_fail(reader *r, const char *fmt, ...) CACHEW_PRINTF(2, 3);

static cachew_err
rd_fail(reader *r, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	char path[256];
	size_t n = 0;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	path[0] = '\0';
	for (size_t i = 0; i < r->depth && n < sizeof(path) - 1; i++) {
		int k = r->path[i].key != NULL
		    ? snprintf(path + n, sizeof(path) - n, "%s%s",
			  n > 0 ? "." : "", r->path[i].key)
		    : snprintf(path + n, sizeof(path) - n, "[%zu]",
			  r->path[i].index);
		if (k < 0)
			break;
		n += (size_t)k < sizeof(path) - n ? (size_t)k
						  : sizeof(path) - n - 1;
	}
	if (n > 0)
		return cwi_fail(CACHEW_EPROTO, "service message %s: %s: %s "
					       "(at byte %zu)",
		    r->msg, path, what, r->pos);
	return cwi_fail(CACHEW_EPROTO, "service message %s: %s (at byte %zu)",
	    r->msg, what, r->pos);
}

static size_t
remain(const reader *r)
{
	return r->len - r->pos;
}

/* Enters field `key` (or item `index` when key is NULL); returns the
 * depth to restore. */
static size_t
path_push(reader *r, const char *key, size_t index)
{
	size_t saved = r->depth;

	if (r->depth < PATH_DEPTH) {
		r->path[r->depth].key = key;
		r->path[r->depth].index = index;
		r->depth++;
	}
	return saved;
}

static void
path_pop(reader *r, size_t saved)
{
	r->depth = saved;
}

static void *
rd_alloc(reader *r, size_t n, size_t size)
{
	void *p;

	/* n * size cannot overflow: n is bounded by the bytes present. */
	if (n * size > r->budget)
		return NULL;
	p = calloc(n != 0 ? n : 1, size);
	if (p != NULL)
		r->budget -= n * size;
	return p;
}

static cachew_err
rd_alloc_fail(reader *r, size_t n, size_t size)
{
	if (n * size > r->budget)
		return rd_fail(r, "decoded size exceeds %u times the message's "
				  "size",
		    CWI_PROTO_EXPANSION);
	return cwi_fail(CACHEW_ENOMEM, "out of memory");
}

/* Reads an nbytes big-endian field after a header byte. */
static cachew_err
rd_be(reader *r, unsigned nbytes, uint64_t *out)
{
	uint64_t x = 0;

	if (remain(r) < nbytes)
		return rd_fail(r, "truncated (needs %u more bytes, %zu remain)",
		    nbytes, remain(r));
	for (unsigned i = 0; i < nbytes; i++)
		x = (x << 8) | r->buf[r->pos + i];
	r->pos += nbytes;
	*out = x;
	return CACHEW_OK;
}

static cachew_err
rd_byte(reader *r, uint8_t *b)
{
	if (remain(r) == 0)
		return rd_fail(r, "unexpected end of message");
	*b = r->buf[r->pos++];
	return CACHEW_OK;
}

/* A container header: a map when `map`, else an array. false in *is when
 * the next value is not one (nothing consumed). */
static cachew_err
rd_container(reader *r, bool map, uint64_t *n, bool *is)
{
	uint8_t b;

	*is = false;
	if (remain(r) == 0)
		return rd_fail(r, "unexpected end of message");
	b = r->buf[r->pos];
	if (map ? (b & 0xf0) == 0x80 : (b & 0xf0) == 0x90) {
		r->pos++;
		*n = b & 0x0f;
		*is = true;
		return CACHEW_OK;
	}
	if (b == (map ? 0xde : 0xdc) || b == (map ? 0xdf : 0xdd)) {
		r->pos++;
		*is = true;
		return rd_be(r, b == 0xde || b == 0xdc ? 2 : 4, n);
	}
	return CACHEW_OK;
}

/* A string (str family) or, with `bin`, a bin; borrowed pointer. */
static cachew_err
rd_bytes(reader *r, bool bin, const uint8_t **p, uint64_t *len, bool *is)
{
	uint8_t b;
	cachew_err rv = CACHEW_OK;

	*is = false;
	if (remain(r) == 0)
		return rd_fail(r, "unexpected end of message");
	b = r->buf[r->pos];
	if (!bin && (b & 0xe0) == 0xa0) {
		r->pos++;
		*len = b & 0x1f;
	} else if (!bin && b >= 0xd9 && b <= 0xdb) {
		r->pos++;
		rv = rd_be(r, 1u << (b - 0xd9), len);
	} else if (bin && b >= 0xc4 && b <= 0xc6) {
		r->pos++;
		rv = rd_be(r, 1u << (b - 0xc4), len);
	} else {
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK)
		return rv;
	if (*len > remain(r))
		return rd_fail(r, "%s of %llu bytes overruns the message (%zu "
				  "bytes remain)",
		    bin ? "bin" : "string", (unsigned long long)*len,
		    remain(r));
	*p = r->buf + r->pos;
	r->pos += (size_t)*len;
	*is = true;
	return CACHEW_OK;
}

/* An integer of any msgpack width: *neg tells which of *u / *i holds it. */
static cachew_err
rd_int(reader *r, uint64_t *u, int64_t *i, bool *neg, bool *is)
{
	uint8_t b;
	uint64_t x;
	cachew_err rv;

	*is = false;
	if (remain(r) == 0)
		return rd_fail(r, "unexpected end of message");
	b = r->buf[r->pos];
	if (b <= 0x7f) {
		r->pos++;
		*u = b;
		*neg = false;
	} else if (b >= 0xe0) {
		r->pos++;
		*i = (int8_t)b;
		*neg = true;
	} else if (b >= 0xcc && b <= 0xcf) {
		r->pos++;
		rv = rd_be(r, 1u << (b - 0xcc), u);
		if (rv != CACHEW_OK)
			return rv;
		*neg = false;
	} else if (b >= 0xd0 && b <= 0xd3) {
		unsigned w = 1u << (b - 0xd0);
		r->pos++;
		rv = rd_be(r, w, &x);
		if (rv != CACHEW_OK)
			return rv;
		if (w < 8 && (x >> (8 * w - 1)) != 0)
			x |= ~(uint64_t)0 << (8 * w);
		if ((int64_t)x >= 0) {
			*u = x;
			*neg = false;
		} else {
			*i = (int64_t)x;
			*neg = true;
		}
	} else {
		return CACHEW_OK;
	}
	*is = true;
	return CACHEW_OK;
}

/* Skips one value of any type without allocating. */
static cachew_err
rd_skip(reader *r, unsigned depth)
{
	uint64_t n, u;
	int64_t i;
	const uint8_t *p;
	bool is, neg;
	uint8_t b = 0;
	cachew_err rv;

	if (depth > CWI_PROTO_MAX_DEPTH)
		return rd_fail(r, "value nested deeper than %u levels",
		    CWI_PROTO_MAX_DEPTH);
	for (int map = 0; map <= 1; map++) {
		rv = rd_container(r, map != 0, &n, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (!is)
			continue;
		/* Each item takes at least one byte: a claimed count larger
		 * than the rest of the message ends here, not in a loop. */
		if (n > remain(r))
			return rd_fail(r, "container of %llu items overruns "
					  "the message",
			    (unsigned long long)n);
		for (uint64_t k = 0; k < (map ? 2 * n : n); k++) {
			rv = rd_skip(r, depth + 1);
			if (rv != CACHEW_OK)
				return rv;
		}
		return CACHEW_OK;
	}
	for (int bin = 0; bin <= 1; bin++) {
		rv = rd_bytes(r, bin != 0, &p, &n, &is);
		if (rv != CACHEW_OK || is)
			return rv;
	}
	rv = rd_int(r, &u, &i, &neg, &is);
	if (rv != CACHEW_OK || is)
		return rv;
	rv = rd_byte(r, &b);
	if (rv != CACHEW_OK)
		return rv;
	switch (b) {
	case 0xc0: /* nil */
	case 0xc2: /* false */
	case 0xc3: /* true */
		return CACHEW_OK;
	case 0xca:
		return rd_be(r, 4, &u);
	case 0xcb:
		return rd_be(r, 8, &u);
	case 0xd4:
	case 0xd5:
	case 0xd6:
	case 0xd7:
	case 0xd8:
		n = 1u + (1u << (b - 0xd4)); /* type byte + payload */
		break;
	case 0xc7:
	case 0xc8:
	case 0xc9:
		rv = rd_be(r, 1u << (b - 0xc7), &n);
		if (rv != CACHEW_OK)
			return rv;
		n += 1; /* the type byte */
		break;
	default:
		r->pos--;
		return rd_fail(r, "invalid msgpack type byte 0x%02x", b);
	}
	if (n > remain(r))
		return rd_fail(r, "ext of %llu bytes overruns the message",
		    (unsigned long long)n);
	r->pos += (size_t)n;
	return CACHEW_OK;
}

static bool
rd_nil(reader *r)
{
	if (remain(r) > 0 && r->buf[r->pos] == 0xc0) {
		r->pos++;
		return true;
	}
	return false;
}

static cachew_err
rd_uint_field(reader *r, uint64_t max, uint64_t *out)
{
	uint64_t u;
	int64_t i;
	bool neg, is;
	cachew_err rv = rd_int(r, &u, &i, &neg, &is);

	if (rv != CACHEW_OK)
		return rv;
	if (!is || neg)
		return rd_fail(r, "expected an unsigned integer");
	if (u > max)
		return rd_fail(r, "%llu exceeds the limit of %llu",
		    (unsigned long long)u, (unsigned long long)max);
	*out = u;
	return CACHEW_OK;
}

static int
hex_digit(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static cachew_err
rd_fingerprint(reader *r, cachew_fingerprint *fp)
{
	const uint8_t *p;
	uint64_t len, half[2] = {0, 0};
	bool is;
	cachew_err rv = rd_bytes(r, false, &p, &len, &is);

	if (rv != CACHEW_OK)
		return rv;
	if (!is || len != 32)
		return rd_fail(r, "expected a string of 32 hex digits");
	for (unsigned k = 0; k < 32; k++) {
		int d = hex_digit(p[k]);
		if (d < 0)
			return rd_fail(r, "expected a string of 32 hex digits");
		half[k / 16] = (half[k / 16] << 4) | (uint64_t)d;
	}
	fp->hi = half[0];
	fp->lo = half[1];
	return CACHEW_OK;
}

static cachew_err rd_obj(reader *r, const schema *s, void *body,
    unsigned depth);

/* An array header whose count is checked against the field's limit and
 * against the bytes left (each item takes at least one byte). */
static cachew_err
rd_array_count(reader *r, const field *f, size_t *n)
{
	uint64_t count;
	bool is;
	cachew_err rv = rd_container(r, false, &count, &is);

	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "expected an array");
	if (count > f->max)
		return rd_fail(r, "array of %llu items exceeds the limit of %u",
		    (unsigned long long)count, f->max);
	if (count > remain(r))
		return rd_fail(r, "array of %llu items overruns the message "
				  "(%zu bytes remain)",
		    (unsigned long long)count, remain(r));
	*n = (size_t)count;
	return CACHEW_OK;
}

static cachew_err
rd_u64s(reader *r, const field *f, void *body)
{
	uint64_t *v;
	size_t n;
	cachew_err rv = rd_array_count(r, f, &n);

	if (rv != CACHEW_OK)
		return rv;
	if (n == 0)
		return CACHEW_OK;
	v = rd_alloc(r, n, sizeof(uint64_t));
	if (v == NULL)
		return rd_alloc_fail(r, n, sizeof(uint64_t));
	*AT(body, f->off, uint64_t *) = v;
	*AT(body, f->off_n, size_t) = n;
	for (size_t k = 0; k < n; k++) {
		size_t saved = path_push(r, NULL, k);
		rv = rd_uint_field(r, UINT64_MAX, &v[k]);
		if (rv != CACHEW_OK)
			return rv;
		path_pop(r, saved);
	}
	return CACHEW_OK;
}

static cachew_err
rd_objs(reader *r, const field *f, void *body, unsigned depth)
{
	char *items;
	size_t n;
	cachew_err rv = rd_array_count(r, f, &n);

	if (rv != CACHEW_OK)
		return rv;
	if (n == 0)
		return CACHEW_OK;
	items = rd_alloc(r, n, f->sub->size);
	if (items == NULL)
		return rd_alloc_fail(r, n, f->sub->size);
	*AT(body, f->off, char *) = items;
	for (size_t k = 0; k < n; k++) {
		size_t saved = path_push(r, NULL, k);
		void *item = items + k * f->sub->size;
		obj_init(f->sub, item);
		/* Counted first, so a failure frees what the item holds. */
		*AT(body, f->off_n, size_t) = k + 1;
		rv = rd_obj(r, f->sub, item, depth + 1);
		if (rv != CACHEW_OK)
			return rv;
		path_pop(r, saved);
	}
	return CACHEW_OK;
}

/* One name of a names list into names[k] (a copy; NULL for ""). */
static cachew_err
rd_one_name(reader *r, char **names, size_t k)
{
	const uint8_t *p;
	uint64_t len;
	bool is;
	cachew_err rv = rd_bytes(r, false, &p, &len, &is);

	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "expected a string");
	if (len == 0)
		return CACHEW_OK; /* an unnamed component */
	if (len > CWI_PROTO_MAX_COMPONENT_NAME)
		return rd_fail(r, "a component name of %llu bytes exceeds the "
				  "limit of %u",
		    (unsigned long long)len, CWI_PROTO_MAX_COMPONENT_NAME);
	if (!cwi_component_name_ok((const char *)p, (size_t)len))
		return rd_fail(r, "a component name holds a control "
				  "character or NUL");
	for (size_t j = 0; j < k; j++)
		if (names[j] != NULL && strlen(names[j]) == len &&
		    memcmp(names[j], p, (size_t)len) == 0)
			return rd_fail(r, "components %zu and %zu are both "
					  "named '%s'",
			    j, k, names[j]);
	if (len + 1 > r->budget)
		return rd_alloc_fail(r, (size_t)len + 1, 1);
	names[k] = cwi_strndup((const char *)p, (size_t)len);
	if (names[k] == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->budget -= (size_t)len + 1;
	return CACHEW_OK;
}

/* A names list: checked whole (count, each name, uniqueness) before the
 * shared table is made; a list with no name at all is none. */
static cachew_err
rd_names(reader *r, const field *f, void *body)
{
	char *names[CACHEW_MAX_COMPONENTS] = {NULL};
	size_t n = 0, k;
	bool any = false;
	cachew_err rv = rd_array_count(r, f, &n);

	for (k = 0; rv == CACHEW_OK && k < n; k++) {
		size_t saved = path_push(r, NULL, k);
		rv = rd_one_name(r, names, k);
		any = any || names[k] != NULL;
		if (rv == CACHEW_OK)
			path_pop(r, saved);
	}
	/* The table's own size counts against the budget too (the names'
	 * copies were counted as they were read). */
	if (rv == CACHEW_OK && any &&
	    sizeof(cwi_names) + n * sizeof(char *) > r->budget)
		rv = rd_fail(r, "decoded size exceeds %u times the message's "
			       "size",
		    CWI_PROTO_EXPANSION);
	if (rv == CACHEW_OK && any) {
		cwi_names *t = cwi_names_create((uint32_t)n,
		    (const char *const *)names);
		if (t == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		else
			*AT(body, f->off, cwi_names *) = t;
		r->budget -= sizeof(cwi_names) + n * sizeof(char *);
	}
	for (k = 0; k < n; k++)
		free(names[k]);
	return rv;
}

static cachew_err
rd_str_field(reader *r, const field *f, void *body)
{
	const uint8_t *p;
	uint64_t len;
	bool is;
	char *s;
	cachew_err rv = rd_bytes(r, f->type == F_BIN, &p, &len, &is);

	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, f->type == F_BIN ? "expected a bin"
						   : "expected a string");
	if (len > f->max)
		return rd_fail(r, "%llu bytes exceed the limit of %u",
		    (unsigned long long)len, f->max);
	if (f->type == F_STR && memchr(p, 0, (size_t)len) != NULL)
		return rd_fail(r, "string contains a NUL byte");
	s = rd_alloc(r, (size_t)len + 1, 1);
	if (s == NULL)
		return rd_alloc_fail(r, (size_t)len + 1, 1);
	if (len > 0)
		memcpy(s, p, (size_t)len);
	s[len] = '\0';
	if (f->type == F_BIN) {
		*AT(body, f->off, uint8_t *) = (uint8_t *)s;
		*AT(body, f->off_n, size_t) = (size_t)len;
	} else {
		*AT(body, f->off, char *) = s;
	}
	return CACHEW_OK;
}

static cachew_err
rd_field(reader *r, const field *f, void *body, unsigned depth)
{
	uint64_t u, len;
	int64_t i;
	const uint8_t *p;
	bool neg, is;
	uint8_t b;
	cachew_err rv;

	switch (f->type) {
	case F_U64:
	case F_U32:
		rv = rd_uint_field(r,
		    f->type == F_U32 ? UINT32_MAX : UINT64_MAX, &u);
		if (rv != CACHEW_OK)
			return rv;
		if (f->type == F_U32)
			*AT(body, f->off, uint32_t) = (uint32_t)u;
		else
			*AT(body, f->off, uint64_t) = u;
		return CACHEW_OK;
	case F_I64:
		rv = rd_int(r, &u, &i, &neg, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (!is)
			return rd_fail(r, "expected an integer");
		if (!neg && u > (uint64_t)INT64_MAX)
			return rd_fail(r, "%llu is larger than INT64_MAX",
			    (unsigned long long)u);
		*AT(body, f->off, int64_t) = neg ? i : (int64_t)u;
		return CACHEW_OK;
	case F_UNITS:
		rv = rd_int(r, &u, &i, &neg, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (!is)
			return rd_fail(r, "expected an integer");
		if (neg && i != -1)
			return rd_fail(r, "%lld is negative (-1 = none)",
			    (long long)i);
		*AT(body, f->off, uint64_t) = neg ? 0 : u;
		*AT(body, f->off_n, bool) = !neg;
		return CACHEW_OK;
	case F_F64:
		rv = rd_int(r, &u, &i, &neg, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (is) {
			*AT(body, f->off, double) = neg ? (double)i : (double)u;
			return CACHEW_OK;
		}
		if (remain(r) > 0 && (r->buf[r->pos] == 0xca ||
					 r->buf[r->pos] == 0xcb)) {
			b = r->buf[r->pos++];
			rv = rd_be(r, b == 0xca ? 4 : 8, &u);
			if (rv != CACHEW_OK)
				return rv;
			if (b == 0xca) {
				uint32_t w = (uint32_t)u;
				float fl;
				memcpy(&fl, &w, sizeof(fl));
				*AT(body, f->off, double) = (double)fl;
			} else {
				memcpy(AT(body, f->off, double), &u,
				    sizeof(double));
			}
			return CACHEW_OK;
		}
		return rd_fail(r, "expected a number");
	case F_BOOL:
		if (remain(r) > 0 && (r->buf[r->pos] == 0xc2 ||
					 r->buf[r->pos] == 0xc3)) {
			*AT(body, f->off, bool) = r->buf[r->pos++] == 0xc3;
			return CACHEW_OK;
		}
		return rd_fail(r, "expected a boolean");
	case F_STR:
	case F_BIN:
		return rd_str_field(r, f, body);
	case F_ENUM: {
		int v;
		rv = rd_bytes(r, false, &p, &len, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (!is)
			return rd_fail(r, "expected a string");
		v = enum_find(f->names, f->nnames, (const char *)p,
		    (size_t)len);
		if (v < 0)
			return rd_fail(r, "unknown value '%.*s'",
			    (int)(len < 64 ? len : 64), (const char *)p);
		*AT(body, f->off, int) = v;
		return CACHEW_OK;
	}
	case F_FP:
		return rd_fingerprint(r, AT(body, f->off, cachew_fingerprint));
	case F_U64S:
		return rd_u64s(r, f, body);
	case F_NAMES:
		return rd_names(r, f, body);
	case F_OBJS:
		return rd_objs(r, f, body, depth);
	default:
		return rd_fail(r, "internal: field type %d", f->type);
	}
}

static bool
key_is(const uint8_t *p, uint64_t len, const char *key)
{
	return strlen(key) == len && memcmp(p, key, (size_t)len) == 0;
}

/* The envelope's "k" or "i" into m: CACHEW_EOF when the key is neither. */
static cachew_err
rd_envelope_entry(reader *r, cwi_pmsg *m, const uint8_t *key, uint64_t klen,
    unsigned *seen)
{
	size_t saved;
	cachew_err rv;

	for (unsigned fi = 0; fi < s_envelope.nfields; fi++) {
		const field *f = &s_envelope.fields[fi];
		if (!key_is(key, klen, f->key))
			continue;
		saved = path_push(r, f->key, 0);
		if ((*seen >> fi & 1) != 0)
			return rd_fail(r, "field appears twice");
		*seen |= 1u << fi;
		if (!rd_nil(r)) {
			rv = rd_field(r, f, m, 0);
			if (rv != CACHEW_OK)
				return rv;
		}
		path_pop(r, saved);
		return CACHEW_OK;
	}
	return CACHEW_EOF;
}

/* Decodes n map entries into body; at the top level (`top`: the message,
 * after "v" and "t") a second "v" or "t" is refused and the envelope's
 * "k" and "i" go to top. */
static cachew_err
rd_entries(reader *r, const schema *s, void *body, unsigned depth,
    cwi_pmsg *top, uint64_t n)
{
	uint64_t klen, seen = 0;
	unsigned env_seen = 0;
	const uint8_t *key;
	bool is;
	cachew_err rv;

	for (uint64_t k = 0; k < n; k++) {
		const field *f = NULL;
		size_t fi = 0, saved;

		rv = rd_bytes(r, false, &key, &klen, &is);
		if (rv != CACHEW_OK)
			return rv;
		if (!is)
			return rd_fail(r, "map key is not a string");
		if (top != NULL &&
		    (key_is(key, klen, "v") || key_is(key, klen, "t")))
			return rd_fail(r, "'%c' appears twice", (char)key[0]);
		if (top != NULL) {
			rv = rd_envelope_entry(r, top, key, klen, &env_seen);
			if (rv == CACHEW_OK)
				continue;
			if (rv != CACHEW_EOF)
				return rv;
		}
		for (fi = 0; fi < s->nfields; fi++) {
			if (key_is(key, klen, s->fields[fi].key)) {
				f = &s->fields[fi];
				break;
			}
		}
		/* Unknown keys belong to later protocol versions. */
		if (f == NULL) {
			rv = rd_skip(r, depth + 1);
			if (rv != CACHEW_OK)
				return rv;
			continue;
		}
		saved = path_push(r, f->key, 0);
		if ((seen >> fi & 1) != 0)
			return rd_fail(r, "field appears twice");
		seen |= (uint64_t)1 << fi;
		if ((f->flags & F_REQ) == 0 && rd_nil(r)) {
			path_pop(r, saved);
			continue;
		}
		rv = rd_field(r, f, body, depth);
		if (rv != CACHEW_OK)
			return rv;
		path_pop(r, saved);
	}
	for (size_t fi = 0; fi < s->nfields; fi++) {
		if ((s->fields[fi].flags & F_REQ) != 0 &&
		    (seen >> fi & 1) == 0) {
			size_t saved = path_push(r, s->fields[fi].key, 0);
			rv = rd_fail(r, "missing required field");
			path_pop(r, saved);
			return rv;
		}
	}
	return CACHEW_OK;
}

/* A map header (each entry takes at least two bytes), then its entries. */
static cachew_err
rd_obj(reader *r, const schema *s, void *body, unsigned depth)
{
	uint64_t n;
	bool is;
	cachew_err rv;

	if (depth > CWI_PROTO_MAX_DEPTH)
		return rd_fail(r, "nested deeper than %u levels",
		    CWI_PROTO_MAX_DEPTH);
	rv = rd_container(r, true, &n, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "expected a map");
	if (n > remain(r) / 2)
		return rd_fail(r, "map of %llu entries overruns the message",
		    (unsigned long long)n);
	return rd_entries(r, s, body, depth, NULL, n);
}

/* The envelope: a map whose first two entries are "v" (checked first, so
 * a later version may change everything after it) and "t". Sets *type and
 * the number of entries that follow. */
static cachew_err
rd_envelope(reader *r, cwi_msg_type *type, uint64_t *rest)
{
	uint64_t n, klen, tlen, u;
	const uint8_t *key, *tname;
	int64_t i, version;
	bool is, neg;
	cachew_err rv;

	rv = rd_container(r, true, &n, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "not a msgpack map");
	if (n > remain(r) / 2)
		return rd_fail(r, "map of %llu entries overruns the message",
		    (unsigned long long)n);
	if (n < 2)
		return rd_fail(r, "no protocol version ('v') and message type "
				  "('t')");
	rv = rd_bytes(r, false, &key, &klen, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is || !key_is(key, klen, "v"))
		return rd_fail(r, "the first key is not the protocol version "
				  "('v')");
	rv = rd_int(r, &u, &i, &neg, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "protocol version 'v' is not an integer");
	version = neg ? i : u > INT64_MAX ? INT64_MAX : (int64_t)u;
	if (version != CWI_PROTO_VERSION)
		return rd_fail(r, "protocol version %lld, this build speaks %d",
		    (long long)version, CWI_PROTO_VERSION);
	rv = rd_bytes(r, false, &key, &klen, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is || !key_is(key, klen, "t"))
		return rd_fail(r, "the second key is not the message type "
				  "('t')");
	rv = rd_bytes(r, false, &tname, &tlen, &is);
	if (rv != CACHEW_OK)
		return rv;
	if (!is)
		return rd_fail(r, "message type 't' is not a string");
	for (int t = CWI_MSG_NONE + 1; t < CWI_MSG_NTYPES; t++) {
		if (key_is(tname, tlen, msg_schemas[t].name)) {
			*type = (cwi_msg_type)t;
			*rest = n - 2;
			return CACHEW_OK;
		}
	}
	return rd_fail(r, "unknown message type '%.*s'",
	    (int)(tlen < 64 ? tlen : 64), (const char *)tname);
}

cachew_err
cwi_pmsg_decode(const uint8_t *buf, size_t len, cwi_pmsg *out)
{
	reader r = {.buf = buf, .len = len, .msg = "?"};
	cwi_msg_type type = CWI_MSG_NONE;
	uint64_t rest = 0;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	if (buf == NULL && len > 0)
		return cwi_fail(CACHEW_EINVAL, "service message: NULL buffer");
	if (len > CWI_PROTO_MAX_HEADER)
		return cwi_fail(CACHEW_EPROTO, "service message: %zu bytes "
					       "exceed the limit of %u",
		    len, CWI_PROTO_MAX_HEADER);
	r.budget = len * CWI_PROTO_EXPANSION + CWI_PROTO_EXPANSION_SLACK;
	rv = rd_envelope(&r, &type, &rest);
	if (rv != CACHEW_OK)
		return rv;
	cwi_pmsg_init(out, type);
	r.msg = msg_schemas[type].name;
	rv = rd_entries(&r, &msg_schemas[type], &out->u, 0, out, rest);
	if (rv == CACHEW_OK && remain(&r) != 0)
		rv = rd_fail(&r, "%zu bytes follow the message", remain(&r));
	if (rv != CACHEW_OK)
		cwi_pmsg_free(out);
	return rv;
}

/* ---- coordinated reads --------------------------------------------------- */

static bool
serves(const cwi_task_info *t, uint64_t round)
{
	return t->start_round <= round && round < t->end_round;
}

cachew_err
cwi_coord_round_task(const cwi_task_info *tasks, size_t ntasks,
    uint64_t round, uint64_t *task_id)
{
	size_t n = 0, want, k;
	bool sorted = true;
	const cwi_task_info *prev = NULL, *pick = NULL;

	for (size_t i = 0; i < ntasks; i++) {
		if (!serves(&tasks[i], round))
			continue;
		if (prev != NULL && prev->task_id >= tasks[i].task_id)
			sorted = false;
		prev = &tasks[i];
		n++;
	}
	if (n == 0)
		return cwi_fail(CACHEW_ENOENT, "no task serves round %llu",
		    (unsigned long long)round);
	want = (size_t)(round % n);
	/* Heartbeat replies list tasks in id order: one pass. Any other
	 * order: the task with exactly `want` serving tasks of smaller id. */
	for (size_t i = 0, seen = 0; sorted && i < ntasks; i++) {
		if (serves(&tasks[i], round) && seen++ == want) {
			*task_id = tasks[i].task_id;
			return CACHEW_OK;
		}
	}
	for (size_t i = 0; i < ntasks && pick == NULL; i++) {
		if (!serves(&tasks[i], round))
			continue;
		k = 0;
		for (size_t j = 0; j < ntasks; j++)
			if (serves(&tasks[j], round) &&
			    tasks[j].task_id < tasks[i].task_id)
				k++;
		if (k == want)
			pick = &tasks[i];
	}
	if (pick == NULL)
		return cwi_fail(CACHEW_EINVAL, "duplicate task ids in the "
					       "schedule of round %llu",
		    (unsigned long long)round);
	*task_id = pick->task_id;
	return CACHEW_OK;
}
