/*
 * dispatcher_ledger.c - the split ledger of a distributed_epoch job
 * (struct split_ledger, dispatcher_int.h). Its one invariant: every split
 * unit is delivered once per epoch. Lease, acknowledgement, release,
 * re-lease after a death, the orphan grace, part-acks of a split read by
 * several clients and lease numbers all serve it, so they live here
 * together, and the rest of the dispatcher changes the ledger only through
 * the functions below (it reads the counts).
 *
 * A job's splits move PENDING -> LEASED -> ACKED, and LEASED -> PENDING
 * when their worker dies (or a shared job's client leaves with them).
 * ACKED is final. The pending pool is a ring of split ids: a split is in
 * the ring at most once, a split acknowledged while pending leaves a
 * stale entry that popping skips, so the ring never needs more than
 * nsplits slots. Released splits go to the front, so lost data is
 * produced again first.
 *
 * An exactly-once job adds RECOVERING (LEASED -> RECOVERING when the task
 * goes, -> PENDING or ACKED once its clients reported: dispatcher_recover.c)
 * and leases groups, not single splits (lease_group).
 *
 * Invariant (checked by the tests): npending + nleased + nacked +
 * nrecovering == nsplits, and every split is in exactly one of those
 * states. A task's nleased counts the splits leased to it that are not
 * acknowledged.
 */
#include "dispatcher_int.h"
#include "../../pipeline/pipeline.h"

#include <inttypes.h>
#include <stdlib.h>


/* ---- the ledger's own state ---------------------------------------------- */

static void
ring_push(struct split_ledger *l, uint64_t id, bool front)
{
	if (front) {
		l->ring_head = (l->ring_head + l->nsplits - 1) % l->nsplits;
		l->ring[l->ring_head] = id;
	} else {
		l->ring[(l->ring_head + l->ring_len) % l->nsplits] = id;
	}
	l->ring_len++;
}

/* The next pending split; stale entries (acknowledged while pending) are
 * dropped on the way. false when none is pending. */
static bool
ring_pop(struct split_ledger *l, uint64_t *id)
{
	while (l->ring_len > 0) {
		uint64_t s = l->ring[l->ring_head];
		l->ring_head = (l->ring_head + 1) % l->nsplits;
		l->ring_len--;
		if (l->splits[s].state == SPLIT_PENDING) {
			*id = s;
			return true;
		}
	}
	return false;
}

static void
split_range(const struct split_ledger *l, uint64_t id, cwi_split *out)
{
	out->split_id = id;
	/* id < nsplits, so begin < nunits; the last split ends at nunits
	 * (begin + units_per_split may pass 2^64 - 1). */
	out->begin = id * l->units_per_split;
	out->end = l->nunits - out->begin > l->units_per_split
	    ? out->begin + l->units_per_split : l->nunits;
}

/* Cuts the ledger's units by units_per_split (> 0) into splits, all
 * pending, in order. */
