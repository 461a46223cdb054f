/*
 * cache_int.h - internals shared by the files of the cache store
 * (cache_chunk.c, cache_write.c, cache_read.c, cache_manifest.c,
 * cache_store.c, cache_admin.c, cache_probe.c). docs/cache-format.md is the
 * specification of every byte these describe.
 */
#ifndef CWI_CACHE_INT_H
#define CWI_CACHE_INT_H

#include "cache.h"

#include "../io/io.h"

#include <zstd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t, XXH3_state_t in structs */
#include <xxhash.h>
/* Debian's libxxhash has XXH3 pick the widest vector unit at run time
 * (AVX2, AVX-512) behind these names; the plain ones are its SSE2 build.
 * 1.7-3.9x faster on this project's machine (17-35 GB/s instead of 7-9
 * on 128 KiB pieces), and XXH3 is a stored record's only pass over its
 * bytes besides the copy out of the page cache. */
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

/* ---- names inside a cache directory ------------------------------------- */

#define CWI_CACHE_FILE_MANIFEST "manifest"
#define CWI_CACHE_FILE_BAD "BAD"
#define CWI_CACHE_FILE_LOCK ".lock"
#define CWI_CACHE_FILE_LAST_READ "last_read"
#define CWI_CACHE_TMP_PREFIX ".tmp-"
/* Readers touch last_read at most this often. */
#define CWI_CACHE_LAST_READ_PERIOD 60
/* A BAD file's reason is cut at this length. */
#define CWI_CACHE_MAX_REASON 4096

/* ---- chunk framing (cache_chunk.c) -------------------------------------- */

#define CWI_CHUNK_MAGIC "\x89" "CWC\r\n\x1a\n"
/* Chunk format versions (docs/cache-format.md, section 3): 1 holds zstd
 * frames only, under 16-byte record headers, and the manifest hashes the
 * whole file; 2 adds stored records (the encoded elements as they are,
 * under an XXH3), 32-byte record headers that carry each payload's hash,
 * and a manifest hash of the skeleton only. Writers write 2; readers read
 * both. */
#define CWI_CHUNK_VERSION_1 1u
#define CWI_CHUNK_VERSION_2 2u
#define CWI_CHUNK_VERSION CWI_CHUNK_VERSION_2
#define CWI_CHUNK_HEADER_SIZE 32
#define CWI_CHUNK_REC1_SIZE 16
#define CWI_CHUNK_REC2_SIZE 32
#define CWI_CHUNK_REC_MAX_SIZE 32
#define CWI_CHUNK_TRAILER_SIZE 32
/* The smallest chunk file: a header and a trailer. */
#define CWI_CHUNK_MIN_SIZE (CWI_CHUNK_HEADER_SIZE + CWI_CHUNK_TRAILER_SIZE)
/* Format 2 record kinds; the record header holds the XXH3 of the payload
 * of either. */
#define CWI_CHUNK_REC_ZSTD 1u
#define CWI_CHUNK_REC_STORED 2u

typedef struct cwi_chunk_header {
	uint32_t version;
	uint32_t flags;
	uint64_t cache_id;
	uint32_t index;
} cwi_chunk_header;

typedef struct cwi_chunk_rec {
	uint32_t clen;  /* payload bytes (the zstd frame, or stored content) */
	uint32_t ulen;  /* content bytes (the msgpack elements) */
	uint32_t nelem; /* elements in the record */
	uint32_t kind;  /* CWI_CHUNK_REC_*: format 1 records are all zstd */
	uint64_t hash;  /* format 2: XXH3 of the payload */
} cwi_chunk_rec;

typedef struct cwi_chunk_trailer {
	uint32_t records;
	uint64_t elements;
	uint64_t ubytes; /* sum of the records' ulen */
} cwi_chunk_trailer;

