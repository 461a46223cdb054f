/*
 * src_user.c - user_source(fn=name, ...): a source defined by callbacks
 * (cachew_source_register, from C or a plugin), tf.data's from_generator.
 * A pipeline names it `name(...)` (graph_node.c rewrites that to this
 * operator, as a map alias is a map). Its split units are the source's
 * splits: a lease opens each of its splits in order, the plain run every
 * split from 0. Elements are checked against the spec the source declared,
 * since everything downstream was typed by it when the pipeline was built.
 */
#include "sources.h"
#include "../exec/exec_split.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct user_iter {
	cwi_iter base;
	const cwi_fn *fn;
	cachew_op_ctx ctx;
	uint64_t base_seed;      /* ctx's seed before a split mixes in */
	cwi_unit_range whole;    /* every split, when not leased */
	const cwi_unit_range *ranges; /* the lease's (the pipeline's), or
				       * &whole */
	size_t nranges;
	cwi_unit_cursor cur;
	uint64_t taken;   /* splits taken from cur, the open one included */
	bool open;
	void *seq;
	uint64_t split;   /* the open split */
	uint64_t yielded; /* elements of the open split read */
} user_iter;

static const char *
user_name(const user_iter *u)
{
	return u->fn->name;
}

static void
user_close(user_iter *u)
{
	if (u->open && u->fn->source.close != NULL)
		u->fn->source.close(u->seq);
	u->open = false;
	u->seq = NULL;
}

/* Whether e is what the source declared; a reason into why if not. */
static bool
user_matches(const cwi_spec *s, const cwi_element *e, char *why, size_t len)
{
	char have[256], want[96];

	if (!s->known)
		return true;
	if (e->n != s->n) {
		snprintf(why, len, "%u components, not %u",
		    e->n, s->n);
		return false;
	}
	for (uint32_t c = 0; c < e->n; c++) {
		const cwi_comp_spec *cs = &s->comp[c];
		const cwi_tensor *t = &e->comp[c];
		bool ok = cs->dtype == CACHEW_INVALID || cs->dtype == t->dtype;
		if (cs->rank != CWI_RANK_UNKNOWN) {
			ok = ok && cs->rank == t->rank;
			for (unsigned d = 0; ok && d < t->rank; d++)
				ok = cs->shape[d] < 0 ||
				    cs->shape[d] == t->shape[d];
		}
		if (!ok) {
			cwi_strbuf sb;
			cwi_strbuf_init(&sb);
			cwi_comp_spec_print(&sb, cs);
			snprintf(want, sizeof(want), "%s",
			    sb.data != NULL && !sb.oom ? sb.data : "?");
			cwi_strbuf_free(&sb);
			snprintf(why, len, "component %u is %s, not %s", c,
			    cwi_tensor_spec_str(t, have, sizeof(have)), want);
			return false;
		}
	}
	return true;
}

/* Opens the next split of the lease; false when none is left. */
static cachew_err
user_open_next(user_iter *u, bool *more)
{
	uint64_t split;
	cachew_err rv;

	*more = cwi_unit_cursor_next(&u->cur, &split);
	if (!*more)
		return CACHEW_OK;
	u->taken++;
	u->split = split;
	u->yielded = 0;
	u->ctx.base_seed = cwi_seed_derive(u->base_seed, split);
	cwi_op_ctx_at(&u->ctx, 0);
	u->seq = NULL;
	rv = u->fn->source.open(&u->ctx, split, &u->seq);
	if (rv != CACHEW_OK) {
		if (u->ctx.errmsg[0] == '\0')
			cachew_op_ctx_fail(&u->ctx, "opening split %llu "
			    "failed", (unsigned long long)split);
		return cwi_fn_failed(&u->ctx, u->base.node, u->base.pl, rv);
	}
	u->open = true;
	return CACHEW_OK;
}

/* The next element of the open split into *out, or CACHEW_EOF at its end
 * (the split is closed then). */
static cachew_err
user_pull(user_iter *u, cwi_element **out)
{
	char why[384];
	cachew_err rv;

	*out = NULL;
	cwi_op_ctx_at(&u->ctx, u->yielded);
	rv = u->fn->source.next(&u->ctx, u->seq, out);
	if (rv == CACHEW_EOF) {
		if (*out != NULL)
			cwi_element_release(*out);
		user_close(u);
		return CACHEW_EOF;
	}
	if (rv == CACHEW_OK && *out == NULL)
		rv = cachew_op_ctx_fail(&u->ctx, "returned no element");
	if (rv != CACHEW_OK) {
		if (*out != NULL)
			cwi_element_release(*out);
		*out = NULL;
		return cwi_fn_failed(&u->ctx, u->base.node, u->base.pl, rv);
	}
	if (!user_matches(&u->fn->source_spec, *out, why, sizeof(why))) {
		cwi_element_release(*out);
		*out = NULL;
		return cwi_pipeline_fail(u->base.pl, CACHEW_ETYPE, "user_source("
		    "%s): split %llu, element %llu: %s, as the source declared",
		    user_name(u), (unsigned long long)u->split,
		    (unsigned long long)u->yielded, why);
	}
	u->yielded++;
	return CACHEW_OK;
}

static cachew_err
user_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	user_iter *u = (user_iter *)it;
	size_t made = 0;
	cachew_err rv;

	while (made < max) {
		cwi_element *e;
		if (!u->open) {
			bool more;
			rv = user_open_next(u, &more);
			if (rv != CACHEW_OK)
				return rv;
			if (!more)
				return CACHEW_EOF;
		}
		rv = user_pull(u, &e);
		if (rv == CACHEW_EOF)
			continue;
		if (rv != CACHEW_OK)
			return rv;
		cwi_chunk_push(out, e);
		made++;
	}
	return CACHEW_OK;
}

