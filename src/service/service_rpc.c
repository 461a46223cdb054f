/*
 * service_rpc.c - protocol messages over a transport (service_rpc.h).
 */
#include "service_rpc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* The option's value, else its environment variable's, else NULL. */
static const char *
opt_or_env(const char *value, const char *var)
{
	const char *env;

	if (value[0] != '\0')
		return value;
	env = getenv(var);
	return env != NULL && env[0] != '\0' ? env : NULL;
}

void
cwi_rpc_client_tls(const cwi_opts *o, cwi_transport_opts *t)
{
	t->tls_ca = opt_or_env(o->tls_ca, "CACHEW_TLS_CA");
	t->tls_cert = opt_or_env(o->tls_cert, "CACHEW_TLS_CERT");
	t->tls_key = opt_or_env(o->tls_key, "CACHEW_TLS_KEY");
	t->tls_server_name = opt_or_env(o->tls_server_name,
	    "CACHEW_TLS_SERVER_NAME");
}

cachew_err
cwi_rpc_pack(const cwi_pmsg *m, cwi_msg **out)
{
	cwi_strbuf sb;
	cwi_msg *msg;
	cachew_err rv;

	*out = NULL;
	cwi_strbuf_init(&sb);
	rv = cwi_pmsg_encode(m, &sb);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cwi_msg_create(&msg);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cwi_msg_set_header_strbuf(msg, &sb);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(msg);
		goto fail;
	}
	*out = msg;
	return CACHEW_OK;
fail:
	cwi_strbuf_free(&sb);
	return rv;
}

cachew_err
cwi_rpc_unpack(const cwi_msg *in, const char *peer, cwi_pmsg *out)
{
	size_t len;
	const uint8_t *hdr = cwi_msg_header(in, &len);
	cachew_err rv;

	cwi_pmsg_init(out, CWI_MSG_NONE);
	if (hdr == NULL || len == 0)
		return cwi_fail(CACHEW_EPROTO, "%s: a message without a header",
		    peer);
	rv = cwi_pmsg_decode(hdr, len, out);
	if (rv != CACHEW_OK && rv != CACHEW_ENOMEM)
		return cwi_fail(rv, "%s: %s", peer, cwi_errmsg_get());
	return rv;
}

static _Thread_local uint64_t tls_error_lineage;

uint64_t
cwi_rpc_error_lineage(void)
{
	return tls_error_lineage;
}

cachew_err
cwi_rpc_call(cwi_conn *c, const cwi_pmsg *req, cwi_msg_type expect,
    int timeout_ms, cwi_pmsg *rep)
{
	cwi_msg *msg, *reply = NULL;
	cachew_err rv;

	tls_error_lineage = 0;
	cwi_pmsg_init(rep, CWI_MSG_NONE);
	rv = cwi_rpc_pack(req, &msg);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_conn_call(c, msg, timeout_ms, &reply);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_rpc_unpack(reply, cwi_conn_url(c), rep);
	cwi_msg_destroy(reply);
	if (rv != CACHEW_OK)
		return rv;
	if (rep->type == CWI_MSG_ERROR) {
		cachew_err code = (cachew_err)rep->u.error.code;
		if (code <= CACHEW_OK || code > CWI_ERR_LAST)
			code = CACHEW_EPROTO;
		tls_error_lineage = rep->u.error.lineage;
		rv = cwi_fail(code, "%s: %s", cwi_conn_url(c),
		    rep->u.error.message != NULL ? rep->u.error.message : "");
		cwi_pmsg_free(rep);
		return rv;
	}
	if (rep->type != expect) {
		rv = cwi_fail(CACHEW_EPROTO, "%s: expected a %s reply, got %s",
		    cwi_conn_url(c), cwi_msg_type_name(expect),
		    cwi_msg_type_name(rep->type));
		cwi_pmsg_free(rep);
		return rv;
	}
	return CACHEW_OK;
}

static bool
transient(cachew_err rv)
{
	return rv == CACHEW_EIO || rv == CACHEW_ETIMEDOUT ||
	       rv == CACHEW_ECLOSED;
}

cachew_err
cwi_rpc_call_retry(cwi_conn *c, const cwi_pmsg *req, cwi_msg_type expect,
    int64_t total_ms, const atomic_bool *stop, cwi_pmsg *rep)
{
	uint64_t deadline = cwi_now_ns() + (uint64_t)total_ms * 1000000u;
	uint64_t backoff_ms = 50;
	cwi_rng rng;
	cachew_err rv;

	rng.state = cwi_now_ns() ^ (uint64_t)(uintptr_t)c;
	for (;;) {
		uint64_t now = cwi_now_ns();
		int left = (int)((deadline > now ? deadline - now : 0) / 1000000u);

		rv = cwi_rpc_call(c, req, expect, left > 0 ? left : 1, rep);
		/* An unreachable peer (never reached, every dial failed: the
		 * transport's unreachable_after_ms) fails each call at once:
		 * retrying only waits out total_ms, then says less. */
		if (rv == CACHEW_OK || !transient(rv) ||
		    cwi_conn_unreachable(c))
			return rv;
		if (stop != NULL && atomic_load(stop))
			return cwi_fail(CACHEW_ECANCELED, "%s: canceled",
			    cwi_conn_url(c));
		now = cwi_now_ns();
		/* Less than the shortest backoff left: the last error is the
		 * answer (another call would wait 1 ms and say "no reply
		 * within 1 ms"). */
		if (now + 25 * 1000000u >= deadline)
			return rv;
		uint64_t sleep_ms = backoff_ms / 2 +
		    cwi_rng_below(&rng, backoff_ms / 2 + 1);
		/* The next call gets half of what is left, at least. */
		if (now + sleep_ms * 1000000u > deadline - (deadline - now) / 2)
			sleep_ms = (deadline - now) / 2 / 1000000u;
		cwi_sleep_ns(sleep_ms * 1000000u);
		if (backoff_ms < 1000)
			backoff_ms *= 2;
	}
}

void
cwi_rpc_reply(cwi_request *r, const cwi_pmsg *m)
{
	cwi_msg *msg;

	if (cwi_rpc_pack(m, &msg) != CACHEW_OK) {
		(void)cwi_request_fail(r, CACHEW_EINTERNAL,
		    "cannot encode the %s reply: %s", cwi_msg_type_name(m->type),
		    cwi_errmsg_get());
		return;
	}
	if (cwi_request_reply(r, msg) != CACHEW_OK)
		cwi_msg_destroy(msg);
}

void
cwi_rpc_reply_error(cwi_request *r, cachew_err code, const char *fmt, ...)
{
	cwi_pmsg m;
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	cwi_pmsg_init(&m, CWI_MSG_ERROR);
	m.u.error.code = code;
	m.u.error.message = text;
	cwi_rpc_reply(r, &m);
	m.u.error.message = NULL;
	cwi_pmsg_free(&m);
}

void
cwi_rpc_reply_pipeline_error(cwi_request *r, cachew_err code,
    const char *message)
{
	cwi_pmsg m;

	cwi_pmsg_init(&m, CWI_MSG_ERROR);
	m.u.error.code = code;
	m.u.error.message = (char *)message; /* borrowed for the encoding */
	m.u.error.pipeline = true;
	cwi_rpc_reply(r, &m);
	m.u.error.message = NULL;
	cwi_pmsg_free(&m);
}
