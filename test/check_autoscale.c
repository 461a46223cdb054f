/*
 * check_autoscale.c - the policy engine inside the dispatcher: scalers,
 * fair share and the pool target driven through the dispatcher's state
 * machine with a clock the tests advance by hand (no processes), the new
 * protocol fields, and end to end: a `cachewd --role=dispatcher
 * --provisioner process` that starts its own workers for a job.
 */
#include "cwt.h"

#include "../src/service/dispatcher/dispatcher_metrics.h"
#include "../src/service/dispatcher/dispatcher_state.h"
#include "../src/service/service_rpc.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MS 1000000ull
#define SEC 1000000000ull

/* ---- a dispatcher on a fake clock ------------------------------------------ */

typedef struct harness {
	cwi_dispatcher *d;
	uint64_t now;
	cwi_strbuf events;
} harness;

static void
collect_event(void *ctx, const char *line, size_t len)
{
	harness *h = ctx;

	cwi_strbuf_append(&h->events, line, len);
	cwi_strbuf_append(&h->events, "\n", 1);
}

/* Small windows and no discards, so one interval of samples is a whole
 * window: a test states a measurement and gets the decision that follows
 * from it. */
static harness *
harness_new(const char *policy)
{
	harness *h = calloc(1, sizeof(*h));
	cwi_dispatcher_config cfg;

	ck_assert_ptr_nonnull(h);
	cwi_dispatcher_config_default(&cfg);
	cfg.autoscale = true;
	ck_assert_int_eq(cwi_scale_parse(&cfg.scale, policy), CACHEW_OK);
	cfg.scale.window_batches = 10;
	cfg.scale.min_step_batches = 10;
	cfg.scale.discard_epoch = 0;
	cfg.scale.discard_change = 0;
	cfg.worker_timeout_ns = 1000 * SEC;
	cfg.client_timeout_ns = 1000 * SEC;
	cfg.decision_interval_ns = 500 * MS;
	cfg.pool_down_intervals = 2;
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
	ck_assert_msg(cwi_dispatcher_worker_register(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	return rep.worker_id;
}

static void
add_workers(harness *h, uint64_t *ids, int n)
{
	for (int i = 0; i < n; i++) {
		char addr[64];
		snprintf(addr, sizeof(addr), "tcp://10.0.0.%d:7000", i + 1);
		ids[i] = add_worker(h, addr);
	}
}

static uint64_t
add_dataset(harness *h)
{
	cwi_msg_dataset_register req = {{7, 21},
	    (uint8_t *)cwt_range3_graph, cwt_range3_graph_len, 100000, true};
	cwi_msg_dataset_register_reply rep;

	ck_assert_int_eq(cwi_dispatcher_dataset_register(h->d, h->now, &req,
			     &rep), CACHEW_OK);
	return rep.dataset_id;
}

typedef struct job_opts {
	const char *name;
	uint64_t iteration;
	const char *policy;
	double weight;
	uint32_t min_workers, max_workers;
	uint32_t fixed_workers; /* the old worker_policy=fixed */
} job_opts;

static cachew_err
try_join(harness *h, uint64_t ds, const job_opts *o, uint64_t *job,
    uint64_t *client)
{
	cwi_msg_job_get_or_create req;
	cwi_msg_job_get_or_create_reply rep;
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &req);
	req.dataset_id = ds;
	req.job_name = (char *)o->name;
	req.iteration = o->iteration;
	req.scale_policy = (char *)o->policy;
	req.weight = o->weight;
	req.min_workers = o->min_workers;
	req.max_workers = o->max_workers;
	if (o->fixed_workers > 0) {
		req.worker_policy = CWI_WORKERS_FIXED;
		req.num_workers = o->fixed_workers;
	}
	rv = cwi_dispatcher_job_get_or_create(h->d, h->now, &req, &rep);
	*job = rep.job_id;
	*client = rep.client_id;
	cwi_pmsg_body_free(CWI_MSG_JOB_GET_OR_CREATE_REPLY, &rep);
	return rv;
}

static void
join(harness *h, uint64_t ds, const job_opts *o, uint64_t *job,
    uint64_t *client)
{
	ck_assert_msg(try_join(h, ds, o, job, client) == CACHEW_OK, "%s",
	    cachew_errmsg());
}

static void
release(harness *h, uint64_t job, uint64_t client)
{
	cwi_msg_job_release req = {.job_id = job, .client_id = client};

	ck_assert_int_eq(cwi_dispatcher_job_release(h->d, h->now, &req),
	    CACHEW_OK);
}

/* A client heartbeat: `batches` batches of batch_ms each, of which the
 * client waited wait_ms in all. */
static void
client_hb(harness *h, uint64_t job, uint64_t client, uint64_t batches,
    double batch_ms, double wait_ms)
{
	cwi_msg_client_heartbeat req;
	cwi_msg_client_heartbeat_reply rep;

	cwi_pmsg_body_init(CWI_MSG_CLIENT_HEARTBEAT, &req);
	req.job_id = job;
	req.client_id = client;
	req.batches = batches;
	req.batch_time_ns = (uint64_t)(batch_ms * 1e6);
	req.wait_time_ns = (uint64_t)(wait_ms * 1e6);
	ck_assert_msg(cwi_dispatcher_client_heartbeat(h->d, h->now, &req,
			  &rep) == CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_pmsg_body_free(CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep);
}

/* A heartbeat of worker wid reporting every task the dispatcher gave it,
 * each with the cumulative run and stall times, at cpu_use cores busy. */
static void
worker_hb(harness *h, uint64_t wid, uint64_t run_ns, uint64_t stall_ns,
    double cpu_use)
{
	cwi_msg_status_reply st;
	cwi_msg_worker_heartbeat req = {0};
	cwi_msg_worker_heartbeat_reply rep;

	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	req.worker_id = wid;
	req.cpu_use = cpu_use;
	req.tasks = calloc(st.ntasks + 1, sizeof(*req.tasks));
	ck_assert_ptr_nonnull(req.tasks);
	for (size_t i = 0; i < st.ntasks; i++) {
		if (st.tasks[i].worker_id != wid)
			continue;
		cwi_task_report *r = &req.tasks[req.ntasks++];
		r->task_id = st.tasks[i].task_id;
		r->run_ns = run_ns;
		r->stall_ns = stall_ns;
	}
	ck_assert_int_eq(cwi_dispatcher_worker_heartbeat(h->d, h->now, &req,
			     &rep), CACHEW_OK);
	cwi_pmsg_body_free(CWI_MSG_WORKER_HEARTBEAT_REPLY, &rep);
	free(req.tasks);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
}

typedef struct job_state {
	uint32_t tasks; /* not being removed */
	uint32_t want, granted;
	bool settled;
	char policy[64];
	char reason[256];
	double weight;
	double client_wait;
} job_state;

static job_state
job_get(harness *h, uint64_t job)
{
	cwi_msg_status_reply st;
	job_state js;
	bool found = false;

	memset(&js, 0, sizeof(js));
	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	for (size_t i = 0; i < st.njobs; i++) {
		const cwi_job_status *j = &st.jobs[i];
		if (j->job_id != job)
			continue;
		found = true;
		js.tasks = j->tasks;
		js.want = j->want;
		js.granted = j->granted;
		js.settled = j->settled;
		js.weight = j->weight;
		snprintf(js.policy, sizeof(js.policy), "%s",
		    j->scale_policy != NULL ? j->scale_policy : "");
		snprintf(js.reason, sizeof(js.reason), "%s",
		    j->reason != NULL ? j->reason : "");
		js.client_wait = j->client_wait;
	}
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	ck_assert_msg(found, "job %" PRIu64 " is not in the status", job);
	return js;
}

/* ---- counts from policies ------------------------------------------------------ */

START_TEST(autoscale_fixed3_gives_3_tasks_with_5_workers)
{
	harness *h = harness_new("model");
	uint64_t w[5], ds, job, client;
	job_opts o = {.policy = "fixed:3"};

	add_workers(h, w, 5);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	job_state js = job_get(h, job);
	ck_assert_uint_eq(js.tasks, 3);
	ck_assert_uint_eq(js.want, 3);
	ck_assert_uint_eq(js.granted, 3);
	ck_assert_str_eq(js.policy, "fixed:3");
	/* Decisions do not move a fixed count. */
	for (int i = 0; i < 4; i++) {
		h->now += 500 * MS;
		client_hb(h, job, client, 50, 10, 400);
		cwi_dispatcher_decide(h->d, h->now);
	}
	ck_assert_uint_eq(job_get(h, job).tasks, 3);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 3);
	harness_free(h);
}
END_TEST

/* issue 17 (cachew top's WAIT%): the status gives per job the mean over
 * its clients of the share of their last heartbeat's interval spent
 * waiting for data: waits over the time their batches took, 1 for a
 * client that only waited, the latest heartbeat replacing the previous. */
START_TEST(status_client_wait_is_the_share_of_time_clients_wait)
{
	harness *h = harness_new("model");
	uint64_t w[2], ds, job, c1, c2;
	job_opts o = {.policy = "fixed:2", .name = "shared"};

	add_workers(h, w, 2);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &c1);
	ck_assert(job_get(h, job).client_wait == 0);
	/* 50 batches of 10 ms, 400 ms of them waiting: 0.8. */
	client_hb(h, job, c1, 50, 10, 400);
	ck_assert_double_eq_tol(job_get(h, job).client_wait, 0.8, 1e-9);
	/* A second client that waited its whole interval, no batch: the
	 * mean of 0.8 and 1. */
	join(h, ds, &o, &job, &c2);
	client_hb(h, job, c2, 0, 0, 500);
	ck_assert_double_eq_tol(job_get(h, job).client_wait, 0.9, 1e-9);
	/* The next heartbeats: 100 batches of 5 ms with 50 ms and no wait. */
	h->now += 500 * MS;
	client_hb(h, job, c1, 100, 5, 50);
	client_hb(h, job, c2, 100, 5, 0);
	ck_assert_double_eq_tol(job_get(h, job).client_wait, 0.05, 1e-9);
	harness_free(h);
}
END_TEST

