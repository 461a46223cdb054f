/*
 * graph_msgpack.c - the serialized graph (docs/graph-format.md): a msgpack
 * map holding the nodes in topological order.
 *
 * The encoder numbers nodes in depth-first post-order (inputs first, in
 * input order) and writes structurally equal nodes once, so equal graphs
 * give equal bytes whatever their sharing. The decoder validates the
 * document and rebuilds every node with cwi_node_build, which re-checks
 * the parameters and recomputes fingerprints: nothing in the input is
 * trusted. A node whose function a plugin registered names that plugin's
 * build (`plugin`); a reader runs it only with the very same build.
 */
#include "pipeline.h"

#include "../core/value_msgpack.h"

#include <stdio.h>
#include <stdlib.h>

#define GRAPH_FORMAT "cachew-graph"
#define GRAPH_VERSION 1
#define GRAPH_MAX_NODES 65536
/* Longest input chain. Releasing a graph recurses along its chains, so
 * this bounds the stack; it matches the parser's stage limit. */
#define GRAPH_MAX_PATH 4096
/* The document nests four levels (graph, nodes, node, params) above the
 * parameter values, which may nest CWI_VALUE_MAX_DEPTH levels. */
#define GRAPH_MAX_DEPTH (4 + CWI_VALUE_MAX_DEPTH)

/* ---- encoder -------------------------------------------------------------- */

typedef struct enc_slot {
	const cwi_node *node; /* NULL: empty */
	size_t index;
} enc_slot;

typedef struct enc_frame {
	const cwi_node *node;
	size_t next; /* next input to visit */
} enc_frame;

typedef struct enc_graph {
	/* Canonical nodes by index, with their inputs as indices. */
	const cwi_node **nodes;
	size_t **inputs;
	size_t *path; /* longest input chain ending at the node */
	size_t n;
	/* Visited node pointers -> index (open addressing, power of 2). */
	enc_slot *seen;
	size_t seen_n, seen_cap;
	/* Index + 1 of canonical nodes by structure hash (0: empty). */
	size_t *shape;
	size_t shape_cap;
} enc_graph;

static uint64_t
ptr_hash(const void *p)
{
	return cwi_mix64((uint64_t)(uintptr_t)p);
}

static size_t
seen_get(const enc_graph *g, const cwi_node *n, bool *found)
{
	size_t mask = g->seen_cap - 1, i = ptr_hash(n) & mask;

	while (g->seen[i].node != NULL && g->seen[i].node != n)
		i = (i + 1) & mask;
	*found = g->seen[i].node != NULL;
	return i;
}

static uint64_t
shape_hash(const cwi_node *n, const size_t *in)
{
	/* The seed fingerprint: equal nodes have equal ones, and it is
	 * there without I/O (the fingerprint may need a bucket listing). */
	uint64_t h = n->seed_fp.hi ^ cwi_mix64(n->seed_fp.lo ^ ptr_hash(n->op));

	for (size_t i = 0; i < n->ninputs; i++)
		h = cwi_mix64(h ^ (in[i] + 1));
	return h;
}

static bool
shape_equal(const enc_graph *g, size_t k, const cwi_node *n, const size_t *in)
{
	const cwi_node *m = g->nodes[k];

	if (m->op != n->op || m->ninputs != n->ninputs)
		return false;
	for (size_t i = 0; i < n->ninputs; i++)
		if (g->inputs[k][i] != in[i])
			return false;
	return cwi_value_equal(&m->params.map, &n->params.map);
}

/* Doubles the tables; the node arrays keep room for one node per visited
 * pointer, which is at least as many as there are canonical nodes. */
