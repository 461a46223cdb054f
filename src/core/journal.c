/*
 * journal.c - the write-ahead journal (journal.h, docs/journal.md).
 *
 * append encodes a record into j->buf under j->mu and signals the
 * committer; the committer swaps the buffer for its spare, fills in the
 * checksums (so the caller's lock never pays for them: about 3 ms for a
 * 32 MiB graph), writes it with one write() and fsyncs once. Records
 * appended while it writes go to the next batch: with N threads waiting,
 * one fsync serves up to N records.
 *
 * A rotation is a mark (LSN, offset in j->buf): the committer writes and
 * fsyncs the bytes before it, creates the next segment (temp name, header,
 * fsync, rename, directory fsync) and writes the rest there. So a segment
 * that has a successor is complete and fsync'd, and only the last segment
 * can end in a torn record.
 *
 * Lock order: the caller's lock, then snap_mu (snapshot_write only), then
 * mu. After open returns, only options.on_durable is called back, by the
 * committer between batches; no callback runs with mu held. The
 * committer alone uses fd and seg_size; the segment list, LSNs, buffers
 * and counters are under mu.
 */
#include "journal.h"
#include "crc32c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SNAPSHOT_NAME "snapshot.cws"
#define LOCK_NAME "journal.lock"
#define SEGMENT_MAGIC "CWJL"
#define SNAPSHOT_MAGIC "CWJS"
#define RECORD_HEADER 16u
/* A spare batch buffer larger than this is freed rather than kept. */
#define SPARE_KEEP (4u << 20)

typedef struct rotation {
	uint64_t lsn; /* the first LSN of the new segment */
	size_t off;   /* where its records start in the batch buffer */
} rotation;

struct cwi_journal {
	char *dir;
	cwi_journal_options opts;
	uint64_t lineage;
	int lock_fd;

	pthread_mutex_t mu;
	pthread_cond_t work;    /* committer: something to write, or stop */
	pthread_cond_t durable; /* waiters: durable_lsn, seg_first or failure */
	pthread_mutex_t snap_mu;
	pthread_t committer;
	bool committer_started;

	/* Under mu. */
	uint8_t *buf; /* encoded records not taken by the committer */
	size_t len, cap;
	uint8_t *spare;
	size_t spare_cap;
	rotation *rot; /* pending rotations, ascending */
	size_t nrot, rot_cap;
	size_t inflight; /* bytes of the batch the committer writes */
	uint64_t next_lsn, durable_lsn;
	uint64_t rot_requested; /* the last rotation asked for (0: none) */
	uint64_t seg_first;     /* first LSN of the segment written to */
	uint64_t *segs;         /* first LSNs of the segments on disk */
	size_t nsegs, segs_cap;
	uint64_t snap_lsn;
	uint64_t since_rot_records, since_rot_bytes;
	bool stopping, hold;
	/* Lazy records (cwi_journal_append_lazy) wait in buf until a record
	 * someone needs comes or LAZY_MAX_NS pass: urgent says one came. */
	bool urgent;
	uint64_t lazy_since; /* when buf got its first lazy record (0) */
	cachew_err failed;
	char failmsg[512];
	cwi_journal_stats st;

	/* The committer's. */
	int fd;
	uint64_t seg_size;
};

/* The longest a lazy record waits in memory for a record that matters. */
#define LAZY_MAX_NS UINT64_C(1000000000)

/* ---- little-endian fields ------------------------------------------------ */

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

static uint64_t
le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void
put32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static bool
all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != 0)
			return false;
	return true;
}

/* ---- reading images ------------------------------------------------------ */

static cachew_err
corrupt(const char *name, size_t off, const char *what)
{
	return cwi_fail(
	    CACHEW_ECORRUPT, "journal: %s at byte %zu: %s", name, off, what);
}

/* The checks both file headers share: the size (at least min bytes),
 * the magic, the header's checksum (its last 4 bytes) and the version. */
static cachew_err
file_header(const char *name, const uint8_t *d, size_t size,
    const char *magic, size_t header, size_t min, const char *kind)
{
	char what[96];

	if (size < min) {
		snprintf(what, sizeof(what),
		    "a file of %zu bytes is shorter than a %s", size, kind);
		return corrupt(name, 0, what);
	}
	if (memcmp(d, magic, 4) != 0) {
		snprintf(what, sizeof(what), "not a journal %s (bad magic)",
		    kind);
		return corrupt(name, 0, what);
	}
	if (cwi_crc32c(0, d, header - 4) != le32(d + header - 4)) {
		snprintf(what, sizeof(what), "bad %s header checksum", kind);
		return corrupt(name, header - 4, what);
	}
	if (le32(d + 4) != CWI_JOURNAL_FORMAT_VERSION)
		return cwi_fail(CACHEW_ENOTSUP,
		    "journal: %s at byte 4: format version %" PRIu32
		    " is not supported (this build reads %u)",
		    name, le32(d + 4), CWI_JOURNAL_FORMAT_VERSION);
	return CACHEW_OK;
}

static cachew_err
segment_header(const char *name, const uint8_t *d, size_t size,
    cwi_journal_segment_scan *out)
{
	cachew_err rv = file_header(name, d, size, SEGMENT_MAGIC,
	    CWI_JOURNAL_SEGMENT_HEADER, CWI_JOURNAL_SEGMENT_HEADER, "segment");

	if (rv != CACHEW_OK)
		return rv;
	out->lineage = le64(d + 8);
	out->first_lsn = le64(d + 16);
	if (out->lineage == 0 || out->first_lsn == 0 || le32(d + 24) != 0)
		return corrupt(name, 8, "lineage or first LSN zero, or "
					"reserved bytes set");
	return CACHEW_OK;
}

/*
 * Verifies the record at off, expected to carry LSN expect. Sets *len for
 * a good record; sets *torn (and returns CACHEW_OK) for what a crash in
 * the middle of a write leaves at the end of a file; else an error.
 */
