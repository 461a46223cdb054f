/*
 * graph_print.c - the canonical pipeline string of a node
 * (docs/pipeline-syntax.md, "Canonical form").
 *
 * A node prints as its chain of first inputs, from the source down, joined
 * by " | "; the other inputs print as nested pipelines inside the stage.
 * Each stage lists every parameter explicitly, so the string does not
 * depend on defaults and parses back to the same fingerprint. A shared
 * subgraph prints once per use: the byte limit bounds that blow-up.
 */
#include "graph.h"

#include <stdlib.h>

/* A pipeline nested n levels deep prints inside n stage parentheses and
 * opens one more for its own stages; the parser allows 32 open brackets. */
#define PRINT_MAX_NESTING 31
/* Far beyond what the parser reads; a guard against graphs whose shared
 * subgraphs would print exponentially often. */
#define PRINT_MAX_BYTES (16u << 20)

static cachew_err print_pipeline(
    const cwi_node *n, cwi_strbuf *sb, unsigned nesting);

static const cwi_param_spec *
spec_find(const cwi_dataset_op *op, const char *name)
{
	for (size_t i = 0; i < op->nparams; i++)
		if (strcmp(op->params[i].name, name) == 0)
			return &op->params[i];
	return NULL;
}

/* True if one positional value binds to `fn`, so `map(add)` is possible. */
static bool
fn_is_first_positional(const cwi_dataset_op *op)
{
	const char *const *form = op->positional[1];
	const char *first = form != NULL ? form[0]
	    : op->nparams > 0	       ? op->params[0].name
				       : NULL;

	return first != NULL && strcmp(first, "fn") == 0;
}

/* A function parameter prints as a plain key=value argument unless its
 * key could be taken for something else: a declared parameter, "fn_params"
 * itself, or a key that is not a name. Those go into fn_params={...}. */
static bool
fn_param_flat(const cwi_dataset_op *op, const char *key)
{
	return spec_find(op, key) == NULL && strcmp(key, "fn_params") != 0 &&
	    cwi_is_ident(key, strlen(key));
}

static void
arg_sep(cwi_strbuf *sb, size_t *nargs)
{
	if ((*nargs)++ > 0)
		cwi_strbuf_puts(sb, ", ");
}

static void
print_param(cwi_strbuf *sb, const cwi_param_spec *s, const cwi_value *v)
{
	cwi_strbuf_puts(sb, s->name);
	cwi_strbuf_puts(sb, "=");
	if ((s->flags & CWI_PF_AUTO) && v->type == CWI_V_INT &&
	    v->u.i == CACHEW_AUTO)
		cwi_strbuf_puts(sb, "auto");
	else
		cwi_value_print(sb, v);
}

/* The function's parameters, sorted: the plain ones first, then the rest
 * as fn_params={...}. Both forms bind to the same function parameters. */
static void
print_fn_params(const cwi_dataset_op *op, const cwi_value *fp, cwi_strbuf *sb,
    size_t *nargs)
{
	size_t boxed = 0;

	for (size_t i = 0; i < fp->u.map.n; i++) {
		const cwi_kv *kv = &fp->u.map.items[i];
		if (!fn_param_flat(op, kv->key)) {
			boxed++;
			continue;
		}
		arg_sep(sb, nargs);
		cwi_strbuf_puts(sb, kv->key);
		cwi_strbuf_puts(sb, "=");
		cwi_value_print(sb, &kv->val);
	}
	if (boxed == 0)
		return;
	arg_sep(sb, nargs);
	cwi_strbuf_puts(sb, "fn_params={");
	boxed = 0;
	for (size_t i = 0; i < fp->u.map.n; i++) {
		const cwi_kv *kv = &fp->u.map.items[i];
		if (fn_param_flat(op, kv->key))
			continue;
		if (boxed++ > 0)
			cwi_strbuf_puts(sb, ", ");
		cwi_strbuf_puts(sb, kv->key);
		cwi_strbuf_puts(sb, "=");
		cwi_value_print(sb, &kv->val);
	}
	cwi_strbuf_puts(sb, "}");
}