static cachew_err
enc_grow(enc_graph *g)
{
	size_t cap = g->seen_cap != 0 ? g->seen_cap * 2 : 64;
	enc_slot *old = g->seen, *seen;
	size_t old_cap = g->seen_cap;
	size_t *shape, *path;
	const cwi_node **nodes;
	size_t **inputs;

	nodes = realloc(g->nodes, cap * sizeof(*nodes));
	if (nodes != NULL)
		g->nodes = nodes;
	inputs = realloc(g->inputs, cap * sizeof(*inputs));
	if (inputs != NULL)
		g->inputs = inputs;
	path = realloc(g->path, cap * sizeof(*path));
	if (path != NULL)
		g->path = path;
	seen = calloc(cap, sizeof(*seen));
	shape = calloc(cap, sizeof(*shape));
	if (nodes == NULL || inputs == NULL || path == NULL || seen == NULL ||
	    shape == NULL) {
		free(seen);
		free(shape);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	g->seen = seen;
	g->seen_cap = cap;
	for (size_t i = 0; i < old_cap; i++) {
		bool found;
		if (old[i].node != NULL)
			g->seen[seen_get(g, old[i].node, &found)] = old[i];
	}
	free(old);
	free(g->shape);
	g->shape = shape;
	g->shape_cap = cap;
	for (size_t k = 0; k < g->n; k++) {
		size_t j = shape_hash(g->nodes[k], g->inputs[k]) & (cap - 1);
		while (g->shape[j] != 0)
			j = (j + 1) & (cap - 1);
		g->shape[j] = k + 1;
	}
	return CACHEW_OK;
}

/* Gives node n (whose inputs all have indices) its index: that of an
 * equal node already numbered, or the next one. */
static cachew_err
enc_number(enc_graph *g, const cwi_node *n)
{
	size_t *in = NULL, j, index, path = 1;
	bool found;
	cachew_err rv;

	/* Tables stay at most half full. */
	if ((g->seen_n + 1) * 2 > g->seen_cap) {
		rv = enc_grow(g);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (n->ninputs > 0) {
		in = malloc(n->ninputs * sizeof(*in));
		if (in == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n->ninputs; i++) {
		in[i] = g->seen[seen_get(g, n->inputs[i], &found)].index;
		if (g->path[in[i]] + 1 > path)
			path = g->path[in[i]] + 1;
	}
	j = shape_hash(n, in) & (g->shape_cap - 1);
	while (g->shape[j] != 0 && !shape_equal(g, g->shape[j] - 1, n, in))
		j = (j + 1) & (g->shape_cap - 1);
	if (g->shape[j] != 0) {
		index = g->shape[j] - 1;
		free(in);
	} else {
		if (g->n >= GRAPH_MAX_NODES) {
			free(in);
			return cwi_fail(CACHEW_ERANGE,
			    "to_msgpack: the graph has more than %d nodes",
			    GRAPH_MAX_NODES);
		}
		if (path > GRAPH_MAX_PATH) {
			free(in);
			return cwi_fail(CACHEW_ERANGE,
			    "to_msgpack: the graph has a chain of more than %d "
			    "nodes",
			    GRAPH_MAX_PATH);
		}
		index = g->n++;
		g->nodes[index] = n;
		g->inputs[index] = in;
		g->path[index] = path;
		g->shape[j] = index + 1;
	}
	g->seen[seen_get(g, n, &found)] =
	    (enc_slot){.node = n, .index = index};
	g->seen_n++;
	return CACHEW_OK;
}

static void
enc_graph_free(enc_graph *g)
{
	for (size_t i = 0; i < g->n; i++)
		free(g->inputs[i]);
	free(g->nodes);
	free(g->inputs);
	free(g->path);
	free(g->seen);
	free(g->shape);
}

/* Depth-first post-order without recursion: chains may be long. */
static cachew_err
enc_walk(enc_graph *g, const cwi_node *root)
{
	enc_frame *stack = NULL;
	size_t depth = 0, cap = 0;
	cachew_err rv = CACHEW_OK;
	bool found;

	rv = enc_grow(g);
	if (rv != CACHEW_OK)
		return rv;
	for (const cwi_node *n = root; n != NULL && rv == CACHEW_OK;) {
		if (depth == cap) {
			size_t ncap = cap != 0 ? cap * 2 : 64;
			enc_frame *s = realloc(stack, ncap * sizeof(*s));
			if (s == NULL) {
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				break;
			}
			stack = s;
			cap = ncap;
		}
		stack[depth++] = (enc_frame){.node = n, .next = 0};
		n = NULL;
		while (depth > 0 && n == NULL && rv == CACHEW_OK) {
			enc_frame *f = &stack[depth - 1];
			if (f->next < f->node->ninputs) {
				const cwi_node *in = f->node->inputs[f->next++];
				(void)seen_get(g, in, &found);
				if (!found)
					n = in;
			} else {
				rv = enc_number(g, f->node);
				depth--;
			}
		}
	}
	free(stack);
	return rv;
}

static void
put_key(cwi_strbuf *sb, const char *key)
{
	cwi_msgpack_put_str(sb, key, strlen(key));
}

static cachew_err
enc_document(const enc_graph *g, cwi_strbuf *sb)
{
	cachew_err rv;

	/* Keys in sorted order, like every map of the format. */
	cwi_msgpack_put_map(sb, 4);
	put_key(sb, "format");
	put_key(sb, GRAPH_FORMAT);
	put_key(sb, "nodes");
	cwi_msgpack_put_array(sb, g->n);
	for (size_t k = 0; k < g->n; k++) {
		const cwi_node *n = g->nodes[k];
		const cwi_plugin *p = n->fn != NULL ? n->fn->plugin : NULL;
		cwi_msgpack_put_map(sb, p != NULL ? 4 : 3);
		put_key(sb, "inputs");
		cwi_msgpack_put_array(sb, n->ninputs);
		for (size_t i = 0; i < n->ninputs; i++)
			cwi_msgpack_put_int(sb, (int64_t)g->inputs[k][i]);
		put_key(sb, "op");
		put_key(sb, n->op->name);
		put_key(sb, "params");
		rv = cwi_value_to_msgpack(&n->params.map, sb);
		if (rv != CACHEW_OK)
			return rv;
		if (p != NULL) {
			/* The build of the plugin the function came from. */
			put_key(sb, "plugin");
			cwi_msgpack_put_map(sb, 3);
			put_key(sb, "hash");
			put_key(sb, p->hash_hex);
			put_key(sb, "name");
			put_key(sb, p->name);
			put_key(sb, "version");
			put_key(sb, p->version);
		}
	}
	put_key(sb, "root");
	cwi_msgpack_put_int(sb, (int64_t)g->n - 1);
	put_key(sb, "version");
	cwi_msgpack_put_int(sb, GRAPH_VERSION);
	return sb->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}

cachew_err
cachew_dataset_to_msgpack(const cachew_dataset *ds, void **buf, size_t *len)
{
	enc_graph g;
	cwi_strbuf sb;
	char *data;
	cachew_err rv;

	cwi_clear_errmsg();
	if (ds == NULL || buf == NULL || len == NULL)
		return cwi_fail(CACHEW_EINVAL, "to_msgpack: NULL argument");
	memset(&g, 0, sizeof(g));
	cwi_strbuf_init(&sb);
	rv = enc_walk(&g, ds);
	if (rv == CACHEW_OK)
		rv = enc_document(&g, &sb);
	enc_graph_free(&g);
	if (rv == CACHEW_OK)
		rv = cwi_strbuf_finish(&sb, &data, len);
	if (rv != CACHEW_OK) {
		cwi_strbuf_free(&sb);
		return rv;
	}
	*buf = data;
	return CACHEW_OK;
}

/* ---- decoder -------------------------------------------------------------- */

static cachew_err
gfail(const char *fmt, ...) CACHEW_PRINTF(1, 2);

static cachew_err
gfail(const char *fmt, ...)
{
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return cwi_fail(CACHEW_EPARSE, "graph: %s", msg);
}

/* Checks that m is a map with the keys in `keys` and no others but
 * `optional` (both NULL-terminated). */
static cachew_err
check_keys(const cwi_value *m, const char *const *keys,
    const char *const *optional, const char *where)
{
	static const char *const none[] = {NULL};
	size_t nkeys = 0;

	if (m->type != CWI_V_MAP)
		return gfail("%s is not a map", where);
	optional = optional != NULL ? optional : none;
	for (; keys[nkeys] != NULL; nkeys++)
		if (cwi_map_get(m, keys[nkeys]) == NULL)
			return gfail("%s lacks the key '%s'", where, keys[nkeys]);
	for (size_t i = 0; i < m->u.map.n; i++) {
		const char *key = m->u.map.items[i].key;
		bool known = false;
		for (size_t k = 0; k < nkeys; k++)
			known = known || strcmp(key, keys[k]) == 0;
		for (size_t k = 0; optional[k] != NULL; k++)
			known = known || strcmp(key, optional[k]) == 0;
		if (!known)
			return gfail("%s has an unknown key '%.64s'", where, key);
	}
	return CACHEW_OK;
}

/* Parameter maps must have name keys at every level, so that every
 * decoded graph can also be written as a pipeline string. */
static bool
keys_are_names(const cwi_value *v, const char **bad)
{
	if (v->type == CWI_V_LIST) {
		for (size_t i = 0; i < v->u.list.n; i++)
			if (!keys_are_names(&v->u.list.items[i], bad))
				return false;
	} else if (v->type == CWI_V_MAP) {
		for (size_t i = 0; i < v->u.map.n; i++) {
			const cwi_kv *kv = &v->u.map.items[i];
			if (!cwi_is_ident(kv->key, strlen(kv->key))) {
				*bad = kv->key;
				return false;
			}
			if (!keys_are_names(&kv->val, bad))
				return false;
		}
	}
	return true;
}

static cachew_err
check_header(const cwi_value *doc, size_t *nnodes)
{
	static const char *const keys[] = {
	    "format", "nodes", "root", "version", NULL};
	const cwi_value *format, *version, *nodes;
	cachew_err rv;

	if (doc->type != CWI_V_MAP)
		return gfail("the document is not a map");
	rv = check_keys(doc, keys, NULL, "the graph map");
	if (rv != CACHEW_OK)
		return rv;
	format = cwi_map_get(doc, "format");
	version = cwi_map_get(doc, "version");
	nodes = cwi_map_get(doc, "nodes");
	if (format->type != CWI_V_STR ||
	    format->u.s.len != strlen(GRAPH_FORMAT) ||
	    memcmp(format->u.s.ptr, GRAPH_FORMAT, format->u.s.len) != 0)
		return gfail("'format' is not \"%s\"", GRAPH_FORMAT);
	if (version->type != CWI_V_INT)
		return gfail("'version' is not an integer");
	if (version->u.i != GRAPH_VERSION)
		return gfail("version %lld is not supported (this library reads "
			     "version %d)",
		    (long long)version->u.i, GRAPH_VERSION);
	if (nodes->type != CWI_V_LIST || nodes->tuple)
		return gfail("'nodes' is not an array");
	if (nodes->u.list.n == 0)
		return gfail("'nodes' is empty");
	if (nodes->u.list.n > GRAPH_MAX_NODES)
		return gfail("%zu nodes exceed the limit of %d", nodes->u.list.n,
		    GRAPH_MAX_NODES);
	*nnodes = nodes->u.list.n;
	return CACHEW_OK;
}

static const char *const node_keys[] = {"inputs", "op", "params", NULL};
static const char *const node_optional[] = {"plugin", NULL};

/* Node i's parts, its keys and types checked, its inputs (earlier nodes)
 * and the longest chain ending at it (path[i]) too; *plugin is NULL when
 * the node has no `plugin` entry. */
static cachew_err
dec_node_shape(const cwi_value *v, size_t i, size_t *path,
    const cwi_value **op, const cwi_value **params, const cwi_value **inputs,
    const cwi_value **plugin)
{
	const char *bad = NULL;
	char where[48];
	cachew_err rv;

	snprintf(where, sizeof(where), "node %zu", i);
	rv = check_keys(v, node_keys, node_optional, where);
	if (rv != CACHEW_OK)
		return rv;
	*op = cwi_map_get(v, "op");
	*params = cwi_map_get(v, "params");
	*inputs = cwi_map_get(v, "inputs");
	*plugin = cwi_map_get(v, "plugin");
	if ((*op)->type != CWI_V_STR ||
	    memchr((*op)->u.s.ptr, 0, (*op)->u.s.len) != NULL)
		return gfail("node %zu: 'op' is not an operator name", i);
	if ((*params)->type != CWI_V_MAP)
		return gfail("node %zu: 'params' is not a map", i);
	if (!keys_are_names(*params, &bad))
		return gfail("node %zu: parameter key '%.64s' is not a name", i,
		    bad);
	if ((*inputs)->type != CWI_V_LIST || (*inputs)->tuple)
		return gfail("node %zu: 'inputs' is not an array", i);
	if ((*inputs)->u.list.n > CWI_MAX_INPUTS)
		return gfail("node %zu: %zu inputs exceed the limit of %d", i,
		    (*inputs)->u.list.n, CWI_MAX_INPUTS);
	path[i] = 1;
	for (size_t k = 0; k < (*inputs)->u.list.n; k++) {
		const cwi_value *x = &(*inputs)->u.list.items[k];
		if (x->type != CWI_V_INT)
			return gfail("node %zu: input %zu is not a node index", i,
			    k);
		if (x->u.i < 0 || (uint64_t)x->u.i >= i)
			return gfail("node %zu: input %zu refers to node %lld, "
				     "which does not come before it",
			    i, k, (long long)x->u.i);
		if (path[x->u.i] + 1 > path[i])
			path[i] = path[x->u.i] + 1;
	}
	if (path[i] > GRAPH_MAX_PATH)
		return gfail("node %zu ends a chain of more than %d nodes", i,
		    GRAPH_MAX_PATH);
	return CACHEW_OK;
}

/* A string value that is a C string (no NUL inside). */
static const char *
cstr(const cwi_value *v)
{
	return v != NULL && v->type == CWI_V_STR &&
		       strlen(v->u.s.ptr) == v->u.s.len
		   ? v->u.s.ptr
		   : NULL;
}

/* Node i's `plugin` entry into f's plugin fields: a map of the plugin's
 * name, version and file hash (32 lowercase hex digits). */
static cachew_err
dec_plugin(const cwi_value *entry, size_t i, cwi_fn_ident *f)
{
	static const char *const keys[] = {"hash", "name", "version", NULL};
	const char *hash, *name, *version;
	char where[48];
	cachew_err rv;

	snprintf(where, sizeof(where), "node %zu: 'plugin'", i);
	rv = check_keys(entry, keys, NULL, where);
	if (rv != CACHEW_OK)
		return rv;
	hash = cstr(cwi_map_get(entry, "hash"));
	name = cstr(cwi_map_get(entry, "name"));
	version = cstr(cwi_map_get(entry, "version"));
	if (!cwi_plugin_text_ok(name, false))
		return gfail("%s: 'name' is not 1 to 63 characters of "
			     "[A-Za-z0-9_.+-]", where);
	if (!cwi_plugin_text_ok(version, true))
		return gfail("%s: 'version' is not at most 63 characters of "
			     "[A-Za-z0-9_.+-]", where);
	if (hash == NULL || strlen(hash) != 32 ||
	    strspn(hash, "0123456789abcdef") != 32)
		return gfail("%s: 'hash' is not 32 lowercase hex digits", where);
	snprintf(f->plugin, sizeof(f->plugin), "%s", name);
	snprintf(f->version, sizeof(f->version), "%s", version);
	snprintf(f->hash, sizeof(f->hash), "%s", hash);
	return CACHEW_OK;
}

/* The function node i names (its `fn` parameter), when its operator
 * takes one and the name can be one; NULL otherwise. */
static const char *
node_fn_name(const cwi_value *op, const cwi_value *params)
{
	const cwi_dataset_op *o = cwi_dataset_op_lookup(op->u.s.ptr);
	const char *fn = cstr(cwi_map_get(params, "fn"));

	if (o == NULL || !(o->flags & CWI_OPF_FN_ANY) || fn == NULL ||
	    strlen(fn) > 63)
		return NULL;
	return fn;
}

/* Node i's function is the build the graph names (docs/graph-format.md,
 * section 2): else it is missing here, CACHEW_ENOENT naming it, the
 * plugin it needs and what this process has under that name. */
static cachew_err
check_fn_build(const cwi_value *plugin, const cwi_fn *fn, const char *name,
    size_t i)
{
	cwi_fn_ident want, have;
	char w[256], h[256];
	cachew_err rv;

	memset(&want, 0, sizeof(want));
	snprintf(want.name, sizeof(want.name), "%s", name);
	if (plugin != NULL) {
		rv = dec_plugin(plugin, i, &want);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (fn == NULL)
		return cwi_fail(CACHEW_ENOENT, "graph: node %zu: function %s is "
		    "not loaded here (no function of that name)", i,
		    cwi_fn_ident_describe(&want, w, sizeof(w)));
	cwi_fn_ident_of(fn, &have);
	if (fn->builtin && plugin == NULL)
		return CACHEW_OK;
	if (cwi_fn_ident_equal(&want, &have))
		return CACHEW_OK;
	return cwi_fail(CACHEW_ENOENT, "graph: node %zu: function %s is not "
	    "loaded here: this process has %s%s", i,
	    cwi_fn_ident_describe(&want, w, sizeof(w)),
	    fn->builtin ? "a built-in function of that name" : "",
	    fn->builtin ? "" : cwi_fn_ident_describe(&have, h, sizeof(h)));
}

/* Builds node i from its map, given the nodes before it. */
static cachew_err
dec_node(const cwi_value *v, size_t i, cwi_node **built, size_t *path)
{
	cwi_node *ins[CWI_MAX_INPUTS];
	const cwi_value *op, *params, *inputs, *plugin;
	const char *fn;
	cachew_err rv;

	rv = dec_node_shape(v, i, path, &op, &params, &inputs, &plugin);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t k = 0; k < inputs->u.list.n; k++)
		ins[k] = built[inputs->u.list.items[k].u.i];
	/* A plugin's function is checked before it is built (its init
	 * runs then): a missing one is named with its plugin. */
	fn = node_fn_name(op, params);
	if (plugin != NULL && fn == NULL)
		return gfail("node %zu: 'plugin' on a node without a function",
		    i);
	if (plugin != NULL) {
		rv = check_fn_build(plugin, cwi_fn_lookup(fn), fn, i);
		if (rv != CACHEW_OK)
			return rv;
	}
	rv = cwi_node_build(&built[i], op->u.s.ptr, ins, inputs->u.list.n, NULL,
	    params);
	if (rv != CACHEW_OK) {
		char msg[320];
		snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
		return cwi_fail(rv, "graph: node %zu: %s", i, msg);
	}
	/* A function of no plugin in the graph must be of none here. */
	if (plugin == NULL && built[i]->fn != NULL)
		return check_fn_build(NULL, built[i]->fn, built[i]->fn->name, i);
	return CACHEW_OK;
}

cachew_err
cachew_dataset_from_msgpack(cachew_dataset **out, const void *buf, size_t len)
{
	cwi_value doc = {0};
	cwi_node **built = NULL;
	size_t *path = NULL, used = 0, n = 0;
	const cwi_value *nodes, *root;
	cachew_err rv;

	cwi_builtins_ready();
	cwi_clear_errmsg();
	if (out == NULL || (buf == NULL && len > 0))
		return cwi_fail(CACHEW_EINVAL, "from_msgpack: NULL argument");
	rv = cwi_value_from_msgpack(buf, len, &used, &doc, GRAPH_MAX_DEPTH);
	if (rv != CACHEW_OK)
		return rv;
	if (used != len) {
		rv = gfail("%zu bytes follow the graph map at byte %zu",
		    len - used, used);
		goto done;
	}
	rv = check_header(&doc, &n);
	if (rv != CACHEW_OK)
		goto done;
	nodes = cwi_map_get(&doc, "nodes");
	root = cwi_map_get(&doc, "root");
	built = calloc(n, sizeof(*built));
	path = calloc(n, sizeof(*path));
	if (built == NULL || path == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++)
		rv = dec_node(&nodes->u.list.items[i], i, built, path);
	if (rv != CACHEW_OK)
		goto done;
	if (root->type != CWI_V_INT || root->u.i < 0 ||
	    (uint64_t)root->u.i >= n) {
		rv = gfail("'root' is not the index of a node (there are %zu)",
		    n);
		goto done;
	}
	*out = cachew_dataset_retain(built[root->u.i]);
done:
	/* Release from the last node back: each node's inputs are still
	 * held by `built`, so no release here recurses. */
	for (size_t i = n; built != NULL && i-- > 0;)
		cachew_dataset_release(built[i]);
	free(built);
	free(path);
	cwi_value_free(&doc);
	return rv;
}

/* ---- the user functions of a graph ------------------------------------------- */

/* Adds f to the set v[*n] unless it is there; false on ENOMEM. */
static bool
fn_set_add(cwi_fn_ident **v, size_t *n, const cwi_fn_ident *f)
{
	cwi_fn_ident *p;

	for (size_t k = 0; k < *n; k++)
		if (cwi_fn_ident_equal(&(*v)[k], f))
			return true;
	p = realloc(*v, (*n + 1) * sizeof(*p));
	if (p == NULL)
		return false;
	p[(*n)++] = *f;
	*v = p;
	return true;
}

/* Node i's user function, if it names one, into the set. */
static cachew_err
node_user_fn(const cwi_value *v, size_t i, size_t *path, cwi_fn_ident **set,
    size_t *n)
{
	const cwi_value *op, *params, *inputs, *plugin;
	const cwi_fn *here;
	const char *fn;
	cwi_fn_ident f;
	cachew_err rv;

	rv = dec_node_shape(v, i, path, &op, &params, &inputs, &plugin);
	if (rv != CACHEW_OK)
		return rv;
	fn = node_fn_name(op, params);
	if (fn == NULL) {
		if (plugin != NULL)
			return gfail("node %zu: 'plugin' on a node without a "
				     "function", i);
		return CACHEW_OK;
	}
	here = cwi_fn_lookup(fn);
	if (plugin == NULL && here != NULL && here->builtin)
		return CACHEW_OK; /* every process has it */
	memset(&f, 0, sizeof(f));
	snprintf(f.name, sizeof(f.name), "%s", fn);
	if (plugin != NULL && (rv = dec_plugin(plugin, i, &f)) != CACHEW_OK)
		return rv;
	if (!fn_set_add(set, n, &f))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

/* Decodes a serialized graph's document for a walk over its nodes without
 * building them: *doc (free with cwi_value_free, also on failure), its
 * node count, and room for dec_node_shape's chain lengths (*path, free()). */
static cachew_err
graph_doc_open(const void *buf, size_t len, cwi_value *doc, size_t *n,
    size_t **path)
{
	size_t used = 0;
	cachew_err rv;

	*path = NULL;
	*n = 0;
	rv = cwi_value_from_msgpack(buf, len, &used, doc, GRAPH_MAX_DEPTH);
	if (rv != CACHEW_OK)
		return rv;
	if (used != len)
		rv = gfail("%zu bytes follow the graph map at byte %zu",
		    len - used, used);
	if (rv == CACHEW_OK)
		rv = check_header(doc, n);
	if (rv == CACHEW_OK && (*path = calloc(*n, sizeof(**path))) == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv != CACHEW_OK) {
		cwi_value_free(doc);
		*n = 0;
	}
	return rv;
}

cachew_err
cwi_graph_user_fns(const void *buf, size_t len, cwi_fn_ident **out,
    size_t *nout)
{
	cwi_value doc = {0};
	cwi_fn_ident *set = NULL;
	size_t *path = NULL, n = 0, nset = 0;
	const cwi_value *nodes;
	cachew_err rv;

	cwi_builtins_ready();
	rv = graph_doc_open(buf, len, &doc, &n, &path);
	if (rv != CACHEW_OK)
		return rv;
	nodes = cwi_map_get(&doc, "nodes");
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++)
		rv = node_user_fn(&nodes->u.list.items[i], i, path, &set, &nset);
	free(path);
	cwi_value_free(&doc);
	if (rv != CACHEW_OK) {
		free(set);
		return rv;
	}
	*out = set;
	*nout = nset;
	return CACHEW_OK;
}

/* A shuffle node's parameters into *s; absent ones have shuffle's
 * defaults (seed -1, reshuffle_each_iteration true). */
static void
node_shuffle(const cwi_value *params, cwi_graph_shuffles *s)
{
	const cwi_value *buffer = cwi_map_get(params, "buffer");
	const cwi_value *seed = cwi_map_get(params, "seed");
	const cwi_value *again = cwi_map_get(params, "reshuffle_each_iteration");
	uint64_t b = buffer != NULL && buffer->type == CWI_V_INT &&
		buffer->u.i > 0 ? (uint64_t)buffer->u.i : 1;

	s->n++;
	if (b > s->buffer)
		s->buffer = b;
	/* Each shuffle's seed (its position too, so that two shuffles of one
	 * seed do not cancel out) mixes into one. */
	s->seed = cwi_seed_derive(s->seed ^ s->n,
	    seed != NULL && seed->type == CWI_V_INT ? (uint64_t)seed->u.i
						    : UINT64_MAX);
	if (again == NULL || again->type != CWI_V_BOOL || again->u.b)
		s->reshuffle = true;
}

cachew_err
cwi_graph_shuffles_of(const void *buf, size_t len, cwi_graph_shuffles *out)
{
	cwi_value doc = {0};
	size_t *path = NULL, n = 0;
	const cwi_value *nodes;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	rv = graph_doc_open(buf, len, &doc, &n, &path);
	if (rv != CACHEW_OK)
		return rv;
	nodes = cwi_map_get(&doc, "nodes");
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++) {
		const cwi_value *op, *params, *inputs, *plugin;
		rv = dec_node_shape(&nodes->u.list.items[i], i, path, &op,
		    &params, &inputs, &plugin);
		if (rv == CACHEW_OK && op->u.s.len == 7 &&
		    memcmp(op->u.s.ptr, "shuffle", 7) == 0)
			node_shuffle(params, out);
	}
	free(path);
	cwi_value_free(&doc);
	if (rv != CACHEW_OK)
		memset(out, 0, sizeof(*out));
	return rv;
}
