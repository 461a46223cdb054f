/*
 * dispatcher_metrics.h - the dispatcher's /metrics families that its
 * status reply does not carry (dispatcher_metrics.c).
 */
#ifndef CWI_DISPATCHER_METRICS_H
#define CWI_DISPATCHER_METRICS_H

#include "dispatcher_state.h"
#include "../service_metrics.h"

/* Appends the request latencies (latency[t] for each request type t that
 * has an observation), the time scrapes held the dispatcher's lock
 * (scrape_lock), the scaling decisions and each job's operator rows of
 * m. */
void cwi_dispatcher_metrics_render(cwi_strbuf *sb,
    const cwi_dispatcher_metrics *m, const cwi_histogram *latency,
    const cwi_histogram *scrape_lock);

#endif /* CWI_DISPATCHER_METRICS_H */
