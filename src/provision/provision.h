/*
 * provision.h - provisioners: turn a total worker target into running
 * workers.
 *
 * The dispatcher decides how many workers all jobs together should have
 * (the sum of the scalers' decisions, within the pool bounds) and hands the
 * number to its provisioner. Each provisioner is a static const ops table
 * registered by name, like a transport:
 * - "static": the pool is whatever workers registered; set_target only
 *   records the number (status shows the shortfall), and running is the
 *   dispatcher's to fill (pool_registered).
 * - "process": starts `cachewd --role=worker` processes on this host up to
 *   the target (at most max_workers) and stops the newest ones beyond it
 *   with SIGTERM (they drain: finish leased splits, deregister, exit 0),
 *   SIGKILL after stop_timeout_ms. Reaps its children; a child that dies
 *   is started again while the target wants it (after a backoff that
 *   doubles with each quick death, so a crashing worker is not a fork
 *   loop).
 * - "kubernetes": PATCHes the scale subresource of a Deployment
 *   (apps/v1) over HTTPS with libcurl: 409/429/5xx and transport errors
 *   retried with exponential backoff, 401/403 reported and not retried
 *   until the token file changes. Token re-read when its file changes.
 *
 * set_target never blocks on the outside world: the work happens on the
 * provisioner's own thread, and the latest target wins. ("static" has no
 * outside world and so no thread.) docs/provisioners.md is the user's view.
 *
 * Thread safety: every call is safe from any thread, except destroy.
 */
#ifndef CWI_PROVISION_H
#define CWI_PROVISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachew.h"

/* A string that is NULL or "" is unset (option tables keep strings in
 * fixed arrays). */
typedef struct cwi_prov_config {
	const char *kind;        /* "static", "process" or "kubernetes" */
	uint32_t min_workers;    /* never ask for fewer (0) */
	uint32_t max_workers;    /* never ask for more (0 = the kind's
				  * default: process 8, kubernetes 1000,
				  * static unbounded) */
	/* process */
	const char *cachewd;     /* path of the cachewd binary ("cachewd" on
				  * PATH when NULL) */
	const char *dispatcher;  /* URL the workers register with */
	const char *worker_listen; /* listen URL for each worker
				    * ("tcp://127.0.0.1:0") */
	const char *const *worker_args; /* extra arguments, NULL-terminated
					 * (e.g. "--threads", "1") */
	const char *log_dir;     /* each worker's stdout and stderr go to
				  * log_dir/worker-<slot>.log, appended, slot
				  * 1..max_workers (NULL: inherited) */
	uint32_t stop_timeout_ms; /* SIGTERM -> SIGKILL (10000) */
	/* kubernetes (NULLs take the in-cluster defaults) */
	const char *api_url;     /* https://$KUBERNETES_SERVICE_HOST:
				  * $KUBERNETES_SERVICE_PORT */
	const char *token_file;  /* /var/run/secrets/kubernetes.io/
				  * serviceaccount/token */
	const char *ca_file;     /* .../serviceaccount/ca.crt when it exists,
				  * else libcurl's default bundle */
	const char *k8s_namespace; /* .../serviceaccount/namespace, else
				    * "default" */
	const char *deployment;  /* "cachew-worker" */
	uint32_t retry_max_ms;   /* backoff cap (30000); also caps the
				  * process kind's restart backoff */
	uint32_t request_timeout_ms; /* kubernetes: one PATCH, connection
				      * included (10000) */
} cwi_prov_config;

/* Fills c with the defaults above for kind "static". */
void cwi_prov_config_default(cwi_prov_config *c);

/* What a provisioner did, by kind of action (the label of
 * cachew_provisioner_actions_total: a fixed set, so a bounded one). */
typedef enum cwi_prov_action {
	CWI_PROV_START,   /* process: a worker started for the target */
	CWI_PROV_RESTART, /* process: a worker that died started again */
	CWI_PROV_STOP,    /* process: a worker sent SIGTERM */
	CWI_PROV_SCALE,   /* kubernetes: a PATCH of the replicas */
	CWI_PROV_NACTIONS,
	/* cwi_prov_note_failure's: the failure of an action counted
	 * before (a started worker that died), not a new one. */
	CWI_PROV_EARLIER = CWI_PROV_NACTIONS
} cwi_prov_action;

/* "start", "restart", "stop", "scale" (a static string). */
const char *cwi_prov_action_name(cwi_prov_action a);

typedef struct cwi_prov_status {
	const char *kind;   /* static string */
	uint32_t target;    /* last target asked for (after the bounds) */
	uint32_t running;   /* process: live children not being stopped;
			     * kubernetes: the replicas last acknowledged by
			     * the API server (status.replicas, else
			     * spec.replicas); static: 0, see
			     * pool_registered */
	/* static: the provisioner runs nothing, so it cannot say how many
	 * run: the pool is whoever registered, which only the dispatcher
	 * knows (it reports its live workers as running). Reporting the
	 * target instead showed 8 running beside 1 live worker. */
	bool pool_registered;
	uint32_t stopping;  /* process: children sent SIGTERM and not yet
			     * reaped; 0 for the other kinds */
	uint64_t requests;  /* actions taken: processes started/stopped,
			     * PATCH requests sent (the sum of actions) */
	/* requests by kind of action and result ([a][0] succeeded,
	 * [a][1] failed as it was taken); action_mask has bit a set for
	 * each action the kind takes (the series shown even at 0). */
	uint64_t actions[CWI_PROV_NACTIONS][2];
	uint32_t action_mask;
	uint64_t failures;  /* of those, failed (process: a child that died
			     * unasked or did not exit 0 when stopped counts
			     * against its start or stop) */
	char last_error[512]; /* the latest failure; emptied by the next
			       * action that succeeds (process: a start or
			       * stop asked by a target change; restarting a
			       * dead worker does not empty it, so a crash
			       * stays visible) */
} cwi_prov_status;

