/*
 * worker.c - the worker role: registers with the dispatcher, heartbeats its
 * tasks' progress and counters, starts and stops the tasks it is told to,
 * and serves get_elements requests on its data listener.
 *
 * Threads: the heartbeat thread (register, heartbeat, task start/stop,
 * drain), one runner per task (worker_task.c), and the transport's threads
 * calling on_request.
 * Locking: w->lock protects the task table; a task's own lock is taken
 * after it (never the other way round), and no lock is held across a
 * transport call.
 */
#include "../service.h"
#include "../service_user.h"
#include "../../graph/graph.h"
#include "worker_task.h"
#include "../service_auth.h"
#include "../service_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

struct cwi_worker {
	cwi_service_config cfg;
	cwi_listener *listener;
	cwi_conn *dispatcher;
	char url[CWI_CFG_STR_MAX];
	cachew_options *opts;
	cwi_wtask_env env;
	cwi_histogram lease_latency; /* env.lease_latency */
	char *token; /* --token-file's (env.token); NULL: none */

	cwi_http_listener *metrics; /* --metrics-listen; NULL: none */
	pthread_t heartbeat;
	bool heartbeat_started;
	atomic_bool stop;
	atomic_bool draining;
	bool poked; /* heartbeat now (lock) */
	uint64_t unknown_poke_ns; /* the last poke for an unknown task (lock) */
	/* Heartbeats begun and finished (lock): cwi_worker_poke_wait waits
	 * for one that began after its poke. */
	uint64_t hb_begun, hb_done;
	bool hb_ok; /* the last heartbeat or registering got a reply (lock) */
	/* Requests for a task not known yet, held until a heartbeat that
	 * began after they came has ended (lock): park_unknown. */
	struct parked_request *parked;
	size_t nparked, capparked;
	uint64_t unknown_replies; /* "no task" errors sent (lock) */
	uint64_t held_served, held_no_task; /* parked: outcomes (lock) */
	/* The highest task id started (lock): the dispatcher numbers tasks
	 * upwards, so an unknown id at or below it is gone, not to come. */
	uint64_t max_task_id;

	pthread_mutex_t lock;
	pthread_mutex_t start_lock; /* start_tasks, before lock */
	pthread_cond_t cond; /* drained, registered */
	cwi_wtask **tasks;
	size_t ntasks, captasks;
	bool drained;
	uint64_t worker_id;

	uint64_t cpu_prev_ns, wall_prev_ns;
	double cpu_last; /* cpu_use's last figure */
	/* The next heartbeat reports every task in full (heartbeat thread):
	 * the first after registering and any after a failed one, which a
	 * restarted dispatcher may not have seen. */
	bool hb_full;
};

/* ---- the data listener --------------------------------------------------------- */

static cwi_wtask *
task_find(cwi_worker *w, uint64_t id)
{
	cwi_wtask *t = NULL;

	pthread_mutex_lock(&w->lock);
	for (size_t i = 0; i < w->ntasks; i++) {
		if (cwi_wtask_id(w->tasks[i]) == id) {
			t = w->tasks[i];
			cwi_wtask_ref(t);
			break;
		}
	}
	pthread_mutex_unlock(&w->lock);
	return t;
}

/* A client asks for a task this worker has not heard of: most often a job
 * just created, whose task the dispatcher hands out at this worker's next
 * heartbeat. That heartbeat goes now rather than at the interval (100 ms
 * to seconds: W6's runs spent a third of their time waiting for it), at
 * most once per UNKNOWN_POKE_NS however many clients ask: a flood of
 * requests for tasks that do not exist costs the dispatcher at most 1000
 * heartbeats a second. A job's setup and end take about 1.5 ms on an
 * idle machine: at 5 ms, each job of a `repeat` waited for the limit. */
#define UNKNOWN_POKE_NS ((uint64_t)1000000)

