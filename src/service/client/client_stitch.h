/*
 * client_stitch.h - stitching the tails of leases (exactly once).
 *
 * A worker runs each lease of a job as its own pipeline, so a batch (or
 * padded_batch) of the worker part would end every lease with a short
 * batch, or drop one with drop_remainder. Instead the worker keeps each
 * grouping operator's last, partial group and sends its elements as tails
 * (cwi_run.tail); the client gathers them here and runs the part of the
 * worker pipeline from that operator up (cwi_split_stitch_graph) over them
 * as soon as they fill whole groups, and once more over what is left when
 * the epoch ends. So every batch is full but at most one per grouping
 * operator per epoch (per client of a shared job), and drop_remainder
 * drops fewer than n elements per epoch, as in-process.
 *
 * Thread safety: none; the session serialises its calls.
 */
#ifndef CWI_CLIENT_STITCH_H
#define CWI_CLIENT_STITCH_H

#include "../../exec/exec_split.h"
#include "../../core/options.h"

typedef struct cwi_stitch cwi_stitch;

/* What stitching made, per operator of the worker part (index: its
 * position from the source, 0), added to the workers' rows in the
 * iterator's stats. */
typedef struct cwi_stitch_counts {
	_Atomic uint64_t elements[64];
	_Atomic uint64_t bytes[64];
} cwi_stitch_counts;

/* A stitcher for plan p (p->ngroups > 0; p must outlive it), whose runs
 * use the client's options with the job's seed and add what they make to
 * *counts (borrowed; NULL: not counted). */
cachew_err cwi_stitch_create(cwi_stitch **out, const cwi_split_plan *p,
    const cwi_opts *opts, uint64_t seed, uint64_t epoch,
    cwi_stitch_counts *counts);
/* Takes a tail element of grouping operator k (cwi_run.tail - 1). */
cachew_err cwi_stitch_add(cwi_stitch *st, uint32_t k, cwi_element *e);
/* Runs what is ready: whole groups of every operator, or (final)
 * everything held, the epoch's last partial groups included. Appends the
 * worker part's output elements so made to out (room reserved here).
 * Errors (the stitched pipeline's own: a batch of mismatched shapes) carry
 * their message in err. */
cachew_err cwi_stitch_drain(cwi_stitch *st, bool final, cwi_chunk *out,
    char *err, size_t errlen);
/* Elements held (0: nothing to stitch at the end). */
size_t cwi_stitch_held(const cwi_stitch *st);
/* Writes the tails held, an array per grouping operator of the plan
 * (exec_state.h's element form), for a saved position; a restore gives
 * them back through cwi_stitch_add. Errors through cwi_fail. */
struct cwi_state_writer;
cachew_err cwi_stitch_save(const cwi_stitch *st, struct cwi_state_writer *w);
void cwi_stitch_destroy(cwi_stitch *st);

#endif /* CWI_CLIENT_STITCH_H */
