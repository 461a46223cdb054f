/*
 * check_coord.c - coordinated reads and compressed payloads of the service:
 * the client's round schedule (client_coord.h) and the payload codec
 * (service_payload.h) as units, then end to end with real processes on
 * loopback like check_cluster.c (a `cachewd --role=dispatcher`, `cachewd
 * --role=worker`s, and consumers in this process). Ports are ephemeral;
 * every wait is bounded and waits on readiness; every process started is
 * stopped by its pid.
 */
#include "cwt.h"

#include "../src/service/client/client_coord.h"
#include "../src/service/service_payload.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- processes (as check_cluster.c) ------------------------------------------ */

typedef struct cluster {
	char *dir;
	cwt_daemon dispatcher;
	cwt_daemon workers[4];
	int nworkers;
} cluster;

/* A copy of the cluster a test runs, stopped by the checked teardown if
 * the test fails before cluster_stop (without fork, nothing else would;
 * the test's own struct is on a stack frame that is gone by then). */
static cluster live_copy;
static bool live;

static char *
events_text(const cluster *c)
{
	char path[700];

	snprintf(path, sizeof(path), "%s/work/events.jsonl", c->dir);
	return cwt_slurp(path);
}

static int
count_substr(const char *s, const char *sub)
{
	int n = 0;

	while (s != NULL && (s = strstr(s, sub)) != NULL) {
		n++;
		s += strlen(sub);
	}
	return n;
}

/* A dispatcher and nworkers workers, fast heartbeats; returns once every
 * worker is registered (the events log says so), so that a job made next
 * gets all of them from round 0. */
static void
cluster_start(cluster *c, int nworkers)
{
	char work[600];
	uint64_t deadline;

	memset(c, 0, sizeof(*c));
	c->dir = cwt_tmpdir();
	live_copy = *c;
	live = true;
	snprintf(work, sizeof(work), "%s/work", c->dir);
	cwt_daemon_start(&c->dispatcher, c->dir, "dispatcher", "--role=dispatcher",
	    "--listen", "tcp://127.0.0.1:0", "--work-dir", work,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--client-timeout-ms", "5000", "--journal-verify", "1",
	    (char *)NULL);
	live_copy = *c;
	for (int i = 0; i < nworkers; i++) {
		char name[32];
		snprintf(name, sizeof(name), "worker%d", i);
		cwt_daemon_start(&c->workers[i], c->dir, name, "--role=worker",
		    "--dispatcher", c->dispatcher.url, "--listen",
		    "tcp://127.0.0.1:0", "--heartbeat-ms", "50", "--threads",
		    "1", (char *)NULL);
		live_copy = *c;
	}
	c->nworkers = nworkers;
	deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(10000);
	for (;;) {
		/* (A worker whose first registration reply came late
		 * registers again, replacing itself.) */
		char *ev = events_text(c);
		int n = count_substr(ev, "\"event\":\"worker_registered\"") -
			count_substr(ev, "\"event\":\"worker_dead\"");
		free(ev);
		for (int i = 0; i < nworkers && n >= nworkers; i++) {
			char *log = cwt_slurp(c->workers[i].log);
			if (log == NULL || strstr(log, "event=registered") == NULL)
				n = -1; /* its registration call still runs */
			free(log);
		}
		if (n >= nworkers)
			break;
		ck_assert_msg(cwt_now_ms() < deadline, "%d of %d workers registered "
		    "in 10 s", n, nworkers);
		cwt_nap_ms(10);
	}
}

/* verify: the dispatcher's journal must replay to its state (not when
 * a failed test is torn down). */
static void
cluster_stop_how(cluster *c, bool verify)
{
	for (int i = 0; i < 4; i++)
		if (c->workers[i].pid > 0)
			cwt_daemon_stop(&c->workers[i], SIGKILL);
	if (c->dispatcher.pid > 0 && verify)
		cwt_dispatcher_stop_verified(&c->dispatcher);
	else if (c->dispatcher.pid > 0)
		cwt_daemon_stop(&c->dispatcher, SIGTERM);
	cwt_rmtree(c->dir);
	free(c->dir);
	c->dir = NULL;
	live = false;
}

static void
cluster_stop(cluster *c)
{
	cluster_stop_how(c, true);
}

static void
teardown_cluster(void)
{
	if (live)
		cluster_stop_how(&live_copy, false);
}

/* ---- consumers ------------------------------------------------------------------ */

/* One client reading a pipeline through the service: the first value of
 * component 0 of every element it got (a scalar, or the first of a rank-1
 * batch), in order, and the order-independent digest. */
