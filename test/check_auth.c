/*
 * check_auth.c - authenticated peers and authorised messages
 * (docs/security.md, "Authentication and authorisation"): the token file,
 * the envelope's "k" and "i", ownership in the state machine, and the
 * attacks of issue 14 replayed against real `cachewd` processes on
 * loopback with a token file made at test time.
 */
#include "cwt.h"
#include "../src/core/siphash.h"
#include "../src/service/dispatcher/dispatcher_state.h"
#include "../src/service/service_auth.h"
#include "../src/service/service_rpc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- token files ------------------------------------------------------------ */

enum { ALICE, BOB, POOL, POOL2, ROOT, NIDS };
static const char *const id_role[NIDS] = {"client", "client", "worker",
    "worker", "admin"};
static const char *const id_name[NIDS] = {"alice", "bob", "pool", "pool2",
    "root"};

typedef struct tokens {
	char token[NIDS][64];
	char file[NIDS][600]; /* each identity's own token file */
	char table[600];      /* the dispatcher's --auth-tokens */
} tokens;

static void
write_mode(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	ck_assert_msg(fd >= 0, "%s", path);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* Fresh random tokens for every identity, the table and one file each. */
static void
tokens_make(tokens *t, const char *dir)
{
	char *table = cwt_fmt("# made by check_auth.c\n\n");
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();

	for (int i = 0; i < NIDS; i++) {
		char *next;
		snprintf(t->token[i], sizeof(t->token[i]), "%s-%08x%08x",
		    id_name[i], (unsigned)rand_r(&seed),
		    (unsigned)rand_r(&seed));
		snprintf(t->file[i], sizeof(t->file[i]), "%s/%s.token", dir,
		    id_name[i]);
		write_mode(t->file[i], t->token[i], 0600);
		next = cwt_fmt("%s%s %s %s\n", table, id_role[i], id_name[i],
		    t->token[i]);
		free(table);
		table = next;
	}
	snprintf(t->table, sizeof(t->table), "%s/tokens", dir);
	write_mode(t->table, table, 0600);
	free(table);
}

START_TEST(token_file_loads_and_checks_roles)
{
	char *dir = cwt_tmpdir();
	tokens t;
	cwi_auth_tokens *a;
	cwi_auth_role role;
	const char *who;
	cwi_pmsg m;

	tokens_make(&t, dir);
	ck_assert_msg(cwi_auth_tokens_load(&a, t.table) == CACHEW_OK, "%s",
	    cachew_errmsg());
	cwi_pmsg_init(&m, CWI_MSG_WORKER_REGISTER);
	ck_assert_int_eq(cwi_auth_check(a, &m, &role, &who), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "not authenticated"));
	ck_assert_int_eq(cwi_pmsg_set_token(&m, t.token[POOL]), CACHEW_OK);
	ck_assert_int_eq(cwi_auth_check(a, &m, &role, &who), CACHEW_OK);
	ck_assert_int_eq(role, CWI_ROLE_WORKER);
	ck_assert_str_eq(who, "pool");
	ck_assert_int_eq(cwi_pmsg_set_token(&m, t.token[ALICE]), CACHEW_OK);
	ck_assert_int_eq(cwi_auth_check(a, &m, &role, &who), CACHEW_EPERM);
	ck_assert_str_eq(cachew_errmsg(), "role client may not send "
					  "worker_register (token of 'alice')");
	ck_assert_int_eq(cwi_pmsg_set_token(&m, "alice-not-the-token"),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_auth_check(a, &m, &role, &who), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "not authenticated"));
	ck_assert_ptr_null(strstr(cachew_errmsg(), "alice-not"));
	cwi_pmsg_free(&m);
	cwi_auth_tokens_destroy(a);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Each defect is refused naming the file and line, never the token. */
START_TEST(token_file_defects_are_refused_naming_the_line)
{
	static const struct {
		const char *text;
		const char *msg;
	} bad[] = {
	    {"client alice 0123456789abcdef\nworker\n", ":2: expected"},
	    {"guest alice 0123456789abcdef\n", ":1: unknown role 'guest'"},
	    {"client al/ice 0123456789abcdef\n", ":1: the name is not"},
	    {"client alice short\n", ":1: the token of 'alice' has 5 "},
	    {"client alice 0123456789abcdef\n# x\nadmin root "
	     "0123456789abcdef\n", ":3: the token of 'root' is also the "
				  "token of 'alice'"},
	    {"# nothing\n", ": no tokens"},
	};
	char *dir = cwt_tmpdir(), *path = cwt_fmt("%s/tokens", dir);
	cwi_auth_tokens *a;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_mode(path, bad[i].text, 0600);
		ck_assert_int_eq(cwi_auth_tokens_load(&a, path),
		    CACHEW_EINVAL);
		ck_assert_msg(strstr(cachew_errmsg(), bad[i].msg) != NULL &&
			strstr(cachew_errmsg(), path) != NULL &&
			strstr(cachew_errmsg(), "0123456789") == NULL,
		    "%zu: %s", i, cachew_errmsg());
	}
	write_mode(path, "client alice 0123456789abcdef\n", 0640);
	ck_assert_int_eq(cwi_auth_tokens_load(&a, path), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "mode 0640"));
	free(path);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(listen_addresses_local_or_not)
{
	ck_assert(cwi_auth_listen_is_local("tcp://127.0.0.1:7070"));
	ck_assert(cwi_auth_listen_is_local("tcp://127.1.2.3:0"));
	ck_assert(cwi_auth_listen_is_local("tcp://localhost:7070"));
	ck_assert(cwi_auth_listen_is_local("tcp://[::1]:7070"));
	ck_assert(cwi_auth_listen_is_local("tls+tcp://127.0.0.1:7070"));
	ck_assert(cwi_auth_listen_is_local("ipc:///tmp/x"));
	ck_assert(cwi_auth_listen_is_local("inproc://d"));
	ck_assert(!cwi_auth_listen_is_local("tcp://0.0.0.0:7070"));
	ck_assert(!cwi_auth_listen_is_local("tcp://10.0.0.5:7070"));
	ck_assert(!cwi_auth_listen_is_local("tcp://127.evil.com:7070"));
	ck_assert(!cwi_auth_listen_is_local("tcp://[::]:7070"));
}
END_TEST

