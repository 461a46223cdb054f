/*
 * dispatcher_server.c - the dispatcher role: the state machine of
 * dispatcher/dispatcher_state.c behind a listener, a lock and a ticker.
 *
 * Every request is decoded on the transport's thread, handled under d->lock
 * with the current time, and answered after the lock is released. A ticker
 * thread times out silent workers and clients every 50 ms, which also runs
 * the policy engine's decision interval; the pool target that follows goes
 * to the provisioner (src/provision/provision.h) after the lock is released.
 * Malformed requests reset the peer's connection (cwi_request_reject) with
 * a logged reason; the process stays up.
 *
 * Locking: d->lock around every call into the state machine; nothing else
 * is locked while it is held (the events file is written inside the state
 * machine's calls, under the lock, which keeps its lines in order). The
 * provisioner is called without d->lock: by the ticker (set_target), and
 * by status requests under d->prov_lock, which its destroy also takes so
 * that no status call runs into it. The two locks are never nested.
 */
#include "../service.h"

#include "dispatcher_autocache.h"
#include "dispatcher_state.h"
#include "../service_rpc.h"
#include "../../cache/cache.h"
#include "../../provision/provision.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct cwi_dispatcher_server {
	cwi_service_config cfg;
	cwi_dispatcher *state;
	cwi_listener *listener;
	FILE *events;
	bool events_owned;
	pthread_mutex_t lock;
	pthread_t ticker;
	bool ticker_started;
	atomic_bool stop;
	/* The ticker naps on tick_cond (with tick_lock) so a stop ends its
	 * nap at once: an embedded service stops at exit. */
	pthread_mutex_t tick_lock;
	pthread_cond_t tick_cond;
	cwi_provisioner *prov;
	pthread_mutex_t prov_lock; /* status calls vs destroy */
	uint32_t prov_sent; /* last target handed to prov */
	bool prov_sent_any;
	/* Autocaching (NULL without a cache root). pass_lock orders planning
	 * a pass after the ends of earlier ones; never held with d->lock
	 * taken first. */
	cwi_dcache *dcache;
	pthread_mutex_t pass_lock;
	/* Time the dispatcher itself did not run (see disp_now). */
	_Atomic uint64_t paused_ns;
	uint64_t last_tick_ns; /* the ticker's, on cwi_now_ns */
	cwi_dispatcher_job_hook job_hook; /* set before clients come */
	void *job_hook_arg;
};

/*
 * The dispatcher's clock: cwi_now_ns() less the time the process was not
 * running (SIGSTOP, a debugger, a suspended VM) or its ticker was starved
 * for long. While the dispatcher does not run it hears from nobody, so
 * without this every worker and client would be declared dead the moment
 * it runs again. The embedded service met it on every Ctrl-Z of a
 * training program longer than the worker timeout: its only worker was
 * dropped, and the iterator failed with "task 1 was stopped".
 */
static uint64_t
disp_now(cwi_dispatcher_server *d)
{
	return cwi_now_ns() - atomic_load(&d->paused_ns);
}

/* Ticks come every TICK_MS; a gap longer than PAUSE_MIN_MS between two
 * is counted as a pause (beyond one tick). */
#define TICK_MS 50
#define PAUSE_MIN_MS 1000

static void
note_pause(cwi_dispatcher_server *d)
{
	uint64_t now = cwi_now_ns(), gap;

	if (now - d->last_tick_ns > (uint64_t)PAUSE_MIN_MS * 1000000u) {
		gap = now - d->last_tick_ns - (uint64_t)TICK_MS * 1000000u;
		atomic_fetch_add(&d->paused_ns, gap);
		cwi_log(CACHEW_LOG_WARN, "dispatcher",
		    "event=paused gap_ms=%llu action=\"timeouts extended by "
		    "the gap\"",
		    (unsigned long long)(gap / 1000000u));
	}
	d->last_tick_ns = now;
}

