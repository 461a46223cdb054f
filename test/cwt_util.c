/*
 * cwt_util.c - helpers shared by the Check suites.
 */
#include "cwt.h"

#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
copy_msg(char *dst, size_t len, const char *src)
{
	if (dst != NULL && len > 0)
		snprintf(dst, len, "%s", src);
}

cachew_dataset *
cwt_parse(const char *pipeline)
{
	cachew_dataset *ds = NULL;
	cachew_err rv = cachew_dataset_parse(&ds, pipeline);

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, cachew_errmsg());
	return ds;
}

int64_t
cwt_card(const char *pipeline)
{
	cachew_dataset *ds = cwt_parse(pipeline);
	int64_t c = cachew_dataset_cardinality(ds);

	cachew_dataset_release(ds);
	return c;
}

char *
cwt_spec(const char *pipeline)
{
	cachew_dataset *ds = cwt_parse(pipeline);
	char *s = NULL;

	ck_assert_int_eq(cachew_dataset_spec_str(ds, &s), CACHEW_OK);
	cachew_dataset_release(ds);
	return s;
}

void
cwt_spec_is(const char *pipeline, const char *want)
{
	char *s = cwt_spec(pipeline);

	ck_assert_msg(strcmp(s, want) == 0, "%s: spec %s, want %s", pipeline,
	    s, want);
	cachew_free(s);
}

void
cwt_build_refused(const char *pipeline, cachew_err code, const char *needle)
{
	cachew_dataset *ds = NULL;
	cachew_err rv = cachew_dataset_parse(&ds, pipeline);
	const char *msg = cachew_errmsg();

	ck_assert_msg(rv == code, "%s: got %s (%s), want %s", pipeline,
	    cachew_strerror(rv), msg, cachew_strerror(code));
	ck_assert_ptr_null(ds);
	ck_assert_msg(strstr(msg, needle) != NULL, "%s: '%s' lacks '%s'",
	    pipeline, msg, needle);
	ck_assert_msg(strstr(msg, "column ") != NULL && strstr(msg, "^") !=
	    NULL, "%s: '%s' has no column and caret", pipeline, msg);
}

cachew_err
cwt_run_ds(cachew_dataset *ds, const cachew_options *opts,
    cachew_element ***out, size_t *n, char *errmsg, size_t errlen)
{
	cachew_iterator *it;
	cachew_element **v = NULL, *e;
	size_t cnt = 0, cap = 0;
	cachew_err rv;

	*out = NULL;
	*n = 0;
	rv = cachew_iterator_create(&it, ds, opts);
	if (rv != CACHEW_OK) {
		copy_msg(errmsg, errlen, cachew_errmsg());
		return rv;
	}
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		if (cnt == cap) {
			cap = cap ? cap * 2 : 64;
			v = realloc(v, cap * sizeof(*v));
			ck_assert_ptr_nonnull(v);
		}
		v[cnt++] = e;
	}
	if (rv != CACHEW_EOF) {
		copy_msg(errmsg, errlen, cachew_iterator_errmsg(it));
		cwt_free(v, cnt);
		cachew_iterator_destroy(it);
		return rv;
	}
	cachew_iterator_destroy(it);
	*out = v;
	*n = cnt;
	return CACHEW_OK;
}

cachew_err
cwt_run(const char *pipeline, const cachew_options *opts,
    cachew_element ***out, size_t *n, char *errmsg, size_t errlen)
{
	cachew_dataset *ds;
	cachew_err rv = cachew_dataset_parse(&ds, pipeline);

	*out = NULL;
	*n = 0;
	if (rv != CACHEW_OK) {
		copy_msg(errmsg, errlen, cachew_errmsg());
		return rv;
	}
	rv = cwt_run_ds(ds, opts, out, n, errmsg, errlen);
	cachew_dataset_release(ds);
	return rv;
}

void
cwt_run_fails(const char *pipeline, const cachew_options *opts,
    cachew_err code, const char *needle)
{
	cachew_element **v;
	size_t n;
	char err[1024] = "";
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, err, sizeof(err));

	if (rv == CACHEW_OK)
		cwt_free(v, n);
	ck_assert_msg(rv == code, "'%s': expected %s, got %s: %s", pipeline,
	    cachew_strerror(code), cachew_strerror(rv), err);
	ck_assert_msg(strstr(err, needle) != NULL,
	    "'%s': message '%s' lacks '%s'", pipeline, err, needle);
}