/* The paper's test vector (appendix A): key 00..0f, message 00..0e. */
START_TEST(siphash_gives_the_papers_vector)
{
	uint8_t key[16], msg[15];

	for (unsigned i = 0; i < 16; i++)
		key[i] = (uint8_t)i;
	for (unsigned i = 0; i < 15; i++)
		msg[i] = (uint8_t)i;
	ck_assert_uint_eq(cwi_siphash24(key, msg, sizeof(msg)),
	    0xa129ca6149be45e5ull);
	/* Another length takes another path through the last word. */
	ck_assert_uint_ne(cwi_siphash24(key, msg, 8),
	    cwi_siphash24(key, msg, 9));
}
END_TEST

/* ---- the envelope ----------------------------------------------------------- */

/* "k" and "i" come right after "v" and "t" and decode back; the codec
 * refuses a token over its limit. */
START_TEST(envelope_carries_token_and_identity)
{
	cwi_pmsg m, back;
	cwi_strbuf sb;
	char big[CWI_PROTO_MAX_TOKEN + 2];
	static const uint8_t head[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't',
	    0xa6, 's', 't', 'a', 't', 'u', 's', 0xa1, 'k'};

	cwi_pmsg_init(&m, CWI_MSG_STATUS);
	ck_assert_int_eq(cwi_pmsg_set_token(&m, "secret-0123456789"),
	    CACHEW_OK);
	m.identity = strdup("alice");
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_pmsg_encode(&m, &sb), CACHEW_OK);
	ck_assert_int_eq(memcmp(sb.data, head, sizeof(head)), 0);
	ck_assert_int_eq(cwi_pmsg_decode((const uint8_t *)sb.data, sb.len,
			     &back), CACHEW_OK);
	ck_assert_str_eq(back.token, "secret-0123456789");
	ck_assert_str_eq(back.identity, "alice");
	cwi_pmsg_free(&back);
	sb.len = 0;
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	ck_assert_int_eq(cwi_pmsg_set_token(&m, big), CACHEW_OK);
	ck_assert_int_eq(cwi_pmsg_encode(&m, &sb), CACHEW_ERANGE);
	cwi_strbuf_free(&sb);
	cwi_pmsg_free(&m);
}
END_TEST

/* ---- ownership in the state machine ------------------------------------------ */

static cachew_err
handle_as(cwi_dispatcher *d, const char *identity, cwi_pmsg *req,
    cwi_pmsg *rep)
{
	cachew_err rv;

	free(req->identity);
	req->identity = identity != NULL ? strdup(identity) : NULL;
	rv = cwi_dispatcher_handle(d, 1000, req, rep);
	cwi_pmsg_free(req);
	return rv;
}

/* A dataset_register of range(3) (3 units) under fingerprint fp. */
static void
dataset_request(cwi_pmsg *req, uint64_t fp)
{
	cwi_pmsg_init(req, CWI_MSG_DATASET_REGISTER);
	req->u.dataset_register.fingerprint.hi = fp;
	req->u.dataset_register.graph = malloc(cwt_range3_graph_len);
	ck_assert_ptr_nonnull(req->u.dataset_register.graph);
	memcpy(req->u.dataset_register.graph, cwt_range3_graph,
	    cwt_range3_graph_len);
	req->u.dataset_register.graph_len = cwt_range3_graph_len;
	req->u.dataset_register.split_units = 3;
	req->u.dataset_register.splittable = true;
}

