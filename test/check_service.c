/*
 * check_service.c - the service protocol messages (encode, decode, hostile
 * input) and the dispatcher's state machine driven with a hand-advanced
 * clock: datasets, jobs, split leases through worker deaths, removals and
 * additions, client release and timeout, coordinated reads, the events
 * log, and a seeded random walk that checks no split is ever lost.
 */
#include "cwt.h"

#include "../src/core/value_msgpack.h"
#include "../src/service/dispatcher/dispatcher_state.h"
#include "../src/service/service_proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ull
#define SEC 1000000000ull

/* ---- helpers: messages --------------------------------------------------- */

static char *
xstrdup(const char *s)
{
	char *p = strdup(s);
	ck_assert_ptr_nonnull(p);
	return p;
}

static void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n, size);
	ck_assert_ptr_nonnull(p);
	return p;
}

static uint64_t *
ids_of(size_t n, uint64_t first)
{
	uint64_t *v = xcalloc(n, sizeof(*v));
	for (size_t i = 0; i < n; i++)
		v[i] = first + i;
	return v;
}

/* {image, (unnamed), label}: the component names of a sample reply. */
static cwi_names *
sample_names(void)
{
	const char *const v[] = {"image", NULL, "label"};
	cwi_names *t = cwi_names_create(3, v);

	ck_assert_ptr_nonnull(t);
	return t;
}

/* A message of `type` with every field set away from its default. */
static void
sample_msg(cwi_msg_type type, cwi_pmsg *m)
{
	cwi_pmsg_init(m, type);
	switch (type) {
	case CWI_MSG_ERROR:
		m->u.error.code = CACHEW_ENOENT;
		m->u.error.message = xstrdup("worker 7 is not registered");
		m->u.error.pipeline = true;
		break;
	case CWI_MSG_OK:
	case CWI_MSG_STATUS:
		break;
	case CWI_MSG_WORKER_REGISTER:
		m->u.worker_register.address = xstrdup("tcp://10.0.0.5:7071");
		m->u.worker_register.cores = 16;
		m->u.worker_register.memory_bytes = 64ull << 30;
		m->u.worker_register.build = xstrdup("cachew 0.5.0");
		m->u.worker_register.direct = true;
		m->u.worker_register.nfunctions = 2;
		m->u.worker_register.functions = xcalloc(2, sizeof(cwi_fn_info));
		m->u.worker_register.functions[0] = (cwi_fn_info){
		    xstrdup("square"), xstrdup("plugin_example"), xstrdup("1.0"),
		    xstrdup("0123456789abcdef0123456789abcdef")};
		m->u.worker_register.functions[1].name = xstrdup("my_fn");
		break;
	case CWI_MSG_WORKER_REGISTER_REPLY:
		m->u.worker_register_reply.worker_id = 3;
		m->u.worker_register_reply.heartbeat_interval_ms = 1000;
		m->u.worker_register_reply.worker_timeout_ms = 10000;
		break;
	case CWI_MSG_WORKER_HEARTBEAT: {
		cwi_msg_worker_heartbeat *h = &m->u.worker_heartbeat;
		h->worker_id = UINT64_MAX; /* the full unsigned range */
		h->cpu_use = 3.25;
		h->draining = true;
		h->ntasks = 2;
		h->tasks = xcalloc(2, sizeof(*h->tasks));
		h->tasks[0].task_id = 11;
		h->tasks[0].done = true;
		h->tasks[0].elements = 1000;
		h->tasks[0].bytes = 8000;
		h->tasks[0].nsplits_delivered = 3;
		h->tasks[0].splits_delivered = ids_of(3, 40);
		h->tasks[0].nops = 2;
		h->tasks[0].ops = xcalloc(2, sizeof(cwi_op_counters));
		h->tasks[0].ops[0] = (cwi_op_counters){xstrdup("range#0"), 1000,
		    8000, 5000, 0, 0, NULL, 0, 0, 0, 0, 0};
		h->tasks[0].ops[1] = (cwi_op_counters){xstrdup("map#1"), 999,
		    7992, 123456789, 42, 17, NULL, 0, 4, 64, 7, 0};
		h->tasks[0].ops_leases = 3;
		h->tasks[1].task_id = 12;
		break;
	}
	case CWI_MSG_WORKER_HEARTBEAT_REPLY: {
		cwi_msg_worker_heartbeat_reply *r = &m->u.worker_heartbeat_reply;
		r->nstart = 1;
		r->start = xcalloc(1, sizeof(*r->start));
		r->start[0].task_id = 5;
		r->start[0].job_id = 2;
		r->start[0].dataset_id = 1;
		r->start[0].fingerprint = (cachew_fingerprint){0x0123456789abcdefull,
		    0xfedcba9876543210ull};
		r->start[0].graph_len = 300; /* a bin 16 header */
		r->start[0].graph = xcalloc(1, 300);
		for (size_t i = 0; i < 300; i++)
			r->start[0].graph[i] = (uint8_t)i;
		r->start[0].processing_mode = CWI_MODE_PARALLEL_EPOCHS;
		r->start[0].compression = CWI_COMPRESSION_ZSTD;
		r->start[0].num_consumers = 4;
		r->start[0].lease_size = 8;
		r->start[0].seed = 42;
		r->start[0].epoch = 3;
		r->nstop = 2;
		r->stop = ids_of(2, 9);
		break;
	}
	case CWI_MSG_WORKER_DEREGISTER:
		m->u.worker_deregister.worker_id = 4;
		break;
	case CWI_MSG_DATASET_REGISTER:
		m->u.dataset_register.fingerprint = (cachew_fingerprint){1, 2};
		m->u.dataset_register.graph = (uint8_t *)xstrdup("\x81\xa1x\x01");
		m->u.dataset_register.graph_len = 4;
		m->u.dataset_register.split_units = 1 << 20;
		m->u.dataset_register.splittable = true;
		break;
	case CWI_MSG_DATASET_REGISTER_REPLY:
		m->u.dataset_register_reply.dataset_id = 6;
		m->u.dataset_register_reply.created = true;
		break;
	case CWI_MSG_JOB_GET_OR_CREATE: {
		cwi_msg_job_get_or_create *j = &m->u.job_get_or_create;
		j->dataset_id = 6;
		j->job_name = xstrdup("train \"resnet\"");
		j->iteration = 2;
		j->processing_mode = CWI_MODE_PARALLEL_EPOCHS;
		j->num_consumers = 2;
		j->consumer_index = 1;
		j->worker_policy = CWI_WORKERS_FIXED;
		j->num_workers = 3;
		j->compression = CWI_COMPRESSION_AUTO;
		j->client_id = 77;
		j->seed = 42;
		j->epoch = 3;
		break;
	}
	case CWI_MSG_JOB_GET_OR_CREATE_REPLY: {
		cwi_msg_job_get_or_create_reply *j = &m->u.job_get_or_create_reply;
		j->job_id = 8;
		j->client_id = 77;
		j->created = true;
		j->processing_mode = CWI_MODE_PARALLEL_EPOCHS;
		j->num_consumers = 2;
		j->compression = CWI_COMPRESSION_ZSTD;
		j->heartbeat_interval_ms = 500;
		break;
	}
	case CWI_MSG_CLIENT_HEARTBEAT: {
		cwi_msg_client_heartbeat *c = &m->u.client_heartbeat;
		c->job_id = 8;
		c->client_id = 77;
		c->batch_time_ns = 12 * MS;
		c->wait_time_ns = 3 * MS;
		c->buffer_fill = 0.75;
		c->round = 99;
		c->nacked_splits = 20; /* an array 16 header */
		c->acked_splits = ids_of(20, 0);
		c->elements_received = 20000;
		c->bytes_received = 160000;
		break;
	}
	case CWI_MSG_CLIENT_HEARTBEAT_REPLY: {
		cwi_msg_client_heartbeat_reply *c = &m->u.client_heartbeat_reply;
		c->job_finished = true;
		c->ntasks = 2;
		c->tasks = xcalloc(2, sizeof(*c->tasks));
		c->tasks[0] = (cwi_task_info){5, 1, xstrdup("tcp://a:1"),
		    CWI_TASK_ACTIVE, 0, 100, false, 0x9e3779b97f4a7c15ull};
		c->tasks[1] = (cwi_task_info){6, 2, xstrdup("ipc:///tmp/w2"),
		    CWI_TASK_REMOVING, 16, CWI_ROUND_NONE, true, 0};
		c->block_round = 132;
		c->splits_total = 64;
		c->splits_acked = 63;
		break;
	}
	case CWI_MSG_SPLIT_LEASE:
		m->u.split_lease = (cwi_msg_split_lease){3, 5, 4, 0, 0};
		break;
	case CWI_MSG_SPLIT_LEASE_REPLY: {
		cwi_msg_split_lease_reply *r = &m->u.split_lease_reply;
		r->nsplits = 2;
		r->splits = xcalloc(2, sizeof(*r->splits));
		r->splits[0] = (cwi_split){0, 0, 7, 1};
		r->splits[1] = (cwi_split){9, 63, 70, 0};
		r->end_of_splits = true;
		r->retry_ms = 100;
		break;
	}
	case CWI_MSG_SPLIT_ACK:
		m->u.split_ack.job_id = 8;
		m->u.split_ack.client_id = 77;
		m->u.split_ack.nsplit_ids = 3;
		m->u.split_ack.split_ids = ids_of(3, 1u << 20);
		m->u.split_ack.nparts = 3;
		m->u.split_ack.parts = ids_of(3, 1);
		m->u.split_ack.nleases = 3;
		m->u.split_ack.leases = ids_of(3, 4);
		break;
	case CWI_MSG_JOB_RELEASE:
		m->u.job_release = (cwi_msg_job_release){.job_id = 8,
		    .client_id = 77, .elements_received = 313,
		    .bytes_received = 160000};
		break;
	case CWI_MSG_STATUS_REPLY: {
		cwi_msg_status_reply *s = &m->u.status_reply;
		s->time_ns = 5 * SEC;
		s->nworkers = 1;
		s->workers = xcalloc(1, sizeof(*s->workers));
		s->workers[0] = (cwi_worker_status){1, xstrdup("tcp://w:1"), 8,
		    true, 250, 6.5, 2};
		s->ndatasets = 1;
		s->datasets = xcalloc(1, sizeof(*s->datasets));
		s->datasets[0] = (cwi_dataset_status){1, {3, 4}, 0, false};
		s->njobs = 1;
		s->jobs = xcalloc(1, sizeof(*s->jobs));
		s->jobs[0] = (cwi_job_status){.job_id = 2,
		    .name = xstrdup("j"),
		    .iteration = 1,
		    .dataset_id = 1,
		    .processing_mode = CWI_MODE_DISTRIBUTED_EPOCH,
		    .num_consumers = 0,
		    .clients = 2,
		    .tasks = 2,
		    .target_workers = 2,
		    .units_per_split = 7,
		    .splits_total = 15,
		    .splits_pending = 5,
		    .splits_leased = 4,
		    .splits_acked = 6,
		    .elements = 600,
		    .bytes = 4800,
		    .elements_per_s = 1200.5,
		    .bytes_per_s = 9604,
		    .batch_time_ns = 20 * MS,
		    .data_done = false,
		    .finished = true};
		s->ntasks = 1;
		s->tasks = xcalloc(1, sizeof(*s->tasks));
		s->tasks[0] = (cwi_task_status){3, 2, 1, CWI_TASK_STARTING, 4,
		    300, 2400, 600.25};
		break;
	}
	case CWI_MSG_GET_ELEMENTS: {
		cwi_msg_get_elements *g = &m->u.get_elements;
		g->task_id = 5;
		g->client_id = 77;
		g->consumer_index = 0;
		g->round = 12;
		g->max_elements = 64;
		g->max_bytes = 8u << 20;
		g->compression = CWI_COMPRESSION_ZSTD;
		g->exec = true;
		g->epoch = 3;
		g->threads = 2;
		g->ram_budget = INT64_C(1) << 33;
		g->deterministic = true;
		g->autotune = true;
		break;
	}
	case CWI_MSG_GET_ELEMENTS_REPLY: {
		cwi_msg_get_elements_reply *g = &m->u.get_elements_reply;
		g->task_id = 5;
		g->seq = 41;
		g->elements = 64;
		g->nsplit_ends = 2;
		g->split_ends = xcalloc(2, sizeof(*g->split_ends));
		g->split_ends[0] = (cwi_split_end){3, 10, 2, 5};
		g->split_ends[1] = (cwi_split_end){4, 64, 0, 0};
		g->end_of_task = true;
		g->round = 12;
		g->compression = CWI_COMPRESSION_ZSTD;
		g->retry_ms = 20;
		g->names = sample_names();
		break;
	}
	case CWI_MSG_TASK_STATS:
		m->u.task_stats.task_id = 9;
		break;
	case CWI_MSG_TASK_STATS_REPLY: {
		cwi_msg_task_stats_reply *t = &m->u.task_stats_reply;
		t->nops = 2;
		t->ops = xcalloc(2, sizeof(*t->ops));
		t->ops[0] = (cwi_op_counters){xstrdup("range"), 100, 800, 5000,
		    0, 0, xstrdup(""), 0, 1, 0, 0, 0};
		t->ops[1] = (cwi_op_counters){xstrdup("map"), 100, 800, 9000,
		    300, 4, xstrdup("add"), 1, 2, 16, 3, 0};
		t->busy = false;
		break;
	}
	case CWI_MSG_TASK_COUNTERS: {
		cwi_msg_task_counters *t = &m->u.task_counters;
		t->worker_id = 3;
		t->task_id = 9;
		t->ops_leases = 2;
		t->nops = 1;
		t->ops = xcalloc(1, sizeof(*t->ops));
		t->ops[0] = (cwi_op_counters){xstrdup("1:map/add"), 100, 800,
		    9000, 300, 0, NULL, 0, 2, 16, 0, 512};
		break;
	}
	default:
		ck_abort_msg("no sample for type %d", type);
	}
}

static void
encode_ok(const cwi_pmsg *m, cwi_strbuf *sb)
{
	cachew_err rv;

	cwi_strbuf_init(sb);
	rv = cwi_pmsg_encode(m, sb);
	ck_assert_msg(rv == CACHEW_OK, "encode %s: %s",
	    cwi_msg_type_name(m->type), cachew_errmsg());
}

/* Decodes bytes that must fail with EPROTO and a message containing
 * needle. */
static void
decode_fails(const void *buf, size_t len, const char *needle)
{
	cwi_pmsg m;
	cachew_err rv = cwi_pmsg_decode(buf, len, &m);

	ck_assert_msg(rv == CACHEW_EPROTO, "expected EPROTO, got %s (%s)",
	    cachew_strerror(rv), cachew_errmsg());
	ck_assert_msg(strstr(cachew_errmsg(), needle) != NULL,
	    "message '%s' lacks '%s'", cachew_errmsg(), needle);
	ck_assert_int_eq(m.type, CWI_MSG_NONE);
}

/* A header built by hand: map of n entries starting with "v" and "t". */
static void
hdr_begin(cwi_strbuf *sb, size_t n, const char *type)
{
	cwi_strbuf_init(sb);
	cwi_msgpack_put_map(sb, n + 2);
	cwi_msgpack_put_str(sb, "v", 1);
	cwi_msgpack_put_int(sb, CWI_PROTO_VERSION);
	cwi_msgpack_put_str(sb, "t", 1);
	cwi_msgpack_put_str(sb, type, strlen(type));
}

static void
put_key(cwi_strbuf *sb, const char *k)
{
	cwi_msgpack_put_str(sb, k, strlen(k));
}

/* ---- protocol tests ------------------------------------------------------ */

START_TEST(test_proto_every_message_round_trips)
{
	for (int t = CWI_MSG_NONE + 1; t < CWI_MSG_NTYPES; t++) {
		cwi_pmsg m, back;
		cwi_strbuf a, b;
		cachew_err rv;

		sample_msg((cwi_msg_type)t, &m);
		encode_ok(&m, &a);
		rv = cwi_pmsg_decode((const uint8_t *)a.data, a.len, &back);
		ck_assert_msg(rv == CACHEW_OK, "decode %s: %s",
		    cwi_msg_type_name((cwi_msg_type)t), cachew_errmsg());
		ck_assert_int_eq(back.type, t);
		/* The encoding is canonical: equal messages, equal bytes. */
		encode_ok(&back, &b);
		ck_assert_msg(a.len == b.len && memcmp(a.data, b.data, a.len) == 0,
		    "%s does not re-encode identically",
		    cwi_msg_type_name((cwi_msg_type)t));
		cwi_pmsg_free(&m);
		cwi_pmsg_free(&back);
		cwi_strbuf_free(&a);
		cwi_strbuf_free(&b);
	}
}
END_TEST

