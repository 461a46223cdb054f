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

#include "../src/core/value_msgpack.h"
#include "../src/exec/exec_split.h"
#include "../src/service/dispatcher/dispatcher_autocache.h"
#include "../src/service/dispatcher/dispatcher_state.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* A planner; with `import`, given the state of that file (an earlier
 * version's state file). */
static cwi_dcache *
dcache(const char *root, const char *policy, const char *import)
{
	cwi_dcache_config cfg = {.root = root, .policy = policy,
	    .default_epochs = 10, .probe_bytes = 4u << 20};
	cwi_dcache *dc = NULL;
	bool found = false;

	ck_assert_msg(cwi_dcache_create(&dc, &cfg) == CACHEW_OK, "%s",
	    cachew_errmsg());
	if (import != NULL) {
		ck_assert_msg(cwi_dcache_import(dc, import, &found) ==
			CACHEW_OK, "%s", cachew_errmsg());
		ck_assert(found);
	}
	return dc;
}

/* A restart: the planner's state as the dispatcher journals it, given
 * to a new planner. */
static cwi_dcache *
restart(cwi_dcache *dc, const char *root, const char *policy)
{
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dcache_save(dc, &sb), CACHEW_OK);
	cwi_dcache_destroy(dc);
	dc = dcache(root, policy, NULL);
	ck_assert_msg(cwi_dcache_load(dc, sb.data, sb.len) == CACHEW_OK, "%s",
	    cachew_errmsg());
	cwi_strbuf_free(&sb);
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
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", NULL);
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

	/* A restarted dispatcher reads the cache at once, even with no
	 * state: the cache is found by fingerprint. */
	dc = dcache(root, "default", NULL);
	(void)one_pass(dc, &g, CWI_AC_GET, event, sizeof(event));
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
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
	/* The mode of the last pass is part of the state: a restart scales
	 * as well. */
	dc = restart(dc, root, "default");
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
	/* ... and it stays so after a restart. */
	dc = restart(dc, root, "default");
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
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", NULL);
	char event[512];
	cwi_dcache_pass pass;

	(void)one_pass(dc, &g, CWI_AC_PROFILE, event, sizeof(event));
	/* The profile and decision came back from the saved state: no
	 * second PROFILE pass, straight to writing. */
	dc = restart(dc, root, "default");
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


/* ---- the planner's state as text, in the dispatcher's journal --------- */

#define LINE_A "dataset fp=0123456789abcdef0123456789abcdef decided=1 " \
	       "choice=full candidate=0 failed=0 epochs=5 n=1 " \
	       "p0=10,8,1000,0 reason=kept"
#define LINE_B "dataset fp=fedcba9876543210fedcba9876543210 decided=0 " \
	       "choice=compute candidate=-1 failed=0 epochs=10 n=0 reason="
#define STORAGE "storage read_mb_per_s=100 read_rows_per_s=1000000 " \
		"write_mb_per_s=50"

/* Saved, loaded into a new planner and saved again: the same text, with
 * everything the planner remembers (storage, profile, decision, the
 * last pass's mode). */
START_TEST(state_text_loads_back_to_the_same_text)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	ds_graph g = graph_of(SLOW);
	cwi_dcache *dc = dcache(root, "default", NULL);
	char event[512];
	cwi_strbuf a, b;

	(void)one_pass(dc, &g, CWI_AC_PROFILE, event, sizeof(event));
	(void)one_pass(dc, &g, CWI_AC_PUT, event, sizeof(event));
	cwi_strbuf_init(&a);
	cwi_strbuf_init(&b);
	ck_assert_int_eq(cwi_dcache_save(dc, &a), CACHEW_OK);
	dc = restart(dc, root, "default");
	ck_assert_int_eq(cwi_dcache_save(dc, &b), CACHEW_OK);
	ck_assert_msg(a.len == b.len && memcmp(a.data, b.data, a.len) == 0,
	    "saved:\n%.*s\nloaded and saved:\n%.*s", (int)a.len, a.data,
	    (int)b.len, b.data);
	ck_assert_msg(strncmp(a.data, "storage read_mb_per_s=", 22) == 0 &&
		strstr(a.data, "\ndataset fp=") != NULL &&
		strstr(a.data, " decided=1 choice=full ") != NULL &&
		strstr(a.data, " put_failures=0 last=put reason=") != NULL,
	    "%.*s", (int)a.len, a.data);
	cwi_strbuf_free(&a);
	cwi_strbuf_free(&b);
	cwi_dcache_destroy(dc);
	cachew_free(g.buf);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* A state text with a line that is not one is refused whole, naming the
 * line; so are keys in another form. */
