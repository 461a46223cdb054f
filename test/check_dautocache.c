/*
 * check_dautocache.c - the dispatcher's autocaching across passes
 * (src/service/dispatcher/dispatcher_autocache.c): PROFILE, then PUT
 * written by leases as workers write it, committed, then GET split by
 * chunk; decisions that persist across a dispatcher restart; caches found
 * by fingerprint; the random-operator guard.
 *
 * Passes run here the way workers run them: each lease of the pass graph
 * through cwi_iterator_create_lease, with the counters of its stats as a
 * worker heartbeats them ("idx:op").
 */
#include "cwt.h"

#include "../src/exec/exec_split.h"
#include "../src/service/dispatcher/dispatcher_autocache.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pass_out {
	uint64_t n;      /* elements */
	uint64_t digest; /* sum of element hashes */
	cwi_ac_counter ops[32];
	char names[32][64];
	size_t nops;
} pass_out;

static void
add_stats(pass_out *o, cachew_iterator *it)
{
	cachew_op_stats rows[32];
	size_t n = 0;

	ck_assert_int_eq(cachew_iterator_stats(it, rows, 32, &n), CACHEW_OK);
	for (size_t i = 0; i < n && i < 32; i++) {
		if (o->nops <= i) {
			snprintf(o->names[i], sizeof(o->names[i]), "%d:%s",
			    rows[i].node, rows[i].name);
			o->ops[i].name = o->names[i];
			o->nops = i + 1;
		}
		o->ops[i].elements += rows[i].elements;
		o->ops[i].bytes += rows[i].bytes;
		o->ops[i].busy_ns += rows[i].busy_ns;
	}
}

/* Runs a pass's graph as `nleases` leases of consecutive units into *po
 * (whose counters point at its own names: filled in place). */
static void
run_pass(const cwi_dcache_pass *pass, size_t nleases, pass_out *po)
{
	cachew_dataset *g = NULL;
	cwi_split_plan *sp = NULL;

	memset(po, 0, sizeof(*po));
	ck_assert_int_eq(cachew_dataset_from_msgpack(&g, pass->graph,
			     pass->graph_len),
	    CACHEW_OK);
	ck_assert_msg(cwi_split_plan_create(&sp, g) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_uint_eq(sp->units, pass->units);
	ck_assert_uint_eq(sp->nclient, 0);
	for (size_t l = 0; l < nleases; l++) {
		cwi_unit_range r = {pass->units * l / nleases,
		    pass->units * (l + 1) / nleases};
		cachew_iterator *it = NULL;
		cachew_element *e;
		cachew_err rv;

		if (r.begin == r.end)
			continue;
		ck_assert_msg(cwi_iterator_create_lease(&it, sp->worker, NULL,
				  sp->source, &r, 1, 7) == CACHEW_OK,
		    "%s", cachew_errmsg());
		while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			po->n++;
			po->digest += cachew_element_hash(e);
			cachew_element_release(e);
		}
		ck_assert_int_eq(rv, CACHEW_EOF);
		add_stats(po, it);
		cachew_iterator_destroy(it);
	}
	cwi_split_plan_destroy(sp);
	cachew_dataset_release(g);
}

typedef struct ds_graph {
	uint8_t *buf;
	size_t len;
	uint64_t units;
} ds_graph;

static ds_graph
graph_of(const char *pipeline)
{
	cachew_dataset *ds = NULL;
	cwi_split_plan *sp = NULL;
	ds_graph g;
	void *buf = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &g.len), CACHEW_OK);
	ck_assert_int_eq(cwi_split_plan_create(&sp, ds), CACHEW_OK);
	g.units = sp->units;
	g.buf = buf;
	cwi_split_plan_destroy(sp);
	cachew_dataset_release(ds);
	return g;
}

/* Writes a state file holding the storage line `storage` and one dataset
 * line for `pipeline`'s fingerprint with the fields `fields`: a decision
 * as a dispatcher would have persisted it. */
