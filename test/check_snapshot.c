/*
 * check_snapshot.c - the dispatcher's snapshot (dispatcher_snapshot.c):
 * saved, loaded into a fresh dispatcher and saved again it gives the same
 * bytes; the loaded copy answers every further request and tick as the
 * original does (the replies' encodings and the event lines compared
 * byte for byte) through to the jobs' ends; corrupt snapshots fail with
 * a message or load a state that holds together.
 *
 * Each scenario is a script over a small model of a cluster (workers
 * that heartbeat and lease, clients that heartbeat and acknowledge) run
 * against a dispatcher with a hand-advanced clock (as check_service.c
 * does). A run takes the snapshot before one step of the script and from
 * there feeds every step to both dispatchers; the scenario is run with
 * the snapshot before each of its steps (or a spread of them), so every
 * kind of state it passes through is saved and loaded at least once.
 */
#include "cwt.h"

#include "../src/service/dispatcher/dispatcher_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEC 1000000000ull
#define MS 1000000ull

/* ---- two dispatchers, one script ----------------------------------------- */

typedef struct side {
	cwi_dispatcher *d;
	cwi_strbuf events; /* every event line, '\n'-terminated */
} side;

typedef struct mtask {
	uint64_t id, job;
	bool done;
} mtask;

typedef struct mworker {
	uint64_t id;
	bool alive;
	mtask tasks[16];
	size_t ntasks;
	uint64_t run_ns;
	uint64_t leases;
	bool draining;
} mworker;

typedef struct mclient {
	uint64_t job, id;
	int64_t consumer_index;
	uint64_t round;
	uint64_t elements;
	bool gone;
	uint64_t stop[16]; /* exactly once: tasks to stop and report */
	size_t nstop;
} mclient;

/* A split leased and not yet acknowledged by every client that reads it. */
typedef struct inflight {
	uint64_t job, split, lease, task, group;
	uint32_t parts;     /* clients that acknowledge it (1 or 2) */
	uint64_t acked_by;  /* the first of two that did */
} inflight;

typedef struct twin {
	side a, b;             /* b.d: NULL until the snapshot */
	cwi_dispatcher_config cfg;
	uint64_t now;
	int step, snap_at;     /* the snapshot before step snap_at */
	uint8_t *snap;
	size_t snap_len;
	mworker w[8];
	size_t nw;
	mclient c[8];
	size_t nc;
	inflight fl[512];
	size_t nfl;
	int pass_ctx;          /* the planner's ctx of an offered pass */
	unsigned seen;         /* kinds of state met at a step (SEEN_*) */
} twin;

/* Kinds of state a snapshot may be taken in. */
enum {
	SEEN_LEASED = 1u << 0,      /* a split leased */
	SEEN_ORPHAN = 1u << 1,      /* a split leased to a task gone */
	SEEN_ACKERS = 1u << 2,      /* a split's part acknowledged */
	SEEN_RECOVERING = 1u << 3,  /* exactly once: a group recovering */
	SEEN_SKIP = 1u << 4,        /* a group with skip ranges */
	SEEN_SCHEDULE = 1u << 5,    /* a coordinated change pending */
	SEEN_STARTING = 1u << 6,    /* a task waiting for its round */
	SEEN_REMOVING = 1u << 7,    /* a task being removed */
	SEEN_SCALER = 1u << 8,      /* a scaler past its first window */
	SEEN_POOL = 1u << 9,        /* the pool's history */
	SEEN_FINISHED = 1u << 10,   /* a finished job kept */
	SEEN_PARALLEL = 1u << 11,   /* a parallel_epochs job */
	SEEN_PASS = 1u << 12,       /* a running autocaching pass */
	SEEN_PASS_END = 1u << 13,   /* a pass end not taken */
	SEEN_DRAINED = 1u << 14,    /* a worker gone, its id in a split */
	SEEN_PLANNER = 1u << 15,    /* the planner's state lines */
};

static unsigned
ledger_seen(const job *j)
{
	unsigned seen = 0;

	for (uint64_t k = 0; j->ledger.splits != NULL &&
	     k < j->ledger.nsplits; k++) {
		const split *s = &j->ledger.splits[k];
		if (s->state == SPLIT_LEASED)
			seen |= SEEN_LEASED |
			    (s->task_id == 0 ? SEEN_ORPHAN : 0u);
		if (s->part_acks > 0)
			seen |= SEEN_ACKERS;
		if (s->state == SPLIT_RECOVERING)
			seen |= SEEN_RECOVERING;
		if (s->skip.n > 0)
			seen |= SEEN_SKIP;
	}
	return seen;
}

static unsigned
state_seen(const cwi_dispatcher *d)
{
	unsigned seen = d->npool_recent > 0 ? SEEN_POOL : 0u;

	seen |= d->npass_ends > 0 ? SEEN_PASS_END : 0u;
	seen |= d->nplanner > 0 ? SEEN_PLANNER : 0u;
	for (size_t i = 0; i < d->jobs.n; i++) {
		const job *j = JOB(d, i);
		seen |= ledger_seen(j);
		seen |= j->coord.target != CWI_ROUND_NONE ? SEEN_SCHEDULE : 0u;
		seen |= j->finished ? SEEN_FINISHED : 0u;
		seen |= j->mode == CWI_MODE_PARALLEL_EPOCHS ? SEEN_PARALLEL
							    : 0u;
		seen |= j->pass.graph != NULL && !j->finished ? SEEN_PASS : 0u;
		if (j->sizing.scaler != NULL &&
		    cwi_scaler_windows(j->sizing.scaler) > 0)
			seen |= SEEN_SCALER;
	}
	for (size_t i = 0; i < d->tasks.n; i++) {
		seen |= TASK(d, i)->state == CWI_TASK_STARTING ? SEEN_STARTING
							       : 0u;
		seen |= TASK(d, i)->state == CWI_TASK_REMOVING ? SEEN_REMOVING
							       : 0u;
	}
	return seen;
}

static void
collect_event(void *ctx, const char *line, size_t len)
{
	side *s = ctx;

	cwi_strbuf_append(&s->events, line, len);
	cwi_strbuf_append(&s->events, "\n", 1);
}

static void
side_create(twin *tw, side *s)
{
	cwi_dispatcher_config cfg = tw->cfg;

	cfg.event_fn = collect_event;
	cfg.event_ctx = s;
	cwi_strbuf_init(&s->events);
	ck_assert_int_eq(cwi_dispatcher_create(&s->d, &cfg), CACHEW_OK);
}