START_TEST(test_proto_fields_survive_round_trip)
{
	cwi_pmsg m, back;
	cwi_strbuf sb;
	const cwi_msg_worker_heartbeat *h;
	const cwi_task_def *td;

	sample_msg(CWI_MSG_WORKER_HEARTBEAT, &m);
	encode_ok(&m, &sb);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	h = &back.u.worker_heartbeat;
	ck_assert_uint_eq(h->worker_id, UINT64_MAX);
	ck_assert(h->cpu_use == 3.25);
	ck_assert(h->draining);
	ck_assert_uint_eq(h->ntasks, 2);
	ck_assert(h->tasks[0].done);
	ck_assert_uint_eq(h->tasks[0].nsplits_delivered, 3);
	ck_assert_uint_eq(h->tasks[0].splits_delivered[2], 42);
	ck_assert_str_eq(h->tasks[0].ops[1].name, "map#1");
	ck_assert_uint_eq(h->tasks[0].ops[1].busy_ns, 123456789);
	ck_assert_uint_eq(h->tasks[0].ops[1].buffered, 17);
	ck_assert_uint_eq(h->tasks[1].task_id, 12);
	ck_assert(!h->tasks[1].done);
	ck_assert_ptr_null(h->tasks[1].ops);
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);

	sample_msg(CWI_MSG_WORKER_HEARTBEAT_REPLY, &m);
	encode_ok(&m, &sb);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	td = &back.u.worker_heartbeat_reply.start[0];
	ck_assert_uint_eq(td->fingerprint.hi, 0x0123456789abcdefull);
	ck_assert_uint_eq(td->fingerprint.lo, 0xfedcba9876543210ull);
	ck_assert_uint_eq(td->graph_len, 300);
	ck_assert_uint_eq(td->graph[299], 299 & 0xff);
	ck_assert_int_eq(td->processing_mode, CWI_MODE_PARALLEL_EPOCHS);
	ck_assert_int_eq(td->compression, CWI_COMPRESSION_ZSTD);
	ck_assert_uint_eq(back.u.worker_heartbeat_reply.stop[1], 10);
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_defaults_are_left_out_and_restored)
{
	cwi_pmsg m, back;
	cwi_strbuf sb, want;

	cwi_pmsg_init(&m, CWI_MSG_GET_ELEMENTS);
	ck_assert_int_eq(m.u.get_elements.consumer_index, -1);
	m.u.get_elements.task_id = 5;
	encode_ok(&m, &sb);
	/* Only the envelope and the one required field. */
	hdr_begin(&want, 1, "get_elements");
	put_key(&want, "task_id");
	cwi_msgpack_put_int(&want, 5);
	ck_assert_uint_eq(sb.len, want.len);
	ck_assert(memcmp(sb.data, want.data, sb.len) == 0);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	ck_assert_int_eq(back.u.get_elements.consumer_index, -1);
	ck_assert_int_eq(back.u.get_elements.compression, CWI_COMPRESSION_NONE);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);
	cwi_strbuf_free(&want);

	cwi_pmsg_init(&m, CWI_MSG_CLIENT_HEARTBEAT_REPLY);
	encode_ok(&m, &sb);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	ck_assert_uint_eq(back.u.client_heartbeat_reply.block_round,
	    CWI_ROUND_NONE);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_unknown_keys_and_nil_optionals_ignored)
{
	cwi_strbuf sb;
	cwi_pmsg m;

	hdr_begin(&sb, 5, "split_lease");
	put_key(&sb, "from_the_future");
	cwi_msgpack_put_map(&sb, 1);
	put_key(&sb, "deep");
	cwi_msgpack_put_array(&sb, 2);
	cwi_strbuf_append(&sb, "\xc4\x02hi\xcb\x3f\xf0\0\0\0\0\0\0", 13);
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 2);
	put_key(&sb, "max_splits");
	cwi_msgpack_put_int(&sb, 3);
	put_key(&sb, "ext_too");
	cwi_strbuf_append(&sb, "\xd5\x07\x01\x02", 4);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &m),
	    CACHEW_OK);
	ck_assert_int_eq(m.type, CWI_MSG_SPLIT_LEASE);
	ck_assert_uint_eq(m.u.split_lease.max_splits, 3);
	cwi_pmsg_free(&m);
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 2, "job_get_or_create");
	put_key(&sb, "dataset_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "job_name");
	cwi_strbuf_append(&sb, "\xc0", 1);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &m),
	    CACHEW_OK);
	ck_assert_ptr_null(m.u.job_get_or_create.job_name);
	ck_assert_int_eq(m.u.job_get_or_create.consumer_index, -1);
	cwi_pmsg_free(&m);
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_missing_required_field_names_it)
{
	cwi_strbuf sb;

	hdr_begin(&sb, 2, "split_lease");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 2);
	decode_fails(sb.data, sb.len, "service message split_lease: "
				      "max_splits: missing required field");
	cwi_strbuf_free(&sb);

	/* Inside a list item the path has the index. */
	hdr_begin(&sb, 2, "worker_heartbeat");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "tasks");
	cwi_msgpack_put_array(&sb, 1);
	cwi_msgpack_put_map(&sb, 2);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "ops");
	cwi_msgpack_put_array(&sb, 1);
	cwi_msgpack_put_map(&sb, 1);
	put_key(&sb, "elements");
	cwi_msgpack_put_int(&sb, 1);
	decode_fails(sb.data, sb.len, "service message worker_heartbeat: "
				      "tasks[0].ops[0].name: missing required "
				      "field");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_wrong_types_name_the_field)
{
	cwi_strbuf sb;

	hdr_begin(&sb, 3, "split_lease");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_str(&sb, "one", 3);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 2);
	put_key(&sb, "max_splits");
	cwi_msgpack_put_int(&sb, 3);
	decode_fails(sb.data, sb.len, "split_lease: worker_id: expected an "
				      "unsigned integer");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 3, "split_lease");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, -1);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 2);
	put_key(&sb, "max_splits");
	cwi_msgpack_put_int(&sb, 1ll << 40);
	decode_fails(sb.data, sb.len, "worker_id: expected an unsigned");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 3, "split_lease");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "task_id");
	cwi_msgpack_put_int(&sb, 2);
	put_key(&sb, "max_splits");
	cwi_msgpack_put_int(&sb, 1ll << 40);
	decode_fails(sb.data, sb.len, "max_splits: 1099511627776 exceeds the "
				      "limit of 4294967295");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 2, "job_get_or_create");
	put_key(&sb, "dataset_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "processing_mode");
	cwi_msgpack_put_str(&sb, "sideways", 8);
	decode_fails(sb.data, sb.len, "job_get_or_create: processing_mode: "
				      "unknown value 'sideways'");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 3, "dataset_register");
	put_key(&sb, "fingerprint");
	cwi_msgpack_put_str(&sb, "00112233", 8);
	put_key(&sb, "graph");
	cwi_strbuf_append(&sb, "\xc4\x01\x80", 3);
	put_key(&sb, "split_units");
	cwi_msgpack_put_int(&sb, 1);
	decode_fails(sb.data, sb.len, "fingerprint: expected a string of 32 "
				      "hex digits");
	cwi_strbuf_free(&sb);

	/* The graph is bin, not a string. */
	hdr_begin(&sb, 2, "dataset_register");
	put_key(&sb, "fingerprint");
	cwi_msgpack_put_str(&sb, "0123456789abcdef0123456789ABCDEF", 32);
	put_key(&sb, "graph");
	cwi_msgpack_put_str(&sb, "x", 1);
	decode_fails(sb.data, sb.len, "dataset_register: graph: expected a bin");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 2, "error");
	put_key(&sb, "code");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "message");
	cwi_strbuf_append(&sb, "\xa3" "a\0b", 4);
	decode_fails(sb.data, sb.len, "error: message: string contains a NUL");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_version_and_type_checked)
{
	cwi_strbuf sb;

	/* The version is checked before anything after it is read. */
	cwi_strbuf_init(&sb);
	cwi_msgpack_put_map(&sb, 3);
	put_key(&sb, "v");
	cwi_msgpack_put_int(&sb, CWI_PROTO_VERSION + 1);
	put_key(&sb, "t");
	cwi_msgpack_put_str(&sb, "status", 6);
	cwi_strbuf_append(&sb, "\xc1\xc1", 2);
	decode_fails(sb.data, sb.len, "service message ?: protocol version 2, "
				      "this build speaks 1");
	cwi_strbuf_free(&sb);

	cwi_strbuf_init(&sb);
	cwi_msgpack_put_map(&sb, 2);
	put_key(&sb, "t");
	cwi_msgpack_put_str(&sb, "status", 6);
	put_key(&sb, "v");
	cwi_msgpack_put_int(&sb, CWI_PROTO_VERSION);
	decode_fails(sb.data, sb.len, "the first key is not the protocol "
				      "version ('v')");
	cwi_strbuf_free(&sb);

	cwi_strbuf_init(&sb);
	cwi_msgpack_put_map(&sb, 1);
	put_key(&sb, "v");
	cwi_msgpack_put_int(&sb, CWI_PROTO_VERSION);
	decode_fails(sb.data, sb.len, "no protocol version ('v') and message "
				      "type ('t')");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 1, "status");
	put_key(&sb, "v");
	cwi_msgpack_put_int(&sb, CWI_PROTO_VERSION);
	decode_fails(sb.data, sb.len, "service message status: 'v' appears "
				      "twice");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 0, "launch_missiles");
	decode_fails(sb.data, sb.len, "unknown message type 'launch_missiles'");
	cwi_strbuf_free(&sb);

	hdr_begin(&sb, 0, "status");
	cwi_strbuf_append(&sb, "\xc0", 1);
	decode_fails(sb.data, sb.len, "1 bytes follow the message");
	cwi_strbuf_free(&sb);

	decode_fails("\x93\x01\x02\x03", 4, "not a msgpack map");
	decode_fails("", 0, "unexpected end of message");
}
END_TEST

START_TEST(test_proto_duplicate_field_refused)
{
	cwi_strbuf sb;

	hdr_begin(&sb, 3, "worker_deregister");
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "worker_id");
	cwi_msgpack_put_int(&sb, 2);
	put_key(&sb, "other");
	cwi_msgpack_put_int(&sb, 2);
	decode_fails(sb.data, sb.len, "worker_deregister: worker_id: field "
				      "appears twice");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_oversized_counts_refused_before_allocating)
{
	cwi_strbuf sb;

	/* An array claiming 2^32-1 items in a few bytes. */
	hdr_begin(&sb, 3, "split_ack");
	put_key(&sb, "job_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "client_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "split_ids");
	cwi_strbuf_append(&sb, "\xdd\xff\xff\xff\xff", 5);
	decode_fails(sb.data, sb.len, "split_ids: array of 4294967295 items "
				      "exceeds the limit of 1048576");
	cwi_strbuf_free(&sb);

	/* Within the limit, but more items than bytes. */
	hdr_begin(&sb, 3, "split_ack");
	put_key(&sb, "job_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "client_id");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "split_ids");
	cwi_strbuf_append(&sb, "\xdd\x00\x01\x00\x00\x01", 6);
	decode_fails(sb.data, sb.len, "array of 65536 items overruns the "
				      "message");
	cwi_strbuf_free(&sb);

	/* A map header in an unknown key, also claiming 2^32-1. */
	hdr_begin(&sb, 1, "status");
	put_key(&sb, "x");
	cwi_strbuf_append(&sb, "\xdf\xff\xff\xff\xff", 5);
	decode_fails(sb.data, sb.len, "container of 4294967295 items overruns");
	cwi_strbuf_free(&sb);

	/* A string claiming 4 GiB. */
	hdr_begin(&sb, 2, "worker_register");
	put_key(&sb, "cores");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "address");
	cwi_strbuf_append(&sb, "\xdb\xff\xff\xff\xff" "abc", 8);
	decode_fails(sb.data, sb.len, "string of 4294967295 bytes overruns");
	cwi_strbuf_free(&sb);

	/* A name longer than names may be. */
	{
		char *big = xcalloc(1, CWI_PROTO_MAX_NAME + 2);
		memset(big, 'a', CWI_PROTO_MAX_NAME + 1);
		hdr_begin(&sb, 2, "worker_register");
		put_key(&sb, "cores");
		cwi_msgpack_put_int(&sb, 1);
		put_key(&sb, "address");
		cwi_msgpack_put_str(&sb, big, CWI_PROTO_MAX_NAME + 1);
		decode_fails(sb.data, sb.len, "address: 4097 bytes exceed the "
					      "limit of 4096");
		cwi_strbuf_free(&sb);
		free(big);
	}

	/* Deep nesting in an unknown key stops at the depth limit. */
	hdr_begin(&sb, 1, "status");
	put_key(&sb, "x");
	for (int i = 0; i < 100; i++)
		cwi_strbuf_append(&sb, "\x91", 1);
	cwi_strbuf_append(&sb, "\xc0", 1);
	decode_fails(sb.data, sb.len, "nested deeper than 32 levels");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_expansion_is_bounded)
{
	cwi_strbuf sb;
	size_t n = 200000;

	/* 200000 one-byte empty maps would take ~10 MB as status entries
	 * (50+ bytes each): more than 16 times the input. */
	hdr_begin(&sb, 2, "status_reply");
	put_key(&sb, "time_ns");
	cwi_msgpack_put_int(&sb, 1);
	put_key(&sb, "workers");
	cwi_msgpack_put_array(&sb, n);
	for (size_t i = 0; i < n; i++)
		cwi_strbuf_append(&sb, "\x80", 1);
	decode_fails(sb.data, sb.len, "decoded size exceeds 16 times the "
				      "message's size");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_proto_every_truncation_fails_cleanly)
{
	for (int t = CWI_MSG_NONE + 1; t < CWI_MSG_NTYPES; t++) {
		cwi_pmsg m, back;
		cwi_strbuf sb;

		sample_msg((cwi_msg_type)t, &m);
		encode_ok(&m, &sb);
		for (size_t len = 0; len < sb.len; len++) {
			/* An exact-size copy, so ASan sees any overread. */
			uint8_t *cut = malloc(len + 1);
			ck_assert_ptr_nonnull(cut);
			memcpy(cut, sb.data, len);
			ck_assert_msg(cwi_pmsg_decode(cut, len, &back) ==
				CACHEW_EPROTO,
			    "%s cut at %zu decoded", cwi_msg_type_name(m.type),
			    len);
			free(cut);
		}
		cwi_pmsg_free(&m);
		cwi_strbuf_free(&sb);
	}
}
END_TEST

START_TEST(test_proto_garbage_never_crashes)
{
	cwi_rng rng = {42};

	for (int t = CWI_MSG_NONE + 1; t < CWI_MSG_NTYPES; t++) {
		cwi_pmsg m, back;
		cwi_strbuf sb;

		sample_msg((cwi_msg_type)t, &m);
		encode_ok(&m, &sb);
		/* Flip random bytes: decoding succeeds or says EPROTO. */
		for (int round = 0; round < 300; round++) {
			uint8_t *x = malloc(sb.len);
			cachew_err rv;
			ck_assert_ptr_nonnull(x);
			memcpy(x, sb.data, sb.len);
			for (int k = 0; k < 3; k++)
				x[cwi_rng_below(&rng, sb.len)] =
				    (uint8_t)cwi_rng_next(&rng);
			rv = cwi_pmsg_decode(x, sb.len, &back);
			ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EPROTO,
			    "%s", cachew_strerror(rv));
			if (rv == CACHEW_OK)
				cwi_pmsg_free(&back);
			free(x);
		}
		cwi_pmsg_free(&m);
		cwi_strbuf_free(&sb);
	}
	for (int round = 0; round < 2000; round++) {
		uint8_t x[64];
		size_t len = (size_t)cwi_rng_below(&rng, sizeof(x));
		cwi_pmsg back;
		for (size_t i = 0; i < len; i++)
			x[i] = (uint8_t)cwi_rng_next(&rng);
		if (len > 0)
			x[0] = (uint8_t)(0x80 | (x[0] & 0x0f)); /* a fixmap */
		if (cwi_pmsg_decode(x, len, &back) == CACHEW_OK)
			cwi_pmsg_free(&back);
	}
}
END_TEST

START_TEST(test_proto_encoder_refuses_over_limit)
{
	cwi_pmsg m;
	cwi_strbuf sb;
	char *big = xcalloc(1, CWI_PROTO_MAX_NAME + 2);

	memset(big, 'w', CWI_PROTO_MAX_NAME + 1);
	cwi_pmsg_init(&m, CWI_MSG_WORKER_REGISTER);
	m.u.worker_register.address = big;
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_pmsg_encode(&m, &sb), CACHEW_ERANGE);
	ck_assert_str_eq(cachew_errmsg(), "service message worker_register: "
					  "worker_register.address: 4097 "
					  "exceeds the limit of 4096");
	ck_assert_uint_eq(sb.len, 0);
	cwi_pmsg_free(&m);

	cwi_pmsg_init(&m, CWI_MSG_JOB_GET_OR_CREATE);
	m.u.job_get_or_create.compression = (cwi_compression)9;
	ck_assert_int_eq(cwi_pmsg_encode(&m, &sb), CACHEW_EINVAL);
	cwi_pmsg_free(&m);
	cwi_strbuf_free(&sb);
}
END_TEST

/* A get_elements_reply header with its required fields and room for
 * `extra` more entries, which the caller writes. */
static void
reply_head(cwi_strbuf *sb, size_t extra)
{
	hdr_begin(sb, 3 + extra, "get_elements_reply");
	put_key(sb, "task_id");
	cwi_msgpack_put_int(sb, 5);
	put_key(sb, "seq");
	cwi_msgpack_put_int(sb, 0);
	put_key(sb, "elements");
	cwi_msgpack_put_int(sb, 2);
}

/* ... then `names`, a list of n items the caller writes raw. */
static void
reply_with_names(cwi_strbuf *sb, size_t n)
{
	reply_head(sb, 1);
	put_key(sb, "names");
	cwi_msgpack_put_array(sb, n);
}

/* The names a worker tells travel as one string per component ("" for
 * an unnamed one); a reply without them (a worker before names) decodes
 * to none, as does a list that names nothing. */
START_TEST(test_proto_element_names_travel_and_absent_is_none)
{
	cwi_pmsg m, back;
	cwi_strbuf sb;
	const cwi_names *t;

	sample_msg(CWI_MSG_GET_ELEMENTS_REPLY, &m);
	encode_ok(&m, &sb);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	t = back.u.get_elements_reply.names;
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->n, 3);
	ck_assert_str_eq(t->name[0], "image");
	ck_assert_ptr_null(t->name[1]);
	ck_assert_str_eq(t->name[2], "label");
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);

	/* An old worker's reply: no key at all. */
	reply_head(&sb, 0);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	ck_assert_uint_eq(back.u.get_elements_reply.elements, 2);
	ck_assert_ptr_null(back.u.get_elements_reply.names);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);

	/* nil, and a list of unnamed components only: none either. */
	reply_head(&sb, 1);
	put_key(&sb, "names");
	cwi_strbuf_append(&sb, "\xc0", 1);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	ck_assert_ptr_null(back.u.get_elements_reply.names);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);
	reply_with_names(&sb, 2);
	cwi_msgpack_put_str(&sb, "", 0);
	cwi_msgpack_put_str(&sb, "", 0);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &back),
	    CACHEW_OK);
	ck_assert_ptr_null(back.u.get_elements_reply.names);
	cwi_pmsg_free(&back);
	cwi_strbuf_free(&sb);

	/* 64 components, the longest name: the limits themselves pass. */
	{
		char longest[CWI_PROTO_MAX_COMPONENT_NAME];
		reply_with_names(&sb, CACHEW_MAX_COMPONENTS);
		memset(longest, 'n', sizeof(longest));
		cwi_msgpack_put_str(&sb, longest, sizeof(longest));
		for (int i = 1; i < CACHEW_MAX_COMPONENTS; i++) {
			char nm[16];
			snprintf(nm, sizeof(nm), "c%d", i);
			cwi_msgpack_put_str(&sb, nm, strlen(nm));
		}
		ck_assert_msg(cwi_pmsg_decode((uint8_t *)sb.data, sb.len,
				  &back) == CACHEW_OK, "%s", cachew_errmsg());
		t = back.u.get_elements_reply.names;
		ck_assert_uint_eq(t->n, CACHEW_MAX_COMPONENTS);
		ck_assert_uint_eq(strlen(t->name[0]),
		    CWI_PROTO_MAX_COMPONENT_NAME);
		ck_assert_str_eq(t->name[63], "c63");
		cwi_pmsg_free(&back);
		cwi_strbuf_free(&sb);
	}
}
END_TEST