static cachew_err
record_check(const char *name, const uint8_t *d, size_t size, size_t off,
    uint64_t expect, uint32_t *len, const char **torn)
{
	const uint8_t *p = d + off;
	size_t rem = size - off;
	char what[128];
	uint32_t n;
	uint64_t lsn;

	*torn = NULL;
	if (rem < RECORD_HEADER) {
		*torn = "the file ends inside a record header";
		return CACHEW_OK;
	}
	if (cwi_crc32c(0, p, 12) != le32(p + 12)) {
		if (all_zero(p, rem)) {
			*torn = "zero bytes from a record header to the end";
			return CACHEW_OK;
		}
		return corrupt(name, off, "bad record header checksum");
	}
	n = le32(p);
	lsn = le64(p + 4);
	if (n > CWI_JOURNAL_MAX_RECORD) {
		snprintf(what, sizeof(what),
		    "record length %" PRIu32 " over the limit of %u", n,
		    CWI_JOURNAL_MAX_RECORD);
		return corrupt(name, off, what);
	}
	if (lsn != expect) {
		snprintf(what, sizeof(what),
		    "record LSN %" PRIu64 " out of sequence (expected %" PRIu64
		    ")", lsn, expect);
		return corrupt(name, off, what);
	}
	if (rem - RECORD_HEADER < (size_t)n + 4) {
		*torn = "the file ends inside a record's payload or checksum";
		return CACHEW_OK;
	}
	if (cwi_crc32c(0, p + RECORD_HEADER, n) !=
	    le32(p + RECORD_HEADER + n)) {
		if (rem == (size_t)n + CWI_JOURNAL_RECORD_OVERHEAD) {
			*torn = "the final record's payload checksum is bad";
			return CACHEW_OK;
		}
		snprintf(what, sizeof(what),
		    "bad payload checksum of record LSN %" PRIu64
		    " (%" PRIu32 " bytes) with more data after it", lsn, n);
		return corrupt(name, off, what);
	}
	*len = n;
	return CACHEW_OK;
}

cachew_err
cwi_journal_segment_scan_image(const char *name, const uint8_t *data,
    size_t size, bool last, uint64_t deliver_after,
    cwi_journal_record_fn fn, void *ctx, cwi_journal_segment_scan *out)
{
	size_t off = CWI_JOURNAL_SEGMENT_HEADER;
	uint64_t next;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	rv = segment_header(name, data, size, out);
	if (rv != CACHEW_OK)
		return rv;
	next = out->first_lsn;
	while (off < size) {
		const char *torn;
		uint32_t n = 0;

		rv = record_check(name, data, size, off, next, &n, &torn);
		if (rv != CACHEW_OK)
			return rv;
		if (torn != NULL) {
			if (!last)
				return corrupt(name, off,
				    "a segment followed by another is "
				    "incomplete: "
				    "its last record is cut short");
			out->torn_bytes = size - off;
			snprintf(out->torn_reason, sizeof(out->torn_reason),
			    "%s", torn);
			break;
		}
		if (fn != NULL && next > deliver_after) {
			rv = fn(ctx, next, data + off + RECORD_HEADER, n);
			if (rv != CACHEW_OK)
				return rv;
		}
		off += (size_t)n + CWI_JOURNAL_RECORD_OVERHEAD;
		next++;
		out->records++;
	}
	out->end = off;
	out->next_lsn = next;
	return CACHEW_OK;
}

cachew_err
cwi_journal_snapshot_parse_image(const char *name, const uint8_t *d,
    size_t size, uint64_t *lineage, uint64_t *lsn, const uint8_t **payload,
    size_t *len)
{
	char what[128];
	uint64_t n;

	cachew_err rv = file_header(name, d, size, SNAPSHOT_MAGIC,
	    CWI_JOURNAL_SNAPSHOT_HEADER, CWI_JOURNAL_SNAPSHOT_HEADER + 4,
	    "snapshot");

	if (rv != CACHEW_OK)
		return rv;
	if (le64(d + 8) == 0 || le32(d + 32) != 0)
		return corrupt(name, 8, "lineage zero or reserved bytes set");
	n = le64(d + 24);
	if (n > CWI_JOURNAL_MAX_SNAPSHOT ||
	    n != size - CWI_JOURNAL_SNAPSHOT_HEADER - 4) {
		snprintf(what, sizeof(what),
		    "payload length %" PRIu64 " does not fit the file of %zu "
		    "bytes (or the limit of %llu)", n, size,
		    (unsigned long long)CWI_JOURNAL_MAX_SNAPSHOT);
		return corrupt(name, 24, what);
	}
	if (cwi_crc32c(0, d + CWI_JOURNAL_SNAPSHOT_HEADER, (size_t)n) !=
	    le32(d + CWI_JOURNAL_SNAPSHOT_HEADER + n))
		return corrupt(name, CWI_JOURNAL_SNAPSHOT_HEADER + (size_t)n,
		    "bad snapshot payload checksum");
	*lineage = le64(d + 8);
	*lsn = le64(d + 16);
	*payload = d + CWI_JOURNAL_SNAPSHOT_HEADER;
	*len = (size_t)n;
	return CACHEW_OK;
}

/* ---- files --------------------------------------------------------------- */

static cachew_err
io_fail(const char *path, const char *what, int e)
{
	return cwi_fail(e == ENOMEM ? CACHEW_ENOMEM : CACHEW_EIO,
	    "journal: %s: %s failed: %s", path, what, strerror(e));
}

static char *
path_join(const char *dir, const char *name)
{
	return cwi_asprintf("%s/%s", dir, name);
}

static char *
segment_path(const char *dir, uint64_t first)
{
	return cwi_asprintf("%s/log-%016" PRIx64 ".cwj", dir, first);
}

/* "log-<16 lowercase hex>.cwj" (tmp: with ".tmp" after it). */
static bool
segment_name(const char *name, uint64_t *first, bool *tmp)
{
	size_t n = strlen(name);
	uint64_t v = 0;

	if (strncmp(name, "log-", 4) != 0 || (n != 24 && n != 28) ||
	    strncmp(name + 20, ".cwj", 4) != 0 ||
	    (n == 28 && strcmp(name + 24, ".tmp") != 0))
		return false;
	for (size_t i = 4; i < 20; i++) {
		char c = name[i];
		if (c >= '0' && c <= '9')
			v = v << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v << 4 | (uint64_t)(c - 'a' + 10);
		else
			return false;
	}
	*first = v;
	*tmp = n == 28;
	return true;
}

static cachew_err
fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return io_fail(dir, "open", errno);
	if (fsync(fd) != 0 && errno != EINVAL) {
		int e = errno;
		close(fd);
		return io_fail(dir, "fsync of the directory", e);
	}
	close(fd);
	return CACHEW_OK;
}

/* Creates dir and its missing parents. Each directory created is made
 * durable in its parent (fsync of the parent), so that a new journal's
 * directory does not vanish in a crash after records were acknowledged. */
static cachew_err
mkdir_parents(const char *dir)
{
	char *p = cwi_strdup(dir);
	cachew_err rv = CACHEW_OK;

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	for (char *s = p + 1; rv == CACHEW_OK; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s, *slash;
		*s = '\0';
		if (mkdir(p, 0755) == 0) {
			slash = strrchr(p, '/');
			if (slash == NULL)
				rv = fsync_dir(".");
			else if (slash == p)
				rv = fsync_dir("/");
			else {
				*slash = '\0';
				rv = fsync_dir(p);
				*slash = '/';
			}
		} else if (errno != EEXIST) {
			rv = io_fail(p, "mkdir", errno);
		}
		*s = c;
		if (c == '\0')
			break;
	}
	free(p);
	return rv;
}

