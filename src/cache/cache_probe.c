/*
 * cache_probe.c - measuring what a cache root delivers: a probe cache of
 * u8 elements is written through the real writer, read back through the
 * real reader and removed. The policy engine prices a cache read with the
 * result instead of a static table.
 *
 * The elements are random bytes, so zstd stores them nearly as they are
 * (like decoded pixels, which compress poorly) and the rates are those of
 * the storage plus the format's own work. On local roots the chunk files'
 * pages are dropped from the page cache after the write, so the read goes
 * to the device as a later epoch's would.
 */
#include "cache_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Elements handed to the writer per add call. */
#define PROBE_BATCH 64

static void
fill_random(uint8_t *p, size_t n, cwi_rng *rng)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t x = cwi_rng_next(rng);
		memcpy(p + i, &x, 8);
	}
	if (i < n) {
		uint64_t x = cwi_rng_next(rng);
		memcpy(p + i, &x, n - i);
	}
}

static cachew_err
probe_write(cwi_cache_root *r, const cachew_fingerprint *fp,
    size_t element_bytes, uint64_t count, double *secs)
{
	cwi_cache_writer *w = NULL;
	cwi_element *batch[PROBE_BATCH];
	cwi_rng rng = {.state = cwi_cache_random64()};
	uint64_t t0, gen_ns = 0, done = 0;
	int64_t shape[1] = {(int64_t)element_bytes};
	cachew_err rv;

	t0 = cwi_now_ns();
	rv = cwi_cache_writer_create(&w, r, fp, "cache_probe", NULL);
	while (rv == CACHEW_OK && done < count) {
		size_t k = count - done < PROBE_BATCH ? (size_t)(count - done)
						      : PROBE_BATCH;
		uint64_t g0 = cwi_now_ns();
		size_t made = 0;
		for (; made < k; made++) {
			uint8_t *data;
			batch[made] = cwi_element_new(1);
			if (batch[made] == NULL) {
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				break;
			}
			rv = cwi_tensor_init_alloc(&batch[made]->comp[0], CACHEW_U8,
			    1, shape, false, &data);
			if (rv != CACHEW_OK) {
				made++;
				break;
			}
			fill_random(data, element_bytes, &rng);
		}
		gen_ns += cwi_now_ns() - g0;
		if (rv == CACHEW_OK)
			rv = cwi_cache_writer_add(w, batch, k);
		for (size_t i = 0; i < made; i++)
			cwi_element_release(batch[i]);
		done += k;
	}
	if (rv == CACHEW_OK)
		rv = cwi_cache_writer_commit(w);
	cwi_cache_writer_destroy(w);
	*secs = (double)(cwi_now_ns() - t0 - gen_ns) / 1e9;
	return rv;
}

/* Local roots: drops the chunks' pages so that the read goes to the
 * device. The files were fsynced: their pages are clean. */
static void
drop_pages(cwi_cache_root *r, const cwi_cache_manifest *m)
{
	if (r->s3)
		return;
	for (size_t i = 0; i < m->nchunks; i++) {
		char *path = cwi_cache_file_path(r, &m->fp, m->chunks[i].name);
		int fd = path != NULL
		    ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
		if (fd >= 0) {
			(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
		free(path);
	}
}

static cachew_err
probe_read(cwi_cache_root *r, const cachew_fingerprint *fp,
    uint64_t *elements, uint64_t *bytes, double *secs)
{
	cwi_cache_manifest *m = NULL;
	cwi_chunk c = {0};
	uint64_t t0;
	cachew_err rv = cwi_cache_lookup(r, fp, &m);

	*elements = 0;
	*bytes = 0;
	if (rv != CACHEW_OK)
		return rv;
	drop_pages(r, m);
	t0 = cwi_now_ns();
	for (size_t i = 0; rv == CACHEW_OK && i < m->nchunks; i++) {
		cwi_cache_reader *rd = NULL;
		rv = cwi_cache_reader_open(&rd, r, m, i, true);
		while (rv == CACHEW_OK) {
			rv = cwi_cache_reader_next(rd, &c, 256);
			for (size_t k = 0; k < c.n; k++)
				*bytes += cwi_element_nbytes(c.v[k]);
			*elements += c.n;
			cwi_chunk_clear(&c);
		}
		if (rv == CACHEW_EOF)
			rv = CACHEW_OK;
		cwi_cache_reader_close(rd);
	}
	*secs = (double)(cwi_now_ns() - t0) / 1e9;
	cwi_chunk_free(&c);
	cwi_cache_manifest_free(m);
	return rv;
}

cachew_err
cwi_cache_probe(cwi_cache_root *r, size_t element_bytes, uint64_t probe_bytes,
    cwi_cache_probe_result *out)
{
	cachew_fingerprint fp = {.hi = cwi_cache_random64(),
	    .lo = cwi_cache_random64()};
	uint64_t count, elements = 0, bytes = 0;
	double wsecs = 0, rsecs = 0;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	if (element_bytes == 0 || element_bytes > CWI_CACHE_MAX_FRAME_BYTES / 2)
		return cwi_fail(CACHEW_ERANGE,
		    "cache probe: element size %zu is outside [1, %u]",
		    element_bytes, CWI_CACHE_MAX_FRAME_BYTES / 2);
	count = probe_bytes / element_bytes;
	if (count == 0)
		count = 1;
	rv = probe_write(r, &fp, element_bytes, count, &wsecs);
	if (rv == CACHEW_OK)
		rv = probe_read(r, &fp, &elements, &bytes, &rsecs);
	if (rv == CACHEW_OK && elements != count)
		rv = cwi_fail(CACHEW_EINTERNAL,
		    "cache probe: read %llu elements back, wrote %llu",
		    (unsigned long long)elements, (unsigned long long)count);
	/* Best effort: a probe left behind is an ordinary cache gc removes.
	 * The message of an earlier failure is kept. */
	char *msg = rv != CACHEW_OK ? cwi_strdup(cachew_errmsg()) : NULL;
	(void)cwi_cache_remove(r, &fp);
	if (rv != CACHEW_OK) {
		(void)cwi_fail(rv, "%s", msg != NULL ? msg : "cache probe failed");
		free(msg);
		return rv;
	}
	/* A clock too coarse for a tiny probe still gives a finite rate. */
	if (wsecs < 1e-6)
		wsecs = 1e-6;
	if (rsecs < 1e-6)
		rsecs = 1e-6;
	out->write_mb_per_s = (double)count * (double)element_bytes / 1e6 / wsecs;
	out->read_mb_per_s = (double)bytes / 1e6 / rsecs;
	out->read_elements_per_s = (double)elements / rsecs;
	cwi_log(CACHEW_LOG_INFO, "cache",
	    "probe %s: %zu-byte elements: read %.1f MB/s, %.0f elements/s; "
	    "write %.1f MB/s",
	    r->path, element_bytes, out->read_mb_per_s,
	    out->read_elements_per_s, out->write_mb_per_s);
	return CACHEW_OK;
}
