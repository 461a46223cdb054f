/*
 * check_journal.c - the write-ahead journal (src/core/journal.h) on real
 * files: round trips, group commit, snapshots and rotation, a torn tail
 * cut at every byte, every single bit flipped, the on-disk states a crash
 * between two syscalls leaves, a write that fails (RLIMIT_FSIZE in a
 * child), discard, and the limits.
 */
#include "cwt.h"
#include "../src/core/crc32c.h"
#include "../src/core/journal.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NS_10S (10ull * 1000000000ull)

/* ---- helpers --------------------------------------------------------------- */

/* What open delivered: the snapshot and each record by LSN. */
typedef struct replayed {
	bool had_snapshot;
	uint64_t snap_lsn;
	uint8_t *snap;
	size_t snap_len;
	uint64_t first_lsn, last_lsn;
	uint8_t **rec;
	size_t *len;
	size_t n, cap;
	/* Optional: the payloads records must have (a record delivered
	 * with other bytes fails the test). */
	uint8_t *const *expect;
	const size_t *expect_len;
	size_t nexpect;
	cachew_err fail_at_lsn_err;
	uint64_t fail_at_lsn;
} replayed;

static cachew_err
on_snapshot(void *ctx, const void *payload, size_t len, uint64_t lsn)
{
	replayed *r = ctx;

	ck_assert(!r->had_snapshot);
	r->had_snapshot = true;
	r->snap_lsn = lsn;
	r->snap = malloc(len + 1);
	ck_assert_ptr_nonnull(r->snap);
	memcpy(r->snap, payload, len);
	r->snap_len = len;
	return CACHEW_OK;
}

static cachew_err
on_record(void *ctx, uint64_t lsn, const void *payload, size_t len)
{
	replayed *r = ctx;

	if (r->fail_at_lsn != 0 && lsn == r->fail_at_lsn)
		return cwi_fail(r->fail_at_lsn_err, "test: refused LSN %llu",
		    (unsigned long long)lsn);
	if (r->n == 0)
		r->first_lsn = lsn;
	else
		ck_assert_uint_eq(lsn, r->last_lsn + 1);
	r->last_lsn = lsn;
	if (r->expect != NULL) {
		ck_assert_uint_ge(lsn, 1);
		ck_assert_uint_le(lsn, r->nexpect);
		ck_assert_uint_eq(len, r->expect_len[lsn - 1]);
		ck_assert(len == 0 ||
		    memcmp(payload, r->expect[lsn - 1], len) == 0);
	}
	if (r->n == r->cap) {
		r->cap = r->cap ? 2 * r->cap : 16;
		r->rec = realloc(r->rec, r->cap * sizeof(*r->rec));
		r->len = realloc(r->len, r->cap * sizeof(*r->len));
		ck_assert(r->rec != NULL && r->len != NULL);
	}
	r->rec[r->n] = malloc(len + 1);
	ck_assert_ptr_nonnull(r->rec[r->n]);
	memcpy(r->rec[r->n], payload, len);
	r->len[r->n++] = len;
	return CACHEW_OK;
}

static void
replayed_free(replayed *r)
{
	for (size_t i = 0; i < r->n; i++)
		free(r->rec[i]);
	free(r->rec);
	free(r->len);
	free(r->snap);
	memset(r, 0, sizeof(*r));
}

static cachew_err
open_replay(cwi_journal **j, const char *dir, const cwi_journal_options *o,
    replayed *r, cwi_journal_recovery *rec)
{
	cwi_journal_callbacks cb = {
	    .on_snapshot = on_snapshot, .on_record = on_record, .ctx = r};
	return cwi_journal_open(j, dir, o, &cb, rec);
}

static char *
jpath(const char *dir, const char *name)
{
	char *s = NULL;
	ck_assert_int_ge(asprintf(&s, "%s/%s", dir, name), 0);
	return s;
}

static bool
exists(const char *dir, const char *name)
{
	char *p = jpath(dir, name);
	bool ok = access(p, F_OK) == 0;
	free(p);
	return ok;
}

static uint8_t *
read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b;
	long n;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return b;
}

static void
copy_file(const char *from, const char *to)
{
	size_t len;
	uint8_t *b = read_all(from, &len);

	cwt_write_file(to, b, len);
	free(b);
}

static uint64_t
next_lsn(cwi_journal *j)
{
	cwi_journal_stats st;

	cwi_journal_stats_get(j, &st);
	return st.next_lsn;
}

static void
append_ok(cwi_journal *j, const void *p, size_t len, uint64_t want_lsn)
{
	uint64_t lsn = 0;

	ck_assert_int_eq(cwi_journal_append(j, p, len, &lsn), CACHEW_OK);
	ck_assert_uint_eq(lsn, want_lsn);
}

/* Record i of a test journal: i bytes of a pattern, every 7th empty,
 * a few large. */
static size_t
payload_len(size_t i)
{
	if (i % 7 == 0)
		return 0;
	if (i % 50 == 3)
		return (1u << 20) + i;
	return (i * 37) % 300;
}

static uint8_t *
payload_make(size_t i, size_t *len)
{
	*len = payload_len(i);
	uint8_t *p = malloc(*len + 1);
	ck_assert_ptr_nonnull(p);
	for (size_t k = 0; k < *len; k++)
		p[k] = (uint8_t)(i * 131 + k * 7);
	return p;
}

/* ---- round trips ------------------------------------------------------------- */