static cachew_err
write_all(int fd, const uint8_t *p, size_t n, const char *path)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return io_fail(path, "write", errno);
		if (w == 0)
			return io_fail(path, "write", EIO);
		p += w;
		n -= (size_t)w;
	}
	return CACHEW_OK;
}

/* Writes a whole new file: temp name, data, fsync, rename, directory
 * fsync. With keep_fd the descriptor stays open (for appends) in *fd. */
static cachew_err
write_file_durably(const char *dir, const char *path, const uint8_t *head,
    size_t head_len, const uint8_t *body, size_t body_len,
    const uint8_t *tail, size_t tail_len, int *fd)
{
	char *tmp = cwi_asprintf("%s.tmp", path);
	cachew_err rv;
	int f;

	if (tmp == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	f = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (f < 0) {
		rv = io_fail(tmp, "create", errno);
		free(tmp);
		return rv;
	}
	rv = write_all(f, head, head_len, tmp);
	if (rv == CACHEW_OK)
		rv = write_all(f, body, body_len, tmp);
	if (rv == CACHEW_OK)
		rv = write_all(f, tail, tail_len, tmp);
	if (rv == CACHEW_OK && fsync(f) != 0)
		rv = io_fail(tmp, "fsync", errno);
	if (rv == CACHEW_OK && rename(tmp, path) != 0)
		rv = io_fail(path, "rename", errno);
	if (rv == CACHEW_OK)
		rv = fsync_dir(dir);
	if (rv != CACHEW_OK) {
		close(f);
		unlink(tmp);
		f = -1;
	}
	free(tmp);
	if (fd != NULL && rv == CACHEW_OK)
		*fd = f;
	else if (f >= 0)
		close(f);
	return rv;
}

/* Creates segment first (header only), open for appending in *fd. */
static cachew_err
segment_create(const char *dir, uint64_t lineage, uint64_t first, int *fd)
{
	uint8_t h[CWI_JOURNAL_SEGMENT_HEADER];
	char *path = segment_path(dir, first);
	cachew_err rv;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	memcpy(h, SEGMENT_MAGIC, 4);
	put32(h + 4, CWI_JOURNAL_FORMAT_VERSION);
	put64(h + 8, lineage);
	put64(h + 16, first);
	put32(h + 24, 0);
	put32(h + 28, cwi_crc32c(0, h, 28));
	rv = write_file_durably(dir, path, h, sizeof(h), NULL, 0, NULL, 0, fd);
	free(path);
	return rv;
}

/* A read-only map of a whole file (NULL data for an empty one). */
static cachew_err
map_file(const char *path, const uint8_t **data, size_t *size)
{
	struct stat sb;
	void *m;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	*data = NULL;
	*size = 0;
	if (fd < 0)
		return io_fail(path, "open", errno);
	if (fstat(fd, &sb) != 0) {
		int e = errno;
		close(fd);
		return io_fail(path, "stat", e);
	}
	if (sb.st_size > 0) {
		m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd,
		    0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			return io_fail(path, "mmap", e);
		}
		*data = m;
		*size = (size_t)sb.st_size;
	}
	close(fd);
	return CACHEW_OK;
}

static void
unmap_file(const uint8_t *data, size_t size)
{
	if (data != NULL)
		munmap((void *)(uintptr_t)data, size);
}

static uint64_t
new_lineage(void)
{
	uint64_t x = 0;

	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x))
		x = cwi_mix64(cwi_now_ns() ^ (uint64_t)time(NULL) << 20 ^
		    (uint64_t)getpid());
	return x != 0 ? x : 1;
}

/* ---- the committer ------------------------------------------------------- */

/* Fills in the checksums of the encoded records in b[0, n). */
static void
seal(uint8_t *b, size_t n)
{
	size_t off = 0;

	while (off < n) {
		uint8_t *p = b + off;
		uint32_t len = le32(p);
		put32(p + 12, cwi_crc32c(0, p, 12));
		put32(p + RECORD_HEADER + len,
		    cwi_crc32c(0, p + RECORD_HEADER, len));
		off += (size_t)len + CWI_JOURNAL_RECORD_OVERHEAD;
	}
}

static cachew_err
commit_piece(cwi_journal *j, uint8_t *b, size_t n, uint64_t *fsyncs)
{
	char *path;
	cachew_err rv;

	if (n == 0)
		return CACHEW_OK;
	seal(b, n);
	path = segment_path(j->dir, j->seg_first);
	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	rv = write_all(j->fd, b, n, path);
	if (rv == CACHEW_OK && fsync(j->fd) != 0)
		rv = io_fail(path, "fsync", errno);
	free(path);
	if (rv == CACHEW_OK) {
		j->seg_size += n;
		(*fsyncs)++;
	}
	return rv;
}

static cachew_err
commit_rotation(cwi_journal *j, uint64_t first)
{
	int fd = -1;
	cachew_err rv = segment_create(j->dir, j->lineage, first, &fd);

	if (rv != CACHEW_OK)
		return rv;
	pthread_mutex_lock(&j->mu);
	if (!CWI_GROW(j->segs, j->segs_cap, j->nsegs + 1)) {
		pthread_mutex_unlock(&j->mu);
		close(fd);
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	}
	j->segs[j->nsegs++] = first;
	close(j->fd);
	j->fd = fd;
	j->seg_size = CWI_JOURNAL_SEGMENT_HEADER;
	j->seg_first = first;
	j->st.rotations++;
	pthread_cond_broadcast(&j->durable);
	pthread_mutex_unlock(&j->mu);
	return CACHEW_OK;
}

/* Writes one batch: the pieces between rotation marks, each fsync'd, then
 * the next segment. */
static cachew_err
commit_batch(cwi_journal *j, uint8_t *b, size_t n, const rotation *rot,
    size_t nrot, uint64_t *fsyncs)
{
	size_t off = 0;
	cachew_err rv;

	for (size_t i = 0; i <= nrot; i++) {
		size_t end = i < nrot ? rot[i].off : n;
		rv = commit_piece(j, b + off, end - off, fsyncs);
		if (rv != CACHEW_OK)
			return rv;
		off = end;
		if (i < nrot) {
			rv = commit_rotation(j, rot[i].lsn);
			if (rv != CACHEW_OK)
				return rv;
		}
	}
	return CACHEW_OK;
}

