/*
 * options.c - the option table and the options object. One table drives the
 * typed setters, text parsing (flags, environment, config files) and help.
 */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum opt_type { OPT_INT, OPT_BOOL, OPT_STR } opt_type;

typedef struct opt_spec {
	const char *name;
	opt_type type;
	int64_t def_int;
	const char *def_str;
	int64_t min, max;
	size_t offset; /* into cwi_opts */
	const char *help;
	const char *def_text; /* the default as `--help-options` prints it */
	const char *const *choices; /* OPT_STR: NULL-terminated, or NULL */
} opt_spec;

static const char *const mode_choices[] = {
    "distributed_epoch", "parallel_epochs", NULL};
static const char *const compression_choices[] = {"none", "zstd", "auto", NULL};
static const char *const client_tail_choices[] = {"auto", "on", "off", NULL};

#define OFF(f) offsetof(cwi_opts, f)

static const opt_spec table[] = {
    {"threads", OPT_INT, 0, NULL, 0, 1024, OFF(threads),
	"CPU budget in threads; 0 = the number of online CPUs", "0", NULL},
    {"ram_budget", OPT_INT, 0, NULL, 0, INT64_MAX, OFF(ram_budget),
	"bytes the executor's buffers may hold; 0 = half of available memory",
	"0", NULL},
    {"seed", OPT_INT, -1, NULL, -1, INT64_MAX, OFF(seed),
	"pipeline seed; -1 = a fresh random seed per iterator", "-1", NULL},
    {"deterministic", OPT_BOOL, 1, NULL, 0, 1, OFF(deterministic),
	"keep element order under parallelism", "true", NULL},
    {"autotune", OPT_BOOL, 1, NULL, 0, 1, OFF(autotune),
	"tune parallel=auto and prefetch(auto) online", "true", NULL},
    {"epoch", OPT_INT, 0, NULL, 0, INT64_MAX, OFF(epoch),
	"the epoch: reshuffling shuffles, list_files(shuffle=true) and "
	"random functions draw anew for each", "0", NULL},
    {"max_element_bytes", OPT_INT, CWI_MAX_ELEMENT_BYTES, NULL, 4096,
	INT64_MAX, OFF(max_element_bytes),
	"bytes an operator may allocate for one element (a file read_file "
	"reads, a resized or decoded image, a batch); over it the element "
	"fails with ERANGE instead", "1073741824", NULL},
    {"service", OPT_STR, 0, "", 0, 0, OFF(service),
	"where the pipeline runs: a dispatcher (tcp://host:port, or "
	"tls+tcp://host:port with the tls_* options), embedded, "
	"embedded:N or local; empty = CACHEW_SERVICE, else embedded",
	"\"\"", NULL},
    {"job_name", OPT_STR, 0, "", 0, 0, OFF(job_name),
	"service: clients naming the same job share it (each element goes to "
	"one of them); empty = a private job", "\"\"", NULL},
    {"processing_mode", OPT_STR, 0, "distributed_epoch", 0, 0,
	OFF(processing_mode),
	"service: distributed_epoch (splits; each element once per epoch) or "
	"parallel_epochs (every worker reads all input)",
	"distributed_epoch", mode_choices},
    {"num_consumers", OPT_INT, 0, NULL, 0, 4096, OFF(num_consumers),
	"service: coordinated reads by this many clients in lock-step "
	"rounds; 0 = uncoordinated", "0", NULL},
    {"consumer_index", OPT_INT, 0, NULL, 0, 4095, OFF(consumer_index),
	"service: this client's index among num_consumers", "0", NULL},
    {"workers", OPT_INT, 0, NULL, 0, 65536, OFF(workers),
	"service: workers for this job; 0 = the dispatcher decides", "0",
	NULL},
    {"compression", OPT_STR, 0, "none", 0, 0, OFF(compression),
	"service: element payloads on the wire: none, zstd, or auto (zstd "
	"only when the link is measured to be the bottleneck)", "none",
	compression_choices},
    {"client_tail", OPT_STR, 0, "auto", 0, 0, OFF(client_tail),
	"service: where the trailing operators that widen elements "
	"element-wise (normalize or cast of u8 to f32) run: auto = on the "
	"client for a remote service's private job, so the workers send the "
	"narrower elements; on = for named jobs too (every client of the job "
	"must say on); off = on the workers", "auto", client_tail_choices},
    {"client_buffer", OPT_INT, 64 << 20, NULL, 1 << 16, INT64_MAX,
	OFF(client_buffer),
	"service: bytes of elements the client buffers ahead", "67108864",
	NULL},
    {"exactly_once", OPT_BOOL, 1, NULL, 0, 1, OFF(exactly_once),
	"service: each element exactly once, even when workers die, and "
	"batches full across leases as in-process; false = the at-least-once "
	"bookkeeping, batches cut where leases end (a debug switch)", "true",
	NULL},
    {"dispatcher_absence_ms", OPT_INT, 60000, NULL, 0, 86400000,
	OFF(dispatcher_absence_ms),
	"service: how long the dispatcher may be unreachable (a restart that "
	"keeps its journal) before the iterator fails; data keeps coming from "
	"the workers meanwhile", "60000", NULL},
    {"service_timeout_ms", OPT_INT, 30000, NULL, 100, 86400000,
	OFF(service_timeout_ms),
	"service: how long a call to the dispatcher or a worker may take, "
	"retries included, before it fails (a dispatcher never reached whose "
	"dials are all refused fails after about 3 s, naming the refusal)",
	"30000", NULL},
    {"token_file", OPT_STR, 0, "", 0, 0, OFF(token_file),
	"service: a file whose first line is this client's token, sent to a "
	"dispatcher that requires tokens; empty = CACHEW_TOKEN_FILE, else "
	"none", "\"\"", NULL},
    {"scale_policy", OPT_STR, 0, "", 0, 0, OFF(scale_policy),
	"service: how the dispatcher sizes this job: model, cachew, fixed:N "
	"or hpa:P (CPU percent); empty = the dispatcher's default",
	"\"\"", NULL},
    {"job_weight", OPT_INT, 1, NULL, 1, 1000000, OFF(job_weight),
	"service: this job's weight in the fair share of the worker pool",
	"1", NULL},
    {"min_workers", OPT_INT, 0, NULL, 0, 65536, OFF(min_workers),
	"service: the autoscaler gives this job at least this many workers; "
	"0 = the policy's default (1)", "0", NULL},
    {"max_workers", OPT_INT, 0, NULL, 0, 65536, OFF(max_workers),
	"service: the autoscaler gives this job at most this many workers; "
	"0 = no bound but the pool's", "0", NULL},
    {"tls_ca", OPT_STR, 0, "", 0, 0, OFF(tls_ca),
	"service over tls+tcp://: the CA certificates (PEM file) that sign "
	"the dispatcher's and the workers' certificates; empty = "
	"CACHEW_TLS_CA", "\"\"", NULL},
    {"tls_cert", OPT_STR, 0, "", 0, 0, OFF(tls_cert),
	"service over tls+tcp://: this client's certificate (PEM file), for "
	"a service that requires client certificates; empty = "
	"CACHEW_TLS_CERT", "\"\"", NULL},
    {"tls_key", OPT_STR, 0, "", 0, 0, OFF(tls_key),
	"service over tls+tcp://: the private key of tls_cert (PEM file); "
	"empty = CACHEW_TLS_KEY", "\"\"", NULL},
    {"tls_server_name", OPT_STR, 0, "", 0, 0, OFF(tls_server_name),
	"service over tls+tcp://: the name the dispatcher's and workers' "
	"certificates must carry; empty = CACHEW_TLS_SERVER_NAME, else the "
	"host of each address dialed", "\"\"", NULL},
};

