/*
 * transport.c - the registry of transports by URL scheme, and the two calls
 * that pick one: cwi_dial and cwi_listen. It sits above the transports it
 * lists (transports/inproc, transports/nng), which build on the shared
 * base (transports/base); everything else dispatches through a
 * connection's or listener's own ops.
 */
#include "transport.h"

#include <stdio.h>
#include <string.h>

/* ---- registry ----------------------------------------------------------- */

static const cwi_transport *const transports[] = {
    &cwi_transport_inproc,
    &cwi_transport_nng,
};

const cwi_transport *
cwi_transport_find(const char *url)
{
	const char *sep = url != NULL ? strstr(url, "://") : NULL;
	size_t n;

	if (sep == NULL)
		return cwi_fail(CACHEW_EINVAL,
			   "'%s': not a transport URL (inproc://name, "
			   "tcp://host:port, tls+tcp://host:port or "
			   "ipc:///path)",
			   url != NULL ? url : "(null)"),
		       NULL;
	n = (size_t)(sep - url);
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]);
	     i++) {
		for (const char *const *s = transports[i]->schemes; *s != NULL;
		     s++)
			if (strlen(*s) == n && strncmp(*s, url, n) == 0)
				return transports[i];
	}
	cwi_fail(CACHEW_EINVAL,
	    "'%s': unsupported transport scheme '%.*s' (supported: inproc, "
	    "tcp, tls+tcp, ipc)",
	    url, (int)n, url);
	return NULL;
}

/* Fills the zero fields of a copy of opts (NULL: all defaults). */
static void
opts_complete(cwi_transport_opts *out, const cwi_transport_opts *opts)
{
	cwi_transport_opts def;

	cwi_transport_opts_init(&def);
	*out = opts != NULL ? *opts : def;
	if (out->max_msg_size == 0)
		out->max_msg_size = def.max_msg_size;
	if (out->max_inflight == 0)
		out->max_inflight = def.max_inflight;
	if (out->max_pending_bytes == 0)
		out->max_pending_bytes = out->max_msg_size < ((size_t)16 << 20)
		    ? (size_t)32 << 20 : out->max_msg_size * 2;
	if (out->send_timeout_ms <= 0)
		out->send_timeout_ms = def.send_timeout_ms;
	if (out->reconnect_min_ms <= 0)
		out->reconnect_min_ms = def.reconnect_min_ms;
	if (out->reconnect_max_ms < out->reconnect_min_ms) {
		out->reconnect_max_ms = def.reconnect_max_ms;
		if (out->reconnect_max_ms < out->reconnect_min_ms)
			out->reconnect_max_ms = out->reconnect_min_ms;
	}
}

cachew_err
cwi_dial(cwi_conn **out, const char *url, const cwi_transport_opts *opts)
{
	const cwi_transport *t = cwi_transport_find(url);
	cwi_transport_opts o;

	if (t == NULL)
		return CACHEW_EINVAL;
	opts_complete(&o, opts);
	return t->dial(out, url, &o);
}

cachew_err
cwi_listen(cwi_listener **out, const char *url,
    const cwi_transport_opts *opts, cwi_handler_fn handler, void *arg)
{
	const cwi_transport *t = cwi_transport_find(url);
	cwi_transport_opts o;

	if (t == NULL)
		return CACHEW_EINVAL;
	if (handler == NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: listen without a handler",
		    url);
	opts_complete(&o, opts);
	return t->listen(out, url, &o, handler, arg);
}
