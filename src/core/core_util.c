/*
 * core_util.c - version, error strings, per-thread error detail, logging,
 * string helpers, clocks and machine facts.
 *
 * Locking: the log sink is swapped under log_lock; the per-thread errmsg
 * needs none.
 */
#include "core.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

const char *
cachew_version(void)
{
	return CACHEW_VERSION_STRING;
}

unsigned
cachew_version_number(void)
{
	return CACHEW_VERSION_NUMBER;
}

void
cachew_free(void *p)
{
	free(p);
}

/* The error numbers are ABI and wire format: they travel in error frames
 * and `error` messages, and docs/protocol.md ("Error codes") lists them.
 * The enumeration pins each value; these checks make a renumbering, or a
 * table that drifts from the documented one, fail the build. */
_Static_assert(CACHEW_OK == 0 && CACHEW_EOF == 1 && CACHEW_EINVAL == 2 &&
	CACHEW_ENOMEM == 3 && CACHEW_ERANGE == 4 && CACHEW_ENOENT == 5 &&
	CACHEW_EPARSE == 6 && CACHEW_ETYPE == 7 && CACHEW_EIO == 8 &&
	CACHEW_ECORRUPT == 9 && CACHEW_EOP == 10 && CACHEW_ECANCELED == 11 &&
	CACHEW_ETIMEDOUT == 12 && CACHEW_ECLOSED == 13 &&
	CACHEW_EEXIST == 14 && CACHEW_ENOTSUP == 15 && CACHEW_EPROTO == 16 &&
	CACHEW_EINTERNAL == 17 && CACHEW_EPERM == 18 && CACHEW_EAUTH == 19,
    "cachew_err values differ from docs/protocol.md (Error codes): "
    "the list is append-only and values are never renumbered");

static const char *const err_names[] = {
	[CACHEW_OK] = "success",
	[CACHEW_EOF] = "end of sequence",
	[CACHEW_EINVAL] = "invalid argument",
	[CACHEW_ENOMEM] = "out of memory",
	[CACHEW_ERANGE] = "value out of range",
	[CACHEW_ENOENT] = "not found",
	[CACHEW_EPARSE] = "parse error",
	[CACHEW_ETYPE] = "type or shape mismatch",
	[CACHEW_EIO] = "I/O error",
	[CACHEW_ECORRUPT] = "corrupt data",
	[CACHEW_EOP] = "operator failed",
	[CACHEW_ECANCELED] = "canceled",
	[CACHEW_ETIMEDOUT] = "timed out",
	[CACHEW_ECLOSED] = "closed",
	[CACHEW_EEXIST] = "already exists",
	[CACHEW_ENOTSUP] = "not supported",
	[CACHEW_EPROTO] = "protocol error",
	[CACHEW_EINTERNAL] = "internal error",
	[CACHEW_EPERM] = "permission denied",
	[CACHEW_EAUTH] = "authentication failed",
};
_Static_assert(sizeof(err_names) / sizeof(err_names[0]) == CWI_ERR_LAST + 1,
    "err_names must name every cachew_err up to the last, CWI_ERR_LAST");

const char *
cachew_strerror(cachew_err err)
{
	if ((unsigned)err < sizeof(err_names) / sizeof(err_names[0]) &&
	    err_names[err] != NULL)
		return err_names[err];
	return "unknown error";
}

/* ---- per-thread error detail ------------------------------------------- */

static _Thread_local char tls_errmsg[512];

cachew_err
cwi_fail(cachew_err err, const char *fmt, ...)
{
	va_list ap;
	char tmp[sizeof(tls_errmsg)];

	/* Format into a copy: the message may quote the current errmsg. */
	va_start(ap, fmt);
	if (vsnprintf(tmp, sizeof(tmp), fmt, ap) >= (int)sizeof(tmp))
		cwi_utf8_trim(tmp);
	va_end(ap);
	memcpy(tls_errmsg, tmp, sizeof(tmp));
	return err;
}

void
cwi_utf8_trim(char *s)
{
	size_t len = strlen(s), i = len, need;
	unsigned char lead;

	/* Back over at most 3 continuation bytes to the last lead byte. */
	while (i > 0 && len - i < 4 &&
	       ((unsigned char)s[i - 1] & 0xC0) == 0x80)
		i--;
	if (i == 0)
		return;
	lead = (unsigned char)s[i - 1];
	if (lead < 0xC0)
		return; /* ASCII, or not UTF-8 at all: left as it is */
	need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
	if (len - (i - 1) < need)
		s[i - 1] = '\0';
}

