/*
 * sim_autoscale.c - `cachew sim autoscale`: each scaling policy on
 * modelled input-bound jobs, against the oracle (the smallest fixed count
 * within 5 % of the best fixed epoch time), by converged count, decision
 * windows to converge, epoch time and cost.
 */
#include "sim.h"
#include "sim_job.h"

#include "../core/core.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ImageNet: 1,281,167 images in batches of 256. */
#define IMAGENET_BATCHES 5005u

/* The input-bound settings (docs/policies.md explains the numbers). */
static const cwi_sim_setting settings[] = {
    {"resnet50",
	"ResNet-50 on a TPU v3-8 (0.10 s/step), 1.6 batches/s per 8-vCPU "
	"worker",
	1.6, 0.100, IMAGENET_BATCHES, 4, 24},
    {"resnet50-heavy",
	"ResNet-50 with CPU-heavier augmentation: 0.8 batches/s per worker",
	0.8, 0.100, IMAGENET_BATCHES, 4, 24},
    {"resnet152",
	"a slower model (0.25 s/step), 1.6 batches/s per worker", 1.6, 0.250,
	IMAGENET_BATCHES, 3, 24},
};

#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))
#define MAX_POLICIES 8

typedef struct run_result {
	char policy[32];
	uint32_t workers;   /* the final decision */
	uint32_t windows;   /* decision windows to converge */
	double converge_s;  /* virtual s when it converged */
	double epoch_s;     /* mean epoch time */
	double total_s;     /* the whole training */
	double worker_h;    /* provisioned worker-hours */
	double cost;
	bool keep_trace;
	cwi_sim_job job;    /* its trace, for plots (keep_trace) */
} run_result;

