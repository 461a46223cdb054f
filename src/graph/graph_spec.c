/*
 * graph_spec.c - element specs and cardinality: what a dataset's elements
 * hold and how many there are, computed when each node is built from its
 * inputs' and its parameters (the operators' infer rules), so that a
 * structure mismatch is refused before the first element is read.
 *
 * A spec is known or not as a whole (a user function's output is not), and
 * within a known spec a dtype, a rank or a dimension may be unknown: every
 * check compares only what both sides know.
 */
#include "graph.h"

#include <errno.h>

#include <stdio.h>
#include <stdlib.h>

/* ---- specs ------------------------------------------------------------------ */

void
cwi_spec_free(cwi_spec *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		free(s->comp[i].name);
	free(s->comp);
	memset(s, 0, sizeof(*s));
}

cachew_err
cwi_spec_init(cwi_spec *s, uint32_t n)
{
	memset(s, 0, sizeof(*s));
	if (n > 0) {
		s->comp = calloc(n, sizeof(*s->comp));
		if (s->comp == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	s->known = true;
	s->n = n;
	for (uint32_t i = 0; i < n; i++)
		s->comp[i].rank = CWI_RANK_UNKNOWN;
	return CACHEW_OK;
}

cachew_err
cwi_comp_spec_name(cwi_comp_spec *c, const char *name)
{
	char *copy = NULL;

	if (name != NULL && (copy = cwi_strdup(name)) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	free(c->name);
	c->name = copy;
	return CACHEW_OK;
}

cachew_err
cwi_spec_copy(cwi_spec *dst, const cwi_spec *src)
{
	cachew_err rv;

	if (!src->known) {
		memset(dst, 0, sizeof(*dst));
		return CACHEW_OK;
	}
	rv = cwi_spec_init(dst, src->n);
	for (uint32_t i = 0; rv == CACHEW_OK && i < src->n; i++) {
		dst->comp[i] = src->comp[i];
		dst->comp[i].name = NULL;
		rv = cwi_comp_spec_name(&dst->comp[i], src->comp[i].name);
	}
	if (rv != CACHEW_OK)
		cwi_spec_free(dst);
	return rv;
}

cachew_err
cwi_spec_of_element(cwi_spec *s, const cwi_element *e)
{
	cachew_err rv = cwi_spec_init(s, e->n);

	for (uint32_t i = 0; rv == CACHEW_OK && i < e->n; i++) {
		cwi_comp_spec *c = &s->comp[i];
		c->dtype = e->comp[i].dtype;
		c->rank = e->comp[i].rank;
		memcpy(c->shape, e->comp[i].shape, sizeof(c->shape));
	}
	return rv;
}

int
cwi_spec_find(const cwi_spec *s, const char *name)
{
	for (uint32_t i = 0; s->known && i < s->n; i++)
		if (s->comp[i].name != NULL && strcmp(s->comp[i].name, name) == 0)
			return (int)i;
	return -1;
}

void
cwi_comp_spec_print(cwi_strbuf *sb, const cwi_comp_spec *c)
{
	const char *dt = cachew_dtype_name((cachew_dtype)c->dtype);

	cwi_strbuf_printf(sb, "%s[", dt != NULL ? dt : "?");
	if (c->rank == CWI_RANK_UNKNOWN)
		cwi_strbuf_puts(sb, "?");
	for (unsigned d = 0; c->rank != CWI_RANK_UNKNOWN && d < c->rank; d++)
		cwi_strbuf_printf(sb, d ? ",%lld" : "%lld",
		    (long long)c->shape[d]);
	cwi_strbuf_puts(sb, "]");
}

void
cwi_spec_print(cwi_strbuf *sb, const cwi_spec *s)
{
	bool named = false;

	if (!s->known) {
		cwi_strbuf_puts(sb, "?");
		return;
	}
	for (uint32_t i = 0; i < s->n; i++)
		named = named || s->comp[i].name != NULL;
	if (s->n == 1 && !named) {
		cwi_comp_spec_print(sb, &s->comp[0]);
		return;
	}
	cwi_strbuf_puts(sb, named ? "{" : "(");
	for (uint32_t i = 0; i < s->n; i++) {
		if (i > 0)
			cwi_strbuf_puts(sb, ", ");
		if (named)
			cwi_strbuf_printf(sb, "%s: ", s->comp[i].name != NULL
				? s->comp[i].name : "_");
		cwi_comp_spec_print(sb, &s->comp[i]);
	}
	cwi_strbuf_puts(sb, named ? "}" : ")");
}

cwi_names *
cwi_spec_names(const cwi_spec *s)
{
	const char *names[CACHEW_MAX_COMPONENTS];
	bool any = false;

	if (!s->known || s->n > CACHEW_MAX_COMPONENTS)
		return NULL;
	for (uint32_t i = 0; i < s->n; i++) {
		names[i] = s->comp[i].name;
		any = any || names[i] != NULL;
	}
	return any ? cwi_names_create(s->n, names) : NULL;
}

const char *
cwi_comp_spec_label(const cwi_spec *s, uint32_t i, char *buf, size_t len)
{
	if (s->known && i < s->n && s->comp[i].name != NULL)
		snprintf(buf, len, "component '%s'", s->comp[i].name);
	else
		snprintf(buf, len, "component %u", i);
	return buf;
}

/* A component spec as text into buf, for messages. */
static const char *
comp_str(const cwi_comp_spec *c, char *buf, size_t len)
{
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	cwi_comp_spec_print(&sb, c);
	snprintf(buf, len, "%s", sb.data != NULL && !sb.oom ? sb.data : "?");
	cwi_strbuf_free(&sb);
	return buf;
}

/* Widens a to hold b's values too; with `what` (strict), another dtype,
 * rank or name is refused, else it becomes unknown. */
static cachew_err
merge_comp(cwi_comp_spec *a, const cwi_comp_spec *b, const cwi_spec *as,
    uint32_t i, const char *what)
{
	char la[64], sa[128], sbuf[128];
	bool same_names = (a->name == NULL) == (b->name == NULL) &&
	    (a->name == NULL || strcmp(a->name, b->name) == 0);
	bool dtypes_clash = a->dtype != CACHEW_INVALID &&
	    b->dtype != CACHEW_INVALID && a->dtype != b->dtype;
	bool ranks_clash = a->rank != CWI_RANK_UNKNOWN &&
	    b->rank != CWI_RANK_UNKNOWN && a->rank != b->rank;

	cwi_comp_spec_label(as, i, la, sizeof(la));
	if (what != NULL && !same_names)
		return cwi_fail(CACHEW_ETYPE, "%s: component %u is named "
		    "'%s' in one and '%s' in the other", what, i,
		    a->name != NULL ? a->name : "", b->name != NULL ? b->name
								   : "");
	if (what != NULL && dtypes_clash)
		return cwi_fail(CACHEW_ETYPE, "%s: %s is %s in one and %s in "
		    "the other", what, la, comp_str(a, sa, sizeof(sa)),
		    comp_str(b, sbuf, sizeof(sbuf)));
	if (what != NULL && ranks_clash)
		return cwi_fail(CACHEW_ETYPE, "%s: %s is %s in one and %s in "
		    "the other (rank %u against %u)", what, la,
		    comp_str(a, sa, sizeof(sa)), comp_str(b, sbuf, sizeof(sbuf)),
		    a->rank, b->rank);
	if (!same_names) {
		free(a->name);
		a->name = NULL;
	}
	if (a->dtype != b->dtype)
		a->dtype = CACHEW_INVALID;
	if (a->rank != b->rank) {
		a->rank = CWI_RANK_UNKNOWN;
		return CACHEW_OK;
	}
	for (unsigned d = 0; a->rank != CWI_RANK_UNKNOWN && d < a->rank; d++)
		if (a->shape[d] != b->shape[d])
			a->shape[d] = -1;
	return CACHEW_OK;
}

cachew_err
cwi_spec_merge(cwi_spec *a, const cwi_spec *b, const char *what)
{
	cachew_err rv;

	if (!b->known) {
		cwi_spec_free(a);
		return CACHEW_OK;
	}
	if (!a->known)
		return CACHEW_OK;
	if (a->n != b->n && what == NULL) {
		cwi_spec_free(a);
		return CACHEW_OK;
	}
	if (a->n != b->n) {
		cwi_strbuf sa, sbuf;
		cwi_strbuf_init(&sa);
		cwi_strbuf_init(&sbuf);
		cwi_spec_print(&sa, a);
		cwi_spec_print(&sbuf, b);
		rv = cwi_fail(CACHEW_ETYPE, "%s: elements of %u and of %u "
		    "components (%s against %s)", what, a->n, b->n,
		    sa.data != NULL && !sa.oom ? sa.data : "?",
		    sbuf.data != NULL && !sbuf.oom ? sbuf.data : "?");
		cwi_strbuf_free(&sa);
		cwi_strbuf_free(&sbuf);
		return rv;
	}
	for (uint32_t i = 0; i < a->n; i++) {
		rv = merge_comp(&a->comp[i], &b->comp[i], a, i, what);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* ---- cardinality ------------------------------------------------------------- */

int64_t
cwi_card_add(int64_t a, int64_t b)
{
	if (a == CACHEW_CARDINALITY_INFINITE || b == CACHEW_CARDINALITY_INFINITE)
		return CACHEW_CARDINALITY_INFINITE;
	if (a < 0 || b < 0)
		return CACHEW_CARDINALITY_UNKNOWN;
	return a > INT64_MAX - b ? CACHEW_CARDINALITY_UNKNOWN : a + b;
}

/* k >= 0 repetitions of a dataset of cardinality a. */
int64_t
cwi_card_mul(int64_t a, int64_t k)
{
	if (k == 0 || a == 0)
		return 0;
	if (a < 0)
		return a;
	return a > INT64_MAX / k ? CACHEW_CARDINALITY_UNKNOWN : a * k;
}

void
cwi_card_print(cwi_strbuf *sb, int64_t card)
{
	if (card == CACHEW_CARDINALITY_INFINITE)
		cwi_strbuf_puts(sb, "infinite");
	else if (card < 0)
		cwi_strbuf_puts(sb, "unknown");
	else
		cwi_strbuf_printf(sb, "%lld", (long long)card);
}

/* ---- rules ---------------------------------------------------------------- */

cachew_err
cwi_infer_passthrough(cwi_node *node)
{
	node->card = node->inputs[0]->card;
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

cachew_err
cwi_infer_same_spec(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_UNKNOWN;
	return cwi_spec_copy(&node->spec, &node->inputs[0]->spec);
}

cachew_err
cwi_spec_scalar(cwi_spec *s, cachew_dtype dtype)
{
	cachew_err rv = cwi_spec_init(s, 1);

	if (rv == CACHEW_OK) {
		s->comp[0].dtype = (uint8_t)dtype;
		s->comp[0].rank = 0;
	}
	return rv;
}

cachew_err
cwi_infer_bytes_scalar(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_UNKNOWN;
	return cwi_spec_scalar(&node->spec, CACHEW_BYTES);
}

/* The function's rule over the input's spec, into node->spec; a function
 * with no rule, or an input spec not known, leaves it unknown. */
static cachew_err
infer_fn(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;

	if (node->fn == NULL || node->fn->spec == NULL || !in->known)
		return CACHEW_OK;
	return node->fn->spec(node, in, &node->spec);
}

cachew_err
cwi_infer_map(cwi_node *node)
{
	node->card = node->inputs[0]->card;
	return infer_fn(node);
}

/* A filter keeps the input's spec whatever its function, whose rule only
 * checks what it reads. */
cachew_err
cwi_infer_filter(cwi_node *node)
{
	cachew_err rv = infer_fn(node);

	cwi_spec_free(&node->spec);
	return rv == CACHEW_OK ? cwi_infer_same_spec(node) : rv;
}

cachew_err
cwi_infer_flat(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_UNKNOWN;
	return infer_fn(node);
}

cachew_err
cwi_node_infer(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_UNKNOWN;
	memset(&node->spec, 0, sizeof(node->spec));
	if (node->op->infer != NULL)
		return node->op->infer(node);
	if ((node->op->flags & CWI_OPF_PASSTHROUGH) && node->ninputs == 1)
		return cwi_infer_passthrough(node);
	return CACHEW_OK;
}

/* ---- public ---------------------------------------------------------------- */

int64_t
cachew_dataset_cardinality(const cachew_dataset *ds)
{
	return ds != NULL ? ds->card : CACHEW_CARDINALITY_UNKNOWN;
}

size_t
cachew_dataset_num_components(const cachew_dataset *ds)
{
	return ds != NULL && ds->spec.known ? ds->spec.n : 0;
}

cachew_err
cachew_dataset_component(const cachew_dataset *ds, size_t i,
    cachew_dtype *dtype, int *rank, int64_t *shape, const char **name)
{
	const cwi_comp_spec *c;

	cwi_clear_errmsg();
	if (ds == NULL)
		return cwi_fail(CACHEW_EINVAL, "dataset is NULL");
	if (!ds->spec.known || i >= ds->spec.n)
		return cwi_fail(CACHEW_EINVAL, "component %zu: the dataset's "
		    "elements have %zu%s", i, cachew_dataset_num_components(ds),
		    ds->spec.known ? "" : " known components");
	c = &ds->spec.comp[i];
	if (dtype != NULL)
		*dtype = (cachew_dtype)c->dtype;
	if (rank != NULL)
		*rank = c->rank == CWI_RANK_UNKNOWN ? -1 : c->rank;
	if (shape != NULL && c->rank != CWI_RANK_UNKNOWN)
		memcpy(shape, c->shape, c->rank * sizeof(*shape));
	if (name != NULL)
		*name = c->name;
	return CACHEW_OK;
}

cachew_err
cachew_dataset_component_find(
    const cachew_dataset *ds, const char *name, size_t *index)
{
	cwi_strbuf names;
	cachew_err rv;
	int i;

	cwi_clear_errmsg();
	if (ds == NULL || name == NULL || index == NULL)
		return cwi_fail(CACHEW_EINVAL, "NULL argument");
	i = cwi_spec_find(&ds->spec, name);
	if (i >= 0) {
		*index = (size_t)i;
		return CACHEW_OK;
	}
	cwi_strbuf_init(&names);
	cwi_spec_print(&names, &ds->spec);
	rv = cwi_fail(CACHEW_ENOENT, "no component is named '%s' (the "
	    "elements are %s)", name,
	    names.data != NULL && !names.oom ? names.data : "?");
	cwi_strbuf_free(&names);
	return rv;
}

cachew_err
cachew_dataset_spec_str(const cachew_dataset *ds, char **out)
{
	cwi_strbuf sb;

	cwi_clear_errmsg();
	if (ds == NULL || out == NULL)
		return cwi_fail(CACHEW_EINVAL, "NULL argument");
	cwi_strbuf_init(&sb);
	cwi_spec_print(&sb, &ds->spec);
	return cwi_strbuf_finish(&sb, out, NULL);
}

/* ---- parsing a spec's text (user sources declare theirs) ---------------- */

typedef struct spec_text {
	const char *s;
	size_t pos;
	char *err;
	size_t errlen;
} spec_text;

static void
spec_skip(spec_text *t)
{
	while (t->s[t->pos] == ' ' || t->s[t->pos] == '\t')
		t->pos++;
}

static bool
spec_bad(spec_text *t, const char *what)
{
	snprintf(t->err, t->errlen, "element spec \"%.80s\": column %zu: %s",
	    t->s, t->pos + 1, what);
	return false;
}

/* An identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 characters) into buf. */
static bool
spec_word(spec_text *t, char *buf, size_t len, const char *what)
{
	size_t n = 0;

	spec_skip(t);
	while (((t->s[t->pos] | 32) >= 'a' && (t->s[t->pos] | 32) <= 'z') ||
	    t->s[t->pos] == '_' ||
	    (n > 0 && t->s[t->pos] >= '0' && t->s[t->pos] <= '9')) {
		if (n + 1 >= len)
			return spec_bad(t, "a name longer than 63 characters");
		buf[n++] = t->s[t->pos++];
	}
	buf[n] = '\0';
	return n > 0 || spec_bad(t, what);
}

/* dtype[d0,d1,...] with d = -1 (or ?) for an unknown dimension; [?] is an
 * unknown rank. */
static bool
spec_comp(spec_text *t, cwi_comp_spec *c)
{
	char dt[64];
	cachew_dtype dtype;

	if (!spec_word(t, dt, sizeof(dt), "expected a dtype (i64, f32, "
	    "bytes, ...)"))
		return false;
	if (cachew_dtype_from_name(dt, &dtype) != CACHEW_OK) {
		t->pos -= strlen(dt);
		return spec_bad(t, "unknown dtype");
	}
	c->dtype = (uint8_t)dtype;
	c->rank = 0;
	spec_skip(t);
	if (t->s[t->pos] != '[')
		return spec_bad(t, "expected '[' and the shape ('[]' for a "
		    "scalar)");
	t->pos++;
	spec_skip(t);
	if (t->s[t->pos] == '?') {
		t->pos++;
		c->rank = CWI_RANK_UNKNOWN;
		spec_skip(t);
	}
	while (c->rank != CWI_RANK_UNKNOWN && t->s[t->pos] != ']') {
		char *end;
		long long d;
		if (c->rank > 0) {
			if (t->s[t->pos] != ',')
				return spec_bad(t, "expected ',' or ']'");
			t->pos++;
			spec_skip(t);
		}
		if (c->rank == CACHEW_MAX_RANK)
			return spec_bad(t, "more dimensions than the maximum "
			    "rank of 8");
		if (t->s[t->pos] == '?') {
			d = -1;
			end = (char *)t->s + t->pos + 1;
		} else {
			errno = 0;
			d = strtoll(t->s + t->pos, &end, 10);
			if (end == t->s + t->pos || errno != 0 || d < -1)
				return spec_bad(t, "expected a dimension (a "
				    "size >= 0, or -1 for unknown)");
		}
		c->shape[c->rank++] = d;
		t->pos = (size_t)(end - t->s);
		spec_skip(t);
	}
	if (t->s[t->pos] != ']')
		return spec_bad(t, "expected ']'");
	t->pos++;
	return true;
}

static bool
spec_push(spec_text *t, cwi_spec *out, const char *name)
{
	cwi_comp_spec *comp;

	if (out->n == CACHEW_MAX_COMPONENTS)
		return spec_bad(t, "more than 64 components");
	comp = realloc(out->comp, (out->n + 1) * sizeof(*comp));
	if (comp == NULL)
		return spec_bad(t, "out of memory");
	out->comp = comp;
	memset(&comp[out->n], 0, sizeof(comp[0]));
	out->n++;
	if (name != NULL && cwi_spec_find(out, name) >= 0)
		return spec_bad(t, "a component name given twice");
	if (name != NULL && cwi_comp_spec_name(&comp[out->n - 1], name) !=
	    CACHEW_OK)
		return spec_bad(t, "out of memory");
	return spec_comp(t, &comp[out->n - 1]);
}

static bool
spec_list(spec_text *t, cwi_spec *out, char close)
{
	char name[64];

	t->pos++;
	do {
		spec_skip(t);
		if (close == '}') {
			if (!spec_word(t, name, sizeof(name), "expected a "
			    "component name"))
				return false;
			spec_skip(t);
			if (t->s[t->pos] != ':')
				return spec_bad(t, "expected ':' after the name");
			t->pos++;
		}
		if (!spec_push(t, out, close == '}' ? name : NULL))
			return false;
		spec_skip(t);
	} while (t->s[t->pos] == ',' && ++t->pos);
	if (t->s[t->pos] != close)
		return spec_bad(t, close == '}' ? "expected ',' or '}'"
						: "expected ',' or ')'");
	t->pos++;
	return true;
}

cachew_err
cwi_spec_parse(const char *text, cwi_spec *out, char *err, size_t errlen)
{
	spec_text t = {.s = text, .err = err, .errlen = errlen};
	bool ok;

	memset(out, 0, sizeof(*out));
	if (text == NULL)
		return CACHEW_OK; /* unknown */
	spec_skip(&t);
	if (text[t.pos] == '?' ) {
		t.pos++;
		spec_skip(&t);
		if (text[t.pos] == '\0')
			return CACHEW_OK;
		spec_bad(&t, "unexpected text after '?'");
		return CACHEW_EINVAL;
	}
	out->known = true;
	if (text[t.pos] == '(')
		ok = spec_list(&t, out, ')');
	else if (text[t.pos] == '{')
		ok = spec_list(&t, out, '}');
	else
		ok = spec_push(&t, out, NULL);
	if (ok) {
		spec_skip(&t);
		ok = text[t.pos] == '\0' ||
		    spec_bad(&t, "unexpected text after the spec");
	}
	if (ok)
		return CACHEW_OK;
	cwi_spec_free(out);
	return CACHEW_EINVAL;
}
