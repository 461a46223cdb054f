/*
 * check_cli.c - the `cachew` command as a user runs it (real processes of
 * <build>/cachew, exit codes, stdout and stderr), and the example plugin
 * (<build>/plugin_example.so) loaded in process.
 */
#include "cwt.h"

#include <math.h>
#include <pty.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "../src/graph/graph.h"

/* ---- running the CLI ----------------------------------------------------- */

typedef struct cli_result {
	int status; /* exit code, or 128 + signal */
	char *out;  /* stdout, NUL-terminated */
	char *err;  /* stderr */
} cli_result;

static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
	buf[len] = '\0';
	fclose(f);
	return buf;
}

static void
cli_child(const char *env, char **argv, const char *out, const char *err)
{
	if (freopen(out, "w", stdout) == NULL ||
	    freopen(err, "w", stderr) == NULL)
		_exit(127);
	if (env != NULL)
		putenv((char *)env);
	execv(argv[0], argv);
	fprintf(stderr, "exec %s failed\n", argv[0]);
	_exit(127);
}

/*
 * Runs `<build>/cachew arg...` (NULL-terminated) with one extra environment
 * assignment `env` ("NAME=VALUE", or NULL), and collects its exit status,
 * stdout and stderr. Output goes through files: nothing can block on a
 * full pipe.
 */
static cli_result
cli_env(const char *env, ...)
{
	char bin[512], out[600], err[600], *argv[32];
	char *dir = cwt_tmpdir();
	cli_result r;
	va_list ap;
	size_t n = 1;
	pid_t pid;
	int st;

	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	snprintf(out, sizeof(out), "%s/stdout", dir);
	snprintf(err, sizeof(err), "%s/stderr", dir);
	argv[0] = bin;
	va_start(ap, env);
	while ((argv[n] = va_arg(ap, char *)) != NULL && n < 30)
		n++;
	va_end(ap);
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		cli_child(env, argv, out, err);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	r.out = slurp(out);
	r.err = slurp(err);
	cwt_rmtree(dir);
	free(dir);
	return r;
}

#define cli(...) cli_env(NULL, __VA_ARGS__, (char *)NULL)

static void
cli_free(cli_result *r)
{
	free(r->out);
	free(r->err);
}

static void
plugin_path(char *buf, size_t len)
{
	cwt_build_file(buf, len, "plugin_example.so");
}

/* ---- a strict checker for the flat JSON object of `run --json` ----------- */

