/*
 * sim_tenant.c - `cachew sim multitenant`: Cachew's Figure 10 scenario.
 * Two ResNet-50 jobs (consumer steps of 100 ms and 50 ms per batch) share
 * a pool of 10 workers; the second arrives when the first starts its third
 * epoch. Every heartbeat (the decision interval) each job's scaler gives a
 * want and cwi_fair_share splits the pool; a job's grant below its want is
 * told to its scaler.
 */
#include "sim.h"
#include "sim_job.h"

#include "../core/core.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define POOL 10u
#define NJOBS 2
#define ARRIVE_EPOCH 2u /* the second job arrives at the first's 3rd */

static const cwi_sim_setting tenants[NJOBS] = {
    {"job1-100ms", "ResNet-50, 100 ms per batch", 1.6, 0.100, 5005, 5,
	POOL},
    {"job2-50ms", "ResNet-50, 50 ms per batch", 1.6, 0.050, 5005, 4, POOL},
};

typedef struct tenant_run {
	cwi_sim_job job[NJOBS];
	bool started[NJOBS];
	double arrive_s;     /* job 2 arrives */
	double leave_s;      /* job 1 finished (0: not while job 2 ran) */
	/* Decision intervals (heartbeats) from an arrival or a departure
	 * until the grants changed for it; -1: they never did. */
	int arrive_intervals;
	int leave_intervals;
	double arrive_moved_s; /* provisioned counts match the new grants */
	double leave_moved_s;
	uint32_t shared[NJOBS]; /* grants just before job 1 left */
	/* Every change of the grants: when, and each job's count. */
	double change_t[64];
	uint32_t change_got[64][NJOBS];
	size_t nchange;
} tenant_run;

