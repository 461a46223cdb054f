/*
 * service_config.h - the options of cachewd's roles. One table drives the
 * command-line flags, the config file and the CACHEW_* environment
 * (docs/cachewd.md lists it; `cachewd --help` prints it).
 *
 * Precedence, lowest first: built-in defaults, the config file
 * (--config PATH or CACHEW_CONFIG), the environment (CACHEW_<NAME>), flags.
 */
#ifndef CWI_SERVICE_CONFIG_H
#define CWI_SERVICE_CONFIG_H

#include "../core/core.h"
#include "../../transports/transport.h"

#include <stdio.h>

#define CWI_CFG_STR_MAX 512

typedef struct cwi_service_config {
	char role[16];                 /* dispatcher | worker */
	/* Operator plug-ins loaded at start, ':'-separated (each setting of
	 * `plugin` appends one; CACHEW_PLUGINS holds several). */
	char plugin[4 * CWI_CFG_STR_MAX];
	char listen[CWI_CFG_STR_MAX];  /* our address */
	char advertise[CWI_CFG_STR_MAX]; /* worker: address clients dial */
	char metrics_listen[CWI_CFG_STR_MAX]; /* HTTP host:port; "": none */
	char dispatcher[CWI_CFG_STR_MAX]; /* worker: the dispatcher */
	char work_dir[CWI_CFG_STR_MAX];   /* dispatcher: state, events log */
	char events_log[CWI_CFG_STR_MAX]; /* "" = <work_dir>/events.jsonl */
	char log_level[16];            /* error | warn | info | debug */
	int64_t threads;               /* worker: CPU budget; 0 = all */
	int64_t max_element_bytes;     /* worker: its pipelines' option */
	int64_t heartbeat_ms;
	int64_t worker_timeout_ms;     /* dispatcher: silent worker is dead */
	int64_t client_timeout_ms;     /* dispatcher: silent client is gone */
	int64_t max_message_bytes;     /* receive limit of every socket */
	int64_t max_connections;       /* per listener */
	int64_t drain_timeout_ms;      /* worker: SIGTERM drain bound */
	int64_t max_lease;             /* dispatcher: splits per lease */
	/* worker: how long it rides out an unreachable dispatcher (leases
	 * retried, tasks kept) */
	int64_t dispatcher_absence_ms;
	/* dispatcher: the journal in <work_dir>/journal (docs/journal.md) */
	int64_t journal;               /* 0: off (state dies with it) */
	int64_t journal_discard;       /* 1: set the old state aside */
	int64_t snapshot_records;      /* fold into a snapshot this often */
	int64_t journal_verify;        /* 1: replay it at stop and compare */
	/* dispatcher: the policy engine and the provisioner */
	char scale_policy[64];         /* jobs' default scale policy */
	int64_t decision_interval_ms;  /* 0 = heartbeat_ms */
	int64_t scale_window_batches;  /* batches per measurement window */
	int64_t scale_discard_epoch;   /* batches ignored at an epoch start */
	int64_t scale_discard_change;  /* batches ignored after a change */
	int64_t scale_cooldown_ms;     /* at least this between changes */
	int64_t min_workers;           /* pool target bounds */
	int64_t max_workers;           /* 0 = the provisioner's default */
	int64_t splits_per_worker;     /* a job's splits per worker */
	char provisioner[16];          /* static | process | kubernetes */
	char worker_bin[CWI_CFG_STR_MAX];  /* process: "" = this binary */
	int64_t worker_threads;        /* process: --threads; 0 = leave out */
	char worker_log_dir[CWI_CFG_STR_MAX]; /* "" = <work_dir>/workers */
	int64_t worker_stop_timeout_ms; /* process: SIGTERM -> SIGKILL */
	char k8s_api_url[CWI_CFG_STR_MAX];
	char k8s_token_file[CWI_CFG_STR_MAX];
	char k8s_ca_file[CWI_CFG_STR_MAX];
	char k8s_namespace[CWI_CFG_STR_MAX];
	char k8s_deployment[CWI_CFG_STR_MAX];
	/* TLS of tls+tcp:// listeners and dialers (PEM file paths) */
	char tls_cert[CWI_CFG_STR_MAX];
	char tls_key[CWI_CFG_STR_MAX];
	char tls_ca[CWI_CFG_STR_MAX];
	char tls_client_auth[16];      /* none | optional | required */
	char tls_server_name[CWI_CFG_STR_MAX];
	/* authentication (docs/security.md) */
	char auth_tokens[CWI_CFG_STR_MAX]; /* dispatcher: the token file */
	char token_file[CWI_CFG_STR_MAX];  /* worker: its own token */
	int64_t insecure;              /* dispatcher: non-loopback, no tokens */
	/* dispatcher: autocaching (off without a cache root). Worker: the
	 * places its pipelines write, ','-separated (io_policy.h). */
	char cache_root[4 * CWI_CFG_STR_MAX];
	char autocache[16];            /* default|cachew|compute|source|full */
	int64_t cache_capacity;        /* bytes; 0 = unbounded */
	int64_t allow_frozen_random;   /* 1: cache after random operators */
	int64_t expected_epochs;       /* passes a pipeline is expected to run */
	/* worker: what its pipelines may read, ','-separated directories
	 * and URL prefixes (io_policy.h) */
	char allow_read[4 * CWI_CFG_STR_MAX];
	char user[64];                 /* "" = stay who we are */
	/* Not in the table. Dispatcher: the policy engine sizes jobs and
	 * shares the workers among them (true by default). The embedded
	 * service turns it off: every job then runs on every worker. */
	bool policy_engine;
	/* Not in the table. Worker: its pipelines touch only what
	 * allow_read and cache_root allow (cwi_worker_confine). cachewd
	 * sets it; the embedded service leaves it false: its pipelines
	 * belong to the user whose process it is. */
	bool confined;
} cwi_service_config;

void cwi_service_config_defaults(cwi_service_config *c);
/* Sets one option from text ("heartbeat_ms", "500"); `origin` names where
 * the value came from in the error ("--heartbeat-ms", "CACHEW_HEARTBEAT_MS",
 * "cachewd.conf:3"). CACHEW_ENOENT for an unknown name, CACHEW_EINVAL for
 * a bad value, with a cwi_fail message. */
cachew_err cwi_service_config_set(cwi_service_config *c, const char *name,
    const char *text, const char *origin);
/* Reads `name = value` lines (# comments, blank lines) from path. */
cachew_err cwi_service_config_file(cwi_service_config *c, const char *path);
/* Applies every CACHEW_<NAME> variable that is set. */
cachew_err cwi_service_config_env(cwi_service_config *c);
/* Checks cross-option rules for the role (a worker needs a dispatcher). */
cachew_err cwi_service_config_check(const cwi_service_config *c);
/* Loads the operator plug-ins of c->plugin (cachew_plugin_load), in order;
 * the first that fails is the error, naming its path. */
cachew_err cwi_service_config_load_plugins(const cwi_service_config *c);
/* Fills t's TLS fields from c (borrowed: valid while c is): what the
 * role's listener and its dial of the dispatcher use for tls+tcp URLs. */
void cwi_service_config_tls(const cwi_service_config *c,
    cwi_transport_opts *t);
/* Prints the table (flag, environment variable, default, meaning). */
void cwi_service_config_print(FILE *out);

#endif /* CWI_SERVICE_CONFIG_H */