/* A per-run seed: the user's seed mixed with the setting and policy. */
static uint64_t
run_seed(uint64_t seed, size_t setting, const char *policy)
{
	uint64_t h = seed * 0x9e3779b97f4a7c15ull + setting;

	for (const char *p = policy; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	return h;
}

/* Runs one training job under `spec` to its end; *r holds the outcome
 * (and the job with its trace when keep_trace; cwi_sim_job_fini it). */
static cachew_err
run_policy(const cwi_sim_setting *set, size_t setting_idx,
    const char *spec, const cwi_sim_opts *o, bool keep_trace,
    run_result *r)
{
	cwi_scale_config cfg;
	cwi_sim_job *j = &r->job;
	uint32_t want;
	cachew_err rv;
	/* A generous bound: one worker doing the whole training, twice. */
	double limit_s = 2.0 * (double)set->epochs *
	    (double)set->epoch_batches / (set->worker_rate * 0.9) + 3600;

	memset(r, 0, sizeof(*r));
	snprintf(r->policy, sizeof(r->policy), "%s", spec);
	cwi_scale_config_default(&cfg);
	rv = cwi_scale_parse(&cfg, spec);
	if (rv != CACHEW_OK)
		return rv;
	cfg.max_workers = set->max_workers;
	if (cfg.kind == CWI_SCALE_FIXED && cfg.fixed > set->max_workers)
		cfg.fixed = set->max_workers;
	rv = cwi_sim_job_init(j, set, &cfg,
	    cfg.kind == CWI_SCALE_FIXED ? cfg.fixed : 1, 0.0,
	    run_seed(o->seed, setting_idx, spec));
	if (rv != CACHEW_OK)
		return rv;
	if (o->verbose && cfg.kind != CWI_SCALE_FIXED) {
		j->log = stderr;
		snprintf(j->label, sizeof(j->label), "%s", set->name);
	}
	while (!j->done && j->t < limit_s)
		if (cwi_sim_job_step(j, &want))
			cwi_sim_job_grant(j, want,
			    want < set->max_workers ? want : set->max_workers);
	r->workers = cwi_scaler_target(j->scaler);
	r->windows = cwi_sim_job_converged(j, r->workers, &r->converge_s);
	r->epoch_s = cwi_sim_job_epoch_mean(j);
	r->total_s = j->done ? j->done_at : j->t;
	r->worker_h = j->worker_s / 3600.0;
	r->cost = r->worker_h * o->price_worker +
	    r->total_s / 3600.0 * o->price_consumer;
	r->keep_trace = keep_trace;
	if (!keep_trace)
		cwi_sim_job_fini(j);
	return CACHEW_OK;
}

/* The oracle: fixed:N for every N up to the pool; the smallest N within
 * 5 % of the best epoch time. */
static cachew_err
find_oracle(const cwi_sim_setting *set, size_t idx, const cwi_sim_opts *o,
    uint32_t *oracle, double *best_epoch_s)
{
	double *epoch = calloc(set->max_workers + 1, sizeof(*epoch));
	double best = INFINITY;
	cachew_err rv = CACHEW_OK;

	if (epoch == NULL)
		return cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
	for (uint32_t n = 1; n <= set->max_workers; n++) {
		char spec[32];
		run_result r;

		snprintf(spec, sizeof(spec), "fixed:%" PRIu32, n);
		rv = run_policy(set, idx, spec, o, false, &r);
		if (rv != CACHEW_OK)
			goto done;
		epoch[n] = r.epoch_s;
		if (r.epoch_s < best)
			best = r.epoch_s;
	}
	*best_epoch_s = best;
	*oracle = set->max_workers;
	for (uint32_t n = 1; n <= set->max_workers; n++)
		if (epoch[n] <= best * 1.05) {
			*oracle = n;
			break;
		}
done:
	free(epoch);
	return rv;
}

static void
print_json(FILE *out, const cwi_sim_setting *set, const run_result *r,
    uint32_t oracle, double best)
{
	fputs("{\"scenario\":\"autoscale\",\"policy\":", out);
	cwi_sim_json_str(out, r->policy);
	fputs(",\"setting\":", out);
	cwi_sim_json_str(out, set->name);
	fprintf(out,
	    ",\"workers\":%" PRIu32 ",\"oracle_workers\":%" PRIu32
	    ",\"windows\":%" PRIu32 ",\"epoch_s\":%.1f,\"cost\":%.3f,"
	    "\"decision\":null,\"best_fixed_epoch_s\":%.1f,"
	    "\"converge_s\":%.1f,\"total_s\":%.1f,\"worker_hours\":%.3f,"
	    "\"epochs\":%" PRIu32 "}\n",
	    r->workers, oracle, r->windows, r->epoch_s, r->cost, best,
	    r->converge_s, r->total_s, r->worker_h, set->epochs);
}

static void
print_table(FILE *out, const cwi_sim_setting *set, const run_result *rs,
    size_t nr, uint32_t oracle, double best)
{
	fprintf(out,
	    "\nautoscale: %s\n  %s; %" PRIu32 " epochs of %" PRIu64
	    " batches\n  oracle %" PRIu32 " workers, best fixed epoch %.1f s\n",
	    set->name, set->about, set->epochs, set->epoch_batches, oracle,
	    best);
	fprintf(out, "  %-10s %7s %7s %10s %8s %9s %8s\n", "policy",
	    "workers", "windows", "converge_s", "epoch_s", "worker_h",
	    "cost_$");
	for (size_t i = 0; i < nr; i++)
		fprintf(out,
		    "  %-10s %7" PRIu32 " %7" PRIu32 " %10.0f %8.1f %9.2f "
		    "%8.2f\n",
		    rs[i].policy, rs[i].workers, rs[i].windows,
		    rs[i].converge_s, rs[i].epoch_s, rs[i].worker_h,
		    rs[i].cost);
}

/* Throughput smoothed over 10 s (20 heartbeats), for readable plots. */
static void
smooth_rate(const cwi_sim_job *j, double *x, double *y)
{
	double sum = 0;

	for (size_t i = 0; i < j->ntrace; i++) {
		sum += j->trace[i].rate;
		if (i >= 20)
			sum -= j->trace[i - 20].rate;
		x[i] = j->trace[i].t;
		y[i] = sum / (double)(i + 1 < 20 ? i + 1 : 20);
	}
}

static cachew_err
plot_setting(const cwi_sim_opts *o, const char *scenario,
    const char *setting, const run_result *rs, size_t nr)
{
	cwi_sim_series ws[MAX_POLICIES], ts[MAX_POLICIES];
	double *buf[MAX_POLICIES * 3] = {0};
	size_t ns = 0;
	char *png = NULL, *title = NULL;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < nr && ns < MAX_POLICIES; i++) {
		const cwi_sim_job *j = &rs[i].job;
		double *x, *y, *r;

		if (!rs[i].keep_trace || j->ntrace == 0)
			continue;
		x = buf[ns * 3] = malloc(j->ntrace * sizeof(double));
		y = buf[ns * 3 + 1] = malloc(j->ntrace * sizeof(double));
		r = buf[ns * 3 + 2] = malloc(j->ntrace * sizeof(double));
		if (x == NULL || y == NULL || r == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
			goto done;
		}
		for (size_t k = 0; k < j->ntrace; k++) {
			x[k] = j->trace[k].t;
			y[k] = j->trace[k].workers;
		}
		ws[ns] = (cwi_sim_series){rs[i].policy, x, y, j->ntrace};
		/* The smoothed rate shares x with the worker series. */
		smooth_rate(j, x, r);
		ts[ns] = (cwi_sim_series){rs[i].policy, x, r, j->ntrace};
		ns++;
	}
	if (ns == 0)
		goto done;
	png = cwi_asprintf("%s/%s-%s-workers.png", o->plot_dir, scenario,
	    setting);
	title = cwi_asprintf("%s %s: provisioned workers", scenario, setting);
	if (png == NULL || title == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
		goto done;
	}
	rv = cwi_sim_plot(png, title, "time (s)", "workers", ws, ns);
	if (rv != CACHEW_OK)
		goto done;
	free(png);
	free(title);
	png = cwi_asprintf("%s/%s-%s-throughput.png", o->plot_dir, scenario,
	    setting);
	title = cwi_asprintf("%s %s: consumed batches/s (10 s mean)",
	    scenario, setting);
	if (png == NULL || title == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
		goto done;
	}
	rv = cwi_sim_plot(png, title, "time (s)", "batches/s", ts, ns);
done:
	free(png);
	free(title);
	for (size_t i = 0; i < MAX_POLICIES * 3; i++)
		free(buf[i]);
	return rv;
}