/* Names from a peer are refused, naming the problem, when one is too
 * long, holds a NUL or a control character, two are alike, there are
 * more than CACHEW_MAX_COMPONENTS or the list is not one of strings; the
 * encoder refuses to send what the decoder would refuse. */
START_TEST(test_proto_hostile_element_names_refused)
{
	static const char *const bad_bytes[] = {"ima\0ge", "ima\nge",
	    "ima\x7fge"};
	char big[CWI_PROTO_MAX_COMPONENT_NAME + 1];
	cwi_strbuf sb;
	cwi_pmsg m;

	memset(big, 'x', sizeof(big));
	reply_with_names(&sb, 2);
	cwi_msgpack_put_str(&sb, "a", 1);
	cwi_msgpack_put_str(&sb, big, sizeof(big));
	decode_fails(sb.data, sb.len, "get_elements_reply: names[1]: a "
	    "component name of 256 bytes exceeds the limit of 255");
	cwi_strbuf_free(&sb);

	reply_with_names(&sb, 3);
	cwi_msgpack_put_str(&sb, "image", 5);
	cwi_msgpack_put_str(&sb, "", 0);
	cwi_msgpack_put_str(&sb, "image", 5);
	decode_fails(sb.data, sb.len, "names[2]: components 0 and 2 are both "
				      "named 'image'");
	cwi_strbuf_free(&sb);

	/* A NUL would cut the C string short; a newline or DEL would
	 * garble what prints names. */
	for (size_t i = 0; i < sizeof(bad_bytes) / sizeof(bad_bytes[0]); i++) {
		reply_with_names(&sb, 1);
		cwi_msgpack_put_str(&sb, bad_bytes[i], 6);
		decode_fails(sb.data, sb.len, "names[0]: a component name "
					      "holds a control character or "
					      "NUL");
		cwi_strbuf_free(&sb);
	}

	reply_with_names(&sb, CACHEW_MAX_COMPONENTS + 1);
	for (int i = 0; i <= CACHEW_MAX_COMPONENTS; i++) {
		char nm[16];
		snprintf(nm, sizeof(nm), "c%d", i);
		cwi_msgpack_put_str(&sb, nm, strlen(nm));
	}
	decode_fails(sb.data, sb.len, "names: array of 65 items exceeds the "
				      "limit of 64");
	cwi_strbuf_free(&sb);

	/* A count claiming more than the bytes that follow. */
	reply_with_names(&sb, 60);
	cwi_msgpack_put_str(&sb, "a", 1);
	decode_fails(sb.data, sb.len, "names: array of 60 items overruns the "
				      "message");
	cwi_strbuf_free(&sb);

	reply_with_names(&sb, 1);
	cwi_msgpack_put_int(&sb, 7);
	decode_fails(sb.data, sb.len, "names[0]: expected a string");
	cwi_strbuf_free(&sb);

	reply_head(&sb, 1);
	put_key(&sb, "names");
	cwi_msgpack_put_str(&sb, "image", 5);
	decode_fails(sb.data, sb.len, "names: expected an array");
	cwi_strbuf_free(&sb);

	/* The encoder: duplicate names are never sent. */
	{
		const char *const dup[] = {"a", "a"};
		cwi_pmsg_init(&m, CWI_MSG_GET_ELEMENTS_REPLY);
		m.u.get_elements_reply.names = cwi_names_create(2, dup);
		ck_assert_ptr_nonnull(m.u.get_elements_reply.names);
		ck_assert(!cwi_names_ok(m.u.get_elements_reply.names));
		cwi_strbuf_init(&sb);
		ck_assert_int_eq(cwi_pmsg_encode(&m, &sb), CACHEW_EINVAL);
		ck_assert_msg(strstr(cachew_errmsg(), "get_elements_reply."
			      "names: a name is not 1 to 255 bytes") != NULL,
		    "%s", cachew_errmsg());
		ck_assert_uint_eq(sb.len, 0);
		cwi_pmsg_free(&m);
		cwi_strbuf_free(&sb);
	}
}
END_TEST

START_TEST(test_proto_enum_names_parse)
{
	cwi_processing_mode pm;
	cwi_compression c;

	ck_assert_int_eq(cwi_processing_mode_parse("parallel_epochs", &pm),
	    CACHEW_OK);
	ck_assert_int_eq(pm, CWI_MODE_PARALLEL_EPOCHS);
	ck_assert_int_eq(cwi_compression_parse("auto", &c), CACHEW_OK);
	ck_assert_int_eq(c, CWI_COMPRESSION_AUTO);
	ck_assert_int_eq(cwi_compression_parse("lz4", &c), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "compression 'lz4' is not none, "
					  "zstd or auto");
	ck_assert_str_eq(cwi_msg_type_name(CWI_MSG_SPLIT_LEASE_REPLY),
	    "split_lease_reply");
	ck_assert_str_eq(cwi_task_state_name(CWI_TASK_REMOVING), "removing");
}
END_TEST

/* split_units is a count up to 2^64 - 1 (range(INT64_MIN, INT64_MAX) has
 * that many elements), or -1 for a dataset without a split source; it
 * used to travel as an int64, so counts over INT64_MAX went negative. */
START_TEST(test_proto_split_units_span_uint64)
{
	static const uint64_t counts[] = {0, 1, (uint64_t)INT64_MAX,
	    (uint64_t)INT64_MAX + 11, UINT64_MAX};
	cwi_strbuf sb;
	cwi_pmsg m, back;

	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		cwi_pmsg_init(&m, CWI_MSG_DATASET_REGISTER);
		m.u.dataset_register.graph = (uint8_t *)xstrdup("\x80");
		m.u.dataset_register.graph_len = 1;
		m.u.dataset_register.split_units = counts[i];
		m.u.dataset_register.splittable = true;
		encode_ok(&m, &sb);
		ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len,
				     &back), CACHEW_OK);
		ck_assert(back.u.dataset_register.splittable);
		ck_assert_uint_eq(back.u.dataset_register.split_units,
		    counts[i]);
		cwi_pmsg_free(&back);
		cwi_pmsg_free(&m);
		cwi_strbuf_free(&sb);
	}
	/* Without a split source: left out, and -1 when written. */
	hdr_begin(&sb, 3, "dataset_register");
	put_key(&sb, "fingerprint");
	cwi_msgpack_put_str(&sb, "0123456789abcdef0123456789abcdef", 32);
	put_key(&sb, "graph");
	cwi_strbuf_append(&sb, "\xc4\x01\x80", 3);
	put_key(&sb, "split_units");
	cwi_msgpack_put_int(&sb, -1);
	ck_assert_int_eq(cwi_pmsg_decode((uint8_t *)sb.data, sb.len, &m),
	    CACHEW_OK);
	ck_assert(!m.u.dataset_register.splittable);
	ck_assert_uint_eq(m.u.dataset_register.split_units, 0);
	cwi_pmsg_free(&m);
	/* -2 is neither. */
	sb.data[sb.len - 1] = (char)0xfe;
	decode_fails(sb.data, sb.len, "dataset_register: split_units: -2 is "
				      "negative (-1 = none)");
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_coord_round_task_rotates_over_serving_tasks)
{
	/* Listed out of order: selection is by task id. */
	cwi_task_info t[3] = {
	    {7, 1, NULL, CWI_TASK_ACTIVE, 0, CWI_ROUND_NONE, false, 0},
	    {3, 2, NULL, CWI_TASK_ACTIVE, 0, 10, false, 0},
	    {9, 3, NULL, CWI_TASK_ACTIVE, 6, CWI_ROUND_NONE, false, 0},
	};
	uint64_t id, want[14] = {3, 7, 3, 7, 3, 7, 3, 7, 9, 3, 7, 9, 7, 9};

	for (uint64_t r = 0; r < 14; r++) {
		ck_assert_int_eq(cwi_coord_round_task(t, 3, r, &id), CACHEW_OK);
		ck_assert_msg(id == want[r], "round %" PRIu64 ": task %" PRIu64
					     ", want %" PRIu64,
		    r, id, want[r]);
	}
	ck_assert_int_eq(cwi_coord_round_task(t, 0, 5, &id), CACHEW_ENOENT);
}
END_TEST

/* ---- helpers: a dispatcher with a hand-driven clock ---------------------- */

typedef struct harness {
	cwi_dispatcher *d;
	cwi_strbuf events; /* every event line, '\n'-terminated */
	uint64_t now;
} harness;

static void
collect_event(void *ctx, const char *line, size_t len)
{
	harness *h = ctx;

	ck_assert_uint_eq(strlen(line), len);
	cwi_strbuf_append(&h->events, line, len);
	cwi_strbuf_append(&h->events, "\n", 1);
}

static harness *
harness_new(void)
{
	harness *h = xcalloc(1, sizeof(*h));
	cwi_dispatcher_config cfg;

	cwi_dispatcher_config_default(&cfg);
	cfg.worker_timeout_ns = 10 * SEC;
	cfg.client_timeout_ns = 10 * SEC;
	cfg.event_fn = collect_event;
	cfg.event_ctx = h;
	cwi_strbuf_init(&h->events);
	h->now = 1000;
	ck_assert_int_eq(cwi_dispatcher_create(&h->d, &cfg), CACHEW_OK);
	return h;
}

static void
harness_free(harness *h)
{
	cwi_dispatcher_destroy(h->d);
	cwi_strbuf_free(&h->events);
	free(h);
}

static bool
has_event(const harness *h, const char *needle)
{
	return h->events.data != NULL && strstr(h->events.data, needle) != NULL;
}

static uint64_t
add_worker(harness *h, const char *address)
{
	cwi_msg_worker_register req = {0};
	cwi_msg_worker_register_reply rep;

	req.address = (char *)address;
	req.cores = 4;
	ck_assert_msg(cwi_dispatcher_worker_register(h->d, h->now, &req, &rep) ==
		CACHEW_OK,
	    "%s", cachew_errmsg());
	return rep.worker_id;
}

/* A dataset of `units` split units, or without a split source (one unit,
 * the whole pipeline). */
static uint64_t
add_dataset_units(harness *h, uint64_t fp, uint64_t units, bool splittable,
    bool *created)
{
	cwi_msg_dataset_register req = {{fp, fp * 3},
	    (uint8_t *)cwt_range3_graph, cwt_range3_graph_len, units,
	    splittable};
	cwi_msg_dataset_register_reply rep;

	ck_assert_msg(cwi_dispatcher_dataset_register(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	if (created != NULL)
		*created = rep.created;
	return rep.dataset_id;
}

/* -1: without a split source. */
static uint64_t
add_dataset(harness *h, uint64_t fp, int64_t units, bool *created)
{
	return add_dataset_units(h, fp, units >= 0 ? (uint64_t)units : 0,
	    units >= 0, created);
}

typedef struct job_opts {
	const char *name;
	cwi_processing_mode mode;
	uint32_t num_consumers;
	int64_t consumer_index;
	uint32_t fixed_workers;
	uint64_t epoch; /* the client's (its iteration too, as clients send) */
	uint64_t seed;
} job_opts;

static cachew_err
try_join(harness *h, uint64_t ds, const job_opts *o,
    cwi_msg_job_get_or_create_reply *rep)
{
	cwi_msg_job_get_or_create req;

	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.job_name = (char *)(o != NULL ? o->name : NULL);
	if (o != NULL) {
		req.processing_mode = o->mode;
		req.num_consumers = o->num_consumers;
		req.consumer_index = o->num_consumers > 0 ? o->consumer_index : -1;
		if (o->fixed_workers > 0) {
			req.worker_policy = CWI_WORKERS_FIXED;
			req.num_workers = o->fixed_workers;
		}
		req.iteration = o->epoch;
		req.epoch = o->epoch;
		req.seed = o->seed;
	}
	return cwi_dispatcher_job_get_or_create(h->d, h->now, &req, rep);
}

static void
join(harness *h, uint64_t ds, const job_opts *o, uint64_t *job,
    uint64_t *client)
{
	cwi_msg_job_get_or_create_reply rep;

	ck_assert_msg(try_join(h, ds, o, &rep) == CACHEW_OK, "%s",
	    cachew_errmsg());
	*job = rep.job_id;
	*client = rep.client_id;
}

/* A worker heartbeat reporting `tasks` (ids; done ones in `done`); returns
 * the reply (free with cwi_pmsg_body_free). */
static void
worker_hb(harness *h, uint64_t wid, const uint64_t *tasks, size_t n,
    const uint64_t *done, size_t ndone, cwi_msg_worker_heartbeat_reply *rep)
{
	cwi_msg_worker_heartbeat req = {0};
	cachew_err rv;

	req.worker_id = wid;
	req.ntasks = n;
	req.tasks = xcalloc(n + 1, sizeof(*req.tasks));
	for (size_t i = 0; i < n; i++) {
		req.tasks[i].task_id = tasks[i];
		for (size_t k = 0; k < ndone; k++)
			if (done[k] == tasks[i])
				req.tasks[i].done = true;
	}
	rv = cwi_dispatcher_worker_heartbeat(h->d, h->now, &req, rep);
	ck_assert_msg(rv == CACHEW_OK, "%s", cachew_errmsg());
	free(req.tasks);
}

/* The task a worker runs for job (0 if none), from the status. */
static uint64_t
task_of(harness *h, uint64_t wid, uint64_t job, cwi_task_state *state)
{
	cwi_msg_status_reply st;
	uint64_t id = 0;

	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	for (size_t i = 0; i < st.ntasks; i++) {
		if (st.tasks[i].worker_id == wid && st.tasks[i].job_id == job) {
			id = st.tasks[i].task_id;
			if (state != NULL)
				*state = st.tasks[i].state;
		}
	}
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	return id;
}

static cwi_job_status
job_status(harness *h, uint64_t job)
{
	cwi_msg_status_reply st;
	cwi_job_status js;
	bool found = false;

	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	for (size_t i = 0; i < st.njobs; i++) {
		if (st.jobs[i].job_id == job) {
			js = st.jobs[i];
			js.name = NULL;
			found = true;
		}
	}
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	ck_assert_msg(found, "job %" PRIu64 " not in the status", job);
	/* The invariant of the split pool. */
	if (!js.finished)
		ck_assert_uint_eq(js.splits_pending + js.splits_leased +
			js.splits_acked,
		    js.splits_total);
	return js;
}

static cachew_err
lease(harness *h, uint64_t wid, uint64_t tid, uint32_t max,
    cwi_msg_split_lease_reply *rep)
{
	cwi_msg_split_lease req = {wid, tid, max, 0, 0};
	return cwi_dispatcher_split_lease(h->d, h->now, &req, rep);
}

static void
ack(harness *h, uint64_t job, uint64_t client, const uint64_t *ids, size_t n)
{
	cwi_msg_split_ack req = {job, client, (uint64_t *)ids, n, NULL, 0, NULL, 0, 0};
	ck_assert_msg(cwi_dispatcher_split_ack(h->d, h->now, &req, NULL) == CACHEW_OK,
	    "%s", cachew_errmsg());
}

static void
client_hb(harness *h, uint64_t job, uint64_t client, uint64_t round,
    cwi_msg_client_heartbeat_reply *rep)
{
	cwi_msg_client_heartbeat req = {0};

	req.job_id = job;
	req.client_id = client;
	req.round = round;
	ck_assert_msg(cwi_dispatcher_client_heartbeat(h->d, h->now, &req, rep) ==
		CACHEW_OK,
	    "%s", cachew_errmsg());
}

/* Marks the units of a leased split in `units` (which counts acks per
 * unit) and acknowledges it. */
static void
ack_splits(harness *h, uint64_t job, uint64_t client,
    const cwi_msg_split_lease_reply *l, uint32_t *units)
{
	for (size_t i = 0; i < l->nsplits; i++) {
		for (uint64_t u = l->splits[i].begin; u < l->splits[i].end; u++)
			units[u]++;
		ack(h, job, client, &l->splits[i].split_id, 1);
	}
}

/* ---- dispatcher tests ---------------------------------------------------- */

START_TEST(test_dispatcher_same_fingerprint_same_dataset)
{
	harness *h = harness_new();
	bool created;
	uint64_t a = add_dataset(h, 10, 100, &created);

	ck_assert(created);
	ck_assert_uint_eq(add_dataset(h, 10, 100, &created), a);
	ck_assert(!created);
	ck_assert_uint_ne(add_dataset(h, 11, 100, &created), a);
	ck_assert(created);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_named_job_shared_unnamed_private)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), ds2 = add_dataset(h, 2, 64, NULL);
	job_opts named = {.name = "train"};
	cwi_msg_job_get_or_create_reply r1, r2, r3;
	uint64_t p1, p2, c;

	add_worker(h, "tcp://w1:1");
	ck_assert_int_eq(try_join(h, ds, &named, &r1), CACHEW_OK);
	ck_assert_int_eq(try_join(h, ds, &named, &r2), CACHEW_OK);
	ck_assert(r1.created);
	ck_assert(!r2.created);
	ck_assert_uint_eq(r1.job_id, r2.job_id);
	ck_assert_uint_ne(r1.client_id, r2.client_id);
	ck_assert_uint_eq(job_status(h, r1.job_id).clients, 2);
	/* Another iteration of the name is another job. */
	named.name = "train";
	{
		cwi_msg_job_get_or_create req;
		cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
		req.dataset_id = ds;
		req.job_name = "train";
		req.iteration = 1;
		ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now,
				     &req, &r3),
		    CACHEW_OK);
		ck_assert(r3.created);
	}
	/* The name with another dataset is refused, naming both. */
	ck_assert_int_eq(try_join(h, ds2, &named, &r3), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "job 'train' runs dataset 1, not 2");
	join(h, ds, NULL, &p1, &c);
	join(h, ds, NULL, &p2, &c);
	ck_assert_uint_ne(p1, p2);
	ck_assert_uint_ne(p1, r1.job_id);
	harness_free(h);
}
END_TEST

/* A named job is one per epoch (issue 20, item 2): the clients of an
 * epoch share the job, whose tasks run at that epoch with the seed of the
 * client that created it, so every client of the job reads the same
 * epoch's data; a client at the next epoch reads the next job. */