/* The old `workers=N` (worker_policy fixed) is the policy fixed:N. */
START_TEST(autoscale_old_fixed_workers_mean_fixed_policy)
{
	harness *h = harness_new("model");
	uint64_t w[4], ds, job, client;
	job_opts o = {.fixed_workers = 2};

	add_workers(h, w, 4);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	job_state js = job_get(h, job);
	ck_assert_str_eq(js.policy, "fixed:2");
	ck_assert_uint_eq(js.tasks, 2);
	harness_free(h);
}
END_TEST

/* One worker delivers 100 batches/s, busy all the time; the client waits
 * two thirds of the time, so it would consume 300 batches/s: demand is 3x
 * one worker's rate, and with 10 % headroom the model asks for 4. */
START_TEST(autoscale_model_jumps_to_demand_in_one_interval)
{
	harness *h = harness_new("model");
	uint64_t w[8], ds, job, client;
	job_opts o = {.policy = "model"};

	ds = add_dataset(h);
	join(h, ds, &o, &job, &client); /* no workers yet: starts at 1 */
	add_workers(h, w, 8);
	ck_assert_uint_eq(job_get(h, job).tasks, 1);
	h->now += 1000 * MS;
	client_hb(h, job, client, 100, 10, 666.667);
	for (int i = 0; i < 8; i++)
		worker_hb(h, w[i], 1 * SEC, 0, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	job_state js = job_get(h, job);
	ck_assert_msg(js.want == 4, "want %u: %s", js.want, js.reason);
	ck_assert_uint_eq(js.granted, 4);
	ck_assert_uint_eq(js.tasks, 4);
	ck_assert_msg(strstr(js.reason, "model: demand 300.0 b/s") != NULL,
	    "%s", js.reason);
	ck_assert(has_event(h, "\"event\":\"scale_decision\",\"job_id\":1,"
			       "\"policy\":\"model\",\"want\":4"));
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 4);
	harness_free(h);
}
END_TEST

