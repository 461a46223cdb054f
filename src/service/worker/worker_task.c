/*
 * worker_task.c - a task on a worker (worker_task.h explains the model):
 * the base every delivery mode shares (creation, references, stop,
 * reports), the runner thread that leases splits and queues their
 * elements, and the stream delivery of queued elements to get_elements
 * requests. Coordinated rounds are formed in worker_coord.c, direct tasks
 * run in worker_direct.c (worker_task_int.h lists the parts).
 *
 * Locking: t->lock guards the queue, the leases, the held requests, the
 * clients and the rounds; replies are built under it and sent after it is
 * released. A direct task's pull_lock is taken before t->lock, never
 * after (worker_direct.c).
 */
#include "worker_task_int.h"

#include <stdio.h>
#include <stdlib.h>

/* The runner hands elements to the queue in groups (one lock, one wake-up
 * of held requests per group): up to 1024 elements or 1 MiB, so that
 * small elements travel hundreds per reply (W1's 512-byte batches cost
 * 2.5x the CPU of in-process with 64 per group), and a group waits about
 * PUSH_GROUP_WAIT_NS (at most twice that) from its first element for
 * more. */
#define PUSH_GROUP_ELEMENTS 1024u
#define PUSH_GROUP_BYTES ((uint64_t)1 << 20)
#define PUSH_GROUP_WAIT_NS ((uint64_t)2000000)
/* zstd: frames larger than this share of their content count as not
 * compressing; at the fast level, one frame in ZSTD_RETRY tries the
 * regular level again. */
#define ZSTD_POOR_RATIO 0.9
#define ZSTD_RETRY 32u

/* ---- fault injection (tests only) ------------------------------------------ */

/*
 * CACHEW_FAULTS="drop=P,reset=P,seed=S" makes a worker lose data replies on
 * purpose, as a flaky network would: with probability P each, a reply that
 * carries elements is not sent (the client's request times out) or the
 * client's connection is reset instead (its requests fail at once). The
 * elements are gone. For the chaos tests (test/check_exact.c, make chaos);
 * unset, nothing is drawn.
 */
static struct {
	pthread_once_t once;
	double drop, reset;
	pthread_mutex_t lock;
	uint64_t rng;
} faults = {PTHREAD_ONCE_INIT, 0, 0, PTHREAD_MUTEX_INITIALIZER, 0};

static void
faults_load(void)
{
	const char *env = getenv("CACHEW_FAULTS");
	unsigned long long seed = 1;
	char key[16];
	double v;
	int used;

	if (env == NULL)
		return;
	while (sscanf(env, " %15[a-z] = %lf%n", key, &v, &used) == 2) {
		if (strcmp(key, "drop") == 0)
			faults.drop = v;
		else if (strcmp(key, "reset") == 0)
			faults.reset = v;
		else if (strcmp(key, "seed") == 0)
			seed = (unsigned long long)v;
		env += used;
		if (*env == ',')
			env++;
	}
	faults.rng = seed * 0x9e3779b97f4a7c15ULL + 1;
	if (faults.drop > 0 || faults.reset > 0)
		cwi_log(CACHEW_LOG_WARN, "worker", "event=fault_injection "
		    "drop=%.4f reset=%.4f seed=%llu", faults.drop,
		    faults.reset, seed);
}

/* 0: send; 1: drop the reply; 2: reset the connection. */
static int
fault_roll(void)
{
	double u;

	pthread_once(&faults.once, faults_load);
	if (faults.drop <= 0 && faults.reset <= 0)
		return 0;
	pthread_mutex_lock(&faults.lock);
	faults.rng ^= faults.rng << 13;
	faults.rng ^= faults.rng >> 7;
	faults.rng ^= faults.rng << 17;
	u = (double)(faults.rng >> 11) / 9007199254740992.0;
	pthread_mutex_unlock(&faults.lock);
	return u < faults.drop ? 1 : u < faults.drop + faults.reset ? 2 : 0;
}


/* ---- creation ------------------------------------------------------------ */

static void *runner_main(void *arg);

/* Whether the task's records leave this process unread, so that file
 * sources may map files rather than read them (cwi_buffer_map_file): the
 * worker part is the source alone (no operator reads its output), the
 * stream goes to other processes over plain tcp or ipc (not inproc's
 * pointers, not through TLS, which encrypts in this process), and not in
 * coordinated rounds. A reply to compress is unmapped first
 * (compress_msg). */
static bool
records_unread(const cwi_wtask *t)
{
	const char *url = t->env->address != NULL ? t->env->address : "";

	return t->plan != NULL && t->plan->source != NULL &&
	       t->plan->source == t->plan->root && t->plan->nworker == 1 &&
	       !t->env->inproc && t->ncons == 0 &&
	       (strncmp(url, "tcp://", 6) == 0 ||
		   strncmp(url, "ipc://", 6) == 0);
}

/* The worker's executor options with the job's epoch: a reshuffle, a
 * per-epoch file order and random functions draw from it, as they would
 * in the client's process for this epoch. */
static cachew_err
lease_options(cwi_wtask *t)
{
	cwi_opts v = *cwi_options_values(t->env->opts);

	v.epoch = (int64_t)t->epoch;
	v.map_reads = records_unread(t);
	t->lease_opts = cwi_options_from_values(&v);
	return t->lease_opts != NULL ? CACHEW_OK
				     : cwi_fail(CACHEW_ENOMEM, "out of memory");
}

/* This worker cannot run the task's graph: a function it lacks, or
 * another build of a plugin (docs/graph-format.md, section 2), which the
 * dispatcher avoids but cannot rule out (a worker of another version), or
 * an input outside what the worker may read.
 * The task stays, failed, with no runner: its clients end with the error,
 * as with a pipeline's, rather than wait for it; it never reports done. */
static void
start_failed(cwi_wtask *t, cachew_err rv)
{
	snprintf(t->errmsg, sizeof(t->errmsg), "worker %llu (%s): %s",
	    (unsigned long long)t->env->worker_id,
	    t->env->address != NULL ? t->env->address : "?",
	    cwi_errmsg_get());
	t->failed = rv;
	t->failed_pipeline = true;
	cwi_log(CACHEW_LOG_WARN, "worker", "event=task_start_failed task=%llu "
	    "error=\"%s\"", (unsigned long long)t->id, t->errmsg);
}

