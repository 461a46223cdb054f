/*
 * client_coord.c - coordinated reads on the client side (client_coord.h).
 */
#include "client_coord.h"

#include <stdlib.h>
#include <sys/types.h>

enum {
	SLOT_EMPTY = 0, /* not asked for */
	SLOT_SENT,      /* a request is in flight */
	SLOT_HAVE,      /* the reply is here */
	SLOT_RETRY      /* the request failed: ask again at retry_at */
};

/* One of a task's rounds that was asked for and not yet delivered. */
typedef struct slot {
	uint8_t state;
	bool end; /* end_of_task */
	uint64_t retry_at;
	cwi_element *element;
	cwi_split_end *ends;
	size_t nends;
} slot;

typedef struct ctask {
	cwi_task_info info; /* address unused (NULL) */
	bool ended;         /* its end round was delivered */
	bool vanished;      /* left the list with requests in flight */
	uint64_t end_at;    /* task round of its end; UINT64_MAX: unknown */
	uint64_t consumed;  /* next task round to deliver */
	uint64_t requested; /* first task round never asked for */
	slot *ring;         /* task round tr at ring[tr % per_task] */
} ctask;

struct cwi_coord {
	uint32_t window, per_task;
	ctask *tasks; /* the schedule, in task id order */
	size_t ntasks;
	cwi_task_info *infos; /* tasks[i].info, for cwi_coord_round_task */
	uint32_t *walk;       /* scratch of next_request, one per task */
	uint64_t next;        /* next round to deliver */
	uint64_t block;       /* block_round */
	bool seen_tasks;      /* a task list was ever non-empty */
};

static void
slot_clear(slot *s)
{
	cwi_element_release(s->element);
	free(s->ends);
	memset(s, 0, sizeof(*s));
}

static void
ctask_free(ctask *t, uint32_t per_task)
{
	if (t->ring != NULL)
		for (uint32_t i = 0; i < per_task; i++)
			slot_clear(&t->ring[i]);
	free(t->ring);
	t->ring = NULL;
}

cachew_err
cwi_coord_create(cwi_coord **out, uint32_t window, uint32_t per_task)
{
	cwi_coord *c;

	*out = NULL;
	if (window == 0 || per_task == 0)
		return cwi_fail(CACHEW_EINVAL, "coordinated reads: window %u "
		    "and per_task %u must be positive", window, per_task);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->window = window;
	c->per_task = per_task;
	c->block = CWI_ROUND_NONE;
	*out = c;
	return CACHEW_OK;
}

void
cwi_coord_destroy(cwi_coord *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->ntasks; i++)
		ctask_free(&c->tasks[i], c->per_task);
	free(c->tasks);
	free(c->infos);
	free(c->walk);
	free(c);
}

static bool
in_flight(const ctask *t, uint32_t per_task)
{
	for (uint32_t i = 0; t->ring != NULL && i < per_task; i++)
		if (t->ring[i].state == SLOT_SENT)
			return true;
	return false;
}

static ssize_t
find_task(const cwi_coord *c, uint64_t task_id)
{
	for (size_t i = 0; i < c->ntasks; i++)
		if (c->tasks[i].info.task_id == task_id)
			return (ssize_t)i;
	return -1;
}

static int
by_task_id(const void *a, const void *b)
{
	uint64_t x = ((const ctask *)a)->info.task_id;
	uint64_t y = ((const ctask *)b)->info.task_id;

	return x < y ? -1 : x > y;
}

