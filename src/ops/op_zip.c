/*
 * op_zip.c - operators that combine structure: zip(a, b, ...) joins the
 * components of aligned elements, concatenate(a, b) yields a's elements
 * then b's, enumerate(start) prepends an i64 counter.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

const char *
cwi_element_spec_str(const cwi_element *e, char *buf, size_t len)
{
	char one[96];
	size_t n = 0;

	if (e->n == 1)
		return cwi_tensor_spec_str(&e->comp[0], buf, len);
	n += (size_t)snprintf(buf, len, "(");
	for (uint32_t c = 0; c < e->n && n < len; c++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", c ? ", " : "",
		    cwi_tensor_spec_str(&e->comp[c], one, sizeof(one)));
	if (n < len)
		snprintf(buf + n, len - n, ")");
	return buf;
}

/* Component c of src into dst: moved when src is ours alone (no reference
 * counting), shared otherwise. src is released by the caller either way. */
static void
take_component(cwi_tensor *dst, cwi_element *src, uint32_t c, bool unique)
{
	if (unique) {
		*dst = src->comp[c];
		src->comp[c].buf = NULL;
		src->comp[c].obuf = NULL;
	} else {
		cwi_tensor_copy(dst, &src->comp[c]);
	}
}

static void
release_range(cwi_chunk *out, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		cwi_element_release(out->v[i]);
}

/* ---- zip ---------------------------------------------------------------- */

typedef struct zip_input {
	cwi_iter *it;
	cwi_chunk st; /* pulled: st.v[pos..n) not yet zipped */
	size_t pos;
	bool done;
	cachew_err err; /* the input's error, due once st is used up */
} zip_input;

typedef struct zip_iter {
	cwi_iter base;
	uint64_t index; /* elements yielded */
	size_t ninputs;
	zip_input in[];
} zip_iter;

/* Makes `k` elements available from input i, or fewer if it ends. */
static cachew_err
zip_fill(zip_input *in, size_t k)
{
	size_t have = in->st.n - in->pos;
	cachew_err rv;

	while (have < k && !in->done) {
		if (in->pos > 0) {
			memmove(in->st.v, in->st.v + in->pos,
			    have * sizeof(in->st.v[0]));
			in->st.n = have;
			in->pos = 0;
		}
		rv = cwi_iter_next(in->it, &in->st, k - have);
		if (rv == CACHEW_EOF) {
			in->done = true;
		} else if (rv != CACHEW_OK) {
			/* Zip what came before the error; report it when
			 * this input is used up. */
			in->done = true;
			in->err = rv;
		}
		have = in->st.n - in->pos;
	}
	return CACHEW_OK;
}

static cachew_err
zip_one(zip_iter *z, cwi_element **out)
{
	uint32_t total = 0, at = 0;
	cwi_element *e;

	for (size_t i = 0; i < z->ninputs; i++)
		total += z->in[i].st.v[z->in[i].pos]->n;
	if (total > CACHEW_MAX_COMPONENTS)
		return cwi_pipeline_fail(z->base.pl, CACHEW_ETYPE,
		    "zip: element %llu of the %zu inputs has %u components in "
		    "all, more than the maximum of %d",
		    (unsigned long long)z->index, z->ninputs, total,
		    CACHEW_MAX_COMPONENTS);
	e = cwi_element_new(total);
	if (e == NULL)
		return cwi_pipeline_fail(z->base.pl, CACHEW_ENOMEM,
		    "zip: out of memory");
	for (size_t i = 0; i < z->ninputs; i++) {
		zip_input *in = &z->in[i];
		cwi_element *src = in->st.v[in->pos];
		bool unique = cwi_element_unique(src);
		for (uint32_t c = 0; c < src->n; c++)
			take_component(&e->comp[at++], src, c, unique);
		cwi_element_release(src);
		in->st.v[in->pos++] = NULL;
	}
	z->index++;
	*out = e;
	return CACHEW_OK;
}

static cachew_err
zip_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	zip_iter *z = (zip_iter *)it;
	size_t k = max;
	cachew_err rv;

	/* k shrinks to what the shortest input has; once it is 0 the later
	 * inputs are not pulled at all. */
	for (size_t i = 0; i < z->ninputs && k > 0; i++) {
		zip_input *in = &z->in[i];
		rv = zip_fill(in, k);
		if (rv != CACHEW_OK)
			return rv;
		if (in->st.n - in->pos < k)
			k = in->st.n - in->pos;
		if (k == 0 && in->err != CACHEW_OK)
			return in->err;
	}
	for (size_t j = 0; j < k; j++) {
		cwi_element *e = NULL;
		rv = zip_one(z, &e);
		if (rv != CACHEW_OK)
			return rv; /* earlier ones are delivered first */
		cwi_chunk_push(out, e);
	}
	return k > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
