/*
 * graph_node.c - building nodes: parameter binding and canonicalisation,
 * function resolution, validation and the structural fingerprint.
 */
#include "graph.h"

#include "../io/io.h"
#include "../io/io_policy.h"

#include <assert.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* ---- parameter binding ---------------------------------------------------- */

static const cwi_param_spec *
spec_find(const cwi_dataset_op *op, const char *name)
{
	for (size_t i = 0; i < op->nparams; i++)
		if (strcmp(op->params[i].name, name) == 0)
			return &op->params[i];
	return NULL;
}

static void
spec_names(const cwi_dataset_op *op, char *buf, size_t len)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < op->nparams && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
		    op->params[i].name);
	if (op->nparams == 0)
		snprintf(buf, len, "none");
}

/* String parameters are paths, URLs, names and choices, which C reads up
 * to the first NUL: "/etc/hostname\0.txt" would silently open
 * /etc/hostname. Refused, naming the parameter (and the list item). */
static cachew_err
refuse_nul(const cwi_dataset_op *op, const cwi_param_spec *s,
    const cwi_value *v, size_t item, bool in_list)
{
	const char *nul = memchr(v->u.s.ptr, '\0', v->u.s.len);
	char where[48] = "";

	if (nul == NULL)
		return CACHEW_OK;
	if (in_list)
		snprintf(where, sizeof(where), " (item %zu)", item);
	return cwi_fail(CACHEW_EINVAL, "%s: parameter '%s'%s holds a NUL byte "
	    "at offset %zu: a path, URL or name cannot", op->name, s->name,
	    where, (size_t)(nul - v->u.s.ptr));
}

/* Converts *v in place to the spec's type, or fails naming the param. */

/* A number becomes a float; true for a number, or a list or map of them
 * (CWI_P_FLOATS), whose numbers become floats too. */
static bool
float_item(cwi_value *v)
{
	if (v->type == CWI_V_INT) {
		double f = (double)v->u.i;
		v->type = CWI_V_FLOAT;
		v->u.f = f;
	}
	return v->type == CWI_V_FLOAT;
}

static bool
floats_value(cwi_value *v)
{
	if (v->type == CWI_V_LIST) {
		for (size_t i = 0; i < v->u.list.n; i++)
			if (!float_item(&v->u.list.items[i]))
				return false;
		v->tuple = false;
		return true;
	}
	if (v->type == CWI_V_MAP) {
		for (size_t i = 0; i < v->u.map.n; i++)
			if (!float_item(&v->u.map.items[i].val))
				return false;
		return true;
	}
	return float_item(v);
}

static cachew_err
coerce(const cwi_dataset_op *op, const cwi_param_spec *s, cwi_value *v)
{
	const char *want = NULL;

	switch (s->type) {
	case CWI_P_INT:
		if ((s->flags & CWI_PF_AUTO) && v->type == CWI_V_STR &&
		    strcmp(v->u.s.ptr, "auto") == 0) {
			cwi_value_free(v);
			v->type = CWI_V_INT;
			v->u.i = CACHEW_AUTO;
			return CACHEW_OK;
		}
		/* Only floats within int64 may be cast (NaN fails both). */
		if (v->type == CWI_V_FLOAT && v->u.f >= -0x1p63 &&
		    v->u.f < 0x1p63 && v->u.f == (double)(int64_t)v->u.f) {
			int64_t i = (int64_t)v->u.f;
			v->type = CWI_V_INT;
			v->u.i = i;
		}
		if (v->type != CWI_V_INT) {
			want = (s->flags & CWI_PF_AUTO) ? "an integer or auto"
							: "an integer";
			break;
		}
		if (s->min < s->max && !((s->flags & CWI_PF_AUTO) &&
					   v->u.i == CACHEW_AUTO) &&
		    (v->u.i < s->min || v->u.i > s->max))
			return cwi_fail(CACHEW_ERANGE,
			    "%s: parameter '%s' must be in [%lld, %lld], not "
			    "%lld",
			    op->name, s->name, (long long)s->min,
			    (long long)s->max, (long long)v->u.i);
		return CACHEW_OK;
	case CWI_P_FLOAT:
		if (v->type == CWI_V_INT) {
			double f = (double)v->u.i;
			v->type = CWI_V_FLOAT;
			v->u.f = f;
		}
		if (v->type != CWI_V_FLOAT)
			want = "a number";
		break;
	case CWI_P_BOOL:
		if (v->type != CWI_V_BOOL)
			want = "true or false";
		break;
	case CWI_P_STR:
		if (v->type != CWI_V_STR)
			want = "a string";
		else
			return refuse_nul(op, s, v, 0, false);
		break;
	case CWI_P_STRS:
		if (v->type == CWI_V_STR)
			return refuse_nul(op, s, v, 0, false);
		if (v->type == CWI_V_LIST) {
			for (size_t i = 0; i < v->u.list.n; i++)
				if (v->u.list.items[i].type != CWI_V_STR)
					want = "a string or a list of strings";
				else if (refuse_nul(op, s, &v->u.list.items[i],
					     i, true) != CACHEW_OK)
					return CACHEW_EINVAL;
			v->tuple = false;
			break;
		}
		want = "a string or a list of strings";
		break;
	case CWI_P_LIST:
		if (v->type != CWI_V_LIST)
			want = "a list";
		break;
	case CWI_P_ANY:
		break;
	case CWI_P_FLOATS:
		want = floats_value(v) ? NULL
				       : "a number, a list of numbers or a map "
					 "of numbers by component name";
		break;
	}
	if (want != NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: parameter '%s' must be %s",
		    op->name, s->name, want);
	return CACHEW_OK;
}

