/*
 * cwt.h - helpers shared by the Check suites. Each suite file defines
 * `Suite *cwt_<module>_suite(void)`; check_main.c runs them all.
 */
#ifndef CWT_H
#define CWT_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachew.h"

Suite *cwt_core_suite(void);
Suite *cwt_graph_suite(void);
Suite *cwt_ops_suite(void);
Suite *cwt_sources_suite(void);
Suite *cwt_exec_suite(void);
Suite *cwt_cli_suite(void);
Suite *cwt_formats_suite(void);
Suite *cwt_io_suite(void);
Suite *cwt_image_suite(void);
Suite *cwt_cache_suite(void);     /* check_cache.c: format, store, management */
Suite *cwt_cacheops_suite(void);  /* check_cacheops.c: operators, CLI, crashes */
Suite *cwt_transport_suite(void); /* check_transport.c: conformance, inproc+nng */
Suite *cwt_service_suite(void);   /* check_service.c: protocol, dispatcher */
Suite *cwt_split_suite(void);     /* check_split.c: splittable sources */
Suite *cwt_cluster_suite(void);   /* check_cluster.c: cachewd processes */
Suite *cwt_exact_suite(void);     /* check_exact.c: service fidelity */
Suite *cwt_dshuffle_suite(void);  /* check_dshuffle.c: shuffles through
				   * the service */
Suite *cwt_coord_suite(void);     /* check_coord.c: coordinated reads, zstd */
Suite *cwt_policy_suite(void);    /* check_policy.c: scalers, fair share */
Suite *cwt_sim_suite(void);       /* check_sim.c: cachew sim */
Suite *cwt_autocache_suite(void); /* check_autocache.c: cache decisions */
Suite *cwt_snapshot_suite(void); /* check_snapshot.c: the dispatcher's
				  * snapshot saved, loaded and corrupted */
Suite *cwt_provision_suite(void); /* check_provision.c: provisioners */
Suite *cwt_dautocache_suite(void); /* check_dautocache.c: the dispatcher's
                                    * autocaching passes */
Suite *cwt_journal_suite(void);   /* check_journal.c: write-ahead journal */
Suite *cwt_autoscale_suite(void); /* check_autoscale.c: policies in the
                                   * dispatcher, end to end */
Suite *cwt_resume_suite(void);    /* check_resume.c: saving and restoring
                                   * an iterator's position */
Suite *cwt_auth_suite(void);      /* check_auth.c: tokens, roles, owners */
Suite *cwt_cancel_suite(void);    /* check_cancel.c: timeouts, cancel,
                                   * fork */
Suite *cwt_stream_ops_suite(void); /* check_stream_ops.c: operators
                                   * over the whole stream (unique,
                                   * scan, window, group_by_window,
                                   * bucket_by_sequence_length,
                                   * ragged_batch) */
Suite *cwt_mixture_suite(void);   /* check_mixture.c: sample_ and
                                   * choose_from_datasets */
Suite *cwt_usersrc_suite(void);   /* check_usersrc.c: sources defined
                                   * by callbacks, from C and plugins */
Suite *cwt_tfdata_ops_suite(void); /* check_tfdata_ops.c: ignore_errors,
                                    * rebatch, random, ... (issue 15 A) */
Suite *cwt_spec_suite(void);      /* check_spec.c: element specs,
                                   * cardinality, named components */
Suite *cwt_security_suite(void);  /* check_security.c: what a worker may
                                   * read, fetch and write; --user */

/* Parses and runs a pipeline to its end. On success *out holds the
 * elements (free with cwt_free). On failure returns the error and, when
 * errmsg is not NULL, copies the message (parser's or iterator's). */
cachew_err cwt_run(const char *pipeline, const cachew_options *opts,
    cachew_element ***out, size_t *n, char *errmsg, size_t errlen);
cachew_err cwt_run_ds(cachew_dataset *ds, const cachew_options *opts,
    cachew_element ***out, size_t *n, char *errmsg, size_t errlen);
void cwt_free(cachew_element **v, size_t n);
/* Parses a pipeline that must build (fails the test with the errmsg). */
cachew_dataset *cwt_parse(const char *pipeline);
/* The cardinality and the spec (text; free with cachew_free) of a
 * pipeline that must build; cwt_spec_is fails the test unless the spec
 * reads `want`. */
int64_t cwt_card(const char *pipeline);
char *cwt_spec(const char *pipeline);
void cwt_spec_is(const char *pipeline, const char *want);
/* Building a pipeline fails with `code`, and the message holds `needle`, a
 * column and a caret line. */
void cwt_build_refused(const char *pipeline, cachew_err code,
    const char *needle);
/* Runs a pipeline (opts NULL: the defaults) that must fail with `code` and
 * a message (parser's or iterator's) containing `needle`. */
void cwt_run_fails(const char *pipeline, const cachew_options *opts,
    cachew_err code, const char *needle);

/* Options with a fixed seed (and threads if > 0). Destroy after use. */
cachew_options *cwt_opts(int64_t seed, int threads);

