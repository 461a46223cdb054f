/*
 * fuzz_gcs_listing.c - the reader of a GCS JSON API objects.list page
 * (jansson, io_gcs.c) over hostile bytes; the checks are
 * fuzz_listing.h's.
 */
#include "fuzz_listing.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_listing(cwi_gcs_parse_page, "gs://", data, size);
	return 0;
}