/* Alice's job: its dataset (range3) and job "j", and a worker of pool. */
static void
owned_state(cwi_dispatcher **d, uint64_t *job, uint64_t *client,
    uint64_t *worker)
{
	cwi_dispatcher_config cfg;
	cwi_pmsg req, rep;

	cwi_dispatcher_config_default(&cfg);
	ck_assert_int_eq(cwi_dispatcher_create(d, &cfg), CACHEW_OK);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = strdup("tcp://127.0.0.1:9");
	req.u.worker_register.cores = 1;
	ck_assert_int_eq(handle_as(*d, "pool", &req, &rep), CACHEW_OK);
	*worker = rep.u.worker_register_reply.worker_id;
	cwi_pmsg_free(&rep);
	dataset_request(&req, 7);
	ck_assert_int_eq(handle_as(*d, "alice", &req, &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	req.u.job_get_or_create.job_name = strdup("j");
	ck_assert_int_eq(handle_as(*d, "alice", &req, &rep), CACHEW_OK);
	*job = rep.u.job_get_or_create_reply.job_id;
	*client = rep.u.job_get_or_create_reply.client_id;
	cwi_pmsg_free(&rep);
}

static cachew_err
release_as(cwi_dispatcher *d, const char *identity, uint64_t job,
    uint64_t client)
{
	cwi_pmsg req, rep;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
	req.u.job_release.job_id = job;
	req.u.job_release.client_id = client;
	rv = handle_as(d, identity, &req, &rep);
	cwi_pmsg_free(&rep);
	return rv;
}

/* Every request naming alice's job or client comes from alice, or it is
 * EPERM naming the job; joining her named job too. */
START_TEST(ownership_refuses_another_tenants_job)
{
	cwi_dispatcher *d;
	uint64_t job, client, worker;
	cwi_pmsg req, rep;

	owned_state(&d, &job, &client, &worker);
	cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
	req.u.split_ack.job_id = job;
	req.u.split_ack.client_id = client;
	req.u.split_ack.split_ids = calloc(1, sizeof(uint64_t));
	req.u.split_ack.nsplit_ids = 1;
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_EPERM);
	ck_assert_str_eq(rep.u.error.message, "job 1 belongs to another "
					      "tenant");
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_CLIENT_HEARTBEAT);
	req.u.client_heartbeat.job_id = job;
	req.u.client_heartbeat.client_id = client;
	ck_assert_int_eq(handle_as(d, NULL, &req, &rep), CACHEW_EPERM);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	req.u.job_get_or_create.job_name = strdup("j");
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_EPERM);
	ck_assert_str_eq(rep.u.error.message, "job 1 ('j') belongs to another "
					      "tenant");
	cwi_pmsg_free(&rep);
	/* A job of her dataset under no name (ids are 1, 2, ...: bob need
	 * not see any): her graph would run for him. */
	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_EPERM);
	ck_assert_str_eq(rep.u.error.message, "dataset 1 was registered by "
					      "another tenant: register its "
					      "graph first");
	cwi_pmsg_free(&rep);
	/* Holding the same graph, he registers it (the same id) and may. */
	dataset_request(&req, 7);
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_OK);
	ck_assert_uint_eq(rep.u.dataset_register_reply.dataset_id, 1);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	ck_assert_int_eq(release_as(d, "bob", job, client), CACHEW_EPERM);
	ck_assert_int_eq(release_as(d, "alice", job, client), CACHEW_OK);
	cwi_dispatcher_destroy(d);
}
END_TEST

/* A worker's messages and its address are its identity's. */
START_TEST(ownership_refuses_another_identitys_worker)
{
	cwi_dispatcher *d;
	uint64_t job, client, worker;
	cwi_pmsg req, rep;

	owned_state(&d, &job, &client, &worker);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = strdup("tcp://127.0.0.1:9");
	req.u.worker_register.cores = 1;
	ck_assert_int_eq(handle_as(d, "pool2", &req, &rep), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(rep.u.error.message, "of another "
							  "identity"));
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = worker;
	ck_assert_int_eq(handle_as(d, "pool2", &req, &rep), CACHEW_EPERM);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = worker;
	ck_assert_int_eq(handle_as(d, "pool", &req, &rep), CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_dispatcher_destroy(d);
}
END_TEST

/* A tenant's status shows its own jobs only, and no worker address. */
START_TEST(ownership_redacts_a_tenants_status)
{
	cwi_dispatcher *d;
	uint64_t job, client, worker;
	cwi_pmsg req, rep;

	owned_state(&d, &job, &client, &worker);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(handle_as(d, "bob", &req, &rep), CACHEW_OK);
	cwi_dispatcher_status_redact(d, "bob", &rep.u.status_reply);
	ck_assert_uint_eq(rep.u.status_reply.njobs, 0);
	ck_assert_uint_eq(rep.u.status_reply.ndatasets, 0);
	ck_assert_uint_eq(rep.u.status_reply.nworkers, 1);
	ck_assert_ptr_null(rep.u.status_reply.workers[0].address);
	ck_assert_uint_eq(rep.u.status_reply.other_jobs, 1);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(handle_as(d, "alice", &req, &rep), CACHEW_OK);
	cwi_dispatcher_status_redact(d, "alice", &rep.u.status_reply);
	ck_assert_uint_eq(rep.u.status_reply.njobs, 1);
	ck_assert_uint_eq(rep.u.status_reply.jobs[0].job_id, job);
	ck_assert_uint_eq(rep.u.status_reply.ndatasets, 1);
	cwi_pmsg_free(&rep);
	cwi_dispatcher_destroy(d);
}
END_TEST

/* A snapshot keeps the owners: loaded, bob is still refused.
 * SNAP_CORPUS_DIR=test/fuzz/corpus/fuzz_dispatcher_snapshot also writes it
 * there (the seed "owners"). */
START_TEST(ownership_survives_a_snapshot)
{
	cwi_dispatcher *d, *e;
	cwi_dispatcher_config cfg;
	uint64_t job, client, worker;
	uint8_t *snap, *again;
	size_t len, len2;

	owned_state(&d, &job, &client, &worker);
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(d, &snap, &len),
	    CACHEW_OK);
	/* A seed of the snapshot fuzz target's corpus, as check_snapshot.c
	 * writes its scenarios'. */
	if (getenv("SNAP_CORPUS_DIR") != NULL) {
		char *path = cwt_fmt("%s/owners", getenv("SNAP_CORPUS_DIR"));
		cwt_write_file(path, snap, len);
		free(path);
	}
	cwi_dispatcher_config_default(&cfg);
	ck_assert_int_eq(cwi_dispatcher_create(&e, &cfg), CACHEW_OK);
	ck_assert_msg(cwi_dispatcher_snapshot_load(e, snap, len) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_int_eq(cwi_dispatcher_snapshot_save(e, &again, &len2),
	    CACHEW_OK);
	ck_assert_uint_eq(len, len2);
	ck_assert_int_eq(memcmp(snap, again, len), 0);
	ck_assert_int_eq(release_as(e, "bob", job, client), CACHEW_EPERM);
	ck_assert_int_eq(release_as(e, "alice", job, client), CACHEW_OK);
	free(snap);
	free(again);
	cwi_dispatcher_destroy(d);
	cwi_dispatcher_destroy(e);
}
END_TEST

/* ---- real processes ------------------------------------------------------------ */

typedef struct authc {
	char *dir;
	char work[600];
	tokens t;
	cwt_daemon dispatcher;
	cwt_daemon worker;
} authc;

static void
dispatcher_start(authc *a)
{
	cwt_daemon_start(&a->dispatcher, a->dir, "dispatcher",
	    "--role=dispatcher", "--listen", "tcp://127.0.0.1:0", "--work-dir",
	    a->work, "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--client-timeout-ms", "20000", "--journal-verify", "1",
	    "--auth-tokens", a->t.table, (char *)NULL);
}

/* A dispatcher with tokens, and a worker of pool unless nworkers is 0. */
static void
authc_start(authc *a, int nworkers)
{
	memset(a, 0, sizeof(*a));
	a->dir = cwt_tmpdir();
	snprintf(a->work, sizeof(a->work), "%s/work", a->dir);
	tokens_make(&a->t, a->dir);
	dispatcher_start(a);
	if (nworkers > 0)
		cwt_daemon_start(&a->worker, a->dir, "worker", "--role=worker",
		    "--dispatcher", a->dispatcher.url, "--listen",
		    "tcp://127.0.0.1:0", "--heartbeat-ms", "50", "--threads",
		    "1", "--token-file", a->t.file[POOL], (char *)NULL);
}

static void
authc_stop(authc *a)
{
	if (a->worker.pid > 0)
		cwt_daemon_stop(&a->worker, SIGKILL);
	if (a->dispatcher.pid > 0)
		ck_assert_int_eq(cwt_dispatcher_stop_verified(&a->dispatcher),
		    0);
	cwt_rmtree(a->dir);
	free(a->dir);
}

/* One request to url as identity i (-1: no token); the reply in *rep. */
static cachew_err
call_as(const char *url, int i, cwi_pmsg *req, cwi_msg_type expect,
    cwi_pmsg *rep, const tokens *t)
{
	cwi_conn *c;
	cachew_err rv;

	ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_OK);
	if (i >= 0)
		ck_assert_int_eq(cwi_pmsg_set_token(req, t->token[i]),
		    CACHEW_OK);
	rv = cwi_rpc_call(c, req, expect, 5000, rep);
	cwi_pmsg_free(req);
	cwi_conn_destroy(c);
	return rv;
}

