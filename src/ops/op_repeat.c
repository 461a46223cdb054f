/*
 * op_repeat.c - operators that select by position: repeat(count),
 * take(n), skip(n) and shard(num, index).
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- repeat ------------------------------------------------------------- */

/*
 * Each repetition runs a fresh iterator of the input. Repetition r gets
 * the epoch that shuffle(reshuffle_each_iteration=true) reseeds by:
 *   - r itself when repeat runs at epoch 0 (the usual, outermost case), so
 *     `... | repeat(3)` yields what three iterators created with the
 *     "epoch" option 0, 1 and 2 would;
 *   - cwi_seed_derive(parent epoch, r) otherwise (a nested repeat, or an
 *     iterator created with another epoch), distinct per (parent, r).
 */
typedef struct repeat_iter {
	cwi_iter base;
	cwi_iter *input;   /* NULL between repetitions */
	cwi_iter_args args; /* the parent's */
	int64_t count;     /* -1 = forever */
	int64_t rep;       /* the current repetition */
	bool produced;     /* the current repetition yielded something */
} repeat_iter;

static uint64_t
repeat_epoch(uint64_t parent, int64_t rep)
{
	return parent == 0 ? (uint64_t)rep
			   : cwi_seed_derive(parent, (uint64_t)rep);
}

static cachew_err
repeat_open(repeat_iter *r)
{
	cwi_iter_args a = r->args;

	a.epoch = repeat_epoch(r->args.epoch, r->rep);
	r->produced = false;
	return cwi_iter_create(&r->input, r->base.node->inputs[0], &a);
}

static cachew_err
repeat_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	repeat_iter *r = (repeat_iter *)it;
	cachew_err rv;

	for (;;) {
		if (r->input == NULL) {
			if (r->count >= 0 && r->rep >= r->count)
				return CACHEW_EOF;
			rv = repeat_open(r);
			if (rv != CACHEW_OK)
				return rv;
		}
		rv = cwi_iter_next(r->input, out, max);
		if (rv == CACHEW_OK) {
			r->produced = true;
			return CACHEW_OK;
		}
		if (rv != CACHEW_EOF)
			return rv;
		cwi_iter_destroy(r->input);
		r->input = NULL;
		r->rep++;
		/* An empty repetition means they all are: stop rather than
		 * spin forever (tf.data does the same). */
		if (!r->produced)
			return CACHEW_EOF;
	}
}

static void
repeat_destroy(cwi_iter *it)
{
	repeat_iter *r = (repeat_iter *)it;
	cwi_iter_destroy(r->input);
	free(r);
}

/* [repetition, produced, input or nil between repetitions]. The input's
 * epoch follows from the repetition. */
static cachew_err
repeat_save(cwi_iter *it, cwi_state_writer *w)
{
	repeat_iter *r = (repeat_iter *)it;

	cwi_sw_array(w, 4);
	cwi_sw_int(w, r->rep);
	cwi_sw_bool(w, r->produced);
	cwi_sw_bool(w, r->input != NULL);
	if (r->input == NULL) {
		cwi_sw_array(w, 0);
		return CACHEW_OK;
	}
	return cwi_iter_save(r->input, w);
}

static cachew_err
repeat_restore(cwi_iter *it, cwi_state_reader *rd)
{
	repeat_iter *r = (repeat_iter *)it;
	cwi_iter_args a = r->args;
	int64_t rep;
	bool open = false;

	if (!cwi_sr_array(rd, "repeat", 4) ||
	    !cwi_sr_int(rd, "repetition", &rep, 0,
		r->count >= 0 ? r->count : INT64_MAX) ||
	    !cwi_sr_bool(rd, "produced", &r->produced) ||
	    !cwi_sr_bool(rd, "open", &open))
		return cwi_sr_error(rd);
	r->rep = rep;
	if (!open) {
		cwi_iter_destroy(r->input);
		r->input = NULL;
		return cwi_sr_array(rd, "closed input", 0) ? CACHEW_OK
							   : cwi_sr_error(rd);
	}
	if (r->count >= 0 && rep >= r->count) {
		cwi_sr_fail(rd, CACHEW_ECORRUPT,
		    "repetition %lld is open, but count is %lld",
		    (long long)rep, (long long)r->count);
		return cwi_sr_error(rd);
	}
	a.epoch = repeat_epoch(r->args.epoch, rep);
	return cwi_iter_recreate(&r->input, it->node->inputs[0], &a, rd);
}