START_TEST(round_trip_replays_every_record_and_continues_lsns)
{
	char *dir = cwt_tmpdir(), *jdir = jpath(dir, "a/b/journal");
	enum { N = 120 };
	uint8_t *p[N + 1];
	size_t len[N + 1];
	cwi_journal *j;
	cwi_journal_recovery rec;
	replayed r = {0};

	ck_assert_int_eq(open_replay(&j, jdir, NULL, &r, &rec), CACHEW_OK);
	ck_assert(rec.created);
	ck_assert_uint_ne(rec.lineage, 0);
	ck_assert_uint_eq(r.n, 0);
	for (size_t i = 0; i < N; i++) {
		p[i] = payload_make(i, &len[i]);
		append_ok(j, p[i], len[i], i + 1);
	}
	ck_assert_int_eq(cwi_journal_wait_durable(j, N, NS_10S), CACHEW_OK);
	ck_assert_uint_eq(cwi_journal_durable_lsn(j), N);
	cwi_journal_destroy(j);

	r.expect = p;
	r.expect_len = len;
	r.nexpect = N;
	cwi_journal_recovery rec2;
	ck_assert_int_eq(open_replay(&j, jdir, NULL, &r, &rec2), CACHEW_OK);
	ck_assert(!rec2.created);
	ck_assert_uint_eq(rec2.lineage, rec.lineage);
	{
		cwi_journal_stats st;
		cwi_journal_stats_get(j, &st);
		ck_assert_uint_eq(st.lineage, rec.lineage);
	}
	ck_assert_uint_eq(rec2.records_replayed, N);
	ck_assert_uint_eq(rec2.last_lsn, N);
	ck_assert_uint_eq(rec2.torn_bytes, 0);
	ck_assert_uint_eq(r.n, N);
	ck_assert_uint_eq(r.first_lsn, 1);
	/* Appends go on with the next LSN, into the same segment. */
	ck_assert_uint_eq(next_lsn(j), N + 1);
	p[N] = payload_make(N + 1, &len[N]);
	append_ok(j, p[N], len[N], N + 1);
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	cwi_journal_destroy(j);

	replayed_free(&r);
	r.expect = p;
	r.expect_len = len;
	r.nexpect = N + 1;
	ck_assert_int_eq(open_replay(&j, jdir, NULL, &r, &rec2), CACHEW_OK);
	ck_assert_uint_eq(r.n, N + 1);
	ck_assert_uint_eq(r.last_lsn, N + 1);
	ck_assert(exists(jdir, "log-0000000000000001.cwj"));
	cwi_journal_destroy(j);
	replayed_free(&r);
	for (size_t i = 0; i <= N; i++)
		free(p[i]);
	free(jdir);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(snapshot_then_rotation_replays_only_later_records)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	cwi_journal_recovery rec;
	cwi_journal_stats st;
	replayed r = {0};
	char rec_text[16];

	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	for (int i = 1; i <= 10; i++) {
		snprintf(rec_text, sizeof(rec_text), "r%d", i);
		append_ok(j, rec_text, strlen(rec_text), (uint64_t)i);
	}
	/* The caller serialised its state as of LSN 10, under its lock. */
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK); /* a no-op */
	for (int i = 11; i <= 15; i++) {
		snprintf(rec_text, sizeof(rec_text), "r%d", i);
		append_ok(j, rec_text, strlen(rec_text), (uint64_t)i);
	}
	ck_assert_int_eq(
	    cwi_journal_snapshot_write(j, "state@10", 8, 10), CACHEW_OK);
	/* A snapshot cannot go back. */
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "x", 1, 9), CACHEW_EINVAL);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "x", 1, 16), CACHEW_EINVAL);
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	cwi_journal_stats_get(j, &st);
	ck_assert_uint_eq(st.snapshot_lsn, 10);
	ck_assert_uint_eq(st.rotations, 1);
	ck_assert_uint_eq(st.snapshots, 1);
	cwi_journal_destroy(j);
	ck_assert(!exists(dir, "log-0000000000000001.cwj"));
	ck_assert(exists(dir, "log-000000000000000b.cwj"));
	ck_assert(exists(dir, "snapshot.cws"));

	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert(r.had_snapshot);
	ck_assert_uint_eq(r.snap_lsn, 10);
	ck_assert_uint_eq(r.snap_len, 8);
	ck_assert_mem_eq(r.snap, "state@10", 8);
	ck_assert_uint_eq(r.n, 5);
	ck_assert_uint_eq(r.first_lsn, 11);
	ck_assert_mem_eq(r.rec[4], "r15", 3);
	ck_assert(rec.had_snapshot);
	ck_assert_uint_eq(rec.snapshot_lsn, 10);
	ck_assert_uint_eq(rec.records_replayed, 5);
	ck_assert_uint_eq(rec.segments_read, 1);
	/* A second snapshot at the same LSN as the last append, after a
	 * rotation with no records behind it. */
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "state@15", 8, 15),
	    CACHEW_OK);
	cwi_journal_destroy(j);
	ck_assert(!exists(dir, "log-000000000000000b.cwj"));
	ck_assert(exists(dir, "log-0000000000000010.cwj"));
	replayed_free(&r);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert_uint_eq(r.snap_lsn, 15);
	ck_assert_uint_eq(r.n, 0);
	append_ok(j, "r16", 3, 16);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(snapshot_due_counts_records_and_bytes_since_rotation)
{
	char *dir = cwt_tmpdir();
	cwi_journal_options o;
	cwi_journal *j;
	uint64_t lsn;
	static uint8_t big[600];

	cwi_journal_options_init(&o);
	ck_assert_uint_eq(o.snapshot_records, 100000);
	o.snapshot_records = 3;
	o.snapshot_bytes = 1000;
	ck_assert_int_eq(cwi_journal_open(&j, dir, &o, NULL, NULL), CACHEW_OK);
	ck_assert(!cwi_journal_snapshot_due(j));
	append_ok(j, "a", 1, 1);
	append_ok(j, "b", 1, 2);
	ck_assert(!cwi_journal_snapshot_due(j));
	append_ok(j, "c", 1, 3);
	ck_assert(cwi_journal_snapshot_due(j));
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	ck_assert(!cwi_journal_snapshot_due(j));
	ck_assert_int_eq(cwi_journal_append(j, big, 600, &lsn), CACHEW_OK);
	ck_assert(!cwi_journal_snapshot_due(j));
	ck_assert_int_eq(cwi_journal_append(j, big, 600, &lsn), CACHEW_OK);
	ck_assert(cwi_journal_snapshot_due(j));
	cwi_journal_destroy(j);
	/* Replayed records count: a journal reopened with more than the
	 * threshold since its last snapshot is due at once. */
	ck_assert_int_eq(cwi_journal_open(&j, dir, &o, NULL, NULL), CACHEW_OK);
	ck_assert(cwi_journal_snapshot_due(j));
	cwi_journal_destroy(j);
	o.snapshot_records = 1000;
	o.snapshot_bytes = 100000;
	ck_assert_int_eq(cwi_journal_open(&j, dir, &o, NULL, NULL), CACHEW_OK);
	ck_assert(!cwi_journal_snapshot_due(j));
	cwi_journal_destroy(j);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- group commit -------------------------------------------------------------- */

typedef struct committer_load {
	cwi_journal *j;
	pthread_mutex_t *caller_lock;
	int rounds;
	int id;
	cachew_err rv;
} committer_load;

static void *
append_and_wait(void *arg)
{
	committer_load *c = arg;
	char text[32];

	for (int i = 0; i < c->rounds && c->rv == CACHEW_OK; i++) {
		uint64_t lsn;
		int n = snprintf(text, sizeof(text), "t%d-%d", c->id, i);
		pthread_mutex_lock(c->caller_lock);
		c->rv = cwi_journal_append(c->j, text, (size_t)n, &lsn);
		pthread_mutex_unlock(c->caller_lock);
		if (c->rv == CACHEW_OK)
			c->rv = cwi_journal_wait_durable(c->j, lsn, NS_10S);
	}
	return NULL;
}

static void
run_load(cwi_journal *j, int threads, int rounds, bool held)
{
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	committer_load c[16];
	pthread_t t[16];
	cwi_journal_stats st;

	for (int i = 0; i < threads; i++) {
		c[i] = (committer_load){.j = j, .caller_lock = &lock,
		    .rounds = rounds, .id = i, .rv = CACHEW_OK};
		ck_assert_int_eq(
		    pthread_create(&t[i], NULL, append_and_wait, &c[i]), 0);
	}
	if (held) {
		/* Every thread's record is in the buffer before the
		 * committer may take a batch. */
		uint64_t t0 = cwt_now_ms();
		do {
			cwi_journal_stats_get(j, &st);
			ck_assert_uint_lt(cwt_now_ms() - t0, 10000);
			if (st.records_appended < (uint64_t)threads)
				usleep(1000);
		} while (st.records_appended < (uint64_t)threads);
		ck_assert_uint_eq(st.durable_lsn, 0);
		cwi_journal_test_hold(j, false);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(c[i].rv, CACHEW_OK);
	}
}

START_TEST(group_commit_one_fsync_for_waiting_threads)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	cwi_journal_stats st;
	replayed r = {0};

	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	cwi_journal_test_hold(j, true);
	run_load(j, 8, 1, true);
	cwi_journal_stats_get(j, &st);
	ck_assert_uint_eq(st.durable_lsn, 8);
	ck_assert_uint_eq(st.records_appended, 8);
	ck_assert_uint_eq(st.fsyncs, 1);
	ck_assert_uint_eq(st.batches, 1);

	/* Free running: every record durable and replayed once; the count
	 * of fsyncs is at most one per record. */
	run_load(j, 8, 50, false);
	cwi_journal_stats_get(j, &st);
	ck_assert_uint_eq(st.durable_lsn, 408);
	ck_assert_uint_le(st.fsyncs, 408);
	fprintf(stderr, "journal: 400 records from 8 threads took %llu fsyncs\n",
	    (unsigned long long)st.fsyncs - 1);
	cwi_journal_destroy(j);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_OK);
	ck_assert_uint_eq(r.n, 408);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Lazy records cost no fsync of their own: they go with the next record
 * someone waits for, or within a second. */
