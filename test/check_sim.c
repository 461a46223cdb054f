/*
 * check_sim.c - `cachew sim`: the autoscale and multitenant scenarios
 * through the library and through the real binary, their JSON lines, the
 * issue's goals on them (deterministic for a fixed seed), and the plots.
 */
#include "cwt.h"

#include "../src/tools/sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------- */

/* Runs a scenario into a string; asserts its exit status. */
static char *
run_scenario(int (*fn)(const cwi_sim_opts *, FILE *), const cwi_sim_opts *o,
    int status)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fn(o, f), status);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

static cwi_sim_opts
json_opts(uint64_t seed)
{
	cwi_sim_opts o;

	cwi_sim_opts_default(&o);
	o.json = true;
	o.seed = seed;
	return o;
}

/* The first setting only: the tests that need one stay quick under
 * valgrind. */
static cwi_sim_opts
quick_opts(uint64_t seed)
{
	cwi_sim_opts o = json_opts(seed);

	o.quick = true;
	return o;
}

/* The number after "key": in one JSON line (NAN when absent or null). */
static double
json_num(const char *line, const char *key)
{
	char pat[64];
	const char *p;
	char *end;
	double v;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(line, pat);
	if (p == NULL)
		return NAN;
	p += strlen(pat);
	v = strtod(p, &end);
	return end == p ? NAN : v;
}

/* The string value of "key" in a JSON line, copied into buf ("" when
 * absent). */
static const char *
json_str(const char *line, const char *key, char *buf, size_t size)
{
	char pat[64];
	const char *p, *q;

	buf[0] = '\0';
	snprintf(pat, sizeof(pat), "\"%s\":\"", key);
	p = strstr(line, pat);
	if (p == NULL)
		return buf;
	p += strlen(pat);
	q = strchr(p, '"');
	if (q == NULL || (size_t)(q - p) >= size)
		return buf;
	memcpy(buf, p, (size_t)(q - p));
	buf[q - p] = '\0';
	return buf;
}

/* Splits text into lines in place; returns how many (at most max). */
static size_t
split_lines(char *text, char **lines, size_t max)
{
	size_t n = 0;

	for (char *p = strtok(text, "\n"); p != NULL && n < max;
	     p = strtok(NULL, "\n"))
		lines[n++] = p;
	return n;
}

static const char *const required_keys[] = {"\"scenario\":",
    "\"policy\":", "\"setting\":", "\"workers\":", "\"oracle_workers\":",
    "\"windows\":", "\"epoch_s\":", "\"cost\":", "\"decision\":",
    "\"best_fixed_epoch_s\":"};

static void
assert_json_line(const char *line)
{
	size_t n = strlen(line);

	ck_assert_msg(n > 2 && line[0] == '{' && line[n - 1] == '}',
	    "not a JSON object: %s", line);
	for (size_t k = 0; k < sizeof(required_keys) / sizeof(required_keys[0]);
	     k++)
		ck_assert_msg(strstr(line, required_keys[k]) != NULL,
		    "line lacks %s: %s", required_keys[k], line);
}

/* The line of `policy` in `setting`, or NULL. */
static const char *
find_line(char **lines, size_t n, const char *setting, const char *policy)
{
	char s[64], p[64];

	for (size_t i = 0; i < n; i++)
		if (strcmp(json_str(lines[i], "setting", s, sizeof(s)),
			setting) == 0 &&
		    strcmp(json_str(lines[i], "policy", p, sizeof(p)),
			policy) == 0)
			return lines[i];
	return NULL;
}

/* ---- autoscale ---------------------------------------------------------------- */

START_TEST(test_autoscale_json_lines_have_the_required_keys)
{
	cwi_sim_opts o = json_opts(1);
	char *out = run_scenario(cwi_sim_autoscale, &o, 0);
	char *lines[64];
	size_t n = split_lines(out, lines, 64);
	static const char *const settings[] = {"resnet50", "resnet50-heavy",
	    "resnet152"};

	ck_assert_uint_ge(n, 15);
	for (size_t i = 0; i < n; i++) {
		assert_json_line(lines[i]);
		ck_assert_ptr_nonnull(strstr(lines[i],
		    "\"scenario\":\"autoscale\""));
		ck_assert_ptr_nonnull(strstr(lines[i], "\"decision\":null"));
	}
	for (size_t s = 0; s < 3; s++) {
		ck_assert_ptr_nonnull(find_line(lines, n, settings[s], "model"));
		ck_assert_ptr_nonnull(find_line(lines, n, settings[s], "cachew"));
		ck_assert_ptr_nonnull(find_line(lines, n, settings[s], "hpa:80"));
	}
	free(out);
}
END_TEST