zip_destroy(cwi_iter *it)
{
	zip_iter *z = (zip_iter *)it;

	for (size_t i = 0; i < z->ninputs; i++) {
		zip_input *in = &z->in[i];
		cwi_iter_destroy(in->it);
		release_range(&in->st, in->pos, in->st.n);
		free(in->st.v);
	}
	free(z);
}

/* [index, inputs: [done, pulled not yet zipped, input]...]. */
static cachew_err
zip_save(cwi_iter *it, cwi_state_writer *w)
{
	zip_iter *z = (zip_iter *)it;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < z->ninputs; i++)
		if (z->in[i].err != CACHEW_OK)
			return cwi_fail(z->in[i].err,
			    "zip: input %zu failed: there is no position to "
			    "save", i);
	cwi_sw_array(w, 2);
	cwi_sw_uint(w, z->index);
	cwi_sw_array(w, z->ninputs);
	for (size_t i = 0; i < z->ninputs && rv == CACHEW_OK; i++) {
		zip_input *in = &z->in[i];
		cwi_sw_array(w, 3);
		cwi_sw_bool(w, in->done);
		rv = cwi_sw_elements(w, in->st.v + in->pos, in->st.n - in->pos);
		if (rv == CACHEW_OK)
			rv = cwi_iter_save(in->it, w);
	}
	return rv;
}

static cachew_err
zip_restore(cwi_iter *it, cwi_state_reader *r)
{
	zip_iter *z = (zip_iter *)it;

	if (!cwi_sr_array(r, "zip", 2) ||
	    !cwi_sr_uint(r, "index", &z->index, UINT64_MAX) ||
	    !cwi_sr_array(r, "inputs", z->ninputs))
		return cwi_sr_error(r);
	for (size_t i = 0; i < z->ninputs; i++) {
		zip_input *in = &z->in[i];
		if (!cwi_sr_array(r, "input", 3) ||
		    !cwi_sr_bool(r, "done", &in->done) ||
		    !cwi_sr_elements(r, "pulled", &in->st) ||
		    cwi_iter_restore(in->it, r) != CACHEW_OK)
			return cwi_sr_error(r);
		in->pos = 0;
	}
	return CACHEW_OK;
}

static const cwi_iter_ops zip_iter_ops = {
    .next = zip_next,
    .destroy = zip_destroy,
    .save = zip_save,
    .restore = zip_restore,
};

static cachew_err
zip_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	zip_iter *z = calloc(1, sizeof(*z) + node->ninputs * sizeof(zip_input));
	cachew_err rv = CACHEW_OK;

	if (z == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	z->base.ops = &zip_iter_ops;
	z->ninputs = node->ninputs;
	for (size_t i = 0; i < node->ninputs && rv == CACHEW_OK; i++)
		rv = cwi_iter_create(&z->in[i].it, node->inputs[i], args);
	if (rv != CACHEW_OK) {
		zip_destroy(&z->base);
		return rv;
	}
	*out = &z->base;
	return CACHEW_OK;
}

static cachew_err
zip_validate(cwi_node *node)
{
	if (node->ninputs < 2)
		return cwi_fail(CACHEW_EINVAL,
		    "zip: needs at least 2 input pipelines, got %zu (write "
		    "zip(a, b) or a | zip(b))",
		    node->ninputs);
	return CACHEW_OK;
}