static void
poke_for_unknown_task(cwi_worker *w)
{
	uint64_t now = cwi_now_ns();

	pthread_mutex_lock(&w->lock);
	if (now - w->unknown_poke_ns >= UNKNOWN_POKE_NS) {
		w->unknown_poke_ns = now;
		w->poked = true;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Serves r when its task is here (true), else leaves it. */
static bool
serve_known(cwi_worker *w, cwi_request *r, cwi_pmsg *m)
{
	cwi_wtask *t;
	uint64_t id;

	id = m->type == CWI_MSG_GET_ELEMENTS ? m->u.get_elements.task_id
					    : m->u.task_stats.task_id;
	t = task_find(w, id);
	if (t == NULL)
		return false;
	if (!cwi_wtask_secret_ok(t, m->type == CWI_MSG_GET_ELEMENTS
					? m->u.get_elements.secret
					: m->u.task_stats.secret)) {
		cwi_rpc_reply_error(r, CACHEW_EPERM, "task %llu on worker %s: "
		    "the request lacks the task's secret: only its job's "
		    "clients may read it", (unsigned long long)id, w->url);
		cwi_wtask_unref(t);
		return true;
	}
	if (m->type == CWI_MSG_GET_ELEMENTS)
		cwi_wtask_get_elements(t, r, &m->u.get_elements);
	else
		cwi_wtask_task_stats(t, r);
	cwi_wtask_unref(t);
	return true;
}

/*
 * A get_elements for a task this worker has not heard of is held, not
 * refused, while the registered worker's heartbeats work: the task of a
 * job just created comes in the reply of a heartbeat that begins after
 * the request came (the dispatcher placed it before the client could
 * know it), which is poked now. The request is served once that
 * heartbeat has ended, or gets ENOENT if the task still is not there
 * (dropped, or never this worker's). Before, it got ENOENT at once and
 * the client asked again after 1 to 20 ms: 8 ms of each job's setup
 * through a remote service (issue 18). At most PARKED_MAX are held;
 * beyond, and while the dispatcher does not answer, ENOENT at once.
 */
#define PARKED_MAX 256

typedef struct parked_request {
	cwi_request *r;
	cwi_pmsg m;         /* a get_elements */
	uint64_t hb_after; /* served once heartbeat hb_after + 1 ended */
} parked_request;

static void
reply_unknown(cwi_worker *w, cwi_request *r, uint64_t id)
{
	pthread_mutex_lock(&w->lock);
	w->unknown_replies++;
	pthread_mutex_unlock(&w->lock);
	cwi_rpc_reply_error(r, CACHEW_ENOENT, "no task %llu on worker %s",
	    (unsigned long long)id, w->url);
}

/* Holds r (takes m) until a heartbeat that begins after now has ended;
 * false when it may not be held. */
static bool
park_unknown(cwi_worker *w, cwi_request *r, cwi_pmsg *m)
{
	bool parked = false;

	pthread_mutex_lock(&w->lock);
	if (w->worker_id != 0 && w->hb_ok && !atomic_load(&w->stop) &&
	    !atomic_load(&w->draining) && w->nparked < PARKED_MAX &&
	    m->u.get_elements.task_id > w->max_task_id &&
	    CWI_GROW(w->parked, w->capparked, w->nparked + 1)) {
		parked_request *p = &w->parked[w->nparked++];
		p->r = r;
		p->m = *m;
		p->hb_after = w->hb_begun;
		parked = true;
		/* A poke the rate limit kept back: sleep_interval sets
		 * its end by the limit's instead. */
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
	return parked;
}

/* After heartbeat hb ended: serves the requests held for it (heartbeat
 * thread); the later ones wait for the next, poked at once. With stop,
 * every one gets ENOENT. */
static void
serve_parked(cwi_worker *w, uint64_t hb, bool stop)
{
	parked_request *v = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&w->lock);
	if (stop) {
		/* All of them, without allocating: none may be left
		 * unanswered (their memory goes with the worker). */
		v = w->parked;
		n = w->nparked;
		w->parked = NULL;
		w->nparked = w->capparked = 0;
	}
	for (size_t i = 0; i < w->nparked;) {
		parked_request *p = &w->parked[i];

		if (!stop && p->hb_after >= hb) {
			i++;
			continue;
		}
		if (!CWI_GROW(v, cap, n + 1))
			break; /* out of memory: the next heartbeat serves it */
		v[n++] = *p;
		w->parked[i] = w->parked[--w->nparked];
	}
	if (w->nparked > 0)
		w->poked = true;
	pthread_mutex_unlock(&w->lock);
	for (size_t i = 0; i < n; i++) {
		bool served = !stop && serve_known(w, v[i].r, &v[i].m);

		if (!served)
			reply_unknown(w, v[i].r, v[i].m.u.get_elements.task_id);
		pthread_mutex_lock(&w->lock);
		if (served)
			w->held_served++;
		else
			w->held_no_task++;
		pthread_mutex_unlock(&w->lock);
		cwi_pmsg_free(&v[i].m);
	}
	free(v);
}

static void
on_request(void *arg, cwi_request *r)
{
	cwi_worker *w = arg;
	cwi_pmsg m;
	uint64_t id;

	if (cwi_rpc_unpack(cwi_request_msg(r), cwi_request_peer(r), &m) !=
	    CACHEW_OK) {
		cwi_request_reject(r, cwi_errmsg_get());
		return;
	}
	if (m.type != CWI_MSG_GET_ELEMENTS && m.type != CWI_MSG_TASK_STATS) {
		cwi_rpc_reply_error(r, CACHEW_EPROTO,
		    "a worker serves get_elements and task_stats, not %s",
		    cwi_msg_type_name(m.type));
		cwi_pmsg_free(&m);
		return;
	}
	id = m.type == CWI_MSG_GET_ELEMENTS ? m.u.get_elements.task_id
					    : m.u.task_stats.task_id;
	if (serve_known(w, r, &m)) {
		cwi_pmsg_free(&m);
		return;
	}
	if (m.type == CWI_MSG_GET_ELEMENTS) {
		poke_for_unknown_task(w);
		if (park_unknown(w, r, &m))
			return; /* took m */
	}
	reply_unknown(w, r, id);
	cwi_pmsg_free(&m);
}


static void sleep_interval(cwi_worker *w);

/* ---- heartbeats ------------------------------------------------------------------ */

static double
cpu_use(cwi_worker *w)
{
	struct rusage ru;
	uint64_t cpu, wall = cwi_now_ns();
	double use = 0;

	/* getrusage sums every thread of the process: with thousands of
	 * live iterators it was 5% of a heartbeat, and heartbeats poked
	 * back to back (one per job created) need no new figure. */
	if (w->wall_prev_ns != 0 && wall > w->wall_prev_ns &&
	    wall - w->wall_prev_ns < 100 * UINT64_C(1000000))
		return w->cpu_last;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	cpu = (uint64_t)ru.ru_utime.tv_sec * 1000000000u +
	      (uint64_t)ru.ru_utime.tv_usec * 1000u +
	      (uint64_t)ru.ru_stime.tv_sec * 1000000000u +
	      (uint64_t)ru.ru_stime.tv_usec * 1000u;
	if (w->wall_prev_ns != 0 && wall > w->wall_prev_ns)
		use = (double)(cpu - w->cpu_prev_ns) /
		      (double)(wall - w->wall_prev_ns);
	w->cpu_prev_ns = cpu;
	w->wall_prev_ns = wall;
	w->cpu_last = use;
	return use;
}

/* The user functions this process can run (its plugins' and those
 * registered from C), for the dispatcher to place tasks by. */
static cachew_err
register_functions(cwi_msg_worker_register *m)
{
	cwi_fn_ident *v = NULL;
	size_t n = 0;
	cachew_err rv = cwi_registry_user_fns(&v, &n);

	if (rv == CACHEW_OK && n > 0 &&
	    (m->functions = calloc(n, sizeof(*m->functions))) == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; rv == CACHEW_OK && i < n; i++) {
		cwi_fn_info *f = &m->functions[m->nfunctions++];
		f->name = cwi_strdup(v[i].name);
		if (v[i].plugin[0] != '\0') {
			f->plugin = cwi_strdup(v[i].plugin);
			f->plugin_hash = cwi_strdup(v[i].hash);
		}
		if (v[i].version[0] != '\0')
			f->plugin_version = cwi_strdup(v[i].version);
		if (f->name == NULL || (v[i].plugin[0] != '\0' &&
		    (f->plugin == NULL || f->plugin_hash == NULL)) ||
		    (v[i].version[0] != '\0' && f->plugin_version == NULL))
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	free(v);
	return rv;
}

static cachew_err
do_register(cwi_worker *w)
{
	cwi_pmsg req, rep;
	uint64_t said = 0;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_WORKER_REGISTER);
	req.u.worker_register.address = cwi_strdup(w->url);
	req.u.worker_register.cores = (uint32_t)(
	    w->cfg.threads > 0 ? w->cfg.threads : cwi_online_cpus());
	req.u.worker_register.build = cwi_strdup(cachew_version());
	req.u.worker_register.direct = w->env.inline_run;
	rv = register_functions(&req.u.worker_register);
	if (rv == CACHEW_OK)
		rv = cwi_pmsg_set_token(&req, w->env.token);
	if (rv != CACHEW_OK) {
		cwi_pmsg_free(&req);
		return rv;
	}
	/* Until it works or the worker stops. Each round of retries is
	 * bounded (the retry's per-call timeout is what is left of it, an
	 * int of milliseconds) and long enough for a slow dispatcher: a
	 * registration whose reply comes after its timeout is sent again,
	 * and the second one replaces the first, tasks and all. A failure is
	 * in the log at once, then every 10 s: a refusal (TLS: CACHEW_EAUTH;
	 * a token: CACHEW_EPERM) as an error, a dispatcher not there (not
	 * started yet, a wrong address) as a warning naming the dial's
	 * error. Both are asked again every heartbeat interval: the
	 * certificate or the token table may be mended, the dispatcher may
	 * come. */
	do {
		rv = cwi_rpc_call_retry(w->dispatcher, &req,
		    CWI_MSG_WORKER_REGISTER_REPLY,
		    (int64_t)w->cfg.worker_timeout_ms > 10000
			? (int64_t)w->cfg.worker_timeout_ms : 10000,
		    &w->stop, &rep);
		if (rv == CACHEW_OK || rv == CACHEW_ECANCELED ||
		    atomic_load(&w->stop))
			break;
		if (cwi_now_ns() >= said) {
			bool refused = rv == CACHEW_EAUTH || rv == CACHEW_EPERM;

			cwi_log(refused ? CACHEW_LOG_ERROR : CACHEW_LOG_WARN,
			    "worker", "event=%s dispatcher=%s error=\"%s\"",
			    refused ? "register_refused" : "register_failed",
			    w->cfg.dispatcher, cwi_errmsg_get());
			said = cwi_now_ns() + UINT64_C(10000000000);
		}
		if (atomic_load(&w->draining))
			break; /* nothing to drain */
		if (rv == CACHEW_EAUTH || rv == CACHEW_EPERM ||
		    cwi_conn_unreachable(w->dispatcher))
			sleep_interval(w);
	} while ((rv == CACHEW_ETIMEDOUT || rv == CACHEW_EIO ||
		     rv == CACHEW_ECLOSED || rv == CACHEW_EAUTH ||
		     rv == CACHEW_EPERM) &&
		 !atomic_load(&w->stop));
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	pthread_mutex_lock(&w->lock);
	w->worker_id = rep.u.worker_register_reply.worker_id;
	w->env.worker_id = w->worker_id;
	w->env.lineage = rep.u.worker_register_reply.lineage;
	/* The dispatcher answers: a task placed here since comes with the
	 * heartbeat that follows at once (park_unknown). */
	w->hb_ok = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	cwi_log(CACHEW_LOG_INFO, "worker", "event=registered worker=%llu "
	    "dispatcher=%s url=%s", (unsigned long long)w->worker_id,
	    w->cfg.dispatcher, w->url);
	cwi_pmsg_free(&rep);
	return CACHEW_OK;
}

static void
start_tasks(cwi_worker *w, const cwi_msg_worker_heartbeat_reply *hr)
{
	/* The heartbeat and the embedded service's job hook both start
	 * tasks: one at a time, or both would start a task neither held. */
	pthread_mutex_lock(&w->start_lock);
	for (size_t i = 0; i < hr->nstart; i++) {
		cwi_wtask *t, *dup = task_find(w, hr->start[i].task_id);

		if (dup != NULL) {
			cwi_wtask_unref(dup);
			continue;
		}
		if (cwi_wtask_start(&t, &hr->start[i], &w->env) != CACHEW_OK) {
			cwi_log(CACHEW_LOG_WARN, "worker", "event=task_start_failed "
			    "task=%llu error=\"%s\"",
			    (unsigned long long)hr->start[i].task_id,
			    cwi_errmsg_get());
			continue;
		}
		pthread_mutex_lock(&w->lock);
		void *p = realloc(w->tasks, (w->ntasks + 1) * sizeof(*w->tasks));
		if (p == NULL) {
			pthread_mutex_unlock(&w->lock);
			cwi_wtask_unref(t);
			continue;
		}
		bool mapped = cwi_wtask_maps_files(t);
		w->tasks = p;
		w->tasks[w->ntasks++] = t;
		if (hr->start[i].task_id > w->max_task_id)
			w->max_task_id = hr->start[i].task_id;
		pthread_mutex_unlock(&w->lock);
		cwi_log(CACHEW_LOG_INFO, "worker", "event=task_started task=%llu "
		    "job=%llu mode=%s files=%s",
		    (unsigned long long)hr->start[i].task_id,
		    (unsigned long long)hr->start[i].job_id,
		    cwi_processing_mode_name(hr->start[i].processing_mode),
		    mapped ? "mapped" : "read");
	}
	pthread_mutex_unlock(&w->start_lock);
}

static void
stop_tasks(cwi_worker *w, const uint64_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		cwi_wtask *t = NULL;

		pthread_mutex_lock(&w->lock);
		for (size_t k = 0; k < w->ntasks; k++) {
			if (cwi_wtask_id(w->tasks[k]) == ids[i]) {
				t = w->tasks[k];
				w->tasks[k] = w->tasks[--w->ntasks];
				break;
			}
		}
		pthread_mutex_unlock(&w->lock);
		if (t == NULL)
			continue;
		cwi_wtask_stop(t);
		cwi_wtask_unref(t);
		cwi_log(CACHEW_LOG_INFO, "worker", "event=task_stopped task=%llu",
		    (unsigned long long)ids[i]);
	}
}

/* Stops every task: the dispatcher that gave them lost its state, so
 * their ids may name its new tasks. */
static void
stop_all_tasks(cwi_worker *w)
{
	cwi_wtask **v;
	size_t n;

	pthread_mutex_lock(&w->lock);
	v = w->tasks;
	n = w->ntasks;
	w->tasks = NULL;
	w->ntasks = 0;
	w->max_task_id = 0; /* the new lineage numbers from 1 */
	pthread_mutex_unlock(&w->lock);
	for (size_t i = 0; i < n; i++) {
		cwi_log(CACHEW_LOG_INFO, "worker", "event=task_stopped task=%llu "
		    "reason=\"dispatcher lost its state\"",
		    (unsigned long long)cwi_wtask_id(v[i]));
		cwi_wtask_stop(v[i]);
		cwi_wtask_unref(v[i]);
	}
	free(v);
}

/* Snapshot of the task table with references. */
static cwi_wtask **
tasks_snapshot(cwi_worker *w, size_t *n)
{
	cwi_wtask **v;

	pthread_mutex_lock(&w->lock);
	*n = w->ntasks;
	v = calloc(w->ntasks > 0 ? w->ntasks : 1, sizeof(*v));
	if (v == NULL)
		*n = 0;
	for (size_t i = 0; i < *n; i++) {
		v[i] = w->tasks[i];
		cwi_wtask_ref(v[i]);
	}
	pthread_mutex_unlock(&w->lock);
	return v;
}

static cachew_err
do_heartbeat(cwi_worker *w, bool *all_drained)
{
	cwi_pmsg req, rep;
	cwi_wtask **v;
	size_t n;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_WORKER_HEARTBEAT);
	req.u.worker_heartbeat.worker_id = w->worker_id;
	req.u.worker_heartbeat.lineage = w->env.lineage;
	req.u.worker_heartbeat.cpu_use = cpu_use(w);
	req.u.worker_heartbeat.draining = atomic_load(&w->draining);
	v = tasks_snapshot(w, &n);
	*all_drained = true;
	req.u.worker_heartbeat.tasks = calloc(n > 0 ? n : 1,
	    sizeof(cwi_task_report));
	if (req.u.worker_heartbeat.tasks != NULL) {
		req.u.worker_heartbeat.ntasks = n;
		for (size_t i = 0; i < n; i++)
			(void)cwi_wtask_report(v[i],
			    &req.u.worker_heartbeat.tasks[i], w->hb_full);
	}
	for (size_t i = 0; i < n; i++)
		if (!cwi_wtask_drained(v[i]))
			*all_drained = false;
	rv = cwi_pmsg_set_token(&req, w->env.token);
	if (rv == CACHEW_OK)
		rv = cwi_rpc_call(w->dispatcher, &req,
		    CWI_MSG_WORKER_HEARTBEAT_REPLY,
		    (int)w->cfg.heartbeat_ms * 4, &rep);
	w->hb_full = rv != CACHEW_OK;
	for (size_t i = 0; i < n; i++) {
		if (rv == CACHEW_OK && req.u.worker_heartbeat.tasks != NULL)
			cwi_wtask_report_acked(v[i],
			    &req.u.worker_heartbeat.tasks[i]);
		cwi_wtask_unref(v[i]);
	}
	free(v);
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	if (!atomic_load(&w->draining))
		start_tasks(w, &rep.u.worker_heartbeat_reply);
	stop_tasks(w, rep.u.worker_heartbeat_reply.stop,
	    rep.u.worker_heartbeat_reply.nstop);
	cwi_pmsg_free(&rep);
	return CACHEW_OK;
}

