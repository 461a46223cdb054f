/*
 * provision.c - what every provisioner shares: the registry of kinds by
 * name, the target and status behind one lock, the thread that hands the
 * latest target to the kind's step, and the "static" kind.
 *
 * Locking: one mutex per provisioner (p->mtx) guards the target, the
 * closing flag and the status. The kinds' steps run on the thread with it
 * released; the cwi_prov_* reporting calls take it briefly and log only
 * after releasing it (a log callback is user code).
 */
#include "provision.h"

#include "../core/core.h"

#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cwi_provisioner {
	const cwi_prov_kind *kind;
	void *state;
	uint32_t min_workers, max_workers;

	pthread_mutex_t mtx;
	pthread_cond_t cv;       /* a new target, or closing */
	uint64_t target_gen;     /* bumped by each set_target */
	atomic_bool closing;
	cwi_prov_status st;

	pthread_t thread;
	bool has_thread;
};

/* ---- registry ------------------------------------------------------------ */

static const cwi_prov_kind *const kinds[] = {
    &cwi_prov_static,
    &cwi_prov_process,
    &cwi_prov_kubernetes,
};

static const cwi_prov_kind *
kind_find(const char *name)
{
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(kinds[i]->name, name) == 0)
			return kinds[i];
	return NULL;
}

void
cwi_prov_config_default(cwi_prov_config *c)
{
	*c = (cwi_prov_config){
	    .kind = "static",
	    .worker_listen = "tcp://127.0.0.1:0",
	    .stop_timeout_ms = 10000,
	    .deployment = "cachew-worker",
	    .retry_max_ms = 30000,
	    .request_timeout_ms = 10000,
	};
}

/* ---- reporting (the kinds' calls) ------------------------------------------ */

void
cwi_prov_set_running(cwi_provisioner *p, uint32_t running, uint32_t stopping)
{
	pthread_mutex_lock(&p->mtx);
	p->st.running = running;
	p->st.stopping = stopping;
	pthread_mutex_unlock(&p->mtx);
}

const char *
cwi_prov_action_name(cwi_prov_action a)
{
	static const char *const names[CWI_PROV_NACTIONS] = {
	    [CWI_PROV_START] = "start",
	    [CWI_PROV_RESTART] = "restart",
	    [CWI_PROV_STOP] = "stop",
	    [CWI_PROV_SCALE] = "scale",
	};

	return (unsigned)a < CWI_PROV_NACTIONS ? names[a] : "?";
}

void
cwi_prov_note_request(cwi_provisioner *p, cwi_prov_action a,
    bool clear_error)
{
	assert((unsigned)a < CWI_PROV_NACTIONS);
	pthread_mutex_lock(&p->mtx);
	p->st.requests++;
	p->st.actions[a][0]++;
	if (clear_error)
		p->st.last_error[0] = '\0';
	pthread_mutex_unlock(&p->mtx);
}

void
cwi_prov_note_failure(cwi_provisioner *p, cwi_prov_action a,
    const char *fmt, ...)
{
	char msg[sizeof(p->st.last_error)];
	va_list ap;

	assert((unsigned)a <= CWI_PROV_EARLIER);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&p->mtx);
	if (a != CWI_PROV_EARLIER) {
		p->st.requests++;
		p->st.actions[a][1]++;
	}
	p->st.failures++;
	memcpy(p->st.last_error, msg, sizeof(msg));
	pthread_mutex_unlock(&p->mtx);
	cwi_log(CACHEW_LOG_WARN, "provision", "event=provision_failed "
	    "kind=%s reason=\"%s\"", p->kind->name, msg);
}

bool
cwi_prov_closing(cwi_provisioner *p)
{
	return atomic_load(&p->closing);
}

/* ---- the thread ------------------------------------------------------------ */

/* Waits on p->cv until the target changes, closing begins or wait_ms
 * passes (CWI_PROV_IDLE: no deadline). Called and returns with p->mtx. */
static void
wait_for_news(cwi_provisioner *p, uint64_t gen, uint64_t wait_ms)
{
	struct timespec ts;
	uint64_t ns;

	if (wait_ms == CWI_PROV_IDLE) {
		while (p->target_gen == gen && !atomic_load(&p->closing))
			pthread_cond_wait(&p->cv, &p->mtx);
		return;
	}
	if (wait_ms == 0)
		return;
	/* A cap keeps the deadline arithmetic far from overflow; the step
	 * is simply asked again after a day. */
	if (wait_ms > 86400000u)
		wait_ms = 86400000u;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ns = (uint64_t)ts.tv_nsec + (wait_ms % 1000u) * 1000000u;
	ts.tv_sec += (time_t)(wait_ms / 1000u + ns / 1000000000u);
	ts.tv_nsec = (long)(ns % 1000000000u);
	while (p->target_gen == gen && !atomic_load(&p->closing))
		if (pthread_cond_timedwait(&p->cv, &p->mtx, &ts) != 0)
			break;
}