/* Scalar value of component c (i64 or f64 accessors check the dtype with
 * ck_assert). */
int64_t cwt_i64(const cachew_element *e, size_t c);
double cwt_f64(const cachew_element *e, size_t c);

/* "0,1,2": the scalar i64 component c of every element, comma-joined, or
 * for rank-1 i64 components "[0 1 2],[3 4]". Free with free(). Makes exact
 * sequence assertions one line: ck_assert_str_eq(s, "1,2,3"). */
char *cwt_join_i64(cachew_element **v, size_t n, size_t c);

/* Runs `pipeline` with opts and returns cwt_join_i64 of component 0;
 * fails the test (with the errmsg) when the run fails. */
char *cwt_seq(const char *pipeline, const cachew_options *opts);
/* Fails the test unless cwt_seq(pipeline, opts) reads `want`, naming the
 * pipeline and what it yielded. */
void cwt_seq_is(const char *pipeline, const cachew_options *opts,
    const char *want);

/* The bytes of component 0 (a bytes scalar) of every element of a run,
 * comma-joined; fails the test when the run fails. Free with free(). */
char *cwt_str_seq(const char *pipeline, const cachew_options *opts);
/* Saves an iterator of pipeline (opts may be NULL) after every count of
 * elements up to total (at most 64), restores it and checks that the run
 * reads `want` (cwt_join_i64 of component 0) every time. */
void cwt_resumes_at_every_cut(const char *pipeline,
    const cachew_options *opts, const char *want, int total);
/* The same on a dataset (`what` names it in failures). */
void cwt_resumes_ds_at_every_cut(cachew_dataset *ds, const char *what,
    const cachew_options *opts, const char *want, int total);

/* Options with a fixed seed and epoch, and `service` unless NULL. Destroy
 * after use. */
cachew_options *cwt_opts_at(int64_t seed, int64_t epoch, const char *service);

/* A run as the cachew_element_hash of each element, in order: 16 hex
 * digits per element, comma-joined; with sorted, in increasing order (the
 * multiset). Compares runs of any element type exactly in one line; fails
 * the test (with the errmsg) when the run fails. Free with free(). */
char *cwt_hash_seq(const char *pipeline, const cachew_options *opts,
    int sorted);

/* printf into a fresh heap string (free with free()); fails the test on
 * ENOMEM. */
char *cwt_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* The build directory (CACHEW_BUILD or "build"); a fresh temporary
 * directory (removed by cwt_rmtree). */
const char *cwt_build_dir(void);
/* The path of a file the build makes for the tests (a plugin: name is
 * "plugin_example_v2.so") in buf; fails the test, naming the make target,
 * when it is not there. */
void cwt_build_file(char *buf, size_t len, const char *name);
char *cwt_tmpdir(void);
void cwt_rmtree(const char *path);
/* Writes len bytes to path; fails the test on error. */
void cwt_write_file(const char *path, const void *data, size_t len);

/* A fresh directory (cwt_rmtree it) of TLS material made with the openssl
 * command, PEM files: ca.pem (and ca.key), server.pem and client.pem
 * (keys server.key, client.key) signed by it, other-ca.pem and
 * other-server.pem (its key other-server.key) signed by that one, and
 * server-expired.pem and client-expired.pem (the server's and the
 * client's keys; signed by ca; their validity ended yesterday). Leaf
 * certificates name localhost and 127.0.0.1. Fails the test when openssl
 * fails. */
char *cwt_tls_dir(void);
/* The TLS fixture of a test case: tcase_add_unchecked_fixture(tc,
 * cwt_tls_setup, cwt_tls_teardown) makes one cwt_tls_dir() in the parent
 * of the forked tests and removes it after them. cwt_tls_file(name) is
 * the path of one of its files, valid until this thread's 16th call
 * after. */
void cwt_tls_setup(void);
void cwt_tls_teardown(void);
const char *cwt_tls_file(const char *name);

/* The graph document of range(3) (docs/graph-format.md, section 3, with
 * only `stop`), cwt_range3_graph_len bytes: what tests register with a
 * dispatcher, which reads the functions a graph names. */
extern const char cwt_range3_graph[];
extern const size_t cwt_range3_graph_len;

/* ---- cachewd processes (cwt_daemon.c) ---------------------------------- */
#include <sys/types.h>

typedef struct cwt_daemon {
	pid_t pid;
	char url[256]; /* as the daemon logged it */
	char log[600]; /* its stderr */
} cwt_daemon;

uint64_t cwt_now_ms(void); /* CLOCK_MONOTONIC */
/* A bound of a wait for something expected to happen: ms, or 6 times ms
 * under valgrind (make valgrind sets CWT_VALGRIND), which runs the code
 * tens of times slower. Only ever makes a failing test slower to fail. */
int cwt_bound_ms(int ms);
void cwt_nap_ms(unsigned ms);
/* How many times needle occurs in hay (overlaps counted). */
int cwt_count(const char *hay, const char *needle);
/* A whole file as a NUL-terminated heap string, or NULL. */
char *cwt_slurp(const char *path);
/* Starts `<build>/cachewd <args...>` (NULL-terminated) with stderr in
 * <dir>/<name>.log and waits (10 s at most) until it logs where it
 * listens; a failed test kills it at exit. */
