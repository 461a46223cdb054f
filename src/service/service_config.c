/*
 * service_config.c - cachewd's option table: flags, config file and
 * environment from one table (redis-style).
 */
#include "service_config.h"
#include "../policy/scale.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* CFG_LIST: a string to which every setting appends one item, ':'
 * separated (CFG_URLS: ',', for items that may be URLs); its environment
 * variable is its plural, and the singular adds one item. */
typedef enum cfg_type { CFG_STR, CFG_INT, CFG_LIST, CFG_URLS } cfg_type;

typedef struct cfg_spec {
	const char *name;
	cfg_type type;
	size_t offset;
	size_t size;         /* CFG_STR: capacity of the field */
	const char *def;     /* default as text */
	int64_t min, max;    /* CFG_INT */
	const char *const *choices; /* CFG_STR: NULL-terminated, or NULL */
	const char *help;
} cfg_spec;

#define STR(f) CFG_STR, offsetof(cwi_service_config, f), \
	sizeof(((cwi_service_config *)0)->f)
#define INT(f) CFG_INT, offsetof(cwi_service_config, f), 0
#define LIST(f) CFG_LIST, offsetof(cwi_service_config, f), \
	sizeof(((cwi_service_config *)0)->f)
#define URLS(f) CFG_URLS, offsetof(cwi_service_config, f), \
	sizeof(((cwi_service_config *)0)->f)

static const char *const roles[] = {"dispatcher", "worker", NULL};
static const char *const levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const provisioners[] = {"static", "process", "kubernetes",
    NULL};
static const char *const autocache_policies[] = {"default", "cachew",
    "compute", "source", "full", NULL};
static const char *const client_auths[] = {"none", "optional", "required",
    NULL};

