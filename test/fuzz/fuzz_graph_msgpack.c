/*
 * fuzz_graph_msgpack.c - the serialized-graph decoder (hostile bytes).
 *
 * Decoding must fail cleanly or give a dataset that re-encodes to bytes
 * that decode to the same fingerprint and re-encode identically. When
 * the canonical string of a decoded graph is within the parser's limits,
 * it must parse back to the same fingerprint too. The dispatcher's reading
 * of the user functions a graph needs (cwi_graph_user_fns) fails cleanly
 * and takes every graph that decodes. A broken round trip abort()s. No
 * iterator is created.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cachew.h"
#include "../../src/core/value_msgpack.h"
#include "../../src/pipeline/pipeline.h"

/* Fingerprints stat and glob the files a source names; a glob pattern
 * could walk the whole file system, so graphs holding a string with '*'
 * or '?' are skipped. */
static int
may_glob(const cwi_value *v)
{
	switch (v->type) {
	case CWI_V_STR:
		return memchr(v->u.s.ptr, '*', v->u.s.len) != NULL ||
		    memchr(v->u.s.ptr, '?', v->u.s.len) != NULL;
	case CWI_V_LIST:
		for (size_t i = 0; i < v->u.list.n; i++)
			if (may_glob(&v->u.list.items[i]))
				return 1;
		return 0;
	case CWI_V_MAP:
		for (size_t i = 0; i < v->u.map.n; i++)
			if (may_glob(&v->u.map.items[i].val))
				return 1;
		return 0;
	default:
		return 0;
	}
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

/* The string form: it may exceed the parser's limits (nesting, length),
 * and then parsing says so; otherwise it must keep the fingerprint. */
static void
check_string(const cachew_dataset *ds)
{
	cachew_dataset *back = NULL;
	char *str = NULL;
	cachew_err rv;

	rv = cachew_dataset_to_string(ds, &str);
	if (rv == CACHEW_ERANGE)
		return;
	if (rv != CACHEW_OK)
		abort();
	rv = cachew_dataset_parse(&back, str);
	if (rv == CACHEW_EPARSE && (strstr(cachew_errmsg(), "deeper than") ||
				       strstr(cachew_errmsg(), "longer than") ||
				       strstr(cachew_errmsg(), "more than"))) {
		cachew_free(str);
		return;
	}
	if (rv != CACHEW_OK || !same_fp(ds, back))
		abort();
	cachew_dataset_release(back);
	cachew_free(str);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cachew_dataset *ds = NULL, *back = NULL;
	cwi_value doc = {0};
	cwi_fn_ident *fns = NULL;
	void *buf = NULL, *buf2 = NULL;
	size_t used, len = 0, len2 = 0, nfns = 0;
	cachew_err rv, fns_rv;

	rv = cwi_value_from_msgpack(data, size, &used, &doc, 64);
	if (rv == CACHEW_OK && may_glob(&doc)) {
		cwi_value_free(&doc);
		return 0;
	}
	cwi_value_free(&doc);
	fns_rv = cwi_graph_user_fns(data, size, &fns, &nfns);
	free(fns);
	if (fns_rv != CACHEW_OK && cachew_errmsg()[0] == '\0')
		abort();
	if (cachew_dataset_from_msgpack(&ds, data, size) != CACHEW_OK) {
		if (cachew_errmsg()[0] == '\0')
			abort();
		return 0;
	}
	if (fns_rv != CACHEW_OK)
		abort();
	/* A document that decodes as a graph decodes as a value. */
	if (rv != CACHEW_OK)
		abort();
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
	check_string(ds);
	cachew_free(buf);
	cachew_free(buf2);
	cachew_dataset_release(back);
	cachew_dataset_release(ds);
	return 0;
}
