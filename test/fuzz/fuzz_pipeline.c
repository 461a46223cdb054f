/*
 * fuzz_pipeline.c - the pipeline-string parser and its round trips.
 *
 * Any text: parsing must fail cleanly (an error code and a message) or
 * give a dataset whose canonical string parses back to the same
 * fingerprint and prints the same again, and whose msgpack form decodes
 * to the same fingerprint and re-encodes to the same bytes. A broken
 * round trip abort()s. No iterator is created.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cachew.h"

/* Fingerprints stat and glob the files a source names. Glob patterns
 * could walk the whole file system, so inputs able to spell one are
 * skipped: '*', '?' and their \x escapes. */
static int
may_glob(const char *s)
{
	if (strpbrk(s, "*?") != NULL)
		return 1;
	for (const char *p = s; (p = strstr(p, "\\x")) != NULL; p += 2)
		if ((p[2] == '2' && (p[3] == 'a' || p[3] == 'A')) ||
		    (p[2] == '3' && (p[3] == 'f' || p[3] == 'F')))
			return 1;
	return 0;
}

static int
same_fp(const cachew_dataset *a, const cachew_dataset *b)
{
	cachew_fingerprint x, y;

	if (cachew_dataset_fingerprint(a, &x) != CACHEW_OK ||
	    cachew_dataset_fingerprint(b, &y) != CACHEW_OK)
		return 0;
	return x.hi == y.hi && x.lo == y.lo;
}

static void
check_msgpack(const cachew_dataset *ds)
{
	void *buf = NULL, *buf2 = NULL;
	size_t len = 0, len2 = 0;
	cachew_dataset *back = NULL;

	if (cachew_dataset_to_msgpack(ds, &buf, &len) != CACHEW_OK)
		abort();
	if (cachew_dataset_from_msgpack(&back, buf, len) != CACHEW_OK)
		abort();
	if (!same_fp(ds, back))
		abort();
	if (cachew_dataset_to_msgpack(back, &buf2, &len2) != CACHEW_OK)
		abort();
	if (len != len2 || memcmp(buf, buf2, len) != 0)
		abort();
	cachew_free(buf);
	cachew_free(buf2);
	cachew_dataset_release(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cachew_dataset *ds = NULL, *again = NULL;
	char *text, *str = NULL, *str2 = NULL;

	if (size > 65536)
		return 0;
	text = malloc(size + 1);
	if (text == NULL)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	if (may_glob(text)) {
		free(text);
		return 0;
	}
	if (cachew_dataset_parse(&ds, text) != CACHEW_OK) {
		/* Every failure says why. */
		if (cachew_errmsg()[0] == '\0')
			abort();
		free(text);
		return 0;
	}
	if (cachew_dataset_to_string(ds, &str) != CACHEW_OK)
		abort();
	if (cachew_dataset_parse(&again, str) != CACHEW_OK)
		abort();
	if (!same_fp(ds, again))
		abort();
	if (cachew_dataset_to_string(again, &str2) != CACHEW_OK)
		abort();
	if (strcmp(str, str2) != 0)
		abort();
	check_msgpack(ds);
	cachew_free(str);
	cachew_free(str2);
	cachew_dataset_release(again);
	cachew_dataset_release(ds);
	free(text);
	return 0;
}