static const cfg_spec table[] = {
    {"role", STR(role), "", 0, 0, roles,
	"dispatcher or worker (required)"},
    {"plugin", LIST(plugin), "", 0, 0, NULL,
	"an operator plug-in (.so) to load at start, so that pipelines "
	"using its functions run here; repeatable (CACHEW_PLUGINS: several, "
	"':'-separated). Clients load the same file"},
    {"listen", STR(listen), "", 0, 0, NULL,
	"address to listen on: tcp://host:port (port 0 = any), "
	"tls+tcp://host:port (TLS: needs tls_cert and tls_key), ipc:///path; "
	"default tcp://0.0.0.0:7070 for a dispatcher, tcp://127.0.0.1:0 for "
	"a worker"},
    {"advertise", STR(advertise), "", 0, 0, NULL,
	"worker: the address clients dial (default: the bound listen "
	"address)"},
    {"metrics_listen", STR(metrics_listen), "", 0, 0, NULL,
	"HTTP address (host:port, port 0 = any) serving /metrics "
	"(Prometheus text format), /healthz and /readyz; empty = none"},
    {"dispatcher", STR(dispatcher), "", 0, 0, NULL,
	"worker: the dispatcher's address (required for a worker)"},
    {"work_dir", STR(work_dir), "", 0, 0, NULL,
	"dispatcher: directory for state and the events log (created; "
	"empty = none kept)"},
    {"events_log", STR(events_log), "", 0, 0, NULL,
	"dispatcher: JSON-lines events file (default <work_dir>/events.jsonl; "
	"'-' = stderr)"},
    {"log_level", STR(log_level), "info", 0, 0, levels,
	"stderr log level: error, warn, info or debug"},
    {"threads", INT(threads), "0", 0, 1024, NULL,
	"worker: CPU budget of its pipelines (0 = online CPUs)"},
    {"max_element_bytes", INT(max_element_bytes), "1073741824", 4096,
	INT64_MAX, NULL,
	"worker: bytes an operator of its pipelines may allocate for one "
	"element (read_file, resize, decode_jpeg, batch...); over it the "
	"element fails with ERANGE. A client's own setting does not raise "
	"it"},
    {"heartbeat_ms", INT(heartbeat_ms), "500", 10, 600000, NULL,
	"heartbeat interval of workers and clients"},
    {"worker_timeout_ms", INT(worker_timeout_ms), "5000", 50, 86400000,
	NULL, "dispatcher: a worker silent this long is dead"},
    {"client_timeout_ms", INT(client_timeout_ms), "30000", 50, 86400000,
	NULL, "dispatcher: a client silent this long has left its job"},
    {"max_message_bytes", INT(max_message_bytes), "268435456", 4096,
	(int64_t)1 << 32, NULL,
	"largest message any socket accepts; larger ones close the peer"},
    {"max_connections", INT(max_connections), "1024", 1, 1000000, NULL,
	"connections a listener accepts before refusing new ones"},
    {"max_lease", INT(max_lease), "4", 1, 1048576, NULL,
	"dispatcher: most splits one lease request takes (fewer when less "
	"than a fair share is left)"},
    {"dispatcher_absence_ms", INT(dispatcher_absence_ms), "60000", 0,
	86400000, NULL, "worker: how long an unreachable dispatcher is "
	"ridden out (tasks kept, leases retried) before tasks fail"},
    {"journal", INT(journal), "1", 0, 1, NULL,
	"dispatcher: keep a journal of its state in <work_dir>/journal and "
	"recover it at start (needs a work_dir; docs/journal.md)"},
    {"journal_discard", INT(journal_discard), "0", 0, 1, NULL,
	"dispatcher: start empty, setting the journal's old files aside "
	"(for a journal that refuses to load)"},
    {"snapshot_records", INT(snapshot_records), "100000", 16, 1000000000,
	NULL, "dispatcher: fold the journal into a snapshot after this many "
	"records"},
    {"journal_verify", INT(journal_verify), "0", 0, 1, NULL,
	"dispatcher: a check for tests: at a clean stop, replay the journal "
	"into a new state and log event=journal_verified or "
	"event=journal_verify_failed"},
    {"drain_timeout_ms", INT(drain_timeout_ms), "60000", 0, 86400000, NULL,
	"worker: on SIGTERM, how long to finish leased splits before exiting"},
    {"scale_policy", STR(scale_policy), "model", 0, 0, NULL,
	"dispatcher: how jobs that name no policy are sized: model, cachew, "
	"fixed:N or hpa:P (docs/policies.md)"},
    {"decision_interval_ms", INT(decision_interval_ms), "0", 0, 3600000,
	NULL, "dispatcher: one autoscaling decision per job this often "
	"(0 = heartbeat_ms)"},
    {"scale_window_batches", INT(scale_window_batches), "500", 1, 1000000,
	NULL, "dispatcher: batches per autoscaling measurement window "
	"(Cachew: 500)"},
    {"scale_discard_epoch", INT(scale_discard_epoch), "200", 0, 1000000,
	NULL, "dispatcher: batches not measured at an epoch's start "
	"(Cachew: 200)"},
    {"scale_discard_change", INT(scale_discard_change), "150", 0, 1000000,
	NULL, "dispatcher: batches not measured after a worker count change "
	"(Cachew: 150)"},
    {"scale_cooldown_ms", INT(scale_cooldown_ms), "0", 0, 86400000, NULL,
	"dispatcher: at least this long between two changes of a job's "
	"worker count"},
    {"min_workers", INT(min_workers), "0", 0, 65536, NULL,
	"dispatcher: the pool target never falls below this"},
    {"max_workers", INT(max_workers), "0", 0, 65536, NULL,
	"dispatcher: the pool target (and any job) never exceeds this "
	"(0 = no bound; the process provisioner's own default is 8)"},
    {"splits_per_worker", INT(splits_per_worker), "8", 1, 65536, NULL,
	"dispatcher: a distributed_epoch job's input is cut into this many "
	"splits per available worker (at most 2^20): more make a worker's "
	"death and a resumed position cheaper, fewer cost less bookkeeping"},
    {"provisioner", STR(provisioner), "static", 0, 0, provisioners,
	"dispatcher: how the pool target becomes workers: static (workers "
	"started by you), process (cachewd workers on this host), kubernetes "
	"(a Deployment's replicas)"},
    {"worker_bin", STR(worker_bin), "", 0, 0, NULL,
	"process provisioner: the cachewd binary to start (default: this "
	"one, /proc/self/exe)"},
    {"worker_threads", INT(worker_threads), "0", 0, 1024, NULL,
	"process provisioner: --threads of each worker (0 = left out)"},
    {"worker_log_dir", STR(worker_log_dir), "", 0, 0, NULL,
	"process provisioner: each worker's stderr goes to "
	"<dir>/worker-<n>.log (default <work_dir>/workers; inherited "
	"without a work_dir)"},
    {"worker_stop_timeout_ms", INT(worker_stop_timeout_ms), "10000", 0,
	86400000, NULL,
	"process provisioner: a stopped worker gets SIGTERM (it drains), "
	"then SIGKILL after this long"},
    {"k8s_api_url", STR(k8s_api_url), "", 0, 0, NULL,
	"kubernetes provisioner: API server URL (default https://"
	"$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)"},
    {"k8s_token_file", STR(k8s_token_file), "", 0, 0, NULL,
	"kubernetes provisioner: bearer token file (default the service "
	"account's)"},
    {"k8s_ca_file", STR(k8s_ca_file), "", 0, 0, NULL,
	"kubernetes provisioner: CA bundle (default the service account's)"},
    {"k8s_namespace", STR(k8s_namespace), "", 0, 0, NULL,
	"kubernetes provisioner: namespace (default the service account's)"},
    {"k8s_deployment", STR(k8s_deployment), "", 0, 0, NULL,
	"kubernetes provisioner: the worker Deployment (default "
	"cachew-worker)"},
    {"auth_tokens", STR(auth_tokens), "", 0, 0, NULL,
	"dispatcher: a file of '<role> <name> <token>' lines (role client, "
	"worker or admin; mode 600): every request must then carry one of "
	"the tokens (docs/security.md)"},
    {"token_file", STR(token_file), "", 0, 0, NULL,
	"worker: a file whose first line is the worker's token, sent to "
	"the dispatcher (one with --auth-tokens); process provisioner: the "
	"same, given to the workers it starts"},
    {"insecure", INT(insecure), "0", 0, 1, NULL,
	"dispatcher: 1 lets it listen on a non-loopback address without "
	"--auth-tokens (anyone who reaches it may do anything)"},
    {"tls_cert", STR(tls_cert), "", 0, 0, NULL,
	"TLS: this daemon's certificate (PEM; a chain may follow it): what a "
	"tls+tcp:// listener shows, and a worker shows a dispatcher that "
	"asks for client certificates"},
    {"tls_key", STR(tls_key), "", 0, 0, NULL,
	"TLS: the private key of tls_cert (PEM, unencrypted)"},
    {"tls_ca", STR(tls_ca), "", 0, 0, NULL,
	"TLS: the CA certificates (PEM) that sign peers' certificates: a "
	"worker's dispatcher's, and clients' when tls_client_auth is set"},
    {"tls_client_auth", STR(tls_client_auth), "none", 0, 0, client_auths,
	"TLS: whether clients (and workers) must show a certificate signed "
	"by tls_ca: none, optional (checked when shown) or required "
	"(mutual TLS)"},
    {"tls_server_name", STR(tls_server_name), "", 0, 0, NULL,
	"TLS, worker: the name the dispatcher's certificate must carry "
	"(default: the host of --dispatcher)"},
    {"cache_root", URLS(cache_root), "", 0, 0, NULL,
	"dispatcher: turns autocaching on: the cache root (a directory on "
	"storage every worker mounts at the same path, or s3://bucket/prefix) "
	"where jobs' pipelines are cached (docs/autocaching.md). Worker: a "
	"place its pipelines may write (cache_put, cache, autocache, "
	"tfrecord_write), created if missing; repeatable (CACHEW_CACHE_ROOTS: "
	"several, ','-separated); none: it writes nothing"},
    {"allow_read", URLS(allow_read), "", 0, 0, NULL,
	"worker: a local directory or URL prefix (s3://bucket/, "
	"https://host/path/) its pipelines may read; repeatable "
	"(CACHEW_ALLOW_READS: several, ','-separated). None: it reads "
	"nothing but its cache roots, fetches no URL; private addresses only "
	"through a prefix naming them (docs/security.md). The process "
	"provisioner passes the dispatcher's to its workers"},
    {"user", STR(user), "", 0, 0, NULL,
	"run as this user: a worker switches after binding its listener, a "
	"dispatcher before opening its work dir; needs root"},
    {"autocache", STR(autocache), "default", 0, 0, autocache_policies,
	"dispatcher: where pipelines are cached: default (the cost model), "
	"cachew (Cachew's rule), or the fixed compute, source (the first "
	"autocache marker) or full (the pipeline end)"},
    {"cache_capacity", INT(cache_capacity), "0", 0, INT64_MAX, NULL,
	"dispatcher: bytes the cache root may hold (0 = no bound); a cache "
	"that does not fit is not chosen. Worker: bytes each cache root may "
	"hold, whatever a pipeline's capacity says (0 = what its caches hold "
	"at start plus 90% of its file system's free space)"},
    {"allow_frozen_random", INT(allow_frozen_random), "0", 0, 1, NULL,
	"dispatcher: 1 lets autocaching cache after a random operator (its "
	"one draw is then replayed every epoch)"},
    {"expected_epochs", INT(expected_epochs), "10", 1, 1000000, NULL,
	"dispatcher: passes a pipeline is expected to run, which a cache's "
	"write cost is spread over"},
};

