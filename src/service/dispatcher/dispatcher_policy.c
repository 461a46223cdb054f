/*
 * dispatcher_policy.c - how many workers each job gets: the glue between
 * the state machine and the pure policies of src/policy/ (scale.h: one
 * scaler per job, weighted fair share, the pool target).
 *
 * What it owns: a job's task count follows one decision, its worker count
 * function (cwi_worker_count_fn), or with the policy engine (autoscale) its
 * scaler's want cut by fair share over the running jobs; the pool target a
 * provisioner reads is the sum of the wants, rising at once and falling
 * late. This file builds what the policies see (a job's view; one sample
 * per decision interval from the clients' heartbeats and the tasks'
 * reports) and applies what they decide (struct job_sizing, the pool
 * target); adding and removing the tasks is the registry's
 * (dispatcher_state.c). The policies stay pure: the clock is the caller's
 * now, passed in.
 */
#include "dispatcher_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

/* ---- what a decision sees, and its target -------------------------------- */

uint32_t
cwi_worker_count_default(void *ctx, const cwi_job_view *view)
{
	(void)ctx;
	if (view->worker_policy == CWI_WORKERS_FIXED)
		return view->num_workers;
	return view->workers_available;
}

void
cwi_sizing_job_view(const cwi_dispatcher *d, const job *j, uint32_t avail,
    cwi_job_view *v)
{
	uint64_t bt = 0, wt = 0, nbt = 0;

	memset(v, 0, sizeof(*v));
	v->job_id = j->id;
	v->name = j->name;
	v->processing_mode = j->mode;
	v->worker_policy = j->policy;
	v->num_workers = j->num_workers;
	v->num_consumers = j->num_consumers;
	v->clients = (uint32_t)j->nclients;
	/* Those that can run it: a job whose graph needs plugin functions
	 * gets tasks only where they are loaded. */
	v->workers_available = j->ds->nneeds > 0
	    ? cwi_fns_workers_for(d, j->ds)
	    : avail;
	for (size_t i = 0; i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		v->elements_per_s += t->elements_per_s;
		if (t->state != CWI_TASK_REMOVING)
			v->tasks++;
	}
	for (size_t i = 0; i < j->nclients; i++) {
		if (j->clients[i].batch_time_ns == 0)
			continue;
		bt += j->clients[i].batch_time_ns;
		wt += j->clients[i].wait_time_ns;
		nbt++;
	}
	if (nbt > 0) {
		v->batch_time_ns = bt / nbt;
		v->wait_time_ns = wt / nbt;
	}
}

uint32_t
cwi_sizing_target(cwi_dispatcher *d, job *j, uint32_t avail,
    cwi_job_view *v)
{
	uint32_t target;

	cwi_sizing_job_view(d, j, avail, v);
	if (j->sizing.count_fn == NULL)
		target = j->sizing.granted; /* the policy engine's */
	else
		target = j->sizing.count_fn(j->sizing.count_ctx, v);
	if (target > v->workers_available)
		target = v->workers_available;
	if (!j->sizing.target_set || target != j->sizing.target) {
		j->sizing.target = target;
		j->sizing.target_set = true;
		cwi_disp_ev_begin(d, "job_target");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_u64(d, "workers", target);
		cwi_disp_ev_end(d);
	}
	return target;
}

cachew_err
cwi_dispatcher_set_worker_count(cwi_dispatcher *d, uint64_t now_ns,
    uint64_t job_id, cwi_worker_count_fn fn, void *ctx)
{
	job *j = cwi_disp_find_job(d, job_id);

	d->now = now_ns;
	if (j == NULL || j->finished)
		return cwi_fail(CACHEW_ENOENT, "job %" PRIu64 " is not running",
		    job_id);
	j->sizing.count_fn = fn != NULL ? fn : cwi_worker_count_default;
	j->sizing.count_ctx = fn != NULL ? ctx : NULL;
	if (fn == NULL && j->sizing.scaler != NULL)
		j->sizing.count_fn = NULL; /* back to the policy engine */
	cwi_disp_reconcile(d);
	return CACHEW_OK;
}

