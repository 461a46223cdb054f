/*
 * client_exact.c - exactly-once delivery on the client's side
 * (docs/protocol.md, "Exactly once").
 *
 * Every element a worker sends in an exactly-once job is numbered within
 * its group (a lease's splits, replayed whole with the same ranges and
 * seed): the reply's runs say which. The client keeps, per group, the set
 * of numbers it received; an element it already has is dropped (a replay
 * the dispatcher could not fully trim), and the set is what it reports
 * when the dispatcher asks it to stop reading a task that went (the
 * dispatcher then replays the group leaving those out). Tail elements (a
 * lease's last partial batch, before batching) go to the stitcher
 * (client_stitch.c), which makes full batches of them across leases.
 *
 * exact_lock guards all of it: the fetch thread takes remote replies, the
 * consumer a direct task's.
 */
#include "client_int.h"
#include "client_stitch.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct cgroup {
	uint64_t id;
	cwi_rset got;
	bool ended;
	uint64_t total;
	uint32_t splits; /* with ended: the next group is id + splits */
	/* Ordered delivery: its elements, held until it is the head. */
	cwi_chunk held;
} cgroup;

/* A client part that starts by selecting by position sees in-process's
 * order only if groups come in split order. */
static bool
needs_order(const client_ctx *ctx)
{
	static const char *const positional[] = {"take", "skip", "shard",
	    "enumerate"};
	const cwi_node *b = ctx->plan->boundary;

	if (b == NULL || ctx->opts.job_name[0] != '\0')
		return false;
	for (size_t i = 0; i < sizeof(positional) / sizeof(*positional); i++)
		if (strcmp(b->op->name, positional[i]) == 0)
			return true;
	return false;
}

cachew_err
cwi_client_exact_init(session *s)
{
	s->ordered = s->exact && needs_order(s->ctx);
	if (!s->exact || s->ctx->plan->ngroups == 0)
		return CACHEW_OK;
	return cwi_stitch_create(&s->stitch, s->ctx->plan, &s->ctx->opts,
	    s->ctx->seed, s->epoch, &s->ctx->stitched);
}

void
cwi_client_exact_free(session *s)
{
	/* A replay the dispatcher could not trim (it had no report of them):
	 * dropped here, worth knowing. */
	if (s->dups > 0)
		cwi_log(CACHEW_LOG_INFO, "client", "event=repeats_dropped "
		    "job=%llu elements=%llu", (unsigned long long)s->job_id,
		    (unsigned long long)s->dups);
	for (size_t i = 0; i < s->ngroups; i++) {
		cwi_rset_free(&s->groups[i].got);
		cwi_chunk_free(&s->groups[i].held);
	}
	free(s->groups);
	cwi_stitch_destroy(s->stitch);
	free(s->stopped);
	free(s->failed);
	free(s->stop_direct);
	free(s->sent_stopped);
	free(s->sent_failed);
	pthread_mutex_destroy(&s->exact_lock);
}

/* The group's record, made on first use (exact_lock held). */
static cgroup *
group_get(session *s, uint64_t id)
{
	cgroup *g;

	if (s->lastgroup < s->ngroups && s->groups[s->lastgroup].id == id)
		return &s->groups[s->lastgroup];
	for (size_t i = s->ngroups; i-- > 0;) {
		if (s->groups[i].id == id) {
			s->lastgroup = i;
			return &s->groups[i];
		}
	}
	if (!CWI_GROW(s->groups, s->capgroups, s->ngroups + 1))
		return NULL;
	g = &s->groups[s->ngroups];
	memset(g, 0, sizeof(*g));
	g->id = id;
	s->lastgroup = s->ngroups++;
	return g;
}

/* Delivers e of group g: into out, or (ordered delivery, g not the head
 * yet) into g's held elements. false on ENOMEM (e released). */
static bool
emit(session *s, cgroup *g, cwi_element *e, cwi_chunk *out)
{
	cwi_chunk *dst = s->ordered && g->id != s->head ? &g->held : out;

	if (cwi_chunk_reserve(dst, 1) != CACHEW_OK) {
		cwi_element_release(e);
		return false;
	}
	if (dst != out)
		s->held_bytes += cwi_element_nbytes(e);
	cwi_chunk_push(dst, e);
	return true;
}

/* Ordered delivery: while the head group has ended, the next one (in
 * split order) becomes the head and what it holds goes out. */
static bool
advance_head(session *s, cwi_chunk *out)
{
	for (;;) {
		cgroup *h = NULL;
		for (size_t i = 0; i < s->ngroups && h == NULL; i++)
			if (s->groups[i].id == s->head)
				h = &s->groups[i];
		if (h == NULL)
			return true;
		if (h->held.n > 0) {
			for (size_t i = 0; i < h->held.n; i++)
				s->held_bytes -= cwi_element_nbytes(h->held.v[i]);
			if (!cwi_chunk_move_all(out, &h->held))
				return false;
		}
		if (!h->ended || h->splits == 0)
			return true;
		s->head = h->id + h->splits;
	}
}