static cachew_err
ledger_cut(struct split_ledger *l)
{
	l->nsplits = l->nunits / l->units_per_split +
	    (l->nunits % l->units_per_split != 0);
	l->ring_head = l->ring_len = 0;
	l->npending = l->nleased = l->nacked = l->nrecovering = 0;
	if (l->nsplits == 0)
		return CACHEW_OK;
	l->splits = calloc(l->nsplits, sizeof(*l->splits));
	l->ring = malloc(l->nsplits * sizeof(*l->ring));
	if (l->splits == NULL || l->ring == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (uint64_t k = 0; k < l->nsplits; k++) {
		l->splits[k].group = NO_GROUP;
		ring_push(l, k, false);
	}
	l->npending = l->nsplits;
	return CACHEW_OK;
}

/* ---- shuffled order ---------------------------------------------------------
 *
 * A shuffle in the worker part runs per lease: its buffer holds one
 * lease's elements. Handed out in split order, the leases of an epoch
 * would keep every element within about a split of where it started
 * (range(100) | shuffle(100) through one worker: each element within 13
 * places), where the in-process run is a full permutation. So, as tf.data
 * service's shuffle split provider shuffles its input's splits through
 * the shuffle's buffer, the pool of such a job is a buffered shuffle of
 * its splits: a window of buffer / units_per_split splits (at least one),
 * each next split drawn at random from the window. A buffer that covers
 * the input makes it a uniform permutation; a buffer of one split or less
 * leaves split order (the per-lease shuffle already mixes as far as the
 * in-process one would).
 *
 * Small splits. The order of S shuffled splits still keeps each split's
 * units together: the rank correlation of position and value is about
 * 1 / sqrt(S). With a window of more than one split the job is cut into
 * at least min(units, SHUFFLE_SPLITS) splits: 1,024 puts that near 0.03
 * (|rho| < 0.1 for range(1000) | shuffle(1000), the dshuffle tests). Each
 * split costs a lease round trip, a pipeline instance, a stitched batch
 * tail and an acknowledgement: measured (bench/shuffle_cost.sh, 2 workers
 * over ipc://) about 0.26 ms of CPU over all processes and 0.16 ms of wall
 * time per split, so range(10^6) | map | shuffle(10^5) | batch(64) went
 * from 0.11 s (16 splits) to 0.27 s (1,024): the price of a real shuffle
 * for the cheapest elements there are, ~0.15 us each; a decoded image
 * costs thousands of times more. Fewer splits would mix worse (256:
 * rho ~0.06, so range(1000) often over 0.1). Without a shuffle nothing
 * changes.
 *
 * The key is a function of the job's seed, the shuffles' seeds and (when
 * one reshuffles each iteration) the epoch: the same job, replayed from
 * the journal or resumed from a saved position, gets the same order. Only
 * an uncoordinated distributed_epoch job over a split source gets it:
 * coordinated rounds and an autocaching pass keep split order, and the
 * embedded service's direct worker, which leases a whole epoch as one
 * group to yield the plain executor's output, keeps it too (the order is
 * applied at the first lease, by a worker that is not direct).
 */
#define SHUFFLE_SPLITS 1024u

/* The shuffles of j's worker part, if its ledger should be shuffled. */
static bool
ledger_shuffles(const job *j, cwi_graph_shuffles *sh)
{
	memset(sh, 0, sizeof(*sh));
	if (j->pass.graph != NULL || job_coordinated(j) ||
	    !j->ds->splittable || j->ds->graph_len == 0)
		return false;
	/* A graph that does not decode here was checked when it was
	 * registered; without its shuffles the job keeps split order. */
	if (cwi_graph_shuffles_of(j->ds->graph, j->ds->graph_len, sh) !=
	    CACHEW_OK)
		return false;
	return sh->n > 0;
}

/* Sets the shuffled order's key and window for the ledger's cut: pending
 * unless a window of one split (split order) is all the buffer makes. */
static void
ledger_shuffle_key(const job *j, const cwi_graph_shuffles *sh,
    struct split_ledger *l)
{
	l->shuffle_pending = false;
	if (sh->buffer <= l->units_per_split)
		return;
	l->shuffle_buffer = sh->buffer;
	l->shuffle_key = cwi_seed_derive(j->seed, sh->seed);
	if (sh->reshuffle)
		l->shuffle_key = cwi_seed_derive(l->shuffle_key, j->epoch);
	l->shuffle_pending = true;
}

/* Sets the shuffled order's key and window and makes the splits small
 * enough for it (see "shuffled order" above). */
static void
ledger_shuffle_plan(const job *j, const cwi_graph_shuffles *sh,
    struct split_ledger *l, uint64_t want)
{
	uint64_t ups = l->units_per_split, target;

	if (sh->buffer > ups && l->nunits > want) {
		target = want > SHUFFLE_SPLITS ? want : SHUFFLE_SPLITS;
		if (target > CWI_PROTO_MAX_SPLITS)
			target = CWI_PROTO_MAX_SPLITS;
		ups = l->nunits / target + (l->nunits % target != 0);
		if (ups == 0)
			ups = 1;
		if (ups < l->units_per_split)
			l->units_per_split = ups;
	}
	ledger_shuffle_key(j, sh, l);
}

/* Puts the pool in the shuffled order: the groups a resume formed first,
 * as they are (their elements were partly delivered), then the splits
 * never leased, a buffered shuffle of them in split order. On failure
 * (no memory for the window) the pool stays as it was. */
static void
ledger_shuffle_pool(struct split_ledger *l)
{
	uint64_t ups = l->units_per_split, next = 0, nbuf = 0, head = 0, k;
	uint64_t *buf;
	cwi_rng rng = {l->shuffle_key};

	/* The window in splits, of the cut the pool has now (a resume may
	 * have cut it as the saved job was). */
	k = l->shuffle_buffer / ups + (l->shuffle_buffer % ups != 0);
	if (k < 2 || l->nsplits == 0)
		return;
	if (k > l->nsplits)
		k = l->nsplits;
	buf = malloc((size_t)k * sizeof(*buf));
	if (buf == NULL)
		return;
	for (uint64_t i = 0; i < l->nsplits; i++)
		if (l->splits[i].state == SPLIT_PENDING &&
		    l->splits[i].group != NO_GROUP)
			l->ring[head++] = i;
	/* Fill the window with the next never-leased splits; each draw
	 * takes one at random and the next one takes its slot. */
	for (;;) {
		while (nbuf < k && next < l->nsplits) {
			if (l->splits[next].state == SPLIT_PENDING &&
			    l->splits[next].group == NO_GROUP)
				buf[nbuf++] = next;
			next++;
		}
		if (nbuf == 0)
			break;
		uint64_t r = cwi_rng_below(&rng, nbuf);
		l->ring[head++] = buf[r];
		buf[r] = buf[--nbuf];
	}
	free(buf);
	l->ring_head = 0;
	l->ring_len = head;
}

/* Groups the dataset's units into about splits_per_worker splits per
 * available worker (at least one unit each), smaller with a shuffle (see
 * "shuffled order"). A dataset without a
 * splittable source is one unit, the whole pipeline: one split. Units go
 * up to 2^64 - 1 (range(INT64_MIN, INT64_MAX)): the ceilings below are
 * quotient plus one, never (n + want - 1) / want, which would wrap. */
cachew_err
cwi_ledger_init(cwi_dispatcher *d, job *j)
{
	struct split_ledger *l = &j->ledger;
	uint64_t want, w = cwi_disp_workers_available(d);
	cwi_graph_shuffles sh;

	/* An autoscaled pool grows after the job starts (a provisioner may
	 * not have started any worker yet): size for the most it may have,
	 * so the epoch's last splits do not leave one worker busy while
	 * the others idle. */
	if (d->cfg.autoscale && d->cfg.max_workers > w)
		w = d->cfg.max_workers < 256 ? d->cfg.max_workers : 256;
	/* A job of a fixed worker count never has more tasks: sized for the
	 * pool, 1,000 such jobs of 10 workers each on 10,000 workers held
	 * 80,000 splits each, 4.5 GB (W9). */
	if (j->policy == CWI_WORKERS_FIXED && j->num_workers > 0 &&
	    j->num_workers < w)
		w = j->num_workers;

	if (j->pass.graph != NULL)
		l->nunits = j->pass.units;
	else
		l->nunits = j->ds->splittable ? j->ds->split_units : 1;
	want = (uint64_t)d->cfg.splits_per_worker * (w > 0 ? w : 1);
	if (want > CWI_PROTO_MAX_SPLITS)
		want = CWI_PROTO_MAX_SPLITS;
	l->units_per_split = l->nunits / want + (l->nunits % want != 0);
	if (l->units_per_split == 0)
		l->units_per_split = 1;
	l->shuffle_pending = false;
	if (ledger_shuffles(j, &sh))
		ledger_shuffle_plan(j, &sh, l, want);
	return ledger_cut(l);
}

void
cwi_ledger_shuffle_loaded(job *j)
{
	struct split_ledger *l = &j->ledger;
	cwi_graph_shuffles sh;

	l->shuffle_pending = false;
	if (l->splits == NULL || !ledger_shuffles(j, &sh))
		return;
	ledger_shuffle_key(j, &sh, l);
	/* A lease that passed lease_none took a split: the order was put in
	 * place then, and the pool the snapshot holds is it. */
	for (uint64_t k = 0; k < l->nsplits && l->shuffle_pending; k++)
		if (l->splits[k].lease != 0)
			l->shuffle_pending = false;
}

void
cwi_ledger_free(struct split_ledger *l)
{
	for (uint64_t i = 0; l->splits != NULL && i < l->nsplits; i++) {
		free(l->splits[i].ackers);
		cwi_rset_free(&l->splits[i].skip);
	}
	free(l->splits);
	free(l->ring);
	l->splits = NULL;
	l->ring = NULL;
}

/* ---- lease --------------------------------------------------------------- */

/* Whether task t gets no split now; then rep says why: its input is over
 * (end_of_splits), or when to ask again (retry_ms). */
static bool
lease_none(const cwi_dispatcher *d, const task *t,
    cwi_msg_split_lease_reply *rep)
{
	const job *j = t->job;

	/* Coordinated: a task ends with an incomplete last round that it
	 * can only drop once it knows no split will come, and the splits
	 * leased elsewhere may be waiting in exactly such rounds: waiting
	 * for them would wait forever. So once nothing is pending, its
	 * input is over. */
	if (t->state == CWI_TASK_REMOVING || t->w->draining || j->data_done ||
	    (job_coordinated(j) && t->state == CWI_TASK_ACTIVE &&
		j->ledger.npending == 0)) {
		rep->end_of_splits = true;
		return true;
	}
	if (t->state == CWI_TASK_STARTING || j->ledger.npending == 0) {
		/* Everything is leased: the epoch ends as soon as the last
		 * acks arrive, and the task learns it by asking again, so it
		 * asks often (an epoch's tail would otherwise wait a whole
		 * retry interval). */
		rep->retry_ms = t->state == CWI_TASK_STARTING
		    ? d->cfg.lease_retry_ms
		    : (d->cfg.lease_retry_ms + 4) / 5;
		return true;
	}
	return false;
}

bool
cwi_ledger_lease_waits(const cwi_dispatcher *d, const task *t)
{
	cwi_msg_split_lease_reply rep = {0};

	return lease_none(d, t, &rep) && !rep.end_of_splits;
}

static uint32_t
active_tasks(const job *j)
{
	uint32_t n = 0;

	for (size_t i = 0; i < j->tasks.n; i++)
		if (OWN_TASK(j, i)->state == CWI_TASK_ACTIVE)
			n++;
	return n;
}

/* How many splits one lease hands out: what the task asks for (0: the
 * most), at most max_lease. Several splits per round trip, but no more
 * than a fair share of what is left, so the last splits do not queue
 * behind one worker. */
static uint64_t
lease_count(const cwi_dispatcher *d, const job *j, uint32_t max_splits)
{
	uint32_t nactive = active_tasks(j);
	uint64_t want = max_splits, fair;

	fair = (j->ledger.npending + nactive - 1) / (nactive > 0 ? nactive : 1);
	if (want == 0 || want > d->cfg.max_lease)
		want = d->cfg.max_lease;
	if (want > fair)
		want = fair;
	if (want == 0)
		want = 1;
	return want;
}

/* PENDING -> LEASED: split id goes to task t under a new lease number. */
static void
take_id(struct split_ledger *l, task *t, uint64_t id, cwi_split *out)
{
	split *s = &l->splits[id];

	s->state = SPLIT_LEASED;
	s->part_acks = 0;
	s->parts_need = 0;
	s->credits = 0;
	s->lease++;
	s->task_id = t->id;
	s->worker_id = t->w->id;
	s->delivered = false;
	l->npending--;
	l->nleased++;
	t->nleased++;
	split_range(l, id, out);
	out->lease = s->lease;
}

/* The next pending split goes to task t; false when none is pending. */
static bool
split_take(struct split_ledger *l, task *t, cwi_split *out)
{
	uint64_t id;

	if (!ring_pop(l, &id))
		return false;
	take_id(l, t, id, out);
	return true;
}

/* The pending split at the head of the pool, stale entries dropped. */
static bool
ring_peek(struct split_ledger *l, uint64_t *id)
{
	while (l->ring_len > 0) {
		uint64_t s = l->ring[l->ring_head];
		if (l->splits[s].state == SPLIT_PENDING) {
			*id = s;
			return true;
		}
		l->ring_head = (l->ring_head + 1) % l->nsplits;
		l->ring_len--;
	}
	return false;
}

/* Removes the pool's entries of splits first..first+n-1: those at its
 * head (where a released group's members are, in order) at once, any
 * other by a scan. */
static void
ring_take_members(struct split_ledger *l, uint64_t first, uint64_t n)
{
	uint64_t w = 0;
	bool other = false;

	while (l->ring_len > 0 && l->ring[l->ring_head] >= first &&
	       l->ring[l->ring_head] < first + n) {
		l->ring_head = (l->ring_head + 1) % l->nsplits;
		l->ring_len--;
	}
	for (uint64_t i = 0; i < l->ring_len; i++) {
		uint64_t s = l->ring[(l->ring_head + i) % l->nsplits];
		other |= s >= first && s < first + n;
	}
	if (!other)
		return;
	for (uint64_t i = 0; i < l->ring_len; i++) {
		uint64_t s = l->ring[(l->ring_head + i) % l->nsplits];
		if (s < first || s >= first + n)
			l->ring[(l->ring_head + w++) % l->nsplits] = s;
	}
	l->ring_len = w;
}

/* Exactly once: a lease is one group. A group leased before comes back
 * whole, with its ranges and the elements its clients already have
 * (skip); a new one takes up to `want` consecutive splits never leased. */
static cachew_err
lease_group(cwi_dispatcher *d, task *t, uint64_t want,
    cwi_msg_split_lease_reply *rep)
{
	struct split_ledger *l = &t->job->ledger;
	uint64_t id, first, n = 1;
	split *g;

	if (!ring_pop(l, &id))
		return CACHEW_OK;
	first = l->splits[id].group != NO_GROUP ? l->splits[id].group : id;
	g = &l->splits[first];
	if (l->splits[id].group != NO_GROUP) {
		n = g->gsize;
		/* The group went back to the front of the pool together: its
		 * other members' entries go with this one, so that no split
		 * is ever in the pool twice (it holds nsplits entries). */
		ring_take_members(l, first, n);
	} else {
		uint64_t next;
		while (n < want && ring_peek(l, &next) && next == first + n &&
		       l->splits[next].group == NO_GROUP) {
			l->ring_head = (l->ring_head + 1) % l->nsplits;
			l->ring_len--;
			n++;
		}
		g->gsize = (uint32_t)n;
	}
	rep->splits = calloc((size_t)n, sizeof(*rep->splits));
	if (g->skip.n > 0)
		rep->skip = malloc(g->skip.n * sizeof(*rep->skip));
	if (rep->splits == NULL || (g->skip.n > 0 && rep->skip == NULL)) {
		/* Back to the front of the pool, as they were. */
		for (uint64_t k = n; k-- > 0;)
			if (l->splits[first + k].state == SPLIT_PENDING)
				ring_push(l, first + k, true);
		if (l->splits[id].group == NO_GROUP)
			g->gsize = 0;
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (uint64_t k = 0; k < n; k++) {
		split *s = &l->splits[first + k];
		s->group = first;
		/* A member acknowledged while pending (a late ack) is
		 * leased again with the rest: the ranges make the group. */
		if (s->state == SPLIT_PENDING) {
			take_id(l, t, first + k, &rep->splits[rep->nsplits]);
		} else {
			split_range(l, first + k, &rep->splits[rep->nsplits]);
			rep->splits[rep->nsplits].lease = s->lease;
		}
		rep->nsplits++;
	}
	rep->group = first;
	if (g->skip.n > 0)
		memcpy(rep->skip, g->skip.v, g->skip.n * sizeof(*rep->skip));
	rep->nskip = g->skip.n;
	if (cwi_disp_events_on(d)) {
		uint64_t ids[64];
		size_t m = n < 64 ? (size_t)n : 64;
		for (size_t k = 0; k < m; k++)
			ids[k] = first + k;
		cwi_disp_task_event(d, "split_leased", t);
		cwi_disp_ev_ids(d, "splits", ids, m);
		cwi_disp_ev_u64(d, "group", first);
		if (g->skip.n > 0)
			cwi_disp_ev_u64(d, "skip", cwi_rset_count(&g->skip));
		cwi_disp_ev_end(d);
	}
	return CACHEW_OK;
}

bool
cwi_ledger_lease_again(cwi_dispatcher *d, task *t,
    cwi_msg_split_lease_reply *rep)
{
	struct split_ledger *l = &t->job->ledger;
	uint64_t first = t->lease_group, n;
	const split *g;

	if (first == NO_GROUP || l->splits == NULL || first >= l->nsplits)
		return false;
	g = &l->splits[first];
	n = g->gsize;
	if (n == 0 || n > l->nsplits - first)
		return false;
	for (uint64_t k = 0; k < n; k++) {
		const split *s = &l->splits[first + k];
		if (s->state != SPLIT_LEASED || s->task_id != t->id ||
		    s->group != first)
			return false;
	}
	rep->splits = calloc((size_t)n, sizeof(*rep->splits));
	if (g->skip.n > 0)
		rep->skip = malloc(g->skip.n * sizeof(*rep->skip));
	if (rep->splits == NULL || (g->skip.n > 0 && rep->skip == NULL)) {
		free(rep->splits);
		free(rep->skip);
		rep->splits = NULL;
		rep->skip = NULL;
		return false;
	}
	for (uint64_t k = 0; k < n; k++) {
		split_range(l, first + k, &rep->splits[k]);
		rep->splits[k].lease = l->splits[first + k].lease;
	}
	rep->nsplits = (size_t)n;
	rep->group = first;
	if (g->skip.n > 0)
		memcpy(rep->skip, g->skip.v, g->skip.n * sizeof(*rep->skip));
	rep->nskip = g->skip.n;
	if (cwi_disp_events_on(d)) {
		cwi_disp_task_event(d, "split_lease_repeated", t);
		cwi_disp_ev_u64(d, "group", first);
		cwi_disp_ev_end(d);
	}
	return true;
}

cachew_err
cwi_ledger_lease(cwi_dispatcher *d, task *t, uint32_t max_splits,
    cwi_msg_split_lease_reply *rep)
{
	uint64_t want, ids_n = 0, *ids = NULL;

	if (lease_none(d, t, rep))
		return CACHEW_OK;
	if (t->job->ledger.shuffle_pending) {
		t->job->ledger.shuffle_pending = false;
		if (!t->w->direct)
			ledger_shuffle_pool(&t->job->ledger);
	}
	want = lease_count(d, t->job, max_splits);
	/* Exactly once, a remote worker's group is one split: what a death
	 * makes it compute again is at most one split, and a split's
	 * elements do not depend on which splits shared its lease (the same
	 * seed and epoch give the same data however the epoch was leased).
	 * A direct task (the embedded service's) takes what it asks for, a
	 * whole epoch, as one group: its output is the plain executor's. */
	if (t->job->exactly_once)
		return lease_group(d, t, t->w->direct ? want : 1, rep);
	rep->splits = calloc((size_t)want, sizeof(*rep->splits));
	if (cwi_disp_events_on(d))
		ids = malloc((size_t)want * sizeof(*ids));
	if (rep->splits == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	while (rep->nsplits < want &&
	       split_take(&t->job->ledger, t, &rep->splits[rep->nsplits])) {
		if (ids != NULL)
			ids[ids_n++] = rep->splits[rep->nsplits].split_id;
		rep->nsplits++;
	}
	if (ids != NULL) {
		cwi_disp_task_event(d, "split_leased", t);
		cwi_disp_ev_ids(d, "splits", ids, ids_n);
		cwi_disp_ev_end(d);
	}
	free(ids);
	return CACHEW_OK;
}

/* ---- delivery and release ------------------------------------------------ */

void
cwi_ledger_delivered(struct split_ledger *l, const task *t,
    const uint64_t *ids, size_t n)
{
	for (size_t k = 0; k < n && l->splits != NULL; k++) {
		uint64_t id = ids[k];
		if (id < l->nsplits && l->splits[id].state == SPLIT_LEASED &&
		    l->splits[id].task_id == t->id)
			l->splits[id].delivered = true;
	}
}

/* Splits a forgotten task still holds stay leased to its worker (which
 * delivered them, or they are released with it when it dies); the orphan
 * grace starts now. */
void
cwi_ledger_task_gone(struct split_ledger *l, const task *t, uint64_t now)
{
	if (t->nleased == 0 || l->splits == NULL)
		return;
	for (uint64_t k = 0; k < l->nsplits; k++) {
		split *s = &l->splits[k];
		if (s->state == SPLIT_LEASED && s->task_id == t->id) {
			s->task_id = 0;
			s->delivered = true;
			s->orphan_ns = now;
			l->orphan_hint++;
		}
	}
}

/* LEASED -> PENDING, at the front of the pool. */
static void
split_release(cwi_dispatcher *d, struct split_ledger *l, uint64_t id)
{
	split *s = &l->splits[id];
	task *t = s->task_id != 0 ? cwi_disp_find_task(d, s->task_id) : NULL;

	if (t != NULL && t->nleased > 0)
		t->nleased--;
	s->state = SPLIT_PENDING;
	s->task_id = 0;
	s->worker_id = 0;
	s->delivered = false;
	l->nleased--;
	l->npending++;
	ring_push(l, id, true);
}

/* Releases the leased, unacknowledged splits of job j that `match`
 * selects; one split_released event lists them. */
static void
release_splits(cwi_dispatcher *d, job *j, bool (*match)(const split *,
    uint64_t), uint64_t arg, const char *reason, uint64_t worker_id)
{
	struct split_ledger *l = &j->ledger;
	uint64_t *ids = NULL;
	size_t n = 0;

	if (l->splits == NULL || l->nleased == 0)
		return;
	if (cwi_disp_events_on(d))
		ids = malloc(l->nleased * sizeof(*ids));
	/* Backwards, so the front of the pool ends up in ascending order. */
	for (uint64_t k = l->nsplits; k-- > 0;) {
		if (l->splits[k].state != SPLIT_LEASED ||
		    !match(&l->splits[k], arg))
			continue;
		split_release(d, l, k);
		if (ids != NULL)
			ids[n] = k;
		n++;
	}
	if (n > 0 && ids != NULL) {
		for (size_t a = 0, b = n - 1; a < b; a++, b--) {
			uint64_t x = ids[a];
			ids[a] = ids[b];
			ids[b] = x;
		}
		cwi_disp_ev_begin(d, "split_released");
		cwi_disp_ev_u64(d, "job_id", j->id);
		if (worker_id != 0)
			cwi_disp_ev_u64(d, "worker_id", worker_id);
		cwi_disp_ev_str(d, "reason", reason);
		cwi_disp_ev_ids(d, "splits", ids, n);
		cwi_disp_ev_end(d);
	}
	free(ids);
}

/* A split whose task ended (its data delivered) that no client has
 * acknowledged within the grace period: the acknowledgement was lost (a
 * reply lost in a reset connection, a client that gave up on a worker).
 * Leasing it again may repeat elements; keeping it would end the epoch
 * never. `arg` is the cutoff time. */
static bool
match_orphaned(const split *s, uint64_t cutoff)
{
	return s->task_id == 0 && s->delivered && s->orphan_ns < cutoff;
}

static bool
match_worker(const split *s, uint64_t worker_id)
{
	return s->worker_id == worker_id;
}

/* A worker that deregistered drained first: the splits it delivered are
 * on their way to clients, whose acknowledgements can trail its goodbye
 * (a slow client: autoscale_process_provisioner_scales_a_job got 500
 * elements twice). Leased again they would come twice; uncoordinated,
 * they stay delivered and unacked, and the orphan rule (match_orphaned)
 * leases them again only if no acknowledgement comes within its grace. */
static bool
match_worker_undelivered(const split *s, uint64_t worker_id)
{
	return s->worker_id == worker_id && !s->delivered;
}

static bool
match_task(const split *s, uint64_t task_id)
{
	return s->task_id == task_id;
}

static bool
match_delivered(const split *s, uint64_t unused)
{
	(void)unused;
	return s->delivered;
}

void
cwi_ledger_release_worker(cwi_dispatcher *d, job *j, uint64_t worker_id,
    const char *reason)
{
	/* Exactly once: dropping the worker's tasks recovers their groups
	 * (cwi_recover_task_gone). */
	if (j->exactly_once)
		return;
	release_splits(d, j,
	    reason == NULL && !job_coordinated(j) ? match_worker_undelivered
						  : match_worker,
	    worker_id, reason != NULL ? reason : "worker_deregistered",
	    worker_id);
}

void
cwi_ledger_release_task(cwi_dispatcher *d, job *j, const task *t)
{
	release_splits(d, j, match_task, t->id, "task_ended", t->w->id);
}

void
cwi_ledger_release_delivered(cwi_dispatcher *d, job *j)
{
	if (j->exactly_once)
		return;
	release_splits(d, j, match_delivered, 0, "client_left", 0);
}

void
cwi_ledger_release_orphans(cwi_dispatcher *d, job *j, uint64_t now)
{
	struct split_ledger *l = &j->ledger;
	/* Ten client heartbeats, at least 2 s: an ack is sent the moment
	 * the split's end arrives, so this only catches lost ones. */
	uint64_t grace = (uint64_t)d->cfg.client_heartbeat_ms * 10000000u;

	if (grace < 2000000000u)
		grace = 2000000000u;
	if (l->splits == NULL || l->orphan_hint == 0)
		return;
	if (j->exactly_once)
		cwi_recover_tick(d, j, grace);
	else if (now > grace)
		release_splits(d, j, match_orphaned, now - grace,
		    "unacknowledged", 0);
	l->orphan_hint = 0;
	for (uint64_t k = 0; l->splits != NULL && k < l->nsplits; k++)
		if (l->splits[k].state == SPLIT_LEASED &&
		    (l->splits[k].task_id == 0 || l->splits[k].credits > 0))
			l->orphan_hint++;
}

/* ---- acknowledgement ----------------------------------------------------- */

/* The split's room for one more client acknowledging its part. */
static cachew_err
ackers_reserve(split *s)
{
	uint32_t cap;
	uint64_t *a;

	if (s->part_acks < s->ackers_cap)
		return CACHEW_OK;
	cap = s->ackers_cap < 4 ? 4 : s->ackers_cap * 2;
	if (cap <= s->ackers_cap ||
	    (a = realloc(s->ackers, cap * sizeof(*a))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->ackers = a;
	s->ackers_cap = cap;
	return CACHEW_OK;
}

/* Checks acknowledgements before any is applied: split ids in range, and
 * room to record each client's part of a split read by several. */
cachew_err
cwi_ledger_acks_check(const job *j, const uint64_t *ids,
    const uint64_t *parts, size_t n)
{
	const struct split_ledger *l = &j->ledger;

	for (size_t i = 0; i < n; i++) {
		split *s;
		cachew_err rv;

		if (ids[i] >= l->nsplits)
			return cwi_fail(CACHEW_EINVAL,
			    "split %" PRIu64 " is out of range: job %" PRIu64
			    " has %" PRIu64 " splits",
			    ids[i], j->id, l->nsplits);
		s = &l->splits[ids[i]];
		if (parts != NULL && parts[i] > 1 &&
		    s->state != SPLIT_ACKED &&
		    (rv = ackers_reserve(s)) != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* Whether client_id's part of s is new (and records it); room was
 * reserved by cwi_ledger_acks_check. */
static bool
part_ack_new(split *s, uint64_t client_id)
{
	for (uint32_t k = 0; k < s->part_acks; k++)
		if (s->ackers[k] == client_id)
			return false;
	s->ackers[s->part_acks++] = client_id;
	return true;
}

enum { ACK_DONE, ACK_DUPLICATE, ACK_PART };

/* One client's acknowledgement of split s (`parts`: how many clients read
 * it, 0 or 1 for one; `lease`: the lease it read, 0 unknown). */
static int
ack_one(cwi_dispatcher *d, struct split_ledger *l, split *s,
    uint64_t client_id, uint64_t parts, uint64_t lease)
{
	uint64_t need = parts > 0 ? parts : 1;

	s->acks++;
	if (s->state == SPLIT_ACKED)
		return ACK_DUPLICATE;
	/* A lease read by several clients of a shared job: each
	 * acknowledges its part, once. A part of an earlier lease (an ack
	 * resent after the split was released and leased again) is not a
	 * part of this one. */
	if (need > 1) {
		if ((lease != 0 && lease != s->lease) ||
		    !part_ack_new(s, client_id))
			return ACK_DUPLICATE;
		s->parts_need = (uint32_t)need;
		/* credits: parts of clients that left (exactly once). */
		if (s->part_acks + s->credits < need)
			return ACK_PART;
	}
	if (s->state == SPLIT_LEASED) {
		task *t = s->task_id != 0 ? cwi_disp_find_task(d, s->task_id)
					  : NULL;
		if (t != NULL && t->nleased > 0)
			t->nleased--;
		l->nleased--;
	} else if (s->state == SPLIT_RECOVERING) {
		/* Its task went, but every part of it did arrive. */
		l->nrecovering--;
	} else {
		/* Released after a death, yet it did arrive: its ring
		 * entry goes stale. */
		l->npending--;
	}
	s->state = SPLIT_ACKED;
	s->task_id = 0;
	free(s->ackers);
	s->ackers = NULL;
	s->ackers_cap = 0;
	l->nacked++;
	return ACK_DONE;
}

void
cwi_ledger_ack(cwi_dispatcher *d, job *j, uint64_t client_id,
    const uint64_t *ids, const uint64_t *parts, const uint64_t *leases,
    size_t n)
{
	uint64_t *fresh = NULL, nfresh = 0, dups = 0;

	if (n == 0)
		return;
	if (cwi_disp_events_on(d))
		fresh = malloc(n * sizeof(*fresh));
	for (size_t i = 0; i < n; i++) {
		int r = ack_one(d, &j->ledger, &j->ledger.splits[ids[i]],
		    client_id, parts != NULL ? parts[i] : 0,
		    leases != NULL ? leases[i] : 0);
		if (r == ACK_DUPLICATE)
			dups++;
		if (r != ACK_DONE)
			continue;
		if (fresh != NULL)
			fresh[nfresh] = ids[i];
		nfresh++;
	}
	if (fresh != NULL && (nfresh > 0 || dups > 0)) {
		cwi_disp_ev_begin(d, "split_acked");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_u64(d, "client_id", client_id);
		cwi_disp_ev_ids(d, "splits", fresh, (size_t)nfresh);
		if (dups > 0)
			cwi_disp_ev_u64(d, "duplicates", dups);
		cwi_disp_ev_end(d);
	}
	free(fresh);
}

/* ---- resuming a saved position -------------------------------------------- */

/* One group of a resume, checked against the ledger and the groups before
 * it (they come in split order, disjoint: prev_end is the split after the
 * one before), into *got. */
static cachew_err
resume_group_check(const struct split_ledger *l, const cwi_progress *p,
    uint64_t prev_end, cwi_rset *got)
{
	if (p->splits == 0 || p->group < prev_end || p->group >= l->nsplits ||
	    p->splits > l->nsplits - p->group)
		return cwi_fail(CACHEW_EINVAL, "resume: group %" PRIu64 " of %"
		    PRIu32 " splits is not within the job's %" PRIu64 " splits "
		    "after the group before it (split %" PRIu64 ")", p->group,
		    p->splits, l->nsplits, prev_end);
	if (!cwi_rset_list_ok(p->ranges, p->nranges))
		return cwi_fail(CACHEW_EINVAL, "resume: group %" PRIu64 ": its "
		    "ranges are not ascending, disjoint from-to pairs",
		    p->group);
	if (p->ended && p->nranges > 0 && p->ranges[p->nranges - 1] > p->total)
		return cwi_fail(CACHEW_EINVAL, "resume: group %" PRIu64 ": a "
		    "range ends at %" PRIu64 ", past its %" PRIu64 " elements",
		    p->group, p->ranges[p->nranges - 1], p->total);
	if (!cwi_rset_add_list(got, p->ranges, p->nranges))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

/* Puts the pending splits in the pool again: the groups formed by the
 * resume first (their elements were partly delivered: finish them first),
 * then the splits never leased, each in split order. */
static void
resume_pool(struct split_ledger *l)
{
	l->ring_head = l->ring_len = 0;
	for (int formed = 1; formed >= 0; formed--)
		for (uint64_t k = 0; k < l->nsplits; k++)
			if (l->splits[k].state == SPLIT_PENDING &&
			    (l->splits[k].group != NO_GROUP) == formed)
				ring_push(l, k, false);
}

cachew_err
cwi_ledger_resume(job *j, const cwi_msg_job_get_or_create *r,
    uint64_t counts[2])
{
	struct split_ledger *l = &j->ledger;
	uint64_t prev_end = 0, nacked = 0, nformed = 0;
	cachew_err rv;

	if (r->resume_units != l->nunits)
		return cwi_fail(CACHEW_EINVAL, "resume: the position was saved "
		    "over %" PRIu64 " split units, the job's input has %" PRIu64
		    " (its files changed, or an autocache pass reads it in "
		    "other units)", r->resume_units, l->nunits);
	if (r->resume_units_per_split != l->units_per_split) {
		/* Cut as the saved job was cut: a group is its ranges. */
		uint64_t ups = r->resume_units_per_split;
		if (l->nunits / ups + (l->nunits % ups != 0) >
		    CWI_PROTO_MAX_SPLITS)
			return cwi_fail(CACHEW_EINVAL, "resume: %" PRIu64
			    " units per split cut %" PRIu64 " units into more "
			    "than %u splits", ups, l->nunits,
			    CWI_PROTO_MAX_SPLITS);
		cwi_ledger_free(l);
		l->units_per_split = ups;
		rv = ledger_cut(l);
		if (rv != CACHEW_OK)
			return rv;
	}
	for (size_t i = 0; i < r->nresume; i++) {
		const cwi_progress *p = &r->resume[i];
		cwi_rset got = {0};
		split *g;
		bool done;

		rv = resume_group_check(l, p, prev_end, &got);
		if (rv != CACHEW_OK) {
			cwi_rset_free(&got);
			return rv;
		}
		prev_end = p->group + p->splits;
		done = p->ended && cwi_rset_covers(&got, 0, p->total);
		for (uint64_t k = p->group; k < prev_end; k++) {
			l->splits[k].group = p->group;
			if (!done)
				continue;
			l->splits[k].state = SPLIT_ACKED;
			l->npending--;
			l->nacked++;
		}
		g = &l->splits[p->group];
		g->gsize = p->splits;
		if (done) {
			nacked++;
			cwi_rset_free(&got);
			continue;
		}
		/* Formed again as it was, less what the client has. */
		g->skip = got;
		g->total_known = p->ended;
		g->total = p->ended ? p->total : 0;
		nformed++;
	}
	resume_pool(l);
	counts[0] = nacked;
	counts[1] = nformed;
	return CACHEW_OK;
}