/* ---- samples ------------------------------------------------------------- */

/* The share of a heartbeat's interval its client spent waiting for data:
 * the wait over the time its batches took (batches x mean batch time);
 * a wait with no batch at all is a client that only waited. */
static double
client_wait_fraction(const cwi_msg_client_heartbeat *req)
{
	double took = (double)req->batches * (double)req->batch_time_ns;

	if (req->wait_time_ns == 0)
		return 0;
	if (took <= 0 || (double)req->wait_time_ns >= took)
		return 1;
	return (double)req->wait_time_ns / took;
}

/* a + b, at most UINT64_MAX / 4 (sums of these feed further sums). */
static uint64_t
add_capped(uint64_t a, uint64_t b)
{
	const uint64_t cap = UINT64_MAX / 4;

	return a >= cap || b >= cap - a ? cap : a + b;
}

void
cwi_sizing_client_report(client *c, const cwi_msg_client_heartbeat *req)
{
	c->batch_time_ns = req->batch_time_ns;
	c->wait_time_ns = req->wait_time_ns;
	c->wait_fraction = client_wait_fraction(req);
	c->buffer_fill = req->buffer_fill;
	/* A peer's counts: a product that would wrap is not a measurement,
	 * and the sums saturate (a hostile client's reports would wrap
	 * them, and the demand then read as about 0). */
	if (req->batches > 0 && req->batch_time_ns > 0 &&
	    req->batch_time_ns <= UINT64_MAX / 4 / req->batches) {
		c->acc_batches += req->batches;
		c->acc_elapsed_ns = add_capped(c->acc_elapsed_ns,
		    req->batches * req->batch_time_ns);
	}
	c->acc_wait_ns = add_capped(c->acc_wait_ns, req->wait_time_ns);
	/* A peer's float: anything outside 0..1 (NaN included) is 0. */
	c->acc_fill += req->buffer_fill >= 0 && req->buffer_fill <= 1
	    ? req->buffer_fill : 0;
	c->acc_reports++;
}

/* Run and stall time since the last report (smaller counters: the worker
 * started over); stall never counts for more than the run. */
void
cwi_sizing_task_busy(task *t, const cwi_task_report *r)
{
	uint64_t drun, dstall;

	drun = r->run_ns >= t->run_ns ? r->run_ns - t->run_ns : r->run_ns;
	dstall = r->stall_ns >= t->stall_ns ? r->stall_ns - t->stall_ns
					    : r->stall_ns;
	if (dstall > drun)
		dstall = drun;
	t->acc_run_ns += drun;
	t->acc_stall_ns += dstall;
	t->run_ns = r->run_ns;
	t->stall_ns = r->stall_ns;
}

/* One observation of job j since its last sample: its clients' mean
 * consumption, its tasks' stall time, its workers' CPU. Resets the
 * accumulators. */
