/*
 * src_tfrecord.c - tfrecord(files, compression, verify, skip_corrupt): the
 * records of TFRecord files as bytes scalars, as a source over a list of
 * files and as a flat_map function over the path in component 0
 * (`list_files("*.tfrecord") | interleave(tfrecord, cycle=8)`).
 *
 * docs/formats.md describes the framing. The reader pulls the (possibly
 * gzip-inflated) byte stream into refcounted blocks and hands out each
 * record as a zero-copy view of its block; a record longer than a block
 * gets a block of its own. Every length is checked against a limit and,
 * for plain files, against the bytes left in the file before anything is
 * allocated for it.
 */
#include "sources.h"
#include "../exec/exec_state.h"

#include "../core/crc32c.h"
#include "../exec/exec_split.h"
#include "../io/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

/* Compressed bytes per read of a gzip file. */
#define TFR_ZBUF (256u << 10)

struct cwi_tfr_reader {
	cwi_tfr_config cfg;
	char *path;
	/* The raw input: a file (local or remote), or borrowed memory. */
	cwi_file *file;
	const uint8_t *mem;
	bool size_known;
	uint64_t raw_size; /* when size_known: the size when opened */
	uint64_t raw_off;  /* next raw byte to read */
	bool raw_eof;
	/* gzip: the inflater and its input buffer. */
	z_stream zs;
	bool z_init;
	bool z_end;        /* the last member ended */
	uint8_t *zbuf;
	/* The decoded stream: block bytes [pos, len) are unread; block byte 0
	 * is stream byte `base`. */
	cwi_buffer *block;
	size_t pos, len;
	uint64_t base;
	bool eof;          /* the stream has no more bytes */
	uint64_t skipped;  /* corrupt records skipped (skip_corrupt) */
	bool warned;       /* the skip count was logged */
	char errmsg[512];
};

