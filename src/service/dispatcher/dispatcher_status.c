/*
 * dispatcher_status.c - snapshots of the state for readers outside it: the
 * status reply (workers, jobs, datasets and tasks, in id order) and a
 * task's last counters for the policy engine (a job's operator rows for
 * its clients are dispatcher_counters.c's). It owns no state and changes
 * none: every
 * function here only copies out (the reply owns its copies), so a status
 * call cannot move a job.
 */
#include "dispatcher_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- the status reply ---------------------------------------------------- */

static cachew_err
status_workers(const cwi_dispatcher *d, uint64_t now, cwi_msg_status_reply *rep)
{
	if (d->workers.n == 0)
		return CACHEW_OK;
	rep->workers = calloc(d->workers.n, sizeof(*rep->workers));
	if (rep->workers == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->workers.n; i++) {
		const worker *w = WORKER(d, i);
		cwi_worker_status *ws = &rep->workers[rep->nworkers++];
		ws->worker_id = w->id;
		ws->cores = w->cores;
		ws->draining = w->draining;
		ws->heartbeat_age_ms = now > w->last_seen_ns
		    ? (now - w->last_seen_ns) / NS_PER_MS
		    : 0;
		ws->cpu_use = w->cpu_use;
		ws->tasks = w->ntasks;
		if ((ws->address = cwi_strdup(w->address)) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

/* The policy engine's and autocaching's part of a job's status. */
static cachew_err
status_job_decisions(const job *j, cwi_job_status *js)
{
	if (j->sizing.scale_name[0] != '\0') {
		js->weight = j->sizing.weight;
		js->want = j->sizing.want;
		js->granted = j->sizing.granted;
		js->settled = j->sizing.settled;
		js->scale_policy = cwi_strdup(j->sizing.scale_name);
		js->reason = cwi_strdup(j->sizing.reason);
		if (js->scale_policy == NULL || js->reason == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if (j->pass.cache_mode[0] != '\0') {
		js->cache_mode = cwi_strdup(j->pass.cache_mode);
		js->cache_reason = cwi_strdup(j->pass.cache_reason);
		if (js->cache_mode == NULL || js->cache_reason == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

/* The mean share of time its clients spent waiting for data, over those
 * that reported batches or waits. */
double
cwi_job_client_wait(const job *j)
{
	double sum = 0;
	size_t n = 0;

	for (size_t i = 0; i < j->nclients; i++) {
		const client *c = &j->clients[i];
		if (c->batch_time_ns == 0 && c->wait_time_ns == 0)
			continue;
		sum += c->wait_fraction;
		n++;
	}
	return n > 0 ? sum / (double)n : 0;
}

static cachew_err
status_job(const cwi_dispatcher *d, const job *j, cwi_job_status *js)
{
	cwi_job_view v;
	cachew_err rv;

	cwi_sizing_job_view(d, j, cwi_disp_workers_available(d), &v);
	js->job_id = j->id;
	js->iteration = j->iteration;
	js->dataset_id = j->ds->id;
	js->processing_mode = j->mode;
	js->num_consumers = j->num_consumers;
	js->clients = (uint32_t)j->nclients;
	js->tasks = v.tasks;
	js->target_workers = j->sizing.target;
	js->units_per_split = j->ledger.units_per_split;
	js->splits_total = j->ledger.nsplits;
	js->splits_pending = j->ledger.npending;
	js->splits_leased = j->ledger.nleased;
	js->splits_acked = j->ledger.nacked;
	js->elements = j->elements;
	js->bytes = j->bytes;
	js->elements_per_s = v.elements_per_s;
	for (size_t k = 0; k < j->tasks.n; k++)
		js->bytes_per_s += OWN_TASK(j, k)->bytes_per_s;
	js->batch_time_ns = v.batch_time_ns;
	js->client_wait = cwi_job_client_wait(j);
	js->data_done = j->data_done;
	js->finished = j->finished;
	rv = status_job_decisions(j, js);
	if (rv == CACHEW_OK)
		rv = cwi_counters_job_summary(j, &js->slowest_op,
		    &js->slowest_op_share, &js->cache_hit_bytes);
	if (rv != CACHEW_OK)
		return rv;
	if (j->name != NULL && (js->name = cwi_strdup(j->name)) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

static cachew_err
status_jobs(const cwi_dispatcher *d, cwi_msg_status_reply *rep)
{
	if (d->jobs.n == 0)
		return CACHEW_OK;
	rep->jobs = calloc(d->jobs.n, sizeof(*rep->jobs));
	if (rep->jobs == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->jobs.n; i++) {
		cachew_err rv = status_job(d, JOB(d, i),
		    &rep->jobs[rep->njobs++]);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

static cachew_err
status_datasets(const cwi_dispatcher *d, cwi_msg_status_reply *rep)
{
	if (d->datasets.n > 0) {
		rep->datasets = calloc(d->datasets.n, sizeof(*rep->datasets));
		if (rep->datasets == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < d->datasets.n; i++) {
		cwi_dataset_status *s = &rep->datasets[rep->ndatasets++];
		s->dataset_id = DATASET(d, i)->id;
		s->fingerprint = DATASET(d, i)->fp;
		s->split_units = DATASET(d, i)->split_units;
		s->splittable = DATASET(d, i)->splittable;
	}
	return CACHEW_OK;
}

static cachew_err
status_tasks(const cwi_dispatcher *d, cwi_msg_status_reply *rep)
{
	if (d->tasks.n > 0) {
		rep->tasks = calloc(d->tasks.n, sizeof(*rep->tasks));
		if (rep->tasks == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		cwi_task_status *s = &rep->tasks[rep->ntasks++];
		s->task_id = t->id;
		s->job_id = t->job->id;
		s->worker_id = t->w->id;
		s->state = t->state;
		s->splits_leased = t->nleased;
		s->elements = t->elements;
		s->bytes = t->bytes;
		s->elements_per_s = t->elements_per_s;
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_status(cwi_dispatcher *d, uint64_t now_ns,
    cwi_msg_status_reply *rep)
{
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_STATUS_REPLY, rep);
	rep->time_ns = now_ns;
	rep->lineage = d->lineage;
	rep->incarnation = d->incarnation;
	if (d->cfg.autoscale)
		rep->pool_target = d->pool_target;
	rv = status_workers(d, now_ns, rep);
	if (rv == CACHEW_OK)
		rv = status_jobs(d, rep);
	if (rv == CACHEW_OK)
		rv = status_datasets(d, rep);
	if (rv == CACHEW_OK)
		rv = status_tasks(d, rep);
	return rv;
}

/* ---- counters ------------------------------------------------------------ */

cachew_err
cwi_dispatcher_task_ops(const cwi_dispatcher *d, uint64_t task_id,
    const cwi_op_counters **ops, size_t *nops)
{
	const task *t = cwi_disp_find_task(d, task_id);

	if (t == NULL)
		return cwi_fail(CACHEW_ENOENT,
		    "task %" PRIu64 " is not running", task_id);
	*ops = t->ops;
	*nops = t->nops;
	return CACHEW_OK;
}

/* ---- what /metrics adds -------------------------------------------------- */

cachew_err
cwi_dispatcher_metrics_get(const cwi_dispatcher *d, cwi_dispatcher_metrics *m)
{
	memset(m, 0, sizeof(*m));
	memcpy(m->scale, d->scale_tally, sizeof(m->scale));
	m->nscale = d->nscale_tally;
	if (d->jobs.n == 0)
		return CACHEW_OK;
	m->jobs = calloc(d->jobs.n, sizeof(*m->jobs));
	if (m->jobs == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->jobs.n; i++) {
		cwi_msg_client_heartbeat_reply rows;
		cachew_err rv;

		memset(&rows, 0, sizeof(rows));
		rv = cwi_counters_job_ops(JOB(d, i), &rows);
		m->jobs[m->njobs].job_id = JOB(d, i)->id;
		m->jobs[m->njobs].ops = rows.ops;
		m->jobs[m->njobs++].nops = rows.nops;
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

void
cwi_dispatcher_metrics_free(cwi_dispatcher_metrics *m)
{
	for (size_t i = 0; i < m->njobs; i++) {
		for (size_t k = 0; k < m->jobs[i].nops; k++)
			free(m->jobs[i].ops[k].name);
		free(m->jobs[i].ops);
	}
	free(m->jobs);
	m->jobs = NULL;
	m->njobs = 0;
}