static cachew_options *
client_opts(const authc *a, int i)
{
	cachew_options *o = cwt_opts_at(5, 0, a->dispatcher.url);

	ck_assert_int_eq(cachew_options_set_str(o, "token_file",
			     a->t.file[i]), CACHEW_OK);
	return o;
}

/* Every element of range(n), once. */
static void
assert_range(cachew_element **v, size_t got, size_t n)
{
	char *seen = calloc(n, 1);

	ck_assert_uint_eq(got, n);
	for (size_t k = 0; k < got; k++) {
		int64_t x = cwt_i64(v[k], 0);
		ck_assert(x >= 0 && (size_t)x < n && !seen[x]);
		seen[x] = 1;
	}
	free(seen);
}

START_TEST(auth_job_runs_with_tokens)
{
	authc a;
	cachew_options *o;
	cachew_element **v;
	size_t n;
	char err[512] = "";

	authc_start(&a, 1);
	o = client_opts(&a, ALICE);
	ck_assert_msg(cwt_run("range(500)", o, &v, &n, err, sizeof(err)) ==
		CACHEW_OK, "%s", err);
	assert_range(v, n, 500);
	cwt_free(v, n);
	cachew_options_destroy(o);
	authc_stop(&a);
}
END_TEST

/* No token, a wrong one, the wrong role: EPERM with the message, and a
 * client without a token fails naming it. */
START_TEST(auth_refuses_without_a_valid_token_or_role)
{
	authc a;
	cwi_pmsg req, rep;
	cachew_options *o;
	cachew_element **v;
	size_t n;
	char err[512] = "";
	tokens wrong;

	authc_start(&a, 0);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(call_as(a.dispatcher.url, -1, &req,
			     CWI_MSG_STATUS_REPLY, &rep, &a.t), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "not authenticated: "
						      "status carries no "
						      "token"));
	memcpy(&wrong, &a.t, sizeof(wrong));
	wrong.token[ALICE][0] ^= 1;
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(call_as(a.dispatcher.url, ALICE, &req,
			     CWI_MSG_STATUS_REPLY, &rep, &wrong), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "not authenticated: "
						      "the token"));
	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = strdup("tcp://127.0.0.1:9");
	req.u.worker_register.cores = 1;
	ck_assert_int_eq(call_as(a.dispatcher.url, ALICE, &req,
			     CWI_MSG_WORKER_REGISTER_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "role client may not "
						      "send worker_register"));
	dataset_request(&req, 8);
	ck_assert_int_eq(call_as(a.dispatcher.url, POOL, &req,
			     CWI_MSG_DATASET_REGISTER_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "role worker may not "
						      "send dataset_register"));
	o = cwt_opts_at(5, 0, a.dispatcher.url);
	ck_assert_int_eq(cwt_run("range(10)", o, &v, &n, err, sizeof(err)),
	    CACHEW_EPERM);
	ck_assert_msg(strstr(err, "not authenticated") != NULL, "%s", err);
	cachew_options_destroy(o);
	authc_stop(&a);
}
END_TEST

/* Alice reading range(total) + tail (" | map(...)") through the service,
 * one element in, and what root's status said of it. */
