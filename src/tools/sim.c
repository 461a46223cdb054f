/*
 * sim.c - `cachew sim`: option parsing, the scenario table, and the helpers
 * every scenario shares (plots through gnuplot, JSON strings, seeded
 * noise). The scenarios live in sim_autoscale.c, sim_tenant.c and
 * sim_autocache.c.
 */
#include "sim.h"

#include "../core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

static const char sim_usage[] =
    "usage: cachew sim <scenario> [flags]\n"
    "\n"
    "Virtual-time simulations of the policy engine (docs/policies.md).\n"
    "\n"
    "scenarios:\n"
    "  autoscale     policies model, cachew, hpa:80 and fixed:N on\n"
    "                input-bound jobs: converged workers vs the oracle,\n"
    "                decision windows, epoch time, cost\n"
    "  multitenant   two jobs sharing 10 workers by fair share (Cachew's\n"
    "                Figure 10): workers over time, epoch times\n"
    "  autocache     the Figure 7 sweep: compute vs source cache vs full\n"
    "                cache, the decision per setting\n"
    "\n"
    "flags:\n"
    "  --json                one JSON object per line, one per policy\n"
    "  --seed N              seed of the modelled noise (default 1)\n"
    "  --plot DIR            write PNG plots of workers and throughput\n"
    "                        over time into DIR (needs gnuplot)\n"
    "  --price-worker X      $ per worker-hour (default 0.40)\n"
    "  --price-consumer X    $ per consumer (training host) hour\n"
    "                        (default 3.00)\n"
    "  --quick               the first setting only (tests)\n"
    "  --verbose             print every decision with its reason and\n"
    "                        virtual time on stderr\n"
    "\n"
    "exit status: 0 ok, 1 runtime failure, 2 usage error\n";

void
cwi_sim_opts_default(cwi_sim_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->seed = 1;
	o->price_worker = 0.40;
	o->price_consumer = 3.00;
}

/* ---- the command line ---------------------------------------------------- */

static int
sim_usage_error(const char *fmt, ...) CACHEW_PRINTF(1, 2);

static int
sim_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("cachew sim: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n(see cachew sim --help)\n", stderr);
	return EXIT_USAGE;
}

static bool
parse_price(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0)
		return false;
	*out = v;
	return true;
}

static bool
parse_seed(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return false;
	*out = (uint64_t)v;
	return true;
}

/* Parses argv[2..] into o; returns 0 or the usage exit status. */
static int
parse_flags(int argc, char **argv, cwi_sim_opts *o)
{
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		/* --name=VALUE as --name VALUE (docs/cli.md). */
		const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=')
							   : NULL;
		char name[32];
		int step = 1;

		if (eq != NULL && (size_t)(eq - a) < sizeof(name)) {
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = '\0';
			a = name;
			v = eq + 1;
			step = 0;
		}

		if ((strcmp(a, "--json") == 0 || strcmp(a, "--quick") == 0 ||
			strcmp(a, "--verbose") == 0) && step == 0) {
			return sim_usage_error("%s takes no value", a);
		} else if (strcmp(a, "--json") == 0) {
			o->json = true;
		} else if (strcmp(a, "--quick") == 0) {
			o->quick = true;
		} else if (strcmp(a, "--verbose") == 0) {
			o->verbose = true;
		} else if (strcmp(a, "--seed") == 0) {
			if (v == NULL || !parse_seed(v, &o->seed))
				return sim_usage_error(
				    "--seed needs a non-negative integer");
			i += step;
		} else if (strcmp(a, "--plot") == 0) {
			if (v == NULL || *v == '\0')
				return sim_usage_error(
				    "--plot needs a directory");
			o->plot_dir = v;
			i += step;
		} else if (strcmp(a, "--price-worker") == 0) {
			if (v == NULL || !parse_price(v, &o->price_worker))
				return sim_usage_error("--price-worker needs "
						       "a price >= 0");
			i += step;
		} else if (strcmp(a, "--price-consumer") == 0) {
			if (v == NULL || !parse_price(v, &o->price_consumer))
				return sim_usage_error("--price-consumer "
						       "needs a price >= 0");
			i += step;
		} else {
			return sim_usage_error("unknown flag '%s'", a);
		}
	}
	return 0;
}

