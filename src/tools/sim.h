/*
 * sim.h - `cachew sim`: a virtual-time simulator that drives the policy
 * functions (scale.h, autocache.h) with modelled workers, storage and
 * clients, to compare policies quickly and reproducibly.
 *
 * Every scenario is a function from options to a printed report: a human
 * table by default, or with opts->json one JSON object per line, one per
 * policy (and per setting for sweeps), with at least the keys scenario,
 * policy, setting, workers, oracle_workers, windows, epoch_s, cost,
 * decision and best_fixed_epoch_s (docs/policies.md). Time is virtual:
 * nothing sleeps, and a run with the same seed prints the same bytes.
 *
 * Thread safety: the scenarios keep no global state; each call is
 * independent.
 */
#ifndef CWI_SIM_H
#define CWI_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cachew.h"

/* Options every scenario understands (parsed by cwi_sim_cli). */
typedef struct cwi_sim_opts {
	bool json;             /* --json: one JSON object per line */
	uint64_t seed;         /* --seed N (1): seeds every modelled noise */
	const char *plot_dir;  /* --plot DIR: write PNGs there (NULL: none) */
	double price_worker;   /* --price-worker: $ per worker-hour (0.40) */
	double price_consumer; /* --price-consumer: $ per consumer-hour,
				* the training host (3.00) */
	bool quick;            /* --quick: the first setting only (tests) */
	bool verbose;          /* --verbose: every decision and its reason,
				* with its virtual time, on stderr */
} cwi_sim_opts;

/* Fills o with the defaults above. */
void cwi_sim_opts_default(cwi_sim_opts *o);

/* `cachew sim <scenario> [flags]`: argv[0] is "sim". Returns the process
 * exit status: 0 ok, 1 runtime failure, 2 usage error. */
int cwi_sim_cli(int argc, char **argv);

/* The scenarios. Each prints its report to out and returns an exit
 * status (0 ok, 1 runtime failure such as an unwritable plot dir). */
int cwi_sim_autoscale(const cwi_sim_opts *o, FILE *out);
int cwi_sim_multitenant(const cwi_sim_opts *o, FILE *out);
/* The Figure 7 autocaching sweep, implemented in sim_autocache.c. */
int cwi_sim_autocache(const cwi_sim_opts *o, FILE *out);

/* ---- helpers for scenarios -------------------------------------------- */

/* One line of a plot: n points (x[i], y[i]), borrowed for the call. */
typedef struct cwi_sim_series {
	const char *title; /* legend entry */
	const double *x;
	const double *y;
	size_t n;
} cwi_sim_series;

/* Writes png_path (which should end in ".png") with one line per series,
 * by writing <base>.dat and <base>.gp next to it and running gnuplot
 * (CACHEW_GNUPLOT, else `gnuplot` on the PATH). When gnuplot is absent it
 * prints one line to stderr saying the plot was skipped and returns
 * CACHEW_OK: plots are an extra, CI machines may lack gnuplot. CACHEW_EIO
 * with a message naming the file when a file cannot be written or gnuplot
 * fails; CACHEW_EINVAL for nseries == 0. */
cachew_err cwi_sim_plot(const char *png_path, const char *title,
    const char *xlabel, const char *ylabel, const cwi_sim_series *series,
    size_t nseries);

/* Runs gnuplot on script, which writes png: ENOENT naming the package when
 * gnuplot is not found, EIO when it fails (its stderr is ours). */
cachew_err cwi_sim_gnuplot(const char *script, const char *png);
/* Writes s as a gnuplot single-quoted string (quotes doubled, control
 * characters dropped). */
void cwi_sim_put_gp_str(FILE *f, const char *s);

/* Whether cwi_sim_plot would run gnuplot (it is found). */
bool cwi_sim_have_gnuplot(void);

/* Prints s as a JSON string literal (quotes and escapes included). */
void cwi_sim_json_str(FILE *out, const char *s);

/* Deterministic pseudo-random numbers (splitmix64) for modelled noise:
 * the next 64 bits, a double uniform in [0, 1), and a factor uniform in
 * [1 - spread, 1 + spread]. *state is any seed and advances. */
uint64_t cwi_sim_rand(uint64_t *state);
double cwi_sim_uniform(uint64_t *state);
double cwi_sim_jitter(uint64_t *state, double spread);

#endif /* CWI_SIM_H */