cachew_err
cwi_wtask_start(cwi_wtask **out, const cwi_task_def *def,
    const cwi_wtask_env *env)
{
	cwi_wtask *t = calloc(1, sizeof(*t));
	cachew_err rv;

	*out = NULL;
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	atomic_init(&t->refs, 1);
	atomic_init(&t->stop, false);
	pthread_mutex_init(&t->lock, NULL);
	cwi_cond_init_monotonic(&t->space);
	pthread_mutex_init(&t->pull_lock, NULL);
	t->id = def->task_id;
	t->job_id = def->job_id;
	t->secret = def->secret;
	t->mode = def->processing_mode;
	t->lease_size = def->lease_size > 0 ? def->lease_size : 4;
	t->seed = def->seed;
	t->epoch = def->epoch;
	t->exactly_once = def->exactly_once && def->num_consumers == 0 &&
	    def->processing_mode == CWI_MODE_DISTRIBUTED_EPOCH;
	t->env = env;
	t->ncons = def->num_consumers;
	t->end_slot = UINT64_MAX;
	t->start_ns = cwi_now_ns();
	atomic_init(&t->compress_logged, false);
	atomic_init(&t->zlevel, CWI_PAYLOAD_ZSTD_LEVEL);
	atomic_init(&t->zframes, 0);
	if (t->ncons > 0) {
		t->end_served = calloc(t->ncons, 1);
		if (t->end_served == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto fail;
		}
	}
	rv = cwi_zstd_pool_create(&t->zstd);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cachew_dataset_from_msgpack(&t->root, def->graph, def->graph_len);
	if (rv != CACHEW_OK) {
		start_failed(t, rv);
		*out = t;
		return CACHEW_OK;
	}
	rv = cwi_split_plan_create(&t->plan, t->root);
	if (rv != CACHEW_OK && rv != CACHEW_ENOMEM) {
		/* An input this worker may not read (its --allow-read,
		 * src/io/io_policy.h: EPERM), one missing or unreadable
		 * here (ENOENT, EIO, a 404), a bad pattern: as final as a
		 * function it lacks. Starting the task again at every
		 * heartbeat would only fail again while its clients wait. */
		start_failed(t, rv);
		*out = t;
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK) {
		rv = cwi_fail(rv, "task %llu: %s", (unsigned long long)t->id,
		    cwi_errmsg_get());
		goto fail;
	}
	t->spec_names = cwi_spec_names(&t->plan->root->spec);
	if (!cwi_names_ok(t->spec_names)) {
		cwi_names_unref(t->spec_names);
		t->spec_names = NULL;
	}
	rv = lease_options(t);
	if (rv != CACHEW_OK)
		goto fail;
	if (env->inline_run && t->ncons == 0 &&
	    t->mode == CWI_MODE_DISTRIBUTED_EPOCH) {
		t->inline_run = true;
		*out = t;
		return CACHEW_OK;
	}
	if (pthread_create(&t->runner, NULL, runner_main, t) != 0) {
		rv = cwi_fail(CACHEW_ENOMEM, "task %llu: cannot start a thread",
		    (unsigned long long)t->id);
		goto fail;
	}
	t->runner_started = true;
	*out = t;
	return CACHEW_OK;
fail:
	cwi_wtask_unref(t);
	return rv;
}

uint64_t
cwi_wtask_id(const cwi_wtask *t)
{
	return t->id;
}

bool
cwi_wtask_maps_files(const cwi_wtask *t)
{
	return t->lease_opts != NULL &&
	       cwi_options_values(t->lease_opts)->map_reads;
}

bool
cwi_wtask_secret_ok(const cwi_wtask *t, uint64_t secret)
{
	return t->secret == 0 || t->secret == secret;
}

void
cwi_wtask_ref(cwi_wtask *t)
{
	atomic_fetch_add(&t->refs, 1);
}

static void
free_queue(cwi_wtask *t)
{
	for (size_t i = 0; i < t->qlen; i++)
		cwi_element_release(t->q[(t->qhead + i) % t->qcap].e);
	t->qlen = 0;
	t->qbytes = 0;
	t->qelems = 0;
}

void
cwi_wtask_unref(cwi_wtask *t)
{
	if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	cwi_wtask_stop(t);
	if (t->runner_started)
		pthread_join(t->runner, NULL);
	if (t->pull_it != NULL)
		cachew_iterator_destroy(t->pull_it);
	free(t->pull_splits);
	cwi_rset_free(&t->pull_skip);
	free_queue(t);
	free(t->q);
	for (size_t i = 0; i < t->nleases; i++) {
		free(t->leases[i].split_ids);
		free(t->leases[i].split_leases);
		free(t->leases[i].clients);
	}
	free(t->leases);
	for (size_t i = 0; i < t->nclients; i++)
		free(t->clients[i].ends);
	free(t->clients);
	free(t->held);
	free(t->delivered);
	cwi_wtask_stats_free(t);
	cwi_wtask_rounds_free(t);
	cwi_zstd_pool_destroy(t->zstd);
	cwi_names_unref(t->spec_names);
	cwi_split_plan_destroy(t->plan);
	cachew_dataset_release(t->root);
	cachew_options_destroy(t->lease_opts);
	pthread_cond_destroy(&t->space);
	pthread_mutex_destroy(&t->lock);
	pthread_mutex_destroy(&t->pull_lock);
	free(t);
}

void
cwi_wtask_stop(cwi_wtask *t)
{
	held_req *held;
	size_t nheld;

	atomic_store(&t->stop, true);
	pthread_mutex_lock(&t->lock);
	held = t->held;
	nheld = t->nheld;
	t->held = NULL;
	t->nheld = t->capheld = 0;
	pthread_cond_broadcast(&t->space);
	pthread_mutex_unlock(&t->lock);
	for (size_t i = 0; i < nheld; i++)
		(void)cwi_request_fail(held[i].r, CACHEW_ECLOSED,
		    "task %llu was stopped", (unsigned long long)t->id);
	free(held);
}

void
cwi_wtask_detach(cwi_wtask *t)
{
	atomic_store(&t->stop, true);
	pthread_mutex_lock(&t->pull_lock);
	t->detached = true;
	pthread_mutex_unlock(&t->pull_lock);
}

void
cwi_wtask_poke(cwi_wtask *t)
{
	pthread_mutex_lock(&t->lock);
	t->poked = true;
	pthread_cond_broadcast(&t->space);
	pthread_mutex_unlock(&t->lock);
}

/* ---- replies --------------------------------------------------------------- */

client_rec *
cwi_wtask_client_get(cwi_wtask *t, uint64_t id)
{
	for (size_t i = 0; i < t->nclients; i++)
		if (t->clients[i].id == id)
			return &t->clients[i];
	if (!CWI_GROW(t->clients, t->capclients, t->nclients + 1))
		return NULL;
	client_rec *c = &t->clients[t->nclients++];
	memset(c, 0, sizeof(*c));
	c->id = id;
	return c;
}