typedef struct consumer {
	const char *url;
	const char *pipeline;
	const char *job;         /* NULL: private */
	const char *compression; /* NULL: the default */
	int ncons, index;        /* ncons 0: uncoordinated */
	int64_t *first;
	size_t n, cap;
	uint64_t digest;
	cachew_err rv;
	char err[512];
} consumer;

static int64_t
first_value(const cachew_element *e)
{
	const cachew_tensor *t = cachew_element_component(e, 0);

	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_I64);
	return *(const int64_t *)cachew_tensor_data(t);
}

static void *
consumer_main(void *arg)
{
	consumer *a = arg;
	cachew_options *o = cwt_opts(7, 1);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	ck_assert_int_eq(cachew_options_set_str(o, "service", a->url),
	    CACHEW_OK);
	if (a->job != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "job_name", a->job),
		    CACHEW_OK);
	if (a->compression != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "compression",
				     a->compression),
		    CACHEW_OK);
	if (a->ncons > 0) {
		ck_assert_int_eq(cachew_options_set_int(o, "num_consumers",
				     a->ncons),
		    CACHEW_OK);
		ck_assert_int_eq(cachew_options_set_int(o, "consumer_index",
				     a->index),
		    CACHEW_OK);
	}
	ck_assert_int_eq(cachew_dataset_parse(&ds, a->pipeline), CACHEW_OK);
	a->rv = cachew_iterator_create(&it, ds, o);
	if (a->rv == CACHEW_OK) {
		while ((a->rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			if (a->n == a->cap) {
				a->cap = a->cap ? a->cap * 2 : 256;
				a->first = realloc(a->first,
				    a->cap * sizeof(*a->first));
				ck_assert_ptr_nonnull(a->first);
			}
			a->first[a->n++] = first_value(e);
			a->digest += cachew_element_hash(e);
			cachew_element_release(e);
		}
		snprintf(a->err, sizeof(a->err), "%s",
		    cachew_iterator_errmsg(it));
		cachew_iterator_destroy(it);
	} else {
		snprintf(a->err, sizeof(a->err), "%s", cachew_errmsg());
	}
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return NULL;
}

/* Runs n consumers of one pipeline at once (coordinated when ncons > 0:
 * consumer i has index i) and checks that each reached the end. */
static void
run_consumers(consumer *v, int n, const char *url, const char *pipeline,
    const char *job, int ncons, const char *compression)
{
	pthread_t th[8];

	for (int i = 0; i < n; i++) {
		memset(&v[i], 0, sizeof(v[i]));
		v[i].url = url;
		v[i].pipeline = pipeline;
		v[i].job = job;
		v[i].ncons = ncons;
		v[i].index = i;
		v[i].compression = compression;
		ck_assert_int_eq(pthread_create(&th[i], NULL, consumer_main,
				     &v[i]),
		    0);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < n; i++)
		ck_assert_msg(v[i].rv == CACHEW_EOF, "consumer %d: %s (%s)", i,
		    cachew_strerror(v[i].rv), v[i].err);
}

static void
consumers_free(consumer *v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i].first);
}

/* The order-independent digest and count of an in-process run. */
static void
local_digest(const char *pipeline, uint64_t *n, uint64_t *digest)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_element **v;
	size_t cnt;
	char err[512];

	ck_assert_msg(cwt_run(pipeline, o, &v, &cnt, err, sizeof(err)) ==
			  CACHEW_OK,
	    "%s: %s", pipeline, err);
	*n = cnt;
	*digest = 0;
	for (size_t i = 0; i < cnt; i++)
		*digest += cachew_element_hash(v[i]);
	cwt_free(v, cnt);
	cachew_options_destroy(o);
}

/* ---- the events log: which task leased which split ------------------------------ */

typedef struct lease_map {
	uint64_t units_per_split;
	uint64_t task_of[4096]; /* split id -> task id (0: never leased) */
	uint64_t tasks[8];      /* task ids that leased, in first-lease order */
	int ntasks;
} lease_map;

static uint64_t
json_u64(const char *line, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(line, k);
	ck_assert_msg(p != NULL, "no %s in %s", key, line);
	return strtoull(p + strlen(k), NULL, 10);
}