START_TEST(test_dispatcher_named_job_tasks_carry_its_epoch)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), w, j1, j2, c;
	job_opts a = {.name = "train", .epoch = 1, .seed = 42};
	job_opts b = {.name = "train", .epoch = 1, .seed = 43};
	job_opts next = {.name = "train", .epoch = 2, .seed = 42};
	cwi_msg_worker_heartbeat_reply wr;

	w = add_worker(h, "tcp://w1:1");
	join(h, ds, &a, &j1, &c);
	join(h, ds, &b, &j2, &c);
	ck_assert_uint_eq(j2, j1);
	join(h, ds, &next, &j2, &c);
	ck_assert_uint_ne(j2, j1);
	worker_hb(h, w, NULL, 0, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 2);
	for (size_t i = 0; i < 2; i++) {
		const cwi_task_def *td = &wr.start[i];
		ck_assert_uint_eq(td->epoch, td->job_id == j1 ? 1 : 2);
		ck_assert_uint_eq(td->seed, 42);
	}
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_job_request_checked)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL);
	uint64_t unsplit = add_dataset(h, 2, -1, NULL);
	cwi_msg_job_get_or_create_reply rep;
	job_opts o = {.name = "sync", .num_consumers = 2, .consumer_index = 1};

	ck_assert_int_eq(try_join(h, 99, NULL, &rep), CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(), "dataset 99 is not registered");
	o.consumer_index = 2;
	ck_assert_int_eq(try_join(h, ds, &o, &rep), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "consumer_index 2 is not in 0..1");
	o.consumer_index = 1;
	ck_assert_int_eq(try_join(h, ds, &o, &rep), CACHEW_OK);
	ck_assert_int_eq(try_join(h, ds, &o, &rep), CACHEW_EEXIST);
	ck_assert_str_eq(cachew_errmsg(), "job 'sync': consumer 1 is taken by "
					  "client 1");
	o.mode = CWI_MODE_PARALLEL_EPOCHS;
	ck_assert_int_eq(try_join(h, unsplit, &(job_opts){.mode =
					  CWI_MODE_PARALLEL_EPOCHS},
			     &rep),
	    CACHEW_OK);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_split_size_targets_splits_per_worker)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 100, NULL), job, c;
	cwi_job_status js;

	add_worker(h, "tcp://w1:1");
	add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	js = job_status(h, job);
	/* 2 workers x 8 = 16 wanted: 7 units per split, 15 splits. */
	ck_assert_uint_eq(js.units_per_split, 7);
	ck_assert_uint_eq(js.splits_total, 15);
	ck_assert_uint_eq(js.splits_pending, 15);
	ck_assert_uint_eq(js.tasks, 2);
	harness_free(h);
}
END_TEST

/* A dataset without a split source (zip, concatenate, a source that
 * cannot be split) runs in distributed_epoch as one split of one unit:
 * one worker runs the pipeline whole, the others get no split. */
START_TEST(test_dispatcher_dataset_without_split_source_is_one_split)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, -1, NULL), job, c, w1, w2;
	cwi_msg_split_lease_reply l1, l2;
	cwi_msg_status_reply st;
	cwi_job_status js;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	js = job_status(h, job);
	ck_assert_uint_eq(js.units_per_split, 1);
	ck_assert_uint_eq(js.splits_total, 1);
	ck_assert_uint_eq(js.tasks, 2);
	ck_assert_int_eq(lease(h, w1, task_of(h, w1, job, NULL), 4, &l1),
	    CACHEW_OK);
	ck_assert_uint_eq(l1.nsplits, 1);
	ck_assert_uint_eq(l1.splits[0].begin, 0);
	ck_assert_uint_eq(l1.splits[0].end, 1);
	ck_assert_int_eq(lease(h, w2, task_of(h, w2, job, NULL), 4, &l2),
	    CACHEW_OK);
	ck_assert_uint_eq(l2.nsplits, 0);
	ck_assert(!l2.end_of_splits); /* w1 may die: then it is w2's */
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
	ack(h, job, c, &l1.splits[0].split_id, 1);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l1);
	ck_assert(has_event(h, "\"event\":\"epoch_done\",\"job_id\":1,"
			       "\"splits\":1}"));
	ck_assert(has_event(h, "\"event\":\"dataset_registered\","
			       "\"dataset_id\":1,\"fingerprint\":"
			       "\"00000000000000010000000000000003\","
			       "\"split_units\":-1}"));
	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	ck_assert(!st.datasets[0].splittable);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	harness_free(h);
}
END_TEST

/* A split source of 2^64 - 1 units (range(INT64_MIN, INT64_MAX)): the
 * splits cover every unit, contiguous, the last one ending at 2^64 - 1
 * (begin + units_per_split of the last split passes 2^64). */
START_TEST(test_dispatcher_splits_cover_uint64_max_units)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset_units(h, 1, UINT64_MAX, true, NULL);
	uint64_t job, c, w, t, begin[8] = {0}, end[8] = {0};
	cwi_msg_split_lease_reply l;
	cwi_msg_status_reply st;
	cwi_job_status js;
	size_t got = 0;

	w = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c);
	js = job_status(h, job);
	ck_assert_uint_eq(js.units_per_split, (uint64_t)1 << 61);
	ck_assert_uint_eq(js.splits_total, 8);
	t = task_of(h, w, job, NULL);
	for (int round = 0; round < 8 && got < 8; round++) {
		ck_assert_int_eq(lease(h, w, t, 4, &l), CACHEW_OK);
		for (size_t i = 0; i < l.nsplits; i++) {
			uint64_t id = l.splits[i].split_id;
			ck_assert_uint_lt(id, 8);
			begin[id] = l.splits[i].begin;
			end[id] = l.splits[i].end;
			got++;
		}
		cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	}
	ck_assert_uint_eq(got, 8);
	ck_assert_uint_eq(begin[0], 0);
	for (size_t i = 0; i < 8; i++) {
		ck_assert_uint_lt(begin[i], end[i]);
		if (i > 0)
			ck_assert_uint_eq(begin[i], end[i - 1]);
	}
	ck_assert_uint_eq(end[7], UINT64_MAX);
	ck_assert(has_event(h, "\"split_units\":18446744073709551615}"));
	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	ck_assert(st.datasets[0].splittable);
	ck_assert_uint_eq(st.datasets[0].split_units, UINT64_MAX);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_ack_reply_says_when_every_split_is_acked)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 100, NULL), job, c, w, t;
	cwi_msg_split_lease_reply l;
	uint64_t ids[64];
	size_t n = 0;

	w = add_worker(h, "tcp://w0:1");
	join(h, ds, NULL, &job, &c);
	t = task_of(h, w, job, NULL);
	ck_assert_uint_ne(t, 0);
	for (int r = 0; r < 100; r++) {
		bool last;
		ck_assert_int_eq(lease(h, w, t, 8, &l), CACHEW_OK);
		for (size_t i = 0; i < l.nsplits && n < 64; i++)
			ids[n++] = l.splits[i].split_id;
		last = l.nsplits == 0;
		cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
		if (last)
			break;
	}
	ck_assert_uint_gt(n, 1);
	for (size_t i = 0; i < n; i++) {
		cwi_msg_split_ack req = {job, c, &ids[i], 1, NULL, 0, NULL, 0, 0};
		cwi_msg_ok ok = {true};
		ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req,
				     &ok), CACHEW_OK);
		/* Only the ack that completes the epoch says so. */
		ck_assert_msg(ok.job_finished == (i + 1 == n),
		    "ack %zu of %zu: job_finished=%d", i + 1, n,
		    (int)ok.job_finished);
	}
	harness_free(h);
}
END_TEST

/* A split read by two clients of a shared job is done when both have
 * acknowledged their part: one client's ack sent twice (a resend after a
 * lost reply) counts once, or the job would end while the other client's
 * part is still on its way. */
START_TEST(test_dispatcher_part_acks_count_each_client_once)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 8, NULL), job, a, b, w, t, id, two = 2;
	job_opts named = {.name = "shared"};
	cwi_msg_split_lease_reply l;
	cwi_msg_ok ok = {true};

	w = add_worker(h, "tcp://w0:1");
	join(h, ds, &named, &job, &a);
	join(h, ds, &named, &job, &b);
	t = task_of(h, w, job, NULL);
	ck_assert_int_eq(lease(h, w, t, 1, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 1);
	id = l.splits[0].split_id;
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* Every other split acknowledged whole. */
	for (uint64_t k = 0; k < job_status(h, job).splits_total; k++)
		if (k != id)
			ack(h, job, a, &k, 1);
	cwi_msg_split_ack req = {job, a, &id, 1, &two, 1, NULL, 0, 0};
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req,
				     &ok), CACHEW_OK);
		ck_assert(!ok.job_finished);
		ck_assert_uint_eq(job_status(h, job).splits_leased, 1);
	}
	req.client_id = b;
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	ck_assert(ok.job_finished);
	ck_assert_uint_eq(job_status(h, job).splits_leased, 0);
	/* Late copies change nothing. */
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	ck_assert(ok.job_finished);
	harness_free(h);
}
END_TEST

/* A part acknowledged for a split's first lease (resent after a lost
 * reply) that arrives after the split was released with its dead lessee
 * and leased again is not that client's part of the new lease: the other
 * client's ack alone does not complete the split while the first client's
 * new part is still on its way. */
START_TEST(test_dispatcher_part_ack_of_an_earlier_lease_is_a_duplicate)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 8, NULL), job, a, b, w1, w2, t1, t2, id,
		 two = 2, lease1, lease2;
	job_opts named = {.name = "shared"};
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_ok ok = {false};

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, &named, &job, &a);
	join(h, ds, &named, &job, &b);
	t1 = task_of(h, w1, job, NULL);
	t2 = task_of(h, w2, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 1, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 1);
	id = l.splits[0].split_id;
	lease1 = l.splits[0].lease;
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	for (uint64_t k = 0; k < job_status(h, job).splits_total; k++)
		if (k != id)
			ack(h, job, a, &k, 1);
	/* Lease 1 (w1): a's part arrives, its ack is applied, the reply is
	 * lost; b's part dies with w1. */
	cwi_msg_split_ack req = {job, a, &id, 1, &two, 1, &lease1, 1, 0};
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	ck_assert(!ok.job_finished);
	for (int i = 0; i < 2; i++) {
		cwi_msg_client_heartbeat_reply cr;
		h->now += 6 * SEC;
		worker_hb(h, w2, &t2, 1, NULL, 0, &wr);
		cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
		client_hb(h, job, a, 0, &cr);
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
		client_hb(h, job, b, 0, &cr);
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	}
	cwi_dispatcher_tick(h->d, h->now);
	ck_assert_uint_eq(job_status(h, job).splits_pending, 1);
	/* Lease 2 (w2): read by a and b again (parts = 2). */
	ck_assert_int_eq(lease(h, w2, t2, 1, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 1);
	ck_assert_uint_eq(l.splits[0].split_id, id);
	lease2 = l.splits[0].lease;
	ck_assert_uint_ne(lease2, lease1);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* a's resend of its lease-1 ack arrives now. */
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	/* b acknowledges its lease-2 part: a's lease-2 part has not come. */
	req.client_id = b;
	req.leases = &lease2;
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	ck_assert_msg(!ok.job_finished, "job finished while a's part of "
	    "lease 2 is still on its way");
	/* a's own part of lease 2 completes it. */
	req.client_id = a;
	ck_assert_int_eq(cwi_dispatcher_split_ack(h->d, h->now, &req, &ok),
	    CACHEW_OK);
	ck_assert(ok.job_finished);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_epoch_leases_every_unit_once)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 1000, NULL), job, c, w[3], t[3];
	uint32_t units[1000] = {0};
	cwi_msg_split_lease_reply l;
	cwi_msg_client_heartbeat_reply cr;
	bool any = true;
	int rounds = 0;

	for (int i = 0; i < 3; i++) {
		char addr[32];
		snprintf(addr, sizeof(addr), "tcp://w%d:1", i);
		w[i] = add_worker(h, addr);
	}
	join(h, ds, NULL, &job, &c);
	for (int i = 0; i < 3; i++) {
		t[i] = task_of(h, w[i], job, NULL);
		ck_assert_uint_ne(t[i], 0);
	}
	while (any && rounds++ < 1000) {
		any = false;
		for (int i = 0; i < 3; i++) {
			ck_assert_int_eq(lease(h, w[i], t[i], 4, &l), CACHEW_OK);
			ck_assert_uint_le(l.nsplits, 4);
			any = any || l.nsplits > 0;
			ack_splits(h, job, c, &l, units);
			cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
		}
	}
	for (int u = 0; u < 1000; u++)
		ck_assert_msg(units[u] == 1, "unit %d acked %u times", u,
		    units[u]);
	ck_assert(has_event(h, "\"event\":\"epoch_done\",\"job_id\":1,"
			       "\"splits\":24}"));
	ck_assert_int_eq(lease(h, w[0], t[0], 4, &l), CACHEW_OK);
	ck_assert(l.end_of_splits);
	ck_assert_uint_eq(l.nsplits, 0);
	client_hb(h, job, c, 0, &cr);
	ck_assert(cr.job_finished);
	ck_assert_uint_eq(cr.splits_acked, 24);
	ck_assert_uint_eq(cr.ntasks, 3);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_lease_is_capped_by_fair_share)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 6, NULL), job, c, w1, w2;
	cwi_msg_split_lease_reply l;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	/* 6 splits of 1 unit, 2 tasks: one asking for 4 gets 3. */
	ck_assert_int_eq(lease(h, w1, task_of(h, w1, job, NULL), 4, &l),
	    CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 3);
	ck_assert_uint_eq(l.splits[0].split_id, 0);
	ck_assert_uint_eq(l.splits[2].split_id, 2);
	ck_assert_uint_eq(l.splits[2].begin, 2);
	ck_assert_uint_eq(l.splits[2].end, 3);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* Of the 3 left, w2 asking for 8 gets 2, then 1. */
	ck_assert_int_eq(lease(h, w2, task_of(h, w2, job, NULL), 8, &l),
	    CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 2);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	ck_assert_int_eq(lease(h, w2, task_of(h, w2, job, NULL), 8, &l),
	    CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 1);
	ck_assert_uint_eq(l.splits[0].split_id, 5);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* Nothing pending, some leased: ask again soon (a fifth of the
	 * retry interval: the epoch ends with the last acks), not the
	 * end. */
	ck_assert_int_eq(lease(h, w2, task_of(h, w2, job, NULL), 8, &l),
	    CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 0);
	ck_assert(!l.end_of_splits);
	ck_assert_uint_eq(l.retry_ms, 20);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_dead_worker_splits_are_leased_again)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 16, NULL), job, c, w1, w2, t1, t2;
	uint32_t units[16] = {0};
	cwi_msg_split_lease_reply l1, l2;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_job_status js;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	t2 = task_of(h, w2, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 4, &l1), CACHEW_OK);
	ck_assert_int_eq(lease(h, w2, t2, 4, &l2), CACHEW_OK);
	/* w1's first split arrives; the other three die with it. */
	ack(h, job, c, &l1.splits[0].split_id, 1);
	units[l1.splits[0].begin]++;
	/* w2 and the client keep heartbeating, w1 falls silent past the
	 * timeout. */
	for (int i = 0; i < 2; i++) {
		cwi_msg_client_heartbeat_reply cr;
		h->now += 6 * SEC;
		worker_hb(h, w2, &t2, 1, NULL, 0, &wr);
		cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
		client_hb(h, job, c, 0, &cr);
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	}
	cwi_dispatcher_tick(h->d, h->now);
	ck_assert(has_event(h, "\"event\":\"worker_dead\",\"worker_id\":1,"
			       "\"reason\":\"timeout\"}"));
	ck_assert(has_event(h, "\"event\":\"split_released\",\"job_id\":1,"
			       "\"worker_id\":1,\"reason\":\"timeout\","
			       "\"splits\":[1,2,3]}"));
	js = job_status(h, job);
	ck_assert_uint_eq(js.splits_leased, 4);
	ck_assert_uint_eq(js.splits_pending, 11);
	ck_assert_uint_eq(js.tasks, 1);
	/* The released splits go first, to the survivor. */
	ack_splits(h, job, c, &l2, units);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
	ck_assert_int_eq(lease(h, w2, t2, 4, &l2), CACHEW_OK);
	ck_assert_uint_eq(l2.splits[0].split_id, 1);
	ck_assert_uint_eq(l2.splits[2].split_id, 3);
	for (int i = 0; i < 100 && l2.nsplits > 0; i++) {
		ack_splits(h, job, c, &l2, units);
		cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
		ck_assert_int_eq(lease(h, w2, t2, 4, &l2), CACHEW_OK);
	}
	ck_assert(l2.end_of_splits);
	for (int u = 0; u < 16; u++)
		ck_assert_msg(units[u] == 1, "unit %d acked %u times", u,
		    units[u]);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l1);
	/* The dead worker is unknown now. */
	ck_assert_int_eq(lease(h, w1, t1, 4, &l1), CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(), "worker 1 is not registered");
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l1);
	harness_free(h);
}
END_TEST

static uint32_t
count_one(void *ctx, const cwi_job_view *v)
{
	(void)v;
	return *(uint32_t *)ctx;
}

START_TEST(test_dispatcher_removed_task_finishes_leased_splits)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 32, NULL), job, c, w1, w2, t1, t2;
	uint32_t units[32] = {0}, want = 1;
	cwi_msg_split_lease_reply l1, l2;
	cwi_task_state st;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	t2 = task_of(h, w2, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 4, &l1), CACHEW_OK);
	ck_assert_int_eq(lease(h, w2, t2, 4, &l2), CACHEW_OK);
	/* Scale down to one worker: the newest task on a busiest worker
	 * goes, but only after its leased splits are acknowledged. */
	ck_assert_int_eq(cwi_dispatcher_set_worker_count(h->d, h->now, job,
			     count_one, &want),
	    CACHEW_OK);
	ck_assert_uint_eq(task_of(h, w2, job, &st), t2);
	ck_assert_int_eq(st, CWI_TASK_REMOVING);
	ck_assert(has_event(h, "\"event\":\"task_removing\",\"task_id\":2,"
			       "\"job_id\":1,\"worker_id\":2,\"leased\":4,"
			       "\"reason\":\"scaled_down\"}"));
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
	ck_assert_int_eq(lease(h, w2, t2, 4, &l2), CACHEW_OK);
	ck_assert(l2.end_of_splits);
	ck_assert_uint_eq(l2.nsplits, 0);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l2);
	/* Its four splits: 4..7 (w1 took 0..3). */
	for (uint64_t s = 4; s < 8; s++) {
		for (uint64_t u = s * 2; u < s * 2 + 2; u++)
			units[u]++;
		ack(h, job, c, &s, 1);
		ck_assert_uint_eq(task_of(h, w2, job, NULL), s < 7 ? t2 : 0);
	}
	ck_assert(has_event(h, "\"event\":\"task_removed\",\"task_id\":2,"
			       "\"job_id\":1,\"worker_id\":2,\"reason\":"
			       "\"removed\"}"));
	for (int i = 0; i < 100 && l1.nsplits > 0; i++) {
		ack_splits(h, job, c, &l1, units);
		cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l1);
		ck_assert_int_eq(lease(h, w1, t1, 4, &l1), CACHEW_OK);
	}
	for (int u = 0; u < 32; u++)
		ck_assert_msg(units[u] == 1, "unit %d acked %u times", u,
		    units[u]);
	ck_assert(job_status(h, job).data_done);
	harness_free(h);
}
END_TEST

