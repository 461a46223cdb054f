/*
 * cache.h - the cache store: verified, persistent materialisations of a
 * pipeline node's output, reusable across jobs (docs/cache-format.md).
 *
 * A cache lives in <root>/<fingerprint hex>/ where root is a local or
 * shared-file-system directory or s3://bucket/prefix. Writers produce chunk
 * files (header + records of msgpack elements, each a zstd frame or stored
 * as they are when they do not compress) under temporary names,
 * fsync and rename them, then write the manifest last by atomic rename:
 * without a manifest a cache does not exist. Readers verify everything they
 * read (record checksums, chunk sizes and checksums from the manifest, the
 * element spec) and report a mismatch naming the file; a bad cache is
 * marked bad and never read again.
 *
 * Thread safety: a cwi_cache_root is safe to share between threads; a
 * writer and a chunk reader are used by one thread at a time (the writer
 * runs its own encoder threads behind cwi_cache_writer_add()).
 */
#ifndef CWI_CACHE_H
#define CWI_CACHE_H

#include "../core/element_codec.h"
#include "../exec/exec.h"

/* The manifest's format version (docs/cache-format.md, section 5). Chunk
 * files have their own (cache_int.h, CWI_CHUNK_VERSION). */
#define CWI_CACHE_FORMAT_VERSION 1u

/* Defaults; the cache_put/cache operators expose them as parameters. */
#define CWI_CACHE_CHUNK_BYTES (64u << 20)  /* target chunk file size */
#define CWI_CACHE_FRAME_BYTES (1u << 20)   /* target uncompressed frame */
/* Decoder limits: a length field above these is corruption, never an
 * allocation. */
#define CWI_CACHE_MAX_FRAME_BYTES (256u << 20)
#define CWI_CACHE_MAX_MANIFEST_BYTES (64u << 20)

/* ---- roots ---------------------------------------------------------------- */

typedef struct cwi_cache_root cwi_cache_root;

/* Opens a cache root: a directory (created if missing) or s3://bucket/prefix.
 * capacity_bytes > 0 limits the sum of all caches under the root: a write
 * that would exceed it evicts least-recently-read complete caches first
 * and fails with CACHEW_ENOMEM naming the root when that is not enough. */
cachew_err cwi_cache_root_open(
    cwi_cache_root **out, const char *root, uint64_t capacity_bytes);
void cwi_cache_root_close(cwi_cache_root *r);
const char *cwi_cache_root_path(const cwi_cache_root *r);

/* ---- manifests ------------------------------------------------------------ */

typedef struct cwi_cache_spec {
	cachew_dtype dtype;
	unsigned rank;         /* -1 in shape[d]: that dimension varies */
	int64_t shape[CACHEW_MAX_RANK];
} cwi_cache_spec;

typedef struct cwi_cache_chunk_info {
	char *name;        /* file name inside the cache directory */
	uint64_t elements;
	uint64_t bytes;    /* file size */
	/* XXH64 (seed 0) of the whole file (chunk format 1), or of its
	 * skeleton: header, record headers and trailer, whose record headers
	 * carry their payloads' hashes (format 2). */
	uint64_t xxh64;
	/* What the chunk's header says: the id of the writer that wrote it
	 * and its index in that writer's output. A cache written by one
	 * writer has writer_id == the manifest's cache_id and index == the
	 * chunk's position; a cache assembled from parts
	 * (cwi_cache_parts_commit) keeps each part writer's. */
	uint64_t writer_id;
	uint32_t index;
} cwi_cache_chunk_info;

