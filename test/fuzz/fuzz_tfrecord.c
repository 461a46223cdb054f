/*
 * fuzz_tfrecord.c - the TFRecord reader over hostile file contents.
 *
 * The bytes are read as a whole file from memory, four ways: verified and
 * not, failing on and skipping corrupt records, with a small block size so
 * that records straddle blocks. Reading must end in EOF or CACHEW_ECORRUPT
 * with a message naming the file; every record yielded must lie inside
 * the input. With skip_corrupt it must never fail.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/sources/sources.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
read_all(const uint8_t *data, size_t size, bool verify, bool skip,
    int64_t bs)
{
	cwi_tfr_config cfg = {.verify = verify, .skip_corrupt = skip,
	    .buffer_size = bs};
	cwi_tfr_reader *r = NULL;
	cwi_tensor t;
	size_t total = 0;
	cachew_err rv;

	if (cwi_tfr_open_mem(&r, &cfg, "fuzz.tfrecord", data, size) !=
	    CACHEW_OK)
		abort();
	while ((rv = cwi_tfr_next(r, &t)) == CACHEW_OK) {
		size_t len;
		(void)cwi_tensor_str(&t, 0, &len);
		total += len + 16;
		cwi_tensor_clear(&t);
	}
	if (total > size)
		abort();
	if (rv != CACHEW_EOF &&
	    (skip || rv != CACHEW_ECORRUPT ||
		strncmp(cwi_tfr_errmsg(r), "fuzz.tfrecord: ", 15) != 0))
		abort();
	cwi_tfr_close(r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	read_all(data, size, true, false, 4096);
	read_all(data, size, false, false, 7);
	read_all(data, size, true, true, 16);
	read_all(data, size, false, true, 64);
	return 0;
}