/* ---- user functions on workers ------------------------------------------ */

#define HASH_V1 "0123456789abcdef0123456789abcdef"
#define HASH_V2 "fedcba9876543210fedcba9876543210"

static void
put_s(cwi_strbuf *sb, const char *s)
{
	cwi_msgpack_put_str(sb, s, strlen(s));
}

/* The graph document of range(3) | map(fn), the map's function from
 * plugin plugin_example at `version` and `hash` (no plugin: NULL). */
static void
fn_graph(cwi_strbuf *sb, const char *fn, const char *version,
    const char *hash)
{
	cwi_strbuf_init(sb);
	cwi_msgpack_put_map(sb, 4);
	put_s(sb, "format");
	put_s(sb, "cachew-graph");
	put_s(sb, "nodes");
	cwi_msgpack_put_array(sb, 2);
	cwi_msgpack_put_map(sb, 3);
	put_s(sb, "inputs");
	cwi_msgpack_put_array(sb, 0);
	put_s(sb, "op");
	put_s(sb, "range");
	put_s(sb, "params");
	cwi_msgpack_put_map(sb, 1);
	put_s(sb, "stop");
	cwi_msgpack_put_int(sb, 3);
	cwi_msgpack_put_map(sb, hash != NULL ? 4 : 3);
	put_s(sb, "inputs");
	cwi_msgpack_put_array(sb, 1);
	cwi_msgpack_put_int(sb, 0);
	put_s(sb, "op");
	put_s(sb, "map");
	put_s(sb, "params");
	cwi_msgpack_put_map(sb, 1);
	put_s(sb, "fn");
	put_s(sb, fn);
	if (hash != NULL) {
		put_s(sb, "plugin");
		cwi_msgpack_put_map(sb, 3);
		put_s(sb, "hash");
		put_s(sb, hash);
		put_s(sb, "name");
		put_s(sb, "plugin_example");
		put_s(sb, "version");
		put_s(sb, version);
	}
	put_s(sb, "root");
	cwi_msgpack_put_int(sb, 1);
	put_s(sb, "version");
	cwi_msgpack_put_int(sb, 1);
	ck_assert(!sb->oom);
}

/* A dataset of range(3) | map(square) with square from plugin_example
 * `version` (hash); fp tells datasets apart. */
static uint64_t
add_fn_dataset(harness *h, uint64_t fp, const char *version,
    const char *hash)
{
	cwi_msg_dataset_register req = {{fp, fp}, NULL, 0, 3, true};
	cwi_msg_dataset_register_reply rep;
	cwi_strbuf sb;

	fn_graph(&sb, "square", version, hash);
	req.graph = (uint8_t *)sb.data;
	req.graph_len = sb.len;
	ck_assert_msg(cwi_dispatcher_dataset_register(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_strbuf_free(&sb);
	return rep.dataset_id;
}

/* A worker that loaded plugin_example at `version` (hash; NULL: none). */
static uint64_t
add_fn_worker(harness *h, const char *address, const char *version,
    const char *hash)
{
	cwi_msg_worker_register req = {0};
	cwi_msg_worker_register_reply rep;
	cwi_fn_info fns[2] = {
	    {"square", "plugin_example", (char *)version, (char *)hash},
	    {"is_even", "plugin_example", (char *)version, (char *)hash},
	};

	req.address = (char *)address;
	req.cores = 4;
	req.functions = hash != NULL ? fns : NULL;
	req.nfunctions = hash != NULL ? 2 : 0;
	ck_assert_msg(cwi_dispatcher_worker_register(h->d, h->now, &req, &rep) ==
		CACHEW_OK,
	    "%s", cachew_errmsg());
	return rep.worker_id;
}

/* A job whose graph needs a plugin function gets tasks only on workers
 * that loaded the same build of the plugin, including workers that come
 * later (issue 20, item 4); its worker count counts only those. */
START_TEST(test_dispatcher_places_tasks_only_on_workers_with_the_functions)
{
	harness *h = harness_new();
	uint64_t w_v1, w_none, w_v2, w_late, ds, job, c;
	cwi_msg_worker_heartbeat_reply wr;

	w_v1 = add_fn_worker(h, "tcp://v1:1", "1.0", HASH_V1);
	w_none = add_fn_worker(h, "tcp://none:1", NULL, NULL);
	w_v2 = add_fn_worker(h, "tcp://v2:1", "2.0", HASH_V2);
	ck_assert(has_event(h, "\"event\":\"worker_registered\",\"worker_id\":1,"
			       "\"address\":\"tcp://v1:1\",\"cores\":4,"
			       "\"functions\":2}"));
	ds = add_fn_dataset(h, 11, "1.0", HASH_V1);
	join(h, ds, NULL, &job, &c);
	ck_assert_uint_ne(task_of(h, w_v1, job, NULL), 0);
	ck_assert_uint_eq(task_of(h, w_none, job, NULL), 0);
	ck_assert_uint_eq(task_of(h, w_v2, job, NULL), 0);
	ck_assert(has_event(h, "\"event\":\"job_target\",\"job_id\":1,"
			       "\"workers\":1}"));
	/* Their heartbeats bring them nothing; a later worker with the
	 * same build gets a task at once. */
	worker_hb(h, w_none, NULL, 0, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 0);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	worker_hb(h, w_v2, NULL, 0, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 0);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	w_late = add_fn_worker(h, "tcp://late:1", "1.0", HASH_V1);
	ck_assert_uint_ne(task_of(h, w_late, job, NULL), 0);
	ck_assert_uint_eq(task_of(h, w_none, job, NULL), 0);
	/* A job of built-in functions runs everywhere. */
	join(h, add_dataset(h, 12, 40, NULL), NULL, &job, &c);
	ck_assert_uint_ne(task_of(h, w_none, job, NULL), 0);
	ck_assert_uint_ne(task_of(h, w_v2, job, NULL), 0);
	harness_free(h);
}
END_TEST

/* A new job that no live worker can run is refused before any work, with
 * CACHEW_ENOTSUP naming the function, its plugin build and each worker
 * with what it has instead; with no live worker yet (a pool starting)
 * the job is accepted and waits. */
START_TEST(test_dispatcher_refuses_a_job_no_worker_can_run)
{
	harness *h = harness_new();
	cwi_msg_job_get_or_create_reply rep;
	uint64_t ds, job, c;

	ds = add_fn_dataset(h, 21, "1.0", HASH_V1);
	join(h, ds, NULL, &job, &c);
	ck_assert_uint_eq(job_status(h, job).tasks, 0);
	(void)add_fn_worker(h, "tcp://none:1", NULL, NULL);
	(void)add_fn_worker(h, "tcp://v2:1", "2.0", HASH_V2);
	ck_assert_uint_eq(job_status(h, job).tasks, 0);
	ck_assert_int_eq(try_join(h, ds, NULL, &rep), CACHEW_ENOTSUP);
	ck_assert_str_eq(cachew_errmsg(), "no worker can run dataset 1, which "
	    "needs function 'square' of plugin plugin_example 1.0 (build "
	    "0123456789abcdef): worker 1 (tcp://none:1) lacks it (has no "
	    "'square'); worker 2 (tcp://v2:1) lacks it (has plugin "
	    "plugin_example 2.0, build fedcba9876543210). Start workers with "
	    "the same plugin files (cachewd --plugin)");
	/* The same version rebuilt is another build. */
	(void)add_fn_worker(h, "tcp://v1:1", "1.0", HASH_V1);
	ds = add_fn_dataset(h, 22, "1.0", HASH_V2);
	ck_assert_int_eq(try_join(h, ds, NULL, &rep), CACHEW_ENOTSUP);
	ck_assert_msg(strstr(cachew_errmsg(), "worker 3 (tcp://v1:1) lacks it "
			  "(has plugin plugin_example 1.0, build "
			  "0123456789abcdef)") != NULL, "%s", cachew_errmsg());
	harness_free(h);
}
END_TEST

/* What workers report and graphs name is checked: a malformed function
 * is EINVAL naming it, a graph that does not decode EPARSE. */
START_TEST(test_dispatcher_checks_reported_functions_and_graphs)
{
	harness *h = harness_new();
	cwi_msg_worker_register req = {0};
	cwi_msg_worker_register_reply rep;
	cwi_fn_info bad = {"square", "plugin_example", "1.0", "XYZ"};
	uint8_t junk[4] = {0x81, 0xa1, 'x', 0x01};
	cwi_msg_dataset_register dr = {{5, 5}, junk, 4, 3, true};
	cwi_msg_dataset_register_reply drr;

	req.address = "tcp://w:1";
	req.cores = 1;
	req.functions = &bad;
	req.nfunctions = 1;
	ck_assert_int_eq(cwi_dispatcher_worker_register(h->d, h->now, &req,
			     &rep), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "worker_register: functions[0] "
	    "('square'): plugin_hash is not 32 lowercase hex digits");
	ck_assert_int_eq(cwi_dispatcher_dataset_register(h->d, h->now, &dr,
			     &drr), CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(), "dataset_register: graph: the graph "
	    "map lacks the key 'format'");
	harness_free(h);
}
END_TEST

/* A dataset is reused for the same fingerprint only with the same graph:
 * graphs differing in what the fingerprint leaves out (a cache_put root,
 * a tfrecord_write path) are two datasets, so that one tenant's job never
 * runs another's graph. */
START_TEST(test_dispatcher_dataset_reuse_needs_the_same_graph)
{
	harness *h = harness_new();
	uint8_t *other = malloc(cwt_range3_graph_len);
	cwi_msg_dataset_register req = {{7, 21}, NULL, cwt_range3_graph_len,
	    3, true};
	cwi_msg_dataset_register_reply rep;
	uint8_t *stop;
	uint64_t a;

	ck_assert_ptr_nonnull(other);
	memcpy(other, cwt_range3_graph, cwt_range3_graph_len);
	stop = memmem(other, cwt_range3_graph_len, "stop\x03", 5);
	ck_assert_ptr_nonnull(stop);
	stop[4] = 4; /* range(4), registered with the same fingerprint */
	a = add_dataset(h, 7, 3, NULL);
	req.graph = other;
	ck_assert_int_eq(cwi_dispatcher_dataset_register(h->d, h->now, &req,
			     &rep), CACHEW_OK);
	ck_assert(rep.created);
	ck_assert_uint_ne(rep.dataset_id, a);
	/* The same bytes again: the same dataset. */
	ck_assert_uint_eq(add_dataset(h, 7, 3, NULL), a);
	free(other);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_worker_added_mid_epoch_gets_splits)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, w2, t2;
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_client_heartbeat_reply cr;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c);
	ck_assert_int_eq(lease(h, w1, task_of(h, w1, job, NULL), 4, &l),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	w2 = add_worker(h, "tcp://w2:1");
	/* Its first heartbeat brings the task, graph included. */
	worker_hb(h, w2, NULL, 0, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 1);
	t2 = wr.start[0].task_id;
	ck_assert_uint_eq(wr.start[0].job_id, job);
	ck_assert_uint_eq(wr.start[0].graph_len, cwt_range3_graph_len);
	ck_assert_uint_eq(wr.start[0].fingerprint.lo, 3);
	ck_assert_uint_eq(wr.start[0].lease_size, 4);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	/* Reported, it is not sent again. */
	worker_hb(h, w2, &t2, 1, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 0);
	ck_assert_uint_eq(wr.nstop, 0);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	/* Half of the four left: a fair share. */
	ck_assert_int_eq(lease(h, w2, t2, 4, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 2);
	ck_assert_uint_eq(l.splits[0].split_id, 4);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	client_hb(h, job, c, 0, &cr);
	ck_assert_uint_eq(cr.ntasks, 2);
	ck_assert_str_eq(cr.tasks[1].address, "tcp://w2:1");
	ck_assert_uint_eq(cr.tasks[1].task_id, t2);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_job_ends_when_clients_release)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c1, c2, w1, t1, j2;
	job_opts named = {.name = "shared"};
	cwi_msg_job_release rel;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_split_lease_reply l;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, &named, &job, &c1);
	join(h, ds, &named, &j2, &c2);
	ck_assert_uint_eq(job, j2);
	t1 = task_of(h, w1, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 2, &l), CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	rel = (cwi_msg_job_release){.job_id = job, .client_id = c1};
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	ck_assert(!job_status(h, job).finished);
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(), "client 1 is not in job 1 "
					  "(released or timed out)");
	rel.client_id = c2;
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	ck_assert(job_status(h, job).finished);
	ck_assert(has_event(h, "\"event\":\"job_finished\",\"job_id\":1,"
			       "\"reason\":\"released\"}"));
	/* The worker is told to stop the task, and is free again. */
	worker_hb(h, w1, &t1, 1, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstop, 1);
	ck_assert_uint_eq(wr.stop[0], t1);
	ck_assert_uint_eq(wr.nstart, 0);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	/* The name is free for a new job. */
	join(h, ds, &named, &j2, &c2);
	ck_assert_uint_ne(j2, job);
	harness_free(h);
}
END_TEST

/* A dataset no job refers to any more is dropped once it has not been
 * used for a client timeout (a long-running process building many
 * pipelines keeps only those in use); one in use stays. */
START_TEST(test_dispatcher_unused_datasets_are_dropped)
{
	harness *h = harness_new();
	uint64_t a = add_dataset(h, 1, 64, NULL), b = add_dataset(h, 2, 64,
	    NULL), job, c, jb, cb, w;
	cwi_msg_job_release rel;
	cwi_msg_job_get_or_create_reply rep;
	cwi_msg_client_heartbeat_reply cr;
	bool created = false;

	w = add_worker(h, "tcp://w1:1");
	(void)w;
	join(h, a, NULL, &job, &c);
	join(h, b, NULL, &jb, &cb);
	rel = (cwi_msg_job_release){.job_id = job, .client_id = c};
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	/* Past the timeout, with more finished jobs than are kept: job 1
	 * goes, then its dataset; b's job (its client heartbeats) stays. */
	for (int i = 0; i < 20; i++) {
		uint64_t jx, cx;
		uint64_t x = add_dataset(h, 100 + (uint64_t)i, 64, NULL);
		join(h, x, NULL, &jx, &cx);
		rel = (cwi_msg_job_release){.job_id = jx, .client_id = cx};
		ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
		    CACHEW_OK);
	}
	h->now += 11 * SEC;
	client_hb(h, jb, cb, 0, &cr);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	cwi_dispatcher_tick(h->d, h->now);
	ck_assert(has_event(h, "\"event\":\"dataset_dropped\",\"dataset_id\":1}"));
	ck_assert(!has_event(h, "\"event\":\"dataset_dropped\",\"dataset_id\":2}"));
	ck_assert_int_eq(try_join(h, a, NULL, &rep), CACHEW_ENOENT);
	/* Registering it again works (a new id). */
	ck_assert_uint_ne(add_dataset(h, 1, 64, &created), a);
	ck_assert(created);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_job_ends_when_clients_time_out)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c1, job2, c2, w1;
	cwi_msg_client_heartbeat_reply cr;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_client_heartbeat req = {0};

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c1);
	join(h, ds, NULL, &job2, &c2);
	for (int i = 0; i < 4; i++) {
		h->now += 4 * SEC;
		worker_hb(h, w1, NULL, 0, NULL, 0, &wr);
		cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
		client_hb(h, job2, c2, 0, &cr);
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
		cwi_dispatcher_tick(h->d, h->now);
	}
	ck_assert(job_status(h, job).finished);
	ck_assert(!job_status(h, job2).finished);
	ck_assert(has_event(h, "\"event\":\"client_timed_out\",\"job_id\":1,"
			       "\"client_id\":1}"));
	ck_assert(has_event(h, "\"event\":\"job_finished\",\"job_id\":1,"
			       "\"reason\":\"timed_out\"}"));
	req.job_id = job;
	req.client_id = c1;
	ck_assert_int_eq(cwi_dispatcher_client_heartbeat(h->d, h->now, &req,
			     &cr),
	    CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(), "job 1 is not running");
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	/* The worker kept only the live job's task. */
	ck_assert_uint_eq(task_of(h, w1, job, NULL), 0);
	ck_assert_uint_ne(task_of(h, w1, job2, NULL), 0);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_shared_job_client_leaving_returns_delivered_splits)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 8, NULL), job, c1, c2, w1, t1;
	job_opts named = {.name = "shared"};
	cwi_msg_worker_heartbeat req = {0};
	cwi_msg_worker_heartbeat_reply wr;
	cwi_task_report tr = {0};
	cwi_msg_split_lease_reply l;
	cwi_msg_job_release rel;
	uint64_t delivered[2] = {0, 1};

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, &named, &job, &c1);
	join(h, ds, &named, &job, &c2);
	t1 = task_of(h, w1, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 4, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 4);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* The worker sent splits 0 and 1 out; nobody acknowledged them. */
	tr.task_id = t1;
	tr.splits_delivered = delivered;
	tr.nsplits_delivered = 2;
	tr.elements = 10;
	req.worker_id = w1;
	req.tasks = &tr;
	req.ntasks = 1;
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &wr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	ack(h, job, c2, &delivered[1], 1);
	/* c1 leaves: split 0 may have been in its buffer. */
	rel = (cwi_msg_job_release){.job_id = job, .client_id = c1,
	    .elements_received = 4};
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	ck_assert(has_event(h, "\"event\":\"split_released\",\"job_id\":1,"
			       "\"reason\":\"client_left\",\"splits\":[0]}"));
	ck_assert_uint_eq(job_status(h, job).splits_pending, 5);
	ck_assert_uint_eq(job_status(h, job).elements, 4);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_draining_worker_finishes_then_goes)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, w2, t1;
	cwi_msg_worker_heartbeat req = {0};
	cwi_msg_worker_heartbeat_reply wr;
	cwi_task_report tr = {0};
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_deregister dr;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 2, &l), CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	w2 = add_worker(h, "tcp://w2:1");
	/* SIGTERM on w1: it drains. */
	tr.task_id = t1;
	req.worker_id = w1;
	req.draining = true;
	req.tasks = &tr;
	req.ntasks = 1;
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &wr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	ck_assert(has_event(h, "\"event\":\"worker_draining\",\"worker_id\":1}"));
	ck_assert_int_eq(lease(h, w1, t1, 2, &l), CACHEW_OK);
	ck_assert(l.end_of_splits);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	/* It delivered both splits; they are acknowledged; it is done. */
	ack(h, job, c, (uint64_t[]){0, 1}, 2);
	ck_assert_uint_eq(task_of(h, w1, job, NULL), 0);
	ck_assert_uint_ne(task_of(h, w2, job, NULL), 0);
	dr.worker_id = w1;
	ck_assert_int_eq(cwi_dispatcher_worker_deregister(h->d, h->now, &dr),
	    CACHEW_OK);
	ck_assert(has_event(h, "\"event\":\"worker_deregistered\","
			       "\"worker_id\":1}"));
	ck_assert_uint_eq(job_status(h, job).splits_pending, 6);
	harness_free(h);
}
END_TEST