START_TEST(lazy_records_wait_for_a_record_that_matters)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	cwi_journal_stats st;
	replayed r = {0};
	uint64_t lsn = 0, t0;

	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	for (int i = 0; i < 20; i++)
		ck_assert_int_eq(cwi_journal_append_lazy(j, "tick", 4, &lsn),
		    CACHEW_OK);
	cwt_nap_ms(200);
	cwi_journal_stats_get(j, &st);
	ck_assert_uint_eq(st.durable_lsn, 0);
	ck_assert_uint_eq(st.fsyncs, 0);
	ck_assert_int_eq(cwi_journal_append(j, "request", 7, &lsn), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_wait_durable(j, lsn, UINT64_MAX),
	    CACHEW_OK);
	cwi_journal_stats_get(j, &st);
	ck_assert_uint_eq(st.durable_lsn, 21);
	ck_assert_uint_eq(st.fsyncs, 1);
	/* Alone, a lazy record is on disk within about a second. */
	t0 = cwt_now_ms();
	ck_assert_int_eq(cwi_journal_append_lazy(j, "tick", 4, &lsn), CACHEW_OK);
	while (cwi_journal_durable_lsn(j) < lsn &&
	       cwt_now_ms() - t0 < (uint64_t)cwt_bound_ms(5000))
		cwt_nap_ms(10);
	ck_assert_uint_eq(cwi_journal_durable_lsn(j), lsn);
	ck_assert_uint_ge(cwt_now_ms() - t0, 900);
	/* Waiting for it sends it at once. */
	ck_assert_int_eq(cwi_journal_append_lazy(j, "tick", 4, &lsn), CACHEW_OK);
	t0 = cwt_now_ms();
	ck_assert_int_eq(cwi_journal_wait_durable(j, lsn, UINT64_MAX),
	    CACHEW_OK);
	ck_assert_uint_lt(cwt_now_ms() - t0, 500);
	ck_assert_int_eq(cwi_journal_append_lazy(j, "last", 4, &lsn), CACHEW_OK);
	cwi_journal_destroy(j); /* writes it */
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_OK);
	ck_assert_uint_eq(r.n, 24);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* What on_durable reported: each batch's LSN, and a failure. */
typedef struct durable_seen {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	cwi_journal *j;
	uint64_t lsn, calls, published_before;
	cachew_err failed;
	char failmsg[256];
} durable_seen;