static void
write_state(const char *state, const char *storage, const char *pipeline,
    const char *fields)
{
	cachew_dataset *ds = NULL;
	cachew_fingerprint fp;
	char hex[33];
	FILE *f;

	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	cachew_dataset_fingerprint(ds, &fp);
	cachew_fingerprint_hex(&fp, hex);
	cachew_dataset_release(ds);
	f = fopen(state, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "storage %s\ndataset fp=%s %s\n", storage, hex, fields);
	ck_assert_int_eq(fclose(f), 0);
}

static cwi_dcache *
dcache(const char *root, const char *policy, const char *state)
{
	cwi_dcache_config cfg = {.root = root, .policy = policy,
	    .state_path = state, .default_epochs = 10,
	    .probe_bytes = 4u << 20};
	cwi_dcache *dc = NULL;

	ck_assert_msg(cwi_dcache_create(&dc, &cfg) == CACHEW_OK, "%s",
	    cachew_errmsg());
	return dc;
}

/* One pass: start, run as leases, end (complete). */
static pass_out
one_pass(cwi_dcache *dc, const ds_graph *g, cwi_ac_mode want, char *event,
    size_t size)
{
	cwi_dcache_pass pass;
	pass_out o;

	ck_assert_msg(cwi_dcache_pass_start(dc, g->buf, g->len, g->units, 0,
			  &pass) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_msg(pass.mode == want, "mode %s, wanted %s: %s",
	    cwi_ac_mode_name(pass.mode), cwi_ac_mode_name(want), pass.event);
	run_pass(&pass, 3, &o);
	cwi_dcache_pass_end(dc, g->buf, g->len, &pass, true, o.ops, o.nops, 2,
	    event, size);
	cwi_dcache_pass_free(&pass);
	/* Returned by value: the copy's counters must not point at ours. */
	for (size_t i = 0; i < o.nops; i++)
		o.ops[i].name = NULL;
	return o;
}

/* Elements cost 2 ms of (sleeping) compute each and are 8 bytes: reading
 * them from a cache is far cheaper, so the default policy caches. */
#define SLOW "range(300) | map(sleep_us, us=2000) | map(add, value=1)"

START_TEST(profile_put_get_across_passes)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	char *state = cwi_asprintf("%s/autocache.state", dir);
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", state);
	char event[512];
	pass_out p1, p2, p3;

	p1 = one_pass(dc, &g, CWI_AC_PROFILE, event, sizeof(event));
	ck_assert_msg(strstr(event, "decided full"), "%s", event);
	p2 = one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	ck_assert_msg(strstr(event, "committed the cache (300 elements)"),
	    "%s", event);
	p3 = one_pass(dc, &g, CWI_AC_GET, event, sizeof(event));
	/* Every pass yields the same multiset. */
	ck_assert_uint_eq(p1.n, 300);
	ck_assert_uint_eq(p2.n, 300);
	ck_assert_uint_eq(p3.n, 300);
	ck_assert_uint_eq(p2.digest, p1.digest);
	ck_assert_uint_eq(p3.digest, p1.digest);
	cwi_dcache_destroy(dc);

	/* A restarted dispatcher reads the cache at once. */
	dc = dcache(root, "default", state);
	(void)one_pass(dc, &g, CWI_AC_GET, event, sizeof(event));
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(state);
	free(dir);
}
END_TEST