/* A draining worker sends its last splits, reports them delivered and its
 * task done, and deregisters before the client's acknowledgements arrive
 * (a slow client): the splits are not leased again, or their elements
 * would come twice; the acknowledgements then complete them. */
START_TEST(test_dispatcher_deregistered_worker_leaves_delivered_splits_to_acks)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, w2, t1, t2;
	uint64_t ids[2];
	cwi_msg_worker_heartbeat req = {0};
	cwi_msg_worker_heartbeat_reply wr;
	cwi_task_report tr = {0};
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_deregister dr;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 2, &l), CACHEW_OK);
	ck_assert_uint_eq(l.nsplits, 2);
	ids[0] = l.splits[0].split_id;
	ids[1] = l.splits[1].split_id;
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	w2 = add_worker(h, "tcp://w2:1");
	tr.task_id = t1;
	tr.done = true;
	tr.splits_delivered = ids;
	tr.nsplits_delivered = 2;
	req.worker_id = w1;
	req.draining = true;
	req.tasks = &tr;
	req.ntasks = 1;
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &wr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	dr.worker_id = w1;
	ck_assert_int_eq(cwi_dispatcher_worker_deregister(h->d, h->now, &dr),
	    CACHEW_OK);
	ck_assert(!has_event(h, "\"event\":\"split_released\""));
	ck_assert_uint_eq(job_status(h, job).splits_leased, 2);
	/* The other worker's task leases everything else, not those two. */
	t2 = task_of(h, w2, job, NULL);
	ck_assert_uint_ne(t2, 0);
	ck_assert_int_eq(lease(h, w2, t2, 64, &l), CACHEW_OK);
	for (size_t i = 0; i < l.nsplits; i++)
		ck_assert(l.splits[i].split_id != ids[0] &&
		    l.splits[i].split_id != ids[1]);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	ack(h, job, c, ids, 2);
	ck_assert_uint_eq(job_status(h, job).splits_acked, 2);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_restarted_worker_replaces_old_one)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, w1b;
	cwi_msg_split_lease_reply l;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, NULL, &job, &c);
	ck_assert_int_eq(lease(h, w1, task_of(h, w1, job, NULL), 3, &l),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	w1b = add_worker(h, "tcp://w1:1");
	ck_assert_uint_ne(w1, w1b);
	ck_assert(has_event(h, "\"event\":\"worker_dead\",\"worker_id\":1,"
			       "\"reason\":\"replaced\"}"));
	ck_assert_uint_eq(job_status(h, job).splits_pending, 8);
	ck_assert_uint_ne(task_of(h, w1b, job, NULL), 0);
	harness_free(h);
}
END_TEST

/* The live workers, from the status. */
static size_t
live_workers(harness *h)
{
	cwi_msg_status_reply st;
	size_t n;

	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	n = st.nworkers;
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	return n;
}

/* Registrations find the worker they replace through an address index:
 * it follows workers that leave and come back, grows past its first size,
 * and is rebuilt after a snapshot load replaced the workers whole. */
START_TEST(test_dispatcher_worker_addresses_stay_indexed)
{
	harness *h = harness_new(), *h2;
	cwi_msg_worker_deregister dr = {0};
	uint64_t ids[300];
	char addr[64];
	uint8_t *snap;
	size_t len;

	for (int i = 0; i < 300; i++) {
		snprintf(addr, sizeof(addr), "tcp://w%d:1", i);
		ids[i] = add_worker(h, addr);
	}
	for (int i = 0; i < 300; i += 3) {
		dr.worker_id = ids[i];
		ck_assert_int_eq(cwi_dispatcher_worker_deregister(h->d, h->now,
				     &dr),
		    CACHEW_OK);
	}
	ck_assert_uint_eq(live_workers(h), 200);
	/* Every address again: the 200 live ones are replaced, the 100 that
	 * left are new. */
	for (int i = 0; i < 300; i++) {
		snprintf(addr, sizeof(addr), "tcp://w%d:1", i);
		(void)add_worker(h, addr);
	}
	ck_assert_uint_eq(live_workers(h), 300);
	ck_assert(has_event(h, "\"worker_id\":2,\"reason\":\"replaced\""));
	ck_assert(!has_event(h, "\"worker_id\":1,\"reason\":\"replaced\""));
	/* A dispatcher loaded from a snapshot replaces the same workers. */
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(h->d, &snap, &len),
	    CACHEW_OK);
	h2 = harness_new();
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(h2->d, snap, len),
	    CACHEW_OK);
	free(snap);
	ck_assert_uint_eq(live_workers(h2), 300);
	for (int i = 0; i < 300; i += 2) {
		snprintf(addr, sizeof(addr), "tcp://w%d:1", i);
		(void)add_worker(h2, addr);
	}
	ck_assert_uint_eq(live_workers(h2), 300);
	(void)add_worker(h2, "tcp://w300:1");
	ck_assert_uint_eq(live_workers(h2), 301);
	harness_free(h2);
	harness_free(h);
}
END_TEST

/* Each worker's tasks, in id order, from the status (at most cap). */
static size_t
tasks_of_worker(harness *h, uint64_t wid, uint64_t *ids, size_t cap)
{
	cwi_msg_status_reply st;
	size_t n = 0;

	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	for (size_t i = 0; i < st.ntasks; i++)
		if (st.tasks[i].worker_id == wid && n < cap)
			ids[n++] = st.tasks[i].task_id;
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	return n;
}

/* A heartbeat reporting nothing is told to start exactly the worker's
 * tasks, in id order; one reporting them all and an unknown id is told
 * to start none and to stop the unknown one. */
static void
check_worker_lists(harness *h, uint64_t wid)
{
	uint64_t want[400], rep_ids[401];
	size_t n = tasks_of_worker(h, wid, want, 400);
	cwi_msg_worker_heartbeat_reply wr;

	worker_hb(h, wid, NULL, 0, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, n);
	ck_assert_uint_eq(wr.nstop, 0);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(wr.start[i].task_id, want[i]);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	memcpy(rep_ids, want, n * sizeof(*want));
	rep_ids[n] = 999999;
	worker_hb(h, wid, rep_ids, n + 1, NULL, 0, &wr);
	ck_assert_uint_eq(wr.nstart, 0);
	ck_assert_uint_eq(wr.nstop, 1);
	ck_assert_uint_eq(wr.stop[0], 999999);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
}

/* Jobs, tasks and workers are found by id, and each job and worker keeps
 * its own tasks: after jobs end out of order and a worker leaves, every
 * client's task list and every worker's heartbeat reply name exactly
 * the tasks the status shows, in id order, also after a snapshot. */
START_TEST(test_dispatcher_many_jobs_keep_their_own_tasks)
{
	harness *h = harness_new(), *h2 = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), w[3], job[300], c[300];
	job_opts one = {.fixed_workers = 1};
	cwi_msg_client_heartbeat_reply cr;
	cwi_msg_worker_deregister dr = {0};
	uint8_t *snap;
	size_t len;

	for (size_t i = 0; i < 3; i++) {
		char addr[32];
		snprintf(addr, sizeof(addr), "tcp://w%zu:1", i);
		w[i] = add_worker(h, addr);
	}
	for (size_t i = 0; i < 300; i++)
		join(h, ds, &one, &job[i], &c[i]);
	for (size_t i = 0; i < 300; i += 3) {
		cwi_msg_job_release rel = {.job_id = job[i], .client_id = c[i]};
		ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
		    CACHEW_OK);
	}
	dr.worker_id = w[1];
	ck_assert_int_eq(cwi_dispatcher_worker_deregister(h->d, h->now, &dr),
	    CACHEW_OK);
	for (size_t i = 1; i < 300; i++) {
		if (i % 3 == 0)
			continue;
		client_hb(h, job[i], c[i], 0, &cr);
		ck_assert_uint_eq(cr.ntasks, 1);
		ck_assert_uint_eq(cr.tasks[0].task_id,
		    task_of(h, cr.tasks[0].worker_id, job[i], NULL));
		ck_assert_uint_ne(cr.tasks[0].worker_id, w[1]);
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	}
	check_worker_lists(h, w[0]);
	check_worker_lists(h, w[2]);
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(h->d, &snap, &len),
	    CACHEW_OK);
	cwi_dispatcher_destroy(h2->d);
	ck_assert_int_eq(cwi_dispatcher_create(&h2->d, cwi_dispatcher_config_of(
	    h->d)), CACHEW_OK);
	ck_assert_msg(cwi_dispatcher_snapshot_load(h2->d, snap, len) ==
	    CACHEW_OK, "%s", cachew_errmsg());
	free(snap);
	h2->now = h->now;
	check_worker_lists(h2, w[0]);
	check_worker_lists(h2, w[2]);
	harness_free(h2);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_parallel_epochs_tasks_read_everything)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, -1, NULL), job, c, w1, w2, t1, t2;
	job_opts o = {.mode = CWI_MODE_PARALLEL_EPOCHS};
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_client_heartbeat_reply cr;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, &o, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	t2 = task_of(h, w2, job, NULL);
	ck_assert_int_eq(lease(h, w1, t1, 2, &l), CACHEW_EINVAL);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	worker_hb(h, w1, &t1, 1, &t1, 1, &wr);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	client_hb(h, job, c, 0, &cr);
	ck_assert(!cr.job_finished);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	/* A worker arriving now would read the whole input again: no. */
	add_worker(h, "tcp://w3:1");
	ck_assert_uint_eq(job_status(h, job).tasks, 1);
	worker_hb(h, w2, &t2, 1, &t2, 1, &wr);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	client_hb(h, job, c, 0, &cr);
	ck_assert(cr.job_finished);
	ck_assert_uint_eq(cr.ntasks, 0);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_fixed_worker_count)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c;
	job_opts o = {.fixed_workers = 2};

	for (int i = 0; i < 4; i++) {
		char addr[32];
		snprintf(addr, sizeof(addr), "tcp://w%d:1", i);
		add_worker(h, addr);
	}
	join(h, ds, &o, &job, &c);
	ck_assert_uint_eq(job_status(h, job).tasks, 2);
	ck_assert_uint_eq(job_status(h, job).target_workers, 2);
	/* Spread: a second job goes to the two idle workers. */
	join(h, ds, &o, &job, &c);
	ck_assert_uint_ne(task_of(h, 3, job, NULL), 0);
	ck_assert_uint_ne(task_of(h, 4, job, NULL), 0);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_coordinated_reads_schedule)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c0, c1, w1, w2, w3;
	job_opts o = {.name = "sync", .num_consumers = 2, .consumer_index = 0};
	cwi_msg_client_heartbeat_reply r0, r1;
	uint64_t tid;

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, &o, &job, &c0);
	o.consumer_index = 1;
	join(h, ds, &o, &job, &c1);
	/* Both tasks serve from round 0: round r from task r mod 2. */
	client_hb(h, job, c0, 0, &r0);
	ck_assert_uint_eq(r0.ntasks, 2);
	ck_assert_uint_eq(r0.tasks[0].start_round, 0);
	ck_assert_uint_eq(r0.tasks[1].start_round, 0);
	ck_assert_uint_eq(r0.block_round, CWI_ROUND_NONE);
	for (uint64_t r = 0; r < 4; r++) {
		ck_assert_int_eq(cwi_coord_round_task(r0.tasks, r0.ntasks, r,
				     &tid),
		    CACHEW_OK);
		ck_assert_uint_eq(tid, r0.tasks[r % 2].task_id);
	}
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r0);
	/* Consumers are at rounds 40 and 42 when a third worker comes: its
	 * task starts at a round announced first, 42 + 16. */
	client_hb(h, job, c0, 40, &r0);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r0);
	client_hb(h, job, c1, 42, &r1);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r1);
	w3 = add_worker(h, "tcp://w3:1");
	ck_assert(has_event(h, "\"event\":\"schedule_change_announced\","
			       "\"job_id\":1,\"round\":58}"));
	client_hb(h, job, c0, 41, &r0);
	ck_assert_uint_eq(r0.block_round, 58);
	ck_assert_uint_eq(r0.ntasks, 3);
	ck_assert_int_eq(r0.tasks[2].state, CWI_TASK_STARTING);
	ck_assert_uint_eq(r0.tasks[2].start_round, CWI_ROUND_NONE);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r0);
	client_hb(h, job, c1, 43, &r1);
	ck_assert_uint_eq(r1.block_round, 58);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r1);
	client_hb(h, job, c0, 45, &r0); /* acknowledged */
	ck_assert_uint_eq(r0.block_round, 58);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r0);
	client_hb(h, job, c1, 47, &r1); /* the last one: committed */
	ck_assert_uint_eq(r1.block_round, CWI_ROUND_NONE);
	ck_assert_int_eq(r1.tasks[2].state, CWI_TASK_ACTIVE);
	ck_assert_uint_eq(r1.tasks[2].start_round, 58);
	ck_assert(has_event(h, "\"event\":\"schedule_changed\",\"job_id\":1,"
			       "\"round\":58,\"started\":[3],\"ended\":[]}"));
	/* Rounds before 58 alternate over two tasks, then over three. */
	ck_assert_int_eq(cwi_coord_round_task(r1.tasks, 3, 57, &tid), CACHEW_OK);
	ck_assert_uint_eq(tid, r1.tasks[1].task_id);
	ck_assert_int_eq(cwi_coord_round_task(r1.tasks, 3, 58, &tid), CACHEW_OK);
	ck_assert_uint_eq(tid, r1.tasks[1].task_id); /* 58 mod 3 = 1 */
	ck_assert_int_eq(cwi_coord_round_task(r1.tasks, 3, 59, &tid), CACHEW_OK);
	ck_assert_uint_eq(tid, task_of(h, w3, job, NULL));
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r1);
	(void)w1;
	(void)w2;
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_coordinated_change_moves_when_a_consumer_passed_it)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c0, c1;
	job_opts o = {.name = "sync", .num_consumers = 2, .consumer_index = 0};
	cwi_msg_client_heartbeat_reply r;

	add_worker(h, "tcp://w1:1");
	join(h, ds, &o, &job, &c0);
	o.consumer_index = 1;
	join(h, ds, &o, &job, &c1);
	client_hb(h, job, c0, 0, &r);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r);
	add_worker(h, "tcp://w2:1"); /* announced for round 16 */
	client_hb(h, job, c1, 20, &r); /* never heard of it, already past */
	ck_assert_uint_eq(r.block_round, 36);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r);
	ck_assert(has_event(h, "\"event\":\"schedule_change_announced\","
			       "\"job_id\":1,\"round\":36}"));
	/* A round no consumer reaches would wrap the target: refused. */
	{
		cwi_msg_client_heartbeat req = {.job_id = job,
		    .client_id = c1, .round = UINT64_MAX - 3};
		ck_assert_int_eq(cwi_dispatcher_client_heartbeat(h->d, h->now,
				     &req, &r), CACHEW_EPROTO);
		ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "round"));
		cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &r);
	}
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_status_reports_progress_and_rates)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, t1;
	cwi_msg_worker_heartbeat req = {0};
	cwi_msg_worker_heartbeat_reply wr;
	cwi_op_counters op = {"map#1", 1000, 8000, 5 * MS, MS, 12, NULL, 0, 0, 0,
	    0, 0};
	cwi_task_report tr = {0};
	cwi_msg_status_reply st;
	const cwi_op_counters *ops;
	size_t nops;
	cwi_job_status js;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, &(job_opts){.name = "train"}, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	tr.task_id = t1;
	req.worker_id = w1;
	req.tasks = &tr;
	req.ntasks = 1;
	req.cpu_use = 3.5;
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &wr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	/* One second later it delivered 1000 elements, 8000 bytes. */
	h->now += SEC;
	tr.elements = 1000;
	tr.bytes = 8000;
	tr.ops = &op;
	tr.nops = 1;
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &wr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	/* Its client took 990 of them (the job's counts are its clients'). */
	cwi_msg_client_heartbeat ch = {.job_id = job, .client_id = c,
	    .elements_received = 990, .bytes_received = 7920};
	cwi_msg_client_heartbeat_reply chr;
	ck_assert_int_eq(cwi_dispatcher_client_heartbeat(h->d, h->now, &ch,
			     &chr),
	    CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &chr);
	h->now += 250 * MS;
	js = job_status(h, job);
	ck_assert_uint_eq(js.elements, 990);
	ck_assert_uint_eq(js.bytes, 7920);
	ck_assert(js.elements_per_s == 1000.0);
	ck_assert(js.bytes_per_s == 8000.0);
	ck_assert_uint_eq(js.target_workers, 1);
	ck_assert_uint_eq(js.splits_total, 8);
	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	ck_assert_uint_eq(st.time_ns, h->now);
	ck_assert_uint_eq(st.nworkers, 1);
	ck_assert_str_eq(st.workers[0].address, "tcp://w1:1");
	ck_assert_uint_eq(st.workers[0].heartbeat_age_ms, 250);
	ck_assert(st.workers[0].cpu_use == 3.5);
	ck_assert_uint_eq(st.workers[0].tasks, 1);
	ck_assert_str_eq(st.jobs[0].name, "train");
	ck_assert_uint_eq(st.ndatasets, 1);
	ck_assert_int_eq(st.datasets[0].split_units, 64);
	ck_assert_uint_eq(st.ntasks, 1);
	ck_assert_uint_eq(st.tasks[0].elements, 1000);
	ck_assert(st.tasks[0].elements_per_s == 1000.0);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	/* The policy engine's input: the last reported counters. */
	ck_assert_int_eq(cwi_dispatcher_task_ops(h->d, t1, &ops, &nops),
	    CACHEW_OK);
	ck_assert_uint_eq(nops, 1);
	ck_assert_str_eq(ops[0].name, "map#1");
	ck_assert_uint_eq(ops[0].buffered, 12);
	harness_free(h);
}
END_TEST

/* A heartbeat of worker wid that reports one task, as tr says. */
static void
report_task(harness *h, uint64_t wid, cwi_task_report *tr)
{
	cwi_msg_worker_heartbeat req = {.worker_id = wid, .tasks = tr,
	    .ntasks = 1};
	cwi_msg_worker_heartbeat_reply rep;

	ck_assert_msg(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &rep);
}

