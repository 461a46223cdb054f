/*
 * check_dshuffle.c - a shuffle through the service (distributed_epoch) is
 * a real shuffle: the dispatcher hands a shuffled job's splits out in a
 * seeded order (dispatcher_ledger.c, "shuffled order"), so range(N) |
 * shuffle(N) through cachewd processes mixes the whole epoch as it does
 * in-process, epochs follow reshuffle_each_iteration and the seed, and
 * exactly-once delivery and saved positions still hold. Before, every
 * element stayed within about a split of where it started (Spearman's rho
 * of position and value ~0.99).
 */
#include "cwt.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N 1000

/* The values of a run of scalar i64 elements, in order. */
typedef struct run_values {
	int64_t *v;
	size_t n;
} run_values;

/* Reads up to `count` elements of it into r; the iterator's result. */
static cachew_err
pull(cachew_iterator *it, size_t count, run_values *r)
{
	cachew_element *e;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < count; i++) {
		rv = cachew_iterator_next(it, &e);
		if (rv != CACHEW_OK)
			return rv;
		r->v = realloc(r->v, (r->n + 1) * sizeof(*r->v));
		ck_assert_ptr_nonnull(r->v);
		r->v[r->n++] = cwt_i64(e, 0);
		cachew_element_release(e);
	}
	return rv;
}

/* Every value 0..n-1 exactly once (the run is a permutation). */
static void
is_permutation(const run_values *r, int64_t n, const char *what)
{
	char *seen = calloc((size_t)n, 1);

	ck_assert_ptr_nonnull(seen);
	ck_assert_msg(r->n == (size_t)n, "%s: %zu values, the epoch has %lld",
	    what, r->n, (long long)n);
	for (size_t i = 0; i < r->n; i++) {
		ck_assert_msg(r->v[i] >= 0 && r->v[i] < n, "%s: value %lld",
		    what, (long long)r->v[i]);
		ck_assert_msg(!seen[r->v[i]], "%s: value %lld twice", what,
		    (long long)r->v[i]);
		seen[r->v[i]] = 1;
	}
	free(seen);
}

/* Spearman's rank correlation of position and value of a permutation of
 * 0..n-1: 1 in order, ~0 shuffled (about 1/sqrt(n) for a uniform one). */
static double
spearman(const run_values *r)
{
	double n = (double)r->n, d2 = 0;

	for (size_t i = 0; i < r->n; i++) {
		double d = (double)r->v[i] - (double)i;
		d2 += d * d;
	}
	return 1.0 - 6.0 * d2 / (n * (n * n - 1.0));
}

/* A whole run of pipeline with seed 7 at `epoch` on `service`. */
static run_values
run_at(const char *pipeline, int64_t epoch, const char *service)
{
	cachew_options *o = cwt_opts_at(7, epoch, service);
	cachew_element **els = NULL;
	run_values r = {0};
	char err[512];

	ck_assert_msg(cwt_run(pipeline, o, &els, &r.n, err, sizeof(err)) ==
			  CACHEW_OK, "%s on %s: %s", pipeline, service, err);
	r.v = calloc(r.n + 1, sizeof(*r.v));
	ck_assert_ptr_nonnull(r.v);
	for (size_t i = 0; i < r.n; i++)
		r.v[i] = cwt_i64(els[i], 0);
	cwt_free(els, r.n);
	cachew_options_destroy(o);
	return r;
}

static bool
same_order(const run_values *a, const run_values *b)
{
	return a->n == b->n && memcmp(a->v, b->v, a->n * sizeof(*a->v)) == 0;
}

/* range(1000) | shuffle(1000) through two workers: every value once, and
 * no trace of the source order left (|rho| < 0.1; split order gave 0.99).
 * The buffer's seed given or not. */
START_TEST(shuffle_through_the_service_mixes_the_epoch)
{
	static const char *const pipelines[] = {
	    "range(1000) | shuffle(1000, seed=5)",
	    "range(1000) | shuffle(1000)",
	    "range(1000) | map(add, value=0) | shuffle(2000, seed=1)",
	};
	cwt_cluster c;

	cwt_cluster_start(&c, 2);
	for (size_t i = 0; i < sizeof(pipelines) / sizeof(*pipelines); i++) {
		run_values r = run_at(pipelines[i], 0, c.dispatcher.url);
		double rho = spearman(&r);
		is_permutation(&r, N, pipelines[i]);
		ck_assert_msg(fabs(rho) < 0.1, "%s through the service: "
		    "Spearman's rho of position and value is %.3f", pipelines[i],
		    rho);
		free(r.v);
	}
	cwt_cluster_stop(&c);
}
END_TEST

