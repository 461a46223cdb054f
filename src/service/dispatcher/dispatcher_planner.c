/*
 * dispatcher_planner.c - the autocaching planner's state as part of the
 * dispatcher's (docs/journal.md, "The planner's state").
 *
 * The planner (dispatcher_autocache.c) runs outside the state machine,
 * for it does I/O; what it has learned (the cache storage's rates, and
 * per dataset its decision and profile) is a few lines of text. The state
 * machine keeps a copy of them so that the journal and the snapshot carry
 * them: after each planner call the server journals the lines that
 * changed (cwi_jrec_planner), applies that record here as a replay does,
 * and a restart gives the copy back to the planner.
 *
 * The copy keeps the planner's order: the storage line first, then the
 * datasets in the order the planner first met them (a new key is
 * appended). So it reads back as the planner's own text, byte for byte,
 * which journal_verify compares at a clean stop.
 *
 * Cost: after each call the server hands over the planner's whole text
 * (a few hundred bytes a dataset); it is walked alongside the copy, which
 * is in the same order, so finding what changed is one pass, and only the
 * lines that changed are parsed. A record's line is found by a scan:
 * datasets number tens, at most CWI_DCACHE_MAX_DATASETS.
 *
 * Thread safety: none, as the rest of the state machine.
 */
#include "dispatcher_int.h"
#include "dispatcher_autocache.h"

#include <stdlib.h>
#include <string.h>

static bool
same_key(const planner_line *l, const char *line, size_t key_len)
{
	return l->key_len == key_len && memcmp(l->text, line, key_len) == 0;
}

/* The index of the line with line's key, trying hint first (the planner's
 * text comes in the copy's order); d->nplanner when there is none. */
static size_t
find(const cwi_dispatcher *d, const char *line, size_t key_len, size_t hint)
{
	if (hint < d->nplanner && same_key(&d->planner[hint], line, key_len))
		return hint;
	for (size_t i = 0; i < d->nplanner; i++)
		if (same_key(&d->planner[i], line, key_len))
			return i;
	return d->nplanner;
}

static bool
is_storage(const char *line, size_t key_len)
{
	return key_len == strlen("storage") &&
	       memcmp(line, "storage", key_len) == 0;
}

/* Sets the line at index `at` (d->nplanner: a new key, appended, or
 * first for the storage line). */