static void
do_deregister(cwi_worker *w)
{
	cwi_pmsg req, rep;

	cwi_pmsg_init(&req, CWI_MSG_WORKER_DEREGISTER);
	req.u.worker_deregister.worker_id = w->worker_id;
	req.u.worker_deregister.lineage = w->env.lineage;
	if (cwi_pmsg_set_token(&req, w->env.token) == CACHEW_OK &&
	    cwi_rpc_call(w->dispatcher, &req, CWI_MSG_OK,
		(int)w->cfg.heartbeat_ms * 4, &rep) == CACHEW_OK)
		cwi_pmsg_free(&rep);
	cwi_pmsg_free(&req);
	cwi_log(CACHEW_LOG_INFO, "worker", "event=deregistered worker=%llu",
	    (unsigned long long)w->worker_id);
}

static void
sleep_interval(cwi_worker *w)
{
	uint64_t end = cwi_now_ns() + (uint64_t)w->cfg.heartbeat_ms * 1000000u;

	/* One wait to the end of the interval: stop, a poke (the start of a
	 * drain is one) and a parked request each broadcast under the lock
	 * and end it at once (an idle worker used to wake every 20 ms to
	 * look, 50 futex round trips a second). A draining worker
	 * heartbeats every 100 ms at most, to notice its tasks are drained
	 * soon, not in a loop: against a dispatcher that is gone each call
	 * fails at once, and the loop spun. */
	if (atomic_load(&w->draining) && w->cfg.heartbeat_ms > 100)
		end = cwi_now_ns() + 100 * 1000000u;
	pthread_mutex_lock(&w->lock);
	while (!atomic_load(&w->stop) && !w->poked) {
		uint64_t now = cwi_now_ns();

		/* Held requests whose poke the rate limit kept back: the
		 * heartbeat goes once it allows. */
		if (w->nparked > 0 &&
		    w->unknown_poke_ns + UNKNOWN_POKE_NS < end) {
			end = w->unknown_poke_ns + UNKNOWN_POKE_NS;
			if (now >= end)
				w->unknown_poke_ns = now;
		}
		if (now >= end)
			break;
		(void)cwi_cond_wait_ns(&w->cond, &w->lock, end - now);
	}
	w->poked = false;
	pthread_mutex_unlock(&w->lock);
}

