/*
 * dispatcher_server.c - the dispatcher role: the state machine of
 * dispatcher/dispatcher_state.c behind a listener, a lock and a ticker.
 *
 * Every request is decoded on the transport's thread, handled under d->lock
 * with the current time, and answered after the lock is released. A ticker
 * thread times out silent workers and clients every 50 ms, which also runs
 * the policy engine's decision interval; the pool target that follows goes
 * to the provisioner (src/provision/provision.h) after the lock is released.
 * Malformed requests reset the peer's connection (cwi_request_reject) with
 * a logged reason; the process stays up.
 *
 * Locking: d->lock around every call into the state machine; nothing else
 * is locked while it is held (the events file is written inside the state
 * machine's calls, under the lock, which keeps its lines in order). The
 * provisioner is called without d->lock: by the ticker (set_target), and
 * by status requests under d->prov_lock, which its destroy also takes so
 * that no status call runs into it. The two locks are never nested.
 * reply_lock (the replies that wait for the journal) is a leaf: handlers
 * take it after d->lock is released, the journal's committer (on_durable)
 * with no lock of the journal's held, and nothing is called under it.
 */
#include "../service.h"
#include "../service_user.h"

#include "dispatcher_autocache.h"
#include "dispatcher_metrics.h"
#include "dispatcher_state.h"
#include "../service_auth.h"
#include "../service_metrics.h"
#include "../service_rpc.h"
#include "../../cache/cache.h"
#include "../../core/journal.h"
#include "../../provision/provision.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

struct cwi_dispatcher_server {
	cwi_service_config cfg;
	cwi_dispatcher *state;
	cwi_listener *listener;
	cwi_http_listener *metrics; /* --metrics-listen; NULL: none */
	/* Per request type: arrival to reply sent, the wait for the
	 * journal's commit included (what the peer waits, less the link). */
	cwi_histogram latency[CWI_MSG_NTYPES];
	/* How long each /metrics scrape held d->lock: it copies the state
	 * there and formats after (issue 17 measured 9 us median, 88 us
	 * max, beside 0.24 ms of formatting, with W1 running). */
	cwi_histogram scrape_lock;
	FILE *events;
	bool events_owned;
	pthread_mutex_t lock;
	pthread_t ticker;
	bool ticker_started;
	atomic_bool stop;
	/* The ticker naps on tick_cond (with tick_lock) so a stop ends its
	 * nap at once: an embedded service stops at exit. */
	pthread_mutex_t tick_lock;
	pthread_cond_t tick_cond;
	cwi_provisioner *prov;
	pthread_mutex_t prov_lock; /* status calls vs destroy */
	uint32_t prov_sent; /* last target handed to prov */
	bool prov_sent_any;
	/* Autocaching (NULL without a cache root). pass_lock orders planning
	 * a pass after the ends of earlier ones; never held with d->lock
	 * taken first. */
	cwi_dcache *dcache;
	pthread_mutex_t pass_lock;
	/* disp_now's offset from cwi_now_ns: less the time the dispatcher
	 * itself did not run, plus where a recovered state's clock was. */
	_Atomic uint64_t clock_offset;
	/* The journal (docs/journal.md; NULL: none). Records are appended
	 * under d->lock in the order the calls ran; replies wait for their
	 * record to be durable in replies, and the journal's committer sends
	 * them (on_durable) once it is. */
	cwi_journal *journal;
	cwi_strbuf jrec; /* the record being built (d->lock) */
	atomic_bool journal_failed_said;
	atomic_bool serving; /* started: a journal failure stops it */
	pthread_mutex_t reply_lock;
	struct pending_reply *replies; /* reply_lock */
	size_t nreplies, capreplies;
	uint64_t replied_lsn; /* the last on_durable's LSN (reply_lock) */
	bool replies_wait;    /* stopping: handlers wait (reply_lock) */
	/* Durable, to send: [ready_head, nready) (reply_lock); ready_left
	 * is their count, for a look without the lock. */
	struct pending_reply *ready;
	size_t ready_head, nready, capready;
	atomic_size_t ready_left;
	uint8_t *snap;    /* a snapshot to write, ticker only */
	size_t snap_len;
	uint64_t snap_lsn;
	uint64_t last_lsn; /* the last record appended (d->lock) */
	/* The last one appended not lazy: any record up to it goes to disk
	 * without being urged (written under d->lock, read without). */
	_Atomic uint64_t last_urgent_lsn;
	uint64_t ids_reserved; /* <work_dir>/ids (d->lock) */
	uint64_t last_tick_ns; /* the ticker's, on cwi_now_ns */
	cwi_dispatcher_job_hook job_hook; /* set before clients come */
	void *job_hook_arg;
	cwi_auth_tokens *tokens; /* --auth-tokens (NULL: none, no checks) */
	struct held_lease *held; /* held split_lease requests (d->lock) */
	size_t nheld, capheld;
	_Atomic uint64_t test_slowed_job; /* test_slow_last_heartbeat's */
};

/* What the server layer learnt of a request's sender before the state
 * machine sees it (authorise). */
typedef struct sender {
	cwi_auth_role role; /* CWI_ROLE_ADMIN without tokens */
	bool reencode;      /* it came with "k" or "i": journal it re-encoded */
} sender;

/*
 * The dispatcher's clock: cwi_now_ns() less the time the process was not
 * running (SIGSTOP, a debugger, a suspended VM) or its ticker was starved
 * for long. While the dispatcher does not run it hears from nobody, so
 * without this every worker and client would be declared dead the moment
 * it runs again. The embedded service met it on every Ctrl-Z of a
 * training program longer than the worker timeout: its only worker was
 * dropped, and the iterator failed with "task 1 was stopped".
 */
static uint64_t
disp_now(cwi_dispatcher_server *d)
{
	return cwi_now_ns() + atomic_load(&d->clock_offset);
}

/* Ticks come every TICK_MS; a gap longer than PAUSE_MIN_MS between two
 * is counted as a pause (beyond one tick). */
#define TICK_MS 50
#define PAUSE_MIN_MS 1000

static void
note_pause(cwi_dispatcher_server *d)
{
	uint64_t now = cwi_now_ns(), gap;

	if (now - d->last_tick_ns > (uint64_t)PAUSE_MIN_MS * 1000000u) {
		gap = now - d->last_tick_ns - (uint64_t)TICK_MS * 1000000u;
		atomic_fetch_sub(&d->clock_offset, gap);
		cwi_log(CACHEW_LOG_WARN, "dispatcher",
		    "event=paused gap_ms=%llu action=\"timeouts extended by "
		    "the gap\"",
		    (unsigned long long)(gap / 1000000u));
	}
	d->last_tick_ns = now;
}

/* ---- the journal ------------------------------------------------------------ */

/* A reply that waits for its request's record to be durable. */
typedef struct pending_reply {
	cwi_request *r;
	cwi_pmsg rep;
	uint64_t lsn;
	bool hook, created;
	cwi_msg_type type; /* the request's, for its latency */
	uint64_t t0;       /* when it arrived (cwi_now_ns) */
} pending_reply;

/* The journal cannot keep what the dispatcher does any more (a write or
 * fsync failed, the disk is far behind, the ids file cannot be written).
 * Serving on would tell peers what a restart forgets: ids given out again
 * under the same lineage, leases leased twice. So the dispatcher stops at
 * once, without answering (fail-stop); restarted (by its supervisor, once
 * the disk is fixed) it recovers everything durable, and its workers and
 * clients ride out the absence. At a clean stop it is only said. */
static void
journal_failed(cwi_dispatcher_server *d, const char *what)
{
	if (atomic_exchange(&d->journal_failed_said, true))
		return;
	if (!atomic_load(&d->serving) || atomic_load(&d->stop)) {
		cwi_log(CACHEW_LOG_ERROR, "dispatcher", "event=journal_failed "
		    "error=\"%s: %s\"", what, cwi_errmsg_get());
		return;
	}
	cwi_log(CACHEW_LOG_ERROR, "dispatcher", "event=journal_failed "
	    "error=\"%s: %s\" action=\"exiting (code 75): restarted, the "
	    "dispatcher recovers what is durable\"", what, cwi_errmsg_get());
	_exit(75);
}

/* Appends the record in d->jrec (built with d->lock held; rv is the
 * builder's); a lazy one (a tick: no reply waits for it) goes to disk with
 * the next one that is not. *lsn 0 when there is no journal or it
 * failed. */
static void
journal_add(cwi_dispatcher_server *d, cachew_err rv, uint64_t *lsn,
    bool lazy)
{
	*lsn = 0;
	if (d->journal == NULL)
		return;
	if (rv == CACHEW_OK)
		rv = (lazy ? cwi_journal_append_lazy : cwi_journal_append)(
		    d->journal, d->jrec.data, d->jrec.len, lsn);
	if (rv != CACHEW_OK) {
		*lsn = 0;
		journal_failed(d, "append");
		return;
	}
	d->last_lsn = *lsn;
	if (!lazy)
		atomic_store(&d->last_urgent_lsn, *lsn);
}

static void
journal_append(cwi_dispatcher_server *d, cachew_err rv, uint64_t *lsn)
{
	journal_add(d, rv, lsn, false);
}

/* Journals a request that the state machine took (d->lock held). A
 * request that came with a token or an identity is journaled re-encoded
 * (the codec is canonical): without its token, which never reaches the
 * disk, and with the identity authorise gave it, which replay needs. */
