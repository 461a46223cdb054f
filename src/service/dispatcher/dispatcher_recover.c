/*
 * dispatcher_recover.c - exactly-once delivery in an uncoordinated
 * distributed_epoch job (docs/protocol.md, "Exactly once").
 *
 * A group (the splits of one lease, dispatcher_ledger.c lease_group)
 * yields the same elements, numbered from 0, wherever it runs. When the
 * task reading a group goes before every client acknowledged it (its
 * worker died, or was only slow and declared dead; a client could not read
 * it; it deregistered), some of the group's elements may have reached
 * clients and the rest not. Its groups then wait in RECOVERING while every
 * client that was in the job stops reading the task (stop_tasks in its
 * heartbeat reply) and reports what it received of each group
 * (progress): only then can no more of the old task's elements arrive
 * anywhere. A group whose reports cover every element is acknowledged;
 * any other goes back to the front of the pool with the reported ranges
 * as its `skip`, and the worker that replays it leaves them out.
 */
#include "dispatcher_int.h"

#include <inttypes.h>
#include <stdlib.h>

static recovery *
find_recovery(job *j, uint64_t task_id)
{
	for (size_t i = 0; i < j->nrecovs; i++)
		if (j->recovs[i].task_id == task_id)
			return &j->recovs[i];
	return NULL;
}

/* The groups of a recovery are settled: acknowledged when the reports
 * cover them, else pending at the front of the pool (ascending). */
static void
recovery_finish(cwi_dispatcher *d, job *j, recovery *r)
{
	struct split_ledger *l = &j->ledger;
	uint64_t task_id = r->task_id, nacked = 0, nreleased = 0;

	free(r->await);
	*r = j->recovs[--j->nrecovs];
	for (uint64_t k = l->nsplits; k-- > 0;) {
		split *s = &l->splits[k];
		const split *g;
		if (s->state != SPLIT_RECOVERING || s->recov_task != task_id)
			continue;
		g = &l->splits[s->group != NO_GROUP ? s->group : k];
		l->nrecovering--;
		s->recov_task = 0;
		if (g->total_known && cwi_rset_covers(&g->skip, 0, g->total)) {
			s->state = SPLIT_ACKED;
			free(s->ackers);
			s->ackers = NULL;
			s->ackers_cap = 0;
			l->nacked++;
			nacked++;
		} else {
			s->state = SPLIT_PENDING;
			l->npending++;
			/* Backwards: the pool's front ends up ascending. */
			l->ring_head = (l->ring_head + l->nsplits - 1) %
			    l->nsplits;
			l->ring[l->ring_head] = k;
			l->ring_len++;
			nreleased++;
		}
	}
	cwi_disp_ev_begin(d, "split_recovered");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_u64(d, "task_id", task_id);
	cwi_disp_ev_u64(d, "released", nreleased);
	cwi_disp_ev_u64(d, "acked", nacked);
	cwi_disp_ev_end(d);
	if (nacked > 0)
		cwi_disp_epoch_check(d, j);
}

void
cwi_recover_task_gone(cwi_dispatcher *d, job *j, const task *t)
{
	struct split_ledger *l = &j->ledger;
	recovery *r;
	uint64_t n = 0;

	if (!j->exactly_once || l->splits == NULL || t->nleased == 0)
		return;
	if (!CWI_GROW(j->recovs, j->caprecovs, j->nrecovs + 1))
		return; /* they stay with the gone task: orphans */
	r = &j->recovs[j->nrecovs];
	memset(r, 0, sizeof(*r));
	r->task_id = t->id;
	/* ENOMEM: waiting for nobody, the groups go back at once with what
	 * was reported before (repeats, not losses, and no hang). */
	if (j->nclients > 0 &&
	    (r->await = malloc(j->nclients * sizeof(*r->await))) != NULL) {
		for (size_t i = 0; i < j->nclients; i++)
			r->await[i] = j->clients[i].id;
		r->nawait = j->nclients;
	}
	j->nrecovs++;
	for (uint64_t k = 0; k < l->nsplits; k++) {
		split *s = &l->splits[k];
		if (s->state != SPLIT_LEASED || s->task_id != t->id)
			continue;
		s->state = SPLIT_RECOVERING;
		s->recov_task = t->id;
		s->task_id = 0;
		s->worker_id = 0;
		s->delivered = false;
		l->nleased--;
		l->nrecovering++;
		n++;
	}
	cwi_disp_task_event(d, "split_recovering", t);
	cwi_disp_ev_u64(d, "splits", n);
	cwi_disp_ev_u64(d, "clients", r->nawait);
	cwi_disp_ev_end(d);
	if (r->nawait == 0)
		recovery_finish(d, j, r);
}

/* LEASED -> ACKED without an acknowledgement (its parts were credited). */
static void
split_done(cwi_dispatcher *d, struct split_ledger *l, split *s)
{
	task *t = s->task_id != 0 ? cwi_disp_find_task(d, s->task_id) : NULL;

	if (t != NULL && t->nleased > 0)
		t->nleased--;
	s->state = SPLIT_ACKED;
	s->task_id = 0;
	free(s->ackers);
	s->ackers = NULL;
	s->ackers_cap = 0;
	s->part_acks = 0;
	l->nleased--;
	l->nacked++;
}

/* Client client_id reported on recovery r (or left). */
static void
recovery_heard(cwi_dispatcher *d, job *j, recovery *r, uint64_t client_id)
{
	for (size_t i = 0; i < r->nawait; i++) {
		if (r->await[i] != client_id)
			continue;
		r->await[i] = r->await[--r->nawait];
		if (r->nawait == 0)
			recovery_finish(d, j, r);
		return;
	}
}

