/*
 * check_autocache.c - autocaching decisions (src/policy/autocache.h) and
 * the Figure 7 sweep of `cachew sim autocache` (sim_autocache.c).
 *
 * The hand-built inputs share one shape: two candidates of 1e6 rows, a
 * source marker of 100 KB rows and the end of 250 KB rows, cache storage
 * reading 500 MB/s and writing 1000 MB/s, one worker. A GET pass then
 * reads 200 s at the marker (+ the compute after it) or 500 s at the end;
 * writing costs 100 s or 250 s on top of a compute pass. Per-row compute
 * up and after the marker picks the scenario. Every expected number below
 * follows from those by hand.
 */
#include "cwt.h"

#include "../src/policy/autocache.h"
#include "../src/tools/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cwi_ac_candidate cands[2];

/* up_ns / after_ns per row at the marker; the end's up is their sum. */
static void
setup(cwi_ac_inputs *in, double up_ns, double after_ns, double epochs_after)
{
	memset(cands, 0, sizeof(cands));
	cands[0].index = 1;
	cands[1].index = 3;
	cands[1].full = true;
	memset(in, 0, sizeof(*in));
	in->n = 2;
	in->cand = cands;
	in->point[0].rows = 1e6;
	in->point[0].row_bytes = 100e3;
	in->point[0].up_ns = up_ns;
	in->point[0].after_ns = after_ns;
	in->point[1].rows = 1e6;
	in->point[1].row_bytes = 250e3;
	in->point[1].up_ns = up_ns + after_ns;
	in->storage.read_mb_per_s = 500;
	in->storage.write_mb_per_s = 1000;
	in->parallelism = 1;
	in->epochs_after = epochs_after;
	in->current_left = 0;
}

static cwi_ac_decision
decide(const cwi_ac_inputs *in, bool allow_random)
{
	cwi_ac_config cfg;
	cwi_ac_decision d;

	cwi_ac_config_default(&cfg);
	cfg.allow_frozen_random = allow_random;
	cwi_autocache_decide(&cfg, in, &d);
	return d;
}

#define EQ(a, b) ck_assert_double_eq_tol((a), (b), 1e-6)

/* ---- our rule ----------------------------------------------------------- */

START_TEST(test_compute_wins_when_cheap)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 100e3, 50e3, 9); /* C = 150 s */
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	ck_assert_int_eq(d.candidate, -1);
	EQ(d.compute.epoch_s, 150);
	EQ(d.compute.total_s, 1350);
	EQ(d.cache[0].epoch_s, 250);   /* 200 read + 50 after */
	EQ(d.cache[0].put_s, 250);     /* 150 compute + 100 write */
	EQ(d.cache[0].total_s, 2250);  /* 250 + 8 x 250 */
	EQ(d.cache[1].epoch_s, 500);
	EQ(d.cache[1].total_s, 4400);  /* 150 + 250 + 8 x 500 */
	ck_assert_str_eq(d.reason,
	    "compute: total 1350.0 s; next source cache at node 1 2250.0 s");
}
END_TEST

START_TEST(test_full_cache_wins_when_compute_expensive)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 100e3, 900e3, 9); /* C = 1000 s */
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	ck_assert_int_eq(d.candidate, 1);
	EQ(d.compute.total_s, 9000);
	EQ(d.cache[0].total_s, 9900); /* 1100 + 8 x 1100 */
	EQ(d.cache[1].total_s, 5250); /* 1250 + 8 x 500 */
	EQ(d.cache[1].bytes, 250e9);
	ck_assert_str_eq(d.reason, "full cache at node 3: total 5250.0 s; "
				   "next compute 9000.0 s");
}
END_TEST

START_TEST(test_source_cache_wins_in_between)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 400e3, 100e3, 9); /* C = 500 s */
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_SOURCE);
	ck_assert_int_eq(d.candidate, 0);
	EQ(d.compute.total_s, 4500);
	EQ(d.cache[0].total_s, 3000); /* 600 + 8 x 300 */
	EQ(d.cache[1].total_s, 4750); /* 750 + 8 x 500 */
	ck_assert_str_eq(d.reason, "source cache at node 1: total 3000.0 s; "
				   "next compute 4500.0 s");
}
END_TEST

