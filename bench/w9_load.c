/*
 * w9_load.c - W9's load generator: N simulated workers and M simulated
 * clients speaking the real protocol (service_proto.h over the nng
 * transport) to one real `cachewd --role=dispatcher`, each on its own
 * connection (up to the process's file limit less a margin; beyond, peers
 * share connections round robin, and "connections" in the output says how
 * many there were), at the rates the dispatcher tells them.
 *
 *   build/w9_load URL WORKERS CLIENTS SECONDS PID
 *
 * Workers register, heartbeat every interval the register reply says with
 * every task they hold (reported done once it ran out of splits), and
 * lease one split per task every LEASE_MS. Clients join shared named jobs
 * of CLIENTS_PER_JOB clients, each job a fixed WORKERS_PER_JOB workers,
 * heartbeat at the interval the dispatcher tells (job reply, heartbeat
 * reply), acknowledge the splits their job's workers leased every
 * ACK_MS, and when the job's data is done release it and join its next
 * iteration (a new epoch: a new job). One client asks for the status
 * every second, as a dashboard would. No element moves: the data path is
 * not part of what W9 measures.
 *
 * After WARMUP_S the latencies of every request (send to reply) are
 * recorded for SECONDS, and the dispatcher process PID's CPU time
 * (/proc/PID/stat) over the same window and its RSS at the end are read.
 * Prints one JSON line: p50/p99/max in ms per request kind, counts,
 * errors, dispatcher cores and RSS. Exit 1 when a request kind never got
 * an answer or errors outnumber 1% of the requests.
 */
#include "../src/service/service_proto.h"
#include "../src/service/service_rpc.h"

#include <cachew.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define WARMUP_S 3
#define LEASE_MS 500
#define ACK_MS 200
#define STATUS_MS 1000
#define CLIENTS_PER_JOB 10
#define WORKERS_PER_JOB 10
#define MAX_TASKS 64
#define MAX_ACK 64
#define NTHREADS 4
#define TIMEOUT_MS 30000

/* OP_LEASE_EMPTY is not a request of its own: a split_lease answered with
 * no split and no end (every split of the epoch is leased elsewhere). The
 * dispatcher holds such a lease until something changes its answer or its
 * retry_ms is over (a long poll, docs/protocol.md "Held leases"), so its
 * time is the wait it was told to do, not the dispatcher's latency: it is
 * reported on its own line and kept out of split_lease's. */
enum { OP_WHB, OP_CHB, OP_LEASE, OP_ACK, OP_JOIN, OP_RELEASE, OP_STATUS,
	OP_LEASE_EMPTY, NOPS };
static const char *op_names[NOPS] = {"worker_heartbeat",
    "client_heartbeat", "split_lease", "split_ack", "job_get_or_create",
    "job_release", "status", "split_lease_empty"};

typedef struct wtask {
	uint64_t id, job_id;
	bool done;          /* end_of_splits: report done */
	bool inflight;
	uint64_t next_ns;
} wtask;

typedef struct ent {
	bool is_worker;
	cwi_conn *conn; /* borrowed from conns[] */
	uint64_t id; /* worker id; client: client id */
	uint32_t hb_ms;
	uint64_t next_hb_ns;
	bool hb_inflight;
	/* worker */
	wtask tasks[MAX_TASKS];
	size_t ntasks;
	/* client */
	size_t job;       /* index into jobs[] */
	uint64_t job_id, iteration;
	bool joining;     /* a release or join in flight: no other request */
	bool ack_inflight;
	uint64_t next_ack_ns, next_status_ns;
	bool status_poller, status_inflight;
	unsigned seed;
} ent;

/* The splits a job's workers leased, for its clients to acknowledge. */
typedef struct job_q {
	pthread_mutex_t lock;
	uint64_t job_id; /* the dispatcher's id of the current iteration */
	uint64_t ids[4096];
	size_t n;
} job_q;

typedef struct lat {
	uint32_t *us;
	size_t n, cap;
} lat;

typedef struct thr {
	pthread_t tid;
	cwi_cq *cq;
	size_t first, count;
	lat lats[NOPS];
	uint64_t sent[NOPS], errors[NOPS];
	uint64_t *sent_ns; /* per (entity, op, slot) send time */
} thr;

static const char *url;
static ent *ents;
static cwi_conn **conns;
static size_t nworkers, nclients, njobs, nconns;
static job_q *jobs;
static uint64_t dataset_id;
static atomic_bool stop_flag, measuring;
static thr threads[NTHREADS];

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
die(const char *what)
{
	fprintf(stderr, "w9_load: %s: %s\n", what, cachew_errmsg());
	exit(1);
}

