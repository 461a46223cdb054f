/*
 * front_iterator.c - cachew_iterator_create: the one front door of
 * iteration. It chooses where a pipeline runs, and nothing below it
 * knows there is a choice:
 *   - `service=local`: the plain executor alone (exec);
 *   - unset (and no CACHEW_SERVICE): the embedded service, a dispatcher
 *     and worker in this process on the inproc transport
 *     (front_embedded.c), or the plain executor for a pipeline the
 *     service cannot split or would run worse (cwi_split_local_reason);
 *   - `embedded`/`embedded:N`: the embedded service, by name;
 *   - a URL: the service client (service/client) of a remote dispatcher.
 */
#include "front.h"
#include "../core/options.h"
#include "../exec/exec_split.h"
#include "../service/client/client.h"

#include <stdlib.h>
#include <string.h>

/* Runs ds on the service at `service` (a URL, or an embedded spec).
 * *fallback is set when the implicit default could not start its embedded
 * service and the plain executor should run instead. */
static cachew_err
service_iterator(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *service, bool implicit,
    bool *fallback)
{
	char url[CWI_OPT_STR_MAX];
	cachew_err rv;

	*fallback = false;
	if (strncmp(service, "embedded", 8) == 0) {
		rv = cwi_embedded_service(service, url, sizeof(url));
		if (rv != CACHEW_OK && implicit) {
			/* The plain executor still works. */
			cwi_log(CACHEW_LOG_WARN, "iterator",
			    "event=embedded_service_failed error=\"%s\" "
			    "action=in_process",
			    cwi_errmsg_get());
			*fallback = true;
			return rv;
		}
		if (rv != CACHEW_OK)
			return rv;
		service = url;
	}
	rv = cwi_client_iterator_create(out, ds, opts, service);
	/* The implicit default cannot take the pipeline (ENOTSUP), or its
	 * source fails already (a pattern that matches no file): the plain
	 * executor runs it, and says so in its own words, not in those of a
	 * service the user did not ask for. */
	if (rv != CACHEW_OK && implicit) {
		cwi_clear_errmsg();
		*fallback = true;
	}
	return rv;
}

cachew_err
cachew_iterator_create(
    cachew_iterator **out, cachew_dataset *ds, const cachew_options *opts)
{
	const char *service, *env;
	bool implicit, fallback;
	cachew_err rv;

	cwi_clear_errmsg();
	if (out == NULL || ds == NULL)
		return cwi_fail(CACHEW_EINVAL, "iterator: NULL argument");
	service = opts != NULL ? cwi_options_values(opts)->service : "";
	if (service[0] == '\0' && (env = getenv("CACHEW_SERVICE")) != NULL)
		service = env;
	/* The default is the embedded service; `local` is the plain
	 * executor alone (no dispatcher, no worker, no splits). A pipeline
	 * the service cannot split (several sources, a source that is not
	 * splittable), or would run worse (cwi_split_local_reason), runs on
	 * the plain executor by default, and the embedded service is not
	 * even started for it; named explicitly, the service says why it
	 * cannot. */
	implicit = service[0] == '\0';
	if (implicit)
		service = cwi_split_local_reason(ds) != NULL ? "local"
							     : "embedded";
	if (strcmp(service, "local") != 0) {
		rv = service_iterator(out, ds, opts, service, implicit,
		    &fallback);
		if (!fallback) {
			if (rv == CACHEW_OK)
				cwi_iterator_mark_user(*out);
			return rv;
		}
	}
	rv = cwi_exec_iterator_create(out, ds, opts);
	if (rv == CACHEW_OK)
		cwi_iterator_mark_user(*out);
	return rv;
}
