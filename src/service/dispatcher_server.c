/*
 * dispatcher_server.c - the dispatcher role: the state machine of
 * dispatcher/dispatcher_state.c behind a listener, a lock and a ticker.
 *
 * Every request is decoded on the transport's thread, handled under d->lock
 * with the current time, and answered after the lock is released. A ticker
 * thread times out silent workers and clients every 50 ms. Malformed
 * requests reset the peer's connection (cwi_request_reject) with a logged
 * reason; the process stays up.
 *
 * Locking: d->lock around every call into the state machine; nothing else
 * is locked while it is held (the events file is written inside the state
 * machine's calls, under the lock, which keeps its lines in order).
 */
#include "service.h"

#include "dispatcher/dispatcher_state.h"
#include "service_rpc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

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
};

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
	cwi_rpc_reply(r, &rep);
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
}

static void *
ticker_main(void *arg)
{
	cwi_dispatcher_server *d = arg;

	while (!atomic_load(&d->stop)) {
		cwi_sleep_ns(50 * 1000000u);
		pthread_mutex_lock(&d->lock);
		cwi_dispatcher_tick(d->state, cwi_now_ns());
		pthread_mutex_unlock(&d->lock);
	}
	return NULL;
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
	rv = open_events(d);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_dispatcher_config_default(&dc);
	dc.worker_timeout_ns = (uint64_t)cfg->worker_timeout_ms * 1000000u;
	dc.client_timeout_ns = (uint64_t)cfg->client_timeout_ms * 1000000u;
	dc.worker_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.client_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.event_file = d->events;
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
	if (pthread_create(&d->ticker, NULL, ticker_main, d) != 0) {
		rv = cwi_fail(CACHEW_ENOMEM, "dispatcher: cannot start a thread");
		goto fail;
	}
	d->ticker_started = true;
	cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=listening url=%s",
	    cwi_listener_url(d->listener));
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
	if (d->listener != NULL)
		cwi_listener_close(d->listener);
	if (d->ticker_started)
		pthread_join(d->ticker, NULL);
	cwi_listener_destroy(d->listener);
	cwi_dispatcher_destroy(d->state);
	if (d->events_owned)
		fclose(d->events);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