static cachew_err
print_stage(const cwi_node *n, cwi_strbuf *sb, unsigned nesting)
{
	const cwi_dataset_op *op = n->op;
	const cwi_value *fn = cwi_node_value(n, "fn");
	const cwi_value *fp = cwi_node_value(n, "fn_params");
	bool fn_pos = (op->flags & CWI_OPF_FN_ANY) && fn != NULL &&
	    fn_is_first_positional(op);
	size_t nargs = 0;
	cachew_err rv;

	cwi_strbuf_puts(sb, op->name);
	cwi_strbuf_puts(sb, "(");
	if (fn_pos) {
		arg_sep(sb, &nargs);
		cwi_value_print(sb, fn);
	}
	for (size_t i = 1; i < n->ninputs; i++) {
		arg_sep(sb, &nargs);
		rv = print_pipeline(n->inputs[i], sb, nesting + 1);
		if (rv != CACHEW_OK)
			return rv;
	}
	for (size_t i = 0; i < op->nparams; i++) {
		const cwi_param_spec *s = &op->params[i];
		const cwi_value *v = cwi_node_value(n, s->name);
		if (v == NULL || strcmp(s->name, "fn_params") == 0 ||
		    (fn_pos && strcmp(s->name, "fn") == 0))
			continue;
		arg_sep(sb, &nargs);
		print_param(sb, s, v);
	}
	if ((op->flags & CWI_OPF_FN_ANY) && fp != NULL && fp->type == CWI_V_MAP)
		print_fn_params(op, fp, sb, &nargs);
	cwi_strbuf_puts(sb, ")");
	return CACHEW_OK;
}

static cachew_err
print_pipeline(const cwi_node *n, cwi_strbuf *sb, unsigned nesting)
{
	const cwi_node **chain;
	const cwi_node *c;
	size_t len = 0;
	cachew_err rv = CACHEW_OK;

	if (nesting > PRINT_MAX_NESTING)
		return cwi_fail(CACHEW_ERANGE,
		    "to_string: pipelines nested more than %d levels deep "
		    "cannot be written as a string",
		    PRINT_MAX_NESTING);
	for (c = n; c != NULL; c = c->ninputs > 0 ? c->inputs[0] : NULL)
		len++;
	chain = malloc(len * sizeof(*chain));
	if (chain == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c = n;
	for (size_t i = len; i-- > 0; c = c->ninputs > 0 ? c->inputs[0] : NULL)
		chain[i] = c;
	for (size_t i = 0; i < len && rv == CACHEW_OK; i++) {
		if (i > 0)
			cwi_strbuf_puts(sb, " | ");
		rv = print_stage(chain[i], sb, nesting);
		if (rv == CACHEW_OK && sb->oom)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		if (rv == CACHEW_OK && sb->len > PRINT_MAX_BYTES)
			rv = cwi_fail(CACHEW_ERANGE,
			    "to_string: the pipeline string would exceed %u "
			    "bytes",
			    PRINT_MAX_BYTES);
	}
	free(chain);
	return rv;
}

cachew_err
cwi_node_to_string(const cwi_node *n, cwi_strbuf *sb)
{
	return print_pipeline(n, sb, 0);
}

cachew_err
cachew_dataset_to_string(const cachew_dataset *ds, char **out)
{
	cwi_strbuf sb;
	cachew_err rv;

	cwi_clear_errmsg();
	if (ds == NULL || out == NULL)
		return cwi_fail(CACHEW_EINVAL, "to_string: NULL argument");
	cwi_strbuf_init(&sb);
	rv = cwi_node_to_string(ds, &sb);
	if (rv != CACHEW_OK) {
		cwi_strbuf_free(&sb);
		return rv;
	}
	return cwi_strbuf_finish(&sb, out, NULL);
}
