/*
 * check_exact.c - the service gives exactly the data in-process gives
 * (issue 20): tf.data's documented batch, unbatch, shuffle, repeat, take,
 * skip and shard behaviours in-process, on the embedded service and on
 * real cachewd processes; and exactly-once delivery while workers die.
 */
#include "cwt.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- what a run gave: batch sizes in order, values as a multiset ---- */

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/*
 * "sizes=<leading dimension of each element, in order, '.' for a scalar>
 * values=<every i64 value of component 0, sorted>", leaving out zeros
 * when `nonzero` (padding, whose count depends on which elements share a
 * batch).
 */
static char *
describe(cachew_element **v, size_t n, bool nonzero)
{
	size_t cap = 64, len = 0, nval = 0, capval = 64;
	char *s = malloc(cap);
	int64_t *vals = malloc(capval * sizeof(*vals));

	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_nonnull(vals);
	len = (size_t)snprintf(s, cap, "sizes=");
	for (size_t i = 0; i < n; i++) {
		const cachew_tensor *t = cachew_element_component(v[i], 0);
		const int64_t *x = cachew_tensor_data(t);
		int64_t numel = 1;
		char item[32];
		int rank = (int)cachew_tensor_rank(t);

		ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_I64);
		for (int d = 0; d < rank; d++)
			numel *= cachew_tensor_shape(t)[d];
		snprintf(item, sizeof(item), "%s%s", i > 0 ? "," : "",
		    rank == 0 ? "." : "");
		if (rank > 0)
			snprintf(item + strlen(item), sizeof(item) - strlen(item),
			    "%lld", (long long)cachew_tensor_shape(t)[0]);
		while (len + strlen(item) + 1 > cap)
			ck_assert_ptr_nonnull(s = realloc(s, cap *= 2));
		memcpy(s + len, item, strlen(item) + 1);
		len += strlen(item);
		for (int64_t k = 0; k < numel; k++) {
			if (nonzero && x[k] == 0)
				continue;
			if (nval == capval)
				ck_assert_ptr_nonnull(vals = realloc(vals,
				    (capval *= 2) * sizeof(*vals)));
			vals[nval++] = x[k];
		}
	}
	qsort(vals, nval, sizeof(*vals), cmp_i64);
	for (size_t i = 0; i <= nval; i++) {
		char item[32];
		if (i == nval)
			snprintf(item, sizeof(item), "%s", i == 0 ? " values=" : "");
		else
			snprintf(item, sizeof(item), "%s%lld",
			    i == 0 ? " values=" : ",", (long long)vals[i]);
		while (len + strlen(item) + 1 > cap)
			ck_assert_ptr_nonnull(s = realloc(s, cap *= 2));
		memcpy(s + len, item, strlen(item) + 1);
		len += strlen(item);
	}
	free(vals);
	return s;
}

static char *
run_described(const char *pipeline, const char *service, bool nonzero)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_element **v;
	size_t n;
	char err[512], *s;

	ck_assert_int_eq(cachew_options_set_str(o, "service", service),
	    CACHEW_OK);
	cachew_err rv = cwt_run(pipeline, o, &v, &n, err, sizeof(err));
	ck_assert_msg(rv == CACHEW_OK, "%s on %s: %s", pipeline, service, err);
	s = describe(v, n, nonzero);
	cwt_free(v, n);
	cachew_options_destroy(o);
	return s;
}

/* tf.data's documented outputs (the `>>>` examples of its API docs),
 * written as batch sizes; the values are the in-process run's. */
