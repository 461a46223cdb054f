/*
 * client_rounds.c - coordinated reads on the session's side
 * (num_consumers > 0): the fetch thread asks each task for its next rounds
 * by task round, keeps each reply until its round comes, and moves rounds
 * into the queue strictly in round order, acknowledging each round's split
 * ends as it goes. Which task serves a round and which rounds to ask for
 * ahead is client_coord.c's bookkeeping (s->coord); this file owns the
 * session's side of it: the requests, the replies, coord_eof and the
 * element counters of the budget (coord_elements, coord_bytes).
 *
 * Runs on the fetch thread; takes s->lock only inside client.c's shared
 * functions (the queue, cwi_client_wake, cwi_client_fail).
 */
#include "client_int.h"

#include <stdlib.h>

/* Rounds asked for ahead of the next one delivered, and at most this many
 * of one task's rounds at once (each request is one element, so more are
 * in flight than in stream mode). */
#define COORD_WINDOW 64u
#define COORD_PER_TASK 16u

cachew_err
cwi_client_rounds_start(session *s)
{
	return cwi_coord_create(&s->coord, COORD_WINDOW, COORD_PER_TASK);
}

/* Coordinated: the task rounds the next rounds need (client_coord.h),
 * within the client buffer: what is queued plus what is asked for, at the
 * mean size of the elements received so far. */
void
cwi_client_rounds_send(session *s)
{
	uint64_t now = cwi_now_ns();
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer, outstanding = 0;
	cwi_coord_request cr;

	for (size_t k = 0; k < s->ntasks; k++)
		outstanding += s->tasks[k].inflight;
	for (;;) {
		uint64_t mean = s->coord_elements > 0
		    ? s->coord_bytes / s->coord_elements : 0;
		if (outstanding > 0 &&
		    cwi_client_queue_bytes(s) + outstanding * mean > budget)
			break;
		if (!cwi_coord_next_request(s->coord, now, &cr))
			break;
		outstanding++;
		ctask *t = cwi_client_task_by_id(s, cr.task_id);
		cwi_msg_get_elements g;
		size_t slot;

		if (t == NULL) {
			/* Listed, but its worker could not be dialed. */
			cwi_coord_failed(s->coord, cr.task_id, cr.task_round,
			    now + 200000000u);
			continue;
		}
		slot = (size_t)(t - s->tasks);
		cwi_pmsg_body_init(CWI_MSG_GET_ELEMENTS, &g);
		g.task_id = cr.task_id;
		g.client_id = s->client_id;
		g.consumer_index = s->ctx->opts.consumer_index;
		g.round = cr.round;
		g.task_round = cr.task_round;
		g.max_elements = 1;
		g.compression = cwi_client_ask_compression(s, t);
		if (cwi_client_send_get(s, slot, &g, TAG_DATA_BASE +
			(cr.task_round << TAG_SLOT_BITS | slot)) != CACHEW_OK)
			cwi_coord_failed(s->coord, cr.task_id, cr.task_round,
			    now + 100000000u);
	}
}

/* Coordinated: a reply is one task round, kept until its round comes. */
void
cwi_client_rounds_reply(session *s, ctask *t, cwi_completion *c,
    uint64_t task_round)
{
	cwi_pmsg hdr;
	cwi_msg_get_elements_reply *r;
	cwi_element **v = NULL;
	size_t n = 0;
	cachew_err rv;

	if (cwi_client_data_failed(s, t, c, &hdr, task_round))
		return;
	r = &hdr.u.get_elements_reply;
	if (r->task_round != task_round || r->task_id != t->task_id) {
		cwi_client_fail(s, CACHEW_EPROTO, "%s: a reply for task %llu "
		    "round %llu answers task %llu round %llu", t->address,
		    (unsigned long long)t->task_id,
		    (unsigned long long)task_round,
		    (unsigned long long)r->task_id,
		    (unsigned long long)r->task_round);
		goto done;
	}
	rv = cwi_client_reply_elements(s, t, c->reply, r, &v, &n);
	if (rv != CACHEW_OK) {
		cwi_client_fail(s, rv, "%s", cwi_errmsg_get());
		goto done;
	}
	if (n > 1 || (n == 0 && !r->end_of_task)) {
		/* Not a round: nothing ready (a worker may say so), or more
		 * than one element, which no consumer can take in lock-step. */
		if (n > 1) {
			cwi_client_fail(s, CACHEW_EPROTO, "%s: %zu elements "
			    "for one coordinated round", t->address, n);
		} else {
			cwi_coord_failed(s->coord, t->task_id, task_round,
			    cwi_now_ns() + 1000000u);
		}
		cwi_client_release_all(v, n);
		goto done;
	}
	if (n == 1) {
		s->coord_elements++;
		s->coord_bytes += cwi_element_nbytes(v[0]);
	}
	rv = cwi_coord_received(s->coord, t->task_id, task_round,
	    n == 1 ? v[0] : NULL, r->end_of_task, r->split_ends,
	    r->nsplit_ends);
	free(v);
	r->split_ends = NULL; /* taken */
	r->nsplit_ends = 0;
	if (rv == CACHEW_EINVAL)
		cwi_client_fail(s, CACHEW_EPROTO, "%s: %s", t->address,
		    cwi_errmsg_get());
done:
	cwi_pmsg_free(&hdr);
	cwi_msg_destroy(c->reply);
}

/* Coordinated: moves the rounds that are ready into the queue, in round
 * order, while the buffer has room; acknowledges their splits. */
void
cwi_client_rounds_deliver(session *s)
{
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer;
	bool pushed = false;

	while (!s->coord_eof && cwi_client_queue_bytes(s) < budget) {
		cwi_coord_round cr;
		cwi_coord_pop_result rv = cwi_coord_pop(s->coord, &cr);

		if (rv == CWI_COORD_END) {
			s->coord_eof = true;
			break;
		}
		if (rv == CWI_COORD_WAIT)
			break;
		for (size_t i = 0; i < cr.nends; i++) {
			if (!cwi_client_add_ack(s, cr.ends[i].split_id,
				cr.ends[i].parts > 0 ? cr.ends[i].parts : 1,
				cr.ends[i].lease))
				cwi_client_fail(s, CACHEW_ENOMEM,
				    "out of memory");
		}
		free(cr.ends);
		if (cr.element != NULL) {
			if (!cwi_client_queue_push(s, cr.element)) {
				cwi_element_release(cr.element);
				cwi_client_fail(s, CACHEW_ENOMEM,
				    "out of memory");
				break;
			}
			pushed = true;
		}
	}
	if (pushed)
		cwi_client_wake(s);
}
