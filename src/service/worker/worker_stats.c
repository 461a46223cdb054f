/*
 * worker_stats.c - a task's operator counters. Each finished lease's rows
 * are added to the task's (cwi_wtask_add_stats); the worker reports the
 * sum in every heartbeat and, when a runner's lease ends, at once in a
 * task_counters message sent before the lease's end marker is queued. A
 * client acknowledges a split only after its lease's end reached it, and
 * a job's data is done only once every split is acknowledged, so by then
 * the dispatcher holds every finished lease's counters: the rows a client
 * fetches at the end of its epoch are exact, not a heartbeat's sample
 * (docs/protocol.md, "Operator counters"). A task_stats request gets the
 * finished leases' rows plus those of a direct task's live lease.
 *
 * Locking: t->lock guards ops, nops and ops_leases; a direct task's live
 * lease (pull_it) is read under pull_lock, which comes before t->lock.
 */
#include "worker_task_int.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- summing leases ------------------------------------------------------ */

/* Adds one lease's rows to the task's (t->lock held); the first lease
 * names them. Rows match by position: every lease runs the same graph. */
static void
rows_add(cwi_wtask *t, const cachew_op_stats *rows, size_t n)
{
	if (n == 0)
		return;
	if (t->ops == NULL) {
		t->ops = calloc(n, sizeof(*t->ops));
		if (t->ops == NULL)
			return; /* metrics only */
		t->nops = n;
		for (size_t i = 0; i < n; i++) {
			snprintf(t->ops[i].name, sizeof(t->ops[i].name), "%s",
			    rows[i].name != NULL ? rows[i].name : "");
			snprintf(t->ops[i].detail, sizeof(t->ops[i].detail),
			    "%s", rows[i].detail != NULL ? rows[i].detail : "");
			t->ops[i].s.node = rows[i].node;
		}
	}
	for (size_t i = 0; i < n && i < t->nops; i++) {
		cachew_op_stats *s = &t->ops[i].s;
		s->elements += rows[i].elements;
		s->bytes += rows[i].bytes;
		s->busy_ns += rows[i].busy_ns;
		s->dropped += rows[i].dropped;
		s->cache_hit_bytes += rows[i].cache_hit_bytes;
		s->wait_ns += rows[i].wait_ns;
		if (rows[i].parallelism > s->parallelism)
			s->parallelism = rows[i].parallelism;
		if (rows[i].buffer_limit > s->buffer_limit)
			s->buffer_limit = rows[i].buffer_limit;
		s->buffered = rows[i].buffered;
	}
	t->ops_leases++;
}

void
cwi_wtask_add_stats(cwi_wtask *t, cachew_iterator *it)
{
	cachew_op_stats rows[MAX_ROWS];
	size_t n = 0;

	if (cachew_iterator_stats(it, rows, MAX_ROWS, &n) != CACHEW_OK)
		return;
	if (n > MAX_ROWS)
		n = MAX_ROWS;
	pthread_mutex_lock(&t->lock);
	rows_add(t, rows, n);
	pthread_mutex_unlock(&t->lock);
}

void
cwi_wtask_stats_free(cwi_wtask *t)
{
	free(t->ops);
	t->ops = NULL;
	t->nops = 0;
}

/* ---- rows on the wire ---------------------------------------------------- */

/* The counters every op_counters carries. */
static void
counters_of(cwi_op_counters *c, const cachew_op_stats *s)
{
	c->elements = s->elements;
	c->bytes = s->bytes;
	c->busy_ns = s->busy_ns;
	c->dropped = s->dropped;
	c->cache_hit_bytes = s->cache_hit_bytes;
	c->wait_ns = s->wait_ns;
	c->buffered = s->buffered > 0 ? (uint64_t)s->buffered : 0;
	c->parallelism = s->parallelism;
	c->buffer_limit = s->buffer_limit;
}

/* A heartbeat's or task_counters' row: the name is its key across a job's
 * tasks, "<node>:<name>[/<detail>]". false on ENOMEM. */
static bool
report_row(cwi_op_counters *c, const task_row *r)
{
	char key[sizeof(r->name) + sizeof(r->detail) + 16];

	snprintf(key, sizeof(key), "%d:%s%s%s", r->s.node, r->name,
	    r->detail[0] != '\0' ? "/" : "", r->detail);
	counters_of(c, &r->s);
	c->name = cwi_strdup(key);
	return c->name != NULL;
}

/* The task's rows as report rows (t->lock held): *ops malloc'd, *nops
 * filled (those before a failure); false on ENOMEM. */
static bool
report_rows(const cwi_wtask *t, cwi_op_counters **ops, size_t *nops)
{
	*ops = NULL;
	*nops = 0;
	if (t->nops == 0)
		return true;
	*ops = calloc(t->nops, sizeof(**ops));
	if (*ops == NULL)
		return false;
	for (size_t i = 0; i < t->nops; i++) {
		if (!report_row(&(*ops)[i], &t->ops[i]))
			return false;
		(*nops)++;
	}
	return true;
}

