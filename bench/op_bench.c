/*
 * op_bench.c - micro-benchmarks of operators side by side: runs each
 * pipeline to its end R times, the pipelines interleaved (run 1 of each,
 * then run 2 of each, ...) so that a shared machine's drift hits them
 * alike, and prints per pipeline the median output elements per second
 * with the min and max over the runs.
 *
 *   build/op_bench [-t THREADS] [-r REPS] [-s SERVICE] "PIPELINE" ...
 *
 * THREADS is the threads option (default 1), SERVICE the service option
 * (default local: the plain executor). Two map functions are registered
 * for pipelines that need large elements:
 *   bench_big_row(bytes=N)  replaces each element by a u8 [N] tensor that
 *                           shares one prebuilt buffer (no copy, no fill),
 *                           so that what follows (batch) pays the copy;
 *   bench_fail_every(k=K)   fails (CACHEW_EOP, a data error) on every K-th
 *                           i64 value, for ignore_errors;
 * and a filter function, bench_below(n=N), keeping i64 values below N
 * (filter and take_while).
 */
#include <cachew.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PIPELINES 32
#define MAX_REPS 31

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- bench_big_row ------------------------------------------------------- */

static cachew_tensor *big_rows[64]; /* one prebuilt tensor per size seen */
static size_t nbig_rows;

static cachew_err
big_row_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	int64_t bytes = 1 << 19;
	cachew_tensor *t;
	void *data;

	(void)cachew_params_get_int(params, "bytes", &bytes);
	if (bytes < 1 || bytes > (1 << 30) || nbig_rows == 64) {
		snprintf(err, errlen, "bytes must be in [1, 2^30]");
		return CACHEW_ERANGE;
	}
	if (cachew_tensor_create(&t, CACHEW_U8, 1, &bytes, &data) !=
	    CACHEW_OK) {
		snprintf(err, errlen, "%s", cachew_errmsg());
		return CACHEW_ENOMEM;
	}
	for (int64_t i = 0; i < bytes; i++)
		((uint8_t *)data)[i] = (uint8_t)(i * 31);
	big_rows[nbig_rows++] = t;
	*state = t;
	return CACHEW_OK;
}

static cachew_err
big_row_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	cachew_element *e;

	cachew_element_release(in);
	if (cachew_element_create(&e, 1) != CACHEW_OK)
		return CACHEW_ENOMEM;
	if (cachew_element_set(e, 0, cachew_op_ctx_state(ctx)) != CACHEW_OK) {
		cachew_element_release(e);
		return CACHEW_ENOMEM;
	}
	*out = e;
	return CACHEW_OK;
}

/* ---- bench_fail_every ------------------------------------------------------- */

static cachew_err
fail_every_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	int64_t *k = malloc(sizeof(*k));

	if (k == NULL)
		return CACHEW_ENOMEM;
	*k = 10;
	(void)cachew_params_get_int(params, "k", k);
	if (*k < 1) {
		free(k);
		snprintf(err, errlen, "k must be >= 1");
		return CACHEW_ERANGE;
	}
	*state = k;
	return CACHEW_OK;
}

static cachew_err
fail_every_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const int64_t *k = cachew_op_ctx_state(ctx);
	const int64_t *v =
	    cachew_tensor_data(cachew_element_component(in, 0));

	if (*v % *k == *k - 1) {
		cachew_element_release(in);
		return cachew_op_ctx_fail(ctx, "value %lld refused",
		    (long long)*v);
	}
	*out = in;
	return CACHEW_OK;
}

/* ---- bench_below ------------------------------------------------------------ */

static cachew_err
below_filter(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	const int64_t *n = cachew_op_ctx_state(ctx);
	const int64_t *v =
	    cachew_tensor_data(cachew_element_component(in, 0));

	*keep = *v < *n;
	return CACHEW_OK;
}

static cachew_err
below_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	int64_t *n = malloc(sizeof(*n));

	(void)err;
	(void)errlen;
	if (n == NULL)
		return CACHEW_ENOMEM;
	*n = INT64_MAX;
	(void)cachew_params_get_int(params, "n", n);
	*state = n;
	return CACHEW_OK;
}