static bool
lease_add_client(lease_rec *l, uint64_t client)
{
	for (size_t i = 0; i < l->nclients; i++)
		if (l->clients[i] == client)
			return true;
	if (!CWI_GROW(l->clients, l->capclients, l->nclients + 1))
		return false;
	l->clients[l->nclients++] = client;
	return true;
}

static bool
client_add_end(client_rec *c, uint64_t split_id, uint32_t parts,
    uint32_t lease)
{
	if (!CWI_GROW(c->ends, c->capends, c->nends + 1))
		return false;
	c->ends[c->nends].split_id = split_id;
	c->ends[c->nends].parts = parts;
	c->ends[c->nends].lease = lease;
	c->nends++;
	return true;
}

bool
cwi_wtask_add_delivered(cwi_wtask *t, uint64_t split_id)
{
	if (!CWI_GROW(t->delivered, t->capdelivered, t->ndelivered + 1))
		return false;
	t->delivered[t->ndelivered++] = split_id;
	return true;
}

/* A lease's end marker reached the head of the queue while serving client
 * `who`: hands its splits' ends to every client that got its elements. */
static bool
lease_ended(cwi_wtask *t, lease_rec *l, client_rec *who)
{
	uint32_t parts = l->nclients > 0 ? (uint32_t)l->nclients : 1u;

	for (size_t s = 0; s < l->nsplits; s++) {
		if (l->nclients == 0) {
			if (!client_add_end(who, l->split_ids[s], 1,
				l->split_leases[s]))
				return false;
		}
		for (size_t k = 0; k < l->nclients; k++) {
			client_rec *c = cwi_wtask_client_get(t, l->clients[k]);
			if (c == NULL || !client_add_end(c, l->split_ids[s],
					     parts, l->split_leases[s]))
				return false;
		}
		if (!cwi_wtask_add_delivered(t, l->split_ids[s]))
			return false;
	}
	return true;
}

void
cwi_wtask_status_fail(reply_status *st, cachew_err err, const char *fmt,
    ...)
{
	va_list ap;

	st->err = err;
	st->proto = true;
	va_start(ap, fmt);
	vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
	va_end(ap);
}

/* Encodes rep as msg's header (rep is freed). */
cachew_err
cwi_wtask_set_header(cwi_msg *msg, cwi_pmsg *rep)
{
	cwi_strbuf sb;
	cachew_err rv;

	cwi_strbuf_init(&sb);
	rv = cwi_pmsg_encode(rep, &sb);
	if (rv == CACHEW_OK)
		rv = cwi_msg_set_header_strbuf(msg, &sb);
	cwi_strbuf_free(&sb);
	cwi_pmsg_free(rep);
	return rv;
}

/* Whether this reply's payload travels compressed: the client asked for it,
 * it is in another process (inproc moves pointers: nothing to save) and
 * there is a payload. */
static bool
want_compress(const cwi_msg_get_elements *m, bool remote, uint32_t count)
{
	return m->compression == CWI_COMPRESSION_ZSTD && remote && count > 0;
}

void
cwi_wtask_reply_init(cwi_pmsg *rep, const cwi_wtask *t, client_rec *c,
    const cwi_msg_get_elements *m, bool remote, uint32_t count,
    reply_status *st)
{
	st->compress = want_compress(m, remote, count);
	cwi_pmsg_init(rep, CWI_MSG_GET_ELEMENTS_REPLY);
	rep->u.get_elements_reply.task_id = t->id;
	rep->u.get_elements_reply.seq = c->seq++;
	rep->u.get_elements_reply.elements = count;
	rep->u.get_elements_reply.round = m->round;
	rep->u.get_elements_reply.compression =
	    st->compress ? CWI_COMPRESSION_ZSTD : CWI_COMPRESSION_NONE;
}

cwi_names *
cwi_wtask_reply_names(const cwi_wtask *t, const cwi_msg *msg)
{
	const cwi_element *e;

	if (t->spec_names != NULL)
		return cwi_names_ref(t->spec_names);
	if (cwi_msg_count(msg) == 0)
		return NULL;
	e = cwi_msg_element(msg, 0);
	if (e == NULL || e->names == NULL || !cwi_names_ok(e->names))
		return NULL;
	return cwi_names_ref(e->names);
}

cwi_msg *
cwi_wtask_reply_finish(const cwi_wtask *t, cwi_msg *msg, cwi_pmsg *rep,
    reply_status *st)
{
	/* Every reply with elements, not only a task's first: a client
	 * takes replies from several tasks and rounds, and may miss any
	 * one (a retry, a consumer joining late); a name list costs a
	 * few bytes against the reply's payload. */
	if (rep->type == CWI_MSG_GET_ELEMENTS_REPLY &&
	    rep->u.get_elements_reply.elements > 0)
		rep->u.get_elements_reply.names = cwi_wtask_reply_names(t, msg);
	st->err = cwi_wtask_set_header(msg, rep);
	if (st->err != CACHEW_OK) {
		cwi_msg_destroy(msg);
		return NULL;
	}
	return msg;
}

/*
 * Builds the reply to m if one can be given now: elements are queued, this
 * client has split ends pending, or the task has ended. Returns NULL with
 * st->err == CACHEW_OK when the request must wait. Called with t->lock held.
 */
