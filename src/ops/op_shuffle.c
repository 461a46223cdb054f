/*
 * op_shuffle.c - shuffle(buffer, seed, reshuffle_each_iteration): tf.data's
 * buffered shuffle. The buffer is filled to `buffer` elements; each output
 * is a uniformly chosen slot, refilled from the input before the next
 * choice; once the input ends the buffer drains in random order.
 *
 * Determinism: the slot layout and the random draws depend only on the
 * seed and the element sequence, never on how the consumer chunks its
 * requests, so a seed gives the same order in every run.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdlib.h>

/* Input elements pulled ahead at most per request. */
#define SHUFFLE_PULL_MAX 1024

typedef struct shuffle_iter {
	cwi_iter base;
	cwi_iter *input;
	cwi_chunk buf;   /* the shuffle buffer: buf.n filled slots */
	size_t cap;      /* buffer size */
	cwi_chunk in;    /* pulled ahead: in.v[pos..n) not yet buffered */
	size_t pos;
	cwi_rng rng;
	bool input_done;
} shuffle_iter;

/* Fills the buffer to its size, or until the input ends. */
static cachew_err
fill(shuffle_iter *s, size_t want_out)
{
	cachew_err rv;

	while (s->buf.n < s->cap && !s->input_done) {
		if (s->pos == s->in.n) {
			size_t want = s->cap - s->buf.n + want_out;
			s->in.n = 0;
			s->pos = 0;
			rv = cwi_iter_next(s->input, &s->in,
			    want < SHUFFLE_PULL_MAX ? want : SHUFFLE_PULL_MAX);
			if (rv == CACHEW_EOF) {
				s->input_done = true;
				break;
			}
			if (rv != CACHEW_OK)
				return rv;
		}
		rv = cwi_chunk_reserve(&s->buf, 1);
		if (rv != CACHEW_OK)
			return cwi_pipeline_fail(s->base.pl, rv,
			    "shuffle: out of memory for a buffer of %zu "
			    "elements", s->cap);
		while (s->buf.n < s->cap && s->buf.n < s->buf.cap &&
		    s->pos < s->in.n) {
			/* Held for long: must not pin whole read blocks. */
			cwi_element *e = cwi_element_compact(s->in.v[s->pos++]);
			if (e == NULL)
				return cwi_pipeline_fail(s->base.pl,
				    CACHEW_ENOMEM, "shuffle: out of memory");
			cwi_chunk_push(&s->buf, e);
		}
	}
	return CACHEW_OK;
}

static cachew_err
shuffle_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	shuffle_iter *s = (shuffle_iter *)it;
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		rv = fill(s, max - got);
		if (rv != CACHEW_OK)
			return rv; /* what was drawn comes first (exec.h) */
		if (s->buf.n == 0)
			break;
		size_t i = (size_t)cwi_rng_below(&s->rng, s->buf.n);
		cwi_chunk_push(out, s->buf.v[i]);
		s->buf.v[i] = s->buf.v[--s->buf.n];
		got++;
	}
	if (it->stats != NULL)
		atomic_store_explicit(&it->stats->buffered, (int64_t)s->buf.n,
		    memory_order_relaxed);
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
shuffle_destroy(cwi_iter *it)
{
	shuffle_iter *s = (shuffle_iter *)it;

	cwi_iter_destroy(s->input);
	cwi_chunk_free(&s->buf);
	for (size_t i = s->pos; i < s->in.n; i++)
		cwi_element_release(s->in.v[i]);
	free(s->in.v);
	free(s);
}

/* [rng, input done, buffer (slot order), pulled ahead, input]: the slots
 * and the generator are what the next draws depend on. */
static cachew_err
shuffle_save(cwi_iter *it, cwi_state_writer *w)
{
	shuffle_iter *s = (shuffle_iter *)it;
	cachew_err rv;

	cwi_sw_array(w, 5);
	cwi_sw_uint(w, s->rng.state);
	cwi_sw_bool(w, s->input_done);
	rv = cwi_sw_elements(w, s->buf.v, s->buf.n);
	if (rv == CACHEW_OK)
		rv = cwi_sw_elements(w, s->in.v + s->pos, s->in.n - s->pos);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(s->input, w);
	return rv;
}

static cachew_err
shuffle_restore(cwi_iter *it, cwi_state_reader *r)
{
	shuffle_iter *s = (shuffle_iter *)it;

	if (!cwi_sr_array(r, "shuffle", 5) ||
	    !cwi_sr_uint(r, "rng", &s->rng.state, UINT64_MAX) ||
	    !cwi_sr_bool(r, "input done", &s->input_done) ||
	    !cwi_sr_elements(r, "buffer", &s->buf) ||
	    !cwi_sr_elements(r, "pulled ahead", &s->in))
		return cwi_sr_error(r);
	if (s->buf.n > s->cap) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "the buffer holds %zu elements, more than its size %zu",
		    s->buf.n, s->cap);
		return cwi_sr_error(r);
	}
	s->pos = 0;
	return cwi_iter_restore(s->input, r);
}

static const cwi_iter_ops shuffle_iter_ops = {
    .next = shuffle_next,
    .destroy = shuffle_destroy,
    .save = shuffle_save,
    .restore = shuffle_restore,
};

static cachew_err
shuffle_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	shuffle_iter *s = calloc(1, sizeof(*s));
	int64_t seed = cwi_node_int(node, "seed");
	uint64_t state;
	cwi_stats *st;
	cachew_err rv;

	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->base.ops = &shuffle_iter_ops;
	s->cap = (size_t)cwi_node_int(node, "buffer");
	/* seed -1 follows the pipeline seed. The node's fingerprint makes
	 * two shuffles of one pipeline independent; the epoch makes each
	 * repetition under repeat() a new permutation. */
	state = seed == -1 ? args->pl->seed : (uint64_t)seed;
	/* A lease other than the one of everything (its seed is derived
	 * from its first unit): an explicit seed is mixed with it, so the
	 * leases of an epoch do not all shuffle alike. */
	if (seed != -1 && args->pl->seed != args->pl->job_seed)
		state = cwi_seed_derive(state, args->pl->seed);
	state = cwi_seed_derive(state, node->seed_fp.hi ^ node->seed_fp.lo);
	if (cwi_node_bool(node, "reshuffle_each_iteration"))
		state = cwi_seed_derive(state, args->epoch);
	s->rng.state = state;
	st = cwi_pipeline_stats(args->pl, node);
	if (st != NULL)
		atomic_store_explicit(&st->buffer_limit, (int64_t)s->cap,
		    memory_order_relaxed);
	rv = cwi_iter_create(&s->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(s);
		return rv;
	}
	*out = &s->base;
	return CACHEW_OK;
}

static const cwi_param_spec shuffle_params[] = {
    {.name = "buffer", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT64_MAX, .help = "elements in the shuffle buffer"},
    {.name = "seed", .type = CWI_P_INT, .def_int = -1, .min = -1,
	.max = INT64_MAX, .help = "seed; -1 = derived from the pipeline seed"},
    {.name = "reshuffle_each_iteration", .type = CWI_P_BOOL, .def_int = 1,
	.help = "a new order for each epoch (each repetition under repeat)"},
};

const cwi_dataset_op cwi_op_shuffle = {
    .name = "shuffle",
    .doc = "shuffles elements through a buffer of the given size",
    .params = shuffle_params,
    .nparams = sizeof(shuffle_params) / sizeof(shuffle_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_RANDOM,
    .iter_create = shuffle_create,
    .saves = "the buffer's elements in slot order, its generator's state, "
	"elements pulled ahead, and the input",
    .infer = cwi_infer_passthrough,
};