/* The goals, for every setting, on seeds 1..3. */
START_TEST(test_autoscale_model_meets_the_goals_in_every_setting)
{
	static const char *const settings[] = {"resnet50", "resnet50-heavy",
	    "resnet152"};

	for (uint64_t seed = 1; seed <= 3; seed++) {
		cwi_sim_opts o = json_opts(seed);
		char *out = run_scenario(cwi_sim_autoscale, &o, 0);
		char *lines[64];
		size_t n = split_lines(out, lines, 64);

		for (size_t s = 0; s < 3; s++) {
			const char *m = find_line(lines, n, settings[s], "model");
			const char *h = find_line(lines, n, settings[s], "hpa:80");
			double w = json_num(m, "workers");
			double oracle = json_num(m, "oracle_workers");

			ck_assert_msg(fabs(w - oracle) <= 1,
			    "seed %d %s: model %g workers, oracle %g",
			    (int)seed, settings[s], w, oracle);
			ck_assert_msg(json_num(m, "windows") <= 3,
			    "seed %d %s: %g windows", (int)seed, settings[s],
			    json_num(m, "windows"));
			ck_assert_msg(json_num(m, "cost") <= json_num(h, "cost"),
			    "seed %d %s: model $%g > hpa:80 $%g", (int)seed,
			    settings[s], json_num(m, "cost"),
			    json_num(h, "cost"));
		}
		free(out);
	}
}
END_TEST

/* Cachew's rule takes one window per worker: more windows than model. */
START_TEST(test_autoscale_cachew_needs_more_windows_than_model)
{
	cwi_sim_opts o = quick_opts(1);
	char *out = run_scenario(cwi_sim_autoscale, &o, 0);
	char *lines[64];
	size_t n = split_lines(out, lines, 64);
	const char *m = find_line(lines, n, "resnet50", "model");
	const char *c = find_line(lines, n, "resnet50", "cachew");

	ck_assert_double_ge(json_num(c, "windows"),
	    json_num(c, "oracle_workers") - 2);
	ck_assert_double_lt(json_num(m, "windows"), json_num(c, "windows"));
	free(out);
}
END_TEST

START_TEST(test_autoscale_fixed_oracle_line_is_the_oracle)
{
	cwi_sim_opts o = quick_opts(1);
	char *out = run_scenario(cwi_sim_autoscale, &o, 0);
	char *lines[64];
	size_t n = split_lines(out, lines, 64);
	const char *m = find_line(lines, n, "resnet50", "model");
	char spec[32];
	const char *f;

	snprintf(spec, sizeof(spec), "fixed:%d",
	    (int)json_num(m, "oracle_workers"));
	f = find_line(lines, n, "resnet50", spec);
	ck_assert_ptr_nonnull(f);
	ck_assert_double_eq(json_num(f, "windows"), 0);
	/* The oracle is within 5 % of the best fixed epoch time. */
	ck_assert_double_le(json_num(f, "epoch_s"),
	    json_num(f, "best_fixed_epoch_s") * 1.05);
	free(out);
}
END_TEST

START_TEST(test_autoscale_is_deterministic_per_seed)
{
	cwi_sim_opts a = quick_opts(7), b = quick_opts(7), c = quick_opts(8);
	char *x = run_scenario(cwi_sim_autoscale, &a, 0);
	char *y = run_scenario(cwi_sim_autoscale, &b, 0);
	char *z = run_scenario(cwi_sim_autoscale, &c, 0);

	ck_assert_str_eq(x, y);
	ck_assert_str_ne(x, z);
	free(x);
	free(y);
	free(z);
}
END_TEST

START_TEST(test_autoscale_table_says_whether_goals_are_met)
{
	cwi_sim_opts o;
	char *out;

	cwi_sim_opts_default(&o);
	o.quick = true;
	out = run_scenario(cwi_sim_autoscale, &o, 0);
	ck_assert_ptr_nonnull(strstr(out, "autoscale: resnet50\n"));
	ck_assert_ptr_nonnull(strstr(out, "oracle 6 workers"));
	ck_assert_ptr_nonnull(strstr(out, "all goals met: yes"));
	free(out);
}
END_TEST