void
cwi_clear_errmsg(void)
{
	tls_errmsg[0] = '\0';
}

const char *
cwi_errmsg_get(void)
{
	return tls_errmsg;
}

const char *
cachew_errmsg(void)
{
	return tls_errmsg;
}

/* ---- logging ----------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static cachew_log_fn log_fn;
static void *log_ctx;
static atomic_int log_max = -1; /* -1: silent */

void
cachew_log_set(cachew_log_fn fn, void *ctx, cachew_log_level max_level)
{
	pthread_mutex_lock(&log_lock);
	log_fn = fn;
	log_ctx = ctx;
	atomic_store(&log_max, fn != NULL ? (int)max_level : -1);
	pthread_mutex_unlock(&log_lock);
}

void
cachew_log_stderr(
    void *ctx, cachew_log_level level, const char *module, const char *msg)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	(void)ctx;
	fprintf(stderr, "cachew %s [%s] %s\n",
	    names[(unsigned)level < 4 ? level : 3], module, msg);
}

bool
cwi_log_enabled(cachew_log_level level)
{
	return (int)level <= atomic_load_explicit(&log_max, memory_order_relaxed);
}

void
cwi_log(cachew_log_level level, const char *module, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	cachew_log_fn fn;
	void *ctx;

	if (!cwi_log_enabled(level))
		return;
	va_start(ap, fmt);
	if (vsnprintf(msg, sizeof(msg), fmt, ap) >= (int)sizeof(msg))
		cwi_utf8_trim(msg);
	va_end(ap);
	pthread_mutex_lock(&log_lock);
	fn = log_fn;
	ctx = log_ctx;
	pthread_mutex_unlock(&log_lock);
	if (fn != NULL)
		fn(ctx, level, module, msg);
}

/* ---- strings ----------------------------------------------------------- */

char *
cwi_strndup(const char *s, size_t n)
{
	char *p = malloc(n + 1);
	if (p == NULL)
		return NULL;
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

char *
cwi_strdup(const char *s)
{
	return cwi_strndup(s, strlen(s));
}

char *
cwi_asprintf(const char *fmt, ...)
{
	va_list ap;
	char *p = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : p;
}

void
cwi_strbuf_init(cwi_strbuf *sb)
{
	memset(sb, 0, sizeof(*sb));
}

void
cwi_strbuf_free(cwi_strbuf *sb)
{
	free(sb->data);
	cwi_strbuf_init(sb);
}

static bool
strbuf_reserve(cwi_strbuf *sb, size_t extra)
{
	size_t need, cap;
	char *p;

	if (sb->oom)
		return false;
	need = sb->len + extra + 1;
	if (need <= sb->cap)
		return true;
	cap = sb->cap != 0 ? sb->cap : 64;
	while (cap < need)
		cap *= 2;
	p = realloc(sb->data, cap);
	if (p == NULL) {
		sb->oom = true;
		return false;
	}
	sb->data = p;
	sb->cap = cap;
	return true;
}

void
cwi_strbuf_append(cwi_strbuf *sb, const void *data, size_t len)
{
	if (!strbuf_reserve(sb, len))
		return;
	memcpy(sb->data + sb->len, data, len);
	sb->len += len;
	sb->data[sb->len] = '\0';
}

void
cwi_strbuf_puts(cwi_strbuf *sb, const char *s)
{
	cwi_strbuf_append(sb, s, strlen(s));
}

void
cwi_strbuf_printf(cwi_strbuf *sb, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !strbuf_reserve(sb, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	sb->len += (size_t)n;
}

cachew_err
cwi_strbuf_finish(cwi_strbuf *sb, char **out, size_t *len)
{
	if (!strbuf_reserve(sb, 0)) {
		cwi_strbuf_free(sb);
		return cwi_fail(CACHEW_ENOMEM, "out of memory building a string");
	}
	/* Appends keep the NUL; a buffer nothing was appended to has none. */
	sb->data[sb->len] = '\0';
	*out = sb->data;
	if (len != NULL)
		*len = sb->len;
	cwi_strbuf_init(sb);
	return CACHEW_OK;
}

/* ---- time and machine -------------------------------------------------- */

uint64_t
cwi_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void
cwi_heap_release(bool all)
{
	if (all)
		cwi_buffer_cache_drop();
	else
		cwi_buffer_cache_trim();
#ifdef __GLIBC__
	/* Returns the free pages of every arena, not only the heap's top
	 * (a tuned heap keeps up to 64 MiB of top: cwi_heap_tune). */
	(void)malloc_trim(0);
#endif
}

/*
 * The heap of a process that moves large messages: one arena (M_ARENA_MAX
 * 1: threads that start later share the main heap; tcache still serves
 * small blocks without its lock), blocks up to 64 MiB in the heap, and a
 * free top kept up to 64 MiB. It was the cure for the client's page
 * faults when nng's threads allocated every received message (W2 through
 * the service: client CPU 0.88-0.92 -> 0.39-0.45 s); since received
 * bodies and large tensors are buffers of their own mapping, recycled
 * (tensor.c), it changes little there (docs/performance.md, "malloc
 * tuning"), and it is process-wide: in a user's trainer it would put
 * PyTorch's threads on one arena and keep its freed tensors resident.
 * So only cachewd tunes by default, before it starts a thread.
 */
#define HEAP_MMAP_BYTES (64 << 20)
#define HEAP_TRIM_BYTES (64 << 20)

static pthread_mutex_t heap_tune_lock = PTHREAD_MUTEX_INITIALIZER;
static int heap_tune_state = -1; /* -1: not decided yet, 0: left, 1: tuned */

static int
heap_tune_decide(bool by_default)
{
	const char *v = getenv("CACHEW_MALLOPT");
	bool on = by_default;

	if (v != NULL && strcmp(v, "0") == 0)
		on = false;
	else if (v != NULL && strcmp(v, "1") == 0)
		on = true;
#ifdef __GLIBC__
	if (on) {
		mallopt(M_ARENA_MAX, 1);
		mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_BYTES);
		mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_BYTES);
		return 1;
	}
#endif
	return 0;
}

