/*
 * fuzz_s3_listing.c - the reader of an S3 ListObjectsV2 page (expat,
 * io_s3.c) over hostile bytes; the checks are fuzz_listing.h's.
 */
#include "fuzz_listing.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_listing(cwi_s3_parse_page, "s3://", data, size);
	return 0;
}
