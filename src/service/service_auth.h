/*
 * service_auth.h - role tokens: the dispatcher's token file, a peer's own
 * token file, and which role may send which message (docs/security.md,
 * "Authentication and authorisation"; docs/protocol.md, "Authorisation").
 *
 * A dispatcher started with `auth_tokens` loads a file of lines
 * `<role> <name> <token>`; every request must then carry one of those
 * tokens in its envelope ("k"), and the server layer stamps the token's
 * name on the request as its identity ("i") before the state machine
 * sees it. Tokens are secrets: nothing here logs or prints one, and error
 * messages name the file and line, never the token.
 *
 * Thread safety: a loaded table is immutable; lookups may run on any
 * thread at once.
 */
#ifndef CWI_SERVICE_AUTH_H
#define CWI_SERVICE_AUTH_H

#include "service_proto.h"

/* Bounds of a token file's fields. */
#define CWI_AUTH_MIN_TOKEN 16u
#define CWI_AUTH_MAX_NAME CWI_PROTO_MAX_IDENTITY

typedef enum cwi_auth_role {
	CWI_ROLE_NONE = 0,
	CWI_ROLE_CLIENT, /* "client": datasets, jobs, acks */
	CWI_ROLE_WORKER, /* "worker": registration, leases, counters */
	CWI_ROLE_ADMIN   /* "admin": what a client may, and the whole status */
} cwi_auth_role;

typedef struct cwi_auth_tokens cwi_auth_tokens;

/* Loads a token file. CACHEW_EINVAL with a message naming the file and
 * line for a malformed line (an unknown role, a name outside
 * [A-Za-z0-9_.-]{1,64}, a token shorter than 16 characters or longer than
 * 256, a missing or extra field), a token given twice, or a file that its
 * group or others may read (mode & 077); CACHEW_EIO when it cannot be
 * read. *out is owned by the caller (cwi_auth_tokens_destroy). */
cachew_err cwi_auth_tokens_load(cwi_auth_tokens **out, const char *path);
void cwi_auth_tokens_destroy(cwi_auth_tokens *t);

/* Authorises a request: its token must be one of t's, and its role one
 * that may send the request's type. On success *role and *identity (the
 * token's name, borrowed from t) are set. CACHEW_EPERM otherwise, with
 * "not authenticated: ..." or "role X may not send Y". */
cachew_err cwi_auth_check(const cwi_auth_tokens *t, const cwi_pmsg *req,
    cwi_auth_role *role, const char **identity);

/* Reads a peer's own token from a file: its first line, without the
 * newline and surrounding blanks. CACHEW_EINVAL (naming the file) for an
 * empty token or one over 256 bytes; CACHEW_EIO when it cannot be read.
 * *token is the caller's to free. */
cachew_err cwi_auth_token_read(const char *path, char **token);

/* The role's name ("client"), "none" for CWI_ROLE_NONE. */
const char *cwi_auth_role_name(cwi_auth_role role);

/* Whether a listen address only takes local peers: ipc:// and inproc://,
 * or tcp:// and tls+tcp:// on 127.0.0.0/8, [::1] or localhost. A
 * dispatcher on any other address needs tokens or --insecure. */
bool cwi_auth_listen_is_local(const char *url);

#endif /* CWI_SERVICE_AUTH_H */
