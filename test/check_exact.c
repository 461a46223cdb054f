/*
 * check_exact.c - the service gives exactly the data in-process gives
 * (issue 20): tf.data's documented batch, unbatch, shuffle, repeat, take,
 * skip and shard behaviours in-process, on the embedded service and on
 * real cachewd processes; and exactly-once delivery while workers die.
 */
#include "cwt.h"
#include "../src/tools/gen.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
		cwt_cluster_dispatcher_restart(&c, away, false);
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
	cwt_cluster_dispatcher_restart(&c, 100, true);
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

/* ---- the client tail: normalize on the client (issues 14, 18) ------------ */

/*
 * W2's shape on generated JPEGs: 6 shards of 10 images (6 splits over 2
 * workers), batches of 4 (each lease ends with a partial batch the client
 * stitches), then normalize, which a remote service's client runs itself.
 * TAIL_DET crops the centre (in-process yields the same rows); TAIL_RAND
 * is W2's random crop and flip (the same rows wherever normalize runs, for
 * the same splits: lease seeds do not depend on it).
 */
#define TAIL_SRC "tfrecord(files=\"%s/img/*.tfrecord\") | parse_example(" \
	"image=\"image/encoded:bytes\", label=\"image/class/label:i64\")"
#define TAIL_NORM "normalize(mean=[0.485, 0.456, 0.406], std=[0.229, " \
	"0.224, 0.225], channels_first=true%s)"
#define TAIL_DET TAIL_SRC " | decode_jpeg | center_crop(24, 24) | " \
	"batch(%d) | " TAIL_NORM
#define TAIL_RAND TAIL_SRC " | random_resized_crop(size=24) | " \
	"flip_left_right | batch(%d) | " TAIL_NORM
#define TAIL_IMAGES 60
#define TAIL_BATCH 4

