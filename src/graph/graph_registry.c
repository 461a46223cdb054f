/*
 * graph_registry.c - the operator registry: built-in dataset operators, and
 * function operators (built-in, registered from C, loaded from plugins).
 * The built-in tables come from cwi_registry_init (the list of them sits
 * above the modules that define them, in src/pipeline): the registry
 * names none of them, so no module below it depends on one above.
 *
 * Locking: reg_lock protects the function table and the list of loaded
 * plugins; load_lock serialises plugin loads (taken before reg_lock). Built-in tables are read-only. Function entries are never freed
 * or moved once registered, so a resolved cwi_fn pointer stays valid.
 */
#include "graph.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
/* Serialises whole plugin loads (check, dlopen, init, record), so two
 * threads loading one path run its init once. Order: load_lock, reg_lock. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static const cwi_builtins *_Atomic reg_builtins; /* cwi_registry_init's */
static const cwi_dataset_op **dataset_ops;
static size_t ndataset_ops;

static cwi_fn **fns;
static size_t nfns, capfns;

typedef struct plugin_rec {
	char *path; /* realpath */
	cachew_err rv; /* what its init returned */
	cwi_plugin *id; /* its functions point at it: never freed */
} plugin_rec;

static plugin_rec *plugins;
static size_t nplugins;

static bool
valid_name(const char *name)
{
	size_t len = name != NULL ? strlen(name) : 0;
	if (len == 0 || len > 63)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || c == '_' ||
			(i > 0 && c >= '0' && c <= '9')))
			return false;
	}
	return true;
}

/* The bytes of cachew_op_def each layout version has (cachew.h lists the
 * fields of each); a definition is read no further than its version. */
static const size_t op_def_sizes[] = {
    [1] = offsetof(cachew_op_def, doc),
    [2] = sizeof(cachew_op_def),
};
_Static_assert(sizeof(op_def_sizes) / sizeof(op_def_sizes[0]) ==
	CACHEW_OP_DEF_VERSION + 1,
    "a new cachew_op_def version needs its size in op_def_sizes");

/* Larger "versions" are not versions: most likely the first word of a
 * definition built against a cachew.h without the version field (its name
 * pointer), so its other fields are not read either. */
#define OP_DEF_VERSION_PLAUSIBLE 0xffffu

/* The file of the plugin whose init runs on this thread, if any: what a
 * refused definition is blamed on; and its identity, which the functions
 * it registers carry. */
static _Thread_local const char *tls_plugin;
static _Thread_local const cwi_plugin *tls_plugin_id;

/* Copies the fields def's version has into *out, the later ones zero
 * (absent), or refuses a version this library cannot read: 0 (unset) is
 * CACHEW_EINVAL, a newer one CACHEW_ENOTSUP. */
static cachew_err
op_def_read(const cachew_op_def *def, cachew_op_def *out)
{
	char from[PATH_MAX + 16];

	if (def == NULL)
		return cwi_fail(CACHEW_EINVAL, "operator definition is NULL");
	memset(out, 0, sizeof(*out));
	if (def->version >= 1 && def->version <= CACHEW_OP_DEF_VERSION) {
		memcpy(out, def, op_def_sizes[def->version]);
		return CACHEW_OK;
	}
	if (tls_plugin != NULL)
		snprintf(from, sizeof(from), "plugin '%s'", tls_plugin);
	else
		snprintf(from, sizeof(from), "not from a plugin");
	if (def->version == 0)
		return cwi_fail(CACHEW_EINVAL,
		    "operator '%.63s' (%s): cachew_op_def version 0: set "
		    ".version = CACHEW_OP_DEF_VERSION (this library reads "
		    "versions 1 to %d)",
		    def->name != NULL ? def->name : "(null)", from,
		    CACHEW_OP_DEF_VERSION);
	if (def->version > OP_DEF_VERSION_PLAUSIBLE)
		return cwi_fail(CACHEW_ENOTSUP,
		    "an operator (%s): cachew_op_def version %u is not a "
		    "version (this library reads 1 to %d): was it built "
		    "against a cachew.h without the version field?",
		    from, def->version, CACHEW_OP_DEF_VERSION);
	return cwi_fail(CACHEW_ENOTSUP,
	    "operator '%.63s' (%s): cachew_op_def version %u is newer than "
	    "this library's %d: build it against this library's cachew.h or "
	    "upgrade cachew",
	    def->name != NULL ? def->name : "(null)", from, def->version,
	    CACHEW_OP_DEF_VERSION);
}