static void
fail_locked(cwi_journal *j, cachew_err rv)
{
	j->failed = rv;
	snprintf(j->failmsg, sizeof(j->failmsg), "%s", cwi_errmsg_get());
	j->st.failed = true;
	cwi_log(CACHEW_LOG_ERROR, "journal", "%s (the journal is failed)",
	    j->failmsg);
}

static void *
committer_main(void *arg)
{
	cwi_journal *j = arg;
	rotation *rot = NULL;
	size_t rot_cap = 0;
	cachew_err failed;

	pthread_mutex_lock(&j->mu);
	for (;;) {
		bool work = j->len > 0 || j->nrot > 0;
		uint8_t *b;
		size_t n, bcap, nrot;
		uint64_t last, fsyncs = 0;
		cachew_err rv = CACHEW_OK;

		if (j->failed != CACHEW_OK || (!work && j->stopping))
			break;
		if (!work || (j->hold && !j->stopping)) {
			pthread_cond_wait(&j->work, &j->mu);
			continue;
		}
		/* Only lazy records: they go when one that matters comes, at
		 * a stop, or LAZY_MAX_NS after the first of them. */
		if (!j->urgent && j->nrot == 0 && !j->stopping) {
			uint64_t now = cwi_now_ns();
			if (now < j->lazy_since + LAZY_MAX_NS) {
				cwi_cond_wait_ns(&j->work, &j->mu,
				    j->lazy_since + LAZY_MAX_NS - now);
				continue;
			}
		}
		j->urgent = false;
		j->lazy_since = 0;
		/* Take the batch; appends go on into the spare. */
		b = j->buf;
		n = j->len;
		bcap = j->cap;
		j->buf = j->spare;
		j->cap = j->spare_cap;
		j->len = 0;
		j->spare = NULL;
		j->spare_cap = 0;
		nrot = j->nrot;
		if (nrot > 0 && !CWI_GROW(rot, rot_cap, nrot))
			rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
		else if (nrot > 0)
			memcpy(rot, j->rot, nrot * sizeof(*rot));
		j->nrot = 0;
		j->inflight = n;
		last = j->next_lsn - 1;
		pthread_mutex_unlock(&j->mu);

		if (rv == CACHEW_OK)
			rv = commit_batch(j, b, n, rot, nrot, &fsyncs);
		/* Before the waiters: once flush returns, what the callback
		 * answers for the records it waited for has gone out. */
		if (rv == CACHEW_OK && j->opts.on_durable != NULL)
			j->opts.on_durable(j->opts.on_durable_ctx, last,
			    CACHEW_OK);

		pthread_mutex_lock(&j->mu);
		j->inflight = 0;
		/* The spare was taken with the batch: this buffer (its
		 * contents written) becomes the next spare unless huge. */
		if (bcap <= SPARE_KEEP) {
			j->spare = b;
			j->spare_cap = bcap;
		} else {
			free(b);
		}
		j->st.fsyncs += fsyncs;
		j->st.batches++;
		if (rv != CACHEW_OK)
			fail_locked(j, rv);
		else
			j->durable_lsn = last;
		pthread_cond_broadcast(&j->durable);
	}
	pthread_cond_broadcast(&j->durable);
	failed = j->failed;
	pthread_mutex_unlock(&j->mu);
	free(rot);
	/* failmsg is only written by this thread, once. */
	if (failed != CACHEW_OK && j->opts.on_durable != NULL) {
		(void)cwi_fail(failed, "%s", j->failmsg);
		j->opts.on_durable(j->opts.on_durable_ctx, 0, failed);
	}
	return NULL;
}

/* ---- writer API ---------------------------------------------------------- */

void
cwi_journal_options_init(cwi_journal_options *o)
{
	memset(o, 0, sizeof(*o));
	o->snapshot_records = 100000;
	o->snapshot_bytes = 64u << 20;
	o->max_buffered = 64u << 20;
}

static cachew_err
failed_locked(cwi_journal *j)
{
	return cwi_fail(j->failed, "%s", j->failmsg);
}

static cachew_err append(cwi_journal *j, const void *payload, size_t len,
    uint64_t *lsn, bool lazy);

cachew_err
cwi_journal_append(
    cwi_journal *j, const void *payload, size_t len, uint64_t *lsn)
{
	return append(j, payload, len, lsn, false);
}

cachew_err
cwi_journal_append_lazy(
    cwi_journal *j, const void *payload, size_t len, uint64_t *lsn)
{
	return append(j, payload, len, lsn, true);
}

static cachew_err
append(cwi_journal *j, const void *payload, size_t len, uint64_t *lsn,
    bool lazy)
{
	size_t rec = len + CWI_JOURNAL_RECORD_OVERHEAD;
	cachew_err rv = CACHEW_OK;
	uint8_t *p;

	if (len > CWI_JOURNAL_MAX_RECORD)
		return cwi_fail(CACHEW_ERANGE,
		    "journal: a record of %zu bytes is over the limit of %u",
		    len, CWI_JOURNAL_MAX_RECORD);
	pthread_mutex_lock(&j->mu);
	if (j->failed != CACHEW_OK) {
		rv = failed_locked(j);
		goto out;
	}
	if (j->len + j->inflight > 0 &&
	    j->len + j->inflight + rec > j->opts.max_buffered) {
		rv = cwi_fail(CACHEW_ENOMEM,
		    "journal: %zu bytes already wait for the disk in %s "
		    "(limit %zu): the disk is far behind",
		    j->len + j->inflight, j->dir, j->opts.max_buffered);
		goto out;
	}
	if (!CWI_GROW(j->buf, j->cap, j->len + rec)) {
		rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
		goto out;
	}
	p = j->buf + j->len;
	put32(p, (uint32_t)len);
	put64(p + 4, j->next_lsn);
	if (len > 0)
		memcpy(p + RECORD_HEADER, payload, len);
	/* The checksums at p + 12 and after the payload are the
	 * committer's to fill in. */
	j->len += rec;
	*lsn = j->next_lsn++;
	j->since_rot_records++;
	j->since_rot_bytes += len;
	j->st.records_appended++;
	j->st.bytes_appended += len;
	if (!lazy) {
		j->urgent = true;
		pthread_cond_signal(&j->work);
	} else if (j->lazy_since == 0) {
		j->lazy_since = cwi_now_ns();
		pthread_cond_signal(&j->work); /* starts its timer */
	}
out:
	pthread_mutex_unlock(&j->mu);
	return rv;
}

/* Waits until durable_lsn >= lsn and the segment written to starts at or
 * after seg (0: no condition on it). */