/* The server's state of one autocaching pass (a job's cwi_job_pass ctx). */
typedef struct srv_pass {
	cwi_dcache_pass pass;
	uint8_t *graph; /* the dataset's graph, as registered */
	size_t graph_len;
} srv_pass;

static void
srv_pass_free(void *ctx)
{
	srv_pass *sp = ctx;

	if (sp == NULL)
		return;
	cwi_dcache_pass_free(&sp->pass);
	free(sp->graph);
	free(sp);
}

/* Hands the passes that ended to the planner (commits, decisions), then
 * records what it did. Called with pass_lock held, d->lock not. */
static void
finish_passes(cwi_dispatcher_server *d)
{
	cwi_pass_end *v = NULL;
	size_t n;

	pthread_mutex_lock(&d->lock);
	n = cwi_dispatcher_take_pass_ends(d->state, &v);
	pthread_mutex_unlock(&d->lock);
	for (size_t i = 0; i < n; i++) {
		srv_pass *sp = v[i].ctx;
		cwi_ac_counter *ops = calloc(v[i].nops + 1, sizeof(*ops));
		char event[768];

		for (size_t k = 0; ops != NULL && k < v[i].nops; k++) {
			ops[k].name = v[i].ops[k].name;
			ops[k].elements = v[i].ops[k].elements;
			ops[k].bytes = v[i].ops[k].bytes;
			ops[k].busy_ns = v[i].ops[k].busy_ns;
		}
		cwi_dcache_pass_end(d->dcache, sp->graph, sp->graph_len,
		    &sp->pass, v[i].complete, ops, ops != NULL ? v[i].nops : 0,
		    v[i].workers > 0 ? v[i].workers : 1, event, sizeof(event));
		free(ops);
		if (event[0] != '\0') {
			cwi_log(CACHEW_LOG_INFO, "dispatcher",
			    "event=autocache job=%llu %s",
			    (unsigned long long)v[i].job_id, event);
			pthread_mutex_lock(&d->lock);
			cwi_dispatcher_autocache_event(d->state, disp_now(d),
			    v[i].job_id, NULL, event);
			pthread_mutex_unlock(&d->lock);
		}
		srv_pass_free(sp);
	}
	cwi_dispatcher_pass_ends_free(v, n);
}

/* A job request that would create a job: plan its pass (I/O) without
 * d->lock, then handle the request with the plan offered. */
static void
handle_job_request(cwi_dispatcher_server *d, const cwi_pmsg *req,
    cwi_pmsg *rep)
{
	cwi_job_pass jp;
	srv_pass *sp = NULL;
	uint8_t *graph = NULL;
	size_t len = 0;
	uint64_t units = 0;
	bool wants;

	memset(&jp, 0, sizeof(jp));
	pthread_mutex_lock(&d->pass_lock);
	finish_passes(d); /* the previous pass's commit comes first */
	pthread_mutex_lock(&d->lock);
	wants = cwi_dispatcher_job_wants_pass(d->state,
	    &req->u.job_get_or_create, &graph, &len, &units);
	pthread_mutex_unlock(&d->lock);
	if (wants && (sp = calloc(1, sizeof(*sp))) != NULL) {
		sp->graph = graph;
		sp->graph_len = len;
		graph = NULL;
		if (cwi_dcache_pass_start(d->dcache, sp->graph, sp->graph_len,
			units, 0, &sp->pass) == CACHEW_OK) {
			jp.graph = sp->pass.graph;
			jp.graph_len = sp->pass.graph_len;
			jp.units = sp->pass.units;
			jp.worker_scale = sp->pass.worker_scale;
			snprintf(jp.mode, sizeof(jp.mode), "%s",
			    cwi_ac_mode_name(sp->pass.mode));
			snprintf(jp.event, sizeof(jp.event), "%s",
			    sp->pass.event);
			jp.ctx = sp;
			sp->pass.graph = NULL; /* the job's now */
			sp->pass.graph_len = 0;
		} else {
			cwi_log(CACHEW_LOG_WARN, "dispatcher",
			    "event=autocache_unplanned reason=\"%s\"",
			    cwi_errmsg_get());
			srv_pass_free(sp);
			sp = NULL;
		}
	}
	free(graph);
	pthread_mutex_lock(&d->lock);
	if (jp.ctx != NULL)
		cwi_dispatcher_offer_pass(d->state, &jp);
	(void)cwi_dispatcher_handle(d->state, disp_now(d), req, rep);
	cwi_dispatcher_offer_pass(d->state, NULL);
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_unlock(&d->pass_lock);
	if (jp.ctx != NULL) {
		/* Not taken: another client created the job meanwhile. */
		free(jp.graph);
		srv_pass_free(jp.ctx);
	}
}

