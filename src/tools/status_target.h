/*
 * status_target.h - what `cachew status` and `cachew top` share
 * (status_cli.c): naming a dispatcher (URL, token file, TLS files),
 * dialing it and asking for its status.
 */
#ifndef CWI_STATUS_TARGET_H
#define CWI_STATUS_TARGET_H

#include "../core/options.h"
#include "../service/service_proto.h"
#include "../../transports/transport.h"

typedef struct cwi_status_target {
	const char *url;        /* NULL: $CACHEW_SERVICE */
	const char *token_file; /* default $CACHEW_TOKEN_FILE */
	cwi_opts opts;          /* the TLS files (tls_ca, tls_cert, ...) */
} cwi_status_target;

void cwi_status_target_init(cwi_status_target *t);
/* Takes argv[*i] when it is one of the target's flags (--token-file,
 * --tls-ca, --tls-cert, --tls-key, --tls-server-name; also
 * --token-file=FILE), moving *i past its value: 1. 0 when it is not one;
 * -1 when its value is missing (said on stderr as "cachew CMD: ..."). */
int cwi_status_target_flag(cwi_status_target *t, const char *cmd, int argc,
    char **argv, int *i);
/* Reads the token and dials the dispatcher: 0 with *c (destroy it) and
 * *token (NULL or heap); else the exit code, 2 for a missing URL or an
 * unreadable token file, 1 when the dial fails, said on stderr. */
int cwi_status_connect(cwi_status_target *t, const char *cmd, cwi_conn **c,
    char **token);
/* One STATUS request on c (5 s deadline) into *rep (cwi_pmsg_free it);
 * token is borrowed. */
cachew_err cwi_status_fetch(cwi_conn *c, const char *token, cwi_pmsg *rep);

#endif /* CWI_STATUS_TARGET_H */
