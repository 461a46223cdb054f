/*
 * dispatcher_journal.c - the dispatcher's journal records: what the server
 * appends for every call that changes the state machine, and how a
 * restart applies them again (docs/journal.md, "Dispatcher records").
 *
 * The state machine is deterministic: the same calls with the same clock
 * readings leave the same state. So a record is the call itself -- the
 * request's msgpack bytes as they came off the wire and the clock the
 * call ran with -- and recovery is the calls run again in journal order
 * on the snapshot's state (or an empty one). Nothing is derived twice.
 * The calls that are not requests have records of their own: a tick, a
 * job request that took an autocaching plan (the plan came from the
 * planner's I/O, which a replay must not repeat), a planner's decision
 * recorded for status, a start of the dispatcher, and what the planner
 * learned (its state lines that changed: dispatcher_planner.c).
 *
 * Each record is one msgpack array whose first item is its kind and
 * second the clock (ns):
 *   [1, now, request]                 a request (bin: the message bytes)
 *   [2, now]                          cwi_dispatcher_tick
 *   [3, now, request, graph, units, mode, worker_scale_bits, event]
 *                                     a job request with a pass offered
 *   [4, now, job_id, mode or "", text] cwi_dispatcher_autocache_event
 *   [5, now, lineage, incarnation, config, first_id]
 *                                     a start; config: the options the
 *                                     later records ran with
 *   [6, now, lines]                   the planner's state lines that
 *                                     changed (str, each ending in '\n')
 * A request that failed changed nothing and has no record; neither has a
 * status request (it only reads).
 *
 * Thread safety: none, as the rest of the state machine.
 */
#include "dispatcher_int.h"
#include "../../core/value_msgpack.h"

#include <stdlib.h>
#include <string.h>

enum {
	REC_REQUEST = 1,
	REC_TICK = 2,
	REC_PASS_REQUEST = 3,
	REC_AUTOCACHE = 4,
	REC_START = 5,
	REC_PLANNER = 6,
};

/* ---- the configuration the records ran with -------------------------------- */

/* The config fields that decide what a call does to the state, in this
 * order: a replay runs each record under the configuration it first ran
 * with (a restart may change options), and the state then continues
 * under the new one. Doubles travel as their bits. */
#define CFG_FIELDS 36
static const char CFG_TYPES[CFG_FIELDS + 1] =
    "LLIIIIIIIIIBLIIIEIDIILIIIIDIDDLILLLL";

