/*
 * nng_http.c - the small HTTP listener of the daemons' metrics and health
 * endpoints (cwi_http_listen), on nng's HTTP server: GET requests of any
 * path go to one handler function, which fills the body; nng parses the
 * request (header and URI limits are its own) and frames the response.
 *
 * Lifetime: cwi_http_listener_destroy stops the server first (nng stops
 * its handlers' callbacks before nng_http_server_stop returns), so the
 * handler's argument may be freed after it.
 */
#include "nng_int.h"

#include <nng/supplemental/http/http.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cwi_http_listener {
	nng_http_server *srv;
	nng_http_handler *h; /* owned by srv once added */
	cwi_http_fn fn;
	void *arg;
	char url[96];
};

static void
http_cb(nng_aio *aio)
{
	nng_http_req *req = nng_aio_get_input(aio, 0);
	nng_http_handler *h = nng_aio_get_input(aio, 1);
	cwi_http_listener *l = nng_http_handler_get_data(h);
	const char *type = "text/plain; charset=utf-8";
	nng_http_res *res = NULL;
	char *body = NULL;
	size_t len = 0;
	int status, rv;

	status = l->fn(l->arg, nng_http_req_get_uri(req), &body, &len, &type);
	if (body == NULL)
		len = 0;
	rv = nng_http_res_alloc(&res);
	if (rv == 0)
		rv = nng_http_res_set_status(res, (uint16_t)status);
	if (rv == 0)
		rv = nng_http_res_set_header(res, "Content-Type", type);
	if (rv == 0 && len > 0)
		rv = nng_http_res_copy_data(res, body, len);
	free(body);
	if (rv != 0) {
		nng_http_res_free(res);
		nng_aio_finish(aio, rv);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}

/* "http://host:port" from "host:port" or an http:// URL, into buf. */
static cachew_err
http_url(const char *addr, char *buf, size_t len)
{
	const char *hostport = strncmp(addr, "http://", 7) == 0 ? addr + 7 : addr;

	if (strstr(hostport, "://") != NULL || strchr(hostport, ':') == NULL ||
	    strchr(hostport, '/') != NULL)
		return cwi_fail(CACHEW_EINVAL, "'%s': expected host:port or "
		    "http://host:port", addr);
	if ((size_t)snprintf(buf, len, "http://%s", hostport) >= len)
		return cwi_fail(CACHEW_EINVAL, "'%s': too long", addr);
	return CACHEW_OK;
}

/* The bound address as a URL: port 0 becomes the port nng got. */
static void
bound_url(cwi_http_listener *l, const nng_url *u)
{
	nng_sockaddr sa;

	if (nng_http_server_get_addr(l->srv, &sa) == 0 &&
	    (sa.s_family == NNG_AF_INET || sa.s_family == NNG_AF_INET6)) {
		uint16_t port = sa.s_family == NNG_AF_INET ? sa.s_in.sa_port
							   : sa.s_in6.sa_port;
		snprintf(l->url, sizeof(l->url), "http://%s:%u", u->u_hostname,
		    (unsigned)ntohs(port));
	}
}

cachew_err
cwi_http_listen(cwi_http_listener **out, const char *addr, cwi_http_fn fn,
    void *arg)
{
	cwi_http_listener *l = calloc(1, sizeof(*l));
	nng_url *u = NULL;
	cachew_err err = CACHEW_OK;
	int rv;

	*out = NULL;
	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l->fn = fn;
	l->arg = arg;
	err = http_url(addr, l->url, sizeof(l->url));
	if (err != CACHEW_OK) {
		free(l);
		return err;
	}
	rv = nng_url_parse(&u, l->url);
	if (rv == 0)
		rv = nng_http_server_hold(&l->srv, u);
	if (rv == 0)
		rv = nng_http_handler_alloc(&l->h, "/", http_cb);
	if (rv == 0)
		rv = nng_http_handler_set_tree(l->h);
	if (rv == 0)
		rv = nng_http_handler_set_data(l->h, l, NULL);
	if (rv == 0) {
		rv = nng_http_server_add_handler(l->srv, l->h);
		if (rv != 0)
			nng_http_handler_free(l->h);
	} else if (l->h != NULL) {
		nng_http_handler_free(l->h);
	}
	if (rv == 0)
		rv = nng_http_server_start(l->srv);
	if (rv == 0)
		bound_url(l, u);
	nng_url_free(u);
	if (rv != 0) {
		err = cwi_nng_err(rv, l->url, "http listen");
		if (l->srv != NULL)
			nng_http_server_release(l->srv);
		free(l);
		return err;
	}
	*out = l;
	return CACHEW_OK;
}

const char *
cwi_http_listener_url(const cwi_http_listener *l)
{
	return l->url;
}

void
cwi_http_listener_destroy(cwi_http_listener *l)
{
	if (l == NULL)
		return;
	nng_http_server_stop(l->srv);
	nng_http_server_release(l->srv);
	free(l);
}