static void
job_sample(job *j, uint64_t now, cwi_scale_sample *smp)
{
	uint64_t nb = 0, ne = 0, nw = 0, run = 0, stall = 0;
	double fill = 0, cpu = 0;
	uint32_t nrep = 0, ncpu = 0, ntasks = 0;

	memset(smp, 0, sizeof(*smp));
	for (size_t i = 0; i < j->nclients; i++) {
		client *c = &j->clients[i];
		if (c->acc_reports == 0)
			continue;
		nb += c->acc_batches;
		ne += c->acc_elapsed_ns;
		nw += c->acc_wait_ns;
		fill += c->acc_fill / c->acc_reports;
		nrep++;
		c->acc_batches = c->acc_elapsed_ns = c->acc_wait_ns = 0;
		c->acc_fill = 0;
		c->acc_reports = 0;
	}
	for (size_t i = 0; i < j->tasks.n; i++) {
		task *t = OWN_TASK(j, i);
		run += t->acc_run_ns;
		stall += t->acc_stall_ns;
		t->acc_run_ns = t->acc_stall_ns = 0;
		/* A removing task delivers the splits it leased until they
		 * are acknowledged: it serves the job until then, and the
		 * scaler must see the count drop when it really does (a
		 * probe's window restarts on it). */
		if (t->state != CWI_TASK_REMOVING || t->nleased > 0)
			ntasks++;
		if (t->w->cores > 0) {
			double u = t->w->cpu_use / t->w->cores;
			cpu += u < 0 ? 0 : u > 1 ? 1 : u;
			ncpu++;
		}
	}
	smp->now_ns = now;
	if (nrep > 0) {
		smp->batches = nb / nrep;
		smp->elapsed_ns = ne / nrep;
		/* A wait that began before the batches counted here (a
		 * client blocked across a heartbeat) is part of their time. */
		smp->wait_ns = nw / nrep;
		if (smp->wait_ns > smp->elapsed_ns)
			smp->elapsed_ns = smp->wait_ns;
		smp->buffer_fill = fill / nrep;
	}
	smp->epoch_start = j->sizing.epoch_start;
	smp->workers = ntasks;
	smp->worker_busy = run > 0 ? 1.0 - (double)stall / (double)run : -1.0;
	smp->worker_cpu = ncpu > 0 ? cpu / ncpu : -1.0;
	j->sizing.epoch_start = false;
	j->sizing.sample_ns = now;
}

/* ---- the policy engine --------------------------------------------------- */

/* A job the policy engine sizes now: autoscaled, running, data to come. */
static bool
scaled(const job *j)
{
	return j->sizing.scaler != NULL && j->sizing.count_fn == NULL &&
	       !j->finished && !j->data_done && !j->any_task_done;
}

/* Weighted fair share of the available workers over the scaled jobs, in
 * creation order (d->jobs is in id order). `tell`: a job that got less
 * than it wants tells its scaler, once per decision interval. */
void
cwi_sizing_share(cwi_dispatcher *d, bool tell)
{
	size_t n = d->jobs.n;
	uint32_t *want, *got;
	double *weight;

	if (!d->cfg.autoscale || n == 0)
		return;
	want = calloc(n, sizeof(*want));
	got = calloc(n, sizeof(*got));
	weight = calloc(n, sizeof(*weight));
	if (want == NULL || got == NULL || weight == NULL)
		goto out; /* the grants stay as they were */
	for (size_t i = 0; i < n; i++) {
		const job *j = JOB(d, i);
		want[i] = scaled(j) ? j->sizing.want : 0;
		weight[i] = j->sizing.weight > 0 ? j->sizing.weight : 1.0;
	}
	cwi_fair_share(want, weight, n, cwi_disp_workers_available(d), got);
	for (size_t i = 0; i < n; i++) {
		job *j = JOB(d, i);
		if (!scaled(j))
			continue;
		if (got[i] != j->sizing.granted) {
			cwi_disp_ev_begin(d, "job_share");
			cwi_disp_ev_u64(d, "job_id", j->id);
			cwi_disp_ev_u64(d, "want", want[i]);
			cwi_disp_ev_u64(d, "granted", got[i]);
			cwi_disp_ev_u64(d, "available",
			    cwi_disp_workers_available(d));
			cwi_disp_ev_end(d);
		}
		j->sizing.granted = got[i];
		if (tell && got[i] >= 1 && got[i] < want[i])
			cwi_scaler_granted(j->sizing.scaler, got[i]);
	}
out:
	free(want);
	free(got);
	free(weight);
}

/* Counts one decision of job j's policy (cwi_scale_tally): up or down
 * from the count it wanted before, else a change of settled. */
