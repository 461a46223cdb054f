/*
 * check_policy.c - the scaling policies (model, cachew, fixed, hpa) and
 * weighted fair share, driven with hand-built sample sequences: exact
 * decisions at exact samples, no clock.
 */
#include "cwt.h"

#include "../src/policy/scale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- a hand-built world ----------------------------------------------------
 * Workers produce `rate` batches/s each; the consumer takes `step` s per
 * batch. Every sample carries 10 batches; its elapsed time is what 10
 * batches take at n workers: 10 * max(step, 1 / (n * rate)). With the
 * defaults a cachew window (500 batches) is 50 samples, the epoch discard
 * (200) 20 samples, the change discard (150) 15, a step (650) 65. The
 * model's windows also end after 60 s (with >= 50 batches) and its
 * discards after 30 s: at one worker (10 s a sample) 6 and 3 samples, at
 * the consumer's pace (2 s a sample) 30 and 15. */
typedef struct world {
	double rate;  /* per worker */
	double step;  /* consumer s per batch */
	double bad5;  /* batch time factor at exactly 5 workers (0: none) */
	double cap;   /* b/s the job gets at most, whatever the count (0:
		       * none): a transport or a machine the workers share */
	bool busy_known;
	uint64_t now; /* ns */
	bool epoch_start;
} world;

static void
world_sample(world *w, uint32_t n, cwi_scale_sample *smp)
{
	double supply = n * w->rate;
	double t = 1.0 / supply > w->step ? 1.0 / supply : w->step;
	double busy = supply > 1.0 / w->step ? (1.0 / w->step) / supply : 1.0;

	if (w->cap > 0 && supply > w->cap) {
		t = 1.0 / w->cap > w->step ? 1.0 / w->cap : w->step;
		busy = 1.0 / t / supply;
	}

	if (n == 5 && w->bad5 > 0)
		t *= w->bad5;
	memset(smp, 0, sizeof(*smp));
	smp->batches = 10;
	smp->elapsed_ns = (uint64_t)llround(10 * t * 1e9);
	smp->wait_ns = (uint64_t)llround(10 * (t - w->step) * 1e9);
	w->now += smp->elapsed_ns;
	smp->now_ns = w->now;
	smp->buffer_fill = busy < 1 ? 1.0 : 0.0;
	smp->epoch_start = w->epoch_start;
	w->epoch_start = false;
	smp->workers = n;
	smp->worker_busy = w->busy_known ? busy : -1.0;
	smp->worker_cpu = smp->worker_busy;
}

/* Feeds samples at the scaler's own target (workers appear at once)
 * until the target changes or `max` samples went by; returns how many
 * samples were fed (max when it did not change). */
static int
until_change(cwi_scaler *s, world *w, int max, cwi_scale_decision *dec)
{
	for (int i = 1; i <= max; i++) {
		cwi_scale_sample smp;

		world_sample(w, cwi_scaler_target(s), &smp);
		cwi_scaler_observe(s, &smp, dec);
		if (dec->changed)
			return i;
	}
	return max;
}

static cwi_scaler *
make(const char *spec, uint32_t initial, uint32_t maxw)
{
	cwi_scale_config c;
	cwi_scaler *s = NULL;

	cwi_scale_config_default(&c);
	ck_assert_int_eq(cwi_scale_parse(&c, spec), CACHEW_OK);
	c.max_workers = maxw;
	ck_assert_int_eq(cwi_scaler_create(&s, &c, initial), CACHEW_OK);
	return s;
}

/* ---- configuration ---------------------------------------------------------- */

START_TEST(test_config_defaults_are_cachews_numbers)
{
	cwi_scale_config c;

	cwi_scale_config_default(&c);
	ck_assert_int_eq(c.kind, CWI_SCALE_MODEL);
	ck_assert_uint_eq(c.window_batches, 500);
	ck_assert_uint_eq(c.discard_epoch, 200);
	ck_assert_uint_eq(c.discard_change, 150);
	ck_assert_uint_eq(c.min_step_batches, 650);
	ck_assert_double_eq_tol(c.improve, 0.07, 1e-12);
	ck_assert_uint_eq(c.drift_every, 21);
	ck_assert_double_eq_tol(c.drift_factor, 1.4, 1e-12);
	ck_assert_double_eq_tol(c.headroom, 0.10, 1e-12);
	ck_assert_uint_eq(c.window_max_ns, 60000000000ull);
	ck_assert_uint_eq(c.min_window_batches, 50);
	ck_assert_uint_eq(c.discard_max_ns, 30000000000ull);
	ck_assert_uint_eq(c.probe_min_ns, 10000000000ull);
	ck_assert_uint_eq(c.probe_max_ns, 300000000000ull);
	ck_assert_uint_eq(c.probe_watch_ns, 120000000000ull);
	ck_assert_uint_eq(c.min_workers, 1);
	ck_assert_uint_eq(c.max_workers, UINT32_MAX);
}
END_TEST