/* Tags: entity index, op, task slot. */
#define TAG(e, op, slot) \
	(((uint64_t)(e) << 16) | ((uint64_t)(op) << 8) | (uint64_t)(slot))
#define SLOT_INDEX(e, op, slot) \
	(((size_t)(e) * NOPS + (size_t)(op)) * (MAX_TASKS + 1) + (size_t)(slot))

static void
lat_add(lat *l, uint64_t ns)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4096;
		uint32_t *v = realloc(l->us, cap * sizeof(*v));
		if (v == NULL)
			return;
		l->us = v;
		l->cap = cap;
	}
	l->us[l->n++] = (uint32_t)(ns / 1000 > UINT32_MAX ? UINT32_MAX
							   : ns / 1000);
}

/* Sends m for entity e; false when it could not be sent (counted). */
static bool
send_msg(thr *t, size_t e, int op, size_t slot, cwi_pmsg *m)
{
	cwi_msg *msg;
	bool ok = false;

	if (cwi_rpc_pack(m, &msg) != CACHEW_OK)
		goto out;
	t->sent_ns[SLOT_INDEX(e - t->first, op, slot)] = now_ns();
	if (cwi_conn_send(ents[e].conn, msg, TIMEOUT_MS, t->cq,
		TAG(e, op, slot)) != CACHEW_OK) {
		cwi_msg_destroy(msg);
		goto out;
	}
	ok = true;
	if (atomic_load(&measuring))
		t->sent[op]++;
out:
	if (!ok && atomic_load(&measuring))
		t->errors[op]++;
	cwi_pmsg_free(m);
	return ok;
}

/* A synchronous call at start-up. */
static void
call(cwi_conn *c, cwi_pmsg *m, cwi_msg_type expect, cwi_pmsg *rep)
{
	if (cwi_rpc_call(c, m, expect, TIMEOUT_MS, rep) != CACHEW_OK)
		die(cwi_msg_type_name(m->type));
	cwi_pmsg_free(m);
}

/* ---- workers --------------------------------------------------------- */

static void
worker_heartbeat(thr *t, size_t e)
{
	ent *w = &ents[e];
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_WORKER_HEARTBEAT);
	m.u.worker_heartbeat.worker_id = w->id;
	m.u.worker_heartbeat.cpu_use = 0.5;
	m.u.worker_heartbeat.tasks = calloc(w->ntasks + 1,
	    sizeof(cwi_task_report));
	if (m.u.worker_heartbeat.tasks == NULL)
		return;
	m.u.worker_heartbeat.ntasks = w->ntasks;
	for (size_t i = 0; i < w->ntasks; i++) {
		cwi_task_report *r = &m.u.worker_heartbeat.tasks[i];
		r->task_id = w->tasks[i].id;
		r->done = w->tasks[i].done;
	}
	w->hb_inflight = send_msg(t, e, OP_WHB, 0, &m);
}

static void
worker_heartbeat_reply(ent *w, const cwi_msg_worker_heartbeat_reply *r)
{
	for (size_t k = 0; k < r->nstop; k++) {
		for (size_t i = 0; i < w->ntasks; i++) {
			if (w->tasks[i].id != r->stop[k] || w->tasks[i].inflight)
				continue;
			w->tasks[i] = w->tasks[--w->ntasks];
			break;
		}
	}
	for (size_t k = 0; k < r->nstart && w->ntasks < MAX_TASKS; k++) {
		wtask *nt = &w->tasks[w->ntasks++];
		memset(nt, 0, sizeof(*nt));
		nt->id = r->start[k].task_id;
		nt->job_id = r->start[k].job_id;
	}
}

static void
lease(thr *t, size_t e, size_t slot)
{
	ent *w = &ents[e];
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_SPLIT_LEASE);
	m.u.split_lease.worker_id = w->id;
	m.u.split_lease.task_id = w->tasks[slot].id;
	m.u.split_lease.max_splits = 1;
	w->tasks[slot].inflight = send_msg(t, e, OP_LEASE, slot, &m);
}

