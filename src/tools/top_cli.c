/*
 * top_cli.c - `cachew top URL`: a live view of a dispatcher, redrawn in
 * place every interval from the same STATUS request as `cachew status`
 * (status_target.h): per job its rate, workers wanted and granted and
 * why, cache mode, the share of time its clients wait for data, their
 * batch time and split progress; per worker its CPU and tasks. `q`
 * quits.
 *
 * The terminal: the alternate screen (the shell's screen comes back
 * untouched), the cursor hidden, stdin in non-canonical mode without echo
 * so one key is read at once. Every way out (q, SIGINT, SIGTERM, SIGHUP,
 * an error) goes through top_restore(), which undoes all three; the
 * signals only set a flag (no stdio in a handler) that ends the poll.
 * A frame is built in memory and written with one write(), so a slow
 * terminal never shows half a frame; lines are cut to the terminal's
 * width and the frame to its height.
 */
#include "tools.h"
#include "status_target.h"
#include "../service/service.h"
#include "../service/service_rpc.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define TOP_INTERVAL_MIN_MS 100
#define TOP_INTERVAL_MAX_MS 3600000

static volatile sig_atomic_t top_stop_signal;
static volatile sig_atomic_t top_resized;

static void
on_stop_signal(int sig)
{
	top_stop_signal = sig;
}

static void
on_resize(int sig)
{
	(void)sig;
	top_resized = 1;
}

typedef struct top_term {
	bool raw;               /* stdin's mode was changed */
	struct termios saved;
	bool screen;            /* the alternate screen is on */
	int cols, rows;
} top_term;

static void
top_size(top_term *t)
{
	struct winsize ws;

	t->cols = 80;
	t->rows = 24;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 &&
	    ws.ws_row > 0) {
		t->cols = ws.ws_col;
		t->rows = ws.ws_row;
	}
}

