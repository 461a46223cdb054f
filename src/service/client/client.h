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

/* An iterator of ds on the service at url that continues a saved position:
 * r is at the saved iterator's body (the client part's states, the
 * stream's with them), `seed` the saved pipeline seed. The job is joined
 * with what the position had received, so the rest of the epoch comes
 * once. Errors are recorded in r (and the iterator is not made). */
cachew_err cwi_client_iterator_restore(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts, const char *url,
    uint64_t seed, struct cwi_state_reader *r);

#endif /* CWI_CLIENT_H */