static void
durable_seen_init(durable_seen *ds)
{
	memset(ds, 0, sizeof(*ds));
	pthread_mutex_init(&ds->mu, NULL);
	cwi_cond_init_monotonic(&ds->cv);
}

static void
durable_seen_destroy(durable_seen *ds)
{
	pthread_mutex_destroy(&ds->mu);
	pthread_cond_destroy(&ds->cv);
}

static void
on_durable_note(void *ctx, uint64_t lsn, cachew_err rv)
{
	durable_seen *ds = ctx;
	/* Waiters must not know yet: what the callback answers goes out
	 * before a flush returns. */
	uint64_t published = rv == CACHEW_OK && ds->j != NULL
	    ? cwi_journal_durable_lsn(ds->j)
	    : 0;

	pthread_mutex_lock(&ds->mu);
	if (rv != CACHEW_OK) {
		ds->failed = rv;
		snprintf(ds->failmsg, sizeof(ds->failmsg), "%s",
		    cachew_errmsg());
	} else {
		/* Ascending, one call per batch. */
		if (lsn <= ds->lsn || published >= lsn)
			ds->published_before++;
		ds->lsn = lsn;
	}
	ds->calls++;
	pthread_cond_broadcast(&ds->cv);
	pthread_mutex_unlock(&ds->mu);
}

START_TEST(on_durable_reports_each_batch_before_its_waiters)
{
	char *dir = cwt_tmpdir();
	cwi_journal_options o;
	cwi_journal *j;
	durable_seen ds;
	uint64_t lsn = 0, t0, calls;

	durable_seen_init(&ds);
	cwi_journal_options_init(&o);
	o.on_durable = on_durable_note;
	o.on_durable_ctx = &ds;
	ck_assert_int_eq(cwi_journal_open(&j, dir, &o, NULL, NULL), CACHEW_OK);
	ds.j = j;
	/* Five records held back make one batch, reported once. */
	cwi_journal_test_hold(j, true);
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(cwi_journal_append(j, "rec", 3, &lsn),
		    CACHEW_OK);
	cwi_journal_test_hold(j, false);
	ck_assert_int_eq(cwi_journal_wait_durable(j, lsn, UINT64_MAX),
	    CACHEW_OK);
	pthread_mutex_lock(&ds.mu);
	ck_assert_uint_eq(ds.lsn, 5);
	ck_assert_uint_eq(ds.calls, 1);
	ck_assert_uint_eq(ds.published_before, 0);
	pthread_mutex_unlock(&ds.mu);
	/* Urged, a lazy record goes at once, not a second later, and it
	 * is learnt from the callback alone (no wait urges it). */
	ck_assert_int_eq(cwi_journal_append_lazy(j, "tick", 4, &lsn),
	    CACHEW_OK);
	t0 = cwt_now_ms();
	cwi_journal_urge(j, lsn);
	pthread_mutex_lock(&ds.mu);
	while (ds.lsn < lsn && cwt_now_ms() - t0 < 5000)
		cwi_cond_wait_ns(&ds.cv, &ds.mu, 10000000u);
	ck_assert_uint_eq(ds.lsn, 6);
	pthread_mutex_unlock(&ds.mu);
	ck_assert_uint_lt(cwt_now_ms() - t0, 500);
	/* An urge for a durable record does nothing. */
	cwi_journal_urge(j, 3);
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	pthread_mutex_lock(&ds.mu);
	calls = ds.calls;
	ck_assert_uint_eq(ds.published_before, 0);
	ck_assert_int_eq(ds.failed, CACHEW_OK);
	pthread_mutex_unlock(&ds.mu);
	ck_assert_uint_eq(calls, 2);
	cwi_journal_destroy(j);
	durable_seen_destroy(&ds);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(append_fails_when_far_ahead_of_the_disk)
{
	char *dir = cwt_tmpdir();
	cwi_journal_options o;
	cwi_journal *j;
	static uint8_t block[4096];
	uint64_t lsn;

	cwi_journal_options_init(&o);
	o.max_buffered = 3 * 4096;
	ck_assert_int_eq(cwi_journal_open(&j, dir, &o, NULL, NULL), CACHEW_OK);
	cwi_journal_test_hold(j, true);
	append_ok(j, block, sizeof(block), 1);
	append_ok(j, block, sizeof(block), 2);
	ck_assert_int_eq(
	    cwi_journal_append(j, block, sizeof(block), &lsn), CACHEW_ENOMEM);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "wait for the disk"));
	ck_assert_int_eq(cwi_journal_wait_durable(j, 2, 1000000), CACHEW_ETIMEDOUT);
	ck_assert_int_eq(cwi_journal_wait_durable(j, 3, 0), CACHEW_EINVAL);
	cwi_journal_test_hold(j, false);
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	append_ok(j, block, sizeof(block), 3);
	/* A record over the limit is refused before anything is read. */
	ck_assert_int_eq(cwi_journal_append(j, block,
			     (size_t)CWI_JOURNAL_MAX_RECORD + 1, &lsn),
	    CACHEW_ERANGE);
	cwi_journal_destroy(j);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- torn tails -------------------------------------------------------------- */

