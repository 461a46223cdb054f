/*
 * worker_coord.c - a coordinated task's rounds (num_consumers N > 0;
 * worker_task.h states the model, docs/protocol.md "Coordinated reads on
 * the wire" the protocol).
 *
 * Owns the ring of formed rounds (t->slots, slot_base, slot_bytes) and the
 * end round (end_slot, end_ends, end_served, dropped). A round is formed
 * from the task's queue on the first request for it, N queued elements,
 * consumer i getting the i-th; it goes once every consumer took its
 * element. The queue itself, the leases and the clients belong to the
 * base (worker_task.c).
 *
 * Locking: everything here runs with t->lock held (the base's
 * build_reply calls in); nothing here takes a lock.
 */
#include "worker_task_int.h"

#include <stdio.h>
#include <stdlib.h>

static void
slot_free(round_slot *s, uint32_t ncons)
{
	for (uint32_t i = 0; i < ncons; i++)
		cwi_element_release(s->e[i]);
	free(s->e);
	free(s->ends);
	memset(s, 0, sizeof(*s));
}

/* Rounds go as soon as every consumer took its element, oldest first;
 * their splits then count as delivered. */
static void
free_taken_rounds(cwi_wtask *t)
{
	bool freed = false;

	while (t->nslots > 0) {
		round_slot *s = &t->slots[t->shead];
		if (s->ntaken < t->ncons)
			break;
		/* Metrics only (a client leaving re-leases delivered splits
		 * nobody acknowledged): a lost entry costs a duplicate. */
		for (size_t i = 0; i < s->nends; i++)
			(void)cwi_wtask_add_delivered(t, s->ends[i].split_id);
		t->slot_bytes -= s->bytes;
		slot_free(s, t->ncons);
		t->shead = (t->shead + 1) % t->capslots;
		t->nslots--;
		t->slot_base++;
		freed = true;
	}
	if (freed)
		pthread_cond_broadcast(&t->space);
}

static bool
slots_grow(cwi_wtask *t)
{
	size_t cap;
	round_slot *ns;

	if (t->nslots < t->capslots)
		return true;
	cap = t->capslots != 0 ? t->capslots * 2 : 16;
	ns = calloc(cap, sizeof(*ns));
	if (ns == NULL)
		return false;
	for (size_t i = 0; i < t->nslots; i++)
		ns[i] = t->slots[(t->shead + i) % t->capslots];
	free(t->slots);
	t->slots = ns;
	t->capslots = cap;
	t->shead = 0;
	return true;
}

static bool
add_coord_end(coord_end **v, size_t *n, size_t *cap, uint64_t split_id,
    uint32_t pos, uint32_t lease)
{
	if (!cwi_grow((void **)v, cap, *n + 1, sizeof(**v)))
		return false;
	(*v)[*n].split_id = split_id;
	(*v)[*n].pos = pos;
	(*v)[*n].lease = lease;
	(*n)++;
	return true;
}

/* The runner is done and fewer than ncons elements are left: no consumer
 * gets a partial round. They are dropped, and the splits still ending in
 * the queue end with the end round (every consumer acknowledges them
 * there, so the epoch completes). */
static bool
end_rounds(cwi_wtask *t)
{
	uint64_t dropped = 0;

	t->end_slot = t->slot_base + t->nslots;
	while (t->qlen > 0) {
		q_entry *q = &t->q[t->qhead];
		if (q->e != NULL) {
			cwi_element_release(q->e);
			t->qbytes -= q->bytes;
			t->qelems--;
			dropped++;
		} else {
			lease_rec *l = &t->leases[q->lease];
			for (size_t i = 0; i < l->nsplits; i++) {
				if (!add_coord_end(&t->end_ends, &t->nend_ends,
					&t->capend_ends, l->split_ids[i], 0,
					l->split_leases[i]) ||
				    !cwi_wtask_add_delivered(t, l->split_ids[i]))
					return false;
			}
		}
		t->qhead = (t->qhead + 1) % t->qcap;
		t->qlen--;
	}
	t->dropped = dropped;
	pthread_cond_broadcast(&t->space);
	cwi_log(CACHEW_LOG_INFO, "worker", "event=rounds_ended task=%llu "
	    "rounds=%llu dropped=%llu", (unsigned long long)t->id,
	    (unsigned long long)t->end_slot, (unsigned long long)dropped);
	return true;
}