static cachew_err
set_default(cwi_value *params, const cwi_param_spec *s)
{
	cwi_value v = {0};
	cachew_err rv;

	switch (s->type) {
	case CWI_P_INT:
		v.type = CWI_V_INT;
		v.u.i = s->def_int;
		break;
	case CWI_P_FLOAT:
	case CWI_P_FLOATS:
		v.type = CWI_V_FLOAT;
		v.u.f = s->def_float;
		break;
	case CWI_P_BOOL:
		v.type = CWI_V_BOOL;
		v.u.b = s->def_int != 0;
		break;
	case CWI_P_STR:
	case CWI_P_STRS:
		rv = cwi_value_set_str(&v, s->def_str != NULL ? s->def_str : "",
		    strlen(s->def_str != NULL ? s->def_str : ""));
		if (rv != CACHEW_OK)
			return rv;
		break;
	case CWI_P_LIST:
		v.type = CWI_V_LIST;
		break;
	case CWI_P_ANY:
		break;
	}
	return cwi_map_set(params, s->name, &v);
}

/* Binds positional and named values into node->params and fn_params. */
static cachew_err
bind_params(cwi_node *node, const cwi_value *pos, const cwi_value *named,
    cwi_value *fn_params)
{
	const cwi_dataset_op *op = node->op;
	cwi_value *params = &node->params.map;
	char names[512];
	cachew_err rv;
	size_t npos = pos != NULL ? pos->u.list.n : 0;

	if (npos > 0) {
		const char *const *form = npos <= CWI_MAX_POSITIONAL
		    ? op->positional[npos]
		    : NULL;
		if (npos > CWI_MAX_POSITIONAL ||
		    (form == NULL && npos > op->nparams))
			return cwi_fail(CACHEW_EINVAL,
			    "%s: too many positional arguments (%zu)", op->name,
			    npos);
		for (size_t i = 0; i < npos; i++) {
			const char *name = form != NULL ? form[i]
							: op->params[i].name;
			cwi_value v;
			rv = cwi_value_copy(&v, &pos->u.list.items[i]);
			if (rv == CACHEW_OK)
				rv = cwi_map_set(params, name, &v);
			if (rv != CACHEW_OK)
				return rv;
		}
	}
	for (size_t i = 0; named != NULL && i < named->u.map.n; i++) {
		const cwi_kv *kv = &named->u.map.items[i];
		cwi_value v;
		if (spec_find(op, kv->key) != NULL) {
			if (cwi_map_get(params, kv->key) != NULL)
				return cwi_fail(CACHEW_EINVAL,
				    "%s: parameter '%s' is given twice",
				    op->name, kv->key);
			rv = cwi_value_copy(&v, &kv->val);
			if (rv == CACHEW_OK)
				rv = cwi_map_set(params, kv->key, &v);
			if (rv != CACHEW_OK)
				return rv;
			continue;
		}
		if (!(op->flags & CWI_OPF_FN_ANY)) {
			spec_names(op, names, sizeof(names));
			return cwi_fail(CACHEW_EINVAL,
			    "%s: unknown parameter '%s' (parameters: %s)",
			    op->name, kv->key, names);
		}
		if (strcmp(kv->key, "fn_params") == 0 &&
		    kv->val.type == CWI_V_MAP) {
			for (size_t j = 0; j < kv->val.u.map.n; j++) {
				rv = cwi_value_copy(&v, &kv->val.u.map.items[j].val);
				if (rv == CACHEW_OK)
					rv = cwi_map_set(fn_params,
					    kv->val.u.map.items[j].key, &v);
				if (rv != CACHEW_OK)
					return rv;
			}
			continue;
		}
		rv = cwi_value_copy(&v, &kv->val);
		if (rv == CACHEW_OK)
			rv = cwi_map_set(fn_params, kv->key, &v);
		if (rv != CACHEW_OK)
			return rv;
	}
	for (size_t i = 0; i < op->nparams; i++) {
		const cwi_param_spec *s = &op->params[i];
		cwi_value *v = (cwi_value *)cwi_map_get(params, s->name);
		if (v == NULL) {
			if (s->flags & CWI_PF_REQUIRED)
				return cwi_fail(CACHEW_EINVAL,
				    "%s: missing required parameter '%s'",
				    op->name, s->name);
			if (s->flags & CWI_PF_OPTIONAL)
				continue;
			rv = set_default(params, s);
		} else {
			rv = coerce(op, s, v);
		}
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* component="image" names the component a built-in function works on:
 * it becomes the index of the input's component of that name (what the
 * functions take), so the canonical form and the fingerprint are those of
 * the index. Only the functions with a typing rule take a component. */
static cachew_err
resolve_component(cwi_node *node, cwi_value *fn_params)
{
	cwi_value *v = (cwi_value *)cwi_map_get(fn_params, "component");
	const cwi_spec *in;
	cwi_strbuf names;
	cachew_err rv;
	int i;

	if (v == NULL || v->type != CWI_V_STR || node->fn->spec == NULL ||
	    node->ninputs == 0)
		return CACHEW_OK;
	in = &node->inputs[0]->spec;
	i = cwi_spec_find(in, v->u.s.ptr);
	if (i >= 0) {
		cwi_value_free(v);
		v->type = CWI_V_INT;
		v->u.i = i;
		return CACHEW_OK;
	}
	if (!in->known)
		return cwi_fail(CACHEW_EINVAL, "%s(%s): component '%s': the "
		    "input's components are not known when building (a "
		    "function registered from C or a plugin does not say what "
		    "it yields): give the component's index", node->op->name,
		    node->fn->name, v->u.s.ptr);
	cwi_strbuf_init(&names);
	cwi_spec_print(&names, in);
	rv = cwi_fail(CACHEW_ENOENT, "%s(%s): no component is named '%s' "
	    "(the input's elements are %s)", node->op->name, node->fn->name,
	    v->u.s.ptr, names.data != NULL && !names.oom ? names.data : "?");
	cwi_strbuf_free(&names);
	return rv;
}

static cachew_err
resolve_fn(cwi_node *node, cwi_value *fn_params)
{
	static const char *const kinds[] = {"?", "map", "filter", "flat_map",
	    "source"};
	const cwi_dataset_op *op = node->op;
	const char *name = cwi_node_str(node, "fn");
	cachew_op_kind want;
	char err[256] = "";
	cachew_err rv;

	node->fn = cwi_fn_lookup(name);
	if (node->fn == NULL)
		return cwi_fail(CACHEW_ENOENT, "%s: unknown function '%s'",
		    op->name, name);
	want = (op->flags & CWI_OPF_FN_MAP)	   ? CACHEW_OP_MAP
	    : (op->flags & CWI_OPF_FN_FILTER) ? CACHEW_OP_FILTER
	    : (op->flags & CWI_OPF_FN_SOURCE) ? (cachew_op_kind)CWI_FN_SOURCE
					      : CACHEW_OP_FLAT_MAP;
	if (node->fn->def.kind != want)
		return cwi_fail(CACHEW_EINVAL,
		    "%s: function '%s' is a %s function, not a %s function",
		    op->name, name, kinds[node->fn->def.kind], kinds[want]);
	rv = resolve_component(node, fn_params);
	if (rv == CACHEW_OK)
		rv = cwi_map_set(&node->params.map, "fn_params", fn_params);
	if (rv != CACHEW_OK)
		return rv;
	node->fn_params = (cachew_params *)cwi_map_get(
	    &node->params.map, "fn_params");
	node->detail = cwi_strdup(name);
	if (node->detail == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (node->fn->def.init != NULL) {
		rv = node->fn->def.init(node->fn_params, &node->fn_state, err,
		    sizeof(err));
		if (rv != CACHEW_OK)
			return cwi_fail(rv, "%s(%s): %s", op->name, name,
			    err[0] != '\0' ? err : cachew_strerror(rv));
	}
	return CACHEW_OK;
}

/* ---- fingerprint ---------------------------------------------------------- */

/*
 * The recipe is docs/graph-format.md, section 5, precisely enough for a
 * second implementation (test/data/fingerprint_ref.py is one): XXH3-128,
 * seed 0, over a stream of items tag (1 byte), length (8 bytes), bytes.
 * Every integer in the stream is little-endian whatever the host, so a
 * fingerprint is the same on every machine. CWI_FP_VERSION is the first
 * item: change it whenever the stream changes for an unchanged graph.
 */
#define CWI_FP_VERSION "cachew-fp-2"

/* fp_state: fp_value is valid (0, so a node made by calloc with its fp set
 * is ready), still to be computed, or being stored by the thread that
 * computed it first. */
enum { FP_READY = 0, FP_PENDING, FP_STORING };

static void
le64(uint8_t out[8], uint64_t v)
{
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)(v >> (8 * i));
}

static void
hash_bytes(XXH3_state_t *st, char tag, const void *p, size_t len)
{
	uint8_t head[9];

	head[0] = (uint8_t)tag;
	le64(head + 1, len);
	XXH3_128bits_update(st, head, sizeof(head));
	XXH3_128bits_update(st, p, len);
}

/* An item whose bytes are n 64-bit words, each little-endian. */
static void
hash_words(XXH3_state_t *st, char tag, const uint64_t *w, size_t n)
{
	uint8_t buf[3 * 8];

	assert(n <= 3);
	for (size_t i = 0; i < n; i++)
		le64(buf + 8 * i, w[i]);
	hash_bytes(st, tag, buf, 8 * n);
}

static void
hash_value(XXH3_state_t *st, const cwi_value *v)
{
	uint64_t w;
	double f;
	uint8_t b;

	switch (v->type) {
	case CWI_V_NIL:
		hash_bytes(st, 'n', "", 0);
		break;
	case CWI_V_BOOL:
		b = v->u.b ? 1 : 0;
		hash_bytes(st, 'b', &b, 1);
		break;
	case CWI_V_INT:
		w = (uint64_t)v->u.i;
		hash_words(st, 'i', &w, 1);
		break;
	case CWI_V_FLOAT:
		/* Every NaN prints as `nan`: hash them all as one. */
		f = v->u.f;
		if (isnan(f))
			w = UINT64_C(0x7ff8000000000000);
		else
			memcpy(&w, &f, sizeof(w));
		hash_words(st, 'f', &w, 1);
		break;
	case CWI_V_STR:
		hash_bytes(st, 's', v->u.s.ptr, v->u.s.len);
		break;
	case CWI_V_LIST:
		w = v->u.list.n;
		hash_words(st, v->tuple ? 't' : 'l', &w, 1);
		for (size_t i = 0; i < v->u.list.n; i++)
			hash_value(st, &v->u.list.items[i]);
		break;
	case CWI_V_MAP:
		w = v->u.map.n;
		hash_words(st, 'm', &w, 1);
		for (size_t i = 0; i < v->u.map.n; i++) {
			const cwi_kv *kv = &v->u.map.items[i];
			hash_bytes(st, 'k', kv->key, strlen(kv->key));
			hash_value(st, &kv->val);
		}
		break;
	}
}

/* True for an s3:// or gs:// pattern with glob characters in its key. */
static bool
is_remote_glob(const char *pat)
{
	const char *key;

	if (!cwi_io_can_list(pat))
		return false;
	key = strchr(pat + 5, '/');
	return key != NULL && strpbrk(key, "*?[") != NULL;
}

/* Whether a file-reading node's patterns include a bucket listing: the
 * one kind of file identity that costs network I/O. */
static bool
lists_a_bucket(const cwi_node *node)
{
	const char **pats;
	size_t npat = 0;
	bool remote = false;

	if (!(node->op->flags & CWI_OPF_FILES))
		return false;
	pats = cwi_value_str_list(cwi_node_value(node, "files"), &npat);
	for (size_t k = 0; pats != NULL && k < npat && !remote; k++)
		remote = is_remote_glob(pats[k]);
	free(pats);
	return remote;
}

/* One s3:// or gs:// glob's objects: URL, ETag when the store gives one,
 * size. False if the listing fails. */
static bool
hash_listing(XXH3_state_t *st, const char *pat)
{
	cwi_io_entry *ents = NULL;
	size_t n = 0;

	if (cwi_io_list(pat, NULL, &ents, &n) != CACHEW_OK || n == 0) {
		cwi_io_entries_free(ents, n);
		cwi_clear_errmsg();
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t meta[3] = {(uint64_t)ents[i].size, 0, 0};
		hash_bytes(st, 'p', ents[i].url, strlen(ents[i].url));
		if (ents[i].etag != NULL)
			hash_bytes(st, 'E', ents[i].etag, strlen(ents[i].etag));
		hash_words(st, 'F', meta, 3);
	}
	cwi_io_entries_free(ents, n);
	return true;
}

/* One local pattern's files (real path, size, mtime) or a URL that is not
 * a listing (its text, no metadata). False if nothing matches. */
static bool
hash_paths(XXH3_state_t *st, const char *pat)
{
	char **paths = NULL;
	struct stat sb;
	size_t n = 0;

	if (cwi_paths_expand(&pat, 1, &paths, &n) != CACHEW_OK) {
		cwi_clear_errmsg();
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t meta[3] = {0, 0, 0};
		char real[PATH_MAX];
		const char *id = paths[i];
		bool local = strstr(paths[i], "://") == NULL;
		/* "f.txt" and "./f.txt" are the same data. */
		if (local && realpath(paths[i], real) != NULL)
			id = real;
		hash_bytes(st, 'p', id, strlen(id));
		if (local && stat(paths[i], &sb) == 0) {
			meta[0] = (uint64_t)sb.st_size;
			meta[1] = (uint64_t)sb.st_mtim.tv_sec;
			meta[2] = (uint64_t)sb.st_mtim.tv_nsec;
		}
		hash_words(st, 'F', meta, 3);
	}
	cwi_paths_free(paths);
	return true;
}

/* The identity of input files, pattern after pattern; false (and st is
 * then to be discarded) unless every pattern resolves. */
static bool
hash_files(XXH3_state_t *st, const cwi_value *files)
{
	size_t npat = 0;
	const char **pats = cwi_value_str_list(files, &npat);
	bool all = pats != NULL;

	for (size_t k = 0; all && k < npat; k++)
		all = is_remote_glob(pats[k]) ? hash_listing(st, pats[k])
					      : hash_paths(st, pats[k]);
	free(pats);
	return all;
}

/* The identity of the plugin a node's function comes from (none for a
 * built-in function or one registered from C: pipelines without plugin
 * functions keep the stream, and so the caches, of before). */
static void
hash_plugin(XXH3_state_t *st, const cwi_node *node)
{
	const cwi_plugin *p = node->fn != NULL ? node->fn->plugin : NULL;
	uint64_t hash[2];

	if (p == NULL)
		return;
	hash[0] = p->hash.hi;
	hash[1] = p->hash.lo;
	hash_bytes(st, 'P', p->name, strlen(p->name));
	hash_bytes(st, 'R', p->version, strlen(p->version));
	hash_words(st, 'H', hash, 2);
}

/* XXH3-128 of a node's structure. With `files` (identity), the parameters
 * that name input files are hashed by what they resolve to (real path,
 * size, mtime, ETag) instead of their text, when every pattern resolves,
 * the plugin of its function counts by its identity, and the inputs count
 * by their fingerprints; else by their seed fingerprints. Cannot fail:
 * the states live on the stack. */
static cachew_fingerprint
hash_node(const cwi_node *node, bool files)
{
	const cwi_dataset_op *op = node->op;
	const cwi_value *params = &node->params.map;
	XXH3_state_t st, probe;
	XXH128_hash_t h;

	XXH3_INITSTATE(&st);
	XXH3_INITSTATE(&probe);
	XXH3_128bits_reset(&st);
	hash_bytes(&st, 'V', CWI_FP_VERSION, strlen(CWI_FP_VERSION));
	hash_bytes(&st, 'O', op->name, strlen(op->name));
	for (size_t i = 0; i < params->u.map.n; i++) {
		const cwi_kv *kv = &params->u.map.items[i];
		const cwi_param_spec *s = spec_find(op, kv->key);
		if (s != NULL && (s->flags & CWI_PF_PERF))
			continue;
		hash_bytes(&st, 'k', kv->key, strlen(kv->key));
		if (files && s != NULL && s->type == CWI_P_STRS &&
		    (op->flags & CWI_OPF_FILES)) {
			/* Try the files on a copy of the state: keep it only
			 * if every pattern resolved. */
			XXH3_copyState(&probe, &st);
			if (hash_files(&probe, &kv->val)) {
				XXH3_copyState(&st, &probe);
				continue;
			}
		}
		hash_value(&st, &kv->val);
	}
	if (files)
		hash_plugin(&st, node);
	for (size_t i = 0; i < node->ninputs; i++) {
		const cachew_fingerprint *in = files
		    ? cwi_node_fp(node->inputs[i])
		    : &node->inputs[i]->seed_fp;
		uint64_t fp[2] = {in->hi, in->lo};
		hash_words(&st, 'I', fp, 2);
	}
	h = XXH3_128bits_digest(&st);
	return (cachew_fingerprint){.hi = h.high64, .lo = h.low64};
}

/* A CWI_OPF_FP_PARAM node's fingerprint: its "fingerprint" parameter. */
static cachew_err
fingerprint_param(cwi_node *node)
{
	const char *hex = cwi_node_str(node, "fingerprint");
	uint64_t w[2] = {0, 0};

	for (size_t i = 0; i < 32; i++) {
		char c = hex[i];
		int d = c >= '0' && c <= '9'   ? c - '0'
			: c >= 'a' && c <= 'f' ? c - 'a' + 10
			: c >= 'A' && c <= 'F' ? c - 'A' + 10
					       : -1;
		if (d < 0)
			return cwi_fail(CACHEW_EINVAL,
			    "%s: fingerprint '%s' is not 32 hex digits",
			    node->op->name, hex);
		w[i / 16] = w[i / 16] << 4 | (uint64_t)d;
	}
	if (hex[32] != '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "%s: fingerprint '%s' is not 32 hex digits", node->op->name,
		    hex);
	node->fp_value.hi = w[0];
	node->fp_value.lo = w[1];
	node->seed_fp = node->fp_value;
	return CACHEW_OK;
}

static bool
passes_through(const cwi_node *node)
{
	return (node->op->flags & CWI_OPF_PASSTHROUGH) && node->ninputs == 1;
}

/* Computes a pending fingerprint, its inputs' first. Two threads may both
 * compute it (a bucket listed twice); the first to finish stores its value
 * and the other takes that one, so a node never shows two fingerprints.
 * Recursion is one small frame per pending node on the input chain. */
static void
fp_settle(cwi_node *node)
{
	cachew_fingerprint fp;
	int expect = FP_PENDING;

	for (size_t i = 0; i < node->ninputs; i++)
		(void)cwi_node_fp(node->inputs[i]);
	fp = passes_through(node) ? *cwi_node_fp(node->inputs[0])
				  : hash_node(node, true);
	if (atomic_compare_exchange_strong_explicit(&node->fp_state, &expect,
		FP_STORING, memory_order_acquire, memory_order_acquire)) {
		node->fp_value = fp;
		atomic_store_explicit(&node->fp_state, FP_READY,
		    memory_order_release);
		return;
	}
	/* Another thread is storing: two 8-byte stores away. */
	while (atomic_load_explicit(&node->fp_state, memory_order_acquire) !=
	    FP_READY)
		sched_yield();
}

const cachew_fingerprint *
cwi_node_fp(const cwi_node *node)
{
	/* The lazily filled fingerprint is not part of the node's value:
	 * every node is allocated writable. */
	cwi_node *n = (cwi_node *)node;

	if (atomic_load_explicit(&n->fp_state, memory_order_acquire) !=
	    FP_READY)
		fp_settle(n);
	return &n->fp_value;
}

/* The seed fingerprint now; the fingerprint now too, unless it needs a
 * bucket listing (here or upstream): building never does network I/O, so
 * that waits for the first cwi_node_fp(). */
static cachew_err
fingerprint(cwi_node *node)
{
	bool later = lists_a_bucket(node);

	if (node->op->flags & CWI_OPF_FP_PARAM)
		return fingerprint_param(node);
	for (size_t i = 0; i < node->ninputs; i++)
		later = later || atomic_load_explicit(&node->inputs[i]->fp_state,
				     memory_order_acquire) != FP_READY;
	if (passes_through(node)) {
		node->seed_fp = node->inputs[0]->seed_fp;
		if (!later)
			node->fp_value = *cwi_node_fp(node->inputs[0]);
	} else {
		node->seed_fp = hash_node(node, false);
		if (!later)
			node->fp_value = hash_node(node, true);
	}
	atomic_init(&node->fp_state, later ? FP_PENDING : FP_READY);
	return CACHEW_OK;
}

/* ---- building --------------------------------------------------------------- */

static void
node_free(cwi_node *node)
{
	if (node->fn != NULL && node->fn->def.fini != NULL &&
	    node->fn_state != NULL)
		node->fn->def.fini(node->fn_state);
	if (node->op_state_free != NULL && atomic_load(&node->op_state) != NULL)
		node->op_state_free(atomic_load(&node->op_state));
	for (size_t i = 0; i < node->ninputs; i++)
		cachew_dataset_release(node->inputs[i]);
	free(node->inputs);
	cwi_value_free(&node->params.map);
	cwi_spec_free(&node->spec);
	free(node->detail);
	free(node);
}

/* `my_source(n=10)` names a user source (cachew_source_register): it is
 * user_source(fn=my_source, n=10), as a map alias is a map. Anything else
 * is an unknown operator. */
static cachew_err
user_source_build(cwi_node **out, const char *name, cwi_node *const *inputs,
    size_t ninputs, const cwi_value *pos, const cwi_value *named)
{
	const cwi_fn *fn = cwi_fn_lookup(name);
	cwi_value args = {.type = CWI_V_MAP}, fnv = {0};
	cachew_err rv;

	if (fn == NULL || fn->def.kind != (cachew_op_kind)CWI_FN_SOURCE)
		return cwi_fail(CACHEW_ENOENT, "unknown operator '%s'", name);
	if (pos != NULL && pos->type == CWI_V_LIST && pos->u.list.n > 0)
		return cwi_fail(CACHEW_EINVAL, "%s: a user source takes its "
		    "parameters by name (%s(key=value, ...))", name, name);
	if (named != NULL && named->type == CWI_V_MAP &&
	    cwi_map_get(named, "fn") != NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: 'fn' is not a parameter a "
		    "user source can take", name);
	rv = named != NULL ? cwi_value_copy(&args, named) : CACHEW_OK;
	if (rv == CACHEW_OK && args.type != CWI_V_MAP)
		rv = cwi_fail(CACHEW_EINVAL, "named values must be a map");
	if (rv == CACHEW_OK)
		rv = cwi_value_set_str(&fnv, name, strlen(name));
	if (rv == CACHEW_OK)
		rv = cwi_map_set(&args, "fn", &fnv);
	if (rv == CACHEW_OK)
		rv = cwi_node_build(out, "user_source", inputs, ninputs, NULL,
		    &args);
	cwi_value_free(&fnv);
	cwi_value_free(&args);
	return rv;
}

cachew_err
cwi_node_build(cwi_node **out, const char *opname, cwi_node *const *inputs,
    size_t ninputs, const cwi_value *pos, const cwi_value *named)
{
	const cwi_dataset_op *op = cwi_dataset_op_lookup(opname);
	cwi_value fn_params = {.type = CWI_V_MAP};
	cwi_value alias_named = {.type = CWI_V_MAP};
	cwi_node *node;
	cachew_err rv;

	if (op == NULL)
		return user_source_build(out, opname, inputs, ninputs, pos,
		    named);
	if (op->map_alias != NULL) {
		/* `read_file` is map(fn=read_file, <its params>); positional
		 * values fill the function's parameters the alias names
		 * (op->positional), never map's own (its first is `fn`). */
		cwi_value fnv = {0};
		size_t npos = pos != NULL && pos->type == CWI_V_LIST
		    ? pos->u.list.n : 0;
		const char *const *form = npos > 0 && npos <= CWI_MAX_POSITIONAL
		    ? op->positional[npos] : NULL;

		if (npos > 0 && form == NULL)
			return cwi_fail(CACHEW_EINVAL, "%s: too many positional "
			    "arguments (%zu); name them (see `cachew ops`)",
			    op->name, npos);
		if (named != NULL) {
			rv = cwi_value_copy(&alias_named, named);
			if (rv != CACHEW_OK)
				return rv;
		} else {
			alias_named.type = CWI_V_MAP;
		}
		for (size_t i = 0; i < npos; i++) {
			cwi_value v;

			if (cwi_map_get(&alias_named, form[i]) != NULL) {
				cwi_value_free(&alias_named);
				return cwi_fail(CACHEW_EINVAL, "%s: parameter '%s' "
				    "is given twice", op->name, form[i]);
			}
			rv = cwi_value_copy(&v, &pos->u.list.items[i]);
			if (rv == CACHEW_OK)
				rv = cwi_map_set(&alias_named, form[i], &v);
			if (rv != CACHEW_OK) {
				cwi_value_free(&alias_named);
				return rv;
			}
		}
		pos = NULL;
		rv = cwi_value_set_str(&fnv, op->map_alias, strlen(op->map_alias));
		if (rv == CACHEW_OK)
			rv = cwi_map_set(&alias_named, "fn", &fnv);
		if (rv == CACHEW_OK)
			rv = cwi_node_build(out, "map", inputs, ninputs, pos,
			    &alias_named);
		cwi_value_free(&alias_named);
		return rv;
	}
	if (pos != NULL && pos->type != CWI_V_LIST)
		return cwi_fail(CACHEW_EINVAL, "positional values must be a list");
	if (named != NULL && named->type != CWI_V_MAP)
		return cwi_fail(CACHEW_EINVAL, "named values must be a map");
	if (ninputs < op->min_inputs || ninputs > op->max_inputs) {
		if (op->max_inputs == 0)
			return cwi_fail(CACHEW_EINVAL,
			    "%s: is a source and takes no input pipeline",
			    op->name);
		if (op->min_inputs == op->max_inputs)
			return cwi_fail(CACHEW_EINVAL,
			    "%s: needs %u input pipeline%s, got %zu", op->name,
			    op->min_inputs, op->min_inputs == 1 ? "" : "s",
			    ninputs);
		return cwi_fail(CACHEW_EINVAL,
		    "%s: needs %u to %u input pipelines, got %zu", op->name,
		    op->min_inputs, op->max_inputs, ninputs);
	}
	node = calloc(1, sizeof(*node));
	if (node == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	atomic_init(&node->refs, 1);
	node->op = op;
	node->params.map.type = CWI_V_MAP;
	if (ninputs > 0) {
		node->inputs = calloc(ninputs, sizeof(cwi_node *));
		if (node->inputs == NULL) {
			free(node);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		for (size_t i = 0; i < ninputs; i++)
			node->inputs[i] = cachew_dataset_retain(inputs[i]);
		node->ninputs = ninputs;
	}
	rv = bind_params(node, pos, named, &fn_params);
	if (rv == CACHEW_OK && (op->flags & CWI_OPF_FN_ANY))
		rv = resolve_fn(node, &fn_params);
	cwi_value_free(&fn_params);
	if (rv == CACHEW_OK && op->validate != NULL)
		rv = op->validate(node);
	if (rv == CACHEW_OK)
		rv = cwi_node_infer(node);
	if (rv == CACHEW_OK)
		rv = fingerprint(node);
	if (rv != CACHEW_OK) {
		node_free(node);
		return rv;
	}
	*out = node;
	return CACHEW_OK;
}

/* ---- accessors ---------------------------------------------------------------- */

const cwi_value *
cwi_node_value(const cwi_node *n, const char *key)
{
	return cwi_map_get(&n->params.map, key);
}

int64_t
cwi_node_int(const cwi_node *n, const char *key)
{
	const cwi_value *v = cwi_node_value(n, key);
	return v != NULL && v->type == CWI_V_INT ? v->u.i : 0;
}

double
cwi_node_float(const cwi_node *n, const char *key)
{
	const cwi_value *v = cwi_node_value(n, key);
	if (v == NULL)
		return 0;
	return v->type == CWI_V_FLOAT ? v->u.f
	    : v->type == CWI_V_INT    ? (double)v->u.i
				      : 0;
}

bool
cwi_node_bool(const cwi_node *n, const char *key)
{
	const cwi_value *v = cwi_node_value(n, key);
	return v != NULL && v->type == CWI_V_BOOL && v->u.b;
}

const char *
cwi_node_str(const cwi_node *n, const char *key)
{
	const cwi_value *v = cwi_node_value(n, key);
	return v != NULL && v->type == CWI_V_STR ? v->u.s.ptr : "";
}

/* ---- public API ----------------------------------------------------------------- */

cachew_dataset *
cachew_dataset_retain(cachew_dataset *ds)
{
	if (ds != NULL)
		atomic_fetch_add_explicit(&ds->refs, 1, memory_order_relaxed);
	return ds;
}

void
cachew_dataset_release(cachew_dataset *ds)
{
	if (ds == NULL)
		return;
	if (atomic_fetch_sub_explicit(&ds->refs, 1, memory_order_acq_rel) == 1)
		node_free(ds);
}

const char *
cachew_dataset_op(const cachew_dataset *ds)
{
	return ds->op->name;
}

size_t
cachew_dataset_num_inputs(const cachew_dataset *ds)
{
	return ds->ninputs;
}

cachew_dataset *
cachew_dataset_input(const cachew_dataset *ds, size_t i)
{
	return i < ds->ninputs ? ds->inputs[i] : NULL;
}

const cachew_params *
cachew_dataset_params(const cachew_dataset *ds)
{
	return &ds->params;
}

cachew_err
cachew_dataset_fingerprint(const cachew_dataset *ds, cachew_fingerprint *out)
{
	if (ds == NULL || out == NULL)
		return cwi_fail(CACHEW_EINVAL, "fingerprint: NULL argument");
	*out = *cwi_node_fp(ds);
	return CACHEW_OK;
}

void
cachew_fingerprint_hex(const cachew_fingerprint *fp, char out[33])
{
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)fp->hi,
	    (unsigned long long)fp->lo);
}

/* ---- files ------------------------------------------------------------------------ */

void
cwi_paths_free(char **paths)
{
	if (paths == NULL)
		return;
	for (char **p = paths; *p != NULL; p++)
		free(*p);
	free(paths);
}

static cachew_err
paths_push(char ***paths, size_t *n, size_t *cap, const char *s)
{
	if (*n + 2 > *cap) {
		size_t ncap = *cap != 0 ? *cap * 2 : 16;
		char **p = realloc(*paths, ncap * sizeof(char *));
		if (p == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		*paths = p;
		*cap = ncap;
	}
	(*paths)[*n] = cwi_strdup(s);
	if ((*paths)[*n] == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	(*n)++;
	(*paths)[*n] = NULL;
	return CACHEW_OK;
}

/* An s3:// or gs:// glob, expanded by listing the bucket. */
static cachew_err
paths_push_listing(char ***paths, size_t *n, size_t *cap, const char *pat)
{
	cwi_io_entry *ents = NULL;
	size_t nents = 0;
	cachew_err rv;

	rv = cwi_io_list(pat, NULL, &ents, &nents);
	if (rv == CACHEW_OK && nents == 0)
		rv = cwi_fail(CACHEW_ENOENT, "no objects match '%s'", pat);
	for (size_t j = 0; j < nents && rv == CACHEW_OK; j++)
		rv = paths_push(paths, n, cap, ents[j].url);
	cwi_io_entries_free(ents, nents);
	return rv;
}

static int
cmp_path(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

cachew_err
cwi_paths_expand(
    const char *const *patterns, size_t npatterns, char ***out, size_t *nout)
{
	char **paths = NULL;
	size_t n = 0, cap = 0;
	cachew_err rv = CACHEW_OK;
	struct stat sb;

	/* Patterns keep their order; each glob's matches come sorted. */
	for (size_t i = 0; i < npatterns && rv == CACHEW_OK; i++) {
		const char *pat = patterns[i];
		glob_t g;
		int grv;

		if (is_remote_glob(pat)) {
			rv = paths_push_listing(&paths, &n, &cap, pat);
			continue;
		}
		if (strstr(pat, "://") != NULL) {
			rv = cwi_io_check_read(pat);
			if (rv == CACHEW_OK)
				rv = paths_push(&paths, &n, &cap, pat);
			continue;
		}
		/* A confined process (a worker) learns nothing of a path
		 * outside what it may read, not even whether it exists. */
		if (strpbrk(pat, "*?[") == NULL) {
			rv = cwi_io_check_read(pat);
			if (rv != CACHEW_OK)
				break;
			if (stat(pat, &sb) != 0) {
				rv = cwi_fail(CACHEW_ENOENT, "%s: %s", pat,
				    strerror(errno));
				break;
			}
			rv = paths_push(&paths, &n, &cap, pat);
			continue;
		}
		rv = cwi_io_check_glob(pat);
		if (rv != CACHEW_OK)
			break;
		/* Sorted by strcmp, not the locale's collation: the order
		 * numbers a file source's split units, which every worker
		 * and client must agree on. */
		grv = glob(pat, GLOB_NOSORT, NULL, &g);
		if (grv == 0)
			qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), cmp_path);
		if (grv == GLOB_NOMATCH) {
			rv = cwi_fail(CACHEW_ENOENT, "no files match '%s'", pat);
		} else if (grv != 0) {
			rv = cwi_fail(grv == GLOB_NOSPACE ? CACHEW_ENOMEM
							  : CACHEW_EIO,
			    "cannot expand '%s'", pat);
		} else {
			/* Each match on its own: a symlink among them may
			 * lead out. */
			for (size_t j = 0; j < g.gl_pathc && rv == CACHEW_OK; j++) {
				rv = cwi_io_check_read(g.gl_pathv[j]);
				if (rv == CACHEW_OK)
					rv = paths_push(&paths, &n, &cap,
					    g.gl_pathv[j]);
			}
		}
		if (grv != GLOB_NOMATCH)
			globfree(&g);
	}
	if (rv == CACHEW_OK && paths == NULL) {
		paths = calloc(1, sizeof(char *));
		if (paths == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if (rv != CACHEW_OK) {
		cwi_paths_free(paths);
		return rv;
	}
	*out = paths;
	*nout = n;
	return CACHEW_OK;
}