static const char *
json_ws(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

static const char *
json_string(const char *p)
{
	if (*p++ != '"')
		return NULL;
	for (; *p != '"'; p++) {
		if (*p == '\0' || (unsigned char)*p < 0x20)
			return NULL;
		if (*p == '\\' && *++p == '\0')
			return NULL;
	}
	return p + 1;
}

static const char *
json_number(const char *p)
{
	const char *s = p;

	if (*p == '-')
		p++;
	if (*p == '0')
		p++;
	else if (*p >= '1' && *p <= '9')
		while (*p >= '0' && *p <= '9')
			p++;
	else
		return NULL;
	if (*p == '.') {
		if (*++p < '0' || *p > '9')
			return NULL;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (*p < '0' || *p > '9')
			return NULL;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	return p > s ? p : NULL;
}

/* True if `line` is exactly one JSON object of string keys and string or
 * number values. */
static bool
json_flat_object_valid(const char *p)
{
	p = json_ws(p);
	if (*p++ != '{')
		return false;
	p = json_ws(p);
	if (*p == '}')
		return *json_ws(p + 1) == '\0';
	for (;;) {
		p = json_string(json_ws(p));
		if (p == NULL || *(p = json_ws(p)) != ':')
			return false;
		p = json_ws(p + 1);
		p = *p == '"' ? json_string(p) : json_number(p);
		if (p == NULL)
			return false;
		p = json_ws(p);
		if (*p == '}')
			return *json_ws(p + 1) == '\0';
		if (*p++ != ',')
			return false;
	}
}

/* The raw text of the value of "key" (quotes stripped), copied to buf. */
static const char *
json_get(const char *obj, const char *key, char *buf, size_t len)
{
	char pat[64];
	const char *p, *end;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(obj, pat);
	ck_assert_msg(p != NULL, "no key %s in %s", key, obj);
	p += strlen(pat);
	if (*p == '"')
		end = strchr(++p, '"');
	else
		end = p + strcspn(p, ",}");
	ck_assert_ptr_nonnull(end);
	snprintf(buf, len, "%.*s", (int)(end - p), p);
	return buf;
}

/* The last non-empty line of s (modified in place). */
static char *
last_line(char *s)
{
	size_t n = strlen(s);
	char *nl;

	while (n > 0 && s[n - 1] == '\n')
		s[--n] = '\0';
	nl = strrchr(s, '\n');
	return nl != NULL ? nl + 1 : s;
}

static int64_t
json_int(const char *obj, const char *key)
{
	char buf[64];

	return strtoll(json_get(obj, key, buf, sizeof(buf)), NULL, 10);
}

static void
fingerprint_of(const char *pipeline, char hex[33])
{
	cachew_dataset *ds;
	cachew_fingerprint fp;

	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_fingerprint_hex(&fp, hex);
	cachew_dataset_release(ds);
}

/* ---- run ----------------------------------------------------------------- */

START_TEST(run_json_reports_exact_elements_and_fingerprint)
{
	const char *pipeline = "range(1000) | batch(64)";
	cli_result r = cli("run", "--json", pipeline);
	char buf[64], hex[33], *line;

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	line = last_line(r.out);
	ck_assert_msg(json_flat_object_valid(line), "not JSON: %s", line);
	ck_assert_int_eq(json_int(line, "elements"), 16);
	ck_assert_int_eq(json_int(line, "bytes"), 8000);
	(void)json_get(line, "seconds", buf, sizeof(buf));
	(void)json_get(line, "elements_per_s", buf, sizeof(buf));
	fingerprint_of(pipeline, hex);
	ck_assert_str_eq(json_get(line, "fingerprint", buf, sizeof(buf)), hex);
	cli_free(&r);
}
END_TEST

START_TEST(run_epochs_multiply_the_count)
{
	cli_result r = cli("run", "--json", "--epochs", "3",
	    "range(1000) | batch(64)");

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_int_eq(json_int(last_line(r.out), "elements"), 48);
	ck_assert_int_eq(json_int(last_line(r.out), "epochs"), 3);
	cli_free(&r);
}
END_TEST

/* The digest (the sum mod 2^64 of every element's hash) that `cachew run
 * --json --seed 7` prints for `epochs` epochs from the epoch option
 * `epoch` on `service`. */
static uint64_t
run_digest(const char *service, const char *epochs, const char *epoch,
    const char *pipeline)
{
	char set_service[64], set_epoch[64], buf[64];
	uint64_t d;
	cli_result r;

	snprintf(set_service, sizeof(set_service), "service=%s", service);
	snprintf(set_epoch, sizeof(set_epoch), "epoch=%s", epoch);
	r = cli("run", "--json", "--seed", "7", "--epochs", epochs, "--set",
	    set_service, "--set", set_epoch, pipeline);
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	d = strtoull(json_get(last_line(r.out), "digest", buf, sizeof(buf)),
	    NULL, 16);
	cli_free(&r);
	return d;
}

/* --epochs N runs epochs base..base+N-1, each drawing its own random
 * functions' values (issue 20, item 2), on the plain executor and on the
 * embedded service alike: two epochs are the sum of each run alone. */
START_TEST(run_epochs_draw_anew_each_epoch)
{
	static const char *const p = "range(500) | map(uniform) | batch(10)";
	static const char *const services[] = {"local", "embedded"};
	uint64_t d[2][3];

	for (int i = 0; i < 2; i++) {
		d[i][0] = run_digest(services[i], "1", "0", p);
		d[i][1] = run_digest(services[i], "1", "1", p);
		d[i][2] = run_digest(services[i], "2", "0", p);
		ck_assert_uint_ne(d[i][0], d[i][1]);
		ck_assert_uint_eq(d[i][2], d[i][0] + d[i][1]);
	}
	for (int k = 0; k < 3; k++)
		ck_assert_uint_eq(d[1][k], d[0][k]);
}
END_TEST

START_TEST(run_prints_human_summary)
{
	cli_result r = cli("run", "range(100) | batch(10)");

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_ptr_nonnull(strstr(r.out, "elements     10\n"));
	ck_assert_ptr_nonnull(strstr(r.out, "fingerprint  "));
	/* stderr is not a terminal here: no progress line. */
	ck_assert_str_eq(r.err, "");
	cli_free(&r);
}
END_TEST

/* Runs `cachew run ARGS...` (NULL-terminated) with its stdout and stderr
 * on a pseudo-terminal, as in a shell, so that it draws its progress
 * line; everything the terminal showed (heap, NUL-terminated). */
static char *
run_on_a_terminal(int *status, ...)
{
	char bin[512], *argv[16], *text = calloc(1, 1 << 16);
	size_t n = 2, len = 0;
	va_list ap;
	int master, st;
	pid_t pid;

	ck_assert_ptr_nonnull(text);
	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	argv[0] = bin;
	argv[1] = "run";
	va_start(ap, status);
	while ((argv[n] = va_arg(ap, char *)) != NULL && n < 14)
		n++;
	va_end(ap);
	argv[n] = NULL;
	fflush(NULL);
	pid = forkpty(&master, NULL, NULL, NULL);
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		execv(bin, argv);
		_exit(127);
	}
	/* Read until the child closes the terminal (EIO on Linux). */
	for (;;) {
		ssize_t got = read(master, text + len, (1 << 16) - 1 - len);
		if (got <= 0)
			break;
		len += (size_t)got;
	}
	close(master);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	*status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	return text;
}

/* Checks every frame "\rN / TOTAL elements  P%  ETA ..." of a progress
 * line: TOTAL as given, P = 100 N / TOTAL; returns how many there were. */
static int
progress_frames_agree(const char *text, unsigned total)
{
	int frames = 0;

	for (const char *p = strchr(text, '\r'); p != NULL;
	     p = strchr(p + 1, '\r')) {
		unsigned n, t;
		double pct;
		char eta[8];

		if (sscanf(p + 1, "%u / %u elements %lf%% %3s", &n, &t, &pct,
			eta) != 4)
			continue;
		ck_assert_uint_eq(t, total);
		ck_assert_msg(fabs(pct - 100.0 * n / t) < 0.051, "%u / %u "
		    "shown as %.1f%%", n, t, pct);
		ck_assert_str_eq(eta, "ETA");
		frames++;
	}
	return frames;
}

/* issue 17, item 2: on a terminal, the progress line of a run whose
 * cardinality is known shows the count out of the total, the percentage
 * and an ETA (2 epochs of 40: out of 80; infinite but cut by --save-at:
 * out of the cut); an unknown cardinality (unique) shows the count and
 * the rate only. Each pipeline sleeps 20 ms per element, so each lasts
 * long enough (>= 0.3 s) for the line's 200 ms redraw to come. */
START_TEST(run_progress_shows_total_percent_and_eta_when_known)
{
	char *dir = cwt_tmpdir(), *state = cwt_fmt("%s/state", dir), *text;
	int status;

	text = run_on_a_terminal(&status, "--epochs", "2",
	    "range(40) | map(sleep_us, us=20000)", (char *)NULL);
	ck_assert_msg(status == 0, "exit %d: %s", status, text);
	ck_assert_msg(progress_frames_agree(text, 80) >= 1, "%s", text);
	ck_assert_msg(strstr(text, "elements     80") != NULL, "%s", text);
	free(text);

	text = run_on_a_terminal(&status, "--save-at", "15", "--state", state,
	    "range(20) | repeat() | map(sleep_us, us=20000)", (char *)NULL);
	ck_assert_msg(status == 0, "exit %d: %s", status, text);
	ck_assert_msg(progress_frames_agree(text, 15) >= 1, "%s", text);
	free(text);

	text = run_on_a_terminal(&status, "range(20) | unique | "
	    "map(sleep_us, us=20000)", (char *)NULL);
	ck_assert_msg(status == 0, "exit %d: %s", status, text);
	ck_assert_msg(strstr(text, " elements  ") != NULL &&
	    strstr(text, "elements/s") != NULL, "%s", text);
	ck_assert_msg(strstr(text, "ETA") == NULL && strstr(text, " / ") ==
	    NULL && strchr(text, '%') == NULL, "%s", text);
	free(text);
	cwt_rmtree(dir);
	free(dir);
	free(state);
}
END_TEST

/* `cachew plot` refuses what is not a dispatcher's events log, naming the
 * file and the line: a missing file, a line that is not JSON, an object
 * that is no event, a log without job samples; and a usage error without
 * --out (exit 2). */
START_TEST(plot_refuses_a_bad_events_log_naming_the_line)
{
	char *dir = cwt_tmpdir(), *ev = cwt_fmt("%s/events.jsonl", dir);
	char *out = cwt_fmt("%s/plots", dir), *missing = cwt_fmt("%s/none",
	    dir);
	static const char good[] = "{\"ts_ns\":5,\"event\":\"job_created\","
				   "\"job_id\":1}\n";
	cli_result r;

	r = cli("plot", missing, "--out", out);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "none: No such file") != NULL, "%s", r.err);
	cli_free(&r);

	cwt_write_file(ev, "{\"ts_ns\":5,\"event\":\"job_created\"}\n{oops\n",
	    strlen("{\"ts_ns\":5,\"event\":\"job_created\"}\n{oops\n"));
	r = cli("plot", ev, "--out", out);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "events.jsonl:2: not JSON") != NULL, "%s",
	    r.err);
	cli_free(&r);

	cwt_write_file(ev, "[1, 2]\n", 7);
	r = cli("plot", ev, "--out", out);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "events.jsonl:1: not an event") != NULL,
	    "%s", r.err);
	cli_free(&r);

	cwt_write_file(ev, good, strlen(good));
	r = cli("plot", ev, "--out", out);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "no job_sample events") != NULL, "%s",
	    r.err);
	cli_free(&r);

	r = cli("plot", ev);
	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "--out DIR is required") != NULL, "%s",
	    r.err);
	cli_free(&r);
	cwt_rmtree(dir);
	free(dir);
	free(ev);
	free(out);
	free(missing);
}
END_TEST

