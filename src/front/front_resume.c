/*
 * front_resume.c - cachew_iterator_save and cachew_iterator_restore: the
 * document around an iterator's position, and the choice of who saves it
 * (its kind). Both kinds save through exec_state.h: the plain executor's
 * iterator tree, or a service client's, whose client part ends at the
 * stream from the service (its state: what the session received and holds,
 * service/client/client_exact.c).
 *
 * The document (docs/design.md, "Saving and restoring a position") is one
 * msgpack array:
 *   ["cachew-iterator-state", version, kind, fingerprint (32 hex digits),
 *    seed, job seed, epoch, deterministic, body]
 * where kind is "local" or "service" and body is exec_state.h's [pulled
 * elements, root state]. A "local" position continues on the plain
 * executor; a "service" one on the service the options name (the embedded
 * one when they name none), in a new job that knows what was received.
 */
#include "front.h"
#include "../core/options.h"
#include "../exec/exec_state.h"
#include "../service/client/client.h"

#include <stdio.h>
#include <stdlib.h>

#define STATE_MAGIC "cachew-iterator-state"
#define KIND_LOCAL "local"
#define KIND_SERVICE "service"

cachew_err
cachew_iterator_save(cachew_iterator *it, void **state, size_t *len)
{
	cwi_state_writer w;
	cwi_exec_run run;
	char fp[33];
	char *doc = NULL;
	size_t n = 0;
	cachew_err rv;

	cwi_clear_errmsg();
	if (it == NULL || state == NULL || len == NULL)
		return cwi_fail(CACHEW_EINVAL, "iterator save: NULL argument");
	cwi_exec_iterator_run(it, &run);
	cachew_fingerprint_hex(&run.fp, fp);
	cwi_strbuf_init(&w.sb);
	cwi_sw_array(&w, 9);
	cwi_sw_str(&w, STATE_MAGIC);
	cwi_sw_uint(&w, CWI_STATE_VERSION);
	cwi_sw_str(&w, cwi_exec_iterator_is_service(it) ? KIND_SERVICE
						       : KIND_LOCAL);
	cwi_sw_str(&w, fp);
	cwi_sw_uint(&w, run.seed);
	cwi_sw_uint(&w, run.job_seed);
	cwi_sw_int(&w, run.epoch);
	cwi_sw_bool(&w, run.deterministic);
	rv = cwi_exec_iterator_save(it, &w);
	if (rv == CACHEW_OK)
		rv = cwi_strbuf_finish(&w.sb, &doc, &n);
	if (rv != CACHEW_OK) {
		cwi_strbuf_free(&w.sb);
		if (cwi_errmsg_get()[0] == '\0')
			cwi_fail(rv, "iterator save: %s", cachew_strerror(rv));
		return rv;
	}
	*state = doc;
	*len = n;
	return CACHEW_OK;
}

/* The saved run, read from the document's header. */
typedef struct saved_run {
	bool service; /* kind "service" */
	char fp[33];
	uint64_t seed, job_seed;
	int64_t epoch;
	bool deterministic;
} saved_run;

static cachew_err
read_header(cwi_state_reader *r, saved_run *s)
{
	char magic[32], kind[16];
	uint64_t version = 0;

	if (!cwi_sr_array(r, "document", 9) ||
	    !cwi_sr_str(r, "magic", magic, sizeof(magic)))
		return cwi_sr_error(r);
	if (strcmp(magic, STATE_MAGIC) != 0) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "not an iterator state (it starts with \"%s\")", magic);
		return cwi_sr_error(r);
	}
	if (!cwi_sr_uint(r, "version", &version, UINT32_MAX))
		return cwi_sr_error(r);
	if (version != CWI_STATE_VERSION) {
		cwi_sr_fail(r, CACHEW_ENOTSUP,
		    "format version %llu, this build reads version %d",
		    (unsigned long long)version, CWI_STATE_VERSION);
		return cwi_sr_error(r);
	}
	if (!cwi_sr_str(r, "kind", kind, sizeof(kind)))
		return cwi_sr_error(r);
	s->service = strcmp(kind, KIND_SERVICE) == 0;
	if (!s->service && strcmp(kind, KIND_LOCAL) != 0) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "unknown kind \"%s\"", kind);
		return cwi_sr_error(r);
	}
	if (!cwi_sr_str(r, "fingerprint", s->fp, sizeof(s->fp)) ||
	    !cwi_sr_uint(r, "seed", &s->seed, UINT64_MAX) ||
	    !cwi_sr_uint(r, "job seed", &s->job_seed, UINT64_MAX) ||
	    !cwi_sr_int(r, "epoch", &s->epoch, 0, INT64_MAX) ||
	    !cwi_sr_bool(r, "deterministic", &s->deterministic))
		return cwi_sr_error(r);
	return CACHEW_OK;
}

/* Refuses options or a dataset that would not continue the saved run,
 * naming what differs. */