/* One setting: the oracle, then each policy. */
static cachew_err
run_setting(const cwi_sim_opts *o, FILE *out, size_t idx, bool *goals_met)
{
	const cwi_sim_setting *set = &settings[idx];
	run_result rs[MAX_POLICIES];
	char specs[MAX_POLICIES][32];
	size_t nspec = 0, nr = 0;
	uint32_t oracle = 1, half, dbl;
	double best = 0;
	bool plots = o->plot_dir != NULL;
	cachew_err rv;

	rv = find_oracle(set, idx, o, &oracle, &best);
	if (rv != CACHEW_OK)
		return rv;
	half = oracle / 2 > 0 ? oracle / 2 : 1;
	dbl = oracle * 2 <= set->max_workers ? oracle * 2 : set->max_workers;
	snprintf(specs[nspec++], 32, "model");
	snprintf(specs[nspec++], 32, "cachew");
	snprintf(specs[nspec++], 32, "hpa:80");
	if (half != oracle)
		snprintf(specs[nspec++], 32, "fixed:%" PRIu32, half);
	snprintf(specs[nspec++], 32, "fixed:%" PRIu32, oracle);
	if (dbl != oracle)
		snprintf(specs[nspec++], 32, "fixed:%" PRIu32, dbl);
	for (size_t i = 0; i < nspec; i++) {
		rv = run_policy(set, idx, specs[i], o, plots,
		    &rs[nr]);
		if (rv != CACHEW_OK)
			goto done;
		nr++;
	}
	/* rs[0] is model, rs[2] hpa:80: the goals. */
	if (!(rs[0].workers + 1 >= oracle && rs[0].workers <= oracle + 1 &&
		rs[0].windows <= 3 && rs[0].cost <= rs[2].cost))
		*goals_met = false;
	if (o->json) {
		for (size_t i = 0; i < nr; i++)
			print_json(out, set, &rs[i], oracle, best);
	} else {
		print_table(out, set, rs, nr, oracle, best);
		fprintf(out,
		    "  goals: model within +-1 of the oracle: %s (%" PRIu32
		    " vs %" PRIu32 "); <= 3 windows: %s (%" PRIu32
		    "); cost <= hpa:80: %s (%.2f vs %.2f)\n",
		    rs[0].workers + 1 >= oracle && rs[0].workers <= oracle + 1
			? "yes"
			: "NO",
		    rs[0].workers, oracle, rs[0].windows <= 3 ? "yes" : "NO",
		    rs[0].windows, rs[0].cost <= rs[2].cost ? "yes" : "NO",
		    rs[0].cost, rs[2].cost);
	}
	if (plots)
		rv = plot_setting(o, "autoscale", set->name, rs, nr);
done:
	for (size_t i = 0; i < nr; i++)
		if (rs[i].keep_trace)
			cwi_sim_job_fini(&rs[i].job);
	return rv;
}

int
cwi_sim_autoscale(const cwi_sim_opts *o, FILE *out)
{
	bool goals = true;
	size_t n = o->quick ? 1 : NSETTINGS;

	if (!o->json)
		fprintf(out,
		    "cachew sim autoscale (seed %" PRIu64 ", $%.2f per "
		    "worker-hour, $%.2f per consumer-hour)\n",
		    o->seed, o->price_worker, o->price_consumer);
	for (size_t i = 0; i < n; i++) {
		cachew_err rv = run_setting(o, out, i, &goals);

		if (rv != CACHEW_OK) {
			fprintf(stderr, "cachew sim: autoscale %s: %s\n",
			    settings[i].name, cachew_errmsg());
			return 1;
		}
	}
	if (!o->json)
		fprintf(out, "\nall goals met: %s\n", goals ? "yes" : "NO");
	return 0;
}