static void
twin_init(twin *tw, int snap_at, bool autoscale)
{
	memset(tw, 0, sizeof(*tw));
	cwi_dispatcher_config_default(&tw->cfg);
	tw->cfg.worker_timeout_ns = 10 * SEC;
	tw->cfg.client_timeout_ns = 10 * SEC;
	tw->cfg.splits_per_worker = 8;
	if (autoscale) {
		tw->cfg.autoscale = true;
		/* Windows of several samples, discards, drift checks:
		 * scalers are mid-way through something at most steps. */
		tw->cfg.scale.window_batches = 100;
		tw->cfg.scale.min_step_batches = 100;
		tw->cfg.scale.discard_epoch = 30;
		tw->cfg.scale.discard_change = 30;
		tw->cfg.scale.drift_every = 3;
		tw->cfg.max_workers = 6;
		tw->cfg.pool_down_intervals = 3;
	}
	tw->snap_at = snap_at;
	tw->now = 1000;
	side_create(tw, &tw->a);
}

static void
twin_free(twin *tw)
{
	cwi_dispatcher_destroy(tw->a.d);
	cwi_dispatcher_destroy(tw->b.d);
	cwi_strbuf_free(&tw->a.events);
	cwi_strbuf_free(&tw->b.events);
	free(tw->snap);
}

/* Saves d, loads the bytes into a fresh dispatcher (returned) and checks
 * that it saves the same bytes. */
static cwi_dispatcher *
round_trip(twin *tw, side *into, const uint8_t *buf, size_t len)
{
	uint8_t *again;
	size_t again_len;

	side_create(tw, into);
	ck_assert_msg(cwi_dispatcher_snapshot_load(into->d, buf, len) ==
		CACHEW_OK,
	    "load: %s", cachew_errmsg());
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(into->d, &again,
			     &again_len), CACHEW_OK);
	ck_assert_msg(again_len == len && memcmp(again, buf, len) == 0,
	    "a loaded snapshot saves %zu other bytes than its %zu", again_len,
	    len);
	free(again);
	return into->d;
}

static void
snap_point(twin *tw)
{
	tw->seen |= state_seen(tw->a.d);
	if (tw->step++ != tw->snap_at || tw->b.d != NULL)
		return;
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(tw->a.d, &tw->snap,
			     &tw->snap_len), CACHEW_OK);
	round_trip(tw, &tw->b, tw->snap, tw->snap_len);
	tw->a.events.len = 0;
}

/* The event lines of both since the snapshot are the same; else the
 * first that differs, from both. */
static void
same_events(const twin *tw)
{
	const cwi_strbuf *a = &tw->a.events, *b = &tw->b.events;
	size_t at = 0, n = a->len < b->len ? a->len : b->len;

	if (tw->b.d == NULL || (a->len == b->len && (a->len == 0 ||
				      memcmp(a->data, b->data, a->len) == 0)))
		return;
	while (at < n && a->data[at] == b->data[at])
		at++;
	while (at > 0 && a->data[at - 1] != '\n')
		at--;
	ck_abort_msg("step %d (snapshot before %d): events differ:\n"
		     "original: %.300s\nloaded:   %.300s",
	    tw->step, tw->snap_at, at < a->len ? a->data + at : "(none)",
	    at < b->len ? b->data + at : "(none)");
}

static void
same_reply(const twin *tw, const cwi_pmsg *ra, const cwi_pmsg *rb)
{
	cwi_strbuf ea, eb;

	cwi_strbuf_init(&ea);
	cwi_strbuf_init(&eb);
	ck_assert_int_eq(cwi_pmsg_encode(ra, &ea), CACHEW_OK);
	ck_assert_int_eq(cwi_pmsg_encode(rb, &eb), CACHEW_OK);
	ck_assert_msg(ea.len == eb.len && memcmp(ea.data, eb.data, ea.len) == 0,
	    "step %d (snapshot before %d): %s replies differ", tw->step,
	    tw->snap_at, cwi_msg_type_name(ra->type));
	cwi_strbuf_free(&ea);
	cwi_strbuf_free(&eb);
}

/* One request to both dispatchers; *rep is the original's (free it). */
static cachew_err
call(twin *tw, const cwi_pmsg *req, cwi_pmsg *rep)
{
	cachew_err rv, rv2;
	cwi_pmsg rep2;

	snap_point(tw);
	rv = cwi_dispatcher_handle(tw->a.d, tw->now, req, rep);
	if (tw->b.d == NULL)
		return rv;
	rv2 = cwi_dispatcher_handle(tw->b.d, tw->now, req, &rep2);
	ck_assert_int_eq(rv, rv2);
	same_reply(tw, rep, &rep2);
	cwi_pmsg_free(&rep2);
	same_events(tw);
	return rv;
}

static void
call_ok(twin *tw, const cwi_pmsg *req, cwi_pmsg *rep)
{
	ck_assert_msg(call(tw, req, rep) == CACHEW_OK, "%s: %s",
	    cwi_msg_type_name(req->type), cachew_errmsg());
}

static void
tick(twin *tw, uint64_t dt)
{
	tw->now += dt;
	snap_point(tw);
	cwi_dispatcher_tick(tw->a.d, tw->now);
	if (tw->b.d != NULL)
		cwi_dispatcher_tick(tw->b.d, tw->now);
	same_events(tw);
}

static void
status(twin *tw)
{
	cwi_pmsg req, rep;

	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	call_ok(tw, &req, &rep);
	cwi_pmsg_free(&rep);
}

/* The planner's state moves on to `text`: its record, applied to both;
 * both then hold the same lines. */