static void
lease_map_read(const cluster *c, lease_map *m)
{
	char *ev = events_text(c), *line, *save = NULL;

	ck_assert_ptr_nonnull(ev);
	memset(m, 0, sizeof(*m));
	for (line = strtok_r(ev, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		if (strstr(line, "\"event\":\"job_created\"") != NULL &&
		    strstr(line, "units_per_split") != NULL)
			m->units_per_split = json_u64(line, "units_per_split");
		if (strstr(line, "\"event\":\"split_leased\"") == NULL)
			continue;
		uint64_t task = json_u64(line, "task_id");
		const char *p = strstr(line, "\"splits\":[") + 10;
		int k;
		for (k = 0; k < m->ntasks && m->tasks[k] != task; k++)
			;
		if (k == m->ntasks && m->ntasks < 8)
			m->tasks[m->ntasks++] = task;
		while (*p != ']') {
			char *end;
			uint64_t id = strtoull(p, &end, 10);
			ck_assert_uint_lt(id, 4096);
			if (m->task_of[id] != 0) {
				char *all = events_text(c);
				fprintf(stderr, "EVENTS\n%s\n", all);
				free(all);
			}
			ck_assert_msg(m->task_of[id] == 0, "split %" PRIu64
			    " leased twice", id);
			m->task_of[id] = task;
			p = *end == ',' ? end + 1 : end;
		}
	}
	free(ev);
	ck_assert_uint_gt(m->units_per_split, 0);
}

static uint64_t
task_of_value(const lease_map *m, int64_t v)
{
	uint64_t split = (uint64_t)v / m->units_per_split;

	ck_assert_uint_lt(split, 4096);
	ck_assert_msg(m->task_of[split] != 0, "split %" PRIu64 " was never "
	    "leased", split);
	return m->task_of[split];
}

/* ---- the client's round schedule (client_coord.h) -------------------------------- */

static cwi_element *
scalar(int64_t v)
{
	cwi_element *e = cwi_element_new(1);

	ck_assert_ptr_nonnull(e);
	cwi_tensor_init_i64(&e->comp[0], v);
	return e;
}

static cwi_task_info
task_info(uint64_t id, uint64_t start, uint64_t end)
{
	cwi_task_info t;

	memset(&t, 0, sizeof(t));
	t.task_id = id;
	t.worker_id = id;
	t.start_round = start;
	t.end_round = end;
	return t;
}

/* Asks for every request the reader wants now; returns how many. */
static int
drain_requests(cwi_coord *c, cwi_coord_request *v, int max)
{
	int n = 0;

	while (n < max && cwi_coord_next_request(c, 0, &v[n]))
		n++;
	return n;
}

START_TEST(coord_reader_asks_each_task_for_its_rounds_in_order)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, 0, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];

	ck_assert_int_eq(cwi_coord_create(&c, 6, 2), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 0); /* no tasks yet */
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	/* Rounds 0..3 alternate over tasks 1 and 2 (2 per task at most). */
	ck_assert_int_eq(drain_requests(c, rq, 16), 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_uint_eq(rq[i].task_id, (uint64_t)(i % 2) + 1);
		ck_assert_uint_eq(rq[i].task_round, (uint64_t)(i / 2));
		ck_assert_uint_eq(rq[i].round, (uint64_t)i);
	}
	cwi_coord_destroy(c);
}
END_TEST

START_TEST(coord_reader_delivers_rounds_in_order_whatever_the_reply_order)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, 0, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];
	cwi_coord_round r;

	ck_assert_int_eq(cwi_coord_create(&c, 4, 4), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 4);
	/* Task 2's rounds come first: nothing to deliver before round 0. */
	ck_assert_int_eq(cwi_coord_received(c, 2, 1, scalar(21), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 2, 0, scalar(20), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_WAIT);
	ck_assert_int_eq(cwi_coord_received(c, 1, 0, scalar(10), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	ck_assert_uint_eq(r.round, 0);
	ck_assert_int_eq(cwt_i64(r.element, 0), 10);
	cwi_element_release(r.element);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	ck_assert_uint_eq(r.round, 1);
	ck_assert_uint_eq(r.task_id, 2);
	ck_assert_int_eq(cwt_i64(r.element, 0), 20);
	cwi_element_release(r.element);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_WAIT); /* task 1 */
	ck_assert_uint_eq(cwi_coord_next_round(c), 2);
	/* A reply nobody asked for is refused, and dropped. */
	ck_assert_int_eq(cwi_coord_received(c, 1, 3, scalar(13), false, NULL,
			     0),
	    CACHEW_EINVAL);
	cwi_coord_destroy(c); /* frees task 2's round 1, still held */
}
END_TEST

START_TEST(coord_reader_skips_an_ended_task_and_ends_the_epoch)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, 0, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];
	cwi_coord_round r;
	cwi_split_end *ends = calloc(1, sizeof(*ends));

	ck_assert_ptr_nonnull(ends);
	ends[0].split_id = 7;
	ends[0].parts = 2;
	ck_assert_int_eq(cwi_coord_create(&c, 8, 8), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 8);
	/* Task 1 ends at its round 0 (round 0), with split 7's end. */
	ck_assert_int_eq(cwi_coord_received(c, 1, 0, NULL, true, ends, 1),
	    CACHEW_OK);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(cwi_coord_received(c, 2, (uint64_t)k,
				     scalar(20 + k), false, NULL, 0),
		    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 2, 3, NULL, true, NULL, 0),
	    CACHEW_OK);
	/* Round 0: no element, split 7 acknowledged. */
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	ck_assert_ptr_null(r.element);
	ck_assert_uint_eq(r.nends, 1);
	ck_assert_uint_eq(r.ends[0].split_id, 7);
	free(r.ends);
	/* Then task 2's rounds 0..2 in rounds 1, 3, 5 (2, 4 are skipped). */
	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
		ck_assert_uint_eq(r.round, (uint64_t)(2 * k + 1));
		ck_assert_int_eq(cwt_i64(r.element, 0), 20 + k);
		cwi_element_release(r.element);
	}
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND); /* end */
	ck_assert_ptr_null(r.element);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_END);
	/* The tasks leave the list (done): still the end, and the round
	 * numbering stays. */
	ck_assert_int_eq(cwi_coord_update(c, NULL, 0, CWI_ROUND_NONE),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_END);
	cwi_coord_destroy(c);
}
END_TEST