static const cwi_iter_ops repeat_iter_ops = {
    .next = repeat_next,
    .destroy = repeat_destroy,
    .save = repeat_save,
    .restore = repeat_restore,
};

static cachew_err
repeat_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	repeat_iter *r = calloc(1, sizeof(*r));
	cachew_err rv = CACHEW_OK;

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &repeat_iter_ops;
	r->base.node = node; /* repeat_open needs it before the wrapper */
	r->args = *args;
	r->count = cwi_node_int(node, "count");
	/* The first repetition now, so its errors surface at creation. */
	if (r->count != 0)
		rv = repeat_open(r);
	if (rv != CACHEW_OK) {
		free(r);
		return rv;
	}
	*out = &r->base;
	return CACHEW_OK;
}

/* tf.data: repeat() is infinite, repeat(0) empty, repeat(k) k times the
 * input's count (an infinite input stays infinite, an unknown one
 * unknown). */
static cachew_err
repeat_infer(cwi_node *node)
{
	int64_t count = cwi_node_int(node, "count");
	int64_t in = node->inputs[0]->card;

	if (count < 0)
		node->card = in == 0 ? 0 : CACHEW_CARDINALITY_INFINITE;
	else
		node->card = cwi_card_mul(in, count);
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

static const cwi_param_spec repeat_params[] = {
    {.name = "count", .type = CWI_P_INT, .def_int = -1, .min = -1,
	.max = INT64_MAX, .help = "repetitions; -1 = forever"},
};

const cwi_dataset_op cwi_op_repeat = {
    .name = "repeat",
    .doc = "repeats the input count times (-1: forever)",
    .params = repeat_params,
    .nparams = sizeof(repeat_params) / sizeof(repeat_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = repeat_create,
    .saves = "the repetition (its epoch follows) and the open input's state",
    .infer = repeat_infer,
};

/* ---- take and skip ------------------------------------------------------ */

typedef struct count_iter {
	cwi_iter base;
	cwi_iter *input;
	int64_t left; /* take: still to yield; skip: still to drop; -1 = all */
	cwi_chunk drop; /* skip: scratch for dropped elements */
} count_iter;

static cachew_err
take_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	count_iter *t = (count_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	if (t->left == 0)
		return CACHEW_EOF;
	if (t->left > 0 && (uint64_t)t->left < max)
		max = (size_t)t->left;
	/* The input stays alive once done: destroying it here could join a
	 * prefetch thread stuck in an op that only the pipeline-wide
	 * cancellation (set when the whole iterator goes) would stop. */
	rv = cwi_iter_next(t->input, out, max);
	if (rv == CACHEW_OK && t->left > 0)
		t->left -= (int64_t)(out->n - n0);
	return rv;
}

/* Drops what skip still has to skip; CACHEW_EOF if the input ends. */
#define SKIP_PULL_MAX 1024

static cachew_err
skip_drop(count_iter *s)
{
	cachew_err rv;

	while (s->left != 0) {
		size_t want = SKIP_PULL_MAX;
		if (s->left > 0 && (uint64_t)s->left < want)
			want = (size_t)s->left;
		if (cwi_pipeline_cancelled(s->base.pl))
			return CACHEW_ECANCELED;
		rv = cwi_iter_next(s->input, &s->drop, want);
		if (rv != CACHEW_OK)
			return rv;
		if (s->left > 0)
			s->left -= (int64_t)s->drop.n;
		cwi_chunk_clear(&s->drop);
	}
	cwi_chunk_free(&s->drop);
	return CACHEW_OK;
}

static cachew_err
skip_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	count_iter *s = (count_iter *)it;
	cachew_err rv;

	if (s->left != 0) {
		rv = skip_drop(s);
		if (rv != CACHEW_OK)
			return rv;
	}
	return cwi_iter_next(s->input, out, max);
}

static void
count_destroy(cwi_iter *it)
{
	count_iter *t = (count_iter *)it;
	cwi_iter_destroy(t->input);
	cwi_chunk_free(&t->drop);
	free(t);
}

/* [left, input]: take's elements still to yield, skip's still to drop. */
static cachew_err
count_save(cwi_iter *it, cwi_state_writer *w)
{
	count_iter *t = (count_iter *)it;

	cwi_sw_array(w, 2);
	cwi_sw_int(w, t->left);
	return cwi_iter_save(t->input, w);
}

static cachew_err
count_restore(cwi_iter *it, cwi_state_reader *r)
{
	count_iter *t = (count_iter *)it;
	int64_t n = cwi_node_int(it->node, "n");

	/* Counts down from n; -1 (all) stays -1. */
	if (!cwi_sr_array(r, it->node->op->name, 2) ||
	    !cwi_sr_int(r, "left", &t->left, n < 0 ? -1 : 0, n))
		return cwi_sr_error(r);
	if ((n < 0) != (t->left < 0)) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "left %lld with n %lld",
		    (long long)t->left, (long long)n);
		return cwi_sr_error(r);
	}
	return cwi_iter_restore(t->input, r);
}

