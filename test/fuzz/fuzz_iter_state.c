/*
 * fuzz_iter_state.c - cachew_iterator_restore over hostile bytes, for a
 * fixed small pipeline with a stateful operator of each kind (a source,
 * shuffle's buffer, a counter, a map, a partial batch, prefetch's queue).
 *
 * Restoring must fail cleanly (an error code from the documented set and
 * a message) or give an iterator that runs to its end or to an error with
 * a message, yielding no more elements than the pipeline and the elements
 * the state holds can. The input
 * is also tried as the body behind a valid header, so that the fuzzer
 * reaches the operators' states past the fingerprint check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/exec/exec_state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PIPELINE                                                              \
	"range(40) | shuffle(6) | map(add, value=3) | skip(2) | batch(4) | "   \
	"prefetch(2)"
#define SEED 3
/* The pipeline yields 10 batches. A state may hold more elements (each
 * takes bytes of it): more than 10 and one per byte is a bug. */
#define MOST_ELEMENTS 10

static cachew_dataset *ds;
static cachew_options *opts;

static void
must(int ok)
{
	if (!ok)
		abort();
}

static void
setup(void)
{
	if (ds != NULL)
		return;
	must(cachew_dataset_parse(&ds, PIPELINE) == CACHEW_OK);
	must(cachew_options_create(&opts) == CACHEW_OK);
	must(cachew_options_set_int(opts, "seed", SEED) == CACHEW_OK);
	must(cachew_options_set_int(opts, "threads", 1) == CACHEW_OK);
	must(cachew_options_set_str(opts, "service", "local") == CACHEW_OK);
}

static void
restore(const uint8_t *data, size_t size)
{
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv = cachew_iterator_restore(&it, ds, opts, data, size);
	size_t n = 0;

	if (rv != CACHEW_OK) {
		must(it == NULL && cachew_errmsg()[0] != '\0');
		must(rv == CACHEW_ECORRUPT || rv == CACHEW_EINVAL ||
		    rv == CACHEW_ENOTSUP || rv == CACHEW_ENOMEM);
		return;
	}
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		cachew_element_release(e);
		must(++n <= MOST_ELEMENTS + size);
	}
	must(rv == CACHEW_EOF || cachew_iterator_errmsg(it)[0] != '\0');
	cachew_iterator_destroy(it);
}

/* data behind the header of a state of PIPELINE at SEED, epoch 0. */
static void
restore_body(const uint8_t *data, size_t size)
{
	cwi_state_writer w;
	cachew_fingerprint fp;
	char hex[33];

	cachew_dataset_fingerprint(ds, &fp);
	cachew_fingerprint_hex(&fp, hex);
	cwi_strbuf_init(&w.sb);
	cwi_sw_array(&w, 9);
	cwi_sw_str(&w, "cachew-iterator-state");
	cwi_sw_uint(&w, CWI_STATE_VERSION);
	cwi_sw_str(&w, "local");
	cwi_sw_str(&w, hex);
	cwi_sw_uint(&w, SEED);
	cwi_sw_uint(&w, SEED);
	cwi_sw_int(&w, 0);
	cwi_sw_bool(&w, true);
	cwi_strbuf_append(&w.sb, data, size);
	if (!w.sb.oom)
		restore((const uint8_t *)w.sb.data, w.sb.len);
	cwi_strbuf_free(&w.sb);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	restore(data, size);
	restore_body(data, size);
	return 0;
}