static void
journal_request(cwi_dispatcher_server *d, uint64_t now, const cwi_request *r,
    const cwi_pmsg *req, const cwi_pmsg *rep, const cwi_job_pass *offered,
    bool reencode, uint64_t *lsn)
{
	const uint8_t *hdr;
	size_t len;
	cwi_strbuf sb;
	cachew_err rv = CACHEW_OK;

	*lsn = 0;
	if (d->journal == NULL || rep->type == CWI_MSG_ERROR ||
	    req->type == CWI_MSG_STATUS)
		return;
	cwi_strbuf_init(&sb);
	if (reencode) {
		assert(req->token == NULL);
		rv = cwi_pmsg_encode(req, &sb);
		hdr = (const uint8_t *)sb.data;
		len = sb.len;
	} else {
		hdr = cwi_msg_header(cwi_request_msg((cwi_request *)r), &len);
	}
	if (rv == CACHEW_OK)
		rv = offered != NULL ? cwi_jrec_pass_request(&d->jrec, now, hdr,
					   len, offered)
				     : cwi_jrec_request(&d->jrec, now, hdr, len);
	journal_append(d, rv, lsn);
	cwi_strbuf_free(&sb);
}

static void
send_reply(cwi_dispatcher_server *d, cwi_request *r, cwi_pmsg *rep,
    bool hook, bool created, cwi_msg_type type, uint64_t t0)
{
	uint64_t job_id = created ? rep->u.job_get_or_create_reply.job_id : 0;

	cwi_rpc_reply(r, rep);
	cwi_pmsg_free(rep);
	if (type > CWI_MSG_NONE && type < CWI_MSG_NTYPES)
		cwi_histogram_observe(&d->latency[type], cwi_now_ns() - t0);
	if (hook && d->job_hook != NULL)
		d->job_hook(d->job_hook_arg, created, job_id);
}

/* How many durable replies a thread takes at a time: few, so that the
 * handler threads that come by share a batch with the committer. */
#define SEND_CHUNK 8

/*
 * Sends the durable replies waiting in d->ready, SEND_CHUNK at a time,
 * until none is left. The committer calls it after each fsync, and every
 * handler on its way out: a reply's send costs a system call and wakes
 * its peer (20-50 us on these machines), so a batch of hundreds sent by
 * the committer alone held the last of them for milliseconds, longer
 * still whenever it lost its core; the handlers run anyway, and their
 * help costs no wake-up.
 */
static void
replies_send_ready(cwi_dispatcher_server *d)
{
	pending_reply chunk[SEND_CHUNK];
	size_t n;

	/* Most handlers find nothing ready: no lock for them. */
	while (atomic_load(&d->ready_left) > 0) {
		pthread_mutex_lock(&d->reply_lock);
		n = d->nready - d->ready_head;
		if (n > SEND_CHUNK)
			n = SEND_CHUNK;
		if (n > 0)
			memcpy(chunk, d->ready + d->ready_head,
			    n * sizeof(*chunk));
		d->ready_head += n;
		if (d->ready_head == d->nready)
			d->ready_head = d->nready = 0;
		atomic_store(&d->ready_left, d->nready - d->ready_head);
		pthread_mutex_unlock(&d->reply_lock);
		for (size_t i = 0; i < n; i++)
			send_reply(d, chunk[i].r, &chunk[i].rep, chunk[i].hook,
			    chunk[i].created, chunk[i].type, chunk[i].t0);
	}
}

/* Waits for the reply's record to be durable, then sends the reply; a
 * journal that failed first drops it (what it tells may be lost). */
static void
reply_when_durable(cwi_dispatcher_server *d, cwi_request *r, cwi_pmsg *rep,
    uint64_t lsn, bool hook, bool created, cwi_msg_type type, uint64_t t0)
{
	if (cwi_journal_wait_durable(d->journal, lsn, UINT64_MAX) !=
	    CACHEW_OK) {
		cwi_request_drop(r);
		cwi_pmsg_free(rep);
		return;
	}
	send_reply(d, r, rep, hook, created, type, t0);
}

/* Replies once the reply's record is durable: at once without a journal
 * or when it already is, else from the journal's committer (on_durable):
 * a transport handler must not block. The committer sends what it made
 * durable itself because a thread of ours in between (a replier) cost a
 * second wake-up per request, and on 2 busy cores each costs
 * milliseconds: W9's heartbeat p99 at 1,000 workers and 1,000 clients
 * (docs/performance.md). */
static void
reply_after(cwi_dispatcher_server *d, cwi_request *r, cwi_pmsg *rep,
    uint64_t lsn, bool hook, bool created, cwi_msg_type type, uint64_t t0)
{
	pending_reply *p;

	/* A failed journal (while stopping: the dispatcher did not exit)
	 * may not hold what this reply tells: dropped, as replies_drop
	 * drops those waiting, never sent. */
	if (d->journal != NULL && atomic_load(&d->journal_failed_said)) {
		cwi_request_drop(r);
		cwi_pmsg_free(rep);
		return;
	}
	if (lsn == 0 || d->journal == NULL) {
		send_reply(d, r, rep, hook, created, type, t0);
		return;
	}
	pthread_mutex_lock(&d->reply_lock);
	if (lsn <= d->replied_lsn) {
		pthread_mutex_unlock(&d->reply_lock);
		send_reply(d, r, rep, hook, created, type, t0);
		replies_send_ready(d);
		return;
	}
	if (d->replies_wait) {
		/* Stopping: the journal's last flush may have passed. */
		pthread_mutex_unlock(&d->reply_lock);
		reply_when_durable(d, r, rep, lsn, hook, created, type, t0);
		return;
	}
	if (d->nreplies == d->capreplies) {
		size_t cap = d->capreplies > 0 ? d->capreplies * 2 : 64;
		void *v = realloc(d->replies, cap * sizeof(*d->replies));
		if (v == NULL) {
			pthread_mutex_unlock(&d->reply_lock);
			/* Out of memory: wait here rather than lose it. */
			reply_when_durable(d, r, rep, lsn, hook, created,
			    type, t0);
			return;
		}
		d->replies = v;
		d->capreplies = cap;
	}
	p = &d->replies[d->nreplies++];
	p->r = r;
	p->rep = *rep;
	p->lsn = lsn;
	p->hook = hook;
	p->created = created;
	p->type = type;
	p->t0 = t0;
	pthread_mutex_unlock(&d->reply_lock);
	/* A borrowed LSN (a reply with no record) may be a lazy tick's,
	 * which would wait up to a second for a reason to go. */
	if (lsn > atomic_load(&d->last_urgent_lsn))
		cwi_journal_urge(d->journal, lsn);
	replies_send_ready(d);
}

/* Moves the waiting replies whose records are durable up to lsn to the
 * end of d->ready (reply_lock held); false when out of memory. Replies
 * come in nearly LSN order, not exactly (handlers race from d->lock to
 * here). */
static bool
replies_take_locked(cwi_dispatcher_server *d, uint64_t lsn)
{
	size_t keep = 0;

	if (d->ready_head > 0) {
		memmove(d->ready, d->ready + d->ready_head,
		    (d->nready - d->ready_head) * sizeof(*d->ready));
		d->nready -= d->ready_head;
		d->ready_head = 0;
	}
	if (!CWI_GROW(d->ready, d->capready, d->nready + d->nreplies))
		return false;
	for (size_t i = 0; i < d->nreplies; i++) {
		if (d->replies[i].lsn <= lsn)
			d->ready[d->nready++] = d->replies[i];
		else
			d->replies[keep++] = d->replies[i];
	}
	d->nreplies = keep;
	atomic_store(&d->ready_left, d->nready);
	return true;
}

/* The journal's on_durable, on its committer thread: sends the replies
 * whose records are now durable (group commit: one fsync for the batch),
 * with the handlers' help, or stops the dispatcher when the journal
 * failed. It returns once every one of them is sent or being sent by a
 * handler (which a listener's close waits for). */
static void
on_durable(void *ctx, uint64_t lsn, cachew_err rv)
{
	cwi_dispatcher_server *d = ctx;
	size_t waiting = 0;
	bool ok;

	if (rv != CACHEW_OK) {
		journal_failed(d, "commit");
		return;
	}
	pthread_mutex_lock(&d->reply_lock);
	d->replied_lsn = lsn;
	ok = replies_take_locked(d, lsn);
	if (!ok)
		waiting = d->nreplies;
	pthread_mutex_unlock(&d->reply_lock);
	if (!ok) {
		(void)cwi_fail(CACHEW_ENOMEM, "out of memory for %zu replies",
		    waiting);
		journal_failed(d, "sending replies");
		return;
	}
	replies_send_ready(d);
}

typedef struct replay_ctx {
	cwi_dispatcher *state;
	uint64_t snapshot_lsn;
} replay_ctx;

static cachew_err
replay_snapshot(void *ctx, const void *payload, size_t len, uint64_t lsn)
{
	replay_ctx *rc = ctx;
	cachew_err rv;

	rv = cwi_dispatcher_checkpoint_load(rc->state, payload, len);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "snapshot at record %llu: %s",
		    (unsigned long long)lsn, cwi_errmsg_get());
	rc->snapshot_lsn = lsn;
	return CACHEW_OK;
}

static cachew_err
replay_record(void *ctx, uint64_t lsn, const void *payload, size_t len)
{
	replay_ctx *rc = ctx;
	cachew_err rv;

	rv = cwi_dispatcher_apply_record(rc->state, payload, len);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "record %llu: %s", (unsigned long long)lsn,
		    cwi_errmsg_get());
	return CACHEW_OK;
}

/* Opens the journal in <work_dir>/journal and brings the state back: the
 * snapshot, then every record after it, without events (they were
 * written when the calls first ran). The clock continues from the
 * recovered state's, so the time the dispatcher was away counts for
 * nobody's timeout: workers and clients have their whole timeouts to
 * come back. */