void
cwi_worker_poke(cwi_worker *w)
{
	pthread_mutex_lock(&w->lock);
	w->poked = true;
	pthread_cond_broadcast(&w->cond);
	for (size_t i = 0; i < w->ntasks; i++)
		cwi_wtask_poke(w->tasks[i]);
	pthread_mutex_unlock(&w->lock);
}

uint64_t
cwi_worker_id(cwi_worker *w)
{
	uint64_t id;

	pthread_mutex_lock(&w->lock);
	id = w->worker_id;
	pthread_mutex_unlock(&w->lock);
	return id;
}

void
cwi_worker_start_tasks(cwi_worker *w,
    const cwi_msg_worker_heartbeat_reply *starts)
{
	if (!atomic_load(&w->draining))
		start_tasks(w, starts);
}

void
cwi_worker_poke_wait(cwi_worker *w, int64_t timeout_ms)
{
	uint64_t deadline = cwi_now_ns() + (uint64_t)timeout_ms * 1000000u;
	uint64_t want;

	pthread_mutex_lock(&w->lock);
	want = w->hb_begun + 1;
	w->poked = true;
	pthread_cond_broadcast(&w->cond);
	for (uint64_t now = cwi_now_ns();
	     w->hb_done < want && !atomic_load(&w->stop) && now < deadline;
	     now = cwi_now_ns())
		(void)cwi_cond_wait_ns(&w->cond, &w->lock, deadline - now);
	pthread_mutex_unlock(&w->lock);
}