typedef struct cwi_provisioner cwi_provisioner;

/* Creates a provisioner of cfg->kind (strings are copied) and starts its
 * thread. CACHEW_ENOENT for an unknown kind, CACHEW_EINVAL for a missing
 * or bad setting (each named in cachew_errmsg()), CACHEW_ENOMEM. The
 * target starts at min_workers: the process kind starts that many workers
 * at once; the kubernetes kind sends nothing before the first set_target,
 * so a restarted dispatcher leaves a running Deployment alone. */
cachew_err cwi_provisioner_create(cwi_provisioner **out,
    const cwi_prov_config *cfg);

/* Asks for n workers in total (clamped to [min_workers, max_workers]).
 * Returns at once; CACHEW_ECLOSED after destroy began. */
cachew_err cwi_provisioner_set_target(cwi_provisioner *p, uint32_t n);

/* A snapshot of what the provisioner did. */
void cwi_provisioner_status(cwi_provisioner *p, cwi_prov_status *st);

/* Stops the thread. process: SIGTERM to every child, then SIGKILL to those
 * alive after stop_timeout_ms, and reaps them all. kubernetes and static
 * leave the outside world as it is (a PATCH in flight is abandoned). NULL
 * is a no-op. */
void cwi_provisioner_destroy(cwi_provisioner *p);

/* ---- for the kinds (provision_<kind>.c) ---------------------------------
 *
 * A kind is a static const table registered in provision.c. Its state is
 * touched by init (the creating thread), then by step and stop (the
 * provisioner's thread) and last by fini (the destroying thread, after the
 * thread was joined): it needs no lock of its own. A kind reports through
 * the cwi_prov_* calls below, which take the provisioner's lock briefly
 * and never call out while holding it. */

/* step's answer when only a new target (or destroy) can change anything. */
#define CWI_PROV_IDLE UINT64_MAX

typedef struct cwi_prov_kind {
	const char *name;
	uint32_t default_max; /* max_workers when the config says 0 */
	uint32_t actions;     /* bit a set for each cwi_prov_action a it
			       * takes */
	/* Does nothing until the first set_target (kubernetes: a restarted
	 * dispatcher must not scale a running Deployment to min_workers
	 * before its policy has spoken). */
	bool wait_first_target;
	/* Checks cfg and builds the state; CACHEW_EINVAL naming the bad
	 * setting. */
	cachew_err (*init)(void **state, const cwi_prov_config *cfg,
	    cwi_provisioner *p);
	/* Moves the outside world toward target. Returns the milliseconds
	 * after which it wants to be called again when the target does not
	 * change (0: at once), or CWI_PROV_IDLE. NULL: the kind has no
	 * thread (static). */
	uint64_t (*step)(void *state, uint32_t target);
	/* Destroy began: leave the outside world in its final state (on the
	 * thread, bounded). May be NULL. */
	void (*stop)(void *state);
	/* Frees the state (NULL is a no-op). */
	void (*fini)(void *state);
} cwi_prov_kind;

extern const cwi_prov_kind cwi_prov_static;
extern const cwi_prov_kind cwi_prov_process;
extern const cwi_prov_kind cwi_prov_kubernetes;

/* Records the workers that exist now. */
void cwi_prov_set_running(cwi_provisioner *p, uint32_t running,
    uint32_t stopping);
/* Counts one action a that succeeded; clear_error empties last_error. */
void cwi_prov_note_request(cwi_provisioner *p, cwi_prov_action a,
    bool clear_error);
/* Counts one failure (of a new action a that failed, or with
 * CWI_PROV_EARLIER of one already counted) and makes the message
 * last_error; also logged as a warning under "provision". */
void cwi_prov_note_failure(cwi_provisioner *p, cwi_prov_action a,
    const char *fmt, ...) CACHEW_PRINTF(3, 4);
/* True once destroy began: a long step (a PATCH) gives up early. */
bool cwi_prov_closing(cwi_provisioner *p);

/* The kubernetes kind's reading of an API server reply (body: len bytes,
 * outside input, NUL not required, parsed by jansson: io_json.h). The
 * replicas of a Scale object: status.replicas, else spec.replicas when
 * status has none; false when the reply is not JSON or the field read is
 * not an integer in [0, 2^32), with why naming the field ("status.replicas
 * is a string, not an integer"). A Status's top-level message into buf
 * (control characters become ' ', cut to buflen at a UTF-8 character's
 * start); false when there is none. Exposed for the tests. */
bool cwi_k8s_scale_replicas(const char *body, size_t len,
    uint32_t *replicas, char *why, size_t whylen);
bool cwi_k8s_status_message(const char *body, size_t len, char *buf,
    size_t buflen);

#endif /* CWI_PROVISION_H */