/* The count of scaling decisions of the given policy and outcome in the
 * dispatcher's /metrics tally, over every kind of reason (0: none). */
static uint64_t
scale_tally(harness *h, const char *policy, const char *decision)
{
	cwi_dispatcher_metrics m;
	uint64_t n = 0;

	ck_assert_int_eq(cwi_dispatcher_metrics_get(h->d, &m), CACHEW_OK);
	for (size_t i = 0; i < m.nscale; i++)
		if (strcmp(m.scale[i].policy, policy) == 0 &&
		    strcmp(m.scale[i].decision, decision) == 0)
			n += m.scale[i].n;
	cwi_dispatcher_metrics_free(&m);
	return n;
}

/* Whether the dispatcher's /metrics text holds the line `series`. */
static bool
metrics_has(harness *h, const char *series)
{
	cwi_dispatcher_metrics m;
	cwi_histogram none[CWI_MSG_NTYPES], lock;
	cwi_strbuf sb;
	bool has;

	memset(none, 0, sizeof(none));
	memset(&lock, 0, sizeof(lock));
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dispatcher_metrics_get(h->d, &m), CACHEW_OK);
	cwi_dispatcher_metrics_render(&sb, &m, none, &lock);
	cwi_dispatcher_metrics_free(&m);
	ck_assert(!sb.oom);
	has = strstr(sb.data, series) != NULL;
	ck_assert_msg(has, "no '%s' in:\n%s", series, sb.data);
	cwi_strbuf_free(&sb);
	return has;
}

/* issue 17, item 3: /metrics counts scaling decisions by policy and what
 * they did: the model's jump from 1 to 4 workers is one "up"; shedding 8
 * stalled workers to 5 one "down"; an interval that changes nothing counts
 * nothing. Item 5: and by the kind of their reason, a bounded label (the
 * text, with its numbers, stays in the events and the status). */