START_TEST(run_stats_prints_a_row_per_operator)
{
	cli_result r = cli("run", "--stats", "range(100) | batch(10)");

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_ptr_nonnull(strstr(r.out, "busy ms"));
	ck_assert_ptr_nonnull(strstr(r.out, "\nrange "));
	ck_assert_ptr_nonnull(strstr(r.out, "\nbatch "));
	cli_free(&r);
}
END_TEST

START_TEST(run_parse_error_exits_2_naming_the_column)
{
	cli_result r = cli("run", "range(10) | batch(");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "column") != NULL, "stderr: %s", r.err);
	ck_assert_msg(strncmp(r.err, "cachew: ", 8) == 0, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_unknown_operator_exits_2)
{
	cli_result r = cli("run", "range(10) | no_such_op(3)");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "no_such_op") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_pipeline_failure_exits_1_with_message)
{
	/* add with a fractional value fails on i64 elements at run time. */
	cli_result r = cli("run", "range(10) | map(add, value=1.5)");

	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "not an integer") != NULL, "stderr: %s",
	    r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_unknown_flag_exits_2_naming_it)
{
	cli_result r = cli("run", "--bogus", "range(3)");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "--bogus") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_extra_argument_exits_2_naming_it)
{
	cli_result r = cli("run", "range(3)", "batch(2)");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "'batch(2)'") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_missing_pipeline_exits_2)
{
	cli_result r = cli("run", "--json");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "pipeline") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_set_unknown_option_exits_2_naming_it)
{
	cli_result r = cli("run", "--set", "thredz=4", "range(3)");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "thredz") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_set_and_threads_accept_valid_options)
{
	cli_result r = cli("run", "--json", "--threads", "2", "--seed", "7",
	    "--set", "deterministic=true", "range(10)");

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_int_eq(json_int(last_line(r.out), "elements"), 10);
	cli_free(&r);
}
END_TEST

START_TEST(run_bad_environment_option_exits_2_naming_the_variable)
{
	cli_result r = cli_env("CACHEW_SEED=abc", "run", "range(3)",
	    (char *)NULL);

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "CACHEW_SEED") != NULL, "stderr: %s",
	    r.err);
	cli_free(&r);
}
END_TEST

START_TEST(run_help_options_prints_the_options_table)
{
	cli_result r = cli("run", "--help-options");

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "threads"));
	ck_assert_ptr_nonnull(strstr(r.out, "seed"));
	ck_assert_ptr_nonnull(strstr(r.out, "CACHEW_"));
	cli_free(&r);
}
END_TEST

START_TEST(run_plugin_flag_loads_functions)
{
	char so[512];
	cli_result r;

	plugin_path(so, sizeof(so));
	r = cli("run", "--json", "--plugin", so,
	    "range(10) | filter(is_even) | map(square)");
	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_int_eq(json_int(last_line(r.out), "elements"), 5);
	cli_free(&r);
}
END_TEST

START_TEST(run_missing_plugin_exits_1_naming_it)
{
	cli_result r = cli("run", "--plugin", "/nonexistent/p.so", "range(3)");

	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "/nonexistent/p.so") != NULL, "stderr: %s",
	    r.err);
	cli_free(&r);
}
END_TEST

/* ---- explain, ops, help, version ----------------------------------------- */

START_TEST(explain_prints_tree_canonical_string_and_round_trip)
{
	const char *pipeline = "range(100) | map(add, value=2) | batch(8)";
	cli_result r = cli("explain", pipeline);
	char hex[33];

	ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strncmp(r.out, "batch", 5) == 0, "root first: %s", r.out);
	ck_assert_ptr_nonnull(strstr(r.out, "\n  map [add]("));
	ck_assert_ptr_nonnull(strstr(r.out, "\n    range("));
	ck_assert_ptr_nonnull(strstr(r.out, "\ncanonical: range("));
	ck_assert_ptr_nonnull(strstr(r.out, "\nround trip: ok\n"));
	/* The root's line carries the fingerprint of the whole pipeline. */
	fingerprint_of(pipeline, hex);
	*strchr(r.out, '\n') = '\0';
	ck_assert_msg(strstr(r.out, hex) != NULL, "root fingerprint %s "
	    "missing: %s", hex, r.out);
	cli_free(&r);
}
END_TEST

START_TEST(explain_parse_error_exits_2)
{
	cli_result r = cli("explain", "range(3) | | batch(2)");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "column") != NULL, "stderr: %s", r.err);
	ck_assert_str_eq(r.out, "");
	cli_free(&r);
}
END_TEST

START_TEST(ops_lists_builtin_operators_and_functions)
{
	cli_result r = cli("ops");

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "\nrange - "));
	ck_assert_ptr_nonnull(strstr(r.out, "\nmap - "));
	ck_assert_ptr_nonnull(strstr(r.out, "\nbatch - "));
	ck_assert_ptr_nonnull(strstr(r.out, " add "));
	cli_free(&r);
}
END_TEST

START_TEST(ops_markdown_says_it_is_generated)
{
	cli_result r = cli("ops", "--markdown");

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "generated by `cachew ops "
					    "--markdown`"));
	ck_assert_ptr_nonnull(strstr(r.out, "### `range`"));
	cli_free(&r);
}
END_TEST

START_TEST(unknown_command_exits_2_naming_it)
{
	cli_result r = cli("frobnicate");

	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "frobnicate") != NULL, "stderr: %s", r.err);
	cli_free(&r);
}
END_TEST

START_TEST(help_lists_every_command)
{
	cli_result r = cli("--help");

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "run "));
	ck_assert_ptr_nonnull(strstr(r.out, "explain "));
	ck_assert_ptr_nonnull(strstr(r.out, "ops "));
	ck_assert_ptr_nonnull(strstr(r.out, "--help-options"));
	cli_free(&r);
}
END_TEST

START_TEST(version_prints_library_version)
{
	cli_result r = cli("version");
	char want[64];

	snprintf(want, sizeof(want), "cachew %s\n", cachew_version());
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, want);
	cli_free(&r);
}
END_TEST

/* ---- the example plugin, in process -------------------------------------- */

static void
load_example_plugin(void)
{
	char so[512];

	plugin_path(so, sizeof(so));
	ck_assert_msg(cachew_plugin_load(so) == CACHEW_OK, "%s: %s", so,
	    cachew_errmsg());
}

START_TEST(plugin_square_maps_values)
{
	char *s;

	load_example_plugin();
	s = cwt_seq("range(5) | map(square)", NULL);
	ck_assert_str_eq(s, "0,1,4,9,16");
	free(s);
}
END_TEST

/* The embedded service runs a plugin's functions even when the plugin was
 * loaded after the service started: its worker shares the process, so
 * the dispatcher does not hold it to the functions it reported at start
 * (issue 20, item 4). Both the named service and the default. */