/* Whether the set holds any of [from, to). */
static bool
rset_meets(const cwi_rset *s, uint64_t from, uint64_t to)
{
	for (size_t i = s->n; i >= 2; i -= 2) {
		if (s->v[i - 1] <= from)
			return false; /* this range and all before end first */
		if (s->v[i - 2] < to)
			return true;
	}
	return false;
}

cachew_err
cwi_client_exact_reply(session *s, const char *worker,
    const cwi_msg_get_elements_reply *r, cwi_element **v, size_t n,
    cwi_chunk *out, char *err, size_t errlen)
{
	size_t e = 0;
	cachew_err rv = CACHEW_OK;

	if (!s->exact)
		return CACHEW_OK;
	for (size_t i = 0; i < r->nruns; i++) {
		if (r->runs[i].n > n - e) {
			snprintf(err, errlen, "%s: the runs of reply %llu name "
			    "more than its %zu elements", worker,
			    (unsigned long long)r->seq, n);
			return CACHEW_EPROTO;
		}
		e += r->runs[i].n;
	}
	if (e != n) {
		snprintf(err, errlen, "%s: the runs of reply %llu name %zu of "
		    "its %zu elements", worker, (unsigned long long)r->seq, e,
		    n);
		return CACHEW_EPROTO;
	}
	if (cwi_chunk_reserve(out, n) != CACHEW_OK) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	pthread_mutex_lock(&s->exact_lock);
	e = 0;
	for (size_t i = 0; i < r->nruns && rv == CACHEW_OK; i++) {
		const cwi_run *run = &r->runs[i];
		cgroup *g = group_get(s, run->group);
		if (g == NULL) {
			rv = CACHEW_ENOMEM;
			break;
		}
		/* The common case, a stream read in order: none of the run
		 * was received before, so it is recorded at once and its
		 * output elements go out as they are. */
		bool fresh = run->n > 0 && run->tail == 0 &&
		    !rset_meets(&g->got, run->from, run->from + run->n);
		if (fresh) {
			if (!cwi_rset_add(&g->got, run->from,
				run->from + run->n)) {
				rv = CACHEW_ENOMEM;
				break;
			}
			for (uint32_t k = 0; k < run->n; k++, e++) {
				cwi_element *x = v[e];
				v[e] = NULL;
				if (!emit(s, g, x, out)) {
					rv = CACHEW_ENOMEM;
					break;
				}
			}
		}
		for (uint32_t k = 0; !fresh && k < run->n; k++, e++) {
			uint64_t idx = run->from + k;
			if (cwi_rset_has(&g->got, idx)) {
				cwi_element_release(v[e]);
				v[e] = NULL;
				s->dups++;
				continue;
			}
			if (!cwi_rset_add(&g->got, idx, idx + 1)) {
				rv = CACHEW_ENOMEM;
				break;
			}
			if (run->tail == 0) {
				cwi_element *x = v[e];
				v[e] = NULL;
				if (!emit(s, g, x, out)) {
					rv = CACHEW_ENOMEM;
					break;
				}
				continue;
			}
			if (s->stitch == NULL) {
				snprintf(err, errlen, "%s: a tail element, but "
				    "the pipeline has no batch to stitch",
				    worker);
				rv = CACHEW_EPROTO;
				break;
			}
			cwi_element *x = v[e];
			v[e] = NULL;
			rv = cwi_stitch_add(s->stitch, run->tail - 1, x);
			if (rv != CACHEW_OK) {
				snprintf(err, errlen, "%s: %s", worker,
				    cwi_errmsg_get());
				break;
			}
		}
		if (run->end) {
			g->ended = true;
			g->total = run->from + run->n;
			g->splits = run->splits;
		}
		/* The batches a tail run completes take their place in the
		 * stream right after it (in its group, ordered). */
		if (rv == CACHEW_OK && run->tail > 0) {
			cwi_chunk made = {0};
			rv = cwi_stitch_drain(s->stitch, false, &made, err,
			    errlen);
			for (size_t k = 0; k < made.n; k++)
				if (rv == CACHEW_OK && !emit(s, g, made.v[k],
				    out))
					rv = CACHEW_ENOMEM;
				else if (rv != CACHEW_OK)
					cwi_element_release(made.v[k]);
			made.n = 0;
			cwi_chunk_free(&made);
		}
		if (rv == CACHEW_OK && s->ordered && g->id == s->head &&
		    !advance_head(s, out))
			rv = CACHEW_ENOMEM;
	}
	if (rv == CACHEW_ENOMEM)
		snprintf(err, errlen, "out of memory");
	pthread_mutex_unlock(&s->exact_lock);
	/* What is left of v (a failure stopped the walk) is released. */
	for (size_t i = 0; i < n; i++) {
		cwi_element_release(v[i]);
		v[i] = NULL;
	}
	return rv;
}