START_TEST(scale_decisions_are_counted_by_policy_and_direction)
{
	harness *h = harness_new("model");
	uint64_t w[8], ds, job, client;
	job_opts o = {.policy = "model"};

	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	add_workers(h, w, 8);
	ck_assert_uint_eq(scale_tally(h, "model", "up"), 0);
	h->now += 1000 * MS;
	client_hb(h, job, client, 100, 10, 666.667);
	for (int i = 0; i < 8; i++)
		worker_hb(h, w[i], 1 * SEC, 0, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(job_get(h, job).want, 4);
	ck_assert_uint_eq(scale_tally(h, "model", "up"), 1);
	ck_assert_uint_eq(scale_tally(h, "model", "down"), 0);
	ck_assert(metrics_has(h, "\ncachew_scale_decisions_total{policy="
	    "\"model\",decision=\"up\",reason=\"demand\"} 1\n"));
	harness_free(h);

	h = harness_new("model");
	add_workers(h, w, 8);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	h->now += 1000 * MS;
	client_hb(h, job, client, 200, 5, 0);
	for (int i = 0; i < 8; i++)
		worker_hb(h, w[i], 1 * SEC, SEC / 2, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(job_get(h, job).want, 5);
	ck_assert_uint_eq(scale_tally(h, "model", "down"), 1);
	ck_assert_uint_eq(scale_tally(h, "model", "up"), 0);
	ck_assert(metrics_has(h, "\ncachew_scale_decisions_total{policy="
	    "\"model\",decision=\"down\",reason=\"demand\"} 1\n"));
	harness_free(h);
}
END_TEST

/* Workers that stall on full queues half the time are twice as many as
 * the demand needs: the model sheds them (a static pool starts a job with
 * every worker). */
START_TEST(autoscale_model_sheds_stalled_workers)
{
	harness *h = harness_new("model");
	uint64_t w[8], ds, job, client;
	job_opts o = {.policy = "model"};

	add_workers(h, w, 8);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	ck_assert_uint_eq(job_get(h, job).tasks, 8);
	h->now += 1000 * MS;
	/* 200 batches/s, never waiting: 8 workers at busy 0.5 give 50 b/s
	 * each; the demand is 200 b/s -> ceil(200 * 1.1 / 50) = 5. */
	client_hb(h, job, client, 200, 5, 0);
	for (int i = 0; i < 8; i++)
		worker_hb(h, w[i], 1 * SEC, SEC / 2, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	job_state js = job_get(h, job);
	ck_assert_msg(js.want == 5, "want %u: %s", js.want, js.reason);
	ck_assert_uint_eq(js.tasks, 5);
	ck_assert(has_event(h, "\"event\":\"task_removed\""));
	harness_free(h);
}
END_TEST

START_TEST(autoscale_weights_2_to_1_share_9_workers_6_3)
{
	harness *h = harness_new("model");
	uint64_t w[9], ds, a, b, ca, cb;
	job_opts oa = {.name = "a", .policy = "fixed:9", .weight = 2};
	job_opts ob = {.name = "b", .policy = "fixed:9", .weight = 1};

	add_workers(h, w, 9);
	ds = add_dataset(h);
	join(h, ds, &oa, &a, &ca);
	join(h, ds, &ob, &b, &cb);
	job_state ja = job_get(h, a), jb = job_get(h, b);
	ck_assert_uint_eq(ja.granted, 6);
	ck_assert_uint_eq(jb.granted, 3);
	ck_assert_uint_eq(ja.tasks, 6);
	ck_assert_uint_eq(jb.tasks, 3);
	ck_assert(ja.weight == 2.0 && jb.weight == 1.0);
	/* Both want 9: the pool target is their sum. */
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 18);
	harness_free(h);
}
END_TEST

/* Job A has all 9 workers; B arrives (equal weights): workers move to B
 * at once (its creation shares the pool; at the latest within one
 * interval); when B leaves, A gets them back. */
START_TEST(autoscale_jobs_arriving_and_leaving_move_workers)
{
	harness *h = harness_new("model");
	uint64_t w[9], ds, a, b, ca, cb;
	job_opts oa = {.name = "a", .policy = "fixed:9"};
	job_opts ob = {.name = "b", .policy = "fixed:9"};

	add_workers(h, w, 9);
	ds = add_dataset(h);
	join(h, ds, &oa, &a, &ca);
	ck_assert_uint_eq(job_get(h, a).tasks, 9);
	h->now += 100 * MS;
	join(h, ds, &ob, &b, &cb);
	h->now += 500 * MS;
	cwi_dispatcher_decide(h->d, h->now);
	/* Max-min fair: 4.5 each, the older job gets the odd one. */
	ck_assert_uint_eq(job_get(h, a).granted, 5);
	ck_assert_uint_eq(job_get(h, a).tasks, 5);
	ck_assert_uint_eq(job_get(h, b).granted, 4);
	ck_assert_uint_eq(job_get(h, b).tasks, 4);
	ck_assert(has_event(h, "\"event\":\"job_share\",\"job_id\":1,"
			       "\"want\":9,\"granted\":5"));
	h->now += 100 * MS;
	release(h, b, cb);
	h->now += 500 * MS;
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(job_get(h, a).granted, 9);
	ck_assert_uint_eq(job_get(h, a).tasks, 9);
	harness_free(h);
}
END_TEST

/* hpa:50 at 100 % CPU on 2 workers wants 4 once an evaluation is due;
 * the pool target follows, and new workers get the job's tasks. */
START_TEST(autoscale_hpa_reacts_to_cpu)
{
	harness *h = harness_new("model");
	uint64_t w[2], ds, job, client;
	job_opts o = {.policy = "hpa:50"};

	add_workers(h, w, 2);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	ck_assert_uint_eq(job_get(h, job).tasks, 2);
	for (int i = 1; i <= 40 && job_get(h, job).want == 2; i++) {
		h->now += 500 * MS;
		client_hb(h, job, client, 50, 10, 0);
		worker_hb(h, w[0], (uint64_t)i * 500 * MS, 0, 4.0);
		worker_hb(h, w[1], (uint64_t)i * 500 * MS, 0, 4.0);
		cwi_dispatcher_decide(h->d, h->now);
	}
	job_state js = job_get(h, job);
	ck_assert_msg(js.want == 4, "want %u: %s", js.want, js.reason);
	ck_assert_uint_eq(js.granted, 2); /* only 2 workers exist */
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 4);
	add_worker(h, "tcp://10.0.1.1:7000");
	add_worker(h, "tcp://10.0.1.2:7000");
	ck_assert_uint_eq(job_get(h, job).tasks, 4);
	harness_free(h);
}
END_TEST

/* ---- the pool target -------------------------------------------------------------- */

/* The pool target is the sum of what jobs want within the dispatcher's
 * bounds; after the job ends it falls back to min_workers, but only after
 * pool_down_intervals intervals (2 here). */
START_TEST(autoscale_pool_target_falls_back_to_min_after_job_ends)
{
	harness *h = harness_new("model");
	uint64_t w[2], ds, job, client;
	job_opts o = {.policy = "fixed:3"};

	add_workers(h, w, 2);
	ds = add_dataset(h);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 0);
	join(h, ds, &o, &job, &client);
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 3);
	ck_assert(has_event(h, "\"event\":\"pool_target\",\"workers\":3,"
			       "\"wanted\":3,\"available\":2"));
	release(h, job, client);
	h->now += 500 * MS;
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 3);
	h->now += 500 * MS;
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 0);
	harness_free(h);
}
END_TEST

START_TEST(autoscale_pool_target_is_bounded)
{
	harness *h;
	cwi_dispatcher_config cfg;
	uint64_t ds, job, client;
	job_opts o = {.policy = "fixed:9"};

	h = calloc(1, sizeof(*h));
	cwi_strbuf_init(&h->events);
	cwi_dispatcher_config_default(&cfg);
	cfg.autoscale = true;
	cfg.min_workers = 2;
	cfg.max_workers = 5;
	ck_assert_int_eq(cwi_dispatcher_create(&h->d, &cfg), CACHEW_OK);
	h->now = 1000;
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 2);
	ds = add_dataset(h);
	/* fixed:9 is over the dispatcher's max_workers: the job's own
	 * bound is the pool's. */
	join(h, ds, &o, &job, &client);
	h->now += 500 * MS;
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(cwi_dispatcher_pool_target(h->d), 5);
	harness_free(h);
}
END_TEST