START_TEST(torn_tail_at_every_byte_of_the_last_record)
{
	char *dir = cwt_tmpdir(), *src = jpath(dir, "src"),
	     *seg = jpath(src, "log-0000000000000001.cwj");
	const char *payloads[4] = {"first", "", "third record", "last one!"};
	uint8_t *p[5];
	size_t len[5], full, before_last;
	uint8_t *img;
	cwi_journal *j;
	struct stat sb;

	ck_assert_int_eq(cwi_journal_open(&j, src, NULL, NULL, NULL), CACHEW_OK);
	for (int i = 0; i < 3; i++)
		append_ok(j, payloads[i], strlen(payloads[i]), (uint64_t)i + 1);
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	ck_assert_int_eq(stat(seg, &sb), 0);
	before_last = (size_t)sb.st_size;
	append_ok(j, payloads[3], strlen(payloads[3]), 4);
	cwi_journal_destroy(j);
	img = read_all(seg, &full);
	ck_assert_uint_eq(full, before_last + 20 + strlen(payloads[3]));
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t *)(uintptr_t)payloads[i];
		len[i] = strlen(payloads[i]);
	}
	p[4] = (uint8_t *)"after";
	len[4] = 5;

	for (size_t cut = before_last; cut < full; cut++) {
		char *d = jpath(dir, "cut"), *f = jpath(d, "log-0000000000000001.cwj");
		cwi_journal_recovery rec;
		replayed r = {.expect = p, .expect_len = len, .nexpect = 5};

		ck_assert_int_eq(mkdir(d, 0755), 0);
		cwt_write_file(f, img, cut);
		ck_assert_int_eq(open_replay(&j, d, NULL, &r, &rec), CACHEW_OK);
		ck_assert_uint_eq(r.n, 3);
		ck_assert_uint_eq(rec.torn_bytes, cut - before_last);
		ck_assert_uint_eq(next_lsn(j), 4);
		append_ok(j, "after", 5, 4);
		cwi_journal_destroy(j);
		replayed_free(&r);
		r = (replayed){.expect = p, .expect_len = len, .nexpect = 5};
		/* The record written after the cut replays: no garbage was
		 * left between it and the complete records. */
		p[3] = p[4];
		len[3] = len[4];
		ck_assert_int_eq(open_replay(&j, d, NULL, &r, &rec), CACHEW_OK);
		ck_assert_uint_eq(r.n, 4);
		ck_assert_uint_eq(rec.torn_bytes, 0);
		cwi_journal_destroy(j);
		replayed_free(&r);
		p[3] = (uint8_t *)(uintptr_t)payloads[3];
		len[3] = strlen(payloads[3]);
		cwt_rmtree(d);
		free(f);
		free(d);
	}
	free(img);
	free(seg);
	free(src);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(zeroed_tail_is_torn_but_garbage_before_the_tail_is_corrupt)
{
	char *dir = cwt_tmpdir(), *seg = jpath(dir, "log-0000000000000001.cwj");
	uint8_t *img, *big;
	size_t size;
	cwi_journal *j;
	cwi_journal_recovery rec;
	replayed r = {0};
	uint8_t zeros[100] = {0};

	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	append_ok(j, "one", 3, 1);
	append_ok(j, "two", 3, 2);
	cwi_journal_destroy(j);
	img = read_all(seg, &size);
	/* The file system extended the file with zeros the crash never
	 * filled: the zeros are a torn tail. */
	big = malloc(size + sizeof(zeros));
	memcpy(big, img, size);
	memcpy(big + size, zeros, sizeof(zeros));
	cwt_write_file(seg, big, size + sizeof(zeros));
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert_uint_eq(r.n, 2);
	ck_assert_uint_eq(rec.torn_bytes, sizeof(zeros));
	cwi_journal_destroy(j);
	replayed_free(&r);
	/* A non-zero byte among them: not what a crash leaves. */
	big[size + 50] = 1;
	cwt_write_file(seg, big, size + sizeof(zeros));
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_ECORRUPT);
	ck_assert_ptr_null(j);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "log-0000000000000001.cwj"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "at byte 78"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "header checksum"));
	/* The failed open changed nothing. */
	free(img);
	img = read_all(seg, &size);
	ck_assert_uint_eq(size, 78 + sizeof(zeros));
	replayed_free(&r);
	free(img);
	free(big);
	free(seg);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- bit flips --------------------------------------------------------------- */

typedef struct image {
	const char *name;
	uint8_t *data;
	size_t size;
} image;

static void
write_images(const char *d, const image *im, size_t n)
{
	ck_assert_int_eq(mkdir(d, 0755), 0);
	for (size_t i = 0; i < n; i++) {
		char *p = jpath(d, im[i].name);
		cwt_write_file(p, im[i].data, im[i].size);
		free(p);
	}
}

START_TEST(every_bit_flip_is_detected_or_drops_only_the_final_record)
{
	char *dir = cwt_tmpdir(), *src = jpath(dir, "src");
	const char *text[6] = {"a1", "b22", "c333", "", "e5", "f666"};
	uint8_t *p[6];
	size_t len[6];
	image im[3] = {{"snapshot.cws", NULL, 0},
	    {"log-0000000000000003.cwj", NULL, 0},
	    {"log-0000000000000005.cwj", NULL, 0}};
	cwi_journal *j;
	size_t last_rec_off;
	unsigned flips = 0, dropped = 0;

	/* snapshot (LSN 2), a segment followed by another (3, 4), and the
	 * last segment (5, 6). */
	ck_assert_int_eq(cwi_journal_open(&j, src, NULL, NULL, NULL), CACHEW_OK);
	for (int i = 0; i < 6; i++) {
		p[i] = (uint8_t *)(uintptr_t)text[i];
		len[i] = strlen(text[i]);
	}
	append_ok(j, text[0], len[0], 1);
	append_ok(j, text[1], len[1], 2);
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "snap", 4, 2), CACHEW_OK);
	append_ok(j, text[2], len[2], 3);
	append_ok(j, text[3], len[3], 4);
	ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	append_ok(j, text[4], len[4], 5);
	append_ok(j, text[5], len[5], 6);
	cwi_journal_destroy(j);
	for (int i = 0; i < 3; i++) {
		char *f = jpath(src, im[i].name);
		im[i].data = read_all(f, &im[i].size);
		free(f);
	}
	last_rec_off = im[2].size - (20 + len[5]);

	for (size_t fi = 0; fi < 3; fi++) {
		for (size_t bit = 0; bit < im[fi].size * 8; bit++) {
			char *d = jpath(dir, "flip");
			replayed r = {.expect = p, .expect_len = len, .nexpect = 6};
			cwi_journal_recovery rec;
			cachew_err rv;

			im[fi].data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			write_images(d, im, 3);
			im[fi].data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			rv = open_replay(&j, d, NULL, &r, &rec);
			if (rv == CACHEW_OK) {
				/* Only a flip in the final record's payload or
				 * checksum, which drops that record alone. */
				ck_assert_uint_eq(fi, 2);
				ck_assert_uint_ge(bit / 8, last_rec_off + 16);
				ck_assert_uint_eq(rec.torn_bytes, 20 + len[5]);
				ck_assert_uint_eq(r.n, 3);
				ck_assert_uint_eq(r.last_lsn, 5);
				ck_assert_mem_eq(r.snap, "snap", 4);
				cwi_journal_destroy(j);
				dropped++;
			} else {
				const char *m = cachew_errmsg();
				ck_assert_msg(rv == CACHEW_ECORRUPT ||
					rv == CACHEW_ENOTSUP,
				    "flip %zu of %s: %s", bit, im[fi].name, m);
				ck_assert_msg(strstr(m, im[fi].name) != NULL &&
					strstr(m, "at byte") != NULL,
				    "flip %zu of %s: %s", bit, im[fi].name, m);
				ck_assert_ptr_null(j);
			}
			/* The snapshot, when delivered, is the true one. */
			if (r.had_snapshot)
				ck_assert_mem_eq(r.snap, "snap", 4);
			replayed_free(&r);
			cwt_rmtree(d);
			free(d);
			flips++;
		}
	}
	ck_assert_uint_eq(dropped, (20 + len[5] - 16) * 8);
	ck_assert_uint_gt(flips, 1000);
	for (int i = 0; i < 3; i++)
		free(im[i].data);
	free(src);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- crash points ------------------------------------------------------------ */