static cachew_err
tfr_fail(cwi_tfr_reader *r, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

/* Records "path: reason" in r->errmsg and returns err. */
static cachew_err
tfr_fail(cwi_tfr_reader *r, cachew_err err, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(r->errmsg, sizeof(r->errmsg), "%s: ",
	    r->path != NULL ? r->path : "?");

	if (n < 0 || (size_t)n >= sizeof(r->errmsg))
		return err;
	va_start(ap, fmt);
	vsnprintf(r->errmsg + n, sizeof(r->errmsg) - (size_t)n, fmt, ap);
	va_end(ap);
	return err;
}

/* ---- framing ---------------------------------------------------------------- */

static uint64_t
load_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t
load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

static void
store_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

void
cwi_tfrecord_header(uint8_t hdr[CWI_TFRECORD_HEADER], uint64_t len)
{
	for (int i = 0; i < 8; i++)
		hdr[i] = (uint8_t)(len >> (8 * i));
	store_le32(hdr + 8, cwi_crc32c_mask(cwi_crc32c(0, hdr, 8)));
}

void
cwi_tfrecord_footer(
    uint8_t ftr[CWI_TFRECORD_FOOTER], const void *data, size_t len)
{
	store_le32(ftr, cwi_crc32c_mask(cwi_crc32c(0, data, len)));
}

/* A header whose length checksum holds and whose length is within the
 * limit: where a resynchronising reader may start again. */
static bool
header_valid(const uint8_t *hdr)
{
	uint32_t want = load_le32(hdr + 8);

	return cwi_crc32c_mask(cwi_crc32c(0, hdr, 8)) == want &&
	    load_le64(hdr) <= CWI_TFRECORD_MAX_LEN;
}

/* ---- the raw input and gzip ----------------------------------------------- */

static cachew_err
raw_read(cwi_tfr_reader *r, uint8_t *dst, size_t want, size_t *got)
{
	*got = 0;
	if (r->mem != NULL) {
		uint64_t left = r->raw_size - r->raw_off;
		size_t n = left < want ? (size_t)left : want;
		memcpy(dst, r->mem + r->raw_off, n);
		r->raw_off += n;
		*got = n;
		return CACHEW_OK;
	}
	/* cwi_file_read fills the buffer unless the file ends first. */
	cachew_err rv = cwi_file_read(r->file, dst, want, got);
	if (rv != CACHEW_OK) {
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", cwi_errmsg_get());
		if (r->errmsg[0] == '\0')
			tfr_fail(r, rv, "read failed at byte offset %llu",
			    (unsigned long long)r->raw_off);
		return rv;
	}
	r->raw_off += *got;
	return CACHEW_OK;
}

/* Reads the next compressed bytes into zbuf; a read short of the buffer
 * is the file's end. */
static cachew_err
gz_refill(cwi_tfr_reader *r)
{
	size_t n;
	cachew_err rv = raw_read(r, r->zbuf, TFR_ZBUF, &n);

	if (rv != CACHEW_OK)
		return rv;
	r->raw_eof = n < TFR_ZBUF;
	r->zs.next_in = r->zbuf;
	r->zs.avail_in = (uInt)n;
	return CACHEW_OK;
}

/* Inflates up to `want` bytes into dst; *got == 0 means the end. A file
 * of several gzip members (concatenated .gz files) is one stream. */
static cachew_err
gz_read(cwi_tfr_reader *r, uint8_t *dst, size_t want, size_t *got)
{
	*got = 0;
	r->zs.next_out = dst;
	r->zs.avail_out = (uInt)(want > UINT32_MAX ? UINT32_MAX : want);
	while (r->zs.avail_out > 0 && !r->z_end) {
		int zrv;

		if (r->zs.avail_in == 0 && !r->raw_eof) {
			cachew_err rv = gz_refill(r);
			if (rv != CACHEW_OK)
				return rv;
		}
		if (r->zs.avail_in == 0)
			return tfr_fail(r, CACHEW_ECORRUPT,
			    "gzip stream truncated at compressed byte %llu",
			    (unsigned long long)r->raw_off);
		zrv = inflate(&r->zs, Z_NO_FLUSH);
		if (zrv == Z_STREAM_END) {
			/* Another member may follow: the file's end says
			 * whether one does. A member that ends where a read
			 * that filled the buffer ended (a file of a multiple
			 * of TFR_ZBUF bytes) is followed by a read of 0. */
			if (r->zs.avail_in == 0 && !r->raw_eof) {
				cachew_err rv = gz_refill(r);
				if (rv != CACHEW_OK)
					return rv;
			}
			if (r->zs.avail_in == 0)
				r->z_end = true;
			else if (inflateReset(&r->zs) != Z_OK)
				return tfr_fail(r, CACHEW_EINTERNAL,
				    "inflateReset failed");
			continue;
		}
		if (zrv != Z_OK && zrv != Z_BUF_ERROR)
			return tfr_fail(r,
			    zrv == Z_MEM_ERROR ? CACHEW_ENOMEM : CACHEW_ECORRUPT,
			    "gzip: %s near compressed byte %llu",
			    r->zs.msg != NULL ? r->zs.msg : "inflate failed",
			    (unsigned long long)(r->raw_off - r->zs.avail_in));
	}
	*got = want - r->zs.avail_out;
	return CACHEW_OK;
}

static cachew_err
stream_read(cwi_tfr_reader *r, uint8_t *dst, size_t want, size_t *got)
{
	return r->cfg.gzip ? gz_read(r, dst, want, got)
			   : raw_read(r, dst, want, got);
}

/*
 * Makes at least `need` unread bytes available in the block, unless the
 * stream ends first. Bytes are appended after `len` when the block has
 * room (views handed out cover only bytes before `pos`, so this never
 * changes what a record holds); otherwise the unread tail moves to the
 * front of the block, when nothing else holds it, or to a new block.
 */
static cachew_err
tfr_fill(cwi_tfr_reader *r, size_t need)
{
	while (r->len - r->pos < need && !r->eof) {
		cwi_buffer *b = r->block;
		size_t keep = r->len - r->pos, got;
		cachew_err rv;

		if (b == NULL || b->size - r->pos < need || r->len == b->size) {
			size_t bs = (size_t)r->cfg.buffer_size;
			size_t cap = need > bs ? need : bs;
			if (b != NULL && cwi_buffer_unique(b) && b->size >= cap) {
				memmove(b->data, b->data + r->pos, keep);
			} else {
				rv = cwi_buffer_alloc(&b, cap, false);
				if (rv != CACHEW_OK)
					return tfr_fail(r, rv,
					    "out of memory for a %zu-byte read "
					    "buffer", cap);
				if (keep > 0)
					memcpy(b->data, r->block->data + r->pos,
					    keep);
				cwi_buffer_unref(r->block);
				r->block = b;
			}
			r->base += r->pos;
			r->pos = 0;
			r->len = keep;
		}
		rv = stream_read(r, b->data + r->len, b->size - r->len, &got);
		if (rv != CACHEW_OK)
			return rv;
		if (got == 0)
			r->eof = true;
		r->len += got;
	}
	return CACHEW_OK;
}

/* ---- records ------------------------------------------------------------------- */

/* Scans forward from the byte after a corrupt record's start for the next
 * valid header; at the end of the stream drops what is left. */
static cachew_err
tfr_resync(cwi_tfr_reader *r)
{
	r->pos++;
	for (;;) {
		cachew_err rv = tfr_fill(r, CWI_TFRECORD_HEADER);
		if (rv != CACHEW_OK)
			return rv;
		if (r->len - r->pos < CWI_TFRECORD_HEADER) {
			r->pos = r->len;
			return CACHEW_OK;
		}
		if (header_valid(r->block->data + r->pos))
			return CACHEW_OK;
		r->pos++;
	}
}

/* Whether path names a record index: "<file>.idx". */
static bool
is_index_path(const char *path)
{
	size_t n = path != NULL ? strlen(path) : 0;

	return n > 4 && strcmp(path + n - 4, ".idx") == 0;
}

static cachew_err
tfr_corrupt(cwi_tfr_reader *r, uint64_t at, size_t whole, const char *fmt,
    ...) CACHEW_PRINTF(4, 5);

/* A corrupt record at stream offset `at`: an error, or with skip_corrupt
 * a skip. `whole` is the size of a record whose header was sound (skipped
 * as a unit); 0 to scan for the next valid header. */
static cachew_err
tfr_corrupt(cwi_tfr_reader *r, uint64_t at, size_t whole, const char *fmt,
    ...)
{
	char reason[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (!r->cfg.skip_corrupt)
		return tfr_fail(r, CACHEW_ECORRUPT, "record at byte %llu: %s",
		    (unsigned long long)at, reason);
	r->skipped++;
	cwi_log(CACHEW_LOG_DEBUG, "tfrecord",
	    "%s: skipping the corrupt record at byte %llu: %s", r->path,
	    (unsigned long long)at, reason);
	if (whole > 0) {
		r->pos += whole;
		return CACHEW_OK;
	}
	return tfr_resync(r);
}

/* One attempt at the record at r->pos: CACHEW_OK with *out set, or with
 * out->dtype left CACHEW_INVALID when a corrupt record was skipped. */
static cachew_err
tfr_record(cwi_tfr_reader *r, cwi_tensor *out)
{
	const uint8_t *hdr;
	uint64_t at = r->base + r->pos, len, total;
	size_t avail;
	cachew_err rv;

	rv = tfr_fill(r, CWI_TFRECORD_HEADER);
	if (rv != CACHEW_OK)
		return rv;
	avail = r->len - r->pos;
	if (avail == 0)
		return CACHEW_EOF;
	if (avail < CWI_TFRECORD_HEADER)
		return tfr_corrupt(r, at, 0,
		    "truncated header: %zu of %d bytes", avail,
		    CWI_TFRECORD_HEADER);
	hdr = r->block->data + r->pos;
	len = load_le64(hdr);
	if (cwi_crc32c_mask(cwi_crc32c(0, hdr, 8)) != load_le32(hdr + 8))
		return tfr_corrupt(r, at, 0, "length checksum mismatch");
	if (len > CWI_TFRECORD_MAX_LEN)
		return tfr_corrupt(r, at, 0,
		    "length %llu exceeds the limit of %llu bytes",
		    (unsigned long long)len,
		    (unsigned long long)CWI_TFRECORD_MAX_LEN);
	total = CWI_TFRECORD_HEADER + len + CWI_TFRECORD_FOOTER;
	/* Plain input of a known size: the file says how much can follow;
	 * never allocate for a record that cannot be there. */
	if (!r->cfg.gzip && r->size_known && total > r->raw_size - at)
		return tfr_corrupt(r, at, 0,
		    "truncated: the record needs %llu bytes, %llu remain",
		    (unsigned long long)total,
		    (unsigned long long)(r->raw_size - at));
	rv = tfr_fill(r, (size_t)total);
	if (rv != CACHEW_OK)
		return rv;
	if (r->len - r->pos < total)
		return tfr_corrupt(r, at, 0,
		    "truncated: the record needs %llu bytes, %zu remain",
		    (unsigned long long)total, r->len - r->pos);
	hdr = r->block->data + r->pos;
	if (r->cfg.verify &&
	    cwi_crc32c_mask(cwi_crc32c(0, hdr + CWI_TFRECORD_HEADER,
		(size_t)len)) !=
		load_le32(hdr + CWI_TFRECORD_HEADER + len))
		return tfr_corrupt(r, at, (size_t)total,
		    "data checksum mismatch");
	cwi_tensor_init_bytes_view(
	    out, r->block, r->pos + CWI_TFRECORD_HEADER, (size_t)len);
	r->pos += (size_t)total;
	return CACHEW_OK;
}

cachew_err
cwi_tfr_next(cwi_tfr_reader *r, cwi_tensor *out)
{
	for (;;) {
		cachew_err rv;

		if (r->errmsg[0] != '\0')
			return CACHEW_EIO; /* used after a failure */
		out->dtype = CACHEW_INVALID;
		rv = tfr_record(r, out);
		if (rv == CACHEW_EOF) {
			if (r->skipped > 0 && !r->warned)
				cwi_log(CACHEW_LOG_WARN, "tfrecord",
				    "%s: skipped %llu corrupt record%s", r->path,
				    (unsigned long long)r->skipped,
				    r->skipped == 1 ? "" : "s");
			r->warned = true;
			return rv;
		}
		if (rv != CACHEW_OK || out->dtype != CACHEW_INVALID)
			return rv;
	}
}

/* ---- record indexes ---------------------------------------------------------- */

/*
 * "<file>.idx" in the format of NVIDIA DALI's tfrecord2idx: one line per
 * record, "<offset> <size>\n" in decimal, offset the byte offset of the
 * record's header and size its whole framed length (16 + data length).
 * Records fill a file from byte 0 with nothing between them, so each
 * offset must be where the previous record ends: that catches an index
 * of another file, or a damaged one, before any byte of data is read.
 */

static cachew_err
idx_fail(cwi_tfr_reader *r, cachew_err err, const char *idx_path,
    const char *fmt, ...) CACHEW_PRINTF(4, 5);

/* Records "<file>.idx: reason" in r->errmsg and returns err. */
static cachew_err
idx_fail(cwi_tfr_reader *r, cachew_err err, const char *idx_path,
    const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(r->errmsg, sizeof(r->errmsg), "%s: ", idx_path);

	if (n < 0 || (size_t)n >= sizeof(r->errmsg))
		return err;
	va_start(ap, fmt);
	vsnprintf(r->errmsg + n, sizeof(r->errmsg) - (size_t)n, fmt, ap);
	va_end(ap);
	return err;
}

/* Parses a decimal number at *p (before end); false when there is none
 * or it does not fit 64 bits. */
static bool
idx_number(const char **p, const char *end, uint64_t *out)
{
	const char *s = *p;
	uint64_t v = 0;

	if (s == end || *s < '0' || *s > '9')
		return false;
	for (; s < end && *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*p = s;
	*out = v;
	return true;
}

/* Parses one line [s, end) (without its '\n') as record `line - 1`, whose
 * header must be at *next; advances *next past the record. */
static cachew_err
idx_line(cwi_tfr_reader *r, const char *idx_path, size_t line,
    const char *s, const char *end, uint64_t *next)
{
	uint64_t off, size;

	if (end > s && end[-1] == '\r')
		end--;
	if (!idx_number(&s, end, &off) || s == end ||
	    (*s != ' ' && *s != '\t'))
		goto malformed;
	while (s < end && (*s == ' ' || *s == '\t'))
		s++;
	if (!idx_number(&s, end, &size))
		goto malformed;
	while (s < end && (*s == ' ' || *s == '\t'))
		s++;
	if (s != end)
		goto malformed;
	if (size < CWI_TFRECORD_HEADER + CWI_TFRECORD_FOOTER ||
	    size - CWI_TFRECORD_HEADER - CWI_TFRECORD_FOOTER >
		CWI_TFRECORD_MAX_LEN)
		return idx_fail(r, CACHEW_ECORRUPT, idx_path,
		    "line %zu: record size %llu is not in [16, %llu]", line,
		    (unsigned long long)size,
		    (unsigned long long)(CWI_TFRECORD_MAX_LEN + 16));
	if (off != *next)
		return idx_fail(r, CACHEW_ECORRUPT, idx_path,
		    "line %zu: offset %llu is not where the previous record "
		    "ends (%llu)", line, (unsigned long long)off,
		    (unsigned long long)*next);
	*next = off + size; /* cannot wrap: both are checked above */
	return CACHEW_OK;
malformed:
	return idx_fail(r, CACHEW_ECORRUPT, idx_path,
	    "line %zu: expected \"<offset> <size>\" in decimal", line);
}

/* Loads an index: bounds[i] is where record i starts, bounds[*n] where
 * the last one ends. */
static cachew_err
idx_load(cwi_tfr_reader *r, const char *idx_path, uint64_t **bounds,
    size_t *n)
{
	cwi_buffer *b = NULL;
	const char *s, *end;
	size_t len = 0, lines = 0;
	uint64_t next = 0;
	cachew_err rv;

	*bounds = NULL;
	*n = 0;
	rv = cwi_file_read_all(idx_path, NULL, &b, &len);
	if (rv == CACHEW_ENOENT)
		return idx_fail(r, rv, idx_path,
		    "no record index; write one with tfrecord_write(index=true) "
		    "or cachew gen");
	if (rv != CACHEW_OK) {
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", cwi_errmsg_get());
		if (r->errmsg[0] == '\0')
			idx_fail(r, rv, idx_path, "%s", cachew_strerror(rv));
		return rv;
	}
	s = (const char *)b->data;
	end = s + len;
	for (const char *p = s; p < end; p++)
		lines += *p == '\n';
	/* One more for a last line without its newline, one for the end. */
	*bounds = malloc((lines + 2) * sizeof(**bounds));
	if (*bounds == NULL) {
		cwi_buffer_unref(b);
		return idx_fail(r, CACHEW_ENOMEM, idx_path, "out of memory");
	}
	(*bounds)[0] = next;
	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		const char *eol = nl != NULL ? nl : end;
		rv = idx_line(r, idx_path, *n + 1, s, eol, &next);
		if (rv != CACHEW_OK)
			break;
		(*bounds)[++*n] = next;
		s = nl != NULL ? nl + 1 : end;
	}
	cwi_buffer_unref(b);
	if (rv != CACHEW_OK) {
		free(*bounds);
		*bounds = NULL;
		*n = 0;
	}
	return rv;
}

/* ---- open and close ---------------------------------------------------------- */

static cachew_err
tfr_new(cwi_tfr_reader **out, const cwi_tfr_config *cfg, const char *path)
{
	cwi_tfr_reader *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->cfg = *cfg;
	if (r->cfg.buffer_size <= 0)
		r->cfg.buffer_size = CWI_READ_BLOCK;
	r->path = cwi_strdup(path);
	*out = r;
	if (r->path == NULL)
		return tfr_fail(r, CACHEW_ENOMEM, "out of memory");
	if (cfg->gzip) {
		r->zbuf = malloc(TFR_ZBUF);
		if (r->zbuf == NULL)
			return tfr_fail(r, CACHEW_ENOMEM, "out of memory");
		if (inflateInit2(&r->zs, 16 + MAX_WBITS) != Z_OK)
			return tfr_fail(r, CACHEW_ENOMEM,
			    "cannot initialise zlib");
		r->z_init = true;
	}
	return CACHEW_OK;
}

/* Checks every record of the index against the size of the data file
 * (when the server said it) before any byte of the range is read. */
static cachew_err
idx_check_size(cwi_tfr_reader *r, const char *idx_path, const uint64_t *bounds,
    size_t n)
{
	int64_t size = cwi_file_size(r->file);

	if (size < 0 || bounds[n] <= (uint64_t)size)
		return CACHEW_OK;
	for (size_t i = 0; i < n; i++)
		if (bounds[i + 1] > (uint64_t)size)
			return idx_fail(r, CACHEW_ECORRUPT, idx_path,
			    "line %zu: record [%llu, %llu) is past the end of "
			    "%s (%lld bytes)", i + 1,
			    (unsigned long long)bounds[i],
			    (unsigned long long)bounds[i + 1], r->path,
			    (long long)size);
	return CACHEW_OK;
}

/* records=[start, stop]: opens only the bytes of those records, found in
 * "<path>.idx"; stop past the last record is clamped. Stream offsets (and
 * so error messages) stay offsets in the whole file. */
static cachew_err
tfr_open_records(cwi_tfr_reader *r, const char *path)
{
	char *idx_path = cwi_asprintf("%s.idx", path);
	uint64_t *bounds = NULL;
	size_t n = 0, start, stop;
	cachew_err rv;

	if (idx_path == NULL)
		return tfr_fail(r, CACHEW_ENOMEM, "out of memory");
	rv = idx_load(r, idx_path, &bounds, &n);
	if (rv != CACHEW_OK)
		goto done;
	start = r->cfg.rec_start < n ? (size_t)r->cfg.rec_start : n;
	stop = r->cfg.rec_stop < n ? (size_t)r->cfg.rec_stop : n;
	r->size_known = true;
	if (start == stop) {
		/* Nothing selected: nothing to read from the data file. */
		r->mem = (const uint8_t *)"";
		goto done;
	}
	rv = cwi_file_open_range(&r->file, path, bounds[start],
	    bounds[stop] - bounds[start], NULL);
	if (rv != CACHEW_OK) {
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", cwi_errmsg_get());
		if (r->errmsg[0] == '\0')
			tfr_fail(r, rv, "%s", cachew_strerror(rv));
		goto done;
	}
	rv = idx_check_size(r, idx_path, bounds, n);
	if (rv != CACHEW_OK)
		goto done;
	/* The range end bounds every record, as the file size does. */
	r->raw_size = bounds[stop];
	r->raw_off = r->base = bounds[start];
done:
	free(bounds);
	free(idx_path);
	return rv;
}

cachew_err
cwi_tfr_open(cwi_tfr_reader **out, const cwi_tfr_config *cfg, const char *path)
{
	cwi_tfr_reader *r = NULL;
	int64_t size;
	cachew_err rv;

	rv = tfr_new(&r, cfg, path);
	*out = r;
	if (rv != CACHEW_OK)
		return rv;
	/* A pattern such as train-* also matches the record indexes beside
	 * the shards (cachew gen and tfrecord_write(index=true) write
	 * <shard>.idx, the name the ranged reader looks for): an index holds
	 * no records, so it reads as an empty file, without opening it. */
	if (is_index_path(path)) {
		cwi_log(CACHEW_LOG_DEBUG, "tfrecord",
		    "%s: a record index, read as holding no records", path);
		r->mem = (const uint8_t *)"";
		r->size_known = true;
		r->cfg.gzip = false;
		return CACHEW_OK;
	}
	if (cfg->ranged)
		return tfr_open_records(r, path);
	/* Local paths, file://, http(s)://, s3:// and gs:// (src/io). */
	rv = cwi_file_open(&r->file, path, NULL);
	if (rv != CACHEW_OK) {
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", cwi_errmsg_get());
		if (r->errmsg[0] == '\0')
			tfr_fail(r, rv, "%s", cachew_strerror(rv));
		return rv;
	}
	/* Remote servers may not say (chunked): then lengths are checked
	 * against the 1 GiB limit alone. */
	size = cwi_file_size(r->file);
	r->size_known = size >= 0;
	r->raw_size = size >= 0 ? (uint64_t)size : 0;
	return CACHEW_OK;
}

cachew_err
cwi_tfr_open_mem(cwi_tfr_reader **out, const cwi_tfr_config *cfg,
    const char *name, const void *data, size_t len)
{
	cachew_err rv = tfr_new(out, cfg, name);

	if (rv != CACHEW_OK)
		return rv;
	(*out)->mem = len > 0 ? data : (const uint8_t *)"";
	(*out)->raw_size = len;
	(*out)->size_known = true;
	return CACHEW_OK;
}

uint64_t
cwi_tfr_tell(const cwi_tfr_reader *r)
{
	return r->base + r->pos;
}

cachew_err
cwi_tfr_seek(cwi_tfr_reader *r, uint64_t off)
{
	uint64_t end = r->size_known ? r->raw_size : UINT64_MAX;
	cwi_file *f;
	cachew_err rv;

	if (r->cfg.gzip || r->mem != NULL || r->file == NULL)
		return CACHEW_ENOTSUP;
	if (off < r->base || off > end)
		return tfr_fail(r, CACHEW_ERANGE,
		    "byte offset %llu is outside the records, [%llu, %llu)",
		    (unsigned long long)off, (unsigned long long)r->base,
		    (unsigned long long)end);
	rv = cwi_file_open_range(&f, r->path, off,
	    end == UINT64_MAX ? UINT64_MAX : end - off, NULL);
	if (rv != CACHEW_OK)
		return tfr_fail(r, rv, "%s", cwi_errmsg_get());
	cwi_file_close(r->file);
	r->file = f;
	r->raw_off = r->base = off;
	r->pos = r->len = 0;
	r->eof = r->raw_eof = false;
	return CACHEW_OK;
}

const char *
cwi_tfr_errmsg(const cwi_tfr_reader *r)
{
	return r->errmsg;
}

uint64_t
cwi_tfr_skipped(const cwi_tfr_reader *r)
{
	return r->skipped;
}

void
cwi_tfr_close(cwi_tfr_reader *r)
{
	if (r == NULL)
		return;
	cwi_file_close(r->file);
	if (r->z_init)
		inflateEnd(&r->zs);
	free(r->zbuf);
	cwi_buffer_unref(r->block);
	free(r->path);
	free(r);
}

/* ---- parameters ------------------------------------------------------------------ */

static cachew_err
compression_parse(const char *s, bool *gzip)
{
	if (strcmp(s, "none") == 0 || s[0] == '\0') {
		*gzip = false;
		return CACHEW_OK;
	}
	if (strcmp(s, "gzip") == 0) {
		*gzip = true;
		return CACHEW_OK;
	}
	return CACHEW_EINVAL;
}

/* records=[start, stop] (NULL: absent) into cfg; a gzip file has no
 * byte offsets to split at. Call after the compression is known. */
static cachew_err
records_parse(const cwi_value *v, cwi_tfr_config *cfg, char *err,
    size_t errlen)
{
	const cwi_value *it;
	int64_t start, stop;

	if (v == NULL)
		return CACHEW_OK;
	it = v->type == CWI_V_LIST ? v->u.list.items : NULL;
	if (it == NULL || v->u.list.n != 2 || it[0].type != CWI_V_INT ||
	    it[1].type != CWI_V_INT) {
		snprintf(err, errlen,
		    "records must be [start, stop], two integers");
		return CACHEW_EINVAL;
	}
	start = it[0].u.i;
	stop = it[1].u.i;
	if (start < 0 || stop < start) {
		snprintf(err, errlen,
		    "records must satisfy 0 <= start <= stop, not [%lld, %lld]",
		    (long long)start, (long long)stop);
		return CACHEW_EINVAL;
	}
	if (cfg->gzip) {
		snprintf(err, errlen,
		    "records needs compression=none: a gzip file cannot be "
		    "split by record index");
		return CACHEW_EINVAL;
	}
	cfg->ranged = true;
	cfg->rec_start = (uint64_t)start;
	cfg->rec_stop = (uint64_t)stop;
	return CACHEW_OK;
}

static cachew_err
tfrecord_validate(cwi_node *node)
{
	cwi_tfr_config cfg = {.verify = true};
	char err[256];

	if (compression_parse(cwi_node_str(node, "compression"), &cfg.gzip) !=
	    CACHEW_OK)
		return cwi_fail(CACHEW_EINVAL,
		    "tfrecord: compression must be none or gzip, not '%s'",
		    cwi_node_str(node, "compression"));
	if (records_parse(cwi_node_value(node, "records"), &cfg, err,
		sizeof(err)) != CACHEW_OK)
		return cwi_fail(CACHEW_EINVAL, "tfrecord: %s", err);
	return CACHEW_OK;
}

cachew_err
cwi_tfr_config_from_params(const cachew_params *params, cwi_tfr_config *cfg,
    char *err, size_t errlen)
{
	const char *s;
	int b;
	int64_t v;

	memset(cfg, 0, sizeof(*cfg));
	cfg->verify = true;
	cfg->buffer_size = CWI_READ_BLOCK;
	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		if (strcmp(k, "compression") != 0 && strcmp(k, "verify") != 0 &&
		    strcmp(k, "skip_corrupt") != 0 &&
		    strcmp(k, "buffer_size") != 0 && strcmp(k, "records") != 0) {
			snprintf(err, errlen,
			    "unknown parameter '%s' (parameters: compression, "
			    "verify, skip_corrupt, buffer_size, records)", k);
			return CACHEW_EINVAL;
		}
	}
	if (cachew_params_get_str(params, "compression", &s) == CACHEW_OK) {
		if (compression_parse(s, &cfg->gzip) != CACHEW_OK) {
			snprintf(err, errlen,
			    "compression must be none or gzip, not '%s'", s);
			return CACHEW_EINVAL;
		}
	} else if (cachew_params_has(params, "compression")) {
		snprintf(err, errlen, "compression must be a string");
		return CACHEW_EINVAL;
	}
	if (cachew_params_get_bool(params, "verify", &b) == CACHEW_OK)
		cfg->verify = b != 0;
	else if (cachew_params_has(params, "verify"))
		goto bad_bool;
	if (cachew_params_get_bool(params, "skip_corrupt", &b) == CACHEW_OK)
		cfg->skip_corrupt = b != 0;
	else if (cachew_params_has(params, "skip_corrupt"))
		goto bad_bool;
	if (cachew_params_get_int(params, "buffer_size", &v) == CACHEW_OK) {
		if (v < 1 || v > CWI_READ_BLOCK_MAX) {
			snprintf(err, errlen,
			    "buffer_size must be in [1, %d]", CWI_READ_BLOCK_MAX);
			return CACHEW_ERANGE;
		}
		cfg->buffer_size = v;
	} else if (cachew_params_has(params, "buffer_size")) {
		snprintf(err, errlen, "buffer_size must be an integer");
		return CACHEW_EINVAL;
	}
	return records_parse(cwi_map_get(&params->map, "records"), cfg, err,
	    errlen);
bad_bool:
	snprintf(err, errlen, "verify and skip_corrupt must be true or false");
	return CACHEW_EINVAL;
}

/* ---- the source ------------------------------------------------------------------ */

typedef struct tfrecord_iter {
	cwi_iter base;
	cwi_tfr_config cfg;
	char **paths;
	size_t npaths;
	size_t next_path;
	cwi_tfr_reader *reader; /* the open file, or NULL */
	uint64_t in_file;       /* records read of the open file */
	cachew_err pending;     /* an error to report after the elements */
	char errmsg[512];
} tfrecord_iter;

static cachew_err
tfrecord_read(tfrecord_iter *t, cwi_chunk *out, size_t max, size_t *got)
{
	cachew_err rv = CACHEW_OK;

	while (*got < max) {
		cwi_element *e;
		cwi_tensor v;

		if (t->reader == NULL) {
			if (t->next_path == t->npaths)
				return CACHEW_EOF;
			rv = cwi_tfr_open(&t->reader, &t->cfg,
			    t->paths[t->next_path++]);
			if (rv != CACHEW_OK)
				break;
			t->in_file = 0;
		}
		rv = cwi_tfr_next(t->reader, &v);
		if (rv == CACHEW_EOF) {
			cwi_tfr_close(t->reader);
			t->reader = NULL;
			continue;
		}
		if (rv != CACHEW_OK)
			break;
		e = cwi_element_new(1);
		if (e == NULL) {
			cwi_tensor_clear(&v);
			snprintf(t->errmsg, sizeof(t->errmsg), "out of memory");
			return CACHEW_ENOMEM;
		}
		e->comp[0] = v;
		cwi_chunk_push(out, e);
		(*got)++;
		t->in_file++;
	}
	if (rv != CACHEW_OK)
		snprintf(t->errmsg, sizeof(t->errmsg), "%s",
		    t->reader != NULL ? cwi_tfr_errmsg(t->reader) : cachew_errmsg());
	return rv;
}

static cachew_err
tfrecord_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	tfrecord_iter *t = (tfrecord_iter *)it;
	size_t got = 0;
	cachew_err rv = t->pending;

	if (rv == CACHEW_OK)
		rv = tfrecord_read(t, out, max, &got);
	if (rv == CACHEW_OK || (rv == CACHEW_EOF && got > 0))
		return CACHEW_OK;
	if (rv == CACHEW_EOF)
		return rv;
	if (got > 0) {
		t->pending = rv;
		return CACHEW_OK;
	}
	return cwi_pipeline_fail(it->pl, rv, "tfrecord: %s", t->errmsg);
}