START_TEST(coord_reader_waits_at_block_round_and_follows_the_new_schedule)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, CWI_ROUND_NONE, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];
	cwi_coord_round r;

	t[1].state = CWI_TASK_STARTING;
	ck_assert_int_eq(cwi_coord_create(&c, 8, 8), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, 2), CACHEW_OK);
	/* Only rounds 0 and 1, both task 1's, before the block. */
	ck_assert_int_eq(drain_requests(c, rq, 16), 2);
	ck_assert_uint_eq(rq[1].task_id, 1);
	ck_assert_uint_eq(rq[1].task_round, 1);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(cwi_coord_received(c, 1, (uint64_t)k,
				     scalar(k), false, NULL, 0),
		    CACHEW_OK);
		ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
		cwi_element_release(r.element);
	}
	ck_assert(cwi_coord_blocked(c));
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_WAIT);
	/* Committed: task 2 serves from round 2 on, every other round. */
	t[1].state = CWI_TASK_ACTIVE;
	t[1].start_round = 2;
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert(!cwi_coord_blocked(c));
	ck_assert_int_eq(drain_requests(c, rq, 16), 8);
	ck_assert_uint_eq(rq[0].task_id, 1); /* round 2: 2 mod 2 = 0 */
	ck_assert_uint_eq(rq[0].task_round, 2);
	ck_assert_uint_eq(rq[1].task_id, 2);
	ck_assert_uint_eq(rq[1].task_round, 0);
	cwi_coord_destroy(c);
}
END_TEST

START_TEST(coord_reader_drops_a_task_that_vanished_before_its_end)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, 0, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];
	cwi_coord_round r;

	ck_assert_int_eq(cwi_coord_create(&c, 4, 4), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 4);
	ck_assert_int_eq(cwi_coord_received(c, 2, 0, scalar(20), false, NULL,
			     0),
	    CACHEW_OK);
	/* Task 2's worker died: its last request settles (here with an
	 * element, not its end), then every round is task 1's, and later
	 * replies of task 2 are not wanted. */
	ck_assert_int_eq(cwi_coord_update(c, t, 1, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 2, 1, scalar(21), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 2, 2, scalar(22), false, NULL,
			     0),
	    CACHEW_ENOENT);
	ck_assert_int_eq(drain_requests(c, rq, 16), 2); /* task 1: 2, 3 */
	for (int k = 0; k < 4; k++)
		ck_assert_int_eq(cwi_coord_received(c, 1, (uint64_t)k,
				     scalar(10 + k), false, NULL, 0),
		    CACHEW_OK);
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
		ck_assert_uint_eq(r.task_id, 1);
		ck_assert_int_eq(cwt_i64(r.element, 0), 10 + k);
		cwi_element_release(r.element);
	}
	cwi_coord_destroy(c);
}
END_TEST

/* The dispatcher drops a task once its worker sent every consumer the end
 * round, which may still be on its way: the task keeps its place until its
 * requests settle. */
