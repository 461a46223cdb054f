/*
 * dispatcher_autocache.c - per-dataset autocaching modes across passes, the
 * storage probe, cache commits and the planner's state as text
 * (dispatcher_autocache.h).
 *
 * Lock order: dc->lock only; held across one call, I/O included (calls
 * come from the dispatcher's own thread at pass boundaries, never from a
 * data path).
 *
 * State lines (the header gives their format): the dispatcher takes the
 * whole text after every call and journals the lines that changed; a
 * line is at most a few hundred bytes (a reason of 639, four points), so
 * the 4096-byte bound is never met by what cwi_dcache_save writes. Unknown
 * keys are ignored, so that a later version's lines load; keys are only
 * looked for before `reason`, which may hold any text.
 */
#include "dispatcher_autocache.h"

#include "../../cache/cache.h"
#include "../../exec/exec_split.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DC_COMMIT_TRIES 3 /* PUT passes that may fail before COMPUTE */

typedef struct dc_entry {
	cachew_fingerprint fp; /* the registered pipeline's */
	bool decided;
	cwi_ac_choice choice;
	int candidate;         /* chosen point; -1: compute */
	bool failed;           /* caching it failed for good: compute */
	uint32_t put_failures;
	double epochs;         /* passes expected, as last told */
	double compute_s;      /* the decision's estimated pass times: */
	double cache_s;        /* computing, and reading the chosen cache */
	cwi_ac_mode last_mode; /* of the latest pass started */
	bool started;          /* a pass was started (last_mode is set) */
	size_t npoints;        /* the profile: one point per candidate */
	cwi_ac_point points[CWI_AC_MAX_CANDIDATES];
	char reason[640];
} dc_entry;

struct cwi_dcache {
	pthread_mutex_t lock;
	cwi_cache_root *root;
	cwi_ac_config ac;
	uint64_t capacity;
	double default_epochs;
	uint64_t probe_bytes;
	bool probed;
	cwi_ac_storage storage;
	dc_entry *v;
	size_t n, cap;
};

/* ---- state lines --------------------------------------------------------- */

#define KEY_STORAGE "storage "
#define KEY_DATASET "dataset fp="
#define KEY_DATASET_LEN (sizeof(KEY_DATASET) - 1 + 32)

static void
put_storage(cwi_strbuf *sb, const cwi_ac_storage *st)
{
	cwi_strbuf_printf(sb,
	    "storage read_mb_per_s=%.17g read_rows_per_s=%.17g "
	    "write_mb_per_s=%.17g\n",
	    st->read_mb_per_s, st->read_rows_per_s, st->write_mb_per_s);
}

static void
put_entry(cwi_strbuf *sb, const dc_entry *e)
{
	char hex[33];

	cachew_fingerprint_hex(&e->fp, hex);
	cwi_strbuf_printf(sb,
	    "dataset fp=%s decided=%d choice=%s candidate=%d failed=%d "
	    "epochs=%.17g compute_s=%.17g cache_s=%.17g n=%zu",
	    hex, e->decided ? 1 : 0, cwi_ac_choice_name(e->choice),
	    e->candidate, e->failed ? 1 : 0, e->epochs, e->compute_s,
	    e->cache_s, e->npoints);
	for (size_t k = 0; k < e->npoints; k++)
		cwi_strbuf_printf(sb, " p%zu=%.17g,%.17g,%.17g,%.17g", k,
		    e->points[k].rows, e->points[k].row_bytes,
		    e->points[k].up_ns, e->points[k].after_ns);
	cwi_strbuf_printf(sb, " put_failures=%u last=%s reason=",
	    (unsigned)e->put_failures,
	    e->started ? cwi_ac_mode_name(e->last_mode) : "none");
	/* The reason runs to the end of the line: no newline inside. */
	for (const char *c = e->reason; *c != '\0'; c++)
		cwi_strbuf_append(sb, *c == '\n' ? " " : c, 1);
	cwi_strbuf_append(sb, "\n", 1);
}

/* The value of `key=` in a line of space-separated fields before its
 * reason. */
static const char *
field(const char *line, const char *key, char *buf, size_t size)
{
	size_t klen = strlen(key);
	const char *p = line, *end = strstr(line, " reason=");

	if (end == NULL)
		end = line + strlen(line);
	while ((p = strstr(p, key)) != NULL && p + klen < end) {
		if ((p == line || p[-1] == ' ') && p[klen] == '=') {
			const char *v = p + klen + 1;
			size_t n = strcspn(v, " \n");
			if (n >= size)
				return NULL;
			memcpy(buf, v, n);
			buf[n] = '\0';
			return buf;
		}
		p += klen;
	}
	return NULL;
}

static bool
parse_double(const char *s, double *out)
{
	char *end;

	if (s == NULL)
		return false;
	errno = 0;
	*out = strtod(s, &end);
	return errno == 0 && end != s && *end == '\0';
}