/* Appends src's components to dst (known). */
static cachew_err
spec_append(cwi_spec *dst, const cwi_spec *src)
{
	cwi_comp_spec *comp;

	if (src->n == 0)
		return CACHEW_OK;
	comp = realloc(dst->comp, (dst->n + src->n) * sizeof(*comp));
	if (comp == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	dst->comp = comp;
	for (uint32_t i = 0; i < src->n; i++) {
		comp[dst->n] = src->comp[i];
		comp[dst->n].name = NULL;
		dst->n++;
		if (cwi_comp_spec_name(&comp[dst->n - 1], src->comp[i].name) !=
		    CACHEW_OK)
			return CACHEW_ENOMEM;
	}
	return CACHEW_OK;
}

/* The inputs' components side by side, as many elements as the shortest
 * input has (tf.data: the least known count; any unknown input makes it
 * unknown; infinite inputs do not bound it). Two inputs naming a
 * component alike would make the name ambiguous: refused. */
static cachew_err
zip_infer(cwi_node *node)
{
	int64_t card = CACHEW_CARDINALITY_INFINITE;
	cachew_err rv = CACHEW_OK;
	bool known = true;
	uint32_t total = 0;

	for (size_t k = 0; k < node->ninputs; k++) {
		int64_t c = node->inputs[k]->card;
		if (c == CACHEW_CARDINALITY_UNKNOWN)
			card = c;
		else if (c >= 0 && card != CACHEW_CARDINALITY_UNKNOWN &&
		    (card < 0 || c < card))
			card = c;
		known = known && node->inputs[k]->spec.known;
		total += node->inputs[k]->spec.n;
	}
	node->card = card;
	if (!known)
		return CACHEW_OK;
	if (total > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_ETYPE, "zip: the inputs have %u "
		    "components together, more than an element's %d", total,
		    CACHEW_MAX_COMPONENTS);
	rv = cwi_spec_init(&node->spec, 0);
	for (size_t k = 0; rv == CACHEW_OK && k < node->ninputs; k++) {
		const cwi_spec *in = &node->inputs[k]->spec;
		for (uint32_t i = 0; i < in->n; i++) {
			int prev = in->comp[i].name != NULL
			    ? cwi_spec_find(&node->spec, in->comp[i].name)
			    : -1;
			if (prev >= 0) {
				cwi_spec_free(&node->spec);
				return cwi_fail(CACHEW_ETYPE, "zip: input %zu "
				    "names a component '%s' as an earlier "
				    "input does: names must be unique", k,
				    in->comp[i].name);
			}
		}
		rv = spec_append(&node->spec, in);
	}
	if (rv != CACHEW_OK)
		cwi_spec_free(&node->spec);
	return rv;
}

const cwi_dataset_op cwi_op_zip = {
    .name = "zip",
    .doc = "joins the components of the inputs' elements, one element "
	   "from each; ends with the shortest input",
    .min_inputs = 1,
    .max_inputs = CWI_MAX_INPUTS,
    .validate = zip_validate,
    .iter_create = zip_create,
    .saves = "the elements each input yielded ahead of the others, and the "
	"inputs",
    .infer = zip_infer,
};

/* ---- concatenate -------------------------------------------------------- */

typedef struct concat_iter {
	cwi_iter base;
	cwi_iter *first, *second; /* first is NULL once it has ended */
	bool have_ref;            /* ref_* describe the first input's first element */
	uint32_t ref_n;
	uint8_t ref_dtype[CACHEW_MAX_COMPONENTS];
	char ref_spec[256];
	uint64_t second_index; /* elements yielded from the second input */
} concat_iter;

static void
concat_set_ref(concat_iter *ci, const cwi_element *e)
{
	ci->have_ref = true;
	ci->ref_n = e->n;
	for (uint32_t c = 0; c < e->n; c++)
		ci->ref_dtype[c] = e->comp[c].dtype;
	cwi_element_spec_str(e, ci->ref_spec, sizeof(ci->ref_spec));
}

static bool
concat_matches(const concat_iter *ci, const cwi_element *e)
{
	if (e->n != ci->ref_n)
		return false;
	for (uint32_t c = 0; c < e->n; c++)
		if (e->comp[c].dtype != ci->ref_dtype[c])
			return false;
	return true;
}

static cachew_err
concat_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	concat_iter *ci = (concat_iter *)it;
	size_t n0 = out->n;
	char spec[256];
	cachew_err rv;

	if (ci->first != NULL) {
		rv = cwi_iter_next(ci->first, out, max);
		if (rv == CACHEW_OK && !ci->have_ref)
			concat_set_ref(ci, out->v[n0]);
		if (rv != CACHEW_EOF)
			return rv;
		cwi_iter_destroy(ci->first);
		ci->first = NULL;
	}
	rv = cwi_iter_next(ci->second, out, max);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = n0; ci->have_ref && i < out->n; i++) {
		if (concat_matches(ci, out->v[i]))
			continue;
		cwi_element_spec_str(out->v[i], spec, sizeof(spec));
		/* [n0, i) matched: delivered before the error (exec.h). */
		release_range(out, i, out->n);
		out->n = i;
		return cwi_pipeline_fail(it->pl, CACHEW_ETYPE,
		    "concatenate: element %llu of the second input is %s, "
		    "expected %s like the first input's elements",
		    (unsigned long long)(ci->second_index + (i - n0)), spec,
		    ci->ref_spec);
	}
	ci->second_index += out->n - n0;
	return CACHEW_OK;
}