START_TEST(coord_reader_keeps_a_dropped_task_until_its_end_arrives)
{
	cwi_coord *c;
	cwi_task_info t[2] = {task_info(1, 0, CWI_ROUND_NONE),
	    task_info(2, 0, CWI_ROUND_NONE)};
	cwi_coord_request rq[16];
	cwi_coord_round r;

	ck_assert_int_eq(cwi_coord_create(&c, 4, 4), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 4);
	ck_assert_int_eq(cwi_coord_received(c, 1, 0, scalar(10), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 1, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 0); /* none to task 2 */
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	cwi_element_release(r.element);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_WAIT); /* task 2's */
	/* Its end arrives: round 1 is empty, and the task stays in the
	 * schedule (round 3 is its too, and skipped). */
	ck_assert_int_eq(cwi_coord_received(c, 2, 0, NULL, true, NULL, 0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 2, 1, NULL, true, NULL, 0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	ck_assert_uint_eq(r.round, 1);
	ck_assert_ptr_null(r.element);
	ck_assert_int_eq(cwi_coord_received(c, 1, 1, scalar(11), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
	ck_assert_uint_eq(r.round, 2);
	cwi_element_release(r.element);
	ck_assert_uint_eq(drain_requests(c, rq, 16), 2); /* task 1: 2, 3 */
	ck_assert_uint_eq(rq[0].round, 4);
	/* Without its end, a failed last request takes it out. */
	cwi_coord_destroy(c);
	ck_assert_int_eq(cwi_coord_create(&c, 4, 4), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, t, 2, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 16), 4);
	ck_assert_int_eq(cwi_coord_update(c, t, 1, CWI_ROUND_NONE), CACHEW_OK);
	cwi_coord_failed(c, 2, 0, 0);
	cwi_coord_failed(c, 2, 1, 0);
	ck_assert_int_eq(cwi_coord_received(c, 1, 0, scalar(10), false, NULL,
			     0),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_coord_received(c, 1, 1, scalar(11), false, NULL,
			     0),
	    CACHEW_OK);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(cwi_coord_pop(c, &r), CWI_COORD_ROUND);
		ck_assert_uint_eq(r.round, (uint64_t)k);
		ck_assert_uint_eq(r.task_id, 1);
		cwi_element_release(r.element);
	}
	cwi_coord_destroy(c);
}
END_TEST

START_TEST(coord_reader_asks_again_after_a_failure)
{
	cwi_coord *c;
	cwi_task_info t = task_info(1, 0, CWI_ROUND_NONE);
	cwi_coord_request rq[4];

	ck_assert_int_eq(cwi_coord_create(&c, 1, 1), CACHEW_OK);
	ck_assert_int_eq(cwi_coord_update(c, &t, 1, CWI_ROUND_NONE), CACHEW_OK);
	ck_assert_int_eq(drain_requests(c, rq, 4), 1);
	cwi_coord_failed(c, 1, 0, 1000);
	ck_assert(!cwi_coord_next_request(c, 999, &rq[1]));
	ck_assert(cwi_coord_next_request(c, 1000, &rq[1]));
	ck_assert_uint_eq(rq[1].task_round, 0);
	cwi_coord_destroy(c);
}
END_TEST

/* ---- compressed payloads (service_payload.h) ------------------------------------------ */

/* Three elements: a scalar, an i64 batch, a bytes string. */
static void
sample_elements(cwi_element **v)
{
	static const char text[] = "compressible compressible compressible";
	cachew_element *e;
	int64_t shape = 512, *rows;

	v[0] = scalar(42);
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_I64, 1, &shape,
			     (void **)&rows),
	    CACHEW_OK);
	for (int i = 0; i < 512; i++)
		rows[i] = i / 4;
	v[1] = e;
	v[2] = cwi_element_new(1);
	ck_assert_int_eq(cwi_tensor_init_bytes_copy(&v[2]->comp[0], text,
			     sizeof(text) - 1),
	    CACHEW_OK);
}

/* The frame of the sample elements, copied out (len bytes; free()). */
static uint8_t *
sample_frame(cwi_element **v, size_t *len, size_t *content)
{
	cwi_zstd_pool *pool;
	cwi_element *fe;
	const uint8_t *p;
	uint8_t *copy;

	ck_assert_int_eq(cwi_zstd_pool_create(&pool), CACHEW_OK);
	ck_assert_int_eq(cwi_payload_compress(pool, CWI_PAYLOAD_ZSTD_LEVEL, v,
			     3, &fe, content),
	    CACHEW_OK);
	p = cwi_tensor_str(&fe->comp[0], 0, len);
	copy = malloc(*len + 16);
	ck_assert_ptr_nonnull(copy);
	memcpy(copy, p, *len);
	cwi_element_release(fe);
	cwi_zstd_pool_destroy(pool);
	return copy;
}

