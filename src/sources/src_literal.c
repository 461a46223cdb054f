/*
 * src_literal.c - from_tensors(values) and from_list(values): elements
 * from literals of the pipeline string.
 *
 * Conversion of a value to a tensor:
 *   int -> i64 scalar, float -> f64, bool -> bool, string -> bytes scalar;
 *   a list -> rank 1, nested lists -> rank n (at most 8), which must be
 *   rectangular; the leaves decide the dtype: all ints -> i64, ints and
 *   floats -> f64, all bools -> bool, all strings -> bytes; strings, bools
 *   and numbers do not mix. An empty list is i64 of shape [0] ([[], []]
 *   is i64 [2, 0]).
 *   A tuple at the top of an element gives one component per item; a
 *   tuple inside a component is read as a list. A map at the top
 *   ({image=[...], label=3}) gives one named component per key, in key
 *   order (as tf.data flattens a dict); a map inside a component is an
 *   error.
 * Errors are CACHEW_EINVAL naming the sub-value ("values[1][0]"), found
 * when the pipeline is built (validate), so iteration only converts.
 * Split unit i is item i (from_tensors has one unit: its one element).
 */
#include "sources.h"
#include "../exec/exec_state.h"

#include "../exec/exec_split.h"

#include <stdio.h>
#include <stdlib.h>

#define PATH_MAX_LEN 160

typedef struct lit_scan {
	unsigned rank;
	int64_t shape[CACHEW_MAX_RANK];
	size_t nleaves;
	bool has_int, has_float, has_bool, has_str;
	char num_path[PATH_MAX_LEN]; /* first number leaf */
	char bool_path[PATH_MAX_LEN];
	char str_path[PATH_MAX_LEN];
} lit_scan;

static const char *
value_kind(const cwi_value *v)
{
	switch (v->type) {
	case CWI_V_NIL:
		return "nil";
	case CWI_V_BOOL:
		return "a bool";
	case CWI_V_INT:
	case CWI_V_FLOAT:
		return "a number";
	case CWI_V_STR:
		return "a string";
	case CWI_V_LIST:
		return "a list";
	case CWI_V_MAP:
		return "a map";
	}
	return "?";
}

/* sub = path + "[i]". */
static void
path_item(char *sub, const char *path, size_t i)
{
	snprintf(sub, PATH_MAX_LEN, "%s[%zu]", path, i);
}

static cachew_err
lit_infer_shape(const cwi_value *v, const char *path, lit_scan *s)
{
	const cwi_value *cur = v;

	s->rank = 0;
	while (cur->type == CWI_V_LIST) {
		if (s->rank == CACHEW_MAX_RANK)
			return cwi_fail(CACHEW_EINVAL,
			    "%s nests lists deeper than %d (the maximum rank)",
			    path, CACHEW_MAX_RANK);
		s->shape[s->rank++] = (int64_t)cur->u.list.n;
		if (cur->u.list.n == 0)
			break;
		cur = &cur->u.list.items[0];
	}
	return CACHEW_OK;
}

static cachew_err
lit_check(const cwi_value *v, unsigned depth, const char *path, lit_scan *s)
{
	char sub[PATH_MAX_LEN];
	cachew_err rv;

	if (depth < s->rank) {
		if (v->type != CWI_V_LIST)
			return cwi_fail(CACHEW_EINVAL,
			    "%s is %s where a list of %lld items was expected "
			    "(nested lists must be rectangular)",
			    path, value_kind(v), (long long)s->shape[depth]);
		if ((int64_t)v->u.list.n != s->shape[depth])
			return cwi_fail(CACHEW_EINVAL,
			    "%s has %zu items where %lld were expected (nested "
			    "lists must be rectangular)",
			    path, v->u.list.n, (long long)s->shape[depth]);
		for (size_t i = 0; i < v->u.list.n; i++) {
			path_item(sub, path, i);
			rv = lit_check(&v->u.list.items[i], depth + 1, sub, s);
			if (rv != CACHEW_OK)
				return rv;
		}
		return CACHEW_OK;
	}
	switch (v->type) {
	case CWI_V_INT:
	case CWI_V_FLOAT:
		if (!s->has_int && !s->has_float)
			snprintf(s->num_path, sizeof(s->num_path), "%s", path);
		if (v->type == CWI_V_INT)
			s->has_int = true;
		else
			s->has_float = true;
		break;
	case CWI_V_BOOL:
		if (!s->has_bool)
			snprintf(s->bool_path, sizeof(s->bool_path), "%s", path);
		s->has_bool = true;
		break;
	case CWI_V_STR:
		if (!s->has_str)
			snprintf(s->str_path, sizeof(s->str_path), "%s", path);
		s->has_str = true;
		break;
	case CWI_V_LIST:
		return cwi_fail(CACHEW_EINVAL,
		    "%s is a list where a scalar was expected (nested lists "
		    "must be rectangular)",
		    path);
	case CWI_V_NIL:
	case CWI_V_MAP:
		return cwi_fail(CACHEW_EINVAL, "%s is %s, not a tensor value",
		    path, value_kind(v));
	}
	s->nleaves++;
	return CACHEW_OK;
}