static const struct {
	const char *pipeline;
	const char *sizes; /* NULL: only equal to in-process */
	bool nonzero;
	/* Which elements a drop_remainder drops depends on how they were
	 * grouped, which distribution may change: compare sizes only. */
	bool sizes_only;
} behaviours[] = {
    {"range(8) | batch(3)", "sizes=3,3,2", false, false},
    {"range(8) | batch(3, drop_remainder=true)", "sizes=3,3", false, true},
    {"range(6) | batch(2) | unbatch | batch(3)", "sizes=3,3", false, false},
    {"range(100) | batch(10)", "sizes=10,10,10,10,10,10,10,10,10,10", false,
	false},
    {"range(20) | batch(4) | map(add, value=1)", "sizes=4,4,4,4,4", false,
	false},
    {"range(50) | batch(7, drop_remainder=true) | unbatch | batch(5)",
	"sizes=5,5,5,5,5,5,5,5,5,4", false, true},
    {"range(30) | shuffle(7, seed=3) | batch(4)", "sizes=4,4,4,4,4,4,4,2",
	false, false},
    {"from_list([\"a\", \"a b\", \"a b c\", \"b\", \"c d\", \"e f g h\", "
     "\"i\"]) | map(tokenize) | padded_batch(3)", "sizes=3,3,1", true,
	false},
    {"range(10) | shuffle(10, seed=7, reshuffle_each_iteration=true) | "
     "repeat(2)", NULL, false, false},
    {"range(0) | batch(3)", "sizes= values=", false, false},
    /* Position-selecting operators run on the client over the groups in
     * split order: the elements in-process keeps. */
    {"range(10) | take(5)", "sizes=.,.,.,.,.", false, false},
    {"range(10) | skip(7)", "sizes=.,.,.", false, false},
    {"range(10) | shard(3, 1)", "sizes=.,.,.", false, false},
    {"range(100) | map(add, value=1) | take(37)", NULL, false, false},
    {"range(10) | enumerate | take(4)", NULL, false, false},
    {"range(3000) | map(sleep_us, us=100) | skip(500) | take(2000)", NULL,
	false, false},
    /* Over batches stitched across leases, which elements share a batch
     * differs: how many batches does not. */
    {"range(20) | batch(3) | take(4)", "sizes=3,3,3,3", false, true},
};

static void
check_behaviours(const char *service)
{
	for (size_t i = 0; i < sizeof(behaviours) / sizeof(behaviours[0]);
	     i++) {
		char *local = run_described(behaviours[i].pipeline, "local",
		    behaviours[i].nonzero);
		char *there = run_described(behaviours[i].pipeline, service,
		    behaviours[i].nonzero);
		if (behaviours[i].sizes != NULL)
			ck_assert_msg(strncmp(local, behaviours[i].sizes,
					  strlen(behaviours[i].sizes)) == 0 &&
				      (local[strlen(behaviours[i].sizes)] == ' ' ||
					  local[strlen(behaviours[i].sizes)] ==
					      '\0'),
			    "%s in-process: %s", behaviours[i].pipeline, local);
		if (behaviours[i].sizes_only) {
			*strchr(local, ' ') = '\0';
			*strchr(there, ' ') = '\0';
		}
		ck_assert_msg(strcmp(local, there) == 0,
		    "%s\n  in-process: %s\n  %s: %s", behaviours[i].pipeline,
		    local, service, there);
		free(local);
		free(there);
	}
}

START_TEST(exact_tfdata_behaviours_embedded)
{
	check_behaviours("embedded");
	check_behaviours("embedded:3");
}
END_TEST

/* Two workers and a split per unit: every lease ends with a partial batch
 * the client stitches. */
START_TEST(exact_tfdata_behaviours_cluster)
{
	cwt_cluster c;

	cwt_cluster_start(&c, 2);
	check_behaviours(c.dispatcher.url);
	cwt_cluster_stop(&c);
}
END_TEST

/* ---- chaos: workers die, stall, drain and lose replies ------------------- */

/* A client reading range(n) | map(sleep_us) through the service, counting
 * every value it gets. */
typedef struct reader {
	const char *url;
	const char *job_name; /* NULL: a private job */
	int n, us;
	int timeout_ms;
	bool ordered; /* read through skip(0): in order, checked */
	int unordered; /* elements that came before a smaller one */
	uint8_t *seen;
	atomic_int received;
	cachew_err rv;
	char err[512];
} reader;