cachew_err
cwi_client_exact_finish(session *s, cwi_chunk *out, char *err, size_t errlen)
{
	cachew_err rv = CACHEW_OK;

	if (!s->exact)
		return CACHEW_OK;
	pthread_mutex_lock(&s->exact_lock);
	/* Ordered delivery: whatever is still held (a group whose end was
	 * never seen: not expected), in group order. */
	while (s->ordered && s->held_bytes > 0 && rv == CACHEW_OK) {
		cgroup *next = NULL;
		for (size_t i = 0; i < s->ngroups; i++)
			if (s->groups[i].held.n > 0 &&
			    (next == NULL || s->groups[i].id < next->id))
				next = &s->groups[i];
		if (next == NULL)
			break;
		s->head = next->id;
		if (!advance_head(s, out))
			rv = CACHEW_ENOMEM;
	}
	if (rv == CACHEW_OK && s->stitch != NULL &&
	    cwi_stitch_held(s->stitch) > 0)
		rv = cwi_stitch_drain(s->stitch, true, out, err, errlen);
	pthread_mutex_unlock(&s->exact_lock);
	if (rv == CACHEW_ENOMEM)
		snprintf(err, errlen, "out of memory");
	return rv;
}

uint64_t
cwi_client_exact_held(session *s)
{
	uint64_t b;

	if (!s->ordered)
		return 0;
	pthread_mutex_lock(&s->exact_lock);
	b = s->held_bytes;
	pthread_mutex_unlock(&s->exact_lock);
	return b;
}

bool
cwi_client_exact_may_hold_head(session *s, const ctask *t)
{
	bool may;

	if (!s->ordered || t->last_group == UINT64_MAX)
		return true;
	pthread_mutex_lock(&s->exact_lock);
	may = t->last_group <= s->head;
	pthread_mutex_unlock(&s->exact_lock);
	return may;
}

bool
cwi_client_queue_chunk(session *s, cwi_chunk *c)
{
	bool ok = true;

	for (size_t i = 0; i < c->n; i++) {
		if (ok && cwi_client_queue_push(s, c->v[i]))
			continue;
		ok = false;
		cwi_element_release(c->v[i]);
	}
	c->n = 0;
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
	else
		cwi_client_wake(s);
	return ok;
}

/* ---- stopping tasks and reporting ------------------------------------------ */

static bool
ids_add(uint64_t **v, size_t *n, size_t *cap, uint64_t id)
{
	for (size_t i = 0; i < *n; i++)
		if ((*v)[i] == id)
			return true;
	if (!CWI_GROW(*v, *cap, *n + 1))
		return false;
	(*v)[(*n)++] = id;
	return true;
}

/* A remote task is read no more (fetch thread). */
static void
task_stop(ctask *t)
{
	for (size_t i = 0; i < t->nheld; i++) {
		cwi_msg_destroy(t->held[i].msg);
		cwi_pmsg_free(&t->held[i].hdr);
	}
	t->nheld = 0;
	t->gone = true;
	t->stopped = true;
}

