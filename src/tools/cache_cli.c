/*
 * cache_cli.c - `cachew cache ls|verify|rm|gc|probe`: manage the caches
 * under a cache root (docs/cache.md). Exit status: 0 ok, 1 runtime failure
 * (including a verify that found corruption), 2 usage error.
 */
#include "tools.h"
#include "../cache/cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* probe defaults: one 224x224x3 u8 crop per element, 64 MiB of them. */
#define PROBE_ELEMENT_BYTES (224u * 224u * 3u)
#define PROBE_BYTES (64u << 20)

static const char cache_usage[] =
    "usage: cachew cache <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  ls [ROOT] [--json]      list the caches under ROOT: fingerprint, "
    "state,\n"
    "                          size, elements, created, last read, "
    "pipeline\n"
    "  verify ROOT [FP...]     read and check every chunk of the given "
    "caches\n"
    "                          (default: every complete one); a corrupt "
    "cache\n"
    "                          is marked bad and the exit status is 1\n"
    "  rm ROOT FP...           remove caches (not while one is read or "
    "written)\n"
    "  gc ROOT --max-bytes N   evict least recently read caches (bad and "
    "partial\n"
    "                          ones first) until ROOT holds at most N "
    "bytes;\n"
    "                          never one being read or written\n"
    "  probe ROOT [--element-bytes N] [--bytes N] [--json]\n"
    "                          measure the storage's cache read rate "
    "(MB/s and\n"
    "                          elements/s) with a temporary probe cache\n"
    "\n"
    "ROOT is a directory, a shared file system path or s3://bucket/prefix;\n"
    "ls uses $CACHEW_CACHE_ROOT when ROOT is not given. FP is a "
    "fingerprint\n"
    "(32 hex digits) or a unique prefix of at least 8 of them. Sizes take "
    "the\n"
    "suffixes K, M, G, T (powers of 1024).\n"
    "\n"
    "exit status: 0 ok, 1 runtime failure or corruption found, 2 usage "
    "error\n";

/* ---- helpers ---------------------------------------------------------------- */

static int
usage(const char *fmt, ...) CACHEW_PRINTF(1, 2);

static int
usage(const char *fmt, ...)
{
	va_list ap;

	fputs("cachew cache: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'cachew cache --help'.\n", stderr);
	return EXIT_USAGE;
}

static const char *
errmsg(cachew_err rv)
{
	const char *m = cwi_errmsg_get();
	return m[0] != '\0' ? m : cachew_strerror(rv);
}

/* "123", "64K", "1.5G", "512MiB": bytes (powers of 1024). */
static bool
parse_size(const char *text, uint64_t *out)
{
	char *end;
	double v, mul = 1;

	errno = 0;
	if (text[0] == '-' || text[0] == '\0')
		return false;
	v = strtod(text, &end);
	if (errno != 0 || end == text)
		return false;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
		end += strlen(end);
	if (*end != '\0' || !(v * mul < 18446744073709551615.0))
		return false;
	*out = (uint64_t)(v * mul);
	return true;
}

static void
human_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	size_t u = 0;

	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", b);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void
utc_time(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (t <= 0 || gmtime_r(&tt, &tm) == NULL) {
		snprintf(buf, len, "%s", t <= 0 ? "never" : "?");
		return;
	}
	strftime(buf, len, "%Y-%m-%d %H:%M:%SZ", &tm);
}

static void
json_str(const char *s)
{
	putchar('"');
	for (; s != NULL && *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c == '\n')
			fputs("\\n", stdout);
		else if (c == '\t')
			fputs("\\t", stdout);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* Opens a root that must exist (ls, verify, rm, gc do not create one). */
static int
open_existing(const char *path, cwi_cache_root **out)
{
	struct stat sb;
	cachew_err rv;

	if (strstr(path, "://") == NULL) {
		if (stat(path, &sb) != 0) {
			fprintf(stderr, "cachew cache: %s: %s\n", path,
			    strerror(errno));
			return EXIT_RUNTIME;
		}
		if (!S_ISDIR(sb.st_mode)) {
			fprintf(stderr, "cachew cache: %s: not a directory\n",
			    path);
			return EXIT_RUNTIME;
		}
	}
	rv = cwi_cache_root_open(out, path, 0);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew cache: %s: %s\n", path, errmsg(rv));
		return EXIT_RUNTIME;
	}
	return 0;
}

static bool
is_hex(const char *s)
{
	for (; *s != '\0'; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') ||
			(*s >= 'A' && *s <= 'F')))
			return false;
	return true;
}

/* Resolves a fingerprint or a unique prefix of one (>= 8 hex digits)
 * against the listing. Prints the reason and returns 1 when it does not
 * name exactly one cache; 2 for a malformed one. */
