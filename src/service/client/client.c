/*
 * client.c - the client of the service: a cachew_iterator whose worker
 * part runs on the service's workers. This file is the base: the
 * iterator, sessions' lifecycle, the fetch thread's loop, the element
 * queue and acks, and the stream requests and their replies;
 * client_int.h lists the other parts (coordinated rounds, compression,
 * the direct task).
 *
 * cwi_client_iterator_create() plans the split (exec_split.h), registers
 * the worker part with the dispatcher, and iterates the client part
 * locally over a stream source. Each open of the stream is a session: it
 * joins (or creates) the job, and one fetch thread then
 *   - heartbeats every heartbeat interval (elements consumed and their
 *     timing, buffer fill: the autoscaler's signal) and
 *     learns the job's tasks (worker addresses) and whether it finished;
 *   - keeps up to INFLIGHT get_elements requests outstanding per task, on
 *     one completion queue, within the client_buffer byte budget (handed
 *     out breadth first, from a rotating task, so with many workers the
 *     budget is shared and no task starves);
 *   - puts each task's replies back in worker order (their seq), queues the
 *     elements for next(), and acknowledges a split to the dispatcher once
 *     every element before its end has been queued.
 * The consumer thread only takes elements from the queue (or reads the
 * job's direct task itself: client_direct.c).
 *
 * Coordinated reads (num_consumers > 0) replace the per-task streams by
 * rounds (client_rounds.c).
 *
 * Compression (the job's `compression`): the fetch thread asks workers in
 * other processes for zstd payloads (service_payload.h) when the job says
 * zstd, or, with auto, while its measurements say the link is the
 * bottleneck (client_zstd.c states the rule); it decompresses them
 * before queueing.
 *
 * Locking: s->lock protects the element queue, the error and the timing
 * counters shared with the consumer; everything else belongs to the fetch
 * thread. ctx->rows_lock (the operator rows) is taken before s->lock, and
 * s->lock before the completion queue's (the consumer wakes the fetch
 * thread with cwi_cq_wake).
 */
#include "client_int.h"
#include "../service_auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INFLIGHT 4            /* get_elements outstanding per task */
#define REPLY_BYTES ((uint64_t)8 << 20)
/* Split ends per split_ack: at most 27 bytes each on the wire, so an ack
 * stays well within the dispatcher's 1 MiB message limit however many
 * piled up while it was away. */
#define ACK_MAX 16384
/* With compression: smaller replies. The worker compresses a reply in one
 * piece before any of it is sent, so a small one starts moving sooner;
 * and auto sees several per window even on a slow link, and its decision
 * takes effect after little data already asked for uncompressed. */
#define REPLY_BYTES_ZSTD ((uint64_t)1 << 20)

/* ---- session state shared with the consumer ------------------------------- */