START_TEST(state_text_with_a_bad_line_is_refused_whole)
{
	char *dir = cwt_tmpdir();
	char *root = cwi_asprintf("%s/cache", dir);
	cwi_dcache *dc = dcache(root, "default", NULL);
	static const char *bad[] = {
	    LINE_A "\ngarbage\n",
	    LINE_A "\ndataset fp=0123456789ABCDEF0123456789abcdef decided=1 "
	    "choice=full candidate=0 failed=0 epochs=5 n=0 reason=\n",
	    LINE_A "\ndataset fp=fedcba9876543210fedcba9876543210 decided=1 "
	    "choice=maybe candidate=0 failed=0 epochs=5 n=0 reason=\n",
	    LINE_A "\nstorage read_mb_per_s=fast read_rows_per_s=1 "
	    "write_mb_per_s=1\n",
	};
	size_t key_len;
	cwi_strbuf sb;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(cwi_dcache_load(dc, bad[i], strlen(bad[i])),
		    CACHEW_ECORRUPT);
		ck_assert_msg(strstr(cachew_errmsg(), "line 2: ") != NULL,
		    "%s", cachew_errmsg());
	}
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dcache_save(dc, &sb), CACHEW_OK);
	ck_assert_uint_eq(sb.len, 0); /* not even line 1 */
	cwi_strbuf_free(&sb);
	ck_assert_int_eq(cwi_dcache_line_check(LINE_A, strlen(LINE_A),
			     &key_len), CACHEW_OK);
	ck_assert_uint_eq(key_len, strlen("dataset fp=") + 32);
	ck_assert_int_eq(cwi_dcache_line_check(STORAGE, strlen(STORAGE),
			     &key_len), CACHEW_OK);
	ck_assert_uint_eq(key_len, strlen("storage"));
	cwi_dcache_destroy(dc);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

static cwi_dispatcher *
bare_dispatcher(void)
{
	cwi_dispatcher_config cfg;
	cwi_dispatcher *d = NULL;

	cwi_dispatcher_config_default(&cfg);
	ck_assert_int_eq(cwi_dispatcher_create(&d, &cfg), CACHEW_OK);
	return d;
}

/* Applies the record of the planner's state `text` to d: true when
 * there was one (a change). */
static bool
planner_step(cwi_dispatcher *d, const char *text, cwi_strbuf *rec)
{
	bool changed = true;

	ck_assert_msg(cwi_jrec_planner(rec, 7, d, text, strlen(text),
			  &changed) == CACHEW_OK, "%s", cachew_errmsg());
	if (changed)
		ck_assert_msg(cwi_dispatcher_apply_record(d,
				  (const uint8_t *)rec->data, rec->len) ==
			CACHEW_OK, "%s", cachew_errmsg());
	return changed;
}

static void
assert_planner_text(const cwi_dispatcher *d, const char *want)
{
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_dispatcher_planner_text(d, &sb), CACHEW_OK);
	ck_assert_msg(sb.len == strlen(want) &&
		memcmp(sb.data, want, sb.len) == 0,
	    "holds:\n%.*s\nwanted:\n%s", (int)sb.len, sb.data, want);
	cwi_strbuf_free(&sb);
}

/* A record holds only the lines that changed; applied, the state holds
 * the planner's text as it is, in its order (the storage line first even
 * when it came later). */
START_TEST(planner_records_hold_the_lines_that_changed)
{
	cwi_dispatcher *d = bare_dispatcher();
	cwi_strbuf rec;
	const char *t1 = LINE_A "\n";
	const char *t2 = STORAGE "\n" LINE_A "\n" LINE_B "\n";
	const char *t3 = STORAGE "\n" LINE_A " again\n" LINE_B "\n";

	cwi_strbuf_init(&rec);
	ck_assert(!planner_step(d, "", &rec));
	ck_assert(planner_step(d, t1, &rec));
	assert_planner_text(d, t1);
	ck_assert(!planner_step(d, t1, &rec));
	ck_assert(planner_step(d, t2, &rec));
	ck_assert_ptr_null(memmem(rec.data, rec.len, "kept", 4));
	assert_planner_text(d, t2);
	ck_assert(planner_step(d, t3, &rec));
	ck_assert_ptr_nonnull(memmem(rec.data, rec.len, "kept again", 10));
	ck_assert_ptr_null(memmem(rec.data, rec.len, "storage", 7));
	ck_assert_ptr_null(memmem(rec.data, rec.len, "fedcba", 6));
	assert_planner_text(d, t3);
	cwi_strbuf_free(&rec);
	cwi_dispatcher_destroy(d);
}
END_TEST