void
cwi_recover_client_gone(cwi_dispatcher *d, job *j, uint64_t client_id)
{
	struct split_ledger *l = &j->ledger;

	if (!j->exactly_once)
		return;
	for (size_t i = j->nrecovs; i-- > 0;)
		if (i < j->nrecovs)
			recovery_heard(d, j, &j->recovs[i], client_id);
	/* A split read in parts by several clients waits for each part's
	 * acknowledgement, and the leaver's will not come: what it received
	 * went to it. Each split leased now is credited one part (the
	 * leaver may have read it); one whose acks then suffice is done,
	 * and one that nobody acknowledges within the grace after its
	 * delivery (the leaver read all of it) is done then
	 * (cwi_recover_tick). */
	for (uint64_t k = 0; l->splits != NULL && k < l->nsplits; k++) {
		split *s = &l->splits[k];
		bool mine = false;
		if (s->state != SPLIT_LEASED)
			continue;
		for (uint32_t a = 0; a < s->part_acks; a++)
			mine |= s->ackers[a] == client_id;
		if (mine)
			continue;
		s->credits++;
		s->orphan_ns = d->now;
		l->orphan_hint++;
		if (s->parts_need > 0 &&
		    s->part_acks + s->credits >= s->parts_need)
			split_done(d, l, s);
	}
	cwi_disp_epoch_check(d, j);
}

void
cwi_recover_tick(cwi_dispatcher *d, job *j, uint64_t grace)
{
	struct split_ledger *l = &j->ledger;
	bool any = false;

	if (!j->exactly_once || l->splits == NULL || d->now < grace)
		return;
	for (uint64_t k = 0; k < l->nsplits; k++) {
		split *s = &l->splits[k];
		if (s->state == SPLIT_LEASED && s->credits > 0 &&
		    s->delivered && s->part_acks == 0 &&
		    s->orphan_ns < d->now - grace) {
			split_done(d, l, s);
			any = true;
		}
	}
	if (any)
		cwi_disp_epoch_check(d, j);
}

cachew_err
cwi_recover_check(const job *j, const cwi_msg_client_heartbeat *req)
{
	for (size_t i = 0; i < req->nprogress; i++) {
		const cwi_progress *p = &req->progress[i];
		if (!j->exactly_once)
			return cwi_fail(CACHEW_EINVAL, "job %" PRIu64 " is not "
			    "exactly-once: no progress expected", j->id);
		if (p->group >= j->ledger.nsplits)
			return cwi_fail(CACHEW_EINVAL, "progress: group %" PRIu64
			    " is out of range: job %" PRIu64 " has %" PRIu64
			    " splits", p->group, j->id, j->ledger.nsplits);
		if (!cwi_rset_list_ok(p->ranges, p->nranges))
			return cwi_fail(CACHEW_EINVAL, "progress: the ranges "
			    "of group %" PRIu64 " are not ascending, disjoint "
			    "[from, to) pairs", p->group);
		if (p->ended && p->nranges > 0 &&
		    p->ranges[p->nranges - 1] > p->total)
			return cwi_fail(CACHEW_EINVAL, "progress: group %" PRIu64
			    " has %" PRIu64 " elements, yet element %" PRIu64
			    " was received", p->group, p->total,
			    p->ranges[p->nranges - 1] - 1);
	}
	return CACHEW_OK;
}

void
cwi_recover_report(cwi_dispatcher *d, job *j, const client *c,
    const cwi_msg_client_heartbeat *req)
{
	struct split_ledger *l = &j->ledger;
	bool dropped = false;

	for (size_t i = 0; i < req->nfailed_tasks; i++) {
		task *t = cwi_disp_find_task(d, req->failed_tasks[i]);
		if (t == NULL || t->job != j)
			continue;
		cwi_disp_task_drop(d, t, "client_failed");
		dropped = true;
	}
	if (dropped)
		cwi_disp_reconcile(d);
	if (!j->exactly_once || l->splits == NULL)
		return;
	for (size_t i = 0; i < req->nprogress; i++) {
		const cwi_progress *p = &req->progress[i];
		split *s = &l->splits[p->group];
		if (s->state != SPLIT_RECOVERING || s->group != p->group)
			continue;
		/* ENOMEM: the ranges not merged come again (repeats, not
		 * losses). */
		(void)cwi_rset_add_list(&s->skip, p->ranges, p->nranges);
		if (p->ended) {
			s->total_known = true;
			s->total = p->total;
		}
	}
	for (size_t i = 0; i < req->nstopped_tasks; i++) {
		recovery *r = find_recovery(j, req->stopped_tasks[i]);
		if (r != NULL)
			recovery_heard(d, j, r, c->id);
	}
}

cachew_err
cwi_recover_stop_list(const job *j, const client *c,
    cwi_msg_client_heartbeat_reply *rep)
{
	size_t n = 0;

	for (size_t i = 0; i < j->nrecovs; i++)
		for (size_t k = 0; k < j->recovs[i].nawait; k++)
			if (j->recovs[i].await[k] == c->id)
				n++;
	if (n == 0)
		return CACHEW_OK;
	rep->stop_tasks = malloc(n * sizeof(*rep->stop_tasks));
	if (rep->stop_tasks == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < j->nrecovs; i++)
		for (size_t k = 0; k < j->recovs[i].nawait; k++)
			if (j->recovs[i].await[k] == c->id)
				rep->stop_tasks[rep->nstop_tasks++] =
				    j->recovs[i].task_id;
	return CACHEW_OK;
}

void
cwi_recover_free(job *j)
{
	for (size_t i = 0; i < j->nrecovs; i++)
		free(j->recovs[i].await);
	free(j->recovs);
	j->recovs = NULL;
	j->nrecovs = 0;
	j->caprecovs = 0;
}
