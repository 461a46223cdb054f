/*
 * plot_cli.c - `cachew plot EVENTS.jsonl --out DIR`: a dispatcher's events
 * log drawn as pictures, one PNG per job with four panels over time (the
 * way Cachew's paper shows autoscaling): its workers (tasks, and with a
 * scale policy what it wanted and what fair share granted), its
 * throughput, its clients' wait for data and its cache mode.
 *
 * The points are the dispatcher's `job_sample` events (one per running job
 * every CWI_DISP_SAMPLE_NS, 0.5 s) and the names its `job_created` events
 * give; time is seconds since the log's first event. For each job it
 * writes job-<id>.dat (the samples, one line each), job-<id>.gp (the
 * gnuplot script) and job-<id>.png beside them, and prints one line per
 * PNG. The log is a peer's file: a line that is not a JSON object with an
 * event and a time stops the command naming the file and the line.
 */
#include "tools.h"
#include "sim.h"

#include "../core/core.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A longer line is not one of ours (a job_sample is ~250 bytes; the
 * longest events name many split ids). */
#define PLOT_MAX_LINE (4u << 20)

static const char *const cache_modes[] = {"none", "profile", "put", "get",
    "compute"};

typedef struct plot_sample {
	double t;
	double tasks, want, granted;
	double elements_per_s, wait;
	int cache; /* index in cache_modes */
} plot_sample;

typedef struct plot_job {
	uint64_t id;
	char name[64];
	bool scaled; /* its samples carry want/granted */
	plot_sample *v;
	size_t n, cap;
} plot_job;

typedef struct plot_log {
	plot_job *jobs;
	size_t njobs, cap;
	uint64_t t0_ns;
	bool any;
} plot_log;

static plot_job *
job_of(plot_log *log, uint64_t id)
{
	plot_job *nv;

	for (size_t i = 0; i < log->njobs; i++)
		if (log->jobs[i].id == id)
			return &log->jobs[i];
	if (log->njobs == log->cap) {
		size_t cap = log->cap > 0 ? log->cap * 2 : 8;
		nv = realloc(log->jobs, cap * sizeof(*nv));
		if (nv == NULL)
			return NULL;
		log->jobs = nv;
		log->cap = cap;
	}
	nv = &log->jobs[log->njobs++];
	memset(nv, 0, sizeof(*nv));
	nv->id = id;
	return nv;
}

static double
num(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : 0;
}

static int
cache_index(const char *mode)
{
	for (size_t i = 1; mode != NULL && i < 5; i++)
		if (strcmp(mode, cache_modes[i]) == 0)
			return (int)i;
	return 0;
}