/* A planner record built by hand: [6, now, lines]. */
static void
planner_record_of(cwi_strbuf *sb, const char *lines, size_t len)
{
	sb->len = 0;
	cwi_msgpack_put_array(sb, 3);
	cwi_msgpack_put_uint(sb, 6);
	cwi_msgpack_put_uint(sb, 9);
	cwi_msgpack_put_str(sb, lines, len);
}

/* A record whose lines are not the planner's is refused whole, saying
 * what is wrong (a start then stops, naming the record); the state keeps
 * what it had. */
START_TEST(planner_record_of_bad_lines_is_refused_whole)
{
	cwi_dispatcher *d = bare_dispatcher();
	char *big = malloc(CWI_DCACHE_LINE_MAX + 2);
	cwi_strbuf rec;
	static const struct {
		const char *lines, *says;
	} bad[] = {
	    {"", "planner: no line"},
	    {LINE_B, "planner: the last line has no newline"},
	    {LINE_B "\ngarbage\n", "planner: line 2: not a planner line"},
	    {LINE_B "\n\n", "planner: line 2: not a planner line"},
	};

	cwi_strbuf_init(&rec);
	planner_step(d, LINE_A "\n", &rec);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		planner_record_of(&rec, bad[i].lines, strlen(bad[i].lines));
		ck_assert_int_eq(cwi_dispatcher_apply_record(d,
				     (const uint8_t *)rec.data, rec.len),
		    CACHEW_ECORRUPT);
		ck_assert_msg(strstr(cachew_errmsg(), "dispatcher record: ") &&
			strstr(cachew_errmsg(), bad[i].says),
		    "%s", cachew_errmsg());
	}
	/* A line beyond the bound, and a NUL inside one. */
	ck_assert_ptr_nonnull(big);
	/* LINE_B with a reason that makes it 4097 bytes, its '\n' the
	 * 4098th. */
	memcpy(big, LINE_B, strlen(LINE_B));
	memset(big + strlen(LINE_B), 'x',
	    CWI_DCACHE_LINE_MAX + 1 - strlen(LINE_B));
	big[CWI_DCACHE_LINE_MAX + 1] = '\n';
	planner_record_of(&rec, big, CWI_DCACHE_LINE_MAX + 2);
	ck_assert_int_eq(cwi_dispatcher_apply_record(d,
			     (const uint8_t *)rec.data, rec.len),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "line 1: a line of 4098 bytes"),
	    "%s", cachew_errmsg());
	planner_record_of(&rec, LINE_B "\0\n", strlen(LINE_B) + 2);
	ck_assert_int_eq(cwi_dispatcher_apply_record(d,
			     (const uint8_t *)rec.data, rec.len),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "NUL"), "%s", cachew_errmsg());
	assert_planner_text(d, LINE_A "\n");
	free(big);
	cwi_strbuf_free(&rec);
	cwi_dispatcher_destroy(d);
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

/* snapshot_records: how often its journal is folded into a snapshot
 * (NULL: the default). */
static void
dispatcher_with_cache(cwt_daemon *d, const char *dir, const char *name,
    const char *snapshot_records)
{
	char work[600], cache[600];

	snprintf(work, sizeof(work), "%s/work", dir);
	snprintf(cache, sizeof(cache), "%s/cache", dir);
	cwt_daemon_start(d, dir, name, "--role=dispatcher", "--listen",
	    "tcp://127.0.0.1:0", "--work-dir", work, "--cache-root", cache,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--journal-verify", "1", "--snapshot-records",
	    snapshot_records != NULL ? snapshot_records : "100000",
	    (char *)NULL);
}

/* A worker that may write the dispatcher's cache root. */
static void
worker_for(cwt_daemon *w, const char *dir, const char *name, const char *url)
{
	char cache[600];

	snprintf(cache, sizeof(cache), "%s/cache", dir);
	cwt_daemon_start(w, dir, name, "--role=worker", "--dispatcher", url,
	    "--listen", "tcp://127.0.0.1:0", "--heartbeat-ms", "50",
	    "--threads", "1", "--cache-root", cache, (char *)NULL);
}

/* Epochs of this compute 0.3 s of sleeping: the default policy caches
 * its end. */
#define SERVICE_PIPELINE \
	"range(600) | map(sleep_us, us=500) | map(add, value=1)"

static void status_durable(const char *dir, const char *url);
static int count_in(const char *path, const char *needle);