static void
tail_images(const char *dir)
{
	char *out = cwt_fmt("%s/img", dir), err[256];
	cwi_gen_imagenet_config cfg = {.out_dir = out, .images = TAIL_IMAGES,
	    .shards = 6, .seed = 5, .width = 64, .height = 48, .quality = 85};

	ck_assert_msg(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	free(out);
}

/* What a run of [image f32 [B, 3, H, W], label i64 [B]] batches held,
 * independent of which rows shared a batch: the sum of a hash of each
 * row (image bytes, seeded by its label), the rows, and the batches
 * smaller than TAIL_BATCH before the last one (none when stitched). */
typedef struct tail_rows {
	uint64_t sum;
	int64_t rows, batches, short_before_last;
	bool last_short;
	cachew_dtype dtype;
} tail_rows;

static void
tail_rows_add(tail_rows *r, const cachew_element *e)
{
	const cachew_tensor *img = cachew_element_component(e, 0);
	const cachew_tensor *lab = cachew_element_component(e, 1);
	const uint8_t *px = cachew_tensor_data(img);
	const int64_t *label = cachew_tensor_data(lab);
	int64_t b = cachew_tensor_shape(img)[0];
	size_t row = b > 0 ? cachew_tensor_nbytes(img) / (size_t)b : 0;

	ck_assert_int_eq(cachew_tensor_dtype(lab), CACHEW_I64);
	r->dtype = cachew_tensor_dtype(img);
	for (int64_t i = 0; i < b; i++)
		r->sum += XXH3_64bits_withSeed(px + (size_t)i * row, row,
		    (uint64_t)label[i]);
	r->rows += b;
	r->short_before_last += r->last_short;
	r->last_short = b < TAIL_BATCH;
	r->batches++;
}

/* Something done while a run reads: fn(arg) once `after` batches came. */
typedef struct tail_event {
	int64_t after;
	void (*fn)(void *arg);
	void *arg;
} tail_event;

/* Reads pipeline on service with client_tail; a job_name unless NULL;
 * ev (unless NULL) happens on the way. The iterator's error, with its
 * message in err. */
static cachew_err
tail_read(const char *pipeline, const char *service, const char *tail,
    const char *job_name, const tail_event *ev, tail_rows *r, char *err,
    size_t errlen)
{
	cachew_options *o = cwt_opts(7, 2);
	cachew_dataset *ds = NULL;
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv;

	memset(r, 0, sizeof(*r));
	err[0] = '\0';
	ck_assert_int_eq(cachew_options_set_str(o, "service", service),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(o, "client_tail", tail),
	    CACHEW_OK);
	if (job_name != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "job_name",
				     job_name), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	rv = cachew_iterator_create(&it, ds, o);
	while (rv == CACHEW_OK &&
	       (rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		tail_rows_add(r, e);
		cachew_element_release(e);
		if (ev != NULL && r->batches == ev->after)
			ev->fn(ev->arg);
	}
	snprintf(err, errlen, "%s", it != NULL ? cachew_iterator_errmsg(it)
					       : cachew_errmsg());
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return rv == CACHEW_EOF ? CACHEW_OK : rv;
}

static tail_rows
tail_rows_of(const char *pipeline, const char *service, const char *tail)
{
	tail_rows r;
	char err[512];

	ck_assert_msg(tail_read(pipeline, service, tail, NULL, NULL, &r, err,
			  sizeof(err)) == CACHEW_OK,
	    "%s on %s (client_tail=%s): %s", pipeline, service, tail, err);
	return r;
}

static void
tail_rows_are(const tail_rows *got, const tail_rows *want, const char *what)
{
	ck_assert_msg(got->sum == want->sum && got->rows == want->rows &&
		got->batches == want->batches && got->dtype == CACHEW_F32 &&
		got->short_before_last == 0,
	    "%s: rows %lld (sum %016llx) in %lld batches (%lld short before "
	    "the last), dtype %d; expected %lld (sum %016llx) in %lld",
	    what, (long long)got->rows, (unsigned long long)got->sum,
	    (long long)got->batches, (long long)got->short_before_last,
	    (int)got->dtype, (long long)want->rows,
	    (unsigned long long)want->sum, (long long)want->batches);
}

/* The payload bytes the dispatcher counted for its newest job (what its
 * client received), from `cachew status --json`. */
static int64_t
newest_job_bytes(const cwt_cluster *c)
{
	char *path = cwt_fmt("%s/status.json", c->dir);
	char *cmd = cwt_fmt("%s/cachew status %s --json > %s", cwt_build_dir(),
	    c->dispatcher.url, path);
	json_error_t jerr;
	json_t *root, *jobs;
	int64_t bytes;

	ck_assert_int_eq(system(cmd), 0);
	root = json_load_file(path, 0, &jerr);
	ck_assert_msg(root != NULL, "%s: %s", path, jerr.text);
	jobs = json_object_get(root, "jobs");
	ck_assert_uint_gt(json_array_size(jobs), 0);
	bytes = json_integer_value(json_object_get(json_array_get(jobs,
	    json_array_size(jobs) - 1), "bytes"));
	json_decref(root);
	free(cmd);
	free(path);
	return bytes;
}

/* The elements of pipeline through the service at url (client_tail
 * auto) are in-process's, as a multiset of element hashes. */
static void
tail_elements_are_in_process(const char *pipeline, const char *url)
{
	cachew_options *o = cwt_opts_at(7, 0, "local");
	char *want = cwt_hash_seq(pipeline, o, 1), *got;

	cachew_options_destroy(o);
	o = cwt_opts_at(7, 0, url);
	got = cwt_hash_seq(pipeline, o, 1);
	ck_assert_str_eq(got, want);
	free(got);
	free(want);
	cachew_options_destroy(o);
}

/* Over tcp the client normalizes: the workers send u8 (a quarter of the
 * f32 bytes), and the rows are in-process's byte for byte, stitched
 * batches whole; client_tail=off sends f32 and gives the same. Where the
 * batches need no stitching (5 divides a lease's 10), each element is
 * in-process's too. */
START_TEST(tail_w2_over_tcp_is_in_process)
{
	cwt_cluster c;
	char *det, *rand, *det5;
	tail_rows local, on, off;
	int64_t on_bytes, off_bytes, image = 3 * 24 * 24;

	cwt_cluster_start(&c, 2);
	tail_images(c.dir);
	det = cwt_fmt(TAIL_DET, c.dir, TAIL_BATCH, ", parallel=2");
	rand = cwt_fmt(TAIL_RAND, c.dir, TAIL_BATCH, "");
	det5 = cwt_fmt(TAIL_DET, c.dir, 5, "");
	local = tail_rows_of(det, "local", "auto");
	ck_assert_int_eq(local.rows, TAIL_IMAGES);
	on = tail_rows_of(det, c.dispatcher.url, "auto");
	on_bytes = newest_job_bytes(&c);
	tail_rows_are(&on, &local, "tcp, client_tail=auto");
	off = tail_rows_of(det, c.dispatcher.url, "off");
	off_bytes = newest_job_bytes(&c);
	tail_rows_are(&off, &local, "tcp, client_tail=off");
	ck_assert_int_eq(on_bytes, TAIL_IMAGES * (image + 8));
	ck_assert_int_eq(off_bytes, TAIL_IMAGES * (4 * image + 8));
	/* Random crops: each lease draws from its own seed, wherever the
	 * normalize runs. */
	on = tail_rows_of(rand, c.dispatcher.url, "auto");
	off = tail_rows_of(rand, c.dispatcher.url, "off");
	tail_rows_are(&on, &off, "random crops, client_tail=auto");
	tail_elements_are_in_process(det5, c.dispatcher.url);
	free(det);
	free(rand);
	free(det5);
	cwt_cluster_stop(&c);
}
END_TEST

/* SIGKILLs worker 0 of the cluster and starts another. */
static void
tail_kill_worker(void *arg)
{
	cwt_cluster *c = arg;

	cwt_daemon_stop(&c->workers[0], SIGKILL);
	cwt_cluster_worker_start(c, c->nworkers++);
}

/* A worker killed mid-epoch: its leases are replayed, the client skips
 * what it has, stitches the tails and normalizes: every row once, every
 * batch but the last full. */
START_TEST(tail_exactly_once_while_a_worker_dies)
{
	cwt_cluster c;
	tail_rows local, got;
	tail_event kill_at_2 = {.after = 2, .fn = tail_kill_worker, .arg = &c};
	char *det, *slow, err[512];

	cwt_cluster_start(&c, 2);
	tail_images(c.dir);
	det = cwt_fmt(TAIL_DET, c.dir, TAIL_BATCH, "");
	/* 20 ms per image: the epoch lasts ~0.6 s, the kill comes early. */
	slow = cwt_fmt(TAIL_SRC " | map(sleep_us, us=20000) | decode_jpeg | "
		       "center_crop(24, 24) | batch(%d) | " TAIL_NORM, c.dir,
	    TAIL_BATCH, "");
	local = tail_rows_of(det, "local", "auto");
	ck_assert_msg(tail_read(slow, c.dispatcher.url, "auto", NULL,
			  &kill_at_2, &got, err, sizeof(err)) == CACHEW_OK,
	    "%s", err);
	tail_rows_are(&got, &local, "a worker killed after 2 batches");
	free(det);
	free(slow);
	cwt_cluster_stop(&c);
}
END_TEST

/* A named job's clients share one worker part: with auto the tail stays
 * on the workers for a named job, so a client that keeps it there (off,
 * or a build without the client tail) and an auto one share the job and
 * both get f32; between them every row once. A client with on runs a
 * narrower worker part: the dispatcher refuses it, and it says why. */
typedef struct tail_reader {
	const char *pipeline, *url, *tail;
	atomic_int *reading; /* readers that got their first batch */
	tail_rows rows;
	cachew_err rv;
	char err[512];
} tail_reader;

static void
tail_count_reader(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

static void *
tail_reader_main(void *arg)
{
	tail_reader *a = arg;
	tail_event first = {.after = 1, .fn = tail_count_reader,
	    .arg = a->reading};

	a->rv = tail_read(a->pipeline, a->url, a->tail, "tail-shared", &first,
	    &a->rows, a->err, sizeof(a->err));
	return NULL;
}

START_TEST(tail_named_job_keeps_one_worker_part)
{
	cwt_cluster c;
	tail_reader r[2];
	pthread_t th[2];
	tail_rows local, both, refused;
	char *slow, err[512];
	atomic_int reading = 0;
	uint64_t deadline;
	cachew_err rv;

	cwt_cluster_start(&c, 2);
	tail_images(c.dir);
	/* 50 ms per image: the shared epoch lasts about 1.5 s. */
	slow = cwt_fmt(TAIL_SRC " | map(sleep_us, us=50000) | decode_jpeg | "
		       "center_crop(24, 24) | batch(%d) | " TAIL_NORM, c.dir,
	    TAIL_BATCH, "");
	local = tail_rows_of(slow, "local", "auto");
	memset(r, 0, sizeof(r));
	r[0].tail = "off";
	r[1].tail = "auto";
	for (int i = 0; i < 2; i++) {
		r[i].pipeline = slow;
		r[i].url = c.dispatcher.url;
		r[i].reading = &reading;
		ck_assert_int_eq(pthread_create(&th[i], NULL, tail_reader_main,
				     &r[i]), 0);
	}
	/* Once both read, a client with on asks for the same job. */
	deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(30000);
	while (atomic_load(&reading) < 2 && cwt_now_ms() < deadline)
		cwt_nap_ms(2);
	rv = tail_read(slow, c.dispatcher.url, "on", "tail-shared", NULL,
	    &refused, err, sizeof(err));
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(r[i].rv == CACHEW_OK, "client_tail=%s: %s",
		    r[i].tail, r[i].err);
	both = r[0].rows;
	both.sum += r[1].rows.sum;
	both.rows += r[1].rows.rows;
	ck_assert_int_eq(r[1].rows.dtype, CACHEW_F32);
	ck_assert_msg(both.sum == local.sum && both.rows == local.rows,
	    "shared: %lld + %lld rows, expected %lld once each",
	    (long long)r[0].rows.rows, (long long)r[1].rows.rows,
	    (long long)local.rows);
	/* It asked while both read (about 1.4 s of the epoch left). */
	ck_assert_msg(rv == CACHEW_EINVAL, "client_tail=on in the shared job: "
	    "%s (%s)", cachew_strerror(rv), err);
	ck_assert_msg(strstr(err, "client_tail=on runs map(normalize): u8 -> "
				  "f32 (image) on this client") != NULL &&
		strstr(err, "job 'tail-shared'") != NULL,
	    "%s", err);
	free(slow);
	cwt_cluster_stop(&c);
}
END_TEST

/* normalize under a per-lease shuffle: nothing moves (the shuffle would
 * have to move too, and would then mix leases), and the service still
 * yields in-process's batches. */
START_TEST(tail_stays_under_a_per_lease_shuffle)
{
	cwt_cluster c;
	char *p;

	cwt_cluster_start(&c, 2);
	tail_images(c.dir);
	p = cwt_fmt(TAIL_DET " | shuffle(3, seed=2)", c.dir, 5, "");
	tail_elements_are_in_process(p, c.dispatcher.url);
	ck_assert_int_eq(newest_job_bytes(&c),
	    TAIL_IMAGES * (4 * 3 * 24 * 24 + 8));
	free(p);
	cwt_cluster_stop(&c);
}
END_TEST

Suite *
cwt_exact_suite(void)
{
	Suite *s = suite_create("exact");
	TCase *tc = tcase_create("exact");
	TCase *chaos = tcase_create("chaos");
	TCase *tail = tcase_create("tail");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, exact_tfdata_behaviours_embedded);
	tcase_add_test(tc, exact_tfdata_behaviours_cluster);
	suite_add_tcase(s, tc);
	tcase_set_timeout(tail, 600);
	tcase_add_test(tail, tail_w2_over_tcp_is_in_process);
	tcase_add_test(tail, tail_exactly_once_while_a_worker_dies);
	tcase_add_test(tail, tail_named_job_keeps_one_worker_part);
	tcase_add_test(tail, tail_stays_under_a_per_lease_shuffle);
	suite_add_tcase(s, tail);
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