START_TEST(test_write_cost_amortised_over_remaining_epochs)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	/* C = 600, full: PUT 850 then 500 per pass. Computing costs 600 per
	 * pass, so the 250 s of writing pays back after 3 reading passes:
	 * 3 passes left -> 1850 vs 1800 computing, 4 -> 2350 vs 2400. */
	setup(&in, 100e3, 500e3, 3);
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	EQ(d.cache[1].total_s, 1850);
	EQ(d.compute.total_s, 1800);
	setup(&in, 100e3, 500e3, 4);
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	EQ(d.cache[1].total_s, 2350);
	EQ(d.compute.total_s, 2400);
}
END_TEST

START_TEST(test_one_remaining_epoch_never_caches)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	/* Caching the source would win with many passes left (3000 vs 4500);
	 * with one, the cache would be written and never read. Even free
	 * writes would only tie, and ties go to computing. */
	setup(&in, 400e3, 100e3, 1);
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	EQ(d.cache[0].total_s, 600);
	EQ(d.compute.total_s, 500);
	in.storage.write_mb_per_s = 1e12;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	setup(&in, 400e3, 100e3, 0);
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	ck_assert(!d.cache[0].eligible);
	ck_assert_str_eq(d.cache[0].why_not,
	    "no pass left to read it after writing it");
}
END_TEST

START_TEST(test_speculative_write_costs_only_the_rest_of_the_pass)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	/* Deciding 10% into the first pass while the full cache is being
	 * written: finishing costs 0.9 x (1000 + 250); 9 passes then read. */
	setup(&in, 100e3, 900e3, 9);
	in.current_left = 0.9;
	in.point[1].writing = true;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	EQ(d.cache[1].total_s, 0.9 * 1250 + 9 * 500);
	EQ(d.compute.total_s, 9.9 * 1000);
	EQ(d.cache[0].total_s, 0.9 * 1000 + 1100 + 8 * 1100);
}
END_TEST

START_TEST(test_existing_cache_costs_no_write)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	/* One pass left: an existing full cache is read (500 < 600). */
	setup(&in, 100e3, 500e3, 1);
	in.point[1].cached = true;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	EQ(d.cache[1].put_s, 0);
	EQ(d.cache[1].total_s, 500);
	ck_assert_str_eq(d.reason, "full cache at node 3: total 500.0 s "
				   "(already cached); next compute 600.0 s");
}
END_TEST

START_TEST(test_capacity_too_small_is_not_chosen)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 100e3, 900e3, 9);
	in.storage.capacity_bytes = 200000000000ull;
	in.storage.used_bytes = 50000000000ull;
	d = decide(&in, false);
	/* Full (250 GB) does not fit in 150 GB; source (100 GB) does but
	 * loses to computing (9900 vs 9000). */
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	ck_assert(!d.cache[1].eligible);
	ck_assert(isinf(d.cache[1].total_s));
	ck_assert(d.cache[0].eligible);
	ck_assert_str_eq(d.cache[1].why_not,
	    "needs 250.0 GB, 150.0 GB free of 200.0 GB capacity");
	ck_assert_str_eq(d.reason,
	    "compute: total 9000.0 s; next source cache at node 1 9900.0 s; "
	    "not full cache at node 3: needs 250.0 GB, 150.0 GB free of "
	    "200.0 GB capacity");
	/* A complete cache already holds its bytes: it is not refused. */
	in.point[1].cached = true;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
}
END_TEST

START_TEST(test_random_upstream_is_never_cached)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 100e3, 900e3, 9);
	cands[1].random_upstream = true;
	snprintf(cands[1].random_op, sizeof(cands[1].random_op), "shuffle");
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	ck_assert(!d.cache[1].eligible);
	ck_assert_str_eq(d.cache[1].why_not,
	    "random upstream (shuffle): a cache would replay one draw");
	ck_assert_ptr_nonnull(strstr(d.reason, "not full cache at node 3: "
					       "random upstream (shuffle)"));
	/* Even an existing cache is not read. */
	in.point[1].cached = true;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
}
END_TEST

START_TEST(test_random_upstream_cached_when_allowed_says_so)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	setup(&in, 100e3, 900e3, 9);
	cands[1].random_upstream = true;
	snprintf(cands[1].random_op, sizeof(cands[1].random_op),
	    "map/uniform");
	d = decide(&in, true);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	ck_assert_str_eq(d.reason,
	    "full cache at node 3: total 5250.0 s; next compute 9000.0 s; "
	    "frozen randomness allowed: every later pass replays the cached "
	    "draw of map/uniform");
}
END_TEST