START_TEST(test_parse_accepts_each_policy_and_names_it_back)
{
	static const char *const specs[] = {"model", "cachew", "fixed:4",
	    "hpa:80", "fixed:1", "hpa:100"};
	cwi_scale_config c;
	char name[32];

	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
		cwi_scale_config_default(&c);
		ck_assert_int_eq(cwi_scale_parse(&c, specs[i]), CACHEW_OK);
		cwi_scale_name(&c, name, sizeof(name));
		ck_assert_str_eq(name, specs[i]);
	}
	cwi_scale_config_default(&c);
	cwi_scale_parse(&c, "fixed:4");
	ck_assert_int_eq(c.kind, CWI_SCALE_FIXED);
	ck_assert_uint_eq(c.fixed, 4);
	cwi_scale_parse(&c, "hpa:80");
	ck_assert_int_eq(c.kind, CWI_SCALE_HPA);
	ck_assert_double_eq_tol(c.hpa_target, 0.80, 1e-12);
}
END_TEST

START_TEST(test_parse_rejects_bad_spellings_naming_them)
{
	static const struct {
		const char *spec;
		const char *msg;
	} bad[] = {
	    {"fixed:0", "scaling policy 'fixed:0': fixed:N needs a worker "
			"count N >= 1"},
	    {"fixed:", "scaling policy 'fixed:': fixed:N needs"},
	    {"fixed:4x", "scaling policy 'fixed:4x': fixed:N needs"},
	    {"fixed:99999999999", "'fixed:99999999999'"},
	    {"hpa:0", "scaling policy 'hpa:0': hpa:P needs a CPU target P "
		      "from 1 to 100 (percent)"},
	    {"hpa:101", "'hpa:101'"},
	    {"hpa:-5", "'hpa:-5'"},
	    {"magic", "unknown scaling policy 'magic' (model, cachew, "
		      "fixed:N, hpa:P)"},
	    {"", "unknown scaling policy ''"},
	    {"Model", "unknown scaling policy 'Model'"},
	};
	cwi_scale_config c;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cwi_scale_config_default(&c);
		ck_assert_int_eq(cwi_scale_parse(&c, bad[i].spec),
		    CACHEW_EINVAL);
		ck_assert_msg(strstr(cachew_errmsg(), bad[i].msg) != NULL,
		    "'%s': message '%s' lacks '%s'", bad[i].spec,
		    cachew_errmsg(), bad[i].msg);
		ck_assert_int_eq(c.kind, CWI_SCALE_MODEL); /* untouched */
	}
}
END_TEST

START_TEST(test_create_rejects_min_above_max)
{
	cwi_scale_config c;
	cwi_scaler *s = (cwi_scaler *)1;

	cwi_scale_config_default(&c);
	c.min_workers = 5;
	c.max_workers = 4;
	ck_assert_int_eq(cwi_scaler_create(&s, &c, 1), CACHEW_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert_str_eq(cachew_errmsg(),
	    "scaler: min_workers 5 > max_workers 4");
}
END_TEST

/* ---- cachew ------------------------------------------------------------------ */

START_TEST(test_cachew_adds_one_worker_per_window_while_r_above_7pct)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("cachew", 1, 64);
	cwi_scale_decision dec;

	ck_assert_uint_eq(cwi_scaler_target(s), 1);
	/* 20 samples of epoch discard, then a 50-sample window. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 70);
	ck_assert_uint_eq(dec.workers, 2);
	ck_assert_str_eq(dec.reason,
	    "cachew: batch time 1000.0 ms at 1 workers -> 2");
	ck_assert_int_eq(dec.why, CWI_WHY_SEARCH);
	/* Then 15 discarded + 50 measured per step: r = 50 %, 33 %,
	 * 25 %, 20 %. */
	for (uint32_t n = 3; n <= 6; n++) {
		ck_assert_int_eq(until_change(s, &w, 500, &dec), 65);
		ck_assert_uint_eq(dec.workers, n);
		ck_assert(!dec.settled);
	}
	ck_assert_str_eq(dec.reason, "cachew: r = 20.0% > 7% at 5 workers -> 6");
	ck_assert_int_eq(dec.why, CWI_WHY_GAIN);
	ck_assert_uint_eq(cwi_scaler_windows(s), 5);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cachew_settles_on_the_smaller_count)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("cachew", 1, 64);
	cwi_scale_decision dec;

	for (int i = 0; i < 5; i++)
		until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 6);
	/* At 6 the consumer is the bottleneck: r = 0 -> back to 5. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 65);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "cachew: r = 0.0% <= 7% -> settle at 5");
	ck_assert_int_eq(dec.why, CWI_WHY_NO_GAIN);
	/* Settled: nothing moves while nothing drifts. */
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	ck_assert_uint_eq(dec.workers, 5);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cachew_drift_in_batch_time_moves_by_one)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("cachew", 1, 64);
	cwi_scale_decision dec;

	for (int i = 0; i < 6; i++)
		until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	/* The workers slow to half: batch time 2x the settled 200 ms. The
	 * change discard (15 samples), then the 21st sample checks. */
	w.rate = 0.5;
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 36);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert_str_eq(dec.reason,
	    "cachew: drift (batch time 2.00x, queue 0.00 vs 0.00) -> 6");
	ck_assert_int_eq(dec.why, CWI_WHY_DRIFT);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cachew_epoch_start_discards_and_restarts_the_window)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("cachew", 1, 64);
	cwi_scale_decision dec;
	cwi_scale_sample smp;

	/* 60 samples: past the discard and 40 into the window. */
	for (int i = 0; i < 60; i++) {
		world_sample(&w, 1, &smp);
		cwi_scaler_observe(s, &smp, &dec);
	}
	ck_assert_uint_eq(dec.workers, 1);
	/* A new epoch: 20 discarded, then a whole new window. */
	w.epoch_start = true;
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 70);
	ck_assert_uint_eq(dec.workers, 2);
	ck_assert_uint_eq(cwi_scaler_windows(s), 1);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cachew_reset_starts_over_at_one_worker)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("cachew", 1, 64);
	cwi_scale_decision dec;

	for (int i = 0; i < 3; i++)
		until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(cwi_scaler_target(s), 4);
	cwi_scaler_reset(s, 7);
	ck_assert_uint_eq(cwi_scaler_target(s), 1);
	/* The change discard (15), then a first window again. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 65);
	ck_assert_uint_eq(dec.workers, 2);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cachew_stops_at_max_workers)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("cachew", 1, 3);
	cwi_scale_decision dec;

	until_change(s, &w, 500, &dec);
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 3);
	/* r = 33 % at the maximum: settles there. */
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	ck_assert_uint_eq(dec.workers, 3);
	ck_assert(dec.settled);
	cwi_scaler_destroy(s);
}
END_TEST

