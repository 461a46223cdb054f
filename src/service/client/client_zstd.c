/*
 * client_zstd.c - compression on the client's side: what to ask each
 * worker for, auto compression's decision, and the decoding of replies
 * (decompressed first when they travel as a zstd frame,
 * service_payload.h). Owns the session's zstd state: zstd_on, the
 * decompression context (dctx) and what auto compression measures
 * (s->auto_); the job's `compression` comes from join_job (client.c).
 * The decoded elements take the component names their reply tells where
 * the client's spec has none (cwi_client_name_elements).
 *
 * Runs on the fetch thread; auto_measure takes s->lock briefly for the
 * consumer's wait time.
 */
#include "client_int.h"

#include <stdio.h>
#include <stdlib.h>

/* auto compression (cwi_client_auto_tick) */
#define AUTO_WINDOW_NS (250 * UINT64_C(1000000))
#define AUTO_MIN_REPLIES 3    /* replies a window must see */
#define AUTO_WAIT_FRAC 0.10   /* the consumer waits this share of time */
#define AUTO_BACKLOG_FRAC 0.5 /* replies that left data at the worker */
#define AUTO_MIN_GAIN 1.10    /* zstd must deliver this much more */
#define AUTO_BAD_RATIO 0.90   /* compressed/raw above this: no use */
#define AUTO_BACKOFF_MIN 8u   /* windows before trying again */
#define AUTO_BACKOFF_MAX 64u
#define AUTO_RECHECK_WINDOWS 120u /* on this long (30 s): measure again */

/* What to ask a task's worker for: zstd when it is on and the worker is in
 * another process (inproc moves pointers: nothing to save). */
cwi_compression
cwi_client_ask_compression(const session *s, const ctask *t)
{
	if (!s->zstd_on || strncmp(t->address, "inproc://", 9) == 0)
		return CWI_COMPRESSION_NONE;
	return CWI_COMPRESSION_ZSTD;
}

/* An uncompressed reply's elements, taken from msg (*raw: their bytes). */
static cachew_err
plain_elements(ctask *t, cwi_msg *msg, const cwi_msg_get_elements_reply *r,
    cwi_element ***out, size_t *n, size_t *raw)
{
	size_t count = cwi_msg_count(msg);
	cwi_element **v;

	if (r->elements != count)
		return cwi_fail(CACHEW_EPROTO, "%s: a reply says %u "
		    "elements but carries %zu", t->address, r->elements,
		    count);
	v = malloc((count > 0 ? count : 1) * sizeof(*v));
	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < count; i++) {
		v[i] = cwi_msg_take(msg, i);
		*raw += v[i] != NULL ? cwi_element_nbytes(v[i]) : 0;
	}
	*n = count;
	*out = v;
	return CACHEW_OK;
}

/* A compressed reply's elements, decompressed from its frame (*raw: their
 * bytes); records the frame's ratio for auto compression. */