#define NCFG (sizeof(table) / sizeof(table[0]))

static int
is_list(const cfg_spec *s)
{
	return s->type == CFG_LIST || s->type == CFG_URLS;
}

static const cfg_spec *
find(const char *name)
{
	for (size_t i = 0; i < NCFG; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

void
cwi_service_config_defaults(cwi_service_config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < NCFG; i++)
		(void)cwi_service_config_set(c, table[i].name, table[i].def,
		    "default");
	c->policy_engine = true;
	cwi_clear_errmsg();
}

static cachew_err
set_str(cwi_service_config *c, const cfg_spec *s, const char *text,
    const char *origin)
{
	if (strlen(text) >= s->size)
		return cwi_fail(CACHEW_EINVAL, "%s: %s is longer than %zu bytes",
		    origin, s->name, s->size - 1);
	if (s->choices != NULL && text[0] != '\0') {
		size_t i = 0;
		while (s->choices[i] != NULL && strcmp(s->choices[i], text) != 0)
			i++;
		if (s->choices[i] == NULL) {
			char list[96] = "";
			for (i = 0; s->choices[i] != NULL; i++)
				snprintf(list + strlen(list),
				    sizeof(list) - strlen(list), "%s%s",
				    i > 0 ? ", " : "", s->choices[i]);
			return cwi_fail(CACHEW_EINVAL,
			    "%s: %s must be one of %s, not '%s'", origin,
			    s->name, list, text);
		}
	}
	memcpy((char *)c + s->offset, text, strlen(text) + 1);
	return CACHEW_OK;
}

static cachew_err
set_int(cwi_service_config *c, const cfg_spec *s, const char *text,
    const char *origin)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0')
		return cwi_fail(CACHEW_EINVAL, "%s: %s needs an integer, not '%s'",
		    origin, s->name, text);
	if (v < s->min || v > s->max)
		return cwi_fail(CACHEW_EINVAL,
		    "%s: %s must be in [%lld, %lld], not %lld", origin, s->name,
		    (long long)s->min, (long long)s->max, v);
	*(int64_t *)(void *)((char *)c + s->offset) = (int64_t)v;
	return CACHEW_OK;
}