typedef struct victim {
	cachew_options *o;
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element **v;
	size_t n, total;
	uint64_t splits; /* the job's */
	char *worker;    /* its worker's address */
} victim;

static void
victim_start(authc *a, victim *vi, size_t total, const char *tail)
{
	cwi_pmsg req, rep;
	char *pipeline = cwt_fmt("range(%zu)%s", total, tail);

	memset(vi, 0, sizeof(*vi));
	vi->total = total;
	vi->o = client_opts(a, ALICE);
	vi->v = calloc(total + 1, sizeof(*vi->v));
	ck_assert_int_eq(cachew_dataset_parse(&vi->ds, pipeline), CACHEW_OK);
	free(pipeline);
	ck_assert_int_eq(cachew_iterator_create(&vi->it, vi->ds, vi->o),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(vi->it, &vi->v[vi->n++]),
	    CACHEW_OK);
	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(call_as(a->dispatcher.url, ROOT, &req,
			     CWI_MSG_STATUS_REPLY, &rep, &a->t), CACHEW_OK);
	ck_assert_uint_eq(rep.u.status_reply.njobs, 1);
	ck_assert_uint_eq(rep.u.status_reply.nworkers, 1);
	vi->splits = rep.u.status_reply.jobs[0].splits_total;
	vi->worker = strdup(rep.u.status_reply.workers[0].address);
	cwi_pmsg_free(&rep);
}

/* Reads the rest: every element of range(total), once. */
static void
victim_finish(victim *vi)
{
	cachew_element *e;
	cachew_err rv;

	while ((rv = cachew_iterator_next(vi->it, &e)) == CACHEW_OK) {
		ck_assert_uint_lt(vi->n, vi->total);
		vi->v[vi->n++] = e;
	}
	ck_assert_msg(rv == CACHEW_EOF, "%s", cachew_iterator_errmsg(vi->it));
	assert_range(vi->v, vi->n, vi->total);
	cwt_free(vi->v, vi->n);
	free(vi->worker);
	cachew_iterator_destroy(vi->it);
	cachew_dataset_release(vi->ds);
	cachew_options_destroy(vi->o);
}

/* Issue 14's attack: bob forges a split_ack of every split and a
 * job_release of alice's running job. Both are refused, and alice's
 * epoch completes with every element. */
START_TEST(auth_forged_ack_and_release_are_refused)
{
	authc a;
	victim vi;
	cwi_pmsg req, rep;

	authc_start(&a, 1);
	victim_start(&a, &vi, 4000, "");
	ck_assert_uint_gt(vi.splits, 0);
	cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
	req.u.split_ack.job_id = 1;
	req.u.split_ack.client_id = 1;
	req.u.split_ack.split_ids = calloc(vi.splits, sizeof(uint64_t));
	for (uint64_t s = 0; s < vi.splits; s++)
		req.u.split_ack.split_ids[s] = s;
	req.u.split_ack.nsplit_ids = vi.splits;
	ck_assert_int_eq(call_as(a.dispatcher.url, BOB, &req, CWI_MSG_OK, &rep,
			     &a.t), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "job 1 belongs to "
						      "another tenant"));
	cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
	req.u.job_release.job_id = 1;
	req.u.job_release.client_id = 1;
	ck_assert_int_eq(call_as(a.dispatcher.url, BOB, &req, CWI_MSG_OK, &rep,
			     &a.t), CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "job 1 belongs to "
						      "another tenant"));
	victim_finish(&vi);
	authc_stop(&a);
}
END_TEST

static cwi_msg_status_reply
status_as(const authc *a, int i, cwi_pmsg *rep)
{
	cwi_pmsg req;

	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_msg(call_as(a->dispatcher.url, i, &req, CWI_MSG_STATUS_REPLY,
			  rep, &a->t) == CACHEW_OK, "%s", cachew_errmsg());
	return rep->u.status_reply;
}

/* Issue 14's read: a get_elements (and a task_stats) naming alice's task
 * without its secret, sent straight to the worker, is refused; alice's
 * epoch still completes with every element. */
START_TEST(auth_worker_refuses_reads_without_the_task_secret)
{
	authc a;
	victim vi;
	cwi_pmsg req, rep;

	authc_start(&a, 1);
	/* 300 elements of 10 ms each on the worker's one thread: its task
	 * is still there (not done) when the reads below reach it. */
	victim_start(&a, &vi, 300, " | map(sleep_us, us=10000)");
	cwi_pmsg_init(&req, CWI_MSG_GET_ELEMENTS);
	req.u.get_elements.task_id = 1;
	req.u.get_elements.client_id = 1;
	req.u.get_elements.secret = 12345;
	ck_assert_int_eq(call_as(vi.worker, BOB, &req,
			     CWI_MSG_GET_ELEMENTS_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "lacks the task's "
						      "secret"));
	cwi_pmsg_init(&req, CWI_MSG_TASK_STATS);
	req.u.task_stats.task_id = 1;
	ck_assert_int_eq(call_as(vi.worker, -1, &req, CWI_MSG_TASK_STATS_REPLY,
			     &rep, &a.t), CACHEW_EPERM);
	victim_finish(&vi);
	authc_stop(&a);
}
END_TEST

/* A worker whose token the dispatcher does not know says so in its log
 * (without the token) and does not register. */
