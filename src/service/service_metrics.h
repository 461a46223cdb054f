/*
 * service_metrics.h - the daemons' metrics and health endpoints
 * (--metrics-listen): /metrics in Prometheus's text format, /healthz and
 * /readyz (docs/cachewd.md, "Metrics and health").
 */
#ifndef CWI_SERVICE_METRICS_H
#define CWI_SERVICE_METRICS_H

#include "../core/core.h"
#include "../../transports/transport.h"
#include "service_proto.h"

/* What a daemon's endpoints show: render appends the /metrics text;
 * ready returns NULL when the daemon is ready, else the text of a 503
 * (a static string saying why). Both run on a transport thread. */
typedef struct cwi_metrics_source {
	cachew_err (*render)(void *arg, cwi_strbuf *sb);
	const char *(*ready)(void *arg);
	void *arg;
} cwi_metrics_source;

/* Starts serving addr (--metrics-listen; "" = none: *out NULL) with fn,
 * logging event=metrics_listening url=... under `role`; errors name the
 * option. */
cachew_err cwi_metrics_listen(cwi_http_listener **out, const char *addr,
    const char *role, cwi_http_fn fn, void *arg);

/* The reply to a GET of path (cwi_http_fn's contract): /metrics, /healthz
 * (200 "ok" while the process serves), /readyz, or 404. */
int cwi_metrics_reply(const char *path, const cwi_metrics_source *src,
    char **body, size_t *len, const char **type);

/* The dispatcher's families, from its status (workers, pool and
 * provisioner, jobs with their splits, elements, rates, scaling and cache
 * mode), then the process's. */
void cwi_metrics_dispatcher(cwi_strbuf *sb, const cwi_msg_status_reply *st);
/* process_resident_memory_bytes and process_cpu_seconds_total. */
void cwi_metrics_process(cwi_strbuf *sb);

#endif /* CWI_SERVICE_METRICS_H */
