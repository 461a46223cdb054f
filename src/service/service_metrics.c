/*
 * service_metrics.c - the daemons' /metrics, /healthz and /readyz
 * (--metrics-listen): Prometheus's text exposition format (version 0.0.4)
 * rendered from what `cachew status` shows (the dispatcher) or from the
 * worker's own state, plus the process's RSS and CPU time.
 *
 * Labels name jobs by `job_id` (and `job_name` when it has one), never
 * `job`: Prometheus sets `job` on every scraped series itself.
 */
#include "service_metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- exposition ------------------------------------------------------------ */

static void
family(cwi_strbuf *sb, const char *name, const char *type, const char *help)
{
	cwi_strbuf_printf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
	    type);
}

void
cwi_metrics_family(cwi_strbuf *sb, const char *name, const char *type,
    const char *help)
{
	family(sb, name, type, help);
}

/* ---- histograms ------------------------------------------------------------ */

static const double hist_bounds[CWI_HIST_NBOUNDS] = {0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

void
cwi_histogram_observe(cwi_histogram *h, uint64_t ns)
{
	double s = (double)ns / 1e9;
	size_t i = 0;

	/* Counted in its own bucket only; the rendering sums them up. */
	while (i < CWI_HIST_NBOUNDS && s > hist_bounds[i])
		i++;
	atomic_fetch_add_explicit(&h->le[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

bool
cwi_histogram_any(const cwi_histogram *h)
{
	for (size_t i = 0; i <= CWI_HIST_NBOUNDS; i++)
		if (atomic_load_explicit(&h->le[i], memory_order_relaxed) > 0)
			return true;
	return false;
}

void
cwi_metrics_histogram(cwi_strbuf *sb, const char *name, const char *labels,
    const cwi_histogram *h)
{
	const char *sep = labels[0] != '\0' ? "," : "";
	uint64_t cum = 0;

	for (size_t i = 0; i <= CWI_HIST_NBOUNDS; i++) {
		cum += atomic_load_explicit(&h->le[i], memory_order_relaxed);
		if (i < CWI_HIST_NBOUNDS)
			cwi_strbuf_printf(sb, "%s_bucket{%s%sle=\"%g\"} %"
			    PRIu64 "\n", name, labels, sep, hist_bounds[i], cum);
		else
			cwi_strbuf_printf(sb, "%s_bucket{%s%sle=\"+Inf\"} %"
			    PRIu64 "\n", name, labels, sep, cum);
	}
	cwi_strbuf_printf(sb, "%s_sum%s%s%s %.9f\n", name,
	    labels[0] != '\0' ? "{" : "", labels, labels[0] != '\0' ? "}" : "",
	    (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) /
		1e9);
	cwi_strbuf_printf(sb, "%s_count%s%s%s %" PRIu64 "\n", name,
	    labels[0] != '\0' ? "{" : "", labels, labels[0] != '\0' ? "}" : "",
	    cum);
}

void
cwi_metrics_label_value(cwi_strbuf *sb, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\' || *v == '"')
			cwi_strbuf_printf(sb, "\\%c", *v);
		else if (*v == '\n')
			cwi_strbuf_puts(sb, "\\n");
		else
			cwi_strbuf_printf(sb, "%c", *v);
	}
}

/* `name{job_id="N",job_name="..."} ` */
static void
job_series(cwi_strbuf *sb, const char *name, const cwi_job_status *j,
    const char *extra)
{
	cwi_strbuf_printf(sb, "%s{job_id=\"%" PRIu64 "\"", name, j->job_id);
	if (j->name != NULL) {
		cwi_strbuf_puts(sb, ",job_name=\"");
		cwi_metrics_label_value(sb, j->name);
		cwi_strbuf_puts(sb, "\"");
	}
	cwi_strbuf_printf(sb, "%s} ", extra != NULL ? extra : "");
}

void
cwi_metrics_process(cwi_strbuf *sb)
{
	struct rusage ru;
	long pages = 0, page = sysconf(_SC_PAGESIZE);
	FILE *f = fopen("/proc/self/statm", "r");

	if (f != NULL) {
		long size;
		if (fscanf(f, "%ld %ld", &size, &pages) != 2)
			pages = 0;
		fclose(f);
	}
	family(sb, "process_resident_memory_bytes", "gauge",
	    "Resident memory size in bytes.");
	cwi_strbuf_printf(sb, "process_resident_memory_bytes %lld\n",
	    (long long)pages * (page > 0 ? page : 4096));
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		double s = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
		    ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) /
			1e6;
		family(sb, "process_cpu_seconds_total", "counter",
		    "Total user and system CPU time spent in seconds.");
		cwi_strbuf_printf(sb, "process_cpu_seconds_total %.6f\n", s);
	}
}

/* ---- the dispatcher ------------------------------------------------------------ */

static void
dispatcher_workers(cwi_strbuf *sb, const cwi_msg_status_reply *st)
{
	size_t draining = 0;
	uint64_t tasks = 0;

	for (size_t i = 0; i < st->nworkers; i++) {
		draining += st->workers[i].draining;
		tasks += st->workers[i].tasks;
	}
	family(sb, "cachew_workers", "gauge",
	    "Workers registered with the dispatcher, by state.");
	cwi_strbuf_printf(sb, "cachew_workers{state=\"live\"} %zu\n",
	    st->nworkers - draining);
	cwi_strbuf_printf(sb, "cachew_workers{state=\"draining\"} %zu\n",
	    draining);
	family(sb, "cachew_worker_tasks", "gauge",
	    "Tasks the dispatcher has assigned to workers.");
	cwi_strbuf_printf(sb, "cachew_worker_tasks %" PRIu64 "\n", tasks);
}

/* cachew_provisioner_actions_total by action and result: the series of
 * the actions the kind takes (at 0 too, so rate() has a start), and any
 * other that happened. Both labels come from fixed sets. */
static void
provisioner_actions(cwi_strbuf *sb, const cwi_prov_status *ps)
{
	static const char *const result[2] = {"ok", "failed"};

	family(sb, "cachew_provisioner_actions_total", "counter",
	    "Actions the provisioner took, by kind (start, restart, stop: "
	    "worker processes; scale: requests to the Kubernetes API) and "
	    "result (ok, failed as taken).");
	for (int a = 0; a < CWI_PROV_NACTIONS; a++)
		for (int r = 0; r < 2; r++) {
			if (!(ps->action_mask & 1u << a) &&
			    ps->actions[a][r] == 0)
				continue;
			cwi_strbuf_printf(sb, "cachew_provisioner_actions_total"
			    "{action=\"%s\",result=\"%s\"} %" PRIu64 "\n",
			    cwi_prov_action_name((cwi_prov_action)a), result[r],
			    ps->actions[a][r]);
		}
}

static void
dispatcher_pool(cwi_strbuf *sb, const cwi_msg_status_reply *st,
    const cwi_prov_status *ps)
{
	family(sb, "cachew_pool_target_workers", "gauge",
	    "Workers every job together wants within the dispatcher's "
	    "bounds (0 without autoscaling).");
	cwi_strbuf_printf(sb, "cachew_pool_target_workers %" PRIu32 "\n",
	    st->pool_target);
	family(sb, "cachew_provisioner_running_workers", "gauge",
	    "Workers the provisioner runs (process: its live children; "
	    "kubernetes: the replicas the API server acknowledged; static: "
	    "the live registered workers).");
	cwi_strbuf_printf(sb, "cachew_provisioner_running_workers %" PRIu32
	    "\n", st->provisioner_running);
	provisioner_actions(sb, ps);
	family(sb, "cachew_provisioner_failures_total", "counter",
	    "Provisioner failures: actions that failed as taken, and "
	    "workers it started that died or did not stop cleanly.");
	cwi_strbuf_printf(sb, "cachew_provisioner_failures_total %" PRIu64
	    "\n", st->provisioner_failures);
}

/* One family over every job: value(j) per job. */
typedef double (*job_value_fn)(const cwi_job_status *j);

static double jv_elements(const cwi_job_status *j) { return (double)j->elements; }
static double jv_bytes(const cwi_job_status *j) { return (double)j->bytes; }
static double jv_eps(const cwi_job_status *j) { return j->elements_per_s; }
static double jv_clients(const cwi_job_status *j) { return j->clients; }
static double jv_want(const cwi_job_status *j) { return j->want; }
static double jv_granted(const cwi_job_status *j) { return j->granted; }
static double jv_batch(const cwi_job_status *j) { return (double)j->batch_time_ns / 1e9; }
static double jv_wait(const cwi_job_status *j) { return j->client_wait; }
static double jv_hits(const cwi_job_status *j) { return (double)j->cache_hit_bytes; }

static void
job_family(cwi_strbuf *sb, const cwi_msg_status_reply *st, const char *name,
    const char *type, const char *help, job_value_fn fn)
{
	family(sb, name, type, help);
	for (size_t i = 0; i < st->njobs; i++) {
		job_series(sb, name, &st->jobs[i], NULL);
		cwi_strbuf_printf(sb, "%.17g\n", fn(&st->jobs[i]));
	}
}

static void
dispatcher_jobs(cwi_strbuf *sb, const cwi_msg_status_reply *st)
{
	size_t finished = 0;

	for (size_t i = 0; i < st->njobs; i++)
		finished += st->jobs[i].finished;
	family(sb, "cachew_jobs", "gauge", "Jobs the dispatcher knows, by "
	    "state (the last finished ones stay visible).");
	cwi_strbuf_printf(sb, "cachew_jobs{state=\"running\"} %zu\n",
	    st->njobs - finished);
	cwi_strbuf_printf(sb, "cachew_jobs{state=\"finished\"} %zu\n", finished);
	family(sb, "cachew_job_splits", "gauge", "A job's splits, by state.");
	for (size_t i = 0; i < st->njobs; i++) {
		const cwi_job_status *j = &st->jobs[i];
		job_series(sb, "cachew_job_splits", j, ",state=\"pending\"");
		cwi_strbuf_printf(sb, "%" PRIu64 "\n", j->splits_pending);
		job_series(sb, "cachew_job_splits", j, ",state=\"leased\"");
		cwi_strbuf_printf(sb, "%" PRIu64 "\n", j->splits_leased);
		job_series(sb, "cachew_job_splits", j, ",state=\"acked\"");
		cwi_strbuf_printf(sb, "%" PRIu64 "\n", j->splits_acked);
	}
	job_family(sb, st, "cachew_job_elements_total", "counter",
	    "Elements a job's clients received, as they report.", jv_elements);
	job_family(sb, st, "cachew_job_bytes_total", "counter",
	    "Bytes a job's clients received, as they report.", jv_bytes);
	job_family(sb, st, "cachew_job_elements_per_second", "gauge",
	    "A job's recent element rate.", jv_eps);
	job_family(sb, st, "cachew_job_clients", "gauge",
	    "Clients reading a job.", jv_clients);
	job_family(sb, st, "cachew_job_batch_time_seconds", "gauge",
	    "Mean time between a job's batches at its clients.", jv_batch);
	job_family(sb, st, "cachew_job_client_wait_ratio", "gauge",
	    "Share of time a job's clients wait for data (0..1).", jv_wait);
	job_family(sb, st, "cachew_job_workers_wanted", "gauge",
	    "Workers a job's scaling policy asks for.", jv_want);
	job_family(sb, st, "cachew_job_workers_granted", "gauge",
	    "Workers fair share gives a job.", jv_granted);
	job_family(sb, st, "cachew_job_cache_hit_bytes_total", "counter",
	    "Bytes a job's operators on workers read from caches rather "
	    "than computed (cache_get; cache and the in-memory cache() on a "
	    "pass that found their cache complete).", jv_hits);
	family(sb, "cachew_job_slowest_operator_ratio", "gauge",
	    "A job's slowest operator (own work per thread) and that time's "
	    "share of its operators' (0..1).");
	for (size_t i = 0; i < st->njobs; i++) {
		cwi_strbuf op;
		if (st->jobs[i].slowest_op == NULL)
			continue;
		cwi_strbuf_init(&op);
		cwi_strbuf_puts(&op, ",operator=\"");
		cwi_metrics_label_value(&op, st->jobs[i].slowest_op);
		cwi_strbuf_puts(&op, "\"");
		job_series(sb, "cachew_job_slowest_operator_ratio",
		    &st->jobs[i], op.oom ? "" : op.data);
		cwi_strbuf_free(&op);
		cwi_strbuf_printf(sb, "%.6g\n", st->jobs[i].slowest_op_share);
	}
	family(sb, "cachew_job_cache_mode", "gauge",
	    "1 for a job's autocaching mode (profile, put, get, compute).");
	for (size_t i = 0; i < st->njobs; i++) {
		char extra[64];
		if (st->jobs[i].cache_mode == NULL)
			continue;
		snprintf(extra, sizeof(extra), ",mode=\"%.40s\"",
		    st->jobs[i].cache_mode);
		job_series(sb, "cachew_job_cache_mode", &st->jobs[i], extra);
		cwi_strbuf_puts(sb, "1\n");
	}
}

void
cwi_metrics_dispatcher(cwi_strbuf *sb, const cwi_msg_status_reply *st,
    const cwi_prov_status *ps)
{
	dispatcher_workers(sb, st);
	dispatcher_pool(sb, st, ps);
	dispatcher_jobs(sb, st);
	cwi_metrics_process(sb);
}

/* ---- the HTTP side --------------------------------------------------------------- */

int
cwi_metrics_reply(const char *path, const cwi_metrics_source *src,
    char **body, size_t *len, const char **type)
{
	const char *text;
	size_t n = strcspn(path, "?");
	int status = 200;

	*body = NULL;
	*len = 0;
	if (n == 8 && strncmp(path, "/metrics", n) == 0) {
		cwi_strbuf sb;

		cwi_strbuf_init(&sb);
		*type = "text/plain; version=0.0.4; charset=utf-8";
		if (src->render(src->arg, &sb) != CACHEW_OK) {
			cwi_strbuf_free(&sb);
			return 500;
		}
		/* On failure it frees the buffer. */
		return cwi_strbuf_finish(&sb, body, len) == CACHEW_OK ? 200
								      : 500;
	}
	if (n == 8 && strncmp(path, "/healthz", n) == 0) {
		text = "ok\n";
	} else if (n == 7 && strncmp(path, "/readyz", n) == 0) {
		const char *why = src->ready(src->arg);
		status = why == NULL ? 200 : 503;
		text = why == NULL ? "ready\n" : why;
	} else {
		status = 404;
		text = "not found: /metrics, /healthz and /readyz are served\n";
	}
	*body = cwi_strdup(text);
	*len = *body != NULL ? strlen(*body) : 0;
	return *body != NULL ? status : 500;
}

cachew_err
cwi_metrics_listen(cwi_http_listener **out, const char *addr,
    const char *role, cwi_http_fn fn, void *arg)
{
	cachew_err rv;

	*out = NULL;
	if (addr[0] == '\0')
		return CACHEW_OK;
	rv = cwi_http_listen(out, addr, fn, arg);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "--metrics-listen: %s", cwi_errmsg_get());
	cwi_log(CACHEW_LOG_INFO, role, "event=metrics_listening url=%s",
	    cwi_http_listener_url(*out));
	return CACHEW_OK;
}