static void
planner(twin *tw, const char *text)
{
	cwi_strbuf rec, a, b;
	bool changed = false;

	tw->now += MS;
	snap_point(tw);
	cwi_strbuf_init(&rec);
	cwi_strbuf_init(&a);
	cwi_strbuf_init(&b);
	ck_assert_msg(cwi_jrec_planner(&rec, tw->now, tw->a.d, text,
			  strlen(text), &changed) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert(changed);
	ck_assert_int_eq(cwi_dispatcher_apply_record(tw->a.d,
			     (const uint8_t *)rec.data, rec.len), CACHEW_OK);
	ck_assert_int_eq(cwi_dispatcher_planner_text(tw->a.d, &a), CACHEW_OK);
	ck_assert_str_eq(a.data, text);
	if (tw->b.d != NULL) {
		ck_assert_int_eq(cwi_dispatcher_apply_record(tw->b.d,
				     (const uint8_t *)rec.data, rec.len),
		    CACHEW_OK);
		ck_assert_int_eq(cwi_dispatcher_planner_text(tw->b.d, &b),
		    CACHEW_OK);
		ck_assert_str_eq(b.data, text);
	}
	cwi_strbuf_free(&rec);
	cwi_strbuf_free(&a);
	cwi_strbuf_free(&b);
}

/* Lines of the planner's state (dispatcher_autocache.h). */
#define PLAN_A "dataset fp=0123456789abcdef0123456789abcdef decided=1 " \
	       "choice=full candidate=0 failed=0 epochs=5 n=1 " \
	       "p0=10,8,1000,0 put_failures=0 last=put reason=kept"
#define PLAN_B "dataset fp=fedcba9876543210fedcba9876543210 decided=0 " \
	       "choice=compute candidate=-1 failed=0 epochs=10 n=0 " \
	       "put_failures=0 last=profile reason="
#define PLAN_STORAGE "storage read_mb_per_s=100 read_rows_per_s=1000000 " \
		     "write_mb_per_s=50"

/* ---- the model ----------------------------------------------------------- */

static size_t
worker_add(twin *tw, const char *address, bool with_fn)
{
	cwi_pmsg req, rep;
	cwi_fn_info fn = {"snap_fn", "snap_plugin", "1.0",
	    "0123456789abcdef0123456789abcdef"};
	mworker *w = &tw->w[tw->nw];

	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = (char *)address;
	req.u.worker_register.cores = 4;
	req.u.worker_register.memory_bytes = 1u << 30;
	req.u.worker_register.build = with_fn ? (char *)"snap-1" : NULL;
	if (with_fn) {
		req.u.worker_register.functions = &fn;
		req.u.worker_register.nfunctions = 1;
	}
	call_ok(tw, &req, &rep);
	memset(w, 0, sizeof(*w));
	w->id = rep.u.worker_register_reply.worker_id;
	w->alive = true;
	cwi_pmsg_free(&rep);
	return tw->nw++;
}

static void
task_forget(mworker *w, uint64_t id)
{
	for (size_t i = 0; i < w->ntasks; i++) {
		if (w->tasks[i].id == id) {
			w->tasks[i] = w->tasks[--w->ntasks];
			return;
		}
	}
}

/* A heartbeat reporting every task the worker holds: what it delivered
 * (every split it leased), its counters and time. */
static void
worker_hb(twin *tw, size_t wi)
{
	mworker *w = &tw->w[wi];
	cwi_task_report rep_tasks[16];
	uint64_t delivered[16][64];
	cwi_op_counters ops[16];
	cwi_pmsg req, rep;

	if (!w->alive)
		return;
	memset(rep_tasks, 0, sizeof(rep_tasks));
	w->run_ns += 400 * MS;
	for (size_t i = 0; i < w->ntasks; i++) {
		cwi_task_report *r = &rep_tasks[i];
		r->task_id = w->tasks[i].id;
		r->done = w->tasks[i].done;
		r->elements = w->run_ns / MS;
		r->bytes = 8 * r->elements;
		r->run_ns = w->run_ns;
		r->stall_ns = w->run_ns / 4;
		r->ops_leases = w->leases;
		memset(&ops[i], 0, sizeof(ops[i]));
		ops[i].name = (char *)"0:range";
		ops[i].elements = r->elements;
		ops[i].busy_ns = w->run_ns / 2;
		ops[i].parallelism = 1;
		r->ops = &ops[i];
		r->nops = 1;
		r->splits_delivered = delivered[i];
		for (size_t k = 0; k < tw->nfl && r->nsplits_delivered < 64;
		     k++)
			if (tw->fl[k].task == r->task_id)
				delivered[i][r->nsplits_delivered++] =
				    tw->fl[k].split;
	}
	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = w->id;
	req.u.worker_heartbeat.cpu_use = 0.5 + (double)(w->run_ns / SEC % 4);
	req.u.worker_heartbeat.draining = w->draining;
	req.u.worker_heartbeat.tasks = rep_tasks;
	req.u.worker_heartbeat.ntasks = w->ntasks;
	if (call(tw, &req, &rep) == CACHEW_OK) {
		const cwi_msg_worker_heartbeat_reply *r =
		    &rep.u.worker_heartbeat_reply;
		for (size_t i = 0; i < r->nstop; i++)
			task_forget(w, r->stop[i]);
		for (size_t i = 0; i < r->nstart && w->ntasks < 16; i++) {
			mtask *t = &w->tasks[w->ntasks++];
			t->id = r->start[i].task_id;
			t->job = r->start[i].job_id;
			t->done = false;
		}
	} else {
		w->alive = false; /* timed out: it is gone */
	}
	cwi_pmsg_free(&rep);
}

static uint32_t
job_clients(const twin *tw, uint64_t job_id)
{
	uint32_t n = 0;

	for (size_t i = 0; i < tw->nc; i++)
		n += tw->c[i].job == job_id && !tw->c[i].gone;
	return n;
}

/* Each task of the worker asks for up to max splits. */
static void
worker_lease(twin *tw, size_t wi, uint32_t max)
{
	mworker *w = &tw->w[wi];

	if (!w->alive)
		return;
	for (size_t i = 0; i < w->ntasks; i++) {
		cwi_pmsg req, rep;
		const cwi_msg_split_lease_reply *r;
		if (w->tasks[i].done)
			continue;
		cwi_pmsg_init(&req, CWI_MSG_SPLIT_LEASE);
		req.u.split_lease.worker_id = w->id;
		req.u.split_lease.task_id = w->tasks[i].id;
		req.u.split_lease.max_splits = max;
		if (call(tw, &req, &rep) != CACHEW_OK) {
			cwi_pmsg_free(&rep);
			continue;
		}
		r = &rep.u.split_lease_reply;
		w->leases++;
		if (r->end_of_splits)
			w->tasks[i].done = true;
		for (size_t k = 0; k < r->nsplits &&
		     tw->nfl < sizeof(tw->fl) / sizeof(tw->fl[0]); k++) {
			inflight *f = &tw->fl[tw->nfl++];
			memset(f, 0, sizeof(*f));
			f->job = w->tasks[i].job;
			f->split = r->splits[k].split_id;
			f->lease = r->splits[k].lease;
			f->task = w->tasks[i].id;
			f->group = r->group;
			f->parts = job_clients(tw, f->job) > 1 ? 2 : 1;
		}
		cwi_pmsg_free(&rep);
	}
}

static void
worker_deregister(twin *tw, size_t wi)
{
	cwi_pmsg req, rep;

	cwi_pmsg_init(&req, CWI_MSG_WORKER_DEREGISTER);
	req.u.worker_deregister.worker_id = tw->w[wi].id;
	call(tw, &req, &rep);
	cwi_pmsg_free(&rep);
	tw->w[wi].alive = false;
}

/* Registers a dataset of `units` split units whose graph is `graph`
 * (borrowed). */
static uint64_t
dataset_add_graph(twin *tw, uint64_t fp, uint64_t units, const void *graph,
    size_t len)
{
	cwi_pmsg req, rep;
	uint64_t id;

	cwi_pmsg_init(&req, CWI_MSG_DATASET_REGISTER);
	req.u.dataset_register.fingerprint.hi = fp;
	req.u.dataset_register.fingerprint.lo = fp * 3;
	req.u.dataset_register.graph = (uint8_t *)graph;
	req.u.dataset_register.graph_len = len;
	req.u.dataset_register.split_units = units;
	req.u.dataset_register.splittable = true;
	call_ok(tw, &req, &rep);
	id = rep.u.dataset_register_reply.dataset_id;
	cwi_pmsg_free(&rep);
	return id;
}

static uint64_t
dataset_add(twin *tw, uint64_t fp, uint64_t units)
{
	return dataset_add_graph(tw, fp, units, cwt_range3_graph,
	    cwt_range3_graph_len);
}

typedef struct job_opts {
	const char *name;
	cwi_processing_mode mode;
	uint32_t num_consumers;
	int64_t consumer_index;
	bool exactly_once;
	const char *scale_policy;
	double weight;
} job_opts;

/* Offers an autocaching pass to the next job created (both sides get
 * their own copy of the plan). */
static void
offer_pass(twin *tw, cwi_job_pass *pa, cwi_job_pass *pb, uint64_t units)
{
	cwi_job_pass *p[2] = {pa, pb};

	for (int i = 0; i < 2; i++) {
		memset(p[i], 0, sizeof(*p[i]));
		p[i]->graph = malloc(cwt_range3_graph_len);
		ck_assert_ptr_nonnull(p[i]->graph);
		memcpy(p[i]->graph, cwt_range3_graph, cwt_range3_graph_len);
		p[i]->graph_len = cwt_range3_graph_len;
		p[i]->units = units;
		p[i]->worker_scale = 0.5;
		snprintf(p[i]->mode, sizeof(p[i]->mode), "put");
		snprintf(p[i]->event, sizeof(p[i]->event), "snapshot test");
		p[i]->ctx = &tw->pass_ctx;
	}
}

static size_t
client_join(twin *tw, uint64_t ds, const job_opts *o, cwi_job_pass *pass)
{
	cwi_pmsg req, rep;
	cwi_job_pass pb;
	mclient *c = &tw->c[tw->nc];

	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = ds;
	req.u.job_get_or_create.job_name = (char *)o->name;
	req.u.job_get_or_create.processing_mode = o->mode;
	req.u.job_get_or_create.num_consumers = o->num_consumers;
	req.u.job_get_or_create.consumer_index =
	    o->num_consumers > 0 ? o->consumer_index : -1;
	req.u.job_get_or_create.exactly_once = o->exactly_once;
	req.u.job_get_or_create.scale_policy = (char *)o->scale_policy;
	req.u.job_get_or_create.weight = o->weight;
	req.u.job_get_or_create.seed = 42;
	if (pass != NULL) {
		/* The offer is made inside the step, after its snapshot. */
		snap_point(tw);
		tw->step--;
		offer_pass(tw, pass, &pb, pass->units > 0 ? pass->units : 40);
		cwi_dispatcher_offer_pass(tw->a.d, pass);
		if (tw->b.d != NULL)
			cwi_dispatcher_offer_pass(tw->b.d, &pb);
	}
	call_ok(tw, &req, &rep);
	if (pass != NULL) {
		cwi_dispatcher_offer_pass(tw->a.d, NULL);
		if (tw->b.d != NULL)
			cwi_dispatcher_offer_pass(tw->b.d, NULL);
		free(pass->graph);
		free(pb.graph);
	}
	memset(c, 0, sizeof(*c));
	c->job = rep.u.job_get_or_create_reply.job_id;
	c->id = rep.u.job_get_or_create_reply.client_id;
	c->consumer_index = req.u.job_get_or_create.consumer_index;
	cwi_pmsg_free(&rep);
	return tw->nc++;
}

/* A split read by two clients: each acknowledges its part. */
static void
ack_part(twin *tw, const mclient *c, const inflight *f)
{
	cwi_pmsg req, rep;
	uint64_t id = f->split, parts = 2, lease = f->lease;

	cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
	req.u.split_ack.job_id = c->job;
	req.u.split_ack.client_id = c->id;
	req.u.split_ack.split_ids = &id;
	req.u.split_ack.nsplit_ids = 1;
	req.u.split_ack.parts = &parts;
	req.u.split_ack.nparts = 1;
	req.u.split_ack.leases = &lease;
	req.u.split_ack.nleases = 1;
	call(tw, &req, &rep);
	cwi_pmsg_free(&rep);
}

/* A client heartbeat: batches and waits for the scalers, the next round
 * (coordinated), acknowledgements of up to nack splits of its job, and
 * (exactly once) the tasks it was told to stop with what it received of
 * their groups (their first three elements). */
static void
client_hb(twin *tw, size_t ci, size_t nack, uint64_t batch_ns)
{
	mclient *c = &tw->c[ci];
	uint64_t acked[64], stopped[16];
	cwi_progress progress[16];
	uint64_t ranges[16][2];
	size_t nacked = 0, nprogress = 0;
	cwi_pmsg req, rep;

	if (c->gone)
		return;
	for (size_t k = 0; k < tw->nfl && nacked < nack && nacked < 64;) {
		inflight *f = &tw->fl[k];
		if (f->job != c->job || f->acked_by == c->id) {
			k++;
			continue;
		}
		if (f->parts == 2) {
			ack_part(tw, c, f);
			nack--;
			if (f->acked_by == 0) {
				f->acked_by = c->id;
				k++;
				continue;
			}
		} else {
			acked[nacked++] = f->split;
		}
		tw->fl[k] = tw->fl[--tw->nfl];
	}
	for (size_t i = 0; i < c->nstop; i++) {
		stopped[i] = c->stop[i];
		for (size_t k = 0; k < tw->nfl && nprogress < 16;) {
			if (tw->fl[k].task != c->stop[i]) {
				k++;
				continue;
			}
			ranges[nprogress][0] = 0;
			ranges[nprogress][1] = 3;
			memset(&progress[nprogress], 0, sizeof(progress[0]));
			progress[nprogress].group = tw->fl[k].group;
			progress[nprogress].ranges = ranges[nprogress];
			progress[nprogress].nranges = 2;
			nprogress++;
			tw->fl[k] = tw->fl[--tw->nfl];
		}
	}
	c->elements += 100;
	cwi_pmsg_init(&req, CWI_MSG_CLIENT_HEARTBEAT);
	req.u.client_heartbeat.job_id = c->job;
	req.u.client_heartbeat.client_id = c->id;
	req.u.client_heartbeat.batch_time_ns = batch_ns;
	req.u.client_heartbeat.batches = batch_ns > 0 ? 25 : 0;
	req.u.client_heartbeat.wait_time_ns = batch_ns * 5;
	req.u.client_heartbeat.buffer_fill = 0.25;
	req.u.client_heartbeat.round = c->round;
	req.u.client_heartbeat.acked_splits = acked;
	req.u.client_heartbeat.nacked_splits = nacked;
	req.u.client_heartbeat.elements_received = c->elements;
	req.u.client_heartbeat.bytes_received = 8 * c->elements;
	req.u.client_heartbeat.stopped_tasks = stopped;
	req.u.client_heartbeat.nstopped_tasks = c->nstop;
	req.u.client_heartbeat.progress = progress;
	req.u.client_heartbeat.nprogress = nprogress;
	c->nstop = 0;
	if (call(tw, &req, &rep) == CACHEW_OK) {
		const cwi_msg_client_heartbeat_reply *r =
		    &rep.u.client_heartbeat_reply;
		for (size_t i = 0; i < r->nstop_tasks && c->nstop < 16; i++)
			c->stop[c->nstop++] = r->stop_tasks[i];
		if (c->consumer_index >= 0 &&
		    (r->block_round == CWI_ROUND_NONE ||
			c->round + 2 < r->block_round))
			c->round += 2;
	} else {
		c->gone = true; /* timed out, or its job is gone */
	}
	cwi_pmsg_free(&rep);
}

static void
client_release(twin *tw, size_t ci)
{
	cwi_pmsg req, rep;
	mclient *c = &tw->c[ci];

	cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
	req.u.job_release.job_id = c->job;
	req.u.job_release.client_id = c->id;
	req.u.job_release.elements_received = c->elements;
	req.u.job_release.bytes_received = 8 * c->elements;
	call(tw, &req, &rep);
	cwi_pmsg_free(&rep);
	c->gone = true;
}

/* One round of the cluster: every live worker heartbeats and leases,
 * every client heartbeats acknowledging what it can, time passes. */
static void
cluster_round(twin *tw, uint32_t max_lease, size_t nack, uint64_t batch_ns)
{
	for (size_t i = 0; i < tw->nw; i++) {
		worker_hb(tw, i);
		worker_lease(tw, i, max_lease);
	}
	for (size_t i = 0; i < tw->nc; i++)
		client_hb(tw, i, nack, batch_ns);
	tick(tw, 300 * MS);
}

/* Rounds until every client is gone: each releases its job once the job
 * has no splits in flight and its workers' tasks said they were done;
 * a bounded number of rounds. */
static void
run_to_end(twin *tw, uint64_t batch_ns)
{
	for (int r = 0; r < 60; r++) {
		bool any = false;
		cluster_round(tw, 4, 8, batch_ns);
		for (size_t i = 0; i < tw->nc; i++)
			any |= !tw->c[i].gone;
		if (!any)
			break;
		if (r >= 30)
			for (size_t i = 0; i < tw->nc; i++)
				if (!tw->c[i].gone)
					client_release(tw, i);
	}
	status(tw);
	tick(tw, 30 * SEC); /* timeouts: every worker and client goes */
	status(tw);
}

/* ---- scenarios ----------------------------------------------------------- */

/* Workers joining, dying and deregistering; a named job shared by two
 * clients (parts acknowledged by each), a private one, parallel_epochs,
 * one that finishes early, and a dataset nobody uses any more. */
static void
scenario_registry(twin *tw)
{
	job_opts shared = {"shared", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false,
	    NULL, 0};
	job_opts priv = {NULL, CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false, NULL,
	    0};
	job_opts par = {NULL, CWI_MODE_PARALLEL_EPOCHS, 0, -1, false, NULL, 0};
	uint64_t ds1, ds2, ds3;
	size_t w3, early;

	worker_add(tw, "tcp://10.0.0.1:7000", true);
	worker_add(tw, "tcp://10.0.0.2:7000", false);
	ds1 = dataset_add(tw, 11, 40);
	ds2 = dataset_add(tw, 12, 25);
	ds3 = dataset_add(tw, 13, 5);
	client_join(tw, ds1, &shared, NULL);
	client_join(tw, ds1, &shared, NULL);
	client_join(tw, ds2, &priv, NULL);
	client_join(tw, ds2, &par, NULL);
	early = client_join(tw, ds3, &priv, NULL);
	cluster_round(tw, 2, 2, 0);
	client_release(tw, early);
	w3 = worker_add(tw, "tcp://10.0.0.3:7000", false);
	cluster_round(tw, 2, 1, 0);
	cluster_round(tw, 2, 3, 0);
	/* Worker 2 falls silent: it dies with splits leased. */
	tw->w[1].alive = false;
	for (int i = 0; i < 4; i++)
		cluster_round(tw, 2, 1, 0);
	/* Worker 3 delivers splits nobody acknowledged yet, then leaves:
	 * they stay leased to its task that is gone (orphans). */
	worker_lease(tw, w3, 3);
	worker_hb(tw, w3);
	status(tw);
	worker_deregister(tw, w3);
	worker_add(tw, "tcp://10.0.0.4:7000", false);
	cluster_round(tw, 3, 4, 0);
	run_to_end(tw, 0);
}

/* nclients clients join an exactly-once job of dataset ds on the two
 * workers, which lease and deliver for two rounds; then worker 1 stops:
 * its task goes after the timeout. */
static void
eo_worker_dies(twin *tw, uint64_t ds, const job_opts *eo, size_t nclients)
{
	for (size_t c = 0; c < nclients; c++)
		client_join(tw, ds, eo, NULL);
	cluster_round(tw, 2, 0, 0);
	cluster_round(tw, 2, 1, 0);
	tw->w[0].alive = false;
	for (int i = 0; i < 3; i++) {
		worker_hb(tw, 1);
		for (size_t c = 0; c < nclients; c++)
			client_hb(tw, c, 0, 0);
		tick(tw, 4 * SEC);
	}
}

/* Exactly once: a worker dies with groups leased, its task goes, the
 * groups wait RECOVERING for both clients' reports (skip ranges), then
 * are leased again with what the clients already have left out. */
static void
scenario_exactly_once(twin *tw)
{
	job_opts eo = {"eo", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, true, NULL, 0};
	uint64_t ds;

	worker_add(tw, "tcp://10.0.0.1:7000", false);
	worker_add(tw, "tcp://10.0.0.2:7000", false);
	ds = dataset_add(tw, 21, 30);
	eo_worker_dies(tw, ds, &eo, 2);
	/* One client reports (told to stop), the other later. */
	client_hb(tw, 0, 0, 0);
	client_hb(tw, 0, 0, 0);
	worker_hb(tw, 1);
	status(tw);
	client_hb(tw, 1, 0, 0);
	client_hb(tw, 1, 0, 0);
	worker_add(tw, "tcp://10.0.0.3:7000", false);
	cluster_round(tw, 2, 1, 0);
	run_to_end(tw, 0);
}

/* A job whose worker part holds a shuffle: its pool goes in a seeded order
 * at the first lease, which a snapshot does not hold but a loaded one
 * derives again, so a snapshot before the first lease, or after it, hands
 * the same splits to the same tasks as the original (the replies are
 * compared). A worker dies on the way: its splits come first again. */
static void
scenario_shuffled(twin *tw)
{
	job_opts eo = {"shuf", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, true, NULL,
	    0};
	cachew_dataset *ds = cwt_parse("range(40) | shuffle(40, seed=3)");
	void *graph = NULL;
	size_t len = 0;
	uint64_t id;

	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &graph, &len),
	    CACHEW_OK);
	worker_add(tw, "tcp://10.0.0.1:7000", false);
	worker_add(tw, "tcp://10.0.0.2:7000", false);
	id = dataset_add_graph(tw, 41, 40, graph, len);
	eo_worker_dies(tw, id, &eo, 1);
	client_hb(tw, 0, 0, 0);
	run_to_end(tw, 0);
	cachew_free(graph);
	cachew_dataset_release(ds);
}