/* The record header size of a chunk format version (1 or 2). */
static inline size_t
cwi_chunk_rec_size(uint32_t version)
{
	return version == CWI_CHUNK_VERSION_1 ? CWI_CHUNK_REC1_SIZE
					      : CWI_CHUNK_REC2_SIZE;
}

void cwi_chunk_header_put(uint8_t out[CWI_CHUNK_HEADER_SIZE],
    const cwi_chunk_header *h);
/* `name` and `at` only word errors ("<name>: ... at byte <at>"). Accepts
 * versions 1 and 2. */
cachew_err cwi_chunk_header_parse(const uint8_t *in, const char *name,
    cwi_chunk_header *h);
/* A record header of the given format version
 * (cwi_chunk_rec_size(version) bytes at in), or the start of the trailer
 * (*trailer set, nothing else checked: the caller reads and checks the
 * whole trailer). Checks the header's check word, the limits, and that a
 * stored record's payload is its content (clen == ulen). */
cachew_err cwi_chunk_rec_parse(const uint8_t *in, uint32_t version,
    const char *name, uint64_t at, cwi_chunk_rec *r, bool *trailer);
void cwi_chunk_trailer_put(uint8_t out[CWI_CHUNK_TRAILER_SIZE],
    const cwi_chunk_trailer *t);
cachew_err cwi_chunk_trailer_parse(const uint8_t *in, const char *name,
    uint64_t at, cwi_chunk_trailer *t);

/* The writer's default level: per frame, level -1 (literals stored raw,
 * decoding at memcpy speed), or level 1 when that shrinks the frame by
 * more than an eighth. */
#define CWI_CHUNK_LEVEL_AUTO 0

/* Appends the record (header + payload) of one frame of nelem encoded
 * elements to out, in chunk format `version`. The frame is compressed at
 * `level` (a zstd level or CWI_CHUNK_LEVEL_AUTO); in format 2 a frame
 * that compression does not shrink by a sixteenth is stored instead.
 * cctx has the checksum and content-size flags set. */
cachew_err cwi_chunk_frame_encode(ZSTD_CCtx *cctx, uint32_t version,
    int level, const void *frame, size_t len, uint32_t nelem,
    cwi_strbuf *out);
/* Decompresses and decodes a zstd record's frame (r->clen bytes at src)
 * into r->nelem new elements in out[]; all or nothing: on error no element
 * is left in out. Elements are zero-copy slices of one new buffer. The
 * caller has checked a format 2 payload's XXH3. */
cachew_err cwi_chunk_frame_decode(ZSTD_DCtx *dctx, const char *name,
    uint64_t at, const cwi_chunk_rec *r, const uint8_t *src,
    cwi_element **out);
/* Decodes a stored record's r->nelem elements from the first r->ulen
 * bytes of buf (whose XXH3 the caller has checked) into out[], as
 * zero-copy slices of buf; all or nothing, like cwi_chunk_frame_decode. */
cachew_err cwi_chunk_stored_decode(cwi_buffer *buf, const char *name,
    uint64_t at, const cwi_chunk_rec *r, cwi_element **out);
/* True if e matches the spec of ncomp components. When not, writes what
 * differs into why. */
bool cwi_cache_spec_match(const cwi_cache_spec *spec, size_t ncomp,
    const cwi_element *e, char *why, size_t whylen);

/* ---- roots and directories (cache_store.c) ------------------------------ */

struct cwi_cache_root {
	char *path;        /* as given, without trailing '/' */
	bool s3;           /* s3://bucket/prefix */
	uint64_t capacity; /* 0: unlimited */
};

/* "<root>/<fp hex>" and "<root>/<fp hex>/<name>" as heap strings (NULL
 * on ENOMEM, errmsg set). */
char *cwi_cache_dir_path(const cwi_cache_root *r, const cachew_fingerprint *fp);
char *cwi_cache_file_path(const cwi_cache_root *r,
    const cachew_fingerprint *fp, const char *name);
