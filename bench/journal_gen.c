/*
 * journal_gen - writes the journal a dispatcher would write for a long
 * run of a busy service, for W8's recovery time (bench/w8.py).
 *
 *   journal_gen DIR RECORDS
 *
 * It runs the dispatcher's own state machine (no sockets) with the
 * traffic of 4 workers and one client reading job after job: every 50 ms
 * a tick; every 500 ms each worker's heartbeat (its tasks' reports) and
 * the client's; each tick a worker leases a split and the client
 * acknowledges what was leased the tick before; a job whose splits are all
 * acknowledged is released and the next one created. Every call is
 * journaled with the records dispatcher_server.c appends (the request's
 * bytes and clock), after a start record with the configuration, until
 * RECORDS records are written; no snapshot is taken, so a dispatcher
 * started on DIR/journal replays them all. Prints the records, bytes and
 * jobs written.
 */
#include "../src/core/journal.h"
#include "../src/service/dispatcher/dispatcher_state.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* range(3), as the tests register it: any graph that decodes will do. */
static const char graph[] =
    "\x84\xa6" "format" "\xac" "cachew-graph" "\xa5" "nodes"
    "\x91\x83\xa6" "inputs" "\x90\xa2" "op" "\xa5" "range" "\xa6" "params"
    "\x81\xa4" "stop" "\x03\xa4" "root" "\x00\xa7" "version" "\x01";

#define WORKERS 4
#define TICK_NS UINT64_C(50000000)

typedef struct gen {
	cwi_dispatcher *d;
	cwi_journal *j;
	cwi_strbuf req, rec;
	uint64_t now, records, bytes, want;
	uint64_t unflushed; /* bytes appended since the last flush */
} gen;

/* Lazy records wait in memory (up to 1 s, and this loop is faster than
 * that), and the journal refuses appends once max_buffered bytes (64 MiB)
 * wait for the disk: flush well before. */
#define FLUSH_BYTES (UINT64_C(8) << 20)

static void
die(const char *what)
{
	fprintf(stderr, "journal_gen: %s: %s\n", what, cachew_errmsg());
	exit(1);
}

static void
append(gen *g)
{
	uint64_t lsn;

	if (cwi_journal_append_lazy(g->j, g->rec.data, g->rec.len, &lsn) !=
	    CACHEW_OK)
		die("append");
	g->records++;
	g->bytes += g->rec.len;
	g->unflushed += g->rec.len + CWI_JOURNAL_RECORD_OVERHEAD;
	if (g->unflushed >= FLUSH_BYTES) {
		if (cwi_journal_flush(g->j) != CACHEW_OK)
			die("flush");
		g->unflushed = 0;
	}
}

/* One request through the state machine, journaled when it succeeds, as
 * the server does; rep is the caller's to free. */
static cachew_err
call(gen *g, const cwi_pmsg *req, cwi_pmsg *rep)
{
	cachew_err rv;

	g->req.len = 0;
	if (cwi_pmsg_encode(req, &g->req) != CACHEW_OK)
		die("encode");
	rv = cwi_dispatcher_handle(g->d, g->now, req, rep);
	if (rv == CACHEW_OK) {
		if (cwi_jrec_request(&g->rec, g->now, (const uint8_t *)g->req.data,
			g->req.len) != CACHEW_OK)
			die("record");
		append(g);
	}
	return rv;
}

static void
tick(gen *g)
{
	g->now += TICK_NS;
	cwi_dispatcher_tick(g->d, g->now);
	if (cwi_jrec_tick(&g->rec, g->now) != CACHEW_OK)
		die("record");
	append(g);
}