static void *
reader_main(void *arg)
{
	reader *a = arg;
	cachew_options *o = cwt_opts(11, 1);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	char p[128];

	int64_t last = -1;

	snprintf(p, sizeof(p), "range(%d) | map(sleep_us, us=%d)%s", a->n,
	    a->us, a->ordered ? " | skip(0)" : "");
	ck_assert_int_eq(cachew_options_set_str(o, "service", a->url),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "service_timeout_ms",
			     a->timeout_ms), CACHEW_OK);
	if (a->job_name != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "job_name",
				     a->job_name), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	a->rv = cachew_iterator_create(&it, ds, o);
	if (a->rv == CACHEW_OK) {
		while ((a->rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			int64_t x = cwt_i64(e, 0);
			if (x >= 0 && x < a->n && a->seen[x] < 255)
				a->seen[x]++;
			if (x < last)
				a->unordered++;
			last = x;
			atomic_fetch_add(&a->received, 1);
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

static uint64_t
rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int
total_received(reader *r, int nr)
{
	int n = 0;

	for (int i = 0; i < nr; i++)
		n += atomic_load(&r[i].received);
	return n;
}

/* A live worker, at random (-1: none). */
static int
pick_worker(const cwt_cluster *c, uint64_t *rng)
{
	int live[CWT_CLUSTER_MAX_WORKERS], n = 0;

	for (int i = 0; i < c->nworkers; i++)
		if (c->workers[i].pid > 0)
			live[n++] = i;
	return n > 0 ? live[rng_next(rng) % (uint64_t)n] : -1;
}

enum { CHAOS_KILL, CHAOS_STALL, CHAOS_DRAIN, CHAOS_NACTIONS };

/* One worker, at a moment chosen by rng, is killed (SIGKILL, a new one
 * starts), stalled past the worker timeout (SIGSTOP 2.5 s: declared dead,
 * then it comes back), or drained (SIGTERM, a new one starts). */
static const char *
chaos_act(cwt_cluster *c, uint64_t *rng, int kinds)
{
	int action = (int)(rng_next(rng) % (uint64_t)kinds);
	int w = pick_worker(c, rng);

	if (w < 0 || c->nworkers == CWT_CLUSTER_MAX_WORKERS)
		return "none";
	switch (action) {
	case CHAOS_KILL:
		cwt_daemon_stop(&c->workers[w], SIGKILL);
		cwt_cluster_worker_start(c, c->nworkers++);
		return "kill";
	case CHAOS_STALL:
		kill(c->workers[w].pid, SIGSTOP);
		cwt_nap_ms(2500);
		kill(c->workers[w].pid, SIGCONT);
		return "stall";
	default:
		cwt_daemon_stop(&c->workers[w], SIGTERM);
		cwt_cluster_worker_start(c, c->nworkers++);
		return "drain";
	}
}

/*
 * One chaos run: 4 workers, nreaders clients (2: one shared job), n
 * distinct elements; `actions` disturbances at moments drawn from seed
 * (after 5..80% of the elements arrived), of the first `kinds` kinds; with
 * `faults`, workers also lose 1% of their replies by timeout and 1% by
 * connection reset. Every element must arrive exactly once. Returns the
 * epoch's wall time in ms.
 */
static uint64_t
chaos_run(uint64_t seed, int nreaders, int actions, int kinds, bool faults,
    bool ordered)
{
	cwt_cluster c;
	reader r[2];
	pthread_t th[2];
	uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 7, t0, ms;
	char env[64], what[128] = "";
	int n = 6000, missing = 0, repeated = 0;

	if (faults) {
		snprintf(env, sizeof(env), "drop=0.01,reset=0.01,seed=%llu",
		    (unsigned long long)seed);
		setenv("CACHEW_FAULTS", env, 1);
	}
	cwt_cluster_start(&c, 4);
	unsetenv("CACHEW_FAULTS");
	memset(r, 0, sizeof(r));
	t0 = cwt_now_ms();
	for (int i = 0; i < nreaders; i++) {
		r[i].url = c.dispatcher.url;
		r[i].job_name = nreaders > 1 ? "chaos" : NULL;
		r[i].n = n;
		r[i].us = 500;
		r[i].timeout_ms = faults ? 1500 : 30000;
		r[i].ordered = ordered;
		r[i].seen = calloc((size_t)n, 1);
		ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main,
				     &r[i]), 0);
	}
	for (int k = 0; k < actions; k++) {
		int at = n / 20 + (int)(rng_next(&rng) % (uint64_t)(n * 3 / 4));
		uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(30000);
		while (total_received(r, nreaders) < at &&
		       cwt_now_ms() < deadline)
			cwt_nap_ms(2);
		if (total_received(r, nreaders) >= n)
			break;
		snprintf(what + strlen(what), sizeof(what) - strlen(what),
		    "%s%s@%d", k > 0 ? "," : "", chaos_act(&c, &rng, kinds),
		    total_received(r, nreaders));
	}
	for (int i = 0; i < nreaders; i++)
		pthread_join(th[i], NULL);
	ms = cwt_now_ms() - t0;
	for (int i = 0; i < nreaders; i++)
		ck_assert_msg(r[i].rv == CACHEW_EOF, "seed %llu (%s): client "
		    "%d: %s", (unsigned long long)seed, what, i, r[i].err);
	for (int v = 0; v < n; v++) {
		int got = 0;
		for (int i = 0; i < nreaders; i++)
			got += r[i].seen[v];
		missing += got == 0;
		repeated += got > 1 ? got - 1 : 0;
	}
	fprintf(stderr, "chaos seed=%llu readers=%d faults=%d ordered=%d "
	    "actions=%s elements=%d missing=%d repeated=%d epoch_ms=%llu\n",
	    (unsigned long long)seed, nreaders, faults, ordered,
	    what[0] ? what : "none", n, missing, repeated,
	    (unsigned long long)ms);
	ck_assert_msg(missing == 0 && repeated == 0, "seed %llu (%s): %d "
	    "missing, %d repeated", (unsigned long long)seed, what, missing,
	    repeated);
	for (int i = 0; ordered && i < nreaders; i++)
		ck_assert_msg(r[i].unordered == 0, "seed %llu (%s): %d elements "
		    "out of order", (unsigned long long)seed, what,
		    r[i].unordered);
	for (int i = 0; i < nreaders; i++)
		free(r[i].seen);
	cwt_cluster_stop(&c);
	return ms;
}

/* ---- chaos: the dispatcher dies ------------------------------------------ */

/* Kills the dispatcher (SIGKILL) and starts it again on the same address
 * and work dir after `away_ms`; with `discard`, it starts empty (its
 * journal set aside). */
static void
dispatcher_restart(cwt_cluster *c, unsigned away_ms, bool discard)
{
	char work[600], url[256];

	snprintf(url, sizeof(url), "%s", c->dispatcher.url);
	snprintf(work, sizeof(work), "%s/work", c->dir);
	cwt_daemon_stop(&c->dispatcher, SIGKILL);
	cwt_nap_ms(away_ms);
	cwt_daemon_start(&c->dispatcher, c->dir, "dispatcher2",
	    "--role=dispatcher", "--listen", url, "--work-dir", work,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--client-timeout-ms", "20000", "--journal-discard",
	    discard ? "1" : "0", "--journal-verify", "1", (char *)NULL);
	ck_assert_str_eq(c->dispatcher.url, url);
}

/*
 * 4 workers; two clients share a job and a third reads its own, each
 * range(n) | map(sleep_us); the dispatcher is killed `kills` times at
 * moments drawn from seed and comes back after 0..1.5 s with its journal.
 * Both jobs' epochs complete with every element exactly once.
 */
static void
dispatcher_chaos_run(uint64_t seed, int kills)
{
	cwt_cluster c;
	reader r[3];
	pthread_t th[3];
	uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 11, t0;
	char what[128] = "";
	int n = 4000;

	cwt_cluster_start(&c, 4);
	memset(r, 0, sizeof(r));
	t0 = cwt_now_ms();
	for (int i = 0; i < 3; i++) {
		r[i].url = c.dispatcher.url;
		r[i].job_name = i < 2 ? "shared" : NULL;
		r[i].n = n;
		r[i].us = 500;
		r[i].timeout_ms = 30000;
		r[i].seen = calloc((size_t)n, 1);
		ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main,
				     &r[i]), 0);
	}
	for (int k = 0; k < kills; k++) {
		/* Elements of both jobs together: 2n in all. */
		int at = n / 10 + (int)(rng_next(&rng) % (uint64_t)(n * 3 / 2));
		unsigned away = (unsigned)(rng_next(&rng) % 1500);
		uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(30000);
		while (total_received(r, 3) < at && cwt_now_ms() < deadline)
			cwt_nap_ms(2);
		if (total_received(r, 3) >= 2 * n)
			break;
		snprintf(what + strlen(what), sizeof(what) - strlen(what),
		    "%skill@%d+%ums", k > 0 ? "," : "", total_received(r, 3),
		    away);
		dispatcher_restart(&c, away, false);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(r[i].rv == CACHEW_EOF, "seed %llu (%s): client "
		    "%d: %s", (unsigned long long)seed, what, i, r[i].err);
	for (int job = 0; job < 2; job++) {
		int missing = 0, repeated = 0;
		for (int v = 0; v < n; v++) {
			int got = job == 0 ? r[0].seen[v] + r[1].seen[v]
					   : r[2].seen[v];
			missing += got == 0;
			repeated += got > 1 ? got - 1 : 0;
		}
		fprintf(stderr, "dispatcher chaos seed=%llu job=%s actions=%s "
		    "elements=%d missing=%d repeated=%d epoch_ms=%llu\n",
		    (unsigned long long)seed, job == 0 ? "shared" : "private",
		    what[0] ? what : "none", n, missing, repeated,
		    (unsigned long long)(cwt_now_ms() - t0));
		ck_assert_msg(missing == 0 && repeated == 0, "seed %llu (%s): "
		    "%s job: %d missing, %d repeated", (unsigned long long)seed,
		    what, job == 0 ? "shared" : "private", missing, repeated);
	}
	for (int i = 0; i < 3; i++)
		free(r[i].seen);
	cwt_cluster_stop(&c);
}

