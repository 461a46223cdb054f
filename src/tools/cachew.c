/*
 * cachew.c - the `cachew` command: run a pipeline string and measure it,
 * explain its graph, list the operators.
 *
 * Thin by design: this file parses arguments and prints; the work is the
 * public API. `cachew ops` and `cachew explain` also read the internal
 * registry and node structs (src/graph/graph.h), which is why the program
 * links libcachew.a statically.
 *
 * Exit status: 0 success, 1 runtime failure (the pipeline failed, a plugin
 * did not load), 2 usage or parse error. docs/cli.md is the reference.
 */
#include "cachew.h"

#include "../cache/cache.h"
#include "../exec/exec_split.h"
#include "../service/service.h"
#include "../graph/graph.h"
#include "../pipeline/pipeline.h"
#include "sim.h"
#include "tools.h"
#include "gen.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* The progress line is redrawn at most this often (5 per second). */
#define PROGRESS_INTERVAL_NS 200000000ull

static const char usage_text[] =
    "usage: cachew <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  run [flags] \"<pipeline>\"     run a pipeline, report elements and "
    "throughput\n"
    "  head [-n N] [--json] [run's --set/--threads/--seed/--plugin]\n"
    "      \"<pipeline>\"             print the first N elements (default 5):\n"
    "                               values, strings, dtypes and shapes, long\n"
    "                               tensors abbreviated as numpy does; --json:\n"
    "                               one JSON object per element\n"
    "  explain [--plugin PATH]... \"<pipeline>\"\n"
    "                               print the graph, the canonical string "
    "and\n"
    "                               check that it parses back the same\n"
    "  ops [--markdown] [--plugin PATH]...\n"
    "                               list dataset operators and functions\n"
    "  gen imagenet --out DIR --images N [--shards K] [--seed S]\n"
    "      [--width 500] [--height 375] [--quality 90]\n"
    "                               write ImageNet-like TFRecord shards of\n"
    "                               tf.train.Example (JPEG + label)\n"
    "  cache ls|verify|rm|gc|probe  manage a cache root (cachew cache --help)\n"
    "  status [URL] [--json]        what a dispatcher knows: workers, jobs,\n"
    "                               tasks, splits, throughput (--tls-ca\n"
    "                               FILE... for tls+tcp://: cachew status -h)\n"
    "  top [URL] [--interval MS]    a live view of a dispatcher: jobs (rate,\n"
    "                               workers wanted/granted, cache mode) and\n"
    "                               workers (CPU, tasks); q quits\n"
    "  plot EVENTS.jsonl --out DIR  draw each job of a dispatcher's events\n"
    "                               log: workers, throughput, client wait,\n"
    "                               cache mode over time (gnuplot PNGs)\n"
    "  sim autoscale|multitenant|autocache [--json] [--plot DIR]\n"
    "                               simulate the policies in virtual time\n"
    "                               (cachew sim --help)\n"
    "  gen text --out DIR --lines N [--files K] [--seed S]\n"
    "                               write Zipf-distributed text files\n"
    "  version                      print the library version\n"
    "  help                         print this help\n"
    "\n"
    "run flags:\n"
    "  --json              print the summary as one JSON object, the last "
    "line\n"
    "                      (with \"digest\": the sum mod 2^64 of every\n"
    "                      element's cachew_element_hash, order-independent)\n"
    "  --no-digest         skip hashing the elements (for benchmarks)\n"
    "  --epochs N          run N epochs, a new iterator each (default 1)\n"
    "  --threads N         same as --set threads=N\n"
    "  --seed S            same as --set seed=S\n"
    "  --set NAME=VALUE    set an iterator option (repeatable)\n"
    "  --plugin PATH       load a plugin .so first (repeatable)\n"
    "  --stats             print per-operator counters after the run\n"
    "  --quiet             no live progress line\n"
    "  --verbose           library log messages down to info level\n"
    "  --help-options      print the options table and exit\n"
    "  --save-at N         stop after N elements and save the position\n"
    "  --state FILE        where --save-at saves it (atomically)\n"
    "  --resume FILE       continue from a saved position to the end\n"
    "\n"
    "environment:\n"
    "  CACHEW_<OPTION>     an option's value unless a flag sets it, e.g.\n"
    "                      CACHEW_THREADS=4 CACHEW_SEED=7\n"
    "\n"
    "A pipeline is stages joined by '|', e.g.\n"
    "  cachew run \"range(1000) | map(add, value=1) | batch(64)\"\n"
    "\n"
    "exit status: 0 ok, 1 runtime failure, 2 usage or parse error\n";

/* ---- small helpers ------------------------------------------------------- */

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int
usage_error(const char *fmt, ...) CACHEW_PRINTF(1, 2);

/* Prints "cachew: <message>" and a pointer to the help; returns 2. */
static int
usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("cachew: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'cachew help'.\n", stderr);
	return EXIT_USAGE;
}

/* The detail of the last failed call, or the code's description. */
static const char *
last_error(cachew_err rv)
{
	const char *msg = cachew_errmsg();

	return msg[0] != '\0' ? msg : cachew_strerror(rv);
}

static bool
parse_i64(const char *text, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0')
		return false;
	*out = v;
	return true;
}

/* Records the single positional argument (the pipeline). */
static int
take_pipeline(const char *arg, const char **pipeline)
{
	if (*pipeline != NULL)
		return usage_error(
		    "unexpected argument '%s' (quote the pipeline as one "
		    "argument)", arg);
	*pipeline = arg;
	return 0;
}

static int
load_plugin(const char *path)
{
	cachew_err rv = cachew_plugin_load(path);

	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: %s\n", last_error(rv));
		return EXIT_RUNTIME;
	}
	return 0;
}

/* Parses the pipeline; on error prints the parser's message (which names
 * the column and shows a caret) and returns 2. */
static int
parse_pipeline(const char *pipeline, cachew_dataset **out)
{
	cachew_err rv = cachew_dataset_parse(out, pipeline);

	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: %s\n", last_error(rv));
		return EXIT_USAGE;
	}
	return 0;
}

/* ---- options: environment, --set, --help-options ------------------------- */

/* Sets one option from text; on error prints a message naming it. `origin`
 * says where the value came from ("--set", "CACHEW_THREADS"). */
static int
set_option(cachew_options *opts, const char *name, const char *value,
    const char *origin)
{
	cachew_err rv = cachew_options_set(opts, name, value);

	if (rv == CACHEW_ENOENT)
		return usage_error("%s: unknown option '%s' (see 'cachew run "
				   "--help-options')", origin, name);
	if (rv != CACHEW_OK)
		return usage_error(
		    "%s: %s", origin, cachew_options_errmsg(opts));
	return 0;
}