static void
concat_destroy(cwi_iter *it)
{
	concat_iter *ci = (concat_iter *)it;
	cwi_iter_destroy(ci->first);
	cwi_iter_destroy(ci->second);
	free(ci);
}

/* [first open, have ref, ref dtypes, ref spec, second index, first's
 * state or the ended state, second]. The first input's element type is
 * what the second's are checked against. */
static cachew_err
concat_save(cwi_iter *it, cwi_state_writer *w)
{
	concat_iter *ci = (concat_iter *)it;
	uint32_t nref = ci->have_ref ? ci->ref_n : 0;
	cachew_err rv;

	cwi_sw_array(w, 6);
	cwi_sw_bool(w, ci->first != NULL);
	cwi_sw_bool(w, ci->have_ref);
	cwi_sw_array(w, nref);
	for (uint32_t c = 0; c < nref; c++)
		cwi_sw_uint(w, ci->ref_dtype[c]);
	cwi_sw_str(w, ci->have_ref ? ci->ref_spec : "");
	cwi_sw_uint(w, ci->second_index);
	if (ci->first != NULL) {
		cwi_sw_array(w, 2);
		rv = cwi_iter_save(ci->first, w);
		if (rv != CACHEW_OK)
			return rv;
	} else {
		cwi_sw_array(w, 1);
	}
	return cwi_iter_save(ci->second, w);
}

static cachew_err
concat_restore(cwi_iter *it, cwi_state_reader *r)
{
	concat_iter *ci = (concat_iter *)it;
	uint64_t nref = 0, dt;
	bool first = false;

	if (!cwi_sr_array(r, "concatenate", 6) ||
	    !cwi_sr_bool(r, "first open", &first) ||
	    !cwi_sr_bool(r, "have ref", &ci->have_ref) ||
	    !cwi_sr_count(r, "ref dtypes", &nref, CACHEW_MAX_COMPONENTS))
		return cwi_sr_error(r);
	ci->ref_n = (uint32_t)nref;
	for (uint64_t c = 0; c < nref; c++) {
		if (!cwi_sr_uint(r, "ref dtype", &dt, UINT8_MAX))
			return cwi_sr_error(r);
		ci->ref_dtype[c] = (uint8_t)dt;
	}
	if (!cwi_sr_str(r, "ref spec", ci->ref_spec, sizeof(ci->ref_spec)) ||
	    !cwi_sr_uint(r, "second index", &ci->second_index, UINT64_MAX) ||
	    !cwi_sr_array(r, "inputs", first ? 2 : 1))
		return cwi_sr_error(r);
	if (first) {
		if (cwi_iter_restore(ci->first, r) != CACHEW_OK)
			return cwi_sr_error(r);
	} else {
		cwi_iter_destroy(ci->first);
		ci->first = NULL;
	}
	return cwi_iter_restore(ci->second, r);
}

static const cwi_iter_ops concat_iter_ops = {
    .next = concat_next,
    .destroy = concat_destroy,
    .save = concat_save,
    .restore = concat_restore,
};

static cachew_err
concat_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	concat_iter *ci = calloc(1, sizeof(*ci));
	cachew_err rv;

	if (ci == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	ci->base.ops = &concat_iter_ops;
	rv = cwi_iter_create(&ci->first, node->inputs[0], args);
	if (rv == CACHEW_OK)
		rv = cwi_iter_create(&ci->second, node->inputs[1], args);
	if (rv != CACHEW_OK) {
		concat_destroy(&ci->base);
		return rv;
	}
	*out = &ci->base;
	return CACHEW_OK;
}

/* tf.data refuses to concatenate datasets of incompatible structure when
 * building; dimensions on which the inputs differ become -1. */
static cachew_err
concat_infer(cwi_node *node)
{
	cachew_err rv;

	node->card = cwi_card_add(node->inputs[0]->card, node->inputs[1]->card);
	rv = cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
	if (rv == CACHEW_OK)
		rv = cwi_spec_merge(&node->spec, &node->inputs[1]->spec,
		    "concatenate: the second input's elements differ from "
		    "the first's");
	if (rv != CACHEW_OK)
		cwi_spec_free(&node->spec);
	return rv;
}

const cwi_dataset_op cwi_op_concatenate = {
    .name = "concatenate",
    .doc = "yields the first input's elements, then the second's (same "
	   "components and dtypes)",
    .min_inputs = 2,
    .max_inputs = 2,
    .iter_create = concat_create,
    .saves = "which input is current, the first input's element type, and "
	"the inputs",
    .infer = concat_infer,
};

