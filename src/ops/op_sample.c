/*
 * op_sample.c - data mixtures: sample_from_datasets(a, b, ..., weights,
 * seed, stop_on_empty_dataset) draws each element from an input picked at
 * random by weight; choose_from_datasets(a, b, ..., choice) from the input
 * each element of the choice dataset (its last input) names. tf.data's
 * operators of the same names (its directed interleave): an input that
 * ends is dropped from the mixture (its weight leaves the draw), or ends
 * the whole dataset with stop_on_empty_dataset; the mixture ends when no
 * input can be drawn any more.
 *
 * Inputs are pulled in chunks (a block of elements at a time from the
 * input drawn), like zip: an input's error is reported when a draw reaches
 * it, after the elements it gave before. Draws depend on the seed, the
 * node and, with rerandomize_each_iteration, the epoch, never on how the
 * consumer chunks its requests.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Elements pulled from an input at a time: large enough to amortise a
 * call per block, small enough that a mixture of many inputs holds little
 * ahead. */
#define MIX_BLOCK 64

typedef struct mix_input {
	cwi_iter *it;
	cwi_chunk st;   /* pulled: st.v[pos..n) not yet yielded */
	size_t pos;
	bool done;      /* the iterator has nothing more to give */
	cachew_err err; /* its error, due once st is used up */
	bool active;    /* may still be drawn */
	double weight;  /* sample_from_datasets: its weight, normalised */
} mix_input;

typedef struct mix_iter {
	cwi_iter base;
	bool choose;     /* choose_from_datasets: in[ndata] is the choice */
	bool stop_on_empty;
	cwi_rng rng;     /* sample_from_datasets' draws */
	uint64_t index;  /* elements yielded */
	uint64_t draws;  /* choices read (choose) */
	size_t ndata;    /* data inputs */
	size_t nactive;  /* data inputs with a weight that may be drawn */
	double total;    /* sum of the active inputs' weights */
	mix_input in[];  /* ndata data inputs, then the choice (choose) */
} mix_iter;

static const char *
mix_name(const mix_iter *m)
{
	return m->choose ? "choose_from_datasets" : "sample_from_datasets";
}

/* Makes at least one element available from in unless it ends. */
static void
mix_fill(mix_input *in)
{
	cachew_err rv;

	if (in->pos < in->st.n || in->done)
		return;
	in->st.n = 0;
	in->pos = 0;
	rv = cwi_iter_next(in->it, &in->st, MIX_BLOCK);
	if (rv == CACHEW_EOF) {
		in->done = true;
	} else if (rv != CACHEW_OK) {
		in->done = true;
		in->err = rv;
	}
}

static void
mix_deactivate(mix_iter *m, size_t i)
{
	m->in[i].active = false;
	m->nactive--;
	m->total = 0;
	for (size_t k = 0; k < m->ndata; k++)
		if (m->in[k].active)
			m->total += m->in[k].weight;
}

/* The data input the next element comes from (sample_from_datasets): an
 * active input, drawn by weight among the active ones. */
static size_t
mix_draw(mix_iter *m)
{
	double x = cwi_rng_double(&m->rng) * m->total;
	size_t last = 0;

	for (size_t i = 0; i < m->ndata; i++) {
		if (!m->in[i].active)
			continue;
		last = i;
		if (x < m->in[i].weight)
			return i;
		x -= m->in[i].weight;
	}
	return last; /* rounding left x at the top */
}

/* The data input the next choice names in *pick, or CACHEW_EOF when the
 * choice dataset ends, or its error (recorded). */
