/*
 * buffer_map.c - buffers that map a range of a local file (mmap) instead
 * of holding a copy of it, for records that leave the process unread: a
 * worker streaming fixed_length_records to a remote client sends them
 * from the page cache, with no read(2) copy into a block first. W6 on
 * this 2-CPU machine (1 MiB records over ipc://, 2 GB, 3 runs each,
 * interleaved, load 8): the worker's CPU 884-929 ms with reads, 544-590 ms
 * with mappings; the pread copy had been 23% of its time.
 *
 * The catch of every file mapping: a thread that reads a page past the
 * end of a file that shrank after it was mapped gets SIGBUS. The kernel's
 * own reads (writev into a socket) get EFAULT instead, a failed send. So
 * these buffers are only for bytes that nothing in the process reads:
 * whoever must read them (a compressor) takes a copy first with
 * cwi_buffer_map_copy, which reads the file again with pread(2) and fails
 * with a clear error if it shrank, as the read path would.
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One open file's descriptor, shared by its mappings (one descriptor per
 * file, not per block: a worker with many tasks would run out). */
struct cwi_map_file {
	atomic_uint refs;
	int fd; /* a dup of the file's descriptor: for copies */
};

typedef struct file_map {
	void *base;         /* the mapping, page aligned */
	size_t len;         /* its length */
	cwi_map_file *file; /* a reference */
	uint64_t off;       /* the file offset of the buffer's first byte */
} file_map;

cachew_err
cwi_map_file_open(cwi_map_file **out, int fd)
{
	cwi_map_file *f = malloc(sizeof(*f));

	*out = NULL;
	if (f == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	f->fd = dup(fd);
	if (f->fd < 0) {
		cachew_err rv = cwi_fail(errno == EMFILE || errno == ENFILE
					     ? CACHEW_ENOMEM : CACHEW_EIO,
		    "cannot map a file: dup: %s", strerror(errno));
		free(f);
		return rv;
	}
	atomic_init(&f->refs, 1);
	*out = f;
	return CACHEW_OK;
}

void
cwi_map_file_unref(cwi_map_file *f)
{
	if (f == NULL || atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	close(f->fd);
	free(f);
}

static void
file_map_free(void *ctx, void *data)
{
	file_map *m = ctx;

	(void)data;
	munmap(m->base, m->len);
	cwi_map_file_unref(m->file);
	free(m);
}

cachew_err
cwi_buffer_map_file(cwi_buffer **out, cwi_map_file *file, uint64_t off,
    size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t skew = off % (uint64_t)(page > 0 ? page : 4096);
	file_map *m = NULL;
	cachew_err rv;

	*out = NULL;
	if (len == 0 || len > SIZE_MAX - skew || off > (uint64_t)INT64_MAX)
		return cwi_fail(CACHEW_EINVAL, "cannot map %zu bytes at byte "
		    "offset %llu", len, (unsigned long long)off);
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->off = off;
	m->len = (size_t)skew + len;
	/* MAP_POPULATE: the page tables are filled in one call rather than
	 * by a fault every few pages when the socket reads them. */
	m->base = mmap(NULL, m->len, PROT_READ, MAP_SHARED | MAP_POPULATE,
	    file->fd, (off_t)(off - skew));
	if (m->base == MAP_FAILED) {
		rv = cwi_fail(errno == ENOMEM ? CACHEW_ENOMEM : CACHEW_ENOTSUP,
		    "cannot map %zu bytes at byte offset %llu: %s", len,
		    (unsigned long long)off, strerror(errno));
		free(m);
		return rv;
	}
	(void)madvise(m->base, m->len, MADV_SEQUENTIAL);
	atomic_fetch_add(&file->refs, 1);
	m->file = file;
	rv = cwi_buffer_wrap(out, (uint8_t *)m->base + skew, len,
	    file_map_free, m);
	if (rv != CACHEW_OK)
		file_map_free(m, NULL);
	return rv;
}

bool
cwi_buffer_mapped(const cwi_buffer *b)
{
	return b != NULL && b->free_fn == file_map_free;
}

cachew_err
cwi_buffer_map_copy(cwi_buffer **out, const cwi_buffer *b, size_t start,
    size_t len)
{
	const file_map *m = b->free_ctx;
	uint64_t at = m->off + start;
	cwi_buffer *c;
	size_t done = 0;
	cachew_err rv;

	*out = NULL;
	if (start > b->size || len > b->size - start)
		return cwi_fail(CACHEW_ERANGE, "bytes [%zu, +%zu) are outside a "
		    "%zu-byte mapping", start, len, b->size);
	rv = cwi_buffer_alloc(&c, len, false);
	if (rv != CACHEW_OK)
		return rv;
	while (done < len) {
		ssize_t n = pread(m->file->fd, c->data + done, len - done,
		    (off_t)(at + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rv = n < 0 ? cwi_fail(CACHEW_EIO, "read failed at byte "
					 "offset %llu: %s",
					 (unsigned long long)(at + done),
					 strerror(errno))
				   : cwi_fail(CACHEW_ECORRUPT, "the file ends at "
					 "byte offset %llu, inside records "
					 "already read (it is shorter than "
					 "when it was opened)",
					 (unsigned long long)(at + done));
			cwi_buffer_unref(c);
			return rv;
		}
		done += (size_t)n;
	}
	*out = c;
	return CACHEW_OK;
}

cachew_err
cwi_element_unmap(cwi_element **e)
{
	bool any = false;
	cachew_err rv;

	for (uint32_t i = 0; i < (*e)->n; i++)
		any |= cwi_buffer_mapped((*e)->comp[i].buf);
	if (!any)
		return CACHEW_OK;
	*e = cwi_element_make_unique(*e);
	if (*e == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < (*e)->n; i++) {
		cwi_tensor *t = &(*e)->comp[i];
		bool scalar = t->dtype == CACHEW_BYTES && t->obuf == NULL;
		cwi_buffer *c;

		if (!cwi_buffer_mapped(t->buf))
			continue;
		/* A bytes scalar (a record) copies its own bytes; any other
		 * tensor the whole mapping, at the same offsets. */
		if (scalar)
			rv = cwi_buffer_map_copy(&c, t->buf, t->inl.u64[0],
			    t->inl.u64[1] - t->inl.u64[0]);
		else
			rv = cwi_buffer_map_copy(&c, t->buf, 0, t->buf->size);
		if (rv != CACHEW_OK) {
			cwi_element_release(*e);
			*e = NULL;
			return rv;
		}
		if (scalar) {
			t->inl.u64[1] -= t->inl.u64[0];
			t->inl.u64[0] = 0;
		}
		cwi_buffer_unref(t->buf);
		t->buf = c;
	}
	return CACHEW_OK;
}