static cachew_err
start_journal(cwi_dispatcher_server *d)
{
	const cwi_service_config *c = &d->cfg;
	char dir[CWI_CFG_STR_MAX + 16];
	cwi_journal_options jo;
	cwi_journal_callbacks cb;
	cwi_journal_recovery rec;
	replay_ctx rc = {d->state, 0};
	cwi_dispatcher_config dc;
	uint64_t lsn, now, inc;
	cachew_err rv;

	if (c->work_dir[0] == '\0' || !c->journal)
		return CACHEW_OK;
	snprintf(dir, sizeof(dir), "%s/journal", c->work_dir);
	cwi_journal_options_init(&jo);
	jo.snapshot_records = (uint64_t)c->snapshot_records;
	/* Room for a few of the largest requests (a dataset's graph, up to
	 * 33 MiB) while an fsync runs. */
	jo.max_buffered = (size_t)160 << 20;
	jo.discard = c->journal_discard != 0;
	jo.on_durable = on_durable;
	jo.on_durable_ctx = d;
	memset(&cb, 0, sizeof(cb));
	cb.on_snapshot = replay_snapshot;
	cb.on_record = replay_record;
	cb.ctx = &rc;
	memset(&rec, 0, sizeof(rec));
	/* This process's configuration, which the records it appends run
	 * with (the replay runs the older ones with theirs). */
	dc = *cwi_dispatcher_config_of(d->state);
	cwi_dispatcher_quiet(d->state, true);
	rv = cwi_journal_open(&d->journal, dir, &jo, &cb, &rec);
	cwi_dispatcher_quiet(d->state, false);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "journal %s: %s (to start empty, setting "
		    "its files aside: --journal-discard=1)", dir,
		    cwi_errmsg_get());
	cwi_dispatcher_set_lineage(d->state, rec.lineage);
	if (cwi_dispatcher_lineage(d->state) != rec.lineage)
		return cwi_fail(CACHEW_ECORRUPT, "journal %s: its snapshot is "
		    "of lineage %016llx, the journal's is %016llx", dir,
		    (unsigned long long)cwi_dispatcher_lineage(d->state),
		    (unsigned long long)rec.lineage);
	/* Continue the clock: a reboot may have reset the monotonic one. */
	if (!rec.created) {
		now = cwi_dispatcher_clock(d->state) + 1000000u;
		atomic_store(&d->clock_offset, now - cwi_now_ns());
	}
	inc = rec.created ? 1 : cwi_dispatcher_incarnation(d->state) + 1;
	pthread_mutex_lock(&d->lock);
	journal_append(d, cwi_jrec_start(&d->jrec, disp_now(d), rec.lineage,
			      inc, &dc, d->ids_reserved + 1),
	    &lsn);
	if (lsn != 0)
		rv = cwi_dispatcher_apply_record(d->state,
		    (const uint8_t *)d->jrec.data, d->jrec.len);
	pthread_mutex_unlock(&d->lock);
	if (lsn == 0 || rv != CACHEW_OK ||
	    cwi_journal_wait_durable(d->journal, lsn, UINT64_MAX) != CACHEW_OK)
		return cwi_fail(CACHEW_EIO, "journal %s: its start record: %s",
		    dir, cwi_errmsg_get());
	cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=%s lineage=%016llx "
	    "incarnation=%llu snapshot_lsn=%llu records=%llu diverged=%llu "
	    "torn_bytes=%llu discarded_files=%llu ms=%.1f dir=%s",
	    rec.created ? "journal_created" : "recovered",
	    (unsigned long long)rec.lineage, (unsigned long long)inc,
	    (unsigned long long)rec.snapshot_lsn,
	    (unsigned long long)rec.records_replayed,
	    (unsigned long long)cwi_dispatcher_replay_diverged(d->state),
	    (unsigned long long)rec.torn_bytes,
	    (unsigned long long)rec.files_discarded,
	    (double)rec.duration_ns / 1e6, dir);
	return CACHEW_OK;
}

static void
dump(const char *dir, const char *name, const cwi_strbuf *sb)
{
	char path[CWI_CFG_STR_MAX + 64];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (f == NULL)
		return;
	fwrite(sb->data, 1, sb->len, f);
	fclose(f);
}

/* The planner's own state and the one a replay gave: the same text, or
 * both dumped and false. */
static bool
planner_verified(cwi_dispatcher_server *d, const cwi_dispatcher *replayed,
    cachew_err *rv)
{
	cwi_strbuf a, b;
	bool same;

	if (d->dcache == NULL)
		return true;
	cwi_strbuf_init(&a);
	cwi_strbuf_init(&b);
	*rv = cwi_dcache_save(d->dcache, &a);
	if (*rv == CACHEW_OK)
		*rv = cwi_dispatcher_planner_text(replayed, &b);
	same = *rv != CACHEW_OK || (a.len == b.len &&
				       memcmp(a.data, b.data, a.len) == 0);
	if (!same) {
		dump(d->cfg.work_dir, "verify-planner-live.txt", &a);
		dump(d->cfg.work_dir, "verify-planner-replayed.txt", &b);
	}
	cwi_strbuf_free(&a);
	cwi_strbuf_free(&b);
	return same;
}

/* journal_verify: the journal, replayed into a new state (created with
 * this one's configuration), must give this state, byte for byte of
 * their checkpoints, and the autocaching planner's state. The journal is
 * closed; the state no longer changes. */
static void
journal_verify(cwi_dispatcher_server *d)
{
	char dir[CWI_CFG_STR_MAX + 16];
	cwi_dispatcher *copy = NULL;
	cwi_journal *j = NULL;
	cwi_journal_callbacks cb;
	cwi_strbuf a, b;
	replay_ctx rc = {NULL, 0};
	cachew_err rv;
	bool planner_same = true;

	snprintf(dir, sizeof(dir), "%s/journal", d->cfg.work_dir);
	cwi_strbuf_init(&a);
	cwi_strbuf_init(&b);
	rv = cwi_dispatcher_create(&copy, cwi_dispatcher_config_of(d->state));
	if (rv == CACHEW_OK) {
		memset(&cb, 0, sizeof(cb));
		cb.on_snapshot = replay_snapshot;
		cb.on_record = replay_record;
		cb.ctx = &rc;
		rc.state = copy;
		cwi_dispatcher_quiet(copy, true);
		rv = cwi_journal_open(&j, dir, NULL, &cb, NULL);
		cwi_journal_destroy(j);
	}
	/* Calls without a record (status, refused requests) moved only
	 * the clock; pass ends not yet taken for the planner at the stop
	 * are not state: a replay drops them after each record, and here
	 * both sides drop them, since a snapshot taken between a pass's
	 * end and the planner taking it holds the end, and when no record
	 * follows the snapshot nothing in the replay drops it (the
	 * verification failed on that, once in 25 runs of dautocache). */
	if (rv == CACHEW_OK) {
		cwi_dispatcher_set_clock(copy, cwi_dispatcher_clock(d->state));
		cwi_dispatcher_drop_pass_ends(d->state);
		cwi_dispatcher_drop_pass_ends(copy);
	}
	if (rv == CACHEW_OK)
		rv = cwi_dispatcher_checkpoint_save(d->state, &a);
	if (rv == CACHEW_OK)
		rv = cwi_dispatcher_checkpoint_save(copy, &b);
	if (rv == CACHEW_OK)
		planner_same = planner_verified(d, copy, &rv);
	if (rv != CACHEW_OK)
		cwi_log(CACHEW_LOG_ERROR, "dispatcher", "event=journal_verify_"
		    "failed error=\"%s\"", cwi_errmsg_get());
	else if (!planner_same)
		cwi_log(CACHEW_LOG_ERROR, "dispatcher", "event=journal_verify_"
		    "failed error=\"the autocaching planner's state differs "
		    "from the journal's; both in %s/verify-planner-{live,"
		    "replayed}.txt\"", d->cfg.work_dir);
	else if (a.len != b.len || memcmp(a.data, b.data, a.len) != 0 ||
		 cwi_dispatcher_replay_diverged(copy) > 0) {
		size_t at = 0;
		while (at < a.len && at < b.len && a.data[at] == b.data[at])
			at++;
		cwi_log(CACHEW_LOG_ERROR, "dispatcher", "event=journal_verify_"
		    "failed error=\"the replayed state differs (%zu vs %zu "
		    "bytes, first at byte %zu; %llu requests diverged); both in "
		    "%s/verify-{live,replayed}.bin\"", b.len, a.len, at,
		    (unsigned long long)cwi_dispatcher_replay_diverged(copy),
		    d->cfg.work_dir);
		dump(d->cfg.work_dir, "verify-live.bin", &a);
		dump(d->cfg.work_dir, "verify-replayed.bin", &b);
	}
	else
		cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=journal_verified "
		    "bytes=%zu", a.len);
	cwi_strbuf_free(&a);
	cwi_strbuf_free(&b);
	cwi_dispatcher_destroy(copy);
}

/* ---- ids never reused ----------------------------------------------------- */

/*
 * <work_dir>/ids holds "reserved N": no id up to N was given out by a
 * later lineage than the one that wrote it. A state that starts empty in
 * that work dir (a discarded or lost journal, or none) gives out ids above
 * N, so ids are never reused across restarts, with or without state. The
 * file is rewritten (temporary file, fsync, rename) a block of IDS_BLOCK
 * ahead whenever the ids given out reach it: rarely.
 */
#define IDS_BLOCK 1024u

static void
ids_path(const cwi_dispatcher_server *d, char *buf, size_t size)
{
	snprintf(buf, size, "%s/ids", d->cfg.work_dir);
}

static cachew_err
ids_read(cwi_dispatcher_server *d)
{
	char path[CWI_CFG_STR_MAX + 16], line[128], extra;
	unsigned long long n;
	FILE *f;

	if (d->cfg.work_dir[0] == '\0')
		return CACHEW_OK;
	ids_path(d, path, sizeof(path));
	f = fopen(path, "r");
	if (f == NULL && errno == ENOENT)
		return CACHEW_OK;
	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	if (fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, "reserved %llu %c", &n, &extra) != 1 ||
	    n > UINT64_MAX / 4) {
		fclose(f);
		return cwi_fail(CACHEW_ECORRUPT, "%s: not \"reserved N\" (the "
		    "ids this work dir gave out; remove the file only if no "
		    "worker or client of an earlier dispatcher here is left)",
		    path);
	}
	fclose(f);
	d->ids_reserved = n;
	return CACHEW_OK;
}