static cachew_err
lit_dtype(const lit_scan *s, const char *path, cachew_dtype *dt)
{
	bool num = s->has_int || s->has_float;

	if (s->has_str && (num || s->has_bool))
		return cwi_fail(CACHEW_EINVAL,
		    "%s mixes strings and %s (%s is a string, %s is not)", path,
		    num ? "numbers" : "bools", s->str_path,
		    num ? s->num_path : s->bool_path);
	if (s->has_bool && num)
		return cwi_fail(CACHEW_EINVAL,
		    "%s mixes bools and numbers (%s is a bool, %s a number)",
		    path, s->bool_path, s->num_path);
	*dt = s->has_str ? CACHEW_BYTES
	    : s->has_bool ? CACHEW_BOOL
	    : s->has_float ? CACHEW_F64
			   : CACHEW_I64;
	return CACHEW_OK;
}

/* Leaf writer state: the next leaf goes to index `i`. */
typedef struct lit_fill {
	cachew_dtype dtype;
	uint8_t *data;       /* fixed-width */
	const void **items;  /* bytes */
	size_t *lens;
	size_t i;
} lit_fill;

static void
lit_fill_leaves(const cwi_value *v, lit_fill *f)
{
	if (v->type == CWI_V_LIST) {
		for (size_t k = 0; k < v->u.list.n; k++)
			lit_fill_leaves(&v->u.list.items[k], f);
		return;
	}
	switch (f->dtype) {
	case CACHEW_I64: {
		int64_t x = v->u.i;
		memcpy(f->data + f->i * 8, &x, 8);
		break;
	}
	case CACHEW_F64: {
		double x = v->type == CWI_V_INT ? (double)v->u.i : v->u.f;
		memcpy(f->data + f->i * 8, &x, 8);
		break;
	}
	case CACHEW_BOOL:
		f->data[f->i] = v->u.b ? 1 : 0;
		break;
	case CACHEW_BYTES:
		f->items[f->i] = v->u.s.ptr;
		f->lens[f->i] = v->u.s.len;
		break;
	default:
		break;
	}
	f->i++;
}

/* Converts one component value. */
static cachew_err
lit_tensor(const cwi_value *v, const char *path, cwi_tensor *out)
{
	lit_scan s;
	lit_fill f;
	cachew_dtype dt = CACHEW_I64;
	cachew_err rv;

	memset(&s, 0, sizeof(s));
	rv = lit_infer_shape(v, path, &s);
	if (rv == CACHEW_OK)
		rv = lit_check(v, 0, path, &s);
	if (rv == CACHEW_OK)
		rv = lit_dtype(&s, path, &dt);
	if (rv != CACHEW_OK)
		return rv;
	memset(&f, 0, sizeof(f));
	f.dtype = dt;
	if (dt != CACHEW_BYTES) {
		rv = cwi_tensor_init_alloc(out, dt, s.rank, s.shape, false,
		    &f.data);
		if (rv != CACHEW_OK)
			return rv;
		lit_fill_leaves(v, &f);
		return CACHEW_OK;
	}
	f.items = calloc(s.nleaves + 1, sizeof(*f.items));
	f.lens = calloc(s.nleaves + 1, sizeof(*f.lens));
	if (f.items == NULL || f.lens == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	} else {
		lit_fill_leaves(v, &f);
		rv = cwi_tensor_init_bytes_list(out, s.rank, s.shape, f.items,
		    f.lens);
	}
	free(f.items);
	free(f.lens);
	return rv;
}