/* Applies CACHEW_<NAME> for every option in the table. */
static int
options_from_env(cachew_options *opts)
{
	const char *name, *type, *def, *help;
	char var[80];
	int rc;

	for (size_t i = 0;
	     cachew_option_info(i, &name, &type, &def, &help) == CACHEW_OK;
	     i++) {
		size_t k = (size_t)snprintf(var, sizeof(var), "CACHEW_");
		const char *value;

		for (const char *p = name; *p != '\0' && k + 1 < sizeof(var);
		     p++)
			var[k++] = (char)toupper((unsigned char)*p);
		var[k] = '\0';
		value = getenv(var);
		if (value == NULL)
			continue;
		rc = set_option(opts, name, value, var);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static int
set_option_assignment(cachew_options *opts, const char *assignment)
{
	const char *eq = strchr(assignment, '=');
	char name[64];

	if (eq == NULL || eq == assignment)
		return usage_error(
		    "--set expects NAME=VALUE, got '%s'", assignment);
	if ((size_t)(eq - assignment) >= sizeof(name))
		return usage_error("--set: unknown option '%.*s'",
		    (int)(eq - assignment), assignment);
	memcpy(name, assignment, (size_t)(eq - assignment));
	name[eq - assignment] = '\0';
	return set_option(opts, name, eq + 1, "--set");
}

static void
print_options_table(void)
{
	const char *name, *type, *def, *help;

	printf("%-18s %-5s %-17s %s\n", "option", "type", "default", "meaning");
	for (size_t i = 0;
	     cachew_option_info(i, &name, &type, &def, &help) == CACHEW_OK; i++)
		printf("%-18s %-5s %-17s %s\n", name, type, def, help);
	printf("\nEach option NAME can also be set with the environment "
	       "variable CACHEW_<NAME>\n(upper case); flags override the "
	       "environment.\n");
}

/* ---- run: progress, counters, summary ------------------------------------ */

typedef struct run_args {
	const char *pipeline;
	int64_t epochs;
	bool json, stats, quiet, verbose, help_options, no_digest;
	cachew_options *opts;
	int64_t save_at;       /* --save-at N: stop after N and save; -1 */
	const char *state;     /* --state FILE: where --save-at saves */
	const char *resume;    /* --resume FILE: continue from a state */
	size_t state_bytes;    /* the size of the state saved */
} run_args;

/* One row of --stats, summed over epochs (labels copied: the iterator's
 * strings die with it). */
typedef struct stats_row {
	char label[96];
	uint64_t elements, bytes, busy_ns, wait_ns;
	int parallelism;
	int64_t buffered, buffer_limit;
} stats_row;

typedef struct run_totals {
	uint64_t elements, bytes;
	/* Elements the whole run will yield (every epoch, up to --save-at)
	 * when the cardinality is a count; -1 when it is infinite or
	 * unknown (the progress line then shows the rate only). */
	int64_t total;
	bool digest_on;
	uint64_t digest; /* sum of cachew_element_hash mod 2^64 */
	uint64_t t0_ns, elapsed_ns;
	stats_row *rows;
	size_t nrows;
} run_totals;

/* The live progress line. The clock is read every `stride` elements, and
 * the stride adapts so that happens about once a millisecond: cheap for
 * tiny elements, still responsive for slow ones. */
typedef struct progress {
	bool on;
	uint64_t countdown, stride;
	uint64_t last_check_ns, next_draw_ns;
} progress;

static void
progress_init(progress *p, bool on)
{
	p->on = on;
	p->countdown = p->stride = 1;
	p->last_check_ns = now_ns();
	p->next_draw_ns = p->last_check_ns + PROGRESS_INTERVAL_NS;
}

/* "12.3 s", "4 min 05 s" or "1 h 02 min": an ETA readable at a glance. */
static void
format_eta(char *buf, size_t len, double s)
{
	uint64_t t = s > 0 ? (uint64_t)(s + 0.5) : 0;

	if (s < 60)
		snprintf(buf, len, "%.1f s", s > 0 ? s : 0.0);
	else if (t < 3600)
		snprintf(buf, len, "%" PRIu64 " min %02" PRIu64 " s", t / 60,
		    t % 60);
	else
		snprintf(buf, len, "%" PRIu64 " h %02" PRIu64 " min", t / 3600,
		    t / 60 % 60);
}

/* With a known total: "N / TOTAL elements  P%  ETA T", then the rate;
 * without: the count and the rate. The ETA assumes the mean rate so far
 * holds (none before the first element). */
static void
progress_draw(const run_totals *t, uint64_t now)
{
	double s = (double)(now - t->t0_ns) / 1e9;
	double eps = s > 0 ? (double)t->elements / s : 0.0;

	if (t->total >= 0) {
		uint64_t total = (uint64_t)t->total;
		double pct = total > 0 ? 100.0 * (double)t->elements /
		    (double)total : 100.0;
		char eta[32];

		if (eps > 0 && total >= t->elements)
			format_eta(eta, sizeof(eta),
			    (double)(total - t->elements) / eps);
		else
			snprintf(eta, sizeof(eta), "?");
		fprintf(stderr,
		    "\r%" PRIu64 " / %" PRIu64 " elements  %.1f%%  ETA %s  ",
		    t->elements, total, pct > 100.0 ? 100.0 : pct, eta);
	} else {
		fprintf(stderr, "\r%" PRIu64 " elements  ", t->elements);
	}
	fprintf(stderr, "%.0f elements/s  %.1f MB/s  %.1f s\033[K", eps,
	    s > 0 ? (double)t->bytes / 1e6 / s : 0.0, s);
	fflush(stderr);
}

static void
progress_tick(progress *p, const run_totals *t)
{
	uint64_t now;

	if (!p->on || --p->countdown > 0)
		return;
	now = now_ns();
	if (now - p->last_check_ns < 1000000 && p->stride < 65536)
		p->stride *= 2;
	else if (now - p->last_check_ns > 10000000 && p->stride > 1)
		p->stride /= 2;
	p->countdown = p->stride;
	p->last_check_ns = now;
	if (now >= p->next_draw_ns) {
		progress_draw(t, now);
		p->next_draw_ns = now + PROGRESS_INTERVAL_NS;
	}
}

static void
progress_clear(const progress *p)
{
	if (p->on) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
}

static uint64_t
element_nbytes(const cachew_element *e)
{
	uint64_t n = 0;

	for (size_t c = 0; c < cachew_element_size(e); c++)
		n += cachew_tensor_nbytes(cachew_element_component(e, c));
	return n;
}

/* Adds this iterator's counters to the totals (rows match by position:
 * every epoch runs the same graph). */
static void
stats_accumulate(cachew_iterator *it, run_totals *t)
{
	cachew_op_stats *s;
	size_t n = 0;

	if (cachew_iterator_stats(it, NULL, 0, &n) != CACHEW_OK || n == 0)
		return;
	s = calloc(n, sizeof(*s));
	if (s == NULL)
		return;
	if (t->rows == NULL) {
		t->rows = calloc(n, sizeof(*t->rows));
		t->nrows = t->rows != NULL ? n : 0;
	}
	(void)cachew_iterator_stats(it, s, n, &n);
	for (size_t i = 0; i < n && i < t->nrows; i++) {
		stats_row *r = &t->rows[i];
		const char *detail = s[i].detail != NULL ? s[i].detail : "";

		snprintf(r->label, sizeof(r->label),
		    detail[0] != '\0' ? "%s(%s)" : "%s", s[i].name, detail);
		r->elements += s[i].elements;
		r->bytes += s[i].bytes;
		r->busy_ns += s[i].busy_ns;
		r->wait_ns += s[i].wait_ns;
		r->parallelism = s[i].parallelism;
		r->buffered = s[i].buffered;
		r->buffer_limit = s[i].buffer_limit;
	}
	free(s);
}

/* The iterator of a run: a new one, or with --resume one that continues
 * from the state in that file. */
static cachew_err
run_iterator(cachew_iterator **it, cachew_dataset *ds, const run_args *a)
{
	char err[512];
	void *state = NULL;
	size_t len = 0;
	cachew_err rv;

	if (a->resume == NULL)
		return cachew_iterator_create(it, ds, a->opts);
	if (cwi_state_file_read(a->resume, &state, &len, err, sizeof(err)) !=
	    0) {
		fprintf(stderr, "cachew: --resume: %s\n", err);
		return CACHEW_EIO;
	}
	rv = cachew_iterator_restore(it, ds, a->opts, state, len);
	free(state);
	return rv;
}

/* --save-at: saves the iterator's position into a->state. */
static int
run_save(cachew_iterator *it, run_args *a)
{
	char err[512];
	void *state = NULL;
	size_t len = 0;
	cachew_err rv;

	rv = cachew_iterator_save(it, &state, &len);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: --save-at: %s\n", last_error(rv));
		return EXIT_RUNTIME;
	}
	if (cwi_state_file_write(a->state, state, len, err, sizeof(err)) != 0) {
		fprintf(stderr, "cachew: --state: %s\n", err);
		free(state);
		return EXIT_RUNTIME;
	}
	free(state);
	a->state_bytes = len;
	return 0;
}

/* Runs one iterator to its end (or to --save-at). Returns 0 or 1 (message
 * printed). */
static int
run_epoch(cachew_dataset *ds, run_args *a, run_totals *t, progress *p)
{
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	int rc;

	rv = run_iterator(&it, ds, a);
	if (rv != CACHEW_OK) {
		progress_clear(p);
		if (rv != CACHEW_EIO || a->resume == NULL)
			fprintf(stderr, "cachew: %s\n", last_error(rv));
		return EXIT_RUNTIME;
	}
	while ((a->save_at < 0 || t->elements < (uint64_t)a->save_at) &&
	    (rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		t->elements++;
		t->bytes += element_nbytes(e);
		if (t->digest_on)
			t->digest += cachew_element_hash(e);
		cachew_element_release(e);
		progress_tick(p, t);
	}
	if (a->stats)
		stats_accumulate(it, t);
	if (rv != CACHEW_EOF && rv != CACHEW_OK) {
		const char *msg = cachew_iterator_errmsg(it);
		progress_clear(p);
		fprintf(stderr, "cachew: %s\n",
		    msg != NULL && msg[0] != '\0' ? msg : cachew_strerror(rv));
	}
	rc = rv == CACHEW_EOF || rv == CACHEW_OK ? 0 : EXIT_RUNTIME;
	/* At the end before N elements, the state saved is the end. */
	if (rc == 0 && a->save_at >= 0) {
		progress_clear(p);
		rc = run_save(it, a);
	}
	cachew_iterator_destroy(it);
	return rc;
}

/* Runs a->epochs epochs, epoch k with option epoch = base + k. */
static int
run_epochs(cachew_dataset *ds, run_args *a, run_totals *t)
{
	progress p;
	int64_t base = 0;
	int rc = 0;

	(void)cachew_options_get_int(a->opts, "epoch", &base);
	progress_init(&p, !a->quiet && isatty(STDERR_FILENO));
	t->t0_ns = now_ns();
	for (int64_t k = 0; k < a->epochs && rc == 0; k++) {
		if (cachew_options_set_int(a->opts, "epoch", base + k) !=
		    CACHEW_OK) {
			fprintf(stderr, "cachew: epoch %" PRId64 ": %s\n",
			    base + k, cachew_options_errmsg(a->opts));
			return EXIT_RUNTIME;
		}
		rc = run_epoch(ds, a, t, &p);
	}
	t->elapsed_ns = now_ns() - t->t0_ns;
	progress_clear(&p);
	return rc;
}

static void
print_stats(const run_totals *t)
{
	printf("%-28s %12s %14s %10s %10s %4s %15s\n", "operator", "elements",
	    "bytes", "busy ms", "wait ms", "par", "buffered/limit");
	for (size_t i = 0; i < t->nrows; i++) {
		const stats_row *r = &t->rows[i];
		char buf[40];

		snprintf(buf, sizeof(buf), "%" PRId64 "/%" PRId64, r->buffered,
		    r->buffer_limit);
		printf("%-28s %12" PRIu64 " %14" PRIu64
		       " %10.1f %10.1f %4d %15s\n",
		    r->label, r->elements, r->bytes, (double)r->busy_ns / 1e6,
		    (double)r->wait_ns / 1e6, r->parallelism,
		    r->buffer_limit > 0 ? buf : "-");
	}
	printf("\n");
}

static long
peak_rss_kb(void)
{
	struct rusage ru;

	return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

static void
print_summary(const run_totals *t, const run_args *a, const char *fp_hex)
{
	double s = (double)t->elapsed_ns / 1e9;
	double eps = s > 0 ? (double)t->elements / s : 0.0;
	double mbps = s > 0 ? (double)t->bytes / 1e6 / s : 0.0;

	if (a->json) {
		printf("{\"elements\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"seconds\":%.6f,\"elements_per_s\":%.3f,"
		       "\"fingerprint\":\"%s\",\"epochs\":%" PRId64
		       ",\"mb_per_s\":%.3f,\"peak_rss_kb\":%ld",
		    t->elements, t->bytes, s, eps, fp_hex, a->epochs, mbps,
		    peak_rss_kb());
		if (t->digest_on)
			printf(",\"digest\":\"%016" PRIx64 "\"", t->digest);
		if (a->save_at >= 0)
			printf(",\"saved_at\":%" PRIu64 ",\"state_bytes\":%zu",
			    t->elements, a->state_bytes);
		printf("}\n");
		return;
	}
	if (a->save_at >= 0)
		printf("saved at     %" PRIu64 " elements (%zu-byte state in "
		       "%s)\n",
		    t->elements, a->state_bytes, a->state);
	printf("elements     %" PRIu64 "\n", t->elements);
	printf("bytes        %" PRIu64 " (%.1f MB)\n", t->bytes,
	    (double)t->bytes / 1e6);
	printf("seconds      %.3f\n", s);
	printf("elements/s   %.0f\n", eps);
	printf("MB/s         %.1f\n", mbps);
	printf("epochs       %" PRId64 "\n", a->epochs);
	printf("peak RSS     %ld kB\n", peak_rss_kb());
	printf("fingerprint  %s\n", fp_hex);
}

/* ---- run: arguments ------------------------------------------------------ */

/* Handles one run flag at argv[*i]; returns 0, or an exit code. */
/* The flags run and head share: --threads, --seed, --set, --plugin.
 * Returns -1 when argv[*i] is none of them, else 0 or an exit code. */
static int
options_flag(int argc, char **argv, int *i, cachew_options *opts)
{
	const char *v = NULL;
	int m;

	if ((m = cwi_flag_value(argc, argv, i, "--threads", &v)) != 0) {
		if (m < 0)
			return usage_error("--threads expects a value");
		return set_option(opts, "threads", v, "--threads");
	}
	if ((m = cwi_flag_value(argc, argv, i, "--seed", &v)) != 0) {
		if (m < 0)
			return usage_error("--seed expects a value");
		return set_option(opts, "seed", v, "--seed");
	}
	if ((m = cwi_flag_value(argc, argv, i, "--set", &v)) != 0) {
		if (m < 0)
			return usage_error("--set expects NAME=VALUE");
		return set_option_assignment(opts, v);
	}
	if ((m = cwi_flag_value(argc, argv, i, "--plugin", &v)) != 0) {
		if (m < 0)
			return usage_error("--plugin expects a path");
		return load_plugin(v);
	}
	return -1;
}

static int
run_flag(int argc, char **argv, int *i, run_args *a)
{
	const char *arg = argv[*i], *v = NULL;
	int m = options_flag(argc, argv, i, a->opts);

	if (m >= 0)
		return m;
	if (strcmp(arg, "--json") == 0)
		a->json = true;
	else if (strcmp(arg, "--stats") == 0)
		a->stats = true;
	else if (strcmp(arg, "--no-digest") == 0)
		a->no_digest = true;
	else if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0)
		a->quiet = true;
	else if (strcmp(arg, "--verbose") == 0 || strcmp(arg, "-v") == 0)
		a->verbose = true;
	else if (strcmp(arg, "--help-options") == 0)
		a->help_options = true;
	else if ((m = cwi_flag_value(argc, argv, i, "--epochs", &v)) != 0) {
		if (m < 0 || !parse_i64(v, &a->epochs) || a->epochs < 1)
			return usage_error(
			    "--epochs expects a positive integer");
	} else if ((m = cwi_flag_value(argc, argv, i, "--save-at", &v)) != 0) {
		if (m < 0 || !parse_i64(v, &a->save_at) || a->save_at < 0)
			return usage_error(
			    "--save-at expects a count of elements, 0 or more");
	} else if ((m = cwi_flag_value(argc, argv, i, "--state", &v)) != 0) {
		if (m < 0)
			return usage_error("--state expects a file");
		a->state = v;
	} else if ((m = cwi_flag_value(argc, argv, i, "--resume", &v)) != 0) {
		if (m < 0)
			return usage_error("--resume expects a file");
		a->resume = v;
	} else
		return usage_error("run: unknown flag '%s'", arg);
	return 0;
}

static int
run_parse_args(int argc, char **argv, run_args *a)
{
	bool flags_done = false;
	int rc = options_from_env(a->opts);

	for (int i = 1; i < argc && rc == 0; i++) {
		const char *arg = argv[i];

		if (!flags_done && strcmp(arg, "--") == 0)
			flags_done = true;
		else if (!flags_done && arg[0] == '-' && arg[1] != '\0')
			rc = run_flag(argc, argv, &i, a);
		else
			rc = take_pipeline(arg, &a->pipeline);
	}
	if (rc == 0 && a->pipeline == NULL && !a->help_options)
		rc = usage_error("run: missing the pipeline string");
	if (rc == 0 && (a->save_at >= 0) != (a->state != NULL))
		rc = usage_error(
		    "run: --save-at N and --state FILE go together");
	if (rc == 0 && (a->save_at >= 0 || a->resume != NULL) && a->epochs > 1)
		rc = usage_error("run: --save-at and --resume work on one "
				 "epoch (drop --epochs)");
	/* Where the user named no service, the plain executor saves and
	 * resumes the position: it yields what the embedded default would,
	 * and resumes without computing again the part of the epoch before
	 * the position (the embedded default's one group would). */
	if (rc == 0 && (a->save_at >= 0 || a->resume != NULL)) {
		const char *svc = NULL;
		const char *env = getenv("CACHEW_SERVICE");
		if (cachew_options_get_str(a->opts, "service", &svc) ==
			CACHEW_OK &&
		    (svc == NULL || svc[0] == '\0') &&
		    (env == NULL || env[0] == '\0') &&
		    cachew_options_set_str(a->opts, "service", "local") !=
			CACHEW_OK)
			rc = usage_error("run: out of memory");
	}
	return rc;
}

/* The elements the whole run yields when that is known beforehand: the
 * cardinality times the epochs, cut at --save-at; -1 for an infinite or
 * unknown cardinality, and after --resume (the position restored is not
 * counted). */
static int64_t
run_total(const cachew_dataset *ds, const run_args *a)
{
	int64_t card = cachew_dataset_cardinality(ds), total;

	if (card < 0 || a->resume != NULL)
		return a->save_at >= 0 && card == CACHEW_CARDINALITY_INFINITE
		    && a->resume == NULL ? a->save_at : -1;
	if (card > 0 && a->epochs > INT64_MAX / card)
		return -1;
	total = card * a->epochs;
	return a->save_at >= 0 && a->save_at < total ? a->save_at : total;
}

static int
cmd_run(int argc, char **argv)
{
	run_args a = {.epochs = 1, .save_at = -1};
	run_totals t = {0};
	cachew_dataset *ds = NULL;
	cachew_fingerprint fp;
	char hex[33];
	int rc;

	if (cachew_options_create(&a.opts) != CACHEW_OK) {
		fprintf(stderr, "cachew: out of memory\n");
		return EXIT_RUNTIME;
	}
	rc = run_parse_args(argc, argv, &a);
	if (rc != 0 || a.help_options) {
		if (rc == 0)
			print_options_table();
		goto done;
	}
	if (a.verbose)
		cachew_log_set(cachew_log_stderr, NULL, CACHEW_LOG_INFO);
	rc = parse_pipeline(a.pipeline, &ds);
	if (rc != 0)
		goto done;
	(void)cachew_dataset_fingerprint(ds, &fp);
	cachew_fingerprint_hex(&fp, hex);
	t.digest_on = a.json && !a.no_digest;
	t.total = run_total(ds, &a);
	rc = run_epochs(ds, &a, &t);
	if (rc != 0)
		goto done;
	if (a.stats)
		print_stats(&t);
	print_summary(&t, &a, hex);
done:
	free(t.rows);
	cachew_dataset_release(ds);
	cachew_options_destroy(a.opts);
	return rc;
}

/* ---- head ------------------------------------------------------------------ */

typedef struct head_args {
	cachew_options *opts;
	const char *pipeline;
	int64_t n;
	bool json;
} head_args;

static int
head_flag(int argc, char **argv, int *i, head_args *a)
{
	const char *arg = argv[*i], *v = NULL;
	int m = options_flag(argc, argv, i, a->opts);

	if (m >= 0)
		return m;
	if (strcmp(arg, "--json") == 0)
		a->json = true;
	else if ((m = cwi_flag_value(argc, argv, i, "-n", &v)) != 0) {
		if (m < 0 || !parse_i64(v, &a->n) || a->n < 0)
			return usage_error("-n expects a count, 0 or more");
	} else
		return usage_error("head: unknown flag '%s'", arg);
	return 0;
}

/* Pulls a->n elements (fewer when the pipeline ends first) and prints
 * each as it comes; returns 0, or 1 after a failure (its message on
 * stderr, after the elements that came before it). */
static int
head_print_elements(cachew_dataset *ds, const head_args *a)
{
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv = CACHEW_OK;
	int64_t k;

	rv = cachew_iterator_create(&it, ds, a->opts);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: %s\n", last_error(rv));
		return EXIT_RUNTIME;
	}
	for (k = 0; k < a->n && (rv = cachew_iterator_next(it, &e)) ==
	     CACHEW_OK; k++) {
		cwi_head_print(stdout, e, (uint64_t)k, a->json);
		cachew_element_release(e);
	}
	if (rv != CACHEW_OK && rv != CACHEW_EOF) {
		const char *msg = cachew_iterator_errmsg(it);

		fflush(stdout);
		fprintf(stderr, "cachew: %s\n",
		    msg != NULL && msg[0] != '\0' ? msg : cachew_strerror(rv));
	}
	cachew_iterator_destroy(it);
	return rv == CACHEW_OK || rv == CACHEW_EOF ? 0 : EXIT_RUNTIME;
}

/* `cachew head [-n N] [--json] "<pipeline>"`: the first N elements (5 by
 * default), to look at what a pipeline yields. */
static int
cmd_head(int argc, char **argv)
{
	head_args a = {.n = 5};
	cachew_dataset *ds = NULL;
	bool flags_done = false;
	int rc;

	if (cachew_options_create(&a.opts) != CACHEW_OK) {
		fprintf(stderr, "cachew: out of memory\n");
		return EXIT_RUNTIME;
	}
	rc = options_from_env(a.opts);
	for (int i = 1; i < argc && rc == 0; i++) {
		if (!flags_done && strcmp(argv[i], "--") == 0)
			flags_done = true;
		else if (!flags_done && argv[i][0] == '-' && argv[i][1] != '\0')
			rc = head_flag(argc, argv, &i, &a);
		else
			rc = take_pipeline(argv[i], &a.pipeline);
	}
	if (rc == 0 && a.pipeline == NULL)
		rc = usage_error("head: missing the pipeline string");
	if (rc == 0)
		rc = parse_pipeline(a.pipeline, &ds);
	if (rc == 0)
		rc = head_print_elements(ds, &a);
	cachew_dataset_release(ds);
	cachew_options_destroy(a.opts);
	return rc;
}

/* ---- explain ------------------------------------------------------------- */

static const cwi_param_spec *
param_spec(const cwi_dataset_op *op, const char *name)
{
	for (size_t i = 0; i < op->nparams; i++)
		if (strcmp(op->params[i].name, name) == 0)
			return &op->params[i];
	return NULL;
}

/* "name=value, ..." of a node's canonical params; `auto` for CACHEW_AUTO
 * in parameters that accept it. */
static void
print_params(cwi_strbuf *sb, const cachew_dataset *ds)
{
	const cachew_params *p = cachew_dataset_params(ds);

	for (size_t i = 0; i < cachew_params_count(p); i++) {
		const char *key = cachew_params_key(p, i);
		const cwi_value *v = cwi_map_get(&p->map, key);
		const cwi_param_spec *s = param_spec(ds->op, key);

		cwi_strbuf_printf(sb, "%s%s=", i > 0 ? ", " : "", key);
		if (s != NULL && (s->flags & CWI_PF_AUTO) && v != NULL &&
		    v->type == CWI_V_INT && v->u.i == CACHEW_AUTO)
			cwi_strbuf_puts(sb, "auto");
		else if (v != NULL)
			cwi_value_print(sb, v);
	}
}

/* The node's element spec and cardinality: "  spec=i64[] card=42". */
static void
explain_spec(const cachew_dataset *ds)
{
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	cwi_spec_print(&sb, &ds->spec);
	cwi_strbuf_puts(&sb, " card=");
	cwi_card_print(&sb, ds->card);
	printf("  spec=%s", sb.data != NULL && !sb.oom ? sb.data : "?");
	cwi_strbuf_free(&sb);
}

/* One line per node, root first, inputs indented below their consumer. */
static void
explain_node(const cachew_dataset *ds, int depth)
{
	cachew_fingerprint fp;
	cwi_strbuf sb;
	char hex[33];

	cwi_strbuf_init(&sb);
	print_params(&sb, ds);
	(void)cachew_dataset_fingerprint(ds, &fp);
	cachew_fingerprint_hex(&fp, hex);
	printf("%*s%s", depth * 2, "", cachew_dataset_op(ds));
	if (ds->detail != NULL && ds->detail[0] != '\0')
		printf(" [%s]", ds->detail);
	printf("(%s)  fp=%s", sb.data != NULL && !sb.oom ? sb.data : "",
	    hex);
	explain_spec(ds);
	/* The plugin build the function came from: part of the fp. */
	if (ds->fn != NULL && ds->fn->plugin != NULL)
		printf("  plugin=%s version=%s build=%s", ds->fn->plugin->name,
		    ds->fn->plugin->version[0] != '\0' ? ds->fn->plugin->version
							 : "none",
		    ds->fn->plugin->hash_hex);
	printf("\n");
	cwi_strbuf_free(&sb);
	for (size_t i = 0; i < cachew_dataset_num_inputs(ds); i++)
		explain_node(cachew_dataset_input(ds, i), depth + 1);
}

/* Prints the canonical string and checks that it parses back to the same
 * fingerprint. */
static int
explain_round_trip(const cachew_dataset *ds)
{
	cachew_fingerprint a, b;
	cachew_dataset *again;
	char *canon, ha[33], hb[33];
	cachew_err rv;

	rv = cachew_dataset_to_string(ds, &canon);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: cannot print the pipeline: %s\n",
		    last_error(rv));
		return EXIT_RUNTIME;
	}
	printf("canonical: %s\n", canon);
	rv = cachew_dataset_parse(&again, canon);
	cachew_free(canon);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: round trip failed: the canonical "
				"string does not parse: %s\n", last_error(rv));
		return EXIT_RUNTIME;
	}
	(void)cachew_dataset_fingerprint(ds, &a);
	(void)cachew_dataset_fingerprint(again, &b);
	cachew_dataset_release(again);
	cachew_fingerprint_hex(&a, ha);
	cachew_fingerprint_hex(&b, hb);
	if (strcmp(ha, hb) != 0) {
		fprintf(stderr, "cachew: round trip failed: fingerprint %s "
				"became %s\n", ha, hb);
		return EXIT_RUNTIME;
	}
	printf("round trip: ok\n");
	return 0;
}

