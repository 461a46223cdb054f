/*
 * service_rpc.h - protocol messages over a transport: encode a request,
 * send it, decode and check the reply. Shared by the worker, the client
 * and `cachew status`.
 */
#ifndef CWI_SERVICE_RPC_H
#define CWI_SERVICE_RPC_H

#include "../../transports/transport.h"
#include "../core/options.h"
#include "service_proto.h"

/* Encodes m into a new transport message (no elements). */
cachew_err cwi_rpc_pack(const cwi_pmsg *m, cwi_msg **out);
/* Decodes the header of a received transport message into *out (freed by
 * the caller with cwi_pmsg_free); CACHEW_EPROTO naming `peer` when it is
 * malformed. */
cachew_err cwi_rpc_unpack(const cwi_msg *in, const char *peer, cwi_pmsg *out);

/*
 * Sends req on c and waits up to timeout_ms for a reply of type `expect`.
 * An error reply becomes its code with the server's message; a reply of
 * another type is CACHEW_EPROTO. *rep is filled on success (free with
 * cwi_pmsg_free) and CWI_MSG_NONE otherwise. Errors name the URL.
 */
cachew_err cwi_rpc_call(cwi_conn *c, const cwi_pmsg *req, cwi_msg_type expect,
    int timeout_ms, cwi_pmsg *rep);

/* The lineage an error reply of this thread's last cwi_rpc_call said its
 * dispatcher has (0: no error reply, or none said): a peer whose request
 * named ids of another lineage learns that the dispatcher restarted
 * without them (docs/journal.md). Per thread, like errno. */
uint64_t cwi_rpc_error_lineage(void);

/* How long a client's or a worker's dials of a dispatcher never reached
 * may all fail (refused, unreachable) before it is unreachable (the
 * transport's unreachable_after_ms): long enough for a dispatcher that is
 * starting or restarting, short next to the 30 s a request may wait for a
 * slow one. */
#define CWI_RPC_UNREACHABLE_MS 3000

/* The same with bounded retries: transient failures (CACHEW_EIO,
 * CACHEW_ETIMEDOUT, CACHEW_ECLOSED) are retried with jittered exponential
 * backoff (from 50 ms, doubling, at most 1 s) until total_ms has passed;
 * other errors return at once. `stop`, when not NULL, ends the retries
 * early (CACHEW_ECANCELED). */
cachew_err cwi_rpc_call_retry(cwi_conn *c, const cwi_pmsg *req,
    cwi_msg_type expect, int64_t total_ms, const atomic_bool *stop,
    cwi_pmsg *rep);

/* Fills t's TLS fields for a client's dials (of the dispatcher, of the
 * workers, of `cachew status`) from the options o, each empty one from
 * its environment variable (tls_ca: CACHEW_TLS_CA, tls_cert, tls_key,
 * tls_server_name likewise). Borrowed from o and the environment. */
void cwi_rpc_client_tls(const cwi_opts *o, cwi_transport_opts *t);

/* Replies to a server-side request with m (and no elements). Consumes r
 * whatever happens. */
void cwi_rpc_reply(cwi_request *r, const cwi_pmsg *m);
/* Replies with an error message (CWI_MSG_ERROR). Consumes r. */
void cwi_rpc_reply_error(cwi_request *r, cachew_err code, const char *fmt,
    ...) CACHEW_PRINTF(3, 4);
/* Replies with a task's pipeline's own error (code and message as the
 * plain executor gives them, marked `pipeline`), which the client ends
 * its stream with whatever the code: a pipeline's ENOENT (a file gone) is
 * not a request's (an unknown task). Consumes r. */
void cwi_rpc_reply_pipeline_error(cwi_request *r, cachew_err code,
    const char *message);

#endif /* CWI_SERVICE_RPC_H */