/* Appends text to a list option (':' between items). */
static cachew_err
add_item(cwi_service_config *c, const cfg_spec *s, const char *text,
    const char *origin)
{
	char *list = (char *)c + s->offset;
	size_t len = strlen(list);

	if (text[0] == '\0')
		return CACHEW_OK;
	if (len + (len > 0) + strlen(text) >= s->size)
		return cwi_fail(CACHEW_EINVAL, "%s: %s: the list is longer than "
		    "%zu bytes", origin, s->name, s->size - 1);
	if (len > 0)
		list[len++] = s->type == CFG_URLS ? ',' : ':';
	memcpy(list + len, text, strlen(text) + 1);
	return CACHEW_OK;
}

cachew_err
cwi_service_config_set(cwi_service_config *c, const char *name,
    const char *text, const char *origin)
{
	const cfg_spec *s = find(name);

	if (s == NULL)
		return cwi_fail(CACHEW_ENOENT, "%s: unknown option '%s'", origin,
		    name);
	if (is_list(s))
		return add_item(c, s, text, origin);
	return s->type == CFG_STR ? set_str(c, s, text, origin)
				  : set_int(c, s, text, origin);
}

cachew_err
cwi_service_config_load_plugins(const cwi_service_config *c)
{
	char list[sizeof(c->plugin)], *save = NULL;

	memcpy(list, c->plugin, sizeof(list));
	for (char *p = strtok_r(list, ":", &save); p != NULL;
	     p = strtok_r(NULL, ":", &save)) {
		cachew_err rv = cachew_plugin_load(p);
		if (rv != CACHEW_OK)
			return cwi_fail(rv, "plugin %s: %s", p, cwi_errmsg_get());
		cwi_log(CACHEW_LOG_INFO, c->role, "event=plugin_loaded "
		    "path=%s", p);
	}
	return CACHEW_OK;
}

