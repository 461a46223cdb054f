/*
 * dispatcher_coord.c - coordinated reads (num_consumers > 0): a job's round
 * schedule (struct coord_schedule, and each task's start and end round).
 *
 * What it owns: every consumer reads round r from the same task, the
 * (r mod n)-th of the n tasks serving r in task id order (tf.data
 * service's round-robin reads), so all consumers must agree on the
 * schedule at every round. A task joins or leaves it only at a round
 * announced to every consumer first (block_round) and acknowledged by
 * each, or at once when nobody can be reading. The client's side of the
 * same rule is client_coord.c.
 */
#include "dispatcher_int.h"

#include <stdlib.h>

/* ---- the schedule -------------------------------------------------------- */

/* Whether a change to the job's schedule can take effect at once because
 * nobody can be reading from it: no client has seen a task list yet, or
 * no task serves now or later (changes still pending do not count). */
static bool
schedule_empty(const job *j)
{
	if (!j->coord.published)
		return true;
	for (size_t i = 0; i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		if (t->start_round != CWI_ROUND_NONE &&
		    t->end_round == CWI_ROUND_NONE)
			return false;
	}
	return true;
}

static uint64_t
consumer_round(const job *j, bool max)
{
	uint64_t r = max ? 0 : UINT64_MAX;

	for (size_t i = 0; i < j->nclients; i++) {
		uint64_t c = j->clients[i].round;
		if (max ? c > r : c < r)
			r = c;
	}
	return j->nclients == 0 ? 0 : r;
}

/* A new task of coordinated job j: nobody can be reading from an empty
 * schedule, so it joins at once, at the round the slowest consumer waits
 * for; otherwise at a round announced to every consumer first (the caller
 * announces it: cwi_sched_open). */
void
cwi_sched_place(task *t)
{
	if (schedule_empty(t->job)) {
		t->start_round = consumer_round(t->job, false);
	} else {
		t->state = CWI_TASK_STARTING;
		t->start_round = CWI_ROUND_NONE;
	}
}

/* Announces a schedule change: it will happen at coord_target, which every
 * consumer is told (block_round) and must acknowledge first. */
void
cwi_sched_open(cwi_dispatcher *d, job *j)
{
	if (j->coord.target != CWI_ROUND_NONE)
		return;
	j->coord.target = consumer_round(j, true) + d->cfg.coord_round_margin;
	for (size_t i = 0; i < j->nclients; i++)
		j->clients[i].ready = false;
	cwi_disp_ev_begin(d, "schedule_change_announced");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_u64(d, "round", j->coord.target);
	cwi_disp_ev_end(d);
}

/* ---- changes ------------------------------------------------------------- */

static void
coord_commit(cwi_dispatcher *d, job *j, uint64_t round)
{
	uint64_t *started = NULL, *ended = NULL;
	size_t ns = 0, ne = 0;

	if (cwi_disp_events_on(d)) {
		started = malloc((j->tasks.n + 1) * sizeof(*started));
		ended = malloc((j->tasks.n + 1) * sizeof(*ended));
	}
	for (size_t i = 0; i < j->tasks.n; i++) {
		task *t = OWN_TASK(j, i);
		if (t->state == CWI_TASK_STARTING) {
			t->state = CWI_TASK_ACTIVE;
			t->start_round = round;
			if (started != NULL)
				started[ns] = t->id;
			ns++;
		} else if (t->state == CWI_TASK_REMOVING &&
		    t->end_round == CWI_ROUND_NONE) {
			t->end_round = round;
			if (ended != NULL)
				ended[ne] = t->id;
			ne++;
		}
	}
	j->coord.target = CWI_ROUND_NONE;
	if (started != NULL && ended != NULL) {
		cwi_disp_ev_begin(d, "schedule_changed");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_u64(d, "round", round);
		cwi_disp_ev_ids(d, "started", started, ns);
		cwi_disp_ev_ids(d, "ended", ended, ne);
		cwi_disp_ev_end(d);
	}
	free(started);
	free(ended);
}

/* Commits the pending change once every consumer acknowledged its round;
 * at once when nobody can be reading (no consumers, or an empty
 * schedule). Then drops ended tasks every consumer has read past. */
void
cwi_sched_update(cwi_dispatcher *d, job *j)
{
	if (!job_coordinated(j) || j->finished)
		return;
	if (j->coord.target != CWI_ROUND_NONE) {
		bool all = true;
		for (size_t i = 0; i < j->nclients; i++)
			all = all && j->clients[i].ready;
		if (j->nclients == 0 || schedule_empty(j))
			coord_commit(d, j, consumer_round(j, false));
		else if (all)
			coord_commit(d, j, j->coord.target);
	}
	for (size_t i = 0; i < j->tasks.n;) {
		task *t = OWN_TASK(j, i);
		if (t->state == CWI_TASK_REMOVING &&
		    t->end_round != CWI_ROUND_NONE &&
		    (j->nclients == 0 ||
			consumer_round(j, false) >= t->end_round)) {
			/* Its rounds are read: what it leased and nobody
			 * acknowledged will never be read from it. */
			cwi_ledger_release_task(d, j, t);
			cwi_disp_task_drop(d, t, "removed");
			continue;
		}
		i++;
	}
}

/* Coordinated reads: a consumer reporting its round either acknowledges
 * the announced change (it was told the round and has not read it: the
 * next round it reads is at most that one) or has already read past it,
 * which moves the change further out. A consumer waiting at the round
 * itself reports exactly it: that is an acknowledgement, or the change
 * would move away from every consumer that keeps up. */
void
cwi_sched_heartbeat(cwi_dispatcher *d, job *j, client *c)
{
	if (j->coord.target == CWI_ROUND_NONE)
		return;
	if (c->round > j->coord.target) {
		j->coord.target = CWI_ROUND_NONE;
		cwi_sched_open(d, j);
		return;
	}
	if (c->told_target == j->coord.target)
		c->ready = true;
}