/* A client's cumulative counts (client_heartbeat) of what it took. */
static void
client_counts(harness *h, uint64_t job, uint64_t client, uint64_t elements,
    uint64_t bytes)
{
	cwi_msg_client_heartbeat req = {.job_id = job, .client_id = client,
	    .elements_received = elements, .bytes_received = bytes};
	cwi_msg_client_heartbeat_reply rep;

	ck_assert_msg(cwi_dispatcher_client_heartbeat(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep);
}

/* A job's elements and bytes are what its clients took, as they last
 * said (a heartbeat that says less, sent before the one answered first,
 * changes nothing), and exact with their releases: not what the workers
 * delivered, which counts a replay the clients skipped. */
START_TEST(test_dispatcher_job_counts_are_what_its_clients_received)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c1, c2, w1;
	job_opts named = {.name = "shared"};
	cwi_task_report tr = {0};
	cwi_msg_job_release rel;
	cwi_job_status js;

	w1 = add_worker(h, "tcp://w1:1");
	join(h, ds, &named, &job, &c1);
	join(h, ds, &named, &job, &c2);
	tr.task_id = task_of(h, w1, job, NULL);
	tr.elements = 5000;
	tr.bytes = 40000;
	report_task(h, w1, &tr);
	client_counts(h, job, c1, 100, 800);
	client_counts(h, job, c1, 60, 480);
	client_counts(h, job, c2, 30, 240);
	js = job_status(h, job);
	ck_assert_uint_eq(js.elements, 130);
	ck_assert_uint_eq(js.bytes, 1040);
	rel = (cwi_msg_job_release){.job_id = job, .client_id = c1,
	    .elements_received = 1200, .bytes_received = 9600};
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	rel = (cwi_msg_job_release){.job_id = job, .client_id = c2,
	    .elements_received = 800, .bytes_received = 6400};
	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &rel),
	    CACHEW_OK);
	js = job_status(h, job);
	ck_assert(js.finished);
	ck_assert_uint_eq(js.elements, 2000);
	ck_assert_uint_eq(js.bytes, 16000);
	harness_free(h);
}
END_TEST

/* A task's counters at a lease's end (task_counters). */
static cachew_err
task_counters(harness *h, uint64_t wid, uint64_t tid, uint64_t leases,
    cwi_op_counters *ops, size_t nops)
{
	cwi_msg_task_counters req = {.worker_id = wid, .task_id = tid,
	    .ops_leases = leases, .ops = ops, .nops = nops};

	return cwi_dispatcher_task_counters(h->d, h->now, &req);
}

/* The job's operator rows in a client's heartbeat reply sum every task's
 * by name, those dropped included (a done task's rows stay, what it held
 * does not), and keep a task's newest counters: a heartbeat counting fewer
 * leases than a task_counters already received changes nothing. */
START_TEST(test_dispatcher_job_rows_sum_every_task_and_keep_the_newest)
{
	harness *h = harness_new();
	uint64_t ds = add_dataset(h, 1, 64, NULL), job, c, w1, w2, t1, t2;
	cwi_op_counters a[2] = {{.name = "0:range", .elements = 600},
	    {.name = "1:map/add", .elements = 600, .buffered = 3,
		.parallelism = 2}};
	cwi_op_counters b[2] = {{.name = "0:range", .elements = 400},
	    {.name = "1:map/add", .elements = 400, .buffered = 5,
		.parallelism = 2}};
	cwi_op_counters stale[2] = {{.name = "0:range", .elements = 300},
	    {.name = "1:map/add", .elements = 300}};
	cwi_msg_worker_heartbeat_reply wr;
	cwi_msg_client_heartbeat_reply rep;
	cwi_task_report tr = {0};

	w1 = add_worker(h, "tcp://w1:1");
	w2 = add_worker(h, "tcp://w2:1");
	join(h, ds, NULL, &job, &c);
	t1 = task_of(h, w1, job, NULL);
	t2 = task_of(h, w2, job, NULL);
	ck_assert_int_eq(task_counters(h, w1, t1, 2, a, 2), CACHEW_OK);
	ck_assert_int_eq(task_counters(h, w2, t2, 1, b, 2), CACHEW_OK);
	tr.task_id = t1;
	tr.ops = stale;
	tr.nops = 2;
	tr.ops_leases = 1;
	report_task(h, w1, &tr);
	client_hb(h, job, c, 0, &rep);
	ck_assert_uint_eq(rep.nops, 2);
	ck_assert_str_eq(rep.ops[0].name, "0:range");
	ck_assert_uint_eq(rep.ops[0].elements, 1000);
	ck_assert_str_eq(rep.ops[1].name, "1:map/add");
	ck_assert_uint_eq(rep.ops[1].elements, 1000);
	ck_assert_uint_eq(rep.ops[1].buffered, 8);
	ck_assert_int_eq(rep.ops[1].parallelism, 4);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep);
	/* t2 is done (its report has no rows: its rows stay) and goes. */
	worker_hb(h, w2, &t2, 1, &t2, 1, &wr);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
	ck_assert_uint_ne(task_of(h, w2, job, NULL), t2);
	ck_assert_int_eq(task_counters(h, w2, t2, 2, b, 2), CACHEW_ENOENT);
	ck_assert_int_eq(task_counters(h, 99, t1, 3, a, 2), CACHEW_ENOENT);
	client_hb(h, job, c, 0, &rep);
	ck_assert_uint_eq(rep.nops, 2);
	ck_assert_uint_eq(rep.ops[0].elements, 1000);
	ck_assert_uint_eq(rep.ops[1].elements, 1000);
	ck_assert_uint_eq(rep.ops[1].buffered, 3);
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_handle_replies_and_errors)
{
	harness *h = harness_new();
	cwi_pmsg req, rep;

	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = 42;
	ck_assert_int_eq(cwi_dispatcher_handle(h->d, h->now, &req, &rep),
	    CACHEW_ENOENT);
	ck_assert_int_eq(rep.type, CWI_MSG_ERROR);
	ck_assert_int_eq(rep.u.error.code, CACHEW_ENOENT);
	ck_assert_str_eq(rep.u.error.message, "worker 42 is not registered "
					      "(timed out, or the dispatcher "
					      "restarted): register again");
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(cwi_dispatcher_handle(h->d, h->now, &req, &rep),
	    CACHEW_OK);
	ck_assert_int_eq(rep.type, CWI_MSG_STATUS_REPLY);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_GET_ELEMENTS);
	ck_assert_int_eq(cwi_dispatcher_handle(h->d, h->now, &req, &rep),
	    CACHEW_EPROTO);
	ck_assert_str_eq(rep.u.error.message, "the dispatcher does not take "
					      "get_elements messages");
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_DEREGISTER);
	req.u.worker_deregister.worker_id = 1;
	add_worker(h, "tcp://w1:1");
	ck_assert_int_eq(cwi_dispatcher_handle(h->d, h->now, &req, &rep),
	    CACHEW_OK);
	ck_assert_int_eq(rep.type, CWI_MSG_OK);
	cwi_pmsg_free(&rep);
	harness_free(h);
}
END_TEST

/* A minimal JSON syntax check: one value, then the end. */
static const char *json_value(const char *p);

static const char *
json_ws(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

static const char *
json_string(const char *p)
{
	if (*p++ != '"')
		return NULL;
	while (*p != '"') {
		if ((unsigned char)*p < 0x20)
			return NULL;
		if (*p == '\\') {
			p++;
			if (*p == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!strchr("0123456789abcdefABCDEF", p[i]) ||
					    p[i] == 0)
						return NULL;
				p += 4;
			} else if (!strchr("\"\\/bfnrt", *p) || *p == 0) {
				return NULL;
			}
		}
		p++;
	}
	return p + 1;
}

static const char *
json_seq(const char *p, char close, bool object)
{
	p = json_ws(p + 1);
	if (*p == close)
		return p + 1;
	for (;;) {
		if (object) {
			p = json_string(json_ws(p));
			if (p == NULL || *(p = json_ws(p)) != ':')
				return NULL;
			p++;
		}
		p = json_value(p);
		if (p == NULL)
			return NULL;
		p = json_ws(p);
		if (*p == close)
			return p + 1;
		if (*p++ != ',')
			return NULL;
	}
}

static const char *
json_value(const char *p)
{
	p = json_ws(p);
	if (*p == '{')
		return json_seq(p, '}', true);
	if (*p == '[')
		return json_seq(p, ']', false);
	if (*p == '"')
		return json_string(p);
	if (strncmp(p, "true", 4) == 0 || strncmp(p, "null", 4) == 0)
		return p + 4;
	if (strncmp(p, "false", 5) == 0)
		return p + 5;
	if (*p == '-' || (*p >= '0' && *p <= '9')) {
		char *end;
		strtod(p, &end);
		return end;
	}
	return NULL;
}

START_TEST(test_dispatcher_events_are_json_lines)
{
	harness *h = harness_new();
	uint64_t ds, job, c, w1;
	cwi_msg_split_lease_reply l;
	cwi_msg_job_get_or_create req;
	cwi_msg_job_get_or_create_reply rep;
	size_t lines = 0;
	char *save = NULL, *all;

	w1 = add_worker(h, "tcp://w1:1");
	h->now = 2000;
	ds = add_dataset(h, 1, 20, NULL);
	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.job_name = "a \"quoted\"\tname";
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &rep),
	    CACHEW_OK);
	job = rep.job_id;
	c = rep.client_id;
	ck_assert_int_eq(lease(h, w1, task_of(h, w1, job, NULL), 2, &l),
	    CACHEW_OK);
	ack(h, job, c, &l.splits[0].split_id, 1);
	ack(h, job, c, &l.splits[0].split_id, 1);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	ck_assert(has_event(h, "{\"ts_ns\":1000,\"event\":\"worker_registered\","
			       "\"worker_id\":1,\"address\":\"tcp://w1:1\","
			       "\"cores\":4}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"dataset_registered\","
			       "\"dataset_id\":1,\"fingerprint\":"
			       "\"00000000000000010000000000000003\","
			       "\"split_units\":20}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"job_created\","
			       "\"job_id\":1,\"name\":\"a \\\"quoted\\\"\\u0009"
			       "name\",\"iteration\":0,\"dataset_id\":1,"
			       "\"processing_mode\":\"distributed_epoch\","
			       "\"num_consumers\":0,\"splits\":7,"
			       "\"units_per_split\":3}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"task_added\","
			       "\"task_id\":1,\"job_id\":1,\"worker_id\":1}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"split_leased\","
			       "\"task_id\":1,\"job_id\":1,\"worker_id\":1,"
			       "\"splits\":[0,1]}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"split_acked\","
			       "\"job_id\":1,\"client_id\":1,\"splits\":[0]}\n"));
	ck_assert(has_event(h, "{\"ts_ns\":2000,\"event\":\"split_acked\","
			       "\"job_id\":1,\"client_id\":1,\"splits\":[],"
			       "\"duplicates\":1}\n"));
	all = xstrdup(h->events.data);
	for (char *line = strtok_r(all, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		const char *end = json_value(line);
		ck_assert_msg(line[0] == '{' && end != NULL && *end == '\0',
		    "not a JSON object: %s", line);
		lines++;
	}
	ck_assert_uint_ge(lines, 9);
	free(all);
	harness_free(h);
}
END_TEST

START_TEST(test_dispatcher_events_to_file)
{
	cwi_dispatcher_config cfg;
	cwi_dispatcher *d;
	cwi_msg_worker_register req = {.address = "ipc:///tmp/w", .cores = 2};
	cwi_msg_worker_register_reply rep;
	char buf[256] = "";
	FILE *f = tmpfile();

	ck_assert_ptr_nonnull(f);
	cwi_dispatcher_config_default(&cfg);
	cfg.event_file = f;
	ck_assert_int_eq(cwi_dispatcher_create(&d, &cfg), CACHEW_OK);
	ck_assert_int_eq(cwi_dispatcher_worker_register(d, 5, &req, &rep),
	    CACHEW_OK);
	rewind(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
	ck_assert_str_eq(buf, "{\"ts_ns\":5,\"event\":\"worker_registered\","
			      "\"worker_id\":1,\"address\":\"ipc:///tmp/w\","
			      "\"cores\":2}\n");
	cwi_dispatcher_destroy(d);
	fclose(f);
}
END_TEST

/* A join sent again with its nonce (its reply was lost in a dispatcher
 * restart) finds the client it made: no second private job, no phantom
 * client in a shared one; another nonce is another client. */
START_TEST(test_dispatcher_join_sent_again_finds_its_client)
{
	harness *h = harness_new();
	cwi_msg_job_get_or_create req;
	cwi_msg_job_get_or_create_reply a, b, c, n1, n2;
	uint64_t ds = add_dataset(h, 6, 100, NULL);

	add_worker(h, "tcp://w:1");
	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.consumer_index = -1;
	req.nonce = 77;
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &a), CACHEW_OK);
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &b), CACHEW_OK);
	ck_assert_uint_eq(b.job_id, a.job_id);
	ck_assert_uint_eq(b.client_id, a.client_id);
	req.nonce = 78;
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &c), CACHEW_OK);
	ck_assert_uint_ne(c.job_id, a.job_id); /* another private job */
	/* A shared job: the retry is the same client, not a second one. */
	req.job_name = "shared";
	req.nonce = 90;
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &n1), CACHEW_OK);
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &n2), CACHEW_OK);
	ck_assert_uint_eq(n2.client_id, n1.client_id);
	ck_assert_uint_eq(job_status(h, n1.job_id).clients, 1);
	harness_free(h);
}
END_TEST

/* Exactly once: a lease request sent again (its reply was lost, the
 * dispatcher restarted) gets the group it got, not a second one that
 * would orphan the first; the next request number gets the next group. */
START_TEST(test_dispatcher_lease_request_sent_again_gets_the_same_group)
{
	harness *h = harness_new();
	cwi_msg_job_get_or_create req;
	cwi_msg_job_get_or_create_reply jr;
	cwi_msg_worker_heartbeat_reply hr;
	cwi_msg_split_lease lr = {0};
	cwi_msg_split_lease_reply a, b, c;
	uint64_t wid = add_worker(h, "tcp://w:1"), ds, tid;

	ds = add_dataset(h, 5, 100, NULL);
	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.consumer_index = -1;
	req.exactly_once = true;
	ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now, &req,
			     &jr), CACHEW_OK);
	worker_hb(h, wid, NULL, 0, NULL, 0, &hr);
	ck_assert_uint_eq(hr.nstart, 1);
	tid = hr.start[0].task_id;
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &hr);
	lr.worker_id = wid;
	lr.task_id = tid;
	lr.max_splits = 1;
	lr.seq = 1;
	ck_assert_int_eq(cwi_dispatcher_split_lease(h->d, h->now, &lr, &a),
	    CACHEW_OK);
	ck_assert_uint_eq(a.nsplits, 1);
	ck_assert_int_eq(cwi_dispatcher_split_lease(h->d, h->now, &lr, &b),
	    CACHEW_OK);
	ck_assert_uint_eq(b.nsplits, 1);
	ck_assert_uint_eq(b.group, a.group);
	ck_assert_uint_eq(b.splits[0].split_id, a.splits[0].split_id);
	ck_assert_uint_eq(b.splits[0].lease, a.splits[0].lease);
	ck_assert(has_event(h, "split_lease_repeated"));
	ck_assert_uint_eq(job_status(h, jr.job_id).splits_leased, 1);
	lr.seq = 2;
	ck_assert_int_eq(cwi_dispatcher_split_lease(h->d, h->now, &lr, &c),
	    CACHEW_OK);
	ck_assert_uint_eq(c.nsplits, 1);
	ck_assert_uint_ne(c.splits[0].split_id, a.splits[0].split_id);
	ck_assert_uint_eq(job_status(h, jr.job_id).splits_leased, 2);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &a);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &b);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &c);
	cwi_pmsg_body_free(CWI_MSG_JOB_GET_OR_CREATE_REPLY, &jr);
	harness_free(h);
}
END_TEST

/* A join that resumes a saved position: the dispatcher cuts the input as
 * the saved job did, acknowledges the whole groups, leases the partial
 * ones first, whole and with their received ranges as skip, then the
 * rest; a resume that does not fit is refused naming what. */
static cachew_err
resume_join(harness *h, uint64_t ds, uint64_t units, uint64_t ups,
    cwi_progress *groups, size_t n, cwi_msg_job_get_or_create_reply *rep)
{
	cwi_msg_job_get_or_create req;

	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.consumer_index = -1;
	req.exactly_once = true;
	req.resume_units = units;
	req.resume_units_per_split = ups;
	req.resume = groups;
	req.nresume = n;
	return cwi_dispatcher_job_get_or_create(h->d, h->now, &req, rep);
}