/* A named job's next pass (a new job, iteration + 1) goes on from the
 * previous pass's decision instead of measuring from scratch. */
START_TEST(autoscale_next_iteration_keeps_the_decision)
{
	harness *h = harness_new("model");
	uint64_t w[8], ds, job, client, job2, client2;
	job_opts o = {.name = "train", .policy = "model"};

	ds = add_dataset(h);
	join(h, ds, &o, &job, &client);
	add_workers(h, w, 8);
	h->now += 1000 * MS;
	client_hb(h, job, client, 100, 10, 666.667);
	worker_hb(h, w[0], 1 * SEC, 0, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(job_get(h, job).want, 4);
	release(h, job, client);
	o.iteration = 1;
	join(h, ds, &o, &job2, &client2);
	ck_assert_uint_ne(job2, job);
	ck_assert_uint_eq(job_get(h, job2).want, 4);
	ck_assert_uint_eq(job_get(h, job2).tasks, 4);
	harness_free(h);
}
END_TEST

/* An autocaching pass offered to the next job: the job runs its graph
 * and units, its end is queued with the planner's state, and a mode
 * change scales the worker count carried over from the previous
 * iteration. */
static void
offer(harness *h, cwi_job_pass *p, const char *mode, double scale,
    void *ctx)
{
	memset(p, 0, sizeof(*p));
	p->graph = malloc(4);
	ck_assert_ptr_nonnull(p->graph);
	memcpy(p->graph, "\x81\xa1y\x02", 4);
	p->graph_len = 4;
	p->units = 40;
	snprintf(p->mode, sizeof(p->mode), "%s", mode);
	snprintf(p->event, sizeof(p->event), "%s pass", mode);
	p->worker_scale = scale;
	p->ctx = ctx;
	cwi_dispatcher_offer_pass(h->d, p);
}

START_TEST(autoscale_cache_mode_change_scales_the_carried_count)
{
	harness *h = harness_new("model");
	uint64_t w[8], ds, job, client, job2, client2;
	job_opts o = {.name = "train", .policy = "model"};
	cwi_job_pass p;
	cwi_pass_end *ends;
	int token1 = 1, token2 = 2;
	size_t n;

	ds = add_dataset(h);
	offer(h, &p, "compute", 0, &token1);
	join(h, ds, &o, &job, &client);
	cwi_dispatcher_offer_pass(h->d, NULL);
	ck_assert_ptr_null(p.graph); /* taken */
	ck_assert_ptr_null(p.ctx);
	add_workers(h, w, 8);
	h->now += 1000 * MS;
	client_hb(h, job, client, 100, 10, 666.667);
	worker_hb(h, w[0], 1 * SEC, 0, 1.0);
	cwi_dispatcher_decide(h->d, h->now);
	ck_assert_uint_eq(job_get(h, job).want, 4);
	release(h, job, client);
	/* The job ended before its data: the pass end says so. */
	n = cwi_dispatcher_take_pass_ends(h->d, &ends);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(ends[0].job_id, job);
	ck_assert_ptr_eq(ends[0].ctx, &token1);
	ck_assert(!ends[0].complete);
	cwi_dispatcher_pass_ends_free(ends, n);
	ck_assert_uint_eq(cwi_dispatcher_take_pass_ends(h->d, &ends), 0);
	free(ends);
	/* The next iteration reads a cache: a quarter of the pass time,
	 * a quarter of the workers. */
	o.iteration = 1;
	offer(h, &p, "get", 0.25, &token2);
	join(h, ds, &o, &job2, &client2);
	cwi_dispatcher_offer_pass(h->d, NULL);
	ck_assert_uint_eq(job_get(h, job2).want, 1);
	ck_assert_msg(strstr(job_get(h, job2).reason,
		"cache mode get: 1 workers carried over (x0.25)"),
	    "%s", job_get(h, job2).reason);
	ck_assert(has_event(h, "\"cache_mode\":\"get\""));
	cwi_dispatcher_autocache_event(h->d, h->now, job2, NULL, "read it");
	ck_assert(has_event(h, "\"event\":\"autocache\""));
	release(h, job2, client2);
	n = cwi_dispatcher_take_pass_ends(h->d, &ends);
	ck_assert_uint_eq(n, 1);
	ck_assert_ptr_eq(ends[0].ctx, &token2);
	cwi_dispatcher_pass_ends_free(ends, n);
	harness_free(h);
}
END_TEST

/* ---- bad requests ------------------------------------------------------------------ */

START_TEST(autoscale_bad_scale_options_are_einval)
{
	harness *h = harness_new("model");
	uint64_t ds, job, client;
	job_opts o = {.policy = "fixed:0"};

	ds = add_dataset(h);
	ck_assert_int_eq(try_join(h, ds, &o, &job, &client), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "scale_policy") != NULL, "%s",
	    cachew_errmsg());
	o.policy = "bogus";
	ck_assert_int_eq(try_join(h, ds, &o, &job, &client), CACHEW_EINVAL);
	o.policy = NULL;
	o.weight = NAN;
	ck_assert_int_eq(try_join(h, ds, &o, &job, &client), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "weight") != NULL, "%s",
	    cachew_errmsg());
	o.weight = -1;
	ck_assert_int_eq(try_join(h, ds, &o, &job, &client), CACHEW_EINVAL);
	o.weight = 1;
	o.min_workers = 4;
	o.max_workers = 2;
	ck_assert_int_eq(try_join(h, ds, &o, &job, &client), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "min_workers 4 is larger than max_workers 2");
	harness_free(h);
}
END_TEST

