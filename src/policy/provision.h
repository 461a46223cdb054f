/*
 * provision.h - provisioners: turn a total worker target into running
 * workers.
 *
 * The dispatcher decides how many workers all jobs together should have
 * (the sum of the scalers' decisions, within the pool bounds) and hands the
 * number to its provisioner. Each provisioner is a static const ops table
 * registered by name, like a transport:
 * - "static": the pool is whatever workers registered; set_target only
 *   records the number (status shows the shortfall).
 * - "process": starts `cachewd --role=worker` processes on this host up to
 *   the target (at most max_workers) and stops the newest ones beyond it
 *   with SIGTERM (they drain: finish leased splits, deregister, exit 0),
 *   SIGKILL after stop_timeout_ms. Reaps its children; a child that dies
 *   is started again while the target wants it.
 * - "kubernetes": PATCHes the scale subresource of a Deployment
 *   (apps/v1) over HTTPS with libcurl: 409/429/5xx and transport errors
 *   retried with exponential backoff, 401/403 reported and not retried
 *   until the token file changes. Token re-read when its file changes.
 *
 * set_target never blocks on the outside world: the work happens on the
 * provisioner's own thread, and the latest target wins.
 *
 * Thread safety: every call is safe from any thread, except destroy.
 */
#ifndef CWI_PROVISION_H
#define CWI_PROVISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachew.h"

typedef struct cwi_prov_config {
	const char *kind;        /* "static", "process" or "kubernetes" */
	uint32_t min_workers;    /* never ask for fewer (0) */
	uint32_t max_workers;    /* never ask for more (process: 8;
				  * 0 = the kind's default) */
	/* process */
	const char *cachewd;     /* path of the cachewd binary ("cachewd" on
				  * PATH when NULL) */
	const char *dispatcher;  /* URL the workers register with */
	const char *worker_listen; /* listen URL for each worker
				    * ("tcp://127.0.0.1:0") */
	const char *const *worker_args; /* extra arguments, NULL-terminated
					 * (e.g. "--threads", "1") */
	const char *log_dir;     /* each worker's stderr goes to
				  * log_dir/worker-<n>.log (NULL: inherited) */
	uint32_t stop_timeout_ms; /* SIGTERM -> SIGKILL (10000) */
	/* kubernetes (NULLs take the in-cluster defaults) */
	const char *api_url;     /* https://$KUBERNETES_SERVICE_HOST:
				  * $KUBERNETES_SERVICE_PORT */
	const char *token_file;  /* /var/run/secrets/kubernetes.io/
				  * serviceaccount/token */
	const char *ca_file;     /* .../serviceaccount/ca.crt */
	const char *k8s_namespace; /* .../serviceaccount/namespace */
	const char *deployment;  /* "cachew-worker" */
	uint32_t retry_max_ms;   /* backoff cap (30000) */
} cwi_prov_config;

/* Fills c with the defaults above for kind "static". */
void cwi_prov_config_default(cwi_prov_config *c);

typedef struct cwi_prov_status {
	const char *kind;   /* static string */
	uint32_t target;    /* last target asked for (after the bounds) */
	uint32_t running;   /* process: live children; kubernetes: the
			     * replicas last acknowledged by the API server;
			     * static: the target */
	uint64_t requests;  /* actions taken: processes started/stopped,
			     * PATCH requests sent */
	uint64_t failures;  /* of those, failed */
	char last_error[256]; /* empty when the last action succeeded */
} cwi_prov_status;

typedef struct cwi_provisioner cwi_provisioner;

/* Creates a provisioner of cfg->kind (strings are copied) and starts its
 * thread. CACHEW_ENOENT for an unknown kind, CACHEW_EINVAL for a missing
 * or bad setting (each named in cachew_errmsg()), CACHEW_ENOMEM. */
cachew_err cwi_provisioner_create(cwi_provisioner **out,
    const cwi_prov_config *cfg);

/* Asks for n workers in total (clamped to [min_workers, max_workers]).
 * Returns at once; CACHEW_ECLOSED after destroy began. */
cachew_err cwi_provisioner_set_target(cwi_provisioner *p, uint32_t n);

/* A snapshot of what the provisioner did. */
void cwi_provisioner_status(cwi_provisioner *p, cwi_prov_status *st);

/* Stops the thread. process: SIGTERM to every child, then SIGKILL to those
 * alive after stop_timeout_ms, and reaps them all. kubernetes and static
 * leave the outside world as it is. NULL is a no-op. */
void cwi_provisioner_destroy(cwi_provisioner *p);

#endif /* CWI_PROVISION_H */
