/*
 * fuzz_dispatcher_snapshot.c - the dispatcher's snapshot loader over
 * hostile bytes, and the state machine run on what loads.
 *
 * Loading into a fresh dispatcher must fail with CACHEW_ECORRUPT (or
 * CACHEW_ENOMEM) and a "dispatcher snapshot: " message, leaving it
 * empty, or load a state that saves, loads again into another fresh
 * dispatcher and saves to the same bytes; the status, a tick, a decision
 * interval and a tick past every timeout then run on it. Anything else
 * abort()s (and ASan/valgrind catch what a check would not).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/service/dispatcher/dispatcher_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
must(bool ok)
{
	if (!ok)
		abort();
}

static cwi_dispatcher *
fresh(void)
{
	cwi_dispatcher_config cfg;
	cwi_dispatcher *d = NULL;

	cwi_dispatcher_config_default(&cfg);
	cfg.autoscale = true;
	must(cwi_dispatcher_create(&d, &cfg) == CACHEW_OK);
	return d;
}

/* The state machine runs on a loaded state. */
static void
exercise(cwi_dispatcher *d)
{
	cwi_pmsg req, rep;
	uint64_t now = d->now;

	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	must(cwi_dispatcher_handle(d, now + 1, &req, &rep) == CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_dispatcher_tick(d, now + 1);
	cwi_dispatcher_decide(d, now + 2);
	cwi_dispatcher_tick(d, now + 60000000000ull);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cwi_dispatcher *d = fresh(), *again;
	uint8_t *a = NULL, *b = NULL;
	size_t alen = 0, blen = 0;
	cachew_err rv = cwi_dispatcher_snapshot_load(d, data, size);

	if (rv != CACHEW_OK) {
		must(rv == CACHEW_ECORRUPT || rv == CACHEW_ENOMEM);
		must(strncmp(cachew_errmsg(), "dispatcher snapshot: ", 21) == 0);
		must(d->jobs.n == 0 && d->workers.n == 0 && d->tasks.n == 0 &&
		     d->datasets.n == 0 && d->npass_ends == 0);
		cwi_dispatcher_destroy(d);
		return 0;
	}
	must(cwi_dispatcher_snapshot_save(d, &a, &alen) == CACHEW_OK);
	again = fresh();
	must(cwi_dispatcher_snapshot_load(again, a, alen) == CACHEW_OK);
	must(cwi_dispatcher_snapshot_save(again, &b, &blen) == CACHEW_OK);
	must(alen == blen && memcmp(a, b, alen) == 0);
	exercise(d);
	cwi_dispatcher_destroy(again);
	cwi_dispatcher_destroy(d);
	free(a);
	free(b);
	return 0;
}