static const cwi_iter_ops take_iter_ops = {
    .next = take_next,
    .destroy = count_destroy,
    .save = count_save,
    .restore = count_restore,
};

static const cwi_iter_ops skip_iter_ops = {
    .next = skip_next,
    .destroy = count_destroy,
    .save = count_save,
    .restore = count_restore,
};

static cachew_err
count_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args,
    const cwi_iter_ops *ops)
{
	count_iter *t = calloc(1, sizeof(*t));
	cachew_err rv;

	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	t->base.ops = ops;
	t->left = cwi_node_int(node, "n");
	rv = cwi_iter_create(&t->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(t);
		return rv;
	}
	*out = &t->base;
	return CACHEW_OK;
}

static cachew_err
take_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return count_create(out, node, args, &take_iter_ops);
}

static cachew_err
skip_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return count_create(out, node, args, &skip_iter_ops);
}

/* take(n): min(n, input); n elements of an infinite input. */
static cachew_err
take_infer(cwi_node *node)
{
	int64_t n = cwi_node_int(node, "n");
	int64_t in = node->inputs[0]->card;

	if (n < 0 || (in >= 0 && in < n))
		node->card = in;
	else if (in == CACHEW_CARDINALITY_INFINITE || in >= n)
		node->card = n;
	else
		node->card = CACHEW_CARDINALITY_UNKNOWN;
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

/* skip(n): max(0, input - n); skip(-1) is empty. */
static cachew_err
skip_infer(cwi_node *node)
{
	int64_t n = cwi_node_int(node, "n");
	int64_t in = node->inputs[0]->card;

	if (n < 0)
		node->card = in == CACHEW_CARDINALITY_INFINITE ? in : 0;
	else if (in >= 0)
		node->card = in > n ? in - n : 0;
	else
		node->card = in;
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

static const cwi_param_spec take_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = -1,
	.max = INT64_MAX, .help = "elements to yield; -1 = all"},
};

static const cwi_param_spec skip_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = -1,
	.max = INT64_MAX, .help = "elements to drop; -1 = all"},
};