START_TEST(service_profiles_writes_then_reads_across_epochs)
{
	const char *pipeline = SERVICE_PIPELINE;
	char *dir = cwt_tmpdir(), events[600], modes[256], status[600];
	cwt_daemon disp, w[2];
	uint64_t n, local, remote;

	local = service_digest(pipeline, NULL, &n);
	ck_assert_uint_eq(n, 600);
	dispatcher_with_cache(&disp, dir, "dispatcher", NULL);
	worker_for(&w[0], dir, "worker0", disp.url);
	worker_for(&w[1], dir, "worker1", disp.url);
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
	/* The two passes that read the cache read its 600 i64 elements
	 * (4800 bytes) each, which status (and /metrics) call cache hits;
	 * the passes that computed hit nothing. */
	status_durable(dir, disp.url);
	snprintf(status, sizeof(status), "%s/status.json", dir);
	ck_assert_int_eq(count_in(status, "\"cache_hit_bytes\":4800}"), 2);
	ck_assert_int_eq(count_in(status, "\"cache_hit_bytes\":0}"), 2);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);

	/* A restarted dispatcher knows the cache: the first job reads it. */
	dispatcher_with_cache(&disp, dir, "dispatcher2", NULL);
	for (int i = 0; i < 2; i++)
		cwt_daemon_stop(&w[i], SIGKILL);
	worker_for(&w[0], dir, "worker2", disp.url);
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

/* Waits (bounded) until the events log holds `needle`. */
static void
wait_for_event(const char *events, const char *needle)
{
	uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(10000);

	for (;;) {
		char *s = cwt_slurp(events);
		bool found = s != NULL && strstr(s, needle) != NULL;

		free(s);
		if (found)
			return;
		ck_assert_msg(cwt_now_ms() < deadline, "no \"%s\" in %s",
		    needle, events);
		cwt_nap_ms(20);
	}
}

/* A status request: its reply waits for every record appended before it
 * to be on disk, so what the events log showed survives a kill. */
static void
status_durable(const char *dir, const char *url)
{
	char cmd[1400];

	snprintf(cmd, sizeof(cmd), "%s/cachew status %s --json > %s/status.json",
	    cwt_build_dir(), url, dir);
	ck_assert_int_eq(system(cmd), 0);
}