/* Adds the provisioner's side to a status reply (outside d->lock). */
static void
status_provisioner(cwi_dispatcher_server *d, cwi_msg_status_reply *st)
{
	cwi_prov_status ps;

	pthread_mutex_lock(&d->prov_lock);
	if (d->prov == NULL) {
		pthread_mutex_unlock(&d->prov_lock);
		return;
	}
	memset(&ps, 0, sizeof(ps));
	cwi_provisioner_status(d->prov, &ps);
	pthread_mutex_unlock(&d->prov_lock);
	ps.last_error[sizeof(ps.last_error) - 1] = '\0';
	st->provisioner = cwi_strdup(ps.kind != NULL ? ps.kind : "?");
	st->provisioner_running = ps.running;
	st->provisioner_requests = ps.requests;
	st->provisioner_failures = ps.failures;
	if (ps.last_error[0] != '\0')
		st->provisioner_error = cwi_strdup(ps.last_error);
}

static void
on_request(void *arg, cwi_request *r)
{
	cwi_dispatcher_server *d = arg;
	cwi_pmsg req, rep;
	bool created, finished;

	if (cwi_rpc_unpack(cwi_request_msg(r), cwi_request_peer(r), &req) !=
	    CACHEW_OK) {
		cwi_request_reject(r, cwi_errmsg_get());
		return;
	}
	if (d->dcache != NULL && req.type == CWI_MSG_JOB_GET_OR_CREATE) {
		handle_job_request(d, &req, &rep);
	} else {
		pthread_mutex_lock(&d->lock);
		(void)cwi_dispatcher_handle(d->state, disp_now(d), &req, &rep);
		pthread_mutex_unlock(&d->lock);
	}
	if (rep.type == CWI_MSG_STATUS_REPLY)
		status_provisioner(d, &rep.u.status_reply);
	created = rep.type == CWI_MSG_JOB_GET_OR_CREATE_REPLY &&
		  rep.u.job_get_or_create_reply.created;
	finished = rep.type == CWI_MSG_OK && rep.u.ok.job_finished;
	cwi_rpc_reply(r, &rep);
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
	if (d->job_hook != NULL && (created || finished))
		d->job_hook(d->job_hook_arg, created);
}

void
cwi_dispatcher_server_set_job_hook(cwi_dispatcher_server *d,
    cwi_dispatcher_job_hook fn, void *arg)
{
	d->job_hook = fn;
	d->job_hook_arg = arg;
}

static void *
ticker_main(void *arg)
{
	cwi_dispatcher_server *d = arg;

	/* From the start: a pause before the first tick counts too. */
	d->last_tick_ns = cwi_now_ns();
	while (!atomic_load(&d->stop)) {
		uint32_t target;

		pthread_mutex_lock(&d->tick_lock);
		if (!atomic_load(&d->stop))
			(void)cwi_cond_wait_ns(&d->tick_cond, &d->tick_lock,
			    (uint64_t)TICK_MS * 1000000u);
		pthread_mutex_unlock(&d->tick_lock);
		if (atomic_load(&d->stop))
			break;
		note_pause(d);
		pthread_mutex_lock(&d->lock);
		cwi_dispatcher_tick(d->state, disp_now(d));
		target = cwi_dispatcher_pool_target(d->state);
		pthread_mutex_unlock(&d->lock);
		if (d->dcache != NULL) {
			pthread_mutex_lock(&d->pass_lock);
			finish_passes(d);
			pthread_mutex_unlock(&d->pass_lock);
		}
		if (d->prov != NULL &&
		    (!d->prov_sent_any || target != d->prov_sent)) {
			cwi_log(CACHEW_LOG_INFO, "dispatcher",
			    "event=pool_target workers=%u", (unsigned)target);
			(void)cwi_provisioner_set_target(d->prov, target);
			d->prov_sent = target;
			d->prov_sent_any = true;
		}
	}
	return NULL;
}