START_TEST(payload_zstd_round_trips_elements_zero_copy)
{
	cwi_element *v[3], *back[3];
	size_t len, content;
	uint8_t *frame;

	sample_elements(v);
	frame = sample_frame(v, &len, &content);
	ck_assert_uint_lt(len, content); /* it did compress */
	ck_assert_int_eq(cwi_payload_decompress(NULL, frame, len, 3, 1 << 20,
			     back),
	    CACHEW_OK);
	for (int i = 0; i < 3; i++) {
		ck_assert(cwi_element_equal(v[i], back[i]));
		cwi_element_release(back[i]);
	}
	/* The batch's payload views the decompressed buffer, aligned. */
	ck_assert_int_eq(cwi_payload_decompress(NULL, frame, len, 3, 1 << 20,
			     back),
	    CACHEW_OK);
	ck_assert_ptr_nonnull(back[1]->comp[0].buf);
	ck_assert_uint_eq((uintptr_t)cwi_tensor_data(&back[1]->comp[0]) % 16,
	    0);
	ck_assert_ptr_eq(back[1]->comp[0].buf, back[2]->comp[0].buf);
	for (int i = 0; i < 3; i++) {
		cwi_element_release(back[i]);
		cwi_element_release(v[i]);
	}
	free(frame);
}
END_TEST

static void
expect_eproto(const uint8_t *frame, size_t len, uint32_t count, size_t limit,
    const char *what)
{
	cwi_element *out[8] = {NULL};

	ck_assert_int_eq(cwi_payload_decompress(NULL, frame, len, count, limit,
			     out),
	    CACHEW_EPROTO);
	ck_assert_msg(strstr(cachew_errmsg(), what) != NULL, "%s", cachew_errmsg());
	for (int i = 0; i < 8; i++)
		ck_assert_ptr_null(out[i]);
}

START_TEST(payload_zstd_refuses_bad_frames_with_eproto)
{
	cwi_element *v[3];
	size_t len, content;
	uint8_t *frame, junk[64];

	sample_elements(v);
	frame = sample_frame(v, &len, &content);
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	expect_eproto(junk, sizeof(junk), 1, 1 << 20,
	    "do not start a zstd frame");
	expect_eproto(frame, 0, 1, 1 << 20, "do not start a zstd frame");
	expect_eproto(frame, len - 5, 3, 1 << 20, "compressed payload");
	frame[len] = 0;
	expect_eproto(frame, len + 1, 3, 1 << 20, "1 bytes after the zstd frame");
	expect_eproto(frame, len, 3, content - 1, "over the limit");
	expect_eproto(frame, len, (uint32_t)content, 1 << 20, "do not fit");
	expect_eproto(frame, len, 2, 1 << 20, "after the last of 2 elements");
	expect_eproto(frame, len, 4, 1 << 20, "element 3");
	for (int i = 0; i < 3; i++)
		cwi_element_release(v[i]);
	free(frame);
}
END_TEST

START_TEST(payload_zstd_refuses_frames_without_content_size_or_of_garbage)
{
	uint8_t junk[300], frame[600];
	ZSTD_CCtx *z = ZSTD_createCCtx();
	ZSTD_outBuffer out = {frame, sizeof(frame), 0};
	ZSTD_inBuffer in = {junk, sizeof(junk), 0};
	size_t len;

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i % 7 == 0 ? 0xdd : i);
	/* A streamed frame declares no content size. */
	ck_assert_ptr_nonnull(z);
	ck_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(z,
	    ZSTD_c_contentSizeFlag, 0)));
	ck_assert_uint_eq(ZSTD_compressStream2(z, &out, &in, ZSTD_e_end), 0);
	expect_eproto(frame, out.pos, 1, 1 << 20, "does not declare");
	/* A well-formed frame whose content is not elements. */
	len = ZSTD_compress(frame, sizeof(frame), junk, sizeof(junk), 1);
	ck_assert(!ZSTD_isError(len));
	expect_eproto(frame, len, 1, 1 << 20, "element 0");
	ZSTD_freeCCtx(z);
}
END_TEST

/* Every single flipped byte of a frame is refused (the frame carries a
 * checksum) or, where the flip is immaterial, decodes to the same
 * elements: never a crash, never other data. */
START_TEST(payload_zstd_detects_every_flipped_byte)
{
	cwi_element *v[3], *back[3];
	size_t len, content;
	uint8_t *frame;
	int refused = 0;

	sample_elements(v);
	frame = sample_frame(v, &len, &content);
	for (size_t i = 0; i < len; i++) {
		frame[i] ^= 0x5a;
		cachew_err rv = cwi_payload_decompress(NULL, frame, len, 3,
		    1 << 20, back);
		if (rv == CACHEW_OK) {
			for (int k = 0; k < 3; k++) {
				ck_assert_msg(cwi_element_equal(v[k], back[k]),
				    "byte %zu flipped: element %d changed", i, k);
				cwi_element_release(back[k]);
			}
		} else {
			ck_assert_int_eq(rv, CACHEW_EPROTO);
			refused++;
		}
		frame[i] ^= 0x5a;
	}
	ck_assert_int_ge(refused, (int)len - 4);
	for (int i = 0; i < 3; i++)
		cwi_element_release(v[i]);
	free(frame);
}
END_TEST

/* ---- coordinated reads end to end ------------------------------------------------ */