static void
lease_reply(ent *w, size_t slot, const cwi_msg_split_lease_reply *r,
    uint64_t now)
{
	wtask *tk = &w->tasks[slot];

	tk->next_ns = now + (r->retry_ms > 0 ? r->retry_ms : LEASE_MS) *
				1000000ull;
	if (r->end_of_splits)
		tk->done = true;
	for (size_t i = 0; i < njobs && r->nsplits > 0; i++) {
		job_q *q = &jobs[i];
		pthread_mutex_lock(&q->lock);
		if (q->job_id == tk->job_id) {
			for (size_t k = 0; k < r->nsplits &&
			     q->n < sizeof(q->ids) / sizeof(q->ids[0]); k++)
				q->ids[q->n++] = r->splits[k].split_id;
			i = njobs;
		}
		pthread_mutex_unlock(&q->lock);
	}
}

/* ---- clients --------------------------------------------------------- */

static void
join(thr *t, size_t e)
{
	ent *c = &ents[e];
	char name[32];
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_JOB_GET_OR_CREATE);
	snprintf(name, sizeof(name), "w9-%zu", c->job);
	m.u.job_get_or_create.dataset_id = dataset_id;
	m.u.job_get_or_create.job_name = strdup(name);
	m.u.job_get_or_create.iteration = c->iteration;
	m.u.job_get_or_create.epoch = c->iteration;
	m.u.job_get_or_create.processing_mode = CWI_MODE_DISTRIBUTED_EPOCH;
	m.u.job_get_or_create.consumer_index = -1;
	m.u.job_get_or_create.worker_policy = CWI_WORKERS_FIXED;
	m.u.job_get_or_create.num_workers = WORKERS_PER_JOB;
	c->joining = send_msg(t, e, OP_JOIN, 0, &m);
}

static void
join_reply(ent *c, const cwi_msg_job_get_or_create_reply *r, uint64_t now)
{
	job_q *q = &jobs[c->job];

	c->job_id = r->job_id;
	c->id = r->client_id;
	c->hb_ms = r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms
						: 500;
	/* Peers are not in step: the first heartbeat and ack at a random
	 * point of their intervals. */
	c->next_hb_ns = now + (uint64_t)rand_r(&c->seed) % (c->hb_ms * 1000000ull);
	c->next_ack_ns = now + (uint64_t)rand_r(&c->seed) % (ACK_MS * 1000000ull);
	c->joining = false;
	pthread_mutex_lock(&q->lock);
	if (q->job_id != r->job_id) {
		q->job_id = r->job_id;
		q->n = 0;
	}
	pthread_mutex_unlock(&q->lock);
}

static void
release_and_rejoin(thr *t, size_t e)
{
	ent *c = &ents[e];
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_JOB_RELEASE);
	m.u.job_release.job_id = c->job_id;
	m.u.job_release.client_id = c->id;
	c->iteration++;
	c->joining = send_msg(t, e, OP_RELEASE, 0, &m);
}

static void
client_heartbeat(thr *t, size_t e)
{
	ent *c = &ents[e];
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_CLIENT_HEARTBEAT);
	m.u.client_heartbeat.job_id = c->job_id;
	m.u.client_heartbeat.client_id = c->id;
	m.u.client_heartbeat.batch_time_ns = 20000000;
	m.u.client_heartbeat.batches = c->hb_ms / 20;
	m.u.client_heartbeat.buffer_fill = 0.5;
	c->hb_inflight = send_msg(t, e, OP_CHB, 0, &m);
}

static void
client_ack(thr *t, size_t e)
{
	ent *c = &ents[e];
	job_q *q = &jobs[c->job];
	uint64_t ids[MAX_ACK];
	size_t n = 0;
	cwi_pmsg m;

	pthread_mutex_lock(&q->lock);
	if (q->job_id == c->job_id)
		while (q->n > 0 && n < MAX_ACK)
			ids[n++] = q->ids[--q->n];
	pthread_mutex_unlock(&q->lock);
	if (n == 0)
		return;
	cwi_pmsg_init(&m, CWI_MSG_SPLIT_ACK);
	m.u.split_ack.job_id = c->job_id;
	m.u.split_ack.client_id = c->id;
	m.u.split_ack.split_ids = malloc(n * sizeof(uint64_t));
	if (m.u.split_ack.split_ids == NULL)
		return;
	memcpy(m.u.split_ack.split_ids, ids, n * sizeof(uint64_t));
	m.u.split_ack.nsplit_ids = n;
	c->ack_inflight = send_msg(t, e, OP_ACK, 0, &m);
}

static void
status(thr *t, size_t e)
{
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_STATUS);
	ents[e].status_inflight = send_msg(t, e, OP_STATUS, 0, &m);
}

/* ---- the loop -------------------------------------------------------- */