void
cwi_client_fail(session *s, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

void
cwi_client_fail(session *s, cachew_err err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&s->lock);
	if (s->err == CACHEW_OK) {
		s->err = err;
		va_start(ap, fmt);
		vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
		va_end(ap);
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

bool
cwi_client_queue_push(session *s, cwi_element *e)
{
	pthread_mutex_lock(&s->lock);
	if (s->qlen == s->qcap) {
		size_t cap = s->qcap != 0 ? s->qcap * 2 : 256;
		cwi_element **nq = malloc(cap * sizeof(*nq));
		if (nq == NULL) {
			pthread_mutex_unlock(&s->lock);
			return false;
		}
		for (size_t i = 0; i < s->qlen; i++)
			nq[i] = s->q[(s->qhead + i) % s->qcap];
		free(s->q);
		s->q = nq;
		s->qcap = cap;
		s->qhead = 0;
	}
	size_t nbytes = cwi_element_nbytes(e);

	s->q[(s->qhead + s->qlen++) % s->qcap] = e;
	s->qbytes += nbytes;
	if (nbytes > s->elem_max)
		s->elem_max = nbytes;
	pthread_mutex_unlock(&s->lock);
	return true;
}

uint64_t
cwi_client_queue_bytes(session *s)
{
	uint64_t b;

	pthread_mutex_lock(&s->lock);
	b = s->qbytes;
	pthread_mutex_unlock(&s->lock);
	return b;
}

void
cwi_client_wake(session *s)
{
	pthread_mutex_lock(&s->lock);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* ---- connections ----------------------------------------------------------- */

static cwi_conn *
conn_for(session *s, const char *address)
{
	cwi_transport_opts o;
	cachew_err rv;
	cwi_conn *c;

	for (size_t i = 0; i < s->nconns; i++)
		if (strcmp(s->conns[i].address, address) == 0)
			return s->conns[i].conn;
	cwi_transport_opts_init(&o);
	o.max_msg_size = (size_t)s->ctx->opts.client_buffer > REPLY_BYTES * 4
			     ? (size_t)s->ctx->opts.client_buffer
			     : CWI_TRANSPORT_MAX_MSG_DEFAULT;
	if (o.max_msg_size < CWI_TRANSPORT_MAX_MSG_DEFAULT)
		o.max_msg_size = CWI_TRANSPORT_MAX_MSG_DEFAULT;
	s->data_limit = o.max_msg_size;
	/* A worker on this host puts large replies in shared memory
	 * (transports/nng/nng_shm.c): what the buffer holds of one worker's
	 * replies is at most all of it (a reply that finds no room comes
	 * through the socket); the pages written stay allocated while the
	 * connection lives, so no more than that. */
	o.shm_bytes = (size_t)s->ctx->opts.client_buffer;
	o.dial_async = true;
	cwi_rpc_client_tls(&s->ctx->opts, &o);
	if (!CWI_GROW(s->conns, s->capconns, s->nconns + 1))
		return NULL;
	s->conns[s->nconns].address = cwi_strdup(address);
	if (s->conns[s->nconns].address == NULL)
		return NULL; /* a NULL address would crash the lookup above */
	if ((rv = cwi_dial(&c, address, &o)) != CACHEW_OK) {
		/* An asynchronous dial fails only for what retrying cannot
		 * mend: the address, or this client's TLS options. */
		cwi_client_fail(s, rv, "worker %s: %s", address,
		    cwi_errmsg_get());
		free(s->conns[s->nconns].address);
		return NULL;
	}
	s->conns[s->nconns].conn = c;
	s->nconns++;
	return c;
}

/* ---- tasks ------------------------------------------------------------------- */

ctask *
cwi_client_task_by_id(session *s, uint64_t id)
{
	for (size_t i = 0; i < s->ntasks; i++)
		if (s->tasks[i].task_id == id)
			return &s->tasks[i];
	return NULL;
}

static void
update_tasks(session *s, const cwi_msg_client_heartbeat_reply *r)
{
	for (size_t i = 0; i < s->ntasks; i++) {
		bool listed = false;
		for (size_t k = 0; k < r->ntasks; k++)
			if (r->tasks[k].task_id == s->tasks[i].task_id)
				listed = true;
		if (!listed) {
			s->tasks[i].gone = true;
			/* Exactly once: a task gone from the job is read no
			 * more (what it held is replayed, stop_tasks). */
			if (s->exact && !s->tasks[i].direct)
				s->tasks[i].stopped = true;
		}
	}
	for (size_t k = 0; k < r->ntasks; k++) {
		const cwi_task_info *ti = &r->tasks[k];
		ctask *t = cwi_client_task_by_id(s, ti->task_id);

		if (t != NULL) {
			/* Listed again (a worker came back): try it again. */
			if (t->gone && !t->ended && !t->stopped &&
			    t->inflight == 0)
				t->gone = false;
			continue;
		}
		if (s->ntasks >= MAX_TASK_SLOTS ||
		    !CWI_GROW(s->tasks, s->captasks, s->ntasks + 1))
			continue;
		t = &s->tasks[s->ntasks];
		memset(t, 0, sizeof(*t));
		t->task_id = ti->task_id;
		t->secret = ti->secret;
		t->last_group = UINT64_MAX;
		t->address = cwi_strdup(ti->address);
		t->conn = t->address != NULL ? conn_for(s, t->address) : NULL;
		if (t->conn == NULL) {
			free(t->address);
			continue;
		}
		if (ti->direct && s->coord == NULL &&
		    !cwi_client_take_direct(s, t)) {
			free(t->address);
			continue;
		}
		s->ntasks++;
	}
	s->job_finished = r->job_finished;
	if (s->coord != NULL &&
	    cwi_coord_update(s->coord, r->tasks, r->ntasks, r->block_round) !=
		CACHEW_OK)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

/* Gives back bytes a task reserved of the client buffer. */
static void
reserve_release(ctask *t, uint64_t bytes)
{
	t->reserved -= bytes < t->reserved ? bytes : t->reserved;
}

/* The bytes of the request that completed with tag (its reservation). */
static uint64_t
tag_reserved(uint64_t tag)
{
	return ((tag - TAG_DATA_BASE) >> TAG_SLOT_BITS) << 10;
}

void
cwi_client_task_drop_held(ctask *t)
{
	for (size_t i = 0; i < t->nheld; i++) {
		cwi_msg_destroy(t->held[i].msg);
		cwi_pmsg_free(&t->held[i].hdr);
		reserve_release(t, t->held[i].reserved);
	}
	t->nheld = 0;
}

bool
cwi_client_add_ack(session *s, uint64_t split_id, uint64_t parts,
    uint64_t lease)
{
	if (!CWI_GROW(s->acks, s->capacks, s->nacks + 1))
		return false;
	/* capacks counts acks; ack_parts and ack_leases grow alongside. */
	uint64_t *p = realloc(s->ack_parts, s->capacks * sizeof(*p));
	if (p == NULL)
		return false;
	s->ack_parts = p;
	p = realloc(s->ack_leases, s->capacks * sizeof(*p));
	if (p == NULL)
		return false;
	s->ack_leases = p;
	s->acks[s->nacks] = split_id;
	s->ack_parts[s->nacks] = parts;
	s->ack_leases[s->nacks] = lease;
	s->nacks++;
	return true;
}

/* ---- sending ------------------------------------------------------------------ */

static void
send_heartbeat(session *s)
{
	cwi_pmsg m;
	cwi_msg *msg;
	uint64_t batches, wait, sum, qb, gap;

	pthread_mutex_lock(&s->lock);
	batches = s->batches;
	wait = s->wait_ns;
	sum = s->batch_ns_sum;
	s->batches = s->wait_ns = s->batch_ns_sum = 0;
	qb = s->qbytes;
	cwi_pmsg_init(&m, CWI_MSG_CLIENT_HEARTBEAT);
	m.u.client_heartbeat.elements_received = s->elements_received;
	m.u.client_heartbeat.bytes_received = s->bytes_received;
	pthread_mutex_unlock(&s->lock);
	m.u.client_heartbeat.job_id = s->job_id;
	m.u.client_heartbeat.client_id = s->client_id;
	m.u.client_heartbeat.lineage = s->lineage;
	m.u.client_heartbeat.batch_time_ns = batches > 0 ? sum / batches : 0;
	m.u.client_heartbeat.batches = batches;
	m.u.client_heartbeat.wait_time_ns = wait;
	m.u.client_heartbeat.buffer_fill =
	    (double)qb / (double)s->ctx->opts.client_buffer;
	if (s->coord != NULL)
		m.u.client_heartbeat.round = cwi_coord_next_round(s->coord);
	cwi_client_exact_fill(s, &m.u.client_heartbeat);
	(void)cwi_pmsg_set_token(&m, s->ctx->token); /* none: refused */
	if (cwi_rpc_pack(&m, &msg) == CACHEW_OK) {
		if (cwi_conn_send(s->dispatcher, msg, (int)s->heartbeat_ms * 4,
			s->cq, TAG_HEARTBEAT) == CACHEW_OK)
			s->hb_inflight = true;
		else
			cwi_msg_destroy(msg);
	}
	if (!s->hb_inflight)
		cwi_client_exact_sent(s, false);
	cwi_pmsg_free(&m);
	gap = (uint64_t)s->heartbeat_ms;
	if (s->ntasks == 0) {
		s->early_hb_ms = s->early_hb_ms == 0 ? 1 : s->early_hb_ms * 2;
		if (s->early_hb_ms > gap)
			s->early_hb_ms = gap; /* doubling stops at the interval */
		gap = s->early_hb_ms;
	}
	s->next_hb_ns = cwi_now_ns() + gap * 1000000u;
}

static void
send_acks(session *s)
{
	size_t n = s->nacks < ACK_MAX ? s->nacks : ACK_MAX, rest;
	cwi_pmsg m;
	cwi_msg *msg;
	cachew_err rv;

	if (s->nacks == 0 || s->ack_inflight)
		return;
	cwi_pmsg_init(&m, CWI_MSG_SPLIT_ACK);
	m.u.split_ack.job_id = s->job_id;
	m.u.split_ack.client_id = s->client_id;
	m.u.split_ack.lineage = s->lineage;
	m.u.split_ack.split_ids = s->acks; /* borrowed for the encoding */
	m.u.split_ack.parts = s->ack_parts;
	m.u.split_ack.leases = s->ack_leases;
	m.u.split_ack.nsplit_ids = n;
	m.u.split_ack.nparts = n;
	m.u.split_ack.nleases = n;
	(void)cwi_pmsg_set_token(&m, s->ctx->token); /* none: refused */
	rv = cwi_rpc_pack(&m, &msg);
	m.u.split_ack.split_ids = NULL;
	m.u.split_ack.parts = NULL;
	m.u.split_ack.leases = NULL;
	cwi_pmsg_free(&m);
	if (rv != CACHEW_OK)
		return;
	if (cwi_conn_send(s->dispatcher, msg,
		(int)s->ctx->opts.service_timeout_ms, s->cq, TAG_ACK) !=
	    CACHEW_OK) {
		cwi_msg_destroy(msg);
		return;
	}
	/* Keep them until the dispatcher confirms; a failed ack is merged
	 * back and sent again (the dispatcher ignores repeats). */
	s->ack_inflight = true;
	s->sent_acks = s->acks;
	s->sent_parts = s->ack_parts;
	s->sent_leases = s->ack_leases;
	s->nsent = n;
	rest = s->nacks - n;
	s->acks = NULL;
	s->ack_parts = NULL;
	s->ack_leases = NULL;
	s->nacks = s->capacks = 0;
	/* The next message takes the rest. */
	for (size_t i = n; i < n + rest; i++)
		if (!cwi_client_add_ack(s, s->sent_acks[i], s->sent_parts[i],
			s->sent_leases[i]))
			cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

static void
on_ack(session *s, cwi_completion *c)
{
	s->ack_inflight = false;
	if (c->err == CACHEW_OK && c->reply != NULL) {
		cwi_pmsg rep;
		if (cwi_rpc_unpack(c->reply, s->ctx->url, &rep) == CACHEW_OK) {
			/* A shared job's split needs every client's part; a
			 * part acked twice (an ack resent after a timeout that
			 * had been applied) could complete it before another
			 * client took its part: shared jobs read their tasks
			 * to the end as before. */
			if (rep.type == CWI_MSG_OK && rep.u.ok.job_finished &&
			    s->ctx->opts.job_name[0] == '\0')
				s->data_acked = true;
			cwi_pmsg_free(&rep);
		}
	}
	if (c->reply != NULL)
		cwi_msg_destroy(c->reply);
	if (c->err != CACHEW_OK) {
		for (size_t i = 0; i < s->nsent; i++)
			(void)cwi_client_add_ack(s, s->sent_acks[i],
			    s->sent_parts[i], s->sent_leases[i]);
	}
	free(s->sent_acks);
	free(s->sent_parts);
	free(s->sent_leases);
	s->sent_acks = NULL;
	s->sent_parts = NULL;
	s->sent_leases = NULL;
	s->nsent = 0;
}

cachew_err
cwi_client_send_get(session *s, size_t slot, const cwi_msg_get_elements *g,
    uint64_t tag)
{
	ctask *t = &s->tasks[slot];
	cwi_pmsg m;
	cwi_msg *msg;
	cachew_err rv;

	cwi_pmsg_init(&m, CWI_MSG_GET_ELEMENTS);
	m.u.get_elements = *g;
	m.u.get_elements.secret = t->secret;
	rv = cwi_rpc_pack(&m, &msg);
	cwi_pmsg_free(&m);
	if (rv != CACHEW_OK)
		return rv;
	/* A held request waits for data as long as the pipeline needs: no
	 * deadline of its own beyond the service timeout. */
	rv = cwi_conn_send(t->conn, msg, (int)s->ctx->opts.service_timeout_ms,
	    s->cq, tag);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(msg);
		return rv;
	}
	t->inflight++;
	return CACHEW_OK;
}

/* How long a worker may hold a request with nothing to send (a third of
 * the service timeout, 100 ms to 10 s): it then answers empty, and the
 * request does not time out as if the worker were gone. */
static uint32_t
hold_ms(const session *s)
{
	int64_t ms = s->ctx->opts.service_timeout_ms / 3;

	return (uint32_t)(ms < 100 ? 100 : ms > 10000 ? 10000 : ms);
}

/*
 * The client buffer (client_buffer bytes) holds what is queued for the
 * consumer, what ordered delivery holds for later groups, and what the
 * requests in flight may bring: each reserves its max_bytes, or the
 * largest element seen if that is more (a worker sends at least one
 * element). A request goes out only when its reservation fits, so the
 * three stay within the budget whatever the consumer's speed. Requests
 * are all of one size, reply_size(): the most a reply may pin (a reply is
 * one buffer that its elements view, freed with the last of them), and
 * large enough that a consumer slower than the workers, which opens room
 * a little at a time, is not sent a round trip per few elements. The
 * elements taken from a reply still partly queued count as queued
 * (s->pinned), as does the last chunk the consumer's iterator took, but
 * its first element (s->handed: up to 256 elements, 8 MiB of 32 KiB
 * batches), until it asks for the next. A task with nothing to send holds
 * its request (up to hold_ms), so the buffer always keeps room for one
 * request of each task that has none in flight: a worker with nothing
 * never blocks one with data. When the largest element times the tasks
 * is more than the buffer, the buffer is that much (each task may bring
 * one element).
 * One exception keeps the stream moving: with nothing queued for the
 * consumer and nothing in flight, one request goes out even when the
 * buffer is full of held elements (ordered delivery waiting for its head
 * group: each task that may hold the head is asked) or an element is
 * larger than the whole buffer.
 */
static uint64_t
reply_size(const session *s)
{
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer;
	uint64_t most = s->compression != CWI_COMPRESSION_NONE
	    ? REPLY_BYTES_ZSTD : REPLY_BYTES;

	/* An eighth of the budget: 8 MiB at the default 64 MiB. */
	return budget / 8 < most ? budget / 8 : most;
}

/* Asks task slot i for up to ask bytes, reserving unit bytes (a multiple
 * of 1 KiB, at least what its reply may bring). Returns the bytes
 * reserved, 0 when the request could not go (it is retried later). */
static uint64_t
ask_task(session *s, size_t i, uint64_t ask, uint64_t unit, uint64_t now)
{
	ctask *t = &s->tasks[i];
	cwi_msg_get_elements g;

	cwi_pmsg_body_init(CWI_MSG_GET_ELEMENTS, &g);
	g.task_id = t->task_id;
	g.client_id = s->client_id;
	g.max_bytes = ask;
	g.compression = cwi_client_ask_compression(s, t);
	g.wait_ms = hold_ms(s);
	if (cwi_client_send_get(s, i, &g,
		TAG_DATA_BASE + ((unit >> 10) << TAG_SLOT_BITS | i)) !=
	    CACHEW_OK) {
		t->retry_at_ns = now + 100000000u;
		return 0;
	}
	t->reserved += unit;
	return unit;
}

static bool
task_askable(const ctask *t, uint64_t now)
{
	return !t->ended && !t->gone && !t->direct && now >= t->retry_at_ns;
}

/* The request size and reservation for n live tasks, and the budget they
 * share: room for one request of each (send_requests). */
static void
request_plan(const session *s, size_t live, uint64_t elem_max, uint64_t *ask,
    uint64_t *unit, uint64_t *limit)
{
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer;

	*ask = reply_size(s);
	if (live > 1 && *ask > budget / live)
		*ask = budget / live;
	/* What a reply may bring, in whole KiB (the tag carries it). */
	*unit = ((*ask > elem_max ? *ask : elem_max) + 1023) & ~(uint64_t)1023;
	*limit = budget > live * *unit ? budget : live * *unit;
}

static void
send_requests(session *s)
{
	uint64_t now = cwi_now_ns();
	uint64_t ask, unit, limit, queued, elem_max, reserved = 0;
	uint64_t refused = UINT64_MAX; /* the least room a refused one needed */
	size_t live = 0, idle = 0;
	bool empty;

	if (s->coord != NULL) {
		cwi_client_rounds_send(s);
		return;
	}
	/* Breadth first, from a rotating start: every task gets one request
	 * before any gets a second, so when the budget allows fewer
	 * requests than tasks x INFLIGHT (many workers), no task starves
	 * behind the first ones in the list. */
	size_t n = s->ntasks, first = n > 0 ? s->rr_next % n : 0;
	/* Ordered delivery: elements held for later groups count too. */
	uint64_t held = cwi_client_exact_held(s);
	if (n > 0)
		s->rr_next = (first + 1) % n;
	pthread_mutex_lock(&s->lock);
	queued = s->qbytes + s->pinned + s->handed;
	empty = s->qlen == 0;
	elem_max = s->elem_max;
	pthread_mutex_unlock(&s->lock);
	for (size_t k = 0; k < n; k++) {
		const ctask *t = &s->tasks[k];
		reserved += t->reserved;
		if (!t->ended && !t->gone && !t->direct) {
			live++;
			idle += t->inflight == 0;
		}
	}
	request_plan(s, live, elem_max, &ask, &unit, &limit);
	for (unsigned depth = 1; depth <= INFLIGHT; depth++) {
		for (size_t j = 0; j < n; j++) {
			size_t i = (first + j) % n;
			ctask *t = &s->tasks[i];
			/* Room for this one and for the idle others' first. */
			uint64_t need = unit * (idle + (t->inflight > 0));

			if (!task_askable(t, now) || t->inflight >= depth)
				continue;
			if (queued + held + reserved + need > limit) {
				refused = need < refused ? need : refused;
				continue;
			}
			if (t->inflight == 0)
				idle--;
			reserved += ask_task(s, i, ask, unit, now);
		}
	}
	/* Nothing queued, nothing in flight, no room: the exception. Held
	 * elements wait for the head group: each task that may send it is
	 * asked; one that sent a later group holds it only if it was leased
	 * again, so when none may, every task is. */
	for (int pass = 0; reserved == 0 && empty && pass < 2; pass++) {
		for (size_t j = 0; j < n; j++) {
			size_t i = (first + j) % n;

			if (!task_askable(&s->tasks[i], now) ||
			    (held > 0 && pass == 0 &&
				!cwi_client_exact_may_hold_head(s,
				    &s->tasks[i])))
				continue;
			reserved += ask_task(s, i, ask, unit, now);
			if (held == 0 && reserved > 0)
				break;
		}
	}
	if (reserved == 0 && !empty && !s->buffer_full)
		s->full_since_ns = now;
	s->buffer_full = reserved == 0 && !empty;
	/* Only the consumer makes room: it wakes this thread once what it
	 * has not taken falls to what would let the refused request go. */
	pthread_mutex_lock(&s->lock);
	s->wake_at_bytes = refused != UINT64_MAX &&
			   limit > held + reserved + refused
			       ? limit - held - reserved - refused
			       : 0;
	s->wake_armed = refused != UINT64_MAX;
	pthread_mutex_unlock(&s->lock);
}

/* ---- receiving ------------------------------------------------------------------ */

void
cwi_client_release_all(cwi_element **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cwi_element_release(v[i]);
	free(v);
}

/* Queues the elements of one in-order reply and records its split ends
 * (takes v). */
static void
process_reply(session *s, ctask *t, cwi_element **v, size_t n,
    const cwi_msg_get_elements_reply *r)
{
	size_t e = 0;

	if (s->exact) {
		/* Exactly once: the reply's elements in stream order, what
		 * this client already had left out, stitched batches in
		 * their places (v is all taken). */
		cwi_chunk ordered = {0};
		char err[512];
		cachew_err rv = cwi_client_exact_reply(s, t->address, r, v, n,
		    &ordered, true, err, sizeof(err));
		if (r->nruns > 0)
			t->last_group = r->runs[r->nruns - 1].group;
		if (rv != CACHEW_OK)
			cwi_client_fail(s, rv, "%s", err);
		cwi_chunk_free(&ordered);
		if (rv != CACHEW_OK)
			goto done;
	}

	for (size_t k = 0; k <= r->nsplit_ends; k++) {
		size_t upto = k < r->nsplit_ends ? r->split_ends[k].after : n;
		if (upto > n || upto < e) {
			cwi_client_fail(s, CACHEW_EPROTO, "%s: a split end at "
			    "element %zu of a reply of %zu", t->address, upto,
			    n);
			goto done;
		}
		for (; e < upto; e++) {
			cwi_element *el = v[e];
			v[e] = NULL;
			if (el != NULL && !cwi_client_queue_push(s, el)) {
				cwi_element_release(el);
				cwi_client_fail(s, CACHEW_ENOMEM,
				    "out of memory");
				goto done;
			}
		}
		if (k < r->nsplit_ends &&
		    !cwi_client_add_ack(s, r->split_ends[k].split_id,
			r->split_ends[k].parts > 0 ? r->split_ends[k].parts : 1,
			r->split_ends[k].lease)) {
			cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
			goto done;
		}
	}
	if (n > 0)
		cwi_client_wake(s);
	if (r->end_of_task)
		t->ended = true;
done:
	cwi_client_release_all(v, n);
}

/* Decodes an in-order reply and queues it. */
static void
take_reply(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r)
{
	cwi_element **v;
	size_t n;
	cachew_err rv = cwi_client_reply_elements(s, t, msg, r, &v, &n);

	if (rv != CACHEW_OK) {
		cwi_client_fail(s, rv, "%s", cwi_errmsg_get());
		return;
	}
	process_reply(s, t, v, n, r);
}

/* A failed data request or an error reply: true when it was handled (the
 * request is to be retried or the session failed). */
bool
cwi_client_data_failed(session *s, ctask *t, cwi_completion *c, cwi_pmsg *hdr,
    uint64_t task_round)
{
	uint64_t now = cwi_now_ns();

	if (c->err == CACHEW_EAUTH) {
		/* A worker that refuses us (TLS) will not change its mind
		 * by being asked again. */
		cwi_client_fail(s, c->err, "%s", cwi_errmsg_get());
		return true;
	}
	if (c->err != CACHEW_OK) {
		if (s->exact && !t->ended) {
			/* Exactly once: whatever the failure lost, the
			 * dispatcher replays from what this client reports. */
			cwi_log(CACHEW_LOG_INFO, "client", "event=task_failed "
			    "task=%llu worker=%s error=\"%s\"",
			    (unsigned long long)t->task_id, t->address,
			    cwi_errmsg_get());
			cwi_client_exact_failed(s, t);
			s->next_hb_ns = 0;
		} else if (c->err == CACHEW_ENOENT && s->coord == NULL) {
			t->gone = true; /* the worker no longer has it */
		} else if (!t->ended) {
			/* A worker that died or stalls: its unacknowledged
			 * splits are leased again; ask again later in case
			 * it is still listed. */
			cwi_log(CACHEW_LOG_INFO, "client", "event=task_unreachable "
			    "task=%llu worker=%s error=\"%s\"",
			    (unsigned long long)t->task_id, t->address,
			    cwi_errmsg_get());
			if (s->coord != NULL) {
				cwi_coord_failed(s->coord, t->task_id,
				    task_round, now + 200000000u);
			} else {
				t->retry_at_ns = now + 200000000u;
				cwi_client_task_drop_held(t);
				t->gone = true;
				/* The worker numbered a reply to the failed
				 * request (a timeout while it was paused,
				 * say) that this client drops: waiting for it
				 * would hold every later reply forever. */
				t->unordered = true;
			}
		}
		return true;
	}
	if (cwi_rpc_unpack(c->reply, t->address, hdr) == CACHEW_OK &&
	    hdr->type == CWI_MSG_GET_ELEMENTS_REPLY)
		return false;
	if (hdr->type == CWI_MSG_ERROR && hdr->u.error.code == CACHEW_ENOENT &&
	    !hdr->u.error.pipeline) {
		/* The worker has not started the task yet (it learns of it
		 * at its next heartbeat, or at once when in this process) or
		 * has dropped it; the job's task list tells which. Ask again
		 * soon: after 1 ms, doubling up to 20 per round, not per
		 * reply (the INFLIGHT replies of one round made it 8 ms). */
		uint64_t gap;
		if (s->coord != NULL || t->retry_at_ns <= now)
			t->unknown_ms = t->unknown_ms == 0 ? 1
				      : t->unknown_ms < 20 ? t->unknown_ms * 2
							   : 20;
		gap = (uint64_t)t->unknown_ms * 1000000u;
		if (s->coord != NULL)
			cwi_coord_failed(s->coord, t->task_id, task_round,
			    now + gap);
		else
			t->retry_at_ns = now + gap;
	} else if (hdr->type == CWI_MSG_ERROR) {
		cwi_client_fail(s, (cachew_err)hdr->u.error.code > CACHEW_OK
			? (cachew_err)hdr->u.error.code : CACHEW_EOP,
		    "%s", hdr->u.error.message != NULL
			      ? hdr->u.error.message : "worker error");
	} else {
		cwi_client_fail(s, CACHEW_EPROTO, "%s: not a get_elements "
		    "reply: %s", t->address, cwi_errmsg_get());
	}
	cwi_pmsg_free(hdr);
	cwi_msg_destroy(c->reply);
	return true;
}

static void
on_data(session *s, ctask *t, cwi_completion *c)
{
	uint64_t reserved = tag_reserved(c->tag);
	cwi_pmsg hdr;

	t->inflight--;
	if (t->stopped) {
		/* Exactly once: read no more; its groups are replayed. */
		reserve_release(t, reserved);
		if (c->reply != NULL)
			cwi_msg_destroy(c->reply);
		return;
	}
	if (cwi_client_data_failed(s, t, c, &hdr, 0)) {
		reserve_release(t, reserved);
		return;
	}
	/* In order, unless a failed request lost a numbered reply (then
	 * as they come: nothing is held since, t->held was dropped). */
	if (!t->unordered && hdr.u.get_elements_reply.seq != t->next_seq) {
		if (hdr.u.get_elements_reply.seq < t->next_seq ||
		    !CWI_GROW(t->held, t->capheld, t->nheld + 1)) {
			cwi_client_fail(s, CACHEW_EPROTO, "%s: reply %llu "
			    "repeated", t->address,
			    (unsigned long long)hdr.u.get_elements_reply.seq);
			reserve_release(t, reserved);
			cwi_pmsg_free(&hdr);
			cwi_msg_destroy(c->reply);
			return;
		}
		t->held[t->nheld].seq = hdr.u.get_elements_reply.seq;
		t->held[t->nheld].msg = c->reply;
		t->held[t->nheld].hdr = hdr;
		t->held[t->nheld].reserved = reserved;
		t->nheld++;
		return;
	}
	t->next_seq = hdr.u.get_elements_reply.seq + 1;
	take_reply(s, t, c->reply, &hdr.u.get_elements_reply);
	reserve_release(t, reserved);
	cwi_pmsg_free(&hdr);
	cwi_msg_destroy(c->reply);
	/* Replies that were waiting for this one. */
	for (bool found = true; found;) {
		found = false;
		for (size_t i = 0; i < t->nheld; i++) {
			if (t->held[i].seq != t->next_seq)
				continue;
			held_reply h = t->held[i];
			t->held[i] = t->held[--t->nheld];
			take_reply(s, t, h.msg, &h.hdr.u.get_elements_reply);
			reserve_release(t, h.reserved);
			cwi_pmsg_free(&h.hdr);
			cwi_msg_destroy(h.msg);
			t->next_seq++;
			found = true;
			break;
		}
	}
}

/* How long the dispatcher may stay silent before the session gives up
 * on it. */
static uint64_t
absence_ms(const session *s)
{
	/* A dispatcher that restarts (its journal keeps the job) is
	 * ridden out for dispatcher_absence_ms: the data keeps coming from
	 * the workers meanwhile. */
	int64_t ms = s->ctx->opts.dispatcher_absence_ms >
			 s->ctx->opts.service_timeout_ms
		     ? s->ctx->opts.dispatcher_absence_ms
		     : s->ctx->opts.service_timeout_ms;

	return (uint64_t)ms;
}

static bool
dispatcher_absent(const session *s, uint64_t now)
{
	return now - s->last_hb_ok_ns > absence_ms(s) * 1000000u;
}

/* A heartbeat completed: true when the dispatcher answered it. */
static bool
on_heartbeat(session *s, cwi_completion *c)
{
	cwi_pmsg rep;
	uint64_t now = cwi_now_ns();
	bool hb_ok = false;

	s->hb_inflight = false;
	if (c->err == CACHEW_EAUTH)
		cwi_client_fail(s, c->err, "%s", cwi_errmsg_get());
	if (c->err == CACHEW_OK &&
	    cwi_rpc_unpack(c->reply, s->ctx->url, &rep) == CACHEW_OK) {
		if (rep.type == CWI_MSG_CLIENT_HEARTBEAT_REPLY) {
			hb_ok = true;
			cwi_client_exact_stop(s,
			    rep.u.client_heartbeat_reply.stop_tasks,
			    rep.u.client_heartbeat_reply.nstop_tasks);
			update_tasks(s, &rep.u.client_heartbeat_reply);
			cwi_client_rows_from_reply(s,
			    &rep.u.client_heartbeat_reply);
			/* As the job reply's: 0 and nonsense keep it. */
			if (rep.u.client_heartbeat_reply.heartbeat_interval_ms >
				0 &&
			    rep.u.client_heartbeat_reply.heartbeat_interval_ms <=
				10000)
				s->heartbeat_ms = rep.u.client_heartbeat_reply
						      .heartbeat_interval_ms;
			s->last_hb_ok_ns = now;
		} else if (rep.type == CWI_MSG_ERROR && rep.u.error.lineage != 0 &&
			   s->lineage != 0 && rep.u.error.lineage != s->lineage) {
			cwi_client_fail(s, CACHEW_EIO, "dispatcher %s restarted "
			    "without its state (no journal, or it was "
			    "discarded): job %llu is gone; start the run again",
			    s->ctx->url, (unsigned long long)s->job_id);
		} else if (rep.type == CWI_MSG_ERROR) {
			cwi_client_fail(s, CACHEW_EIO, "dispatcher %s: %s",
			    s->ctx->url, rep.u.error.message != NULL
					     ? rep.u.error.message : "error");
		}
		cwi_pmsg_free(&rep);
	}
	if (c->reply != NULL)
		cwi_msg_destroy(c->reply);
	cwi_client_exact_sent(s, hb_ok);
	return hb_ok;
}

static bool
all_tasks_done(const session *s)
{
	if (s->coord != NULL)
		return s->coord_eof;
	for (size_t i = 0; i < s->ntasks; i++)
		if (!s->tasks[i].ended && !s->tasks[i].gone)
			return false;
	return true;
}

/* The epoch is over for this client: uncoordinated, an ack's reply said
 * every split is acknowledged, or the dispatcher says the job finished and
 * every task was read to its end; coordinated, no
 * task can serve a round any more (a job whose last rounds were dropped
 * may never see every split acknowledged). Every ack went out first. */
static bool
session_done(const session *s)
{
	if (s->nacks > 0 || s->ack_inflight)
		return false;
	if (s->coord != NULL)
		return s->coord_eof;
	return s->data_acked || (s->job_finished && all_tasks_done(s));
}

static void
on_completion(session *s, cwi_completion *c)
{
	uint64_t x, slot;

	if (c->tag == TAG_HEARTBEAT) {
		if (!on_heartbeat(s, c) && dispatcher_absent(s, cwi_now_ns()))
			cwi_client_fail(s, CACHEW_ETIMEDOUT, "dispatcher %s "
			    "did not answer for %llu ms", s->ctx->url,
			    (unsigned long long)absence_ms(s));
		return;
	}
	if (c->tag == TAG_ACK) {
		on_ack(s, c);
		return;
	}
	if (c->tag == TAG_RELEASE) {
		s->release_done = true;
		if (c->reply != NULL)
			cwi_msg_destroy(c->reply);
		return;
	}
	x = c->tag - TAG_DATA_BASE;
	slot = x & (MAX_TASK_SLOTS - 1);
	if (c->tag < TAG_DATA_BASE || slot >= s->ntasks) {
		if (c->reply != NULL)
			cwi_msg_destroy(c->reply);
		return;
	}
	if (s->coord != NULL) {
		s->tasks[slot].inflight--;
		cwi_client_rounds_reply(s, &s->tasks[slot], c,
		    x >> TAG_SLOT_BITS);
	} else {
		on_data(s, &s->tasks[slot], c);
	}
}

/* How long the fetch thread may wait for a completion: until the next
 * heartbeat or the next retry of a task, at most idle_wait_ms (the
 * consumer wakes it when it makes room that a request waits for). */
#define FETCH_WAIT_MS 50u

static int
fetch_wait_ms(const session *s, uint64_t now)
{
	uint64_t until = now + s->idle_wait_ms * UINT64_C(1000000);

	if (!s->hb_inflight && s->next_hb_ns < until)
		until = s->next_hb_ns;
	for (size_t i = 0; i < s->ntasks; i++) {
		const ctask *t = &s->tasks[i];
		if (!t->ended && t->retry_at_ns > now && t->retry_at_ns < until)
			until = t->retry_at_ns;
	}
	return until > now ? (int)((until - now + 999999u) / 1000000u) : 0;
}

static bool
session_failed(session *s)
{
	bool failed;

	pthread_mutex_lock(&s->lock);
	failed = s->err != CACHEW_OK;
	pthread_mutex_unlock(&s->lock);
	return failed;
}

/* The epoch's data is all in. Remote tasks' operator rows come from the
 * dispatcher, which has every finished lease's counters once every split
 * is acknowledged (a worker sends them before a lease's end goes out:
 * docs/protocol.md, "Operator counters"): the reply to one more
 * heartbeat, sent now, brings them, so the rows are exact when the
 * consumer sees the end. It waits for that reply, not for a time guess
 * (4 heartbeat intervals ran out on a loaded machine): a heartbeat that
 * fails (its own timeout, a reset) goes out again. Only the consumer
 * closing the iterator, a failed session or a dispatcher silent for as
 * long as a session rides one out ends the wait without the rows: the
 * data is all in, so the epoch still ends, with the rows it has. Data
 * replies meanwhile can only repeat acknowledged splits and are dropped,
 * as drain_requests does; the release's reply is taken. A direct task's
 * rows are its own. */
static void
final_rows(session *s)
{
	bool direct, sent = false;

	pthread_mutex_lock(&s->lock);
	direct = s->inl.conn != NULL;
	pthread_mutex_unlock(&s->lock);
	if (direct)
		return;
	while (!atomic_load(&s->closing) && !session_failed(s)) {
		cwi_completion c;
		if (dispatcher_absent(s, cwi_now_ns())) {
			cwi_log(CACHEW_LOG_WARN, "client", "event=rows_not_exact "
			    "job=%llu reason=\"dispatcher %s did not answer "
			    "for %llu ms\"", (unsigned long long)s->job_id,
			    s->ctx->url, (unsigned long long)absence_ms(s));
			return;
		}
		if (!s->hb_inflight) {
			send_heartbeat(s);
			/* One that could not go out is tried again after an
			 * interval, as the fetch loop would. */
			sent = s->hb_inflight;
		}
		if (cwi_cq_wait(s->cq, (int)s->heartbeat_ms, &c) != CACHEW_OK)
			continue;
		if (c.tag == TAG_HEARTBEAT) {
			if (on_heartbeat(s, &c) && sent)
				return;
		} else if (c.tag == TAG_RELEASE || c.tag == TAG_ACK) {
			on_completion(s, &c);
		} else if (c.reply != NULL) {
			cwi_msg_destroy(c.reply);
		}
	}
}

/*
 * A consumer slower than the workers keeps the buffer full for long, and
 * the replies it frees in the order they came leave holes in the heap
 * that later replies (of other sizes) fill only in part: the process
 * grew by 14 MiB in 3 minutes over a 32 MiB buffer with the nng
 * transport's heap settings (cwi_nng_heap_tune: one arena, blocks up to
 * 64 MiB in the heap, 64 MiB of free top kept), and stayed flat at 44 MB
 * without them. While the buffer stays full (the process then waits for
 * its consumer anyway: a fast consumer empties it within the second), the
 * free pages go back once a second: 1.8 ms with 40 MB free, nothing when
 * little is. The large buffers kept for reuse stay, but for those nobody
 * took within their second: dropping them all made a client that keeps
 * its buffer full by running the pipeline's tail (W2's normalize) fault
 * its next batches in again every second (W2 through the service: 134,000
 * page faults in 6,000 images, 0.41 s of system time in 0.93).
 */
#define HEAP_RELEASE_NS (UINT64_C(1) * 1000000000u)

static void
release_heap(session *s, uint64_t now)
{
	if (!s->buffer_full || now - s->full_since_ns < HEAP_RELEASE_NS ||
	    now - s->heap_released_ns < HEAP_RELEASE_NS)
		return;
	cwi_heap_release(false);
	s->heap_released_ns = now;
}

static void *
fetch_main(void *arg)
{
	session *s = arg;

	s->last_hb_ok_ns = cwi_now_ns();
	s->idle_wait_ms = FETCH_WAIT_MS;
	send_heartbeat(s);
	while (!atomic_load(&s->closing)) {
		cwi_completion c;
		uint64_t now = cwi_now_ns();
		bool soon;
		int wait_ms;

		pthread_mutex_lock(&s->lock);
		bool stop = s->err != CACHEW_OK || s->eof;
		pthread_mutex_unlock(&s->lock);
		if (stop)
			break;
		if (s->coord != NULL)
			cwi_client_rounds_deliver(s);
		if (session_done(s)) {
			final_rows(s);
			cwi_client_end_epoch(s);
			break;
		}
		cwi_client_exact_poll(s);
		if (cwi_client_exact_due(s) && !s->hb_inflight)
			s->next_hb_ns = 0; /* a report: at once */
		/* Near the end (every task ended, every ack confirmed), ask
		 * every 20 ms whether the job finished; coordinated, the same
		 * while a schedule change holds the rounds back. */
		soon = (s->ntasks > 0 && all_tasks_done(s) &&
			   s->nacks == 0 && !s->ack_inflight) ||
		       (s->coord != NULL && cwi_coord_blocked(s->coord));
		if (!s->hb_inflight &&
		    (now >= s->next_hb_ns ||
			(soon && now + (uint64_t)s->heartbeat_ms * 1000000u >=
				     s->next_hb_ns + 20000000u)))
			send_heartbeat(s);
		send_acks(s);
		send_requests(s);
		release_heap(s, now);
		cwi_client_auto_tick(s, now);
		wait_ms = fetch_wait_ms(s, now);
		if (cwi_cq_wait(s->cq, wait_ms, &c) != CACHEW_OK) {
			s->idle_wait_ms = s->idle_wait_ms * 2 > s->heartbeat_ms
			    ? (s->heartbeat_ms > FETCH_WAIT_MS ? s->heartbeat_ms
							       : FETCH_WAIT_MS)
			    : s->idle_wait_ms * 2;
			continue;
		}
		if (c.tag != TAG_HEARTBEAT)
			s->idle_wait_ms = FETCH_WAIT_MS; /* data flows */
		on_completion(s, &c);
		/* Take whatever else completed before going round again. */
		while (cwi_cq_wait(s->cq, 0, &c) == CACHEW_OK)
			on_completion(s, &c);
	}
	return NULL;
}

/* ---- session lifecycle ----------------------------------------------------------- */

void
cwi_client_end_epoch(session *s)
{
	cwi_chunk last = {0};
	char err[512];
	cachew_err rv;

	/* The tails left over: the epoch's last partial batches, before the
	 * consumer sees the end. */
	rv = cwi_client_exact_finish(s, &last, err, sizeof(err));
	if (rv != CACHEW_OK)
		cwi_client_fail(s, rv, "%s", err);
	cwi_chunk_free(&last);
	pthread_mutex_lock(&s->lock);
	s->eof = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* A named job that runs another dataset refused this client, whose
 * worker part is narrower than its pipeline's (client_tail=on): says
 * which setting makes the worker parts agree. */
static cachew_err
tail_refused(const client_ctx *ctx, cachew_err rv)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
	return cwi_fail(rv, "%s (client_tail=on runs %s on this client, so "
	    "its workers run a narrower pipeline than a client that keeps it "
	    "on the workers: give every client of job '%s' the same "
	    "client_tail)", msg, ctx->plan->tail_why, ctx->opts.job_name);
}

static cachew_err
join_job(session *s)
{
	client_ctx *ctx = s->ctx;
	int64_t total = ctx->opts.service_timeout_ms;
	cwi_pmsg req, rep;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_DATASET_REGISTER);
	req.u.dataset_register.fingerprint = ctx->plan->worker_fp;
	req.u.dataset_register.graph = ctx->graph;
	req.u.dataset_register.graph_len = ctx->graph_len;
	/* A plan without a split source runs whole: -1 on the wire. */
	req.u.dataset_register.splittable = ctx->plan->source != NULL;
	req.u.dataset_register.split_units = ctx->plan->units;
	(void)cwi_pmsg_set_token(&req, s->ctx->token); /* none: refused */
	rv = cwi_rpc_call_retry(s->dispatcher, &req,
	    CWI_MSG_DATASET_REGISTER_REPLY, total, &s->closing, &rep);
	req.u.dataset_register.graph = NULL; /* borrowed */
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	s->dataset_id = rep.u.dataset_register_reply.dataset_id;
	cwi_pmsg_free(&rep);

	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	cwi_msg_job_get_or_create *j = &req.u.job_get_or_create;
	j->dataset_id = s->dataset_id;
	j->job_name = ctx->opts.job_name[0] != '\0'
			  ? cwi_strdup(ctx->opts.job_name) : NULL;
	j->iteration = s->epoch;
	(void)cwi_processing_mode_parse(ctx->opts.processing_mode,
	    &j->processing_mode);
	j->num_consumers = (uint32_t)ctx->opts.num_consumers;
	j->consumer_index = ctx->opts.num_consumers > 0
				? ctx->opts.consumer_index : -1;
	j->worker_policy = ctx->opts.workers > 0 ? CWI_WORKERS_FIXED
						 : CWI_WORKERS_ALL;
	j->num_workers = (uint32_t)ctx->opts.workers;
	(void)cwi_compression_parse(ctx->opts.compression, &j->compression);
	j->seed = ctx->seed;
	j->epoch = s->epoch;
	if (ctx->opts.scale_policy[0] != '\0')
		j->scale_policy = cwi_strdup(ctx->opts.scale_policy);
	j->weight = (double)ctx->opts.job_weight;
	j->min_workers = (uint32_t)ctx->opts.min_workers;
	j->max_workers = (uint32_t)ctx->opts.max_workers;
	j->exactly_once = ctx->opts.exactly_once != 0;
	/* Retries send the same nonce: a join whose reply was lost is
	 * found, not made twice. */
	j->nonce = cwi_mix64(cwi_now_ns() ^ (uint64_t)(uintptr_t)s ^
	    ((uint64_t)getpid() << 32)) | 1;
	if (s->resume != NULL) {
		rv = cwi_client_resume_fill(s->resume, j);
		if (rv != CACHEW_OK) {
			cwi_pmsg_free(&req);
			return rv;
		}
	}
	(void)cwi_pmsg_set_token(&req, s->ctx->token); /* none: refused */
	rv = cwi_rpc_call_retry(s->dispatcher, &req,
	    CWI_MSG_JOB_GET_OR_CREATE_REPLY, total, &s->closing, &rep);
	cwi_pmsg_free(&req);
	if (rv == CACHEW_EINVAL && ctx->plan->ntail > 0 &&
	    ctx->opts.job_name[0] != '\0')
		return tail_refused(ctx, rv);
	if (rv != CACHEW_OK)
		return rv;
	s->job_id = rep.u.job_get_or_create_reply.job_id;
	s->client_id = rep.u.job_get_or_create_reply.client_id;
	s->lineage = rep.u.job_get_or_create_reply.lineage;
	s->units = rep.u.job_get_or_create_reply.units;
	s->units_per_split = rep.u.job_get_or_create_reply.units_per_split;
	/* A named job's settings are its first client's. */
	s->compression = rep.u.job_get_or_create_reply.compression;
	s->zstd_on = s->compression == CWI_COMPRESSION_ZSTD;
	if (rep.u.job_get_or_create_reply.num_consumers > 0)
		rv = cwi_client_rounds_start(s);
	/* The dispatcher refuses to mix exactly-once clients with others
	 * in a job; it applies to uncoordinated distributed_epoch jobs. */
	s->exact = ctx->opts.exactly_once != 0 && s->coord == NULL &&
	    rep.u.job_get_or_create_reply.processing_mode ==
		CWI_MODE_DISTRIBUTED_EPOCH;
	if (rv == CACHEW_OK)
		rv = cwi_client_exact_init(s);
	s->heartbeat_ms = rep.u.job_get_or_create_reply.heartbeat_interval_ms;
	if (s->heartbeat_ms == 0 || s->heartbeat_ms > 10000)
		s->heartbeat_ms = 500;
	cwi_pmsg_free(&rep);
	if (rv != CACHEW_OK)
		return rv;
	cwi_log(CACHEW_LOG_INFO, "client", "event=joined job=%llu client=%llu "
	    "dispatcher=%s consumer=%lld compression=%s",
	    (unsigned long long)s->job_id, (unsigned long long)s->client_id,
	    ctx->url, s->coord != NULL ? (long long)ctx->opts.consumer_index
				       : -1LL,
	    cwi_compression_name(s->compression));
	return CACHEW_OK;
}

/* The next completion on the session's queue, waiting until deadline (a
 * cwi_now_ns time) at most; false when none came. */
static bool
cq_wait_until(session *s, uint64_t deadline, cwi_completion *c)
{
	for (uint64_t now = cwi_now_ns(); now < deadline; now = cwi_now_ns()) {
		cachew_err rv = cwi_cq_wait(s->cq,
		    (int)((deadline - now) / 1000000u) + 1, c);
		/* ETIMEDOUT before the deadline: the consumer woke us. */
		if (rv != CACHEW_ETIMEDOUT)
			return rv == CACHEW_OK;
	}
	return false;
}

/* At the end of the epoch, the requests still in flight (coordinated:
 * rounds asked for beyond a task's end) are answered at once: wait for
 * them (2 s at most) rather than cancel them. nng 1.5's nng_close() was
 * seen to hang on a req socket whose contexts had requests canceled, with
 * many in flight. */
static void
drain_requests(session *s)
{
	uint64_t deadline = cwi_now_ns() + 2000 * UINT64_C(1000000);
	bool eof;

	pthread_mutex_lock(&s->lock);
	eof = s->eof;
	pthread_mutex_unlock(&s->lock);
	while (eof && s->cq != NULL && cwi_cq_outstanding(s->cq) > 0) {
		cwi_completion c;
		if (!cq_wait_until(s, deadline, &c))
			break;
		if (c.reply != NULL)
			cwi_msg_destroy(c.reply);
	}
}

/* Releases the session's part of the job. Through the fetch thread's
 * queue: its reply also ends the fetch thread's wait at once (it would
 * otherwise sleep out its timeout before noticing `closing`, up to 50 ms
 * per iterator). Without a fetch thread, a plain call. */
static void
release_job(session *s)
{
	cwi_pmsg req, rep;
	cwi_msg *msg;

	cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
	req.u.job_release.job_id = s->job_id;
	req.u.job_release.client_id = s->client_id;
	req.u.job_release.lineage = s->lineage;
	pthread_mutex_lock(&s->lock);
	req.u.job_release.elements_received = s->elements_received;
	req.u.job_release.bytes_received = s->bytes_received;
	pthread_mutex_unlock(&s->lock);
	(void)cwi_pmsg_set_token(&req, s->ctx->token); /* none: refused */
	if (!s->fetcher_started) {
		if (cwi_rpc_call(s->dispatcher, &req, CWI_MSG_OK, 2000,
			&rep) == CACHEW_OK)
			cwi_pmsg_free(&rep);
	} else if (cwi_rpc_pack(&req, &msg) == CACHEW_OK) {
		if (cwi_conn_send(s->dispatcher, msg, 2000, s->cq,
			TAG_RELEASE) == CACHEW_OK)
			s->release_sent = true;
		else
			cwi_msg_destroy(msg);
	}
	cwi_pmsg_free(&req);
}

/* The release must reach the dispatcher before the connection closes
 * (closing cancels what is still queued): waits for its reply (2 s at
 * most) if the fetch thread did not take it. */
static void
await_release(session *s)
{
	uint64_t deadline = cwi_now_ns() + 2000 * UINT64_C(1000000);

	if (!s->release_sent)
		return;
	while (!s->release_done) {
		cwi_completion c;
		if (!cq_wait_until(s, deadline, &c))
			break;
		on_completion(s, &c);
	}
}

/* Closes every connection and the completion queue (what is still in
 * flight is canceled). */
static void
session_close_conns(session *s)
{
	for (size_t i = 0; i < s->nconns; i++)
		cwi_conn_close(s->conns[i].conn);
	if (s->dispatcher != NULL)
		cwi_conn_close(s->dispatcher);
	if (s->cq != NULL)
		cwi_cq_close(s->cq);
}

/* Frees what the session holds, once nothing runs on it any more. */
static void
session_destroy(session *s)
{
	for (size_t i = 0; i < s->ntasks; i++) {
		cwi_client_task_drop_held(&s->tasks[i]);
		free(s->tasks[i].held);
		free(s->tasks[i].address);
	}
	free(s->tasks);
	for (size_t i = 0; i < s->nconns; i++) {
		cwi_conn_destroy(s->conns[i].conn);
		free(s->conns[i].address);
	}
	free(s->conns);
	cwi_conn_destroy(s->dispatcher);
	cwi_cq_destroy(s->cq);
	for (size_t i = 0; i < s->qlen; i++)
		cwi_element_release(s->q[(s->qhead + i) % s->qcap]);
	free(s->q);
	free(s->acks);
	free(s->ack_parts);
	free(s->ack_leases);
	free(s->sent_acks);
	free(s->sent_parts);
	free(s->sent_leases);
	cwi_coord_destroy(s->coord);
	cwi_client_exact_free(s);
	cwi_cq_destroy(s->inl_cq);
	ZSTD_freeDCtx(s->dctx);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

static void
session_free(session *s)
{
	if (s == NULL)
		return;
	cwi_client_session_retire_rows(s);
	atomic_store(&s->closing, true);
	if (s->job_id != 0 && s->dispatcher != NULL)
		release_job(s);
	if (s->fetcher_started)
		pthread_join(s->fetcher, NULL);
	await_release(s);
	drain_requests(s);
	session_close_conns(s);
	session_destroy(s);
}

/* Joins the job and starts the fetch thread. */
static cachew_err
session_start(session *s)
{
	cachew_err rv = join_job(s);

	if (rv != CACHEW_OK)
		return rv;
	if (pthread_create(&s->fetcher, NULL, fetch_main, s) != 0)
		return cwi_fail(CACHEW_ENOMEM, "cannot start a thread");
	s->fetcher_started = true;
	return CACHEW_OK;
}

/*
 * Tests only: CACHEW_TEST_LATE_OPEN=1 makes the open of a session return
 * only once its fetch thread ended the epoch (or the session failed, or
 * found a direct task, which the consumer reads itself), as a consumer
 * thread descheduled right after starting that thread would find it on a
 * loaded machine. For epochs that fit the client buffer; the wait is
 * bounded by service_timeout_ms against a larger one.
 */
static void
test_late_open(session *s)
{
	uint64_t deadline;

	if (getenv("CACHEW_TEST_LATE_OPEN") == NULL)
		return;
	deadline = cwi_now_ns() +
	    (uint64_t)s->ctx->opts.service_timeout_ms * 1000000u;
	pthread_mutex_lock(&s->lock);
	for (uint64_t now = cwi_now_ns(); !s->eof && s->err == CACHEW_OK &&
	     s->inl.conn == NULL && now < deadline; now = cwi_now_ns())
		(void)cwi_cond_wait_ns(&s->cond, &s->lock, deadline - now);
	pthread_mutex_unlock(&s->lock);
}

static cachew_err
stream_open(void *arg, uint64_t epoch, void **out, char *err, size_t errlen)
{
	client_ctx *ctx = arg;
	session *s = calloc(1, sizeof(*s));
	cwi_transport_opts o;
	cachew_err rv;

	*out = NULL;
	if (s == NULL) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	s->ctx = ctx;
	/* `epoch` already counts the epoch option (the client part's
	 * iterator runs with it) plus the repetitions before this one. */
	s->epoch = epoch;
	atomic_init(&s->closing, false);
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->exact_lock, NULL);
	cwi_cond_init_monotonic(&s->cond);
	cwi_transport_opts_init(&o);
	o.max_msg_size = CWI_TRANSPORT_MAX_MSG_DEFAULT;
	o.dial_async = true;
	o.unreachable_after_ms = CWI_RPC_UNREACHABLE_MS;
	cwi_rpc_client_tls(&ctx->opts, &o);
	rv = cwi_dial(&s->dispatcher, ctx->url, &o);
	if (rv == CACHEW_OK)
		rv = cwi_cq_create(&s->cq);
	if (rv == CACHEW_OK)
		rv = cwi_cq_create(&s->inl_cq);
	/* The session's rows are the context's before its fetch thread
	 * starts: that thread takes rows only for ctx->cur, and it may run
	 * the whole epoch, its last heartbeat included, before this thread
	 * runs again (embedded:2 lost one epoch's rows in about 1 run of 15
	 * at load 4). A failed start retires the session (session_free). */
	pthread_mutex_lock(&ctx->rows_lock);
	ctx->cur = s;
	pthread_mutex_unlock(&ctx->rows_lock);
	/* A restore joins with the saved position (stream_restore). */
	if (rv == CACHEW_OK && !ctx->restoring)
		rv = session_start(s);
	if (rv == CACHEW_OK && !ctx->restoring)
		test_late_open(s);
	if (rv != CACHEW_OK) {
		const char *why = cwi_errmsg_get();
		size_t n = strlen(ctx->url);

		/* The transport's messages begin with the URL: once is
		 * enough. */
		if (strncmp(why, ctx->url, n) == 0 && why[n] == ':')
			why += n + 1 + (why[n + 1] == ' ');
		snprintf(err, errlen, "service %s: %s", ctx->url, why);
		session_free(s);
		return rv;
	}
	*out = s;
	return CACHEW_OK;
}

/* The buffer an element's data lies in (a received reply's, for the
 * elements of a reply), or NULL. */
static const cwi_buffer *
element_block(const cwi_element *e)
{
	return e->n > 0 ? e->comp[0].buf : NULL;
}

/* e left the queue (s->lock held). The elements of one reply view its
 * buffer, which lives while any of them does: while the next queued
 * element views the same one, e's bytes stay counted (s->pinned). */
static void
queue_pin(session *s, const cwi_element *e)
{
	const cwi_buffer *b = element_block(e);

	if (b != NULL && s->qlen > 0 && element_block(s->q[s->qhead]) == b)
		s->pinned += cwi_element_nbytes(e);
	else
		s->pinned = 0;
}

/* The consumer made room (s->lock held): wakes the fetch thread if a
 * request waits for it (send_requests). */
static void
wake_fetcher(session *s)
{
	if (s->wake_armed &&
	    s->qbytes + s->pinned + s->handed <= s->wake_at_bytes) {
		s->wake_armed = false;
		cwi_cq_wake(s->cq);
	}
}

static cachew_err
stream_next(void *arg, cwi_chunk *out, size_t max, char *err, size_t errlen)
{
	session *s = arg;
	uint64_t t0 = cwi_now_ns();
	cachew_err rv = CACHEW_OK;
	size_t n = 0;

	if (!s->fetcher_started) {
		/* Opened for a restore that never came: nothing feeds it. */
		snprintf(err, errlen, "service %s: the stream was opened for a "
		    "restore and never restored", s->ctx->url);
		return CACHEW_EINTERNAL;
	}
	pthread_mutex_lock(&s->lock);
	/* The consumer has taken on the chunk of the previous call. */
	s->handed = 0;
	wake_fetcher(s);
	while (s->qlen == 0 && !s->eof && s->err == CACHEW_OK &&
	    !s->canceled) {
		size_t got = 0;

		if (cwi_client_direct_turn(s, out, max, &got)) {
			if (got > 0) {
				n = got;
				goto taken;
			}
			continue;
		}
		pthread_cond_wait(&s->cond, &s->lock);
	}
	if (s->canceled) {
		rv = CACHEW_ECANCELED;
		snprintf(err, errlen, "service %s: canceled", s->ctx->url);
	} else if (s->qlen > 0) {
		n = s->qlen < max ? s->qlen : max;
		for (size_t i = 0; i < n; i++) {
			cwi_element *e = s->q[s->qhead];
			s->qhead = (s->qhead + 1) % s->qcap;
			s->qlen--;
			s->qbytes -= cwi_element_nbytes(e);
			/* The element the consumer works on is its own: the
			 * rest of the chunk waits in its iterator. */
			if (i > 0)
				s->handed += cwi_element_nbytes(e);
			queue_pin(s, e);
			cwi_chunk_push(out, e);
		}
		wake_fetcher(s);
	} else if (s->err != CACHEW_OK) {
		rv = s->err;
		snprintf(err, errlen, "%s", s->errmsg);
	} else {
		rv = CACHEW_EOF;
	}
taken:
	cwi_client_count_received(s, out, n);
	uint64_t now = cwi_now_ns();
	s->wait_ns += now - t0;
	s->auto_wait_ns += now - t0;
	/* The consumer took the elements of the previous chunk (the
	 * trainer's batches, when the pipeline ends with batch()) in the
	 * time since that chunk was handed over. */
	if (s->last_next_ns != 0) {
		s->batch_ns_sum += now - s->last_next_ns;
		s->batches += s->last_chunk_n;
	}
	s->last_next_ns = now;
	s->last_chunk_n = n;
	pthread_mutex_unlock(&s->lock);
	return rv;
}

/* cachew_iterator_cancel, from any thread: the consumer stops waiting. */
static void
stream_cancel(void *arg)
{
	session *s = arg;

	pthread_mutex_lock(&s->lock);
	s->canceled = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void
stream_close(void *arg)
{
	session_free(arg);
}

static cachew_err
stream_save(void *arg, cwi_state_writer *w)
{
	return cwi_client_session_save(arg, w);
}

/* Joins the job with the saved position, then the session takes what the
 * client had received and not yet handed on. */
static cachew_err
stream_restore(void *arg, cwi_state_reader *r)
{
	session *s = arg;
	cwi_client_resume *rs;
	cachew_err rv;

	rv = cwi_client_resume_read(r, s->epoch, s->ctx->plan->ngroups, &rs);
	if (rv != CACHEW_OK)
		return rv;
	s->resume = rs;
	rv = join_job(s);
	s->resume = NULL;
	/* A dispatcher that ignored the resume (older than it) cut the
	 * input its own way: the saved groups would name other units. */
	if (rv == CACHEW_OK && (s->units != cwi_client_resume_units(rs) ||
	    s->units_per_split != cwi_client_resume_units_per_split(rs)))
		rv = cwi_fail(CACHEW_ENOTSUP, "the dispatcher did not resume "
		    "the position (it cut the job into splits of %llu units, "
		    "the position's are of %llu): it is older than resumable "
		    "iteration", (unsigned long long)s->units_per_split,
		    (unsigned long long)cwi_client_resume_units_per_split(rs));
	if (rv == CACHEW_OK)
		rv = cwi_client_resume_install(s, rs);
	cwi_client_resume_free(rs);
	if (rv == CACHEW_OK && pthread_create(&s->fetcher, NULL, fetch_main,
	    s) != 0)
		rv = cwi_fail(CACHEW_ENOMEM, "cannot start a thread");
	if (rv != CACHEW_OK) {
		cwi_sr_fail(r, rv, "service %s: %s", s->ctx->url,
		    cwi_errmsg_get());
		return cwi_sr_error(r);
	}
	s->fetcher_started = true;
	return CACHEW_OK;
}

static const cwi_stream_ops stream_ops = {
    .open = stream_open,
    .next = stream_next,
    .close = stream_close,
    .save = stream_save,
    .restore = stream_restore,
    .cancel = stream_cancel,
};

/* ---- the iterator ---------------------------------------------------------------- */

static void
ctx_free(void *arg)
{
	client_ctx *ctx = arg;

	if (ctx == NULL)
		return;
	cachew_dataset_release(ctx->client_graph);
	cwi_split_plan_destroy(ctx->plan);
	cachew_free(ctx->graph);
	if (ctx->token != NULL)
		explicit_bzero(ctx->token, strlen(ctx->token));
	free(ctx->token);
	pthread_mutex_destroy(&ctx->rows_lock);
	free(ctx);
}

/* The token_file option, else CACHEW_TOKEN_FILE: the client's token. The
 * embedded service (inproc) takes none: a variable set for a remote
 * dispatcher must not fail a program that runs in-process. */
static cachew_err
read_token(client_ctx *ctx)
{
	const char *path = ctx->opts.token_file;

	if (strncmp(ctx->url, "inproc://", 9) == 0)
		return CACHEW_OK;
	if (path[0] == '\0' && (path = getenv("CACHEW_TOKEN_FILE")) == NULL)
		return CACHEW_OK;
	if (path[0] == '\0')
		return CACHEW_OK;
	return cwi_auth_token_read(path, &ctx->token);
}

/*
 * Whether this client moves the plan's client tail (exec_split.h) out of
 * the worker part. Only for a remote service: over it each byte a worker
 * sends costs serialisation, a kernel copy on both sides and with TLS the
 * cipher (~0.38 CPU s per GB), so widening u8 -> f32 on the client cuts
 * W2's wire bytes 4x. The embedded service moves pointers: there the
 * widening would only move from the worker's threads onto the consumer's.
 * auto leaves a named job's tail on the workers: its clients may be of
 * builds that do not move it, or say off, and a job's clients must all
 * run the same worker part (the dispatcher refuses the others with
 * EINVAL); on moves it for a named job too.
 */
static unsigned
tail_flags(const client_ctx *ctx)
{
	const char *mode = ctx->opts.client_tail;

	if (strncmp(ctx->url, "inproc://", 9) == 0 || strcmp(mode, "off") == 0)
		return 0;
	if (strcmp(mode, "on") != 0 && ctx->opts.job_name[0] != '\0')
		return 0;
	return CWI_SPLIT_CLIENT_TAIL;
}

/* The iterator of ds on the service at url, with pipeline seed `seed`;
 * `restoring`: its streams wait for a saved position. tail: the client
 * tail's placement (CWI_SPLIT_CLIENT_TAIL or 0), or -1 for the options'
 * (tail_flags). */
static cachew_err
iterator_make(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *url, uint64_t seed,
    bool restoring, int tail, client_ctx **ctxp)
{
	client_ctx *ctx = calloc(1, sizeof(*ctx));
	cwi_names *own_names;
	cachew_err rv;

	*out = NULL;
	if (ctx == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&ctx->rows_lock, NULL);
	if (opts != NULL)
		ctx->opts = *cwi_options_values(opts);
	else
		cwi_opts_defaults(&ctx->opts);
	snprintf(ctx->url, sizeof(ctx->url), "%s", url);
	ctx->seed = seed;
	ctx->restoring = restoring;
	rv = read_token(ctx);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cwi_split_plan_create_for(&ctx->plan, ds,
	    tail >= 0 ? (unsigned)tail : tail_flags(ctx));
	if (rv != CACHEW_OK) {
		rv = cwi_fail(rv, "service %s: %s", url, cwi_errmsg_get());
		goto fail;
	}
	own_names = cwi_spec_names(&ctx->plan->worker->spec);
	ctx->wire_names = own_names == NULL;
	cwi_names_unref(own_names);
	rv = cachew_dataset_to_msgpack(ctx->plan->worker,
	    (void **)&ctx->graph, &ctx->graph_len);
	if (rv != CACHEW_OK)
		goto fail;
	/* Every pipeline has a plan; one whose graph the wire cannot carry
	 * (a large literal) is the one the service cannot run. */
	if (ctx->graph_len > CWI_PROTO_MAX_GRAPH_SENT) {
		rv = cwi_fail(CACHEW_ENOTSUP, "service %s: the pipeline's graph "
		    "is %zu bytes, over the service's limit of %u (a large "
		    "literal?); run it in-process (service=local)",
		    url, ctx->graph_len, CWI_PROTO_MAX_GRAPH_SENT);
		goto fail;
	}
	ctx->src.ops = &stream_ops;
	ctx->src.ctx = ctx;
	rv = cwi_split_client_graph(ctx->plan, &ctx->src, &ctx->client_graph);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_client_rows_prefill(ctx);
	/* The client part runs locally with the job's seed, so that a
	 * client-side shuffle replays like the in-process run. */
	/* The iterator owns ctx from here (ctx_free), failure included. */
	if (ctxp != NULL)
		*ctxp = ctx;
	rv = cwi_iterator_create_owned(out, ctx->client_graph, opts,
	    ctx->seed, ctx_free, ctx);
	if (rv == CACHEW_OK) {
		cwi_iterator_set_part_stats(*out, cwi_client_part_stats);
		cwi_iterator_set_names(*out, ds);
	}
	return rv;
fail:
	ctx_free(ctx);
	return rv;
}

cachew_err
cwi_client_iterator_create(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *url)
{
	const cwi_opts *o = opts != NULL ? cwi_options_values(opts) : NULL;

	return iterator_make(out, ds, opts, url,
	    o != NULL && o->seed >= 0 ? (uint64_t)o->seed : cwi_fresh_seed(),
	    false, -1, NULL);
}

/* Restores r into a new iterator whose client tail is placed by tail (as
 * iterator_make's); *moved says whether the plan moved it, *movable
 * whether it had one to move (false when the iterator was not made). */
static cachew_err
restore_placed(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *url, uint64_t seed,
    cwi_state_reader *r, int tail, bool *moved, bool *movable)
{
	client_ctx *ctx;
	cachew_err rv;

	*moved = *movable = false;
	rv = iterator_make(out, ds, opts, url, seed, true, tail, &ctx);
	if (rv != CACHEW_OK)
		return rv;
	*moved = ctx->plan->ntail > 0;
	*movable = ctx->plan->ncandidate > 0;
	rv = cwi_exec_iterator_restore(*out, r);
	ctx->restoring = false; /* later repetitions join as usual */
	if (rv != CACHEW_OK) {
		cachew_iterator_destroy(*out);
		*out = NULL;
	}
	return rv;
}

cachew_err
cwi_client_iterator_restore(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *url, uint64_t seed,
    cwi_state_reader *r)
{
	cwi_state_reader again = *r, first;
	char msg[512];
	bool moved, movable;
	unsigned placed;
	cachew_err rv;

	rv = restore_placed(out, ds, opts, url, seed, r, -1, &moved, &movable);
	if (rv != CACHEW_EINVAL || !movable)
		return rv;
	/* A position saved with the client tail placed the other way (by
	 * the embedded service, with another client_tail, by a build that
	 * does not move it) holds another client part: its operator states
	 * tell at once, before the stream joins a job. It continues with the
	 * tail where it was. When that fails too, the first failure is the
	 * one to report. */
	placed = moved ? 0 : CWI_SPLIT_CLIENT_TAIL;
	first = *r;
	snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
	*r = again;
	if (restore_placed(out, ds, opts, url, seed, r, (int)placed, &moved,
		&movable) == CACHEW_OK)
		return CACHEW_OK;
	*r = first;
	return cwi_fail(rv, "%s", msg);
}