static cachew_err
mix_choice(mix_iter *m, size_t *pick)
{
	mix_input *c = &m->in[m->ndata];
	const cwi_element *e;
	const cwi_tensor *t;
	int64_t v;

	mix_fill(c);
	if (c->pos == c->st.n)
		return c->err != CACHEW_OK ? c->err : CACHEW_EOF;
	e = c->st.v[c->pos];
	t = &e->comp[0];
	if (e->n != 1 || t->rank != 0 ||
	    (t->dtype != CACHEW_I64 && t->dtype != CACHEW_I32 &&
		t->dtype != CACHEW_U8)) {
		char spec[256];
		return cwi_pipeline_fail(m->base.pl, CACHEW_ETYPE,
		    "choose_from_datasets: element %llu of the choice dataset "
		    "is %s, not a scalar integer",
		    (unsigned long long)m->draws,
		    cwi_element_spec_str(e, spec, sizeof(spec)));
	}
	v = t->dtype == CACHEW_I64   ? *(const int64_t *)cwi_tensor_data(t)
	    : t->dtype == CACHEW_I32 ? *(const int32_t *)cwi_tensor_data(t)
				     : *cwi_tensor_data(t);
	if (v < 0 || (uint64_t)v >= m->ndata)
		return cwi_pipeline_fail(m->base.pl, CACHEW_EINVAL,
		    "choose_from_datasets: element %llu of the choice dataset "
		    "is %lld, outside [0, %zu): there are %zu datasets to "
		    "choose from",
		    (unsigned long long)m->draws, (long long)v, m->ndata,
		    m->ndata);
	cwi_element_release(c->st.v[c->pos]);
	c->st.v[c->pos++] = NULL;
	m->draws++;
	*pick = (size_t)v;
	return CACHEW_OK;
}

static cachew_err
mix_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	mix_iter *m = (mix_iter *)it;
	size_t made = 0;
	cachew_err rv;

	while (made < max) {
		size_t i;
		mix_input *in;

		if (m->nactive == 0)
			return CACHEW_EOF;
		if (m->choose) {
			rv = mix_choice(m, &i);
			if (rv != CACHEW_OK)
				return rv;
		} else {
			i = mix_draw(m);
		}
		in = &m->in[i];
		/* An input that ended is skipped (choose: its choices are
		 * passed over), as tf.data does without stop_on_empty. */
		if (!in->active)
			continue;
		mix_fill(in);
		if (in->pos == in->st.n) {
			if (in->err != CACHEW_OK)
				return in->err;
			if (m->stop_on_empty)
				return CACHEW_EOF;
			mix_deactivate(m, i);
			continue;
		}
		cwi_chunk_push(out, in->st.v[in->pos]);
		in->st.v[in->pos++] = NULL;
		m->index++;
		made++;
	}
	return CACHEW_OK;
}

static void
mix_destroy(cwi_iter *it)
{
	mix_iter *m = (mix_iter *)it;
	size_t n = m->ndata + (m->choose ? 1 : 0);

	for (size_t i = 0; i < n; i++) {
		mix_input *in = &m->in[i];
		cwi_iter_destroy(in->it);
		for (size_t k = in->pos; k < in->st.n; k++)
			cwi_element_release(in->st.v[k]);
		free(in->st.v);
	}
	free(m);
}

/* [rng, index, draws, inputs: [done, active, pulled not yet yielded,
 * input]...]. Weights come from the node again. */
static cachew_err
mix_save(cwi_iter *it, cwi_state_writer *w)
{
	mix_iter *m = (mix_iter *)it;
	size_t n = m->ndata + (m->choose ? 1 : 0);
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < n; i++)
		if (m->in[i].err != CACHEW_OK)
			return cwi_fail(m->in[i].err, "%s: input %zu failed: "
			    "there is no position to save", mix_name(m), i);
	cwi_sw_array(w, 4);
	cwi_sw_uint(w, m->rng.state);
	cwi_sw_uint(w, m->index);
	cwi_sw_uint(w, m->draws);
	cwi_sw_array(w, n);
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++) {
		mix_input *in = &m->in[i];
		cwi_sw_array(w, 4);
		cwi_sw_bool(w, in->done);
		cwi_sw_bool(w, in->active);
		rv = cwi_sw_elements(w, in->st.v + in->pos, in->st.n - in->pos);
		if (rv == CACHEW_OK)
			rv = cwi_iter_save(in->it, w);
	}
	return rv;
}