static cachew_err
zstd_elements(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r, cwi_element ***out, size_t *n,
    size_t *raw)
{
	size_t count = cwi_msg_count(msg), flen;
	/* One scalar BYTES element: the frame (service_payload.h). */
	const cwi_element *fe = count == 1 ? cwi_msg_element(msg, 0) : NULL;
	const uint8_t *frame;
	cwi_element **v;
	cachew_err rv;

	if (r->compression != CWI_COMPRESSION_ZSTD || fe == NULL ||
	    fe->n != 1 || fe->comp[0].dtype != CACHEW_BYTES ||
	    fe->comp[0].rank != 0)
		return cwi_fail(CACHEW_EPROTO, "%s: a compressed reply "
		    "must carry one scalar bytes element (zstd), not "
		    "%zu elements (%s)", t->address, count,
		    cwi_compression_name(r->compression));
	if (s->dctx == NULL && (s->dctx = ZSTD_createDCtx()) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	frame = cwi_tensor_str(&fe->comp[0], 0, &flen);
	v = malloc((r->elements > 0 ? r->elements : 1) * sizeof(*v));
	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_payload_decompress(s->dctx, frame, flen, r->elements,
	    s->data_limit, v);
	if (rv != CACHEW_OK) {
		free(v);
		return rv == CACHEW_ENOMEM
		    ? rv
		    : cwi_fail(rv, "%s: %s", t->address, cwi_errmsg_get());
	}
	for (size_t i = 0; i < r->elements; i++)
		*raw += cwi_element_nbytes(v[i]);
	*n = r->elements;
	s->auto_.zraw += *raw;
	s->auto_.zwire += flen;
	*out = v;
	return CACHEW_OK;
}

/*
 * The elements of a reply as an array of n references the caller owns
 * (release them, free the array), decompressed first when they travel
 * compressed. Records what auto compression measures. A reply that breaks
 * the protocol is CACHEW_EPROTO naming the worker.
 */
cachew_err
cwi_client_reply_elements(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r, cwi_element ***out, size_t *n)
{
	size_t raw = 0;
	cachew_err rv;

	*out = NULL;
	*n = 0;
	rv = r->compression == CWI_COMPRESSION_NONE
	    ? plain_elements(t, msg, r, out, n, &raw)
	    : zstd_elements(s, t, msg, r, out, n, &raw);
	if (rv != CACHEW_OK)
		return rv;
	cwi_client_name_elements(s, r, *out, *n);
	s->auto_.replies++;
	if (r->queued_bytes > 0)
		s->auto_.backlogged++;
	s->auto_.raw_bytes += raw;
	return CACHEW_OK;
}

/* Names element *e (replaced by a named clone when shared). */
static void
name_one(cwi_element **e, cwi_names *names)
{
	cwi_element *c;

	if (*e == NULL || (*e)->names != NULL || (*e)->n != names->n)
		return;
	if (!cwi_element_unique(*e)) {
		c = cwi_element_clone(*e);
		if (c == NULL)
			return;
		cwi_element_release(*e);
		*e = c;
	}
	cwi_element_set_names(*e, names);
}

void
cwi_client_give_names(cwi_names *names, cwi_element **v, size_t n)
{
	for (size_t i = 0; names != NULL && i < n; i++)
		name_one(&v[i], names);
}

void
cwi_client_name_elements(const session *s,
    const cwi_msg_get_elements_reply *r, cwi_element **v, size_t n)
{
	size_t at = 0;

	if (!s->ctx->wire_names || r->names == NULL)
		return;
	if (r->nruns == 0) {
		cwi_client_give_names(r->names, v, n);
		return;
	}
	for (size_t k = 0; k < r->nruns && at < n; k++) {
		size_t end = r->runs[k].n < n - at ? at + r->runs[k].n : n;
		for (; at < end; at++)
			if (r->runs[k].tail == 0)
				name_one(&v[at], r->names);
	}
}

/* What one window of auto compression measured. */
typedef struct auto_window {
	double wait_frac;    /* share of the window the consumer waited */
	double backlog_frac; /* share of replies that left data queued */
	double rate;         /* payload bytes delivered per second */
} auto_window;

/* Whether a window is over (the first call starts one); if so, *w holds
 * what it measured. */
static bool
auto_measure(session *s, uint64_t now, auto_window *w)
{
	auto_state *a = &s->auto_;
	uint64_t dt, wait;

	if (a->window_start_ns == 0) {
		a->window_start_ns = now;
		a->backoff_len = AUTO_BACKOFF_MIN;
		return false;
	}
	/* A window needs a few replies to say anything (at a slow link one
	 * 8 MiB reply takes a good part of it): it grows up to 8 times. */
	if (now - a->window_start_ns < AUTO_WINDOW_NS ||
	    (a->replies < AUTO_MIN_REPLIES &&
		now - a->window_start_ns < 8 * AUTO_WINDOW_NS))
		return false;
	dt = now - a->window_start_ns;
	pthread_mutex_lock(&s->lock);
	wait = s->auto_wait_ns;
	s->auto_wait_ns = 0;
	pthread_mutex_unlock(&s->lock);
	/* (a wait that began in the previous window counts in this one) */
	w->wait_frac = (double)wait / (double)dt;
	if (w->wait_frac > 1)
		w->wait_frac = 1;
	w->backlog_frac = a->replies > 0
	    ? (double)a->backlogged / (double)a->replies : 0;
	w->rate = (double)a->raw_bytes * 1e9 / (double)dt;
	return true;
}

/* zstd is off: it goes on when the window says the link is the
 * bottleneck, once the backoff of a failed try ran out. */
static void
auto_window_off(session *s, const auto_window *w)
{
	auto_state *a = &s->auto_;

	if (a->backoff > 0) {
		a->backoff--;
	} else if (a->replies >= AUTO_MIN_REPLIES &&
		   w->wait_frac >= AUTO_WAIT_FRAC &&
		   w->backlog_frac >= AUTO_BACKLOG_FRAC) {
		s->zstd_on = true;
		a->rate_off = w->rate;
		a->on_windows = 0;
		cwi_log(CACHEW_LOG_INFO, "client", "event=compression_on "
		    "job=%llu wait=%.2f backlog=%.2f bytes_per_s=%.0f",
		    (unsigned long long)s->job_id, w->wait_frac,
		    w->backlog_frac, w->rate);
	}
}

/* zstd is on: it goes off when it does not pay (a failed try, with a
 * backoff) or when it is time to measure without it again. */
static void
auto_window_on(session *s, const auto_window *w)
{
	auto_state *a = &s->auto_;
	const char *off = NULL;

	a->on_windows++;
	if (a->zraw > 0 &&
	    (double)a->zwire > AUTO_BAD_RATIO * (double)a->zraw)
		off = "incompressible";
	else if (a->on_windows == 2 && w->wait_frac >= AUTO_WAIT_FRAC &&
		 w->rate < AUTO_MIN_GAIN * a->rate_off)
		off = "no_gain";
	else if (a->on_windows >= AUTO_RECHECK_WINDOWS)
		off = "recheck";
	else if (a->on_windows == 2)
		a->backoff_len = AUTO_BACKOFF_MIN; /* it paid */
	if (off != NULL && strcmp(off, "recheck") == 0) {
		/* Not a failure: measure without it again (the
		 * link or the data may have changed). */
		s->zstd_on = false;
		a->backoff = 0;
	} else if (off != NULL) {
		s->zstd_on = false;
		a->backoff = a->backoff_len;
		if (a->backoff_len < AUTO_BACKOFF_MAX)
			a->backoff_len *= 2;
		cwi_log(CACHEW_LOG_INFO, "client", "event=compression_off "
		    "job=%llu reason=%s wait=%.2f backlog=%.2f "
		    "bytes_per_s=%.0f before=%.0f ratio=%.2f",
		    (unsigned long long)s->job_id, off, w->wait_frac,
		    w->backlog_frac, w->rate, a->rate_off,
		    a->zraw > 0 ? (double)a->zwire / (double)a->zraw : 0);
	}
}

/*
 * Auto compression, evaluated once per AUTO_WINDOW_NS. The link is taken to
 * be the bottleneck when, over a window, the consumer waited for data at
 * least AUTO_WAIT_FRAC of the time while at least AUTO_BACKLOG_FRAC of the
 * replies left data queued at the worker (queued_bytes > 0): the workers
 * are ahead, the consumer is starved, so what limits it is moving bytes.
 * zstd then goes on, and is kept only if it pays: after two full windows
 * the rate of payload bytes delivered must have grown by AUTO_MIN_GAIN
 * (while the consumer still waits; a consumer that stopped waiting is
 * proof enough), and the data must keep compressing (frames at most
 * AUTO_BAD_RATIO of their content). A failed try waits a backoff (8
 * windows, doubling to 64 after each failed try) before zstd may go on
 * again. A try that paid is re-measured every AUTO_RECHECK_WINDOWS: zstd
 * goes off, and the rule above decides again from fresh measurements.
 * (Workers becoming the bottleneck once zstd is on is the expected
 * outcome, not a reason to stop: only the delivered rate says whether it
 * pays.)
 */
void
cwi_client_auto_tick(session *s, uint64_t now)
{
	auto_state *a = &s->auto_;
	auto_window w;

	if (s->compression != CWI_COMPRESSION_AUTO)
		return;
	if (!auto_measure(s, now, &w))
		return;
	if (!s->zstd_on)
		auto_window_off(s, &w);
	else
		auto_window_on(s, &w);
	a->window_start_ns = now;
	a->replies = a->backlogged = a->raw_bytes = a->zraw = a->zwire = 0;
}