#define NOPTS (sizeof(table) / sizeof(table[0]))

struct cachew_options {
	cwi_opts v;
	char errmsg[256];
};

static const opt_spec *
find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

void
cwi_opts_defaults(cwi_opts *o)
{
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < NOPTS; i++) {
		const opt_spec *s = &table[i];
		switch (s->type) {
		case OPT_INT:
			*(int64_t *)((char *)o + s->offset) = s->def_int;
			break;
		case OPT_BOOL:
			*(int *)((char *)o + s->offset) = (int)s->def_int;
			break;
		case OPT_STR:
			snprintf((char *)o + s->offset, CWI_OPT_STR_MAX, "%s",
			    s->def_str);
			break;
		}
	}
}

static cachew_err
opts_fail(cachew_options *o, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

static cachew_err
opts_fail(cachew_options *o, cachew_err err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->errmsg, sizeof(o->errmsg), fmt, ap);
	va_end(ap);
	return cwi_fail(err, "%s", o->errmsg);
}

static const opt_spec *
lookup(cachew_options *o, const char *name, opt_type want, cachew_err *rv)
{
	static const char *const tnames[] = {"int", "bool", "str"};
	const opt_spec *s = find(name);

	if (s == NULL) {
		*rv = opts_fail(o, CACHEW_ENOENT, "unknown option '%s'", name);
		return NULL;
	}
	if (s->type != want) {
		*rv = opts_fail(o, CACHEW_ETYPE,
		    "option '%s' is of type %s, not %s", name,
		    tnames[s->type], tnames[want]);
		return NULL;
	}
	*rv = CACHEW_OK;
	return s;
}

cachew_err
cachew_options_create(cachew_options **out)
{
	cachew_options *o = calloc(1, sizeof(*o));
	if (o == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_opts_defaults(&o->v);
	*out = o;
	return CACHEW_OK;
}

void
cachew_options_destroy(cachew_options *opts)
{
	free(opts);
}

cachew_err
cachew_options_set_int(cachew_options *o, const char *name, int64_t value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_INT, &rv);
	if (s == NULL)
		return rv;
	if (value < s->min || value > s->max)
		return opts_fail(o, CACHEW_ERANGE,
		    "option '%s' must be in [%lld, %lld], not %lld", name,
		    (long long)s->min, (long long)s->max, (long long)value);
	*(int64_t *)((char *)&o->v + s->offset) = value;
	return CACHEW_OK;
}