static cachew_err
mix_restore(cwi_iter *it, cwi_state_reader *r)
{
	mix_iter *m = (mix_iter *)it;
	size_t n = m->ndata + (m->choose ? 1 : 0);

	if (!cwi_sr_array(r, mix_name(m), 4) ||
	    !cwi_sr_uint(r, "rng", &m->rng.state, UINT64_MAX) ||
	    !cwi_sr_uint(r, "index", &m->index, UINT64_MAX) ||
	    !cwi_sr_uint(r, "draws", &m->draws, UINT64_MAX) ||
	    !cwi_sr_array(r, "inputs", n))
		return cwi_sr_error(r);
	for (size_t i = 0; i < n; i++) {
		mix_input *in = &m->in[i];
		bool active = false;
		if (!cwi_sr_array(r, "input", 4) ||
		    !cwi_sr_bool(r, "done", &in->done) ||
		    !cwi_sr_bool(r, "active", &active) ||
		    !cwi_sr_elements(r, "pulled", &in->st) ||
		    cwi_iter_restore(in->it, r) != CACHEW_OK)
			return cwi_sr_error(r);
		in->pos = 0;
		if (i < m->ndata && in->active && !active)
			mix_deactivate(m, i);
	}
	return CACHEW_OK;
}

static const cwi_iter_ops mix_iter_ops = {
    .next = mix_next,
    .destroy = mix_destroy,
    .save = mix_save,
    .restore = mix_restore,
};

/* The weights of sample_from_datasets' node (validated: one finite,
 * non-negative number per input, not all zero), or 1 each when absent. */
static void
mix_weights(const cwi_node *node, double *w, size_t n)
{
	const cwi_value *v = cwi_node_value(node, "weights");

	for (size_t i = 0; i < n; i++) {
		const cwi_value *x = v != NULL && v->type == CWI_V_LIST
		    ? &v->u.list.items[i] : NULL;
		w[i] = x == NULL ? 1.0
		    : x->type == CWI_V_INT ? (double)x->u.i
					   : x->u.f;
	}
}

static cachew_err
mix_create_as(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args,
    bool choose)
{
	size_t ndata = node->ninputs - (choose ? 1 : 0);
	mix_iter *m = calloc(1, sizeof(*m) + node->ninputs * sizeof(mix_input));
	double w[CWI_MAX_INPUTS];
	cachew_err rv = CACHEW_OK;

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->base.ops = &mix_iter_ops;
	m->choose = choose;
	m->ndata = ndata;
	m->stop_on_empty = cwi_node_bool(node, "stop_on_empty_dataset");
	mix_weights(node, w, ndata);
	for (size_t i = 0; i < ndata; i++) {
		m->in[i].weight = choose ? 1.0 : w[i];
		/* A weight of 0 is never drawn: it ends nothing either. */
		m->in[i].active = m->in[i].weight > 0;
		m->nactive += m->in[i].active;
		m->total += m->in[i].weight;
	}
	if (!choose) {
		int64_t seed = cwi_node_int(node, "seed");
		uint64_t state = seed == -1 ? args->pl->seed : (uint64_t)seed;
		/* As shuffle: a lease's own seed mixes into an explicit one. */
		if (seed != -1 && args->pl->seed != args->pl->job_seed)
			state = cwi_seed_derive(state, args->pl->seed);
		state = cwi_seed_derive(state,
		    node->seed_fp.hi ^ node->seed_fp.lo);
		if (cwi_node_bool(node, "rerandomize_each_iteration"))
			state = cwi_seed_derive(state, args->epoch);
		m->rng.state = state;
	}
	for (size_t i = 0; i < node->ninputs && rv == CACHEW_OK; i++)
		rv = cwi_iter_create(&m->in[i].it, node->inputs[i], args);
	if (rv != CACHEW_OK) {
		mix_destroy(&m->base);
		return rv;
	}
	*out = &m->base;
	return CACHEW_OK;
}

static cachew_err
sample_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return mix_create_as(out, node, args, false);
}

static cachew_err
choose_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return mix_create_as(out, node, args, true);
}

