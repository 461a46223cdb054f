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
 * reaches the operators' states past the fingerprint check, and as the
 * session state of a stream from the embedded service (the groups a client
 * received and what it holds), which a restore sends to the dispatcher.
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
/* Through the embedded service: the pipeline is all worker part, so the
 * iterator's root is the stream from the service, whose state (what the
 * session received, client_exact.c) the input is tried as too. */
#define SVC_PIPELINE "range(40) | batch(4)"

static cachew_dataset *ds, *svc_ds;
static cachew_options *opts, *svc_opts;

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
	must(cachew_dataset_parse(&svc_ds, SVC_PIPELINE) == CACHEW_OK);
	must(cachew_options_create(&svc_opts) == CACHEW_OK);
	must(cachew_options_set_int(svc_opts, "seed", SEED) == CACHEW_OK);
	must(cachew_options_set_str(svc_opts, "service", "embedded") ==
	    CACHEW_OK);
}

static void
restore_in(cachew_dataset *d, const cachew_options *o, const uint8_t *data,
    size_t size)
{
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv = cachew_iterator_restore(&it, d, o, data, size);
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

static void
restore(const uint8_t *data, size_t size)
{
	restore_in(ds, opts, data, size);
}

/* The header of a state of d at SEED, epoch 0, of kind `kind`. */
static void
header(cwi_state_writer *w, cachew_dataset *d, const char *kind)
{
	cachew_fingerprint fp;
	char hex[33];

	cachew_dataset_fingerprint(d, &fp);
	cachew_fingerprint_hex(&fp, hex);
	cwi_sw_array(w, 9);
	cwi_sw_str(w, "cachew-iterator-state");
	cwi_sw_uint(w, CWI_STATE_VERSION);
	cwi_sw_str(w, kind);
	cwi_sw_str(w, hex);
	cwi_sw_uint(w, SEED);
	cwi_sw_uint(w, SEED);
	cwi_sw_int(w, 0);
	cwi_sw_bool(w, true);
}

/* data behind the header of a state of PIPELINE at SEED, epoch 0. */
static void
restore_body(const uint8_t *data, size_t size)
{
	cwi_state_writer w;

	cwi_strbuf_init(&w.sb);
	header(&w, ds, "local");
	cwi_strbuf_append(&w.sb, data, size);
	if (!w.sb.oom)
		restore((const uint8_t *)w.sb.data, w.sb.len);
	cwi_strbuf_free(&w.sb);
}

/* data as the session state of SVC_PIPELINE's stream from the embedded
 * service: [no pulled element, [service_stream, not ended, data]]. */
static void
restore_session(const uint8_t *data, size_t size)
{
	cwi_state_writer w;

	cwi_strbuf_init(&w.sb);
	header(&w, svc_ds, "service");
	cwi_sw_array(&w, 2);
	cwi_sw_array(&w, 0);
	cwi_sw_array(&w, 3);
	cwi_sw_str(&w, "service_stream");
	cwi_sw_bool(&w, false);
	cwi_strbuf_append(&w.sb, data, size);
	if (!w.sb.oom)
		restore_in(svc_ds, svc_opts, (const uint8_t *)w.sb.data,
		    w.sb.len);
	cwi_strbuf_free(&w.sb);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	restore(data, size);
	restore_body(data, size);
	restore_session(data, size);
	return 0;
}
