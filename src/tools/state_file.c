/*
 * state_file.c - the iterator state files of `cachew run --save-at N
 * --state FILE` and `--resume FILE`: written whole to a temporary file
 * beside FILE, flushed and renamed over it, so FILE is always either the
 * previous state or the new one, never a torn write.
 */
#include "tools.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A state holds the buffered elements, so it may be large; beyond this it
 * is surely not one. */
#define STATE_FILE_MAX ((uint64_t)16 << 30)

int
cwi_state_file_write(const char *path, const void *data, size_t len,
    char *err, size_t errlen)
{
	char tmp[4096];
	const char *p = data;
	size_t done = 0;
	int fd;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path,
		(long)getpid()) >= sizeof(tmp)) {
		snprintf(err, errlen, "%s: path too long", path);
		return -1;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		return -1;
	}
	while (done < len) {
		ssize_t n = write(fd, p + done, len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			goto fail;
		done += (size_t)n;
	}
	if (fsync(fd) != 0)
		goto fail;
	if (close(fd) != 0) {
		fd = -1;
		goto fail;
	}
	if (rename(tmp, path) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
fail:
	snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return -1;
}

int
cwi_state_file_read(const char *path, void **data, size_t *len, char *err,
    size_t errlen)
{
	struct stat st;
	uint8_t *buf = NULL;
	size_t done = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > STATE_FILE_MAX) {
		snprintf(err, errlen, "%s: not an iterator state file (%s)",
		    path, S_ISREG(st.st_mode) ? "too large" : "not a file");
		close(fd);
		return -1;
	}
	buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
	if (buf == NULL) {
		snprintf(err, errlen, "%s: out of memory", path);
		close(fd);
		return -1;
	}
	while (done < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + done, (size_t)st.st_size - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(err, errlen, "%s: %s", path,
			    n == 0 ? "shorter than its size" : strerror(errno));
			free(buf);
			close(fd);
			return -1;
		}
		done += (size_t)n;
	}
	close(fd);
	*data = buf;
	*len = done;
	return 0;
}