START_TEST(plugin_functions_run_on_an_embedded_service_started_before)
{
	cachew_options *o;
	char *s;

	ck_assert_int_eq(cachew_options_create(&o), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(o, "service", "embedded"),
	    CACHEW_OK);
	s = cwt_seq("range(4)", o);
	ck_assert_str_eq(s, "0,1,2,3");
	free(s);
	load_example_plugin();
	s = cwt_seq("range(6) | map(square)", o);
	ck_assert_str_eq(s, "0,1,4,9,16,25");
	free(s);
	s = cwt_seq("range(6) | map(square) | filter(is_even)", NULL);
	ck_assert_str_eq(s, "0,4,16");
	free(s);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(plugin_square_maps_batches_in_place)
{
	char *s;

	load_example_plugin();
	s = cwt_seq("range(6) | batch(3) | map(square)", NULL);
	ck_assert_str_eq(s, "[0 1 4],[9 16 25]");
	free(s);
}
END_TEST

START_TEST(plugin_square_maps_f64)
{
	cachew_element **v;
	size_t n;
	char err[256] = "";

	load_example_plugin();
	ck_assert_msg(cwt_run("from_list([1.5, -2.0]) | map(square)", NULL, &v,
	    &n, err, sizeof(err)) == CACHEW_OK, "%s", err);
	ck_assert_uint_eq(n, 2);
	ck_assert_double_eq(cwt_f64(v[0], 0), 2.25);
	ck_assert_double_eq(cwt_f64(v[1], 0), 4.0);
	cwt_free(v, n);
}
END_TEST

START_TEST(plugin_square_rejects_bytes_naming_the_component)
{
	cachew_element **v;
	size_t n;
	char err[256] = "";

	load_example_plugin();
	ck_assert_int_eq(cwt_run("from_list([\"a\"]) | map(square)", NULL, &v,
	    &n, err, sizeof(err)), CACHEW_EOP);
	ck_assert_msg(strstr(err, "component 0 is bytes") != NULL, "%s", err);
}
END_TEST

START_TEST(plugin_is_even_filters)
{
	char *s;

	load_example_plugin();
	s = cwt_seq("range(10) | filter(is_even)", NULL);
	ck_assert_str_eq(s, "0,2,4,6,8");
	free(s);
}
END_TEST

START_TEST(plugin_rejects_unknown_params)
{
	cachew_dataset *ds = NULL;

	load_example_plugin();
	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(3) | map(square, "
						   "power=3)"), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "power") != NULL, "%s",
	    cachew_errmsg());
	ck_assert_ptr_null(ds);
}
END_TEST

START_TEST(plugin_load_twice_is_ok)
{
	load_example_plugin();
	load_example_plugin();
}
END_TEST

START_TEST(plugin_load_missing_path_is_enoent)
{
	ck_assert_int_eq(cachew_plugin_load("/nonexistent/plugin.so"),
	    CACHEW_ENOENT);
	ck_assert_ptr_nonnull(
	    strstr(cachew_errmsg(), "/nonexistent/plugin.so"));
}
END_TEST

static cachew_err
dummy_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

START_TEST(plugin_duplicate_name_is_eexist)
{
	cachew_op_def def = {.version = CACHEW_OP_DEF_VERSION,
	    .name = "square", .kind = CACHEW_OP_MAP,
	    .map = dummy_map};

	load_example_plugin();
	ck_assert_int_eq(cachew_op_register(&def), CACHEW_EEXIST);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "square"));
}
END_TEST

static char registry_warning[1024];

static void
capture_registry_warning(void *ctx, cachew_log_level level,
    const char *module, const char *msg)
{
	(void)ctx;
	if (level == CACHEW_LOG_WARN && strcmp(module, "registry") == 0)
		snprintf(registry_warning, sizeof(registry_warning), "%s", msg);
}

/* A plugin built against a newer cachew.h: its definition is refused, the
 * load fails, and both the error and a WARN line (for a plugin that would
 * carry on regardless) name the operator, the file and both versions. */
START_TEST(plugin_with_a_newer_op_def_is_refused_naming_it)
{
	char so[512], why[1024], want[2048];
	cachew_dataset *ds = NULL;

	cwt_build_file(so, sizeof(so), "plugin_newer_def.so");
	snprintf(why, sizeof(why),
	    "operator 'future_pass' (plugin '%s'): cachew_op_def version %d "
	    "is newer than this library's %d: build it against this "
	    "library's cachew.h or upgrade cachew",
	    so, CACHEW_OP_DEF_VERSION + 1, CACHEW_OP_DEF_VERSION);
	snprintf(want, sizeof(want), "plugin '%s' failed to initialise: %s",
	    so, why);
	registry_warning[0] = '\0';
	cachew_log_set(capture_registry_warning, NULL, CACHEW_LOG_WARN);
	ck_assert_int_eq(cachew_plugin_load(so), CACHEW_ENOTSUP);
	cachew_log_set(NULL, NULL, CACHEW_LOG_WARN);
	ck_assert_str_eq(cachew_errmsg(), want);
	ck_assert_str_eq(registry_warning, why);
	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(3) | map(future_pass)"),
	    CACHEW_ENOENT);
}
END_TEST

/* Compiles a one-function plugin (pass_<fn>, a map) into dir/file with
 * `identity` as the body of its cachew_plugin_identity (NULL: none). */
static void
tiny_plugin(const char *dir, const char *file, const char *fn,
    const char *identity)
{
	char src[2048], path[600], cmd[1600];

	snprintf(src, sizeof(src),
	    "#include \"cachew.h\"\n"
	    "static cachew_err pass(cachew_op_ctx *c, cachew_element *in,\n"
	    "    cachew_element **out) { (void)c; *out = in; return 0; }\n"
	    "static const cachew_op_def def = {.version = "
	    "CACHEW_OP_DEF_VERSION, .name = \"%s\", .kind = CACHEW_OP_MAP,"
	    " .map = pass};\n"
	    "%s%s%s"
	    "CACHEW_API cachew_err cachew_plugin_init(unsigned abi);\n"
	    "cachew_err cachew_plugin_init(unsigned abi) { (void)abi;"
	    " return cachew_op_register(&def); }\n",
	    fn, identity != NULL ? "CACHEW_API const cachew_plugin_info "
				    "cachew_plugin_identity = {" : "",
	    identity != NULL ? identity : "", identity != NULL ? "};\n" : "");
	snprintf(path, sizeof(path), "%s/%s.c", dir, file);
	cwt_write_file(path, src, strlen(src));
	snprintf(cmd, sizeof(cmd), "cc -std=c11 -fPIC -shared -Iinclude -o "
	    "%s/%s %s", dir, file, path);
	ck_assert_int_eq(system(cmd), 0);
}

/* A plugin's identity is what its cachew_plugin_identity says, or else
 * its file's name with no version; with the hash of the file's bytes
 * (`cachew explain` shows all three on the node using it). A malformed
 * identity fails the load, naming the plugin and the field. */