/* With d->lock held: reserves the next block when the ids given out
 * reached the reserved ones. */
static void
ids_reserve(cwi_dispatcher_server *d)
{
	char path[CWI_CFG_STR_MAX + 16], tmp[CWI_CFG_STR_MAX + 24], buf[64];
	uint64_t max = cwi_dispatcher_max_id(d->state), want;
	int fd, len;
	bool ok;

	if (d->cfg.work_dir[0] == '\0' || max < d->ids_reserved)
		return;
	want = (max / IDS_BLOCK + 2) * IDS_BLOCK;
	ids_path(d, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	len = snprintf(buf, sizeof(buf), "reserved %llu\n",
	    (unsigned long long)want);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ok = fd >= 0 && write(fd, buf, (size_t)len) == len && fsync(fd) == 0;
	if (fd >= 0)
		ok = close(fd) == 0 && ok;
	ok = ok && rename(tmp, path) == 0;
	if (ok) {
		/* The rename itself durable: after a power loss an older,
		 * lower reservation must not come back. */
		int dfd = open(d->cfg.work_dir, O_RDONLY | O_DIRECTORY |
		    O_CLOEXEC);
		ok = dfd >= 0 && fsync(dfd) == 0;
		if (dfd >= 0)
			close(dfd);
	}
	if (!ok) {
		(void)cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
		(void)unlink(tmp);
		journal_failed(d, "reserving ids");
		return;
	}
	d->ids_reserved = want;
}

/* With d->lock held: when the journal asks for one, serialises the state
 * for a snapshot (written by snapshot_write, without the lock). */
static void
snapshot_take(cwi_dispatcher_server *d)
{
	if (d->journal == NULL || d->snap != NULL ||
	    !cwi_journal_snapshot_due(d->journal))
		return;
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	if (cwi_dispatcher_checkpoint_save(d->state, &sb) != CACHEW_OK) {
		cwi_strbuf_free(&sb);
		return;
	}
	d->snap = (uint8_t *)sb.data; /* the strbuf's: freed with free() */
	d->snap_len = sb.len;
	d->snap_lsn = d->last_lsn;
	if (cwi_journal_rotate(d->journal) != CACHEW_OK) {
		free(d->snap);
		d->snap = NULL;
	}
}

static void
snapshot_write(cwi_dispatcher_server *d)
{
	uint64_t t0 = cwi_now_ns();
	cachew_err rv;

	if (d->snap == NULL)
		return;
	rv = cwi_journal_snapshot_write(d->journal, d->snap, d->snap_len,
	    d->snap_lsn);
	if (rv != CACHEW_OK)
		cwi_log(CACHEW_LOG_WARN, "dispatcher", "event=snapshot_failed "
		    "error=\"%s\"", cwi_errmsg_get());
	else
		cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=snapshot lsn=%llu "
		    "bytes=%zu ms=%.1f", (unsigned long long)d->snap_lsn,
		    d->snap_len, (double)(cwi_now_ns() - t0) / 1e6);
	free(d->snap);
	d->snap = NULL;
}

/* ---- the planner's state in the journal ------------------------------------ */

/* Journals what the planner's last call changed (pass_lock held, or no
 * other thread yet; d->lock not): the lines of its state that differ
 * from the state machine's copy, as one record, applied to the copy as a
 * replay applies it. Returns the record's LSN (0: none). A line that
 * does not check (a planner bug) is logged and not journaled: a record
 * that a restart would refuse is never written. */
static uint64_t
planner_record(cwi_dispatcher_server *d)
{
	cwi_strbuf text;
	bool changed = false;
	uint64_t lsn = 0;
	cachew_err rv;

	if (d->journal == NULL || d->dcache == NULL)
		return 0;
	cwi_strbuf_init(&text);
	rv = cwi_dcache_save(d->dcache, &text);
	pthread_mutex_lock(&d->lock);
	if (rv == CACHEW_OK)
		rv = cwi_jrec_planner(&d->jrec, disp_now(d), d->state,
		    text.data, text.len, &changed);
	if (rv == CACHEW_ECORRUPT) {
		cwi_log(CACHEW_LOG_WARN, "dispatcher", "event=autocache_"
		    "unrecorded error=\"%s\"", cwi_errmsg_get());
	} else if (rv != CACHEW_OK || changed) {
		journal_append(d, rv, &lsn);
		/* The copy must hold what the journal holds. */
		if (lsn != 0 && cwi_dispatcher_apply_record(d->state,
				    (const uint8_t *)d->jrec.data,
				    d->jrec.len) != CACHEW_OK)
			journal_failed(d, "the planner's state");
	}
	pthread_mutex_unlock(&d->lock);
	cwi_strbuf_free(&text);
	return lsn;
}

/* Sets an autocache.state file aside (renamed), once its state is in the
 * journal, so that no later start reads it. */
static void
state_file_aside(const char *path, const char *why)
{
	char aside[CWI_CFG_STR_MAX + 48];
	int k = 1;

	/* An earlier one set aside stays: -2, -3... */
	snprintf(aside, sizeof(aside), "%s.imported", path);
	while (access(aside, F_OK) == 0 && k < 1000)
		snprintf(aside, sizeof(aside), "%s.imported-%d", path, ++k);
	if (rename(path, aside) != 0)
		cwi_log(CACHEW_LOG_WARN, "dispatcher", "event=autocache_state_"
		    "aside_failed file=%s error=\"%s\"", path, strerror(errno));
	else
		cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=autocache_state_"
		    "aside file=%s to=%s reason=\"%s\"", path, aside, why);
}

/* At a start (the journal open, nothing served yet): the planner takes
 * its state back from the journal. A journal with none yet imports an
 * earlier version's <work_dir>/autocache.state once, as one record,
 * then sets the file aside. A file found next to a journal that has the
 * state (an import cut short before its rename) is set aside unread: the
 * journal's state wins. */
static cachew_err
planner_recover(cwi_dispatcher_server *d)
{
	char path[CWI_CFG_STR_MAX + 32];
	cwi_strbuf text;
	bool found = false;
	uint64_t lsn;
	cachew_err rv;

	if (d->journal == NULL || d->dcache == NULL)
		return CACHEW_OK;
	snprintf(path, sizeof(path), "%s/autocache.state", d->cfg.work_dir);
	cwi_strbuf_init(&text);
	rv = cwi_dispatcher_planner_text(d->state, &text);
	if (rv == CACHEW_OK && text.len > 0) {
		rv = cwi_dcache_load(d->dcache, text.data, text.len);
		if (rv != CACHEW_OK)
			rv = cwi_fail(rv, "the journal's autocaching state: %s",
			    cwi_errmsg_get());
		else if (access(path, F_OK) == 0)
			state_file_aside(path, "the journal holds the "
			    "planner's state");
	} else if (rv == CACHEW_OK) {
		rv = cwi_dcache_import(d->dcache, path, &found);
	}
	cwi_strbuf_free(&text);
	if (rv != CACHEW_OK || !found)
		return rv;
	/* The file goes aside only once its record is on disk. */
	lsn = planner_record(d);
	if (atomic_load(&d->journal_failed_said) ||
	    (lsn != 0 && cwi_journal_wait_durable(d->journal, lsn,
			     UINT64_MAX) != CACHEW_OK))
		return cwi_fail(CACHEW_EIO, "importing %s into the journal: %s",
		    path, cwi_errmsg_get());
	cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=autocache_imported "
	    "file=%s record=%llu", path, (unsigned long long)lsn);
	state_file_aside(path, "imported into the journal");
	return CACHEW_OK;
}

/* The server's state of one autocaching pass (a job's cwi_job_pass ctx). */
typedef struct srv_pass {
	cwi_dcache_pass pass;
	uint8_t *graph; /* the dataset's graph, as registered */
	size_t graph_len;
} srv_pass;

static void
srv_pass_free(void *ctx)
{
	srv_pass *sp = ctx;

	if (sp == NULL)
		return;
	cwi_dcache_pass_free(&sp->pass);
	free(sp->graph);
	free(sp);
}

/* Hands the passes that ended to the planner (commits, decisions), then
 * records what it did. Called with pass_lock held, d->lock not. */
static void
finish_passes(cwi_dispatcher_server *d)
{
	cwi_pass_end *v = NULL;
	size_t n;

	pthread_mutex_lock(&d->lock);
	n = cwi_dispatcher_take_pass_ends(d->state, &v);
	pthread_mutex_unlock(&d->lock);
	for (size_t i = 0; i < n; i++) {
		srv_pass *sp = v[i].ctx;
		cwi_ac_counter *ops;
		char event[768];
		uint64_t lsn;

		/* A pass recovered from the journal has no planner context:
		 * its end teaches the planner nothing. */
		if (sp == NULL)
			continue;
		ops = calloc(v[i].nops + 1, sizeof(*ops));

		for (size_t k = 0; ops != NULL && k < v[i].nops; k++) {
			ops[k].name = v[i].ops[k].name;
			ops[k].elements = v[i].ops[k].elements;
			ops[k].bytes = v[i].ops[k].bytes;
			ops[k].busy_ns = v[i].ops[k].busy_ns;
		}
		cwi_dcache_pass_end(d->dcache, sp->graph, sp->graph_len,
		    &sp->pass, v[i].complete, ops, ops != NULL ? v[i].nops : 0,
		    v[i].workers > 0 ? v[i].workers : 1, event, sizeof(event));
		free(ops);
		(void)planner_record(d);
		if (event[0] != '\0') {
			cwi_log(CACHEW_LOG_INFO, "dispatcher",
			    "event=autocache job=%llu %s",
			    (unsigned long long)v[i].job_id, event);
			pthread_mutex_lock(&d->lock);
			uint64_t now = disp_now(d);
			cwi_dispatcher_autocache_event(d->state, now,
			    v[i].job_id, NULL, event);
			journal_append(d, cwi_jrec_autocache(&d->jrec, now,
					      v[i].job_id, NULL, event),
			    &lsn);
			pthread_mutex_unlock(&d->lock);
		}
		srv_pass_free(sp);
	}
	cwi_dispatcher_pass_ends_free(v, n);
}