START_TEST(test_dispatcher_resume_forms_the_saved_groups)
{
	harness *h = harness_new();
	uint64_t got0[] = {0, 10}, got3[] = {0, 4, 6, 7}, bad[] = {5, 2};
	cwi_progress g[2] = {
	    {.group = 0, .ranges = got0, .nranges = 2, .ended = true,
		.total = 10, .splits = 2},
	    {.group = 3, .ranges = got3, .nranges = 4, .splits = 1}};
	cwi_msg_job_get_or_create_reply jr;
	cwi_msg_worker_heartbeat_reply hr;
	cwi_msg_split_lease lr = {0};
	cwi_msg_split_lease_reply a;
	uint64_t wid = add_worker(h, "tcp://w:1"), ds, tid;

	ds = add_dataset(h, 5, 100, NULL);
	/* The saved job cut 100 units into splits of 10. */
	ck_assert_msg(resume_join(h, ds, 100, 10, g, 2, &jr) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_uint_eq(jr.units, 100);
	ck_assert_uint_eq(jr.units_per_split, 10);
	ck_assert(has_event(h, "\"splits\":10,\"groups_done\":1,"
			       "\"groups_partial\":1,\"splits_acked\":2"));
	ck_assert(has_event(h, "\"event\":\"job_resumed\""));
	ck_assert_uint_eq(job_status(h, jr.job_id).splits_acked, 2);
	worker_hb(h, wid, NULL, 0, NULL, 0, &hr);
	tid = hr.start[0].task_id;
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &hr);
	lr.worker_id = wid;
	lr.task_id = tid;
	lr.max_splits = 1;
	lr.seq = 1;
	/* The partial group first, with what the client had as its skip. */
	ck_assert_int_eq(cwi_dispatcher_split_lease(h->d, h->now, &lr, &a),
	    CACHEW_OK);
	ck_assert_uint_eq(a.group, 3);
	ck_assert_uint_eq(a.nsplits, 1);
	ck_assert_uint_eq(a.splits[0].begin, 30);
	ck_assert_uint_eq(a.nskip, 4);
	ck_assert_uint_eq(a.skip[3], 7);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &a);
	lr.seq = 2;
	ck_assert_int_eq(cwi_dispatcher_split_lease(h->d, h->now, &lr, &a),
	    CACHEW_OK);
	ck_assert_uint_eq(a.group, 2);
	ck_assert_uint_eq(a.nskip, 0);
	cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &a);
	cwi_pmsg_body_free(CWI_MSG_JOB_GET_OR_CREATE_REPLY, &jr);

	/* What does not fit is refused, naming it. */
	ck_assert_int_eq(resume_join(h, ds, 90, 10, g, 2, &jr),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "saved over 90 split "
						      "units"));
	g[1].group = 1; /* overlaps group 0's two splits */
	ck_assert_int_eq(resume_join(h, ds, 100, 10, g, 2, &jr),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "group 1 of 1 splits"));
	g[1].group = 9;
	g[1].splits = 2; /* past the last split */
	ck_assert_int_eq(resume_join(h, ds, 100, 10, g, 2, &jr),
	    CACHEW_EINVAL);
	g[1].splits = 1;
	g[1].ranges = bad;
	g[1].nranges = 2;
	ck_assert_int_eq(resume_join(h, ds, 100, 10, g, 2, &jr),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "not ascending"));
	g[1].ranges = got3;
	g[1].nranges = 4;
	g[1].ended = true;
	g[1].total = 5; /* its ranges go to 7 */
	ck_assert_int_eq(resume_join(h, ds, 100, 10, g, 2, &jr),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "past its 5 elements"));
	/* Groups without a layout, and jobs that cannot resume. */
	ck_assert_int_eq(resume_join(h, ds, 100, 0, g, 2, &jr),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "without "
						      "resume_units_per_split"));
	{
		cwi_msg_job_get_or_create req;
		cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
		req.dataset_id = ds;
		req.consumer_index = -1;
		req.resume_units = 100;
		req.resume_units_per_split = 10;
		ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now,
				     &req, &jr), CACHEW_ENOTSUP);
		ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
		    "not exactly-once"));
		req.exactly_once = true;
		req.job_name = "shared";
		ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now,
				     &req, &jr), CACHEW_ENOTSUP);
		ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "is named"));
		req.job_name = NULL;
		req.num_consumers = 2;
		req.consumer_index = 0;
		ck_assert_int_eq(cwi_dispatcher_job_get_or_create(h->d, h->now,
				     &req, &jr), CACHEW_ENOTSUP);
		ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "coordinated"));
	}
	harness_free(h);
}
END_TEST

/* A request naming ids of another dispatcher state (a restart without
 * its journal) is refused, and the error says this dispatcher's lineage,
 * which every reply that hands out ids also carries. */
START_TEST(test_dispatcher_refuses_another_lineage)
{
	cwi_dispatcher *a, *b;
	cwi_pmsg req, rep;
	uint64_t la, lb;

	ck_assert_int_eq(cwi_dispatcher_create(&a, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_dispatcher_create(&b, NULL), CACHEW_OK);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = cwi_strdup("ipc:///tmp/w");
	req.u.worker_register.cores = 1;
	ck_assert_int_eq(cwi_dispatcher_handle(a, 1, &req, &rep), CACHEW_OK);
	la = rep.u.worker_register_reply.lineage;
	ck_assert_uint_ne(la, 0);
	cwi_pmsg_free(&rep);
	ck_assert_int_eq(cwi_dispatcher_handle(b, 1, &req, &rep), CACHEW_OK);
	lb = rep.u.worker_register_reply.lineage;
	ck_assert_uint_ne(lb, la);
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);

	/* Worker 1 exists in both; a's worker 1 is unknown to b. */
	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = 1;
	req.u.worker_heartbeat.lineage = la;
	ck_assert_int_eq(cwi_dispatcher_handle(a, 2, &req, &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	ck_assert_int_eq(cwi_dispatcher_handle(b, 2, &req, &rep),
	    CACHEW_ENOENT);
	ck_assert_int_eq(rep.type, CWI_MSG_ERROR);
	ck_assert_uint_eq(rep.u.error.lineage, lb);
	ck_assert_ptr_nonnull(strstr(rep.u.error.message, "another"));
	cwi_pmsg_free(&rep);
	/* Without a lineage (an older peer) the id alone decides. */
	req.u.worker_heartbeat.lineage = 0;
	ck_assert_int_eq(cwi_dispatcher_handle(b, 3, &req, &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
	cwi_dispatcher_destroy(a);
	cwi_dispatcher_destroy(b);
}
END_TEST

/* ---- the random walk ----------------------------------------------------- */

/* A simulated worker: the splits it holds, in lease order; a prefix of
 * them has been delivered to the client (which acks at random later). */
typedef struct sim_worker {
	uint64_t id;
	uint64_t task;
	bool alive;
	cwi_split held[64];
	size_t nheld;
} sim_worker;

typedef struct sim {
	harness *h;
	cwi_rng rng;
	uint64_t job, client, nunits;
	sim_worker w[9]; /* 8 in the random phase, one more after */
	size_t nw;
	uint64_t unacked[4096]; /* delivered, not yet acknowledged */
	size_t nunacked;
	uint32_t *unit_acks;    /* per unit, acks the dispatcher took */
	uint8_t *split_acked;   /* split ids acknowledged */
	uint64_t units_per_split, nsplits;
	uint32_t target; /* the worker count decision's answer */
} sim;

static uint32_t
sim_count(void *ctx, const cwi_job_view *v)
{
	const sim *s = ctx;
	return s->target < v->workers_available ? s->target
						: v->workers_available;
}

static void
sim_refresh_tasks(sim *s)
{
	for (size_t i = 0; i < s->nw; i++)
		if (s->w[i].alive)
			s->w[i].task = task_of(s->h, s->w[i].id, s->job, NULL);
}

static void
sim_add_worker(sim *s, bool calm)
{
	char addr[32];
	sim_worker *w;

	if (s->nw == (calm ? 9 : 8)) {
		sim_refresh_tasks(s);
		return;
	}
	w = &s->w[s->nw++];
	memset(w, 0, sizeof(*w));
	snprintf(addr, sizeof(addr), "tcp://sim%zu:1", s->nw);
	w->id = add_worker(s->h, addr);
	w->alive = true;
	sim_refresh_tasks(s);
}

/* The client acknowledges one delivered split; the first ack of a split
 * counts its units (later ones are duplicates, allowed). */
static void
sim_ack_one(sim *s)
{
	size_t k;
	uint64_t id;

	if (s->nunacked == 0)
		return;
	k = (size_t)cwi_rng_below(&s->rng, s->nunacked);
	id = s->unacked[k];
	s->unacked[k] = s->unacked[--s->nunacked];
	ack(s->h, s->job, s->client, &id, 1);
	/* A removing task may have gone, and a new one come. */
	sim_refresh_tasks(s);
	if (!s->split_acked[id]) {
		uint64_t end = (id + 1) * s->units_per_split;
		s->split_acked[id] = 1;
		for (uint64_t u = id * s->units_per_split;
		     u < end && u < s->nunits; u++)
			s->unit_acks[u]++;
	}
}

static void
sim_step(sim *s)
{
	uint64_t r = cwi_rng_below(&s->rng, 100);
	sim_worker *w = s->nw > 0 ? &s->w[cwi_rng_below(&s->rng, s->nw)] : NULL;
	cwi_msg_split_lease_reply l;
	cwi_msg_worker_heartbeat_reply wr;

	if (r < 5 || w == NULL) {
		sim_add_worker(s, false);
	} else if (r < 9 && w->alive) {
		/* It dies: silent past the timeout while the others and the
		 * client go on. */
		w->alive = false;
		w->nheld = 0;
		s->h->now += 11 * SEC;
		for (size_t i = 0; i < s->nw; i++) {
			if (!s->w[i].alive)
				continue;
			worker_hb(s->h, s->w[i].id, NULL, 0, NULL, 0, &wr);
			cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &wr);
		}
		{
			cwi_msg_client_heartbeat_reply cr;
			client_hb(s->h, s->job, s->client, 0, &cr);
			cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &cr);
		}
		cwi_dispatcher_tick(s->h->d, s->h->now);
		sim_refresh_tasks(s);
	} else if (r < 12) {
		/* Scale to a random count: tasks come and go mid-epoch. */
		s->target = (uint32_t)cwi_rng_below(&s->rng, s->nw + 1);
		ck_assert_int_eq(cwi_dispatcher_set_worker_count(s->h->d,
				     s->h->now, s->job, sim_count, s),
		    CACHEW_OK);
		sim_refresh_tasks(s);
	} else if (r < 40 && w->alive && w->task != 0 && w->nheld <= 58) {
		ck_assert_int_eq(lease(s->h, w->id, w->task,
				     (uint32_t)(1 + cwi_rng_below(&s->rng, 6)),
				     &l),
		    CACHEW_OK);
		for (size_t i = 0; i < l.nsplits && w->nheld < 64; i++)
			w->held[w->nheld++] = l.splits[i];
		cwi_pmsg_body_free(CWI_MSG_SPLIT_LEASE_REPLY, &l);
	} else if (r < 75 && w->alive && w->nheld > 0) {
		/* Delivers its oldest split to the client. */
		ck_assert_uint_lt(s->nunacked, 4096);
		s->unacked[s->nunacked++] = w->held[0].split_id;
		memmove(&w->held[0], &w->held[1],
		    (w->nheld - 1) * sizeof(w->held[0]));
		w->nheld--;
	} else {
		sim_ack_one(s);
	}
}

static void
sim_check_invariant(sim *s)
{
	cwi_job_status js = job_status(s->h, s->job);
	uint64_t acked = 0;

	for (uint64_t i = 0; i < s->nsplits; i++)
		acked += s->split_acked[i];
	ck_assert_uint_eq(js.splits_total, s->nsplits);
	ck_assert_uint_eq(js.splits_acked, acked);
	ck_assert_uint_eq(js.splits_pending + js.splits_leased + js.splits_acked,
	    s->nsplits);
	/* Per unit: assert only on failure (a passing ck_assert costs a
	 * write to Check's pipe). */
	for (uint64_t u = 0; u < s->nunits; u++)
		if (s->unit_acks[u] > 1)
			ck_abort_msg("unit %" PRIu64 " acked %u times", u,
			    s->unit_acks[u]);
}

START_TEST(test_dispatcher_random_walk_loses_no_split)
{
	for (uint64_t seed = 1; seed <= 40; seed++) {
		sim s;
		uint64_t ds;
		int guard = 0;

		memset(&s, 0, sizeof(s));
		s.h = harness_new();
		s.rng.state = seed;
		s.nunits = 50 + cwi_rng_below(&s.rng, 400);
		s.unit_acks = xcalloc(s.nunits, sizeof(uint32_t));
		ds = add_dataset(s.h, seed, (int64_t)s.nunits, NULL);
		sim_add_worker(&s, false);
		join(s.h, ds, NULL, &s.job, &s.client);
		sim_refresh_tasks(&s);
		{
			cwi_job_status js = job_status(s.h, s.job);
			s.nsplits = js.splits_total;
			s.units_per_split = js.units_per_split;
		}
		s.split_acked = xcalloc(s.nsplits, 1);
		for (int step = 0; step < 400; step++) {
			sim_step(&s);
			sim_check_invariant(&s);
		}
		/* Then calm: every worker, a fresh one too, everyone
		 * delivers, the client acknowledges, until the epoch is
		 * done. */
		ck_assert_int_eq(cwi_dispatcher_set_worker_count(s.h->d,
				     s.h->now, s.job, NULL, NULL),
		    CACHEW_OK);
		sim_add_worker(&s, true);
		while (!job_status(s.h, s.job).data_done && guard++ < 100000) {
			sim_refresh_tasks(&s);
			for (size_t i = 0; i < s.nw; i++) {
				sim_worker *w = &s.w[i];
				cwi_msg_split_lease_reply l;
				if (!w->alive || w->task == 0)
					continue;
				if (w->nheld == 0) {
					ck_assert_int_eq(lease(s.h, w->id,
							     w->task, 4, &l),
					    CACHEW_OK);
					for (size_t k = 0; k < l.nsplits; k++)
						w->held[w->nheld++] = l.splits[k];
					cwi_pmsg_body_free(
					    CWI_MSG_SPLIT_LEASE_REPLY, &l);
				}
				while (w->nheld > 0) {
					s.unacked[s.nunacked++] =
					    w->held[--w->nheld].split_id;
				}
			}
			while (s.nunacked > 0)
				sim_ack_one(&s);
			sim_check_invariant(&s);
		}
		ck_assert_msg(job_status(s.h, s.job).data_done,
		    "seed %" PRIu64 ": the epoch never ended", seed);
		for (uint64_t u = 0; u < s.nunits; u++)
			if (s.unit_acks[u] != 1)
				ck_abort_msg("seed %" PRIu64 ": unit %" PRIu64
					     " acked %u times",
				    seed, u, s.unit_acks[u]);
		free(s.unit_acks);
		free(s.split_acked);
		harness_free(s.h);
	}
}
END_TEST

Suite *
cwt_service_suite(void)
{
	Suite *s = suite_create("service");
	TCase *proto = tcase_create("proto");
	TCase *disp = tcase_create("dispatcher");

	tcase_add_test(proto, test_proto_every_message_round_trips);
	tcase_add_test(proto, test_proto_fields_survive_round_trip);
	tcase_add_test(proto, test_proto_defaults_are_left_out_and_restored);
	tcase_add_test(proto, test_proto_unknown_keys_and_nil_optionals_ignored);
	tcase_add_test(proto, test_proto_missing_required_field_names_it);
	tcase_add_test(proto, test_proto_wrong_types_name_the_field);
	tcase_add_test(proto, test_proto_version_and_type_checked);
	tcase_add_test(proto, test_proto_duplicate_field_refused);
	tcase_add_test(proto, test_proto_oversized_counts_refused_before_allocating);
	tcase_add_test(proto, test_proto_expansion_is_bounded);
	tcase_add_test(proto, test_proto_every_truncation_fails_cleanly);
	tcase_add_test(proto, test_proto_garbage_never_crashes);
	tcase_add_test(proto, test_proto_encoder_refuses_over_limit);
	tcase_add_test(proto, test_proto_enum_names_parse);
	tcase_add_test(proto, test_proto_element_names_travel_and_absent_is_none);
	tcase_add_test(proto, test_proto_hostile_element_names_refused);
	tcase_add_test(proto, test_proto_split_units_span_uint64);
	tcase_add_test(proto, test_coord_round_task_rotates_over_serving_tasks);
	tcase_set_timeout(proto, 60);
	suite_add_tcase(s, proto);

	tcase_add_test(disp, test_dispatcher_same_fingerprint_same_dataset);
	tcase_add_test(disp, test_dispatcher_named_job_shared_unnamed_private);
	tcase_add_test(disp, test_dispatcher_named_job_tasks_carry_its_epoch);
	tcase_add_test(disp, test_dispatcher_job_request_checked);
	tcase_add_test(disp, test_dispatcher_split_size_targets_splits_per_worker);
	tcase_add_test(disp, test_dispatcher_dataset_without_split_source_is_one_split);
	tcase_add_test(disp, test_dispatcher_splits_cover_uint64_max_units);
	tcase_add_test(disp, test_dispatcher_epoch_leases_every_unit_once);
	tcase_add_test(disp, test_dispatcher_unused_datasets_are_dropped);
	tcase_add_test(disp, test_dispatcher_ack_reply_says_when_every_split_is_acked);
	tcase_add_test(disp, test_dispatcher_part_acks_count_each_client_once);
	tcase_add_test(disp, test_dispatcher_part_ack_of_an_earlier_lease_is_a_duplicate);
	tcase_add_test(disp, test_dispatcher_lease_is_capped_by_fair_share);
	tcase_add_test(disp, test_dispatcher_dead_worker_splits_are_leased_again);
	tcase_add_test(disp, test_dispatcher_removed_task_finishes_leased_splits);
	tcase_add_test(disp, test_dispatcher_worker_added_mid_epoch_gets_splits);
	tcase_add_test(disp, test_dispatcher_dataset_reuse_needs_the_same_graph);
	tcase_add_test(disp,
	    test_dispatcher_places_tasks_only_on_workers_with_the_functions);
	tcase_add_test(disp, test_dispatcher_refuses_a_job_no_worker_can_run);
	tcase_add_test(disp, test_dispatcher_checks_reported_functions_and_graphs);
	tcase_add_test(disp, test_dispatcher_job_ends_when_clients_release);
	tcase_add_test(disp, test_dispatcher_job_ends_when_clients_time_out);
	tcase_add_test(disp,
	    test_dispatcher_shared_job_client_leaving_returns_delivered_splits);
	tcase_add_test(disp, test_dispatcher_draining_worker_finishes_then_goes);
	tcase_add_test(disp,
	    test_dispatcher_deregistered_worker_leaves_delivered_splits_to_acks);
	tcase_add_test(disp, test_dispatcher_restarted_worker_replaces_old_one);
	tcase_add_test(disp, test_dispatcher_worker_addresses_stay_indexed);
	tcase_add_test(disp, test_dispatcher_many_jobs_keep_their_own_tasks);
	tcase_add_test(disp, test_dispatcher_parallel_epochs_tasks_read_everything);
	tcase_add_test(disp, test_dispatcher_fixed_worker_count);
	tcase_add_test(disp, test_dispatcher_coordinated_reads_schedule);
	tcase_add_test(disp,
	    test_dispatcher_coordinated_change_moves_when_a_consumer_passed_it);
	tcase_add_test(disp, test_dispatcher_status_reports_progress_and_rates);
	tcase_add_test(disp,
	    test_dispatcher_job_counts_are_what_its_clients_received);
	tcase_add_test(disp,
	    test_dispatcher_job_rows_sum_every_task_and_keep_the_newest);
	tcase_add_test(disp, test_dispatcher_handle_replies_and_errors);
	tcase_add_test(disp, test_dispatcher_events_are_json_lines);
	tcase_add_test(disp, test_dispatcher_events_to_file);
	tcase_add_test(disp, test_dispatcher_refuses_another_lineage);
	tcase_add_test(disp, test_dispatcher_lease_request_sent_again_gets_the_same_group);
	tcase_add_test(disp, test_dispatcher_resume_forms_the_saved_groups);
	tcase_add_test(disp, test_dispatcher_join_sent_again_finds_its_client);
	tcase_add_test(disp, test_dispatcher_random_walk_loses_no_split);
	tcase_set_timeout(disp, 60);
	suite_add_tcase(s, disp);
	return s;
}