static void *
heartbeat_main(void *arg)
{
	cwi_worker *w = arg;
	bool registered = false, drained;
	uint64_t hb_fail_since = 0, hb_warn_next = 0;

	while (!atomic_load(&w->stop)) {
		if (!registered) {
			if (do_register(w) != CACHEW_OK)
				break; /* stopped */
			registered = true;
			w->hb_full = true;
		}
		pthread_mutex_lock(&w->lock);
		uint64_t hb = ++w->hb_begun;
		pthread_mutex_unlock(&w->lock);
		cachew_err rv = do_heartbeat(w, &drained);
		pthread_mutex_lock(&w->lock);
		w->hb_done = hb;
		w->hb_ok = rv == CACHEW_OK;
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		serve_parked(w, hb, false);
		if (rv == CACHEW_ENOENT) {
			uint64_t l = cwi_rpc_error_lineage();

			/* The dispatcher forgot us (declared dead, or it
			 * restarted without its journal: another lineage,
			 * whose ids may name other tasks): register again. */
			cwi_log(CACHEW_LOG_WARN, "worker", "event=reregister "
			    "reason=\"%s\"", cwi_errmsg_get());
			if (l != 0 && l != w->env.lineage)
				stop_all_tasks(w);
			registered = false;
			continue;
		}
		/* A call that cwi_worker_stop cut short (it sets stop, then
		 * closes the connection) is the stop, not a failure: `cachew
		 * run` printed this warning on stderr when it exited while
		 * the embedded worker's heartbeat was in flight. An absent
		 * dispatcher (a restart) is said once, then every 10 s; not
		 * by a worker that drained and stops now (the dispatcher
		 * stopped with it). */
		if (rv != CACHEW_OK && !atomic_load(&w->stop) &&
		    !(atomic_load(&w->draining) && drained)) {
			uint64_t now = cwi_now_ns();

			if (hb_fail_since == 0)
				hb_fail_since = now;
			if (now >= hb_warn_next) {
				cwi_log(CACHEW_LOG_WARN, "worker",
				    "event=heartbeat_failed for_ms=%llu "
				    "error=\"%s\"",
				    (unsigned long long)((now - hb_fail_since) /
					1000000u),
				    cwi_errmsg_get());
				hb_warn_next = now + UINT64_C(10000000000);
			}
		} else if (rv == CACHEW_OK && hb_fail_since != 0) {
			cwi_log(CACHEW_LOG_INFO, "worker", "event=heartbeat_back "
			    "after_ms=%llu", (unsigned long long)((cwi_now_ns() -
						  hb_fail_since) / 1000000u));
			hb_fail_since = 0;
			hb_warn_next = 0;
		}
		/* Drained is a local fact: every task's clients have what it
		 * produced, and a draining worker starts no task. So a
		 * worker whose dispatcher is gone (both got SIGTERM at
		 * once) stops now rather than waiting out the drain
		 * timeout; its deregistration is a courtesy. */
		if (atomic_load(&w->draining) && drained) {
			if (rv == CACHEW_OK)
				do_deregister(w);
			pthread_mutex_lock(&w->lock);
			w->drained = true;
			pthread_cond_broadcast(&w->cond);
			pthread_mutex_unlock(&w->lock);
			break;
		}
		/* The large buffers its leases' elements left for reuse are
		 * the process's (its iterators' ends leave them, tensor.c):
		 * an idle worker gives back the stale ones here. */
		cwi_buffer_cache_trim();
		sleep_interval(w);
	}
	return NULL;
}