int
cwi_sim_cli(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*run)(const cwi_sim_opts *o, FILE *out);
	} scenarios[] = {
	    {"autoscale", cwi_sim_autoscale},
	    {"multitenant", cwi_sim_multitenant},
	    {"autocache", cwi_sim_autocache},
	};
	cwi_sim_opts o;
	int rc;

	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0 ||
		    (i == 1 && strcmp(argv[i], "help") == 0)) {
			fputs(sim_usage, stdout);
			return 0;
		}
	if (argc < 2)
		return sim_usage_error("missing a scenario (autoscale, "
				       "multitenant, autocache)");
	cwi_sim_opts_default(&o);
	rc = parse_flags(argc, argv, &o);
	if (rc != 0)
		return rc;
	if (o.plot_dir != NULL && mkdir(o.plot_dir, 0777) != 0 &&
	    errno != EEXIST) {
		fprintf(stderr, "cachew sim: cannot create plot directory "
				"%s: %s\n",
		    o.plot_dir, strerror(errno));
		return EXIT_RUNTIME;
	}
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (strcmp(argv[1], scenarios[i].name) == 0)
			return scenarios[i].run(&o, stdout);
	return sim_usage_error("unknown scenario '%s'", argv[1]);
}

/* ---- shared helpers ------------------------------------------------------ */

uint64_t
cwi_sim_rand(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double
cwi_sim_uniform(uint64_t *state)
{
	return (double)(cwi_sim_rand(state) >> 11) * 0x1.0p-53;
}

double
cwi_sim_jitter(uint64_t *state, double spread)
{
	return 1.0 + spread * (2.0 * cwi_sim_uniform(state) - 1.0);
}

void
cwi_sim_json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(out, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", out);
		else if (*p < 0x20)
			fprintf(out, "\\u%04x", *p);
		else
			fputc(*p, out);
	}
	fputc('"', out);
}

/* ---- plots --------------------------------------------------------------- */

/* The gnuplot to run: CACHEW_GNUPLOT (tests point it at a missing file to
 * exercise the fallback), else the first `gnuplot` on the PATH. Writes the
 * path into buf; false when there is none. */
static bool
find_gnuplot(char *buf, size_t size)
{
	const char *env = getenv("CACHEW_GNUPLOT");
	const char *path = getenv("PATH");

	if (env != NULL && *env != '\0') {
		snprintf(buf, size, "%s", env);
		return access(buf, X_OK) == 0;
	}
	if (path == NULL)
		path = "/usr/bin:/bin";
	while (*path != '\0') {
		const char *colon = strchr(path, ':');
		size_t len = colon ? (size_t)(colon - path) : strlen(path);
		int n = snprintf(buf, size, "%.*s/gnuplot", (int)len, path);

		if (len > 0 && n > 0 && (size_t)n < size &&
		    access(buf, X_OK) == 0)
			return true;
		path += len;
		if (*path == ':')
			path++;
	}
	return false;
}

bool
cwi_sim_have_gnuplot(void)
{
	char buf[4096];

	return find_gnuplot(buf, sizeof(buf));
}

/* gnuplot's single-quoted strings end at a quote (doubled to escape it);
 * titles become plain text without quotes or control characters. */
void
cwi_sim_put_gp_str(FILE *f, const char *s)
{
	fputc('\'', f);
	for (const char *p = s; *p; p++) {
		if (*p == '\'')
			fputs("''", f);
		else if ((unsigned char)*p < 0x20)
			fputc(' ', f);
		else
			fputc(*p, f);
	}
	fputc('\'', f);
}

static cachew_err
write_plot_data(const char *path, const cwi_sim_series *series,
    size_t nseries)
{
	FILE *f = fopen(path, "w");

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "sim plot: cannot write %s: %s",
		    path, strerror(errno));
	for (size_t s = 0; s < nseries; s++) {
		/* Blocks separated by two blank lines are gnuplot's
		 * `index` 0, 1, ... */
		fprintf(f, "# %s\n", series[s].title);
		for (size_t i = 0; i < series[s].n; i++)
			fprintf(f, "%.6g %.6g\n", series[s].x[i],
			    series[s].y[i]);
		fputs("\n\n", f);
	}
	if (fclose(f) != 0)
		return cwi_fail(CACHEW_EIO, "sim plot: cannot write %s: %s",
		    path, strerror(errno));
	return CACHEW_OK;
}