static int
resolve_fp(const char *arg, const cwi_cache_entry *v, size_t n,
    cachew_fingerprint *out)
{
	size_t len = strlen(arg), hits = 0;
	char hex[33];

	if (len < 8 || len > 32 || !is_hex(arg))
		return usage("'%s' is not a fingerprint (32 hex digits, or a "
			     "unique prefix of at least 8)", arg);
	for (size_t i = 0; i < n; i++) {
		cachew_fingerprint_hex(&v[i].fp, hex);
		if (strncasecmp(hex, arg, len) == 0) {
			*out = v[i].fp;
			hits++;
		}
	}
	if (hits == 1)
		return 0;
	fprintf(stderr, "cachew cache: %s: %s\n", arg,
	    hits == 0 ? "no such cache" : "ambiguous prefix");
	return EXIT_RUNTIME;
}

static int
list_root(cwi_cache_root *r, const char *path, cwi_cache_entry **v,
    size_t *n)
{
	cachew_err rv = cwi_cache_list(r, v, n);

	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew cache: listing %s: %s\n", path,
		    errmsg(rv));
		return EXIT_RUNTIME;
	}
	return 0;
}

/* ---- ls ----------------------------------------------------------------------- */

static void
ls_json(const cwi_cache_entry *v, size_t n)
{
	char hex[33];

	putchar('[');
	for (size_t i = 0; i < n; i++) {
		const cwi_cache_entry *e = &v[i];
		cachew_fingerprint_hex(&e->fp, hex);
		printf("%s{\"fingerprint\":\"%s\",\"state\":", i > 0 ? "," : "",
		    hex);
		json_str(cwi_cache_state_name(e->state));
		printf(",\"bytes\":%" PRIu64 ",\"elements\":%" PRIu64
		       ",\"created\":%" PRId64 ",\"last_read\":%" PRId64
		       ",\"pipeline\":",
		    e->bytes, e->elements, e->created_unix, e->last_read_unix);
		if (e->pipeline != NULL)
			json_str(e->pipeline);
		else
			fputs("null", stdout);
		fputs(",\"reason\":", stdout);
		if (e->reason != NULL)
			json_str(e->reason);
		else
			fputs("null", stdout);
		putchar('}');
	}
	puts("]");
}

static void
ls_text(const cwi_cache_entry *v, size_t n, const char *path)
{
	char hex[33], size[32], created[32], last[32];
	uint64_t total = 0;

	if (n == 0) {
		printf("no caches under %s\n", path);
		return;
	}
	printf("%-32s  %-8s  %10s  %10s  %-20s  %-20s  %s\n", "fingerprint",
	    "state", "size", "elements", "created", "last read", "pipeline");
	for (size_t i = 0; i < n; i++) {
		const cwi_cache_entry *e = &v[i];
		cachew_fingerprint_hex(&e->fp, hex);
		human_bytes(e->bytes, size, sizeof(size));
		utc_time(e->created_unix, created, sizeof(created));
		utc_time(e->last_read_unix, last, sizeof(last));
		printf("%-32s  %-8s  %10s  %10" PRIu64 "  %-20s  %-20s  %s\n",
		    hex, cwi_cache_state_name(e->state), size, e->elements,
		    e->created_unix > 0 ? created : "-", last,
		    e->pipeline != NULL ? e->pipeline
		    : e->reason != NULL ? e->reason
					: "-");
		total += e->bytes;
	}
	human_bytes(total, size, sizeof(size));
	printf("%zu cache%s, %s under %s\n", n, n == 1 ? "" : "s", size, path);
}

static int
cmd_ls(int argc, char **argv)
{
	const char *path = NULL;
	bool json = false;
	cwi_cache_root *r = NULL;
	cwi_cache_entry *v = NULL;
	size_t n = 0;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else if (argv[i][0] == '-' && argv[i][1] != '\0')
			return usage("ls: unknown flag '%s'", argv[i]);
		else if (path == NULL)
			path = argv[i];
		else
			return usage("ls: more than one ROOT ('%s')", argv[i]);
	}
	if (path == NULL) {
		path = getenv("CACHEW_CACHE_ROOT");
		if (path == NULL || path[0] == '\0')
			return usage("ls: no ROOT given and CACHEW_CACHE_ROOT "
				     "is not set");
	}
	rc = open_existing(path, &r);
	if (rc == 0)
		rc = list_root(r, path, &v, &n);
	if (rc == 0) {
		if (json)
			ls_json(v, n);
		else
			ls_text(v, n, path);
	}
	cwi_cache_entries_free(v, n);
	cwi_cache_root_close(r);
	return rc;
}

/* ---- verify ------------------------------------------------------------------- */