/* Without a shuffle, split order as before: one worker yields the source
 * order. And a shuffle whose buffer holds one split or less keeps split
 * order too: its elements move about as far as in-process. */
START_TEST(no_or_small_shuffle_keeps_split_order)
{
	cwt_cluster c;
	run_values r, s;

	cwt_cluster_start(&c, 1);
	r = run_at("range(1000) | map(add, value=0)", 0, c.dispatcher.url);
	is_permutation(&r, N, "no shuffle");
	for (size_t i = 0; i < r.n; i++)
		ck_assert_int_eq(r.v[i], (int64_t)i);
	s = run_at("range(1000) | shuffle(4, seed=3)", 0, c.dispatcher.url);
	is_permutation(&s, N, "shuffle(4)");
	for (size_t i = 0; i < s.n; i++)
		ck_assert_msg(llabs(s.v[i] - (int64_t)i) < 130, "shuffle(4): "
		    "value %lld at %zu", (long long)s.v[i], i);
	free(r.v);
	free(s.v);
	cwt_cluster_stop(&c);
}
END_TEST

/* Epochs (a new job each, as a client-side repeat makes them): with
 * reshuffle_each_iteration=true each epoch has its own order, the same
 * epoch and seed the same one; with false every epoch has the seed's.
 * One worker, so the order the client sees is the order handed out. */
START_TEST(shuffle_epochs_follow_reshuffle_each_iteration)
{
	const char *again = "range(1000) | shuffle(1000, seed=5)";
	const char *fixed = "range(1000) | shuffle(1000, seed=5, "
			    "reshuffle_each_iteration=false)";
	cwt_cluster c;
	run_values a0, a0b, a1, f0, f1;

	cwt_cluster_start(&c, 1);
	a0 = run_at(again, 0, c.dispatcher.url);
	a0b = run_at(again, 0, c.dispatcher.url);
	a1 = run_at(again, 1, c.dispatcher.url);
	f0 = run_at(fixed, 0, c.dispatcher.url);
	f1 = run_at(fixed, 1, c.dispatcher.url);
	is_permutation(&a1, N, "epoch 1");
	is_permutation(&f1, N, "reshuffle false, epoch 1");
	ck_assert_msg(same_order(&a0, &a0b), "the same epoch and seed gave "
	    "two orders");
	ck_assert_msg(!same_order(&a0, &a1), "reshuffle_each_iteration=true: "
	    "epochs 0 and 1 in the same order");
	ck_assert_msg(same_order(&f0, &f1), "reshuffle_each_iteration=false: "
	    "epochs 0 and 1 differ");
	ck_assert_msg(fabs(spearman(&f1)) < 0.1, "rho %.3f", spearman(&f1));
	free(a0.v);
	free(a0b.v);
	free(a1.v);
	free(f0.v);
	free(f1.v);
	cwt_cluster_stop(&c);
}
END_TEST

/* The embedded service (the default in-process path) still yields the
 * plain executor's order element for element. */
START_TEST(in_process_shuffle_is_unchanged)
{
	const char *p = "range(1000) | shuffle(1000, seed=5)";
	run_values local = run_at(p, 0, "local");
	run_values emb = run_at(p, 0, "embedded");

	ck_assert_msg(same_order(&local, &emb), "the embedded service's "
	    "shuffle differs from the plain executor's");
	free(local.v);
	free(emb.v);
}
END_TEST

/* Reads range(1000) | map(sleep_us) | shuffle(1000) through two workers
 * and does `act` to the cluster after `after` values: the epoch still
 * comes whole, every value once, and still shuffled. */