START_TEST(test_storage_rates_bound_reads)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;

	/* 10,000 rows/s per reader: 100 s per pass even for tiny rows. */
	setup(&in, 100e3, 900e3, 9);
	in.point[1].row_bytes = 1000;
	in.storage.read_rows_per_s = 10000;
	d = decide(&in, false);
	EQ(d.cache[1].epoch_s, 100);
	/* Four workers read 4x as fast, unless the storage caps the sum:
	 * 250 GB at 1000 MB/s is 250 s. */
	setup(&in, 100e3, 900e3, 9);
	in.parallelism = 4;
	d = decide(&in, false);
	EQ(d.cache[1].epoch_s, 125);
	EQ(d.compute.epoch_s, 250);
	in.storage.read_mb_per_s_max = 1000;
	d = decide(&in, false);
	EQ(d.cache[1].epoch_s, 250);
	/* No measured storage: nothing can be cached. */
	setup(&in, 100e3, 900e3, 9);
	in.storage.read_mb_per_s = 0;
	d = decide(&in, false);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_COMPUTE);
	ck_assert_str_eq(d.cache[1].why_not, "cache storage not measured");
}
END_TEST

/* ---- drift -------------------------------------------------------------- */

START_TEST(test_drift_beyond_25_percent)
{
	cwi_ac_config cfg;
	cwi_ac_inputs a, b;
	char why[128];

	cwi_ac_config_default(&cfg);
	setup(&a, 400e3, 100e3, 9);
	b = a;
	b.storage.read_mb_per_s = 500 * 0.76; /* -24% */
	b.point[0].up_ns = 400e3 * 1.24;
	b.epochs_after = 3;   /* progress is not drift */
	b.parallelism = 8;    /* nor is the worker count */
	ck_assert(!cwi_autocache_drifted(&cfg, &a, &b, why, sizeof(why)));
	ck_assert_str_eq(why, "");
	b.storage.read_mb_per_s = 500 * 0.74; /* -26% */
	ck_assert(cwi_autocache_drifted(&cfg, &a, &b, why, sizeof(why)));
	ck_assert_str_eq(why, "read_mb_per_s 500 -> 370 (-26%)");
	b = a;
	b.point[1].up_ns = 500e3 * 1.3;
	ck_assert(cwi_autocache_drifted(&cfg, &a, &b, why, sizeof(why)));
	ck_assert_str_eq(why, "candidate 1 up_ns 5e+05 -> 6.5e+05 (+30%)");
}
END_TEST

/* ---- Cachew's rule ------------------------------------------------------ */

START_TEST(test_cachew_table_is_static)
{
	EQ(cwi_autocache_table_us(100), 6);
	EQ(cwi_autocache_table_us(65536), 60);
	EQ(cwi_autocache_table_us(100e3), 60 + 160.0 * 34464 / 196608);
	EQ(cwi_autocache_table_us(8388608), 6800);
}
END_TEST

START_TEST(test_cachew_rule_ignores_storage_and_writes)
{
	cwi_ac_config cfg;
	cwi_ac_inputs in;
	cwi_ac_decision d;
	double t_src = 60 + 160.0 * 34464 / 196608;
	double t_full = 60 + 160.0 * 184464 / 196608;

	cwi_ac_config_default(&cfg);
	(void)cwi_ac_parse(&cfg, "cachew");
	/* Compute 1000 s per pass; the table says the full cache reads in
	 * 210 s (1.2 GB/s) where the storage gives 500 s; it picks full even
	 * with one pass left, where ours computes. */
	setup(&in, 100e3, 900e3, 1);
	in.storage.read_mb_per_s = 1; /* ignored */
	cwi_autocache_decide_cachew(&cfg, &in, &d);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_FULL);
	EQ(d.compute.epoch_s, 1000);
	EQ(d.cache[0].epoch_s, t_src + 900);
	EQ(d.cache[1].epoch_s, t_full);
	ck_assert_ptr_nonnull(strstr(d.reason, "cachew rule (static read "
					       "table, decided once): full"));
	/* Source wins in between (its rows are smaller). */
	setup(&in, 400e3, 100e3, 9);
	cwi_autocache_decide_cachew(&cfg, &in, &d);
	ck_assert_int_eq(d.choice, CWI_AC_CHOICE_SOURCE);
	EQ(d.cache[0].epoch_s, t_src + 100);
}
END_TEST