/* A journal in dir: records 1..5 in log-1, a rotation, 6..7 in log-6. */
static void
two_segments(const char *dir)
{
	cwi_journal *j;
	char t[8];

	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	for (int i = 1; i <= 7; i++) {
		snprintf(t, sizeof(t), "r%d", i);
		append_ok(j, t, strlen(t), (uint64_t)i);
		if (i == 5)
			ck_assert_int_eq(cwi_journal_rotate(j), CACHEW_OK);
	}
	ck_assert_int_eq(cwi_journal_flush(j), CACHEW_OK);
	cwi_journal_destroy(j);
}

START_TEST(crash_after_rotation_before_snapshot_replays_both_segments)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	cwi_journal_recovery rec;
	replayed r = {0};
	char *tmp = jpath(dir, "snapshot.cws.tmp"),
	     *stmp = jpath(dir, "log-0000000000000008.cwj.tmp");

	two_segments(dir);
	/* The snapshot's temp file was being written, and the next
	 * rotation's segment was being created. */
	cwt_write_file(tmp, "CWJS garbage", 12);
	cwt_write_file(stmp, "CWJL", 4);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert(!r.had_snapshot);
	ck_assert_uint_eq(r.n, 7);
	ck_assert_uint_eq(r.first_lsn, 1);
	ck_assert_uint_eq(rec.segments_read, 2);
	ck_assert(access(tmp, F_OK) != 0);
	ck_assert(access(stmp, F_OK) != 0);
	append_ok(j, "r8", 2, 8);
	cwi_journal_destroy(j);
	replayed_free(&r);
	free(tmp);
	free(stmp);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(crash_after_snapshot_before_deletion_skips_stale_segments)
{
	char *dir = cwt_tmpdir(), *old = jpath(dir, "log-0000000000000001.cwj");
	uint8_t *img;
	size_t size;
	cwi_journal *j;
	cwi_journal_recovery rec;
	replayed r = {0};

	two_segments(dir);
	img = read_all(old, &size);
	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "s5", 2, 5), CACHEW_OK);
	cwi_journal_destroy(j);
	ck_assert(access(old, F_OK) != 0);
	/* As if the crash came before the unlink. */
	cwt_write_file(old, img, size);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert_uint_eq(r.snap_lsn, 5);
	ck_assert_uint_eq(r.n, 2);
	ck_assert_uint_eq(r.first_lsn, 6);
	ck_assert_uint_eq(rec.stale_segments_removed, 1);
	ck_assert(access(old, F_OK) != 0);
	cwi_journal_destroy(j);
	replayed_free(&r);
	free(img);
	free(old);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(snapshot_without_rotation_keeps_the_segment_it_is_inside)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	replayed r = {0};

	two_segments(dir);
	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	/* LSN 3 is inside log-1: nothing can go yet. */
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "s3", 2, 3), CACHEW_OK);
	cwi_journal_destroy(j);
	ck_assert(exists(dir, "log-0000000000000001.cwj"));
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_OK);
	ck_assert_uint_eq(r.snap_lsn, 3);
	ck_assert_uint_eq(r.first_lsn, 4);
	ck_assert_uint_eq(r.n, 4);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

static void
expect_corrupt(const char *dir, const char *file, const char *what)
{
	cwi_journal *j;
	replayed r = {0};

	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_ECORRUPT);
	ck_assert_ptr_null(j);
	ck_assert_msg(strstr(cachew_errmsg(), file) != NULL &&
		strstr(cachew_errmsg(), what) != NULL,
	    "%s", cachew_errmsg());
	replayed_free(&r);
}