/* Coordinated reads: two consumers, rounds, a worker added (a schedule
 * change announced, pending until both consumers acknowledge it) and one
 * that deregisters. */
static void
scenario_coordinated(twin *tw)
{
	job_opts c0 = {"coord", CWI_MODE_DISTRIBUTED_EPOCH, 2, 0, false, NULL,
	    0};
	job_opts c1 = c0;
	uint64_t ds;
	size_t w2;

	c1.consumer_index = 1;
	worker_add(tw, "tcp://10.0.0.1:7000", false);
	ds = dataset_add(tw, 31, 48);
	client_join(tw, ds, &c0, NULL);
	client_join(tw, ds, &c1, NULL);
	cluster_round(tw, 2, 1, 0);
	w2 = worker_add(tw, "tcp://10.0.0.2:7000", false);
	worker_hb(tw, w2);
	client_hb(tw, 0, 1, 0);
	status(tw);
	cluster_round(tw, 2, 1, 0);
	client_hb(tw, 1, 1, 0);
	cluster_round(tw, 2, 2, 0);
	/* Worker 2 drains: its task is removed at an announced round. */
	tw->w[w2].draining = true;
	cluster_round(tw, 2, 1, 0);
	cluster_round(tw, 2, 1, 0);
	worker_deregister(tw, w2);
	cluster_round(tw, 2, 2, 0);
	run_to_end(tw, 0);
}