START_TEST(test_autoscale_prices_change_the_cost)
{
	cwi_sim_opts a = quick_opts(1), b = quick_opts(1);
	char *x, *y;
	char *lx[64], *ly[64];
	size_t nx, ny;

	b.price_worker = 0;
	b.price_consumer = 0;
	x = run_scenario(cwi_sim_autoscale, &a, 0);
	y = run_scenario(cwi_sim_autoscale, &b, 0);
	nx = split_lines(x, lx, 64);
	ny = split_lines(y, ly, 64);
	ck_assert_double_gt(json_num(find_line(lx, nx, "resnet50", "model"),
				"cost"),
	    0);
	ck_assert_double_eq(json_num(find_line(ly, ny, "resnet50", "model"),
				"cost"),
	    0);
	free(x);
	free(y);
}
END_TEST

/* ---- multitenant ---------------------------------------------------------------- */

START_TEST(test_multitenant_workers_move_within_one_interval)
{
	cwi_sim_opts o = json_opts(1);
	char *out = run_scenario(cwi_sim_multitenant, &o, 0);
	char *lines[16];
	size_t n = split_lines(out, lines, 16);
	const char *j1 = find_line(lines, n, "job1-100ms", "model");
	const char *j2 = find_line(lines, n, "job2-50ms", "model");

	ck_assert_uint_eq(n, 4); /* two jobs x model, cachew */
	for (size_t i = 0; i < n; i++) {
		assert_json_line(lines[i]);
		ck_assert_ptr_nonnull(strstr(lines[i],
		    "\"scenario\":\"multitenant\""));
	}
	ck_assert_ptr_nonnull(j1);
	ck_assert_ptr_nonnull(j2);
	/* The second job arrives: the grants move in that interval; the
	 * first leaves: the second gets the pool in that interval. */
	ck_assert_double_le(json_num(j1, "arrive_move_intervals"), 1);
	ck_assert_double_ge(json_num(j1, "arrive_move_intervals"), 0);
	ck_assert_double_le(json_num(j2, "leave_move_intervals"), 1);
	ck_assert_double_ge(json_num(j2, "leave_move_intervals"), 0);
	/* Both share the pool as the ideal split says (5/5). */
	ck_assert_double_eq(json_num(j1, "workers"),
	    json_num(j1, "oracle_workers"));
	ck_assert_double_eq(json_num(j2, "workers"),
	    json_num(j2, "oracle_workers"));
	ck_assert_double_eq(json_num(j1, "workers") + json_num(j2, "workers"),
	    10);
	free(out);
}
END_TEST

START_TEST(test_multitenant_model_beats_cachew_on_epoch_time)
{
	cwi_sim_opts o = json_opts(1);
	char *out = run_scenario(cwi_sim_multitenant, &o, 0);
	char *lines[16];
	size_t n = split_lines(out, lines, 16);

	ck_assert_double_lt(
	    json_num(find_line(lines, n, "job2-50ms", "model"), "epoch_s"),
	    json_num(find_line(lines, n, "job2-50ms", "cachew"), "epoch_s"));
	ck_assert_double_lt(
	    json_num(find_line(lines, n, "job1-100ms", "model"), "epoch_s"),
	    json_num(find_line(lines, n, "job1-100ms", "cachew"), "epoch_s"));
	free(out);
}
END_TEST

/* ---- helpers of sim.h ------------------------------------------------------------ */

START_TEST(test_json_str_escapes)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	cwi_sim_json_str(f, "a\"b\\c\nd\x01");
	fclose(f);
	ck_assert_str_eq(buf, "\"a\\\"b\\\\c\\nd\\u0001\"");
	free(buf);
}
END_TEST

START_TEST(test_rand_is_deterministic_and_jitter_bounded)
{
	uint64_t a = 42, b = 42;

	for (int i = 0; i < 1000; i++) {
		double j;

		ck_assert_uint_eq(cwi_sim_rand(&a), cwi_sim_rand(&b));
		j = cwi_sim_jitter(&a, 0.05);
		ck_assert(j >= 0.95 && j <= 1.05);
		(void)cwi_sim_jitter(&b, 0.05);
		ck_assert(cwi_sim_uniform(&a) < 1.0);
		(void)cwi_sim_uniform(&b);
	}
}
END_TEST