/* How the service would split the pipeline (exec_split.h). */
static int
explain_split(cachew_dataset *ds)
{
	cwi_strbuf sb;
	int rc = 0;

	cwi_strbuf_init(&sb);
	if (cwi_split_explain(ds, &sb) != CACHEW_OK) {
		fprintf(stderr, "cachew: out of memory\n");
		rc = EXIT_RUNTIME;
	} else if (sb.data != NULL) {
		fputs(sb.data, stdout);
	}
	cwi_strbuf_free(&sb);
	return rc;
}

static int
cmd_explain(int argc, char **argv)
{
	const char *pipeline = NULL, *v;
	cachew_dataset *ds;
	int rc = 0, m;

	for (int i = 1; i < argc && rc == 0; i++) {
		if ((m = cwi_flag_value(argc, argv, &i, "--plugin", &v)) != 0)
			rc = m < 0 ? usage_error("--plugin expects a path")
				   : load_plugin(v);
		else if (argv[i][0] == '-' && argv[i][1] != '\0')
			rc = usage_error("explain: unknown flag '%s'", argv[i]);
		else
			rc = take_pipeline(argv[i], &pipeline);
	}
	if (rc != 0)
		return rc;
	if (pipeline == NULL)
		return usage_error("explain: missing the pipeline string");
	rc = parse_pipeline(pipeline, &ds);
	if (rc != 0)
		return rc;
	explain_node(ds, 0);
	rc = explain_round_trip(ds);
	if (rc == 0)
		rc = explain_split(ds);
	cachew_dataset_release(ds);
	return rc;
}