/* Forms the next round: the next ncons queued elements, and the ends of
 * the leases met before the last of them. Returns 1 when a round (or the
 * end) was formed, 0 when the queue does not hold enough yet, -1 when
 * memory ran out. */
static int
form_round(cwi_wtask *t)
{
	uint32_t n = t->ncons, cnt = 0;
	round_slot *s;

	if (t->qelems < n) {
		if (!t->produced_all)
			return 0;
		return end_rounds(t) ? 1 : -1;
	}
	if (!slots_grow(t))
		return -1;
	s = &t->slots[(t->shead + t->nslots) % t->capslots];
	memset(s, 0, sizeof(*s));
	s->e = calloc(n, sizeof(*s->e) + 1);
	if (s->e == NULL)
		return -1;
	s->taken = (uint8_t *)(s->e + n);
	/* Bookkeeping counts against the queue bound too: with scalar
	 * elements it outweighs the payload. */
	s->bytes = sizeof(*s) + (uint64_t)n * (sizeof(*s->e) + 1 + 64);
	while (cnt < n) {
		q_entry *q = &t->q[t->qhead];
		if (q->e != NULL) {
			s->e[cnt++] = q->e;
			s->bytes += q->bytes;
			t->qbytes -= q->bytes;
			t->qelems--;
		} else {
			lease_rec *l = &t->leases[q->lease];
			size_t cap = s->nends;
			for (size_t i = 0; i < l->nsplits; i++) {
				if (!add_coord_end(&s->ends, &s->nends, &cap,
					l->split_ids[i], cnt,
					l->split_leases[i])) {
					slot_free(s, cnt);
					return -1;
				}
			}
		}
		t->qhead = (t->qhead + 1) % t->qcap;
		t->qlen--;
	}
	t->slot_bytes += s->bytes;
	t->nslots++;
	return 1;
}

/* Whether m may be served: it comes from one of the task's consumers and
 * its round did not go to every consumer already (st says why not). */
static bool
coord_request_ok(const cwi_wtask *t, const cwi_msg_get_elements *m,
    reply_status *st)
{
	uint64_t k = m->task_round;
	int64_t ci = m->consumer_index;

	if (ci < 0 || ci >= (int64_t)t->ncons) {
		cwi_wtask_status_fail(st, CACHEW_EINVAL, "task %llu is read by "
		    "%u coordinated consumers: consumer_index %lld is not in "
		    "0..%u", (unsigned long long)t->id, t->ncons,
		    (long long)ci, t->ncons - 1);
		return false;
	}
	if (k < t->slot_base) {
		cwi_wtask_status_fail(st, CACHEW_EINVAL, "task %llu: round "
		    "%llu (the task's %llu-th) went to every consumer already",
		    (unsigned long long)t->id, (unsigned long long)m->round,
		    (unsigned long long)k);
		return false;
	}
	return true;
}

/* Consumer ci's part of the task's round k (formed, or at or after the
 * end): its element pushed on msg (*count 1; none at the end), and the
 * split ends that come with it (*src, *nsrc). false on ENOMEM. */