START_TEST(mode_change_scales_the_worker_count)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", NULL);
	char event[512];
	cwi_dcache_pass pass;

	(void)one_pass(dc, &g, CWI_AC_PROFILE, event, sizeof(event));
	(void)one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	/* PUT computes like PROFILE did: no change. GET reads the cache,
	 * far faster than the 2 ms per element computing costs. */
	ck_assert_int_eq(cwi_dcache_pass_start(dc, g.buf, g.len, g.units, 0,
			     &pass),
	    CACHEW_OK);
	ck_assert_int_eq(pass.mode, CWI_AC_GET);
	ck_assert_msg(pass.worker_scale > 0 && pass.worker_scale < 0.5,
	    "worker_scale %g", pass.worker_scale);
	cwi_dcache_pass_end(dc, g.buf, g.len, &pass, true, NULL, 0, 1, event,
	    sizeof(event));
	cwi_dcache_pass_free(&pass);
	/* GET again: the same mode, nothing to scale. */
	ck_assert_int_eq(cwi_dcache_pass_start(dc, g.buf, g.len, g.units, 0,
			     &pass),
	    CACHEW_OK);
	ck_assert(pass.worker_scale == 0);
	cwi_dcache_pass_free(&pass);
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(storage_slower_than_assumed_turns_back_to_compute)
{
	const char *pipeline = "range(3000) | map(add, value=1)";
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	char *state = cwi_asprintf("%s/autocache.state", dir);
	ds_graph g = graph_of(pipeline);
	char event[768];
	cwi_dcache *dc;

	/* A decision taken on storage that claimed to read 1e12 bytes/s,
	 * for a pipeline that computes a row in 1 ns. */
	write_state(state,
	    "read_mb_per_s=1e12 read_rows_per_s=1e15 write_mb_per_s=1e12",
	    pipeline,
	    "decided=1 choice=full candidate=0 failed=0 epochs=10 n=1 "
	    "p0=3000,8,1,0 reason=on paper");
	dc = dcache(root, "default", state);
	(void)one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	ck_assert_msg(strstr(event, "committed"), "%s", event);
	/* Reading shows the truth: slower than computing. */
	(void)one_pass(dc, &g, CWI_AC_GET, event, sizeof(event));
	ck_assert_msg(strstr(event, "decided again:"), "%s", event);
	(void)one_pass(dc, &g, CWI_AC_COMPUTE, event, sizeof(event));
	cwi_dcache_destroy(dc);
	/* ... and it stays so after a restart. */
	dc = dcache(root, "default", state);
	(void)one_pass(dc, &g, CWI_AC_COMPUTE, event, sizeof(event));
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(state);
	free(dir);
}
END_TEST

START_TEST(compute_that_got_expensive_is_cached_after_all)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	char *state = cwi_asprintf("%s/autocache.state", dir);
	ds_graph g = graph_of(SLOW);
	char event[768];
	cwi_dcache *dc;

	/* Decided to compute when a row took 1 ns; now it takes 2 ms. */
	write_state(state,
	    "read_mb_per_s=100 read_rows_per_s=1000000 write_mb_per_s=100",
	    SLOW,
	    "decided=1 choice=compute candidate=-1 failed=0 epochs=10 n=1 "
	    "p0=300,8,1,0 reason=cheap then");
	dc = dcache(root, "default", state);
	(void)one_pass(dc, &g, CWI_AC_COMPUTE, event, sizeof(event));
	ck_assert_msg(strstr(event, "decided again full"), "%s", event);
	(void)one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	(void)one_pass(dc, &g, CWI_AC_GET, event, sizeof(event));
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(state);
	free(dir);
}
END_TEST

START_TEST(decision_persists_without_the_cache)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	char *state = cwi_asprintf("%s/autocache.state", dir);
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", state);
	char event[512];
	cwi_dcache_pass pass;

	(void)one_pass(dc, &g, CWI_AC_PROFILE, event, sizeof(event));
	cwi_dcache_destroy(dc);
	/* The profile and decision came back from the state file: no second
	 * PROFILE pass, straight to writing. */
	dc = dcache(root, "default", state);
	ck_assert_int_eq(cwi_dcache_pass_start(dc, g.buf, g.len, g.units, 0,
			     &pass),
	    CACHEW_OK);
	ck_assert_int_eq(pass.mode, CWI_AC_PUT);
	ck_assert_uint_ne(pass.write_id, 0);
	/* A pass cut short writes nothing and the next one writes again. */
	cwi_dcache_pass_end(dc, g.buf, g.len, &pass, false, NULL, 0, 1, event,
	    sizeof(event));
	ck_assert_msg(strstr(event, "ended early"), "%s", event);
	cwi_dcache_pass_free(&pass);
	(void)one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(state);
	free(dir);
}
END_TEST

