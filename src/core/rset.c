/*
 * rset.c - range sets (core.h): ascending, disjoint half-open ranges of
 * uint64 indices, merged on insert.
 */
#include "core.h"
#include "msgpack_doc.h"

#include <inttypes.h>
#include <stdlib.h>

/* The first range whose end is >= x (n/2 when none): binary search. */
static size_t
first_ending_at_or_after(const cwi_rset *s, uint64_t x)
{
	size_t lo = 0, hi = s->n / 2;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (s->v[2 * mid + 1] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

bool
cwi_rset_add(cwi_rset *s, uint64_t from, uint64_t to)
{
	size_t i, j, nr = s->n / 2;

	if (from >= to)
		return true;
	/* Ranges i..j-1 touch or overlap [from, to): they merge into it. */
	i = first_ending_at_or_after(s, from);
	for (j = i; j < nr && s->v[2 * j] <= to; j++)
		;
	if (i == j) {
		/* A new range at i. */
		if (!CWI_GROW(s->v, s->cap, s->n + 2))
			return false;
		memmove(&s->v[2 * i + 2], &s->v[2 * i],
		    (s->n - 2 * i) * sizeof(*s->v));
		s->v[2 * i] = from;
		s->v[2 * i + 1] = to;
		s->n += 2;
		return true;
	}
	if (s->v[2 * i] < from)
		from = s->v[2 * i];
	if (s->v[2 * (j - 1) + 1] > to)
		to = s->v[2 * (j - 1) + 1];
	s->v[2 * i] = from;
	s->v[2 * i + 1] = to;
	memmove(&s->v[2 * i + 2], &s->v[2 * j], (s->n - 2 * j) * sizeof(*s->v));
	s->n -= 2 * (j - i - 1);
	return true;
}

bool
cwi_rset_add_list(cwi_rset *s, const uint64_t *pairs, size_t n)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		if (!cwi_rset_add(s, pairs[i], pairs[i + 1]))
			return false;
	return true;
}

bool
cwi_rset_has(const cwi_rset *s, uint64_t x)
{
	size_t i = first_ending_at_or_after(s, x + 1);

	return x != UINT64_MAX && i < s->n / 2 && s->v[2 * i] <= x;
}

bool
cwi_rset_covers(const cwi_rset *s, uint64_t from, uint64_t to)
{
	size_t i;

	if (from >= to)
		return true;
	i = first_ending_at_or_after(s, from + 1);
	return i < s->n / 2 && s->v[2 * i] <= from && s->v[2 * i + 1] >= to;
}

uint64_t
cwi_rset_count(const cwi_rset *s)
{
	uint64_t total = 0;

	for (size_t i = 0; i + 1 < s->n; i += 2) {
		uint64_t len = s->v[i + 1] - s->v[i];
		total = total + len < total ? UINT64_MAX : total + len;
	}
	return total;
}

bool
cwi_rset_list_ok(const uint64_t *pairs, size_t n)
{
	if (n % 2 != 0)
		return false;
	for (size_t i = 0; i < n; i += 2) {
		if (pairs[i] >= pairs[i + 1])
			return false;
		if (i > 0 && pairs[i] < pairs[i - 1])
			return false;
	}
	return true;
}

void
cwi_rset_free(cwi_rset *s)
{
	free(s->v);
	s->v = NULL;
	s->n = 0;
	s->cap = 0;
}

/* ---- msgpack (msgpack_doc.h) --------------------------------------------- */

void
cwi_rset_put_msgpack(cwi_strbuf *sb, const cwi_rset *s)
{
	cwi_msgpack_put_array(sb, s->n);
	for (size_t i = 0; i < s->n; i++)
		cwi_msgpack_put_uint(sb, s->v[i]);
}

bool
cwi_rset_get_msgpack(cwi_mp_doc *d, const char *field, uint64_t max_ranges,
    cwi_rset *s)
{
	uint64_t n;

	if (!cwi_mp_doc_array(d, field, max_ranges * 2, &n))
		return false;
	if (n % 2 != 0)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " bounds: ranges come in pairs", n);
	if (n == 0)
		return true;
	s->v = malloc((size_t)n * sizeof(*s->v));
	if (s->v == NULL)
		return cwi_mp_doc_fail(d, CACHEW_ENOMEM, field, "out of memory");
	s->cap = (size_t)n;
	for (size_t i = 0; i < n; i++) {
		/* Ascending and never touching: a range's start lies past
		 * the previous end, its end past its start. */
		uint64_t lo = i == 0 ? 0 : s->v[i - 1] + 1;
		if (i > 0 && s->v[i - 1] == UINT64_MAX)
			return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
			    "bound %zu follows the largest value", i);
		if (!cwi_mp_doc_u64(d, field, lo, UINT64_MAX, &s->v[i]))
			return false;
		s->n = i + 1;
	}
	return true;
}