static int
verify_one(cwi_cache_root *r, const cwi_cache_entry *e)
{
	char hex[33], size[32];
	cachew_err rv;

	cachew_fingerprint_hex(&e->fp, hex);
	if (e->state != CWI_CACHE_COMPLETE) {
		printf("%s  %s%s%s\n", hex, cwi_cache_state_name(e->state),
		    e->reason != NULL ? ": " : "",
		    e->reason != NULL ? e->reason : "");
		return e->state == CWI_CACHE_BAD ? EXIT_RUNTIME : 0;
	}
	cwi_clear_errmsg();
	rv = cwi_cache_verify(r, &e->fp);
	if (rv == CACHEW_OK) {
		human_bytes(e->bytes, size, sizeof(size));
		printf("%s  ok  %" PRIu64 " elements, %s\n", hex, e->elements,
		    size);
		return 0;
	}
	if (rv == CACHEW_ECORRUPT) {
		printf("%s  CORRUPT (now marked bad): %s\n", hex, errmsg(rv));
		return EXIT_RUNTIME;
	}
	fprintf(stderr, "cachew cache: verify %s: %s\n", hex, errmsg(rv));
	return EXIT_RUNTIME;
}

static int
cmd_verify(int argc, char **argv)
{
	cwi_cache_root *r = NULL;
	cwi_cache_entry *v = NULL;
	size_t n = 0, checked = 0;
	int rc, worst = 0;

	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-' && argv[i][1] != '\0')
			return usage("verify: unknown flag '%s'", argv[i]);
	if (argc < 2)
		return usage("verify: missing ROOT");
	rc = open_existing(argv[1], &r);
	if (rc == 0)
		rc = list_root(r, argv[1], &v, &n);
	for (int i = 2; rc == 0 && i < argc; i++) {
		cachew_fingerprint fp;
		int one = resolve_fp(argv[i], v, n, &fp);
		if (one == EXIT_USAGE) {
			rc = one;
			break;
		}
		if (one != 0) {
			worst = EXIT_RUNTIME;
			continue;
		}
		for (size_t k = 0; k < n; k++)
			if (v[k].fp.hi == fp.hi && v[k].fp.lo == fp.lo) {
				one = verify_one(r, &v[k]);
				checked++;
			}
		if (one != 0)
			worst = one;
	}
	if (rc == 0 && argc == 2) {
		for (size_t k = 0; k < n; k++) {
			int one;
			if (v[k].state == CWI_CACHE_WRITING ||
			    v[k].state == CWI_CACHE_PARTIAL)
				continue;
			one = verify_one(r, &v[k]);
			checked++;
			if (one != 0)
				worst = one;
		}
		if (checked == 0)
			printf("no complete caches under %s\n", argv[1]);
	}
	cwi_cache_entries_free(v, n);
	cwi_cache_root_close(r);
	return rc != 0 ? rc : worst;
}

/* ---- rm --------------------------------------------------------------------------- */

static int
cmd_rm(int argc, char **argv)
{
	cwi_cache_root *r = NULL;
	cwi_cache_entry *v = NULL;
	size_t n = 0;
	int rc, worst = 0;

	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-' && argv[i][1] != '\0')
			return usage("rm: unknown flag '%s'", argv[i]);
	if (argc < 3)
		return usage(argc < 2 ? "rm: missing ROOT and FP"
				      : "rm: missing FP (the cache to remove)");
	for (int i = 2; i < argc; i++)
		if (strlen(argv[i]) < 8 || strlen(argv[i]) > 32 ||
		    !is_hex(argv[i]))
			return usage("'%s' is not a fingerprint (32 hex "
				     "digits, or a unique prefix of at least "
				     "8)", argv[i]);
	rc = open_existing(argv[1], &r);
	if (rc == 0)
		rc = list_root(r, argv[1], &v, &n);
	for (int i = 2; rc == 0 && i < argc; i++) {
		cachew_fingerprint fp;
		char hex[33];
		cachew_err rv;

		if (resolve_fp(argv[i], v, n, &fp) != 0) {
			worst = EXIT_RUNTIME;
			continue;
		}
		cachew_fingerprint_hex(&fp, hex);
		cwi_clear_errmsg();
		rv = cwi_cache_remove(r, &fp);
		if (rv == CACHEW_OK) {
			printf("removed %s\n", hex);
			continue;
		}
		fprintf(stderr, "cachew cache: rm %s: %s\n", hex,
		    rv == CACHEW_EIO && cwi_errmsg_get()[0] == '\0'
			? "it is being read or written"
			: errmsg(rv));
		worst = EXIT_RUNTIME;
	}
	cwi_cache_entries_free(v, n);
	cwi_cache_root_close(r);
	return rc != 0 ? rc : worst;
}

/* ---- gc --------------------------------------------------------------------------- */

