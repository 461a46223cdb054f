/*
 * cache_parts.c - completing a cache written in parts (docs/cache-format.md,
 * "Caches written in parts").
 *
 * In a distributed write every lease of the source's split units writes
 * its elements through a part writer (cwi_cache_writer_opts.part_write_id):
 * its own chunks, then a part file, a manifest-format file listing those
 * chunks and the units it covered. A lease that is replayed (its worker
 * died before the client acknowledged it) writes a second part for the
 * same units; a writer that crashed leaves chunks without a part file.
 * The commit here picks one part per unit, writes the cache's manifest
 * over their chunks and removes everything else of that write, so what
 * becomes visible holds each unit's elements exactly once.
 *
 * Locks: the commit holds the cache's lock shared, like the part writers,
 * so gc and rm leave the directory alone meanwhile.
 */
#include "cache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

typedef struct part {
	char *path;
	cwi_cache_manifest *m;
	bool picked;
} part;

typedef struct parts {
	part *v;
	size_t n;
	cwi_unit_range *picked; /* ranges of the picked parts */
	size_t npicked, cap;
} parts;

static void
parts_free(parts *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->v[i].path);
		cwi_cache_manifest_free(p->v[i].m);
	}
	free(p->v);
	free(p->picked);
}

/* "part-<write id>-": the prefix of every file of one write. */
static void
write_prefix(uint64_t write_id, char *buf, size_t size)
{
	snprintf(buf, size, CWI_CACHE_PART_PREFIX "%016llx-",
	    (unsigned long long)write_id);
}

static const char *
base_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash != NULL ? slash + 1 : path;
}

static bool
is_part_file(const char *name, const char *prefix)
{
	size_t n = strlen(name), lp = strlen(prefix),
	       ls = strlen(CWI_CACHE_PART_SUFFIX);

	return n > lp + ls && strncmp(name, prefix, lp) == 0 &&
	       strcmp(name + n - ls, CWI_CACHE_PART_SUFFIX) == 0;
}

static int range_cmp(const void *a, const void *b);

/* A part's own ranges must not overlap: a lease reads each unit once. */
static cachew_err
units_disjoint(const cwi_cache_manifest *m, const char *name)
{
	cwi_unit_range *v = malloc(m->nunits * sizeof(*v));
	cachew_err rv = CACHEW_OK;

	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	memcpy(v, m->units, m->nunits * sizeof(*v));
	qsort(v, m->nunits, sizeof(*v), range_cmp);
	for (size_t i = 1; i < m->nunits; i++)
		if (v[i].begin < v[i - 1].end) {
			rv = cwi_fail(CACHEW_ECORRUPT,
			    "%s: its unit ranges overlap at unit %llu", name,
			    (unsigned long long)v[i].begin);
			break;
		}
	free(v);
	return rv;
}