/* ---- ops ----------------------------------------------------------------- */

static const char *
ptype_name(const cwi_param_spec *s)
{
	switch (s->type) {
	case CWI_P_INT:
		return (s->flags & CWI_PF_AUTO) ? "int|auto" : "int";
	case CWI_P_FLOAT:
		return "float";
	case CWI_P_BOOL:
		return "bool";
	case CWI_P_STR:
		return "str";
	case CWI_P_STRS:
		return "str|[str]";
	case CWI_P_LIST:
		return "list";
	case CWI_P_ANY:
		return "any";
	case CWI_P_FLOATS:
		return "float|[float]|{name=float}";
	}
	return "?";
}

/* The default of a parameter as it would be written in a pipeline. */
static const char *
pdefault(const cwi_param_spec *s, char *buf, size_t len)
{
	if (s->flags & CWI_PF_REQUIRED)
		return "required";
	if (s->flags & CWI_PF_OPTIONAL)
		return "(absent)";
	switch (s->type) {
	case CWI_P_INT:
		if ((s->flags & CWI_PF_AUTO) && s->def_int == CACHEW_AUTO)
			return "auto";
		snprintf(buf, len, "%" PRId64, s->def_int);
		return buf;
	case CWI_P_FLOAT:
	case CWI_P_FLOATS:
		snprintf(buf, len, "%g", s->def_float);
		return buf;
	case CWI_P_BOOL:
		return s->def_int ? "true" : "false";
	case CWI_P_STR:
	case CWI_P_STRS:
		snprintf(buf, len, "\"%s\"",
		    s->def_str != NULL ? s->def_str : "");
		return buf;
	case CWI_P_LIST:
		return "[]";
	case CWI_P_ANY:
		return "(none)";
	}
	return "?";
}