static void
tfrecord_destroy(cwi_iter *it)
{
	tfrecord_iter *t = (tfrecord_iter *)it;

	cwi_tfr_close(t->reader);
	cwi_paths_free(t->paths);
	free(t);
}

/* [next file, open, records read of the open file, the stream offset of
 * the next one]. */
static cachew_err
tfrecord_save(cwi_iter *it, cwi_state_writer *w)
{
	tfrecord_iter *t = (tfrecord_iter *)it;

	if (t->pending != CACHEW_OK)
		return cwi_fail(t->pending, "tfrecord: %s", t->errmsg);
	cwi_sw_array(w, 4);
	cwi_sw_uint(w, t->next_path);
	cwi_sw_bool(w, t->reader != NULL);
	cwi_sw_uint(w, t->reader != NULL ? t->in_file : 0);
	cwi_sw_uint(w, t->reader != NULL ? cwi_tfr_tell(t->reader) : 0);
	return CACHEW_OK;
}

/* Reopens the file at the saved offset, or (gzip) reads past the records
 * already taken (a corrupt record skipped is skipped again, uncounted). */
static cachew_err
tfrecord_reopen(tfrecord_iter *t, uint64_t in_file, uint64_t off,
    cwi_state_reader *r)
{
	const char *p = t->paths[t->next_path - 1];
	cwi_tensor v;
	cachew_err rv;

	rv = cwi_tfr_open(&t->reader, &t->cfg, p);
	if (rv == CACHEW_OK)
		rv = cwi_tfr_seek(t->reader, off);
	if (rv != CACHEW_OK && rv != CACHEW_ENOTSUP) {
		cwi_sr_fail(r, rv, "%s", t->reader != NULL
					     ? cwi_tfr_errmsg(t->reader)
					     : cachew_errmsg());
		return cwi_sr_error(r);
	}
	if (rv == CACHEW_OK) {
		t->in_file = in_file;
		return CACHEW_OK;
	}
	for (t->in_file = 0; t->in_file < in_file; t->in_file++) {
		rv = cwi_tfr_next(t->reader, &v);
		if (rv == CACHEW_EOF) {
			cwi_sr_fail(r, CACHEW_ECORRUPT,
			    "%s has %llu records, the state says %llu were "
			    "read",
			    p, (unsigned long long)t->in_file,
			    (unsigned long long)in_file);
			return cwi_sr_error(r);
		}
		if (rv != CACHEW_OK) {
			cwi_sr_fail(r, rv, "%s", cwi_tfr_errmsg(t->reader));
			return cwi_sr_error(r);
		}
		cwi_tensor_clear(&v);
	}
	return CACHEW_OK;
}