/* A job request that would create a job: plan its pass (I/O) without
 * d->lock, then handle the request with the plan offered. *lsn: its
 * journal record's. */
static void
handle_job_request(cwi_dispatcher_server *d, const cwi_request *r,
    const cwi_pmsg *req, const sender *who, cwi_pmsg *rep, uint64_t *lsn)
{
	cwi_job_pass offered;
	uint64_t now;
	cwi_job_pass jp;
	srv_pass *sp = NULL;
	uint8_t *graph = NULL;
	size_t len = 0;
	uint64_t units = 0;
	bool wants;
	cachew_err rv;

	memset(&jp, 0, sizeof(jp));
	pthread_mutex_lock(&d->pass_lock);
	finish_passes(d); /* the previous pass's commit comes first */
	pthread_mutex_lock(&d->lock);
	wants = cwi_dispatcher_job_wants_pass(d->state,
	    &req->u.job_get_or_create, &graph, &len, &units);
	pthread_mutex_unlock(&d->lock);
	if (wants && (sp = calloc(1, sizeof(*sp))) != NULL) {
		sp->graph = graph;
		sp->graph_len = len;
		graph = NULL;
		rv = cwi_dcache_pass_start(d->dcache, sp->graph, sp->graph_len,
		    units, 0, &sp->pass);
		(void)planner_record(d); /* before the job's record */
		if (rv == CACHEW_OK) {
			jp.graph = sp->pass.graph;
			jp.graph_len = sp->pass.graph_len;
			jp.units = sp->pass.units;
			jp.worker_scale = sp->pass.worker_scale;
			snprintf(jp.mode, sizeof(jp.mode), "%s",
			    cwi_ac_mode_name(sp->pass.mode));
			snprintf(jp.event, sizeof(jp.event), "%s",
			    sp->pass.event);
			jp.ctx = sp;
			sp->pass.graph = NULL; /* the job's now */
			sp->pass.graph_len = 0;
		} else {
			cwi_log(CACHEW_LOG_WARN, "dispatcher",
			    "event=autocache_unplanned reason=\"%s\"",
			    cwi_errmsg_get());
			srv_pass_free(sp);
			sp = NULL;
		}
	}
	free(graph);
	pthread_mutex_lock(&d->lock);
	now = disp_now(d);
	/* The journal keeps the plan as offered (the job takes it). */
	offered = jp;
	if (jp.ctx != NULL)
		cwi_dispatcher_offer_pass(d->state, &jp);
	(void)cwi_dispatcher_handle(d->state, now, req, rep);
	cwi_dispatcher_offer_pass(d->state, NULL);
	journal_request(d, now, r, req, rep, offered.ctx != NULL ? &offered
								: NULL,
	    who->reencode, lsn);
	ids_reserve(d);
	if (*lsn == 0)
		*lsn = d->last_lsn;
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_unlock(&d->pass_lock);
	if (jp.ctx != NULL) {
		/* Not taken: another client created the job meanwhile. */
		free(jp.graph);
		srv_pass_free(jp.ctx);
	}
}

/* Adds the provisioner's side to a status reply (outside d->lock), and
 * puts the provisioner's own status in *ps (all 0, kind NULL: none). */
static void
status_provisioner(cwi_dispatcher_server *d, cwi_msg_status_reply *st,
    cwi_prov_status *ps)
{
	memset(ps, 0, sizeof(*ps));
	pthread_mutex_lock(&d->prov_lock);
	if (d->prov == NULL) {
		pthread_mutex_unlock(&d->prov_lock);
		return;
	}
	cwi_provisioner_status(d->prov, ps);
	pthread_mutex_unlock(&d->prov_lock);
	ps->last_error[sizeof(ps->last_error) - 1] = '\0';
	if (ps->pool_registered) {
		/* static: what runs is who registered and is not leaving. */
		uint32_t live = 0;
		for (size_t i = 0; i < st->nworkers; i++)
			live += !st->workers[i].draining;
		ps->running = live;
	}
	st->provisioner = cwi_strdup(ps->kind != NULL ? ps->kind : "?");
	st->provisioner_running = ps->running;
	st->provisioner_requests = ps->requests;
	st->provisioner_failures = ps->failures;
	if (ps->last_error[0] != '\0')
		st->provisioner_error = cwi_strdup(ps->last_error);
}

/* Adds the journal's side to a status reply. */
static void
status_journal(cwi_dispatcher_server *d, cwi_msg_status_reply *st)
{
	cwi_journal_stats js;
	char buf[CWI_CFG_STR_MAX + 256];

	if (d->journal == NULL)
		return;
	cwi_journal_stats_get(d->journal, &js);
	snprintf(buf, sizeof(buf), "%s/journal: %s; %llu records (%llu "
	    "durable), snapshot at %llu, %llu fsyncs for %llu records since "
	    "this start",
	    d->cfg.work_dir, js.failed ? "FAILED (see the log)" : "ok",
	    (unsigned long long)(js.next_lsn - 1),
	    (unsigned long long)js.durable_lsn,
	    (unsigned long long)js.snapshot_lsn,
	    (unsigned long long)js.fsyncs,
	    (unsigned long long)js.records_appended);
	st->journal = cwi_strdup(buf);
}

/* Checks the request's token (with --auth-tokens) and replaces whatever
 * identity it came with by the token's name (none without tokens); the
 * token itself is dropped here, before anything could keep it. */
