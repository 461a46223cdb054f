/*
 * worker_confine.c - a cachewd worker's pipelines touch only what its
 * operator allows: --allow-read and --cache-root become the process's
 * access policy (src/io/io_policy.h, docs/security.md), installed before
 * the worker takes its first task.
 *
 * Cache roots are created here, as the worker's user (after --user), and
 * each local one gets a capacity: --cache-capacity, or by default what the
 * caches there hold at start plus 90% of the free space of its file
 * system. So writes that a client never commits (the parts of a write_id
 * no one commits, left by the hundred) cannot fill the disk: when a write
 * needs room, the cache store evicts partial caches (where such parts
 * live) first, then the least recently read, and refuses the write when
 * that is not enough. An s3:// root has no default bound.
 */
#include "../service.h"
#include "../../cache/cache.h"
#include "../../io/io_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>

/* The most items of --allow-read or --cache-root. */
#define CONFINE_MAX_ITEMS 64

/* Splits a ','-separated list in place into at most max items; returns
 * how many there were (more than max: too many). */
static size_t
split_list(char *list, const char **items, size_t max)
{
	size_t n = 0;
	char *save = NULL;

	for (char *p = strtok_r(list, ",", &save); p != NULL;
	     p = strtok_r(NULL, ",", &save)) {
		if (n < max)
			items[n] = p;
		n++;
	}
	return n;
}

static bool
is_local(const char *root)
{
	return strstr(root, "://") == NULL || strncmp(root, "file://", 7) == 0;
}

/* What the caches under a local root hold plus 90% of its file system's
 * free space; 0 (no bound) when the file system cannot be measured. */
static uint64_t
default_capacity(const char *root)
{
	cwi_cache_root *r = NULL;
	cwi_cache_entry *v = NULL;
	struct statvfs sv;
	uint64_t used = 0;
	size_t n = 0;

	if (statvfs(root, &sv) != 0)
		return 0;
	if (cwi_cache_root_open(&r, root, 0) == CACHEW_OK &&
	    cwi_cache_list(r, &v, &n) == CACHEW_OK)
		for (size_t i = 0; i < n; i++)
			used += v[i].bytes;
	cwi_cache_entries_free(v, n);
	cwi_cache_root_close(r);
	cwi_clear_errmsg();
	return used + (uint64_t)sv.f_bavail * sv.f_frsize / 10 * 9;
}

cachew_err
cwi_worker_confine(const cwi_service_config *cfg)
{
	char reads[sizeof(cfg->allow_read)], roots[sizeof(cfg->cache_root)];
	const char *ritems[CONFINE_MAX_ITEMS], *witems[CONFINE_MAX_ITEMS];
	cwi_io_write_root w[CONFINE_MAX_ITEMS];
	size_t nr, nw;
	cachew_err rv;

	memcpy(reads, cfg->allow_read, sizeof(reads));
	memcpy(roots, cfg->cache_root, sizeof(roots));
	nr = split_list(reads, ritems, CONFINE_MAX_ITEMS);
	nw = split_list(roots, witems, CONFINE_MAX_ITEMS);
	if (nr > CONFINE_MAX_ITEMS || nw > CONFINE_MAX_ITEMS)
		return cwi_fail(CACHEW_EINVAL, "more than %d --%s items",
		    CONFINE_MAX_ITEMS,
		    nr > CONFINE_MAX_ITEMS ? "allow-read" : "cache-root");
	for (size_t i = 0; i < nw; i++) {
		const char *path = witems[i];
		if (is_local(path)) {
			if (strncmp(path, "file://", 7) == 0)
				path += 7;
			rv = cwi_cache_mkdirs(path);
			if (rv != CACHEW_OK)
				return cwi_fail(rv, "--cache-root %s: %s", witems[i],
				    cwi_errmsg_get());
		}
		w[i].path = witems[i];
		w[i].capacity = cfg->cache_capacity > 0
		    ? (uint64_t)cfg->cache_capacity
		    : is_local(path) ? default_capacity(path) : 0;
		cwi_log(CACHEW_LOG_INFO, "worker", "event=cache_root path=%s "
		    "capacity=%llu", witems[i], (unsigned long long)w[i].capacity);
	}
	rv = cwi_io_policy_install(ritems, nr, w, nw);
	if (rv != CACHEW_OK)
		return rv;
	cwi_log(CACHEW_LOG_INFO, "worker", "event=confined allow_read=\"%s\" "
	    "cache_root=\"%s\"", cfg->allow_read, cfg->cache_root);
	return CACHEW_OK;
}