static void
user_destroy(cwi_iter *it)
{
	user_iter *u = (user_iter *)it;

	user_close(u);
	free(u);
}

/* [splits taken, open, elements of the open split read]. */
static cachew_err
user_save(cwi_iter *it, cwi_state_writer *w)
{
	user_iter *u = (user_iter *)it;

	cwi_sw_array(w, 3);
	cwi_sw_uint(w, u->taken);
	cwi_sw_bool(w, u->open);
	cwi_sw_uint(w, u->yielded);
	return CACHEW_OK;
}

/* Takes the splits again, reopens the one that was open and reads past
 * what it had yielded: a split yields the same elements each time. */
static cachew_err
user_restore(cwi_iter *it, cwi_state_reader *r)
{
	user_iter *u = (user_iter *)it;
	uint64_t taken = 0, yielded = 0, split;
	bool open = false, more = true;
	cachew_err rv = CACHEW_OK;

	if (!cwi_sr_array(r, "user_source", 3) ||
	    !cwi_sr_uint(r, "splits taken", &taken, UINT64_MAX) ||
	    !cwi_sr_bool(r, "open", &open) ||
	    !cwi_sr_uint(r, "yielded", &yielded, UINT64_MAX))
		return cwi_sr_error(r);
	if (open && taken == 0) {
		cwi_sr_fail(r, CACHEW_EINVAL, "an open split among none taken");
		return cwi_sr_error(r);
	}
	for (uint64_t k = 0; k + (open ? 1 : 0) < taken; k++) {
		if (!cwi_unit_cursor_next(&u->cur, &split)) {
			cwi_sr_fail(r, CACHEW_EINVAL, "%llu splits taken, more "
			    "than the source has", (unsigned long long)taken);
			return cwi_sr_error(r);
		}
		u->taken++;
	}
	if (!open)
		return CACHEW_OK;
	rv = user_open_next(u, &more);
	if (rv == CACHEW_OK && !more)
		rv = cwi_fail(CACHEW_EINVAL, "user_source(%s): the saved split "
		    "is past the source's", user_name(u));
	for (uint64_t k = 0; rv == CACHEW_OK && k < yielded; k++) {
		cwi_element *e;
		rv = user_pull(u, &e);
		if (rv == CACHEW_EOF)
			rv = cwi_fail(CACHEW_EINVAL, "user_source(%s): split "
			    "%llu ended after %llu elements, before the saved "
			    "position (%llu): does it yield the same elements "
			    "each time?", user_name(u),
			    (unsigned long long)u->split,
			    (unsigned long long)k, (unsigned long long)yielded);
		else if (rv == CACHEW_OK)
			cwi_element_release(e);
	}
	return rv;
}

static const cwi_iter_ops user_iter_ops = {
    .next = user_next,
    .destroy = user_destroy,
    .save = user_save,
    .restore = user_restore,
};

static cachew_err
user_split_units(const cwi_node *node, uint64_t *units)
{
	char err[256] = "";
	cachew_err rv;

	*units = 1;
	if (node->fn->source.splits == NULL)
		return CACHEW_OK;
	rv = node->fn->source.splits(node->fn_state, units, err, sizeof(err));
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "user_source(%s): splits: %s",
		    node->fn->name, err[0] != '\0' ? err : cachew_strerror(rv));
	return CACHEW_OK;
}

static cachew_err
user_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	user_iter *u = calloc(1, sizeof(*u));
	uint64_t units;
	bool split;
	cachew_err rv;

	if (u == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	u->base.ops = &user_iter_ops;
	u->fn = node->fn;
	rv = user_split_units(node, &units);
	if (rv == CACHEW_OK)
		rv = cwi_split_source_ranges(args, node, units, &split,
		    &u->ranges, &u->nranges);
	if (rv != CACHEW_OK) {
		free(u);
		return rv;
	}
	if (!split) {
		u->whole.begin = 0;
		u->whole.end = units;
		u->ranges = &u->whole;
		u->nranges = 1;
	}
	cwi_unit_cursor_init(&u->cur, u->ranges, u->nranges);
	cwi_op_ctx_init(&u->ctx, node, args->pl, args->epoch);
	u->base_seed = u->ctx.base_seed;
	*out = &u->base;
	return CACHEW_OK;
}

/* What the source declared (unknown without a spec); how many elements
 * it yields nobody says. */
static cachew_err
user_infer(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_UNKNOWN;
	if (node->fn == NULL || !node->fn->source_spec.known)
		return CACHEW_OK;
	return cwi_spec_copy(&node->spec, &node->fn->source_spec);
}

static const cwi_param_spec user_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the user source (cachew_source_register)"},
};

const cwi_dataset_op cwi_op_user_source = {
    .name = "user_source",
    .doc = "the elements of a source defined by callbacks "
	   "(cachew_source_register), split by split; `name(...)` for a "
	   "registered source `name` is user_source(fn=name, ...)",
    .params = user_params,
    .nparams = sizeof(user_params) / sizeof(user_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_FN_SOURCE | CWI_OPF_SPLITTABLE,
    .iter_create = user_create,
    .split_units = user_split_units,
    .saves = "the splits taken and the elements of the open split read "
	"(restoring reopens that split and reads past them)",
    .infer = user_infer,
    .note = "tf.data's from_generator, as C callbacks: open(split), next, "
	"close, an optional split count (the service leases splits to "
	"workers as it leases files) and a declared element spec, which "
	"every element is checked against. Plugins register sources as "
	"they register functions; workers run them by name "
	"(examples/plugin).",
};