/* The address workers on this host dial: the bound URL, with a wildcard
 * host replaced by the loopback address. */
static void
local_url(const char *bound, char *out, size_t size)
{
	const char *any = "tcp://0.0.0.0:";

	if (strncmp(bound, any, strlen(any)) == 0)
		snprintf(out, size, "tcp://127.0.0.1:%s", bound + strlen(any));
	else
		snprintf(out, size, "%s", bound);
}

/* Creates the provisioner the options name, for workers that register
 * with this dispatcher. */
static cachew_err
start_provisioner(cwi_dispatcher_server *d)
{
	const cwi_service_config *c = &d->cfg;
	char url[CWI_CFG_STR_MAX], bin[CWI_CFG_STR_MAX], logs[CWI_CFG_STR_MAX + 16];
	char hb[24], threads[24];
	const char *args[7];
	size_t nargs = 0;
	cwi_prov_config pc;
	cachew_err rv;
	ssize_t n;

	cwi_prov_config_default(&pc);
	pc.kind = c->provisioner[0] != '\0' ? c->provisioner : "static";
	pc.min_workers = (uint32_t)c->min_workers;
	pc.max_workers = (uint32_t)c->max_workers;
	if (strcmp(pc.kind, "process") == 0) {
		local_url(cwi_listener_url(d->listener), url, sizeof(url));
		pc.dispatcher = url;
		if (c->worker_bin[0] != '\0') {
			pc.cachewd = c->worker_bin;
		} else {
			n = readlink("/proc/self/exe", bin, sizeof(bin) - 1);
			if (n <= 0)
				return cwi_fail(CACHEW_EIO, "process provisioner: "
				    "cannot find this binary (/proc/self/exe: "
				    "%s); set --worker-bin", strerror(errno));
			bin[n] = '\0';
			pc.cachewd = bin;
		}
		snprintf(hb, sizeof(hb), "%lld", (long long)c->heartbeat_ms);
		args[nargs++] = "--heartbeat-ms";
		args[nargs++] = hb;
		if (c->worker_threads > 0) {
			snprintf(threads, sizeof(threads), "%lld",
			    (long long)c->worker_threads);
			args[nargs++] = "--threads";
			args[nargs++] = threads;
		}
		/* The workers it starts load the dispatcher's plug-ins. */
		if (c->plugin[0] != '\0') {
			args[nargs++] = "--plugin";
			args[nargs++] = c->plugin;
		}
		args[nargs] = NULL;
		pc.worker_args = args;
		if (c->worker_log_dir[0] != '\0') {
			pc.log_dir = c->worker_log_dir;
		} else if (c->work_dir[0] != '\0') {
			snprintf(logs, sizeof(logs), "%s/workers", c->work_dir);
			pc.log_dir = logs;
		}
		pc.stop_timeout_ms = (uint32_t)c->worker_stop_timeout_ms;
	}
	if (c->k8s_api_url[0] != '\0')
		pc.api_url = c->k8s_api_url;
	if (c->k8s_token_file[0] != '\0')
		pc.token_file = c->k8s_token_file;
	if (c->k8s_ca_file[0] != '\0')
		pc.ca_file = c->k8s_ca_file;
	if (c->k8s_namespace[0] != '\0')
		pc.k8s_namespace = c->k8s_namespace;
	if (c->k8s_deployment[0] != '\0')
		pc.deployment = c->k8s_deployment;
	pthread_mutex_lock(&d->prov_lock);
	rv = cwi_provisioner_create(&d->prov, &pc);
	pthread_mutex_unlock(&d->prov_lock);
	return rv;
}

