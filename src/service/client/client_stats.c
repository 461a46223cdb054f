/*
 * client_stats.c - the iterator's view of the worker part and what the
 * service delivered:
 *   - the worker part's operator rows, one per operator of the plan's
 *     worker part (named from the plan at once, so the rows are the plain
 *     executor's from the first call on), their counters summed over the
 *     job's tasks: from the dispatcher's heartbeat replies for remote
 *     workers (the fetch thread asks once more when the epoch's data is
 *     all in, and those rows are exact: docs/protocol.md, "Operator
 *     counters"), from task_stats for a direct task (client_direct.c).
 *     cachew_iterator_stats shows them in place of the stream's own row,
 *     and a session that ends adds its counters to the earlier epochs';
 *   - the elements (and payload bytes) the session handed to the client
 *     part, which heartbeats and the job's release report: the job's
 *     counters in the dispatcher's status.
 *
 * Lock order: ctx->rows_lock, then s->lock (client_int.h).
 */
#include "client_int.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_ROWS (sizeof(((client_ctx *)0)->rows) / \
		  sizeof(((client_ctx *)0)->rows[0]))

/* ---- the rows ------------------------------------------------------------ */

void
cwi_client_rows_prefill(client_ctx *ctx)
{
	const cwi_node *v[MAX_ROWS];
	size_t n = 0;

	/* The worker part is a chain from its top down to the source. */
	for (const cwi_node *x = ctx->plan->worker; x != NULL && n < MAX_ROWS;
	     x = x->ninputs > 0 ? x->inputs[0] : NULL)
		v[n++] = x;
	for (size_t i = 0; i < n; i++) {
		const cwi_node *x = v[n - 1 - i];
		op_row *w = &ctx->rows[i];

		memset(w, 0, sizeof(*w));
		snprintf(w->name, sizeof(w->name), "%s", x->op->name);
		snprintf(w->detail, sizeof(w->detail), "%s",
		    x->detail != NULL ? x->detail : "");
		w->s.node = (int)i;
		w->s.parallelism = 1;
	}
	ctx->nrows = n;
}

/* One row of a heartbeat reply, named "<node>:<name>[/<detail>]"; false
 * when the name has no valid node. */
static bool
row_from_counters(client_ctx *ctx, const cwi_op_counters *c, size_t *extent)
{
	char *end;
	long node = strtol(c->name, &end, 10);
	const char *name, *slash;
	op_row *w;
	int len;

	if (end == c->name || *end != ':' || node < 0 ||
	    (size_t)node >= MAX_ROWS)
		return false;
	name = end + 1;
	slash = strchr(name, '/');
	len = slash != NULL ? (int)(slash - name) : (int)strlen(name);
	w = &ctx->rows[node];
	memset(w, 0, sizeof(*w));
	snprintf(w->name, sizeof(w->name), "%.*s", len, name);
	snprintf(w->detail, sizeof(w->detail), "%s",
	    slash != NULL ? slash + 1 : "");
	w->s.node = (int)node;
	w->s.elements = c->elements;
	w->s.bytes = c->bytes;
	w->s.busy_ns = c->busy_ns;
	w->s.dropped = c->dropped;
	w->s.cache_hit_bytes = c->cache_hit_bytes;
	w->s.wait_ns = c->wait_ns;
	w->s.parallelism = c->parallelism > 0 && c->parallelism <= INT32_MAX
	    ? (int)c->parallelism : 1;
	w->s.buffer_limit = c->buffer_limit;
	w->s.buffered = c->buffered <= INT64_MAX ? (int64_t)c->buffered : 0;
	if ((size_t)node + 1 > *extent)
		*extent = (size_t)node + 1;
	return true;
}