START_TEST(test_cachew_decides_once_and_never_revisits)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	cwi_ac_inputs in;

	memset(&plan, 0, sizeof(plan));
	plan.ncand = 2;
	plan.cand[0].index = 1;
	plan.cand[1].index = 3;
	plan.cand[1].full = true;
	cwi_ac_config_default(&cfg);
	ck_assert_int_eq(cwi_ac_parse(&cfg, "cachew"), CACHEW_OK);
	ck_assert_uint_eq(cfg.profile_batches, 300);
	cwi_ac_job_start(&j, &cfg, &plan, NULL);
	ck_assert_int_eq(j.mode, CWI_AC_PROFILE);
	ck_assert_uint_eq(j.writes, 0); /* Cachew writes nothing while profiling */
	ck_assert(!cwi_ac_job_batches(&j, 299));
	ck_assert(cwi_ac_job_batches(&j, 1));
	setup(&in, 100e3, 900e3, 9);
	cwi_ac_job_decide(&j, &in);
	/* The rest of the first pass computes; the next one writes. */
	ck_assert_int_eq(j.mode, CWI_AC_PROFILE);
	ck_assert_int_eq(j.pending, 1);
	ck_assert(!cwi_ac_job_batches(&j, 1000));
	cwi_ac_job_pass_end(&j, false);
	ck_assert_int_eq(j.mode, CWI_AC_PUT);
	ck_assert_int_eq(j.target, 1);
	ck_assert_uint_eq(j.writes, 2);
	cwi_ac_job_pass_end(&j, true);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_str_eq(j.event, "put -> get at candidate 1: cache complete");
	/* Computing became 10x cheaper: Cachew's rule does not look. */
	setup(&in, 10e3, 90e3, 7);
	ck_assert(!cwi_ac_job_observe(&j, &in));
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_int_eq(j.target, 1);
}
END_TEST

/* ---- a job's modes ------------------------------------------------------ */

static void
plan2(cwi_ac_plan *plan)
{
	memset(plan, 0, sizeof(*plan));
	plan->ncand = 2;
	plan->cand[0].index = 1;
	plan->cand[1].index = 3;
	plan->cand[1].full = true;
}

START_TEST(test_default_profiles_puts_and_gets_in_two_passes)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	cwi_ac_inputs in;

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	cwi_ac_job_start(&j, &cfg, &plan, NULL);
	ck_assert_int_eq(j.mode, CWI_AC_PROFILE);
	ck_assert_uint_eq(j.writes, 3); /* both candidates, speculatively */
	ck_assert_str_eq(j.event,
	    "profile: measuring, and writing 2 candidate(s) until the "
	    "decision");
	ck_assert(!cwi_ac_job_batches(&j, 99));
	ck_assert(cwi_ac_job_batches(&j, 1));
	setup(&in, 100e3, 900e3, 9);
	in.current_left = 0.9;
	in.point[0].writing = in.point[1].writing = true;
	cwi_ac_job_decide(&j, &in);
	ck_assert_int_eq(j.mode, CWI_AC_PUT);
	ck_assert_int_eq(j.target, 1);
	ck_assert_uint_eq(j.writes, 2); /* the source write is abandoned */
	ck_assert_str_eq(j.event,
	    "profile -> put at candidate 1: full cache at node 3: total "
	    "5625.0 s; next compute 9900.0 s");
	cwi_ac_job_pass_end(&j, true);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	EQ(j.epoch_s, 500);
	EQ(j.worker_scale, 500.0 / 1250.0);
	/* Steady measurements: no revisit. */
	in.current_left = 0;
	in.epochs_after = 8;
	in.point[0].writing = in.point[1].writing = false;
	ck_assert(!cwi_ac_job_observe(&j, &in));
	ck_assert_str_eq(j.event, "");
}
END_TEST

START_TEST(test_default_revisits_on_drift)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	cwi_ac_inputs in;

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	cwi_ac_job_start(&j, &cfg, &plan, NULL);
	ck_assert(cwi_ac_job_batches(&j, 100));
	setup(&in, 100e3, 900e3, 9);
	in.current_left = 0.9;
	in.point[0].writing = in.point[1].writing = true;
	cwi_ac_job_decide(&j, &in);
	cwi_ac_job_pass_end(&j, true);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	/* The shared file system slows to 200 MB/s: the full cache now
	 * reads in 1250 s, slower than computing (1000 s); 8 passes left:
	 * 8000 s computing, 10000 s reading it. */
	setup(&in, 100e3, 900e3, 8);
	in.storage.read_mb_per_s = 200;
	ck_assert(cwi_ac_job_observe(&j, &in));
	ck_assert_int_eq(j.mode, CWI_AC_COMPUTE);
	ck_assert_int_eq(j.target, -1);
	ck_assert_str_eq(j.event,
	    "drift (read_mb_per_s 500 -> 200 (-60%)): revisited; get -> "
	    "compute: compute: total 8000.0 s; next full cache at node 3 "
	    "10000.0 s");
}
END_TEST

