/*
 * journal.h - a write-ahead journal in a directory: a snapshot file and
 * log segments of opaque records, with group commit, snapshots that
 * truncate the log, and recovery that tells a torn tail from corruption.
 * docs/journal.md gives the format byte by byte and the crash analysis.
 *
 * Use:
 *   cwi_journal_open(&j, dir, &opts, &callbacks, &recovery);
 *       on_snapshot(snapshot), then on_record() for each later record
 *   cwi_journal_append(j, bytes, len, &lsn);     (under the caller's lock)
 *   cwi_journal_wait_durable(j, lsn, timeout);  (after dropping it)
 *   if (cwi_journal_snapshot_due(j)) {
 *       serialise the state as of the last appended LSN L;
 *       cwi_journal_rotate(j);                  (still under the lock)
 *       cwi_journal_snapshot_write(j, state, len, L);  (any thread)
 *   }
 *   cwi_journal_flush(j); cwi_journal_destroy(j);
 *
 * Threads: one committer thread per journal writes and fsyncs what
 * append buffered, one write() and one fsync() per batch. append,
 * rotate and snapshot_due take only the journal's internal mutex for a
 * copy into memory: they never do I/O or wait for the disk, so the
 * caller may hold its own lock around them (lock order: caller's lock,
 * then the journal's). The journal calls back into the caller during
 * open, and on the committer thread through options.on_durable (with no
 * journal lock held). Every other call is safe from any thread;
 * destroy joins the committer and must not race with other calls.
 */
#ifndef CWI_JOURNAL_H
#define CWI_JOURNAL_H

#include "core.h"

/* The largest record payload (the dispatcher's largest message is a
 * 32 MiB graph) and the largest snapshot payload. Longer appends are
 * CACHEW_ERANGE; longer lengths in a file are corruption. */
#define CWI_JOURNAL_MAX_RECORD (64u << 20)
#define CWI_JOURNAL_MAX_SNAPSHOT (4ull << 30)

/* On-disk sizes (docs/journal.md). */
#define CWI_JOURNAL_SEGMENT_HEADER 32u
#define CWI_JOURNAL_RECORD_OVERHEAD 20u /* len, lsn, header crc, crc */
#define CWI_JOURNAL_SNAPSHOT_HEADER 40u
#define CWI_JOURNAL_FORMAT_VERSION 1u

typedef struct cwi_journal cwi_journal;

typedef struct cwi_journal_options {
	/* cwi_journal_snapshot_due() turns true after this many records or
	 * payload bytes have been appended since the last rotation (0: never
	 * for that measure). Defaults 100000 records, 64 MiB. */
	uint64_t snapshot_records;
	uint64_t snapshot_bytes;
	/* Bytes append may hold that the committer has not yet written
	 * (64 MiB). An append past it fails with CACHEW_ENOMEM: the disk is
	 * far behind. */
	size_t max_buffered;
	/* Start empty: the directory's journal files are renamed to
	 * "<name>.discarded-<unix time>" (never deleted) and a new lineage
	 * begins. No callback runs. */
	bool discard;
	/* Called by the committer thread after each batch it wrote and
	 * fsync'd, with the highest LSN now durable (rv CACHEW_OK), before
	 * any waiter learns it; once, with the failure (rv and this thread's
	 * errmsg), when the journal fails. No journal lock is held: it may
	 * call any journal function but destroy. NULL: none. It lets the
	 * caller answer what waited for those records on the thread that
	 * made them durable, without a thread of its own to wake (W9). */
	void (*on_durable)(void *ctx, uint64_t durable_lsn, cachew_err rv);
	void *on_durable_ctx;
} cwi_journal_options;

/* Fills o with the defaults. */
void cwi_journal_options_init(cwi_journal_options *o);

/* What open delivers. Payloads are borrowed: valid only during the call.
 * A callback's error other than CACHEW_OK aborts the open, which returns
 * it (the callback's errmsg stays). Either callback may be NULL. */
typedef struct cwi_journal_callbacks {
	cachew_err (*on_snapshot)(
	    void *ctx, const void *payload, size_t len, uint64_t lsn);
	cachew_err (*on_record)(
	    void *ctx, uint64_t lsn, const void *payload, size_t len);
	void *ctx;
} cwi_journal_callbacks;