/* How many seeds each chaos test runs: CWT_CHAOS_SEEDS (make chaos sets
 * it), else 1. */
static int
chaos_seeds(void)
{
	const char *e = getenv("CWT_CHAOS_SEEDS");
	int n = e != NULL ? atoi(e) : 1;

	return n > 0 ? n : 1;
}

START_TEST(chaos_private_job_workers_die)
{
	for (int i = 0; i < chaos_seeds(); i++)
		(void)chaos_run(1000 + (uint64_t)i, 1, 2, CHAOS_NACTIONS, false,
		    false);
}
END_TEST

START_TEST(chaos_shared_job_workers_die)
{
	for (int i = 0; i < chaos_seeds(); i++)
		(void)chaos_run(2000 + (uint64_t)i, 2, 2, CHAOS_NACTIONS, false,
		    false);
}
END_TEST

START_TEST(chaos_replies_lost)
{
	for (int i = 0; i < chaos_seeds(); i++)
		(void)chaos_run(3000 + (uint64_t)i, 1 + i % 2, 1, 1, true,
		    false);
}
END_TEST

/* A client part that selects by position (skip(0)) gets the groups in
 * split order: in-process's order, kept while workers die. */
START_TEST(chaos_ordered_delivery)
{
	for (int i = 0; i < chaos_seeds(); i++)
		(void)chaos_run(4000 + (uint64_t)i, 1, 2, CHAOS_NACTIONS,
		    i % 2 == 1, true);
}
END_TEST