START_TEST(plugin_identity_is_its_info_or_its_file_name)
{
	char *dir = cwt_tmpdir(), so[600], want[800];
	cachew_fingerprint h;
	cli_result r;

	tiny_plugin(dir, "anon_ops.so.1", "anon_pass", NULL);
	snprintf(so, sizeof(so), "%s/anon_ops.so.1", dir);
	r = cli("explain", "--plugin", so, "range(3) | map(anon_pass)");
	ck_assert_int_eq(r.status, 0);
	{
		char *bytes = slurp(so);
		struct stat st;
		ck_assert_int_eq(stat(so, &st), 0);
		/* XXH3-128 of the file, by the library's own hash of bytes
		 * (the fingerprint hex form is the same). */
		XXH128_hash_t x = XXH3_128bits(bytes, (size_t)st.st_size);
		h.hi = x.high64;
		h.lo = x.low64;
		free(bytes);
	}
	{
		char hex[33];
		cachew_fingerprint_hex(&h, hex);
		snprintf(want, sizeof(want), "plugin=anon_ops version=none "
		    "build=%s\n", hex);
	}
	ck_assert_msg(strstr(r.out, want) != NULL, "%s lacks %s", r.out, want);
	cli_free(&r);
	tiny_plugin(dir, "named.so", "named_pass",
	    ".version = CACHEW_PLUGIN_INFO_VERSION, .name = \"my-ops\", "
	    ".plugin_version = \"1.2.0+g3\"");
	snprintf(so, sizeof(so), "%s/named.so", dir);
	r = cli("explain", "--plugin", so, "range(3) | map(named_pass)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_msg(strstr(r.out, "plugin=my-ops version=1.2.0+g3 build=") !=
		NULL, "%s", r.out);
	cli_free(&r);
	/* `cachew ops` says where each function comes from. */
	r = cli("ops", "--plugin", so);
	ck_assert_int_eq(r.status, 0);
	ck_assert_msg(strstr(r.out, "named_pass           map               "
				    "plugin my-ops 1.2.0+g3\n") != NULL,
	    "%s", r.out);
	cli_free(&r);
	tiny_plugin(dir, "bad_name.so", "bad_pass",
	    ".version = CACHEW_PLUGIN_INFO_VERSION, .name = \"my ops\"");
	snprintf(so, sizeof(so), "%s/bad_name.so", dir);
	ck_assert_int_eq(cachew_plugin_load(so), CACHEW_EINVAL);
	snprintf(want, sizeof(want), "plugin '%s': cachew_plugin_identity.name "
	    "'my ops' is not 1 to 63 characters of [A-Za-z0-9_.+-]", so);
	ck_assert_str_eq(cachew_errmsg(), want);
	tiny_plugin(dir, "bad_version.so", "bad_pass2", ".name = \"x\"");
	snprintf(so, sizeof(so), "%s/bad_version.so", dir);
	ck_assert_int_eq(cachew_plugin_load(so), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "cachew_plugin_identity has "
			  "version 0: set .version = CACHEW_PLUGIN_INFO_VERSION")
		!= NULL, "%s", cachew_errmsg());
	/* Neither registered its function: the init never ran. */
	ck_assert_ptr_null(cwi_fn_lookup("bad_pass"));
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- head ------------------------------------------------------------------ */

/* Scalars print as values, several components as a tuple, strings quoted
 * with C escapes; the count is -n. */
START_TEST(head_prints_values_tuples_and_quoted_strings)
{
	cli_result r = cli("head", "-n", "2",
	    "zip(range(3), from_list([\"hello\", \"wo\\\"r\\nld\"]))");

	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: (0, \"hello\")\n1: (1, \"wo\\\"r\\nld\")\n");
	ck_assert_str_eq(r.err, "");
	cli_free(&r);
	r = cli("head", "-n", "1",
	    "range(24) | map(cast, dtype=f32) | batch(4) | batch(3)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: f32[3,4] [[0.0 1.0 2.0 3.0] [4.0 5.0 6.0 "
				"7.0] [8.0 9.0 10.0 11.0]]\n");
	cli_free(&r);
}
END_TEST

/* numpy's print options: over 1000 values, each axis longer than 6 shows
 * its first and last 3; a string is cut after 48 bytes, naming its
 * length. */
START_TEST(head_abbreviates_long_tensors_and_strings_as_numpy)
{
	cli_result r = cli("head", "-n", "1", "range(2000) | batch(1200)");

	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: i64[1200] [0 1 2 ... 1197 1198 1199]\n");
	cli_free(&r);
	r = cli("head", "-n", "1", "range(1200) | batch(40) | batch(30)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: i64[30,40] [[0 1 2 ... 37 38 39] [40 41 42 "
				"... 77 78 79] [80 81 82 ... 117 118 119] ... "
				"[1080 1081 1082 ... 1117 1118 1119] [1120 1121 "
				"1122 ... 1157 1158 1159] [1160 1161 1162 ... "
				"1197 1198 1199]]\n");
	cli_free(&r);
	r = cli("head", "from_list([\"0123456789012345678901234567890123456789"
			"012345678901234567890123456789\"])");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: \"0123456789012345678901234567890123456789"
				"01234567...\" (70 bytes)\n");
	cli_free(&r);
}
END_TEST

/* --json: one object per element, dtype, shape and value; over 1000
 * values, the first 6 and "truncated". */
START_TEST(head_json_is_one_object_per_element)
{
	cli_result r = cli("head", "--json", "-n", "2",
	    "zip(range(2), from_list([\"a\\\"b\", \"x\"]))");

	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out,
	    "{\"index\":0,\"components\":[{\"dtype\":\"i64\",\"shape\":[],"
	    "\"value\":0},{\"dtype\":\"bytes\",\"shape\":[],\"value\":"
	    "\"a\\\"b\"}]}\n"
	    "{\"index\":1,\"components\":[{\"dtype\":\"i64\",\"shape\":[],"
	    "\"value\":1},{\"dtype\":\"bytes\",\"shape\":[],\"value\":"
	    "\"x\"}]}\n");
	cli_free(&r);
	r = cli("head", "--json", "-n", "1",
	    "range(1200) | map(cast, dtype=f64) | batch(1100)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out,
	    "{\"index\":0,\"components\":[{\"dtype\":\"f64\",\"shape\":[1100],"
	    "\"head\":[0.0,1.0,2.0,3.0,4.0,5.0],\"truncated\":true}]}\n");
	cli_free(&r);
	r = cli("head", "--json", "-n", "1", "range(6) | batch(3) | batch(2)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out,
	    "{\"index\":0,\"components\":[{\"dtype\":\"i64\",\"shape\":[2,3],"
	    "\"value\":[[0,1,2],[3,4,5]]}]}\n");
	cli_free(&r);
}
END_TEST

/* Named components print as a dict (text) and carry "name" (JSON), in
 * process and through the embedded service. */
START_TEST(head_names_named_components)
{
	const char *p = "from_tensors({image=[1, 2], label=3})";
	cli_result r = cli("head", p);

	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: {image: i64[2] [1 2], label: 3}\n");
	cli_free(&r);
	r = cli("head", "--json", p);
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out,
	    "{\"index\":0,\"components\":[{\"name\":\"image\",\"dtype\":"
	    "\"i64\",\"shape\":[2],\"value\":[1,2]},{\"name\":\"label\","
	    "\"dtype\":\"i64\",\"shape\":[],\"value\":3}]}\n");
	cli_free(&r);
	r = cli("head", "--set", "service=embedded", "-n", "2",
	    "from_tensors({a=1, b=[2, 3]}) | repeat(2)");
	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: {a: 1, b: i64[2] [2 3]}\n"
				"1: {a: 1, b: i64[2] [2 3]}\n");
	cli_free(&r);
}
END_TEST

/* Five by default, and it stops there: an endless pipeline ends. */
START_TEST(head_takes_five_by_default_even_of_an_endless_pipeline)
{
	cli_result r = cli("head", "range(3) | repeat");

	ck_assert_int_eq(r.status, 0);
	ck_assert_str_eq(r.out, "0: 0\n1: 1\n2: 2\n3: 0\n4: 1\n");
	cli_free(&r);
}
END_TEST