static cachew_err
wait_locked(cwi_journal *j, uint64_t lsn, uint64_t seg, uint64_t timeout_ns)
{
	uint64_t deadline = timeout_ns == UINT64_MAX
	    ? UINT64_MAX
	    : cwi_now_ns() + timeout_ns;

	for (;;) {
		uint64_t now;
		if (j->durable_lsn >= lsn && j->seg_first >= seg)
			return CACHEW_OK;
		if (j->failed != CACHEW_OK)
			return failed_locked(j);
		/* Someone needs it: lazy records before it go now. */
		if (!j->urgent && j->len > 0) {
			j->urgent = true;
			pthread_cond_signal(&j->work);
		}
		if (deadline == UINT64_MAX) {
			pthread_cond_wait(&j->durable, &j->mu);
			continue;
		}
		now = cwi_now_ns();
		if (now >= deadline)
			return cwi_fail(CACHEW_ETIMEDOUT,
			    "journal: LSN %" PRIu64 " not durable in %s "
			    "after %" PRIu64 " ms (durable up to %" PRIu64 ")",
			    lsn, j->dir, timeout_ns / 1000000, j->durable_lsn);
		cwi_cond_wait_ns(&j->durable, &j->mu, deadline - now);
	}
}

cachew_err
cwi_journal_wait_durable(cwi_journal *j, uint64_t lsn, uint64_t timeout_ns)
{
	cachew_err rv;

	pthread_mutex_lock(&j->mu);
	if (lsn >= j->next_lsn)
		rv = cwi_fail(CACHEW_EINVAL,
		    "journal: LSN %" PRIu64 " was not appended (next is %" PRIu64
		    ")", lsn, j->next_lsn);
	else
		rv = wait_locked(j, lsn, 0, timeout_ns);
	pthread_mutex_unlock(&j->mu);
	return rv;
}

void
cwi_journal_urge(cwi_journal *j, uint64_t lsn)
{
	pthread_mutex_lock(&j->mu);
	/* A record not durable is in buf or in the batch being written;
	 * only buf's wait for a reason to go. */
	if (j->failed == CACHEW_OK && lsn > j->durable_lsn && !j->urgent &&
	    j->len > 0) {
		j->urgent = true;
		pthread_cond_signal(&j->work);
	}
	pthread_mutex_unlock(&j->mu);
}

cachew_err
cwi_journal_flush(cwi_journal *j)
{
	cachew_err rv;

	pthread_mutex_lock(&j->mu);
	if (j->failed != CACHEW_OK)
		rv = failed_locked(j);
	else
		rv = wait_locked(
		    j, j->next_lsn - 1, j->rot_requested, UINT64_MAX);
	pthread_mutex_unlock(&j->mu);
	return rv;
}

uint64_t
cwi_journal_durable_lsn(cwi_journal *j)
{
	uint64_t v;

	pthread_mutex_lock(&j->mu);
	v = j->durable_lsn;
	pthread_mutex_unlock(&j->mu);
	return v;
}

bool
cwi_journal_snapshot_due(cwi_journal *j)
{
	bool due;

	pthread_mutex_lock(&j->mu);
	due = (j->opts.snapshot_records > 0 &&
		  j->since_rot_records >= j->opts.snapshot_records) ||
	    (j->opts.snapshot_bytes > 0 &&
		j->since_rot_bytes >= j->opts.snapshot_bytes);
	pthread_mutex_unlock(&j->mu);
	return due;
}

cachew_err
cwi_journal_rotate(cwi_journal *j)
{
	cachew_err rv = CACHEW_OK;

	pthread_mutex_lock(&j->mu);
	if (j->failed != CACHEW_OK) {
		rv = failed_locked(j);
	} else if (j->next_lsn == j->seg_first ||
	    j->next_lsn == j->rot_requested) {
		/* The segment records after L go to is already new. */
	} else if (!CWI_GROW(j->rot, j->rot_cap, j->nrot + 1)) {
		rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	} else {
		j->rot[j->nrot].lsn = j->next_lsn;
		j->rot[j->nrot].off = j->len;
		j->nrot++;
		j->rot_requested = j->next_lsn;
		j->since_rot_records = 0;
		j->since_rot_bytes = 0;
		pthread_cond_signal(&j->work);
	}
	pthread_mutex_unlock(&j->mu);
	return rv;
}

void
cwi_journal_stats_get(cwi_journal *j, cwi_journal_stats *st)
{
	pthread_mutex_lock(&j->mu);
	*st = j->st;
	st->lineage = j->lineage;
	st->next_lsn = j->next_lsn;
	st->durable_lsn = j->durable_lsn;
	st->snapshot_lsn = j->snap_lsn;
	st->buffered = j->len + j->inflight;
	pthread_mutex_unlock(&j->mu);
}

void
cwi_journal_test_hold(cwi_journal *j, bool hold)
{
	pthread_mutex_lock(&j->mu);
	j->hold = hold;
	pthread_cond_signal(&j->work);
	pthread_mutex_unlock(&j->mu);
}

/* ---- snapshots ----------------------------------------------------------- */

/* Deletes the segments whose records are all <= lsn (each followed by a
 * segment starting at or before lsn + 1). Best effort: a segment left
 * behind is skipped by its LSNs at the next open. */
static void
truncate_segments(cwi_journal *j, uint64_t lsn)
{
	uint64_t *gone = NULL;
	size_t ngone = 0, keep = 0;

	pthread_mutex_lock(&j->mu);
	while (keep + 1 < j->nsegs && j->segs[keep + 1] <= lsn + 1)
		keep++;
	if (keep > 0) {
		gone = malloc(keep * sizeof(*gone));
		if (gone != NULL) {
			memcpy(gone, j->segs, keep * sizeof(*gone));
			memmove(j->segs, j->segs + keep,
			    (j->nsegs - keep) * sizeof(*j->segs));
			j->nsegs -= keep;
			ngone = keep;
		}
	}
	pthread_mutex_unlock(&j->mu);
	for (size_t i = 0; i < ngone; i++) {
		char *path = segment_path(j->dir, gone[i]);
		if (path != NULL && unlink(path) != 0 && errno != ENOENT)
			cwi_log(CACHEW_LOG_WARN, "journal",
			    "%s: could not delete a segment the snapshot "
			    "covers: %s", path, strerror(errno));
		free(path);
	}
	if (ngone > 0 && fsync_dir(j->dir) != CACHEW_OK)
		cwi_log(CACHEW_LOG_WARN, "journal", "%s", cwi_errmsg_get());
	free(gone);
}

