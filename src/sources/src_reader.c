/*
 * src_reader.c - the record reader shared by the text_lines and
 * fixed_length_records sources and functions: large sequential reads into
 * refcounted blocks, records handed out as zero-copy views of them. Files
 * are read through src/io, so every source reads local paths and remote
 * URLs (http, https, s3, gs) alike.
 */
#include "sources.h"

#include "../io/io.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static cachew_err
rec_fail(cwi_rec_reader *r, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

/* Records "path: reason" in r->errmsg and returns err. */
static cachew_err
rec_fail(cwi_rec_reader *r, cachew_err err, const char *fmt, ...)
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

void
cwi_rec_init(cwi_rec_reader *r, const cwi_rec_config *cfg)
{
	memset(r, 0, sizeof(*r));
	r->cfg = *cfg;
}

void
cwi_rec_close(cwi_rec_reader *r)
{
	cwi_file_close(r->file);
	r->file = NULL;
	cwi_buffer_unref(r->block);
	r->block = NULL;
	cwi_map_file_unref(r->mapped);
	r->mapped = NULL;
	free(r->path);
	r->path = NULL;
	r->pos = r->len = r->scanned = 0;
	r->file_off = r->end = 0;
	r->eof = false;
}

/* Fixed-length files: the body between header and footer must hold whole
 * records; like tf.data, a file that does not is an error before any of
 * its records is read. */
static cachew_err
rec_check_fixed(cwi_rec_reader *r, uint64_t size)
{
	uint64_t hdr = (uint64_t)r->cfg.header_bytes;
	uint64_t ftr = (uint64_t)r->cfg.footer_bytes;
	uint64_t rb = (uint64_t)r->cfg.record_bytes;
	uint64_t body, whole;

	if (size < hdr || size - hdr < ftr)
		return rec_fail(r, CACHEW_ECORRUPT,
		    "the file is %llu bytes, shorter than its %llu-byte header "
		    "and %llu-byte footer",
		    (unsigned long long)size, (unsigned long long)hdr,
		    (unsigned long long)ftr);
	body = size - hdr - ftr;
	whole = body - body % rb;
	if (whole != body)
		return rec_fail(r, CACHEW_ECORRUPT,
		    "partial record at byte offset %llu: %llu of %llu bytes "
		    "(the %llu-byte body is not a multiple of the record "
		    "length)",
		    (unsigned long long)(hdr + whole),
		    (unsigned long long)(body - whole), (unsigned long long)rb,
		    (unsigned long long)body);
	r->file_off = hdr;
	r->end = hdr + body;
	return CACHEW_OK;
}

/* Copies this thread's io error into r->errmsg and returns err. */
static cachew_err
rec_io_fail(cwi_rec_reader *r, cachew_err err)
{
	snprintf(r->errmsg, sizeof(r->errmsg), "%s", cwi_errmsg_get());
	return err;
}

/* Fixed-length files with a header read from the header's end: local
 * files by offset, remote ones with a ranged request. */
static cachew_err
rec_skip_header(cwi_rec_reader *r, uint64_t size)
{
	uint64_t hdr = (uint64_t)r->cfg.header_bytes;
	cwi_file *f;
	cachew_err rv;

	if (hdr == 0)
		return CACHEW_OK;
	(void)size;
	rv = cwi_file_open_range(&f, r->path, hdr, r->end - hdr, NULL);
	if (rv != CACHEW_OK)
		return rec_io_fail(r, rv);
	cwi_file_close(r->file);
	r->file = f;
	return CACHEW_OK;
}

uint64_t
cwi_rec_tell(const cwi_rec_reader *r)
{
	return r->file_off - (uint64_t)(r->len - r->pos);
}

cachew_err
cwi_rec_seek(cwi_rec_reader *r, uint64_t off)
{
	uint64_t start = r->file_off, end = r->end;
	int64_t size = cwi_file_size(r->file);
	cwi_file *f;
	cachew_err rv;

	if (r->cfg.record_bytes == 0) {
		if (size < 0)
			return CACHEW_ENOTSUP;
		end = (uint64_t)size;
	} else if (end == UINT64_MAX) {
		return CACHEW_ENOTSUP;
	}
	if (off < start || off > end ||
	    (r->cfg.record_bytes > 0 &&
		(off - start) % (uint64_t)r->cfg.record_bytes != 0))
		return rec_fail(r, CACHEW_ERANGE,
		    "byte offset %llu is not where a record of [%llu, %llu) "
		    "starts",
		    (unsigned long long)off, (unsigned long long)start,
		    (unsigned long long)end);
	rv = cwi_file_open_range(&f, r->path, off, end - off, NULL);
	if (rv != CACHEW_OK)
		return rec_io_fail(r, rv);
	cwi_file_close(r->file);
	r->file = f;
	cwi_map_file_unref(r->mapped); /* mappings keep their references */
	r->mapped = NULL;
	r->file_off = off;
	r->pos = r->len = r->scanned = 0;
	r->eof = false;
	return CACHEW_OK;
}

cachew_err
cwi_rec_open(cwi_rec_reader *r, const char *path, size_t len)
{
	int64_t size;
	cachew_err rv;

	cwi_rec_close(r);
	r->errmsg[0] = '\0';
	if (len >= 7 && memcmp(path, "file://", 7) == 0) {
		path += 7;
		len -= 7;
	}
	r->path = cwi_strndup(path, len);
	if (r->path == NULL) {
		snprintf(r->errmsg, sizeof(r->errmsg), "?: out of memory");
		return CACHEW_ENOMEM;
	}
	if (strlen(r->path) != len)
		return rec_fail(r, CACHEW_EINVAL, "the path contains a NUL byte");
	rv = cwi_file_open(&r->file, r->path, NULL);
	if (rv != CACHEW_OK)
		return rec_io_fail(r, rv);
	if (r->cfg.record_bytes == 0)
		return CACHEW_OK;
	size = cwi_file_size(r->file);
	if (size < 0) {
		/* A chunked response: records are checked as they come;
		 * a footer cannot be found without the size. */
		if (r->cfg.footer_bytes > 0 || r->cfg.header_bytes > 0)
			return rec_fail(r, CACHEW_EIO,
			    "the server did not send the size, which a header "
			    "or footer needs");
		r->file_off = 0;
		r->end = UINT64_MAX;
		return CACHEW_OK;
	}
	rv = rec_check_fixed(r, (uint64_t)size);
	if (rv == CACHEW_OK)
		rv = rec_skip_header(r, (uint64_t)size);
	return rv;
}

/*
 * Mapped reading (cfg.map): the next records, whole, as one mapping of
 * the file. CACHEW_ENOTSUP when they are to be read instead: not a local
 * file, records under CWI_MAP_MIN, or a mapping that failed (this reader
 * then reads the rest of the file from where the mappings stopped).
 */
static cachew_err
rec_map(cwi_rec_reader *r, uint64_t limit)
{
	size_t rb = (size_t)r->cfg.record_bytes;
	size_t len = CWI_MAP_BLOCK / rb * rb;
	int fd = cwi_file_fd(r->file);
	cwi_buffer *b;
	cachew_err rv;

	if (!r->cfg.map || rb < CWI_MAP_MIN || r->len != r->pos || fd < 0 ||
	    limit == 0)
		return CACHEW_ENOTSUP;
	if (len < rb)
		len = rb;
	if (len > limit)
		len = (size_t)limit;
	if ((r->mapped == NULL &&
		cwi_map_file_open(&r->mapped, fd) != CACHEW_OK) ||
	    cwi_buffer_map_file(&b, r->mapped, r->file_off, len) !=
		CACHEW_OK) {
		r->cfg.map = false;
		/* The file's read position is where this file was opened or
		 * last sought: move it to the records not yet mapped. */
		rv = cwi_rec_seek(r, r->file_off);
		return rv == CACHEW_OK ? CACHEW_ENOTSUP : rv;
	}
	cwi_buffer_unref(r->block);
	r->block = b;
	r->pos = r->scanned = 0;
	r->len = len;
	r->file_off += (uint64_t)len;
	return CACHEW_OK;
}

/*
 * Moves the unread bytes [pos, len) to the front of a block of `cap`
 * bytes and fills the rest from the file (up to `limit` bytes when
 * limit > 0). The current block is reused when nothing else holds it
 * (every record cut from it has been released); otherwise a new one is
 * allocated and only the unread tail is copied.
 */
static cachew_err
rec_refill(cwi_rec_reader *r, size_t cap, uint64_t limit)
{
	size_t keep = r->len - r->pos, want, got = 0;
	cwi_buffer *b = r->block;

	if (b == NULL || !cwi_buffer_unique(b) || b->size < cap) {
		cachew_err rv = cwi_buffer_alloc(&b, cap, false);
		if (rv != CACHEW_OK)
			return rec_fail(r, rv,
			    "out of memory for a %zu-byte read buffer", cap);
		if (keep > 0)
			memcpy(b->data, r->block->data + r->pos, keep);
		cwi_buffer_unref(r->block);
		r->block = b;
	} else if (keep > 0 && r->pos > 0) {
		memmove(b->data, b->data + r->pos, keep);
	}
	r->scanned = r->scanned > r->pos ? r->scanned - r->pos : 0;
	r->pos = 0;
	r->len = keep;
	want = b->size - keep;
	if (limit > 0 && want > limit)
		want = (size_t)limit;
	while (got < want) {
		size_t n = 0;
		cachew_err rv = cwi_file_read(r->file, b->data + keep + got,
		    want - got, &n);
		if (rv != CACHEW_OK) {
			r->len = keep + got;
			return rec_io_fail(r, rv);
		}
		if (n == 0) {
			r->eof = true;
			break;
		}
		got += n;
		r->file_off += (uint64_t)n;
	}
	r->len = keep + got;
	return CACHEW_OK;
}

static cachew_err
rec_next_line(cwi_rec_reader *r, cwi_tensor *out)
{
	size_t bs = (size_t)r->cfg.buffer_size;

	for (;;) {
		size_t from = r->scanned > r->pos ? r->scanned : r->pos;
		const uint8_t *d = r->block != NULL ? r->block->data : NULL;
		const uint8_t *nl = from < r->len
		    ? memchr(d + from, '\n', r->len - from)
		    : NULL;
		cachew_err rv;

		if (nl != NULL) {
			size_t end = (size_t)(nl - d);
			size_t start = r->pos;
			r->pos = end + 1;
			r->scanned = r->pos;
			if (end > start && d[end - 1] == '\r')
				end--;
			cwi_tensor_init_bytes_view(out, r->block, start,
			    end - start);
			return CACHEW_OK;
		}
		r->scanned = r->len;
		if (r->eof) {
			/* A last line without a newline is still a line. */
			if (r->pos < r->len) {
				size_t start = r->pos, end = r->len;
				r->pos = r->scanned = r->len;
				if (d[end - 1] == '\r')
					end--; /* as tf.data's ReadLine does */
				cwi_tensor_init_bytes_view(out, r->block, start,
				    end - start);
				return CACHEW_OK;
			}
			return CACHEW_EOF;
		}
		/* Keep the partial line and read at least a block more;
		 * a line longer than that doubles the block, so a line of n
		 * bytes costs O(n) copying whatever the block size. */
		size_t keep = r->len - r->pos;
		size_t cap = keep < bs ? bs + keep : 2 * keep;
		/* Input decides line lengths: bound what it can make us hold. */
		if (keep >= (size_t)CWI_READ_BLOCK_MAX)
			return rec_fail(r, CACHEW_ECORRUPT,
			    "the line at byte offset %llu is longer than %d bytes",
			    (unsigned long long)(r->file_off - keep),
			    CWI_READ_BLOCK_MAX);
		if (cap > (size_t)CWI_READ_BLOCK_MAX)
			cap = (size_t)CWI_READ_BLOCK_MAX + 1;
		rv = rec_refill(r, cap, 0);
		if (rv != CACHEW_OK)
			return rv;
	}
}

static cachew_err
rec_next_fixed(cwi_rec_reader *r, cwi_tensor *out)
{
	size_t rb = (size_t)r->cfg.record_bytes;

	for (;;) {
		size_t keep = r->len - r->pos, cap;
		cachew_err rv;

		if (keep >= rb) {
			cwi_tensor_init_bytes_view(out, r->block, r->pos, rb);
			r->pos += rb;
			return CACHEW_OK;
		}
		if (r->eof || r->file_off >= r->end) {
			if (keep == 0)
				return CACHEW_EOF;
			/* The file shrank after it was opened. */
			return rec_fail(r, CACHEW_ECORRUPT,
			    "partial record at byte offset %llu: %zu of %zu "
			    "bytes (the file is shorter than when it was "
			    "opened)",
			    (unsigned long long)(r->file_off - keep), keep, rb);
		}
		rv = rec_map(r, r->end - r->file_off);
		if (rv == CACHEW_OK)
			continue;
		if (rv != CACHEW_ENOTSUP)
			return rv;
		/* Whole records per block: reads stay record-aligned. */
		cap = (size_t)r->cfg.buffer_size / rb * rb;
		if (cap < rb)
			cap = rb;
		rv = rec_refill(r, cap, r->end - r->file_off);
		if (rv != CACHEW_OK)
			return rv;
	}
}

cachew_err
cwi_rec_next(cwi_rec_reader *r, cwi_tensor *out)
{
	if (r->file == NULL)
		return CACHEW_EOF;
	return r->cfg.record_bytes > 0 ? rec_next_fixed(r, out)
				       : rec_next_line(r, out);
}

/* ---- function helpers ------------------------------------------------------ */

static cachew_err
param_int(const cachew_params *params, const char *key, int64_t min,
    int64_t max, int64_t *out, char *err, size_t errlen)
{
	cachew_err rv = cachew_params_get_int(params, key, out);

	if (rv == CACHEW_ENOENT)
		return CACHEW_OK;
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "parameter '%s' must be an integer", key);
		return CACHEW_EINVAL;
	}
	if (*out < min || *out > max) {
		snprintf(err, errlen,
		    "parameter '%s' must be in [%lld, %lld], not %lld", key,
		    (long long)min, (long long)max, (long long)*out);
		return CACHEW_ERANGE;
	}
	return CACHEW_OK;
}