/* ---- enumerate ---------------------------------------------------------- */

typedef struct enumerate_iter {
	cwi_iter base;
	cwi_iter *input;
	uint64_t next; /* the next counter value, wrapping like two's complement */
	uint64_t index;
} enumerate_iter;

static cachew_err
enumerate_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	enumerate_iter *en = (enumerate_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	rv = cwi_iter_next(en->input, out, max);
	if (rv != CACHEW_OK)
		return rv;
	size_t fail_at = n0;
	for (size_t i = n0; i < out->n; i++) {
		cwi_element *src = out->v[i], *e;
		bool unique;

		fail_at = i;
		if (src->n >= CACHEW_MAX_COMPONENTS) {
			rv = cwi_pipeline_fail(it->pl, CACHEW_ETYPE,
			    "enumerate: element %llu already has %u components, "
			    "the maximum",
			    (unsigned long long)en->index, src->n);
			goto fail;
		}
		e = cwi_element_new(src->n + 1);
		if (e == NULL) {
			rv = cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "enumerate: out of memory");
			goto fail;
		}
		cwi_tensor_init_i64(&e->comp[0], (int64_t)en->next++);
		unique = cwi_element_unique(src);
		for (uint32_t c = 0; c < src->n; c++)
			take_component(&e->comp[c + 1], src, c, unique);
		cwi_element_release(src);
		out->v[i] = e;
		en->index++;
	}
	return CACHEW_OK;
fail:
	/* [n0, i) are enumerated and delivered first; drop the rest. */
	release_range(out, fail_at, out->n);
	out->n = fail_at;
	return rv;
}

static void
enumerate_destroy(cwi_iter *it)
{
	enumerate_iter *en = (enumerate_iter *)it;
	cwi_iter_destroy(en->input);
	free(en);
}

/* [next counter, index, input]. */
static cachew_err
enumerate_save(cwi_iter *it, cwi_state_writer *w)
{
	enumerate_iter *en = (enumerate_iter *)it;

	cwi_sw_array(w, 3);
	cwi_sw_uint(w, en->next);
	cwi_sw_uint(w, en->index);
	return cwi_iter_save(en->input, w);
}

static cachew_err
enumerate_restore(cwi_iter *it, cwi_state_reader *r)
{
	enumerate_iter *en = (enumerate_iter *)it;

	if (!cwi_sr_array(r, "enumerate", 3) ||
	    !cwi_sr_uint(r, "counter", &en->next, UINT64_MAX) ||
	    !cwi_sr_uint(r, "index", &en->index, UINT64_MAX))
		return cwi_sr_error(r);
	return cwi_iter_restore(en->input, r);
}

static const cwi_iter_ops enumerate_iter_ops = {
    .next = enumerate_next,
    .destroy = enumerate_destroy,
    .save = enumerate_save,
    .restore = enumerate_restore,
};

static cachew_err
enumerate_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	enumerate_iter *en = calloc(1, sizeof(*en));
	cachew_err rv;

	if (en == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	en->base.ops = &enumerate_iter_ops;
	en->next = (uint64_t)cwi_node_int(node, "start");
	rv = cwi_iter_create(&en->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(en);
		return rv;
	}
	*out = &en->base;
	return CACHEW_OK;
}

static const cwi_param_spec enumerate_params[] = {
    {.name = "start", .type = CWI_P_INT, .def_int = 0,
	.help = "the first counter value"},
};

/* An unnamed i64 scalar, then the input's components. */
static cachew_err
enumerate_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	cachew_err rv;

	node->card = node->inputs[0]->card;
	if (!in->known)
		return CACHEW_OK;
	if (in->n >= CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_ETYPE, "enumerate: the elements already "
		    "have %u components", in->n);
	rv = cwi_spec_scalar(&node->spec, CACHEW_I64);
	if (rv == CACHEW_OK)
		rv = spec_append(&node->spec, in);
	if (rv != CACHEW_OK)
		cwi_spec_free(&node->spec);
	return rv;
}

const cwi_dataset_op cwi_op_enumerate = {
    .name = "enumerate",
    .doc = "prepends an i64 counter component to every element",
    .params = enumerate_params,
    .nparams = sizeof(enumerate_params) / sizeof(enumerate_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = enumerate_create,
    .saves = "the next counter value, and the input",
    .infer = enumerate_infer,
};
