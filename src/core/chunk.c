/*
 * chunk.c - growable arrays of element references (core.h): what one
 * iterator call, one thread hand-off or one reply moves.
 */
#include "core.h"

#include <stdlib.h>

cachew_err
cwi_chunk_reserve(cwi_chunk *c, size_t extra)
{
	size_t need = c->n + extra, cap;
	cwi_element **v;

	if (need <= c->cap)
		return CACHEW_OK;
	cap = c->cap != 0 ? c->cap : 16;
	while (cap < need)
		cap *= 2;
	v = realloc(c->v, cap * sizeof(*v));
	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->v = v;
	c->cap = cap;
	return CACHEW_OK;
}

void
cwi_chunk_clear(cwi_chunk *c)
{
	for (size_t i = 0; i < c->n; i++)
		cwi_element_release(c->v[i]);
	c->n = 0;
}

void
cwi_chunk_free(cwi_chunk *c)
{
	cwi_chunk_clear(c);
	free(c->v);
	c->v = NULL;
	c->cap = 0;
}


bool
cwi_chunk_move_all(cwi_chunk *dst, cwi_chunk *src)
{
	if (cwi_chunk_reserve(dst, src->n) != CACHEW_OK)
		return false;
	for (size_t i = 0; i < src->n; i++)
		dst->v[dst->n++] = src->v[i];
	src->n = 0;
	return true;
}