START_TEST(auth_worker_with_a_wrong_token_says_so)
{
	authc a;
	cwt_daemon w;
	char *path, *log = NULL;
	uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(5000);
	cwi_pmsg rep;

	authc_start(&a, 0);
	path = cwt_fmt("%s/wrong.token", a.dir);
	write_mode(path, "wrong-0123456789abcdef\n", 0600);
	cwt_daemon_start(&w, a.dir, "wrong", "--role=worker", "--dispatcher",
	    a.dispatcher.url, "--listen", "tcp://127.0.0.1:0", "--heartbeat-ms",
	    "50", "--token-file", path, (char *)NULL);
	while (cwt_now_ms() < deadline) {
		free(log);
		log = cwt_slurp(w.log);
		if (log != NULL && strstr(log, "event=register_refused") != NULL)
			break;
		cwt_nap_ms(20);
	}
	ck_assert_msg(log != NULL && strstr(log, "event=register_refused") !=
		NULL && strstr(log, "not authenticated") != NULL &&
		strstr(log, "wrong-0123") == NULL, "%s", log);
	ck_assert_uint_eq(status_as(&a, ROOT, &rep).nworkers, 0);
	cwi_pmsg_free(&rep);
	cwt_daemon_stop(&w, SIGTERM);
	free(log);
	free(path);
	authc_stop(&a);
}
END_TEST

/* pool2 (a worker token of another identity) registering with pool's
 * worker's address is refused: the worker keeps its id and tasks. */
START_TEST(auth_stranger_cannot_evict_a_worker)
{
	authc a;
	cwi_pmsg req, rep;
	cwi_msg_status_reply st;
	uint64_t id;
	char *address;
	uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(5000);

	authc_start(&a, 1);
	do {
		st = status_as(&a, ROOT, &rep);
		if (st.nworkers == 1)
			break;
		cwi_pmsg_free(&rep);
		cwt_nap_ms(20);
	} while (cwt_now_ms() < deadline);
	ck_assert_uint_eq(st.nworkers, 1);
	id = st.workers[0].worker_id;
	address = strdup(st.workers[0].address);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = address;
	req.u.worker_register.cores = 1;
	ck_assert_int_eq(call_as(a.dispatcher.url, POOL2, &req,
			     CWI_MSG_WORKER_REGISTER_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "of another identity"));
	st = status_as(&a, ROOT, &rep);
	ck_assert_uint_eq(st.nworkers, 1);
	ck_assert_uint_eq(st.workers[0].worker_id, id);
	cwi_pmsg_free(&rep);
	authc_stop(&a);
}
END_TEST

/* While alice's job runs, bob's status has no job and no worker address;
 * alice's has hers; root's every one. */
START_TEST(auth_status_of_a_tenant_shows_only_its_jobs)
{
	authc a;
	victim vi;
	cwi_pmsg rep;
	cwi_msg_status_reply st;

	authc_start(&a, 1);
	victim_start(&a, &vi, 1000, "");
	st = status_as(&a, BOB, &rep);
	ck_assert_uint_eq(st.njobs, 0);
	ck_assert_uint_eq(st.ntasks, 0);
	ck_assert_uint_eq(st.other_jobs, 1);
	ck_assert_uint_le(st.other_tasks, 1); /* 0 once its data is in */
	ck_assert_uint_eq(st.ndatasets, 0);
	ck_assert_uint_eq(st.nworkers, 1);
	ck_assert_str_eq(st.workers[0].address, ""); /* required: empty */
	cwi_pmsg_free(&rep);
	st = status_as(&a, ALICE, &rep);
	ck_assert_uint_eq(st.njobs, 1);
	ck_assert_uint_eq(st.other_jobs, 0);
	cwi_pmsg_free(&rep);
	st = status_as(&a, ROOT, &rep);
	ck_assert_uint_eq(st.njobs, 1);
	ck_assert_str_eq(st.workers[0].address, vi.worker);
	cwi_pmsg_free(&rep);
	victim_finish(&vi);
	authc_stop(&a);
}
END_TEST

/* Runs the shell command cmd (which writes its output to path), frees
 * both, and returns its exit code (-1: killed) with the output in *out. */
