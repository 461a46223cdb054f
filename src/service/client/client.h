/*
 * client.h - service mode of cachew_iterator_create (client.c).
 */
#ifndef CWI_CLIENT_H
#define CWI_CLIENT_H

#include "../../exec/exec.h"

/* Creates an iterator of ds whose worker part runs on the service at url
 * (the client part, if any, runs here). Errors name the service. */
cachew_err cwi_client_iterator_create(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts, const char *url);

#endif /* CWI_CLIENT_H */