/* The elements before a failure are printed, then the error; exit 1. A
 * bad count is a usage error. */
START_TEST(head_failure_prints_what_came_then_exits_1)
{
	char *dir = cwt_tmpdir(), path[600], pipeline[1400];
	cli_result r;

	snprintf(path, sizeof(path), "%s/a.txt", dir);
	cwt_write_file(path, "abc", 3);
	snprintf(pipeline, sizeof(pipeline),
	    "from_list([\"%s\", \"%s/missing\"]) | read_file", path, dir);
	r = cli("head", pipeline);
	ck_assert_int_eq(r.status, 1);
	ck_assert_str_eq(r.out, "0: \"abc\"\n");
	ck_assert_msg(strstr(r.err, "/missing: No such file or directory") !=
			  NULL, "%s", r.err);
	cli_free(&r);
	r = cli("head", "-n", "x", "range(3)");
	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "-n expects a count") != NULL, "%s", r.err);
	cli_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- README's install and link lines ----------------------------------- */

/* The sh block after "<!-- install-and-link -->" in README.md, or NULL. */
static char *
readme_link_block(void)
{
	char *readme = cwt_slurp("README.md"), *start, *end, *block = NULL;

	if (readme == NULL)
		return NULL;
	start = strstr(readme, "<!-- install-and-link -->\n```sh\n");
	if (start != NULL) {
		start = strchr(strchr(start, '\n') + 1, '\n') + 1;
		end = strstr(start, "```\n");
		if (end != NULL)
			block = strndup(start, (size_t)(end - start));
	}
	free(readme);
	return block;
}

/* A source tree in dir/src made of links to this one's, so that what the
 * README's lines write (train_loop, train_loop_static) lands in dir. */
static void
link_source_tree(const char *dir)
{
	static const char *const parts[] = {"Makefile", "include", "src",
	    "transports", "examples", "test", "build", "man"};
	char cwd[512], from[700], to[700];

	ck_assert_ptr_nonnull(getcwd(cwd, sizeof(cwd)));
	snprintf(to, sizeof(to), "%s/src", dir);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		snprintf(from, sizeof(from), "%s/%s", cwd, parts[i]);
		snprintf(to, sizeof(to), "%s/src/%s", dir, parts[i]);
		ck_assert_int_eq(symlink(from, to), 0);
	}
}

/* issue 17: the README's link line gave 276 undefined references, the one
 * in train_loop.c 350, the pkg-config one a program that could not find
 * libcachew.so.0, and cachew.pc kept the first install's prefix. The
 * README's lines, run as written with HOME in a fresh directory, install,
 * build train_loop shared and static, and both run. */
START_TEST(install_and_link_with_the_readme_lines)
{
	char *dir, *block = readme_link_block(), *script, *run, *log, *want;
	int st;

	ck_assert_msg(block != NULL, "README.md has no install-and-link "
				     "block");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* The README's cc lines carry no sanitizer runtime. */
	printf("cli: the README's link lines run in the plain build only\n");
	free(block);
	return;
#endif
	if (strcmp(cwt_build_dir(), "build") != 0) {
		printf("cli: the README's link lines name build/: skipped for "
		       "%s\n", cwt_build_dir());
		free(block);
		return;
	}
	dir = cwt_tmpdir();
	link_source_tree(dir);
	/* Another install first: cachew.pc must then name the README's
	 * prefix, not this one. */
	log = cwt_fmt("cd %s/src && unset MAKEFLAGS MAKELEVEL MFLAGS && "
		      "make -s install PREFIX=%s/first >/dev/null && "
		      "HOME=%s && export HOME && set -ex\n%s",
	    dir, dir, dir, block);
	script = cwt_fmt("%s/link.sh", dir);
	cwt_write_file(script, log, strlen(log));
	free(log);
	run = cwt_fmt("sh -e %s > %s/out 2>&1", script, dir);
	st = system(run);
	want = cwt_fmt("%s/out", dir);
	log = cwt_slurp(want);
	ck_assert_ptr_nonnull(log);
	/* The end of the log: Check's messages are short. */
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	    "the README's lines failed:\n%s",
	    strlen(log) > 1500 ? log + strlen(log) - 1500 : log);
	/* Both programs ran the whole pipeline. */
	ck_assert_msg(strstr(log, "batches    100\nchecksum   499500") != NULL,
	    "%s", log);
	ck_assert_msg(strstr(strstr(log, "checksum   499500") + 1,
			  "checksum   499500") != NULL, "%s", log);
	free(log);
	free(want);
	want = cwt_fmt("%s/.local/lib/pkgconfig/cachew.pc", dir);
	log = cwt_slurp(want);
	ck_assert_ptr_nonnull(log);
	free(want);
	want = cwt_fmt("prefix=%s/.local\n", dir);
	ck_assert_msg(strncmp(log, want, strlen(want)) == 0, "%s", log);
	free(want);
	want = cwt_fmt("%s/.local/bin/cachewd", dir);
	ck_assert_int_eq(access(want, X_OK), 0);
	free(want);
	/* The man pages, where man looks under a prefix. */
	static const char *const pages[] = {"man1/cachew.1", "man3/cachew.3",
	    "man8/cachewd.8"};
	for (size_t i = 0; i < 3; i++) {
		want = cwt_fmt("%s/.local/share/man/%s", dir, pages[i]);
		ck_assert_msg(access(want, R_OK) == 0, "%s", want);
		free(want);
	}
	free(log);
	free(run);
	free(script);
	free(block);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- man pages ------------------------------------------------------------ */

/* The names a man page must cover, from the source of truth: the commands
 * `cachew help` lists, the flags `cachewd --help` lists, the functions
 * include/cachew.h exports. NULL-terminated, heap. */
static char **
names_from_help(const char *dir, const char *cmd, bool flags)
{
	char *out_path = cwt_fmt("%s/help.txt", dir);
	char *run = cwt_fmt("%s > %s 2>&1", cmd, out_path);
	char *text, *line, *save = NULL, **v = calloc(256, sizeof(*v));
	size_t n = 0;
	bool in_commands = false;

	ck_assert_int_eq(system(run), 0);
	text = cwt_slurp(out_path);
	ck_assert_ptr_nonnull(text);
	for (line = strtok_r(text, "\n", &save); line != NULL && n < 255;
	     line = strtok_r(NULL, "\n", &save)) {
		if (!flags && line[0] != ' ')
			in_commands = strcmp(line, "commands:") == 0;
		if (flags && strncmp(line, "  --", 4) == 0)
			v[n++] = strndup(line + 2, strcspn(line + 2, " "));
		else if (!flags && in_commands && line[0] == ' ' &&
		    line[1] == ' ' && line[2] >= 'a' && line[2] <= 'z')
			v[n++] = cwt_fmt("cachew %.*s", (int)strcspn(line + 2, " "),
			    line + 2);
	}
	free(text);
	free(run);
	free(out_path);
	/* The help texts' layouts are what is parsed: a change to them
	 * must not leave nothing to check. */
	ck_assert_uint_gt(n, flags ? 40 : 8);
	return v;
}

/* Every function the header exports: the name before the first '(' after
 * each CACHEW_API outside comments (a CACHEW_DEPRECATED(...) skipped). */