void
cwi_client_rows_from_reply(session *s, const cwi_msg_client_heartbeat_reply *r)
{
	client_ctx *ctx = s->ctx;
	size_t extent = 0;

	if (r->nops == 0)
		return;
	pthread_mutex_lock(&ctx->rows_lock);
	if (ctx->cur == s && !ctx->inline_seen) {
		/* What the workers ran replaces the plan's rows (an
		 * autocaching pass may run another graph). */
		for (size_t i = 0; i < r->nops; i++)
			(void)row_from_counters(ctx, &r->ops[i], &extent);
		if (extent > 0)
			ctx->nrows = extent;
	}
	pthread_mutex_unlock(&ctx->rows_lock);
}

/* A session ended: its counters join those of the earlier epochs (the
 * plain executor's counters run over all of an iterator's epochs). */
static void
rows_retire(client_ctx *ctx)
{
	for (size_t i = 0; i < ctx->nrows; i++) {
		cachew_op_stats *d = &ctx->done[i];
		const cachew_op_stats *r = &ctx->rows[i].s;
		if (i >= ctx->ndone)
			memset(d, 0, sizeof(*d));
		d->node = r->node;
		d->elements += r->elements;
		d->bytes += r->bytes;
		d->busy_ns += r->busy_ns;
		d->dropped += r->dropped;
		d->cache_hit_bytes += r->cache_hit_bytes;
		d->wait_ns += r->wait_ns;
		d->parallelism = r->parallelism;
		d->buffer_limit = r->buffer_limit;
		d->buffered = 0;
	}
	if (ctx->nrows > ctx->ndone)
		ctx->ndone = ctx->nrows;
	/* The names stay in rows[]; their counters now live in done[]. */
	for (size_t i = 0; i < ctx->nrows; i++) {
		cachew_op_stats keep = ctx->rows[i].s;
		memset(&ctx->rows[i].s, 0, sizeof(ctx->rows[i].s));
		ctx->rows[i].s.node = keep.node;
		ctx->rows[i].s.parallelism = keep.parallelism;
		ctx->rows[i].s.buffer_limit = keep.buffer_limit;
	}
}

size_t
cwi_client_part_stats(void *arg, cachew_op_stats *out, size_t cap,
    size_t *hide)
{
	client_ctx *ctx = arg;
	size_t n;

	pthread_mutex_lock(&ctx->rows_lock);
	if (ctx->cur != NULL)
		cwi_client_rows_refresh(ctx, ctx->cur);
	n = ctx->nrows;
	/* The stream is no operator of the user's: the worker part's rows
	 * stand in for it, as the plain executor would show them. */
	*hide = n > 0 ? 1 : 0;
	for (size_t i = 0; i < n && i < cap; i++) {
		out[i] = ctx->rows[i].s;
		out[i].name = ctx->rows[i].name;
		out[i].detail = ctx->rows[i].detail;
		if (i < 64) {
			/* Batches stitched here from the leases' tails. */
			out[i].elements +=
			    atomic_load(&ctx->stitched.elements[i]);
			out[i].bytes += atomic_load(&ctx->stitched.bytes[i]);
		}
		if (i < ctx->ndone) {
			out[i].elements += ctx->done[i].elements;
			out[i].bytes += ctx->done[i].bytes;
			out[i].busy_ns += ctx->done[i].busy_ns;
			out[i].dropped += ctx->done[i].dropped;
			out[i].cache_hit_bytes +=
			    ctx->done[i].cache_hit_bytes;
			out[i].wait_ns += ctx->done[i].wait_ns;
		}
	}
	pthread_mutex_unlock(&ctx->rows_lock);
	return n;
}

void
cwi_client_session_retire_rows(session *s)
{
	pthread_mutex_lock(&s->ctx->rows_lock);
	if (s->ctx->cur == s) {
		cwi_client_rows_refresh(s->ctx, s);
		rows_retire(s->ctx);
		s->ctx->cur = NULL;
	}
	pthread_mutex_unlock(&s->ctx->rows_lock);
}

/* ---- what the session delivered ------------------------------------------ */

void
cwi_client_count_received(session *s, const cwi_chunk *out, size_t n)
{
	s->elements_received += n;
	for (size_t i = out->n - n; i < out->n; i++)
		s->bytes_received += cwi_element_nbytes(out->v[i]);
}