START_TEST(chaos_dispatcher_dies)
{
	for (int i = 0; i < chaos_seeds(); i++)
		dispatcher_chaos_run(5000 + (uint64_t)i, 1 + i % 2);
}
END_TEST

/* A dispatcher that comes back without its state (its journal set
 * aside): the client is told its job is gone, naming it, at once; the
 * workers register again with the new dispatcher and serve a new job. */
START_TEST(dispatcher_back_without_state)
{
	cwt_cluster c;
	reader r, again;
	pthread_t th;
	uint64_t t0;

	cwt_cluster_start(&c, 2);
	memset(&r, 0, sizeof(r));
	r.url = c.dispatcher.url;
	r.n = 20000;
	r.us = 500;
	r.timeout_ms = 30000;
	r.seen = calloc((size_t)r.n, 1);
	ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &r), 0);
	while (atomic_load(&r.received) < 200)
		cwt_nap_ms(5);
	dispatcher_restart(&c, 100, true);
	t0 = cwt_now_ms();
	pthread_join(th, NULL);
	ck_assert_int_eq(r.rv, CACHEW_EIO);
	ck_assert_msg(strstr(r.err, "without its state") != NULL &&
		strstr(r.err, "job 1 ") != NULL, "%s", r.err);
	ck_assert_uint_lt(cwt_now_ms() - t0, (uint64_t)cwt_bound_ms(10000));
	free(r.seen);

	memset(&again, 0, sizeof(again));
	again.url = c.dispatcher.url;
	again.n = 300;
	again.timeout_ms = 30000;
	again.seen = calloc((size_t)again.n, 1);
	reader_main(&again);
	ck_assert_msg(again.rv == CACHEW_EOF, "%s", again.err);
	for (int v = 0; v < again.n; v++)
		ck_assert_int_eq(again.seen[v], 1);
	free(again.seen);
	/* Ids are not reused: the new state's job came after the block the
	 * work dir's ids file reserved (2048), not as job 1 again. */
	{
		char path[700], *ev;
		snprintf(path, sizeof(path), "%s/work/events.jsonl", c.dir);
		ev = cwt_slurp(path);
		ck_assert_ptr_nonnull(ev);
		ck_assert_msg(strstr(ev, "\"event\":\"job_created\",\"job_id\":"
					 "2049") != NULL, "%s", ev);
		free(ev);
	}
	cwt_cluster_stop(&c);
}
END_TEST

Suite *
cwt_exact_suite(void)
{
	Suite *s = suite_create("exact");
	TCase *tc = tcase_create("exact");
	TCase *chaos = tcase_create("chaos");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, exact_tfdata_behaviours_embedded);
	tcase_add_test(tc, exact_tfdata_behaviours_cluster);
	suite_add_tcase(s, tc);
	tcase_set_timeout(chaos, 3600);
	tcase_add_test(chaos, chaos_private_job_workers_die);
	tcase_add_test(chaos, chaos_shared_job_workers_die);
	tcase_add_test(chaos, chaos_replies_lost);
	tcase_add_test(chaos, chaos_ordered_delivery);
	tcase_add_test(chaos, chaos_dispatcher_dies);
	tcase_add_test(chaos, dispatcher_back_without_state);
	suite_add_tcase(s, chaos);
	return s;
}