static bool
round_take(cwi_wtask *t, uint64_t k, int64_t ci, cwi_msg *msg,
    const coord_end **src, size_t *nsrc, uint32_t *count)
{
	if (k >= t->end_slot) {
		/* The end round carries the last splits' ends; later ones
		 * (asked ahead) carry nothing. */
		if (k == t->end_slot) {
			*src = t->end_ends;
			*nsrc = t->nend_ends;
			if (!t->end_served[ci]) {
				t->end_served[ci] = 1;
				t->nend_served++;
			}
		}
		return true;
	}
	round_slot *s = &t->slots[(t->shead + (k - t->slot_base)) %
				  t->capslots];
	cwi_element *e = s->e[ci];
	cwi_element_retain(e);
	if (cwi_msg_push(msg, e) != CACHEW_OK) {
		cwi_element_release(e);
		return false;
	}
	*count = 1;
	*src = s->ends;
	*nsrc = s->nends;
	if (!s->taken[ci]) {
		s->taken[ci] = 1;
		s->ntaken++;
		t->elements++;
		t->bytes += cwi_element_nbytes(e);
	}
	return true;
}

/* A round's split ends as consumer ci acknowledges them (calloc'd; NULL
 * when n is 0 or on ENOMEM). Every consumer reads every round: each
 * acknowledges its part of every split. */
static cwi_split_end *
round_ends(const cwi_wtask *t, const coord_end *src, size_t n, int64_t ci)
{
	cwi_split_end *ends;

	if (n == 0)
		return NULL;
	ends = calloc(n, sizeof(*ends));
	if (ends == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		ends[i].split_id = src[i].split_id;
		ends[i].after = src[i].pos > (uint64_t)ci ? 1u : 0u;
		ends[i].parts = t->ncons;
		ends[i].lease = src[i].lease;
	}
	return ends;
}

cwi_msg *
cwi_wtask_coord_reply(cwi_wtask *t, const cwi_msg_get_elements *m,
    bool remote, reply_status *st)
{
	uint64_t k = m->task_round;
	int64_t ci = m->consumer_index;
	client_rec *c;
	cwi_pmsg rep;
	cwi_msg *msg = NULL;
	cwi_split_end *ends;
	const coord_end *src = NULL;
	size_t nsrc = 0;
	uint32_t count = 0;
	int formed;

	if (!coord_request_ok(t, m, st))
		return NULL;
	while (t->end_slot == UINT64_MAX && k >= t->slot_base + t->nslots) {
		formed = form_round(t);
		if (formed == 0)
			return NULL;
		if (formed < 0)
			goto nomem;
	}
	c = cwi_wtask_client_get(t, m->client_id);
	if (c == NULL || cwi_msg_create(&msg) != CACHEW_OK)
		goto nomem;
	if (!round_take(t, k, ci, msg, &src, &nsrc, &count))
		goto nomem;
	ends = round_ends(t, src, nsrc, ci);
	if (nsrc > 0 && ends == NULL)
		goto nomem;
	cwi_wtask_reply_init(&rep, t, c, m, remote, count, st);
	rep.u.get_elements_reply.split_ends = ends;
	rep.u.get_elements_reply.nsplit_ends = nsrc;
	rep.u.get_elements_reply.end_of_task = count == 0;
	rep.u.get_elements_reply.task_round = k;
	rep.u.get_elements_reply.queued_bytes = t->qbytes + t->slot_bytes;
	free_taken_rounds(t);
	return cwi_wtask_reply_finish(t, msg, &rep, st); /* frees ends */
nomem:
	cwi_msg_destroy(msg);
	/* A round half formed cannot be repaired: the task fails. */
	if (t->failed == CACHEW_OK) {
		t->failed = CACHEW_ENOMEM;
		snprintf(t->errmsg, sizeof(t->errmsg), "out of memory forming "
		    "rounds");
	}
	st->err = CACHEW_ENOMEM;
	return NULL;
}

void
cwi_wtask_rounds_free(cwi_wtask *t)
{
	for (size_t i = 0; i < t->nslots; i++)
		slot_free(&t->slots[(t->shead + i) % t->capslots], t->ncons);
	free(t->slots);
	free(t->end_ends);
	free(t->end_served);
}