START_TEST(test_revisit_to_another_cache_writes_it_next_pass)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	cwi_ac_inputs in;

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	cwi_ac_job_start(&j, &cfg, &plan, NULL);
	ck_assert(cwi_ac_job_batches(&j, 100));
	/* Cheap after the marker: the source cache (300 s a pass). */
	setup(&in, 2000e3, 100e3, 9);
	in.current_left = 0.9;
	in.point[0].writing = in.point[1].writing = true;
	cwi_ac_job_decide(&j, &in);
	ck_assert_int_eq(j.mode, CWI_AC_PUT);
	ck_assert_int_eq(j.target, 0);
	cwi_ac_job_pass_end(&j, true);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	/* The work after the marker grows 20x: reading the source cache now
	 * takes 2200 s a pass; a full cache 500 s after one PUT (4250 s):
	 * 7750 s over 8 passes against 17600 s. */
	setup(&in, 2000e3, 2000e3, 8);
	ck_assert(cwi_ac_job_observe(&j, &in));
	ck_assert_int_eq(j.mode, CWI_AC_GET); /* this pass still reads */
	ck_assert_int_eq(j.target, 0);
	ck_assert_int_eq(j.pending, 1);
	ck_assert_str_eq(j.event,
	    "drift (candidate 0 after_ns 1e+05 -> 2e+06 (+1900%)): "
	    "revisited; decided: put at candidate 1 next pass: full cache at "
	    "node 3: total 7750.0 s; next source cache at node 1 17600.0 s");
	ck_assert(!cwi_ac_job_observe(&j, &in)); /* a PUT is pending */
	cwi_ac_job_pass_end(&j, false);
	ck_assert_int_eq(j.mode, CWI_AC_PUT);
	ck_assert_int_eq(j.target, 1);
	ck_assert_uint_eq(j.writes, 2);
	cwi_ac_job_pass_end(&j, true);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_int_eq(j.target, 1);
}
END_TEST

START_TEST(test_job_started_on_a_cache_takes_a_baseline)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	cwi_ac_inputs in;
	bool cached[2] = {false, true};

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	cwi_ac_job_start(&j, &cfg, &plan, cached);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_uint_eq(j.assumed.n, 0);
	setup(&in, 100e3, 900e3, 8);
	in.point[1].cached = true;
	ck_assert(!cwi_ac_job_observe(&j, &in)); /* the baseline */
	ck_assert_uint_eq(j.assumed.n, 2);
	in.storage.read_mb_per_s = 200;
	ck_assert(cwi_ac_job_observe(&j, &in));
	ck_assert_int_eq(j.mode, CWI_AC_COMPUTE);
}
END_TEST

START_TEST(test_already_cached_reads_at_once)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;
	bool cached[2] = {true, true};

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	cwi_ac_job_start(&j, &cfg, &plan, cached);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_int_eq(j.target, 1); /* nearest the end */
	ck_assert(j.decided);
	ck_assert_str_eq(cwi_ac_mode_name(j.mode), "get");
	(void)cwi_ac_parse(&cfg, "cachew");
	cached[1] = false;
	cwi_ac_job_start(&j, &cfg, &plan, cached);
	ck_assert_int_eq(j.mode, CWI_AC_GET);
	ck_assert_int_eq(j.target, 0);
	/* A cache after a random operator is not read without permission. */
	plan.cand[0].random_upstream = true;
	cwi_ac_job_start(&j, &cfg, &plan, cached);
	ck_assert_int_eq(j.mode, CWI_AC_PROFILE);
}
END_TEST

START_TEST(test_abandoned_put_falls_back_to_compute)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job j;

	plan2(&plan);
	cwi_ac_config_default(&cfg);
	ck_assert_int_eq(cwi_ac_parse(&cfg, "full"), CACHEW_OK);
	cwi_ac_job_start(&j, &cfg, &plan, NULL);
	ck_assert_int_eq(j.mode, CWI_AC_PUT);
	ck_assert_int_eq(j.target, 1);
	cwi_ac_job_pass_end(&j, false);
	ck_assert_int_eq(j.mode, CWI_AC_COMPUTE);
	ck_assert_str_eq(j.event,
	    "put -> compute: the cache write was abandoned (capacity or I/O; "
	    "see the worker's warning)");
}
END_TEST