static cwi_msg *
build_stream_reply(cwi_wtask *t, const cwi_msg_get_elements *m, bool remote,
    reply_status *st)
{
	uint32_t max_e = m->max_elements > 0 ? m->max_elements
					      : REPLY_MAX_ELEMENTS;
	uint64_t max_b = m->max_bytes > 0 ? m->max_bytes : REPLY_MAX_BYTES;
	client_rec *c = cwi_wtask_client_get(t, m->client_id);
	cwi_pmsg rep;
	cwi_msg *msg = NULL;
	cwi_split_end *ends = NULL;
	size_t nends = 0, capends = 0;
	cwi_run *runs = NULL;
	size_t nruns = 0, capruns = 0;
	uint32_t count = 0;
	uint64_t bytes = 0;

	if (c == NULL)
		goto nomem;
	if (t->qlen == 0 && c->nends == 0 && !t->produced_all)
		return NULL;
	if (cwi_msg_create(&msg) != CACHEW_OK)
		goto nomem;
	/* Ends left over from leases that other clients finished. */
	for (size_t i = 0; i < c->nends; i++) {
		if (!CWI_GROW(ends, capends, nends + 1))
			goto nomem;
		ends[nends].split_id = c->ends[i].split_id;
		ends[nends].parts = c->ends[i].parts;
		ends[nends].lease = c->ends[i].lease;
		ends[nends].after = 0;
		nends++;
	}
	c->nends = 0;
	while (t->qlen > 0) {
		q_entry *q = &t->q[t->qhead];
		lease_rec *l = &t->leases[q->lease];

		if (q->e != NULL) {
			if (count >= max_e || (count > 0 && bytes + q->bytes > max_b))
				break;
			if (!lease_add_client(l, m->client_id))
				goto nomem;
			if (t->exactly_once &&
			    !cwi_wtask_run_add(&runs, &nruns, &capruns,
				l->group, (uint32_t)l->nsplits, q->index, 1,
				q->tail, false))
				goto nomem;
			if (cwi_msg_push(msg, q->e) != CACHEW_OK)
				goto nomem;
			count++;
			bytes += q->bytes;
			t->qbytes -= q->bytes;
			t->qelems--;
		} else {
			size_t before = c->nends;
			if (t->exactly_once &&
			    !cwi_wtask_run_add(&runs, &nruns, &capruns,
				l->group, (uint32_t)l->nsplits, q->index, 0, 0,
				true))
				goto nomem;
			if (!lease_ended(t, l, c))
				goto nomem;
			for (size_t i = before; i < c->nends; i++) {
				if (!CWI_GROW(ends, capends, nends + 1))
					goto nomem;
				ends[nends].split_id = c->ends[i].split_id;
				ends[nends].parts = c->ends[i].parts;
				ends[nends].lease = c->ends[i].lease;
				ends[nends].after = count;
				nends++;
			}
			c->nends = before;
		}
		t->qhead = (t->qhead + 1) % t->qcap;
		t->qlen--;
	}
	pthread_cond_broadcast(&t->space);
	t->elements += count;
	t->bytes += bytes;
	cwi_wtask_reply_init(&rep, t, c, m, remote, count, st);
	rep.u.get_elements_reply.split_ends = ends;
	rep.u.get_elements_reply.nsplit_ends = nends;
	rep.u.get_elements_reply.runs = runs;
	rep.u.get_elements_reply.nruns = nruns;
	rep.u.get_elements_reply.end_of_task =
	    t->produced_all && t->qlen == 0;
	rep.u.get_elements_reply.queued_bytes = t->qbytes;
	return cwi_wtask_reply_finish(t, msg, &rep, st); /* frees ends, runs */
nomem:
	free(ends);
	free(runs);
	cwi_msg_destroy(msg);
	cwi_wtask_status_fail(st, CACHEW_ENOMEM, "task %llu: out of "
	    "memory", (unsigned long long)t->id);
	st->proto = false;
	return NULL;
}

static cwi_msg *
build_reply(cwi_wtask *t, const cwi_msg_get_elements *m, bool remote,
    reply_status *st)
{
	memset(st, 0, sizeof(*st));
	if (t->failed != CACHEW_OK && t->failed_pipeline &&
	    (t->qlen == 0 || t->ncons > 0)) {
		/* An error reply, not a failed request: the client ends
		 * the epoch with the pipeline's error (a corrupt file gives
		 * the same error again wherever its split is leased), after
		 * the elements the pipeline gave before it, as the plain
		 * executor would. */
		cwi_wtask_status_fail(st, t->failed, "%s", t->errmsg[0] != '\0'
		    ? t->errmsg : cachew_strerror(t->failed));
		st->pipeline = true;
		return NULL;
	}
	if (t->failed != CACHEW_OK && !t->failed_pipeline) {
		st->err = t->failed; /* the task is gone: splits go elsewhere */
		return NULL;
	}
	if (t->ncons == 0 && m->consumer_index >= 0) {
		cwi_wtask_status_fail(st, CACHEW_EINVAL, "task %llu is not "
		    "coordinated: no consumer_index expected",
		    (unsigned long long)t->id);
		return NULL;
	}
	return t->ncons > 0 ? cwi_wtask_coord_reply(t, m, remote, st)
			    : build_stream_reply(t, m, remote, st);
}

/* ---- sending ---------------------------------------------------------------- */

typedef struct ready_reply {
	cwi_request *r;
	cwi_msg *msg;     /* NULL: fail with st.err */
	reply_status st;
} ready_reply;

/* The level for the next frame. Payloads that do not compress at the
 * regular level (decoded pixels: 0.95) go at the fastest one, which frames
 * them at near memcpy speed; every ZSTD_RETRY-th frame tries the regular
 * level again in case the data changed. */
static int
zstd_level(cwi_wtask *t)
{
	int level = atomic_load(&t->zlevel);

	if (level != CWI_PAYLOAD_ZSTD_LEVEL &&
	    atomic_fetch_add(&t->zframes, 1) % ZSTD_RETRY == 0)
		return CWI_PAYLOAD_ZSTD_LEVEL;
	return level;
}

static void
zstd_result(cwi_wtask *t, int level, size_t content, size_t wire)
{
	bool poor = (double)wire > ZSTD_POOR_RATIO * (double)content;

	if (level == CWI_PAYLOAD_ZSTD_LEVEL)
		atomic_store(&t->zlevel, poor ? CWI_PAYLOAD_ZSTD_FAST
					      : CWI_PAYLOAD_ZSTD_LEVEL);
}

/* Replaces msg's elements by their compressed form (service_payload.h). */
static cachew_err
compress_msg(cwi_wtask *t, cwi_msg **msg, const char *peer)
{
	size_t n = cwi_msg_count(*msg), hlen, content = 0;
	const uint8_t *hdr = cwi_msg_header(*msg, &hlen);
	cwi_element *one, **v = n == 1 ? &one : malloc(n * sizeof(*v));
	cwi_element *frame = NULL;
	cwi_msg *out = NULL;
	cachew_err rv;

	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = CACHEW_OK;
	for (size_t i = 0; i < n; i++) {
		v[i] = cwi_msg_element(*msg, i);
		/* The compressor reads the bytes: not from a mapping. */
		if (rv == CACHEW_OK) {
			cwi_element_retain(v[i]);
			rv = cwi_element_unmap(&v[i]);
		} else {
			v[i] = NULL;
		}
	}
	int level = zstd_level(t);
	if (rv == CACHEW_OK)
		rv = cwi_payload_compress(t->zstd, level, v, n, &frame,
		    &content);
	if (rv == CACHEW_OK)
		zstd_result(t, level, content, cwi_element_nbytes(frame));
	for (size_t i = 0; i < n; i++)
		cwi_element_release(v[i]);
	if (v != &one)
		free(v);
	if (rv == CACHEW_OK)
		rv = cwi_msg_create(&out);
	if (rv == CACHEW_OK)
		rv = cwi_msg_set_header(out, hdr, hlen);
	if (rv == CACHEW_OK) {
		rv = cwi_msg_push(out, frame);
		if (rv == CACHEW_OK)
			frame = NULL;
	}
	if (rv != CACHEW_OK) {
		cwi_element_release(frame);
		cwi_msg_destroy(out);
		return rv;
	}
	if (!atomic_exchange(&t->compress_logged, true))
		cwi_log(CACHEW_LOG_INFO, "worker", "event=compressing task=%llu "
		    "peer=%s elements=%zu bytes=%zu compressed=%zu",
		    (unsigned long long)t->id, peer, n, content,
		    cwi_element_nbytes(cwi_msg_element(out, 0)));
	cwi_msg_destroy(*msg);
	*msg = out;
	return CACHEW_OK;
}