bool
cwi_heap_tune(bool by_default)
{
	int state;

	/* The first call decides: cachewd's, in main, or a user process's
	 * first listen or dial. */
	pthread_mutex_lock(&heap_tune_lock);
	if (heap_tune_state < 0)
		heap_tune_state = heap_tune_decide(by_default);
	state = heap_tune_state;
	pthread_mutex_unlock(&heap_tune_lock);
	return state == 1;
}

void
cwi_sleep_ns(uint64_t ns)
{
	struct timespec ts = {
	    .tv_sec = (time_t)(ns / 1000000000ULL),
	    .tv_nsec = (long)(ns % 1000000000ULL),
	};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

void
cwi_cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
}

int
cwi_cond_wait_ns(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns)
{
	struct timespec ts;
	uint64_t nsec;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	nsec = (uint64_t)ts.tv_nsec + ns % 1000000000ULL;
	ts.tv_sec += (time_t)(ns / 1000000000ULL + nsec / 1000000000ULL);
	ts.tv_nsec = (long)(nsec % 1000000000ULL);
	return pthread_cond_timedwait(c, m, &ts);
}

int
cwi_online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

uint64_t
cwi_available_ram(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;

	if (f != NULL) {
		while (fgets(line, sizeof(line), f) != NULL) {
			if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
				break;
		}
		fclose(f);
	}
	if (kb == 0) {
		long pages = sysconf(_SC_AVPHYS_PAGES);
		long psize = sysconf(_SC_PAGESIZE);
		if (pages > 0 && psize > 0)
			return (uint64_t)pages * (uint64_t)psize;
		return 1ULL << 30;
	}
	return (uint64_t)kb * 1024ULL;
}

uint64_t
cwi_rng_below(cwi_rng *r, uint64_t n)
{
	uint64_t x = cwi_rng_next(r);
	__uint128_t m = (__uint128_t)x * n;
	uint64_t lo = (uint64_t)m;

	if (lo < n) {
		uint64_t t = (0 - n) % n;
		while (lo < t) {
			x = cwi_rng_next(r);
			m = (__uint128_t)x * n;
			lo = (uint64_t)m;
		}
	}
	return (uint64_t)(m >> 64);
}

double
cwi_rng_double(cwi_rng *r)
{
	return (double)(cwi_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

bool
cwi_grow(void **v, size_t *cap, size_t need, size_t size)
{
	size_t c;
	void *p;

	if (need <= *cap)
		return true;
	c = *cap != 0 ? *cap * 2 : 8;
	while (c < need)
		c *= 2;
	p = realloc(*v, c * size);
	if (p == NULL)
		return false;
	*v = p;
	*cap = c;
	return true;
}