cachew_err
cwi_coord_update(cwi_coord *c, const cwi_task_info *tasks, size_t ntasks,
    uint64_t block_round)
{
	size_t cap = c->ntasks + ntasks, n = 0;
	ctask *nt = calloc(cap > 0 ? cap : 1, sizeof(*nt));
	cwi_task_info *ni = calloc(cap > 0 ? cap : 1, sizeof(*ni));
	uint32_t *nw = calloc(cap > 0 ? cap : 1, sizeof(*nw));
	bool *kept = calloc(c->ntasks > 0 ? c->ntasks : 1, sizeof(*kept));

	if (nt == NULL || ni == NULL || nw == NULL || kept == NULL)
		goto nomem;
	for (size_t k = 0; k < ntasks; k++) {
		ssize_t old = find_task(c, tasks[k].task_id);
		ctask *t = &nt[n];

		if (old >= 0 && kept[old])
			continue; /* listed twice: the first one counts */
		if (old >= 0) {
			*t = c->tasks[old];
			t->vanished = false;
			kept[old] = true;
		} else {
			t->ring = calloc(c->per_task, sizeof(*t->ring));
			if (t->ring == NULL)
				goto nomem_new;
			t->end_at = UINT64_MAX;
		}
		t->info = tasks[k];
		t->info.address = NULL;
		n++;
	}
	/* A task that ended keeps its place in the round numbering after
	 * the list drops it; so does one with requests in flight until they
	 * settle: the dispatcher drops a task once its worker sent every
	 * consumer the end round, which may still be on its way here. One
	 * that vanished before its end, with nothing in flight, is gone (its
	 * worker died, or it was removed and its end_round passed). */
	for (size_t i = 0; i < c->ntasks; i++) {
		if (kept[i])
			continue;
		if (c->tasks[i].ended || c->tasks[i].end_at != UINT64_MAX) {
			nt[n++] = c->tasks[i];
		} else if (in_flight(&c->tasks[i], c->per_task)) {
			c->tasks[i].vanished = true;
			nt[n++] = c->tasks[i];
		} else {
			ctask_free(&c->tasks[i], c->per_task);
		}
	}
	qsort(nt, n, sizeof(*nt), by_task_id);
	for (size_t i = 0; i < n; i++)
		ni[i] = nt[i].info;
	free(c->tasks);
	free(c->infos);
	free(c->walk);
	free(kept);
	c->tasks = nt;
	c->infos = ni;
	c->walk = nw;
	c->ntasks = n;
	c->block = block_round;
	if (ntasks > 0)
		c->seen_tasks = true;
	return CACHEW_OK;
nomem_new:
	/* Undo: the rings made for new tasks go, the old tasks stay. */
	for (size_t i = 0; i < n; i++)
		if (find_task(c, nt[i].info.task_id) < 0)
			ctask_free(&nt[i], c->per_task);
nomem:
	free(nt);
	free(ni);
	free(nw);
	free(kept);
	return cwi_fail(CACHEW_ENOMEM, "out of memory");
}

/* The index of the task serving round r, or -1 when none does. */
static ssize_t
round_index(const cwi_coord *c, uint64_t r)
{
	uint64_t id;
	bool any = false;

	for (size_t i = 0; i < c->ntasks && !any; i++)
		any = c->infos[i].start_round <= r && r < c->infos[i].end_round;
	/* (checked first: the schedule's own error path formats a message
	 * per call) */
	if (!any || cwi_coord_round_task(c->infos, c->ntasks, r, &id) !=
			CACHEW_OK)
		return -1;
	return find_task(c, id);
}

bool
cwi_coord_next_request(cwi_coord *c, uint64_t now_ns, cwi_coord_request *out)
{
	uint64_t r = c->next;

	if (c->ntasks > 0)
		memset(c->walk, 0, c->ntasks * sizeof(*c->walk));
	for (uint32_t i = 0; i < c->window && r < c->block; i++, r++) {
		ssize_t idx = round_index(c, r);
		ctask *t;
		uint64_t tr;
		slot *s;

		if (idx < 0)
			break;
		t = &c->tasks[idx];
		/* The next round the schedule gives this task takes its next
		 * task round, and so on. */
		tr = t->consumed + c->walk[idx]++;
		if (t->ended || t->vanished)
			continue;
		if (tr > t->end_at || tr >= t->consumed + c->per_task)
			continue;
		s = &t->ring[tr % c->per_task];
		if (tr >= t->requested) {
			s->state = SLOT_SENT;
			t->requested = tr + 1;
		} else if (s->state == SLOT_RETRY && s->retry_at <= now_ns) {
			s->state = SLOT_SENT;
		} else {
			continue;
		}
		out->task_id = t->info.task_id;
		out->task_round = tr;
		out->round = r;
		return true;
	}
	return false;
}

/* A vanished task whose last request settled without its end: it leaves
 * the schedule now. */
static void
settle(cwi_coord *c, size_t idx)
{
	ctask *t = &c->tasks[idx];

	if (!t->vanished || t->ended || t->end_at != UINT64_MAX ||
	    in_flight(t, c->per_task))
		return;
	ctask_free(t, c->per_task);
	memmove(&c->tasks[idx], &c->tasks[idx + 1],
	    (c->ntasks - idx - 1) * sizeof(*c->tasks));
	memmove(&c->infos[idx], &c->infos[idx + 1],
	    (c->ntasks - idx - 1) * sizeof(*c->infos));
	c->ntasks--;
}