static void
send_ready(cwi_wtask *t, ready_reply *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (v[i].msg != NULL && v[i].st.compress) {
			cachew_err rv = compress_msg(t, &v[i].msg,
			    cwi_request_peer(v[i].r));
			if (rv != CACHEW_OK) {
				cwi_msg_destroy(v[i].msg);
				v[i].msg = NULL;
				v[i].st.err = rv;
				v[i].st.proto = false;
				snprintf(v[i].st.msg, sizeof(v[i].st.msg), "%s",
				    cwi_errmsg_get());
			}
		}
		int fault = v[i].msg != NULL && cwi_msg_count(v[i].msg) > 0
		    ? fault_roll() : 0;
		if (fault != 0) {
			cwi_msg_destroy(v[i].msg);
			if (fault == 1)
				cwi_request_drop(v[i].r);
			else
				cwi_request_reject(v[i].r, "fault injection");
		} else if (v[i].msg != NULL) {
			if (cwi_request_reply(v[i].r, v[i].msg) != CACHEW_OK)
				cwi_msg_destroy(v[i].msg);
		} else if (v[i].st.proto && v[i].st.pipeline) {
			cwi_rpc_reply_pipeline_error(v[i].r, v[i].st.err,
			    v[i].st.msg);
		} else if (v[i].st.proto) {
			cwi_rpc_reply_error(v[i].r, v[i].st.err, "%s",
			    v[i].st.msg);
		} else {
			(void)cwi_request_fail(v[i].r, v[i].st.err,
			    "task %llu: %s", (unsigned long long)t->id,
			    v[i].st.msg[0] != '\0' ? v[i].st.msg
			    : t->errmsg[0] != '\0' ? t->errmsg
						   : cachew_strerror(v[i].st.err));
		}
	}
}

/* Answers the held requests that can be answered now, in arrival order.
 * Called with t->lock held; fills *out (the caller sends after unlocking). */
static size_t
serve_held(cwi_wtask *t, ready_reply **out)
{
	ready_reply *v = NULL;
	size_t n = 0, cap = 0, keep = 0;

	for (size_t i = 0; i < t->nheld; i++) {
		reply_status st;
		cwi_msg *msg = build_reply(t, &t->held[i].m, t->held[i].remote,
		    &st);

		if (msg == NULL && st.err == CACHEW_OK) {
			t->held[keep++] = t->held[i];
			continue;
		}
		if (!CWI_GROW(v, cap, n + 1)) {
			/* Keep it held; it is answered on the next push. */
			if (msg != NULL)
				cwi_msg_destroy(msg);
			t->held[keep++] = t->held[i];
			continue;
		}
		v[n].r = t->held[i].r;
		v[n].msg = msg;
		v[n].st = st;
		n++;
	}
	t->nheld = keep;
	*out = v;
	return n;
}

void
cwi_wtask_get_elements(cwi_wtask *t, cwi_request *r,
    const cwi_msg_get_elements *m)
{
	ready_reply *ready = NULL, one;
	size_t nready;
	bool remote = !t->env->inproc;

	memset(&one, 0, sizeof(one));
	one.r = r;
	if (t->inline_run) {
		cwi_wtask_get_elements_direct(t, r, m);
		return;
	}
	pthread_mutex_lock(&t->lock);
	if (atomic_load(&t->stop)) {
		pthread_mutex_unlock(&t->lock);
		(void)cwi_request_fail(r, CACHEW_ECLOSED, "task %llu is stopped",
		    (unsigned long long)t->id);
		return;
	}
	/* Earlier held requests go first: a client's stream replies keep
	 * request order. Coordinated requests name their round, so one that
	 * can be served now never waits behind another's. */
	nready = serve_held(t, &ready);
	if (t->nheld == 0 || t->ncons > 0)
		one.msg = build_reply(t, m, remote, &one.st);
	if (one.msg == NULL && one.st.err == CACHEW_OK) {
		if (CWI_GROW(t->held, t->capheld, t->nheld + 1)) {
			t->held[t->nheld].r = r;
			t->held[t->nheld].m = *m;
			t->held[t->nheld].remote = remote;
			t->held[t->nheld].expire_ns = m->wait_ms > 0 &&
			    t->ncons == 0
			    ? cwi_now_ns() + (uint64_t)m->wait_ms * 1000000u : 0;
			t->nheld++;
			one.r = NULL;
		} else {
			one.st.err = CACHEW_ENOMEM;
		}
	}
	pthread_mutex_unlock(&t->lock);
	send_ready(t, ready, nready);
	free(ready);
	if (one.r != NULL)
		send_ready(t, &one, 1);
}

/* ---- the runner -------------------------------------------------------------- */

/* Queues a group of elements, then the lease's end marker when lease_end.
 * Waits for room. Takes v only on CACHEW_OK; CACHEW_ECANCELED: the task
 * stopped; CACHEW_ENOMEM: the queue could not grow (the task fails: a
 * lost group would leave its lease's splits unended). */