static char *
trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

cachew_err
cwi_service_config_file(cwi_service_config *c, const char *path)
{
	char line[1024], origin[600];
	cachew_err rv = CACHEW_OK;
	int lineno = 0;
	FILE *f = fopen(path, "r");
	struct stat st;

	if (f == NULL)
		return cwi_fail(CACHEW_ENOENT, "config file %s: %s", path,
		    strerror(errno));
	/* A directory opens for reading and reads as nothing: an empty
	 * configuration the user did not mean. */
	if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fclose(f);
		return cwi_fail(CACHEW_EINVAL, "config file %s: is a directory",
		    path);
	}
	while (rv == CACHEW_OK && fgets(line, sizeof(line), f) != NULL) {
		char *p, *eq, *name, *value;

		lineno++;
		snprintf(origin, sizeof(origin), "%s:%d", path, lineno);
		if (strchr(line, '\n') == NULL && !feof(f)) {
			rv = cwi_fail(CACHEW_EINVAL, "%s: line too long", origin);
			break;
		}
		p = line;
		if ((eq = strchr(p, '#')) != NULL)
			*eq = '\0';
		p = trim(p);
		if (*p == '\0')
			continue;
		eq = strchr(p, '=');
		if (eq == NULL) {
			rv = cwi_fail(CACHEW_EINVAL,
			    "%s: expected 'name = value', got '%s'", origin, p);
			break;
		}
		*eq = '\0';
		name = trim(p);
		value = trim(eq + 1);
		/* Accept the flag spelling too: listen-address == listen_address. */
		for (char *q = name; *q != '\0'; q++)
			if (*q == '-')
				*q = '_';
		rv = cwi_service_config_set(c, name, value, origin);
	}
	fclose(f);
	return rv;
}