typedef struct cwi_cache_manifest {
	cachew_fingerprint fp;
	char *pipeline;         /* canonical string of the cached node */
	uint32_t writer_version; /* CACHEW_VERSION_NUMBER of the writer */
	uint64_t cache_id;      /* random per write; also in every chunk
				 * header, so a reader notices a cache that
				 * was replaced under it */
	int64_t created_unix;   /* seconds since the epoch */
	uint64_t elements;      /* sum over chunks */
	uint64_t bytes;         /* sum of chunk file sizes */
	size_t ncomponents;     /* 0 for an empty cache */
	cwi_cache_spec *spec;
	/* The components' names (one reference, ncomponents entries, each
	 * may be NULL), or NULL when none is named: what the dataset's spec
	 * named when the cache was written. Kept apart from spec, which is
	 * copied by value, so that the table is shared, never copied: the
	 * elements read from the cache take references to it. */
	cwi_names *names;
	size_t nchunks;
	cwi_cache_chunk_info *chunks;
	/* Part files only (cwi_cache_parts_commit): the split units of the
	 * source whose elements the part holds, in the order read. */
	cwi_unit_range *units;
	size_t nunits;
} cwi_cache_manifest;

void cwi_cache_manifest_free(cwi_cache_manifest *m);
/* Parses 32 hex digits (cachew_fingerprint_hex's form) into *out;
 * CACHEW_EINVAL naming the text otherwise. */
cachew_err cwi_cache_fp_parse(const char *hex, cachew_fingerprint *out);
/* The manifest's file bytes (msgpack; docs/cache-format.md). */
cachew_err cwi_cache_manifest_encode(const cwi_cache_manifest *m,
    cwi_strbuf *sb);
/* Decodes and checks a manifest (fuzzed: never trusts a count or length
 * before checking it against len and the limits). CACHEW_ECORRUPT with a
 * cwi_fail message on any defect. */
cachew_err cwi_cache_manifest_decode(
    const void *data, size_t len, cwi_cache_manifest **out);

/* Finds the complete cache of fp: CACHEW_OK with *out, CACHEW_ENOENT when
 * there is none (no manifest, or marked bad), CACHEW_ECORRUPT when the
 * manifest is damaged (the cache is then marked bad). */
cachew_err cwi_cache_lookup(cwi_cache_root *r, const cachew_fingerprint *fp,
    cwi_cache_manifest **out);

/* The manifest of fp under the root path `root`, read for a pipeline being
 * built: unlike cwi_cache_lookup it has no side effect (no directory is
 * created, a damaged manifest is not marked bad: the run that reads the
 * cache reports it as before) and a remote read makes one attempt with
 * short timeouts (CWI_CACHE_PEEK_*), so that building never waits long
 * on slow storage. Local files must be regular (a FIFO never blocks it).
 * CACHEW_ENOENT when there is no manifest or the cache is marked bad;
 * CACHEW_ECORRUPT, CACHEW_EIO, CACHEW_EINVAL, CACHEW_ETIMEDOUT otherwise,
 * with a message; the caller treats all of them as "not known". */
#define CWI_CACHE_PEEK_CONNECT_MS 2000
#define CWI_CACHE_PEEK_STALL_SECS 5
cachew_err cwi_cache_peek(const char *root, const cachew_fingerprint *fp,
    cwi_cache_manifest **out);

/* Marks a cache bad (reason recorded, logged at WARN): lookups no longer
 * find it, gc and rm remove it, a writer may replace it. */
cachew_err cwi_cache_mark_bad(cwi_cache_root *r, const cachew_fingerprint *fp,
    const char *reason);

/* ---- writing -------------------------------------------------------------- */

typedef struct cwi_cache_writer cwi_cache_writer;

typedef struct cwi_cache_writer_opts {
	uint64_t chunk_bytes;  /* 0: CWI_CACHE_CHUNK_BYTES */
	size_t frame_bytes;    /* 0: CWI_CACHE_FRAME_BYTES */
	int zstd_level;        /* 0: auto (level -1, or 1 for data that
				* compresses; docs/cache-format.md) */
	int threads;           /* encoder/writer threads; 0: 2 */
	size_t queue_bytes;    /* memory bound of queued elements; 0: 4 frames
				* per thread */
	/* Part writing (a lease of a distributed write, docs/cache-format.md
	 * "Caches written in parts"): non-zero part_write_id makes the writer
	 * one of many writing the cache together. It shares the cache's lock
	 * with the others, leaves their files alone, and its commit writes a
	 * part file listing its chunks and the source units it covered
	 * (part_units, copied) instead of the manifest; nothing is visible to
	 * readers until cwi_cache_parts_commit. */
	uint64_t part_write_id;
	const cwi_unit_range *part_units;
	size_t npart_units;
	/* The names of the elements' components for the manifest (the
	 * dataset's spec's), or NULL: borrowed, the writer takes its own
	 * reference. Their count must be the elements' component count
	 * (else the commit fails with CACHEW_ETYPE). */
	cwi_names *names;
	/* The chunk format to write: 0 for the current one (2); 1 writes the
	 * previous format, so tests can check that old caches still read. */
	uint32_t chunk_version;
} cwi_cache_writer_opts;