/* One worker: its rounds are the pipeline's elements two by two, consumer
 * 0 gets the first of each, consumer 1 the second; the 1001st element
 * makes an incomplete last round and is dropped. */
static void
one_worker_lock_step(const char *compression)
{
	cluster c;
	consumer v[2];

	cluster_start(&c, 1);
	run_consumers(v, 2, c.dispatcher.url, "range(1001)", "sync", 2,
	    compression);
	ck_assert_uint_eq(v[0].n, 500);
	ck_assert_uint_eq(v[1].n, 500);
	for (size_t j = 0; j < 500; j++) {
		ck_assert_int_eq(v[0].first[j], (int64_t)(2 * j));
		ck_assert_int_eq(v[1].first[j], (int64_t)(2 * j + 1));
	}
	char *log = cwt_slurp(c.workers[0].log);
	ck_assert_msg(strstr(log, "event=rounds_ended") != NULL &&
		strstr(log, "dropped=1") != NULL,
	    "%s", log);
	if (compression != NULL && strcmp(compression, "zstd") == 0)
		ck_assert_msg(strstr(log, "event=compressing") != NULL, "%s",
		    log);
	else
		ck_assert_msg(strstr(log, "event=compressing") == NULL, "%s",
		    log);
	free(log);
	/* Every split was acknowledged by both consumers: the epoch is
	 * complete at the dispatcher. */
	char *ev = events_text(&c);
	ck_assert_msg(strstr(ev, "\"event\":\"epoch_done\"") != NULL, "%s", ev);
	free(ev);
	consumers_free(v, 2);
	cluster_stop(&c);
}

START_TEST(coord_two_consumers_take_rounds_in_lock_step)
{
	one_worker_lock_step(NULL);
}
END_TEST

START_TEST(coord_lock_step_holds_with_zstd_payloads)
{
	one_worker_lock_step("zstd");
}
END_TEST

/*
 * Two workers, two consumers, 1 MiB batches: every round's two batches
 * come from the same task (the events log says which task leased which
 * split), they are consecutive batches of that task, rounds alternate
 * between the tasks while both have data, and the union is the whole input
 * (each task's batch count is even here: nothing is dropped). 128 MiB of
 * input: more than one worker's 64 MiB queue, so the first task to start
 * cannot take every split before the other starts (consumers cannot pass
 * its first round without the other task).
 */
START_TEST(coord_rounds_come_from_one_task_at_a_time)
{
	const int64_t batch = 131072, nbatches = 128;
	char pipeline[128];
	cluster c;
	consumer v[2];
	lease_map m;
	uint8_t *seen = calloc((size_t)nbatches, 1);
	size_t from[2] = {0, 0}, rounds;

	snprintf(pipeline, sizeof(pipeline), "range(%" PRId64 ") | batch(%" PRId64
	    ")", batch * nbatches, batch);
	cluster_start(&c, 2);
	run_consumers(v, 2, c.dispatcher.url, pipeline, "sync2", 2, NULL);
	lease_map_read(&c, &m);
	ck_assert_int_eq(m.ntasks, 2); /* both tasks leased splits */
	ck_assert_uint_eq(v[0].n, v[1].n);
	rounds = v[0].n;
	ck_assert_uint_eq(rounds * 2, (size_t)nbatches);
	for (size_t j = 0; j < rounds; j++) {
		uint64_t t0 = task_of_value(&m, v[0].first[j]);
		uint64_t t1 = task_of_value(&m, v[1].first[j]);
		ck_assert_msg(t0 == t1, "round %zu: task %" PRIu64 " and %" PRIu64,
		    j, t0, t1);
		ck_assert_int_eq(v[1].first[j], v[0].first[j] + batch);
		from[t0 == m.tasks[0] ? 0 : 1]++;
		for (int k = 0; k < 2; k++) {
			int64_t b = v[k].first[j] / batch;
			ck_assert_int_eq(seen[b], 0);
			seen[b] = 1;
		}
	}
	/* Rounds alternate while both tasks serve: round r is the task
	 * r mod 2 (both started at round 0). */
	size_t both = 2 * (from[0] < from[1] ? from[0] : from[1]);
	ck_assert_uint_gt(both, 0);
	for (size_t j = 0; j + 1 < both; j++) {
		if (task_of_value(&m, v[0].first[j]) !=
		    task_of_value(&m, v[0].first[j + 1]))
			continue;
		char seq[1024];
		size_t k = 0;
		for (size_t i = 0; i < rounds && k + 24 < sizeof(seq); i++)
			k += (size_t)snprintf(seq + k, sizeof(seq) - k,
			    "%" PRIu64 ":%" PRId64 " ",
			    task_of_value(&m, v[0].first[i]),
			    v[0].first[i] / batch);
		char *ev = events_text(&c);
		fprintf(stderr, "EVENTS\n%s\n", ev);
		ck_abort_msg("rounds %zu and %zu from one task: %s", j, j + 1,
		    seq);
	}
	consumers_free(v, 2);
	free(seen);
	cluster_stop(&c);
}
END_TEST