static void
scale_tally(cwi_dispatcher *d, const job *j, uint32_t old_want,
    const cwi_scale_decision *dec)
{
	const char *what = dec->workers > old_want   ? "up"
			   : dec->workers < old_want ? "down"
			   : dec->settled	     ? "settled"
						     : "unsettled";
	size_t kind = strcspn(j->sizing.scale_name, ":"), i;
	char policy[16];

	snprintf(policy, sizeof(policy), "%.*s", (int)kind,
	    j->sizing.scale_name);
	for (i = 0; i < d->nscale_tally; i++)
		if (strcmp(d->scale_tally[i].policy, policy) == 0 &&
		    strcmp(d->scale_tally[i].decision, what) == 0 &&
		    d->scale_tally[i].why == dec->why)
			break;
	if (i == d->nscale_tally) {
		if (i == CWI_SCALE_TALLIES)
			return; /* every pair's outcomes fit: not reached */
		snprintf(d->scale_tally[i].policy,
		    sizeof(d->scale_tally[i].policy), "%s", policy);
		snprintf(d->scale_tally[i].decision,
		    sizeof(d->scale_tally[i].decision), "%s", what);
		d->scale_tally[i].why = dec->why;
		d->nscale_tally++;
	}
	d->scale_tally[i].n++;
}

/* Feeds job j's sample to its scaler; an event when the decision moved. */
static void
job_decide(cwi_dispatcher *d, job *j, uint64_t now)
{
	cwi_scale_sample smp;
	cwi_scale_decision dec;

	job_sample(j, now, &smp);
	memset(&dec, 0, sizeof(dec));
	cwi_scaler_observe(j->sizing.scaler, &smp, &dec);
	dec.reason[sizeof(dec.reason) - 1] = '\0';
	if (dec.workers == j->sizing.want && dec.settled == j->sizing.settled)
		return;
	scale_tally(d, j, j->sizing.want, &dec);
	j->sizing.want = dec.workers;
	j->sizing.settled = dec.settled;
	snprintf(j->sizing.reason, sizeof(j->sizing.reason), "%s", dec.reason);
	cwi_disp_ev_begin(d, "scale_decision");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_str(d, "policy", j->sizing.scale_name);
	cwi_disp_ev_u64(d, "want", j->sizing.want);
	cwi_strbuf_printf(&d->ev, ",\"settled\":%s",
	    j->sizing.settled ? "true" : "false");
	cwi_disp_ev_u64(d, "batches", smp.batches);
	cwi_disp_ev_u64(d, "elapsed_ns", smp.elapsed_ns);
	cwi_disp_ev_u64(d, "wait_ns", smp.wait_ns);
	cwi_disp_ev_u64(d, "workers", smp.workers);
	cwi_disp_ev_str(d, "reason", j->sizing.reason);
	cwi_disp_ev_end(d);
}

/* The pool target: the sum of what the scaled jobs want, within the
 * bounds, and no lower than any raw target of the last
 * pool_down_intervals intervals (it rises at once, falls late). */
static void
pool_update(cwi_dispatcher *d)
{
	uint64_t sum = 0;
	uint32_t raw, target;

	for (size_t i = 0; i < d->jobs.n; i++)
		if (scaled(JOB(d, i)))
			sum += JOB(d, i)->sizing.want;
	if (d->cfg.max_workers > 0 && sum > d->cfg.max_workers)
		sum = d->cfg.max_workers;
	if (sum < d->cfg.min_workers)
		sum = d->cfg.min_workers;
	raw = sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
	memmove(&d->pool_recent[1], &d->pool_recent[0],
	    (d->cfg.pool_down_intervals - 1) * sizeof(*d->pool_recent));
	d->pool_recent[0] = raw;
	if (d->npool_recent < d->cfg.pool_down_intervals)
		d->npool_recent++;
	target = raw;
	for (uint32_t i = 0; i < d->npool_recent; i++)
		if (d->pool_recent[i] > target)
			target = d->pool_recent[i];
	if (target == d->pool_target)
		return;
	cwi_disp_ev_begin(d, "pool_target");
	cwi_disp_ev_u64(d, "workers", target);
	cwi_disp_ev_u64(d, "wanted", raw);
	cwi_disp_ev_u64(d, "available", cwi_disp_workers_available(d));
	cwi_disp_ev_end(d);
	d->pool_target = target;
}