static cachew_err
tfrecord_restore(cwi_iter *it, cwi_state_reader *r)
{
	tfrecord_iter *t = (tfrecord_iter *)it;
	uint64_t next = 0, in_file = 0, off = 0;
	bool open = false;

	if (!cwi_sr_array(r, "tfrecord", 4) ||
	    !cwi_sr_uint(r, "next file", &next, t->npaths) ||
	    !cwi_sr_bool(r, "open", &open) ||
	    !cwi_sr_uint(r, "records read", &in_file, UINT64_MAX) ||
	    !cwi_sr_uint(r, "byte offset", &off, UINT64_MAX))
		return cwi_sr_error(r);
	if (open && next == 0) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "a file is open before the first");
		return cwi_sr_error(r);
	}
	t->next_path = (size_t)next;
	return open ? tfrecord_reopen(t, in_file, off, r) : CACHEW_OK;
}

static const cwi_iter_ops tfrecord_iter_ops = {
    .next = tfrecord_next,
    .destroy = tfrecord_destroy,
    .save = tfrecord_save,
    .restore = tfrecord_restore,
};

static cachew_err
tfrecord_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	tfrecord_iter *t;
	const char **pats;
	size_t npat = 0;
	cachew_err rv;

	t = calloc(1, sizeof(*t));
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	t->base.ops = &tfrecord_iter_ops;
	(void)compression_parse(cwi_node_str(node, "compression"), &t->cfg.gzip);
	t->cfg.verify = cwi_node_bool(node, "verify");
	t->cfg.skip_corrupt = cwi_node_bool(node, "skip_corrupt");
	t->cfg.buffer_size = cwi_node_int(node, "buffer_size");
	/* Checked by tfrecord_validate. */
	(void)records_parse(cwi_node_value(node, "records"), &t->cfg,
	    t->errmsg, sizeof(t->errmsg));
	t->errmsg[0] = '\0';
	pats = cwi_value_str_list(cwi_node_value(node, "files"), &npat);
	if (pats == NULL) {
		free(t);
		return CACHEW_ENOMEM;
	}
	rv = cwi_paths_expand(pats, npat, &t->paths, &t->npaths);
	free(pats);
	if (rv == CACHEW_OK)
		rv = cwi_split_select_paths(args, node, &t->paths, &t->npaths);
	if (rv != CACHEW_OK) {
		cwi_paths_free(t->paths);
		free(t);
		return rv;
	}
	*out = &t->base;
	return CACHEW_OK;
}