static cachew_err
open_events(cwi_dispatcher_server *d)
{
	char path[CWI_CFG_STR_MAX + 32];

	if (strcmp(d->cfg.events_log, "-") == 0) {
		d->events = stderr;
		return CACHEW_OK;
	}
	/* Created with its parents, as docs/cachewd.md says. */
	if (d->cfg.work_dir[0] != '\0' &&
	    cwi_cache_mkdirs(d->cfg.work_dir) != CACHEW_OK)
		return cwi_fail(CACHEW_EIO, "work dir %s: %s", d->cfg.work_dir,
		    cwi_errmsg_get());
	if (d->cfg.events_log[0] != '\0')
		snprintf(path, sizeof(path), "%s", d->cfg.events_log);
	else if (d->cfg.work_dir[0] != '\0')
		snprintf(path, sizeof(path), "%s/events.jsonl", d->cfg.work_dir);
	else
		return CACHEW_OK; /* no events kept */
	d->events = fopen(path, "a");
	if (d->events == NULL)
		return cwi_fail(CACHEW_EIO, "events log %s: %s", path,
		    strerror(errno));
	d->events_owned = true;
	return CACHEW_OK;
}

/* Autocaching is on with a cache root; its state persists in the work
 * dir. */
static cachew_err
start_autocache(cwi_dispatcher_server *d)
{
	const cwi_service_config *c = &d->cfg;
	char state[CWI_CFG_STR_MAX + 32];
	cwi_dcache_config dc;
	cachew_err rv;

	if (c->cache_root[0] == '\0')
		return CACHEW_OK;
	memset(&dc, 0, sizeof(dc));
	dc.root = c->cache_root;
	dc.capacity_bytes = (uint64_t)c->cache_capacity;
	dc.policy = c->autocache[0] != '\0' ? c->autocache : "default";
	dc.allow_frozen_random = c->allow_frozen_random != 0;
	dc.default_epochs = (double)c->expected_epochs;
	if (c->work_dir[0] != '\0') {
		snprintf(state, sizeof(state), "%s/autocache.state", c->work_dir);
		dc.state_path = state;
	}
	rv = cwi_dcache_create(&d->dcache, &dc);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "--cache-root %s: %s", c->cache_root,
		    cwi_errmsg_get());
	cwi_log(CACHEW_LOG_INFO, "dispatcher",
	    "event=autocache_on root=%s policy=%s", c->cache_root, dc.policy);
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_server_start(cwi_dispatcher_server **out,
    const cwi_service_config *cfg)
{
	cwi_dispatcher_server *d = calloc(1, sizeof(*d));
	cwi_dispatcher_config dc;
	cwi_transport_opts topts;
	const char *listen;
	cachew_err rv;

	*out = NULL;
	if (d == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	/* Autocaching plans decode graphs, which name their functions. */
	rv = cwi_service_config_load_plugins(cfg);
	if (rv != CACHEW_OK) {
		free(d);
		return rv;
	}
	d->cfg = *cfg;
	atomic_init(&d->stop, false);
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->prov_lock, NULL);
	pthread_mutex_init(&d->pass_lock, NULL);
	pthread_mutex_init(&d->tick_lock, NULL);
	cwi_cond_init_monotonic(&d->tick_cond);
	rv = open_events(d);
	if (rv != CACHEW_OK)
		goto fail;
	rv = start_autocache(d);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_dispatcher_config_default(&dc);
	dc.worker_timeout_ns = (uint64_t)cfg->worker_timeout_ms * 1000000u;
	dc.client_timeout_ns = (uint64_t)cfg->client_timeout_ms * 1000000u;
	dc.worker_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.client_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.max_lease = (uint32_t)cfg->max_lease;
	dc.event_file = d->events;
	dc.pass_free = srv_pass_free;
	dc.autoscale = cfg->policy_engine;
	rv = cwi_scale_parse(&dc.scale, cfg->scale_policy[0] != '\0'
					    ? cfg->scale_policy : "model");
	if (rv != CACHEW_OK) {
		rv = cwi_fail(rv, "--scale-policy: %s", cwi_errmsg_get());
		goto fail;
	}
	dc.decision_interval_ns = (uint64_t)(cfg->decision_interval_ms > 0
						 ? cfg->decision_interval_ms
						 : cfg->heartbeat_ms) *
	    1000000u;
	dc.scale.window_batches = (uint32_t)cfg->scale_window_batches;
	dc.scale.discard_epoch = (uint32_t)cfg->scale_discard_epoch;
	dc.scale.discard_change = (uint32_t)cfg->scale_discard_change;
	dc.scale.cooldown_ns = (uint64_t)cfg->scale_cooldown_ms * 1000000u;
	dc.min_workers = (uint32_t)cfg->min_workers;
	dc.max_workers = (uint32_t)cfg->max_workers;
	if (dc.max_workers > 0)
		dc.scale.max_workers = dc.max_workers;
	rv = cwi_dispatcher_create(&d->state, &dc);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_transport_opts_init(&topts);
	/* Control messages only; a dataset's graph is the largest. */
	topts.max_msg_size = (size_t)cfg->max_message_bytes <
				     (size_t)CWI_PROTO_MAX_GRAPH + (1u << 20)
				 ? (size_t)cfg->max_message_bytes
				 : (size_t)CWI_PROTO_MAX_GRAPH + (1u << 20);
	listen = cfg->listen[0] != '\0' ? cfg->listen : "tcp://0.0.0.0:7070";
	rv = cwi_listen(&d->listener, listen, &topts, on_request, d);
	if (rv != CACHEW_OK)
		goto fail;
	rv = start_provisioner(d);
	if (rv != CACHEW_OK)
		goto fail;
	if (pthread_create(&d->ticker, NULL, ticker_main, d) != 0) {
		rv = cwi_fail(CACHEW_ENOMEM, "dispatcher: cannot start a thread");
		goto fail;
	}
	d->ticker_started = true;
	cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=listening url=%s "
	    "scale_policy=%s provisioner=%s", cwi_listener_url(d->listener),
	    cfg->scale_policy, d->cfg.provisioner);
	*out = d;
	return CACHEW_OK;