cachew_err
cwi_literal_element(const cwi_value *v, const char *path, cwi_element **out)
{
	bool map = v->type == CWI_V_MAP;
	size_t n = v->type == CWI_V_LIST && v->tuple ? v->u.list.n
	    : map				     ? v->u.map.n
						     : 1;
	char sub[PATH_MAX_LEN];
	cwi_element *e;
	cachew_err rv;

	if (n == 0)
		return cwi_fail(CACHEW_EINVAL,
		    "%s is an empty %s: an element needs a component", path,
		    map ? "map" : "tuple");
	if (n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_EINVAL,
		    "%s is a %s of %zu items: an element has at most %d "
		    "components",
		    path, map ? "map" : "tuple", n, CACHEW_MAX_COMPONENTS);
	e = cwi_element_new((uint32_t)n);
	if (e == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if (v->type == CWI_V_LIST && v->tuple) {
			path_item(sub, path, i);
			rv = lit_tensor(&v->u.list.items[i], sub, &e->comp[i]);
		} else if (map) {
			snprintf(sub, sizeof(sub), "%s.%s", path,
			    v->u.map.items[i].key);
			rv = lit_tensor(&v->u.map.items[i].val, sub, &e->comp[i]);
		} else {
			rv = lit_tensor(v, path, &e->comp[i]);
		}
		if (rv != CACHEW_OK) {
			cwi_element_release(e);
			return rv;
		}
	}
	*out = e;
	return CACHEW_OK;
}

/* ---- the sources ------------------------------------------------------------ */

typedef struct literal_iter {
	cwi_iter base;
	const cwi_value *items; /* borrowed from the node */
	size_t n, next;
	bool split;             /* read only the lease's units */
	cwi_unit_cursor lease;
} literal_iter;

/* The next item to convert: in order, or the lease's next unit. */
static bool
literal_take(literal_iter *l, size_t *i)
{
	uint64_t u;

	if (!l->split) {
		if (l->next == l->n)
			return false;
		*i = l->next++;
		return true;
	}
	if (!cwi_unit_cursor_next(&l->lease, &u))
		return false;
	*i = (size_t)u;
	return true;
}

static cachew_err
literal_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	literal_iter *l = (literal_iter *)it;
	char path[PATH_MAX_LEN];
	size_t got = 0;

	size_t i;

	while (got < max && literal_take(l, &i)) {
		cwi_element *e;
		cachew_err rv;

		/* from_list's items are values[i]; from_tensors' only item
		 * is the whole value. */
		if (l->n == 1 && it->node->op == &cwi_op_from_tensors)
			snprintf(path, sizeof(path), "values");
		else
			path_item(path, "values", i);
		rv = cwi_literal_element(&l->items[i], path, &e);
		if (rv != CACHEW_OK) {
			for (size_t k = 0; k < got; k++)
				cwi_element_release(out->v[--out->n]);
			return cwi_pipeline_fail(it->pl, rv, "%s: %s",
			    it->node->op->name, cwi_errmsg_get());
		}
		cwi_chunk_push(out, e);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
literal_destroy(cwi_iter *it)
{
	free(it);
}

/* [next item, lease cursor]. */
static cachew_err
literal_save(cwi_iter *it, cwi_state_writer *w)
{
	literal_iter *l = (literal_iter *)it;

	cwi_sw_array(w, 2);
	cwi_sw_uint(w, l->next);
	cwi_sw_unit_cursor(w, &l->lease);
	return CACHEW_OK;
}

static cachew_err
literal_restore(cwi_iter *it, cwi_state_reader *r)
{
	literal_iter *l = (literal_iter *)it;
	uint64_t next = 0;

	if (!cwi_sr_array(r, it->node->op->name, 2) ||
	    !cwi_sr_uint(r, "next", &next, l->n) ||
	    !cwi_sr_unit_cursor(r, &l->lease))
		return cwi_sr_error(r);
	l->next = (size_t)next;
	return CACHEW_OK;
}

static const cwi_iter_ops literal_iter_ops = {
    .next = literal_next,
    .destroy = literal_destroy,
    .save = literal_save,
    .restore = literal_restore,
};

/* Elements are converted as they are pulled: the node holds the literal,
 * so nothing is converted twice within an epoch and nothing is kept. */
static cachew_err
literal_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	const cwi_value *v = cwi_node_value(node, "values");
	literal_iter *l = calloc(1, sizeof(*l));
	const cwi_unit_range *ranges;
	size_t nranges;
	bool split;
	cachew_err rv;

	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l->base.ops = &literal_iter_ops;
	if (node->op == &cwi_op_from_tensors) {
		l->items = v;
		l->n = 1;
	} else {
		l->items = v->u.list.items;
		l->n = v->u.list.n;
	}
	rv = cwi_split_source_ranges(args, node, l->n, &split, &ranges, &nranges);
	if (rv != CACHEW_OK) {
		free(l);
		return rv;
	}
	l->split = split;
	cwi_unit_cursor_init(&l->lease, ranges, nranges);
	*out = &l->base;
	return CACHEW_OK;
}