/* What open found and did, for the caller's log. */
typedef struct cwi_journal_recovery {
	uint64_t lineage;          /* the journal's 64-bit id (nonzero) */
	bool created;              /* a new lineage (empty dir or discard) */
	bool had_snapshot;
	uint64_t snapshot_lsn;     /* 0 without a snapshot */
	uint64_t records_replayed; /* on_record calls */
	uint64_t last_lsn;         /* the last LSN recovered (0: none) */
	uint64_t segments_read;
	uint64_t stale_segments_removed; /* fully covered by the snapshot */
	uint64_t torn_bytes;       /* dropped from the last segment's tail */
	uint64_t files_discarded;  /* renamed aside by options.discard */
	uint64_t duration_ns;
} cwi_journal_recovery;

/*
 * Opens (creating it and its parents if missing) the journal in dir,
 * recovers it and starts its committer: on_snapshot with the snapshot,
 * if any, then on_record for every record after it in LSN order; the
 * next append gets last_lsn + 1. A torn final record is dropped with a
 * warning and cut from the file. The directory is locked (flock) while
 * the journal is open. rec (may be NULL) receives the summary. opts NULL
 * means the defaults.
 *
 * Errors: CACHEW_ECORRUPT for a corrupt file, record or sequence (the
 * errmsg names the file, the byte offset and what was wrong; nothing on
 * disk is changed), CACHEW_ENOTSUP for a newer format version, CACHEW_EEXIST
 * when another open journal holds the directory, CACHEW_EIO and
 * CACHEW_ENOMEM, or a callback's error. *out is NULL on failure.
 */
cachew_err cwi_journal_open(cwi_journal **out, const char *dir,
    const cwi_journal_options *opts, const cwi_journal_callbacks *cb,
    cwi_journal_recovery *rec);

/* Lets the committer write what is buffered (best effort: flush first to
 * know), joins it, closes the files and frees j. NULL is a no-op. */
void cwi_journal_destroy(cwi_journal *j);

/* Copies a record of len bytes (0 allowed) into the journal's buffer and
 * gives it the next LSN in *lsn; the committer makes it durable soon.
 * No I/O. CACHEW_ERANGE for len over CWI_JOURNAL_MAX_RECORD, CACHEW_ENOMEM
 * when options.max_buffered bytes already wait for the disk or memory
 * runs out, or the journal's failure (below). */
cachew_err cwi_journal_append(
    cwi_journal *j, const void *payload, size_t len, uint64_t *lsn);

/* The same for a record nobody waits for (the dispatcher's ticks): it is
 * written with the next record appended with cwi_journal_append, at a
 * wait or flush, or 1 s after it at the latest, so an idle writer costs
 * no fsync per record. Losing it in a crash loses only what no reply
 * depended on. */
cachew_err cwi_journal_append_lazy(
    cwi_journal *j, const void *payload, size_t len, uint64_t *lsn);

/* Blocks until the record lsn is written and fsync'd, at most timeout_ns
 * (UINT64_MAX: no limit). CACHEW_OK once it is durable (also when the
 * journal failed later), CACHEW_ETIMEDOUT, CACHEW_EINVAL for an LSN not
 * appended yet, or the journal's failure.
 *
 * Failure: once a write, fsync or segment creation fails, the journal is
 * failed for good (after a failed fsync the kernel's page state is not
 * trustworthy): every later append, rotate, flush, snapshot_write and
 * every wait for a record not yet durable returns that error (CACHEW_EIO
 * naming the file and the system's reason). Records already durable stay
 * so; reopening recovers them. */
cachew_err cwi_journal_wait_durable(
    cwi_journal *j, uint64_t lsn, uint64_t timeout_ns);

/* Asks for the record lsn to be made durable now even when it is a lazy
 * one (cwi_journal_append_lazy), without waiting: what wait_durable does
 * first, for a caller that learns of durability from on_durable. No I/O;
 * a no-op for a durable or failed record. */
void cwi_journal_urge(cwi_journal *j, uint64_t lsn);

/* Writes and fsyncs everything appended so far (and performs pending
 * rotations): a clean stop calls it before destroy. */