void
cwt_free(cachew_element **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cachew_element_release(v[i]);
	free(v);
}

cachew_options *
cwt_opts(int64_t seed, int threads)
{
	cachew_options *o;
	ck_assert_int_eq(cachew_options_create(&o), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "seed", seed), CACHEW_OK);
	if (threads > 0)
		ck_assert_int_eq(
		    cachew_options_set_int(o, "threads", threads), CACHEW_OK);
	return o;
}

int64_t
cwt_i64(const cachew_element *e, size_t c)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_I64);
	ck_assert_int_eq(cachew_tensor_numel(t), 1);
	return *(const int64_t *)cachew_tensor_data(t);
}

double
cwt_f64(const cachew_element *e, size_t c)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_F64);
	ck_assert_int_eq(cachew_tensor_numel(t), 1);
	return *(const double *)cachew_tensor_data(t);
}

char *
cwt_join_i64(cachew_element **v, size_t n, size_t c)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);

	ck_assert_ptr_nonnull(s);
	s[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		const cachew_tensor *t = cachew_element_component(v[i], c);
		const int64_t *d;
		int64_t numel;
		char item[64];

		ck_assert_ptr_nonnull(t);
		ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_I64);
		d = cachew_tensor_data(t);
		numel = cachew_tensor_numel(t);
		for (int64_t j = -1; j <= numel; j++) {
			size_t il;
			if (j == -1) {
				if (cachew_tensor_rank(t) == 0)
					continue;
				snprintf(item, sizeof(item), "%s[",
				    i > 0 ? "," : "");
			} else if (j == numel) {
				if (cachew_tensor_rank(t) == 0)
					continue;
				snprintf(item, sizeof(item), "]");
			} else if (cachew_tensor_rank(t) == 0) {
				snprintf(item, sizeof(item), "%s%lld",
				    i > 0 ? "," : "", (long long)d[j]);
			} else {
				snprintf(item, sizeof(item), "%s%lld",
				    j > 0 ? " " : "", (long long)d[j]);
			}
			il = strlen(item);
			while (len + il + 1 > cap) {
				cap *= 2;
				s = realloc(s, cap);
				ck_assert_ptr_nonnull(s);
			}
			memcpy(s + len, item, il + 1);
			len += il;
		}
	}
	return s;
}

char *
cwt_seq(const char *pipeline, const cachew_options *opts)
{
	cachew_element **v;
	size_t n;
	char err[1024];
	char *s;
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_OK, "'%s' failed: %s: %s", pipeline,
	    cachew_strerror(rv), err);
	s = cwt_join_i64(v, n, 0);
	cwt_free(v, n);
	return s;
}

void
cwt_seq_is(const char *pipeline, const cachew_options *opts, const char *want)
{
	char *s = cwt_seq(pipeline, opts);

	ck_assert_msg(strcmp(s, want) == 0, "%s: yields %s, want %s", pipeline,
	    s, want);
	free(s);
}

cachew_options *
cwt_opts_at(int64_t seed, int64_t epoch, const char *service)
{
	cachew_options *o = cwt_opts(seed, 0);

	ck_assert_int_eq(cachew_options_set_int(o, "epoch", epoch), CACHEW_OK);
	if (service != NULL)
		ck_assert_msg(cachew_options_set_str(o, "service", service) ==
			CACHEW_OK, "service '%s': %s", service,
		    cachew_options_errmsg(o));
	return o;
}