static cachew_err
literal_split_units(const cwi_node *node, uint64_t *units)
{
	const cwi_value *v = cwi_node_value(node, "values");

	*units = node->op == &cwi_op_from_tensors ? 1 : v->u.list.n;
	return CACHEW_OK;
}

/* Converts once when the pipeline is built, so that a ragged or mixed
 * literal is a build error naming the bad value, and gives the element's
 * spec (named after the keys of a map). */
static cachew_err
literal_try(const cwi_node *node, const cwi_value *v, const char *path,
    cwi_spec *spec)
{
	cwi_element *e = NULL;
	char msg[512];
	cachew_err rv = cwi_literal_element(v, path, &e);

	if (rv != CACHEW_OK) {
		snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
		return cwi_fail(rv, "%s: %s", node->op->name, msg);
	}
	rv = cwi_spec_of_element(spec, e);
	cwi_element_release(e);
	for (size_t i = 0; rv == CACHEW_OK && v->type == CWI_V_MAP &&
	     i < v->u.map.n; i++)
		rv = cwi_comp_spec_name(&spec->comp[i], v->u.map.items[i].key);
	return rv;
}

static cachew_err
from_tensors_infer(cwi_node *node)
{
	node->card = 1;
	return literal_try(node, cwi_node_value(node, "values"), "values",
	    &node->spec);
}

/* The items' specs widened to hold them all: what differs between items
 * (a dimension, a dtype, a rank, the structure) becomes unknown. Items may
 * differ (from_list([1, 2.5]) yields an i64 then an f64), which tf.data's
 * from_tensor_slices, one tensor sliced, cannot express. */
static cachew_err
from_list_infer(cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "values");
	char path[PATH_MAX_LEN];
	cwi_spec item = {0};
	cachew_err rv = CACHEW_OK;

	node->card = (int64_t)v->u.list.n;
	for (size_t i = 0; rv == CACHEW_OK && i < v->u.list.n; i++) {
		path_item(path, "values", i);
		rv = literal_try(node, &v->u.list.items[i], path,
		    i == 0 ? &node->spec : &item);
		if (rv != CACHEW_OK || i == 0)
			continue;
		rv = cwi_spec_merge(&node->spec, &item, NULL);
		cwi_spec_free(&item);
	}
	return rv;
}

static const cwi_param_spec from_tensors_params[] = {
    {.name = "values", .type = CWI_P_ANY, .flags = CWI_PF_REQUIRED,
	.help = "the literal: a value, a (nested) list or a tuple"},
};

const cwi_dataset_op cwi_op_from_tensors = {
    .name = "from_tensors",
    .doc = "one element from a literal (a tuple gives several components, a map named ones)",
    .params = from_tensors_params,
    .nparams = 1,
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_SPLITTABLE,
    .infer = from_tensors_infer,
    .iter_create = literal_create,
    .split_units = literal_split_units,
    .saves = "whether the element was yielded (and a lease's unit cursor)",
};

static const cwi_param_spec from_list_params[] = {
    {.name = "values", .type = CWI_P_LIST, .flags = CWI_PF_REQUIRED,
	.help = "a list: one element per item"},
};

const cwi_dataset_op cwi_op_from_list = {
    .name = "from_list",
    .doc = "one element per item of a literal list",
    .params = from_list_params,
    .nparams = 1,
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_SPLITTABLE,
    .infer = from_list_infer,
    .iter_create = literal_create,
    .split_units = literal_split_units,
    .saves = "the index of the next item (and a lease's unit cursor)",
};