static void
register_functions(void)
{
	static const cachew_op_def below = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "bench_below",
	    .kind = CACHEW_OP_FILTER,
	    .init = below_init,
	    .fini = free,
	    .filter = below_filter,
	};
	static const cachew_op_def big = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "bench_big_row",
	    .kind = CACHEW_OP_MAP,
	    .init = big_row_init,
	    .map = big_row_map,
	};
	static const cachew_op_def fail = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "bench_fail_every",
	    .kind = CACHEW_OP_MAP,
	    .init = fail_every_init,
	    .fini = free,
	    .map = fail_every_map,
	};
	if (cachew_op_register(&big) != CACHEW_OK ||
	    cachew_op_register(&fail) != CACHEW_OK ||
	    cachew_op_register(&below) != CACHEW_OK) {
		fprintf(stderr, "op_bench: cannot register: %s\n",
		    cachew_errmsg());
		exit(1);
	}
}

/* ---- runs ------------------------------------------------------------------ */

/* Elements of one run to the end, and its seconds; -1 on failure. */
static long
run_once(cachew_dataset *ds, const cachew_options *o, double *secs)
{
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	long n = 0;
	double t0 = now_s();

	if (cachew_iterator_create(&it, ds, o) != CACHEW_OK) {
		fprintf(stderr, "op_bench: %s\n", cachew_errmsg());
		return -1;
	}
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		cachew_element_release(e);
		n++;
	}
	if (rv != CACHEW_EOF) {
		fprintf(stderr, "op_bench: %s\n", cachew_iterator_errmsg(it));
		n = -1;
	}
	cachew_iterator_destroy(it);
	*secs = now_s() - t0;
	return n;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
	cachew_dataset *ds[MAX_PIPELINES] = {0};
	double rate[MAX_PIPELINES][MAX_REPS];
	long count[MAX_PIPELINES] = {0};
	const char *service = "local";
	cachew_options *o = NULL;
	long threads = 1, reps = 5;
	int opt, np = 0, status = 1;
	double load[3] = {0};

	while ((opt = getopt(argc, argv, "t:r:s:")) != -1) {
		if (opt == 't')
			threads = strtol(optarg, NULL, 10);
		else if (opt == 'r')
			reps = strtol(optarg, NULL, 10);
		else if (opt == 's')
			service = optarg;
		else
			goto usage;
	}
	np = argc - optind;
	if (np < 1 || np > MAX_PIPELINES || reps < 1 || reps > MAX_REPS ||
	    threads < 1)
		goto usage;
	register_functions();
	if (cachew_options_create(&o) != CACHEW_OK ||
	    cachew_options_set_int(o, "threads", threads) != CACHEW_OK ||
	    cachew_options_set_int(o, "seed", 1) != CACHEW_OK ||
	    cachew_options_set_str(o, "service", service) != CACHEW_OK) {
		fprintf(stderr, "op_bench: options: %s\n", cachew_errmsg());
		goto out;
	}
	for (int p = 0; p < np; p++)
		if (cachew_dataset_parse(&ds[p], argv[optind + p]) != CACHEW_OK) {
			fprintf(stderr, "op_bench: %s\n", cachew_errmsg());
			goto out;
		}
	for (long r = 0; r < reps; r++)
		for (int p = 0; p < np; p++) {
			double secs;
			count[p] = run_once(ds[p], o, &secs);
			if (count[p] < 0)
				goto out;
			rate[p][r] = (double)count[p] / secs;
		}
	(void)getloadavg(load, 3);
	printf("threads=%ld service=%s reps=%ld load=%.2f %.2f %.2f\n",
	    threads, service, reps, load[0], load[1], load[2]);
	for (int p = 0; p < np; p++) {
		qsort(rate[p], (size_t)reps, sizeof(double), cmp_double);
		printf("%12.0f el/s  (%.0f .. %.0f)  %ld el  %s\n",
		    rate[p][reps / 2], rate[p][0], rate[p][reps - 1], count[p],
		    argv[optind + p]);
	}
	status = 0;
out:
	for (int p = 0; p < np; p++)
		cachew_dataset_release(ds[p]);
	cachew_options_destroy(o);
	for (size_t i = 0; i < nbig_rows; i++)
		cachew_tensor_release(big_rows[i]);
	return status;
usage:
	fprintf(stderr, "usage: op_bench [-t THREADS] [-r REPS] [-s SERVICE] "
			"\"PIPELINE\" ...\n");
	return 2;
}