/* Without autoscale the dispatcher behaves as before: every worker. */
START_TEST(autoscale_off_keeps_every_worker)
{
	harness *h = calloc(1, sizeof(*h));
	cwi_dispatcher_config cfg;
	uint64_t w[3], ds, job, client;
	job_opts o = {.policy = "fixed:1"};
	cwi_msg_status_reply st;

	cwi_strbuf_init(&h->events);
	cwi_dispatcher_config_default(&cfg);
	ck_assert_int_eq(cwi_dispatcher_create(&h->d, &cfg), CACHEW_OK);
	h->now = 1000;
	add_workers(h, w, 3);
	ds = add_dataset(h);
	join(h, ds, &o, &job, &client); /* the policy is not looked at */
	ck_assert_int_eq(cwi_dispatcher_status(h->d, h->now, &st), CACHEW_OK);
	ck_assert_uint_eq(st.jobs[0].tasks, 3);
	ck_assert_ptr_null(st.jobs[0].scale_policy);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	harness_free(h);
}
END_TEST

/* ---- the protocol's new fields ------------------------------------------------------ */

static void
round_trip(const cwi_pmsg *in, cwi_pmsg *out)
{
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_pmsg_encode(in, &sb), CACHEW_OK);
	ck_assert_msg(cwi_pmsg_decode((const uint8_t *)sb.data, sb.len, out) ==
		CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_strbuf_free(&sb);
}

START_TEST(autoscale_proto_new_fields_round_trip)
{
	cwi_pmsg m, out;
	cwi_task_report tr = {0};

	cwi_pmsg_init(&m, CWI_MSG_JOB_GET_OR_CREATE);
	m.u.job_get_or_create.dataset_id = 3;
	m.u.job_get_or_create.scale_policy = cwi_strdup("hpa:80");
	m.u.job_get_or_create.weight = 2.5;
	m.u.job_get_or_create.min_workers = 2;
	m.u.job_get_or_create.max_workers = 7;
	round_trip(&m, &out);
	ck_assert_str_eq(out.u.job_get_or_create.scale_policy, "hpa:80");
	ck_assert(out.u.job_get_or_create.weight == 2.5);
	ck_assert_uint_eq(out.u.job_get_or_create.min_workers, 2);
	ck_assert_uint_eq(out.u.job_get_or_create.max_workers, 7);
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&out);

	cwi_pmsg_init(&m, CWI_MSG_CLIENT_HEARTBEAT);
	m.u.client_heartbeat.job_id = 1;
	m.u.client_heartbeat.client_id = 2;
	m.u.client_heartbeat.batches = 650;
	round_trip(&m, &out);
	ck_assert_uint_eq(out.u.client_heartbeat.batches, 650);
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&out);

	cwi_pmsg_init(&m, CWI_MSG_WORKER_HEARTBEAT);
	m.u.worker_heartbeat.worker_id = 1;
	tr.task_id = 9;
	tr.run_ns = 5000000000ull;
	tr.stall_ns = 1234;
	m.u.worker_heartbeat.tasks = &tr;
	m.u.worker_heartbeat.ntasks = 1;
	round_trip(&m, &out);
	ck_assert_uint_eq(out.u.worker_heartbeat.tasks[0].run_ns,
	    5000000000ull);
	ck_assert_uint_eq(out.u.worker_heartbeat.tasks[0].stall_ns, 1234);
	m.u.worker_heartbeat.tasks = NULL; /* on the stack */
	m.u.worker_heartbeat.ntasks = 0;
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&out);

	/* A job's slowest operator and cache hits in a status reply. */
	cwi_pmsg_init(&m, CWI_MSG_STATUS_REPLY);
	m.u.status_reply.jobs = calloc(1, sizeof(cwi_job_status));
	ck_assert_ptr_nonnull(m.u.status_reply.jobs);
	m.u.status_reply.njobs = 1;
	m.u.status_reply.jobs[0].job_id = 4;
	m.u.status_reply.jobs[0].dataset_id = 1;
	m.u.status_reply.jobs[0].slowest_op = cwi_strdup("1:map/decode_jpeg");
	m.u.status_reply.jobs[0].slowest_op_share = 0.75;
	m.u.status_reply.jobs[0].cache_hit_bytes = 1ull << 40;
	round_trip(&m, &out);
	ck_assert_uint_eq(out.u.status_reply.njobs, 1);
	ck_assert_str_eq(out.u.status_reply.jobs[0].slowest_op,
	    "1:map/decode_jpeg");
	ck_assert(out.u.status_reply.jobs[0].slowest_op_share == 0.75);
	ck_assert_uint_eq(out.u.status_reply.jobs[0].cache_hit_bytes,
	    1ull << 40);
	cwi_pmsg_free(&m);
	cwi_pmsg_free(&out);
}
END_TEST

/* A client_heartbeat of the previous revision (no batches) and a
 * job_get_or_create without the scale fields decode with the defaults. */