/* ---- metrics and health (--metrics-listen) ---------------------------- */

static cachew_err
metrics_render(void *arg, cwi_strbuf *sb)
{
	cwi_worker *w = arg;
	uint64_t id, unknown, held[2];
	size_t ntasks;

	pthread_mutex_lock(&w->lock);
	id = w->worker_id;
	ntasks = w->ntasks;
	unknown = w->unknown_replies;
	held[0] = w->held_served;
	held[1] = w->held_no_task;
	pthread_mutex_unlock(&w->lock);
	cwi_strbuf_puts(sb, "# HELP cachew_worker_registered 1 once the "
			    "dispatcher registered this worker.\n"
			    "# TYPE cachew_worker_registered gauge\n");
	cwi_strbuf_printf(sb, "cachew_worker_registered %d\n", id != 0);
	cwi_strbuf_puts(sb, "# HELP cachew_worker_draining 1 while it drains "
			    "(after SIGTERM).\n"
			    "# TYPE cachew_worker_draining gauge\n");
	cwi_strbuf_printf(sb, "cachew_worker_draining %d\n",
	    atomic_load(&w->draining) ? 1 : 0);
	cwi_strbuf_puts(sb, "# HELP cachew_worker_tasks Tasks this worker "
			    "runs.\n# TYPE cachew_worker_tasks gauge\n");
	cwi_strbuf_printf(sb, "cachew_worker_tasks %zu\n", ntasks);
	cwi_strbuf_puts(sb, "# HELP cachew_worker_unknown_task_replies_total "
			    "get_elements and task_stats requests answered "
			    "\"no task\" (ENOENT): a task this worker did not "
			    "have, not even after the heartbeat that followed "
			    "the request.\n"
			    "# TYPE cachew_worker_unknown_task_replies_total "
			    "counter\n");
	cwi_strbuf_printf(sb, "cachew_worker_unknown_task_replies_total %llu\n",
	    (unsigned long long)unknown);
	cwi_strbuf_puts(sb, "# HELP cachew_worker_held_requests_total "
			    "get_elements for a task not started yet, held "
			    "for the heartbeat that brings it: served, or "
			    "answered \"no task\" when it did not.\n"
			    "# TYPE cachew_worker_held_requests_total "
			    "counter\n");
	cwi_strbuf_printf(sb, "cachew_worker_held_requests_total{outcome="
			      "\"served\"} %llu\n"
			      "cachew_worker_held_requests_total{outcome="
			      "\"no_task\"} %llu\n",
	    (unsigned long long)held[0], (unsigned long long)held[1]);
	cwi_metrics_family(sb, "cachew_worker_lease_duration_seconds",
	    "histogram", "Split lease calls to the dispatcher that got a "
	    "reply: request to reply, retries included.");
	cwi_metrics_histogram(sb, "cachew_worker_lease_duration_seconds", "",
	    &w->lease_latency);
	cwi_metrics_process(sb);
	return CACHEW_OK;
}

