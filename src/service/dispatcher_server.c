/*
 * dispatcher_server.c - the dispatcher role: the state machine of
 * dispatcher/dispatcher_state.c behind a listener, a lock and a ticker.
 *
 * Every request is decoded on the transport's thread, handled under d->lock
 * with the current time, and answered after the lock is released. A ticker
 * thread times out silent workers and clients every 50 ms, which also runs
 * the policy engine's decision interval; the pool target that follows goes
 * to the provisioner (src/policy/provision.h) after the lock is released.
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
#include "service.h"

#include "dispatcher/dispatcher_state.h"
#include "service_rpc.h"
#include "../policy/provision.h"

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
	cwi_provisioner *prov;
	pthread_mutex_t prov_lock; /* status calls vs destroy */
	uint32_t prov_sent; /* last target handed to prov */
	bool prov_sent_any;
};

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

	if (cwi_rpc_unpack(cwi_request_msg(r), cwi_request_peer(r), &req) !=
	    CACHEW_OK) {
		cwi_request_reject(r, cwi_errmsg_get());
		return;
	}
	pthread_mutex_lock(&d->lock);
	(void)cwi_dispatcher_handle(d->state, cwi_now_ns(), &req, &rep);
	pthread_mutex_unlock(&d->lock);
	if (rep.type == CWI_MSG_STATUS_REPLY)
		status_provisioner(d, &rep.u.status_reply);
	cwi_rpc_reply(r, &rep);
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
}

static void *
ticker_main(void *arg)
{
	cwi_dispatcher_server *d = arg;

	while (!atomic_load(&d->stop)) {
		uint32_t target;

		cwi_sleep_ns(50 * 1000000u);
		pthread_mutex_lock(&d->lock);
		cwi_dispatcher_tick(d->state, cwi_now_ns());
		target = cwi_dispatcher_pool_target(d->state);
		pthread_mutex_unlock(&d->lock);
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
	const char *args[5];
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
	if (d->cfg.work_dir[0] != '\0' &&
	    mkdir(d->cfg.work_dir, 0755) != 0 && errno != EEXIST)
		return cwi_fail(CACHEW_EIO, "work dir %s: %s", d->cfg.work_dir,
		    strerror(errno));
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
	d->cfg = *cfg;
	atomic_init(&d->stop, false);
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->prov_lock, NULL);
	rv = open_events(d);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_dispatcher_config_default(&dc);
	dc.worker_timeout_ns = (uint64_t)cfg->worker_timeout_ms * 1000000u;
	dc.client_timeout_ns = (uint64_t)cfg->client_timeout_ms * 1000000u;
	dc.worker_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.client_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.event_file = d->events;
	dc.autoscale = true;
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
	atomic_store(&d->stop, true);
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
	if (d->events_owned)
		fclose(d->events);
	pthread_mutex_destroy(&d->lock);
	pthread_mutex_destroy(&d->prov_lock);
	free(d);
}
