/*
 * fuzz_example.c - the tf.train.Example decoder over hostile bytes.
 *
 * Decodes the input with a spec that asks for every dtype under keys a
 * mutated proto is likely to hold ("a", "b", "k", "image/encoded"), with
 * and without defaults and shapes. Decoding must succeed or fail with
 * ECORRUPT, ETYPE or EOP and a message; a success must give tensors of
 * the requested dtypes that lie within what the input could hold.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/ops/ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cwi_example_spec *spec;

static void
make_spec(void)
{
	cachew_params *p = NULL;
	char err[256];

	if (cachew_params_create(&p) != CACHEW_OK ||
	    cachew_params_set_str(p, "a", "a:i64:default=1") != CACHEW_OK ||
	    cachew_params_set_str(p, "b", "b:f32:[-1]:default=0") != CACHEW_OK ||
	    cachew_params_set_str(p, "c", "k:bytes:default=x") != CACHEW_OK ||
	    cachew_params_set_str(p, "d", "image/encoded:bytes") != CACHEW_OK ||
	    cachew_params_set_str(p, "e", "a:i64:[2,-1]:default=5") !=
		CACHEW_OK ||
	    cwi_example_spec_create(p, &spec, err, sizeof(err)) != CACHEW_OK)
		abort();
	cachew_params_destroy(p);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const cachew_dtype want[] = {CACHEW_I64, CACHEW_F32,
	    CACHEW_BYTES, CACHEW_BYTES, CACHEW_I64};
	cwi_tensor in, out[5];
	char err[400];
	cachew_err rv;

	if (spec == NULL)
		make_spec();
	if (cwi_tensor_init_bytes_copy(&in, data, size) != CACHEW_OK)
		return 0;
	rv = cwi_example_decode(spec, &in, out, err, sizeof(err));
	if (rv == CACHEW_OK) {
		for (size_t i = 0; i < 5; i++) {
			/* A value costs at least one input byte, except
			 * for defaults (at most 2 values here). */
			if (out[i].dtype != want[i] ||
			    cwi_tensor_numel(&out[i]) > (int64_t)size + 2)
				abort();
			cwi_tensor_clear(&out[i]);
		}
	} else if ((rv != CACHEW_ECORRUPT && rv != CACHEW_ETYPE &&
		       rv != CACHEW_EOP && rv != CACHEW_ENOMEM) ||
	    err[0] == '\0') {
		abort();
	}
	cwi_tensor_clear(&in);
	return 0;
}