static void
due(thr *t, size_t e, uint64_t now)
{
	ent *x = &ents[e];

	if (x->is_worker) {
		if (!x->hb_inflight && now >= x->next_hb_ns) {
			x->next_hb_ns = now + x->hb_ms * 1000000ull;
			worker_heartbeat(t, e);
		}
		for (size_t i = 0; i < x->ntasks; i++)
			if (!x->tasks[i].inflight && !x->tasks[i].done &&
			    now >= x->tasks[i].next_ns)
				lease(t, e, i);
		return;
	}
	if (x->status_poller && !x->status_inflight &&
	    now >= x->next_status_ns) {
		x->next_status_ns = now + STATUS_MS * 1000000ull;
		status(t, e);
	}
	if (x->joining)
		return;
	if (!x->hb_inflight && now >= x->next_hb_ns) {
		x->next_hb_ns = now + x->hb_ms * 1000000ull;
		client_heartbeat(t, e);
	}
	if (!x->ack_inflight && now >= x->next_ack_ns) {
		x->next_ack_ns = now + ACK_MS * 1000000ull;
		client_ack(t, e);
	}
}

static void
completed(thr *t, const cwi_completion *c, uint64_t now)
{
	size_t e = (size_t)(c->tag >> 16), slot = c->tag & 0xff;
	int op = (int)((c->tag >> 8) & 0xff);
	ent *x = &ents[e];
	bool ok = false;
	cwi_pmsg rep = {0};

	if (c->err == CACHEW_OK &&
	    cwi_rpc_unpack(c->reply, url, &rep) == CACHEW_OK &&
	    rep.type != CWI_MSG_ERROR)
		ok = true;
	if (c->reply != NULL)
		cwi_msg_destroy(c->reply);
	if (atomic_load(&measuring)) {
		int lop = op;

		if (ok && op == OP_LEASE &&
		    rep.u.split_lease_reply.nsplits == 0 &&
		    !rep.u.split_lease_reply.end_of_splits)
			lop = OP_LEASE_EMPTY;
		if (ok)
			lat_add(&t->lats[lop],
			    now - t->sent_ns[SLOT_INDEX(e - t->first, op,
				      slot)]);
		else
			t->errors[op]++;
	}
	switch (op) {
	case OP_WHB:
		x->hb_inflight = false;
		if (ok)
			worker_heartbeat_reply(x, &rep.u.worker_heartbeat_reply);
		break;
	case OP_LEASE:
		x->tasks[slot].inflight = false;
		if (ok)
			lease_reply(x, slot, &rep.u.split_lease_reply, now);
		else
			x->tasks[slot].done = true; /* gone: report, drop */
		break;
	case OP_CHB:
		x->hb_inflight = false;
		if (ok && rep.u.client_heartbeat_reply.heartbeat_interval_ms > 0)
			x->hb_ms =
			    rep.u.client_heartbeat_reply.heartbeat_interval_ms;
		if (!ok || rep.u.client_heartbeat_reply.job_finished)
			release_and_rejoin(t, e);
		break;
	case OP_ACK:
		x->ack_inflight = false;
		break;
	case OP_RELEASE:
		join(t, e); /* released or already gone: the next epoch */
		break;
	case OP_JOIN:
		x->joining = false;
		if (ok)
			join_reply(x, &rep.u.job_get_or_create_reply, now);
		else
			join(t, e);
		break;
	case OP_STATUS:
		x->status_inflight = false;
		break;
	}
	if (rep.type != CWI_MSG_NONE)
		cwi_pmsg_free(&rep);
}

static void *
thr_main(void *arg)
{
	thr *t = arg;

	while (!atomic_load(&stop_flag)) {
		uint64_t now = now_ns();
		cwi_completion c;

		for (size_t i = 0; i < t->count; i++)
			due(t, t->first + i, now);
		/* Replies as they come, for up to 5 ms before the next
		 * look at what is due. */
		while (now_ns() < now + 5000000u &&
		       cwi_cq_wait(t->cq, 5, &c) == CACHEW_OK)
			completed(t, &c, now_ns());
	}
	return NULL;
}

/* ---- set-up and report ------------------------------------------------- */