/* ---- model ------------------------------------------------------------------- */

START_TEST(test_model_jumps_to_the_computed_count_then_probes_once)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	/* One worker: 3 samples discarded (30 s), a 60 s window of 6;
	 * 1 b/s per worker, demand 5 b/s: ceil(5 x 1.1) = 6. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 9);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert_str_eq(dec.reason, "model: demand 5.0 b/s, 1.00 b/s per "
				     "worker -> 6 (+10% headroom)");
	ck_assert_int_eq(dec.why, CWI_WHY_DEMAND);
	ck_assert(!dec.settled);
	/* At 6 (15 discarded, 30 measured) the estimate holds; the probe
	 * tries 5, the count without headroom. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 45);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert_str_eq(dec.reason, "model: probe 5 workers (5.0 b/s at "
				     "1.00 per worker; 6 with headroom: "
				     "200.0 ms)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE);
	/* 5 is as fast: kept, settled, and nothing moves after. */
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe kept 5 workers: waits "
				     "+0.0% of a batch <= 7% (batch time "
				     "+0.0%)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_KEPT);
	/* The jump, the confirmation, the probe, and one more window of
	 * the probe's 120 s watch. */
	ck_assert_uint_eq(cwi_scaler_windows(s), 4);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_rejected_goes_back)
{
	/* Five workers are 20 % slower than the model predicts. */
	world w = {.rate = 1.0, .step = 0.2, .bad5 = 1.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	until_change(s, &w, 500, &dec);
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	/* 2.4 s a sample at 5: 13 discarded (31.2 s), 25 measured. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 38);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe rejected: waits +20.0% "
				     "of a batch > 7% (batch time +20.0%) "
				     "-> back to 6");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_REJECTED);
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_without_busy_figure_uses_waiting)
{
	/* No busy figure, but the client waits: the workers are the
	 * bottleneck, so the same jump. */
	world w = {.rate = 2.0, .step = 0.1, .busy_known = false};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	/* 5 s a sample: 6 discarded, 12 measured; 2 b/s per worker,
	 * demand 10 b/s: ceil(10 x 1.1 / 2) = 6. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 18);
	ck_assert_uint_eq(dec.workers, 6);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_jump_is_bounded_by_max_workers)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("model", 1, 4);
	cwi_scale_decision dec;

	ck_assert_int_eq(until_change(s, &w, 500, &dec), 9);
	ck_assert_uint_eq(dec.workers, 4);
	/* At the bound the demand still needs 5: no probe below it. */
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	ck_assert_uint_eq(dec.workers, 4);
	ck_assert(dec.settled);
	cwi_scaler_destroy(s);
}
END_TEST

/* A consumer that does next to nothing between batches has a demand far
 * beyond what one window's rate can be extrapolated to: the jump goes to
 * 8 times the count at most (issue 17: "wants 1514" for a trivial range,
 * which the Kubernetes provisioner would have asked for). */
START_TEST(test_model_jump_is_at_most_eight_times_the_count)
{
	world w = {.rate = 1000.0, .step = 0.00001, .busy_known = true};
	cwi_scaler *s = make("model", 1, UINT32_MAX);
	cwi_scale_decision dec;

	/* Demand 100000 b/s at 1000 per worker would be 110. */
	ck_assert_int_lt(until_change(s, &w, 100000, &dec), 100000);
	ck_assert_uint_eq(dec.workers, 8);
	cwi_scaler_destroy(s);
}
END_TEST

/* When the jump did not make the job faster, the workers are not what it
 * waits for: back to the count before, settled. */
START_TEST(test_model_jump_that_gains_nothing_goes_back)
{
	world w = {.rate = 1000.0, .step = 0.00001, .cap = 1000.0,
	    .busy_known = true};
	cwi_scaler *s = make("model", 1, UINT32_MAX);
	cwi_scale_decision dec;

	until_change(s, &w, 100000, &dec);
	ck_assert_uint_eq(dec.workers, 8);
	ck_assert_int_lt(until_change(s, &w, 100000, &dec), 100000);
	ck_assert_uint_eq(dec.workers, 1);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: 8 workers gave 1000.0 b/s, 1 "
				     "gave 1000.0 b/s: more workers do not "
				     "help -> 1");
	ck_assert_int_eq(dec.why, CWI_WHY_SATURATED);
	ck_assert_int_eq(until_change(s, &w, 100000, &dec), 100000);
	ck_assert_uint_eq(dec.workers, 1);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_from_too_many_workers_jumps_down)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("model", 20, 64);
	cwi_scale_decision dec;

	/* 2 s a sample: 15 discarded, 30 measured; 20 workers 25 % busy:
	 * 1 b/s each; demand 5: 6. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 45);
	ck_assert_uint_eq(dec.workers, 6);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_windows_by_batches_only_when_time_caps_are_off)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	c.window_max_ns = 0;
	c.discard_max_ns = 0;
	ck_assert_int_eq(cwi_scaler_create(&s, &c, 1), CACHEW_OK);
	/* Cachew's counts: 20 discarded, 50 measured. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 70);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 65);
	ck_assert_uint_eq(dec.workers, 5);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_reset_carries_the_count_over)
{
	cwi_scaler *s = make("model", 3, 64);

	cwi_scaler_reset(s, 7);
	ck_assert_uint_eq(cwi_scaler_target(s), 7);
	cwi_scaler_reset(s, 100);
	ck_assert_uint_eq(cwi_scaler_target(s), 64); /* clamped */
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_granted_less_keeps_asking)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	ck_assert_int_eq(until_change(s, &w, 500, &dec), 9);
	ck_assert_uint_eq(dec.workers, 6);
	/* Fair share gives 3: the samples come from 3 workers. */
	cwi_scaler_granted(s, 3);
	for (int i = 0; i < 1000; i++) {
		cwi_scale_sample smp;

		world_sample(&w, 3, &smp);
		cwi_scaler_observe(s, &smp, &dec);
		ck_assert_uint_eq(dec.workers, 6);
	}
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: demand 5.0 b/s, 1.00 b/s per "
				     "worker wants 6, granted 3");
	ck_assert_int_eq(dec.why, CWI_WHY_GRANTED);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_cooldown_holds_a_change)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	c.cooldown_ns = 200000000000ull; /* 200 s */
	ck_assert_int_eq(cwi_scaler_create(&s, &c, 1), CACHEW_OK);
	/* The first change is free: 9 samples of 10 s. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 9);
	ck_assert_uint_eq(dec.workers, 6);
	/* The probe wants 5 after 45 samples of 2 s (90 s): held; again
	 * after the next window (30 samples, 150 s): held; the one after
	 * (210 s) may change. */
	ck_assert_int_eq(until_change(s, &w, 500, &dec), 105);
	ck_assert_uint_eq(dec.workers, 5);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_samples_without_time_are_ignored)
{
	cwi_scaler *s = make("model", 2, 64);
	cwi_scale_sample smp;
	cwi_scale_decision dec;

	memset(&smp, 0, sizeof(smp));
	smp.batches = 100000;
	smp.workers = 2;
	for (int i = 0; i < 100; i++) {
		cwi_scaler_observe(s, &smp, &dec);
		ck_assert_uint_eq(dec.workers, 2);
		ck_assert(!dec.changed);
	}
	ck_assert_uint_eq(cwi_scaler_windows(s), 0);
	cwi_scaler_destroy(s);
}
END_TEST

