/*
 * dispatcher_metrics.c - the dispatcher's /metrics families beyond what
 * its status reply carries (service_metrics.c renders those): request
 * latencies by request type, scaling decisions, and each job's operator
 * rows. The state is copied under the dispatcher's lock
 * (cwi_dispatcher_metrics_get); rendering runs without it.
 */
#include "dispatcher_int.h"
#include "dispatcher_metrics.h"

#include <inttypes.h>

static void
render_latency(cwi_strbuf *sb, const cwi_histogram *latency)
{
	static const char name[] = "cachew_dispatcher_request_duration_seconds";

	cwi_metrics_family(sb, name, "histogram", "Time from a request's "
	    "arrival to its reply, the journal's commit included, by request "
	    "type (split_lease, split_ack, heartbeats, ...).");
	for (int t = CWI_MSG_NONE + 1; t < CWI_MSG_NTYPES; t++) {
		char labels[64];

		if (!cwi_histogram_any(&latency[t]))
			continue;
		snprintf(labels, sizeof(labels), "request=\"%s\"",
		    cwi_msg_type_name((cwi_msg_type)t));
		cwi_metrics_histogram(sb, name, labels, &latency[t]);
	}
}

static void
render_scale(cwi_strbuf *sb, const cwi_dispatcher_metrics *m)
{
	cwi_metrics_family(sb, "cachew_scale_decisions_total", "counter",
	    "Scaling decisions, by policy, what they did (up, down: the "
	    "count wanted moved; settled, unsettled: it stayed) and the kind "
	    "of their reason (start, demand, probe, gain, drift, ...).");
	for (size_t i = 0; i < m->nscale; i++)
		cwi_strbuf_printf(sb, "cachew_scale_decisions_total{policy=\"%s\","
		    "decision=\"%s\",reason=\"%s\"} %" PRIu64 "\n",
		    m->scale[i].policy, m->scale[i].decision,
		    cwi_scale_why_name(m->scale[i].why), m->scale[i].n);
}

/* An operator row's name as a label value: names are "<index>:<op>",
 * but a worker's report is a peer's text, so escaped anyway. */
static void
op_series(cwi_strbuf *sb, const char *family, uint64_t job_id,
    const char *op)
{
	cwi_strbuf_printf(sb, "%s{job_id=\"%" PRIu64 "\",operator=\"", family,
	    job_id);
	cwi_metrics_label_value(sb, op);
	cwi_strbuf_puts(sb, "\"} ");
}

typedef double (*op_value_fn)(const cwi_op_counters *c);

static double ov_elements(const cwi_op_counters *c) { return (double)c->elements; }
static double ov_bytes(const cwi_op_counters *c) { return (double)c->bytes; }
static double ov_busy(const cwi_op_counters *c) { return (double)c->busy_ns / 1e9; }

static void
render_ops(cwi_strbuf *sb, const cwi_dispatcher_metrics *m, const char *name,
    const char *help, op_value_fn fn)
{
	cwi_metrics_family(sb, name, "counter", help);
	for (size_t i = 0; i < m->njobs; i++)
		for (size_t k = 0; k < m->jobs[i].nops; k++) {
			op_series(sb, name, m->jobs[i].job_id,
			    m->jobs[i].ops[k].name);
			cwi_strbuf_printf(sb, "%.17g\n", fn(&m->jobs[i].ops[k]));
		}
}

void
cwi_dispatcher_metrics_render(cwi_strbuf *sb, const cwi_dispatcher_metrics *m,
    const cwi_histogram *latency, const cwi_histogram *scrape_lock)
{
	static const char lock[] = "cachew_dispatcher_scrape_lock_seconds";

	render_latency(sb, latency);
	/* Requests wait for the lock a scrape holds: what the endpoint costs
	 * the data path (bench/metrics_cost.py reads it). */
	cwi_metrics_family(sb, lock, "histogram", "Time each /metrics scrape "
	    "held the dispatcher's lock to copy its state (formatting runs "
	    "after, without it).");
	cwi_metrics_histogram(sb, lock, "", scrape_lock);
	render_scale(sb, m);
	render_ops(sb, m, "cachew_job_operator_elements_total", "Elements a "
	    "job's operator produced, summed over its tasks as their workers "
	    "reported them.", ov_elements);
	render_ops(sb, m, "cachew_job_operator_bytes_total", "Payload bytes a "
	    "job's operator produced, summed over its tasks.", ov_bytes);
	render_ops(sb, m, "cachew_job_operator_busy_seconds_total", "Time a "
	    "job's operator spent in its own work, summed over its tasks and "
	    "threads.", ov_busy);
}