START_TEST(missing_segment_or_foreign_lineage_is_corrupt)
{
	char *dir = cwt_tmpdir(), *other = jpath(dir, "other"),
	     *seg6 = jpath(dir, "log-0000000000000006.cwj"),
	     *seg1 = jpath(dir, "log-0000000000000001.cwj"),
	     *snap = jpath(dir, "snapshot.cws"),
	     *oseg = jpath(other, "log-0000000000000001.cwj"),
	     *osnap = jpath(other, "snapshot.cws");
	cwi_journal *j;

	two_segments(dir);
	two_segments(other);
	/* The first segment of another journal. */
	copy_file(oseg, seg1);
	expect_corrupt(dir, "log-0000000000000006.cwj", "lineage");
	/* The first segment gone and no snapshot: LSNs 1..5 are lost. */
	ck_assert_int_eq(unlink(seg1), 0);
	expect_corrupt(dir, "log-0000000000000006.cwj", "no snapshot");
	/* The snapshot of another journal (at 5: no gap before log-6). */
	ck_assert_int_eq(cwi_journal_open(&j, other, NULL, NULL, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "s5", 2, 5), CACHEW_OK);
	cwi_journal_destroy(j);
	copy_file(osnap, snap);
	expect_corrupt(dir, "log-0000000000000006.cwj", "lineage");
	/* A snapshot and no segment at all. */
	ck_assert_int_eq(unlink(seg6), 0);
	expect_corrupt(dir, "snapshot.cws", "no log segment");
	free(osnap);
	free(oseg);
	free(snap);
	free(seg1);
	free(seg6);
	cwt_rmtree(other);
	free(other);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(gap_between_snapshot_and_segments_is_corrupt)
{
	char *dir = cwt_tmpdir(), *seg1 = jpath(dir, "log-0000000000000001.cwj");
	cwi_journal *j;

	two_segments(dir);
	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_snapshot_write(j, "s2", 2, 2), CACHEW_OK);
	cwi_journal_destroy(j);
	ck_assert_int_eq(unlink(seg1), 0);
	expect_corrupt(dir, "log-0000000000000006.cwj", "covers only up to LSN 2");
	free(seg1);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(corrupt_middle_record_fails_after_delivering_only_good_ones)
{
	char *dir = cwt_tmpdir(), *seg = jpath(dir, "log-0000000000000001.cwj");
	uint8_t *img;
	size_t size;
	cwi_journal *j;
	replayed r = {0};

	two_segments(dir);
	img = read_all(seg, &size);
	/* Record 2's payload ("r2" at 32 + 22 + 16). */
	img[32 + 22 + 16] ^= 0x40;
	cwt_write_file(seg, img, size);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "at byte 54"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "payload checksum"));
	ck_assert_uint_eq(r.n, 1);
	replayed_free(&r);
	free(img);
	free(seg);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

static void
put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A segment image: the header (version given) and one record whose
 * length and LSN are given, both checksums right, with `tail` payload
 * bytes present. */
static size_t
craft_segment(uint8_t *b, uint32_t version, uint32_t len, uint64_t lsn,
    size_t tail)
{
	memcpy(b, "CWJL", 4);
	put_le(b + 4, version, 4);
	put_le(b + 8, 0x1234, 8);
	put_le(b + 16, 1, 8);
	put_le(b + 24, 0, 4);
	put_le(b + 28, cwi_crc32c(0, b, 28), 4);
	put_le(b + 32, len, 4);
	put_le(b + 36, lsn, 8);
	put_le(b + 44, cwi_crc32c(0, b + 32, 12), 4);
	memset(b + 48, 'p', tail);
	put_le(b + 48 + tail, cwi_crc32c(0, b + 48, tail), 4);
	/* A second record after it, so that the first is not the tail. */
	memset(b + 52 + tail, 0xee, 20);
	return 72 + tail;
}