static int
shell_run(char *cmd, char *path, char **out)
{
	int st = system(cmd);

	*out = cwt_slurp(path);
	ck_assert_ptr_nonnull(*out);
	free(cmd);
	free(path);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `cachew status URL args` as identity i (-1: no token file): its exit
 * code and output (stdout and stderr) in *out. */
static int
status_cli(const authc *a, int i, char **out)
{
	char *path = cwt_fmt("%s/status.out", a->dir);
	char *cmd = cwt_fmt("%s/cachew status %s%s%s > %s 2>&1",
	    cwt_build_dir(), a->dispatcher.url, i >= 0 ? " --token-file " : "",
	    i >= 0 ? a->t.file[i] : "", path);

	return shell_run(cmd, path, out);
}

/* `cachew status --token-file`: an admin sees the worker's address, a
 * tenant a '-', no token an error naming the reason. */
START_TEST(auth_status_command_takes_a_token_file)
{
	authc a;
	victim vi;
	char *out;

	authc_start(&a, 1);
	victim_start(&a, &vi, 500, "");
	ck_assert_int_eq(status_cli(&a, ROOT, &out), 0);
	ck_assert_msg(strstr(out, vi.worker) != NULL, "%s", out);
	free(out);
	ck_assert_int_eq(status_cli(&a, BOB, &out), 0);
	ck_assert_msg(strstr(out, vi.worker) == NULL &&
		strstr(out, "jobs (0; 1 of other tenants, with ") != NULL,
	    "%s", out);
	free(out);
	ck_assert_int_eq(status_cli(&a, -1, &out), 1);
	ck_assert_msg(strstr(out, "not authenticated") != NULL, "%s", out);
	free(out);
	victim_finish(&vi);
	authc_stop(&a);
}
END_TEST

/* Whether any file under dir holds the bytes of s. */
static bool
tree_holds(const char *dir, const char *s)
{
	DIR *dh = opendir(dir);
	struct dirent *de;
	bool found = false;

	ck_assert_ptr_nonnull(dh);
	while (!found && (de = readdir(dh)) != NULL) {
		char *path, *text;
		struct stat st;
		if (strcmp(de->d_name, ".") == 0 ||
		    strcmp(de->d_name, "..") == 0)
			continue;
		path = cwt_fmt("%s/%s", dir, de->d_name);
		ck_assert_int_eq(stat(path, &st), 0);
		if (S_ISDIR(st.st_mode)) {
			found = tree_holds(path, s);
		} else if ((text = malloc((size_t)st.st_size + 1)) != NULL) {
			FILE *f = fopen(path, "rb");
			size_t len = f != NULL ? fread(text, 1,
						     (size_t)st.st_size, f)
					       : 0;
			if (f != NULL)
				fclose(f);
			found = memmem(text, len, s, strlen(s)) != NULL;
			free(text);
		}
		free(path);
	}
	closedir(dh);
	return found;
}

/* After a job, the work dir (journal, snapshot, events) holds no token,
 * but the journal does hold the identities. */
START_TEST(auth_journal_holds_no_token)
{
	authc a;
	cachew_options *o;
	cachew_element **v;
	size_t n;
	char err[512] = "", *journal;

	authc_start(&a, 1);
	o = client_opts(&a, ALICE);
	ck_assert_msg(cwt_run("range(300)", o, &v, &n, err, sizeof(err)) ==
		CACHEW_OK, "%s", err);
	cwt_free(v, n);
	cachew_options_destroy(o);
	cwt_daemon_stop(&a.worker, SIGKILL);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&a.dispatcher), 0);
	for (int i = 0; i < NIDS; i++)
		ck_assert_msg(!tree_holds(a.work, a.t.token[i]),
		    "the token of %s is in %s", id_name[i], a.work);
	journal = cwt_fmt("%s/journal", a.work);
	ck_assert(tree_holds(journal, "alice"));
	ck_assert(tree_holds(journal, "pool"));
	free(journal);
	authc_stop(&a);
}
END_TEST

/* Alice's named job survives a restart of the dispatcher (journal) and
 * stays hers: bob's join, heartbeat and release are refused, hers go. */
START_TEST(auth_restart_keeps_ownership)
{
	authc a;
	cwi_pmsg req, rep;

	authc_start(&a, 0);
	dataset_request(&req, 9);
	ck_assert_int_eq(call_as(a.dispatcher.url, ALICE, &req,
			     CWI_MSG_DATASET_REGISTER_REPLY, &rep, &a.t),
	    CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	req.u.job_get_or_create.job_name = strdup("train");
	ck_assert_int_eq(call_as(a.dispatcher.url, ALICE, &req,
			     CWI_MSG_JOB_GET_OR_CREATE_REPLY, &rep, &a.t),
	    CACHEW_OK);
	ck_assert_uint_eq(rep.u.job_get_or_create_reply.job_id, 1);
	cwi_pmsg_free(&rep);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&a.dispatcher), 0);
	dispatcher_start(&a);

	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	req.u.job_get_or_create.dataset_id = 1;
	req.u.job_get_or_create.job_name = strdup("train");
	ck_assert_int_eq(call_as(a.dispatcher.url, BOB, &req,
			     CWI_MSG_JOB_GET_OR_CREATE_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "job 1 ('train') "
						      "belongs to another "
						      "tenant"));
	cwi_pmsg_init(&req, CWI_MSG_CLIENT_HEARTBEAT);
	req.u.client_heartbeat.job_id = 1;
	req.u.client_heartbeat.client_id = 1;
	ck_assert_int_eq(call_as(a.dispatcher.url, BOB, &req,
			     CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep, &a.t),
	    CACHEW_EPERM);
	cwi_pmsg_init(&req, CWI_MSG_CLIENT_HEARTBEAT);
	req.u.client_heartbeat.job_id = 1;
	req.u.client_heartbeat.client_id = 1;
	ck_assert_msg(call_as(a.dispatcher.url, ALICE, &req,
			  CWI_MSG_CLIENT_HEARTBEAT_REPLY, &rep, &a.t) ==
		CACHEW_OK, "%s", cachew_errmsg());
	cwi_pmsg_free(&rep);
	cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
	req.u.job_release.job_id = 1;
	req.u.job_release.client_id = 1;
	ck_assert_int_eq(call_as(a.dispatcher.url, ALICE, &req, CWI_MSG_OK,
			     &rep, &a.t), CACHEW_OK);
	cwi_pmsg_free(&rep);
	authc_stop(&a);
}
END_TEST

/*
 * `cachewd --role=dispatcher` with `args`: its exit code (0 when it
 * started: then stopped with SIGTERM) and its log in *log. It has
 * cwt_bound_ms(20000) to listen or exit, like cwt_daemon_start's daemons:
 * a fixed 5 s of polls ran out on a loaded machine, and the shell then
 * waited for ever on a dispatcher that was running (the test's timeout).
 * timeout(1) ends it at the bound, which fails the test saying so.
 */
static int
dispatcher_try(const char *dir, const char *args, char **log)
{
	int bound_ms = cwt_bound_ms(20000), rc;
	char *path = cwt_fmt("%s/try.log", dir);
	char *cmd = cwt_fmt("exec timeout -s KILL %d %s/cachewd "
			    "--role=dispatcher %s --work-dir %s/w 2> %s & "
			    "pid=$!; for i in $(seq %d); do "
			    "grep -q event=listening %s && "
			    "{ kill $pid; wait $pid; exit 0; }; "
			    "kill -0 $pid 2>/dev/null || break; sleep 0.05; "
			    "done; wait $pid",
	    bound_ms / 1000, cwt_build_dir(), args, dir, path, bound_ms / 50,
	    path);

	rc = shell_run(cmd, path, log);
	ck_assert_msg(rc != 128 + SIGKILL, "cachewd %s neither listened nor "
	    "exited within %d ms: %s", args, bound_ms, *log);
	return rc;
}