/* Ready while registered and not draining: a worker that cannot reach its
 * dispatcher gets no tasks, and a draining one takes none. */
static const char *
metrics_ready(void *arg)
{
	cwi_worker *w = arg;
	uint64_t id;

	pthread_mutex_lock(&w->lock);
	id = w->worker_id;
	pthread_mutex_unlock(&w->lock);
	if (atomic_load(&w->draining))
		return "draining\n";
	return id != 0 ? NULL : "not registered with its dispatcher\n";
}

static int
on_http(void *arg, const char *path, char **body, size_t *len,
    const char **type)
{
	cwi_metrics_source src = {metrics_render, metrics_ready, arg};

	return cwi_metrics_reply(path, &src, body, len, type);
}

/* ---- lifecycle --------------------------------------------------------------------- */

/* Whether url's host is a wildcard (0.0.0.0, [::], *, none): what a
 * worker listening on every interface would register without
 * --advertise, which only a client on its own host can dial. */
static bool
url_is_wildcard(const char *url)
{
	static const char *const hosts[] = {"0.0.0.0:", "[::]:", "*:", ":"};
	const char *host = strstr(url, "://");

	if (host == NULL || strncmp(url, "ipc://", 6) == 0 ||
	    strncmp(url, "inproc://", 9) == 0)
		return false;
	host += 3;
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
		if (strncmp(host, hosts[i], strlen(hosts[i])) == 0)
			return true;
	return false;
}

static cachew_err worker_start(cwi_worker **out,
    const cwi_service_config *cfg, bool inline_run);

cachew_err
cwi_worker_start(cwi_worker **out, const cwi_service_config *cfg)
{
	return worker_start(out, cfg, false);
}

cachew_err
cwi_worker_start_inline(cwi_worker **out, const cwi_service_config *cfg)
{
	return worker_start(out, cfg, true);
}

static cachew_err
worker_start(cwi_worker **out, const cwi_service_config *cfg, bool inline_run)
{
	cwi_worker *w = calloc(1, sizeof(*w));
	cwi_transport_opts topts;
	cwi_service_user user;
	const char *listen;
	cachew_err rv;

	*out = NULL;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cfg->user[0] != '\0' ? cwi_service_user_find(&user, cfg->user)
				  : CACHEW_OK;
	if (rv == CACHEW_OK)
		rv = cwi_service_config_load_plugins(cfg);
	if (rv != CACHEW_OK) {
		free(w);
		return rv;
	}
	w->cfg = *cfg;
	atomic_init(&w->stop, false);
	atomic_init(&w->draining, false);
	pthread_mutex_init(&w->lock, NULL);
	pthread_mutex_init(&w->start_lock, NULL);
	cwi_cond_init_monotonic(&w->cond);
	rv = cachew_options_create(&w->opts);
	if (rv == CACHEW_OK && cfg->token_file[0] != '\0')
		rv = cwi_auth_token_read(cfg->token_file, &w->token);
	if (rv != CACHEW_OK)
		goto fail;
	w->env.token = w->token;
	if (cfg->threads > 0)
		(void)cachew_options_set_int(w->opts, "threads", cfg->threads);
	if (cfg->max_element_bytes > 0)
		(void)cachew_options_set_int(w->opts, "max_element_bytes",
		    cfg->max_element_bytes);
	cwi_transport_opts_init(&topts);
	topts.max_msg_size = CWI_TRANSPORT_MAX_MSG_CONTROL;
	cwi_service_config_tls(&w->cfg, &topts);
	listen = cfg->listen[0] != '\0' ? cfg->listen : "tcp://127.0.0.1:0";
	rv = cwi_listen(&w->listener, listen, &topts, on_request, w);
	if (rv == CACHEW_OK && cfg->user[0] != '\0')
		rv = cwi_service_user_become(&user);
	if (rv == CACHEW_OK && cfg->confined)
		rv = cwi_worker_confine(cfg);
	if (rv != CACHEW_OK)
		goto fail;
	snprintf(w->url, sizeof(w->url), "%s",
	    cfg->advertise[0] != '\0' ? cfg->advertise
				      : cwi_listener_url(w->listener));
	if (cfg->advertise[0] == '\0' && url_is_wildcard(w->url))
		cwi_log(CACHEW_LOG_WARN, "worker", "event=wildcard_address "
		    "url=%s reason=\"clients on other hosts cannot dial a "
		    "wildcard address; give the address they can reach with "
		    "--advertise (e.g. --advertise=tcp://$(hostname):PORT)\"",
		    w->url);
	cwi_transport_opts_init(&topts);
	topts.max_msg_size = (size_t)cfg->max_message_bytes;
	topts.dial_async = true;
	topts.unreachable_after_ms = CWI_RPC_UNREACHABLE_MS;
	cwi_service_config_tls(&w->cfg, &topts);
	rv = cwi_dial(&w->dispatcher, cfg->dispatcher, &topts);
	if (rv != CACHEW_OK)
		goto fail;
	w->env.dispatcher = w->dispatcher;
	w->env.address = w->url;
	w->env.opts = w->opts;
	w->env.rpc_timeout_ms = cfg->worker_timeout_ms;
	w->env.absence_ms = cfg->dispatcher_absence_ms;
	w->env.queue_bytes = (uint64_t)64 << 20;
	w->env.draining = &w->draining;
	/* inproc clients take element pointers: compressing saves nothing. */
	w->env.inproc = strncmp(w->url, "inproc://", 9) == 0;
	w->env.inline_run = inline_run && w->env.inproc;
	w->env.lease_latency = &w->lease_latency;
	if (pthread_create(&w->heartbeat, NULL, heartbeat_main, w) != 0) {
		rv = cwi_fail(CACHEW_ENOMEM, "worker: cannot start a thread");
		goto fail;
	}
	w->heartbeat_started = true;
	rv = cwi_metrics_listen(&w->metrics, cfg->metrics_listen, "worker",
	    on_http, w);
	if (rv != CACHEW_OK)
		goto fail;
	*out = w;
	return CACHEW_OK;
fail:
	cwi_worker_stop(w);
	return rv;
}