const cwi_dataset_op cwi_op_take = {
    .name = "take",
    .doc = "yields the first n elements (-1: all)",
    .params = take_params,
    .nparams = sizeof(take_params) / sizeof(take_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = take_create,
    .saves = "the count still to yield, and the input",
    .infer = take_infer,
};

const cwi_dataset_op cwi_op_skip = {
    .name = "skip",
    .doc = "drops the first n elements (-1: all) and yields the rest",
    .params = skip_params,
    .nparams = sizeof(skip_params) / sizeof(skip_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = skip_create,
    .saves = "the count still to drop, and the input",
    .infer = skip_infer,
};

/* ---- shard -------------------------------------------------------------- */

/* Input elements pulled at most per request. */
#define SHARD_PULL_MAX 4096

typedef struct shard_iter {
	cwi_iter base;
	cwi_iter *input;
	uint64_t num, index;
	uint64_t pos; /* position of the next input element */
	cwi_chunk in;
} shard_iter;

static cachew_err
shard_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	shard_iter *s = (shard_iter *)it;
	size_t n0 = out->n, want;
	cachew_err rv;

	/* A window of max * num positions holds at most max of ours. */
	want = max <= SHARD_PULL_MAX / s->num ? max * s->num : SHARD_PULL_MAX;
	if (want == 0)
		want = 1;
	while (out->n == n0) {
		if (cwi_pipeline_cancelled(it->pl))
			return CACHEW_ECANCELED;
		rv = cwi_iter_next(s->input, &s->in, want);
		if (rv != CACHEW_OK)
			return rv;
		for (size_t i = 0; i < s->in.n; i++, s->pos++) {
			if (s->pos % s->num == s->index)
				cwi_chunk_push(out, s->in.v[i]);
			else
				cwi_element_release(s->in.v[i]);
		}
		s->in.n = 0;
	}
	return CACHEW_OK;
}

static void
shard_destroy(cwi_iter *it)
{
	shard_iter *s = (shard_iter *)it;
	cwi_iter_destroy(s->input);
	cwi_chunk_free(&s->in);
	free(s);
}

/* [position at the input, input]. */
static cachew_err
shard_save(cwi_iter *it, cwi_state_writer *w)
{
	shard_iter *s = (shard_iter *)it;

	cwi_sw_array(w, 2);
	cwi_sw_uint(w, s->pos);
	return cwi_iter_save(s->input, w);
}

static cachew_err
shard_restore(cwi_iter *it, cwi_state_reader *r)
{
	shard_iter *s = (shard_iter *)it;

	if (!cwi_sr_array(r, "shard", 2) ||
	    !cwi_sr_uint(r, "position", &s->pos, UINT64_MAX))
		return cwi_sr_error(r);
	return cwi_iter_restore(s->input, r);
}

static const cwi_iter_ops shard_iter_ops = {
    .next = shard_next,
    .destroy = shard_destroy,
    .save = shard_save,
    .restore = shard_restore,
};

static cachew_err
shard_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	shard_iter *s = calloc(1, sizeof(*s));
	cachew_err rv;

	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->base.ops = &shard_iter_ops;
	s->num = (uint64_t)cwi_node_int(node, "num");
	s->index = (uint64_t)cwi_node_int(node, "index");
	rv = cwi_iter_create(&s->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(s);
		return rv;
	}
	*out = &s->base;
	return CACHEW_OK;
}

static cachew_err
shard_validate(cwi_node *node)
{
	int64_t num = cwi_node_int(node, "num");
	int64_t index = cwi_node_int(node, "index");

	if (index >= num)
		return cwi_fail(CACHEW_ERANGE,
		    "shard: index %lld must be less than num %lld",
		    (long long)index, (long long)num);
	return CACHEW_OK;
}

/* The positions index, index + num, ... of the input. */
static cachew_err
shard_infer(cwi_node *node)
{
	int64_t num = cwi_node_int(node, "num");
	int64_t index = cwi_node_int(node, "index");
	int64_t in = node->inputs[0]->card;

	node->card = in < 0 ? in : in / num + (index < in % num ? 1 : 0);
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

static const cwi_param_spec shard_params[] = {
    {.name = "num", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT64_MAX, .help = "number of shards"},
    {.name = "index", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 0,
	.max = INT64_MAX, .help = "the shard to keep, 0 <= index < num"},
};

const cwi_dataset_op cwi_op_shard = {
    .name = "shard",
    .doc = "keeps every num-th element, starting at position index",
    .params = shard_params,
    .nparams = sizeof(shard_params) / sizeof(shard_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .validate = shard_validate,
    .iter_create = shard_create,
    .saves = "the input position, and the input",
    .infer = shard_infer,
};
