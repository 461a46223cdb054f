/*
 * train_loop.c - the canonical C training loop over a cachew pipeline.
 *
 * Start here: it shows every step a training program takes, with the error
 * handling a real one needs.
 *   1. Describe the input pipeline as a string and parse it into a dataset
 *      (or build the same graph with cachew_dataset_range/_map/_batch...).
 *   2. Create an iterator (options: threads, seed, epoch...).
 *   3. Pull elements; each is a tuple of tensors (dtype, shape, data).
 *   4. Release every element, destroy the iterator, release the dataset.
 *
 * Build and run (the Makefile builds it as build/train_loop; against an
 * installed cachew, after make install PREFIX=$HOME/.local, see README.md):
 *   export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig
 *   cc -std=c11 examples/train_loop.c $(pkg-config --cflags --libs cachew) \
 *       -Wl,-rpath,$(pkg-config --variable=libdir cachew) -o train_loop
 *   ./train_loop ["<another pipeline>" [STEP_MS]]
 * STEP_MS stands in for the model: the loop sleeps that long per batch,
 * like an accelerator busy with a training step.
 *
 * The same binary reads from a cachew service when the environment names a
 * dispatcher -- CACHEW_SERVICE=tcp://host:7070 ./train_loop -- and the
 * workers of that service run the pipeline: the loop does not change and
 * is not recompiled (`make demo` runs it both ways). Without it, the same
 * service runs inside the process: a dispatcher and a worker whose
 * pipeline runs on this thread, at the plain executor's speed
 * (CACHEW_SERVICE=local: the plain executor alone).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include "cachew.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The pipeline of the issue: a million numbers, each plus one (map runs in
 * parallel, tuned online), batched by 64, with a tuned prefetch buffer so
 * the next batch is ready while the model trains on this one. */
static const char default_pipeline[] =
    "range(1000000) | map(add, value=1, parallel=auto) | batch(64) | "
    "prefetch(auto)";

/* The fake model step: sleep ms milliseconds. */
static void
model_step(double ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
	nanosleep(&ts, NULL);
}

static double
seconds_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Stands in for a training step: reads every component of a batch. A real
 * program would hand cachew_tensor_data() to its framework (the buffer is
 * valid while it holds the element). Returns the sum of integer values. */
static int64_t
train_step(const cachew_element *batch, uint64_t *bytes)
{
	int64_t sum = 0;

	for (size_t c = 0; c < cachew_element_size(batch); c++) {
		const cachew_tensor *t = cachew_element_component(batch, c);
		int64_t n = cachew_tensor_numel(t);

		*bytes += cachew_tensor_nbytes(t);
		/* Batches of scalars have rank 1: shape[0] is the batch size
		 * (the last batch may be smaller unless drop_remainder). */
		if (cachew_tensor_dtype(t) == CACHEW_I64) {
			const int64_t *v = cachew_tensor_data(t);
			for (int64_t i = 0; i < n; i++)
				sum += v[i];
		}
	}
	return sum;
}

/* Prints the dtype and shape of the first batch, e.g. "i64[64]". */
static void
describe(const cachew_element *e)
{
	for (size_t c = 0; c < cachew_element_size(e); c++) {
		const cachew_tensor *t = cachew_element_component(e, c);
		const int64_t *shape = cachew_tensor_shape(t);

		printf("component %zu: %s[", c,
		    cachew_dtype_name(cachew_tensor_dtype(t)));
		for (unsigned d = 0; d < cachew_tensor_rank(t); d++)
			printf("%s%" PRId64, d > 0 ? "," : "", shape[d]);
		printf("]\n");
	}
}

int
main(int argc, char **argv)
{
	const char *pipeline = argc > 1 ? argv[1] : default_pipeline;
	double step_ms = argc > 2 ? atof(argv[2]) : 0;
	const char *service = getenv("CACHEW_SERVICE");
	cachew_dataset *ds = NULL;
	cachew_options *opts = NULL;
	cachew_iterator *it = NULL;
	cachew_element *batch;
	uint64_t batches = 0, bytes = 0;
	int64_t checksum = 0;
	double t0, secs;
	cachew_err rv;
	int status = EXIT_FAILURE;

	/* Library warnings go to stderr; by default the library is silent. */
	cachew_log_set(cachew_log_stderr, NULL, CACHEW_LOG_WARN);

	/* 1. Parse. A syntax error names the column and shows a caret. */
	rv = cachew_dataset_parse(&ds, pipeline);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "train_loop: %s\n", cachew_errmsg());
		goto out;
	}

	/* 2. Options are copied by the iterator: destroy them any time. A
	 * fixed seed makes random operators (shuffle...) reproducible. */
	rv = cachew_options_create(&opts);
	if (rv == CACHEW_OK)
		rv = cachew_options_set_int(opts, "seed", 42);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "train_loop: options: %s\n",
		    opts != NULL ? cachew_options_errmsg(opts)
				 : cachew_strerror(rv));
		goto out;
	}
	printf("input      %s\n", service != NULL && service[0] != '\0'
					  ? service
					  : "in-process (the embedded service)");
	t0 = seconds_now();
	rv = cachew_iterator_create(&it, ds, opts);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "train_loop: %s\n", cachew_errmsg());
		goto out;
	}

	/* 3. The loop. CACHEW_EOF ends the epoch; any other code is an error
	 * that stopped the pipeline, explained by cachew_iterator_errmsg. */
	while ((rv = cachew_iterator_next(it, &batch)) == CACHEW_OK) {
		if (batches == 0)
			describe(batch);
		checksum += train_step(batch, &bytes);
		model_step(step_ms);
		batches++;
		cachew_element_release(batch); /* 4. every element */
	}
	if (rv != CACHEW_EOF) {
		fprintf(stderr, "train_loop: pipeline failed (%s): %s\n",
		    cachew_strerror(rv), cachew_iterator_errmsg(it));
		goto out;
	}
	secs = seconds_now() - t0;
	printf("batches    %" PRIu64 "\n", batches);
	/* The default pipeline sums 1 + 2 + ... + 1000000 = 500000500000. */
	printf("checksum   %" PRId64 "\n", checksum);
	printf("seconds    %.3f\n", secs);
	printf("batches/s  %.0f\n", secs > 0 ? (double)batches / secs : 0.0);
	printf("MB/s       %.1f\n", secs > 0 ? (double)bytes / 1e6 / secs : 0.0);
	status = EXIT_SUCCESS;
out:
	/* Destroy and release accept NULL, so one cleanup path serves all. */
	cachew_iterator_destroy(it);
	cachew_options_destroy(opts);
	cachew_dataset_release(ds);
	return status;
}