static void *
prov_thread(void *arg)
{
	cwi_provisioner *p = arg;

	pthread_mutex_lock(&p->mtx);
	if (p->kind->wait_first_target)
		wait_for_news(p, 0, CWI_PROV_IDLE);
	while (!atomic_load(&p->closing)) {
		uint32_t target = p->st.target;
		uint64_t gen = p->target_gen, wait_ms;

		pthread_mutex_unlock(&p->mtx);
		wait_ms = p->kind->step(p->state, target);
		pthread_mutex_lock(&p->mtx);
		wait_for_news(p, gen, wait_ms);
	}
	pthread_mutex_unlock(&p->mtx);
	if (p->kind->stop != NULL)
		p->kind->stop(p->state);
	return NULL;
}

/* ---- lifecycle --------------------------------------------------------------- */

static uint32_t
clamp_target(const cwi_provisioner *p, uint32_t n)
{
	if (n < p->min_workers)
		return p->min_workers;
	return n > p->max_workers ? p->max_workers : n;
}

cachew_err
cwi_provisioner_create(cwi_provisioner **out, const cwi_prov_config *cfg)
{
	cwi_provisioner *p;
	const cwi_prov_kind *kind;
	pthread_condattr_t ca;
	cachew_err rv;

	*out = NULL;
	if (cfg == NULL || cfg->kind == NULL || cfg->kind[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "provisioner: no kind given "
		    "(static, process or kubernetes)");
	kind = kind_find(cfg->kind);
	if (kind == NULL)
		return cwi_fail(CACHEW_ENOENT, "provisioner: unknown kind '%s' "
		    "(static, process or kubernetes)", cfg->kind);
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "provisioner: out of memory");
	p->kind = kind;
	p->min_workers = cfg->min_workers;
	p->max_workers = cfg->max_workers != 0 ? cfg->max_workers
	    : kind->default_max;
	if (p->min_workers > p->max_workers) {
		uint32_t max = p->max_workers;
		free(p);
		return cwi_fail(CACHEW_EINVAL, "provisioner %s: min_workers %u "
		    "is above max_workers %u", kind->name, cfg->min_workers,
		    max);
	}
	p->st.kind = kind->name;
	p->st.target = p->min_workers;
	p->st.pool_registered = kind->step == NULL;
	p->st.action_mask = kind->actions;
	atomic_init(&p->closing, false);
	pthread_mutex_init(&p->mtx, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cv, &ca);
	pthread_condattr_destroy(&ca);
	rv = kind->init(&p->state, cfg, p);
	if (rv != CACHEW_OK)
		goto fail;
	if (kind->step != NULL) {
		if (pthread_create(&p->thread, NULL, prov_thread, p) != 0) {
			rv = cwi_fail(CACHEW_ENOMEM, "provisioner %s: cannot "
			    "start its thread", kind->name);
			goto fail;
		}
		p->has_thread = true;
	}
	*out = p;
	return CACHEW_OK;

fail:
	kind->fini(p->state);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mtx);
	free(p);
	return rv;
}

cachew_err
cwi_provisioner_set_target(cwi_provisioner *p, uint32_t n)
{
	if (atomic_load(&p->closing))
		return cwi_fail(CACHEW_ECLOSED, "provisioner %s: closing",
		    p->kind->name);
	pthread_mutex_lock(&p->mtx);
	p->st.target = clamp_target(p, n);
	p->target_gen++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mtx);
	return CACHEW_OK;
}

void
cwi_provisioner_status(cwi_provisioner *p, cwi_prov_status *st)
{
	pthread_mutex_lock(&p->mtx);
	*st = p->st;
	pthread_mutex_unlock(&p->mtx);
}

void
cwi_provisioner_destroy(cwi_provisioner *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mtx);
	atomic_store(&p->closing, true);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mtx);
	if (p->has_thread)
		pthread_join(p->thread, NULL);
	p->kind->fini(p->state);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mtx);
	free(p);
}

/* ---- static: the pool is whoever registered -------------------------------- */
/* It runs nothing, so its status leaves running at 0 with pool_registered
 * set: the dispatcher, which knows who registered, fills it in. */

static cachew_err
static_init(void **state, const cwi_prov_config *cfg, cwi_provisioner *p)
{
	(void)cfg;
	(void)p;
	*state = NULL;
	return CACHEW_OK;
}

static void
static_fini(void *state)
{
	(void)state;
}

const cwi_prov_kind cwi_prov_static = {
    .name = "static",
    .default_max = UINT32_MAX,
    .actions = 0, /* it takes none */
    .init = static_init,
    .step = NULL,
    .stop = NULL,
    .fini = static_fini,
};