/* The policy engine: three jobs with different policies and weights,
 * fed batches so the scalers sit in their windows, decisions stepped. */
static void
scenario_autoscale(twin *tw)
{
	job_opts model = {"model", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false,
	    "model", 2.0};
	job_opts cachew = {"cachew", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false,
	    "cachew", 1.0};
	job_opts hpa = {NULL, CWI_MODE_PARALLEL_EPOCHS, 0, -1, false, "hpa:60",
	    0};
	uint64_t ds;

	worker_add(tw, "tcp://10.0.0.1:7000", false);
	worker_add(tw, "tcp://10.0.0.2:7000", false);
	worker_add(tw, "tcp://10.0.0.3:7000", false);
	ds = dataset_add(tw, 41, 120);
	client_join(tw, ds, &model, NULL);
	client_join(tw, ds, &cachew, NULL);
	client_join(tw, ds, &hpa, NULL);
	/* Batch times that move (drift), over 30 s of samples (hpa
	 * decides every 15 s). */
	for (int i = 0; i < 14; i++) {
		cluster_round(tw, 1, 1, (uint64_t)(4 + i % 5 * 3) * MS);
		tick(tw, 700 * MS);
	}
	worker_add(tw, "tcp://10.0.0.4:7000", false);
	for (int i = 0; i < 16; i++) {
		cluster_round(tw, 1, 1, (uint64_t)(3 + i % 4 * 4) * MS);
		tick(tw, 700 * MS);
	}
	run_to_end(tw, 3 * MS);
}