START_TEST(test_policy_names)
{
	cwi_ac_config cfg;
	const char *names[] = {"default", "cachew", "compute", "source",
	    "full"};

	cwi_ac_config_default(&cfg);
	for (size_t i = 0; i < 5; i++) {
		ck_assert_int_eq(cwi_ac_parse(&cfg, names[i]), CACHEW_OK);
		ck_assert_str_eq(cwi_ac_kind_name(cfg.kind), names[i]);
	}
	ck_assert_int_eq(cwi_ac_parse(&cfg, "always"), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "autocache policy \"always\": expected default, cachew, compute, "
	    "source or full");
	ck_assert_str_eq(cwi_ac_mode_name(CWI_AC_PROFILE), "profile");
	ck_assert_str_eq(cwi_ac_mode_name(CWI_AC_PUT), "put");
	ck_assert_str_eq(cwi_ac_mode_name(CWI_AC_COMPUTE), "compute");
	ck_assert_str_eq(cwi_ac_choice_name(CWI_AC_CHOICE_SOURCE), "source");
}
END_TEST

/* ---- plans from pipelines ----------------------------------------------- */

static cwi_ac_plan *
plan_of(const char *pipeline, cachew_dataset **ds)
{
	cwi_ac_plan *p = NULL;

	ck_assert_int_eq(cachew_dataset_parse(ds, pipeline), CACHEW_OK);
	ck_assert_int_eq(cwi_autocache_plan(*ds, &p), CACHEW_OK);
	return p;
}

