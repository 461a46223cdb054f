/*
 * front.h - the front door: which form of cachew_iterator_create runs
 * (front_iterator.c), and the process's embedded service that the default
 * form reads from (front_embedded.c).
 *
 * The front door sits above every other module of the library (exec,
 * service and below); nothing under it calls up into it.
 */
#ifndef CWI_FRONT_H
#define CWI_FRONT_H

#include "../core/core.h"

/* The process's embedded service for `service=embedded` or `embedded:N`:
 * starts (once) a dispatcher and N workers (default 1) on inproc and
 * writes the dispatcher's URL. `embedded` (one inline worker) and
 * `embedded:N` are separate instances; more workers are added to the
 * latter when a later spec asks for more. */
cachew_err cwi_embedded_service(const char *spec, char *url, size_t urllen);

#endif /* CWI_FRONT_H */