/* Autocaching: a pass offered to a job (its own graph and units), run to
 * its end (queued, not taken), and a named job's next iteration. */
static void
scenario_pass(twin *tw)
{
	job_opts pass_job = {"ac", CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false,
	    NULL, 0};
	cwi_job_pass pa;
	uint64_t ds;

	worker_add(tw, "tcp://10.0.0.1:7000", false);
	ds = dataset_add(tw, 51, 30);
	pa.units = 24;
	planner(tw, PLAN_B "\n");
	client_join(tw, ds, &pass_job, &pa);
	cluster_round(tw, 2, 2, 0);
	cluster_round(tw, 2, 2, 0);
	status(tw);
	run_to_end(tw, 0);
	planner(tw, PLAN_STORAGE "\n" PLAN_B "\n" PLAN_A "\n");
	pass_job.name = "ac2";
	client_join(tw, ds, &pass_job, NULL);
	cluster_round(tw, 2, 2, 0);
	planner(tw, PLAN_STORAGE "\n" PLAN_B " again\n" PLAN_A "\n");
	run_to_end(tw, 0);
}

typedef void (*scenario_fn)(twin *);

/* Each scenario with the kinds of state it must pass through. */
static const struct {
	const char *name;
	scenario_fn fn;
	bool autoscale;
	unsigned seen;
} scenarios[] = {
	{"registry", scenario_registry, false,
	    SEEN_LEASED | SEEN_ORPHAN | SEEN_ACKERS | SEEN_FINISHED |
		SEEN_PARALLEL},
	{"exactly_once", scenario_exactly_once, false,
	    SEEN_LEASED | SEEN_RECOVERING | SEEN_SKIP | SEEN_FINISHED},
	{"coordinated", scenario_coordinated, false,
	    SEEN_LEASED | SEEN_SCHEDULE | SEEN_STARTING | SEEN_REMOVING},
	{"autoscale", scenario_autoscale, true,
	    SEEN_LEASED | SEEN_SCALER | SEEN_POOL | SEEN_PARALLEL},
	{"shuffled", scenario_shuffled, false,
	    SEEN_LEASED | SEEN_RECOVERING | SEEN_FINISHED},
	{"pass", scenario_pass, false,
	    SEEN_LEASED | SEEN_PASS | SEEN_PASS_END | SEEN_FINISHED |
		SEEN_PLANNER},
};