/* Parameter flags that matter to a user, comma-separated. */
static const char *
pflags(const cwi_param_spec *s, char *buf, size_t len)
{
	buf[0] = '\0';
	if (s->flags & CWI_PF_PERF)
		snprintf(buf, len, "performance only (not fingerprinted)");
	if (s->type == CWI_P_INT && s->min < s->max && s->max >= INT32_MAX)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s>= %" PRId64,
		    buf[0] ? ", " : "", s->min);
	else if (s->type == CWI_P_INT && s->min < s->max)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%" PRId64
		    "..%" PRId64, buf[0] ? ", " : "", s->min, s->max);
	return buf;
}

static void
op_props(const cwi_dataset_op *op, char *buf, size_t len)
{
	static const struct {
		unsigned flag;
		const char *name;
	} names[] = {
	    {CWI_OPF_SOURCE, "source"},
	    {CWI_OPF_SPLITTABLE, "splittable"},
	    {CWI_OPF_RANDOM, "random (uses the seed)"},
	    {CWI_OPF_PASSTHROUGH, "passes data through unchanged"},
	    {CWI_OPF_FN_MAP, "takes a map function"},
	    {CWI_OPF_FN_FILTER, "takes a filter function"},
	    {CWI_OPF_FN_FLAT, "takes a flat_map function"},
	    {CWI_OPF_FILES, "reads files (fingerprint covers each file's size and mtime, or an object's ETag and size)"},
	    {CWI_OPF_ASYNC, "runs on its own threads"},
	};
	size_t k = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if ((op->flags & names[i].flag) && k < len)
			k += (size_t)snprintf(buf + k, len - k, "%s%s",
			    k > 0 ? ", " : "", names[i].name);
}