/* Starts writing the cache of fp. CACHEW_EEXIST when a complete cache of
 * fp exists or another writer holds it (the caller then just passes data
 * through). */
cachew_err cwi_cache_writer_create(cwi_cache_writer **out, cwi_cache_root *r,
    const cachew_fingerprint *fp, const char *pipeline,
    const cwi_cache_writer_opts *opts);
/* Queues n elements for writing, taking a new reference on each (the
 * caller keeps its own); payloads are never copied before encoding.
 * Blocks while the queue is over its memory bound. CACHEW_ETYPE when an
 * element's component count, a dtype or a rank differs from the first
 * element's; CACHEW_ENOMEM when the root's capacity cannot hold the cache
 * even after evicting others; CACHEW_EIO on a write failure. Encoding
 * runs behind the call, so an error may surface on a later add or on
 * commit. An error is sticky. */
cachew_err cwi_cache_writer_add(cwi_cache_writer *w, cwi_element *const *v,
    size_t n);
/* Writes what is queued, fsyncs and renames every chunk, then the manifest,
 * and fsyncs the directory: the cache becomes visible. */
cachew_err cwi_cache_writer_commit(cwi_cache_writer *w);
/* Destroys a writer; one that was not committed is aborted: its temporary
 * files are removed and nothing becomes visible. */
void cwi_cache_writer_destroy(cwi_cache_writer *w);

/*
 * Completes a cache written in parts: reads the part files of write_id,
 * picks parts that cover the source units [0, units_total) exactly once
 * (in order of their first unit; a part that overlaps one already picked,
 * as a replayed lease writes, is skipped), checks that their element specs
 * agree, and writes the manifest listing their chunks in that order. Part
 * files and chunks of write_id that were not picked are removed. The
 * cache's element count goes to *elements (may be NULL).
 * CACHEW_ENOENT naming the first uncovered unit when the parts do not
 * cover every unit (nothing is written; the parts stay for a later try),
 * CACHEW_EEXIST when the cache is already complete, CACHEW_ETYPE when two
 * parts' specs disagree, CACHEW_ECORRUPT for a damaged part file,
 * CACHEW_EIO, CACHEW_ENOMEM.
 */
cachew_err cwi_cache_parts_commit(cwi_cache_root *r,
    const cachew_fingerprint *fp, const char *pipeline, uint64_t write_id,
    uint64_t units_total, uint64_t *elements);

/* Removes every part file and chunk of write_id (a distributed write that
 * was given up). CACHEW_OK when there were none. */
cachew_err cwi_cache_parts_abort(cwi_cache_root *r,
    const cachew_fingerprint *fp, uint64_t write_id);

/* ---- reading -------------------------------------------------------------- */

typedef struct cwi_cache_reader cwi_cache_reader;

/* Opens chunk `index` of a manifest (found by cwi_cache_lookup on r) for
 * reading. `willneed`: whether the reader asks the kernel for the next
 * window of a local file ahead of its reads (POSIX_FADV_WILLNEED). A reader
 * whose records several threads load at once passes false: their
 * concurrent preads, with the kernel's own readahead of a file read in
 * order (POSIX_FADV_SEQUENTIAL), kept a cold disk busier than windows
 * asked for on the claiming thread, whose pages the kernel's readahead
 * then no longer tracks (W4's cold read at 2 threads: 1,806 MB/s without,
 * 1,349 with, `cat` 1,862; docs/cache.md); a single loader passes true
 * (without, its rate swung 630-1,730 MB/s between runs, as `cat`'s does). Reading verifies the file against the manifest. While a reader
 * is open the cache holds a shared lock, so gc and rm leave it alone.
 * CACHEW_ENOENT when the cache was removed or replaced since the lookup
 * (not a defect: look it up again); CACHEW_ECORRUPT (the cache is then
 * already marked bad) when the chunk is missing or its header is bad. */
