/*
 * fuzz_jpeg.c - the JPEG map functions over hostile bytes.
 *
 * The input becomes component 0 of a one-component element (a rank-0
 * BYTES tensor), which goes through the registered map functions the way
 * a pipeline calls them: decode_jpeg (channels=3 and channels=0, as
 * stored), random_resized_crop(size=16) on the JPEG bytes (the fused
 * crop-while-decoding path) and random_resized_crop(size=16) on a decoded
 * image. Each call must succeed or fail with a message; a success must
 * give a u8 [H, W, C] image of a plausible shape. Anything else abort()s;
 * crashes, leaks and undefined behaviour are found by the sanitizers.
 *
 * Full decodes are skipped for inputs whose header declares more than
 * MAX_PIXELS (as libjpeg-turbo's own fuzzers do): a few hundred bytes can
 * declare a 65500 x 65500 image, whose decoding costs gigabytes and
 * seconds and would stop the fuzzer on its memory limit rather than find
 * bugs. The fused crop decodes only a DCT-scaled crop, so it runs on
 * every input.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "../../src/exec/exec.h"
#include "../../src/pipeline/pipeline.h"

#define MAX_PIXELS (1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One map function with its parameters, initialised once. */
typedef struct jpeg_fn {
	const char *name;
	const char *int_key; /* a single integer parameter, or NULL */
	int64_t int_value;
	int64_t want_h, want_w, want_c; /* 0: any */
	const cwi_fn *fn;
	void *state;
} jpeg_fn;

static jpeg_fn fns[] = {
    {"decode_jpeg", "channels", 3, 0, 0, 3, NULL, NULL},
    {"decode_jpeg", "channels", 0, 0, 0, 0, NULL, NULL},
    {"random_resized_crop", "size", 16, 16, 16, 3, NULL, NULL},
};
enum { FN_DECODE3, FN_DECODE0, FN_RRC, FN_COUNT };

static void
fns_init(void)
{
	cwi_builtins_ready(); /* the functions are looked up directly */
	for (size_t i = 0; i < FN_COUNT; i++) {
		cachew_params *p = NULL;
		char err[256] = "";

		fns[i].fn = cwi_fn_lookup(fns[i].name);
		if (fns[i].fn == NULL || fns[i].fn->def.map == NULL ||
		    cachew_params_create(&p) != CACHEW_OK ||
		    cachew_params_set_int(p, fns[i].int_key, fns[i].int_value) !=
			CACHEW_OK)
			abort();
		if (fns[i].fn->def.init != NULL &&
		    fns[i].fn->def.init(p, &fns[i].state, err, sizeof(err)) !=
			CACHEW_OK)
			abort();
		cachew_params_destroy(p);
	}
}

/* Checks a successful result: component 0 is u8 [H, W, C]. */
static void
check_image(const jpeg_fn *f, const cachew_element *e)
{
	const cachew_tensor *t = cachew_element_component(e, 0);
	const int64_t *shape;

	if (cachew_element_size(e) != 1 || t == NULL ||
	    cachew_tensor_dtype(t) != CACHEW_U8 || cachew_tensor_rank(t) != 3)
		abort();
	shape = cachew_tensor_shape(t);
	if (shape[0] < 1 || shape[1] < 1 ||
	    (shape[2] != 1 && shape[2] != 3) ||
	    (f->want_h != 0 && shape[0] != f->want_h) ||
	    (f->want_w != 0 && shape[1] != f->want_w) ||
	    (f->want_c != 0 && shape[2] != f->want_c) ||
	    cachew_tensor_nbytes(t) !=
		(size_t)(shape[0] * shape[1] * shape[2]))
		abort();
}

/* Calls f on `in` (consumed) like a pipeline's map stage; returns the
 * result, or NULL after a clean failure. */
static cachew_element *
apply(const jpeg_fn *f, cachew_element *in, uint64_t index)
{
	cachew_op_ctx ctx;
	cachew_element *out = NULL;
	cachew_err rv;

	memset(&ctx, 0, sizeof(ctx));
	ctx.fn = f->fn;
	ctx.state = f->state;
	ctx.base_seed = 0x6a70656721ull;
	cwi_op_ctx_at(&ctx, index);
	rv = f->fn->def.map(&ctx, in, &out);
	if (rv != CACHEW_OK) {
		if (out != NULL || ctx.errmsg[0] == '\0')
			abort();
		return NULL;
	}
	if (out == NULL)
		abort();
	check_image(f, out);
	return out;
}

/* True when the header declares more than MAX_PIXELS. */
static int
too_large(const uint8_t *data, size_t size)
{
	tjhandle tj = tjInitDecompress();
	int w = 0, h = 0, sub = 0, cs = 0, big = 0;

	if (tj == NULL)
		abort();
	/* A warning (extraneous bytes) fails the call after the sizes are
	 * read, while the decoder goes on: look at the sizes either way. */
	if (size <= ULONG_MAX) {
		(void)tjDecompressHeader3(tj, data, (unsigned long)size, &w, &h,
		    &sub, &cs);
		big = (int64_t)w * h > MAX_PIXELS;
	}
	tjDestroy(tj);
	return big;
}

/* A new element holding the input bytes as its one component. */
static cachew_element *
bytes_element(const uint8_t *data, size_t size)
{
	cachew_element *e = NULL;
	cachew_tensor *t = NULL;
	const void *items[1] = {data};
	size_t lens[1] = {size};

	if (cachew_tensor_create_bytes(&t, 0, NULL, items, lens) != CACHEW_OK)
		return NULL;
	if (cachew_element_create(&e, 1) != CACHEW_OK ||
	    cachew_element_set(e, 0, t) != CACHEW_OK) {
		cachew_element_release(e);
		e = NULL;
	}
	cachew_tensor_release(t);
	return e;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cachew_element *e, *img;
	int big;

	if (fns[0].fn == NULL)
		fns_init();
	big = too_large(data, size);
	/* The crop depends on the element index: vary it with the input. */
	for (size_t i = FN_DECODE0; i < FN_COUNT; i++) {
		if (big && i != FN_RRC)
			continue;
		e = bytes_element(data, size);
		if (e == NULL)
			return 0;
		cachew_element_release(apply(&fns[i], e, size));
	}
	if (big)
		return 0;
	/* Decoded first, then cropped: the rrc path over pixels. */
	e = bytes_element(data, size);
	if (e == NULL)
		return 0;
	img = apply(&fns[FN_DECODE3], e, size);
	if (img != NULL)
		cachew_element_release(apply(&fns[FN_RRC], img, size));
	return 0;
}