static void
op_inputs(const cwi_dataset_op *op, char *buf, size_t len)
{
	if (op->max_inputs == 0)
		snprintf(buf, len, "none");
	else if (op->min_inputs == op->max_inputs)
		snprintf(buf, len, "%u", op->min_inputs);
	else
		snprintf(buf, len, "%u to %u", op->min_inputs, op->max_inputs);
}

/* "range(stop), range(start, stop), ..." when the op names its positional
 * forms; empty when positional values fill parameters in table order. */
static void
op_positional(const cwi_dataset_op *op, char *buf, size_t len, bool md)
{
	size_t k = 0;

	buf[0] = '\0';
	for (size_t n = 1; n <= CWI_MAX_POSITIONAL && k < len; n++) {
		const char *const *names = op->positional[n];
		if (names == NULL)
			continue;
		k += (size_t)snprintf(buf + k, len - k, "%s%s%s(",
		    k > 0 ? ", " : "", md ? "`" : "", op->name);
		for (size_t j = 0; j < n && k < len; j++)
			k += (size_t)snprintf(buf + k, len - k, "%s%s",
			    j > 0 ? ", " : "", names[j]);
		if (k < len)
			k += (size_t)snprintf(
			    buf + k, len - k, ")%s", md ? "`" : "");
	}
}

static const char *
fn_kind(cachew_op_kind kind)
{
	switch (kind) {
	case CACHEW_OP_MAP:
		return "map";
	case CACHEW_OP_FILTER:
		return "filter";
	case CACHEW_OP_FLAT_MAP:
		return "flat_map";
	}
	if ((int)kind == CWI_FN_SOURCE)
		return "source";
	return "?";
}

static void
ops_text_op(const cwi_dataset_op *op)
{
	char props[256], inputs[32], pos[256], b1[64], b2[128];

	op_props(op, props, sizeof(props));
	op_inputs(op, inputs, sizeof(inputs));
	op_positional(op, pos, sizeof(pos), false);
	printf("%s - %s\n", op->name, op->doc != NULL ? op->doc : "");
	printf("    inputs: %s%s%s\n", inputs, props[0] ? "; " : "", props);
	if (pos[0] != '\0')
		printf("    forms: %s\n", pos);
	for (size_t i = 0; i < op->nparams; i++) {
		const cwi_param_spec *s = &op->params[i];
		const char *notes = pflags(s, b2, sizeof(b2));

		printf("    %-16s %-10s %-10s %s%s%s%s\n", s->name,
		    ptype_name(s), pdefault(s, b1, sizeof(b1)),
		    s->help != NULL ? s->help : "",
		    notes[0] ? " [" : "", notes, notes[0] ? "]" : "");
	}
	printf("\n");
}

/* Where a function comes from: built in, registered from C, or a
 * plugin (its name and version). */