void
cwi_dispatcher_decide(cwi_dispatcher *d, uint64_t now_ns)
{
	d->now = now_ns;
	if (!d->cfg.autoscale)
		return;
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		/* A job younger than half an interval keeps measuring. */
		if (scaled(j) && now_ns - j->sizing.sample_ns >=
			d->cfg.decision_interval_ns / 2)
			job_decide(d, j, now_ns);
	}
	cwi_sizing_share(d, true);
	pool_update(d);
	cwi_disp_reconcile(d);
	d->next_decision_ns = now_ns + d->cfg.decision_interval_ns;
}

uint32_t
cwi_dispatcher_pool_target(const cwi_dispatcher *d)
{
	return d->pool_target;
}

/* ---- a new job's scaler -------------------------------------------------- */

/* The scale configuration a job request asks for, checked. */
cachew_err
cwi_sizing_check(const cwi_dispatcher *d, const cwi_msg_job_get_or_create *r,
    cwi_scale_config *c)
{
	*c = d->cfg.scale;
	if (d->cfg.max_workers > 0 && c->max_workers > d->cfg.max_workers)
		c->max_workers = d->cfg.max_workers;
	if (r->scale_policy != NULL) {
		if (cwi_scale_parse(c, r->scale_policy) != CACHEW_OK)
			return cwi_fail(CACHEW_EINVAL, "scale_policy: %s",
			    cwi_errmsg_get());
	} else if (r->worker_policy == CWI_WORKERS_FIXED) {
		char spec[32];
		snprintf(spec, sizeof(spec), "fixed:%" PRIu32, r->num_workers);
		if (cwi_scale_parse(c, spec) != CACHEW_OK)
			return cwi_fail(CACHEW_EINVAL, "num_workers: %s",
			    cwi_errmsg_get());
	}
	if (r->min_workers > 0)
		c->min_workers = r->min_workers;
	if (r->max_workers > 0)
		c->max_workers = r->max_workers;
	if (c->min_workers > c->max_workers)
		return cwi_fail(CACHEW_EINVAL, "min_workers %" PRIu32 " is "
		    "larger than max_workers %" PRIu32, c->min_workers,
		    c->max_workers);
	if (!isfinite(r->weight) || r->weight < 0 || r->weight > 1e6)
		return cwi_fail(CACHEW_EINVAL, "weight %g is not in (0, 1e6]",
		    r->weight);
	return CACHEW_OK;
}

/* The previous pass of a named job, finished, still holding a scaler
 * with the same policy: its scaler carries on into the next pass. */
static job *
previous_pass(const cwi_dispatcher *d, const job *j)
{
	job *best = NULL;

	if (j->name == NULL)
		return NULL;
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *p = JOB(d, i);
		if (p != j && p->finished && p->sizing.scaler != NULL &&
		    p->name != NULL && strcmp(p->name, j->name) == 0 &&
		    p->iteration < j->iteration &&
		    strcmp(p->sizing.scale_name, j->sizing.scale_name) == 0)
			best = p; /* the newest */
	}
	return best;
}

/* Where a new job's scaler starts. Cachew's rule starts at one worker;
 * "model" and "hpa" start with the workers that are there (the scaler
 * clamps to its bounds): idle workers of a static pool cost nothing, and
 * the model measures from them how busy each one is (a surplus stalls on
 * full queues) and sheds what the demand does not need. With no worker
 * yet (a provisioner starts them) that is one. */
static uint32_t
initial_workers(const cwi_dispatcher *d, const cwi_scale_config *c)
{
	uint32_t n = cwi_disp_workers_available(d);

	switch (c->kind) {
	case CWI_SCALE_FIXED:
		return c->fixed;
	case CWI_SCALE_CACHEW:
		return 1;
	default:
		return n > 0 ? n : 1;
	}
}