static cachew_err
push_group(cwi_wtask *t, cwi_element **v, const uint64_t *idx,
    const uint32_t *tails, size_t n, uint64_t bytes, uint32_t lease,
    bool lease_end, uint64_t total)
{
	ready_reply *ready = NULL;
	size_t nready, need = n + (lease_end ? 1 : 0);

	uint64_t stall_from = 0;

	pthread_mutex_lock(&t->lock);
	/* Formed rounds count against the bound until every consumer took
	 * them; a coordinated queue always takes elements while it holds
	 * less than a round, so the next round can form. */
	while (!atomic_load(&t->stop) && t->qlen > 0 &&
	       t->qbytes + t->slot_bytes + bytes > t->env->queue_bytes &&
	       (t->ncons == 0 || t->qelems >= t->ncons)) {
		if (stall_from == 0)
			stall_from = cwi_now_ns();
		pthread_cond_wait(&t->space, &t->lock);
	}
	if (stall_from != 0)
		t->stall_ns += cwi_now_ns() - stall_from;
	if (atomic_load(&t->stop)) {
		pthread_mutex_unlock(&t->lock);
		return CACHEW_ECANCELED;
	}
	if (t->qlen + need > t->qcap) {
		/* Grow the ring, unrolling it so qhead becomes 0. */
		size_t cap = t->qcap != 0 ? t->qcap : 256;
		while (cap < t->qlen + need)
			cap *= 2;
		q_entry *nq = malloc(cap * sizeof(*nq));
		if (nq == NULL) {
			pthread_mutex_unlock(&t->lock);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		for (size_t i = 0; i < t->qlen; i++)
			nq[i] = t->q[(t->qhead + i) % t->qcap];
		free(t->q);
		t->q = nq;
		t->qcap = cap;
		t->qhead = 0;
	}
	for (size_t i = 0; i < n; i++) {
		q_entry *q = &t->q[(t->qhead + t->qlen++) % t->qcap];
		q->e = v[i];
		q->lease = lease;
		q->bytes = cwi_element_nbytes(v[i]);
		q->index = idx[i];
		q->tail = tails[i];
		t->qbytes += q->bytes;
	}
	t->qelems += n;
	if (lease_end) {
		q_entry *q = &t->q[(t->qhead + t->qlen++) % t->qcap];
		q->e = NULL;
		q->lease = lease;
		q->bytes = 0;
		q->index = total;
		q->tail = 0;
		t->leases[lease].total = total;
	}
	nready = serve_held(t, &ready);
	pthread_mutex_unlock(&t->lock);
	send_ready(t, ready, nready);
	free(ready);
	return CACHEW_OK;
}

static void
runner_fail(cwi_wtask *t, cachew_err rv, const char *msg)
{
	ready_reply *ready = NULL;
	size_t nready;
	bool pipeline;

	pthread_mutex_lock(&t->lock);
	if (t->failed == CACHEW_OK) {
		t->failed = rv;
		snprintf(t->errmsg, sizeof(t->errmsg), "%s", msg);
	}
	t->produced_all = true;
	pipeline = t->failed_pipeline;
	nready = serve_held(t, &ready);
	pthread_mutex_unlock(&t->lock);
	send_ready(t, ready, nready);
	free(ready);
	/* ENOENT from the lease: the dispatcher no longer has the task (its
	 * job ended a moment ago, or this worker was declared dead), which
	 * is no fault of the task's. */
	if (rv == CACHEW_ENOENT && !pipeline)
		cwi_log(CACHEW_LOG_INFO, "worker", "event=task_gone task=%llu "
		    "reason=\"%s\"", (unsigned long long)t->id, msg);
	else
		cwi_log(CACHEW_LOG_WARN, "worker", "event=task_failed "
		    "task=%llu error=\"%s\"", (unsigned long long)t->id, msg);
}

static void
mark_pipeline_failure(cwi_wtask *t)
{
	pthread_mutex_lock(&t->lock);
	t->failed_pipeline = true;
	pthread_mutex_unlock(&t->lock);
}

/* ---- a lease's elements, numbered (exactly once) ------------------------------ */

cachew_err
cwi_wtask_lease_open(cwi_wtask *t, cachew_iterator **it,
    const cachew_options *opts, const cwi_unit_range *ranges, size_t n)
{
	return cwi_iterator_create_lease_tails(it, t->plan->root, opts,
	    t->plan->source, ranges, n, t->seed, t->plan->groups,
	    t->exactly_once ? t->plan->ngroups : 0);
}

cachew_err
cwi_wtask_feed_next(cwi_wtask *t, lease_feed *f, cwi_element **e,
    uint64_t *index, uint32_t *tail)
{
	cachew_element *x;
	cachew_err rv;

	for (;;) {
		if (f->tails_of == 0) {
			rv = cachew_iterator_next(f->it, &x);
			if (rv == CACHEW_EOF && t->plan->ngroups > 0 &&
			    t->exactly_once) {
				f->tails_of = 1;
				f->tail_k = 0;
				continue;
			}
			if (rv != CACHEW_OK)
				return rv;
			*tail = 0;
		} else {
			/* The tails, grouping operator by operator. */
			while (f->tails_pos == f->tails.n) {
				f->tails.n = 0;
				f->tails_pos = 0;
				if (f->tail_k == t->plan->ngroups)
					return CACHEW_EOF;
				rv = cwi_iterator_take_tails(f->it, f->tail_k,
				    &f->tails);
				if (rv != CACHEW_OK)
					return rv;
				f->tails_of = (uint32_t)++f->tail_k;
			}
			x = f->tails.v[f->tails_pos];
			f->tails.v[f->tails_pos++] = NULL;
			*tail = f->tails_of;
		}
		*index = f->next++;
		if (f->skip != NULL && cwi_rset_has(f->skip, *index)) {
			cwi_element_release(x);
			continue;
		}
		*e = x;
		return CACHEW_OK;
	}
}

void
cwi_wtask_feed_free(lease_feed *f)
{
	for (size_t i = f->tails_pos; i < f->tails.n; i++)
		cwi_element_release(f->tails.v[i]);
	free(f->tails.v);
	cachew_iterator_destroy(f->it);
	memset(f, 0, sizeof(*f));
}

bool
cwi_wtask_run_add(cwi_run **runs, size_t *n, size_t *cap, uint64_t group,
    uint32_t splits, uint64_t index, uint32_t count, uint32_t tail, bool end)
{
	cwi_run *r = *n > 0 ? &(*runs)[*n - 1] : NULL;

	if (end)
		count = 0;
	if (r != NULL && r->group == group && !r->end &&
	    r->from + r->n == index && (count == 0 || (r->tail == tail &&
	    r->n <= UINT32_MAX - count))) {
		r->n += count;
		r->end = end;
		return true;
	}
	if (!CWI_GROW(*runs, *cap, *n + 1))
		return false;
	r = &(*runs)[(*n)++];
	r->group = group;
	r->from = index;
	r->n = count;
	r->tail = end ? 0 : tail;
	r->end = end;
	r->splits = splits;
	return true;
}

/* Runs one lease to its end, queueing its elements then its end marker. */
static cachew_err
run_lease(cwi_wtask *t, uint32_t lease, const cwi_unit_range *ranges,
    size_t nranges, const cwi_rset *skip)
{
	lease_feed f = {0};
	cwi_element *group[PUSH_GROUP_ELEMENTS];
	uint64_t idx[PUSH_GROUP_ELEMENTS];
	uint32_t tails[PUSH_GROUP_ELEMENTS];
	size_t n = 0;
	uint64_t bytes = 0, first_ns = 0;
	bool refused = false; /* push_group's error is rv */
	cachew_err rv;

	rv = cwi_wtask_lease_open(t, &f.it, t->lease_opts, ranges, nranges);
	if (rv != CACHEW_OK) {
		mark_pipeline_failure(t);
		return rv;
	}
	f.skip = skip;
	while (!atomic_load(&t->stop) &&
	       (rv = cwi_wtask_feed_next(t, &f, &group[n], &idx[n],
		    &tails[n])) == CACHEW_OK) {
		if (n == 0)
			first_ns = cwi_now_ns();
		bytes += cwi_element_nbytes(group[n]);
		n++;
		/* The clock is read at group sizes 2, 4, 8, ...: a group of
		 * slow elements still goes within about twice the wait, and
		 * one of fast elements costs 10 clock reads, not 1024. */
		if (n == PUSH_GROUP_ELEMENTS || bytes >= PUSH_GROUP_BYTES ||
		    ((n & (n - 1)) == 0 && n > 1 &&
			cwi_now_ns() - first_ns >= PUSH_GROUP_WAIT_NS)) {
			rv = push_group(t, group, idx, tails, n, bytes, lease,
			    false, 0);
			if (rv != CACHEW_OK) {
				refused = true;
				break;
			}
			n = 0;
			bytes = 0;
		}
	}
	if (rv == CACHEW_EOF) {
		cwi_wtask_add_stats(t, f.it);
		cwi_wtask_send_counters(t);
		rv = push_group(t, group, idx, tails, n, bytes, lease, true,
		    f.next);
		if (rv == CACHEW_OK)
			n = 0;
	} else if (refused) {
		/* Stopped, or out of memory (a failure the runner reports,
		 * not the pipeline's). */
	} else if (rv != CACHEW_ECANCELED && rv != CACHEW_OK) {
		rv = cwi_fail(rv, "%s", cachew_iterator_errmsg(f.it));
		mark_pipeline_failure(t);
	} else if (rv == CACHEW_OK) {
		rv = CACHEW_ECANCELED; /* stopped */
	}
	/* A group push_group refused is still ours. */
	for (size_t i = 0; i < n; i++)
		cwi_element_release(group[i]);
	cwi_wtask_feed_free(&f);
	return rv;
}

static uint32_t
new_lease(cwi_wtask *t, const cwi_split *splits, size_t n, uint64_t group)
{
	uint32_t id;

	pthread_mutex_lock(&t->lock);
	if (!CWI_GROW(t->leases, t->capleases, t->nleases + 1)) {
		pthread_mutex_unlock(&t->lock);
		return UINT32_MAX;
	}
	lease_rec *l = &t->leases[t->nleases];
	memset(l, 0, sizeof(*l));
	if (n > 0) {
		l->split_ids = malloc(n * sizeof(*l->split_ids));
		l->split_leases = malloc(n * sizeof(*l->split_leases));
		if (l->split_ids == NULL || l->split_leases == NULL) {
			free(l->split_ids);
			free(l->split_leases);
			pthread_mutex_unlock(&t->lock);
			return UINT32_MAX;
		}
		for (size_t i = 0; i < n; i++) {
			l->split_ids[i] = splits[i].split_id;
			l->split_leases[i] = splits[i].lease;
		}
	}
	l->nsplits = n;
	l->group = group;
	id = (uint32_t)t->nleases++;
	pthread_mutex_unlock(&t->lock);
	return id;
}

cachew_err
cwi_wtask_lease_splits(cwi_wtask *t, cwi_pmsg *rep)
{
	cwi_pmsg req;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_SPLIT_LEASE);
	req.u.split_lease.worker_id = t->env->worker_id;
	req.u.split_lease.task_id = t->id;
	req.u.split_lease.lineage = t->env->lineage;
	/* Retries below send the same number: the same lease comes back. */
	req.u.split_lease.seq = ++t->lease_seq;
	/* Inline: as many as the dispatcher gives (the embedded one, a
	 * whole epoch): one lease pipeline batches and shuffles across
	 * splits exactly as the plain executor does. */
	req.u.split_lease.max_splits = t->inline_run ? CWI_PROTO_MAX_SPLITS
						     : t->lease_size;
	(void)cwi_pmsg_set_token(&req, t->env->token); /* none: refused */
	/* Each round of retries is bounded by the call timeout (a stop is
	 * seen between rounds); an unreachable dispatcher (a restart) is
	 * ridden out for absence_ms in all. */
	uint64_t t0 = cwi_now_ns();
	uint64_t until = t0 + (uint64_t)t->env->absence_ms * 1000000u;
	do {
		rv = cwi_rpc_call_retry(t->env->dispatcher, &req,
		    CWI_MSG_SPLIT_LEASE_REPLY, t->env->rpc_timeout_ms, &t->stop,
		    rep);
	} while ((rv == CACHEW_ETIMEDOUT || rv == CACHEW_EIO ||
		     rv == CACHEW_ECLOSED) &&
		 !atomic_load(&t->stop) && cwi_now_ns() < until);
	if (rv == CACHEW_OK && t->env->lease_latency != NULL)
		cwi_histogram_observe(t->env->lease_latency,
		    cwi_now_ns() - t0);
	cwi_pmsg_free(&req);
	return rv;
}