static cachew_err
snapshot_store(cwi_journal *j, const void *payload, size_t len, uint64_t lsn)
{
	uint8_t h[CWI_JOURNAL_SNAPSHOT_HEADER], t[4];
	char *path = path_join(j->dir, SNAPSHOT_NAME);
	cachew_err rv;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	memcpy(h, SNAPSHOT_MAGIC, 4);
	put32(h + 4, CWI_JOURNAL_FORMAT_VERSION);
	put64(h + 8, j->lineage);
	put64(h + 16, lsn);
	put64(h + 24, len);
	put32(h + 32, 0);
	put32(h + 36, cwi_crc32c(0, h, 36));
	put32(t, cwi_crc32c(0, payload, len));
	rv = write_file_durably(
	    j->dir, path, h, sizeof(h), payload, len, t, sizeof(t), NULL);
	free(path);
	return rv;
}

cachew_err
cwi_journal_snapshot_write(
    cwi_journal *j, const void *payload, size_t len, uint64_t lsn)
{
	cachew_err rv;

	if ((uint64_t)len > CWI_JOURNAL_MAX_SNAPSHOT)
		return cwi_fail(CACHEW_ERANGE,
		    "journal: a snapshot of %zu bytes is over the limit of "
		    "%llu", len, (unsigned long long)CWI_JOURNAL_MAX_SNAPSHOT);
	pthread_mutex_lock(&j->snap_mu);
	pthread_mutex_lock(&j->mu);
	if (lsn >= j->next_lsn || lsn < j->snap_lsn)
		rv = cwi_fail(CACHEW_EINVAL,
		    "journal: a snapshot at LSN %" PRIu64 " is outside [%" PRIu64
		    ", %" PRIu64 "] (the last snapshot, the last appended)",
		    lsn, j->snap_lsn, j->next_lsn - 1);
	else if (j->failed != CACHEW_OK)
		rv = failed_locked(j);
	else
		rv = wait_locked(j, lsn,
		    j->rot_requested < lsn + 1 ? j->rot_requested : lsn + 1,
		    UINT64_MAX);
	pthread_mutex_unlock(&j->mu);
	if (rv == CACHEW_OK)
		rv = snapshot_store(j, payload, len, lsn);
	if (rv == CACHEW_OK) {
		pthread_mutex_lock(&j->mu);
		j->snap_lsn = lsn;
		j->st.snapshots++;
		pthread_mutex_unlock(&j->mu);
		truncate_segments(j, lsn);
	}
	pthread_mutex_unlock(&j->snap_mu);
	return rv;
}

/* ---- open and recovery --------------------------------------------------- */

typedef struct dir_listing {
	bool has_snapshot;
	uint64_t *segs; /* first LSNs, ascending */
	size_t nsegs, segs_cap;
	char **leftovers; /* temp files of interrupted writes */
	size_t nleft, left_cap;
} dir_listing;

static void
listing_free(dir_listing *l)
{
	free(l->segs);
	for (size_t i = 0; i < l->nleft; i++)
		free(l->leftovers[i]);
	free(l->leftovers);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* A file the journal owns: its snapshot, segments and their temp names. */
static bool
journal_file(const char *name, bool *snapshot, bool *tmp, uint64_t *first)
{
	*first = 0;
	*snapshot = strcmp(name, SNAPSHOT_NAME) == 0;
	*tmp = strcmp(name, SNAPSHOT_NAME ".tmp") == 0;
	return *snapshot || *tmp || segment_name(name, first, tmp);
}

static cachew_err
list_dir(const char *dir, dir_listing *l)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	cachew_err rv = CACHEW_OK;

	if (d == NULL)
		return io_fail(dir, "opendir", errno);
	while (rv == CACHEW_OK && (e = readdir(d)) != NULL) {
		bool snap, tmp;
		uint64_t first;
		if (!journal_file(e->d_name, &snap, &tmp, &first))
			continue;
		if (snap) {
			l->has_snapshot = true;
		} else if (tmp) {
			char *s = cwi_strdup(e->d_name);
			if (s == NULL ||
			    !CWI_GROW(l->leftovers, l->left_cap, l->nleft + 1)) {
				free(s);
				rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
			} else {
				l->leftovers[l->nleft++] = s;
			}
		} else if (!CWI_GROW(l->segs, l->segs_cap, l->nsegs + 1)) {
			rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
		} else {
			l->segs[l->nsegs++] = first;
		}
	}
	closedir(d);
	if (l->nsegs > 1)
		qsort(l->segs, l->nsegs, sizeof(*l->segs), cmp_u64);
	return rv;
}

/* Renames every journal file to "<name>.discarded-<unix time>[-k]". */
static cachew_err
discard_files(const char *dir, uint64_t *count)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	long long now = (long long)time(NULL);
	DIR *d = opendir(dir);
	struct dirent *e;
	cachew_err rv = CACHEW_OK;

	if (d == NULL)
		return io_fail(dir, "opendir", errno);
	while (rv == CACHEW_OK && (e = readdir(d)) != NULL) {
		bool snap, tmp;
		uint64_t first;
		char *s;
		if (!journal_file(e->d_name, &snap, &tmp, &first))
			continue;
		s = path_join(dir, e->d_name);
		if (s == NULL || !CWI_GROW(names, cap, n + 1)) {
			free(s);
			rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
		} else {
			names[n++] = s;
		}
	}
	closedir(d);
	for (size_t i = 0; i < n && rv == CACHEW_OK; i++) {
		char *to = NULL;
		for (int k = 1; rv == CACHEW_OK; k++) {
			free(to);
			to = k == 1 ? cwi_asprintf("%s.discarded-%lld", names[i],
					  now)
				    : cwi_asprintf("%s.discarded-%lld-%d",
					  names[i], now, k);
			if (to == NULL)
				rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
			else if (access(to, F_OK) != 0)
				break;
		}
		if (rv == CACHEW_OK && rename(names[i], to) != 0)
			rv = io_fail(names[i], "rename aside", errno);
		if (rv == CACHEW_OK) {
			cwi_log(CACHEW_LOG_WARN, "journal",
			    "discarded: %s moved aside to %s", names[i], to);
			(*count)++;
		}
		free(to);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rv == CACHEW_OK && n > 0)
		rv = fsync_dir(dir);
	return rv;
}

typedef struct replay {
	const cwi_journal_callbacks *cb;
	uint64_t records, bytes;
} replay;

static cachew_err
replay_record(void *ctx, uint64_t lsn, const void *payload, size_t len)
{
	replay *r = ctx;

	r->records++;
	r->bytes += len;
	if (r->cb == NULL || r->cb->on_record == NULL)
		return CACHEW_OK;
	return r->cb->on_record(r->cb->ctx, lsn, payload, len);
}