static char **
names_from_header(void)
{
	char *h = cwt_slurp("include/cachew.h"), *p, **v = calloc(400,
	    sizeof(*v));
	size_t n = 0;

	ck_assert_ptr_nonnull(h);
	/* Comments become spaces: the plugin example in one names
	 * CACHEW_API too. */
	for (p = strstr(h, "/*"); p != NULL; p = strstr(p, "/*")) {
		char *e = strstr(p + 2, "*/");
		ck_assert_ptr_nonnull(e);
		memset(p, ' ', (size_t)(e + 2 - p));
	}
	for (p = strstr(h, "CACHEW_API "); p != NULL && n < 399;
	     p = strstr(p + 1, "CACHEW_API ")) {
		char *q = p + 11, *paren, *name;
		while (*q == ' ')
			q++;
		if (strncmp(q, "CACHEW_DEPRECATED(", 18) == 0)
			q = strchr(q, ')') + 1;
		paren = strchr(q, '(');
		ck_assert_ptr_nonnull(paren);
		for (name = paren; name > q && (name[-1] == '_' ||
		    (name[-1] >= 'a' && name[-1] <= 'z') ||
		    (name[-1] >= '0' && name[-1] <= '9')); name--)
			;
		if (strncmp(name, "cachew_", 7) == 0)
			v[n++] = strndup(name, (size_t)(paren - name));
	}
	free(h);
	ck_assert_uint_gt(n, 100);
	return v;
}

/* Renders page with man -l (as a reader sees it) into *text, and checks
 * that groff finds nothing to warn about with every warning on. */
static void
man_render(const char *dir, const char *page, char **text)
{
	char *warn = cwt_fmt("%s/warn", dir), *out = cwt_fmt("%s/out", dir);
	char *cmd = cwt_fmt("groff -man -Tutf8 -ww -z %s 2> %s", page, warn);
	char *w;

	ck_assert_int_eq(system(cmd), 0);
	w = cwt_slurp(warn);
	ck_assert_msg(w != NULL && w[0] == '\0', "%s: groff warns:\n%s", page,
	    w);
	free(w);
	free(cmd);
	cmd = cwt_fmt("MANWIDTH=200 MAN_KEEP_FORMATTING= man -l %s > %s "
		      "2> %s", page, out, warn);
	ck_assert_int_eq(system(cmd), 0);
	w = cwt_slurp(warn);
	ck_assert_msg(w != NULL && w[0] == '\0', "%s: man -l says:\n%s", page,
	    w);
	free(w);
	*text = cwt_slurp(out);
	ck_assert_ptr_nonnull(*text);
	free(cmd);
	free(out);
	free(warn);
}

static void
man_covers(const char *page, const char *text, char **names)
{
	for (size_t i = 0; names[i] != NULL; i++) {
		ck_assert_msg(strstr(text, names[i]) != NULL,
		    "%s does not mention %s", page, names[i]);
		free(names[i]);
	}
	free(names);
}

/* issue 17: there were no man pages. cachew(1), cachewd(8) and cachew(3)
 * render under man -l without one groff warning, have the sections a
 * reader looks for, and name every command, daemon option and exported
 * function: a new one without its line fails here. */
START_TEST(man_pages_render_cleanly_and_name_everything)
{
	static const char *const sections[] = {"NAME", "SYNOPSIS",
	    "DESCRIPTION", "EXAMPLES", "SEE ALSO"};
	static const struct {
		const char *page, *title, *status;
	} pages[] = {
	    {"man/cachew.1", "CACHEW(1)", "EXIT STATUS"},
	    {"man/cachewd.8", "CACHEWD(8)", "EXIT STATUS"},
	    {"man/cachew.3", "CACHEW(3)", "RETURN VALUE"},
	};
	char *dir, *text[3], *cmd;

	if (system("command -v groff >/dev/null && command -v man "
		   ">/dev/null") != 0) {
		printf("cli: skipping the man page check: groff or man is not "
		       "installed (sh .ci/test-deps.sh installs man-db)\n");
		return;
	}
	dir = cwt_tmpdir();
	for (size_t i = 0; i < 3; i++) {
		man_render(dir, pages[i].page, &text[i]);
		ck_assert_msg(strncmp(text[i], pages[i].title,
				  strlen(pages[i].title)) == 0, "%s", text[i]);
		for (size_t k = 0; k < sizeof(sections) / sizeof(sections[0]);
		     k++)
			ck_assert_msg(strstr(text[i], sections[k]) != NULL,
			    "%s has no %s section", pages[i].page, sections[k]);
		ck_assert_msg(strstr(text[i], pages[i].status) != NULL,
		    "%s has no %s section", pages[i].page, pages[i].status);
	}
	cmd = cwt_fmt("%s/cachew help", cwt_build_dir());
	man_covers("cachew(1)", text[0], names_from_help(dir, cmd, false));
	free(cmd);
	cmd = cwt_fmt("%s/cachewd --help", cwt_build_dir());
	man_covers("cachewd(8)", text[1], names_from_help(dir, cmd, true));
	free(cmd);
	man_covers("cachew(3)", text[2], names_from_header());
	for (size_t i = 0; i < 3; i++)
		free(text[i]);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* issue 17: the Dockerfile of deploy/kubernetes/README.md built an image
 * whose runtime stage lacked libjpeg.so.62 (and the mbedTLS libraries):
 * the package of every library the programs and libcachew.so need (their
 * DT_NEEDED entries, found with dpkg -S) is in its runtime apt-get line. */
START_TEST(deploy_image_has_every_library)
{
	static const char script[] =
	    "set -e\n"
	    "b=$1\n"
	    "pkgs=$(sed -n '/^FROM debian:12$/,/^COPY/p' "
	    "deploy/kubernetes/README.md | tr -s ' \\\\\\n' '\\n\\n\\n')\n"
	    "arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || "
	    "gcc -dumpmachine)\n"
	    "for l in $(for f in $b/cachew $b/cachewd $b/libcachew.so; do "
	    "readelf -d $f | sed -n 's/.*Shared library: \\[\\(.*\\)\\]/\\1/p';"
	    " done | sort -u); do\n"
	    "  p=$(dpkg -S \"*/$arch/$l\" | head -n 1 | cut -d: -f1)\n"
	    "  [ -n \"$p\" ] || { echo \"$l: no package\"; exit 1; }\n"
	    "  [ \"$p\" = libc6 ] && continue\n"
	    "  echo \"$pkgs\" | grep -qx \"$p\" || "
	    "{ echo \"$l: $p is not in the image\"; exit 1; }\n"
	    "done\n"
	    "echo checked\n";
	char *dir, *path, *cmd, *log;
	int st;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* A sanitizer build also loads the sanitizers' runtimes. */
	printf("cli: the image check runs in the plain build only\n");
	return;
#endif
	if (system("command -v dpkg readelf >/dev/null 2>&1") != 0) {
		printf("cli: no dpkg or readelf: the image check skipped\n");
		return;
	}
	dir = cwt_tmpdir();
	path = cwt_fmt("%s/libs.sh", dir);
	cwt_write_file(path, script, strlen(script));
	cmd = cwt_fmt("sh %s %s > %s/out 2>&1", path, cwt_build_dir(), dir);
	st = system(cmd);
	free(path);
	path = cwt_fmt("%s/out", dir);
	log = cwt_slurp(path);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
			  strcmp(log, "checked\n") == 0,
	    "%s", log);
	free(log);
	free(path);
	free(cmd);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- the layer check (test/module_graph.py, make check-layers) ---------- */

/* Compiles `src` into dir/module/name.o (a module is a folder). */
static void
layer_obj(const char *dir, const char *module, const char *name,
    const char *src)
{
	char path[512], cmd[1400];

	snprintf(path, sizeof(path), "%s/%s", dir, module);
	(void)mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/%s/%s.c", dir, module, name);
	cwt_write_file(path, src, strlen(src));
	snprintf(cmd, sizeof(cmd), "cc -c -o %s/%s/%s.o %s", dir, module,
	    name, path);
	ck_assert_int_eq(system(cmd), 0);
}

/* Runs the layer check over dir's objects a and b; returns its exit
 * status, its output in out. */
static int
layer_check(const char *dir, const char *a, const char *b, char *out,
    size_t cap)
{
	char cmd[1400];
	size_t n;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 test/module_graph.py %s "
	    "%s/%s %s/%s 2>&1", dir, dir, a, dir, b);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	return WEXITSTATUS(pclose(p));
}