int
main(int argc, char **argv)
{
	gen g;
	cwi_journal_options jo;
	cwi_journal_recovery jr;
	cwi_pmsg req, rep;
	uint64_t wid[WORKERS], tid[WORKERS] = {0}, ds, job = 0, client = 0;
	uint64_t *pending = NULL, npending = 0, jobs = 0, lsn;
	uint32_t *plse = NULL;
	uint64_t cap = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: journal_gen DIR RECORDS\n");
		return 2;
	}
	memset(&g, 0, sizeof(g));
	g.want = strtoull(argv[2], NULL, 10);
	g.now = UINT64_C(1000000000);
	cwi_strbuf_init(&g.req);
	cwi_strbuf_init(&g.rec);
	if (cwi_dispatcher_create(&g.d, NULL) != CACHEW_OK)
		die("dispatcher");
	cwi_journal_options_init(&jo);
	jo.snapshot_records = 0;
	jo.snapshot_bytes = 0;
	if (cwi_journal_open(&g.j, argv[1], &jo, NULL, &jr) != CACHEW_OK)
		die(argv[1]);
	cwi_dispatcher_set_lineage(g.d, jr.lineage);
	if (cwi_jrec_start(&g.rec, g.now, jr.lineage, 1,
		cwi_dispatcher_config_of(g.d), 0) !=
	    CACHEW_OK)
		die("record");
	if (cwi_dispatcher_apply_record(g.d, (const uint8_t *)g.rec.data,
		g.rec.len) != CACHEW_OK)
		die("start");
	append(&g);

	for (int i = 0; i < WORKERS; i++) {
		char addr[64];
		snprintf(addr, sizeof(addr), "tcp://10.0.0.%d:7071", i + 1);
		cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
		req.u.worker_register.address = cwi_strdup(addr);
		req.u.worker_register.cores = 8;
		if (call(&g, &req, &rep) != CACHEW_OK)
			die("worker_register");
		wid[i] = rep.u.worker_register_reply.worker_id;
		cwi_pmsg_free(&req);
		cwi_pmsg_free(&rep);
	}
	cwi_pmsg_init(&req, CWI_MSG_DATASET_REGISTER);
	req.u.dataset_register.fingerprint.hi = 7;
	req.u.dataset_register.fingerprint.lo = 21;
	req.u.dataset_register.graph = malloc(sizeof(graph) - 1);
	memcpy(req.u.dataset_register.graph, graph, sizeof(graph) - 1);
	req.u.dataset_register.graph_len = sizeof(graph) - 1;
	req.u.dataset_register.split_units = 100000;
	req.u.dataset_register.splittable = true;
	if (call(&g, &req, &rep) != CACHEW_OK)
		die("dataset_register");
	ds = rep.u.dataset_register_reply.dataset_id;
	cwi_pmsg_free(&req);
	cwi_pmsg_free(&rep);

	for (uint64_t t = 0; g.records < g.want; t++) {
		if (job == 0) {
			cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
			req.u.job_get_or_create.dataset_id = ds;
			req.u.job_get_or_create.consumer_index = -1;
			req.u.job_get_or_create.seed = 42 + jobs;
			if (call(&g, &req, &rep) != CACHEW_OK)
				die("job_get_or_create");
			job = rep.u.job_get_or_create_reply.job_id;
			client = rep.u.job_get_or_create_reply.client_id;
			cwi_pmsg_free(&req);
			cwi_pmsg_free(&rep);
			memset(tid, 0, sizeof(tid));
			jobs++;
		}
		tick(&g);
		if (t % 10 == 0) {
			for (int i = 0; i < WORKERS; i++) {
				cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
				req.u.worker_heartbeat.worker_id = wid[i];
				req.u.worker_heartbeat.cpu_use = 0.9;
				if (tid[i] != 0) {
					cwi_task_report *r = calloc(1, sizeof(*r));
					r->task_id = tid[i];
					r->elements = t * 64;
					r->bytes = t * 4096;
					r->run_ns = t * TICK_NS;
					req.u.worker_heartbeat.tasks = r;
					req.u.worker_heartbeat.ntasks = 1;
				}
				if (call(&g, &req, &rep) != CACHEW_OK)
					die("worker_heartbeat");
				if (rep.u.worker_heartbeat_reply.nstart > 0)
					tid[i] = rep.u.worker_heartbeat_reply
						     .start[0].task_id;
				cwi_pmsg_free(&req);
				cwi_pmsg_free(&rep);
			}
			cwi_pmsg_init(&req, CWI_MSG_CLIENT_HEARTBEAT);
			req.u.client_heartbeat.job_id = job;
			req.u.client_heartbeat.client_id = client;
			req.u.client_heartbeat.batch_time_ns = 20000000;
			req.u.client_heartbeat.batches = 25;
			req.u.client_heartbeat.buffer_fill = 0.5;
			req.u.client_heartbeat.elements_received = t * 64;
			if (call(&g, &req, &rep) != CACHEW_OK)
				die("client_heartbeat");
			cwi_pmsg_free(&req);
			cwi_pmsg_free(&rep);
		}
		/* The client acknowledges last tick's leases. */
		if (npending > 0) {
			cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
			req.u.split_ack.job_id = job;
			req.u.split_ack.client_id = client;
			req.u.split_ack.split_ids = calloc(npending, 8);
			req.u.split_ack.leases = calloc(npending, 8);
			memcpy(req.u.split_ack.split_ids, pending, npending * 8);
			for (uint64_t k = 0; k < npending; k++)
				req.u.split_ack.leases[k] = plse[k];
			req.u.split_ack.nsplit_ids = npending;
			req.u.split_ack.nleases = npending;
			cachew_err rv = call(&g, &req, &rep);
			bool done = rv == CACHEW_OK &&
			    rep.type == CWI_MSG_OK && rep.u.ok.job_finished;
			cwi_pmsg_free(&req);
			cwi_pmsg_free(&rep);
			npending = 0;
			if (done) {
				cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
				req.u.job_release.job_id = job;
				req.u.job_release.client_id = client;
				(void)call(&g, &req, &rep);
				cwi_pmsg_free(&req);
				cwi_pmsg_free(&rep);
				job = 0;
				continue;
			}
		}
		int w = (int)(t % WORKERS);
		if (tid[w] == 0)
			continue;
		cwi_pmsg_init(&req, CWI_MSG_SPLIT_LEASE);
		req.u.split_lease.worker_id = wid[w];
		req.u.split_lease.task_id = tid[w];
		req.u.split_lease.max_splits = 1;
		if (call(&g, &req, &rep) == CACHEW_OK) {
			const cwi_msg_split_lease_reply *lr =
			    &rep.u.split_lease_reply;
			for (size_t k = 0; k < lr->nsplits; k++) {
				if (npending == cap) {
					cap = cap ? cap * 2 : 16;
					pending = realloc(pending, cap * 8);
					plse = realloc(plse, cap * 4);
				}
				pending[npending] = lr->splits[k].split_id;
				plse[npending++] = lr->splits[k].lease;
			}
		}
		cwi_pmsg_free(&req);
		cwi_pmsg_free(&rep);
	}
	/* One record someone waits for makes them all durable. */
	if (cwi_jrec_tick(&g.rec, g.now) != CACHEW_OK ||
	    cwi_journal_append(g.j, g.rec.data, g.rec.len, &lsn) != CACHEW_OK ||
	    cwi_journal_flush(g.j) != CACHEW_OK)
		die("flush");
	printf("records=%" PRIu64 " bytes=%" PRIu64 " jobs=%" PRIu64 "\n",
	    g.records + 1, g.bytes + g.rec.len, jobs);
	cwi_journal_destroy(g.j);
	cwi_dispatcher_destroy(g.d);
	cwi_strbuf_free(&g.req);
	cwi_strbuf_free(&g.rec);
	free(pending);
	free(plse);
	return 0;
}