void cwt_daemon_start(cwt_daemon *d, const char *dir, const char *name, ...);
/* The same with the arguments in a NULL-terminated array (at most 30). */
void cwt_daemon_startv(cwt_daemon *d, const char *dir, const char *name,
    const char *const *args);
/* Sends sig and waits (10 s, then SIGKILL); the exit code, 128 + signal
 * when killed, -1 when it was not running. */
int cwt_daemon_stop(cwt_daemon *d, int sig);
/* Waits for d to exit on its own (ms, cwt_bound_ms, then SIGKILL); its
 * exit code as cwt_daemon_stop's. */
int cwt_daemon_wait(cwt_daemon *d, int ms);
/* "tcp://127.0.0.1:PORT" of a loopback port nothing listens on (bound,
 * then closed): dialling it is refused. */
void cwt_refused_url(char *url, size_t len);

/* Stops a dispatcher started with --journal-verify 1 (SIGTERM), checks
 * that its journal, replayed at the stop, gave the state it had, and
 * returns its exit code (cwt_daemon_stop's). */
int cwt_dispatcher_stop_verified(cwt_daemon *d);

/* Forks and execs argv (looked up on PATH), with NODE_PATH=node_path in
 * its environment unless NULL; fails the test when fork fails. */
pid_t cwt_spawn(char *const argv[], const char *node_path);
/* Waits (20 s at most) for a server to write its port to `portfile` and
 * for that port on 127.0.0.1 to accept; -1 when pid exits or time runs
 * out. */
int cwt_await_port(const char *portfile, pid_t pid);
/* Whether something accepts connections on 127.0.0.1:port now. */
bool cwt_port_accepts(int port);
/* SIGTERM, then SIGKILL after 2 s; waits for pid. No-op for pid <= 0. */
void cwt_stop_pid(pid_t pid);

/* test/servers/http_server.py serving `root` on 127.0.0.1, its request
 * log and port file in `dir`. */
typedef struct cwt_http_server {
	pid_t pid;
	int port;
	char log[512];
	char base[64]; /* "http://127.0.0.1:PORT" */
} cwt_http_server;

void cwt_http_server_start(cwt_http_server *s, const char *dir,
    const char *root);
void cwt_http_server_stop(cwt_http_server *s);

/* A dispatcher and workers on loopback, with fast heartbeats (50 ms), a
 * 2 s worker timeout and a 20 s client timeout; the workers run with one
 * thread, read what is under the cluster's dir and cache under
 * <dir>/cache. */
#define CWT_CLUSTER_MAX_WORKERS 16
typedef struct cwt_cluster {
	char *dir;
	cwt_daemon dispatcher;
	cwt_daemon workers[CWT_CLUSTER_MAX_WORKERS];
	int nworkers; /* started so far */
	/* The dispatcher runs with --journal-verify (cwt_cluster_start):
	 * cwt_cluster_stop checks that its journal replayed to its state. */
	bool verify_journal;
	/* cwt_cluster_start_tls: the listeners' --tls-client-auth; NULL:
	 * plaintext tcp. */
	const char *tls_client_auth;
	/* cwt_cluster_start_secure: role tokens. The dispatcher's
	 * --auth-tokens table, the workers' --token-file and a client's
	 * (role client, also good for `cachew status --token-file`); empty
	 * strings otherwise. */
	char token_table[600], worker_token[600], client_token[600];
} cwt_cluster;

void cwt_cluster_start(cwt_cluster *c, int nworkers);
/* The same over TLS, in a test case with the TLS fixture (cwt_tls_setup):
 * every daemon listens on tls+tcp://127.0.0.1:0 with its server.pem (and
 * server.key), which a worker also shows its dispatcher, trusts ca.pem,
 * and asks clients for certificates as client_auth says (none, optional,
 * required). */
void cwt_cluster_start_tls(cwt_cluster *c, int nworkers,
    const char *client_auth);
/* TLS as cwt_cluster_start_tls and role tokens (docs/security.md): the
 * dispatcher runs with --auth-tokens, the workers with --token-file; a
 * client uses c->client_token (token_file, CACHEW_TOKEN_FILE). */
void cwt_cluster_start_secure(cwt_cluster *c, int nworkers,
    const char *client_auth);
/* Starts worker i (its log is <dir>/worker<i>.log). */
void cwt_cluster_worker_start(cwt_cluster *c, int i);
/* Kills the dispatcher (SIGKILL) and starts it again on the same address
 * and work dir after `away_ms`; with `discard`, it starts empty (its
 * journal set aside). */
void cwt_cluster_dispatcher_restart(cwt_cluster *c, unsigned away_ms,
    bool discard);
/* Kills the workers, stops the dispatcher, removes the directory. */
void cwt_cluster_stop(cwt_cluster *c);

#endif /* CWT_H */