void
cwi_client_exact_stop(session *s, const uint64_t *ids, size_t n)
{
	bool ok = true;

	for (size_t i = 0; i < n; i++) {
		ctask *t = cwi_client_task_by_id(s, ids[i]);
		if (t != NULL && t->direct) {
			pthread_mutex_lock(&s->exact_lock);
			ok &= ids_add(&s->stop_direct, &s->nstop_direct,
			    &s->capstop_direct, ids[i]);
			pthread_mutex_unlock(&s->exact_lock);
			continue;
		}
		if (t != NULL)
			task_stop(t);
		pthread_mutex_lock(&s->exact_lock);
		ok &= ids_add(&s->stopped, &s->nstopped, &s->capstopped,
		    ids[i]);
		pthread_mutex_unlock(&s->exact_lock);
	}
	cwi_client_exact_poll(s);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

void
cwi_client_exact_failed(session *s, ctask *t)
{
	bool ok;

	task_stop(t);
	pthread_mutex_lock(&s->exact_lock);
	ok = ids_add(&s->failed, &s->nfailed, &s->capfailed, t->task_id) &&
	     ids_add(&s->stopped, &s->nstopped, &s->capstopped, t->task_id);
	pthread_mutex_unlock(&s->exact_lock);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

void
cwi_client_exact_poll(session *s)
{
	bool ok = true;

	pthread_mutex_lock(&s->exact_lock);
	for (size_t i = 0; i < s->nstop_direct;) {
		uint64_t id = s->stop_direct[i];
		bool idle;

		/* The consumer calls the task with s->lock released: once
		 * it is blocked while no call runs, nothing more of it can
		 * arrive. */
		pthread_mutex_lock(&s->lock);
		idle = !s->inl_calling || s->inl.id != id;
		if (idle)
			s->inl_blocked = id;
		pthread_mutex_unlock(&s->lock);
		if (!idle) {
			i++;
			continue;
		}
		ok &= ids_add(&s->stopped, &s->nstopped, &s->capstopped, id);
		s->stop_direct[i] = s->stop_direct[--s->nstop_direct];
		ctask *t = cwi_client_task_by_id(s, id);
		if (t != NULL) {
			t->gone = true;
			t->stopped = true;
		}
	}
	pthread_mutex_unlock(&s->exact_lock);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

bool
cwi_client_exact_due(session *s)
{
	bool due;

	if (!s->exact)
		return false;
	pthread_mutex_lock(&s->exact_lock);
	due = s->nstopped > 0 || s->nfailed > 0;
	pthread_mutex_unlock(&s->exact_lock);
	return due;
}

static uint64_t *
ids_copy(const uint64_t *v, size_t n)
{
	uint64_t *c = n > 0 ? malloc(n * sizeof(*c)) : NULL;

	if (c != NULL)
		memcpy(c, v, n * sizeof(*c));
	return c;
}

void
cwi_client_exact_fill(session *s, cwi_msg_client_heartbeat *m)
{
	if (!s->exact)
		return;
	pthread_mutex_lock(&s->exact_lock);
	if (s->nstopped == 0 && s->nfailed == 0) {
		pthread_mutex_unlock(&s->exact_lock);
		return;
	}
	/* Every group this client has data of: the dispatcher takes the
	 * ones it is recovering (a complete one included: its ack may still
	 * be on its way). */
	m->progress = calloc(s->ngroups > 0 ? s->ngroups : 1,
	    sizeof(*m->progress));
	m->stopped_tasks = ids_copy(s->stopped, s->nstopped);
	m->failed_tasks = ids_copy(s->failed, s->nfailed);
	if (m->progress == NULL || (s->nstopped > 0 && m->stopped_tasks ==
	    NULL) || (s->nfailed > 0 && m->failed_tasks == NULL)) {
		/* Nothing reported this time; the next heartbeat tries. */
		free(m->progress);
		free(m->stopped_tasks);
		free(m->failed_tasks);
		m->progress = NULL;
		m->stopped_tasks = m->failed_tasks = NULL;
		pthread_mutex_unlock(&s->exact_lock);
		return;
	}
	m->nstopped_tasks = s->nstopped;
	m->nfailed_tasks = s->nfailed;
	for (size_t i = 0; i < s->ngroups; i++) {
		const cgroup *g = &s->groups[i];
		cwi_progress *p = &m->progress[m->nprogress];
		p->group = g->id;
		p->ended = g->ended;
		p->total = g->total;
		p->ranges = ids_copy(g->got.v, g->got.n);
		if (g->got.n > 0 && p->ranges == NULL)
			continue;
		p->nranges = g->got.n;
		m->nprogress++;
	}
	/* In flight now; back to the lists if the heartbeat fails. */
	free(s->sent_stopped);
	free(s->sent_failed);
	s->sent_stopped = s->stopped;
	s->nsent_stopped = s->nstopped;
	s->sent_failed = s->failed;
	s->nsent_failed = s->nfailed;
	s->stopped = s->failed = NULL;
	s->nstopped = s->capstopped = s->nfailed = s->capfailed = 0;
	pthread_mutex_unlock(&s->exact_lock);
}

void
cwi_client_exact_sent(session *s, bool ok)
{
	bool mem = true;

	if (!s->exact)
		return;
	pthread_mutex_lock(&s->exact_lock);
	for (size_t i = 0; !ok && i < s->nsent_stopped; i++)
		mem &= ids_add(&s->stopped, &s->nstopped, &s->capstopped,
		    s->sent_stopped[i]);
	for (size_t i = 0; !ok && i < s->nsent_failed; i++)
		mem &= ids_add(&s->failed, &s->nfailed, &s->capfailed,
		    s->sent_failed[i]);
	free(s->sent_stopped);
	free(s->sent_failed);
	s->sent_stopped = s->sent_failed = NULL;
	s->nsent_stopped = s->nsent_failed = 0;
	pthread_mutex_unlock(&s->exact_lock);
	if (!mem)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}