START_TEST(test_plan_has_markers_and_the_end)
{
	cachew_dataset *ds;
	cwi_ac_plan *p = plan_of(
	    "range(1000) | map(add, value=1) | autocache | map(mul, value=2)",
	    &ds);

	ck_assert_uint_eq(p->nnodes, 4);
	ck_assert_uint_eq(p->ncand, 2);
	ck_assert_int_eq(p->cand[0].index, 2);
	ck_assert(!p->cand[0].full);
	ck_assert_str_eq(p->cand[0].node->op->name, "autocache");
	ck_assert_int_eq(p->cand[1].index, 3);
	ck_assert(p->cand[1].full);
	ck_assert(!p->cand[0].random_upstream && !p->cand[1].random_upstream);
	/* upstream: range, map(add), autocache feed the marker; all feed
	 * the end. */
	ck_assert(p->upstream[0 * 2 + 0] && p->upstream[2 * 2 + 0]);
	ck_assert(!p->upstream[3 * 2 + 0]);
	ck_assert(p->upstream[3 * 2 + 1] && p->upstream[0 * 2 + 1]);
	cwi_autocache_plan_free(p);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_plan_marker_at_the_end_is_one_candidate)
{
	cachew_dataset *ds;
	cwi_ac_plan *p = plan_of("range(10) | map(add, value=1) | autocache",
	    &ds);

	ck_assert_uint_eq(p->ncand, 1);
	ck_assert(p->cand[0].full);
	ck_assert_int_eq(p->cand[0].index, 2);
	cwi_autocache_plan_free(p);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_plan_knows_random_operators)
{
	cachew_dataset *ds;
	cwi_ac_plan *p = plan_of(
	    "range(1000) | autocache | shuffle(100, seed=3) | autocache | "
	    "map(uniform) | batch(10)",
	    &ds);

	ck_assert_uint_eq(p->ncand, 3);
	ck_assert(!p->cand[0].random_upstream);
	ck_assert_str_eq(p->cand[0].random_op, "");
	ck_assert(p->cand[1].random_upstream);
	ck_assert_str_eq(p->cand[1].random_op, "shuffle");
	ck_assert(p->cand[2].random_upstream);
	ck_assert_str_eq(p->cand[2].random_op, "shuffle");
	cwi_autocache_plan_free(p);
	cachew_dataset_release(ds);

	p = plan_of("range(10) | autocache | map(uniform)", &ds);
	ck_assert(!p->cand[0].random_upstream);
	ck_assert_str_eq(p->cand[1].random_op, "map/uniform");
	cwi_autocache_plan_free(p);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_measure_turns_counters_into_costs)
{
	cachew_dataset *ds;
	cwi_ac_plan *p = plan_of(
	    "range(1000) | map(add, value=1) | autocache | map(mul, value=2)",
	    &ds);
	/* Two tasks, each half of what was measured (half an epoch). */
	const cwi_ac_counter ops[] = {
	    {"0:range", 250, 2000, 500000},
	    {"1:map/add", 250, 2000, 1000000},
	    {"2:autocache", 250, 2000, 0},
	    {"3:map/mul", 250, 2000, 1500000},
	    {"0:range", 250, 2000, 500000},
	    {"1:map/add", 250, 2000, 1000000},
	    {"2:autocache", 250, 2000, 0},
	    {"3:map/mul", 250, 2000, 1500000},
	};
	cwi_ac_inputs in;

	memset(&in, 0, sizeof(in));
	ck_assert_int_eq(cwi_autocache_measure(p, ops, 8, 0.5, &in),
	    CACHEW_OK);
	ck_assert_uint_eq(in.n, 2);
	ck_assert_ptr_eq(in.cand, p->cand);
	EQ(in.point[0].rows, 1000);
	EQ(in.point[0].row_bytes, 8);
	EQ(in.point[0].up_ns, 6000);    /* 3 ms over 500 rows */
	EQ(in.point[0].after_ns, 6000); /* the mul's 3 ms */
	EQ(in.point[1].up_ns, 12000);
	EQ(in.point[1].after_ns, 0);

	const cwi_ac_counter bad[] = {{"map/add", 1, 1, 1}};
	ck_assert_int_eq(cwi_autocache_measure(p, bad, 1, 0.5, &in),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "autocache: counter \"map/add\": "
					  "expected \"index:operator\"");
	const cwi_ac_counter far[] = {{"9:map", 1, 1, 1}};
	ck_assert_int_eq(cwi_autocache_measure(p, far, 1, 0.5, &in),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "autocache: counter \"9:map\": index outside the pipeline");
	ck_assert_int_eq(cwi_autocache_measure(p, ops, 1, 0.5, &in),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "autocache: candidate 2:autocache "
					  "produced no elements yet; nothing "
					  "to measure");
	cwi_autocache_plan_free(p);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_plan_limits_candidates)
{
	cwi_strbuf sb;
	cachew_dataset *ds;
	cwi_ac_plan *p = NULL;

	cwi_strbuf_init(&sb);
	cwi_strbuf_puts(&sb, "range(10)");
	for (int i = 0; i < CWI_AC_MAX_CANDIDATES; i++)
		cwi_strbuf_puts(&sb, " | autocache | map(add, value=1)");
	ck_assert(!sb.oom);
	ck_assert_int_eq(cachew_dataset_parse(&ds, sb.data), CACHEW_OK);
	ck_assert_int_eq(cwi_autocache_plan(ds, &p), CACHEW_EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_str_eq(cachew_errmsg(),
	    "autocache: 17 candidate points (autocache markers and the end); "
	    "at most 16 are considered");
	cachew_dataset_release(ds);
	cwi_strbuf_free(&sb);
}
END_TEST

/* ---- the Figure 7 sweep ------------------------------------------------- */

static char *
sweep_json(uint64_t seed)
{
	cwi_sim_opts o;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	cwi_sim_opts_default(&o);
	o.json = true;
	o.seed = seed;
	ck_assert_int_eq(cwi_sim_autocache(&o, f), 0);
	fclose(f);
	return buf;
}

static void
json_str(const char *line, const char *key, char *out, size_t size)
{
	char pat[64];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\":\"", key);
	p = strstr(line, pat);
	ck_assert_msg(p != NULL, "no %s in %s", key, line);
	p += strlen(pat);
	while (p[n] != '"' && n + 1 < size)
		n++;
	memcpy(out, p, n);
	out[n] = '\0';
}

static double
json_num(const char *line, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(line, pat);
	ck_assert_msg(p != NULL, "no %s in %s", key, line);
	return strtod(p + strlen(pat), NULL);
}