static bool
is_png(const char *path)
{
	unsigned char magic[8] = {0};
	FILE *f = fopen(path, "rb");
	size_t n;

	if (f == NULL)
		return false;
	n = fread(magic, 1, sizeof(magic), f);
	fclose(f);
	return n == 8 && memcmp(magic, "\x89PNG\r\n\x1a\n", 8) == 0;
}

START_TEST(test_plot_writes_pngs_of_workers_and_throughput)
{
	cwi_sim_opts o;
	char *dir, *out;
	char path[600];
	static const char *const files[] = {
	    "autoscale-resnet50-workers.png",
	    "autoscale-resnet50-throughput.png",
	    "multitenant-model-workers.png",
	    "multitenant-model-throughput.png",
	    "multitenant-cachew-workers.png",
	};

	if (!cwi_sim_have_gnuplot()) {
		printf("check_sim: gnuplot not found, PNG test skipped\n");
		return;
	}
	dir = cwt_tmpdir();
	cwi_sim_opts_default(&o);
	o.json = true;
	o.quick = true; /* the first setting only */
	o.plot_dir = dir;
	out = run_scenario(cwi_sim_autoscale, &o, 0);
	free(out);
	out = run_scenario(cwi_sim_multitenant, &o, 0);
	free(out);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		ck_assert_msg(stat(path, &st) == 0, "%s missing", path);
		ck_assert_int_gt(st.st_size, 1000);
		ck_assert_msg(is_png(path), "%s is not a PNG", path);
	}
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_plot_without_gnuplot_skips_and_succeeds)
{
	char *dir = cwt_tmpdir();
	char path[600];
	double x[2] = {0, 1}, y[2] = {1, 2};
	cwi_sim_series s = {"line", x, y, 2};
	struct stat st;

	setenv("CACHEW_GNUPLOT", "/nonexistent/gnuplot", 1);
	ck_assert(!cwi_sim_have_gnuplot());
	snprintf(path, sizeof(path), "%s/p.png", dir);
	ck_assert_int_eq(cwi_sim_plot(path, "t", "x", "y", &s, 1), CACHEW_OK);
	ck_assert_int_ne(stat(path, &st), 0);
	unsetenv("CACHEW_GNUPLOT");
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_plot_rejects_no_series)
{
	ck_assert_int_eq(cwi_sim_plot("/tmp/x.png", "t", "x", "y", NULL, 0),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "sim plot: /tmp/x.png has no series");
}
END_TEST

/* ---- the real binary -------------------------------------------------------------- */

typedef struct run_out {
	int status;
	char *out;
	char *err;
} run_out;

/* Runs `<build>/cachew sim args...` (NULL-terminated) with output in
 * files, so nothing blocks on a pipe. */
static run_out
run_cachew(const char *a1, ...)
{
	char bin[512], outp[600], errp[600], *argv[16];
	char *dir = cwt_tmpdir();
	run_out r;
	va_list ap;
	size_t n = 2;
	pid_t pid;
	int st;

	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	snprintf(outp, sizeof(outp), "%s/stdout", dir);
	snprintf(errp, sizeof(errp), "%s/stderr", dir);
	argv[0] = bin;
	argv[1] = (char *)"sim";
	argv[2] = (char *)a1;
	va_start(ap, a1);
	while (argv[n] != NULL && n < 14)
		argv[++n] = va_arg(ap, char *);
	va_end(ap);
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (freopen(outp, "w", stdout) == NULL ||
		    freopen(errp, "w", stderr) == NULL)
			_exit(127);
		execv(argv[0], argv);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	r.out = cwt_slurp(outp);
	r.err = cwt_slurp(errp);
	ck_assert_ptr_nonnull(r.out);
	ck_assert_ptr_nonnull(r.err);
	cwt_rmtree(dir);
	free(dir);
	return r;
}