static cachew_err
recover_snapshot(const char *dir, const cwi_journal_callbacks *cb,
    uint64_t *lineage, uint64_t *lsn)
{
	char *path = path_join(dir, SNAPSHOT_NAME);
	const uint8_t *data = NULL, *payload;
	size_t size = 0, len;
	cachew_err rv;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	rv = map_file(path, &data, &size);
	if (rv == CACHEW_OK)
		rv = cwi_journal_snapshot_parse_image(
		    path, data, size, lineage, lsn, &payload, &len);
	if (rv == CACHEW_OK && cb != NULL && cb->on_snapshot != NULL)
		rv = cb->on_snapshot(cb->ctx, payload, len, *lsn);
	unmap_file(data, size);
	free(path);
	return rv;
}

/* The state a recovery hands to the writer. */
typedef struct recovered {
	uint64_t snap_lsn;
	size_t live;      /* index of the first segment not all <= snap_lsn */
	size_t end;       /* verified bytes of the last segment */
	size_t torn;      /* bytes after them to cut */
	char torn_reason[96];
	uint64_t next_lsn;
} recovered;

/* The header of segment i, checked against its name and the lineage
 * (taken from it when *lineage is 0). */
static cachew_err
check_segment_header(const char *path, const uint8_t *data, size_t size,
    uint64_t first, uint64_t *lineage)
{
	cwi_journal_segment_scan h;
	char what[160];
	cachew_err rv = segment_header(path, data, size, &h);

	if (rv != CACHEW_OK)
		return rv;
	if (h.first_lsn != first) {
		snprintf(what, sizeof(what),
		    "the header's first LSN %" PRIu64
		    " differs from the file name's", h.first_lsn);
		return corrupt(path, 16, what);
	}
	if (*lineage == 0)
		*lineage = h.lineage;
	if (h.lineage != *lineage) {
		snprintf(what, sizeof(what),
		    "lineage %016" PRIx64 " differs from the journal's %016" PRIx64
		    " (a file of another journal)", h.lineage, *lineage);
		return corrupt(path, 8, what);
	}
	return CACHEW_OK;
}

static cachew_err
recover_segment(cwi_journal *j, const dir_listing *l, size_t i,
    recovered *rc, replay *rp, cwi_journal_recovery *rec)
{
	bool last = i + 1 == l->nsegs;
	char *path = segment_path(j->dir, l->segs[i]);
	const uint8_t *data = NULL;
	size_t size = 0;
	cwi_journal_segment_scan sc;
	char what[200];
	cachew_err rv;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	rv = map_file(path, &data, &size);
	if (rv == CACHEW_OK)
		rv = check_segment_header(
		    path, data, size, l->segs[i], &j->lineage);
	if (rv != CACHEW_OK || i < rc->live)
		goto out; /* a stale segment: its header is enough */
	rv = cwi_journal_segment_scan_image(path, data, size, last,
	    rc->snap_lsn, replay_record, rp, &sc);
	if (rv != CACHEW_OK)
		goto out;
	rec->segments_read++;
	if (!last && sc.next_lsn != l->segs[i + 1]) {
		snprintf(what, sizeof(what),
		    "the segment ends before LSN %" PRIu64
		    " but the next one starts at LSN %" PRIu64, sc.next_lsn,
		    l->segs[i + 1]);
		rv = corrupt(path, sc.end, what);
	} else if (last && sc.next_lsn <= rc->snap_lsn) {
		snprintf(what, sizeof(what),
		    "the log ends before LSN %" PRIu64
		    " but the snapshot covers up to LSN %" PRIu64,
		    sc.next_lsn, rc->snap_lsn);
		rv = corrupt(path, sc.end, what);
	} else if (last) {
		rc->end = sc.end;
		rc->torn = sc.torn_bytes;
		memcpy(rc->torn_reason, sc.torn_reason, sizeof(rc->torn_reason));
		rc->next_lsn = sc.next_lsn;
	}
out:
	unmap_file(data, size);
	free(path);
	return rv;
}

static cachew_err
recover(cwi_journal *j, const dir_listing *l, const cwi_journal_callbacks *cb,
    recovered *rc, cwi_journal_recovery *rec)
{
	replay rp = {.cb = cb, .records = 0};
	char what[200];
	char *path;
	cachew_err rv = CACHEW_OK;

	if (l->has_snapshot) {
		rv = recover_snapshot(j->dir, cb, &j->lineage, &rc->snap_lsn);
		if (rv != CACHEW_OK)
			return rv;
		rec->had_snapshot = true;
		rec->snapshot_lsn = rc->snap_lsn;
	}
	if (l->nsegs == 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "journal: %s/%s is present but no log segment is (the log "
		    "after it is lost)", j->dir, SNAPSHOT_NAME);
	/* The first segment to read: the last one starting by snap + 1. */
	rc->live = l->nsegs;
	for (size_t i = 0; i < l->nsegs; i++)
		if (l->segs[i] <= rc->snap_lsn + 1)
			rc->live = i;
	if (rc->live == l->nsegs) {
		path = segment_path(j->dir, l->segs[0]);
		if (l->has_snapshot)
			snprintf(what, sizeof(what),
			    "the oldest segment starts at LSN %" PRIu64
			    " but the snapshot covers only up to LSN %" PRIu64
			    " (records are missing)", l->segs[0],
			    rc->snap_lsn);
		else
			snprintf(what, sizeof(what),
			    "the oldest segment starts at LSN %" PRIu64
			    " but there is no snapshot (records from LSN 1 "
			    "are missing)", l->segs[0]);
		rv = path != NULL ? corrupt(path, 16, what)
				  : cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
		free(path);
		return rv;
	}
	for (size_t i = 0; i < l->nsegs && rv == CACHEW_OK; i++)
		rv = recover_segment(j, l, i, rc, &rp, rec);
	rec->records_replayed = rp.records;
	/* They count towards the next snapshot: a dispatcher that dies
	 * before appending a threshold's worth would otherwise replay an
	 * ever longer tail at each restart. */
	j->since_rot_records = rp.records;
	j->since_rot_bytes = rp.bytes;
	return rv;
}

/* After a successful recovery: cut the torn tail, remove what the
 * snapshot covers and the temp files, open the last segment for appends. */