fail:
	cwi_dispatcher_server_stop(d);
	return rv;
}

const char *
cwi_dispatcher_server_url(const cwi_dispatcher_server *d)
{
	return cwi_listener_url(d->listener);
}

void
cwi_dispatcher_server_stop(cwi_dispatcher_server *d)
{
	if (d == NULL)
		return;
	pthread_mutex_lock(&d->tick_lock);
	atomic_store(&d->stop, true);
	pthread_cond_broadcast(&d->tick_cond);
	pthread_mutex_unlock(&d->tick_lock);
	if (d->ticker_started)
		pthread_join(d->ticker, NULL);
	/* The workers it started drain and deregister while the listener
	 * still answers them. */
	pthread_mutex_lock(&d->prov_lock);
	cwi_provisioner_destroy(d->prov);
	d->prov = NULL;
	pthread_mutex_unlock(&d->prov_lock);
	if (d->listener != NULL)
		cwi_listener_close(d->listener);
	cwi_listener_destroy(d->listener);
	cwi_dispatcher_destroy(d->state);
	cwi_dcache_destroy(d->dcache);
	if (d->events_owned)
		fclose(d->events);
	pthread_mutex_destroy(&d->lock);
	pthread_mutex_destroy(&d->prov_lock);
	pthread_mutex_destroy(&d->pass_lock);
	pthread_mutex_destroy(&d->tick_lock);
	pthread_cond_destroy(&d->tick_cond);
	free(d);
}