/* ---- compression end to end -------------------------------------------------------- */

START_TEST(compression_zstd_gives_the_same_digest_as_none)
{
	/* Batches of whole splits (8 splits of 2560 units with one
	 * worker): no partial batch at a lease end. */
	static const char *const pipelines[] = {
	    "range(20480) | map(add, value=3) | batch(64)",
	    "range(5000) | shuffle(100) | map(mul, value=2)",
	};
	cluster c;
	consumer v[1];

	cluster_start(&c, 1);
	for (size_t i = 0; i < 2; i++) {
		uint64_t n, digest;
		local_digest(pipelines[i], &n, &digest);
		run_consumers(v, 1, c.dispatcher.url, pipelines[i], NULL, 0,
		    "zstd");
		ck_assert_uint_eq(v[0].n, n);
		ck_assert_uint_eq(v[0].digest, digest);
		consumers_free(v, 1);
	}
	char *log = cwt_slurp(c.workers[0].log);
	ck_assert_msg(strstr(log, "event=compressing") != NULL, "%s", log);
	free(log);
	cluster_stop(&c);
}
END_TEST

START_TEST(compression_auto_gives_the_same_digest_as_none)
{
	const char *pipeline = "range(51200) | map(add, value=1) | batch(32)";
	cluster c;
	consumer v[1];
	uint64_t n, digest;

	cluster_start(&c, 2);
	local_digest(pipeline, &n, &digest);
	run_consumers(v, 1, c.dispatcher.url, pipeline, NULL, 0, "auto");
	ck_assert_uint_eq(v[0].n, n);
	ck_assert_uint_eq(v[0].digest, digest);
	consumers_free(v, 1);
	cluster_stop(&c);
}
END_TEST

/* Over inproc (the embedded service) payloads are never compressed: the
 * elements move as pointers. */
START_TEST(compression_zstd_in_process_delivers_everything)
{
	const char *pipeline = "range(3000) | map(add, value=1) | batch(10)";
	consumer v[1];
	uint64_t n, digest;

	local_digest(pipeline, &n, &digest);
	run_consumers(v, 1, "embedded", pipeline, NULL, 0, "zstd");
	ck_assert_uint_eq(v[0].n, n);
	ck_assert_uint_eq(v[0].digest, digest);
	consumers_free(v, 1);
}
END_TEST

Suite *
cwt_coord_suite(void)
{
	Suite *s = suite_create("coord");
	TCase *unit = tcase_create("coord_unit");
	TCase *e2e = tcase_create("coord_cluster");

	tcase_add_test(unit, coord_reader_asks_each_task_for_its_rounds_in_order);
	tcase_add_test(unit,
	    coord_reader_delivers_rounds_in_order_whatever_the_reply_order);
	tcase_add_test(unit, coord_reader_skips_an_ended_task_and_ends_the_epoch);
	tcase_add_test(unit,
	    coord_reader_waits_at_block_round_and_follows_the_new_schedule);
	tcase_add_test(unit,
	    coord_reader_drops_a_task_that_vanished_before_its_end);
	tcase_add_test(unit,
	    coord_reader_keeps_a_dropped_task_until_its_end_arrives);
	tcase_add_test(unit, coord_reader_asks_again_after_a_failure);
	tcase_add_test(unit, payload_zstd_round_trips_elements_zero_copy);
	tcase_add_test(unit, payload_zstd_refuses_bad_frames_with_eproto);
	tcase_add_test(unit,
	    payload_zstd_refuses_frames_without_content_size_or_of_garbage);
	tcase_add_test(unit, payload_zstd_detects_every_flipped_byte);
	suite_add_tcase(s, unit);
	tcase_set_timeout(e2e, 120);
	tcase_add_checked_fixture(e2e, NULL, teardown_cluster);
	tcase_add_test(e2e, coord_two_consumers_take_rounds_in_lock_step);
	tcase_add_test(e2e, coord_lock_step_holds_with_zstd_payloads);
	tcase_add_test(e2e, coord_rounds_come_from_one_task_at_a_time);
	tcase_add_test(e2e, compression_zstd_gives_the_same_digest_as_none);
	tcase_add_test(e2e, compression_auto_gives_the_same_digest_as_none);
	tcase_add_test(e2e, compression_zstd_in_process_delivers_everything);
	suite_add_tcase(s, e2e);
	return s;
}
