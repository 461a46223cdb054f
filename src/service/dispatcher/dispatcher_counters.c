/*
 * dispatcher_counters.c - a job's counters: the operator rows of its
 * tasks' pipelines and what its clients received.
 *
 * Operator rows. A worker reports a task's rows summed over its finished
 * leases, with how many leases that is (ops_leases): in every heartbeat
 * and in a task_counters message at each lease's end, sent before the
 * lease's end marker is queued. Of two reports, the one that counts more
 * leases wins, so a heartbeat built earlier and received later does not
 * undo a task_counters. A task that is dropped (done, removed, its worker
 * gone, the job finished) leaves its rows to its job (ops_done), so the
 * job's rows cover every task it had. Since a client acknowledges a split
 * only once its lease's end reached it, the job's rows hold every finished
 * lease once its data is all acknowledged: a client that asks then gets
 * exact rows.
 *
 * Received counts. Each client says how many elements (and payload bytes)
 * of the job it took, cumulative, in its heartbeats and finally in its
 * job_release; their growth adds to the job's. The release is what ends
 * the job, so once every client released it the counts are exact.
 *
 * Like the rest of the state machine, no locks: the caller's.
 */
#include "dispatcher_int.h"

#include <stdlib.h>

/* Adds c to the list v (n entries) under c's name: a name not met yet is
 * appended (at most CWI_PROTO_MAX_OPS entries, then dropped). */
static cachew_err
ops_add(cwi_op_counters **v, size_t *n, const cwi_op_counters *c)
{
	cwi_op_counters *o = NULL, *nv;

	for (size_t i = 0; i < *n && o == NULL; i++)
		if (strcmp((*v)[i].name, c->name) == 0)
			o = &(*v)[i];
	if (o == NULL) {
		if (*n == CWI_PROTO_MAX_OPS)
			return CACHEW_OK;
		nv = realloc(*v, (*n + 1) * sizeof(**v));
		if (nv == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		*v = nv;
		o = &nv[*n];
		memset(o, 0, sizeof(*o));
		o->name = cwi_strdup(c->name);
		if (o->name == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		(*n)++;
	}
	o->elements += c->elements;
	o->bytes += c->bytes;
	o->busy_ns += c->busy_ns;
	o->dropped += c->dropped;
	o->cache_hit_bytes += c->cache_hit_bytes;
	o->wait_ns += c->wait_ns;
	o->buffered += c->buffered;
	/* Threads and buffer room of the job, over its workers. */
	o->parallelism += c->parallelism;
	o->buffer_limit += c->buffer_limit;
	return CACHEW_OK;
}

static void
ops_free(cwi_op_counters *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
}

cachew_err
cwi_counters_task_ops(task *t, const cwi_op_counters *ops, size_t nops,
    uint64_t ops_leases)
{
	cwi_op_counters *v = NULL;

	/* Older than what the task has, or none (a worker out of memory):
	 * the task's stay. */
	if (ops_leases < t->ops_leases || (nops == 0 && t->nops > 0))
		return CACHEW_OK;
	if (nops > 0 && (v = calloc(nops, sizeof(*v))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < nops; i++) {
		v[i] = ops[i];
		v[i].detail = NULL; /* the name carries it */
		v[i].name = cwi_strdup(ops[i].name != NULL ? ops[i].name : "");
		if (v[i].name == NULL) {
			ops_free(v, i);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	ops_free(t->ops, t->nops);
	t->ops = v;
	t->nops = nops;
	t->ops_leases = ops_leases;
	return CACHEW_OK;
}

void
cwi_counters_retire(job *j, const task *t)
{
	for (size_t i = 0; i < t->nops; i++) {
		cwi_op_counters c = t->ops[i];
		c.buffered = 0; /* it holds nothing any more */
		if (ops_add(&j->ops_done, &j->nops_done, &c) != CACHEW_OK)
			return; /* metrics only */
	}
}

void
cwi_counters_job_free(job *j)
{
	ops_free(j->ops_done, j->nops_done);
	j->ops_done = NULL;
	j->nops_done = 0;
}

static uint64_t
sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void
cwi_counters_received(job *j, client *c, uint64_t elements, uint64_t bytes)
{
	/* Cumulative: only growth counts (a peer's numbers, so the sum
	 * saturates rather than wraps). */
	if (elements > c->elements_received) {
		j->elements = sat_add(j->elements,
		    elements - c->elements_received);
		c->elements_received = elements;
	}
	if (bytes > c->bytes_received) {
		j->bytes = sat_add(j->bytes, bytes - c->bytes_received);
		c->bytes_received = bytes;
	}
}

cachew_err
cwi_counters_job_ops(const job *j,
    cwi_msg_client_heartbeat_reply *rep)
{
	cachew_err rv = CACHEW_OK;

	for (size_t k = 0; rv == CACHEW_OK && k < j->nops_done; k++)
		rv = ops_add(&rep->ops, &rep->nops, &j->ops_done[k]);
	for (size_t i = 0; rv == CACHEW_OK && i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		for (size_t k = 0; rv == CACHEW_OK && k < t->nops; k++)
			rv = ops_add(&rep->ops, &rep->nops, &t->ops[k]);
	}
	return rv;
}

/* An operator's own work per thread it ran on: what makes it the one the
 * pipeline waits for (a map on 4 threads with 4 times the busy time of a
 * one-thread batch is not slower than it). */
static double
op_time_per_thread(const cwi_op_counters *c)
{
	return (double)c->busy_ns / (double)(c->parallelism > 0 ?
	    c->parallelism : 1);
}

/* A row named "<index>:cache_get" (a worker's rows carry the node's index
 * before the operator's name). */
static bool
is_cache_get(const char *name)
{
	const char *op = strchr(name, ':');

	return strcmp(op != NULL ? op + 1 : name, "cache_get") == 0;
}

/* The bytes a row read from a cache. A worker built before rows carried
 * cache_hit_bytes reports 0 there: its cache_get's output is all hits
 * still (its cache and cache() reads stay uncounted). */
static uint64_t
row_hit_bytes(const cwi_op_counters *c)
{
	if (c->cache_hit_bytes == 0 && is_cache_get(c->name))
		return c->bytes;
	return c->cache_hit_bytes;
}

cachew_err
cwi_counters_job_summary(const job *j, char **slowest, double *share,
    uint64_t *cache_hit_bytes)
{
	cwi_msg_client_heartbeat_reply rows;
	const cwi_op_counters *max = NULL;
	double sum = 0;
	cachew_err rv;

	*slowest = NULL;
	*share = 0;
	*cache_hit_bytes = 0;
	memset(&rows, 0, sizeof(rows));
	rv = cwi_counters_job_ops(j, &rows);
	for (size_t i = 0; rv == CACHEW_OK && i < rows.nops; i++) {
		const cwi_op_counters *c = &rows.ops[i];
		sum += op_time_per_thread(c);
		if (c->busy_ns > 0 && (max == NULL ||
		    op_time_per_thread(c) > op_time_per_thread(max)))
			max = c;
		*cache_hit_bytes = sat_add(*cache_hit_bytes, row_hit_bytes(c));
	}
	if (rv == CACHEW_OK && max != NULL) {
		*share = sum > 0 ? op_time_per_thread(max) / sum : 0;
		if ((*slowest = cwi_strdup(max->name)) == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	ops_free(rows.ops, rows.nops);
	return rv;
}