/* The unit ranges of a lease reply's splits (malloc'd), or NULL. */
cwi_unit_range *
cwi_wtask_lease_ranges(const cwi_msg_split_lease_reply *lr)
{
	cwi_unit_range *ranges = malloc(lr->nsplits * sizeof(*ranges));

	if (ranges == NULL)
		return NULL;
	for (size_t i = 0; i < lr->nsplits; i++) {
		ranges[i].begin = lr->splits[i].begin;
		ranges[i].end = lr->splits[i].end;
	}
	return ranges;
}

static cachew_err
run_distributed(cwi_wtask *t)
{
	for (;;) {
		cwi_pmsg rep;
		cwi_unit_range *ranges;
		cwi_msg_split_lease_reply *lr;
		cachew_err rv;
		uint32_t lease;

		if (atomic_load(&t->stop))
			return CACHEW_ECANCELED;
		if (atomic_load(t->env->draining))
			return CACHEW_OK;
		rv = cwi_wtask_lease_splits(t, &rep);
		if (rv != CACHEW_OK)
			return rv;
		lr = &rep.u.split_lease_reply;
		if (lr->nsplits == 0) {
			bool end = lr->end_of_splits;
			uint32_t retry = lr->retry_ms > 0 ? lr->retry_ms : 50;
			cwi_pmsg_free(&rep);
			if (end)
				return CACHEW_OK;
			/* On t->space: a stop ends the wait at once. */
			pthread_mutex_lock(&t->lock);
			if (!atomic_load(&t->stop) && !t->poked)
				(void)cwi_cond_wait_ns(&t->space, &t->lock,
				    (uint64_t)retry * 1000000u);
			t->poked = false;
			pthread_mutex_unlock(&t->lock);
			continue;
		}
		cwi_rset skip = {0};
		ranges = cwi_wtask_lease_ranges(lr);
		lease = new_lease(t, lr->splits, lr->nsplits, lr->group);
		if (ranges == NULL || lease == UINT32_MAX ||
		    !cwi_rset_list_ok(lr->skip, lr->nskip) ||
		    !cwi_rset_add_list(&skip, lr->skip, lr->nskip)) {
			bool bad = !cwi_rset_list_ok(lr->skip, lr->nskip);
			free(ranges);
			cwi_rset_free(&skip);
			cwi_pmsg_free(&rep);
			return bad ? cwi_fail(CACHEW_EPROTO, "split_lease_reply: "
					 "skip is not ascending [from, to) "
					 "pairs")
				   : cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		rv = run_lease(t, lease, ranges, lr->nsplits,
		    skip.n > 0 ? &skip : NULL);
		cwi_rset_free(&skip);
		free(ranges);
		cwi_pmsg_free(&rep);
		if (rv != CACHEW_OK)
			return rv;
	}
}

static cachew_err
run_parallel_epochs(cwi_wtask *t)
{
	cwi_unit_range all = {0, t->plan->units};
	uint32_t lease = new_lease(t, NULL, 0, 0);

	if (lease == UINT32_MAX)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return run_lease(t, lease, &all, 1, NULL);
}

static void *
runner_main(void *arg)
{
	cwi_wtask *t = arg;
	cachew_err rv;

	rv = t->mode == CWI_MODE_PARALLEL_EPOCHS ? run_parallel_epochs(t)
						 : run_distributed(t);
	if (rv == CACHEW_OK) {
		ready_reply *ready = NULL;
		size_t nready;

		pthread_mutex_lock(&t->lock);
		t->produced_all = true;
		t->end_ns = cwi_now_ns();
		nready = serve_held(t, &ready);
		pthread_mutex_unlock(&t->lock);
		send_ready(t, ready, nready);
		free(ready);
	} else if (rv != CACHEW_ECANCELED) {
		runner_fail(t, rv, cwi_errmsg_get());
	}
	return NULL;
}

/* ---- reports ----------------------------------------------------------------- */

/* Everything the task will deliver went out. Coordinated: every consumer
 * got the end round (and so every round before it). */
static bool
task_done_locked(const cwi_wtask *t)
{
	if (t->ncons > 0)
		return t->produced_all && t->end_slot != UINT64_MAX &&
		       t->nend_served == t->ncons && t->nslots == 0;
	/* A pipeline that failed stays failed: every client asking gets
	 * its error, and its splits are not leased again elsewhere to fail
	 * the same way (a file gone, a URL answering 404). */
	if (t->failed != CACHEW_OK && t->failed_pipeline)
		return false;
	return t->produced_all && t->qlen == 0;
}

/* Held requests past their wait_ms get a reply with no elements (in
 * arrival order, each with its client's next seq), so that the client's
 * request does not time out while the task has nothing for it. */
static void
expire_held(cwi_wtask *t)
{
	uint64_t now = cwi_now_ns();
	ready_reply *v = NULL;
	size_t n = 0, cap = 0, keep = 0;

	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->nheld; i++) {
		held_req *h = &t->held[i];
		client_rec *c = cwi_wtask_client_get(t, h->m.client_id);
		cwi_msg *msg = NULL;
		cwi_pmsg rep;

		if (h->expire_ns == 0 || now < h->expire_ns || c == NULL ||
		    !CWI_GROW(v, cap, n + 1) || cwi_msg_create(&msg) !=
		    CACHEW_OK) {
			t->held[keep++] = *h;
			continue;
		}
		memset(&v[n], 0, sizeof(v[n]));
		cwi_wtask_reply_init(&rep, t, c, &h->m, h->remote, 0,
		    &v[n].st);
		rep.u.get_elements_reply.queued_bytes = t->qbytes;
		v[n].r = h->r;
		v[n].msg = cwi_wtask_reply_finish(t, msg, &rep, &v[n].st);
		n++;
	}
	t->nheld = keep;
	pthread_mutex_unlock(&t->lock);
	send_ready(t, v, n);
	free(v);
}