static cachew_err
authorise(cwi_dispatcher_server *d, cwi_pmsg *req, sender *who)
{
	const char *identity = NULL;
	cachew_err rv = CACHEW_OK;

	who->role = CWI_ROLE_ADMIN;
	who->reencode = req->token != NULL || req->identity != NULL;
	free(req->identity);
	req->identity = NULL;
	if (d->tokens != NULL)
		rv = cwi_auth_check(d->tokens, req, &who->role, &identity);
	if (req->token != NULL)
		explicit_bzero(req->token, strlen(req->token));
	free(req->token);
	req->token = NULL;
	if (rv == CACHEW_OK && identity != NULL &&
	    (req->identity = cwi_strdup(identity)) == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	return rv;
}

/* ---- held leases --------------------------------------------------------- */

/*
 * A split_lease that would get nothing but retry_ms (every split of the
 * epoch is leased elsewhere, their acks are not in) is held instead, and
 * handled again as soon as that changes: after every other request (an
 * ack ending the epoch, a release or a heartbeat giving a split back)
 * and every tick (a death), or once its retry_ms is over, at the tick
 * after, when its reply says to ask again at once. The worker used to
 * sleep out retry_ms (20 ms) and ask again, and every job's end through
 * a remote service waited for it: the client waits for its requests that
 * the worker holds until the task ends (22 of the 32 ms a job took,
 * issue 18). The reply is one a worker could always get, only later:
 * the protocol is unchanged. Requests from inproc peers are answered at
 * once: the embedded service's direct tasks are pulled by the consumer
 * itself, which must come back to send the acks they wait for.
 */
#define HELD_LEASES_MAX 4096 /* beyond: answered at once, as before */

typedef struct held_lease {
	cwi_request *r;
	cwi_pmsg req; /* authorised (no token) */
	bool reencode;
	uint64_t until_ns; /* cwi_now_ns */
	uint64_t t0;
} held_lease;

typedef struct held_reply {
	cwi_request *r;
	cwi_pmsg rep;
	uint64_t lsn, t0;
} held_reply;

/* Holds r instead of sending rep when rep is a lease of nothing to ask
 * for again (d->lock held): then it takes req, frees rep and returns
 * true. */
static bool
lease_hold(cwi_dispatcher_server *d, cwi_request *r, cwi_pmsg *req,
    cwi_pmsg *rep, bool reencode, uint64_t t0)
{
	const cwi_msg_split_lease_reply *lr = &rep->u.split_lease_reply;
	held_lease *h;

	if (req->type != CWI_MSG_SPLIT_LEASE ||
	    rep->type != CWI_MSG_SPLIT_LEASE_REPLY || lr->nsplits > 0 ||
	    lr->end_of_splits || lr->retry_ms == 0 ||
	    d->nheld >= HELD_LEASES_MAX || atomic_load(&d->stop) ||
	    strncmp(cwi_request_peer(r), "inproc://", 9) == 0 ||
	    !CWI_GROW(d->held, d->capheld, d->nheld + 1))
		return false;
	h = &d->held[d->nheld++];
	h->r = r;
	h->req = *req;
	h->reencode = reencode;
	h->until_ns = cwi_now_ns() + (uint64_t)lr->retry_ms * 1000000u;
	h->t0 = t0;
	cwi_pmsg_free(rep);
	return true;
}

/* Handles again the held leases that would get something now, and with
 * expire those held their retry_ms (d->lock held). Their replies go to
 * *out (n of them), for held_send once the lock is released. */
static void
held_take(cwi_dispatcher_server *d, uint64_t now, bool expire,
    held_reply **out, size_t *n)
{
	uint64_t mono = cwi_now_ns();

	for (size_t i = 0; i < d->nheld;) {
		held_lease *h = &d->held[i];
		cwi_msg_split_lease_reply *lr;
		held_reply *o;

		if (!(expire && mono >= h->until_ns) &&
		    cwi_dispatcher_lease_waits(d->state, &h->req.u.split_lease)) {
			i++;
			continue;
		}
		o = realloc(*out, (*n + 1) * sizeof(*o));
		if (o == NULL)
			break; /* out of memory: the next call takes them */
		*out = o;
		o = &o[(*n)++];
		o->r = h->r;
		o->t0 = h->t0;
		(void)cwi_dispatcher_handle(d->state, now, &h->req, &o->rep);
		lr = &o->rep.u.split_lease_reply;
		/* It waited its retry_ms here already. */
		if (o->rep.type == CWI_MSG_SPLIT_LEASE_REPLY &&
		    lr->nsplits == 0 && lr->retry_ms > 1)
			lr->retry_ms = 1;
		journal_request(d, now, h->r, &h->req, &o->rep, NULL,
		    h->reencode, &o->lsn);
		if (o->lsn == 0)
			o->lsn = d->last_lsn;
		cwi_pmsg_free(&h->req);
		d->held[i] = d->held[--d->nheld];
	}
}

static void
held_send(cwi_dispatcher_server *d, held_reply *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		reply_after(d, v[i].r, &v[i].rep, v[i].lsn, false, false,
		    CWI_MSG_SPLIT_LEASE, v[i].t0);
	free(v);
}

/*
 * Tests only: CACHEW_TEST_SLOW_LAST_HEARTBEAT=1 makes the dispatcher
 * answer the first client_heartbeat of each job that it answers once the
 * job's data is all acknowledged (the one a client sends for its exact
 * operator rows) only 5 client heartbeat intervals later: past that
 * heartbeat's own timeout (4 intervals), as a dispatcher on a loaded
 * machine may. Later ones go at once. The handler's thread waits (over
 * inproc, the client's), with no lock held. Job ids only grow, so the
 * largest one slowed down says which jobs had theirs.
 */
static void
test_slow_last_heartbeat(cwi_dispatcher_server *d, uint64_t job_id,
    const cwi_msg_client_heartbeat_reply *rep)
{
	uint64_t last;

	if (!rep->job_finished ||
	    getenv("CACHEW_TEST_SLOW_LAST_HEARTBEAT") == NULL)
		return;
	last = atomic_load(&d->test_slowed_job);
	do {
		if (job_id <= last)
			return;
	} while (!atomic_compare_exchange_weak(&d->test_slowed_job, &last,
	    job_id));
	cwi_sleep_ns((uint64_t)rep->heartbeat_interval_ms * 5 * 1000000u);
}

static void
on_request(void *arg, cwi_request *r)
{
	cwi_dispatcher_server *d = arg;
	cwi_pmsg req, rep;
	bool created, finished;
	uint64_t lsn = 0, now, t0 = cwi_now_ns();
	cwi_msg_type type;
	sender who;
	held_reply *ready = NULL;
	size_t nready = 0;
	bool held = false;
	cachew_err rv;

	if (cwi_rpc_unpack(cwi_request_msg(r), cwi_request_peer(r), &req) !=
	    CACHEW_OK) {
		cwi_request_reject(r, cwi_errmsg_get());
		return;
	}
	rv = authorise(d, &req, &who);
	if (rv != CACHEW_OK) {
		cwi_log(CACHEW_LOG_WARN, "dispatcher", "event=refused peer=%s "
		    "reason=\"%s\"", cwi_request_peer(r), cwi_errmsg_get());
		cwi_rpc_reply_error(r, rv, "%s", cwi_errmsg_get());
		cwi_pmsg_free(&req);
		return;
	}
	if (d->dcache != NULL && req.type == CWI_MSG_JOB_GET_OR_CREATE) {
		handle_job_request(d, r, &req, &who, &rep, &lsn);
	} else {
		pthread_mutex_lock(&d->lock);
		now = disp_now(d);
		(void)cwi_dispatcher_handle(d->state, now, &req, &rep);
		if (rep.type == CWI_MSG_STATUS_REPLY &&
		    who.role != CWI_ROLE_ADMIN)
			cwi_dispatcher_status_redact(d->state, req.identity,
			    &rep.u.status_reply);
		journal_request(d, now, r, &req, &rep, NULL, who.reencode,
		    &lsn);
		ids_reserve(d);
		/* A reply with no record (status, a refused request) may
		 * still show what earlier records did (a lazy tick's
		 * timeouts): it waits for them too. */
		if (lsn == 0)
			lsn = d->last_lsn;
		held = lease_hold(d, r, &req, &rep, who.reencode, t0);
		if (!held && d->nheld > 0 && req.type != CWI_MSG_SPLIT_LEASE)
			held_take(d, now, false, &ready, &nready);
		pthread_mutex_unlock(&d->lock);
		held_send(d, ready, nready);
		if (held)
			return; /* lease_hold took req */
	}
	if (rep.type == CWI_MSG_STATUS_REPLY) {
		cwi_prov_status ps;
		status_provisioner(d, &rep.u.status_reply, &ps);
		status_journal(d, &rep.u.status_reply);
	}
	created = rep.type == CWI_MSG_JOB_GET_OR_CREATE_REPLY &&
		  rep.u.job_get_or_create_reply.created;
	finished = rep.type == CWI_MSG_OK && rep.u.ok.job_finished;
	type = req.type;
	if (rep.type == CWI_MSG_CLIENT_HEARTBEAT_REPLY)
		test_slow_last_heartbeat(d, req.u.client_heartbeat.job_id,
		    &rep.u.client_heartbeat_reply);
	cwi_pmsg_free(&req);
	reply_after(d, r, &rep, lsn, created || finished, created, type, t0);
}

/* ---- metrics and health (--metrics-listen) ---------------------------- */

/* /metrics: what `cachew status` shows an admin, as Prometheus text. */
static cachew_err
metrics_render(void *arg, cwi_strbuf *sb)
{
	cwi_dispatcher_server *d = arg;
	cwi_msg_status_reply st;
	cwi_dispatcher_metrics m;
	cwi_prov_status ps;
	cachew_err rv;
	uint64_t t0;

	pthread_mutex_lock(&d->lock);
	t0 = cwi_now_ns();
	rv = cwi_dispatcher_status(d->state, disp_now(d), &st);
	if (rv == CACHEW_OK)
		rv = cwi_dispatcher_metrics_get(d->state, &m);
	else
		memset(&m, 0, sizeof(m));
	cwi_histogram_observe(&d->scrape_lock, cwi_now_ns() - t0);
	pthread_mutex_unlock(&d->lock);
	if (rv == CACHEW_OK) {
		status_provisioner(d, &st, &ps);
		status_journal(d, &st);
		cwi_metrics_dispatcher(sb, &st, &ps);
		cwi_dispatcher_metrics_render(sb, &m, d->latency,
		    &d->scrape_lock);
	}
	cwi_dispatcher_metrics_free(&m);
	cwi_pmsg_body_free(CWI_MSG_STATUS_REPLY, &st);
	return rv;
}

/* Ready once serving: the journal is recovered before the listener
 * opens, and a stop closes it. */
static const char *
metrics_ready(void *arg)
{
	cwi_dispatcher_server *d = arg;

	return atomic_load(&d->serving) && !atomic_load(&d->stop)
		   ? NULL
		   : "not serving: starting or stopping\n";
}

static int
on_http(void *arg, const char *path, char **body, size_t *len,
    const char **type)
{
	cwi_metrics_source src = {metrics_render, metrics_ready, arg};

	return cwi_metrics_reply(path, &src, body, len, type);
}

cachew_err
cwi_dispatcher_server_job_starts(cwi_dispatcher_server *d, uint64_t job_id,
    uint64_t worker_id, cwi_pmsg *out)
{
	cachew_err rv;

	cwi_pmsg_init(out, CWI_MSG_WORKER_HEARTBEAT_REPLY);
	pthread_mutex_lock(&d->lock);
	rv = cwi_dispatcher_job_starts(d->state, job_id, worker_id,
	    &out->u.worker_heartbeat_reply);
	pthread_mutex_unlock(&d->lock);
	return rv;
}

void
cwi_dispatcher_server_set_job_hook(cwi_dispatcher_server *d,
    cwi_dispatcher_job_hook fn, void *arg)
{
	d->job_hook = fn;
	d->job_hook_arg = arg;
}

static void *
ticker_main(void *arg)
{
	cwi_dispatcher_server *d = arg;

	/* From the start: a pause before the first tick counts too. */
	d->last_tick_ns = cwi_now_ns();
	while (!atomic_load(&d->stop)) {
		uint32_t target;

		pthread_mutex_lock(&d->tick_lock);
		if (!atomic_load(&d->stop))
			(void)cwi_cond_wait_ns(&d->tick_cond, &d->tick_lock,
			    (uint64_t)TICK_MS * 1000000u);
		pthread_mutex_unlock(&d->tick_lock);
		if (atomic_load(&d->stop))
			break;
		note_pause(d);
		pthread_mutex_lock(&d->lock);
		uint64_t now = disp_now(d), lsn;
		cwi_dispatcher_tick(d->state, now);
		cwi_dispatcher_sample_jobs(d->state, now);
		journal_add(d, d->journal != NULL ? cwi_jrec_tick(&d->jrec, now)
						  : CACHEW_OK,
		    &lsn, true);
		held_reply *ready = NULL;
		size_t nready = 0;
		if (d->nheld > 0)
			held_take(d, now, true, &ready, &nready);
		target = cwi_dispatcher_pool_target(d->state);
		snapshot_take(d);
		pthread_mutex_unlock(&d->lock);
		held_send(d, ready, nready);
		snapshot_write(d);
		if (d->dcache != NULL) {
			pthread_mutex_lock(&d->pass_lock);
			finish_passes(d);
			pthread_mutex_unlock(&d->pass_lock);
		}
		if (d->prov != NULL &&
		    (!d->prov_sent_any || target != d->prov_sent)) {
			cwi_log(CACHEW_LOG_INFO, "dispatcher",
			    "event=pool_target workers=%u", (unsigned)target);
			(void)cwi_provisioner_set_target(d->prov, target);
			d->prov_sent = target;
			d->prov_sent_any = true;
		}
	}
	return NULL;
}

/* The address workers on this host dial: the bound URL, with a wildcard
 * host replaced by the loopback address. */
static void
local_url(const char *bound, char *out, size_t size)
{
	const char *any = strstr(bound, "://0.0.0.0:");

	if (any != NULL && strncmp(bound, "ipc", 3) != 0)
		snprintf(out, size, "%.*s://127.0.0.1:%s", (int)(any - bound),
		    bound, any + strlen("://0.0.0.0:"));
	else
		snprintf(out, size, "%s", bound);
}

/* The process provisioner's workers speak TLS as their dispatcher does:
 * they listen on tls+tcp and take its TLS options (args gets them). */
static size_t
worker_tls_args(const cwi_service_config *c, const char **args)
{
	static const struct {
		const char *flag;
		size_t off;
	} opts[] = {
	    {"--tls-cert", offsetof(cwi_service_config, tls_cert)},
	    {"--tls-key", offsetof(cwi_service_config, tls_key)},
	    {"--tls-ca", offsetof(cwi_service_config, tls_ca)},
	    {"--tls-client-auth", offsetof(cwi_service_config, tls_client_auth)},
	    {"--tls-server-name", offsetof(cwi_service_config, tls_server_name)},
	};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		const char *v = (const char *)c + opts[i].off;
		if (v[0] == '\0')
			continue;
		args[n++] = opts[i].flag;
		args[n++] = v;
	}
	return n;
}