static cachew_err
finish_recovery(cwi_journal *j, const dir_listing *l, const recovered *rc,
    cwi_journal_recovery *rec)
{
	uint64_t last = l->segs[l->nsegs - 1];
	char *path = segment_path(j->dir, last);
	cachew_err rv = CACHEW_OK;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	j->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (j->fd < 0)
		rv = io_fail(path, "open for appending", errno);
	if (rv == CACHEW_OK && rc->torn > 0) {
		cwi_log(CACHEW_LOG_WARN, "journal",
		    "%s: dropped a torn final record at byte %zu (%zu bytes "
		    "cut: %s)", path, rc->end, rc->torn, rc->torn_reason);
		if (ftruncate(j->fd, (off_t)rc->end) != 0)
			rv = io_fail(path, "truncate of the torn tail", errno);
		else if (fsync(j->fd) != 0)
			rv = io_fail(path, "fsync", errno);
		rec->torn_bytes = rc->torn;
	}
	free(path);
	for (size_t i = 0; i < rc->live && rv == CACHEW_OK; i++) {
		path = segment_path(j->dir, l->segs[i]);
		if (path != NULL && unlink(path) == 0)
			rec->stale_segments_removed++;
		free(path);
	}
	j->seg_size = rc->end;
	j->seg_first = last;
	j->next_lsn = rc->next_lsn;
	j->durable_lsn = rc->next_lsn - 1;
	j->snap_lsn = rc->snap_lsn;
	rec->last_lsn = rc->next_lsn - 1;
	if (rv == CACHEW_OK &&
	    !CWI_GROW(j->segs, j->segs_cap, l->nsegs - rc->live))
		rv = cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	if (rv == CACHEW_OK) {
		j->nsegs = l->nsegs - rc->live;
		memcpy(j->segs, l->segs + rc->live, j->nsegs * sizeof(*j->segs));
	}
	return rv;
}

static cachew_err
create_journal(cwi_journal *j, cwi_journal_recovery *rec)
{
	cachew_err rv;

	j->lineage = new_lineage();
	rv = segment_create(j->dir, j->lineage, 1, &j->fd);
	if (rv != CACHEW_OK)
		return rv;
	if (!CWI_GROW(j->segs, j->segs_cap, 1))
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	j->segs[0] = 1;
	j->nsegs = 1;
	j->seg_first = 1;
	j->seg_size = CWI_JOURNAL_SEGMENT_HEADER;
	j->next_lsn = 1;
	rec->created = true;
	return CACHEW_OK;
}

static cachew_err
remove_leftovers(const char *dir, const dir_listing *l)
{
	for (size_t i = 0; i < l->nleft; i++) {
		char *path = path_join(dir, l->leftovers[i]);
		if (path != NULL && unlink(path) == 0)
			cwi_log(CACHEW_LOG_INFO, "journal",
			    "%s: removed the temp file of an interrupted write",
			    path);
		free(path);
	}
	return fsync_dir(dir);
}

static cachew_err
lock_dir(cwi_journal *j)
{
	char *path = path_join(j->dir, LOCK_NAME);
	cachew_err rv = CACHEW_OK;

	if (path == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	j->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (j->lock_fd < 0)
		rv = io_fail(path, "open", errno);
	else if (flock(j->lock_fd, LOCK_EX | LOCK_NB) != 0)
		rv = errno == EWOULDBLOCK
		    ? cwi_fail(CACHEW_EEXIST,
			  "journal: %s is in use by another open journal", j->dir)
		    : io_fail(path, "flock", errno);
	free(path);
	return rv;
}

static void
journal_free(cwi_journal *j)
{
	if (j->fd >= 0)
		close(j->fd);
	if (j->lock_fd >= 0)
		close(j->lock_fd);
	pthread_mutex_destroy(&j->mu);
	pthread_mutex_destroy(&j->snap_mu);
	pthread_cond_destroy(&j->work);
	pthread_cond_destroy(&j->durable);
	free(j->buf);
	free(j->spare);
	free(j->rot);
	free(j->segs);
	free(j->dir);
	free(j);
}

static cwi_journal *
journal_alloc(const char *dir, const cwi_journal_options *opts)
{
	cwi_journal *j = calloc(1, sizeof(*j));

	if (j == NULL)
		return NULL;
	j->dir = cwi_strdup(dir);
	if (j->dir == NULL) {
		free(j);
		return NULL;
	}
	if (opts != NULL)
		j->opts = *opts;
	else
		cwi_journal_options_init(&j->opts);
	j->fd = -1;
	j->lock_fd = -1;
	pthread_mutex_init(&j->mu, NULL);
	pthread_mutex_init(&j->snap_mu, NULL);
	cwi_cond_init_monotonic(&j->work);
	cwi_cond_init_monotonic(&j->durable);
	return j;
}

static cachew_err
open_files(cwi_journal *j, const cwi_journal_callbacks *cb,
    cwi_journal_recovery *rec)
{
	dir_listing l = {0};
	recovered rc = {0};
	cachew_err rv = mkdir_parents(j->dir);

	if (rv == CACHEW_OK)
		rv = lock_dir(j);
	if (rv == CACHEW_OK && j->opts.discard)
		rv = discard_files(j->dir, &rec->files_discarded);
	if (rv == CACHEW_OK)
		rv = list_dir(j->dir, &l);
	if (rv == CACHEW_OK && !l.has_snapshot && l.nsegs == 0) {
		rv = remove_leftovers(j->dir, &l);
		if (rv == CACHEW_OK)
			rv = create_journal(j, rec);
	} else if (rv == CACHEW_OK) {
		rv = recover(j, &l, cb, &rc, rec);
		/* Nothing on disk changes unless all of it verified. */
		if (rv == CACHEW_OK)
			rv = finish_recovery(j, &l, &rc, rec);
		if (rv == CACHEW_OK)
			rv = remove_leftovers(j->dir, &l);
	}
	listing_free(&l);
	return rv;
}

cachew_err
cwi_journal_open(cwi_journal **out, const char *dir,
    const cwi_journal_options *opts, const cwi_journal_callbacks *cb,
    cwi_journal_recovery *rec)
{
	cwi_journal_recovery r = {0};
	uint64_t t0 = cwi_now_ns();
	cwi_journal *j;
	cachew_err rv;

	*out = NULL;
	if (dir == NULL || *dir == '\0')
		return cwi_fail(CACHEW_EINVAL, "journal: no directory given");
	j = journal_alloc(dir, opts);
	if (j == NULL)
		return cwi_fail(CACHEW_ENOMEM, "journal: out of memory");
	rv = open_files(j, cb, &r);
	if (rv == CACHEW_OK && pthread_create(&j->committer, NULL,
				   committer_main, j) != 0)
		rv = cwi_fail(CACHEW_ENOMEM,
		    "journal: cannot start the committer thread");
	if (rv != CACHEW_OK) {
		journal_free(j);
		return rv;
	}
	j->committer_started = true;
	r.lineage = j->lineage;
	r.duration_ns = cwi_now_ns() - t0;
	if (rec != NULL)
		*rec = r;
	*out = j;
	return CACHEW_OK;
}

void
cwi_journal_destroy(cwi_journal *j)
{
	if (j == NULL)
		return;
	if (j->committer_started) {
		pthread_mutex_lock(&j->mu);
		j->stopping = true;
		pthread_cond_signal(&j->work);
		pthread_mutex_unlock(&j->mu);
		pthread_join(j->committer, NULL);
	}
	journal_free(j);
}