cachew_err cwi_journal_flush(cwi_journal *j);

/* The highest LSN known durable (the stats give the next LSN too). */
uint64_t cwi_journal_durable_lsn(cwi_journal *j);

/* True when options' snapshot thresholds are reached since the last
 * rotation. No I/O. */
bool cwi_journal_snapshot_due(cwi_journal *j);

/* Makes records appended from now on (LSN > L, the last appended) go to a
 * new segment, so that a snapshot at L lets every older segment go. Call
 * it under the caller's lock right after serialising the state as of L,
 * then cwi_journal_snapshot_write(..., L). No I/O (the committer creates
 * the segment); a rotation at the LSN of the current segment's start is a
 * no-op. Errors: the journal's failure. */
cachew_err cwi_journal_rotate(cwi_journal *j);

/* Writes payload as the snapshot of the state after every record up to
 * lsn (durably: temp file, fsync, rename, directory fsync), then deletes
 * the segments that hold only records <= lsn. Waits first until lsn is
 * durable and a rotation requested up to lsn is on disk. Any thread, no
 * caller lock needed; snapshots are serialised. The payload stays the
 * caller's. Errors: CACHEW_EINVAL for lsn beyond the last appended or
 * below the last snapshot, CACHEW_ERANGE for len over
 * CWI_JOURNAL_MAX_SNAPSHOT, CACHEW_EIO naming the file (the journal stays
 * usable: the older snapshot and the segments still recover), or the
 * journal's failure. */
cachew_err cwi_journal_snapshot_write(
    cwi_journal *j, const void *payload, size_t len, uint64_t lsn);

typedef struct cwi_journal_stats {
	uint64_t lineage;
	uint64_t next_lsn;
	uint64_t durable_lsn;
	uint64_t snapshot_lsn;
	uint64_t records_appended; /* since open */
	uint64_t bytes_appended;   /* payload bytes since open */
	uint64_t batches;          /* committer writes of a batch */
	uint64_t fsyncs;           /* fsync of segment data */
	uint64_t rotations;        /* segments created since open */
	uint64_t snapshots;        /* snapshots written since open */
	size_t buffered;           /* bytes waiting for the committer */
	bool failed;
} cwi_journal_stats;

/* A consistent copy of the journal's counters and LSNs. Any thread. */
void cwi_journal_stats_get(cwi_journal *j, cwi_journal_stats *st);

/* ---- internals for tests and the fuzzer --------------------------------- */

/* While hold is true the committer starts no new batch (a batch in
 * flight finishes): tests use it to make group commit deterministic. */
void cwi_journal_test_hold(cwi_journal *j, bool hold);

typedef cachew_err (*cwi_journal_record_fn)(
    void *ctx, uint64_t lsn, const void *payload, size_t len);

/* What a scan of one segment image found. */
typedef struct cwi_journal_segment_scan {
	uint64_t lineage;
	uint64_t first_lsn;
	uint64_t next_lsn;   /* after the last verified record */
	uint64_t records;    /* verified records */
	size_t end;          /* offset after the last verified record */
	size_t torn_bytes;   /* size - end when a torn tail was dropped */
	char torn_reason[96];
} cwi_journal_segment_scan;

/* Verifies the segment image data[0, size) named name (for messages):
 * header, then records in order, calling fn (may be NULL) for each
 * verified record with an LSN > deliver_after. A torn tail is accepted
 * only when last (the segment being appended to when the writer
 * stopped); elsewhere it is corruption. CACHEW_ECORRUPT or
 * CACHEW_ENOTSUP with a message naming name and the offset, or fn's
 * error. Reads nothing outside data. */
cachew_err cwi_journal_segment_scan_image(const char *name,
    const uint8_t *data, size_t size, bool last, uint64_t deliver_after,
    cwi_journal_record_fn fn, void *ctx, cwi_journal_segment_scan *out);

/* Verifies the snapshot image data[0, size) named name; on success
 * *payload points into data. Errors as for the segment scan. */
cachew_err cwi_journal_snapshot_parse_image(const char *name,
    const uint8_t *data, size_t size, uint64_t *lineage, uint64_t *lsn,
    const uint8_t **payload, size_t *len);

#endif /* CWI_JOURNAL_H */