/* Reads and checks every part file of the write. */
static cachew_err
load_parts(const cwi_cache_root *r, const cachew_fingerprint *fp,
    char **names, size_t nnames, const char *prefix, parts *p)
{
	p->v = calloc(nnames + 1, sizeof(*p->v));
	if (p->v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < nnames; i++) {
		cwi_buffer *b = NULL;
		size_t len = 0;
		part *pt;
		cachew_err rv;

		if (!is_part_file(base_name(names[i]), prefix))
			continue;
		pt = &p->v[p->n++];
		pt->path = cwi_strdup(names[i]);
		if (pt->path == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		rv = cwi_cache_read_small(names[i], CWI_CACHE_MAX_MANIFEST_BYTES,
		    &b, &len);
		if (rv == CACHEW_OK)
			rv = cwi_cache_manifest_decode(b->data, len, &pt->m);
		cwi_buffer_unref(b);
		if (rv == CACHEW_ECORRUPT)
			return cwi_fail(CACHEW_ECORRUPT, "%s: %s", names[i],
			    cachew_errmsg());
		if (rv != CACHEW_OK)
			return rv;
		if (memcmp(&pt->m->fp, fp, sizeof(*fp)) != 0 ||
		    pt->m->nunits == 0)
			return cwi_fail(CACHEW_ECORRUPT,
			    "%s: not a part of this cache (%s)", names[i],
			    pt->m->nunits == 0 ? "no units"
					       : "another fingerprint");
		rv = units_disjoint(pt->m, names[i]);
		if (rv != CACHEW_OK)
			return rv;
	}
	(void)r;
	return CACHEW_OK;
}

/* Parts in order of their first unit; the earlier writer (by name: the
 * writer id is random, so this is only deterministic) on ties. */
static int
part_cmp(const void *a, const void *b)
{
	const part *x = a, *y = b;
	uint64_t ux = x->m->units[0].begin, uy = y->m->units[0].begin;

	if (ux != uy)
		return ux < uy ? -1 : 1;
	if (x->m->nunits != y->m->nunits)
		return x->m->nunits > y->m->nunits ? -1 : 1;
	return strcmp(x->path, y->path);
}

static int
range_cmp(const void *a, const void *b)
{
	const cwi_unit_range *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return 0;
}

/* The index of the first picked range (picked is kept sorted by begin,
 * and disjoint) whose begin is >= b. */
static size_t
picked_lower(const parts *p, uint64_t b)
{
	size_t lo = 0, hi = p->npicked;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->picked[mid].begin < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Logarithmic per range: a write of many leases has many parts. */
static bool
overlaps_picked(const parts *p, const cwi_cache_manifest *m)
{
	for (size_t i = 0; i < m->nunits; i++) {
		const cwi_unit_range *r = &m->units[i];
		size_t k = picked_lower(p, r->end);
		/* picked[k-1] is the last range beginning before r ends. */
		if (k > 0 && p->picked[k - 1].end > r->begin)
			return true;
	}
	return false;
}

/* Adds the part's ranges to the sorted picked ranges. */
static cachew_err
pick(parts *p, part *pt)
{
	const cwi_cache_manifest *m = pt->m;

	if (p->npicked + m->nunits > p->cap) {
		size_t cap = 2 * (p->npicked + m->nunits);
		cwi_unit_range *v = realloc(p->picked, cap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		p->picked = v;
		p->cap = cap;
	}
	for (size_t i = 0; i < m->nunits; i++) {
		size_t k = picked_lower(p, m->units[i].begin);
		memmove(p->picked + k + 1, p->picked + k,
		    (p->npicked - k) * sizeof(*p->picked));
		p->picked[k] = m->units[i];
		p->npicked++;
	}
	pt->picked = true;
	return CACHEW_OK;
}

/* Picks parts until every unit is covered once; checks they tile
 * [0, units_total). */
static cachew_err
pick_cover(parts *p, uint64_t units_total, const char *dir)
{
	uint64_t next = 0;
	cachew_err rv;

	qsort(p->v, p->n, sizeof(*p->v), part_cmp);
	for (size_t i = 0; i < p->n; i++) {
		if (overlaps_picked(p, p->v[i].m))
			continue;
		rv = pick(p, &p->v[i]);
		if (rv != CACHEW_OK)
			return rv;
	}
	size_t i = 0;
	for (; i < p->npicked && p->picked[i].begin == next; i++)
		next = p->picked[i].end;
	/* Picked ranges past a gap (sorted: the last ends highest) count
	 * too: a tiling of [0, units_total) followed by a stray part is
	 * no tiling. */
	if (next > units_total || (next == units_total && i < p->npicked))
		return cwi_fail(CACHEW_EINVAL,
		    "cache %s: parts cover units up to %llu, the source has %llu",
		    dir, (unsigned long long)p->picked[p->npicked - 1].end,
		    (unsigned long long)units_total);
	if (next < units_total)
		return cwi_fail(CACHEW_ENOENT,
		    "cache %s: no part covers unit %llu of %llu yet", dir,
		    (unsigned long long)next, (unsigned long long)units_total);
	return CACHEW_OK;
}

/* Both unnamed, or the same name for every component. */
static bool
names_equal(const cwi_names *a, const cwi_names *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	if (a->n != b->n)
		return false;
	for (uint32_t i = 0; i < a->n; i++)
		if ((a->name[i] == NULL) != (b->name[i] == NULL) ||
		    (a->name[i] != NULL && strcmp(a->name[i], b->name[i]) != 0))
			return false;
	return true;
}

/* The picked parts' element specs, merged: same components, dtypes,
 * ranks and names (every lease runs the same pipeline); a dimension that
 * differs varies (-1). */
static cachew_err
merge_spec(const parts *p, cwi_cache_manifest *out, const char *dir)
{
	bool first = true;

	for (size_t i = 0; i < p->n; i++) {
		const cwi_cache_manifest *m = p->v[i].m;
		if (!p->v[i].picked || m->elements == 0)
			continue;
		if (first) {
			out->spec = calloc(m->ncomponents, sizeof(*out->spec));
			if (out->spec == NULL)
				return cwi_fail(CACHEW_ENOMEM, "out of memory");
			memcpy(out->spec, m->spec,
			    m->ncomponents * sizeof(*m->spec));
			out->ncomponents = m->ncomponents;
			out->names = cwi_names_ref(m->names);
			first = false;
			continue;
		}
		if (m->ncomponents != out->ncomponents)
			return cwi_fail(CACHEW_ETYPE,
			    "cache %s: part %s has %zu components, others %zu",
			    dir, base_name(p->v[i].path), m->ncomponents,
			    out->ncomponents);
		for (size_t c = 0; c < m->ncomponents; c++) {
			cwi_cache_spec *s = &out->spec[c];
			if (m->spec[c].dtype != s->dtype ||
			    m->spec[c].rank != s->rank)
				return cwi_fail(CACHEW_ETYPE,
				    "cache %s: part %s: component %zu differs "
				    "in dtype or rank from the other parts",
				    dir, base_name(p->v[i].path), c);
			for (unsigned d = 0; d < s->rank; d++)
				if (m->spec[c].shape[d] != s->shape[d])
					s->shape[d] = -1;
		}
		if (!names_equal(m->names, out->names))
			return cwi_fail(CACHEW_ETYPE,
			    "cache %s: part %s names its components otherwise "
			    "than the other parts", dir,
			    base_name(p->v[i].path));
	}
	return CACHEW_OK;
}

/* The manifest over the picked parts' chunks, in part order. */
static cachew_err
build_manifest(const parts *p, const cachew_fingerprint *fp,
    const char *pipeline, cwi_cache_manifest *out, const char *dir)
{
	size_t nchunks = 0;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	out->fp = *fp;
	out->writer_version = CACHEW_VERSION_NUMBER;
	out->cache_id = cwi_cache_random64();
	out->created_unix = (int64_t)time(NULL);
	out->pipeline = cwi_strdup(pipeline != NULL ? pipeline : "");
	if (out->pipeline == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = merge_spec(p, out, dir);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = 0; i < p->n; i++)
		if (p->v[i].picked)
			nchunks += p->v[i].m->nchunks;
	out->chunks = calloc(nchunks + 1, sizeof(*out->chunks));
	if (out->chunks == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < p->n; i++) {
		const cwi_cache_manifest *m = p->v[i].m;
		if (!p->v[i].picked)
			continue;
		for (size_t c = 0; c < m->nchunks; c++) {
			cwi_cache_chunk_info *ci = &out->chunks[out->nchunks];
			*ci = m->chunks[c];
			ci->name = cwi_strdup(m->chunks[c].name);
			if (ci->name == NULL)
				return cwi_fail(CACHEW_ENOMEM, "out of memory");
			out->nchunks++;
			out->elements += ci->elements;
			out->bytes += ci->bytes;
		}
	}
	return CACHEW_OK;
}

/* Part writers do not fsync (a write of many leases would pay a few
 * fsyncs per lease on the workers' data path): the commit makes every
 * chunk it lists durable, and their directory entries, before the
 * manifest names them. */
static cachew_err
sync_chunks(const cwi_cache_root *r, const char *dir,
    const cwi_cache_manifest *m)
{
	cachew_err rv = CACHEW_OK;

	if (r->s3)
		return CACHEW_OK;
	for (size_t i = 0; rv == CACHEW_OK && i < m->nchunks; i++) {
		char *path = cwi_asprintf("%s/%s", dir, m->chunks[i].name);
		int fd;

		if (path == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
		if (fd < 0 || fsync(fd) != 0)
			rv = cwi_fail(CACHEW_EIO, "%s: fsync failed: %s", path,
			    strerror(errno));
		if (fd >= 0)
			close(fd);
		free(path);
	}
	if (rv == CACHEW_OK)
		rv = cwi_cache_fsync_dir(dir);
	return rv;
}

static bool
in_manifest(const cwi_cache_manifest *m, const char *name)
{
	for (size_t i = 0; i < m->nchunks; i++)
		if (strcmp(m->chunks[i].name, name) == 0)
			return true;
	return false;
}

/* Removes the write's files that `keep` does not list (keep NULL: all). */
static void
remove_write_files(const cwi_cache_root *r, char **names, size_t n,
    const char *prefix, const cwi_cache_manifest *keep)
{
	for (size_t i = 0; i < n; i++) {
		const char *b = base_name(names[i]);
		if (strncmp(b, prefix, strlen(prefix)) != 0)
			continue;
		if (keep != NULL && in_manifest(keep, b))
			continue;
		(void)cwi_cache_unlink(r, names[i]);
	}
}

cachew_err
cwi_cache_parts_commit(cwi_cache_root *r, const cachew_fingerprint *fp,
    const char *pipeline, uint64_t write_id, uint64_t units_total,
    uint64_t *elements)
{
	char prefix[64], **names = NULL;
	uint64_t *sizes = NULL;
	size_t nnames = 0;
	parts p = {0};
	cwi_cache_manifest m = {0}, *existing = NULL;
	cwi_strbuf sb;
	char *dir = cwi_cache_dir_path(r, fp);
	int lockfd = -1;
	cachew_err rv;

	if (dir == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_strbuf_init(&sb);
	write_prefix(write_id, prefix, sizeof(prefix));
	rv = cwi_cache_lookup(r, fp, &existing);
	cwi_cache_manifest_free(existing);
	if (rv == CACHEW_OK) {
		rv = cwi_fail(CACHEW_EEXIST, "cache %s already exists", dir);
		goto done;
	}
	if (rv != CACHEW_ENOENT)
		goto done;
	if (!r->s3) {
		rv = cwi_cache_lock(dir, LOCK_SH, false, &lockfd);
		if (rv == CACHEW_ENOENT)
			rv = cwi_fail(CACHEW_ENOENT, "cache %s: no parts written",
			    dir);
		if (rv != CACHEW_OK)
			goto done;
	}
	rv = cwi_cache_list_dir(r, dir, &names, &sizes, &nnames);
	if (rv == CACHEW_OK)
		rv = load_parts(r, fp, names, nnames, prefix, &p);
	if (rv == CACHEW_OK)
		rv = pick_cover(&p, units_total, dir);
	if (rv == CACHEW_OK)
		rv = build_manifest(&p, fp, pipeline, &m, dir);
	if (rv == CACHEW_OK)
		rv = sync_chunks(r, dir, &m);
	if (rv == CACHEW_OK)
		rv = cwi_cache_manifest_encode(&m, &sb);
	if (rv == CACHEW_OK)
		rv = cwi_cache_put_file(r, dir, CWI_CACHE_FILE_MANIFEST, sb.data,
		    sb.len, true);
	if (rv != CACHEW_OK)
		goto done;
	/* Visible now. What no reader of this manifest needs goes: the
	 * part files, the parts that were not picked, crashed writers'
	 * chunks. */
	remove_write_files(r, names, nnames, prefix, &m);
	if (elements != NULL)
		*elements = m.elements;
	cwi_log(CACHEW_LOG_INFO, "cache",
	    "%s: committed %llu elements in %zu chunks from %zu parts", dir,
	    (unsigned long long)m.elements, m.nchunks, p.n);
done:
	cwi_strbuf_free(&sb);
	cwi_cache_manifest_clear(&m);
	parts_free(&p);
	cwi_cache_names_free(names, sizes, nnames);
	cwi_cache_unlock(lockfd);
	free(dir);
	return rv;
}

cachew_err
cwi_cache_parts_abort(cwi_cache_root *r, const cachew_fingerprint *fp,
    uint64_t write_id)
{
	char prefix[64], **names = NULL;
	uint64_t *sizes = NULL;
	size_t nnames = 0;
	char *dir = cwi_cache_dir_path(r, fp);
	int lockfd = -1;
	cachew_err rv = CACHEW_OK;

	if (dir == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	write_prefix(write_id, prefix, sizeof(prefix));
	if (!r->s3)
		rv = cwi_cache_lock(dir, LOCK_SH, false, &lockfd);
	if (rv == CACHEW_ENOENT) {
		free(dir);
		return CACHEW_OK; /* nothing was written */
	}
	if (rv == CACHEW_OK)
		rv = cwi_cache_list_dir(r, dir, &names, &sizes, &nnames);
	if (rv == CACHEW_OK)
		remove_write_files(r, names, nnames, prefix, NULL);
	cwi_cache_names_free(names, sizes, nnames);
	cwi_cache_unlock(lockfd);
	free(dir);
	return rv;
}