/* Reads a whole file of at most `limit` bytes (local or remote);
 * CACHEW_ENOENT if absent, CACHEW_ECORRUPT if larger than limit. */
/* The reads of a cache's files: the environment's remote settings, and a
 * local path must be a regular file (a FIFO named like a chunk would block
 * the reader for ever). */
void cwi_cache_io_opts(cwi_io_opts *o);
cachew_err cwi_cache_read_small(const char *path, size_t limit,
    cwi_buffer **out, size_t *len);
/* Writes a whole file so that it appears complete or not at all: local
 * files go to a temporary name and are renamed (when `durable`, the file
 * is fsynced before and the directory after); S3 objects are PUT whole. */
cachew_err cwi_cache_put_file(const cwi_cache_root *r, const char *dir,
    const char *name, const void *data, size_t len, bool durable);
/* Removes one file or object; an absent one is not an error. */
cachew_err cwi_cache_unlink(const cwi_cache_root *r, const char *path);
/* fsyncs a local directory. */
cachew_err cwi_cache_fsync_dir(const char *dir);

/* A random 64-bit id (getrandom, falling back to time and pid). */
uint64_t cwi_cache_random64(void);

/* Local caches only: the lock file dir/.lock held with flock(2). op is
 * LOCK_SH or LOCK_EX; never blocks. CACHEW_EEXIST when another holder
 * conflicts, CACHEW_ENOENT when dir is gone (and create is false). The
 * lock file is re-checked after locking: one unlinked by a remover in
 * the meantime is not a lock. A shared lock in a read-only directory
 * without a lock file is CACHEW_OK with *fd = -1: nothing here can
 * change it. */
cachew_err cwi_cache_lock(const char *dir, int op, bool create, int *fd);
/* The files of a cache directory (local) or the objects under it (S3), as
 * full paths with their sizes; free with cwi_cache_names_free. */
cachew_err cwi_cache_list_dir(const cwi_cache_root *r, const char *dir,
    char ***names, uint64_t **sizes, size_t *n);
void cwi_cache_names_free(char **names, uint64_t *sizes, size_t n);
/* Part files of a distributed write: part-<write id>-<writer id>.cwp. */
#define CWI_CACHE_PART_PREFIX "part-"
#define CWI_CACHE_PART_SUFFIX ".cwp"

void cwi_cache_unlock(int fd);

/* Removes a cache directory's contents, the manifest first so that it
 * stops being a cache before any chunk goes. keep_lock leaves .lock and
 * the directory (a writer that takes the directory over); otherwise both
 * go too. The caller holds the exclusive lock. */
cachew_err cwi_cache_clear_dir(const cwi_cache_root *r, const char *dir,
    bool keep_lock);
/* Sum of the sizes of the files in a cache directory. */
cachew_err cwi_cache_dir_bytes(const cwi_cache_root *r, const char *dir,
    uint64_t *bytes);

/* The reason recorded in a cache's BAD marker (a heap string), or NULL
 * when it is not marked bad. */
char *cwi_cache_bad_reason(const cwi_cache_root *r,
    const cachew_fingerprint *fp);
/* Sets the mtime of the cache's last_read file to now, unless it is
 * less than CWI_CACHE_LAST_READ_PERIOD seconds old. Best effort. */
void cwi_cache_touch_last_read(const cwi_cache_root *r,
    const cachew_fingerprint *fp);
/* When the cache was last read (0: never). */
int64_t cwi_cache_last_read(const cwi_cache_root *r,
    const cachew_fingerprint *fp);

/* Bytes held by every cache under the root except `skip` (may be NULL):
 * the writer's capacity check. */
cachew_err cwi_cache_usage(cwi_cache_root *r, const cachew_fingerprint *skip,
    uint64_t *bytes);

/* Frees the contents of a manifest without freeing m itself. */
void cwi_cache_manifest_clear(cwi_cache_manifest *m);

#endif /* CWI_CACHE_INT_H */