static cachew_err
put_line(cwi_dispatcher *d, size_t at, const char *line, size_t len,
    size_t key_len)
{
	planner_line l = {cwi_strndup(line, len), len, key_len};
	size_t datasets = d->nplanner;

	if (l.text == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (at < d->nplanner) {
		free(d->planner[at].text);
		d->planner[at] = l;
		return CACHEW_OK;
	}
	if (d->nplanner > 0 && is_storage(d->planner[0].text,
				   d->planner[0].key_len))
		datasets--;
	if (!is_storage(line, key_len) && datasets >= CWI_DCACHE_MAX_DATASETS) {
		free(l.text);
		return cwi_fail(CACHEW_ECORRUPT, "more than %d datasets",
		    CWI_DCACHE_MAX_DATASETS);
	}
	if (d->nplanner == d->capplanner) {
		size_t cap = d->capplanner > 0 ? 2 * d->capplanner : 8;
		planner_line *v = realloc(d->planner, cap * sizeof(*v));
		if (v == NULL) {
			free(l.text);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		d->planner = v;
		d->capplanner = cap;
	}
	if (is_storage(line, key_len)) {
		memmove(d->planner + 1, d->planner,
		    d->nplanner * sizeof(*d->planner));
		d->planner[0] = l;
	} else {
		d->planner[d->nplanner] = l;
	}
	d->nplanner++;
	return CACHEW_OK;
}

cachew_err
cwi_planner_load_line(cwi_dispatcher *d, const char *line, size_t len)
{
	size_t key_len;
	cachew_err rv = cwi_dcache_line_check(line, len, &key_len);

	if (rv != CACHEW_OK)
		return rv;
	if (find(d, line, key_len, 0) != d->nplanner)
		return cwi_fail(CACHEW_ECORRUPT, "a second line of \"%.*s\"",
		    (int)key_len, line);
	if (is_storage(line, key_len) && d->nplanner > 0)
		return cwi_fail(CACHEW_ECORRUPT, "the storage line is not "
		    "first");
	return put_line(d, d->nplanner, line, len, key_len);
}

/* A record's lines: at least one, each ending in '\n', each checked. */
static cachew_err
check_lines(const char *text, size_t len)
{
	size_t at = 0, lineno = 0, key_len;

	if (len == 0 || text[len - 1] != '\n')
		return cwi_fail(CACHEW_ECORRUPT, "planner: %s",
		    len == 0 ? "no line" : "the last line has no newline");
	while (at < len) {
		const char *nl = memchr(text + at, '\n', len - at);
		size_t n = (size_t)(nl - (text + at));

		lineno++;
		if (cwi_dcache_line_check(text + at, n, &key_len) != CACHEW_OK)
			return cwi_fail(CACHEW_ECORRUPT, "planner: line %zu: %s",
			    lineno, cachew_errmsg());
		at += n + 1;
	}
	return CACHEW_OK;
}

cachew_err
cwi_planner_merge(cwi_dispatcher *d, const char *text, size_t len)
{
	size_t at = 0, hint = 0, key_len, i;
	cachew_err rv = check_lines(text, len);

	while (rv == CACHEW_OK && at < len) {
		const char *line = text + at, *nl = memchr(line, '\n', len - at);
		size_t n = (size_t)(nl - line);

		(void)cwi_dcache_line_check(line, n, &key_len); /* checked */
		i = find(d, line, key_len, hint);
		rv = put_line(d, i, line, n, key_len);
		if (rv == CACHEW_ECORRUPT)
			rv = cwi_fail(rv, "planner: %s", cachew_errmsg());
		hint = i + 1;
		at += n + 1;
	}
	return rv;
}

void
cwi_planner_clear(cwi_dispatcher *d)
{
	for (size_t i = 0; i < d->nplanner; i++)
		free(d->planner[i].text);
	free(d->planner);
	d->planner = NULL;
	d->nplanner = d->capplanner = 0;
}

cachew_err
cwi_planner_diff(const cwi_dispatcher *d, const char *text, size_t len,
    cwi_strbuf *out)
{
	size_t at = 0, hint = 0, lineno = 0, key_len, i;

	while (at < len) {
		const char *line = text + at, *nl = memchr(line, '\n', len - at);
		size_t n = nl != NULL ? (size_t)(nl - line) : len - at;
		const planner_line *had = hint < d->nplanner ? &d->planner[hint]
							     : NULL;

		lineno++;
		at += n + 1;
		/* Unchanged, in its place: most lines, not parsed again. */
		if (had != NULL && had->len == n &&
		    memcmp(had->text, line, n) == 0) {
			hint++;
			continue;
		}
		if (cwi_dcache_line_check(line, n, &key_len) != CACHEW_OK)
			return cwi_fail(CACHEW_ECORRUPT, "planner: line %zu: %s",
			    lineno, cachew_errmsg());
		i = find(d, line, key_len, hint);
		had = i < d->nplanner ? &d->planner[i] : NULL;
		if (had != NULL)
			hint = i + 1;
		if (had == NULL || had->len != n ||
		    memcmp(had->text, line, n) != 0) {
			cwi_strbuf_append(out, line, n);
			cwi_strbuf_append(out, "\n", 1);
		}
	}
	return out->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}

cachew_err
cwi_dispatcher_planner_text(const cwi_dispatcher *d, cwi_strbuf *out)
{
	for (size_t i = 0; i < d->nplanner; i++) {
		cwi_strbuf_append(out, d->planner[i].text, d->planner[i].len);
		cwi_strbuf_append(out, "\n", 1);
	}
	return out->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}
