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
#include "../provision/provision.h"

#include <stdatomic.h>
#include <stdbool.h>

/* A latency histogram in Prometheus's cumulative-bucket form, safe to
 * observe from any thread (relaxed atomics: a scrape may see an
 * observation's count before its sum, never a torn value). The bucket
 * bounds (seconds) are CWI_HIST_BOUNDS: from 100 us, for requests answered
 * from memory, to 10 s, past the default timeouts. */
#define CWI_HIST_NBOUNDS 15
typedef struct cwi_histogram {
	_Atomic uint64_t le[CWI_HIST_NBOUNDS + 1]; /* the last: +Inf */
	_Atomic uint64_t sum_ns;
} cwi_histogram;

/* Adds one observation of ns nanoseconds. */
void cwi_histogram_observe(cwi_histogram *h, uint64_t ns);
/* Whether h has any observation. */
bool cwi_histogram_any(const cwi_histogram *h);
/* Appends h as `name_bucket{labels,le="..."}` lines, then `name_sum` and
 * `name_count` (labels: "" or `key="value"` pairs without braces). The
 * family's HELP and TYPE lines are the caller's (cwi_metrics_family). */
void cwi_metrics_histogram(cwi_strbuf *sb, const char *name,
    const char *labels, const cwi_histogram *h);
/* Appends v as a label value: backslashes, quotes and newlines escaped,
 * as the format wants (a peer's text may hold any of them). */
void cwi_metrics_label_value(cwi_strbuf *sb, const char *v);
/* `# HELP name help` and `# TYPE name type` lines. */
void cwi_metrics_family(cwi_strbuf *sb, const char *name, const char *type,
    const char *help);

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
 * mode) and its provisioner's (ps: the actions by kind; kind NULL: it has
 * none), then the process's. */
void cwi_metrics_dispatcher(cwi_strbuf *sb, const cwi_msg_status_reply *st,
    const cwi_prov_status *ps);
/* process_resident_memory_bytes and process_cpu_seconds_total. */
void cwi_metrics_process(cwi_strbuf *sb);

#endif /* CWI_SERVICE_METRICS_H */