cachew_err
cwi_wtask_report(cwi_wtask *t, cwi_task_report *rep, bool full)
{
	if (!t->inline_run)
		expire_held(t);
	memset(rep, 0, sizeof(*rep));
	pthread_mutex_lock(&t->lock);
	rep->task_id = t->id;
	rep->done = task_done_locked(t);
	rep->elements = t->elements;
	rep->bytes = t->bytes;
	rep->run_ns = (t->end_ns != 0 ? t->end_ns : cwi_now_ns()) - t->start_ns;
	rep->stall_ns = t->stall_ns;
	rep->splits_delivered = t->delivered;
	rep->nsplits_delivered = t->ndelivered;
	t->delivered = NULL;
	t->ndelivered = t->capdelivered = 0;
	if (full || t->ops_leases != t->ops_leases_acked)
		(void)cwi_wtask_report_ops(t, rep); /* metrics only */
	else
		rep->ops_leases = t->ops_leases;
	pthread_mutex_unlock(&t->lock);
	return CACHEW_OK;
}

void
cwi_wtask_report_acked(cwi_wtask *t, const cwi_task_report *rep)
{
	/* Rows that failed to build (ENOMEM: nops short) are sent again. */
	pthread_mutex_lock(&t->lock);
	if (rep->nops == t->nops && rep->ops_leases == t->ops_leases)
		t->ops_leases_acked = rep->ops_leases;
	pthread_mutex_unlock(&t->lock);
}

bool
cwi_wtask_drained(cwi_wtask *t)
{
	bool drained;

	pthread_mutex_lock(&t->lock);
	/* A task that could not start (no plan: start_failed) holds no
	 * split, though it never reports done. */
	drained = task_done_locked(t) || t->plan == NULL;
	for (size_t i = 0; drained && i < t->nclients; i++)
		if (t->clients[i].nends > 0)
			drained = false;
	pthread_mutex_unlock(&t->lock);
	return drained;
}