/* ---- the probe against a client buffer ---------------------------------------
 * The real client buffers what the workers deliver ahead of the consumer
 * (64 MiB: thousands of small elements), so after a step down it consumes
 * the backlog built at the larger count and the batch time hides a
 * shortfall. Here: a buffer of `cap` batches; workers deliver n * rate
 * batches/s into it (times `factor` at exactly `short_n` workers: the
 * count the model trusts too much) while it has room; the consumer takes
 * `step` s per batch and waits only when it is empty. No busy figure (the
 * real workers never stall on such a buffer). Every sample is 10
 * batches. */
typedef struct bworld {
	double rate;
	double step;
	double cap;
	uint32_t short_n;
	double factor;
	double level; /* batches buffered */
	uint64_t now;
	uint64_t lag_until; /* until then one more worker delivers */
} bworld;

static void
bworld_sample(bworld *w, uint32_t n, cwi_scale_sample *smp)
{
	double supply = n * w->rate * (n == w->short_n ? w->factor : 1.0);

	if (w->now < w->lag_until)
		supply += w->rate; /* a removed worker's leased splits */
	double demand = 1.0 / w->step;
	double t = 10 * w->step, wait = 0;

	if (supply >= demand) {
		w->level += (supply - demand) * t;
		if (w->level > w->cap)
			w->level = w->cap;
	} else if (w->level >= (demand - supply) * t) {
		w->level -= (demand - supply) * t;
	} else {
		/* The buffer runs dry part way: the rest at the workers'
		 * pace. */
		double dry = w->level / (demand - supply);

		t = dry + (10 - dry * demand) / supply;
		wait = t - 10 * w->step;
		w->level = 0;
	}
	memset(smp, 0, sizeof(*smp));
	smp->batches = 10;
	smp->elapsed_ns = (uint64_t)llround(t * 1e9);
	smp->wait_ns = (uint64_t)llround(wait * 1e9);
	w->now += smp->elapsed_ns;
	smp->now_ns = w->now;
	smp->buffer_fill = w->level / w->cap;
	smp->workers = n;
	smp->worker_busy = -1;
	smp->worker_cpu = -1;
}

/* Feeds buffered samples at the scaler's target until the decision moves
 * or settles (or max samples); returns how many were fed. */
static int
bworld_until_decided(cwi_scaler *s, bworld *w, int max,
    cwi_scale_decision *dec)
{
	for (int i = 1; i <= max; i++) {
		cwi_scale_sample smp;

		bworld_sample(w, cwi_scaler_target(s), &smp);
		cwi_scaler_observe(s, &smp, dec);
		if (dec->changed || dec->settled)
			return i;
	}
	return max;
}

