/*
 * dispatcher_pass.c - autocaching passes in the state machine (struct
 * job_pass): the planner (dispatcher_autocache.c) does I/O and runs
 * outside the caller's lock, so the state machine only carries its plans.
 *
 * What it owns: a pass's plan goes to exactly one job (the next one
 * created that can take it), and its end is queued exactly once, when the
 * job's data is done or the job ends before that, with the counters of the
 * tasks that ran it; the planner's ctx is freed by whoever holds it last.
 */
#include "dispatcher_int.h"

#include <stdlib.h>

/* ---- offers and the jobs that take them ---------------------------------- */

bool
cwi_dispatcher_job_wants_pass(const cwi_dispatcher *d,
    const cwi_msg_job_get_or_create *req, uint8_t **graph, size_t *len,
    uint64_t *units)
{
	const dataset *ds = cwi_disp_find_dataset(d, req->dataset_id);

	*graph = NULL;
	*len = 0;
	*units = 0;
	/* A resumed job continues a saved epoch: a pass would cache (or
	 * profile) the part of it that is left. */
	if (ds == NULL || req->processing_mode != CWI_MODE_DISTRIBUTED_EPOCH ||
	    !ds->splittable || ds->graph_len == 0 ||
	    req->resume_units_per_split != 0 || req->nresume > 0)
		return false;
	if (req->job_name != NULL &&
	    cwi_disp_find_named_job(d, req->job_name, req->iteration) != NULL)
		return false;
	*graph = malloc(ds->graph_len);
	if (*graph == NULL)
		return false;
	memcpy(*graph, ds->graph, ds->graph_len);
	*len = ds->graph_len;
	*units = ds->split_units;
	return true;
}

void
cwi_dispatcher_offer_pass(cwi_dispatcher *d, cwi_job_pass *p)
{
	d->offered = p;
}

/* Job j (distributed_epoch, being created) takes the pass on offer, if
 * there is one with a plan. */
void
cwi_pass_take(cwi_dispatcher *d, job *j)
{
	cwi_job_pass *p = d->offered;

	if (p == NULL || p->graph == NULL)
		return;
	j->pass.graph = p->graph;
	j->pass.graph_len = p->graph_len;
	j->pass.units = p->units;
	j->pass.worker_scale = p->worker_scale;
	j->pass.ctx = p->ctx;
	snprintf(j->pass.cache_mode, sizeof(j->pass.cache_mode), "%s",
	    p->mode);
	snprintf(j->pass.cache_reason, sizeof(j->pass.cache_reason), "%s",
	    p->event);
	p->graph = NULL;
	p->ctx = NULL;
	d->offered = NULL;
}

void
cwi_dispatcher_autocache_event(cwi_dispatcher *d, uint64_t now_ns,
    uint64_t job_id, const char *mode, const char *text)
{
	job *j = cwi_disp_find_job(d, job_id);

	d->now = now_ns;
	if (j == NULL)
		return;
	if (mode != NULL)
		snprintf(j->pass.cache_mode, sizeof(j->pass.cache_mode), "%s",
		    mode);
	snprintf(j->pass.cache_reason, sizeof(j->pass.cache_reason), "%s",
	    text);
	cwi_disp_ev_begin(d, "autocache");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_str(d, "cache_mode", j->pass.cache_mode);
	cwi_disp_ev_str(d, "cache", text);
	cwi_disp_ev_end(d);
}

/* ---- ends ---------------------------------------------------------------- */

/* Queues the end of a job's autocaching pass with its tasks' counters.
 * Out of memory: the planner never hears of it (its ctx is freed), which
 * only costs what the pass would have taught it. */
void
cwi_pass_finish(cwi_dispatcher *d, job *j, bool complete)
{
	cwi_pass_end *pe;
	size_t nops = 0;

	if (j->pass.graph == NULL || j->pass.ended)
		return;
	/* Ended whether or not a planner waits for it (one recovered from
	 * the journal has none): the state is the same either way. */
	j->pass.ended = true;
	if (j->pass.ctx == NULL)
		return;
	if (d->npass_ends == d->cappass_ends) {
		size_t cap = d->cappass_ends ? 2 * d->cappass_ends : 4;
		cwi_pass_end *v = realloc(d->pass_ends, cap * sizeof(*v));
		if (v == NULL)
			goto oom;
		d->pass_ends = v;
		d->cappass_ends = cap;
	}
	pe = &d->pass_ends[d->npass_ends];
	memset(pe, 0, sizeof(*pe));
	pe->job_id = j->id;
	pe->complete = complete;
	for (size_t i = 0; i < j->tasks.n; i++)
		nops += OWN_TASK(j, i)->nops;
	pe->ops = calloc(nops + 1, sizeof(*pe->ops));
	if (pe->ops == NULL)
		goto oom;
	for (size_t i = 0; i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		pe->workers++;
		for (size_t k = 0; k < t->nops; k++) {
			cwi_op_counters *c = &pe->ops[pe->nops];
			*c = t->ops[k];
			c->name = cwi_strdup(t->ops[k].name);
			if (c->name == NULL) {
				for (size_t m = 0; m < pe->nops; m++)
					free(pe->ops[m].name);
				free(pe->ops);
				goto oom;
			}
			pe->nops++;
		}
	}
	pe->ctx = j->pass.ctx;
	j->pass.ctx = NULL;
	d->npass_ends++;
	return;
oom:
	if (d->cfg.pass_free != NULL)
		d->cfg.pass_free(j->pass.ctx);
	j->pass.ctx = NULL;
}

size_t
cwi_dispatcher_take_pass_ends(cwi_dispatcher *d, cwi_pass_end **out)
{
	size_t n = d->npass_ends;

	*out = d->pass_ends;
	d->pass_ends = NULL;
	d->npass_ends = d->cappass_ends = 0;
	return n;
}

void
cwi_dispatcher_pass_ends_free(cwi_pass_end *v, size_t n)
{
	for (size_t i = 0; v != NULL && i < n; i++) {
		for (size_t k = 0; k < v[i].nops; k++)
			free(v[i].ops[k].name);
		free(v[i].ops);
	}
	free(v);
}

void
cwi_pass_free(const cwi_dispatcher *d, job *j)
{
	free(j->pass.graph);
	if (j->pass.ctx != NULL && d->cfg.pass_free != NULL)
		d->cfg.pass_free(j->pass.ctx);
}

void
cwi_pass_ends_drop(cwi_dispatcher *d)
{
	for (size_t i = 0; i < d->npass_ends; i++)
		if (d->pass_ends[i].ctx != NULL && d->cfg.pass_free != NULL)
			d->cfg.pass_free(d->pass_ends[i].ctx);
	cwi_dispatcher_pass_ends_free(d->pass_ends, d->npass_ends);
	d->pass_ends = NULL;
	d->npass_ends = d->cappass_ends = 0;
}