#define NSCENARIOS (sizeof(scenarios) / sizeof(scenarios[0]))

/* Runs scenario i with the snapshot before step snap_at; returns the
 * number of steps. */
static int
run_scenario(size_t i, int snap_at, uint8_t **snap, size_t *snap_len)
{
	twin tw;
	int steps;

	twin_init(&tw, snap_at, scenarios[i].autoscale);
	scenarios[i].fn(&tw);
	steps = tw.step;
	if (getenv("SNAP_DEBUG") != NULL)
		fprintf(stderr, "%s: %d steps, seen 0x%x\n%.*s\n",
		    scenarios[i].name, steps, tw.seen, (int)tw.a.events.len,
		    tw.a.events.data);
	ck_assert_msg((tw.seen & scenarios[i].seen) == scenarios[i].seen,
	    "scenario %s never reached the states 0x%x", scenarios[i].name,
	    scenarios[i].seen & ~tw.seen);
	if (snap != NULL) {
		*snap = tw.snap;
		*snap_len = tw.snap_len;
		tw.snap = NULL;
	}
	twin_free(&tw);
	return steps;
}

/* ---- tests --------------------------------------------------------------- */

/* Scenario _i (a loop test: one per scenario) with the snapshot before
 * each of its steps (under valgrind, fifteen spread over them). */
START_TEST(snapshot_round_trips_and_behaves_alike)
{
	size_t i = (size_t)_i;
	int steps = run_scenario(i, -1, NULL, NULL);
	int stride = getenv("CWT_VALGRIND") != NULL ? steps / 15 + 1 : 1;

	ck_assert_int_gt(steps, 20);
	for (int at = 0; at < steps; at += stride)
		run_scenario(i, at, NULL, NULL);
}
END_TEST


/* A loaded corrupt snapshot must hold together: it saves, that loads and
 * saves the same bytes, and the state machine runs on it. */
static void
corrupt_one(const uint8_t *buf, size_t len, size_t *loaded)
{
	twin tw;
	cwi_pmsg req, rep;

	twin_init(&tw, -1, true); /* decide() runs the scalers too */
	if (cwi_dispatcher_snapshot_load(tw.a.d, buf, len) != CACHEW_OK) {
		const char *msg = cachew_errmsg();
		ck_assert_msg(strncmp(msg, "dispatcher snapshot: ", 21) == 0,
		    "message: %s", msg);
		ck_assert_int_eq(tw.a.d->jobs.n + tw.a.d->workers.n, 0);
		twin_free(&tw);
		return;
	}
	(*loaded)++;
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(tw.a.d, &tw.snap,
			     &tw.snap_len), CACHEW_OK);
	round_trip(&tw, &tw.b, tw.snap, tw.snap_len);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(cwi_dispatcher_handle(tw.a.d, tw.a.d->now + 1, &req,
			     &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_dispatcher_tick(tw.a.d, tw.a.d->now + 1);
	cwi_dispatcher_decide(tw.a.d, tw.a.d->now + 1);
	cwi_dispatcher_tick(tw.a.d, tw.a.d->now + 60 * SEC);
	twin_free(&tw);
}

/* SNAP_CORPUS_DIR=test/fuzz/corpus/fuzz_dispatcher_snapshot writes the
 * snapshots taken mid-way through the scenarios there: the fuzz target's
 * seed corpus is made this way. */
static void
corpus_write(const char *name, const uint8_t *buf, size_t len)
{
	const char *dir = getenv("SNAP_CORPUS_DIR");
	char path[512];
	FILE *f;

	if (dir == NULL)
		return;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
	fclose(f);
}

/* Truncations at every offset and single-bit flips of every bit of a
 * snapshot taken mid-way through scenario _i (a loop test; under
 * valgrind, which runs this some fifty times slower, a spread of them). */
START_TEST(snapshot_corrupt_input_fails_or_holds_together)
{
	size_t stride = getenv("CWT_VALGRIND") != NULL ? 13 : 1;
	size_t i = (size_t)_i, len, loaded = 0;
	int steps = run_scenario(i, -1, NULL, NULL);
	uint8_t *snap, *bad;

	run_scenario(i, steps / 2, &snap, &len);
	ck_assert_ptr_nonnull(snap);
	corpus_write(scenarios[i].name, snap, len);
	bad = malloc(len);
	ck_assert_ptr_nonnull(bad);
	for (size_t n = 0; n < len; n += stride) {
		memcpy(bad, snap, n);
		corrupt_one(bad, n, &loaded);
	}
	ck_assert_uint_eq(loaded, 0); /* no prefix is a snapshot */
	for (size_t bit = 0; bit < 8 * len; bit += stride) {
		memcpy(bad, snap, len);
		bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		corrupt_one(bad, len, &loaded);
	}
	if (getenv("SNAP_DEBUG") != NULL)
		fprintf(stderr, "%s: %zu bytes, %zu flips loaded\n",
		    scenarios[i].name, len, loaded);
	/* Flips of counters and times load; of types and counts do not. */
	ck_assert_uint_gt(loaded, 0);
	ck_assert_uint_lt(loaded, 8 * len / stride);
	free(bad);
	free(snap);
}
END_TEST

/* The messages name the field that is wrong. */
START_TEST(snapshot_errors_name_the_field)
{
	twin tw;
	uint8_t *snap;
	size_t len;
	cwi_dispatcher *d;
	static const uint8_t not_snapshot[] = {0x92, 0xa3, 'a', 'b', 'c', 0x01};

	run_scenario(1, 40, &snap, &len);
	twin_init(&tw, -1, false);
	d = tw.a.d;
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, not_snapshot,
			     sizeof(not_snapshot)), CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "magic"));
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len - 1),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "truncated"));
	/* The version follows the magic (after the array16 header): a
	 * later one is refused. */
	snap[3 + 1 + strlen("cachew-dispatcher-snapshot")] = 4;
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "version: 4 is not 1 to 3"));
	/* Version 1 has two fields fewer, version 2 one. */
	snap[3 + 1 + strlen("cachew-dispatcher-snapshot")] = 1;
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "20 fields, 18 expected"));
	snap[3 + 1 + strlen("cachew-dispatcher-snapshot")] = 2;
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "20 fields, 19 expected"));
	snap[3 + 1 + strlen("cachew-dispatcher-snapshot")] = 3;
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len), CACHEW_OK);
	/* A dispatcher that holds a state does not load another. */
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(d, snap, len),
	    CACHEW_EINVAL);
	free(snap);
	twin_free(&tw);
}
END_TEST

/* A snapshot with the planner's state in b, from a and then changed by
 * swap (from, to: same length) at its first occurrence. */