START_TEST(test_sweep_meets_the_goals)
{
	char *a = sweep_json(7), *b = sweep_json(7);
	size_t lines = 0, defaults = 0, cachew_slow = 0, checked = 0;
	size_t drift_revisited = 0, drift_cachew_slow = 0;
	char *save = NULL;

	ck_assert_str_eq(a, b); /* deterministic for a seed */
	for (char *line = strtok_r(a, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		char policy[32], decision[32], best[32], scenario[32];
		double vs;

		lines++;
		json_str(line, "scenario", scenario, sizeof(scenario));
		ck_assert_str_eq(scenario, "autocache");
		json_str(line, "policy", policy, sizeof(policy));
		json_str(line, "decision", decision, sizeof(decision));
		json_str(line, "best_fixed", best, sizeof(best));
		ck_assert_ptr_nonnull(strstr(line, "\"setting\":\"sleep_ms="));
		ck_assert_ptr_nonnull(strstr(line, "\"oracle_workers\":null"));
		ck_assert_ptr_nonnull(strstr(line, "\"windows\":null"));
		ck_assert(json_num(line, "epoch_s") > 0);
		ck_assert(json_num(line, "cost") > 0);
		ck_assert(json_num(line, "best_fixed_epoch_s") > 0);
		vs = json_num(line, "vs_best");
		if (strcmp(policy, "default") == 0) {
			defaults++;
			ck_assert_msg(vs <= 0.05, "default %.3f slower: %s",
			    vs, line);
			if (strstr(line, "\"near_crossover\":false") != NULL) {
				checked++;
				ck_assert_msg(strcmp(decision, best) == 0,
				    "default chose %s, best is %s: %s",
				    decision, best, line);
			}
		} else if (strcmp(policy, "cachew") == 0 && vs > 0.05) {
			cachew_slow++;
		}
		if (strstr(line, "\"storage_drift\":true") == NULL)
			continue;
		if (strcmp(policy, "default") == 0 &&
		    strcmp(decision, "compute") == 0 &&
		    strstr(line, "\"reason\":\"drift (read_mb_per_s ") != NULL)
			drift_revisited++;
		if (strcmp(policy, "cachew") == 0 && vs > 0.05)
			drift_cachew_slow++;
	}
	/* 13 sleeps from 200 to 500 ms, then 2 with the storage slowing. */
	ck_assert_uint_eq(lines, 15 * 5);
	ck_assert_uint_eq(defaults, 15);
	ck_assert_uint_ge(checked, 12);
	/* The static table is off from the storage: Cachew's rule caches
	 * the inflated rows where the source cache is cheaper; and it never
	 * revisits when the storage slows down. */
	ck_assert_uint_ge(cachew_slow, 1);
	ck_assert_uint_eq(drift_revisited, 2);
	ck_assert_uint_eq(drift_cachew_slow, 2);
	free(a);
	free(b);
}
END_TEST

Suite *
cwt_autocache_suite(void)
{
	Suite *s = suite_create("autocache");
	TCase *tc = tcase_create("autocache");

	tcase_add_test(tc, test_compute_wins_when_cheap);
	tcase_add_test(tc, test_full_cache_wins_when_compute_expensive);
	tcase_add_test(tc, test_source_cache_wins_in_between);
	tcase_add_test(tc, test_write_cost_amortised_over_remaining_epochs);
	tcase_add_test(tc, test_one_remaining_epoch_never_caches);
	tcase_add_test(tc, test_speculative_write_costs_only_the_rest_of_the_pass);
	tcase_add_test(tc, test_existing_cache_costs_no_write);
	tcase_add_test(tc, test_capacity_too_small_is_not_chosen);
	tcase_add_test(tc, test_random_upstream_is_never_cached);
	tcase_add_test(tc, test_random_upstream_cached_when_allowed_says_so);
	tcase_add_test(tc, test_storage_rates_bound_reads);
	tcase_add_test(tc, test_drift_beyond_25_percent);
	tcase_add_test(tc, test_cachew_table_is_static);
	tcase_add_test(tc, test_cachew_rule_ignores_storage_and_writes);
	tcase_add_test(tc, test_cachew_decides_once_and_never_revisits);
	tcase_add_test(tc, test_default_profiles_puts_and_gets_in_two_passes);
	tcase_add_test(tc, test_default_revisits_on_drift);
	tcase_add_test(tc, test_revisit_to_another_cache_writes_it_next_pass);
	tcase_add_test(tc, test_job_started_on_a_cache_takes_a_baseline);
	tcase_add_test(tc, test_already_cached_reads_at_once);
	tcase_add_test(tc, test_abandoned_put_falls_back_to_compute);
	tcase_add_test(tc, test_policy_names);
	tcase_add_test(tc, test_plan_has_markers_and_the_end);
	tcase_add_test(tc, test_plan_marker_at_the_end_is_one_candidate);
	tcase_add_test(tc, test_plan_knows_random_operators);
	tcase_add_test(tc, test_measure_turns_counters_into_costs);
	tcase_add_test(tc, test_plan_limits_candidates);
	tcase_add_test(tc, test_sweep_meets_the_goals);
	suite_add_tcase(s, tc);
	return s;
}
