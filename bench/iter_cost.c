/*
 * iter_cost.c - the fixed cost of an iterator: creates, reads to the end
 * and destroys N iterators of a tiny pipeline, one after the other, and
 * prints the mean time per iterator. What a program that makes an iterator
 * per epoch, or per small evaluation set, pays on top of its data.
 *
 *   build/iter_cost N [SERVICE] ["PIPELINE"]
 *
 * SERVICE is the `service` option: omitted = the default (the embedded
 * service), `local` (the plain executor), `embedded:2`, or a dispatcher.
 * The pipeline defaults to range(1000) | batch(64) (16 batches).
 */
#include <cachew.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
main(int argc, char **argv)
{
	const char *pipeline = argc > 3 ? argv[3] : "range(1000) | batch(64)";
	cachew_options *o = NULL;
	cachew_dataset *ds = NULL;
	long n = argc > 1 ? strtol(argv[1], NULL, 10) : 0;
	size_t first = 0;
	double t0;

	if (n < 1) {
		fprintf(stderr, "usage: iter_cost N [SERVICE] [PIPELINE]\n");
		return 2;
	}
	if (cachew_options_create(&o) != CACHEW_OK ||
	    (argc > 2 && cachew_options_set_str(o, "service", argv[2]) !=
			     CACHEW_OK) ||
	    cachew_dataset_parse(&ds, pipeline) != CACHEW_OK) {
		fprintf(stderr, "iter_cost: %s\n", cachew_errmsg());
		return 1;
	}
	t0 = now_s();
	for (long i = 0; i < n; i++) {
		cachew_iterator *it;
		cachew_element *e;
		size_t k = 0;
		cachew_err rv;

		if (cachew_iterator_create(&it, ds, o) != CACHEW_OK) {
			fprintf(stderr, "iter_cost: %s\n", cachew_errmsg());
			return 1;
		}
		while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			cachew_element_release(e);
			k++;
		}
		if (rv != CACHEW_EOF) {
			fprintf(stderr, "iter_cost: %s\n",
			    cachew_iterator_errmsg(it));
			return 1;
		}
		cachew_iterator_destroy(it);
		if (i == 0)
			first = k;
		else if (k != first) {
			fprintf(stderr, "iter_cost: %zu elements, then %zu\n",
			    first, k);
			return 1;
		}
	}
	printf("%ld iterators of %zu elements (service %s): %.3f ms each\n",
	    n, first, argc > 2 ? argv[2] : "default",
	    (now_s() - t0) * 1e3 / (double)n);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return 0;
}