/* Creates the provisioner the options name, for workers that register
 * with this dispatcher. */
static cachew_err
start_provisioner(cwi_dispatcher_server *d)
{
	const cwi_service_config *c = &d->cfg;
	char url[CWI_CFG_STR_MAX], bin[CWI_CFG_STR_MAX], logs[CWI_CFG_STR_MAX + 16];
	char hb[24], threads[24], capacity[24];
	const char *args[27];
	size_t nargs = 0;
	cwi_prov_config pc;
	cachew_err rv;
	ssize_t n;

	cwi_prov_config_default(&pc);
	pc.kind = c->provisioner[0] != '\0' ? c->provisioner : "static";
	pc.min_workers = (uint32_t)c->min_workers;
	pc.max_workers = (uint32_t)c->max_workers;
	if (strcmp(pc.kind, "process") == 0) {
		local_url(cwi_listener_url(d->listener), url, sizeof(url));
		pc.dispatcher = url;
		if (c->worker_bin[0] != '\0') {
			pc.cachewd = c->worker_bin;
		} else {
			n = readlink("/proc/self/exe", bin, sizeof(bin) - 1);
			if (n <= 0)
				return cwi_fail(CACHEW_EIO, "process provisioner: "
				    "cannot find this binary (/proc/self/exe: "
				    "%s); set --worker-bin", strerror(errno));
			bin[n] = '\0';
			pc.cachewd = bin;
		}
		snprintf(hb, sizeof(hb), "%lld", (long long)c->heartbeat_ms);
		args[nargs++] = "--heartbeat-ms";
		args[nargs++] = hb;
		if (c->worker_threads > 0) {
			snprintf(threads, sizeof(threads), "%lld",
			    (long long)c->worker_threads);
			args[nargs++] = "--threads";
			args[nargs++] = threads;
		}
		/* The workers it starts load the dispatcher's plug-ins. */
		if (c->plugin[0] != '\0') {
			args[nargs++] = "--plugin";
			args[nargs++] = c->plugin;
		}
		/* ... and, with tokens, need one of a worker. */
		if (d->tokens != NULL && c->token_file[0] == '\0')
			return cwi_fail(CACHEW_EINVAL, "process provisioner: "
			    "with --auth-tokens its workers need a worker's "
			    "token: give --token-file FILE");
		if (c->token_file[0] != '\0') {
			args[nargs++] = "--token-file";
			args[nargs++] = c->token_file;
		}
		/* And read and write what the dispatcher's options allow: its
		 * cache root is where their caches go (docs/security.md). */
		if (c->allow_read[0] != '\0') {
			args[nargs++] = "--allow-read";
			args[nargs++] = c->allow_read;
		}
		if (c->cache_root[0] != '\0') {
			args[nargs++] = "--cache-root";
			args[nargs++] = c->cache_root;
		}
		if (c->cache_capacity > 0) {
			snprintf(capacity, sizeof(capacity), "%lld",
			    (long long)c->cache_capacity);
			args[nargs++] = "--cache-capacity";
			args[nargs++] = capacity;
		}
		if (strncmp(url, "tls+tcp://", 10) == 0) {
			pc.worker_listen = "tls+tcp://127.0.0.1:0";
			nargs += worker_tls_args(c, args + nargs);
		}
		args[nargs] = NULL;
		pc.worker_args = args;
		if (c->worker_log_dir[0] != '\0') {
			pc.log_dir = c->worker_log_dir;
		} else if (c->work_dir[0] != '\0') {
			snprintf(logs, sizeof(logs), "%s/workers", c->work_dir);
			pc.log_dir = logs;
		}
		pc.stop_timeout_ms = (uint32_t)c->worker_stop_timeout_ms;
	}
	if (c->k8s_api_url[0] != '\0')
		pc.api_url = c->k8s_api_url;
	if (c->k8s_token_file[0] != '\0')
		pc.token_file = c->k8s_token_file;
	if (c->k8s_ca_file[0] != '\0')
		pc.ca_file = c->k8s_ca_file;
	if (c->k8s_namespace[0] != '\0')
		pc.k8s_namespace = c->k8s_namespace;
	if (c->k8s_deployment[0] != '\0')
		pc.deployment = c->k8s_deployment;
	pthread_mutex_lock(&d->prov_lock);
	rv = cwi_provisioner_create(&d->prov, &pc);
	pthread_mutex_unlock(&d->prov_lock);
	return rv;
}

static cachew_err
open_events(cwi_dispatcher_server *d)
{
	char path[CWI_CFG_STR_MAX + 32];

	if (strcmp(d->cfg.events_log, "-") == 0) {
		d->events = stderr;
		return CACHEW_OK;
	}
	/* Created with its parents, as docs/cachewd.md says. */
	if (d->cfg.work_dir[0] != '\0' &&
	    cwi_cache_mkdirs(d->cfg.work_dir) != CACHEW_OK)
		return cwi_fail(CACHEW_EIO, "work dir %s: %s", d->cfg.work_dir,
		    cwi_errmsg_get());
	if (d->cfg.events_log[0] != '\0')
		snprintf(path, sizeof(path), "%s", d->cfg.events_log);
	else if (d->cfg.work_dir[0] != '\0')
		snprintf(path, sizeof(path), "%s/events.jsonl", d->cfg.work_dir);
	else
		return CACHEW_OK; /* no events kept */
	d->events = fopen(path, "a");
	if (d->events == NULL)
		return cwi_fail(CACHEW_EIO, "events log %s: %s", path,
		    strerror(errno));
	d->events_owned = true;
	return CACHEW_OK;
}

/* Autocaching is on with a cache root; its state persists in the
 * journal (planner_recover). */
static cachew_err
start_autocache(cwi_dispatcher_server *d)
{
	const cwi_service_config *c = &d->cfg;
	cwi_dcache_config dc;
	cachew_err rv;

	if (c->cache_root[0] == '\0')
		return CACHEW_OK;
	memset(&dc, 0, sizeof(dc));
	dc.root = c->cache_root;
	dc.capacity_bytes = (uint64_t)c->cache_capacity;
	dc.policy = c->autocache[0] != '\0' ? c->autocache : "default";
	dc.allow_frozen_random = c->allow_frozen_random != 0;
	dc.default_epochs = (double)c->expected_epochs;
	rv = cwi_dcache_create(&d->dcache, &dc);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "--cache-root %s: %s", c->cache_root,
		    cwi_errmsg_get());
	cwi_log(CACHEW_LOG_INFO, "dispatcher",
	    "event=autocache_on root=%s policy=%s", c->cache_root, dc.policy);
	return CACHEW_OK;
}

/* Loads --auth-tokens, and refuses a listener that anyone on the network
 * reaches without them unless --insecure says so (redis's protected
 * mode). */
static cachew_err
start_auth(cwi_dispatcher_server *d, const char *listen)
{
	cachew_err rv;

	if (d->cfg.auth_tokens[0] != '\0') {
		rv = cwi_auth_tokens_load(&d->tokens, d->cfg.auth_tokens);
		if (rv != CACHEW_OK)
			return cwi_fail(rv, "--auth-tokens: %s",
			    cwi_errmsg_get());
		return CACHEW_OK;
	}
	if (d->cfg.insecure || cwi_auth_listen_is_local(listen))
		return CACHEW_OK;
	return cwi_fail(CACHEW_EPERM, "refusing to listen on %s without "
	    "authentication: anyone who reaches it could read and change "
	    "every job. Give --auth-tokens FILE (docs/security.md), or "
	    "--insecure to run without (only on a trusted network), or "
	    "listen on a loopback address", listen);
}

static cachew_err
random_key(uint8_t key[16])
{
	if (getrandom(key, 16, 0) != 16)
		return cwi_fail(CACHEW_EIO, "getrandom: %s", strerror(errno));
	return CACHEW_OK;
}

/* With tokens, the key of the tasks' data-path secrets: kept in
 * <work_dir>/auth.key (mode 600, made with getrandom at the first start)
 * so that a restart derives the same secrets as before it; random per
 * process without a work dir (whose state dies with it anyway). */