cachew_err
cwi_coord_received(cwi_coord *c, uint64_t task_id, uint64_t task_round,
    cwi_element *element, bool end_of_task, cwi_split_end *ends,
    size_t nends)
{
	ssize_t idx = find_task(c, task_id);
	ctask *t;
	slot *s;
	cachew_err rv;

	if (idx < 0) {
		rv = cwi_fail(CACHEW_ENOENT, "task %llu is not in the "
		    "schedule", (unsigned long long)task_id);
		goto drop;
	}
	t = &c->tasks[idx];
	if (t->ended || task_round < t->consumed) {
		rv = cwi_fail(CACHEW_ENOENT, "task %llu: round %llu is not "
		    "wanted any more", (unsigned long long)task_id,
		    (unsigned long long)task_round);
		goto drop;
	}
	s = &t->ring[task_round % c->per_task];
	if (task_round >= t->requested ||
	    (s->state != SLOT_SENT && s->state != SLOT_RETRY)) {
		rv = cwi_fail(CACHEW_EINVAL, "task %llu: a reply for its round "
		    "%llu, which was not asked for", (unsigned long long)task_id,
		    (unsigned long long)task_round);
		goto drop;
	}
	if ((element == NULL) != end_of_task) {
		rv = cwi_fail(CACHEW_EINVAL, "task %llu: round %llu %s",
		    (unsigned long long)task_id,
		    (unsigned long long)task_round,
		    end_of_task ? "ends the task but carries an element"
				: "carries no element and does not end the "
				  "task");
		goto drop;
	}
	s->state = SLOT_HAVE;
	s->end = end_of_task;
	s->element = element;
	s->ends = ends;
	s->nends = nends;
	if (end_of_task && task_round < t->end_at)
		t->end_at = task_round;
	settle(c, (size_t)idx);
	return CACHEW_OK;
drop:
	cwi_element_release(element);
	free(ends);
	return rv;
}

void
cwi_coord_failed(cwi_coord *c, uint64_t task_id, uint64_t task_round,
    uint64_t retry_at_ns)
{
	ssize_t idx = find_task(c, task_id);
	ctask *t;
	slot *s;

	if (idx < 0)
		return;
	t = &c->tasks[idx];
	if (t->ended || task_round < t->consumed || task_round >= t->requested)
		return;
	s = &t->ring[task_round % c->per_task];
	if (s->state != SLOT_SENT)
		return;
	s->state = SLOT_RETRY;
	s->retry_at = retry_at_ns;
	/* A vanished task is not asked again (unless listed again). */
	settle(c, (size_t)idx);
}

/* No task can serve the next round or a later one. */
static bool
finished(const cwi_coord *c)
{
	if (!c->seen_tasks || c->ntasks == 0)
		return false;
	for (size_t i = 0; i < c->ntasks; i++) {
		const ctask *t = &c->tasks[i];
		if (!t->ended && t->info.end_round > c->next)
			return false;
	}
	return true;
}

cwi_coord_pop_result
cwi_coord_pop(cwi_coord *c, cwi_coord_round *out)
{
	memset(out, 0, sizeof(*out));
	for (;;) {
		ssize_t idx;
		ctask *t;
		slot *s;

		if (finished(c))
			return CWI_COORD_END;
		if (c->next >= c->block)
			return CWI_COORD_WAIT;
		idx = round_index(c, c->next);
		if (idx < 0)
			return CWI_COORD_WAIT; /* served later (a task starts) */
		t = &c->tasks[idx];
		if (t->ended) {
			c->next++; /* an ended task's rounds are empty */
			continue;
		}
		s = &t->ring[t->consumed % c->per_task];
		if (s->state != SLOT_HAVE)
			return CWI_COORD_WAIT;
		out->round = c->next;
		out->task_id = t->info.task_id;
		out->element = s->element;
		out->ends = s->ends;
		out->nends = s->nends;
		s->element = NULL;
		s->ends = NULL;
		if (s->end) {
			/* Rounds asked for beyond the end are useless. */
			t->ended = true;
			for (uint32_t i = 0; i < c->per_task; i++)
				slot_clear(&t->ring[i]);
		} else {
			slot_clear(s);
		}
		t->consumed++;
		c->next++;
		return CWI_COORD_ROUND;
	}
}

uint64_t
cwi_coord_next_round(const cwi_coord *c)
{
	return c->next;
}

bool
cwi_coord_blocked(const cwi_coord *c)
{
	return c->next >= c->block;
}
