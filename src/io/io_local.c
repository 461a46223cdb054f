/*
 * io_local.c - local files behind the cwi_file interface: pread(2) on a
 * descriptor from a tracked offset, so a byte range costs nothing extra.
 */
#include "io.h"
#include "io_policy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct local_file {
	cwi_file base;
	uint64_t pos; /* offset of the next read */
	uint64_t end; /* UINT64_MAX: to the end of the file */
} local_file;

static cachew_err
errno_code(int err)
{
	switch (err) {
	case ENOENT:
	case ENOTDIR:
		return CACHEW_ENOENT;
	case ENOMEM:
		return CACHEW_ENOMEM;
	default:
		return CACHEW_EIO;
	}
}

static cachew_err
local_read(cwi_file *f, void *buf, size_t len, size_t *got)
{
	local_file *l = (local_file *)f;
	size_t done = 0;

	if (l->end != UINT64_MAX && len > l->end - l->pos)
		len = (size_t)(l->end - l->pos);
	while (done < len) {
		ssize_t n = pread(f->fd, (uint8_t *)buf + done, len - done,
		    (off_t)l->pos);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*got = done;
			return cwi_fail(CACHEW_EIO,
			    "%s: read failed at byte offset %llu: %s", f->path,
			    (unsigned long long)l->pos, strerror(errno));
		}
		if (n == 0)
			break;
		done += (size_t)n;
		l->pos += (uint64_t)n;
	}
	*got = done;
	return CACHEW_OK;
}

static void
local_close(cwi_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	free(f->path);
	free(f);
}

static const cwi_file_ops local_ops = {
    .read = local_read,
    .close = local_close,
};

cachew_err
cwi_local_open(cwi_file **out, const char *path, uint64_t offset,
    uint64_t length, bool regular_only)
{
	local_file *l = calloc(1, sizeof(*l));
	struct stat sb;
	cachew_err rv;

	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l->base.ops = &local_ops;
	l->base.fd = -1;
	l->base.path = cwi_strdup(path);
	if (l->base.path == NULL) {
		free(l);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	/* O_NONBLOCK: opening a FIFO would wait for a writer. */
	l->base.fd = open(path,
	    O_RDONLY | O_CLOEXEC | (regular_only ? O_NONBLOCK : 0));
	if (l->base.fd < 0 || fstat(l->base.fd, &sb) != 0) {
		rv = cwi_fail(errno_code(errno), "%s: %s", path, strerror(errno));
		goto fail;
	}
	if (S_ISDIR(sb.st_mode)) {
		rv = cwi_fail(CACHEW_EIO, "%s: is a directory, not a file", path);
		goto fail;
	}
	if (regular_only && !S_ISREG(sb.st_mode)) {
		rv = cwi_fail(CACHEW_EINVAL, "%s: not a regular file (%s)", path,
		    S_ISFIFO(sb.st_mode)	? "a FIFO"
		    : S_ISCHR(sb.st_mode) ? "a character device"
		    : S_ISBLK(sb.st_mode) ? "a block device"
		    : S_ISSOCK(sb.st_mode) ? "a socket"
					   : "not a file");
		goto fail;
	}
	/* Where the descriptor leads, whatever replaced a symlink since
	 * cwi_file_open_range checked the path. */
	rv = cwi_io_check_read_fd(l->base.fd, path);
	if (rv != CACHEW_OK)
		goto fail;
	/* Pipes and /proc files have no meaningful size: read to the end. */
	l->base.size = S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
	l->pos = offset;
	l->end = length == UINT64_MAX || length > UINT64_MAX - offset
	    ? UINT64_MAX
	    : offset + length;
	(void)posix_fadvise(l->base.fd, (off_t)offset, 0, POSIX_FADV_SEQUENTIAL);
	*out = &l->base;
	return CACHEW_OK;
fail:
	local_close(&l->base);
	return rv;
}