static void
read_through(void (*act)(cwt_cluster *c), size_t after, const char *what)
{
	const char *p = "range(1000) | map(sleep_us, us=400) | "
			"shuffle(1000, seed=9)";
	cwt_cluster c;
	cachew_options *o;
	cachew_dataset *ds = cwt_parse(p);
	cachew_iterator *it = NULL;
	run_values r = {0};
	cachew_err rv;

	cwt_cluster_start(&c, 2);
	o = cwt_opts_at(7, 0, c.dispatcher.url);
	ck_assert_msg(cachew_iterator_create(&it, ds, o) == CACHEW_OK, "%s",
	    cachew_errmsg());
	rv = pull(it, after, &r);
	ck_assert_msg(rv == CACHEW_OK, "%s", cachew_iterator_errmsg(it));
	act(&c);
	rv = pull(it, SIZE_MAX, &r);
	ck_assert_msg(rv == CACHEW_EOF, "%s: %s", what,
	    cachew_iterator_errmsg(it));
	is_permutation(&r, N, what);
	ck_assert_msg(fabs(spearman(&r)) < 0.1, "%s: rho %.3f", what,
	    spearman(&r));
	free(r.v);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	cwt_cluster_stop(&c);
}

static void
kill_worker(cwt_cluster *c)
{
	cwt_daemon_stop(&c->workers[0], SIGKILL);
	cwt_cluster_worker_start(c, c->nworkers++);
}

static void
restart_dispatcher(cwt_cluster *c)
{
	cwt_cluster_dispatcher_restart(c, 200, false);
}

/* A worker SIGKILLed mid-epoch: its leases are replayed elsewhere in the
 * same order, the client skips what it has. */
START_TEST(shuffle_exactly_once_while_a_worker_dies)
{
	read_through(kill_worker, 150, "a worker killed after 150 values");
}
END_TEST

/* The dispatcher SIGKILLed mid-epoch and started again from its journal:
 * the replayed ledger holds the order it handed out. */
START_TEST(shuffle_survives_a_dispatcher_restart)
{
	read_through(restart_dispatcher, 200,
	    "the dispatcher restarted after 200 values");
}
END_TEST

/* A position saved mid-epoch and restored in a new iterator: the restored
 * job recomputes the order; the two parts hold every value once, the rest
 * still shuffled. */
START_TEST(shuffle_position_resumes)
{
	const char *p = "range(1000) | shuffle(1000, seed=5)";
	static const size_t cuts[] = {0, 1, 300, 999};
	cwt_cluster c;

	cwt_cluster_start(&c, 2);
	for (size_t k = 0; k < sizeof(cuts) / sizeof(*cuts); k++) {
		cachew_options *o = cwt_opts_at(7, 0, c.dispatcher.url);
		cachew_dataset *ds = cwt_parse(p);
		cachew_iterator *it = NULL, *back = NULL;
		run_values r = {0};
		void *state = NULL;
		size_t len = 0;
		cachew_err rv;

		ck_assert_msg(cachew_iterator_create(&it, ds, o) == CACHEW_OK,
		    "%s", cachew_errmsg());
		rv = pull(it, cuts[k], &r);
		ck_assert_msg(rv == CACHEW_OK, "%s", cachew_iterator_errmsg(it));
		ck_assert_msg(cachew_iterator_save(it, &state, &len) ==
				  CACHEW_OK, "save: %s", cachew_errmsg());
		cachew_iterator_destroy(it);
		rv = cachew_iterator_restore(&back, ds, o, state, len);
		ck_assert_msg(rv == CACHEW_OK, "restore at %zu: %s", cuts[k],
		    cachew_errmsg());
		rv = pull(back, SIZE_MAX, &r);
		ck_assert_msg(rv == CACHEW_EOF, "after restore at %zu: %s",
		    cuts[k], cachew_iterator_errmsg(back));
		is_permutation(&r, N, "saved and restored");
		ck_assert_msg(fabs(spearman(&r)) < 0.1, "cut at %zu: rho %.3f",
		    cuts[k], spearman(&r));
		cachew_iterator_destroy(back);
		free(state);
		free(r.v);
		cachew_dataset_release(ds);
		cachew_options_destroy(o);
	}
	cwt_cluster_stop(&c);
}
END_TEST

Suite *
cwt_dshuffle_suite(void)
{
	Suite *s = suite_create("dshuffle");
	TCase *tc = tcase_create("dshuffle");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, shuffle_through_the_service_mixes_the_epoch);
	tcase_add_test(tc, no_or_small_shuffle_keeps_split_order);
	tcase_add_test(tc, shuffle_epochs_follow_reshuffle_each_iteration);
	tcase_add_test(tc, in_process_shuffle_is_unchanged);
	tcase_add_test(tc, shuffle_exactly_once_while_a_worker_dies);
	tcase_add_test(tc, shuffle_survives_a_dispatcher_restart);
	tcase_add_test(tc, shuffle_position_resumes);
	suite_add_tcase(s, tc);
	return s;
}