static bool
parse_storage(const char *line, cwi_ac_storage *st)
{
	char buf[64];

	return parse_double(field(line, "read_mb_per_s", buf, sizeof(buf)),
		   &st->read_mb_per_s) &&
	       parse_double(field(line, "read_rows_per_s", buf, sizeof(buf)),
		   &st->read_rows_per_s) &&
	       parse_double(field(line, "write_mb_per_s", buf, sizeof(buf)),
		   &st->write_mb_per_s);
}

/* The fields later than the first state files: absent, their defaults. */
static bool
parse_later_fields(const char *line, dc_entry *e)
{
	static const cwi_ac_mode modes[] = {CWI_AC_PROFILE, CWI_AC_PUT,
	    CWI_AC_GET, CWI_AC_COMPUTE};
	char buf[32];
	double d;

	if (!parse_double(field(line, "compute_s", buf, sizeof(buf)),
		&e->compute_s) ||
	    !parse_double(field(line, "cache_s", buf, sizeof(buf)), &e->cache_s))
		e->compute_s = e->cache_s = 0;
	if (field(line, "put_failures", buf, sizeof(buf)) != NULL) {
		if (!parse_double(buf, &d) || d < 0 || d > DC_COMMIT_TRIES)
			return false;
		e->put_failures = (uint32_t)d;
	}
	if (field(line, "last", buf, sizeof(buf)) == NULL ||
	    strcmp(buf, "none") == 0)
		return true;
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (strcmp(buf, cwi_ac_mode_name(modes[i])) == 0) {
			e->last_mode = modes[i];
			e->started = true;
			return true;
		}
	return false;
}

static bool
parse_entry(const char *line, dc_entry *e)
{
	char buf[128], key[32];
	double d;
	const char *r;

	memset(e, 0, sizeof(*e));
	if (field(line, "fp", buf, sizeof(buf)) == NULL ||
	    cwi_cache_fp_parse(buf, &e->fp) != CACHEW_OK)
		return false;
	if (!parse_double(field(line, "decided", buf, sizeof(buf)), &d))
		return false;
	e->decided = d != 0;
	if (field(line, "choice", buf, sizeof(buf)) == NULL)
		return false;
	if (strcmp(buf, "compute") == 0)
		e->choice = CWI_AC_CHOICE_COMPUTE;
	else if (strcmp(buf, "source") == 0)
		e->choice = CWI_AC_CHOICE_SOURCE;
	else if (strcmp(buf, "full") == 0)
		e->choice = CWI_AC_CHOICE_FULL;
	else
		return false;
	if (!parse_double(field(line, "candidate", buf, sizeof(buf)), &d) ||
	    d < -1 || d >= CWI_AC_MAX_CANDIDATES)
		return false;
	e->candidate = (int)d;
	if (!parse_double(field(line, "failed", buf, sizeof(buf)), &d))
		return false;
	e->failed = d != 0;
	if (!parse_double(field(line, "epochs", buf, sizeof(buf)), &e->epochs))
		return false;
	if (!parse_double(field(line, "n", buf, sizeof(buf)), &d) || d < 0 ||
	    d > CWI_AC_MAX_CANDIDATES)
		return false;
	e->npoints = (size_t)d;
	for (size_t k = 0; k < e->npoints; k++) {
		cwi_ac_point *p = &e->points[k];
		snprintf(key, sizeof(key), "p%zu", k);
		if (field(line, key, buf, sizeof(buf)) == NULL ||
		    sscanf(buf, "%lg,%lg,%lg,%lg", &p->rows, &p->row_bytes,
			&p->up_ns, &p->after_ns) != 4)
			return false;
	}
	if (!parse_later_fields(line, e))
		return false;
	r = strstr(line, " reason=");
	if (r != NULL) {
		r += strlen(" reason=");
		snprintf(e->reason, sizeof(e->reason), "%.*s",
		    (int)strcspn(r, "\n"), r);
	}
	return true;
}

/* A line of the state, parsed: a storage line (*is_storage) or a
 * dataset's. */
typedef struct dc_line {
	bool is_storage;
	cwi_ac_storage storage;
	dc_entry entry;
} dc_line;

/* Parses one NUL-terminated line (no '\n'); strict about the key's
 * form, which names the line. */
static bool
parse_line(const char *line, dc_line *out)
{
	size_t n = strlen(KEY_DATASET);

	memset(out, 0, sizeof(*out));
	if (strncmp(line, KEY_STORAGE, strlen(KEY_STORAGE)) == 0) {
		out->is_storage = true;
		return parse_storage(line, &out->storage);
	}
	if (strncmp(line, KEY_DATASET, n) != 0 ||
	    strspn(line + n, "0123456789abcdef") != 32 ||
	    line[KEY_DATASET_LEN] != ' ')
		return false;
	return parse_entry(line, &out->entry);
}