static int
cmp_hash(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

char *
cwt_hash_seq(const char *pipeline, const cachew_options *opts, int sorted)
{
	cachew_element **v;
	size_t n;
	char err[1024];
	uint64_t *h;
	char *s;
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_OK, "'%s' failed: %s: %s", pipeline,
	    cachew_strerror(rv), err);
	h = malloc((n + 1) * sizeof(*h));
	s = malloc(n * 17 + 1);
	ck_assert_ptr_nonnull(h);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++)
		h[i] = cachew_element_hash(v[i]);
	if (sorted)
		qsort(h, n, sizeof(*h), cmp_hash);
	s[0] = '\0';
	for (size_t i = 0, w = 0; i < n; i++)
		w += (size_t)snprintf(s + w, 18, "%s%016llx", i > 0 ? "," : "",
		    (unsigned long long)h[i]);
	free(h);
	cwt_free(v, n);
	return s;
}

const char *
cwt_build_dir(void)
{
	const char *b = getenv("CACHEW_BUILD");
	return b != NULL && b[0] != '\0' ? b : "build";
}

void
cwt_build_file(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", cwt_build_dir(), name);
	/* A focused run on a build that lacks it would otherwise fail
	 * further on with "cannot load", which says nothing about why. */
	ck_assert_msg(access(buf, R_OK) == 0, "%s is missing: build it first "
	    "(make %s; make check builds every file the tests use)", buf, buf);
}

char *
cwt_tmpdir(void)
{
	char *d = strdup("/tmp/cachew-test-XXXXXX");
	ck_assert_ptr_nonnull(d);
	ck_assert_ptr_nonnull(mkdtemp(d));
	return d;
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void
cwt_rmtree(const char *path)
{
	if (path != NULL)
		nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void
cwt_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f != NULL, "cannot create %s", path);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
}

const char cwt_range3_graph[] =
    "\x84\xa6" "format" "\xac" "cachew-graph" "\xa5" "nodes"
    "\x91\x83\xa6" "inputs" "\x90\xa2" "op" "\xa5" "range" "\xa6" "params"
    "\x81\xa4" "stop" "\x03\xa4" "root" "\x00\xa7" "version" "\x01";
const size_t cwt_range3_graph_len = sizeof(cwt_range3_graph) - 1;

char *
cwt_fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	ck_assert_int_ge(vasprintf(&s, f, ap), 0);
	va_end(ap);
	return s;
}

/* ---- TLS material (the openssl command) --------------------------------- */

/*
 * One shell script makes it all: a CA and certificates it signs, a second
 * CA, and certificates whose validity ended yesterday. P-256 keys; valid
 * for a day (a test never runs longer). `openssl x509 -req` cannot set a
 * start date in OpenSSL 3.0 (-not_before came in 3.4), so the expired
 * ones come from `openssl ca` with -startdate and -enddate, which needs
 * a minimal CA database; leaf certificates carry the names tests dial
 * (localhost, 127.0.0.1) in subjectAltName.
 */
static const char tls_script[] =
    "set -e\n"
    "cd \"$1\"\n"
    "ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
    "printf 'subjectAltName=DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\\n' "
    "> leaf.ext\n"
    "newca() { openssl req -x509 $ec -keyout $1.key -out $1.pem -days 1 "
    "-subj /CN=$2; }\n"
    "leaf() { openssl req -new $ec -keyout $1.key -out $1.csr -subj /CN=$3\n"
    "  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial "
    "-days 1 -extfile leaf.ext -out $1.pem; }\n"
    "newca ca cachew-test-ca\n"
    "newca other-ca cachew-other-ca\n"
    "leaf server ca localhost\n"
    "leaf client ca cachew-test-client\n"
    "leaf other-server other-ca localhost\n"
    "mkdir db && : > db/index.txt && echo 01 > db/serial\n"
    "printf '[ca]\\ndefault_ca=c\\n[c]\\ndatabase=db/index.txt\\n"
    "new_certs_dir=db\\nserial=db/serial\\ndefault_md=sha256\\npolicy=p\\n"
    "unique_subject=no\\nx509_extensions=x\\n[p]\\ncommonName=supplied\\n"
    "[x]\\nsubjectAltName=DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\\n' "
    "> ca.cnf\n"
    "from=$(date -u -d '2 days ago' +%Y%m%d%H%M%SZ)\n"
    "to=$(date -u -d '1 day ago' +%Y%m%d%H%M%SZ)\n"
    "for who in server client; do\n"
    "  openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key "
    "-in $who.csr -startdate $from -enddate $to -notext "
    "-out $who-expired.pem\n"
    "done\n";

