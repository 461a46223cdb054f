/*
 * client_coord.h - coordinated reads on the client side: which task serves
 * each round, which of a task's rounds to ask for ahead, and delivery of
 * the rounds in order (docs/protocol.md, "Coordinated reads on the wire").
 *
 * A consumer reads rounds 0, 1, 2, ... Round r comes from the task that
 * cwi_coord_round_task() picks from the schedule (the heartbeat's task
 * list). Every task hands out its rounds in one order to every consumer,
 * and numbers them itself: the k-th round a consumer reads from task T is
 * T's round k (the request's `task_round`), whatever the global round
 * number. So requests can go out ahead, several per task, before the
 * schedule of the rounds they will serve is final: a reply is used by the
 * next round the schedule gives to its task. Consumers that agree on the
 * schedule (the dispatcher's block_round protocol sees to it) therefore
 * get, for each round, element i of the same round of the same task.
 *
 * A task's end (end_of_task at its round e) is the same round e for every
 * consumer: the round that serves it yields no element, and later rounds
 * the schedule gives the task are skipped. A task that ended stays in the
 * schedule after the dispatcher drops it from the list, so that the round
 * numbering stays the same for every consumer; a task that disappears
 * without having ended (its worker died) leaves the schedule at once.
 *
 * The epoch ends when the schedule holds tasks and none of them can serve
 * a round at or after the next one: every task ended or its end_round
 * passed, and none waits to start.
 *
 * Pure: no I/O, no locks; times come from the caller. One thread at a
 * time.
 */
#ifndef CWI_CLIENT_COORD_H
#define CWI_CLIENT_COORD_H

#include "../service_proto.h"

typedef struct cwi_coord cwi_coord;

/* A round taken by cwi_coord_pop. */
typedef struct cwi_coord_round {
	uint64_t round;
	uint64_t task_id;
	cwi_element *element; /* the caller's reference; NULL: no element (a
			       * task's end) */
	cwi_split_end *ends;  /* split ends that came with it (free()) */
	size_t nends;
} cwi_coord_round;

/* A request to send. */
typedef struct cwi_coord_request {
	uint64_t task_id;
	uint64_t task_round;
	uint64_t round; /* the round it is expected to serve (informative) */
} cwi_coord_request;

/* window: rounds to ask for ahead of the next one to deliver; per_task:
 * at most this many of one task's rounds asked for and not yet delivered.
 * CACHEW_ENOMEM, CACHEW_EINVAL for a zero. */
cachew_err cwi_coord_create(cwi_coord **out, uint32_t window,
    uint32_t per_task);
/* Frees everything, replies held included. NULL is a no-op. */
void cwi_coord_destroy(cwi_coord *c);

/* A heartbeat reply's task list and block_round (CWI_ROUND_NONE: none).
 * Tasks that vanished without ending leave the schedule (their held
 * replies are dropped). CACHEW_ENOMEM (nothing changed then). */
cachew_err cwi_coord_update(cwi_coord *c, const cwi_task_info *tasks,
    size_t ntasks, uint64_t block_round);

/* The next request to send now (marked as sent), if any: a task round the
 * next `window` rounds need, in order per task, or one whose retry time
 * (cwi_coord_failed) has come. */
bool cwi_coord_next_request(cwi_coord *c, uint64_t now_ns,
    cwi_coord_request *out);

/* A reply to a request: `element` (NULL for end_of_task) and the split
 * ends (ends, an array of nends the function takes over, NULL when 0).
 * Takes both in every case. CACHEW_EINVAL (errmsg set) when nothing asked
 * for it (an unknown task, a task round not in flight, element and
 * end_of_task that disagree): the caller may treat that as the worker's
 * protocol error; the reply is dropped. */
cachew_err cwi_coord_received(cwi_coord *c, uint64_t task_id,
    uint64_t task_round, cwi_element *element, bool end_of_task,
    cwi_split_end *ends, size_t nends);

/* A request failed: ask again at retry_at_ns or later. Unknown requests
 * are ignored. */
void cwi_coord_failed(cwi_coord *c, uint64_t task_id, uint64_t task_round,
    uint64_t retry_at_ns);

typedef enum cwi_coord_pop_result {
	CWI_COORD_ROUND, /* *out holds the next round; the round advanced */
	CWI_COORD_WAIT,  /* its reply is not here yet, or the round waits
			  * for a schedule change (block_round) */
	CWI_COORD_END    /* the epoch is over */
} cwi_coord_pop_result;

/* Takes the next round. Rounds of ended tasks are skipped without
 * output. */
cwi_coord_pop_result cwi_coord_pop(cwi_coord *c, cwi_coord_round *out);

/* The next round to deliver (what heartbeats report). */
uint64_t cwi_coord_next_round(const cwi_coord *c);
/* Whether delivery waits for a schedule change (next round >=
 * block_round). */
bool cwi_coord_blocked(const cwi_coord *c);

#endif /* CWI_CLIENT_COORD_H */