cachew_err
cwi_dcache_line_check(const char *line, size_t len, size_t *key_len)
{
	char buf[CWI_DCACHE_LINE_MAX];
	dc_line parsed;

	*key_len = 0;
	if (len + 1 > sizeof(buf))
		return cwi_fail(CACHEW_ECORRUPT, "a line of %zu bytes (at most "
		    "%d)", len + 1, CWI_DCACHE_LINE_MAX);
	if (memchr(line, '\0', len) != NULL || memchr(line, '\n', len) != NULL)
		return cwi_fail(CACHEW_ECORRUPT, "a line holds a NUL or a "
		    "newline");
	memcpy(buf, line, len);
	buf[len] = '\0';
	if (!parse_line(buf, &parsed))
		return cwi_fail(CACHEW_ECORRUPT, "not a planner line: "
		    "\"%.48s%s\"", buf, len > 48 ? "..." : "");
	*key_len = parsed.is_storage ? strlen(KEY_STORAGE) - 1
				     : KEY_DATASET_LEN;
	return CACHEW_OK;
}

static cachew_err entry_add(cwi_dcache *dc, const dc_entry *e);

/* Takes a parsed line in (dc->lock held). */
static cachew_err
line_take(cwi_dcache *dc, const dc_line *l)
{
	if (l->is_storage) {
		dc->storage = l->storage;
		dc->probed = true;
		return CACHEW_OK;
	}
	return entry_add(dc, &l->entry);
}

cachew_err
cwi_dcache_save(cwi_dcache *dc, cwi_strbuf *sb)
{
	pthread_mutex_lock(&dc->lock);
	if (dc->probed)
		put_storage(sb, &dc->storage);
	for (size_t i = 0; i < dc->n; i++)
		put_entry(sb, &dc->v[i]);
	pthread_mutex_unlock(&dc->lock);
	return sb->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}

/* Calls fn on each '\n'-terminated line of text (a last line without
 * one counts too), with its number from 1, until fn fails. */
static cachew_err
each_line(const char *text, size_t len,
    cachew_err (*fn)(void *, const char *, size_t, size_t), void *arg)
{
	size_t at = 0, lineno = 0;
	cachew_err rv = CACHEW_OK;

	while (rv == CACHEW_OK && at < len) {
		const char *nl = memchr(text + at, '\n', len - at);
		size_t n = nl != NULL ? (size_t)(nl - (text + at)) : len - at;

		rv = fn(arg, text + at, n, ++lineno);
		at += n + 1;
	}
	return rv;
}

static cachew_err
check_one(void *arg, const char *line, size_t len, size_t lineno)
{
	size_t key_len;

	(void)arg;
	if (cwi_dcache_line_check(line, len, &key_len) != CACHEW_OK)
		return cwi_fail(CACHEW_ECORRUPT, "planner state, line %zu: %s",
		    lineno, cachew_errmsg());
	return CACHEW_OK;
}

static cachew_err
take_one(void *arg, const char *line, size_t len, size_t lineno)
{
	char buf[CWI_DCACHE_LINE_MAX];
	dc_line parsed;

	memcpy(buf, line, len);
	buf[len] = '\0';
	if (!parse_line(buf, &parsed))
		return cwi_fail(CACHEW_ECORRUPT, "planner state, line %zu: "
		    "does not parse", lineno);
	return line_take(arg, &parsed);
}

cachew_err
cwi_dcache_load(cwi_dcache *dc, const char *text, size_t len)
{
	cachew_err rv = each_line(text, len, check_one, NULL);

	if (rv != CACHEW_OK)
		return rv;
	pthread_mutex_lock(&dc->lock);
	rv = each_line(text, len, take_one, dc);
	pthread_mutex_unlock(&dc->lock);
	return rv;
}

cachew_err
cwi_dcache_import(cwi_dcache *dc, const char *path, bool *found)
{
	char line[CWI_DCACHE_LINE_MAX];
	size_t lineno = 0;
	FILE *f;
	cachew_err rv = CACHEW_OK;

	*found = false;
	f = fopen(path, "r");
	if (f == NULL)
		return errno == ENOENT
		    ? CACHEW_OK
		    : cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	*found = true;
	pthread_mutex_lock(&dc->lock);
	while (rv == CACHEW_OK && fgets(line, sizeof(line), f) != NULL) {
		dc_line parsed;

		lineno++;
		line[strcspn(line, "\n")] = '\0';
		/* Lenient, as those versions were: a line that does not
		 * parse is skipped. */
		if (parse_line(line, &parsed) &&
		    (parsed.is_storage || dc->n < CWI_DCACHE_MAX_DATASETS))
			rv = line_take(dc, &parsed);
		else
			cwi_log(CACHEW_LOG_WARN, "autocache",
			    "%s:%zu: skipping a line that does not parse",
			    path, lineno);
	}
	pthread_mutex_unlock(&dc->lock);
	if (rv == CACHEW_OK && ferror(f))
		rv = cwi_fail(CACHEW_EIO, "%s: read failed", path);
	fclose(f);
	return rv;
}

/* ---- datasets ------------------------------------------------------------ */

static dc_entry *
entry_find(cwi_dcache *dc, const cachew_fingerprint *fp)
{
	for (size_t i = 0; i < dc->n; i++)
		if (memcmp(&dc->v[i].fp, fp, sizeof(*fp)) == 0)
			return &dc->v[i];
	return NULL;
}