START_TEST(test_cli_sim_autoscale_json_meets_the_goals)
{
	run_out r = run_cachew("autoscale", "--json", "--seed", "3", "--quick",
	    (char *)NULL);
	char *lines[64];
	size_t n;
	const char *m, *h;

	ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
	n = split_lines(r.out, lines, 64);
	ck_assert_uint_ge(n, 5);
	for (size_t i = 0; i < n; i++)
		assert_json_line(lines[i]);
	m = find_line(lines, n, "resnet50", "model");
	h = find_line(lines, n, "resnet50", "hpa:80");
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_nonnull(h);
	ck_assert_double_le(fabs(json_num(m, "workers") -
				json_num(m, "oracle_workers")),
	    1);
	ck_assert_double_le(json_num(m, "windows"), 3);
	ck_assert_double_le(json_num(m, "cost"), json_num(h, "cost"));
	free(r.out);
	free(r.err);
}
END_TEST

START_TEST(test_cli_sim_usage_errors)
{
	run_out r = run_cachew("autoscale", "--seed", "x", (char *)NULL);

	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err,
	    "cachew sim: --seed needs a non-negative integer"));
	free(r.out);
	free(r.err);
	r = run_cachew("nosuch", (char *)NULL);
	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err,
	    "cachew sim: unknown scenario 'nosuch'"));
	free(r.out);
	free(r.err);
	r = run_cachew("autoscale", "--price-worker", "-1", (char *)NULL);
	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err, "--price-worker needs a price"));
	free(r.out);
	free(r.err);
	r = run_cachew("autoscale", "--frobnicate", (char *)NULL);
	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err, "unknown flag '--frobnicate'"));
	free(r.out);
	free(r.err);
	/* --name=VALUE is --name VALUE, as for every command (it was an
	 * unknown flag); a flag without a value takes none. */
	r = run_cachew("autoscale", "--seed=x", (char *)NULL);
	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err,
	    "cachew sim: --seed needs a non-negative integer"));
	free(r.out);
	free(r.err);
	r = run_cachew("autoscale", "--json=1", (char *)NULL);
	ck_assert_int_eq(r.status, 2);
	ck_assert_ptr_nonnull(strstr(r.err, "--json takes no value"));
	free(r.out);
	free(r.err);
}
END_TEST

START_TEST(test_cli_sim_help)
{
	run_out r = run_cachew("--help", (char *)NULL);

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "usage: cachew sim <scenario>"));
	ck_assert_ptr_nonnull(strstr(r.out, "multitenant"));
	free(r.out);
	free(r.err);
}
END_TEST

Suite *
cwt_sim_suite(void)
{
	Suite *s = suite_create("sim");
	TCase *as = tcase_create("autoscale");
	TCase *mt = tcase_create("multitenant");
	TCase *hl = tcase_create("helpers");
	TCase *cli = tcase_create("cli");

	/* Each scenario runs in well under a second; sanitizers and
	 * valgrind make it slower. */
	tcase_set_timeout(as, 120);
	tcase_set_timeout(mt, 60);
	tcase_set_timeout(hl, 120);
	tcase_set_timeout(cli, 120);
	tcase_add_test(as, test_autoscale_json_lines_have_the_required_keys);
	tcase_add_test(as, test_autoscale_model_meets_the_goals_in_every_setting);
	tcase_add_test(as, test_autoscale_cachew_needs_more_windows_than_model);
	tcase_add_test(as, test_autoscale_fixed_oracle_line_is_the_oracle);
	tcase_add_test(as, test_autoscale_is_deterministic_per_seed);
	tcase_add_test(as, test_autoscale_table_says_whether_goals_are_met);
	tcase_add_test(as, test_autoscale_prices_change_the_cost);
	tcase_add_test(mt, test_multitenant_workers_move_within_one_interval);
	tcase_add_test(mt, test_multitenant_model_beats_cachew_on_epoch_time);
	tcase_add_test(hl, test_json_str_escapes);
	tcase_add_test(hl, test_rand_is_deterministic_and_jitter_bounded);
	tcase_add_test(hl, test_plot_writes_pngs_of_workers_and_throughput);
	tcase_add_test(hl, test_plot_without_gnuplot_skips_and_succeeds);
	tcase_add_test(hl, test_plot_rejects_no_series);
	tcase_add_test(cli, test_cli_sim_autoscale_json_meets_the_goals);
	tcase_add_test(cli, test_cli_sim_usage_errors);
	tcase_add_test(cli, test_cli_sim_help);
	suite_add_tcase(s, as);
	suite_add_tcase(s, mt);
	suite_add_tcase(s, hl);
	suite_add_tcase(s, cli);
	return s;
}