cachew_err cwi_cache_reader_open(cwi_cache_reader **out, cwi_cache_root *r,
    const cwi_cache_manifest *m, size_t index, bool willneed);
/* Appends up to max elements in written order; CACHEW_EOF after the last
 * one; CACHEW_ECORRUPT naming the file on any mismatch (a bad frame, a
 * short file, more or fewer elements than the manifest says, an element
 * that does not match the spec). Elements are zero-copy views of the
 * record's buffer: the bytes read (a stored record) or the decompressed
 * frame. No element of a damaged record is ever appended: a record is
 * verified (its XXH3 or zstd checksum, size, every element decoded and
 * checked against the spec) before any of its elements is handed out;
 * the file's size and XXH64 (of the whole file, or of its skeleton) are
 * checked after the last record. On
 * CACHEW_ECORRUPT the reader has already marked the cache bad. Errors
 * are sticky. */
cachew_err cwi_cache_reader_next(cwi_cache_reader *rd, cwi_chunk *out,
    size_t max);

/* A record claimed from a reader, to be loaded by any thread. */
typedef struct cwi_cache_rec_job {
	uint64_t at;         /* the record header's byte offset in the chunk */
	uint64_t payload_at; /* its payload's */
	uint64_t hash;       /* the payload's XXH3, from the header */
	uint32_t clen, ulen, nelem;
	uint32_t record;     /* its index in the chunk */
	/* Decoded and verified by the claim already (a zstd record, format 1,
	 * a remote file), or NULL: the load reads the stored payload. Owned
	 * by the job until loaded or discarded. */
	cwi_element **els;
	/* A stored payload of a local file whose pages were not in the page
	 * cache, read by the claim (in file order; not yet hashed), or NULL.
	 * Owned by the job until loaded or discarded. */
	cwi_buffer *payload;
} cwi_cache_rec_job;

/* Claims the next record of a chunk so that several threads can read one
 * chunk: the claim walks the chunk's skeleton (it reads the record header
 * after the claimed payload, hashes it into the skeleton's XXH64 and
 * advances), and cwi_cache_reader_load() then reads, verifies and decodes
 * the payload, on any thread. A stored record of a local file is left to
 * the load, but for its bytes when they are not in the page cache and
 * several threads load (the claim reads them, job->payload, so that the
 * disk sees one stream in file order); any other record is read and
 * verified by the claim itself (job->els). Returns CACHEW_OK with *job filled, CACHEW_EOF after the
 * trailer was verified (counts, size, the manifest's XXH64), or an error
 * as cwi_cache_reader_next() (sticky; ECORRUPT marks the cache bad).
 * Claims are made one at a time (the caller serialises them) and not
 * mixed with cwi_cache_reader_next() on one reader; the reader must stay
 * open until every load of its claims returned. */
cachew_err cwi_cache_reader_claim(cwi_cache_reader *rd,
    cwi_cache_rec_job *job);
/* Loads a claimed record: its job->nelem elements into out[] (room for
 * them), all verified (the payload's XXH3, every element decoded and
 * matched against the spec) before any is stored; on failure out[] holds
 * none and ECORRUPT has marked the cache bad. Thread-safe against other
 * loads and claims of the same reader. Consumes the job either way. */
cachew_err cwi_cache_reader_load(cwi_cache_reader *rd, cwi_cache_rec_job *job,
    cwi_element **out);
/* Releases a claimed job that will not be loaded. NULL-safe. */
void cwi_cache_rec_job_discard(cwi_cache_rec_job *job);
/* How many stored payloads claims read since the process started (they
 * were not in the page cache: cwi_cache_reader_claim); for tests. */
uint64_t cwi_cache_claimed_payloads(void);
void cwi_cache_reader_close(cwi_cache_reader *rd);

/* Decodes a whole chunk file held in memory, calling fn for each element
 * (fn takes the reference). The fuzz target's entry point: any defect is
 * CACHEW_ECORRUPT, never a crash or an allocation beyond the limits. */