START_TEST(marker_cache_is_read_by_another_pipeline_through_it)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	ds_graph a = graph_of("range(200) | map(sleep_us, us=1000) | "
			      "autocache() | map(add, value=1)");
	ds_graph b = graph_of("range(200) | map(sleep_us, us=1000) | "
			      "autocache() | map(add, value=5) | map(add, value=1)");
	cwi_dcache *dc = dcache(root, "source", NULL);
	char event[512];
	pass_out want, got;

	/* The fixed "source" policy writes the marker's cache at once. */
	(void)one_pass(dc, &a, CWI_AC_PUT, event, sizeof(event));
	ck_assert_msg(strstr(event, "committed"), "%s", event);
	/* Another pipeline with the same prefix reads it at once. */
	want = one_pass(dc, &b, CWI_AC_GET, event, sizeof(event));
	ck_assert_uint_eq(want.n, 200);
	{
		cwi_dcache *plain = dcache(root, "compute", NULL);
		got = one_pass(plain, &b, CWI_AC_COMPUTE, event, sizeof(event));
		cwi_dcache_destroy(plain);
	}
	ck_assert_uint_eq(got.n, want.n);
	ck_assert_uint_eq(got.digest, want.digest);
	cwi_dcache_destroy(dc);
	cachew_free(a.buf);
	cachew_free(b.buf);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(nothing_after_a_random_operator_is_cached)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	ds_graph g = graph_of("range(100) | map(sleep_us, us=500) | "
			      "shuffle(buffer=10)");
	cwi_dcache *dc = dcache(root, "full", NULL);
	char event[512];
	cwi_dcache_pass pass;

	ck_assert_int_eq(cwi_dcache_pass_start(dc, g.buf, g.len, g.units, 0,
			     &pass),
	    CACHEW_OK);
	ck_assert_int_eq(pass.mode, CWI_AC_COMPUTE);
	ck_assert_msg(strstr(pass.event, "no eligible point"), "%s",
	    pass.event);
	cwi_dcache_pass_free(&pass);
	cwi_dcache_destroy(dc);
	(void)event;
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(damaged_state_lines_are_skipped)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	char *state = cwi_asprintf("%s/autocache.state", dir);
	FILE *f = fopen(state, "w");
	cwi_dcache *dc;
	cwi_strbuf sb;

	fputs("storage read_mb_per_s=oops\n"
	      "dataset fp=zz decided=1\n"
	      "dataset fp=0123456789abcdef0123456789abcdef decided=1 "
	      "choice=full candidate=0 failed=0 epochs=5 n=1 "
	      "p0=10,8,1000,0 reason=kept\n"
	      "garbage\n",
	    f);
	fclose(f);
	dc = dcache(root, "default", state);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dcache_describe(dc, &sb), CACHEW_OK);
	ck_assert_msg(sb.len > 0 && strstr(sb.data,
					"0123456789abcdef0123456789abcdef "
					"decided full kept"),
	    "%.*s", (int)sb.len, sb.data);
	cwi_strbuf_free(&sb);
	cwi_dcache_destroy(dc);
	cwt_rmtree(dir);
	free(root);
	free(state);
	free(dir);
}
END_TEST


/* ---- end to end: a dispatcher with a cache root and real workers ------- */

static uint64_t
service_digest(const char *pipeline, const char *url, uint64_t *n)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_element **v;
	size_t nv;
	char err[512];
	uint64_t d = 0;

	if (url != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "service", url),
		    CACHEW_OK);
	ck_assert_msg(cwt_run(pipeline, o, &v, &nv, err, sizeof(err)) ==
			  CACHEW_OK,
	    "%s: %s", pipeline, err);
	for (size_t i = 0; i < nv; i++)
		d += cachew_element_hash(v[i]);
	*n = nv;
	cwt_free(v, nv);
	cachew_options_destroy(o);
	return d;
}

/* The cache modes of the jobs the events log shows created, in order,
 * space-separated. */