char *
cwt_tls_dir(void)
{
	char *dir = cwt_tmpdir();
	char *script = cwt_fmt("%s/gen.sh", dir);
	char *cmd = cwt_fmt("sh %s %s >%s/gen.log 2>&1", script, dir, dir);
	int rc;

	cwt_write_file(script, tls_script, strlen(tls_script));
	rc = system(cmd);
	if (rc != 0) {
		char *log = cwt_fmt("%s/gen.log", dir);
		char *text = cwt_slurp(log);
		ck_abort_msg("TLS test certificates (openssl; .ci/test-deps.sh "
		    "installs it): exit %d: %s", rc, text != NULL ? text : "");
	}
	free(cmd);
	free(script);
	return dir;
}

static char *tls_fixture_dir;

void
cwt_tls_setup(void)
{
	tls_fixture_dir = cwt_tls_dir();
}

void
cwt_tls_teardown(void)
{
	cwt_rmtree(tls_fixture_dir);
	free(tls_fixture_dir);
	tls_fixture_dir = NULL;
}

const char *
cwt_tls_file(const char *name)
{
	/* Per thread: tests dial from several threads at once. */
	static _Thread_local char paths[16][512];
	static _Thread_local int next;
	char *p = paths[next++ % 16];

	ck_assert_ptr_nonnull(tls_fixture_dir);
	snprintf(p, sizeof(paths[0]), "%s/%s", tls_fixture_dir, name);
	return p;
}

/* The strings of component 0 of a run, comma-joined; free with free(). */
char *
cwt_str_seq(const char *pipeline, const cachew_options *opts)
{
	cachew_element **v = NULL;
	size_t n = 0, len = 0;
	char errmsg[512] = "";
	char *s = calloc(1, 4096);
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg));

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, errmsg);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++) {
		const void *data;
		size_t dlen;
		ck_assert_int_eq(cachew_tensor_bytes_at(
		    cachew_element_component(v[i], 0), 0, &data, &dlen),
		    CACHEW_OK);
		ck_assert_uint_lt(len + dlen + 2, 4096);
		if (i > 0)
			s[len++] = ',';
		memcpy(s + len, data, dlen);
		len += dlen;
	}
	cwt_free(v, n);
	return s;
}

/* Saves after every count of elements `cut` and checks that the restored
 * iterator yields the rest: the whole run is `want` (cwt_join_i64). On one
 * dataset throughout, so that a cache() keeps its memory between runs. */
void
cwt_resumes_ds_at_every_cut(cachew_dataset *ds, const char *what,
    const cachew_options *opts, const char *want, int total)
{
	ck_assert_int_le(total, 64);
	for (int cut = 0; cut <= total; cut++) {
		cachew_iterator *it, *back;
		cachew_element *v[64];
		void *state;
		size_t len, n = 0;
		char *s;

		ck_assert_int_eq(cachew_iterator_create(&it, ds, opts),
		    CACHEW_OK);
		for (int i = 0; i < cut; i++)
			ck_assert_int_eq(cachew_iterator_next(it, &v[n++]),
			    CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_save(it, &state, &len),
		    CACHEW_OK);
		cachew_iterator_destroy(it);
		ck_assert_int_eq(cachew_iterator_restore(&back, ds, opts, state,
		    len), CACHEW_OK);
		cachew_free(state);
		while (n < 64 && cachew_iterator_next(back, &v[n]) == CACHEW_OK)
			n++;
		s = cwt_join_i64(v, n, 0);
		ck_assert_msg(strcmp(s, want) == 0, "%s cut at %d: %s, want %s",
		    what, cut, s, want);
		free(s);
		for (size_t i = 0; i < n; i++)
			cachew_element_release(v[i]);
		cachew_iterator_destroy(back);
	}
}

void
cwt_resumes_at_every_cut(const char *pipeline, const cachew_options *opts,
    const char *want, int total)
{
	cachew_dataset *ds = cwt_parse(pipeline);

	cwt_resumes_ds_at_every_cut(ds, pipeline, opts, want, total);
	cachew_dataset_release(ds);
}