static void
setup(void)
{
	cachew_dataset *ds;
	cwi_pmsg m, rep;
	void *graph;
	size_t len;

	if (cachew_dataset_parse(&ds, "range(100000000)") != CACHEW_OK ||
	    cachew_dataset_to_msgpack(ds, &graph, &len) != CACHEW_OK)
		die("dataset");
	cwi_pmsg_init(&m, CWI_MSG_DATASET_REGISTER);
	if (cachew_dataset_fingerprint(ds,
		&m.u.dataset_register.fingerprint) != CACHEW_OK)
		die("fingerprint");
	m.u.dataset_register.graph = graph;
	m.u.dataset_register.graph_len = len;
	m.u.dataset_register.split_units = 100000000;
	m.u.dataset_register.splittable = true;
	call(ents[0].conn, &m, CWI_MSG_DATASET_REGISTER_REPLY, &rep);
	dataset_id = rep.u.dataset_register_reply.dataset_id;
	cwi_pmsg_free(&rep);
	cachew_dataset_release(ds);
	for (size_t i = 0; i < nworkers; i++) {
		char addr[64];
		snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%zu", 20000 + i);
		cwi_pmsg_init(&m, CWI_MSG_WORKER_REGISTER);
		m.u.worker_register.address = strdup(addr);
		m.u.worker_register.cores = 8;
		call(ents[i].conn, &m, CWI_MSG_WORKER_REGISTER_REPLY, &rep);
		ents[i].is_worker = true;
		ents[i].id = rep.u.worker_register_reply.worker_id;
		ents[i].hb_ms = rep.u.worker_register_reply.heartbeat_interval_ms;
		ents[i].seed = (unsigned)(nclients + i + 1);
		ents[i].next_hb_ns = now_ns() +
		    (uint64_t)rand_r(&ents[i].seed) % (ents[i].hb_ms * 1000000ull);
		cwi_pmsg_free(&rep);
	}
	for (size_t i = 0; i < nclients; i++) {
		ent *c = &ents[nworkers + i];
		c->job = i / CLIENTS_PER_JOB;
		c->seed = (unsigned)i + 1;
		c->status_poller = i == 0;
	}
}

static uint64_t
proc_cpu_ticks(long pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	if (fgets(buf, sizeof(buf), f) != NULL &&
	    (p = strrchr(buf, ')')) != NULL)
		(void)sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
				    "%*u %lu %lu",
		    &ut, &st);
	fclose(f);
	return ut + st;
}

static long
proc_kib(long pid, const char *key)
{
	char path[64], line[256];
	long kib = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, key, strlen(key)) == 0)
			kib = strtol(line + strlen(key) + 1, NULL, 10);
	fclose(f);
	return kib;
}