static void
write_all(const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = write(STDOUT_FILENO, s, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

static void
top_setup(top_term *t)
{
	struct termios raw;

	if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
		raw = t->saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		t->raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
	}
	/* Alternate screen, cursor hidden. */
	write_all("\033[?1049h\033[?25l", 14);
	t->screen = true;
	top_size(t);
}

static void
top_restore(top_term *t)
{
	if (t->screen)
		write_all("\033[?25h\033[?1049l", 14);
	if (t->raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
	t->screen = t->raw = false;
}

/* ---- one frame ---------------------------------------------------------- */

typedef struct top_frame {
	cwi_strbuf sb;
	int cols, rows, lines;
	size_t line_start;
} top_frame;

/* Appends one line, cut to the width; lines past the height are dropped.
 * With ansi, each ends by clearing the rest of the terminal's line. */
static void
frame_line(top_frame *f, bool ansi, const char *fmt, ...)
	CACHEW_PRINTF(3, 4);

static void
frame_line(top_frame *f, bool ansi, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	size_t n;

	if (f->lines >= f->rows)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	n = strlen(line);
	if (n > (size_t)f->cols)
		n = (size_t)f->cols;
	cwi_strbuf_append(&f->sb, line, n);
	cwi_strbuf_puts(&f->sb, ansi ? "\033[K\r\n" : "\n");
	f->lines++;
}

static void
frame_jobs(top_frame *f, bool ansi, const cwi_msg_status_reply *s)
{
	frame_line(f, ansi, "JOBS %zu", s->njobs);
	frame_line(f, ansi, "  %-6s %-16s %-17s %7s %10s %8s %12s %-8s %5s "
	    "%8s %s", "ID", "NAME", "MODE", "CLIENTS", "ELEM/S", "MB/S",
	    "WORKERS w/g", "CACHE", "WAIT%", "BATCH ms", "SPLITS acked/total");
	for (size_t i = 0; i < s->njobs; i++) {
		const cwi_job_status *j = &s->jobs[i];
		char workers[32];

		if (j->scale_policy != NULL)
			snprintf(workers, sizeof(workers), "%u/%u%s", j->want,
			    j->granted, j->settled ? " =" : "");
		else
			snprintf(workers, sizeof(workers), "%u", j->tasks);
		frame_line(f, ansi, "  %-6" PRIu64 " %-16.16s %-17s %7u %10.0f "
		    "%8.1f %12s %-8s %5.0f %8.2f %" PRIu64 "/%" PRIu64 "%s",
		    j->job_id, j->name != NULL ? j->name : "(private)",
		    cwi_processing_mode_name(j->processing_mode), j->clients,
		    j->elements_per_s, j->bytes_per_s / 1e6, workers,
		    j->cache_mode != NULL ? j->cache_mode : "-",
		    j->client_wait * 100, (double)j->batch_time_ns / 1e6,
		    j->splits_acked,
		    j->splits_total,
		    j->finished ? " finished" : j->data_done ? " done" : "");
		if (j->slowest_op != NULL)
			frame_line(f, ansi, "         slowest %s %.0f%%",
			    j->slowest_op, j->slowest_op_share * 100);
		if (j->scale_policy != NULL && j->reason != NULL &&
		    j->reason[0] != '\0')
			frame_line(f, ansi, "         %s: %s", j->scale_policy,
			    j->reason);
	}
}

static void
frame_workers(top_frame *f, bool ansi, const cwi_msg_status_reply *s)
{
	frame_line(f, ansi, "WORKERS %zu", s->nworkers);
	frame_line(f, ansi, "  %-6s %-28s %5s %6s %6s %8s %s", "ID", "ADDRESS",
	    "CORES", "CPU", "TASKS", "HB ms", "STATE");
	for (size_t i = 0; i < s->nworkers; i++) {
		const cwi_worker_status *w = &s->workers[i];
		frame_line(f, ansi, "  %-6" PRIu64 " %-28.28s %5u %6.2f %6u %8"
		    PRIu64 " %s", w->worker_id,
		    w->address != NULL && w->address[0] != '\0' ? w->address
								: "-",
		    w->cores, w->cpu_use, w->tasks, w->heartbeat_age_ms,
		    w->draining ? "draining" : "live");
	}
}

/* The whole screen: a title, the pool, the jobs, the workers; s NULL with
 * error set when the last request failed. */
static void
frame_build(top_frame *f, bool ansi, const char *url, unsigned interval_ms,
    const cwi_msg_status_reply *s, const char *error)
{
	char clock[16];
	time_t now = time(NULL);
	struct tm tm;

	strftime(clock, sizeof(clock), "%H:%M:%S", localtime_r(&now, &tm));
	if (ansi)
		cwi_strbuf_puts(&f->sb, "\033[H");
	frame_line(f, ansi, "cachew top  %s  %s  every %.1f s  (q quits)", url,
	    clock, interval_ms / 1000.0);
	if (s == NULL) {
		frame_line(f, ansi, "dispatcher: %s; trying again", error);
	} else if (s->provisioner != NULL) {
		frame_line(f, ansi, "pool: target %u; provisioner %s, %u running, "
		    "%" PRIu64 " actions, %" PRIu64 " failed%s%s", s->pool_target,
		    s->provisioner, s->provisioner_running,
		    s->provisioner_requests, s->provisioner_failures,
		    s->provisioner_error != NULL ? "; last error: " : "",
		    s->provisioner_error != NULL ? s->provisioner_error : "");
	} else {
		frame_line(f, ansi, "pool: no policy engine");
	}
	if (s != NULL) {
		frame_line(f, ansi, "%s", "");
		frame_jobs(f, ansi, s);
		frame_line(f, ansi, "%s", "");
		frame_workers(f, ansi, s);
	}
	if (ansi)
		cwi_strbuf_puts(&f->sb, "\033[J");
}

/* ---- the loop ----------------------------------------------------------- */

typedef struct top_args {
	cwi_status_target target;
	unsigned interval_ms;
	bool once;
} top_args;

static const char top_usage[] =
    "usage: cachew top [URL] [--interval MS] [--once] [--token-file FILE]\n"
    "                  [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "                  [--tls-server-name NAME]\n"
    "  a live view of a dispatcher, redrawn every MS milliseconds (default\n"
    "  1000): jobs (rate, workers wanted/granted, cache mode, client batch\n"
    "  time, splits) and workers (CPU, tasks); q quits. --once prints one\n"
    "  frame without terminal control and exits. URL and FILE default as\n"
    "  for cachew status.\n";

/* 0 to run, else the exit code (help: 0 after printing it, as -1). */
static int
top_parse(top_args *a, int argc, char **argv)
{
	cwi_status_target_init(&a->target);
	a->interval_ms = 1000;
	a->once = false;
	for (int i = 1; i < argc; i++) {
		int st = cwi_status_target_flag(&a->target, "top", argc, argv, &i);
		const char *val = NULL;
		char *end;
		int m;
		if (st < 0)
			return 2;
		if (st > 0)
			continue;
		if (strcmp(argv[i], "--once") == 0) {
			a->once = true;
		} else if ((m = cwi_flag_value(argc, argv, &i, "--interval",
				&val)) != 0) {
			unsigned long v = 0;
			errno = 0;
			if (m > 0)
				v = strtoul(val, &end, 10);
			if (m < 0 || errno != 0 || *end != '\0' || end == val ||
			    val[0] == '-' || v < TOP_INTERVAL_MIN_MS ||
			    v > TOP_INTERVAL_MAX_MS) {
				fprintf(stderr, "cachew top: --interval must be "
				    "milliseconds in [%d, %d], not '%s'\n",
				    TOP_INTERVAL_MIN_MS, TOP_INTERVAL_MAX_MS,
				    m > 0 ? val : "");
				return 2;
			}
			a->interval_ms = (unsigned)v;
		} else if (strcmp(argv[i], "--help") == 0 ||
			   strcmp(argv[i], "-h") == 0) {
			fputs(top_usage, stdout);
			return -1;
		} else if (a->target.url == NULL && argv[i][0] != '-') {
			a->target.url = argv[i];
		} else {
			fprintf(stderr, "cachew top: unexpected '%s'\n", argv[i]);
			return 2;
		}
	}
	return 0;
}

/* Waits up to ms for a key; true when it asks to quit (q, Q). Once stdin
 * ends (or is no terminal that can be read), *no_keys is set and the
 * interval is slept instead, so an ended stdin never spins. A signal ends
 * either wait early; the caller looks at the flag. */
static bool
top_wait_key(unsigned ms, bool *no_keys)
{
	struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
	char keys[32];
	ssize_t n;

	if (*no_keys) {
		poll(NULL, 0, (int)ms);
		return false;
	}
	if (poll(&p, 1, (int)ms) <= 0)
		return false;
	n = (p.revents & POLLIN) != 0 ? read(STDIN_FILENO, keys, sizeof(keys))
				      : 0;
	if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
		*no_keys = true;
		return false;
	}
	for (ssize_t i = 0; i < n; i++)
		if (keys[i] == 'q' || keys[i] == 'Q')
			return true;
	return false;
}

/* One request; on failure the connection is dropped, to be dialed again
 * next time. */
static cachew_err
top_fetch(top_args *a, cwi_conn **c, const char *token, cwi_pmsg *rep,
    char *error, size_t errlen)
{
	cwi_transport_opts topts;
	cachew_err rv;

	if (*c == NULL) {
		cwi_transport_opts_init(&topts);
		cwi_rpc_client_tls(&a->target.opts, &topts);
		rv = cwi_dial(c, a->target.url, &topts);
		if (rv != CACHEW_OK) {
			snprintf(error, errlen, "%s", cachew_errmsg());
			return rv;
		}
	}
	rv = cwi_status_fetch(*c, token, rep);
	if (rv != CACHEW_OK) {
		snprintf(error, errlen, "%s", cachew_errmsg());
		cwi_conn_destroy(*c);
		*c = NULL;
	}
	return rv;
}

static void
top_draw(top_args *a, top_term *t, bool ansi, const cwi_msg_status_reply *s,
    const char *error)
{
	top_frame f = {.cols = t->cols, .rows = t->rows};
	char *text;
	size_t len;

	cwi_strbuf_init(&f.sb);
	frame_build(&f, ansi, a->target.url, a->interval_ms, s, error);
	if (cwi_strbuf_finish(&f.sb, &text, &len) == CACHEW_OK) {
		write_all(text, len);
		free(text);
	}
}

static void
top_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: the signal ends the poll at once. */
	sa.sa_handler = on_stop_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_resize;
	sigaction(SIGWINCH, &sa, NULL);
}