cachew_err
cwi_service_config_env(cwi_service_config *c)
{
	for (size_t i = 0; i < NCFG; i++) {
		char var[64];
		size_t k = (size_t)snprintf(var, sizeof(var), "CACHEW_");
		const char *v;

		for (const char *p = table[i].name;
		     *p != '\0' && k + 2 < sizeof(var); p++)
			var[k++] = (char)toupper((unsigned char)*p);
		var[k] = '\0';
		/* A list's singular (CACHEW_CACHE_ROOT) adds one item, its
		 * plural several. */
		for (int plural = 0; plural <= is_list(&table[i]); plural++) {
			cachew_err rv;
			var[k] = plural ? 'S' : '\0';
			var[k + 1] = '\0';
			if ((v = getenv(var)) == NULL)
				continue;
			rv = cwi_service_config_set(c, table[i].name, v, var);
			if (rv != CACHEW_OK)
				return rv;
		}
	}
	return CACHEW_OK;
}

cachew_err
cwi_service_config_check(const cwi_service_config *c)
{
	if (c->role[0] == '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "--role is required: dispatcher or worker");
	if (strcmp(c->role, "worker") == 0 && c->dispatcher[0] == '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "a worker needs --dispatcher ADDRESS (or CACHEW_DISPATCHER)");
	if (strcmp(c->role, "dispatcher") == 0) {
		cwi_scale_config sc;
		if (strchr(c->cache_root, ',') != NULL)
			return cwi_fail(CACHEW_EINVAL, "a dispatcher takes one "
			    "--cache-root (where autocaching writes), not '%s'",
			    c->cache_root);
		cwi_scale_config_default(&sc);
		if (cwi_scale_parse(&sc, c->scale_policy) != CACHEW_OK)
			return cwi_fail(CACHEW_EINVAL, "--scale-policy: %s",
			    cwi_errmsg_get());
		if (c->max_workers > 0 && c->min_workers > c->max_workers)
			return cwi_fail(CACHEW_EINVAL, "--min-workers %lld is "
			    "larger than --max-workers %lld",
			    (long long)c->min_workers, (long long)c->max_workers);
	}
	return CACHEW_OK;
}

static const char *
nonempty(const char *s)
{
	return s[0] != '\0' ? s : NULL;
}

void
cwi_service_config_tls(const cwi_service_config *c, cwi_transport_opts *t)
{
	t->tls_cert = nonempty(c->tls_cert);
	t->tls_key = nonempty(c->tls_key);
	t->tls_ca = nonempty(c->tls_ca);
	t->tls_server_name = nonempty(c->tls_server_name);
	/* The table's choices have checked the text. */
	(void)cwi_tls_client_auth_parse(c->tls_client_auth, "tls_client_auth",
	    &t->tls_client_auth);
}

void
cwi_service_config_print(FILE *out)
{
	fprintf(out, "options (flag / environment variable / config-file key, "
		     "default):\n");
	for (size_t i = 0; i < NCFG; i++) {
		const cfg_spec *s = &table[i];
		char flag[64], var[64];
		size_t k;

		k = (size_t)snprintf(flag, sizeof(flag), "--");
		for (const char *p = s->name; *p != '\0' && k + 1 < sizeof(flag);
		     p++)
			flag[k++] = *p == '_' ? '-' : *p;
		flag[k] = '\0';
		k = (size_t)snprintf(var, sizeof(var), "CACHEW_");
		for (const char *p = s->name; *p != '\0' && k + 1 < sizeof(var);
		     p++)
			var[k++] = (char)toupper((unsigned char)*p);
		if (is_list(s) && k + 1 < sizeof(var))
			var[k++] = 'S';
		var[k] = '\0';
		fprintf(out, "  %-22s %-26s %s%s%s\n      %s\n", flag, var,
		    s->def[0] != '\0' ? "default " : "", s->def,
		    s->def[0] != '\0' ? "" : "", s->help);
	}
}