bool
cwi_wtask_report_ops(const cwi_wtask *t, cwi_task_report *rep)
{
	rep->ops_leases = t->ops_leases;
	return report_rows(t, &rep->ops, &rep->nops);
}

void
cwi_wtask_send_counters(cwi_wtask *t)
{
	cwi_pmsg req, rep;
	cwi_msg_task_counters *m = &req.u.task_counters;
	cachew_err rv;
	bool ok;

	if (atomic_load(&t->stop))
		return; /* stopping: its clients are gone */
	cwi_pmsg_init(&req, CWI_MSG_TASK_COUNTERS);
	m->worker_id = t->env->worker_id;
	m->task_id = t->id;
	m->lineage = t->env->lineage;
	pthread_mutex_lock(&t->lock);
	m->ops_leases = t->ops_leases;
	ok = report_rows(t, &m->ops, &m->nops);
	pthread_mutex_unlock(&t->lock);
	ok = ok && cwi_pmsg_set_token(&req, t->env->token) == CACHEW_OK;
	rv = ok ? cwi_rpc_call(t->env->dispatcher, &req, CWI_MSG_OK,
		      (int)t->env->rpc_timeout_ms, &rep)
		: cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv == CACHEW_OK)
		cwi_pmsg_free(&rep);
	else
		cwi_log(CACHEW_LOG_DEBUG, "worker", "event=task_counters_lost "
		    "task=%llu error=\"%s\"", (unsigned long long)t->id,
		    cwi_errmsg_get());
	cwi_pmsg_free(&req);
}

/* ---- task_stats ---------------------------------------------------------- */

/* A task_stats row, with its name, detail and node. false on ENOMEM. */
static bool
stats_row(cwi_op_counters *c, const task_row *r)
{
	counters_of(c, &r->s);
	c->node = r->s.node;
	c->name = cwi_strdup(r->name);
	c->detail = cwi_strdup(r->detail);
	return c->name != NULL && c->detail != NULL;
}

/* Row i of the finished leases plus the live lease's row i, if any
 * (whose parallelism and buffer are the ones now). */
static task_row
row_now(const cwi_wtask *t, const cachew_op_stats *live, size_t nlive,
    size_t i)
{
	task_row r;

	memset(&r, 0, sizeof(r));
	if (i < t->nops)
		r = t->ops[i];
	if (i >= nlive)
		return r;
	if (i >= t->nops) {
		snprintf(r.name, sizeof(r.name), "%s",
		    live[i].name != NULL ? live[i].name : "");
		snprintf(r.detail, sizeof(r.detail), "%s",
		    live[i].detail != NULL ? live[i].detail : "");
		r.s.node = live[i].node;
	}
	r.s.elements += live[i].elements;
	r.s.bytes += live[i].bytes;
	r.s.busy_ns += live[i].busy_ns;
	r.s.dropped += live[i].dropped;
	r.s.cache_hit_bytes += live[i].cache_hit_bytes;
	r.s.wait_ns += live[i].wait_ns;
	r.s.parallelism = live[i].parallelism;
	r.s.buffer_limit = live[i].buffer_limit;
	r.s.buffered = live[i].buffered;
	return r;
}

/* The task's rows now (pull_lock held); false on ENOMEM. */
static bool
stats_rows(cwi_wtask *t, cwi_msg_task_stats_reply *rep)
{
	cachew_op_stats live[MAX_ROWS];
	size_t nlive = 0, n;
	bool ok = true;

	if (t->pull_it != NULL &&
	    cachew_iterator_stats(t->pull_it, live, MAX_ROWS, &nlive) !=
		CACHEW_OK)
		nlive = 0;
	if (nlive > MAX_ROWS)
		nlive = MAX_ROWS;
	pthread_mutex_lock(&t->lock);
	n = t->nops > nlive ? t->nops : nlive;
	if (n > 0 && (rep->ops = calloc(n, sizeof(*rep->ops))) == NULL)
		ok = false;
	for (size_t i = 0; ok && i < n; i++) {
		task_row r = row_now(t, live, nlive, i);
		ok = stats_row(&rep->ops[i], &r);
		rep->nops++;
	}
	pthread_mutex_unlock(&t->lock);
	return ok;
}

void
cwi_wtask_task_stats(cwi_wtask *t, cwi_request *r)
{
	cwi_pmsg rep;

	cwi_pmsg_init(&rep, CWI_MSG_TASK_STATS_REPLY);
	/* A call may run long (a slow pipeline): stats do not wait for it. */
	if (pthread_mutex_trylock(&t->pull_lock) != 0) {
		rep.u.task_stats_reply.busy = true;
	} else {
		bool ok = stats_rows(t, &rep.u.task_stats_reply);
		pthread_mutex_unlock(&t->pull_lock);
		if (!ok) {
			cwi_pmsg_free(&rep);
			cwi_rpc_reply_error(r, CACHEW_ENOMEM,
			    "task %llu: out of memory",
			    (unsigned long long)t->id);
			return;
		}
	}
	cwi_rpc_reply(r, &rep);
	cwi_pmsg_free(&rep);
}