const char *
cwi_worker_url(const cwi_worker *w)
{
	return w->url;
}

void
cwi_worker_drain(cwi_worker *w)
{
	atomic_store(&w->draining, true);
	pthread_mutex_lock(&w->lock);
	/* Never registered (its dispatcher unreachable since the start): it
	 * holds no task and no lease, so there is nothing to drain. */
	if (w->worker_id == 0)
		w->drained = true;
	w->poked = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

cachew_err
cwi_worker_wait_registered(cwi_worker *w, int64_t timeout_ms)
{
	uint64_t deadline = cwi_now_ns() + (uint64_t)timeout_ms * 1000000u;
	bool registered;

	pthread_mutex_lock(&w->lock);
	while (w->worker_id == 0 && !atomic_load(&w->stop) &&
	       cwi_now_ns() < deadline) {
		(void)cwi_cond_wait_ns(&w->cond, &w->lock, 10 * 1000000u);
	}
	registered = w->worker_id != 0;
	pthread_mutex_unlock(&w->lock);
	return registered ? CACHEW_OK
			  : cwi_fail(CACHEW_ETIMEDOUT,
				"worker: not registered within %lld ms",
				(long long)timeout_ms);
}

cachew_err
cwi_worker_wait_drained(cwi_worker *w, int64_t timeout_ms)
{
	uint64_t deadline = cwi_now_ns() + (uint64_t)timeout_ms * 1000000u;
	bool drained;

	pthread_mutex_lock(&w->lock);
	while (!w->drained && cwi_now_ns() < deadline) {
		(void)cwi_cond_wait_ns(&w->cond, &w->lock, 50 * 1000000u);
	}
	drained = w->drained;
	pthread_mutex_unlock(&w->lock);
	return drained ? CACHEW_OK
		       : cwi_fail(CACHEW_ETIMEDOUT,
			     "worker: leased splits not delivered within %lld ms",
			     (long long)timeout_ms);
}

void
cwi_worker_stop(cwi_worker *w)
{
	if (w == NULL)
		return;
	/* First: no metrics handler runs on a worker being taken down. */
	cwi_http_listener_destroy(w->metrics);
	w->metrics = NULL;
	/* Under the lock: the heartbeat thread's nap ends at once. */
	pthread_mutex_lock(&w->lock);
	atomic_store(&w->stop, true);
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (w->dispatcher != NULL)
		cwi_conn_close(w->dispatcher);
	if (w->heartbeat_started)
		pthread_join(w->heartbeat, NULL);
	for (size_t i = 0; i < w->ntasks; i++)
		cwi_wtask_stop(w->tasks[i]);
	/* Inline tasks live on in the sessions that pull them, and their
	 * pulls use this worker's connection and settings: wait for a pull
	 * in progress (its lease call ends: the connection is closed) and
	 * keep later ones out. */
	for (size_t i = 0; i < w->ntasks; i++)
		cwi_wtask_detach(w->tasks[i]);
	cwi_listener_close(w->listener);
	serve_parked(w, 0, true);
	free(w->parked);
	for (size_t i = 0; i < w->ntasks; i++)
		cwi_wtask_unref(w->tasks[i]);
	free(w->tasks);
	cwi_listener_destroy(w->listener);
	cwi_conn_destroy(w->dispatcher);
	cachew_options_destroy(w->opts);
	if (w->token != NULL)
		explicit_bzero(w->token, strlen(w->token));
	free(w->token);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	pthread_mutex_destroy(&w->start_lock);
	free(w);
}