static bool
file_exists(const char *dir, const char *name)
{
	char path[800];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

static void
run_epochs(const char *url, int epochs, uint64_t want)
{
	uint64_t n;

	for (int epoch = 0; epoch < epochs; epoch++) {
		ck_assert_uint_eq(service_digest(SERVICE_PIPELINE, url, &n),
		    want);
		ck_assert_uint_eq(n, 600);
	}
}

/* Occurrences of needle in the file at path. */
static int
count_in(const char *path, const char *needle)
{
	char *s = cwt_slurp(path), *p = s;
	int n = 0;

	while (p != NULL && (p = strstr(p, needle)) != NULL) {
		n++;
		p += strlen(needle);
	}
	free(s);
	return n;
}

/* A dispatcher killed (-9) once its first pass decided and a snapshot
 * folded its journal: the restart takes the decision and the profile
 * back from the journal alone (there is no autocache.state), so the next
 * pass writes the cache at once instead of profiling again. */
START_TEST(service_planner_state_survives_a_kill_in_the_journal)
{
	char *dir = cwt_tmpdir(), work[600], events[700], modes[256], *log;
	cwt_daemon disp, w;
	uint64_t n, local = service_digest(SERVICE_PIPELINE, NULL, &n);
	uint64_t deadline;
	int snapshots;

	snprintf(work, sizeof(work), "%s/work", dir);
	snprintf(events, sizeof(events), "%s/events.jsonl", work);
	dispatcher_with_cache(&disp, dir, "dispatcher", "20");
	worker_for(&w, dir, "worker0", disp.url);
	run_epochs(disp.url, 1, local);
	wait_for_event(events, "\"cache\":\"decided full");
	status_durable(dir, disp.url);
	/* A snapshot taken from here holds the planner's lines; the log
	 * before it is gone. Ticks are records: one comes soon. */
	snapshots = count_in(disp.log, "event=snapshot lsn=");
	deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(10000);
	while (count_in(disp.log, "event=snapshot lsn=") == snapshots) {
		ck_assert_msg(cwt_now_ms() < deadline, "no snapshot");
		cwt_nap_ms(20);
	}
	ck_assert_int_eq(cwt_daemon_stop(&disp, SIGKILL), 128 + SIGKILL);
	cwt_daemon_stop(&w, SIGKILL);
	ck_assert(!file_exists(work, "autocache.state"));

	dispatcher_with_cache(&disp, dir, "dispatcher2", "20");
	log = cwt_slurp(disp.log);
	ck_assert_msg(log != NULL && strstr(log, "event=recovered") != NULL &&
		strstr(log, "snapshot_lsn=0 ") == NULL,
	    "%s", log != NULL ? log : "");
	free(log);
	worker_for(&w, dir, "worker1", disp.url);
	run_epochs(disp.url, 2, local);
	job_modes(events, modes, sizeof(modes));
	ck_assert_str_eq(modes, "profile put get");
	cwt_daemon_stop(&w, SIGKILL);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);
	ck_assert(!file_exists(work, "autocache.state"));
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* An earlier version's <work_dir>/autocache.state is imported into the
 * journal at the first start, once, and set aside; a file found later
 * next to a journal that holds the planner's state is set aside unread. */
START_TEST(service_imports_an_old_state_file_once)
{
	char *dir = cwt_tmpdir(), work[600], state[700], aside[720];
	char events[700], modes[256], *log, *old, *kept;
	cwt_daemon disp, w;
	uint64_t n, local = service_digest(SERVICE_PIPELINE, NULL, &n);

	snprintf(work, sizeof(work), "%s/work", dir);
	snprintf(state, sizeof(state), "%s/autocache.state", work);
	snprintf(aside, sizeof(aside), "%s.imported", state);
	snprintf(events, sizeof(events), "%s/events.jsonl", work);
	ck_assert_int_eq(mkdir(work, 0755), 0);
	/* An earlier dispatcher decided to cache the end. */
	write_state(state,
	    "read_mb_per_s=100 read_rows_per_s=1000000 write_mb_per_s=100",
	    SERVICE_PIPELINE,
	    "decided=1 choice=full candidate=0 failed=0 epochs=10 n=1 "
	    "p0=600,8,500000,0 reason=from the old file");
	old = cwt_slurp(state);
	dispatcher_with_cache(&disp, dir, "dispatcher", NULL);
	log = cwt_slurp(disp.log);
	ck_assert_msg(strstr(log, "event=autocache_imported") != NULL, "%s",
	    log);
	free(log);
	ck_assert(!file_exists(work, "autocache.state"));
	kept = cwt_slurp(aside);
	ck_assert_str_eq(kept, old);
	worker_for(&w, dir, "worker0", disp.url);
	run_epochs(disp.url, 2, local);
	job_modes(events, modes, sizeof(modes));
	ck_assert_str_eq(modes, "put get");
	cwt_daemon_stop(&w, SIGKILL);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);

	/* Read, this one would make it compute for good. */
	write_state(state,
	    "read_mb_per_s=1 read_rows_per_s=1 write_mb_per_s=1",
	    SERVICE_PIPELINE,
	    "decided=1 choice=full candidate=0 failed=1 epochs=10 n=0 "
	    "reason=never read");
	dispatcher_with_cache(&disp, dir, "dispatcher2", NULL);
	log = cwt_slurp(disp.log);
	ck_assert_msg(strstr(log, "event=autocache_state_aside") != NULL &&
		strstr(log, "event=autocache_imported") == NULL, "%s", log);
	free(log);
	ck_assert(!file_exists(work, "autocache.state"));
	ck_assert(file_exists(work, "autocache.state.imported-2"));
	free(kept);
	kept = cwt_slurp(aside);
	ck_assert_str_eq(kept, old); /* the first one stays */
	worker_for(&w, dir, "worker1", disp.url);
	run_epochs(disp.url, 1, local);
	job_modes(events, modes, sizeof(modes));
	ck_assert_str_eq(modes, "put get get");
	cwt_daemon_stop(&w, SIGKILL);
	ck_assert_int_eq(cwt_dispatcher_stop_verified(&disp), 0);
	free(kept);
	free(old);
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
	tcase_add_test(tc, state_text_loads_back_to_the_same_text);
	tcase_add_test(tc, state_text_with_a_bad_line_is_refused_whole);
	tcase_add_test(tc, planner_records_hold_the_lines_that_changed);
	tcase_add_test(tc, planner_record_of_bad_lines_is_refused_whole);
	tcase_add_test(tc, service_profiles_writes_then_reads_across_epochs);
	tcase_add_test(tc, service_planner_state_survives_a_kill_in_the_journal);
	tcase_add_test(tc, service_imports_an_old_state_file_once);
	suite_add_tcase(s, tc);
	return s;
}