/* One worker (the client waits: 1 b/s per worker, demand 5 b/s) -> 6;
 * at 6 the backlog grows by 1 b/s for 90 s; the probe tries 5. */
static cwi_scaler *
bworld_to_probe(bworld *w, cwi_scale_config *c)
{
	cwi_scaler *s = NULL;
	cwi_scale_decision dec;

	ck_assert_int_eq(cwi_scaler_create(&s, c, 1), CACHEW_OK);
	ck_assert_int_eq(bworld_until_decided(s, w, 500, &dec), 9);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert_int_eq(bworld_until_decided(s, w, 500, &dec), 45);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert_str_eq(dec.reason, "model: probe 5 workers (5.0 b/s at "
				     "1.00 per worker; 6 with headroom: "
				     "200.0 ms)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE);
	return s;
}

/* Feeds n buffered samples at the scaler's target; the last decision. */
static void
bworld_feed(cwi_scaler *s, bworld *w, int n, cwi_scale_decision *dec)
{
	for (int i = 0; i < n; i++) {
		cwi_scale_sample smp;

		bworld_sample(w, cwi_scaler_target(s), &smp);
		cwi_scaler_observe(s, &smp, dec);
	}
}

START_TEST(test_model_probe_hidden_by_the_buffer_goes_back_up)
{
	/* Five workers deliver 4.4 b/s, 12 % short: the 90 batches built
	 * at 6 feed the client through the whole probe window, so it never
	 * waits there (the old rule kept 5). The fill falls, so the probe
	 * goes on until the client waits, and then sees the shortfall. */
	bworld w = {.rate = 1.0, .step = 0.2, .cap = 1000, .short_n = 5,
	    .factor = 0.88};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	s = bworld_to_probe(&w, &c);
	/* 15 discarded, then a 60 s window of 30 without a wait. */
	bworld_feed(s, &w, 45, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(!dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe 5 workers: buffer drains "
				     "(fill 0.0714 -> 0.0354), waits +0.0% "
				     "-> until the client waits");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE);
	ck_assert_int_eq(bworld_until_decided(s, &w, 1000, &dec), 57);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe rejected once the buffer "
				     "ran dry: waits +13.6% of a batch > 7% "
				     "(batch time +13.6%) -> back to 6");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_REJECTED);
	for (int i = 0; i < 1000; i++) {
		bworld_feed(s, &w, 1, &dec);
		ck_assert_uint_eq(dec.workers, 6);
	}
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_watch_catches_a_late_shortfall)
{
	/* The worker removed for the probe delivers 80 s more (the splits
	 * it leased): the probe's first window sees six workers and keeps
	 * five, watching; the shortfall shows in the watch, and the probe
	 * goes back up. */
	bworld w = {.rate = 1.0, .step = 0.2, .cap = 1000, .short_n = 5,
	    .factor = 0.88};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	s = bworld_to_probe(&w, &c);
	w.lag_until = w.now + 80000000000ull;
	ck_assert_int_eq(bworld_until_decided(s, &w, 1000, &dec), 45);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe kept 5 workers: waits "
				     "+0.0% of a batch <= 7% (batch time "
				     "+0.0%), watching");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_KEPT);
	for (int i = 0; i < 1000 && cwi_scaler_target(s) == 5; i++)
		bworld_feed(s, &w, 1, &dec);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe rejected once the buffer "
				     "ran dry: waits +13.3% of a batch > 7% "
				     "(batch time +13.3%) -> back to 6");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_REJECTED);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_short_within_improve_is_kept_once_dry)
{
	/* A small buffer (20 batches, full at 6) and five workers 3 % short:
	 * the fill falls through the window, the client then waits 3 % of
	 * a batch: within the 7 %, 5 stays. */
	bworld w = {.rate = 1.0, .step = 0.2, .cap = 20, .short_n = 5,
	    .factor = 0.97};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	s = bworld_to_probe(&w, &c);
	ck_assert_int_eq(bworld_until_decided(s, &w, 1000, &dec), 96);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe kept 5 workers once the "
				     "buffer ran dry: waits +3.0% of a batch "
				     "<= 7% (batch time +3.0%)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_KEPT);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_draining_without_a_wait_is_ambiguous)
{
	/* As in the hidden case, but the probe may drain for 100 s only:
	 * the client has not waited by then, and the larger count wins. */
	bworld w = {.rate = 1.0, .step = 0.2, .cap = 1000, .short_n = 5,
	    .factor = 0.88};
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;

	cwi_scale_config_default(&c);
	c.probe_max_ns = 100000000000ull;
	s = bworld_to_probe(&w, &c);
	ck_assert_int_eq(bworld_until_decided(s, &w, 1000, &dec), 65);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe ambiguous: buffer drained "
				     "100 s and the client never waited -> "
				     "back to 6");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_REJECTED);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_ignores_a_slower_consumer)
{
	/* The consumer slows by 20 % during the probe (a shared machine)
	 * but never waits: the workers keep up, 5 stays. */
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	until_change(s, &w, 500, &dec);
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	w.step = 0.24;
	ck_assert_int_eq(until_change(s, &w, 1000, &dec), 1000);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: probe kept 5 workers: waits "
				     "+0.0% of a batch <= 7% (batch time "
				     "+20.0%)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE_KEPT);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_granted_fewer_settles)
{
	/* Fair share gives the probe 4 of its 5: that window measures 4,
	 * not the probe, which ends asking 5. */
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;
	int fed = 0;

	until_change(s, &w, 500, &dec);
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	cwi_scaler_granted(s, 4);
	while (!dec.settled && fed < 1000) {
		cwi_scale_sample smp;

		world_sample(&w, 4, &smp);
		cwi_scaler_observe(s, &smp, &dec);
		fed++;
	}
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason,
	    "model: probe of 5 workers granted 4 -> settle");
	ck_assert_int_eq(dec.why, CWI_WHY_GRANTED);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_uses_the_larger_demand)
{
	/* The consumer is slower in the confirmation window (3.7 b/s
	 * against the jump's 5; within one worker of 6, so no second
	 * jump): the probe still tries 5, one fewer than 6, not the 4 the
	 * low demand alone would give. */
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 6);
	w.step = 1.0 / 3.7;
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert_str_eq(dec.reason, "model: probe 5 workers (5.0 b/s at "
				     "1.00 per worker; 6 with headroom: "
				     "270.3 ms)");
	ck_assert_int_eq(dec.why, CWI_WHY_PROBE);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_probe_lasts_probe_min)
{
	/* 100 b/s per worker, demand 500 b/s: 10 batches take 20 ms, so
	 * the window's 500 batches would pass in 1 s; the probe still
	 * lasts 10 s (500 samples) after its 15-sample discard. */
	world w = {.rate = 100.0, .step = 0.002, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;
	int fed = 0;

	until_change(s, &w, 5000, &dec);
	ck_assert_uint_eq(dec.workers, 6);
	until_change(s, &w, 5000, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	while (!dec.settled && fed < 5000) {
		cwi_scale_sample smp;

		world_sample(&w, 5, &smp);
		cwi_scaler_observe(s, &smp, &dec);
		fed++;
	}
	ck_assert_int_eq(fed, 515);
	ck_assert_uint_eq(dec.workers, 5);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_model_confirm_short_by_more_than_improve_goes_up)
{
	/* Demand 3.5 b/s at one worker: 4 (ceil 3.85). The consumer then
	 * speeds up to 4.4 b/s: at 4 workers the client waits, 4 workers
	 * are 9 % short even at the jump's rate, and nothing holds the job
	 * at 4: up to 5 rather than settling short. */
	world w = {.rate = 1.0, .step = 1.0 / 3.5, .busy_known = true,
	    .epoch_start = true};
	cwi_scaler *s = make("model", 1, 64);
	cwi_scale_decision dec;

	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 4);
	w.step = 1.0 / 4.4;
	until_change(s, &w, 500, &dec);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert(dec.settled);
	ck_assert_str_eq(dec.reason, "model: confirm: demand 4.4 b/s needs 5 "
				     "workers at 1.00 per worker -> 5");
	ck_assert_int_eq(dec.why, CWI_WHY_DEMAND);
	cwi_scaler_destroy(s);
}
END_TEST

/* ---- fixed and hpa ----------------------------------------------------------- */

START_TEST(test_fixed_never_moves)
{
	world w = {.rate = 1.0, .step = 0.2, .busy_known = true};
	cwi_scaler *s = make("fixed:3", 1, 64);
	cwi_scale_decision dec;

	ck_assert_uint_eq(cwi_scaler_target(s), 3);
	ck_assert_int_eq(until_change(s, &w, 2000, &dec), 2000);
	ck_assert_uint_eq(dec.workers, 3);
	ck_assert(dec.settled);
	cwi_scaler_reset(s, 9);
	ck_assert_uint_eq(cwi_scaler_target(s), 3);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_fixed_is_bounded)
{
	cwi_scaler *s = make("fixed:30", 1, 8);

	ck_assert_uint_eq(cwi_scaler_target(s), 8);
	cwi_scaler_destroy(s);
}
END_TEST

/* HPA samples: 500 ms each at a given CPU use. */
static int
hpa_until_change(cwi_scaler *s, uint64_t *now, double cpu, int max,
    cwi_scale_decision *dec)
{
	for (int i = 1; i <= max; i++) {
		cwi_scale_sample smp;

		memset(&smp, 0, sizeof(smp));
		*now += 500000000ull;
		smp.now_ns = *now;
		smp.batches = 5;
		smp.elapsed_ns = 500000000ull;
		smp.workers = cwi_scaler_target(s);
		smp.worker_busy = cpu;
		smp.worker_cpu = cpu;
		cwi_scaler_observe(s, &smp, dec);
		if (dec->changed)
			return i;
	}
	return max;
}

START_TEST(test_hpa_scales_by_utilisation_over_target)
{
	cwi_scaler *s = make("hpa:80", 4, 64);
	cwi_scale_decision dec;
	uint64_t now = 0;

	/* 100 % CPU at 4 workers: ceil(4 x 1.0 / 0.8) = 5, at the first
	 * 15 s sync (the 31st sample: the first only starts the clock). */
	ck_assert_int_eq(hpa_until_change(s, &now, 1.0, 100, &dec), 31);
	ck_assert_uint_eq(dec.workers, 5);
	ck_assert_str_eq(dec.reason, "hpa:80: cpu 100% of 4 workers -> 5");
	ck_assert_int_eq(dec.why, CWI_WHY_CPU);
	/* Within the 10 % tolerance (86 % / 80 % = 1.075): stays. */
	ck_assert_int_eq(hpa_until_change(s, &now, 0.86, 300, &dec), 300);
	ck_assert_uint_eq(dec.workers, 5);
	/* 90 % is outside: ceil(5 x 1.125) = 6. */
	ck_assert_int_eq(hpa_until_change(s, &now, 0.90, 100, &dec), 30);
	ck_assert_uint_eq(dec.workers, 6);
	ck_assert_uint_eq(cwi_scaler_windows(s), 12);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_hpa_scale_down_waits_for_the_stabilisation_window)
{
	cwi_scaler *s = make("hpa:80", 4, 64);
	cwi_scale_decision dec;
	uint64_t now = 0;

	ck_assert_int_eq(hpa_until_change(s, &now, 1.0, 100, &dec), 31);
	ck_assert_uint_eq(dec.workers, 5);
	/* 40 % at 5 recommends 3, but 5 was recommended less than 5
	 * minutes ago: held until that recommendation is 300 s old, 600
	 * samples later. */
	ck_assert_int_eq(hpa_until_change(s, &now, 0.40, 1000, &dec), 600);
	ck_assert_uint_eq(dec.workers, 3);
	cwi_scaler_destroy(s);
}
END_TEST

START_TEST(test_hpa_respects_min_workers)
{
	cwi_scale_config c;
	cwi_scaler *s;
	cwi_scale_decision dec;
	uint64_t now = 0;

	cwi_scale_config_default(&c);
	cwi_scale_parse(&c, "hpa:50");
	c.min_workers = 2;
	ck_assert_int_eq(cwi_scaler_create(&s, &c, 1), CACHEW_OK);
	ck_assert_uint_eq(cwi_scaler_target(s), 2);
	ck_assert_int_eq(hpa_until_change(s, &now, 0.0, 2000, &dec), 2000);
	ck_assert_uint_eq(dec.workers, 2);
	cwi_scaler_destroy(s);
}
END_TEST

/* ---- fair share -------------------------------------------------------------- */

static void
share(const uint32_t *want, const double *weight, size_t n, uint32_t total,
    const uint32_t *expect)
{
	uint32_t got[16];

	cwi_fair_share(want, weight, n, total, got);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(got[i] == expect[i],
		    "job %zu: got %u, expected %u", i, got[i], expect[i]);
}

START_TEST(test_share_equal_weights_split_evenly)
{
	share((uint32_t[]){10, 10}, (double[]){1, 1}, 2, 10,
	    (uint32_t[]){5, 5});
	/* An odd worker goes to the lower index. */
	share((uint32_t[]){10, 10, 10}, (double[]){1, 1, 1}, 3, 10,
	    (uint32_t[]){4, 3, 3});
}
END_TEST

START_TEST(test_share_weights_two_to_one)
{
	share((uint32_t[]){100, 100}, (double[]){2, 1}, 2, 9,
	    (uint32_t[]){6, 3});
	share((uint32_t[]){100, 100}, (double[]){2, 1}, 2, 10,
	    (uint32_t[]){7, 3});
}
END_TEST

START_TEST(test_share_small_wants_leave_the_rest_to_others)
{
	share((uint32_t[]){2, 10, 10}, (double[]){1, 1, 1}, 3, 12,
	    (uint32_t[]){2, 5, 5});
	share((uint32_t[]){5, 100}, (double[]){3, 1}, 2, 12,
	    (uint32_t[]){5, 7});
}
END_TEST

START_TEST(test_share_all_wants_met_when_enough)
{
	share((uint32_t[]){3, 4}, (double[]){1, 1}, 2, 10,
	    (uint32_t[]){3, 4});
}
END_TEST

START_TEST(test_share_fewer_workers_than_jobs_oldest_first)
{
	share((uint32_t[]){3, 3, 3, 3}, (double[]){1, 1, 1, 1}, 4, 2,
	    (uint32_t[]){1, 1, 0, 0});
	share((uint32_t[]){3, 0, 3, 3}, (double[]){1, 1, 1, 1}, 4, 2,
	    (uint32_t[]){1, 0, 1, 0});
	share((uint32_t[]){3, 3}, (double[]){1, 1}, 2, 0,
	    (uint32_t[]){0, 0});
}
END_TEST

START_TEST(test_share_no_starvation_with_extreme_weights)
{
	share((uint32_t[]){100, 100}, (double[]){100, 1}, 2, 10,
	    (uint32_t[]){9, 1});
}
END_TEST

START_TEST(test_share_zero_wants_get_nothing)
{
	share((uint32_t[]){0, 4, 0}, (double[]){1, 1, 1}, 3, 10,
	    (uint32_t[]){0, 4, 0});
	share((uint32_t[]){0, 40, 0, 40}, (double[]){1, 1, 1, 1}, 4, 10,
	    (uint32_t[]){0, 5, 0, 5});
}
END_TEST

START_TEST(test_share_big_n)
{
	enum { N = 1000 };
	uint32_t *want = malloc(N * sizeof(*want));
	uint32_t *got = malloc(N * sizeof(*got));
	double *weight = malloc(N * sizeof(*weight));

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_ptr_nonnull(weight);
	for (size_t i = 0; i < N; i++) {
		want[i] = 1000;
		weight[i] = 1.0;
	}
	cwi_fair_share(want, weight, N, 100500, got);
	for (size_t i = 0; i < N; i++)
		ck_assert_uint_eq(got[i], i < 500 ? 101 : 100);
	/* Huge wants and totals do not overflow or loop for long. */
	for (size_t i = 0; i < N; i++)
		want[i] = UINT32_MAX;
	cwi_fair_share(want, weight, N, UINT32_MAX, got);
	{
		uint64_t sum = 0;

		for (size_t i = 0; i < N; i++) {
			sum += got[i];
			ck_assert(got[i] == UINT32_MAX / N ||
			    got[i] == UINT32_MAX / N + 1);
		}
		ck_assert_uint_eq(sum, UINT32_MAX);
	}
	free(want);
	free(got);
	free(weight);
}
END_TEST

START_TEST(test_share_is_deterministic)
{
	uint32_t want[5] = {7, 3, 9, 1, 12};
	double weight[5] = {1.5, 1, 2, 1, 0.5};
	uint32_t a[5], b[5];

	cwi_fair_share(want, weight, 5, 17, a);
	cwi_fair_share(want, weight, 5, 17, b);
	ck_assert_mem_eq(a, b, sizeof(a));
	ck_assert_uint_eq(a[0] + a[1] + a[2] + a[3] + a[4], 17);
}
END_TEST

Suite *
cwt_policy_suite(void)
{
	Suite *s = suite_create("policy");
	TCase *cfg = tcase_create("config");
	TCase *cw = tcase_create("cachew");
	TCase *mo = tcase_create("model");
	TCase *fh = tcase_create("fixed_hpa");
	TCase *fs = tcase_create("fair_share");

	tcase_add_test(cfg, test_config_defaults_are_cachews_numbers);
	tcase_add_test(cfg, test_parse_accepts_each_policy_and_names_it_back);
	tcase_add_test(cfg, test_parse_rejects_bad_spellings_naming_them);
	tcase_add_test(cfg, test_create_rejects_min_above_max);
	tcase_add_test(cw,
	    test_cachew_adds_one_worker_per_window_while_r_above_7pct);
	tcase_add_test(cw, test_cachew_settles_on_the_smaller_count);
	tcase_add_test(cw, test_cachew_drift_in_batch_time_moves_by_one);
	tcase_add_test(cw,
	    test_cachew_epoch_start_discards_and_restarts_the_window);
	tcase_add_test(cw, test_cachew_reset_starts_over_at_one_worker);
	tcase_add_test(cw, test_cachew_stops_at_max_workers);
	tcase_add_test(mo,
	    test_model_jumps_to_the_computed_count_then_probes_once);
	tcase_add_test(mo, test_model_probe_rejected_goes_back);
	tcase_add_test(mo, test_model_without_busy_figure_uses_waiting);
	tcase_add_test(mo, test_model_jump_is_bounded_by_max_workers);
	tcase_add_test(mo, test_model_from_too_many_workers_jumps_down);
	tcase_add_test(mo, test_model_jump_is_at_most_eight_times_the_count);
	tcase_add_test(mo, test_model_jump_that_gains_nothing_goes_back);
	tcase_add_test(mo,
	    test_model_windows_by_batches_only_when_time_caps_are_off);
	tcase_add_test(mo, test_model_reset_carries_the_count_over);
	tcase_add_test(mo, test_model_granted_less_keeps_asking);
	tcase_add_test(mo, test_cooldown_holds_a_change);
	tcase_add_test(mo, test_samples_without_time_are_ignored);
	tcase_add_test(mo,
	    test_model_probe_hidden_by_the_buffer_goes_back_up);
	tcase_add_test(mo, test_model_probe_watch_catches_a_late_shortfall);
	tcase_add_test(mo,
	    test_model_probe_short_within_improve_is_kept_once_dry);
	tcase_add_test(mo,
	    test_model_probe_draining_without_a_wait_is_ambiguous);
	tcase_add_test(mo, test_model_probe_ignores_a_slower_consumer);
	tcase_add_test(mo, test_model_probe_granted_fewer_settles);
	tcase_add_test(mo, test_model_probe_uses_the_larger_demand);
	tcase_add_test(mo, test_model_probe_lasts_probe_min);
	tcase_add_test(mo,
	    test_model_confirm_short_by_more_than_improve_goes_up);
	tcase_add_test(fh, test_fixed_never_moves);
	tcase_add_test(fh, test_fixed_is_bounded);
	tcase_add_test(fh, test_hpa_scales_by_utilisation_over_target);
	tcase_add_test(fh,
	    test_hpa_scale_down_waits_for_the_stabilisation_window);
	tcase_add_test(fh, test_hpa_respects_min_workers);
	tcase_add_test(fs, test_share_equal_weights_split_evenly);
	tcase_add_test(fs, test_share_weights_two_to_one);
	tcase_add_test(fs, test_share_small_wants_leave_the_rest_to_others);
	tcase_add_test(fs, test_share_all_wants_met_when_enough);
	tcase_add_test(fs, test_share_fewer_workers_than_jobs_oldest_first);
	tcase_add_test(fs, test_share_no_starvation_with_extreme_weights);
	tcase_add_test(fs, test_share_zero_wants_get_nothing);
	tcase_add_test(fs, test_share_big_n);
	tcase_add_test(fs, test_share_is_deterministic);
	suite_add_tcase(s, cfg);
	suite_add_tcase(s, cw);
	suite_add_tcase(s, mo);
	suite_add_tcase(s, fh);
	suite_add_tcase(s, fs);
	return s;
}