START_TEST(autoscale_proto_old_messages_decode_with_defaults)
{
	/* {"v":1,"t":"client_heartbeat","job_id":1,"client_id":2} */
	static const uint8_t hb[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0xb0,
	    'c', 'l', 'i', 'e', 'n', 't', '_', 'h', 'e', 'a', 'r', 't', 'b',
	    'e', 'a', 't', 0xa6, 'j', 'o', 'b', '_', 'i', 'd', 0x01, 0xa9, 'c',
	    'l', 'i', 'e', 'n', 't', '_', 'i', 'd', 0x02};
	/* {"v":1,"t":"job_get_or_create","dataset_id":4} */
	static const uint8_t jc[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0xb1,
	    'j', 'o', 'b', '_', 'g', 'e', 't', '_', 'o', 'r', '_', 'c', 'r',
	    'e', 'a', 't', 'e', 0xaa, 'd', 'a', 't', 'a', 's', 'e', 't', '_',
	    'i', 'd', 0x04};
	cwi_pmsg out;

	ck_assert_msg(cwi_pmsg_decode(hb, sizeof(hb), &out) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(out.type, CWI_MSG_CLIENT_HEARTBEAT);
	ck_assert_uint_eq(out.u.client_heartbeat.batches, 0);
	cwi_pmsg_free(&out);
	ck_assert_msg(cwi_pmsg_decode(jc, sizeof(jc), &out) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_ptr_null(out.u.job_get_or_create.scale_policy);
	ck_assert(out.u.job_get_or_create.weight == 0.0);
	ck_assert_uint_eq(out.u.job_get_or_create.min_workers, 0);
	ck_assert_uint_eq(out.u.job_get_or_create.max_workers, 0);
	cwi_pmsg_free(&out);
}
END_TEST

/* ---- end to end: the process provisioner ------------------------------------------ */

/* A dispatcher that starts its own workers (none started by the test). */
static void
dispatcher_start(cwt_daemon *d, const char *dir)
{
	char work[700];

	snprintf(work, sizeof(work), "%s/work", dir);
	cwt_daemon_start(d, dir, "dispatcher", "--role=dispatcher",
	    "--listen", "tcp://127.0.0.1:0", "--work-dir", work,
	    "--heartbeat-ms", "100", "--provisioner", "process",
	    "--max-workers", "4", "--worker-threads", "1",
	    "--worker-stop-timeout-ms", "5000", "--journal-verify", "1",
	    (char *)NULL);
}

typedef struct pool_view {
	uint32_t target, running, workers;
	uint32_t granted; /* of the last job */
} pool_view;

static pool_view
pool_get(const char *url)
{
	cwi_conn *c;
	cwi_pmsg req, rep;
	pool_view v = {0};

	ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_OK);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_msg(cwi_rpc_call(c, &req, CWI_MSG_STATUS_REPLY, 5000, &rep) ==
		CACHEW_OK,
	    "%s", cachew_errmsg());
	cwi_pmsg_free(&req);
	cwi_conn_destroy(c);
	v.target = rep.u.status_reply.pool_target;
	v.running = rep.u.status_reply.provisioner_running;
	v.workers = (uint32_t)rep.u.status_reply.nworkers;
	ck_assert_str_eq(rep.u.status_reply.provisioner, "process");
	if (rep.u.status_reply.njobs > 0)
		v.granted = rep.u.status_reply
				.jobs[rep.u.status_reply.njobs - 1]
				.granted;
	cwi_pmsg_free(&rep);
	return v;
}

/* The largest "granted" of any job_share event in the events log. */
static uint32_t
max_granted(const char *dir)
{
	char path[700], *log, *p;
	uint32_t best = 0;

	snprintf(path, sizeof(path), "%s/work/events.jsonl", dir);
	log = cwt_slurp(path);
	ck_assert_ptr_nonnull(log);
	for (p = log; (p = strstr(p, "\"event\":\"job_share\"")) != NULL;
	     p++) {
		const char *g = strstr(p, "\"granted\":");
		unsigned v;
		if (g != NULL && sscanf(g, "\"granted\":%u", &v) == 1 &&
		    v > best)
			best = v;
	}
	free(log);
	return best;
}

typedef struct consumer {
	const char *url;
	const char *policy; /* NULL: the dispatcher's */
	int n;
	unsigned step_us; /* the consumer's time per element */
	uint8_t *seen;
	atomic_int received;
	atomic_bool done;
	cachew_err rv;
	char err[512];
} consumer;

/* Iterates range(n) | map(sleep_us) through the service: an I/O-bound
 * pipeline (2 ms per element, no CPU), so more workers help. */
static void *
consumer_main(void *arg)
{
	consumer *a = arg;
	cachew_options *o = cwt_opts(1, 1);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	char p[128];

	snprintf(p, sizeof(p), "range(%d) | map(sleep_us, us=2000)", a->n);
	ck_assert_int_eq(cachew_options_set_str(o, "service", a->url),
	    CACHEW_OK);
	if (a->policy != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "scale_policy",
				     a->policy), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	a->rv = cachew_iterator_create(&it, ds, o);
	if (a->rv == CACHEW_OK) {
		while ((a->rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			int64_t x = cwt_i64(e, 0);
			if (x >= 0 && x < a->n && a->seen[x] < 255)
				a->seen[x]++;
			atomic_fetch_add(&a->received, 1);
			cachew_element_release(e);
			if (a->step_us > 0)
				usleep(a->step_us);
		}
		snprintf(a->err, sizeof(a->err), "%s",
		    cachew_iterator_errmsg(it));
		cachew_iterator_destroy(it);
	} else {
		snprintf(a->err, sizeof(a->err), "%s", cachew_errmsg());
	}
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	atomic_store(&a->done, true);
	return NULL;
}

static void
assert_exactly_once(const consumer *a)
{
	ck_assert_msg(a->rv == CACHEW_EOF, "client: %s", a->err);
	for (int v = 0; v < a->n; v++)
		ck_assert_msg(a->seen[v] == 1, "element %d came %d times", v,
		    a->seen[v]);
}

/* After the job the pool target is min_workers (0) again and every
 * worker the provisioner started has drained and gone. */
static void
wait_pool_empty(const char *url)
{
	uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(30000);
	pool_view v;

	do {
		v = pool_get(url);
		if (v.target == 0 && v.running == 0 && v.workers == 0)
			return;
		cwt_nap_ms(50);
	} while (cwt_now_ms() < deadline);
	ck_abort_msg("pool not empty after the job: target %u, running %u, "
		     "workers %u", v.target, v.running, v.workers);
}

/* A consumer 8x faster than one worker: the model asks for more workers,
 * the provisioner starts them (up to --max-workers 4), every element
 * comes exactly once, and afterwards the pool shrinks to nothing. */
START_TEST(autoscale_process_provisioner_scales_a_job)
{
	char *dir = cwt_tmpdir();
	cwt_daemon d;
	consumer a = {0};

	dispatcher_start(&d, dir);
	a.url = d.url;
	a.n = 4000;
	a.step_us = 250;
	a.seen = calloc((size_t)a.n, 1);
	consumer_main(&a);
	assert_exactly_once(&a);
	ck_assert_uint_ge(max_granted(dir), 2);
	wait_pool_empty(d.url);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&d), 0);
	free(a.seen);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* `cachew status --json` shows the job's policy and the provisioner. */
static void
status_shows_policy(const char *dir, const char *url)
{
	char cmd[2048], path[700];
	char *json;

	snprintf(path, sizeof(path), "%s/status.json", dir);
	snprintf(cmd, sizeof(cmd), "%s/cachew status %s --json > %s",
	    cwt_build_dir(), url, path);
	ck_assert_int_eq(system(cmd), 0);
	json = cwt_slurp(path);
	ck_assert_ptr_nonnull(json);
	ck_assert_msg(strstr(json, "\"provisioner\":{\"kind\":\"process\"") !=
		NULL, "%s", json);
	ck_assert_msg(strstr(json, "\"scale_policy\":\"fixed:2\",\"weight\":1,"
				   "\"want\":2,\"granted\":2") != NULL,
	    "%s", json);
	free(json);
}

/* scale_policy=fixed:2: exactly two worker processes, never more. */
START_TEST(autoscale_process_provisioner_fixed2_runs_2_workers)
{
	char *dir = cwt_tmpdir();
	cwt_daemon d;
	consumer a = {0};
	pthread_t th;
	uint32_t max_running = 0, max_workers = 0;

	dispatcher_start(&d, dir);
	a.url = d.url;
	a.policy = "fixed:2";
	a.n = 2000;
	a.seen = calloc((size_t)a.n, 1);
	atomic_init(&a.done, false);
	ck_assert_int_eq(pthread_create(&th, NULL, consumer_main, &a), 0);
	while (!atomic_load(&a.done)) {
		pool_view v = pool_get(d.url);
		if (v.running > max_running)
			max_running = v.running;
		if (v.workers > max_workers)
			max_workers = v.workers;
		cwt_nap_ms(20);
	}
	pthread_join(th, NULL);
	assert_exactly_once(&a);
	ck_assert_uint_eq(max_running, 2);
	ck_assert_uint_eq(max_workers, 2);
	ck_assert_uint_eq(max_granted(dir), 2);
	status_shows_policy(dir, d.url);
	wait_pool_empty(d.url);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&d), 0);
	free(a.seen);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_autoscale_suite(void)
{
	Suite *s = suite_create("autoscale");
	TCase *tc = tcase_create("dispatcher");

	tcase_add_test(tc, autoscale_fixed3_gives_3_tasks_with_5_workers);
	tcase_add_test(tc, autoscale_old_fixed_workers_mean_fixed_policy);
	tcase_add_test(tc, status_client_wait_is_the_share_of_time_clients_wait);
	tcase_add_test(tc, autoscale_model_jumps_to_demand_in_one_interval);
	tcase_add_test(tc, autoscale_model_sheds_stalled_workers);
	tcase_add_test(tc, scale_decisions_are_counted_by_policy_and_direction);
	tcase_add_test(tc, autoscale_weights_2_to_1_share_9_workers_6_3);
	tcase_add_test(tc, autoscale_jobs_arriving_and_leaving_move_workers);
	tcase_add_test(tc, autoscale_hpa_reacts_to_cpu);
	tcase_add_test(tc, autoscale_pool_target_falls_back_to_min_after_job_ends);
	tcase_add_test(tc, autoscale_pool_target_is_bounded);
	tcase_add_test(tc, autoscale_next_iteration_keeps_the_decision);
	tcase_add_test(tc, autoscale_cache_mode_change_scales_the_carried_count);
	tcase_add_test(tc, autoscale_bad_scale_options_are_einval);
	tcase_add_test(tc, autoscale_off_keeps_every_worker);
	tcase_add_test(tc, autoscale_proto_new_fields_round_trip);
	tcase_add_test(tc, autoscale_proto_old_messages_decode_with_defaults);
	suite_add_tcase(s, tc);
	tc = tcase_create("process");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, autoscale_process_provisioner_scales_a_job);
	tcase_add_test(tc, autoscale_process_provisioner_fixed2_runs_2_workers);
	suite_add_tcase(s, tc);
	return s;
}