static uint64_t
tenant_seed(uint64_t seed, size_t job, const char *policy)
{
	uint64_t h = seed * 0xd1b54a32d192ed03ull + job * 0x9e3779b97f4a7c15ull;

	for (const char *p = policy; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	return h;
}

/* The grants for the current wants (0 for absent or finished jobs). */
static void
share_pool(const uint32_t *want, uint32_t *got)
{
	static const double weight[NJOBS] = {1.0, 1.0};

	cwi_fair_share(want, weight, NJOBS, POOL, got);
}

static cachew_err
start_job(tenant_run *tr, size_t i, const char *spec,
    const cwi_sim_opts *o, uint32_t initial, double t)
{
	cwi_scale_config cfg;
	cachew_err rv;

	cwi_scale_config_default(&cfg);
	rv = cwi_scale_parse(&cfg, spec);
	if (rv != CACHEW_OK)
		return rv;
	cfg.max_workers = POOL;
	rv = cwi_sim_job_init(&tr->job[i], &tenants[i], &cfg, initial, t,
	    tenant_seed(o->seed, i, spec));
	if (rv != CACHEW_OK)
		return rv;
	if (o->verbose) {
		tr->job[i].log = stderr;
		snprintf(tr->job[i].label, sizeof(tr->job[i].label), "%s",
		    tenants[i].name);
	}
	tr->started[i] = true;
	return CACHEW_OK;
}

/* One decision interval: wants in, fair share out, grants applied. */
static void
decide(tenant_run *tr, const bool *beat, const uint32_t *asked,
    uint32_t *got)
{
	uint32_t want[NJOBS] = {0};

	for (size_t i = 0; i < NJOBS; i++)
		if (tr->started[i] && !tr->job[i].done)
			want[i] = beat[i] ? asked[i]
					  : cwi_scaler_target(tr->job[i].scaler);
	share_pool(want, got);
	for (size_t i = 0; i < NJOBS; i++)
		if (beat[i])
			cwi_sim_job_grant(&tr->job[i], want[i], got[i]);
		else if (tr->started[i] && !tr->job[i].done &&
			 got[i] != tr->job[i].applied)
			cwi_sim_job_grant(&tr->job[i], want[i], got[i]);
}

static bool
provisioned_as_granted(const tenant_run *tr)
{
	for (size_t i = 0; i < NJOBS; i++)
		if (tr->started[i] && !tr->job[i].done &&
		    (tr->job[i].pending ||
			tr->job[i].nworkers != tr->job[i].applied))
			return false;
	return true;
}

/* Runs both jobs to their ends under `spec`. */
static cachew_err
run_tenants(const cwi_sim_opts *o, const char *spec, tenant_run *tr)
{
	uint32_t last_got[NJOBS] = {0};
	int arrive_wait = -1, leave_wait = -1;
	bool arrive_pending = false, leave_pending = false;
	cachew_err rv;
	double limit_s = 50000;

	memset(tr, 0, sizeof(*tr));
	tr->arrive_intervals = tr->leave_intervals = -1;
	/* Alone, the first job starts with the whole pool and the model
	 * measures from there; Cachew starts at one worker regardless. */
	rv = start_job(tr, 0, spec, o, POOL, 0.0);
	if (rv != CACHEW_OK)
		return rv;
	last_got[0] = cwi_scaler_target(tr->job[0].scaler);
	while (tr->job[0].t < limit_s &&
	       !(tr->job[0].done && tr->started[1] && tr->job[1].done)) {
		bool beat[NJOBS] = {false, false}, any = false;
		uint32_t asked[NJOBS] = {0}, got[NJOBS] = {0};

		for (size_t i = 0; i < NJOBS; i++)
			if (tr->started[i] && !tr->job[i].done)
				beat[i] = cwi_sim_job_step(&tr->job[i],
				    &asked[i]);
		if (tr->started[1] && !tr->job[1].done && tr->job[0].done)
			tr->job[0].t = tr->job[1].t; /* the clock goes on */
		any = beat[0] || beat[1];
		/* Job 2 arrives at the first heartbeat of job 1's third
		 * epoch: its first grant is its fair share of the pool. */
		if (!tr->started[1] && beat[0] && tr->job[0].epoch >= ARRIVE_EPOCH) {
			uint32_t w[NJOBS] = {asked[0], POOL}, g[NJOBS];

			share_pool(w, g);
			rv = start_job(tr, 1, spec, o, g[1],
			    tr->job[0].t);
			if (rv != CACHEW_OK)
				return rv;
			tr->arrive_s = tr->job[0].t;
			arrive_pending = true;
			arrive_wait = 0;
		}
		if (tr->started[1] && tr->job[0].done && tr->leave_s == 0 &&
		    !tr->job[1].done) {
			tr->leave_s = tr->job[1].t;
			tr->shared[0] = last_got[0];
			tr->shared[1] = last_got[1];
			leave_pending = true;
			leave_wait = 0;
		}
		if (!any)
			continue;
		decide(tr, beat, asked, got);
		if (arrive_pending && tr->arrive_intervals < 0) {
			if (got[0] != last_got[0] || got[1] != last_got[1])
				tr->arrive_intervals = arrive_wait;
			arrive_wait++;
		}
		if (leave_pending && tr->leave_intervals < 0) {
			if (got[1] != last_got[1])
				tr->leave_intervals = leave_wait;
			leave_wait++;
		}
		if (arrive_pending && tr->arrive_intervals >= 0 &&
		    tr->arrive_moved_s == 0 && provisioned_as_granted(tr))
			tr->arrive_moved_s = tr->job[0].t - tr->arrive_s;
		if (leave_pending && tr->leave_intervals >= 0 &&
		    tr->leave_moved_s == 0 && provisioned_as_granted(tr))
			tr->leave_moved_s = tr->job[1].t - tr->leave_s;
		if ((got[0] != last_got[0] || got[1] != last_got[1] ||
			tr->nchange == 0) &&
		    tr->nchange < sizeof(tr->change_t) / sizeof(tr->change_t[0])) {
			tr->change_t[tr->nchange] = tr->job[0].t;
			memcpy(tr->change_got[tr->nchange], got, sizeof(got));
			tr->nchange++;
		}
		memcpy(last_got, got, sizeof(got));
	}
	return CACHEW_OK;
}

static void
fini_run(tenant_run *tr)
{
	for (size_t i = 0; i < NJOBS; i++)
		if (tr->started[i])
			cwi_sim_job_fini(&tr->job[i]);
}

/* A job alone with the whole pool: its best epoch time. */
static cachew_err
alone_epoch(const cwi_sim_opts *o, size_t i, double *epoch_s)
{
	cwi_scale_config cfg;
	cwi_sim_job j;
	uint32_t want;
	cachew_err rv;

	cwi_scale_config_default(&cfg);
	cfg.kind = CWI_SCALE_FIXED;
	cfg.fixed = POOL;
	cfg.max_workers = POOL;
	rv = cwi_sim_job_init(&j, &tenants[i], &cfg, POOL, 0.0,
	    tenant_seed(o->seed, i, "fixed"));
	if (rv != CACHEW_OK)
		return rv;
	while (!j.done && j.t < 50000)
		if (cwi_sim_job_step(&j, &want))
			cwi_sim_job_grant(&j, want, want);
	*epoch_s = cwi_sim_job_epoch_mean(&j);
	cwi_sim_job_fini(&j);
	return CACHEW_OK;
}

/* The ideal shared split: each job's true need (the smallest count
 * within 5 % of its consumer's rate), fair-shared. */
static void
ideal_split(uint32_t *got)
{
	uint32_t need[NJOBS];
	static const double weight[NJOBS] = {1.0, 1.0};

	for (size_t i = 0; i < NJOBS; i++)
		need[i] = (uint32_t)ceil(1.0 / tenants[i].step_s /
		    (tenants[i].worker_rate * 1.05));
	cwi_fair_share(need, weight, NJOBS, POOL, got);
}

static void
print_run(FILE *out, const cwi_sim_opts *o, const char *spec,
    const tenant_run *tr, const double *alone, const uint32_t *ideal)
{
	for (size_t i = 0; i < NJOBS; i++) {
		const cwi_sim_job *j = &tr->job[i];
		double total = (j->done ? j->done_at : j->t) -
		    (i == 0 ? 0 : tr->arrive_s);
		double cost = j->worker_s / 3600 * o->price_worker +
		    total / 3600 * o->price_consumer;
		int moved = i == 0 ? tr->arrive_intervals
				   : (tr->leave_intervals >= 0
					     ? tr->leave_intervals
					     : tr->arrive_intervals);

		if (o->json) {
			fputs("{\"scenario\":\"multitenant\",\"policy\":", out);
			cwi_sim_json_str(out, spec);
			fputs(",\"setting\":", out);
			cwi_sim_json_str(out, tenants[i].name);
			fprintf(out,
			    ",\"workers\":%" PRIu32 ",\"oracle_workers\":%"
			    PRIu32 ",\"windows\":%d,\"epoch_s\":%.1f,"
			    "\"cost\":%.3f,\"decision\":null,"
			    "\"best_fixed_epoch_s\":%.1f,\"epochs\":%" PRIu32
			    ",\"arrive_s\":%.1f,\"leave_s\":%.1f,"
			    "\"arrive_move_intervals\":%d,"
			    "\"leave_move_intervals\":%d,"
			    "\"arrive_provisioned_s\":%.1f,"
			    "\"leave_provisioned_s\":%.1f,\"epoch_times\":[",
			    tr->shared[i], ideal[i], moved,
			    cwi_sim_job_epoch_mean(j), cost, alone[i],
			    j->epoch, tr->arrive_s, tr->leave_s,
			    tr->arrive_intervals, tr->leave_intervals,
			    tr->arrive_moved_s, tr->leave_moved_s);
			for (uint32_t e = 0; e < j->epoch && e < 64; e++)
				fprintf(out, "%s%.1f", e ? "," : "",
				    j->epoch_s[e]);
			fputs("]}\n", out);
			continue;
		}
		fprintf(out, "  %-11s shared %2" PRIu32 " (ideal %2" PRIu32
			     ")  epochs:",
		    tenants[i].name, tr->shared[i], ideal[i]);
		for (uint32_t e = 0; e < j->epoch && e < 64; e++)
			fprintf(out, " %.0f", j->epoch_s[e]);
		fprintf(out, " s (alone with %u: %.0f s)  cost $%.2f\n", POOL,
		    alone[i], cost);
	}
	if (o->json)
		return;
	fprintf(out, "  workers (job1/job2) from t:");
	for (size_t k = 0; k < tr->nchange; k++)
		fprintf(out, "%s %.0f s %" PRIu32 "/%" PRIu32,
		    k % 6 == 5 ? "\n   " : "", tr->change_t[k],
		    tr->change_got[k][0], tr->change_got[k][1]);
	fprintf(out, "\n  job2 arrives at %.0f s: ", tr->arrive_s);
	if (tr->arrive_intervals >= 0)
		fprintf(out, "grants moved after %d decision intervals, "
			     "workers in place %.1f s later\n",
		    tr->arrive_intervals, tr->arrive_moved_s);
	else
		fprintf(out, "no grant had to move\n");
	fprintf(out, "  job1 leaves at %.0f s: ", tr->leave_s);
	if (tr->leave_intervals >= 0)
		fprintf(out, "grants moved after %d decision intervals, "
			     "workers in place %.1f s later\n",
		    tr->leave_intervals, tr->leave_moved_s);
	else
		fprintf(out, "job2 wanted no more workers\n");
}

static cachew_err
plot_run(const cwi_sim_opts *o, const char *spec, const tenant_run *tr)
{
	cwi_sim_series ws[NJOBS], ts[NJOBS];
	double *buf[NJOBS * 3] = {0};
	char *png = NULL, *title = NULL, name[40];
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < NJOBS; i++) {
		const cwi_sim_job *j = &tr->job[i];
		size_t n = j->ntrace ? j->ntrace : 1;
		double sum = 0;

		for (size_t k = 0; k < 3; k++) {
			buf[i * 3 + k] = calloc(n, sizeof(double));
			if (buf[i * 3 + k] == NULL) {
				rv = cwi_fail(CACHEW_ENOMEM, "sim: out of "
							     "memory");
				goto done;
			}
		}
		for (size_t k = 0; k < j->ntrace; k++) {
			buf[i * 3][k] = j->trace[k].t;
			buf[i * 3 + 1][k] = j->trace[k].workers;
			sum += j->trace[k].rate;
			if (k >= 20)
				sum -= j->trace[k - 20].rate;
			buf[i * 3 + 2][k] = sum / (double)(k + 1 < 20 ? k + 1
								      : 20);
		}
		ws[i] = (cwi_sim_series){tenants[i].name, buf[i * 3],
		    buf[i * 3 + 1], j->ntrace};
		ts[i] = (cwi_sim_series){tenants[i].name, buf[i * 3],
		    buf[i * 3 + 2], j->ntrace};
	}
	/* "fixed:4" and "hpa:80" become file-name friendly. */
	snprintf(name, sizeof(name), "%s", spec);
	for (char *p = name; *p; p++)
		if (*p == ':')
			*p = '-';
	png = cwi_asprintf("%s/multitenant-%s-workers.png", o->plot_dir, name);
	title = cwi_asprintf("multitenant (%s): workers per job, pool %u",
	    spec, POOL);
	if (png == NULL || title == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
		goto done;
	}
	rv = cwi_sim_plot(png, title, "time (s)", "workers", ws, NJOBS);
	if (rv != CACHEW_OK)
		goto done;
	free(png);
	free(title);
	png = cwi_asprintf("%s/multitenant-%s-throughput.png", o->plot_dir,
	    name);
	title = cwi_asprintf("multitenant (%s): batches/s per job (10 s "
			     "mean)",
	    spec);
	if (png == NULL || title == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "sim: out of memory");
		goto done;
	}
	rv = cwi_sim_plot(png, title, "time (s)", "batches/s", ts, NJOBS);
