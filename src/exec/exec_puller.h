/*
 * exec_puller.h - a thread that pulls for a caller who waits with a
 * deadline: what cachew_iterator_next_timeout and cachew_iterator_cancel
 * stand on (exec_iter.c).
 *
 * A pull in the caller's own thread cannot be abandoned: it returns when
 * the operator it is in returns, which may be a JPEG decode or a worker
 * that does not answer. So a caller that wants to stop waiting hands the
 * pull to this thread and waits on a condition variable: on its deadline
 * it returns CACHEW_ETIMEDOUT and the pull goes on, its result kept for
 * the next wait; on cwi_puller_cancel every waiter returns
 * CACHEW_ECANCELED at once. One pull runs at a time and none runs ahead:
 * a pull starts only when a caller asks for elements, so the pipeline
 * computes what it would have without the thread (its position, its
 * saved state and its order are the same).
 *
 * Thread safety: cwi_puller_wait by one thread at a time (the iterator's
 * consumer); cwi_puller_cancel from any thread; cwi_puller_destroy by the
 * consumer once the pull in flight, if any, can return (the pipeline was
 * cancelled). Locking: p->lock guards the request, the result and the
 * flags; the pull itself runs without it.
 */
#ifndef CWI_EXEC_PULLER_H
#define CWI_EXEC_PULLER_H

#include "exec.h"

/* Appends the next elements to out (room for them is its job) and returns
 * CACHEW_OK, or returns the end or the error, like cwi_iter_next. */
typedef cachew_err (*cwi_pull_fn)(void *arg, cwi_chunk *out);

typedef struct cwi_puller cwi_puller;

/* Starts the pulling thread. CACHEW_ENOMEM when it cannot be allocated or
 * started, with a cwi_fail message. */
cachew_err cwi_puller_create(cwi_puller **out, cwi_pull_fn fn, void *arg);
/* Asks for a pull unless one is running or its result waits, then waits
 * for the result at most timeout_ns (UINT64_MAX: without a bound). On
 * CACHEW_OK the pulled elements are in *got (swapped with it: give an
 * empty chunk, whose storage the puller keeps for its next pull) and the
 * pull's own return value in *result. CACHEW_ETIMEDOUT: the pull goes on
 * and the next wait gets its result. CACHEW_ECANCELED after
 * cwi_puller_cancel. */
cachew_err cwi_puller_wait(cwi_puller *p, uint64_t timeout_ns, cwi_chunk *got,
    cachew_err *result);
/* True while a pull is asked for, running, or its result waits: the
 * consumer's elements are then in the puller's hands. Consumer only. */
bool cwi_puller_pending(cwi_puller *p);
/* Makes every wait, present and future, return CACHEW_ECANCELED. The pull
 * in flight is not interrupted: cancel the pipeline too. */
void cwi_puller_cancel(cwi_puller *p);
/* Stops the thread (after the pull in flight returns), releases the
 * elements of a result nobody took, and frees p. NULL is a no-op. */
void cwi_puller_destroy(cwi_puller *p);

#endif /* CWI_EXEC_PULLER_H */