static const char *
fn_origin(const cwi_fn *fn, char *buf, size_t len)
{
	if (fn->builtin)
		return "built-in";
	if (fn->plugin == NULL)
		return "registered";
	snprintf(buf, len, "plugin %s%s%s", fn->plugin->name,
	    fn->plugin->version[0] != '\0' ? " " : "", fn->plugin->version);
	return buf;
}

static void
ops_text(void)
{
	printf("Dataset operators (%zu):\n\n", cwi_dataset_op_count());
	for (size_t i = 0; i < cwi_dataset_op_count(); i++)
		ops_text_op(cwi_dataset_op_at(i));
	printf("Functions for map/filter/flat_map/interleave, and user sources (%zu):\n",
	    cwi_fn_count());
	for (size_t i = 0; i < cwi_fn_count(); i++) {
		const cwi_fn *fn = cwi_fn_at(i);
		char origin[160];
		printf("    %-20s %-9s %-7s %s\n", fn->name,
		    fn_kind(fn->def.kind),
		    (fn->def.flags & CACHEW_OP_RANDOM) ? "random" : "",
		    fn_origin(fn, origin, sizeof(origin)));
		if (fn->def.doc != NULL)
			printf("        %s\n", fn->def.doc);
	}
}

/* Markdown table cells must not contain a bare '|'. */
static void
md_cell(const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '|')
			putchar('\\');
		putchar(*s);
	}
}

static void
ops_markdown_op(const cwi_dataset_op *op)
{
	char props[256], inputs[32], pos[256], b1[64], b2[128];

	op_props(op, props, sizeof(props));
	op_inputs(op, inputs, sizeof(inputs));
	op_positional(op, pos, sizeof(pos), true);
	printf("### `%s`\n\n%s.\n\n", op->name, op->doc != NULL ? op->doc : "");
	if (op->note != NULL)
		printf("%s\n\n", op->note);
	printf("- Input pipelines: %s\n", inputs);
	if (props[0] != '\0')
		printf("- Properties: %s\n", props);
	printf("- Positional forms: %s\n",
	    pos[0] ? pos : "values fill the parameters in table order");
	if (op->saves != NULL)
		printf("- Saved position (`cachew_iterator_save`): %s\n",
		    op->saves);
	printf("\n");
	if (op->nparams == 0) {
		printf("No parameters.\n\n");
		return;
	}
	printf("| parameter | type | default | meaning | notes |\n");
	printf("|---|---|---|---|---|\n");
	for (size_t i = 0; i < op->nparams; i++) {
		const cwi_param_spec *s = &op->params[i];
		printf("| `%s` | ", s->name);
		md_cell(ptype_name(s));
		if (s->flags & (CWI_PF_REQUIRED | CWI_PF_OPTIONAL))
			printf(" | *%s* | ", pdefault(s, b1, sizeof(b1)));
		else
			printf(" | `%s` | ", pdefault(s, b1, sizeof(b1)));
		md_cell(s->help != NULL ? s->help : "");
		printf(" | ");
		md_cell(pflags(s, b2, sizeof(b2)));
		printf(" |\n");
	}
	printf("\n");
}

/* The tf.data operators with no operator of their own here, and why: a
 * fixed text, kept with the generator so the file says it next to the
 * table it is about. */
static void
ops_markdown_left_out(void)
{
	static const char *const rows[][3] = {
	    {"`map`, `filter`, `flat_map` with a Python function",
		"a registered function (built-in, C, plugin)",
		"a worker is a C process: it runs what it has loaded, and a "
		"function's name and build are part of the fingerprint"},
	    {"`from_generator`", "a user source (`cachew_source_register`)",
		"the same reason; a source's splits are what lets the service "
		"share it among workers"},
	    {"`from_tensor_slices`", "`from_list`", "the same, by another name"},
	    {"`dense_to_ragged_batch`", "`ragged_batch`", "the same"},
	    {"`snapshot`, `save`, `load`",
		"`cache_put`, `cache_get`, `cache(root)`, `autocache`",
		"one verified cache format serves all of them, shared across "
		"jobs by fingerprint"},
	    {"`group_by_reducer`; `group_by_window`'s general `reduce_func` "
		"and `window_size_func`",
		"`group_by_window` that batches each window, "
		"`bucket_by_sequence_length`",
		"a pipeline string has no lambdas, and a registered function "
		"maps an element to an element, not a dataset to a dataset"},
	    {"`sparse_batch`, `from_sparse_tensor_slices`", "none",
		"elements are dense tensors (ragged batches as values and "
		"row splits); no sparse type"},
	    {"`rejection_resample`", "`filter` per class and "
		"`sample_from_datasets`",
		"it estimates the class distribution online with a Python "
		"class function; the mixture with fixed weights covers the "
		"common use"},
	    {"`assert_cardinality`", "`cachew_dataset_cardinality`",
		"cardinality is computed when the pipeline is built and "
		"printed by `cachew explain`"},
	    {"`get_single_element`", "`reduce`, or one `cachew_iterator_next`",
		"no graph-mode tensors to return"},
	    {"`apply`, `options`, `with_options`",
		"pipeline strings compose; iterator options",
		"options belong to an iterator (or `cachew.Dataset.with_options` "
		"in Python), not to the graph, so one graph runs anywhere"},
	    {"`shuffle_and_repeat`, `map_and_batch`, `parallel_interleave`",
		"`shuffle | repeat`, `map(parallel=) | batch`, "
		"`interleave(parallel=)`",
		"tf.data deprecated these fusions"},
	    {"`prefetch_to_device`, `copy_to_device`", "none",
		"no accelerators here; the Python package hands tensors to "
		"torch without a copy (DLPack)"},
	    {"`CsvDataset`, `SqlDataset`, `LMDBDataset`",
		"`text_lines` and map functions, or a user source",
		"formats outside the TFRecord family are a plugin's job"},
	    {"`distribute` (tf.data service)", "`CACHEW_SERVICE`, `service=`",
		"the service is the same pipeline on remote workers, chosen "
		"by configuration"},
	};

	printf("\n## tf.data operators left out\n\n"
	       "What tf.data offers that has no operator of its own here, "
	       "what to use instead, and why.\n\n"
	       "| tf.data | here | why |\n|---|---|---|\n");
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		printf("| ");
		md_cell(rows[i][0]);
		printf(" | ");
		md_cell(rows[i][1]);
		printf(" | ");
		md_cell(rows[i][2]);
		printf(" |\n");
	}
}