static void
job_modes(const char *events, char *out, size_t size)
{
	char *s = cwt_slurp(events), *p;

	out[0] = '\0';
	ck_assert_ptr_nonnull(s);
	for (p = s; (p = strstr(p, "\"event\":\"job_created\"")) != NULL; p++) {
		char *m = strstr(p, "\"cache_mode\":\""), *nl = strchr(p, '\n');
		if (m != NULL && (nl == NULL || m < nl)) {
			m += strlen("\"cache_mode\":\"");
			snprintf(out + strlen(out), size - strlen(out), "%s%.*s",
			    out[0] != '\0' ? " " : "", (int)strcspn(m, "\""), m);
		}
	}
	free(s);
}

static void
dispatcher_with_cache(cwt_daemon *d, const char *dir, const char *name)
{
	char work[600], cache[600];

	snprintf(work, sizeof(work), "%s/work", dir);
	snprintf(cache, sizeof(cache), "%s/cache", dir);
	cwt_daemon_start(d, dir, name, "--role=dispatcher", "--listen",
	    "tcp://127.0.0.1:0", "--work-dir", work, "--cache-root", cache,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--journal-verify", "1", (char *)NULL);
}

START_TEST(service_profiles_writes_then_reads_across_epochs)
{
	const char *pipeline =
	    "range(600) | map(sleep_us, us=500) | map(add, value=1)";
	char *dir = cwt_tmpdir(), events[600], modes[256];
	cwt_daemon disp, w[2];
	uint64_t n, local, remote;

	local = service_digest(pipeline, NULL, &n);
	ck_assert_uint_eq(n, 600);
	dispatcher_with_cache(&disp, dir, "dispatcher");
	for (int i = 0; i < 2; i++)
		cwt_daemon_start(&w[i], dir, i == 0 ? "worker0" : "worker1",
		    "--role=worker", "--dispatcher", disp.url, "--listen",
		    "tcp://127.0.0.1:0", "--heartbeat-ms", "50", "--threads",
		    "1", (char *)NULL);
	/* Each run is one epoch: a new job, the next pass. */
	for (int epoch = 0; epoch < 4; epoch++) {
		remote = service_digest(pipeline, disp.url, &n);
		ck_assert_msg(n == 600 && remote == local,
		    "epoch %d: %" PRIu64 " elements, digest %016" PRIx64
		    " (in-process %016" PRIx64 ")",
		    epoch, n, remote, local);
	}
	snprintf(events, sizeof(events), "%s/work/events.jsonl", dir);
	job_modes(events, modes, sizeof(modes));
	ck_assert_str_eq(modes, "profile put get get");
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);

	/* A restarted dispatcher knows the cache: the first job reads it. */
	dispatcher_with_cache(&disp, dir, "dispatcher2");
	for (int i = 0; i < 2; i++)
		cwt_daemon_stop(&w[i], SIGKILL);
	cwt_daemon_start(&w[0], dir, "worker2", "--role=worker",
	    "--dispatcher", disp.url, "--listen", "tcp://127.0.0.1:0",
	    "--heartbeat-ms", "50", "--threads", "1", (char *)NULL);
	remote = service_digest(pipeline, disp.url, &n);
	ck_assert_uint_eq(n, 600);
	ck_assert_uint_eq(remote, local);
	job_modes(events, modes, sizeof(modes));
	ck_assert_str_eq(modes, "profile put get get get");
	cwt_daemon_stop(&w[0], SIGKILL);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_dautocache_suite(void)
{
	Suite *s = suite_create("dautocache");
	TCase *tc = tcase_create("passes");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, profile_put_get_across_passes);
	tcase_add_test(tc, decision_persists_without_the_cache);
	tcase_add_test(tc, compute_that_got_expensive_is_cached_after_all);
	tcase_add_test(tc, storage_slower_than_assumed_turns_back_to_compute);
	tcase_add_test(tc, mode_change_scales_the_worker_count);
	tcase_add_test(tc, marker_cache_is_read_by_another_pipeline_through_it);
	tcase_add_test(tc, nothing_after_a_random_operator_is_cached);
	tcase_add_test(tc, damaged_state_lines_are_skipped);
	tcase_add_test(tc, service_profiles_writes_then_reads_across_epochs);
	suite_add_tcase(s, tc);
	return s;
}