/* The process provisioner gives the workers it starts the dispatcher's
 * --token-file: they register; without one it refuses to start. */
START_TEST(auth_process_provisioner_passes_the_worker_token)
{
	authc a;
	cwi_pmsg rep;
	char *args, *log;
	uint64_t deadline;
	uint64_t n = 0;

	memset(&a, 0, sizeof(a));
	a.dir = cwt_tmpdir();
	snprintf(a.work, sizeof(a.work), "%s/work", a.dir);
	tokens_make(&a.t, a.dir);
	args = cwt_fmt("--listen tcp://127.0.0.1:0 --provisioner process "
		       "--auth-tokens %s", a.t.table);
	ck_assert_int_eq(dispatcher_try(a.dir, args, &log), 1);
	ck_assert_msg(strstr(log, "give --token-file FILE") != NULL, "%s",
	    log);
	free(log);
	free(args);
	cwt_daemon_start(&a.dispatcher, a.dir, "dispatcher",
	    "--role=dispatcher", "--listen", "tcp://127.0.0.1:0", "--work-dir",
	    a.work, "--heartbeat-ms", "50", "--auth-tokens", a.t.table,
	    "--provisioner", "process", "--min-workers", "1", "--max-workers",
	    "1", "--worker-threads", "1", "--token-file", a.t.file[POOL],
	    (char *)NULL);
	deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(10000);
	while (n == 0 && cwt_now_ms() < deadline) {
		n = status_as(&a, ROOT, &rep).nworkers;
		cwi_pmsg_free(&rep);
		if (n == 0)
			cwt_nap_ms(50);
	}
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(cwt_daemon_stop(&a.dispatcher, SIGTERM), 0);
	cwt_rmtree(a.dir);
	free(a.dir);
}
END_TEST

/* A dispatcher on a non-loopback address without tokens refuses to
 * start, saying both ways out; --insecure or tokens let it. */
START_TEST(auth_protected_mode_needs_tokens_or_insecure)
{
	char *dir = cwt_tmpdir(), *log, *args;
	tokens t;

	tokens_make(&t, dir);
	ck_assert_int_eq(dispatcher_try(dir, "--listen tcp://0.0.0.0:0", &log),
	    1);
	ck_assert_msg(strstr(log, "refusing to listen on tcp://0.0.0.0:0 "
				  "without authentication") != NULL &&
		strstr(log, "--auth-tokens FILE") != NULL &&
		strstr(log, "--insecure") != NULL, "%s", log);
	free(log);
	ck_assert_int_eq(dispatcher_try(dir, "--listen tcp://0.0.0.0:0 "
					     "--insecure", &log), 0);
	free(log);
	args = cwt_fmt("--listen tcp://0.0.0.0:0 --auth-tokens %s", t.table);
	ck_assert_int_eq(dispatcher_try(dir, args, &log), 0);
	free(log);
	free(args);
	ck_assert_int_eq(chmod(t.table, 0644), 0);
	args = cwt_fmt("--listen tcp://127.0.0.1:0 --auth-tokens %s", t.table);
	ck_assert_int_eq(dispatcher_try(dir, args, &log), 1);
	ck_assert_msg(strstr(log, "mode 0644") != NULL &&
		strstr(log, t.token[ALICE]) == NULL, "%s", log);
	free(log);
	free(args);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_auth_suite(void)
{
	Suite *s = suite_create("auth");
	TCase *tc = tcase_create("tokens");

	tcase_add_test(tc, token_file_loads_and_checks_roles);
	tcase_add_test(tc, token_file_defects_are_refused_naming_the_line);
	tcase_add_test(tc, listen_addresses_local_or_not);
	tcase_add_test(tc, siphash_gives_the_papers_vector);
	tcase_add_test(tc, envelope_carries_token_and_identity);
	suite_add_tcase(s, tc);
	tc = tcase_create("ownership");
	tcase_add_test(tc, ownership_refuses_another_tenants_job);
	tcase_add_test(tc, ownership_refuses_another_identitys_worker);
	tcase_add_test(tc, ownership_redacts_a_tenants_status);
	tcase_add_test(tc, ownership_survives_a_snapshot);
	suite_add_tcase(s, tc);
	tc = tcase_create("cluster");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, auth_job_runs_with_tokens);
	tcase_add_test(tc, auth_refuses_without_a_valid_token_or_role);
	tcase_add_test(tc, auth_forged_ack_and_release_are_refused);
	tcase_add_test(tc, auth_stranger_cannot_evict_a_worker);
	tcase_add_test(tc, auth_worker_with_a_wrong_token_says_so);
	tcase_add_test(tc, auth_worker_refuses_reads_without_the_task_secret);
	tcase_add_test(tc, auth_status_of_a_tenant_shows_only_its_jobs);
	tcase_add_test(tc, auth_status_command_takes_a_token_file);
	tcase_add_test(tc, auth_journal_holds_no_token);
	tcase_add_test(tc, auth_restart_keeps_ownership);
	tcase_add_test(tc, auth_protected_mode_needs_tokens_or_insecure);
	tcase_add_test(tc, auth_process_provisioner_passes_the_worker_token);
	suite_add_tcase(s, tc);
	return s;
}