static const cwi_param_spec tfrecord_params[] = {
    {.name = "files", .type = CWI_P_STRS, .flags = CWI_PF_REQUIRED,
	.help = "TFRecord files or glob patterns, read in order"},
    {.name = "compression", .type = CWI_P_STR, .def_str = "none",
	.help = "none or gzip"},
    {.name = "verify", .type = CWI_P_BOOL, .def_int = 1,
	.help = "check each record's data checksum"},
    {.name = "skip_corrupt", .type = CWI_P_BOOL, .def_int = 0,
	.help = "skip corrupt records with a counted warning instead of "
		"failing"},
    {.name = "buffer_size", .type = CWI_P_INT, .flags = CWI_PF_PERF,
	.def_int = CWI_READ_BLOCK, .min = 1, .max = CWI_READ_BLOCK_MAX,
	.help = "bytes per read"},
    {.name = "records", .type = CWI_P_LIST, .flags = CWI_PF_OPTIONAL,
	.help = "[start, stop]: only records [start, stop) of each file, "
		"found through the file's record index, FILE.idx "
		"(compression=none)"},
};

const cwi_dataset_op cwi_op_tfrecord = {
    .name = "tfrecord",
    .doc = "the records of TFRecord files, as bytes scalars",
    .params = tfrecord_params,
    .nparams = sizeof(tfrecord_params) / sizeof(tfrecord_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_FILES | CWI_OPF_SPLITTABLE,
    .validate = tfrecord_validate,
    .iter_create = tfrecord_create,
    /* One unit per file. With records=[a, b] and record indexes, units
     * could later be record ranges of large files. */
    .split_units = cwi_split_units_files,
    .saves = "the file, the records read of it and the offset of the next "
	"one: a restore reopens an uncompressed file there (gzip: reads past "
	"them)",
    .infer = cwi_infer_bytes_scalar,
};

/* ---- the function: one file per input element -------------------------------------- */

static cachew_err
tfrecord_fn_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	cwi_tfr_config *cfg = malloc(sizeof(*cfg));
	cachew_err rv;

	if (cfg == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_tfr_config_from_params(params, cfg, err, errlen);
	if (rv != CACHEW_OK) {
		free(cfg);
		return rv;
	}
	*state = cfg;
	return CACHEW_OK;
}

static void
tfrecord_fn_fini(void *state)
{
	free(state);
}

static cachew_err
tfrecord_fn_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	const cwi_tfr_config *cfg = cachew_op_ctx_state(ctx);
	cwi_tfr_reader *r = NULL;
	char *path = NULL;
	cachew_err rv;

	rv = cwi_input_path(ctx, in, &path);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_tfr_open(&r, cfg, path);
	free(path);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "%s",
		    r != NULL ? r->errmsg : cachew_errmsg());
		cwi_tfr_close(r);
		return rv;
	}
	*seq = r;
	return CACHEW_OK;
}