int
cwi_top_cli(int argc, char **argv)
{
	top_args a;
	top_term t = {0};
	cwi_conn *c = NULL;
	char *token = NULL, error[512];
	bool no_keys = false;
	int st = top_parse(&a, argc, argv);

	if (st != 0)
		return st < 0 ? 0 : st;
	if (!a.once && !isatty(STDOUT_FILENO)) {
		fprintf(stderr, "cachew top: standard output is not a terminal "
				"(--once prints one frame; cachew status "
				"--json is for scripts)\n");
		return 2;
	}
	st = cwi_status_connect(&a.target, "top", &c, &token);
	if (st != 0)
		return st;
	top_stop_signal = 0;
	top_signals();
	if (!a.once) {
		top_setup(&t);
	} else {
		t.cols = 1000;
		t.rows = 1000;
	}
	for (;;) {
		cwi_pmsg rep;
		bool ok = top_fetch(&a, &c, token, &rep, error,
		    sizeof(error)) == CACHEW_OK;

		if (top_resized) {
			top_resized = 0;
			top_size(&t);
		}
		top_draw(&a, &t, !a.once, ok ? &rep.u.status_reply : NULL,
		    error);
		if (ok)
			cwi_pmsg_free(&rep);
		if (a.once) {
			st = ok ? 0 : 1;
			if (!ok)
				fprintf(stderr, "cachew top: %s\n", error);
			break;
		}
		if (top_wait_key(a.interval_ms, &no_keys) ||
		    top_stop_signal != 0)
			break;
	}
	top_restore(&t);
	cwi_conn_destroy(c);
	free(token);
	return st;
}