static void
snap_swapped(cwi_dispatcher *a, const char *from, const char *to,
    uint8_t **buf, size_t *len)
{
	uint8_t *at;

	ck_assert_int_eq(cwi_dispatcher_snapshot_save(a, buf, len), CACHEW_OK);
	if (from == NULL)
		return;
	at = memmem(*buf, *len, from, strlen(from));
	ck_assert_ptr_nonnull(at);
	memcpy(at, to, strlen(to));
}

/* The planner's state lines go into the snapshot and come back in their
 * order; a version 1 snapshot (before they were kept) loads with none;
 * lines that are not the planner's, or twice of one key, fail the load
 * naming the line. */
START_TEST(snapshot_carries_the_planner_state)
{
	const char *text = PLAN_STORAGE "\n" PLAN_A "\n" PLAN_B "\n";
	size_t vpos = 3 + 1 + strlen("cachew-dispatcher-snapshot");
	twin tw;
	side loaded;
	uint8_t *snap;
	size_t len;
	cwi_strbuf sb;

	twin_init(&tw, -1, false);
	/* Empty: the version 2 form is this without the last field (the
	 * owners), version 1 without the last two. */
	snap_swapped(tw.a.d, NULL, NULL, &snap, &len);
	ck_assert_uint_eq(snap[2], 20);
	ck_assert_uint_eq(snap[vpos], 3);
	ck_assert_uint_eq(snap[len - 2], 0x90);
	ck_assert_uint_eq(snap[len - 1], 0x90);
	snap[2] = 19;
	snap[vpos] = 2;
	side_create(&tw, &loaded);
	ck_assert_msg(cwi_dispatcher_snapshot_load(loaded.d, snap, len - 1) ==
		CACHEW_OK, "%s", cachew_errmsg());
	cwi_dispatcher_destroy(loaded.d);
	cwi_strbuf_free(&loaded.events);
	snap[2] = 18;
	snap[vpos] = 1;
	side_create(&tw, &loaded);
	ck_assert_msg(cwi_dispatcher_snapshot_load(loaded.d, snap, len - 2) ==
		CACHEW_OK, "%s", cachew_errmsg());
	ck_assert_uint_eq(loaded.d->nplanner, 0);
	cwi_dispatcher_destroy(loaded.d);
	cwi_strbuf_free(&loaded.events);
	free(snap);

	planner(&tw, PLAN_A "\n" PLAN_B "\n");
	planner(&tw, text); /* the storage line comes first */
	snap_swapped(tw.a.d, NULL, NULL, &snap, &len);
	round_trip(&tw, &tw.b, snap, len);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dispatcher_planner_text(tw.b.d, &sb), CACHEW_OK);
	ck_assert_str_eq(sb.data, text);
	cwi_strbuf_free(&sb);
	free(snap);

	snap_swapped(tw.a.d, "storage ", "storagX ", &snap, &len);
	side_create(&tw, &loaded);
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(loaded.d, snap, len),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "planner[0]: not a planner "
					      "line") != NULL,
	    "%s", cachew_errmsg());
	ck_assert_uint_eq(loaded.d->nplanner, 0);
	free(snap);
	snap_swapped(tw.a.d, "fedcba9876543210fedcba9876543210",
	    "0123456789abcdef0123456789abcdef", &snap, &len);
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(loaded.d, snap, len),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "planner[2]: a second line of "
					      "\"dataset fp=0123") != NULL,
	    "%s", cachew_errmsg());
	cwi_dispatcher_destroy(loaded.d);
	cwi_strbuf_free(&loaded.events);
	free(snap);
	twin_free(&tw);
}
END_TEST

/* Measures a job of 10,000 splits (half leased, a quarter acknowledged):
 * prints the size and times, asserts only the round trip. */
START_TEST(snapshot_size_and_time_of_10000_splits)
{
	twin tw;
	uint8_t *snap;
	size_t len;
	uint64_t t0, t1, t2;
	job_opts o = {NULL, CWI_MODE_DISTRIBUTED_EPOCH, 0, -1, false, NULL, 0};
	side loaded;
	uint64_t ds;

	twin_init(&tw, -1, false);
	cwi_dispatcher_destroy(tw.a.d);
	cwi_strbuf_free(&tw.a.events);
	tw.cfg.splits_per_worker = 10000;
	side_create(&tw, &tw.a);
	worker_add(&tw, "tcp://10.0.0.1:7000", false);
	ds = dataset_add(&tw, 61, 10000);
	client_join(&tw, ds, &o, NULL);
	ck_assert_uint_eq(JOB(tw.a.d, 0)->ledger.nsplits, 10000);
	worker_hb(&tw, 0);
	for (int i = 0; i < 1250; i++) {
		worker_lease(&tw, 0, 4);
		client_hb(&tw, 0, 2, 0);
		tw.nfl = 0; /* the other two stay leased */
	}
	t0 = cwi_now_ns();
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(tw.a.d, &snap, &len),
	    CACHEW_OK);
	t1 = cwi_now_ns();
	side_create(&tw, &loaded);
	ck_assert_int_eq(cwi_dispatcher_snapshot_load(loaded.d, snap, len),
	    CACHEW_OK);
	t2 = cwi_now_ns();
	fprintf(stderr, "snapshot of 10000 splits (%" PRIu64 " leased, %"
	    PRIu64 " acked): %zu bytes, save %.2f ms, load %.2f ms\n",
	    JOB(tw.a.d, 0)->ledger.nleased, JOB(tw.a.d, 0)->ledger.nacked,
	    len, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6);
	cwi_dispatcher_destroy(loaded.d);
	cwi_strbuf_free(&loaded.events);
	free(snap);
	twin_free(&tw);
}
END_TEST

/* A case of its own for each test (CK_RUN_CASE picks one); a loop test
 * runs once per scenario. */
static void
add_case(Suite *s, const char *name, const TTest *test, bool per_scenario)
{
	TCase *tc = tcase_create(name);

	tcase_set_timeout(tc, 120);
	if (per_scenario)
		tcase_add_loop_test(tc, test, 0, (int)NSCENARIOS);
	else
		tcase_add_test(tc, test);
	suite_add_tcase(s, tc);
}

Suite *
cwt_snapshot_suite(void)
{
	Suite *s = suite_create("snapshot");

	add_case(s, "behaves_alike", snapshot_round_trips_and_behaves_alike,
	    true);
	add_case(s, "corrupt", snapshot_corrupt_input_fails_or_holds_together,
	    true);
	add_case(s, "errors", snapshot_errors_name_the_field, false);
	add_case(s, "planner", snapshot_carries_the_planner_state, false);
	add_case(s, "size", snapshot_size_and_time_of_10000_splits, false);
	return s;
}