static cachew_err
check_run(const saved_run *s, cachew_dataset *ds, const cwi_opts *o)
{
	cachew_fingerprint fp;
	char hex[33];

	cachew_dataset_fingerprint(ds, &fp);
	cachew_fingerprint_hex(&fp, hex);
	if (strcmp(hex, s->fp) != 0)
		return cwi_fail(CACHEW_EINVAL,
		    "iterator restore: the state is of another pipeline "
		    "(fingerprint %s, this dataset's is %s)",
		    s->fp, hex);
	if (o->seed >= 0 && (uint64_t)o->seed != s->seed)
		return cwi_fail(CACHEW_EINVAL,
		    "iterator restore: the option seed differs: the state was "
		    "saved with seed %llu, the options say %lld",
		    (unsigned long long)s->seed, (long long)o->seed);
	if (o->epoch != s->epoch)
		return cwi_fail(CACHEW_EINVAL,
		    "iterator restore: the option epoch differs: the state was "
		    "saved at epoch %lld, the options say %lld",
		    (long long)s->epoch, (long long)o->epoch);
	if ((o->deterministic != 0) != s->deterministic)
		return cwi_fail(CACHEW_EINVAL,
		    "iterator restore: the option deterministic differs: the "
		    "state was saved with %s, the options say %s",
		    s->deterministic ? "true" : "false",
		    o->deterministic ? "true" : "false");
	return CACHEW_OK;
}

/* Where the options run a position: a "local" one continues on the plain
 * executor, which the options may not move to a service; a "service" one
 * on the service they name, the embedded one when they name none. Writes
 * the service's URL (empty: the plain executor). */
static cachew_err
check_where(const saved_run *s, const cwi_opts *o, char *url, size_t urllen)
{
	const char *service = o->service, *env;

	url[0] = '\0';
	if (service[0] == '\0' && (env = getenv("CACHEW_SERVICE")) != NULL)
		service = env;
	if (!s->service) {
		if (service[0] != '\0' && strcmp(service, "local") != 0)
			return cwi_fail(CACHEW_EINVAL, "iterator restore: the "
			    "position was saved by the plain executor "
			    "(service=local), the options name the service "
			    "\"%s\"; restore it with service=local", service);
		return CACHEW_OK;
	}
	if (strcmp(service, "local") == 0)
		return cwi_fail(CACHEW_EINVAL, "iterator restore: the position "
		    "was saved through a service, the options say "
		    "service=local; restore it through a service (the "
		    "default, or a URL)");
	if (service[0] == '\0')
		service = "embedded";
	if (strncmp(service, "embedded", 8) == 0)
		return cwi_embedded_service(service, url, urllen);
	snprintf(url, urllen, "%s", service);
	return CACHEW_OK;
}

cachew_err
cachew_iterator_restore(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const void *state, size_t len)
{
	cwi_opts defaults;
	const cwi_opts *o;
	cwi_state_reader r;
	cachew_iterator *it = NULL;
	char url[CWI_OPT_STR_MAX];
	saved_run s;
	cachew_err rv;

	cwi_clear_errmsg();
	if (out == NULL || ds == NULL || (state == NULL && len > 0))
		return cwi_fail(CACHEW_EINVAL,
		    "iterator restore: NULL argument");
	if (opts != NULL) {
		o = cwi_options_values(opts);
	} else {
		cwi_opts_defaults(&defaults);
		o = &defaults;
	}
	cwi_sr_init(&r, state, len);
	rv = read_header(&r, &s);
	if (rv != CACHEW_OK)
		return cwi_fail(rv, "%s", r.errmsg);
	rv = check_run(&s, ds, o);
	if (rv == CACHEW_OK)
		rv = check_where(&s, o, url, sizeof(url));
	if (rv != CACHEW_OK)
		return rv;
	if (url[0] != '\0') {
		rv = cwi_client_iterator_restore(&it, ds, opts, url, s.seed,
		    &r);
		if (rv != CACHEW_OK)
			return cwi_fail(rv, "%s", r.err != CACHEW_OK ? r.errmsg
							     : cwi_errmsg_get());
	} else {
		rv = cwi_exec_iterator_create_seeded(&it, ds, opts, s.seed,
		    s.job_seed);
		if (rv != CACHEW_OK)
			return rv;
		rv = cwi_exec_iterator_restore(it, &r);
	}
	if (rv == CACHEW_OK && r.c.pos != r.c.len) {
		cwi_sr_fail(&r, CACHEW_ECORRUPT,
		    "%zu bytes follow the document", r.c.len - r.c.pos);
		rv = cwi_sr_error(&r);
	}
	if (rv != CACHEW_OK) {
		cachew_iterator_destroy(it);
		return cwi_fail(rv, "%s", r.errmsg);
	}
	cwi_iterator_mark_user(it);
	*out = it;
	return CACHEW_OK;
}