static cachew_err
tfrecord_fn_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	cwi_tfr_reader *r = seq;
	cwi_element *e;
	cwi_tensor t;
	cachew_err rv = cwi_tfr_next(r, &t);

	if (rv == CACHEW_EOF)
		return rv;
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "%s", r->errmsg);
		return rv;
	}
	e = cwi_element_new(1);
	if (e == NULL) {
		cwi_tensor_clear(&t);
		cachew_op_ctx_fail(ctx, "out of memory");
		return CACHEW_ENOMEM;
	}
	e->comp[0] = t;
	*out = e;
	return CACHEW_OK;
}

static void
tfrecord_fn_close(void *seq)
{
	cwi_tfr_close(seq);
}

static uint64_t
tfrecord_fn_tell(void *seq)
{
	return cwi_tfr_tell(seq);
}

static cachew_err
tfrecord_fn_seek(void *seq, uint64_t pos, char *err, size_t errlen)
{
	cachew_err rv = cwi_tfr_seek(seq, pos);

	if (rv != CACHEW_OK && rv != CACHEW_ENOTSUP)
		snprintf(err, errlen, "%s", cwi_tfr_errmsg(seq));
	return rv;
}

const cwi_seq_resume cwi_tfr_fn_resume = {
    .tell = tfrecord_fn_tell,
    .seek = tfrecord_fn_seek,
};

const cachew_op_def cwi_fn_tfrecord = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "tfrecord",
    .doc = "tfrecord(compression=none, verify=true, skip_corrupt=false, buffer_size=1048576, records=[start, stop]): the records of the TFRecord file named by component 0",
    .kind = CACHEW_OP_FLAT_MAP,
    .cost_ns = 200,
    .init = tfrecord_fn_init,
    .fini = tfrecord_fn_fini,
    .flat_open = tfrecord_fn_open,
    .flat_next = tfrecord_fn_next,
    .flat_close = tfrecord_fn_close,
};