START_TEST(layer_check_fails_on_a_cycle_across_folders)
{
	char *dir = cwt_tmpdir(), out[4096];

	if (access("/usr/bin/python3", X_OK) != 0) {
		printf("cli: skipping the layer check test: no /usr/bin/python3\n");
		cwt_rmtree(dir);
		free(dir);
		return;
	}
	/* upper uses lower: a DAG. */
	layer_obj(dir, "lower", "lo", "int cwi_lo(void) { return 1; }\n");
	layer_obj(dir, "upper", "up",
	    "int cwi_lo(void);\nint cwi_up(void) { return cwi_lo(); }\n");
	ck_assert_int_eq(layer_check(dir, "lower/lo.o", "upper/up.o", out,
			     sizeof(out)), 0);
	ck_assert_msg(strstr(out, "2 modules, no cycle across folders") != NULL, "%s",
	    out);
	/* lower calls back up: a cycle, named with the symbol that makes
	 * it. */
	layer_obj(dir, "lower", "lo2",
	    "int cwi_up(void);\nint cwi_lo(void) { return cwi_up(); }\n");
	ck_assert_int_eq(layer_check(dir, "lower/lo2.o", "upper/up.o", out,
			     sizeof(out)), 1);
	ck_assert_msg(strstr(out, "a cycle across folders: lower upper") !=
			  NULL, "%s", out);
	ck_assert_msg(strstr(out, "lower -> upper: lower/lo2.o uses cwi_up "
				  "from upper/up.o") != NULL, "%s", out);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_cli_suite(void)
{
	Suite *s = suite_create("cli");
	TCase *run = tcase_create("run");
	TCase *other = tcase_create("explain_ops_help");
	TCase *plugin = tcase_create("plugin");
	TCase *install = tcase_create("install_and_link");

	tcase_set_timeout(run, 30);
	tcase_add_test(run, run_json_reports_exact_elements_and_fingerprint);
	tcase_add_test(run, run_epochs_multiply_the_count);
	tcase_add_test(run, run_epochs_draw_anew_each_epoch);
	tcase_add_test(run, run_prints_human_summary);
	tcase_add_test(run, run_progress_shows_total_percent_and_eta_when_known);
	tcase_add_test(run, plot_refuses_a_bad_events_log_naming_the_line);
	tcase_add_test(run, run_stats_prints_a_row_per_operator);
	tcase_add_test(run, run_parse_error_exits_2_naming_the_column);
	tcase_add_test(run, run_unknown_operator_exits_2);
	tcase_add_test(run, run_pipeline_failure_exits_1_with_message);
	tcase_add_test(run, run_unknown_flag_exits_2_naming_it);
	tcase_add_test(run, run_extra_argument_exits_2_naming_it);
	tcase_add_test(run, run_missing_pipeline_exits_2);
	tcase_add_test(run, run_set_unknown_option_exits_2_naming_it);
	tcase_add_test(run, run_set_and_threads_accept_valid_options);
	tcase_add_test(
	    run, run_bad_environment_option_exits_2_naming_the_variable);
	tcase_add_test(run, run_help_options_prints_the_options_table);
	tcase_add_test(run, run_plugin_flag_loads_functions);
	tcase_add_test(run, run_missing_plugin_exits_1_naming_it);
	suite_add_tcase(s, run);

	/* These start processes: `cachew`, and for the layer check three
	 * compilers and two Python interpreters (about 0.3 s of CPU). Check's
	 * default of 4 s timed the layer check out on the 2-core CI machine
	 * under load (wall time is CPU time times the run queue), so the
	 * bound is the run tcase's: a hang still fails, a slow machine not. */
	tcase_set_timeout(other, 30);
	tcase_add_test(
	    other, explain_prints_tree_canonical_string_and_round_trip);
	tcase_add_test(other, explain_parse_error_exits_2);
	tcase_add_test(other, ops_lists_builtin_operators_and_functions);
	tcase_add_test(other, ops_markdown_says_it_is_generated);
	tcase_add_test(other, unknown_command_exits_2_naming_it);
	tcase_add_test(other, help_lists_every_command);
	tcase_add_test(other, version_prints_library_version);
	tcase_add_test(other, layer_check_fails_on_a_cycle_across_folders);
	tcase_add_test(other, head_prints_values_tuples_and_quoted_strings);
	tcase_add_test(other, head_abbreviates_long_tensors_and_strings_as_numpy);
	tcase_add_test(other, head_json_is_one_object_per_element);
	tcase_add_test(other, head_names_named_components);
	tcase_add_test(other,
	    head_takes_five_by_default_even_of_an_endless_pipeline);
	tcase_add_test(other, head_failure_prints_what_came_then_exits_1);
	suite_add_tcase(s, other);

	/* make install and two compilations of train_loop. */
	tcase_set_timeout(install, 120);
	tcase_add_test(install, install_and_link_with_the_readme_lines);
	tcase_add_test(install, deploy_image_has_every_library);
	tcase_add_test(install, man_pages_render_cleanly_and_name_everything);
	suite_add_tcase(s, install);

	/* One test starts an embedded service: the run tcase's bound, as
	 * above, rather than Check's default of 4 s. */
	tcase_set_timeout(plugin, 30);
	tcase_add_test(plugin, plugin_square_maps_values);
	tcase_add_test(plugin, plugin_square_maps_batches_in_place);
	tcase_add_test(plugin, plugin_square_maps_f64);
	tcase_add_test(plugin, plugin_square_rejects_bytes_naming_the_component);
	tcase_add_test(plugin, plugin_is_even_filters);
	tcase_add_test(plugin, plugin_rejects_unknown_params);
	tcase_add_test(plugin, plugin_load_twice_is_ok);
	tcase_add_test(plugin, plugin_load_missing_path_is_enoent);
	tcase_add_test(plugin, plugin_duplicate_name_is_eexist);
	tcase_add_test(plugin, plugin_with_a_newer_op_def_is_refused_naming_it);
	tcase_add_test(plugin, plugin_identity_is_its_info_or_its_file_name);
	tcase_add_test(plugin,
	    plugin_functions_run_on_an_embedded_service_started_before);
	suite_add_tcase(s, plugin);
	return s;
}