static cachew_err
add_sample(plot_log *log, const json_t *ev, double t)
{
	plot_job *j = job_of(log, (uint64_t)num(ev, "job_id"));
	plot_sample *s;

	if (j == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (j->n == j->cap) {
		size_t cap = j->cap > 0 ? j->cap * 2 : 64;
		s = realloc(j->v, cap * sizeof(*s));
		if (s == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		j->v = s;
		j->cap = cap;
	}
	s = &j->v[j->n++];
	s->t = t;
	s->tasks = num(ev, "tasks");
	j->scaled |= json_object_get(ev, "want") != NULL;
	s->want = num(ev, "want");
	s->granted = num(ev, "granted");
	s->elements_per_s = num(ev, "elements_per_s");
	s->wait = 100 * num(ev, "client_wait");
	s->cache = cache_index(json_string_value(json_object_get(ev,
	    "cache_mode")));
	return CACHEW_OK;
}

/* One line of the log: its event kept when it is one plot draws. */
static cachew_err
read_event(plot_log *log, const char *path, size_t lineno, const char *line,
    size_t len)
{
	json_error_t err;
	json_t *ev = json_loadb(line, len, JSON_REJECT_DUPLICATES, &err);
	const json_t *ts;
	const char *name;
	cachew_err rv = CACHEW_OK;
	double t;

	if (ev == NULL)
		return cwi_fail(CACHEW_EPROTO, "%s:%zu: not JSON: %s", path,
		    lineno, err.text);
	ts = json_object_get(ev, "ts_ns");
	name = json_string_value(json_object_get(ev, "event"));
	if (!json_is_integer(ts) || json_integer_value(ts) < 0 ||
	    name == NULL) {
		json_decref(ev);
		return cwi_fail(CACHEW_EPROTO, "%s:%zu: not an event of a "
		    "dispatcher's log (an object with \"ts_ns\" and \"event\")",
		    path, lineno);
	}
	if (!log->any) {
		log->t0_ns = (uint64_t)json_integer_value(ts);
		log->any = true;
	}
	t = ((double)(uint64_t)json_integer_value(ts) - (double)log->t0_ns) /
	    1e9;
	if (strcmp(name, "job_sample") == 0) {
		rv = add_sample(log, ev, t);
	} else if (strcmp(name, "job_created") == 0) {
		plot_job *j = job_of(log, (uint64_t)num(ev, "job_id"));
		const char *jn = json_string_value(json_object_get(ev, "name"));
		if (j == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		else if (jn != NULL)
			snprintf(j->name, sizeof(j->name), "%s", jn);
	}
	json_decref(ev);
	return rv;
}

static cachew_err
read_log(plot_log *log, const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, lineno = 0;
	ssize_t n;
	cachew_err rv = CACHEW_OK;

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	while (rv == CACHEW_OK && (n = getline(&line, &cap, f)) >= 0) {
		lineno++;
		if (n > 0 && line[n - 1] == '\n')
			n--;
		if ((size_t)n > PLOT_MAX_LINE)
			rv = cwi_fail(CACHEW_EPROTO, "%s:%zu: a line of %zd "
			    "bytes (at most %u)", path, lineno, n,
			    PLOT_MAX_LINE);
		else if (n > 0)
			rv = read_event(log, path, lineno, line, (size_t)n);
	}
	if (rv == CACHEW_OK && ferror(f))
		rv = cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	free(line);
	fclose(f);
	return rv;
}

/* ---- writing ------------------------------------------------------------- */

static cachew_err
write_data(const char *path, const plot_job *j)
{
	FILE *f = fopen(path, "w");

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	fputs("# seconds tasks wanted granted elements_per_s client_wait_pct "
	      "cache_mode(0 none,1 profile,2 put,3 get,4 compute)\n", f);
	for (size_t i = 0; i < j->n; i++) {
		const plot_sample *s = &j->v[i];
		fprintf(f, "%.3f %g %g %g %.1f %.2f %d\n", s->t, s->tasks,
		    s->want, s->granted, s->elements_per_s, s->wait, s->cache);
	}
	if (fclose(f) != 0)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	return CACHEW_OK;
}

/* The top of a panel's y range: a tenth above its largest value, 1 for a
 * panel of zeros (gnuplot warns of an empty range otherwise). */
static double
y_top(const plot_job *j, bool workers)
{
	double max = 0;

	for (size_t i = 0; i < j->n; i++) {
		const plot_sample *s = &j->v[i];
		double v = workers ? s->tasks : s->elements_per_s;
		if (workers && s->want > v)
			v = s->want;
		if (workers && s->granted > v)
			v = s->granted;
		if (v > max)
			max = v;
	}
	return max > 0 ? max * 1.1 : 1;
}

/* `plot 'data' using 1:col with steps lw 2 title 'title'` */
static void
series(FILE *f, const char *data, int col, const char *title, bool first)
{
	fputs(first ? "plot " : ", ", f);
	cwi_sim_put_gp_str(f, data);
	fprintf(f, " using 1:%d with steps lw 2 title ", col);
	cwi_sim_put_gp_str(f, title);
}

static cachew_err
write_script(const char *path, const char *png, const char *data,
    const plot_job *j)
{
	char title[160];
	double x1 = j->v[j->n - 1].t > j->v[0].t ? j->v[j->n - 1].t
						  : j->v[0].t + 1;
	FILE *f = fopen(path, "w");

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	snprintf(title, sizeof(title), "job %" PRIu64 "%s%s%s", j->id,
	    j->name[0] != '\0' ? " (" : "", j->name,
	    j->name[0] != '\0' ? ")" : "");
	fputs("set terminal pngcairo size 1000,1000 noenhanced\nset output ",
	    f);
	cwi_sim_put_gp_str(f, png);
	fputs("\nset multiplot layout 4,1 title ", f);
	cwi_sim_put_gp_str(f, title);
	fprintf(f, "\nset grid\nset key outside right top\nset lmargin 12\n"
		   "set rmargin 20\nset xrange [%.3f:%.3f]\nset yrange [0:%g]\n"
		   "set ylabel 'workers'\n",
	    j->v[0].t, x1, y_top(j, true));
	series(f, data, 2, "tasks", true);
	if (j->scaled) {
		series(f, data, 3, "wanted", false);
		series(f, data, 4, "granted", false);
	}
	fprintf(f, "\nset ylabel 'elements/s'\nset yrange [0:%g]\n",
	    y_top(j, false));
	series(f, data, 5, "throughput", true);
	fputs("\nset ylabel 'client wait %'\nset yrange [0:105]\n", f);
	series(f, data, 6, "clients waiting", true);
	fputs("\nset ylabel 'cache mode'\nset yrange [-0.5:4.5]\nset ytics ('none' 0, 'profile' 1, 'put' 2, 'get' 3, "
	      "'compute' 4)\nset xlabel 'seconds since the first event'\n",
	    f);
	series(f, data, 7, "cache mode", true);
	fputs("\nunset multiplot\n", f);
	if (fclose(f) != 0)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	return CACHEW_OK;
}

static cachew_err
plot_job_files(const char *dir, const plot_job *j)
{
	char *data = cwi_asprintf("%s/job-%" PRIu64 ".dat", dir, j->id);
	char *script = cwi_asprintf("%s/job-%" PRIu64 ".gp", dir, j->id);
	char *png = cwi_asprintf("%s/job-%" PRIu64 ".png", dir, j->id);
	cachew_err rv;

	if (data == NULL || script == NULL || png == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	rv = write_data(data, j);
	if (rv == CACHEW_OK)
		rv = write_script(script, png, data, j);
	if (rv == CACHEW_OK)
		rv = cwi_sim_gnuplot(script, png);
	if (rv == CACHEW_OK)
		printf("job %" PRIu64 "%s%s%s: %zu sample%s over %.1f s -> %s\n",
		    j->id, j->name[0] != '\0' ? " (" : "", j->name,
		    j->name[0] != '\0' ? ")" : "", j->n, j->n == 1 ? "" : "s",
		    j->v[j->n - 1].t - j->v[0].t, png);
done:
	free(data);
	free(script);
	free(png);
	return rv;
}

static int
plot_usage(const char *why)
{
	if (why != NULL)
		fprintf(stderr, "cachew plot: %s\n", why);
	fputs("usage: cachew plot EVENTS.jsonl --out DIR\n"
	      "  draws each job of a dispatcher's events log (<work_dir>/"
	      "events.jsonl)\n  as DIR/job-<id>.png: its workers, throughput, "
	      "client wait and cache\n  mode over time (gnuplot; Debian: "
	      "gnuplot-nox)\n",
	    why != NULL ? stderr : stdout);
	return why != NULL ? 2 : 0;
}

int
cwi_plot_cli(int argc, char **argv)
{
	const char *events = NULL, *out = NULL;
	plot_log log;
	size_t drawn = 0;
	cachew_err rv = CACHEW_OK;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			return plot_usage(NULL);
		if (strcmp(argv[i], "--out") == 0) {
			if (++i == argc)
				return plot_usage("--out expects a directory");
			out = argv[i];
		} else if (strncmp(argv[i], "--out=", 6) == 0) {
			out = argv[i] + 6;
		} else if (argv[i][0] == '-' && argv[i][1] != '\0') {
			fprintf(stderr, "cachew plot: unknown flag '%s'\n",
			    argv[i]);
			return plot_usage("see the usage");
		} else if (events == NULL) {
			events = argv[i];
		} else {
			return plot_usage("one events file only");
		}
	}
	if (events == NULL || out == NULL)
		return plot_usage(events == NULL ? "which events file?"
						 : "--out DIR is required");
	memset(&log, 0, sizeof(log));
	rv = read_log(&log, events);
	if (rv == CACHEW_OK && mkdir(out, 0777) != 0 && errno != EEXIST)
		rv = cwi_fail(CACHEW_EIO, "--out %s: %s", out, strerror(errno));
	for (size_t i = 0; rv == CACHEW_OK && i < log.njobs; i++) {
		if (log.jobs[i].n == 0)
			continue;
		rv = plot_job_files(out, &log.jobs[i]);
		drawn++;
	}
	if (rv == CACHEW_OK && drawn == 0)
		rv = cwi_fail(CACHEW_ENOENT, "%s: no job_sample events (a "
		    "dispatcher writes one per running job every 0.5 s)",
		    events);
	for (size_t i = 0; i < log.njobs; i++)
		free(log.jobs[i].v);
	free(log.jobs);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew plot: %s\n", cwi_errmsg_get());
		return 1;
	}
	return 0;
}