cachew_err
cwi_rec_config_from_params(const cachew_params *params, bool fixed,
    cwi_rec_config *cfg, char *err, size_t errlen)
{
	const char *known = fixed
	    ? "record_bytes, header_bytes, footer_bytes, buffer_size"
	    : "buffer_size";
	cachew_err rv;

	memset(cfg, 0, sizeof(*cfg));
	cfg->buffer_size = CWI_READ_BLOCK;
	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		if (strcmp(k, "buffer_size") == 0 ||
		    (fixed && (strcmp(k, "record_bytes") == 0 ||
				  strcmp(k, "header_bytes") == 0 ||
				  strcmp(k, "footer_bytes") == 0)))
			continue;
		snprintf(err, errlen, "unknown parameter '%s' (parameters: %s)",
		    k, known);
		return CACHEW_EINVAL;
	}
	rv = param_int(params, "buffer_size", 1, CWI_READ_BLOCK_MAX,
	    &cfg->buffer_size, err, errlen);
	if (rv != CACHEW_OK || !fixed)
		return rv;
	if (!cachew_params_has(params, "record_bytes")) {
		snprintf(err, errlen, "missing required parameter 'record_bytes'");
		return CACHEW_EINVAL;
	}
	rv = param_int(params, "record_bytes", 1, CWI_READ_BLOCK_MAX,
	    &cfg->record_bytes, err, errlen);
	if (rv == CACHEW_OK)
		rv = param_int(params, "header_bytes", 0, INT64_MAX / 4,
		    &cfg->header_bytes, err, errlen);
	if (rv == CACHEW_OK)
		rv = param_int(params, "footer_bytes", 0, INT64_MAX / 4,
		    &cfg->footer_bytes, err, errlen);
	return rv;
}

cachew_err
cwi_input_path(cachew_op_ctx *ctx, const cwi_element *in, char **path)
{
	const cwi_tensor *t = &in->comp[0];
	const uint8_t *s;
	size_t len;
	char spec[64];

	if (t->dtype != CACHEW_BYTES || t->rank != 0) {
		cachew_op_ctx_fail(ctx,
		    "component 0 is %s, expected a bytes scalar (a file path)",
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		return CACHEW_ETYPE;
	}
	s = cwi_tensor_str(t, 0, &len);
	if (memchr(s, '\0', len) != NULL) {
		cachew_op_ctx_fail(ctx, "the path in component 0 contains a "
					"NUL byte");
		return CACHEW_EINVAL;
	}
	*path = cwi_strndup((const char *)s, len);
	if (*path == NULL) {
		cachew_op_ctx_fail(ctx, "out of memory");
		return CACHEW_ENOMEM;
	}
	return CACHEW_OK;
}