done:
	free(png);
	free(title);
	for (size_t i = 0; i < NJOBS * 3; i++)
		free(buf[i]);
	return rv;
}

int
cwi_sim_multitenant(const cwi_sim_opts *o, FILE *out)
{
	static const char *const policies[] = {"model", "cachew"};
	double alone[NJOBS];
	uint32_t ideal[NJOBS];
	cachew_err rv;

	ideal_split(ideal);
	for (size_t i = 0; i < NJOBS; i++) {
		rv = alone_epoch(o, i, &alone[i]);
		if (rv != CACHEW_OK)
			goto fail;
	}
	if (!o->json)
		fprintf(out,
		    "cachew sim multitenant (seed %" PRIu64 "): pool of %u "
		    "workers at %.1f batches/s each; job1 %.0f ms/batch x %"
		    PRIu32 " epochs, job2 %.0f ms/batch x %" PRIu32
		    " epochs from job1's epoch %u\n",
		    o->seed, POOL, tenants[0].worker_rate,
		    tenants[0].step_s * 1e3, tenants[0].epochs,
		    tenants[1].step_s * 1e3, tenants[1].epochs,
		    ARRIVE_EPOCH + 1);
	for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
		tenant_run tr;

		rv = run_tenants(o, policies[p], &tr);
		if (rv != CACHEW_OK) {
			fini_run(&tr);
			goto fail;
		}
		if (!o->json)
			fprintf(out, "\npolicy %s:\n", policies[p]);
		print_run(out, o, policies[p], &tr, alone, ideal);
		if (o->plot_dir != NULL)
			rv = plot_run(o, policies[p], &tr);
		fini_run(&tr);
		if (rv != CACHEW_OK)
			goto fail;
	}
	return 0;
fail:
	fprintf(stderr, "cachew sim: multitenant: %s\n", cachew_errmsg());
	return 1;
}
