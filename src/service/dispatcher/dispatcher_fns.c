/*
 * dispatcher_fns.c - user functions on workers: what a dataset's graph
 * needs (its functions that are not built in, with the plugin build each
 * came from), what a worker has (worker_register.functions), and so which
 * workers may run a job's tasks (docs/protocol.md, "Dispatcher rules",
 * Functions).
 *
 * A worker lacking one of a dataset's functions never gets a task of its
 * jobs: the graph would not decode there (docs/graph-format.md, section
 * 2). A new job that no live worker can run is refused, naming the
 * function, its plugin and each worker; with no live worker at all it is
 * accepted, and waits for one that can (a pool that is starting, or that
 * the provisioner grows, has none yet).
 *
 * Sizes are small (a handful of functions per graph and per worker), so
 * every check scans. Workers on inproc (the embedded service) share
 * their clients' process, and so every function the clients have.
 */
#include "dispatcher_int.h"
#include "../../pipeline/pipeline.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* Workers a refusal names one by one; the rest are counted. */
#define REFUSAL_MAX_WORKERS 3

/* One reported function as an ident, checked: a plugin's comes with its
 * version (optional) and hash. */
static cachew_err
fn_from_wire(const cwi_fn_info *f, size_t i, cwi_fn_ident *out)
{
	const char *version = f->plugin_version != NULL ? f->plugin_version : "";

	memset(out, 0, sizeof(*out));
	if (f->name == NULL || f->name[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "worker_register: functions[%zu]: "
		    "empty name", i);
	snprintf(out->name, sizeof(out->name), "%s", f->name);
	if (f->plugin == NULL)
		return CACHEW_OK;
	if (!cwi_plugin_text_ok(f->plugin, false) ||
	    !cwi_plugin_text_ok(version, true))
		return cwi_fail(CACHEW_EINVAL, "worker_register: functions[%zu] "
		    "('%s'): plugin name or version is not made of "
		    "[A-Za-z0-9_.+-]", i, out->name);
	if (f->plugin_hash == NULL || strlen(f->plugin_hash) != 32 ||
	    strspn(f->plugin_hash, "0123456789abcdef") != 32)
		return cwi_fail(CACHEW_EINVAL, "worker_register: functions[%zu] "
		    "('%s'): plugin_hash is not 32 lowercase hex digits", i,
		    out->name);
	snprintf(out->plugin, sizeof(out->plugin), "%s", f->plugin);
	snprintf(out->version, sizeof(out->version), "%s", version);
	snprintf(out->hash, sizeof(out->hash), "%s", f->plugin_hash);
	return CACHEW_OK;
}

cachew_err
cwi_fns_of_worker(worker *w, const cwi_msg_worker_register *req)
{
	cachew_err rv = CACHEW_OK;

	if (req->nfunctions == 0)
		return CACHEW_OK;
	w->fns = calloc(req->nfunctions, sizeof(*w->fns));
	if (w->fns == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < req->nfunctions && rv == CACHEW_OK; i++)
		rv = fn_from_wire(&req->functions[i], i, &w->fns[i]);
	if (rv != CACHEW_OK) {
		free(w->fns);
		w->fns = NULL;
		return rv;
	}
	w->nfns = req->nfunctions;
	return CACHEW_OK;
}

cachew_err
cwi_fns_of_dataset(dataset *ds)
{
	cachew_err rv = cwi_graph_user_fns(ds->graph, ds->graph_len, &ds->needs,
	    &ds->nneeds);

	if (rv != CACHEW_OK) {
		char msg[400];
		snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
		return cwi_fail(rv, "dataset_register: %s", msg);
	}
	return CACHEW_OK;
}

static bool
worker_has(const worker *w, const cwi_fn_ident *f)
{
	for (size_t i = 0; i < w->nfns; i++)
		if (cwi_fn_ident_equal(&w->fns[i], f))
			return true;
	return false;
}

/* The first function of ds that w lacks, or NULL. */
static const cwi_fn_ident *
worker_lacks(const worker *w, const dataset *ds)
{
	for (size_t i = 0; i < ds->nneeds; i++)
		if (!worker_has(w, &ds->needs[i]))
			return &ds->needs[i];
	return NULL;
}

bool
cwi_fns_worker_can_run(const worker *w, const dataset *ds)
{
	/* An inproc worker (the embedded service's) can only be reached from
	 * its own process, so its clients are in it too and share its
	 * registry: what it reported at start may predate a plugin loaded
	 * since, but it has every function they have. */
	if (strncmp(w->address, "inproc://", 9) == 0)
		return true;
	return worker_lacks(w, ds) == NULL;
}

uint32_t
cwi_fns_workers_for(const cwi_dispatcher *d, const dataset *ds)
{
	uint32_t n = 0;

	for (size_t i = 0; i < d->workers.n; i++)
		if (!WORKER(d, i)->draining &&
		    cwi_fns_worker_can_run(WORKER(d, i), ds))
			n++;
	return n;
}

/* "worker 2 (tcp://h:p) lacks it (has plugin_example 1.0, build ...)"
 * into sb: what w has instead of `need` ("it" when need is `head`, the
 * function the message names in full). */
static void
describe_lack(cwi_strbuf *sb, const worker *w, const cwi_fn_ident *need,
    const cwi_fn_ident *head)
{
	const cwi_fn_ident *same = NULL;

	for (size_t i = 0; i < w->nfns && same == NULL; i++)
		if (strcmp(w->fns[i].name, need->name) == 0)
			same = &w->fns[i];
	cwi_strbuf_printf(sb, "worker %" PRIu64 " (%s) lacks ", w->id,
	    w->address);
	if (need == head)
		cwi_strbuf_puts(sb, "it");
	else
		cwi_strbuf_printf(sb, "'%s'", need->name);
	if (same == NULL)
		cwi_strbuf_printf(sb, " (has no '%s')", need->name);
	else if (same->plugin[0] == '\0')
		cwi_strbuf_puts(sb, " (has one of no plugin)");
	else
		cwi_strbuf_printf(sb, " (has plugin %s %s, build %.16s)", same->plugin,
		    same->version[0] != '\0' ? same->version : "(no version)",
		    same->hash);
}

cachew_err
cwi_fns_check_job(const cwi_dispatcher *d, const dataset *ds)
{
	const cwi_fn_ident *head = NULL;
	uint32_t live = 0, named = 0;
	char need[256];
	cwi_strbuf sb;
	cachew_err rv;

	if (ds->nneeds == 0)
		return CACHEW_OK;
	for (size_t i = 0; i < d->workers.n; i++) {
		if (WORKER(d, i)->draining)
			continue;
		if (cwi_fns_worker_can_run(WORKER(d, i), ds))
			return CACHEW_OK;
		live++;
	}
	if (live == 0)
		return CACHEW_OK; /* the pool is starting: wait for it */
	/* Error messages hold 511 bytes: the function in full once, then
	 * the first workers briefly. */
	cwi_strbuf_init(&sb);
	for (size_t i = 0; i < d->workers.n; i++) {
		const worker *w = WORKER(d, i);
		if (w->draining)
			continue;
		if (named == REFUSAL_MAX_WORKERS) {
			cwi_strbuf_printf(&sb, "; and %" PRIu32 " more",
			    live - named);
			break;
		}
		if (head == NULL)
			head = worker_lacks(w, ds);
		cwi_strbuf_puts(&sb, named > 0 ? "; " : "");
		describe_lack(&sb, w, worker_lacks(w, ds), head);
		named++;
	}
	rv = cwi_fail(CACHEW_ENOTSUP, "no worker can run dataset %" PRIu64
	    ", which needs function %s: %s. Start workers with the same "
	    "plugin files (cachewd --plugin)", ds->id,
	    cwi_fn_ident_describe(head, need, sizeof(need)),
	    sb.oom || sb.data == NULL ? "out of memory" : sb.data);
	cwi_strbuf_free(&sb);
	return rv;
}