static int
cmd_gc(int argc, char **argv)
{
	const char *path = NULL, *max = NULL;
	cwi_cache_root *r = NULL;
	uint64_t max_bytes = 0, freed = 0;
	cachew_err rv;
	char b1[32];
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--max-bytes") == 0) {
			if (i + 1 >= argc)
				return usage("gc: --max-bytes expects a size");
			max = argv[++i];
		} else if (strncmp(argv[i], "--max-bytes=", 12) == 0) {
			max = argv[i] + 12;
		} else if (argv[i][0] == '-' && argv[i][1] != '\0') {
			return usage("gc: unknown flag '%s'", argv[i]);
		} else if (path == NULL) {
			path = argv[i];
		} else {
			return usage("gc: unexpected argument '%s'", argv[i]);
		}
	}
	if (path == NULL)
		return usage("gc: missing ROOT");
	if (max == NULL)
		return usage("gc: missing --max-bytes N");
	if (!parse_size(max, &max_bytes))
		return usage("gc: --max-bytes '%s' is not a size (e.g. 0, "
			     "500M, 20G)", max);
	rc = open_existing(path, &r);
	if (rc != 0)
		return rc;
	rv = cwi_cache_gc(r, max_bytes, &freed);
	human_bytes(freed, b1, sizeof(b1));
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew cache: gc %s: %s (freed %s)\n", path,
		    errmsg(rv), b1);
		rc = EXIT_RUNTIME;
	} else {
		printf("freed %s (%" PRIu64 " bytes) under %s\n", b1, freed,
		    path);
	}
	cwi_cache_root_close(r);
	return rc;
}

/* ---- probe ------------------------------------------------------------------------ */

static int
cmd_probe(int argc, char **argv)
{
	const char *path = NULL;
	uint64_t elem = PROBE_ELEMENT_BYTES, bytes = PROBE_BYTES;
	cwi_cache_probe_result res;
	cwi_cache_root *r = NULL;
	bool json = false;
	cachew_err rv;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = NULL;
		uint64_t *dst = NULL;
		int m;

		if (strcmp(a, "--json") == 0) {
			json = true;
			continue;
		}
		if ((m = cwi_flag_value(argc, argv, &i, "--element-bytes",
			 &val)) != 0)
			dst = &elem;
		else if ((m = cwi_flag_value(argc, argv, &i, "--bytes",
			      &val)) != 0)
			dst = &bytes;
		if (dst != NULL) {
			if (m < 0 || !parse_size(val, dst) || *dst == 0)
				return usage("probe: %.*s expects a positive "
					     "size", (int)strcspn(a, "="), a);
		} else if (a[0] == '-' && a[1] != '\0') {
			return usage("probe: unknown flag '%s'", a);
		} else if (path == NULL) {
			path = a;
		} else {
			return usage("probe: unexpected argument '%s'", a);
		}
	}
	if (path == NULL)
		return usage("probe: missing ROOT");
	if (elem > bytes)
		return usage("probe: --element-bytes %" PRIu64 " is larger "
			     "than --bytes %" PRIu64, elem, bytes);
	rv = cwi_cache_root_open(&r, path, 0);
	if (rv == CACHEW_OK)
		rv = cwi_cache_probe(r, (size_t)elem, bytes, &res);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew cache: probe %s: %s\n", path,
		    errmsg(rv));
		cwi_cache_root_close(r);
		return EXIT_RUNTIME;
	}
	if (json)
		printf("{\"root\":\"%s\",\"element_bytes\":%" PRIu64
		       ",\"probe_bytes\":%" PRIu64 ",\"read_mb_per_s\":%.3f,"
		       "\"read_elements_per_s\":%.3f,\"write_mb_per_s\":%.3f}\n",
		    path, elem, bytes, res.read_mb_per_s,
		    res.read_elements_per_s, res.write_mb_per_s);
	else
		printf("root            %s\n"
		       "element bytes   %" PRIu64 "\n"
		       "probe bytes     %" PRIu64 "\n"
		       "read MB/s       %.1f\n"
		       "read elements/s %.0f\n"
		       "write MB/s      %.1f\n",
		    path, elem, bytes, res.read_mb_per_s,
		    res.read_elements_per_s, res.write_mb_per_s);
	cwi_cache_root_close(r);
	return 0;
}

/* ---- dispatch --------------------------------------------------------------------- */

int
cwi_cache_cli(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*main)(int argc, char **argv);
	} cmds[] = {
	    {"ls", cmd_ls},
	    {"verify", cmd_verify},
	    {"rm", cmd_rm},
	    {"gc", cmd_gc},
	    {"probe", cmd_probe},
	};

	if (argc < 2)
		return usage("missing a command (ls, verify, rm, gc, probe)");
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		fputs(cache_usage, stdout);
		return 0;
	}
	for (int i = 2; i < argc; i++)
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0) {
			fputs(cache_usage, stdout);
			return 0;
		}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].main(argc - 1, argv + 1);
	return usage("unknown command '%s'", argv[1]);
}