/* Lookup without pthread_once: reg_init itself calls it. */
static const cwi_dataset_op *
op_find(const char *name)
{
	for (size_t i = 0; i < ndataset_ops; i++)
		if (strcmp(dataset_ops[i]->name, name) == 0)
			return dataset_ops[i];
	return NULL;
}

static const cwi_fn *
fn_find_locked(const char *name)
{
	for (size_t i = 0; i < nfns; i++)
		if (strcmp(fns[i]->name, name) == 0)
			return fns[i];
	return NULL;
}

/* Room for one more function entry; false on ENOMEM. reg_lock held. */
static bool
fns_reserve_locked(void)
{
	size_t ncap;
	cwi_fn **p;

	if (nfns < capfns)
		return true;
	ncap = capfns != 0 ? capfns * 2 : 32;
	p = realloc(fns, ncap * sizeof(*p));
	if (p == NULL)
		return false;
	fns = p;
	capfns = ncap;
	return true;
}

static cachew_err
fn_add_locked(const cachew_op_def *def, bool builtin)
{
	cachew_op_def known;
	cachew_err rv;
	cwi_fn *fn;

	/* From here on only the fields def's version has are read. */
	rv = op_def_read(def, &known);
	if (rv != CACHEW_OK)
		return rv;
	def = &known;
	if (!valid_name(def->name))
		return cwi_fail(CACHEW_EINVAL,
		    "operator name '%s' must match [a-z_][a-z0-9_]{0,62}",
		    def->name != NULL ? def->name : "(null)");
	/* Function names are their own namespace: `interleave(text_lines)`
	 * names the function, `text_lines(...)` the source. */
	if (fn_find_locked(def->name) != NULL)
		return cwi_fail(CACHEW_EEXIST, "operator '%s' already exists",
		    def->name);
	switch (def->kind) {
	case CACHEW_OP_MAP:
		if (def->map == NULL)
			goto missing;
		break;
	case CACHEW_OP_FILTER:
		if (def->filter == NULL)
			goto missing;
		break;
	case CACHEW_OP_FLAT_MAP:
		if (def->flat_open == NULL || def->flat_next == NULL)
			goto missing;
		break;
	default:
		return cwi_fail(CACHEW_EINVAL, "operator '%s' has an invalid kind",
		    def->name);
	}
	if (!fns_reserve_locked())
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	fn = calloc(1, sizeof(*fn));
	if (fn == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	fn->def = *def;
	snprintf(fn->name, sizeof(fn->name), "%s", def->name);
	fn->def.name = fn->name;
	fn->builtin = builtin;
	fn->plugin = builtin ? NULL : tls_plugin_id;
	fns[nfns++] = fn;
	return CACHEW_OK;
missing:
	return cwi_fail(CACHEW_EINVAL,
	    "operator '%s' lacks the function its kind needs", def->name);
}

static void
reg_init(void)
{
	const cwi_builtins *b = atomic_load(&reg_builtins);
	size_t n = 0;

	for (size_t t = 0; t < b->nop_tables; t++)
		for (size_t i = 0; b->op_tables[t][i] != NULL; i++)
			n++;
	dataset_ops = calloc(n, sizeof(*dataset_ops));
	if (dataset_ops == NULL)
		return;
	for (size_t t = 0; t < b->nop_tables; t++)
		for (size_t i = 0; b->op_tables[t][i] != NULL; i++)
			dataset_ops[ndataset_ops++] = b->op_tables[t][i];
	for (size_t t = 0; t < b->nfn_tables; t++)
		for (size_t i = 0; b->fn_tables[t][i] != NULL; i++)
			(void)fn_add_locked(b->fn_tables[t][i], true);
	for (size_t k = 0; k < b->nresumes; k++)
		for (size_t i = 0; i < nfns; i++)
			if (fns[i]->builtin &&
			    strcmp(fns[i]->name, b->resumes[k].def->name) == 0)
				fns[i]->resume = b->resumes[k].resume;
	for (size_t k = 0; b->specs != NULL && b->specs[k].name != NULL; k++)
		for (size_t i = 0; i < nfns; i++)
			if (fns[i]->builtin &&
			    strcmp(fns[i]->name, b->specs[k].name) == 0)
				fns[i]->spec = b->specs[k].rule;
}

void
cwi_registry_init(const cwi_builtins *b)
{
	const cwi_builtins *none = NULL;

	(void)atomic_compare_exchange_strong(&reg_builtins, &none, b);
	pthread_once(&reg_once, reg_init);
}

/* Whether the registry has its built-ins (it is filled, and this thread
 * sees it filled); before cwi_registry_init it knows nothing. */
static bool
reg_ready(void)
{
	if (atomic_load(&reg_builtins) == NULL)
		return false;
	pthread_once(&reg_once, reg_init);
	return true;
}

const cwi_dataset_op *
cwi_dataset_op_lookup(const char *name)
{
	return reg_ready() ? op_find(name) : NULL;
}

size_t
cwi_dataset_op_count(void)
{
	return reg_ready() ? ndataset_ops : 0;
}

const cwi_dataset_op *
cwi_dataset_op_at(size_t i)
{
	return reg_ready() && i < ndataset_ops ? dataset_ops[i] : NULL;
}

const cwi_fn *
cwi_fn_lookup(const char *name)
{
	const cwi_fn *fn;

	(void)reg_ready();
	pthread_mutex_lock(&reg_lock);
	fn = fn_find_locked(name);
	pthread_mutex_unlock(&reg_lock);
	return fn;
}

size_t
cwi_fn_count(void)
{
	size_t n;

	(void)reg_ready();
	pthread_mutex_lock(&reg_lock);
	n = nfns;
	pthread_mutex_unlock(&reg_lock);
	return n;
}

const cwi_fn *
cwi_fn_at(size_t i)
{
	const cwi_fn *fn;

	(void)reg_ready();
	pthread_mutex_lock(&reg_lock);
	fn = i < nfns ? fns[i] : NULL;
	pthread_mutex_unlock(&reg_lock);
	return fn;
}

cachew_err
cwi_registry_register(const cachew_op_def *def)
{
	cachew_err rv;

	(void)reg_ready();
	cwi_clear_errmsg();
	pthread_mutex_lock(&reg_lock);
	rv = fn_add_locked(def, false);
	pthread_mutex_unlock(&reg_lock);
	if (rv == CACHEW_OK)
		cwi_log(CACHEW_LOG_DEBUG, "registry", "registered operator '%s'",
		    def->name);
	else if (tls_plugin != NULL) /* its init may go on regardless */
		cwi_log(CACHEW_LOG_WARN, "registry", "%s", cwi_errmsg_get());
	return rv;
}

/* A user source: a cwi_fn of kind CWI_FN_SOURCE, its definition copied
 * (doc too: the caller's strings are read during the call only). */
static cachew_err
source_add_locked(const cachew_source_def *def)
{
	char err[256] = "";
	cwi_fn *fn;
	cachew_err rv;

	if (def == NULL)
		return cwi_fail(CACHEW_EINVAL, "source definition is NULL");
	if (def->version == 0)
		return cwi_fail(CACHEW_EINVAL, "source '%.63s': "
		    "cachew_source_def version 0: set .version = "
		    "CACHEW_SOURCE_DEF_VERSION (this library reads version "
		    "%d)", def->name != NULL ? def->name : "(null)",
		    CACHEW_SOURCE_DEF_VERSION);
	if (def->version > CACHEW_SOURCE_DEF_VERSION)
		return cwi_fail(CACHEW_ENOTSUP, "a source: cachew_source_def "
		    "version %u is newer than this library's %d: build it "
		    "against this library's cachew.h or upgrade cachew",
		    def->version, CACHEW_SOURCE_DEF_VERSION);
	if (!valid_name(def->name))
		return cwi_fail(CACHEW_EINVAL,
		    "source name '%s' must match [a-z_][a-z0-9_]{0,62}",
		    def->name != NULL ? def->name : "(null)");
	if (fn_find_locked(def->name) != NULL || op_find(def->name) != NULL)
		return cwi_fail(CACHEW_EEXIST, "source '%s': the name is "
		    "taken by %s", def->name, op_find(def->name) != NULL
		    ? "a built-in operator" : "a function or source");
	if (def->open == NULL || def->next == NULL)
		return cwi_fail(CACHEW_EINVAL, "source '%s' lacks its %s "
		    "callback", def->name, def->open == NULL ? "open" : "next");
	if (!fns_reserve_locked())
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	fn = calloc(1, sizeof(*fn));
	if (fn == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_spec_parse(def->element_spec, &fn->source_spec, err,
	    sizeof(err));
	if (rv != CACHEW_OK) {
		free(fn);
		return cwi_fail(rv, "source '%s': %s", def->name, err);
	}
	fn->source = *def;
	snprintf(fn->name, sizeof(fn->name), "%s", def->name);
	fn->source.name = fn->name;
	fn->source.element_spec = NULL;
	if (def->doc != NULL) {
		fn->source.doc = cwi_strdup(def->doc);
		if (fn->source.doc == NULL) {
			cwi_spec_free(&fn->source_spec);
			free(fn);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	fn->def.version = CACHEW_OP_DEF_VERSION;
	fn->def.name = fn->name;
	fn->def.kind = (cachew_op_kind)CWI_FN_SOURCE;
	fn->def.flags = def->flags;
	fn->def.init = def->init;
	fn->def.fini = def->fini;
	fn->def.doc = fn->source.doc;
	fn->plugin = tls_plugin_id;
	fns[nfns++] = fn;
	return CACHEW_OK;
}

cachew_err
cwi_registry_register_source(const cachew_source_def *def)
{
	cachew_err rv;

	(void)reg_ready();
	cwi_clear_errmsg();
	pthread_mutex_lock(&reg_lock);
	rv = source_add_locked(def);
	pthread_mutex_unlock(&reg_lock);
	if (rv == CACHEW_OK)
		cwi_log(CACHEW_LOG_DEBUG, "registry", "registered source '%s'",
		    def->name);
	else if (tls_plugin != NULL)
		cwi_log(CACHEW_LOG_WARN, "registry", "%s", cwi_errmsg_get());
	return rv;
}

/* Records a load's outcome; returns false on ENOMEM. reg_lock held. */
static bool
plugin_record(const char *real, cachew_err rv, cwi_plugin *id)
{
	plugin_rec *p = realloc(plugins, (nplugins + 1) * sizeof(*p));
	if (p == NULL)
		return false;
	plugins = p;
	plugins[nplugins].path = cwi_strdup(real);
	plugins[nplugins].rv = rv;
	plugins[nplugins].id = id;
	if (plugins[nplugins].path == NULL)
		return false;
	nplugins++;
	return true;
}

static bool
plugin_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || (c != '\0' && strchr("_.+-", c) != NULL);
}

bool
cwi_plugin_text_ok(const char *s, bool empty)
{
	size_t len = s != NULL ? strnlen(s, 64) : 0;

	if (s == NULL || len > 63 || (len == 0 && !empty))
		return false;
	for (size_t i = 0; i < len; i++)
		if (!plugin_char_ok(s[i]))
			return false;
	return true;
}

void
cwi_fn_ident_of(const cwi_fn *fn, cwi_fn_ident *out)
{
	const cwi_plugin *p = fn->plugin;

	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "%s", fn->name);
	if (p == NULL)
		return;
	memcpy(out->plugin, p->name, sizeof(out->plugin));
	memcpy(out->version, p->version, sizeof(out->version));
	memcpy(out->hash, p->hash_hex, sizeof(out->hash));
}

bool
cwi_fn_ident_equal(const cwi_fn_ident *a, const cwi_fn_ident *b)
{
	return strcmp(a->name, b->name) == 0 &&
	       strcmp(a->plugin, b->plugin) == 0 &&
	       strcmp(a->version, b->version) == 0 &&
	       strcmp(a->hash, b->hash) == 0;
}

const char *
cwi_fn_ident_describe(const cwi_fn_ident *f, char *buf, size_t len)
{
	if (f->plugin[0] == '\0')
		snprintf(buf, len, "'%s' (registered from C, of no plugin)",
		    f->name);
	else /* 16 of the 32 digits: enough to tell two builds apart */
		snprintf(buf, len, "'%s' of plugin %s %s (build %.16s)",
		    f->name, f->plugin,
		    f->version[0] != '\0' ? f->version : "(no version)",
		    f->hash);
	return buf;
}

cachew_err
cwi_registry_user_fns(cwi_fn_ident **out, size_t *n)
{
	cwi_fn_ident *v;
	size_t k = 0;

	(void)reg_ready();
	pthread_mutex_lock(&reg_lock);
	v = calloc(nfns > 0 ? nfns : 1, sizeof(*v));
	for (size_t i = 0; v != NULL && i < nfns; i++)
		if (!fns[i]->builtin)
			cwi_fn_ident_of(fns[i], &v[k++]);
	pthread_mutex_unlock(&reg_lock);
	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	*out = v;
	*n = k;
	return CACHEW_OK;
}

/* XXH3-128 of the plugin file's bytes: two builds of one plugin differ
 * here whatever their name and version say. */
static cachew_err
plugin_hash(const char *path, cwi_plugin *id)
{
	uint8_t buf[16384];
	XXH3_state_t st;
	XXH128_hash_t h;
	FILE *f = fopen(id->path, "rb");
	size_t n;
	int err;

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "cannot read plugin '%s': %s", path,
		    strerror(errno));
	XXH3_INITSTATE(&st);
	XXH3_128bits_reset(&st);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		XXH3_128bits_update(&st, buf, n);
	err = ferror(f) ? errno : 0;
	fclose(f);
	if (err != 0)
		return cwi_fail(CACHEW_EIO, "cannot read plugin '%s': %s", path,
		    strerror(err));
	h = XXH3_128bits_digest(&st);
	id->hash = (cachew_fingerprint){.hi = h.high64, .lo = h.low64};
	cachew_fingerprint_hex(&id->hash, id->hash_hex);
	return CACHEW_OK;
}

/* The plugin's name and version: its cachew_plugin_info, or the file's
 * base name up to its first '.' and no version. */
static cachew_err
plugin_info_read(void *handle, const char *path, cwi_plugin *id)
{
	const cachew_plugin_info *info;
	const char *base = strrchr(id->path, '/'), *ver;
	size_t n = 0;

	*(void **)&info = dlsym(handle, CACHEW_PLUGIN_INFO_SYMBOL);
	if (info == NULL) {
		base = base != NULL ? base + 1 : id->path;
		for (; base[n] != '\0' && base[n] != '.' && n < 63; n++)
			id->name[n] = plugin_char_ok(base[n]) ? base[n] : '_';
		snprintf(id->name + n, sizeof(id->name) - n, "%s",
		    n == 0 ? "plugin" : "");
		id->version[0] = '\0';
		return CACHEW_OK;
	}
	/* Fields are only appended: a newer layout starts with these. */
	if (info->version == 0 || info->version > OP_DEF_VERSION_PLAUSIBLE)
		return cwi_fail(CACHEW_EINVAL, "plugin '%s': %s has version %u: "
		    "set .version = CACHEW_PLUGIN_INFO_VERSION (this library "
		    "reads %d)", path, CACHEW_PLUGIN_INFO_SYMBOL, info->version,
		    CACHEW_PLUGIN_INFO_VERSION);
	ver = info->plugin_version != NULL ? info->plugin_version : "";
	if (!cwi_plugin_text_ok(info->name, false))
		return cwi_fail(CACHEW_EINVAL, "plugin '%s': %s.name '%.63s' is "
		    "not 1 to 63 characters of [A-Za-z0-9_.+-]", path,
		    CACHEW_PLUGIN_INFO_SYMBOL,
		    info->name != NULL ? info->name : "(null)");
	if (!cwi_plugin_text_ok(ver, true))
		return cwi_fail(CACHEW_EINVAL, "plugin '%s': "
		    "%s.plugin_version '%.63s' is not at most 63 characters of "
		    "[A-Za-z0-9_.+-]", path, CACHEW_PLUGIN_INFO_SYMBOL, ver);
	snprintf(id->name, sizeof(id->name), "%s", info->name);
	snprintf(id->version, sizeof(id->version), "%s", ver);
	return CACHEW_OK;
}

/* dlopens the plugin and finds its init; CACHEW_OK with *handle and
 * *init set, else the handle is closed. load_lock held. */
static cachew_err
plugin_open(const char *path, cwi_plugin *id, void **handle,
    cachew_plugin_init_fn *init)
{
	cachew_err rv;

	*handle = dlopen(id->path, RTLD_NOW | RTLD_LOCAL);
	if (*handle == NULL)
		return cwi_fail(CACHEW_EINVAL, "cannot load plugin '%s': %s",
		    path, dlerror());
	*(void **)init = dlsym(*handle, CACHEW_PLUGIN_INIT_SYMBOL);
	if (*init == NULL)
		rv = cwi_fail(CACHEW_ENOENT, "plugin '%s' has no symbol %s",
		    path, CACHEW_PLUGIN_INIT_SYMBOL);
	else
		rv = plugin_info_read(*handle, path, id);
	if (rv != CACHEW_OK)
		dlclose(*handle);
	return rv;
}

cachew_err
cwi_registry_plugin_load(const char *path)
{
	char real[PATH_MAX];
	cachew_plugin_init_fn init = NULL;
	cwi_plugin *id;
	void *handle = NULL;
	cachew_err rv = CACHEW_OK;
	bool seen = false;

	(void)reg_ready();
	cwi_clear_errmsg();
	if (path == NULL || realpath(path, real) == NULL)
		return cwi_fail(CACHEW_ENOENT, "plugin '%s' not found",
		    path != NULL ? path : "(null)");
	pthread_mutex_lock(&load_lock);
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < nplugins && !seen; i++) {
		if (strcmp(plugins[i].path, real) == 0) {
			seen = true;
			rv = plugins[i].rv;
		}
	}
	pthread_mutex_unlock(&reg_lock);
	if (seen) {
		pthread_mutex_unlock(&load_lock);
		if (rv != CACHEW_OK)
			return cwi_fail(rv, "plugin '%s' failed to initialise "
			    "when it was first loaded", path);
		return CACHEW_OK;
	}

	/* The identity first: the bytes hashed are those dlopen maps, unless
	 * the file is replaced in between (install plugins by rename). */
	id = calloc(1, sizeof(*id));
	if (id == NULL || (id->path = cwi_strdup(real)) == NULL) {
		free(id);
		pthread_mutex_unlock(&load_lock);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	rv = plugin_hash(path, id);
	if (rv == CACHEW_OK)
		rv = plugin_open(path, id, &handle, &init);
	if (rv != CACHEW_OK) {
		free(id->path);
		free(id);
		pthread_mutex_unlock(&load_lock);
		return rv;
	}
	/* The init function registers through cachew_op_register, which takes
	 * reg_lock itself: call it with only load_lock held. */
	tls_plugin = path;
	tls_plugin_id = id;
	rv = init(CACHEW_VERSION_NUMBER);
	tls_plugin = NULL;
	tls_plugin_id = NULL;
	if (rv != CACHEW_OK)
		rv = cwi_fail(rv, "plugin '%s' failed to initialise: %s", path,
		    cwi_errmsg_get()[0] != '\0' ? cwi_errmsg_get()
						: cachew_strerror(rv));
	/* Recorded either way: the operators it registered stay (entries are
	 * never freed), so loading it again must not run init again. */
	pthread_mutex_lock(&reg_lock);
	if (!plugin_record(real, rv, id) && rv == CACHEW_OK)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_unlock(&reg_lock);
	pthread_mutex_unlock(&load_lock);
	if (rv == CACHEW_OK)
		cwi_log(CACHEW_LOG_INFO, "registry", "loaded plugin %s: name=%s "
		    "version=%s build=%s", real, id->name,
		    id->version[0] != '\0' ? id->version : "none",
		    id->hash_hex);
	return rv;
}
