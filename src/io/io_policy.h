/*
 * io_policy.h - what a confined process may read, fetch and write: the
 * access policy of a `cachewd --role=worker`, which runs pipelines that
 * other users send (docs/security.md, "Workers' file and URL access").
 *
 * A process without a policy (a training process, the embedded service,
 * `cachew`) reads and writes with its own user's rights: every check below
 * passes. A confined process reads a local file only when its real path
 * (symlinks and ".." resolved) lies under an --allow-read directory or a
 * --cache-root; fetches a URL only when it starts with an --allow-read URL
 * prefix and connects only to public addresses, unless the prefix that
 * admits it names the private address itself; and writes only under a
 * --cache-root.
 *
 * Errors: a refusal is CACHEW_EINVAL with a message that names the path or
 * URL, the flag that would allow it and what is allowed:
 * "/etc/shadow: outside the worker's --allow-read (allowed: /data)".
 *
 * Thread safety: installed once, before the threads that open files start
 * (cwi_worker_start), and immutable after; the checks are safe from any
 * thread.
 */
#ifndef CWI_IO_POLICY_H
#define CWI_IO_POLICY_H

#include "../core/core.h"

struct sockaddr;

/* A place a confined process writes: a local directory (which must exist)
 * or an s3://bucket/prefix URL. */
typedef struct cwi_io_write_root {
	const char *path;
	uint64_t capacity; /* bytes the caches there may hold; 0: no bound */
} cwi_io_write_root;

/* Installs this process's policy: `read` lists local directories (which
 * must exist) and URL prefixes (http://, https://, s3://, gs://) that
 * may be read, `write` the roots that may be written (and read). Either
 * may be empty: nothing of that kind is then allowed. The strings are
 * copied. Errors: CACHEW_EEXIST when a policy is installed already,
 * CACHEW_EINVAL naming an item that is not a directory or not a URL
 * prefix of a supported scheme. Call before other threads open files. */
cachew_err cwi_io_policy_install(const char *const *read, size_t nread,
    const cwi_io_write_root *write, size_t nwrite);
/* True once a policy is installed. */
bool cwi_io_confined(void);

/* Checks a local path, file:// URL or remote URL that a pipeline is about
 * to read. */
cachew_err cwi_io_check_read(const char *path);
/* Checks an open local file against where its descriptor really leads
 * (/proc/self/fd), which no symlink swapped after cwi_io_check_read can
 * change; `path` names it in the error. */
cachew_err cwi_io_check_read_fd(int fd, const char *path);
/* Checks a glob pattern before it is expanded: the directory part before
 * its first wildcard (a local directory, or for s3:// and gs:// the URL up
 * to the wildcard) must be readable. Each match is then checked with
 * cwi_io_check_read. */
cachew_err cwi_io_check_glob(const char *pattern);
/* Checks a local path or URL that a pipeline is about to create or write
 * (tfrecord_write's file). */
cachew_err cwi_io_check_write(const char *path);
/* True when `path` may be written: cwi_io_check_write without the error. */
bool cwi_io_may_write(const char *path);
/* Checks the root of a cache that a pipeline writes: on a confined
 * process it must be one of the write roots itself (not a directory below
 * one), so that the root's capacity counts every cache there. *capacity
 * is that root's capacity, 0 when there is no bound. */
cachew_err cwi_io_check_cache_root(const char *root, uint64_t *capacity);
/* Checks a connection of `url` (a URL the pipeline names, or a redirect's
 * target) to a peer address, given as a socket address or as text
 * ("127.0.0.1", "::1"): a private, loopback or link-local address is
 * allowed only through an --allow-read prefix naming it. */
cachew_err cwi_io_check_peer(const char *url, const struct sockaddr *sa);
cachew_err cwi_io_check_peer_text(const char *url, const char *ip);

#endif /* CWI_IO_POLICY_H */