static cachew_err
entry_add(cwi_dcache *dc, const dc_entry *e)
{
	dc_entry *old = entry_find(dc, &e->fp);

	if (old != NULL) {
		*old = *e;
		return CACHEW_OK;
	}
	if (dc->n == dc->cap) {
		size_t cap = dc->cap ? 2 * dc->cap : 16;
		dc_entry *v = realloc(dc->v, cap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		dc->v = v;
		dc->cap = cap;
	}
	dc->v[dc->n++] = *e;
	return CACHEW_OK;
}

static dc_entry *
entry_get(cwi_dcache *dc, const cachew_fingerprint *fp)
{
	dc_entry e, *found = entry_find(dc, fp);

	if (found != NULL)
		return found;
	if (dc->n >= CWI_DCACHE_MAX_DATASETS)
		return NULL;
	memset(&e, 0, sizeof(e));
	e.fp = *fp;
	e.candidate = -1;
	if (entry_add(dc, &e) != CACHEW_OK)
		return NULL;
	return &dc->v[dc->n - 1];
}

/* ---- create / destroy ---------------------------------------------------- */

cachew_err
cwi_dcache_create(cwi_dcache **out, const cwi_dcache_config *cfg)
{
	cwi_dcache *dc = calloc(1, sizeof(*dc));
	cachew_err rv;

	*out = NULL;
	if (dc == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&dc->lock, NULL);
	cwi_ac_config_default(&dc->ac);
	rv = cwi_ac_parse(&dc->ac, cfg->policy != NULL ? cfg->policy
						     : "default");
	if (rv != CACHEW_OK)
		goto fail;
	dc->ac.allow_frozen_random = cfg->allow_frozen_random;
	dc->capacity = cfg->capacity_bytes;
	dc->default_epochs = cfg->default_epochs > 0 ? cfg->default_epochs : 10;
	dc->probe_bytes = cfg->probe_bytes > 0 ? cfg->probe_bytes : 64u << 20;
	if (cfg->root == NULL) {
		rv = cwi_fail(CACHEW_EINVAL, "autocache: no cache root");
		goto fail;
	}
	rv = cwi_cache_root_open(&dc->root, cfg->root, cfg->capacity_bytes);
	if (rv != CACHEW_OK)
		goto fail;
	*out = dc;
	return CACHEW_OK;
fail:
	cwi_dcache_destroy(dc);
	return rv;
}

void
cwi_dcache_destroy(cwi_dcache *dc)
{
	if (dc == NULL)
		return;
	cwi_cache_root_close(dc->root);
	free(dc->v);
	pthread_mutex_destroy(&dc->lock);
	free(dc);
}

void
cwi_dcache_pass_free(cwi_dcache_pass *p)
{
	if (p == NULL)
		return;
	cachew_free(p->graph);
	p->graph = NULL;
	p->graph_len = 0;
}

/* ---- passes -------------------------------------------------------------- */

static bool
eligible(const cwi_dcache *dc, const cwi_ac_candidate *c)
{
	return !c->random_upstream || dc->ac.allow_frozen_random;
}

static bool
is_cached(cwi_dcache *dc, const cwi_node *n)
{
	cwi_cache_manifest *m = NULL;
	bool yes = cwi_cache_lookup(dc->root, cwi_node_fp(n), &m) == CACHEW_OK;

	cwi_cache_manifest_free(m);
	cwi_clear_errmsg();
	return yes;
}

/* The graph a pass runs, as msgpack, and its split units. */
static cachew_err
pass_graph(cwi_dcache *dc, cwi_node *top, const cwi_ac_candidate *c,
    cwi_ac_mode mode, cwi_dcache_pass *pass)
{
	cwi_node *g = NULL;
	cwi_split_plan *sp = NULL;
	void *buf = NULL;
	size_t len = 0;
	cachew_err rv;

	if (mode == CWI_AC_PUT)
		rv = cwi_cache_plan_put(top, c->node, cwi_cache_root_path(dc->root),
		    pass->write_id, &g);
	else
		rv = cwi_cache_plan_get(top, c->node, cwi_cache_root_path(dc->root),
		    &g);
	if (rv == CACHEW_OK && mode == CWI_AC_GET) {
		/* Split by cache chunk now. */
		rv = cwi_split_plan_create(&sp, g);
		if (rv == CACHEW_OK)
			pass->units = sp->units;
		cwi_split_plan_destroy(sp);
	}
	if (rv == CACHEW_OK)
		rv = cachew_dataset_to_msgpack(g, &buf, &len);
	cachew_dataset_release(g);
	if (rv != CACHEW_OK)
		return rv;
	pass->graph = buf;
	pass->graph_len = len;
	return CACHEW_OK;
}

static cachew_err
copy_graph(const uint8_t *graph, size_t len, cwi_dcache_pass *pass)
{
	pass->graph = malloc(len > 0 ? len : 1);
	if (pass->graph == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	memcpy(pass->graph, graph, len);
	pass->graph_len = len;
	return CACHEW_OK;
}

/* The mode and point of the next pass of a planned dataset. */
static void
choose(cwi_dcache *dc, dc_entry *e, const cwi_ac_plan *plan,
    cwi_dcache_pass *pass)
{
	int nearest = -1;

	pass->mode = CWI_AC_PROFILE;
	pass->candidate = -1;
	if (dc->ac.kind == CWI_AC_FIX_COMPUTE ||
	    (e->decided && e->choice == CWI_AC_CHOICE_COMPUTE) || e->failed) {
		pass->mode = CWI_AC_COMPUTE;
		snprintf(pass->event, sizeof(pass->event), "compute: %s",
		    e->failed ? "caching failed before" : e->decided
			? "the decision was to compute"
			: "policy compute");
		return;
	}
	/* A cache that exists is read at once: the decided point, or else
	 * the eligible cached point nearest the end (least compute after). */
	bool cached[CWI_AC_MAX_CANDIDATES] = {false};

	for (size_t k = 0; k < plan->ncand; k++) {
		cached[k] = eligible(dc, &plan->cand[k]) &&
			    is_cached(dc, plan->cand[k].node);
		if (cached[k])
			nearest = (int)k;
	}
	if (e->decided && e->candidate >= 0 &&
	    (size_t)e->candidate < plan->ncand && cached[e->candidate])
		nearest = e->candidate;
	if (nearest >= 0) {
		pass->mode = CWI_AC_GET;
		pass->candidate = nearest;
		snprintf(pass->event, sizeof(pass->event),
		    "get: reading the cache at %s (node %d)",
		    plan->cand[nearest].full ? "the end" : "a marker",
		    plan->cand[nearest].index);
		return;
	}
	if (!e->decided && (dc->ac.kind == CWI_AC_FIX_SOURCE ||
			       dc->ac.kind == CWI_AC_FIX_FULL)) {
		for (size_t k = 0; k < plan->ncand; k++)
			if (eligible(dc, &plan->cand[k]) &&
			    plan->cand[k].full ==
				(dc->ac.kind == CWI_AC_FIX_FULL)) {
				e->decided = true;
				e->candidate = (int)k;
				e->choice = plan->cand[k].full
				    ? CWI_AC_CHOICE_FULL
				    : CWI_AC_CHOICE_SOURCE;
				snprintf(e->reason, sizeof(e->reason),
				    "policy %s", cwi_ac_kind_name(dc->ac.kind));
				break;
			}
		if (!e->decided) {
			pass->mode = CWI_AC_COMPUTE;
			snprintf(pass->event, sizeof(pass->event),
			    "compute: policy %s has no eligible point",
			    cwi_ac_kind_name(dc->ac.kind));
			return;
		}
	}
	if (e->decided && e->candidate >= 0 &&
	    (size_t)e->candidate < plan->ncand) {
		pass->mode = CWI_AC_PUT;
		pass->candidate = e->candidate;
		do
			pass->write_id = cwi_fresh_seed() & INT64_MAX;
		while (pass->write_id == 0);
		snprintf(pass->event, sizeof(pass->event),
		    "put: writing the cache at %s (node %d), write %016llx",
		    plan->cand[e->candidate].full ? "the end" : "a marker",
		    plan->cand[e->candidate].index,
		    (unsigned long long)pass->write_id);
		return;
	}
	snprintf(pass->event, sizeof(pass->event),
	    "profile: computing and measuring %zu candidate point%s",
	    plan->ncand, plan->ncand == 1 ? "" : "s");
}

/* A mode's estimated pass time (0: unknown): reading the cache, or
 * computing (profile, put and compute all compute; put also writes, which
 * the parts make cheap). */
static double
mode_seconds(const dc_entry *e, cwi_ac_mode m)
{
	return m == CWI_AC_GET ? e->cache_s : e->compute_s;
}

static double
worker_scale(const dc_entry *e, cwi_ac_mode next)
{
	double from, to;

	if (!e->started || e->last_mode == next)
		return 0;
	from = mode_seconds(e, e->last_mode);
	to = mode_seconds(e, next);
	return from > 0 && to > 0 ? to / from : 0;
}

cachew_err
cwi_dcache_pass_start(cwi_dcache *dc, const uint8_t *graph, size_t graph_len,
    uint64_t units, double epochs_left, cwi_dcache_pass *pass)
{
	cachew_dataset *top = NULL;
	cwi_ac_plan *plan = NULL;
	dc_entry *e;
	cachew_err rv;

	memset(pass, 0, sizeof(*pass));
	pass->candidate = -1;
	pass->units = units;
	rv = cachew_dataset_from_msgpack(&top, graph, graph_len);
	if (rv != CACHEW_OK)
		return rv;
	pthread_mutex_lock(&dc->lock);
	e = entry_get(dc, cwi_node_fp(top));
	if (e == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "autocache: too many datasets");
		goto done;
	}
	e->epochs = epochs_left > 0 ? epochs_left : dc->default_epochs;
	if (cwi_autocache_plan(top, &plan) != CACHEW_OK) {
		pass->mode = CWI_AC_COMPUTE;
		snprintf(pass->event, sizeof(pass->event), "compute: %s",
		    cachew_errmsg());
		rv = copy_graph(graph, graph_len, pass);
		goto done;
	}
	choose(dc, e, plan, pass);
	if (pass->mode == CWI_AC_PUT || pass->mode == CWI_AC_GET)
		rv = pass_graph(dc, top, &plan->cand[pass->candidate], pass->mode,
		    pass);
	else
		rv = copy_graph(graph, graph_len, pass);
	if (rv != CACHEW_OK && pass->mode != CWI_AC_PROFILE &&
	    pass->mode != CWI_AC_COMPUTE) {
		/* The rewrite failed (e.g. the cache vanished between the
		 * lookup and the split plan): compute this pass. */
		snprintf(pass->event, sizeof(pass->event),
		    "compute this pass: cannot plan %s: %s",
		    cwi_ac_mode_name(pass->mode), cachew_errmsg());
		pass->mode = CWI_AC_COMPUTE;
		pass->candidate = -1;
		pass->write_id = 0;
		pass->units = units;
		rv = copy_graph(graph, graph_len, pass);
	}
	pass->worker_scale = worker_scale(e, pass->mode);
	e->last_mode = pass->mode;
	e->started = true;
done:
	pthread_mutex_unlock(&dc->lock);
	cwi_autocache_plan_free(plan);
	cachew_dataset_release(top);
	return rv;
}

/* ---- end of a pass ------------------------------------------------------- */

static void
commit_put(cwi_dcache *dc, dc_entry *e, cwi_node *top, const cwi_ac_plan *plan,
    const cwi_dcache_pass *pass, bool complete, char *event, size_t size)
{
	const cwi_node *at = plan->cand[pass->candidate].node;
	cwi_strbuf sb;
	char *pipeline = NULL;
	size_t len;
	uint64_t n = 0;
	cachew_err rv = CACHEW_ECANCELED;

	(void)top;
	if (complete) {
		cwi_strbuf_init(&sb);
		rv = cwi_node_to_string(at, &sb);
		if (rv == CACHEW_OK)
			rv = cwi_strbuf_finish(&sb, &pipeline, &len);
		else
			cwi_strbuf_free(&sb);
		if (rv == CACHEW_OK)
			rv = cwi_cache_parts_commit(dc->root, cwi_node_fp(at),
			    pipeline, pass->write_id, pass->units, &n);
		cachew_free(pipeline);
	}
	if (rv == CACHEW_OK || rv == CACHEW_EEXIST) {
		snprintf(event, size, "put: committed the cache (%llu elements); "
				      "the next pass reads it",
		    (unsigned long long)n);
		return;
	}
	(void)cwi_cache_parts_abort(dc->root, cwi_node_fp(at), pass->write_id);
	if (!complete) {
		snprintf(event, size, "put: the pass ended early; its parts are "
				      "removed and the next pass writes again");
		return;
	}
	e->put_failures++;
	if (e->put_failures >= DC_COMMIT_TRIES)
		e->failed = true;
	snprintf(event, size, "put: commit failed (%s)%s", cachew_errmsg(),
	    e->failed ? "; computing from now on" : "; writing again next pass");
	snprintf(e->reason, sizeof(e->reason), "commit failed: %s",
	    cachew_errmsg());
}

/* Bytes held by other caches under a bounded root. */
static uint64_t
used_bytes(cwi_dcache *dc)
{
	cwi_cache_entry *v = NULL;
	size_t n = 0;
	uint64_t sum = 0;

	if (dc->capacity == 0 || cwi_cache_list(dc->root, &v, &n) != CACHEW_OK)
		return 0;
	for (size_t i = 0; i < n; i++)
		sum += v[i].bytes;
	cwi_cache_entries_free(v, n);
	return sum;
}

/* What a decision needs besides the profile: the storage, its capacity,
 * the parallelism and the passes left. */
static void
set_context(cwi_dcache *dc, const dc_entry *e, cwi_ac_inputs *in,
    double parallelism)
{
	in->storage = dc->storage;
	in->storage.capacity_bytes = dc->capacity;
	in->storage.used_bytes = used_bytes(dc);
	in->parallelism = parallelism > 0 ? parallelism : 1;
	in->epochs_after = e->epochs > 1 ? e->epochs - 1 : 0;
	in->current_left = 0;
}

/* A decision taken: what the next passes do and what it assumed. */
static void
record(dc_entry *e, const cwi_ac_inputs *in, const cwi_ac_decision *d)
{
	e->decided = true;
	e->choice = d->choice;
	e->candidate = d->candidate;
	e->compute_s = d->compute.epoch_s;
	e->cache_s = d->candidate >= 0 && (size_t)d->candidate < d->n
	    ? d->cache[d->candidate].epoch_s
	    : 0;
	e->npoints = in->n;
	memcpy(e->points, in->point, in->n * sizeof(in->point[0]));
}

static void
decide_profile(cwi_dcache *dc, dc_entry *e, const cwi_ac_plan *plan,
    const cwi_ac_counter *ops, size_t nops, double parallelism, char *event,
    size_t size)
{
	cwi_ac_inputs in;
	cwi_ac_decision d;
	double row_bytes = 0;
	cachew_err rv;

	memset(&in, 0, sizeof(in));
	in.n = plan->ncand;
	in.cand = plan->cand;
	rv = cwi_autocache_measure(plan, ops, nops, 1.0, &in);
	if (rv != CACHEW_OK) {
		snprintf(event, size, "profile: nothing to decide on yet (%s)",
		    cachew_errmsg());
		return;
	}
	for (size_t k = 0; k < in.n; k++)
		if (in.point[k].row_bytes > row_bytes)
			row_bytes = in.point[k].row_bytes;
	if (!dc->probed) {
		cwi_cache_probe_result pr;
		size_t eb = row_bytes >= 1 ? (size_t)row_bytes : 1;
		/* Enough elements to see the per-element cost, no more:
		 * 64 MiB of 8-byte rows would take seconds. */
		uint64_t bytes = (uint64_t)eb * 200000u;
		if (bytes > dc->probe_bytes)
			bytes = dc->probe_bytes;
		if (bytes < (4u << 20) && dc->probe_bytes >= (4u << 20))
			bytes = 4u << 20;
		rv = cwi_cache_probe(dc->root, eb, bytes, &pr);
		if (rv != CACHEW_OK) {
			snprintf(event, size,
			    "profile: cannot measure the cache storage (%s); "
			    "computing",
			    cachew_errmsg());
			e->decided = true;
			e->choice = CWI_AC_CHOICE_COMPUTE;
			e->candidate = -1;
			snprintf(e->reason, sizeof(e->reason),
			    "storage probe failed");
			return;
		}
		dc->storage.read_mb_per_s = pr.read_mb_per_s;
		dc->storage.read_rows_per_s = pr.read_elements_per_s;
		dc->storage.write_mb_per_s = pr.write_mb_per_s;
		dc->probed = true;
	}
	set_context(dc, e, &in, parallelism);
	if (dc->ac.kind == CWI_AC_CACHEW)
		cwi_autocache_decide_cachew(&dc->ac, &in, &d);
	else
		cwi_autocache_decide(&dc->ac, &in, &d);
	record(e, &in, &d);
	snprintf(e->reason, sizeof(e->reason), "%s", d.reason);
	snprintf(event, size, "decided %s: %s", cwi_ac_choice_name(d.choice),
	    d.reason);
}

/* After a COMPUTE pass (which runs the registered pipeline, so its
 * counters map onto the plan): when what computing costs moved more than
 * `drift` from what the decision assumed (the input got larger or
 * slower), the policy decides again on the new profile. Our policy only. */
static void
revisit_compute(cwi_dcache *dc, dc_entry *e, const cwi_ac_plan *plan,
    const cwi_ac_counter *ops, size_t nops, double parallelism, char *event,
    size_t size)
{
	cwi_ac_inputs now, assumed;
	cwi_ac_decision d;
	char why[160];

	if (dc->ac.kind != CWI_AC_DEFAULT || !dc->probed ||
	    e->npoints != plan->ncand)
		return;
	memset(&now, 0, sizeof(now));
	now.n = plan->ncand;
	now.cand = plan->cand;
	if (cwi_autocache_measure(plan, ops, nops, 1.0, &now) != CACHEW_OK) {
		cwi_clear_errmsg();
		return;
	}
	set_context(dc, e, &now, parallelism);
	assumed = now;
	memcpy(assumed.point, e->points, e->npoints * sizeof(e->points[0]));
	if (!cwi_autocache_drifted(&dc->ac, &assumed, &now, why, sizeof(why)))
		return;
	cwi_autocache_decide(&dc->ac, &now, &d);
	snprintf(event, size, "compute: %s: %s %s: %s", why,
	    d.choice == e->choice ? "decision stands" : "decided again",
	    cwi_ac_choice_name(d.choice), d.reason);
	record(e, &now, &d);
	snprintf(e->reason, sizeof(e->reason), "revisited: %.600s", d.reason);
}

/* The per-row read time (ns) the storage rates imply for rows of
 * row_bytes: the slower of bandwidth and per-row overhead. */
static double
read_ns(const cwi_ac_storage *st, double row_bytes)
{
	double by_bytes = st->read_mb_per_s > 0
	    ? row_bytes / (st->read_mb_per_s * 1e6) * 1e9
	    : 0;
	double by_rows = st->read_rows_per_s > 0 ? 1e9 / st->read_rows_per_s
						 : 0;

	return by_bytes > by_rows ? by_bytes : by_rows;
}

/* After a GET pass: when reading the cache took more than `drift` away
 * from what the decision assumed, the storage rates are corrected to what
 * was measured and the policy decides again with the cache counted as
 * existing; a different choice (computing, as a shared file system that
 * slowed down makes best) applies from the next pass. Only our policy
 * revisits: Cachew's rule and the fixed ones never do. */
static void
revisit(cwi_dcache *dc, dc_entry *e, const cwi_ac_plan *plan, int k,
    const cwi_ac_counter *ops, size_t nops, double parallelism, char *event,
    size_t size)
{
	const char *suffix = ":cache_get";
	uint64_t elements = 0, busy = 0;
	double assumed, measured, rel;
	cwi_ac_inputs in;
	cwi_ac_decision d;

	if (dc->ac.kind != CWI_AC_DEFAULT || !dc->probed || k < 0 ||
	    (size_t)k >= e->npoints || e->npoints != plan->ncand)
		return;
	for (size_t i = 0; i < nops; i++) {
		size_t n = strlen(ops[i].name), ls = strlen(suffix);
		if (n > ls && strcmp(ops[i].name + n - ls, suffix) == 0) {
			elements += ops[i].elements;
			busy += ops[i].busy_ns;
		}
	}
	assumed = read_ns(&dc->storage, e->points[k].row_bytes);
	if (elements == 0 || busy == 0 || assumed <= 0)
		return;
	measured = (double)busy / (double)elements;
	rel = measured / assumed - 1;
	if (rel <= dc->ac.drift && rel >= -dc->ac.drift)
		return;
	/* What the reads showed, as rates: both bounds at the measured
	 * per-row time. */
	dc->storage.read_mb_per_s = e->points[k].row_bytes / measured * 1e3;
	dc->storage.read_rows_per_s = 1e9 / measured;
	memset(&in, 0, sizeof(in));
	in.n = plan->ncand;
	in.cand = plan->cand;
	memcpy(in.point, e->points, e->npoints * sizeof(e->points[0]));
	in.point[k].cached = true;
	set_context(dc, e, &in, parallelism);
	cwi_autocache_decide(&dc->ac, &in, &d);
	snprintf(event, size,
	    "get: reading took %.0f ns per row, the decision assumed %.0f "
	    "(%+.0f%%): %s %s",
	    measured, assumed, rel * 100,
	    d.choice == e->choice && d.candidate == e->candidate
		? "decision stands:"
		: "decided again:",
	    d.reason);
	if (d.choice == e->choice && d.candidate == e->candidate)
		return;
	in.point[k].cached = false; /* the profile, as assumed */
	record(e, &in, &d);
	snprintf(e->reason, sizeof(e->reason), "revisited: %.600s", d.reason);
}

void
cwi_dcache_pass_end(cwi_dcache *dc, const uint8_t *graph, size_t graph_len,
    const cwi_dcache_pass *pass, bool complete, const cwi_ac_counter *ops,
    size_t nops, double parallelism, char *event, size_t event_size)
{
	cachew_dataset *top = NULL;
	cwi_ac_plan *plan = NULL;
	char scratch[1];
	dc_entry *e;

	if (event == NULL) {
		event = scratch;
		event_size = sizeof(scratch);
	}
	event[0] = '\0';
	if (cachew_dataset_from_msgpack(&top, graph, graph_len) != CACHEW_OK)
		return;
	if (cwi_autocache_plan(top, &plan) != CACHEW_OK) {
		cachew_dataset_release(top);
		return;
	}
	pthread_mutex_lock(&dc->lock);
	e = entry_get(dc, cwi_node_fp(top));
	if (e == NULL)
		goto done;
	if (pass->mode == CWI_AC_PUT && pass->candidate >= 0 &&
	    (size_t)pass->candidate < plan->ncand)
		commit_put(dc, e, top, plan, pass, complete, event, event_size);
	else if (pass->mode == CWI_AC_PROFILE && !e->decided && complete)
		decide_profile(dc, e, plan, ops, nops, parallelism, event,
		    event_size);
	else if (pass->mode == CWI_AC_GET && complete && e->decided)
		revisit(dc, e, plan, pass->candidate, ops, nops, parallelism,
		    event, event_size);
	else if (pass->mode == CWI_AC_COMPUTE && complete && e->decided &&
		 e->choice == CWI_AC_CHOICE_COMPUTE && !e->failed)
		revisit_compute(dc, e, plan, ops, nops, parallelism, event,
		    event_size);
done:
	pthread_mutex_unlock(&dc->lock);
	cwi_autocache_plan_free(plan);
	cachew_dataset_release(top);
}

cachew_err
cwi_dcache_describe(cwi_dcache *dc, cwi_strbuf *sb)
{
	char hex[33];

	pthread_mutex_lock(&dc->lock);
	for (size_t i = 0; i < dc->n; i++) {
		const dc_entry *e = &dc->v[i];
		cachew_fingerprint_hex(&e->fp, hex);
		cwi_strbuf_printf(sb, "%s %s %s %s\n", hex,
		    e->failed ? "failed"
			      : e->decided ? "decided" : "profiling",
		    cwi_ac_choice_name(e->choice), e->reason);
	}
	pthread_mutex_unlock(&dc->lock);
	return sb->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}