static void
ops_markdown(void)
{
	printf("<!-- Generated by `cachew ops --markdown` (cachew %s). Do not "
	       "edit: regenerate. -->\n", cachew_version());
	printf("# Operators\n\n"
	       "This file is generated by `cachew ops --markdown` from the "
	       "operator registry.\n"
	       "A pipeline string joins stages with `|`; each stage is "
	       "`name(args)` with positional\nvalues and `key=value` pairs. "
	       "Parameters marked *performance only* do not\nchange the data "
	       "and are left out of the fingerprint. `auto` is tuned "
	       "online.\n\n"
	       "## Dataset operators\n\n");
	for (size_t i = 0; i < cwi_dataset_op_count(); i++)
		ops_markdown_op(cwi_dataset_op_at(i));
	printf("## Functions\n\n"
	       "Named functions for `map`, `filter`, `flat_map` and "
	       "`interleave`. Extra `key=value`\npairs of the stage go to the "
	       "function (e.g. `map(add, value=1)`).\n\n"
	       "| function | kind | random | origin | what it does |\n"
	       "|---|---|---|---|---|\n");
	for (size_t i = 0; i < cwi_fn_count(); i++) {
		const cwi_fn *fn = cwi_fn_at(i);
		char origin[160];
		printf("| `%s` | %s | %s | %s | ", fn->name,
		    fn_kind(fn->def.kind),
		    (fn->def.flags & CACHEW_OP_RANDOM) ? "yes" : "no",
		    fn_origin(fn, origin, sizeof(origin)));
		md_cell(fn->def.doc != NULL ? fn->def.doc : "");
		printf(" |\n");
	}
	ops_markdown_left_out();
}

static int
cmd_ops(int argc, char **argv)
{
	bool markdown = false;
	const char *v;
	int rc = 0, m;

	for (int i = 1; i < argc && rc == 0; i++) {
		if (strcmp(argv[i], "--markdown") == 0)
			markdown = true;
		else if ((m = cwi_flag_value(argc, argv, &i, "--plugin", &v)) != 0)
			rc = m < 0 ? usage_error("--plugin expects a path")
				   : load_plugin(v);
		else
			rc = usage_error("ops: unknown argument '%s'", argv[i]);
	}
	if (rc != 0)
		return rc;
	if (markdown)
		ops_markdown();
	else
		ops_text();
	return 0;
}

/* ---- gen ------------------------------------------------------------------ */

/* Reads "--name N" into *out when argv[*i] is that flag: 1 matched, 0 not
 * this flag, 2 (usage error) for a bad value. */
static int
gen_flag(int argc, char **argv, int *i, const char *name, int64_t min,
    int64_t *out)
{
	const char *v;
	int m = cwi_flag_value(argc, argv, i, name, &v);

	if (m == 0)
		return 0;
	if (m < 0 || !parse_i64(v, out) || *out < min)
		return usage_error("gen: %s expects an integer >= %lld", name,
		    (long long)min);
	return 1;
}

static int
cmd_gen(int argc, char **argv)
{
	int64_t n = -1, parts = 1, seed = 0, w = 500, h = 375, q = 90;
	bool images = argc > 1 && strcmp(argv[1], "imagenet") == 0;
	const char *out = NULL;
	char err[512];
	uint64_t bytes = 0, t0 = now_ns();
	cachew_err rv;

	if (argc < 2 || (!images && strcmp(argv[1], "text") != 0))
		return usage_error("gen: expected 'imagenet' or 'text'");
	for (int i = 2; i < argc; i++) {
		int m = cwi_flag_value(argc, argv, &i, "--out", &out);
		if (m == 0)
			m = gen_flag(argc, argv, &i, images ? "--images" : "--lines", 0, &n);
		if (m == 0)
			m = gen_flag(argc, argv, &i, images ? "--shards" : "--files", 1, &parts);
		if (m == 0)
			m = gen_flag(argc, argv, &i, "--seed", 0, &seed);
		if (m == 0 && images)
			m = gen_flag(argc, argv, &i, "--width", 16, &w);
		if (m == 0 && images)
			m = gen_flag(argc, argv, &i, "--height", 16, &h);
		if (m == 0 && images)
			m = gen_flag(argc, argv, &i, "--quality", 1, &q);
		if (m == 0)
			return usage_error("gen: unknown argument '%s'", argv[i]);
		if (m < 0)
			return usage_error("gen: --out expects a directory");
		if (m == EXIT_USAGE)
			return m;
	}
	if (out == NULL || n < 0)
		return usage_error("gen %s: --out and %s are required", argv[1],
		    images ? "--images" : "--lines");
	if (images) {
		cwi_gen_imagenet_config cfg = {.out_dir = out, .images = n,
		    .shards = parts, .seed = (uint64_t)seed,
		    .width = (int)(w > 8192 ? 8192 + 1 : w),
		    .height = (int)(h > 8192 ? 8192 + 1 : h),
		    .quality = (int)(q > 100 ? 101 : q)};
		rv = cwi_gen_imagenet(&cfg, &bytes, err, sizeof(err));
	} else {
		cwi_gen_text_config cfg = {.out_dir = out, .lines = n,
		    .files = parts, .seed = (uint64_t)seed};
		rv = cwi_gen_text(&cfg, &bytes, err, sizeof(err));
	}
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew: gen %s: %s\n", argv[1], err);
		return EXIT_RUNTIME;
	}
	double s = (double)(now_ns() - t0) / 1e9;
	printf("wrote %lld %s in %lld %s to %s: %.1f MB, %.1f s, %.0f %s/s\n",
	    (long long)n, images ? "images" : "lines", (long long)parts,
	    images ? "shards" : "files", out, (double)bytes / 1e6, s,
	    s > 0 ? (double)n / s : 0.0, images ? "images" : "lines");
	return 0;
}

/* ---- version, help, dispatch --------------------------------------------- */

static int
cmd_version(int argc, char **argv)
{
	(void)argv;
	if (argc > 1)
		return usage_error("version: takes no arguments");
	printf("cachew %s\n", cachew_version());
	return 0;
}

static int
cmd_help(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fputs(usage_text, stdout);
	return 0;
}

/* `cachew <command> --help` prints the usage (before `--`). */
static bool
wants_help(int argc, char **argv)
{
	for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0)
			return true;
	return false;
}

typedef struct command {
	const char *name;
	int (*main)(int argc, char **argv);
} command;

static const command commands[] = {
    {"run", cmd_run},
    {"explain", cmd_explain},
    {"head", cmd_head},
    {"ops", cmd_ops},
    {"gen", cmd_gen},
    {"cache", cwi_cache_cli},
    {"status", cwi_status_cli},
    {"top", cwi_top_cli},
    {"plot", cwi_plot_cli},
    {"sim", cwi_sim_cli},
    {"version", cmd_version},
    {"--version", cmd_version},
    {"help", cmd_help},
    {"--help", cmd_help},
    {"-h", cmd_help},
};

int
main(int argc, char **argv)
{
	int rc;

	/* `cachew ops` lists the registry directly. */
	cwi_builtins_ready();
	if (argc < 2) {
		fputs(usage_text, stderr);
		return EXIT_USAGE;
	}
	cachew_log_set(cachew_log_stderr, NULL, CACHEW_LOG_WARN);
	/* `cache`, `status`, `top` and `sim` print their own subcommand
	 * help. */
	if (strcmp(argv[1], "cache") != 0 && strcmp(argv[1], "status") != 0 &&
	    strcmp(argv[1], "top") != 0 && strcmp(argv[1], "sim") != 0 &&
	    strcmp(argv[1], "plot") != 0 &&
	    wants_help(argc, argv))
		return cmd_help(argc, argv);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[1], commands[i].name) == 0) {
			rc = commands[i].main(argc - 1, argv + 1);
			if (fflush(stdout) != 0 && rc == 0)
				rc = EXIT_RUNTIME;
			return rc;
		}
	}
	return usage_error("unknown command '%s'", argv[1]);
}