START_TEST(lengths_sequences_and_versions_are_checked)
{
	char *dir = cwt_tmpdir(), *seg = jpath(dir, "log-0000000000000001.cwj");
	uint8_t b[256];
	cwi_journal *j;
	replayed r = {0};

	cwt_write_file(seg, b, craft_segment(b, 1, CWI_JOURNAL_MAX_RECORD + 1,
				   1, 8));
	expect_corrupt(dir, "log-0000000000000001.cwj at byte 32",
	    "over the limit");
	cwt_write_file(seg, b, craft_segment(b, 1, 8, 2, 8));
	expect_corrupt(dir, "log-0000000000000001.cwj at byte 32",
	    "LSN 2 out of sequence (expected 1)");
	cwt_write_file(seg, b, craft_segment(b, 2, 8, 1, 8));
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "format version 2"));
	ck_assert_uint_eq(r.n, 0);
	/* The same record, right, with garbage after it: that record is
	 * delivered, the garbage is corrupt. */
	cwt_write_file(seg, b, craft_segment(b, 1, 8, 1, 8));
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "at byte 60"));
	ck_assert_uint_eq(r.n, 1);
	ck_assert_mem_eq(r.rec[0], "pppppppp", 8);
	replayed_free(&r);
	free(seg);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(callback_error_aborts_the_open)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	replayed r = {.fail_at_lsn = 3, .fail_at_lsn_err = CACHEW_EPROTO};

	two_segments(dir);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, NULL), CACHEW_EPROTO);
	ck_assert_str_eq(cachew_errmsg(), "test: refused LSN 3");
	ck_assert_ptr_null(j);
	ck_assert_uint_eq(r.n, 2);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(a_second_open_of_the_directory_is_refused)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j, *j2;

	ck_assert_int_eq(cwi_journal_open(&j, dir, NULL, NULL, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_journal_open(&j2, dir, NULL, NULL, NULL), CACHEW_EEXIST);
	ck_assert_ptr_null(j2);
	cwi_journal_destroy(j);
	ck_assert_int_eq(cwi_journal_open(&j2, dir, NULL, NULL, NULL), CACHEW_OK);
	cwi_journal_destroy(j2);
	cwi_journal_destroy(NULL);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- failures ---------------------------------------------------------------- */

/* In a child: a file size limit of 8 KiB; a small record becomes durable,
 * a large one fails to write. Exit 0 when every check held. */
static int
fsize_child(const char *dir)
{
	struct rlimit rl = {.rlim_cur = 8192, .rlim_max = 8192};
	static uint8_t big[16384];
	cwi_journal_options o;
	durable_seen ds;
	cwi_journal *j;
	uint64_t lsn;
	int rv = 0;

	signal(SIGXFSZ, SIG_IGN);
	if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
		return 10;
	durable_seen_init(&ds);
	cwi_journal_options_init(&o);
	o.on_durable = on_durable_note;
	o.on_durable_ctx = &ds;
	if (cwi_journal_open(&j, dir, &o, NULL, NULL) != CACHEW_OK)
		return 11;
	if (cwi_journal_append(j, "small", 5, &lsn) != CACHEW_OK ||
	    cwi_journal_wait_durable(j, lsn, NS_10S) != CACHEW_OK)
		return 12;
	if (cwi_journal_append(j, big, sizeof(big), &lsn) != CACHEW_OK)
		return 13;
	if (cwi_journal_wait_durable(j, lsn, NS_10S) != CACHEW_EIO)
		return 14;
	if (strstr(cachew_errmsg(), "log-0000000000000001.cwj") == NULL ||
	    strstr(cachew_errmsg(), "write failed") == NULL)
		return 15;
	/* Failed for good, with the same message; the durable record
	 * stays durable. */
	if (cwi_journal_append(j, "x", 1, &lsn) != CACHEW_EIO ||
	    strstr(cachew_errmsg(), "write failed") == NULL)
		return 16;
	if (cwi_journal_wait_durable(j, 1, 0) != CACHEW_OK ||
	    cwi_journal_flush(j) != CACHEW_EIO ||
	    cwi_journal_rotate(j) != CACHEW_EIO ||
	    cwi_journal_snapshot_write(j, "s", 1, 1) != CACHEW_EIO)
		return 17;
	cwi_journal_destroy(j);
	/* on_durable heard of the durable record, then of the failure,
	 * with the file named. */
	if (ds.lsn != 1 || ds.failed != CACHEW_EIO || ds.calls != 2 ||
	    strstr(ds.failmsg, "log-0000000000000001.cwj") == NULL)
		rv = 18;
	durable_seen_destroy(&ds);
	return rv;
}

START_TEST(write_failure_fails_the_journal_with_the_file_named)
{
	char *dir = cwt_tmpdir();
	cwi_journal *j;
	cwi_journal_recovery rec;
	replayed r = {0};
	int status;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* The child's copy of dir is freed too: valgrind checks
		 * the child's leaks as well. */
		status = fsize_child(dir);
		free(dir);
		_exit(status);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	/* Under valgrind (make valgrind runs every suite in one process)
	 * the child inherits the threads of earlier suites' services, gone
	 * in it, and valgrind's leak check of the child reports what only
	 * their stacks held: exit 1, its --error-exitcode. The child's own
	 * failures are 10 and above, and what it wrote is checked below. */
	if (getenv("CWT_VALGRIND") != NULL && WEXITSTATUS(status) == 1)
		status = 0;
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	/* The partly written record is a torn tail; the durable one
	 * replays. */
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_mem_eq(r.rec[0], "small", 5);
	ck_assert_uint_gt(rec.torn_bytes, 0);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- discard ----------------------------------------------------------------- */

START_TEST(discard_moves_files_aside_and_starts_a_new_lineage)
{
	char *dir = cwt_tmpdir();
	cwi_journal_options o;
	cwi_journal_recovery rec, rec2;
	cwi_journal *j;
	replayed r = {0};
	DIR *d;
	struct dirent *e;
	unsigned aside = 0;

	two_segments(dir);
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwi_journal_options_init(&o);
	o.discard = true;
	ck_assert_int_eq(open_replay(&j, dir, &o, &r, &rec2), CACHEW_OK);
	ck_assert(rec2.created);
	ck_assert_uint_eq(rec2.files_discarded, 2);
	ck_assert_uint_ne(rec2.lineage, rec.lineage);
	ck_assert_uint_eq(r.n, 0);
	append_ok(j, "new", 3, 1);
	cwi_journal_destroy(j);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL)
		if (strstr(e->d_name, ".cwj.discarded-") != NULL)
			aside++;
	closedir(d);
	ck_assert_uint_eq(aside, 2);
	/* The new journal alone replays. */
	ck_assert_int_eq(open_replay(&j, dir, NULL, &r, &rec), CACHEW_OK);
	ck_assert_uint_eq(rec.lineage, rec2.lineage);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_mem_eq(r.rec[0], "new", 3);
	cwi_journal_destroy(j);
	replayed_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_journal_suite(void)
{
	Suite *s = suite_create("journal");
	TCase *tc = tcase_create("journal");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trip_replays_every_record_and_continues_lsns);
	tcase_add_test(tc, snapshot_then_rotation_replays_only_later_records);
	tcase_add_test(tc, snapshot_due_counts_records_and_bytes_since_rotation);
	tcase_add_test(tc, group_commit_one_fsync_for_waiting_threads);
	tcase_add_test(tc, lazy_records_wait_for_a_record_that_matters);
	tcase_add_test(tc, on_durable_reports_each_batch_before_its_waiters);
	tcase_add_test(tc, append_fails_when_far_ahead_of_the_disk);
	tcase_add_test(tc, torn_tail_at_every_byte_of_the_last_record);
	tcase_add_test(tc, zeroed_tail_is_torn_but_garbage_before_the_tail_is_corrupt);
	tcase_add_test(tc, every_bit_flip_is_detected_or_drops_only_the_final_record);
	tcase_add_test(tc, crash_after_rotation_before_snapshot_replays_both_segments);
	tcase_add_test(tc, crash_after_snapshot_before_deletion_skips_stale_segments);
	tcase_add_test(tc, snapshot_without_rotation_keeps_the_segment_it_is_inside);
	tcase_add_test(tc, missing_segment_or_foreign_lineage_is_corrupt);
	tcase_add_test(tc, gap_between_snapshot_and_segments_is_corrupt);
	tcase_add_test(tc, corrupt_middle_record_fails_after_delivering_only_good_ones);
	tcase_add_test(tc, lengths_sequences_and_versions_are_checked);
	tcase_add_test(tc, callback_error_aborts_the_open);
	tcase_add_test(tc, a_second_open_of_the_directory_is_refused);
	tcase_add_test(tc, write_failure_fails_the_journal_with_the_file_named);
	tcase_add_test(tc, discard_moves_files_aside_and_starts_a_new_lineage);
	suite_add_tcase(s, tc);
	return s;
}
