/*
 * live_iters.c - what many live iterators cost one embedded dispatcher:
 * creates N iterators of a tiny pipeline on the default service (the
 * embedded one), each read to its first element and kept open, then
 * measures the process's CPU while they all sit idle, then destroys them.
 *
 *   build/live_iters N [IDLE_SECONDS] [SERVICE]
 *
 * Prints one JSON line: create_s (all N), idle_cpu (cores used while idle,
 * from getrusage over IDLE_SECONDS, default 5), destroy_s. Issue 18 found
 * creation of 2,000 at 155 s and idle CPU at 105% of a core.
 */
#include <cachew.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double
cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	    (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

int
main(int argc, char **argv)
{
	long n = argc > 1 ? strtol(argv[1], NULL, 10) : 0;
	double idle = argc > 2 ? strtod(argv[2], NULL) : 5.0;
	cachew_iterator **its;
	cachew_options *o = NULL;
	cachew_dataset *ds = NULL;
	double t0, t_create, c0, c1, t1, t_destroy;
	struct timespec nap;

	if (n < 1 || n > 100000 || idle < 0 || idle > 600) {
		fprintf(stderr,
		    "usage: live_iters N [IDLE_SECONDS] [SERVICE]\n");
		return 2;
	}
	its = calloc((size_t)n, sizeof(*its));
	if (its == NULL || cachew_options_create(&o) != CACHEW_OK ||
	    (argc > 3 && cachew_options_set_str(o, "service", argv[3]) !=
			     CACHEW_OK) ||
	    cachew_dataset_parse(&ds, "range(1000) | batch(64)") !=
		CACHEW_OK) {
		fprintf(stderr, "live_iters: %s\n", cachew_errmsg());
		return 1;
	}
	t0 = now_s();
	for (long i = 0; i < n; i++) {
		cachew_element *e;

		if (cachew_iterator_create(&its[i], ds, o) != CACHEW_OK ||
		    cachew_iterator_next(its[i], &e) != CACHEW_OK) {
			fprintf(stderr, "live_iters: iterator %ld: %s\n", i,
			    cachew_errmsg());
			return 1;
		}
		cachew_element_release(e);
	}
	t_create = now_s() - t0;
	c0 = cpu_s();
	t1 = now_s();
	nap.tv_sec = (time_t)idle;
	nap.tv_nsec = (long)((idle - (double)nap.tv_sec) * 1e9);
	nanosleep(&nap, NULL);
	c1 = cpu_s();
	idle = now_s() - t1;
	t0 = now_s();
	for (long i = 0; i < n; i++)
		cachew_iterator_destroy(its[i]);
	t_destroy = now_s() - t0;
	printf("{\"iterators\": %ld, \"create_s\": %.3f, \"idle_cpu\": %.3f, "
	       "\"destroy_s\": %.3f}\n",
	    n, t_create, idle > 0 ? (c1 - c0) / idle : 0.0, t_destroy);
	free(its);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return 0;
}