/* The cache mode changed from the previous pass: carry the worker count
 * over scaled by the new mode's expected pass time over the old one's (a
 * pass that reads a cache in a tenth of the time needs about a tenth of
 * the workers to keep its consumer fed). Cachew's own rule restarts at
 * one worker instead (cwi_scaler_reset). */
static void
carry_scaled(job *j)
{
	double n = ceil((double)cwi_scaler_target(j->sizing.scaler) *
	    j->pass.worker_scale);
	uint32_t workers = n < 1 ? 1 : n > 65536 ? 65536 : (uint32_t)n;

	cwi_scaler_reset(j->sizing.scaler, workers);
	snprintf(j->sizing.reason, sizeof(j->sizing.reason),
	    "cache mode %s: %u workers carried over (x%.2f)",
	    j->pass.cache_mode, cwi_scaler_target(j->sizing.scaler),
	    j->pass.worker_scale);
}

/* Gives a new job its scaler (autoscale on). */
cachew_err
cwi_sizing_init(cwi_dispatcher *d, job *j, const cwi_msg_job_get_or_create *r)
{
	cwi_scale_config c;
	job *prev;
	cachew_err rv;

	rv = cwi_sizing_check(d, r, &c);
	if (rv != CACHEW_OK)
		return rv;
	cwi_scale_name(&c, j->sizing.scale_name, sizeof(j->sizing.scale_name));
	j->sizing.weight = r->weight > 0 ? r->weight : 1.0;
	j->sizing.epoch_start = true;
	j->sizing.sample_ns = d->now;
	prev = previous_pass(d, j);
	if (prev != NULL) {
		j->sizing.scaler = prev->sizing.scaler;
		prev->sizing.scaler = NULL;
		j->sizing.settled = prev->sizing.settled;
		snprintf(j->sizing.reason, sizeof(j->sizing.reason), "%s",
		    prev->sizing.reason);
		if (j->pass.worker_scale > 0 &&
		    strcmp(j->pass.cache_mode, prev->pass.cache_mode) != 0)
			carry_scaled(j);
	} else {
		rv = cwi_scaler_create(&j->sizing.scaler, &c,
		    initial_workers(d, &c));
		if (rv != CACHEW_OK)
			return rv;
		snprintf(j->sizing.reason, sizeof(j->sizing.reason), "new job");
	}
	j->sizing.want = cwi_scaler_target(j->sizing.scaler);
	j->sizing.count_fn = NULL;
	j->sizing.count_ctx = NULL;
	return CACHEW_OK;
}

/* ---- samples for plots --------------------------------------------------- */

void
cwi_dispatcher_sample_jobs(cwi_dispatcher *d, uint64_t now)
{
	uint32_t avail;

	d->now = now;
	if (!cwi_disp_events_on(d) || now < d->next_sample_ns)
		return;
	d->next_sample_ns = now + CWI_DISP_SAMPLE_NS;
	avail = cwi_disp_workers_available(d);
	d->ev_hold = true;
	for (size_t i = 0; i < d->jobs.n; i++) {
		const job *j = JOB(d, i);
		cwi_job_view v;

		if (j->finished)
			continue;
		cwi_sizing_job_view(d, j, avail, &v);
		cwi_disp_ev_begin(d, "job_sample");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_u64(d, "tasks", v.tasks);
		if (j->sizing.scale_name[0] != '\0') {
			cwi_disp_ev_u64(d, "want", j->sizing.want);
			cwi_disp_ev_u64(d, "granted", j->sizing.granted);
		}
		cwi_disp_ev_u64(d, "elements", j->elements);
		cwi_strbuf_printf(&d->ev, ",\"elements_per_s\":%.1f,"
		    "\"client_wait\":%.4f", v.elements_per_s,
		    cwi_job_client_wait(j));
		if (j->pass.cache_mode[0] != '\0')
			cwi_disp_ev_str(d, "cache_mode", j->pass.cache_mode);
		cwi_disp_ev_end(d);
	}
	d->ev_hold = false;
	if (d->cfg.event_file != NULL)
		fflush(d->cfg.event_file);
}