static cachew_err
task_key(cwi_dispatcher_server *d, cwi_dispatcher_config *dc)
{
	char path[CWI_CFG_STR_MAX + 16];
	cachew_err rv;
	ssize_t n;
	int fd;

	if (d->tokens == NULL)
		return CACHEW_OK;
	dc->task_secrets = true;
	if (d->cfg.work_dir[0] == '\0')
		return random_key(dc->task_key);
	snprintf(path, sizeof(path), "%s/auth.key", d->cfg.work_dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, dc->task_key, sizeof(dc->task_key));
		close(fd);
		if (n != (ssize_t)sizeof(dc->task_key))
			return cwi_fail(CACHEW_ECORRUPT, "%s: not a key of %zu "
			    "bytes (removed, a new one is made: the clients of "
			    "running tasks then fail)", path,
			    sizeof(dc->task_key));
		return CACHEW_OK;
	}
	if (errno != ENOENT)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	rv = random_key(dc->task_key);
	if (rv != CACHEW_OK)
		return rv;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return cwi_fail(CACHEW_EIO, "%s: %s", path, strerror(errno));
	n = write(fd, dc->task_key, sizeof(dc->task_key));
	if (n != (ssize_t)sizeof(dc->task_key) || fsync(fd) != 0) {
		close(fd);
		(void)unlink(path);
		return cwi_fail(CACHEW_EIO, "%s: cannot write the key", path);
	}
	close(fd);
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_server_start(cwi_dispatcher_server **out,
    const cwi_service_config *cfg)
{
	cwi_dispatcher_server *d = calloc(1, sizeof(*d));
	cwi_dispatcher_config dc;
	cwi_transport_opts topts;
	cwi_service_user user;
	const char *listen;
	cachew_err rv;

	*out = NULL;
	if (d == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	/* Before the work dir opens, so that its files are the user's. */
	rv = CACHEW_OK;
	if (cfg->user[0] != '\0') {
		rv = cwi_service_user_find(&user, cfg->user);
		if (rv == CACHEW_OK)
			rv = cwi_service_user_become(&user);
	}
	/* Autocaching plans decode graphs, which name their functions. */
	if (rv == CACHEW_OK)
		rv = cwi_service_config_load_plugins(cfg);
	if (rv != CACHEW_OK) {
		free(d);
		return rv;
	}
	d->cfg = *cfg;
	listen = cfg->listen[0] != '\0' ? cfg->listen : "tcp://0.0.0.0:7070";
	atomic_init(&d->stop, false);
	atomic_init(&d->test_slowed_job, 0);
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->prov_lock, NULL);
	pthread_mutex_init(&d->pass_lock, NULL);
	pthread_mutex_init(&d->tick_lock, NULL);
	cwi_cond_init_monotonic(&d->tick_cond);
	pthread_mutex_init(&d->reply_lock, NULL);
	cwi_strbuf_init(&d->jrec);
	rv = start_auth(d, listen);
	if (rv != CACHEW_OK)
		goto fail;
	rv = open_events(d);
	if (rv != CACHEW_OK)
		goto fail;
	rv = start_autocache(d);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_dispatcher_config_default(&dc);
	dc.worker_timeout_ns = (uint64_t)cfg->worker_timeout_ms * 1000000u;
	dc.client_timeout_ns = (uint64_t)cfg->client_timeout_ms * 1000000u;
	dc.worker_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.client_heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	dc.max_lease = (uint32_t)cfg->max_lease;
	dc.event_file = d->events;
	dc.pass_free = srv_pass_free;
	dc.autoscale = cfg->policy_engine;
	rv = cwi_scale_parse(&dc.scale, cfg->scale_policy[0] != '\0'
					    ? cfg->scale_policy : "model");
	if (rv != CACHEW_OK) {
		rv = cwi_fail(rv, "--scale-policy: %s", cwi_errmsg_get());
		goto fail;
	}
	dc.decision_interval_ns = (uint64_t)(cfg->decision_interval_ms > 0
						 ? cfg->decision_interval_ms
						 : cfg->heartbeat_ms) *
	    1000000u;
	dc.scale.window_batches = (uint32_t)cfg->scale_window_batches;
	dc.scale.discard_epoch = (uint32_t)cfg->scale_discard_epoch;
	dc.scale.discard_change = (uint32_t)cfg->scale_discard_change;
	dc.scale.cooldown_ns = (uint64_t)cfg->scale_cooldown_ms * 1000000u;
	dc.min_workers = (uint32_t)cfg->min_workers;
	dc.max_workers = (uint32_t)cfg->max_workers;
	dc.splits_per_worker = (uint32_t)cfg->splits_per_worker;
	if (dc.max_workers > 0)
		dc.scale.max_workers = dc.max_workers;
	rv = task_key(d, &dc);
	if (rv == CACHEW_OK)
		rv = cwi_dispatcher_create(&d->state, &dc);
	explicit_bzero(dc.task_key, sizeof(dc.task_key));
	if (rv != CACHEW_OK)
		goto fail;
	rv = ids_read(d);
	if (rv == CACHEW_OK)
		rv = start_journal(d);
	if (rv == CACHEW_OK)
		rv = planner_recover(d);
	if (rv != CACHEW_OK)
		goto fail;
	/* Without a journal the state starts empty every time. */
	if (d->journal == NULL && d->ids_reserved > 0)
		cwi_dispatcher_ids_from(d->state, d->ids_reserved + 1);
	pthread_mutex_lock(&d->lock);
	ids_reserve(d);
	pthread_mutex_unlock(&d->lock);
	if (atomic_load(&d->journal_failed_said)) {
		rv = cwi_fail(CACHEW_EIO, "the work dir's ids file cannot be "
		    "written (see the log)");
		goto fail;
	}
	cwi_transport_opts_init(&topts);
	/* Control messages only, the largest a dataset_register with its
	 * graph (CWI_PROTO_MAX_GRAPH_SENT). */
	topts.max_msg_size = (size_t)cfg->max_message_bytes <
				     CWI_TRANSPORT_MAX_MSG_CONTROL
				 ? (size_t)cfg->max_message_bytes
				 : CWI_TRANSPORT_MAX_MSG_CONTROL;
	cwi_service_config_tls(&d->cfg, &topts);
	rv = cwi_listen(&d->listener, listen, &topts, on_request, d);
	if (rv != CACHEW_OK)
		goto fail;
	rv = start_provisioner(d);
	if (rv != CACHEW_OK)
		goto fail;
	if (pthread_create(&d->ticker, NULL, ticker_main, d) != 0) {
		rv = cwi_fail(CACHEW_ENOMEM, "dispatcher: cannot start a thread");
		goto fail;
	}
	d->ticker_started = true;
	rv = cwi_metrics_listen(&d->metrics, cfg->metrics_listen, "dispatcher",
	    on_http, d);
	if (rv != CACHEW_OK)
		goto fail;
	atomic_store(&d->serving, true);
	cwi_log(CACHEW_LOG_INFO, "dispatcher", "event=listening url=%s "
	    "scale_policy=%s provisioner=%s", cwi_listener_url(d->listener),
	    cfg->scale_policy, d->cfg.provisioner);
	*out = d;
	return CACHEW_OK;
fail:
	cwi_dispatcher_server_stop(d);
	return rv;
}

const char *
cwi_dispatcher_server_url(const cwi_dispatcher_server *d)
{
	return cwi_listener_url(d->listener);
}

/* At the end of a stop whose journal failed: the replies still waiting
 * are dropped, never sent, since their records may be lost. */
static void
replies_drop(cwi_dispatcher_server *d)
{
	for (size_t i = 0; i < d->nreplies; i++) {
		cwi_request_drop(d->replies[i].r);
		cwi_pmsg_free(&d->replies[i].rep);
	}
	free(d->replies);
	d->replies = NULL;
	d->nreplies = 0;
	/* None is left ready: on_durable returns only once each is taken. */
	assert(d->ready_head == d->nready);
	free(d->ready);
	d->ready = NULL;
}

void
cwi_dispatcher_server_stop(cwi_dispatcher_server *d)
{
	if (d == NULL)
		return;
	/* First: no metrics handler runs on a state being taken down. */
	cwi_http_listener_destroy(d->metrics);
	d->metrics = NULL;
	pthread_mutex_lock(&d->tick_lock);
	atomic_store(&d->stop, true);
	pthread_cond_broadcast(&d->tick_cond);
	pthread_mutex_unlock(&d->tick_lock);
	if (d->ticker_started)
		pthread_join(d->ticker, NULL);
	/* The workers it started drain and deregister while the listener
	 * still answers them. */
	pthread_mutex_lock(&d->prov_lock);
	cwi_provisioner_destroy(d->prov);
	d->prov = NULL;
	pthread_mutex_unlock(&d->prov_lock);
	/* The replies still waiting go out once their records are on disk,
	 * while the listener can still send them (the committer sends them
	 * before the flush returns); later ones are sent by their handlers. */
	if (d->journal != NULL) {
		pthread_mutex_lock(&d->reply_lock);
		d->replies_wait = true;
		pthread_mutex_unlock(&d->reply_lock);
		if (cwi_journal_flush(d->journal) != CACHEW_OK)
			journal_failed(d, "flush");
	}
	if (d->listener != NULL)
		cwi_listener_close(d->listener);
	/* Nobody hears the held leases any more (no handler runs now). */
	for (size_t i = 0; i < d->nheld; i++) {
		cwi_request_drop(d->held[i].r);
		cwi_pmsg_free(&d->held[i].req);
	}
	free(d->held);
	cwi_listener_destroy(d->listener);
	/* A clean stop loses nothing. */
	if (d->journal != NULL && cwi_journal_flush(d->journal) != CACHEW_OK)
		journal_failed(d, "flush");
	cwi_journal_destroy(d->journal);
	if (d->journal != NULL && d->cfg.journal_verify &&
	    atomic_load(&d->serving))
		journal_verify(d);
	free(d->snap);
	cwi_strbuf_free(&d->jrec);
	replies_drop(d);
	cwi_dispatcher_destroy(d->state);
	cwi_dcache_destroy(d->dcache);
	cwi_auth_tokens_destroy(d->tokens);
	if (d->events_owned)
		fclose(d->events);
	pthread_mutex_destroy(&d->lock);
	pthread_mutex_destroy(&d->prov_lock);
	pthread_mutex_destroy(&d->pass_lock);
	pthread_mutex_destroy(&d->tick_lock);
	pthread_cond_destroy(&d->tick_cond);
	pthread_mutex_destroy(&d->reply_lock);
	free(d);
}