static uint64_t
dbits(double x)
{
	uint64_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static double
bitsd(uint64_t u)
{
	double x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

static void
cfg_values(const cwi_dispatcher_config *c, uint64_t v[CFG_FIELDS])
{
	const cwi_scale_config *s = &c->scale;
	size_t i = 0;

	v[i++] = c->worker_timeout_ns;
	v[i++] = c->client_timeout_ns;
	v[i++] = c->worker_heartbeat_ms;
	v[i++] = c->client_heartbeat_ms;
	v[i++] = c->splits_per_worker;
	v[i++] = c->max_lease;
	v[i++] = c->lease_size;
	v[i++] = c->lease_retry_ms;
	v[i++] = c->coord_round_margin;
	v[i++] = c->max_finished_jobs;
	v[i++] = c->max_consumers;
	v[i++] = c->autoscale;
	v[i++] = c->decision_interval_ns;
	v[i++] = c->min_workers;
	v[i++] = c->max_workers;
	v[i++] = c->pool_down_intervals;
	v[i++] = (uint64_t)s->kind;
	v[i++] = s->fixed;
	v[i++] = dbits(s->hpa_target);
	v[i++] = s->min_workers;
	v[i++] = s->max_workers;
	v[i++] = s->cooldown_ns;
	v[i++] = s->window_batches;
	v[i++] = s->discard_epoch;
	v[i++] = s->discard_change;
	v[i++] = s->min_step_batches;
	v[i++] = dbits(s->improve);
	v[i++] = s->drift_every;
	v[i++] = dbits(s->drift_factor);
	v[i++] = dbits(s->headroom);
	v[i++] = s->window_max_ns;
	v[i++] = s->min_window_batches;
	v[i++] = s->discard_max_ns;
	v[i++] = s->probe_min_ns;
	v[i++] = s->probe_max_ns;
	v[i++] = s->probe_watch_ns;
}

static void
put_cfg(cwi_strbuf *out, const cwi_dispatcher_config *c)
{
	uint64_t v[CFG_FIELDS];

	cfg_values(c, v);
	cwi_msgpack_put_array(out, CFG_FIELDS);
	for (size_t i = 0; i < CFG_FIELDS; i++)
		cwi_msgpack_put_uint(out, v[i]);
}

/* Reads a config block into c (a copy of the current one: the fields
 * not in the block, callbacks and events, stay). */
static bool
get_cfg(cwi_mp_cursor *cur, cwi_dispatcher_config *c)
{
	uint64_t n, v[CFG_FIELDS];
	cwi_scale_config *s = &c->scale;
	size_t i = 0;

	if (!cwi_mp_get_array(cur, &n) || n != CFG_FIELDS)
		return false;
	for (size_t k = 0; k < CFG_FIELDS; k++)
		if (!cwi_mp_get_uint(cur, &v[k]))
			return false;
	/* Each field within its type (L 64-bit, I 32-bit, B a boolean, E
	 * the policy kind, D a double's bits), and the counts the state
	 * allocates or divides by not 0 (the option table's bounds). */
	for (size_t k = 0; k < CFG_FIELDS; k++) {
		char t = CFG_TYPES[k];
		if ((t == 'I' && v[k] > UINT32_MAX) || (t == 'B' && v[k] > 1) ||
		    (t == 'E' && v[k] > CWI_SCALE_HPA))
			return false;
	}
	if (v[4] == 0 || v[5] == 0 || v[6] == 0 || v[15] == 0 || v[15] > 1000)
		return false;
	c->worker_timeout_ns = v[i++];
	c->client_timeout_ns = v[i++];
	c->worker_heartbeat_ms = (uint32_t)v[i++];
	c->client_heartbeat_ms = (uint32_t)v[i++];
	c->splits_per_worker = (uint32_t)v[i++];
	c->max_lease = (uint32_t)v[i++];
	c->lease_size = (uint32_t)v[i++];
	c->lease_retry_ms = (uint32_t)v[i++];
	c->coord_round_margin = (uint32_t)v[i++];
	c->max_finished_jobs = (uint32_t)v[i++];
	c->max_consumers = (uint32_t)v[i++];
	c->autoscale = v[i++] != 0;
	c->decision_interval_ns = v[i++];
	c->min_workers = (uint32_t)v[i++];
	c->max_workers = (uint32_t)v[i++];
	c->pool_down_intervals = (uint32_t)v[i++];
	s->kind = (cwi_scale_kind)v[i++];
	s->fixed = (uint32_t)v[i++];
	s->hpa_target = bitsd(v[i++]);
	s->min_workers = (uint32_t)v[i++];
	s->max_workers = (uint32_t)v[i++];
	s->cooldown_ns = v[i++];
	s->window_batches = (uint32_t)v[i++];
	s->discard_epoch = (uint32_t)v[i++];
	s->discard_change = (uint32_t)v[i++];
	s->min_step_batches = (uint32_t)v[i++];
	s->improve = bitsd(v[i++]);
	s->drift_every = (uint32_t)v[i++];
	s->drift_factor = bitsd(v[i++]);
	s->headroom = bitsd(v[i++]);
	s->window_max_ns = v[i++];
	s->min_window_batches = (uint32_t)v[i++];
	s->discard_max_ns = v[i++];
	s->probe_min_ns = v[i++];
	s->probe_max_ns = v[i++];
	s->probe_watch_ns = v[i++];
	return true;
}

/* Makes c the state's configuration; the pool's history of raw targets
 * follows a changed length (its newest entries kept). */
static cachew_err
set_cfg(cwi_dispatcher *d, const cwi_dispatcher_config *c)
{
	if (c->pool_down_intervals != d->cfg.pool_down_intervals) {
		uint32_t *v = calloc(c->pool_down_intervals, sizeof(*v));
		uint32_t keep = d->npool_recent < c->pool_down_intervals
				    ? d->npool_recent
				    : c->pool_down_intervals;

		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		memcpy(v, d->pool_recent, keep * sizeof(*v)); /* newest first */
		free(d->pool_recent);
		d->pool_recent = v;
		d->npool_recent = keep;
	}
	d->cfg = *c;
	return CACHEW_OK;
}

static void
put_head(cwi_strbuf *out, unsigned n, unsigned kind, uint64_t now)
{
	out->len = 0;
	out->oom = false;
	cwi_msgpack_put_array(out, n);
	cwi_msgpack_put_uint(out, kind);
	cwi_msgpack_put_uint(out, now);
}

static cachew_err
done(const cwi_strbuf *out)
{
	return out->oom ? cwi_fail(CACHEW_ENOMEM, "out of memory") : CACHEW_OK;
}

cachew_err
cwi_jrec_request(cwi_strbuf *out, uint64_t now, const uint8_t *req,
    size_t len)
{
	put_head(out, 3, REC_REQUEST, now);
	cwi_msgpack_put_bin(out, req, len);
	return done(out);
}

cachew_err
cwi_jrec_pass_request(cwi_strbuf *out, uint64_t now, const uint8_t *req,
    size_t len, const cwi_job_pass *p)
{
	uint64_t bits;

	memcpy(&bits, &p->worker_scale, sizeof(bits));
	put_head(out, 8, REC_PASS_REQUEST, now);
	cwi_msgpack_put_bin(out, req, len);
	cwi_msgpack_put_bin(out, p->graph, p->graph_len);
	cwi_msgpack_put_uint(out, p->units);
	cwi_msgpack_put_str(out, p->mode, strnlen(p->mode, sizeof(p->mode)));
	cwi_msgpack_put_uint(out, bits);
	cwi_msgpack_put_str(out, p->event,
	    strnlen(p->event, sizeof(p->event)));
	return done(out);
}

cachew_err
cwi_jrec_tick(cwi_strbuf *out, uint64_t now)
{
	put_head(out, 2, REC_TICK, now);
	return done(out);
}

cachew_err
cwi_jrec_autocache(cwi_strbuf *out, uint64_t now, uint64_t job_id,
    const char *mode, const char *text)
{
	put_head(out, 5, REC_AUTOCACHE, now);
	cwi_msgpack_put_uint(out, job_id);
	cwi_msgpack_put_str(out, mode != NULL ? mode : "",
	    mode != NULL ? strlen(mode) : 0);
	cwi_msgpack_put_str(out, text, strlen(text));
	return done(out);
}

cachew_err
cwi_jrec_planner(cwi_strbuf *out, uint64_t now, const cwi_dispatcher *d,
    const char *text, size_t len, bool *changed)
{
	cwi_strbuf lines;
	cachew_err rv;

	*changed = false;
	cwi_strbuf_init(&lines);
	rv = cwi_planner_diff(d, text, len, &lines);
	if (rv == CACHEW_OK && lines.len > 0) {
		put_head(out, 3, REC_PLANNER, now);
		cwi_msgpack_put_str(out, lines.data, lines.len);
		rv = done(out);
		*changed = rv == CACHEW_OK;
	}
	cwi_strbuf_free(&lines);
	return rv;
}

cachew_err
cwi_jrec_start(cwi_strbuf *out, uint64_t now, uint64_t lineage,
    uint64_t incarnation, const cwi_dispatcher_config *cfg,
    uint64_t first_id)
{
	put_head(out, 6, REC_START, now);
	cwi_msgpack_put_uint(out, lineage);
	cwi_msgpack_put_uint(out, incarnation);
	put_cfg(out, cfg);
	cwi_msgpack_put_uint(out, first_id);
	return done(out);
}

/* No id below first is given out from now on. */
void
cwi_dispatcher_ids_from(cwi_dispatcher *d, uint64_t first)
{
	uint64_t *next[] = {&d->next_worker_id, &d->next_dataset_id,
	    &d->next_job_id, &d->next_client_id, &d->next_task_id};

	for (size_t i = 0; i < sizeof(next) / sizeof(*next); i++)
		if (*next[i] < first)
			*next[i] = first;
}

uint64_t
cwi_dispatcher_max_id(const cwi_dispatcher *d)
{
	uint64_t next[] = {d->next_worker_id, d->next_dataset_id,
	    d->next_job_id, d->next_client_id, d->next_task_id}, m = 0;

	for (size_t i = 0; i < sizeof(next) / sizeof(*next); i++)
		if (next[i] > m)
			m = next[i];
	return m - 1;
}

/* ---- replay ---------------------------------------------------------------- */

static cachew_err
bad(const char *what)
{
	return cwi_fail(CACHEW_ECORRUPT, "dispatcher record: %s", what);
}

/* A str item copied into buf (NUL-terminated; longer ones are refused). */
static bool
get_str(cwi_mp_cursor *c, char *buf, size_t size)
{
	size_t off, len;

	if (!cwi_mp_get_str(c, &off, &len) || len >= size)
		return false;
	memcpy(buf, c->buf + off, len);
	buf[len] = '\0';
	return true;
}

/* Runs a recorded request through the state machine. A request that
 * succeeded when it was recorded must succeed again: anything else means
 * the state diverged from the one the journal describes. */
static cachew_err
replay_request(cwi_dispatcher *d, uint64_t now, const uint8_t *buf,
    size_t len)
{
	cwi_pmsg req, rep;
	cachew_err rv;

	rv = cwi_pmsg_decode(buf, len, &req);
	if (rv != CACHEW_OK)
		return rv == CACHEW_ENOMEM ? rv : bad(cwi_errmsg_get());
	rv = cwi_dispatcher_handle(d, now, &req, &rep);
	/* It succeeded when it ran first. Failing now, the state differs
	 * from the one it met (a record lost with a torn tail before the
	 * one that mattered cannot be: records are appended in call
	 * order); the replay goes on, and the start says how often. */
	if (rv != CACHEW_OK && rv != CACHEW_ENOMEM) {
		d->replay_diverged++;
		cwi_log(CACHEW_LOG_WARN, "dispatcher", "event=replay_diverged "
		    "request=%s error=\"%s\"", cwi_msg_type_name(req.type),
		    rep.type == CWI_MSG_ERROR && rep.u.error.message != NULL
			? rep.u.error.message : "?");
		rv = CACHEW_OK;
	}
	cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
	return rv;
}

cachew_err
cwi_dispatcher_apply_record(cwi_dispatcher *d, const uint8_t *rec,
    size_t len)
{
	cwi_mp_cursor c = {rec, len, 0};
	uint64_t n, kind, now, u;
	size_t off, blen, goff, glen;
	cwi_job_pass p;
	cachew_err rv;

	if (!cwi_mp_get_array(&c, &n) || n < 2 || n > 8 ||
	    !cwi_mp_get_uint(&c, &kind) || !cwi_mp_get_uint(&c, &now))
		return bad("not an array of a kind and a clock");
	switch (kind) {
	case REC_REQUEST:
		if (n != 3 || !cwi_mp_get_bin(&c, &off, &blen))
			return bad("request: not [1, now, bytes]");
		rv = replay_request(d, now, rec + off, blen);
		break;
	case REC_TICK:
		if (n != 2)
			return bad("tick: not [2, now]");
		cwi_dispatcher_tick(d, now);
		rv = CACHEW_OK;
		break;
	case REC_PASS_REQUEST:
		memset(&p, 0, sizeof(p));
		if (n != 8 || !cwi_mp_get_bin(&c, &off, &blen) ||
		    !cwi_mp_get_bin(&c, &goff, &glen) ||
		    !cwi_mp_get_uint(&c, &p.units) ||
		    !get_str(&c, p.mode, sizeof(p.mode)) ||
		    !cwi_mp_get_uint(&c, &u) ||
		    !get_str(&c, p.event, sizeof(p.event)))
			return bad("pass request: not [3, now, bytes, graph, "
				   "units, mode, scale, event]");
		memcpy(&p.worker_scale, &u, sizeof(u));
		if (glen > 0) {
			p.graph = malloc(glen);
			if (p.graph == NULL)
				return cwi_fail(CACHEW_ENOMEM, "out of memory");
			memcpy(p.graph, rec + goff, glen);
			p.graph_len = glen;
		}
		/* The planner's context of a pass is not in the journal:
		 * the replayed pass has none (its end teaches the planner
		 * nothing; what it learned before is in kind-6 records). */
		cwi_dispatcher_offer_pass(d, &p);
		rv = replay_request(d, now, rec + off, blen);
		cwi_dispatcher_offer_pass(d, NULL);
		free(p.graph); /* NULL when the job took it */
		break;
	case REC_AUTOCACHE: {
		char mode[sizeof(p.mode)], text[sizeof(p.event) + 256];

		if (n != 5 || !cwi_mp_get_uint(&c, &u) ||
		    !get_str(&c, mode, sizeof(mode)) ||
		    !get_str(&c, text, sizeof(text)))
			return bad("autocache: not [4, now, job, mode, text]");
		cwi_dispatcher_autocache_event(d, now, u,
		    mode[0] != '\0' ? mode : NULL, text);
		rv = CACHEW_OK;
		break;
	}
	case REC_START: {
		cwi_dispatcher_config cfg = d->cfg;
		uint64_t lineage;

		uint64_t first;

		if (n != 6 || !cwi_mp_get_uint(&c, &lineage) || lineage == 0 ||
		    !cwi_mp_get_uint(&c, &u) || u == 0 ||
		    !get_cfg(&c, &cfg) || !cwi_mp_get_uint(&c, &first) ||
		    first > UINT64_MAX / 2)
			return bad("start: not [5, now, lineage, incarnation, "
				   "config, first id]");
		rv = set_cfg(d, &cfg);
		cwi_dispatcher_ids_from(d, first);
		d->lineage = lineage;
		d->incarnation = u;
		d->now = now;
		break;
	}
	case REC_PLANNER:
		/* The lines are checked (each a planner line, at most
		 * CWI_DCACHE_LINE_MAX bytes, at most CWI_DCACHE_MAX_DATASETS
		 * datasets) before any is taken. */
		if (n != 3 || !cwi_mp_get_str(&c, &off, &blen))
			return bad("planner: not [6, now, lines]");
		rv = cwi_planner_merge(d, (const char *)rec + off, blen);
		if (rv == CACHEW_ECORRUPT)
			return bad(cwi_errmsg_get());
		d->now = now;
		break;
	default:
		return bad("unknown kind");
	}
	if (rv == CACHEW_OK && c.pos != len)
		return bad("bytes follow the record");
	/* The server takes a pass's end when it comes, for the planner; a
	 * replayed pass has no planner context, so its end goes at once. */
	if (d->quiet)
		cwi_pass_ends_drop(d);
	return rv;
}

/* ---- checkpoints: the configuration and the state ---------------------------- */

cachew_err
cwi_dispatcher_checkpoint_save(const cwi_dispatcher *d, cwi_strbuf *out)
{
	uint8_t *state = NULL;
	size_t len = 0;
	cachew_err rv;

	out->len = 0;
	out->oom = false;
	rv = cwi_dispatcher_snapshot_save(d, &state, &len);
	if (rv != CACHEW_OK)
		return rv;
	cwi_msgpack_put_array(out, 3);
	cwi_msgpack_put_uint(out, 1); /* version */
	put_cfg(out, &d->cfg);
	cwi_msgpack_put_bin(out, state, len);
	free(state);
	return done(out);
}

cachew_err
cwi_dispatcher_checkpoint_load(cwi_dispatcher *d, const uint8_t *buf,
    size_t len)
{
	cwi_mp_cursor c = {buf, len, 0};
	cwi_dispatcher_config cfg = d->cfg;
	uint64_t n, version;
	size_t off, slen;
	cachew_err rv;

	if (!cwi_mp_get_array(&c, &n) || n != 3 ||
	    !cwi_mp_get_uint(&c, &version))
		return cwi_fail(CACHEW_ECORRUPT, "dispatcher snapshot: not "
		    "[version, config, state]");
	if (version != 1)
		return cwi_fail(CACHEW_ENOTSUP, "dispatcher snapshot: version "
		    "%llu, this build reads 1", (unsigned long long)version);
	if (!get_cfg(&c, &cfg) || !cwi_mp_get_bin(&c, &off, &slen) ||
	    c.pos != len)
		return cwi_fail(CACHEW_ECORRUPT, "dispatcher snapshot: not "
		    "[version, config, state]");
	rv = set_cfg(d, &cfg);
	if (rv == CACHEW_OK)
		rv = cwi_dispatcher_snapshot_load(d, buf + off, slen);
	return rv;
}

const cwi_dispatcher_config *
cwi_dispatcher_config_of(const cwi_dispatcher *d)
{
	return &d->cfg;
}

uint64_t
cwi_dispatcher_replay_diverged(const cwi_dispatcher *d)
{
	return d->replay_diverged;
}

void
cwi_dispatcher_quiet(cwi_dispatcher *d, bool quiet)
{
	d->quiet = quiet;
}

uint64_t
cwi_dispatcher_clock(const cwi_dispatcher *d)
{
	return d->now;
}

void
cwi_dispatcher_drop_pass_ends(cwi_dispatcher *d)
{
	cwi_pass_ends_drop(d);
}

void
cwi_dispatcher_set_clock(cwi_dispatcher *d, uint64_t now)
{
	d->now = now;
}

uint64_t
cwi_dispatcher_lineage(const cwi_dispatcher *d)
{
	return d->lineage;
}

uint64_t
cwi_dispatcher_incarnation(const cwi_dispatcher *d)
{
	return d->incarnation;
}

void
cwi_dispatcher_set_lineage(cwi_dispatcher *d, uint64_t lineage)
{
	if (lineage != 0)
		d->lineage = lineage;
}