cachew_err cwi_cache_chunk_decode(const void *data, size_t len,
    cachew_err (*fn)(void *ctx, cwi_element *e), void *ctx);

/* ---- management ----------------------------------------------------------- */

typedef enum cwi_cache_state {
	CWI_CACHE_COMPLETE, /* manifest present and well formed */
	CWI_CACHE_WRITING,  /* a live writer holds it */
	CWI_CACHE_PARTIAL,  /* no manifest, no live writer: a dead write */
	CWI_CACHE_BAD       /* marked bad */
} cwi_cache_state;

typedef struct cwi_cache_entry {
	cachew_fingerprint fp;
	char *pipeline;       /* NULL unless complete */
	cwi_cache_state state;
	uint64_t bytes;       /* bytes on storage */
	uint64_t elements;
	int64_t created_unix;
	int64_t last_read_unix; /* 0: never */
	char *reason;         /* why bad, or NULL */
} cwi_cache_entry;

const char *cwi_cache_state_name(cwi_cache_state s);
cachew_err cwi_cache_list(cwi_cache_root *r, cwi_cache_entry **out,
    size_t *n);
void cwi_cache_entries_free(cwi_cache_entry *v, size_t n);
/* Reads and checks every chunk; marks the cache bad on a mismatch and
 * returns CACHEW_ECORRUPT with the reason. */
cachew_err cwi_cache_verify(cwi_cache_root *r, const cachew_fingerprint *fp);
/* Removes a cache (CACHEW_EEXIST-free: CACHEW_ENOENT if absent, CACHEW_EIO
 * when it is being read or written). */
cachew_err cwi_cache_remove(cwi_cache_root *r, const cachew_fingerprint *fp);
/* Evicts complete, bad and partial caches, least recently read first,
 * until the root holds at most max_bytes; never one being read or
 * written. */
cachew_err cwi_cache_gc(cwi_cache_root *r, uint64_t max_bytes,
    uint64_t *freed_bytes);

/* Measures the storage's read throughput for elements of element_bytes
 * (one u8 tensor each): writes a probe cache of probe_bytes under the root,
 * reads it back through the real reader, removes it. The policy engine
 * uses this instead of a static table. */
typedef struct cwi_cache_probe_result {
	double read_mb_per_s;       /* uncompressed element bytes */
	double read_elements_per_s;
	double write_mb_per_s;
} cwi_cache_probe_result;
cachew_err cwi_cache_probe(cwi_cache_root *r, size_t element_bytes,
    uint64_t probe_bytes, cwi_cache_probe_result *out);

/* ---- plans: pipelines rewritten to write or read a cache ------------------- */

/* A copy of the pipeline `top` whose node `at` (a node of top's graph,
 * e.g. an autocache marker, or top itself) passes through
 * cache_put(root, write_id=write_id) (write_id 0: one writer), sharing the
 * nodes that do not lead to `at`. Every fingerprint stays what it was.
 * CACHEW_EINVAL when `at` is not in top's graph; build errors otherwise. */
cachew_err cwi_cache_plan_put(cwi_node *top, const cwi_node *at,
    const char *root, uint64_t write_id, cwi_node **out);
/* The same with `at` and everything upstream of it replaced by
 * cache_get(root, fingerprint of at): the pipeline reads the cache of `at`
 * and computes only what comes after it. */
cachew_err cwi_cache_plan_get(cwi_node *top, const cwi_node *at,
    const char *root, cwi_node **out);

/* ---- operators and CLI ---------------------------------------------------- */

extern const cwi_dataset_op cwi_op_cache_put;
extern const cwi_dataset_op cwi_op_cache_get;
extern const cwi_dataset_op cwi_op_cache;
/* cache() without a root: the in-memory cache's iterator (op_cache_mem.c). */
cachew_err cwi_mem_cache_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args);

/* Creates a local directory and its parents (mkdir -p); errors name the
 * directory that could not be made. The dispatcher's work dir uses it too. */
cachew_err cwi_cache_mkdirs(const char *dir);

#endif /* CWI_CACHE_H */