cachew_err
cachew_options_set_bool(cachew_options *o, const char *name, int value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_BOOL, &rv);
	if (s == NULL)
		return rv;
	*(int *)((char *)&o->v + s->offset) = value != 0;
	return CACHEW_OK;
}

static bool
is_choice(const opt_spec *s, const char *value)
{
	for (size_t i = 0; s->choices[i] != NULL; i++)
		if (strcmp(s->choices[i], value) == 0)
			return true;
	return false;
}

cachew_err
cachew_options_set_str(cachew_options *o, const char *name, const char *value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_STR, &rv);
	if (s == NULL)
		return rv;
	if (strlen(value) >= CWI_OPT_STR_MAX)
		return opts_fail(o, CACHEW_ERANGE,
		    "option '%s' is longer than %d characters", name,
		    CWI_OPT_STR_MAX - 1);
	if (s->choices != NULL && !is_choice(s, value)) {
		char list[128] = "";
		for (size_t i = 0; s->choices[i] != NULL; i++)
			snprintf(list + strlen(list), sizeof(list) - strlen(list),
			    "%s%s", i > 0 ? ", " : "", s->choices[i]);
		return opts_fail(o, CACHEW_ERANGE,
		    "option '%s' must be one of %s, not '%s'", name, list,
		    value);
	}
	snprintf((char *)&o->v + s->offset, CWI_OPT_STR_MAX, "%s", value);
	return CACHEW_OK;
}

cachew_err
cachew_options_set(cachew_options *o, const char *name, const char *text)
{
	const opt_spec *s = find(name);
	char *end;
	long long v;

	if (s == NULL)
		return opts_fail(o, CACHEW_ENOENT, "unknown option '%s'", name);
	switch (s->type) {
	case OPT_INT: {
		/* Decimal, or 0x hex: never octal (a seed of 010 is ten). */
		const char *digits = text + (text[0] == '-' || text[0] == '+');
		bool hex = digits[0] == '0' &&
			   (digits[1] == 'x' || digits[1] == 'X');
		errno = 0;
		v = strtoll(text, &end, hex ? 16 : 10);
		if (errno != 0 || end == text || *end != '\0' ||
		    isspace((unsigned char)text[0]))
			return opts_fail(o, CACHEW_ETYPE,
			    "option '%s' needs an integer, not '%s'", name, text);
		return cachew_options_set_int(o, name, (int64_t)v);
	}
	case OPT_BOOL:
		if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0 ||
		    strcmp(text, "yes") == 0 || strcmp(text, "on") == 0)
			return cachew_options_set_bool(o, name, 1);
		if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0 ||
		    strcmp(text, "no") == 0 || strcmp(text, "off") == 0)
			return cachew_options_set_bool(o, name, 0);
		return opts_fail(o, CACHEW_ETYPE,
		    "option '%s' needs true or false, not '%s'", name, text);
	case OPT_STR:
		return cachew_options_set_str(o, name, text);
	}
	return CACHEW_EINTERNAL;
}

cachew_err
cachew_options_get_int(const cachew_options *o, const char *name, int64_t *out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_INT, &rv);
	if (s == NULL)
		return rv;
	*out = *(const int64_t *)((const char *)&o->v + s->offset);
	return CACHEW_OK;
}

cachew_err
cachew_options_get_bool(const cachew_options *o, const char *name, int *out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_BOOL, &rv);
	if (s == NULL)
		return rv;
	*out = *(const int *)((const char *)&o->v + s->offset);
	return CACHEW_OK;
}

cachew_err
cachew_options_get_str(
    const cachew_options *o, const char *name, const char **out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_STR, &rv);
	if (s == NULL)
		return rv;
	*out = (const char *)&o->v + s->offset;
	return CACHEW_OK;
}

const char *
cachew_options_errmsg(const cachew_options *o)
{
	return o->errmsg;
}

cachew_err
cachew_option_info(size_t i, const char **name, const char **type,
    const char **default_text, const char **help)
{
	static const char *const tnames[] = {"int", "bool", "str"};

	if (i >= NOPTS)
		return CACHEW_ENOENT;
	*name = table[i].name;
	*type = tnames[table[i].type];
	*default_text = table[i].def_text;
	*help = table[i].help;
	return CACHEW_OK;
}

const cwi_opts *
cwi_options_values(const cachew_options *o)
{
	return &o->v;
}

cachew_options *
cwi_options_from_values(const cwi_opts *v)
{
	cachew_options *o = calloc(1, sizeof(*o));

	if (o != NULL)
		o->v = *v;
	return o;
}
