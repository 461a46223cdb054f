/*
 * fuzz_listing.h - what the fuzz targets of the listing readers
 * (fuzz_s3_listing.c: expat, fuzz_gcs_listing.c: jansson) ask of a page of
 * hostile bytes (a store, or whatever answers at its endpoint).
 *
 * The reader must not read past `size`; a page it accepts yields only
 * well-formed entries (<scheme>bkt/ and a non-empty name, a size of -1 or
 * more) and a non-empty token or none; a page it refuses says why
 * (CACHEW_EPROTO with a message) and hands back no token. A failed check
 * abort()s, which libFuzzer and the corpus replay report.
 */
#ifndef FUZZ_LISTING_H
#define FUZZ_LISTING_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/io/io.h"

typedef cachew_err (*fuzz_page_parser)(const char *, const char *,
    const char *, size_t, cwi_io_entry **, size_t *, size_t *, char **);

static void
fuzz_listing(fuzz_page_parser parse, const char *scheme, const uint8_t *data,
    size_t size)
{
	/* An exact-size copy: ASan sees any read past the end. */
	char *body = malloc(size > 0 ? size : 1), prefix[16];
	cwi_io_entry *v = NULL;
	size_t n = 0, cap = 0, plen;
	char *token = NULL;
	cachew_err rv;

	if (body == NULL)
		return;
	if (size > 0)
		memcpy(body, data, size);
	plen = (size_t)snprintf(prefix, sizeof(prefix), "%sbkt/", scheme);
	rv = parse(prefix, "bkt", body, size, &v, &n, &cap, &token);
	if (rv == CACHEW_OK) {
		for (size_t i = 0; i < n; i++)
			if (strncmp(v[i].url, prefix, plen) != 0 ||
			    v[i].url[plen] == '\0' || v[i].size < -1)
				abort();
		if (token != NULL && token[0] == '\0')
			abort();
	} else if ((rv != CACHEW_EPROTO && rv != CACHEW_ENOMEM) ||
	    token != NULL || cachew_errmsg()[0] == '\0') {
		abort();
	}
	free(token);
	cwi_io_entries_free(v, n);
	free(body);
}

#endif /* FUZZ_LISTING_H */
