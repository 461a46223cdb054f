/*
 * resume_cost.c - what saving and restoring an iterator's position costs
 * (issue 19: the state's size and the save/restore times, for W2's
 * pipeline and for a service job of 10,000 splits; bench/w8.py runs it).
 *
 *   resume_cost SERVICE PIPELINE K REPS [SEED]
 *
 * Per repetition: creates an iterator of PIPELINE on SERVICE (`local`,
 * `embedded`, or a dispatcher's URL), reads K elements, saves the position
 * (timed), destroys the iterator, restores it (timed: the call, which
 * joins the service's new job), reads the first element after it (timed
 * from the restore's start: what a training loop waits for) and the rest
 * to the end. Prints one JSON line per repetition:
 *   {"state_bytes":..,"save_ms":..,"restore_ms":..,"first_ms":..,
 *    "before":K,"after":N,"digest":".."}
 * where digest is the sum of the element hashes of both parts (mod 2^64),
 * which the caller compares with an uninterrupted run's.
 */
#include <cachew.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int
fail(const char *what)
{
	fprintf(stderr, "resume_cost: %s: %s\n", what, cachew_errmsg());
	return 1;
}

/* Reads up to k elements (SIZE_MAX: to the end) into *n and *digest. */
static cachew_err
drain(cachew_iterator *it, size_t k, size_t *n, uint64_t *digest)
{
	cachew_element *e;
	cachew_err rv = CACHEW_OK;

	while (*n < k && (rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		*digest += cachew_element_hash(e);
		cachew_element_release(e);
		(*n)++;
	}
	return rv;
}

static int
one_rep(cachew_dataset *ds, cachew_options *o, size_t k)
{
	cachew_iterator *it = NULL, *back = NULL;
	uint64_t digest = 0;
	size_t before = 0, after = 0;
	void *state = NULL;
	size_t len = 0;
	double t0, save_ms, restore_ms, first_ms;
	cachew_err rv;

	if (cachew_iterator_create(&it, ds, o) != CACHEW_OK)
		return fail("create");
	rv = drain(it, k, &before, &digest);
	if (rv != CACHEW_OK && rv != CACHEW_EOF)
		return fail("iterate");
	t0 = now_ms();
	if (cachew_iterator_save(it, &state, &len) != CACHEW_OK)
		return fail("save");
	save_ms = now_ms() - t0;
	cachew_iterator_destroy(it);
	t0 = now_ms();
	if (cachew_iterator_restore(&back, ds, o, state, len) != CACHEW_OK)
		return fail("restore");
	restore_ms = now_ms() - t0;
	rv = drain(back, 1, &after, &digest);
	first_ms = now_ms() - t0;
	if (rv == CACHEW_OK)
		rv = drain(back, SIZE_MAX, &after, &digest);
	if (rv != CACHEW_EOF)
		return fail("iterate after the restore");
	cachew_iterator_destroy(back);
	free(state);
	printf("{\"state_bytes\":%zu,\"save_ms\":%.3f,\"restore_ms\":%.3f,"
	       "\"first_ms\":%.3f,\"before\":%zu,\"after\":%zu,"
	       "\"digest\":\"%016" PRIx64 "\"}\n",
	    len, save_ms, restore_ms, first_ms, before, after, digest);
	fflush(stdout);
	return 0;
}

int
main(int argc, char **argv)
{
	cachew_dataset *ds = NULL;
	cachew_options *o = NULL;
	int reps, rc = 0;

	if (argc < 5) {
		fprintf(stderr, "usage: resume_cost SERVICE PIPELINE K REPS "
				"[SEED]\n");
		return 2;
	}
	reps = atoi(argv[4]);
	if (cachew_dataset_parse(&ds, argv[2]) != CACHEW_OK)
		return fail("parse");
	if (cachew_options_create(&o) != CACHEW_OK ||
	    cachew_options_set_str(o, "service", argv[1]) != CACHEW_OK ||
	    cachew_options_set_int(o, "seed",
		argc > 5 ? strtoll(argv[5], NULL, 10) : 7) != CACHEW_OK)
		return fail("options");
	for (int i = 0; i < reps && rc == 0; i++)
		rc = one_rep(ds, o, (size_t)strtoull(argv[3], NULL, 10));
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
	return rc;
}