static cachew_err
sample_validate(cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "weights");
	double sum = 0;

	if (v == NULL)
		return CACHEW_OK;
	if (v->u.list.n != node->ninputs)
		return cwi_fail(CACHEW_EINVAL, "sample_from_datasets: weights "
		    "has %zu values for %zu datasets: give one per dataset",
		    v->u.list.n, node->ninputs);
	for (size_t i = 0; i < v->u.list.n; i++) {
		const cwi_value *x = &v->u.list.items[i];
		double d = x->type == CWI_V_INT ? (double)x->u.i
		    : x->type == CWI_V_FLOAT    ? x->u.f
						: NAN;
		if (!(d >= 0) || !isfinite(d))
			return cwi_fail(CACHEW_EINVAL, "sample_from_datasets: "
			    "weights[%zu] must be a finite number >= 0", i);
		sum += d;
	}
	if (!(sum > 0) || !isfinite(sum))
		return cwi_fail(CACHEW_EINVAL, "sample_from_datasets: the "
		    "weights add up to %g: at least one must be above 0 (and "
		    "their sum finite)", sum);
	return CACHEW_OK;
}

static cachew_err
choose_validate(cwi_node *node)
{
	if (node->ninputs < 2)
		return cwi_fail(CACHEW_EINVAL, "choose_from_datasets: needs the "
		    "datasets and, last, the choice dataset (write "
		    "choose_from_datasets(a, b, choice) or a | "
		    "choose_from_datasets(b, choice))");
	return CACHEW_OK;
}

/* The data inputs' specs merged (tf.data: compatible structure, refused
 * when building), each input named in the refusal. */
static cachew_err
mix_spec(cwi_node *node, size_t ndata, const char *op)
{
	char what[160];
	cachew_err rv = cwi_spec_copy(&node->spec, &node->inputs[0]->spec);

	for (size_t i = 1; i < ndata && rv == CACHEW_OK; i++) {
		snprintf(what, sizeof(what), "%s: dataset %zu's elements differ "
		    "from dataset 0's", op, i);
		rv = cwi_spec_merge(&node->spec, &node->inputs[i]->spec, what);
	}
	if (rv != CACHEW_OK)
		cwi_spec_free(&node->spec);
	return rv;
}

/* Cardinality: the inputs that can be drawn (weight > 0) decide it.
 * Without stop_on_empty_dataset every one of them is read to its end: the
 * sum (infinite if any is). With it the first to end stops the mixture,
 * which is random unless every one is infinite or only one can be drawn. */
static cachew_err
sample_infer(cwi_node *node)
{
	double w[CWI_MAX_INPUTS];
	bool stop = cwi_node_bool(node, "stop_on_empty_dataset");
	int64_t card = 0;
	size_t live = 0, infinite = 0;

	mix_weights(node, w, node->ninputs);
	for (size_t i = 0; i < node->ninputs; i++) {
		if (w[i] <= 0)
			continue;
		live++;
		infinite += node->inputs[i]->card == CACHEW_CARDINALITY_INFINITE;
		card = cwi_card_add(card, node->inputs[i]->card);
	}
	if (stop && live > 1)
		card = infinite == live ? CACHEW_CARDINALITY_INFINITE
					: CACHEW_CARDINALITY_UNKNOWN;
	node->card = card;
	return mix_spec(node, node->ninputs, "sample_from_datasets");
}

/* The choice dataset's elements are scalar integers (tf.data: int64
 * scalars); refused when its spec says otherwise. Cardinality: the choice
 * dataset's when every data input is infinite, else unknown. */