static cachew_err
write_plot_script(const char *path, const char *png, const char *data,
    const char *title, const char *xlabel, const char *ylabel,
    const cwi_sim_series *series, size_t nseries)
{
	FILE *f = fopen(path, "w");

	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "sim plot: cannot write %s: %s",
		    path, strerror(errno));
	fputs("set terminal pngcairo size 1000,520 noenhanced\n", f);
	fputs("set output ", f);
	cwi_sim_put_gp_str(f, png);
	fputs("\nset title ", f);
	cwi_sim_put_gp_str(f, title);
	fputs("\nset xlabel ", f);
	cwi_sim_put_gp_str(f, xlabel);
	fputs("\nset ylabel ", f);
	cwi_sim_put_gp_str(f, ylabel);
	fputs("\nset grid\nset key outside right top\nset yrange [0:*]\n"
	      "set offsets 0, 0, graph 0.05, 0\n"
	      "plot ",
	    f);
	for (size_t s = 0; s < nseries; s++) {
		if (s > 0)
			fputs(", \\\n     ", f);
		cwi_sim_put_gp_str(f, data);
		fprintf(f, " index %zu using 1:2 with steps lw 2 title ", s);
		cwi_sim_put_gp_str(f, series[s].title);
	}
	fputs("\n", f);
	if (fclose(f) != 0)
		return cwi_fail(CACHEW_EIO, "sim plot: cannot write %s: %s",
		    path, strerror(errno));
	return CACHEW_OK;
}

/* Runs `gnuplot script` with its stdout on /dev/null; its stderr stays
 * ours so a script error is visible. */
static cachew_err
run_gnuplot(const char *gnuplot, const char *script, const char *png)
{
	posix_spawn_file_actions_t fa;
	char *argv[3];
	pid_t pid;
	int status;
	int rc;

	argv[0] = (char *)gnuplot;
	argv[1] = (char *)script;
	argv[2] = NULL;
	if (posix_spawn_file_actions_init(&fa) != 0)
		return cwi_fail(CACHEW_ENOMEM, "sim plot: spawn setup failed");
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	rc = posix_spawn(&pid, gnuplot, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0)
		return cwi_fail(CACHEW_EIO, "sim plot: cannot run %s: %s",
		    gnuplot, strerror(rc));
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return cwi_fail(CACHEW_EIO, "sim plot: waiting for "
						    "%s: %s",
			    gnuplot, strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return cwi_fail(CACHEW_EIO, "sim plot: %s failed writing %s",
		    gnuplot, png);
	return CACHEW_OK;
}

cachew_err
cwi_sim_gnuplot(const char *script, const char *png)
{
	char gnuplot[4096];

	if (!find_gnuplot(gnuplot, sizeof(gnuplot)))
		return cwi_fail(CACHEW_ENOENT, "gnuplot not found (CACHEW_GNUPLOT "
		    "or the PATH; Debian: apt-get install gnuplot-nox)");
	return run_gnuplot(gnuplot, script, png);
}

cachew_err
cwi_sim_plot(const char *png_path, const char *title, const char *xlabel,
    const char *ylabel, const cwi_sim_series *series, size_t nseries)
{
	char gnuplot[4096];
	char *base = NULL;
	char *data = NULL;
	char *script = NULL;
	size_t len;
	cachew_err rv;

	if (nseries == 0)
		return cwi_fail(CACHEW_EINVAL, "sim plot: %s has no series",
		    png_path);
	if (!find_gnuplot(gnuplot, sizeof(gnuplot))) {
		fprintf(stderr, "cachew sim: gnuplot not found, plot %s "
				"skipped\n",
		    png_path);
		return CACHEW_OK;
	}
	len = strlen(png_path);
	if (len > 4 && strcmp(png_path + len - 4, ".png") == 0)
		len -= 4;
	base = cwi_strndup(png_path, len);
	data = base ? cwi_asprintf("%s.dat", base) : NULL;
	script = base ? cwi_asprintf("%s.gp", base) : NULL;
	if (data == NULL || script == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "sim plot: out of memory");
		goto done;
	}
	rv = write_plot_data(data, series, nseries);
	if (rv != CACHEW_OK)
		goto done;
	rv = write_plot_script(script, png_path, data, title, xlabel, ylabel,
	    series, nseries);
	if (rv != CACHEW_OK)
		goto done;
	rv = run_gnuplot(gnuplot, script, png_path);
done:
	free(base);
	free(data);
	free(script);
	return rv;
}