static double
tv_s(const struct timeval *tv)
{
	return (double)tv->tv_sec + (double)tv->tv_usec * 1e-6;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Merges the threads' latencies of op and prints its JSON fields; false
 * when it never got an answer or failed more than 1%. */
static bool
report_op(int op, bool comma)
{
	lat all = {0};
	uint64_t sent = 0, errors = 0;

	for (size_t k = 0; k < NTHREADS; k++) {
		sent += threads[k].sent[op];
		errors += threads[k].errors[op];
		for (size_t i = 0; i < threads[k].lats[op].n; i++)
			lat_add(&all, (uint64_t)threads[k].lats[op].us[i] * 1000);
	}
	qsort(all.us, all.n, sizeof(*all.us), cmp_u32);
	printf("%s\"%s\": {\"n\": %zu, \"errors\": %llu", comma ? ", " : "",
	    op_names[op], all.n, (unsigned long long)errors);
	if (all.n > 0)
		printf(", \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f",
		    all.us[all.n / 2] / 1000.0,
		    all.us[(size_t)((double)all.n * 0.99)] / 1000.0,
		    all.us[all.n - 1] / 1000.0);
	printf("}");
	free(all.us);
	return (all.n > 0 || op == OP_RELEASE || op == OP_JOIN ||
		   op == OP_LEASE_EMPTY) &&
	       errors * 100 <= sent + 1;
}

int
main(int argc, char **argv)
{
	long secs, pid;
	uint64_t c0, c1, t0, t1;
	struct rusage r0, r1;
	struct rlimit rl;
	struct timespec nap;
	size_t n, per;
	bool ok = true;

	if (argc < 6) {
		fprintf(stderr, "usage: w9_load URL WORKERS CLIENTS SECONDS "
				"PID\n");
		return 2;
	}
	url = argv[1];
	nworkers = (size_t)strtoul(argv[2], NULL, 10);
	nclients = (size_t)strtoul(argv[3], NULL, 10);
	secs = strtol(argv[4], NULL, 10);
	pid = strtol(argv[5], NULL, 10);
	if (nworkers < 1 || nclients < 1 || nworkers + nclients > 100000 ||
	    secs < 1 || secs > 600 || pid < 1) {
		fprintf(stderr, "w9_load: WORKERS and CLIENTS 1..50000, "
				"SECONDS 1..600, PID the dispatcher's\n");
		return 2;
	}
	/* A connection per simulated peer while the file limit allows. */
	n = nworkers + nclients;
	nconns = n;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
		if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n + 4096)
			nconns = rl.rlim_cur > 8192 ? rl.rlim_cur - 4096 : 4096;
	}
	njobs = (nclients + CLIENTS_PER_JOB - 1) / CLIENTS_PER_JOB;
	ents = calloc(n, sizeof(*ents));
	jobs = calloc(njobs, sizeof(*jobs));
	if (ents == NULL || jobs == NULL)
		return 1;
	for (size_t i = 0; i < njobs; i++)
		pthread_mutex_init(&jobs[i].lock, NULL);
	conns = calloc(nconns, sizeof(*conns));
	if (conns == NULL)
		return 1;
	for (size_t i = 0; i < nconns; i++)
		if (cwi_dial(&conns[i], url, NULL) != CACHEW_OK)
			die("dial");
	for (size_t i = 0; i < n; i++)
		ents[i].conn = conns[i % nconns];
	setup();
	/* Workers and clients spread over the threads alike. */
	per = (n + NTHREADS - 1) / NTHREADS;
	for (size_t k = 0; k < NTHREADS; k++) {
		thr *t = &threads[k];
		t->first = k * per < n ? k * per : n;
		t->count = t->first + per <= n ? per : n - t->first;
		t->sent_ns = calloc(t->count * NOPS * (MAX_TASKS + 1) + 1,
		    sizeof(uint64_t));
		if (cwi_cq_create(&t->cq) != CACHEW_OK || t->sent_ns == NULL)
			die("set-up");
	}
	for (size_t k = 0; k < NTHREADS; k++) {
		/* Clients join from their thread: a first join each. */
		for (size_t i = 0; i < threads[k].count; i++)
			if (!ents[threads[k].first + i].is_worker)
				join(&threads[k], threads[k].first + i);
		pthread_create(&threads[k].tid, NULL, thr_main, &threads[k]);
	}
	nap.tv_sec = WARMUP_S;
	nap.tv_nsec = 0;
	nanosleep(&nap, NULL);
	c0 = proc_cpu_ticks(pid);
	getrusage(RUSAGE_SELF, &r0);
	t0 = now_ns();
	atomic_store(&measuring, true);
	nap.tv_sec = secs;
	nanosleep(&nap, NULL);
	atomic_store(&measuring, false);
	c1 = proc_cpu_ticks(pid);
	getrusage(RUSAGE_SELF, &r1);
	t1 = now_ns();
	atomic_store(&stop_flag, true);
	for (size_t k = 0; k < NTHREADS; k++)
		pthread_join(threads[k].tid, NULL);
	printf("{\"workers\": %zu, \"clients\": %zu, \"jobs\": %zu, "
	       "\"connections\": %zu, "
	       "\"seconds\": %.3f, \"dispatcher_cores\": %.3f, "
	       "\"dispatcher_rss_kib\": %ld, \"dispatcher_hwm_kib\": %ld, "
	       "\"generator_cores\": %.3f",
	    nworkers, nclients, njobs, nconns, (double)(t1 - t0) / 1e9,
	    (double)(c1 - c0) / (double)sysconf(_SC_CLK_TCK) /
		((double)(t1 - t0) / 1e9),
	    proc_kib(pid, "VmRSS:"), proc_kib(pid, "VmHWM:"),
	    (tv_s(&r1.ru_utime) + tv_s(&r1.ru_stime) - tv_s(&r0.ru_utime) -
		tv_s(&r0.ru_stime)) / ((double)(t1 - t0) / 1e9));
	for (int op = 0; op < NOPS; op++)
		ok = report_op(op, true) && ok;
	printf("}\n");
	for (size_t i = 0; i < nconns; i++)
		cwi_conn_destroy(conns[i]);
	free(conns);
	for (size_t k = 0; k < NTHREADS; k++) {
		cwi_cq_destroy(threads[k].cq);
		free(threads[k].sent_ns);
		for (int op = 0; op < NOPS; op++)
			free(threads[k].lats[op].us);
	}
	free(ents);
	free(jobs);
	return ok ? 0 : 1;
}