static cachew_err
choose_infer(cwi_node *node)
{
	const cwi_node *choice = node->inputs[node->ninputs - 1];
	const cwi_spec *cs = &choice->spec;
	bool all_infinite = true;

	if (cs->known) {
		const cwi_comp_spec *c = cs->n == 1 ? &cs->comp[0] : NULL;
		bool ok = c != NULL &&
		    (c->rank == 0 || c->rank == CWI_RANK_UNKNOWN) &&
		    (c->dtype == CACHEW_INVALID || c->dtype == CACHEW_I64 ||
			c->dtype == CACHEW_I32 || c->dtype == CACHEW_U8);
		if (!ok) {
			cwi_strbuf sb;
			cachew_err rv;
			cwi_strbuf_init(&sb);
			cwi_spec_print(&sb, cs);
			rv = cwi_fail(CACHEW_ETYPE, "choose_from_datasets: the "
			    "choice dataset (the last input) yields %s, not "
			    "scalar integers naming a dataset",
			    sb.data != NULL && !sb.oom ? sb.data : "?");
			cwi_strbuf_free(&sb);
			return rv;
		}
	}
	for (size_t i = 0; i + 1 < node->ninputs; i++)
		all_infinite = all_infinite &&
		    node->inputs[i]->card == CACHEW_CARDINALITY_INFINITE;
	node->card = all_infinite || choice->card == 0
	    ? choice->card
	    : CACHEW_CARDINALITY_UNKNOWN;
	return mix_spec(node, node->ninputs - 1, "choose_from_datasets");
}

static const cwi_param_spec sample_params[] = {
    {.name = "weights", .type = CWI_P_LIST, .flags = CWI_PF_OPTIONAL,
	.help = "one weight >= 0 per dataset, normalised; absent: uniform"},
    {.name = "seed", .type = CWI_P_INT, .def_int = -1, .min = -1,
	.max = INT64_MAX, .help = "seed; -1 = derived from the pipeline seed"},
    {.name = "stop_on_empty_dataset", .type = CWI_P_BOOL, .def_int = 0,
	.help = "end at the first dataset drawn that is empty; false: drop "
		"it from the mixture and go on"},
    {.name = "rerandomize_each_iteration", .type = CWI_P_BOOL, .def_int = 1,
	.help = "new draws each epoch (each repetition under repeat)"},
};

static const cwi_param_spec choose_params[] = {
    {.name = "stop_on_empty_dataset", .type = CWI_P_BOOL, .def_int = 1,
	.help = "end when the dataset chosen is empty; false: skip the "
		"choices of empty datasets"},
};

static const char *const sample_pos1[] = {"weights"};

const cwi_dataset_op cwi_op_sample_from_datasets = {
    .name = "sample_from_datasets",
    .doc = "draws each element from one of the input datasets at random, "
	   "with probability proportional to its weight",
    .params = sample_params,
    .nparams = sizeof(sample_params) / sizeof(sample_params[0]),
    .positional = {[1] = sample_pos1},
    .min_inputs = 1,
    .max_inputs = CWI_MAX_INPUTS,
    .flags = CWI_OPF_RANDOM,
    .validate = sample_validate,
    .iter_create = sample_create,
    .saves = "the random stream, which inputs have ended, the elements "
	"pulled ahead from each, and the inputs",
    .infer = sample_infer,
    .note = "As in tf.data (its directed interleave), an input that ends "
	"leaves the draw and the others go on (weights renormalised), "
	"unless stop_on_empty_dataset; the mixture ends when no input with "
	"a weight above 0 is left (tf.data would keep drawing an input of "
	"weight 0 forever). Unlike tf.data's default, the draws change each "
	"epoch (rerandomize_each_iteration=true, as shuffle reshuffles); "
	"false repeats them. tf.data's weights given as a dataset (weights "
	"that change per element) are not taken: weights are a list. Through "
	"the service the mixture and its inputs run as one unit on one "
	"worker, as zip does.",
};

const cwi_dataset_op cwi_op_choose_from_datasets = {
    .name = "choose_from_datasets",
    .doc = "yields, for each element of the choice dataset (the last "
	   "input, scalar integers), the next element of the input it names",
    .params = choose_params,
    .nparams = sizeof(choose_params) / sizeof(choose_params[0]),
    .min_inputs = 1,
    .max_inputs = CWI_MAX_INPUTS,
    .validate = choose_validate,
    .iter_create = choose_create,
    .saves = "which inputs have ended, the elements pulled ahead from each "
	"and from the choice dataset, and the inputs",
    .infer = choose_infer,
    .note = "tf.data's choose_from_datasets(datasets, choice_dataset): the "
	"choice dataset is the last input. A choice outside [0, number of "
	"datasets) fails the iteration (EINVAL), as in tf.data. Through the "
	"service the operator and its inputs run as one unit on one worker.",
};
