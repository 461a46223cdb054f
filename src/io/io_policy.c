/*
 * io_policy.c - the access policy of a confined process (io_policy.h).
 *
 * Why process-wide and set once, rather than carried by each pipeline or
 * lease: the policy belongs to the process, not to a job. Every pipeline
 * a `cachewd --role=worker` runs comes from users whom its operator does
 * not trust with the worker's own rights, and the same rule holds for all
 * of them; it is installed by cwi_worker_start before the worker takes a
 * task and never changes after, like the registries ("the only
 * process-wide state is the registries, filled at init and read-only
 * after"). Carried per pipeline, it would be a pointer threaded through
 * every source, reader, operator and io call that opens a file
 * (cwi_file_open, cwi_paths_expand and cwi_io_list take none), and one
 * call that forgot it would open unchecked. Here the checks sit in the few
 * choke points that every open goes through: cwi_file_open_range and
 * cwi_local_open (every file a source, read_file or a cache reader opens),
 * cwi_paths_expand and cwi_io_list (globs and listings), the HTTP engine's
 * socket and request callbacks (the addresses a URL and its redirects
 * connect to), the cache operators' roots and tfrecord_write. A process
 * that installs nothing (a training process, the embedded service in it,
 * `cachew`) reads and writes with its own user's rights, unrestricted.
 *
 * Local paths are compared by real path (realpath(3): symlinks and ".."
 * resolved), component-wise ("/data" allows "/data/x", not "/data2"); a
 * path that does not exist yet (a file about to be written) resolves
 * through its deepest existing ancestor. An open file is checked again by
 * where its descriptor leads (/proc/self/fd), so a symlink swapped between
 * the check and the open is caught. URLs are compared by prefix, scheme
 * and host case-insensitively, at a boundary ("https://h/data" allows
 * "https://h/data/x" and "https://h/data?x", not "https://h/database"); a
 * URL with a "." or ".." path segment (also percent-encoded) is refused
 * rather than normalised, since curl, S3 and web servers each resolve
 * those their own way.
 */
#include "io_policy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* The most of the allowed list that a refusal quotes. */
#define ALLOWED_TEXT_MAX 400

typedef struct ip_addr {
	int family; /* AF_INET or AF_INET6 */
	uint8_t b[16];
} ip_addr;

typedef struct prefix {
	char *given;       /* as the operator wrote it, for messages */
	char *text;        /* local: a real path; URL: its url_key */
	bool url;
	bool literal;      /* a URL whose host is an IP address: addr */
	ip_addr addr;
	uint64_t capacity; /* write roots */
} prefix;

typedef struct policy {
	prefix *read, *write;
	size_t nread, nwrite;
	char *read_text, *write_text; /* the allowed lists of messages */
} policy;

static _Atomic(policy *) installed;

static const policy *
current(void)
{
	return atomic_load_explicit(&installed, memory_order_acquire);
}

bool
cwi_io_confined(void)
{
	return current() != NULL;
}

/* ---- URLs ----------------------------------------------------------------- */

static bool
is_url(const char *s)
{
	return strstr(s, "://") != NULL;
}

/* "file:///a" is the local path "/a". */
static const char *
strip_file_scheme(const char *s)
{
	return strncmp(s, "file://", 7) == 0 ? s + 7 : s;
}

/* Where a URL's path (or query) starts. */
static const char *
url_path(const char *url)
{
	const char *a = strstr(url, "://");

	a = a != NULL ? a + 3 : url;
	return a + strcspn(a, "/?#");
}

/* A heap copy of the URL with its scheme and authority lower-cased, the
 * form prefixes are compared in; NULL on ENOMEM. */
static char *
url_key(const char *url)
{
	char *k = cwi_strdup(url);
	char *end;

	if (k == NULL)
		return NULL;
	end = k + (url_path(url) - url);
	for (char *p = k; p < end; p++)
		*p = (char)tolower((unsigned char)*p);
	return k;
}

/* The host of a URL (without an IPv6 literal's brackets) and its port,
 * as spans of the URL; lengths 0 when absent. */
typedef struct url_parts {
	const char *host, *port;
	size_t host_len, port_len;
} url_parts;

static url_parts
url_split(const char *url)
{
	url_parts u = {NULL, NULL, 0, 0};
	const char *a = strstr(url, "://"), *end, *at, *colon;

	if (a == NULL)
		return u;
	a += 3;
	end = url_path(url);
	at = memrchr(a, '@', (size_t)(end - a));
	if (at != NULL)
		a = at + 1;
	if (*a == '[') {
		const char *rb = memchr(a, ']', (size_t)(end - a));
		if (rb == NULL)
			return u;
		u.host = a + 1;
		u.host_len = (size_t)(rb - a - 1);
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
	} else {
		colon = memchr(a, ':', (size_t)(end - a));
		u.host = a;
		u.host_len = (size_t)((colon != NULL ? colon : end) - a);
	}
	if (colon != NULL) {
		u.port = colon + 1;
		u.port_len = (size_t)(end - colon - 1);
	}
	return u;
}

/* True when a segment of the URL's path is "." or "..", also spelled with
 * %2e, between '/', '\\', %2f or %5c. */
static bool
has_dot_segment(const char *url)
{
	const char *p = url_path(url);

	while (*p != '\0' && *p != '?' && *p != '#') {
		size_t dots = 0;
		bool other = false;

		for (;;) {
			if (*p == '/' || *p == '\\') {
				p++;
				break;
			}
			if (p[0] == '%' && p[1] != '\0' &&
			    (strncasecmp(p, "%2f", 3) == 0 ||
				strncasecmp(p, "%5c", 3) == 0)) {
				p += 3;
				break;
			}
			if (*p == '\0' || *p == '?' || *p == '#')
				break;
			if (*p == '.') {
				dots++;
				p++;
			} else if (strncasecmp(p, "%2e", 3) == 0) {
				dots++;
				p += 3;
			} else {
				other = true;
				p++;
			}
		}
		if (!other && (dots == 1 || dots == 2))
			return true;
	}
	return false;
}

/* Whether prefix p admits the URL whose url_key is key. */
static bool
url_admitted(const prefix *p, const char *key)
{
	size_t n = strlen(p->text);
	char next;

	/* A shorter key differs from the prefix at its NUL. */
	if (!p->url || n == 0 || strncmp(key, p->text, n) != 0)
		return false;
	next = key[n];
	return p->text[n - 1] == '/' || next == '\0' || next == '/' ||
	       next == '?' || next == '#';
}

/* ---- addresses ------------------------------------------------------------ */

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4 address. */
static void
unmap(ip_addr *a)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	    0xff, 0xff};

	if (a->family == AF_INET6 && memcmp(a->b, mapped, 12) == 0) {
		memmove(a->b, a->b + 12, 4);
		memset(a->b + 4, 0, 12);
		a->family = AF_INET;
	}
}

static bool
parse_ip(const char *s, size_t len, ip_addr *a)
{
	char buf[INET6_ADDRSTRLEN + 1];

	memset(a, 0, sizeof(*a));
	if (len == 0 || len >= sizeof(buf))
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (inet_pton(AF_INET, buf, a->b) == 1) {
		a->family = AF_INET;
		return true;
	}
	if (inet_pton(AF_INET6, buf, a->b) == 1) {
		a->family = AF_INET6;
		unmap(a);
		return true;
	}
	return false;
}

static bool
ip_equal(const ip_addr *x, const ip_addr *y)
{
	return x->family == y->family &&
	       memcmp(x->b, y->b, x->family == AF_INET ? 4 : 16) == 0;
}

/* NULL for a public address, else what it is ("a loopback"). 0.0.0.0
 * and :: count: connecting to them reaches this host. */
static const char *
address_kind(const ip_addr *a)
{
	const uint8_t *b = a->b;
	static const uint8_t zero[16];

	if (a->family == AF_INET) {
		if (b[0] == 127)
			return "a loopback";
		if (b[0] == 10 || (b[0] == 172 && (b[1] & 0xf0) == 16) ||
		    (b[0] == 192 && b[1] == 168))
			return "a private";
		if (b[0] == 169 && b[1] == 254)
			return "a link-local";
		if (b[0] == 0)
			return "an unspecified (this host)";
		if (b[0] == 100 && (b[1] & 0xc0) == 64)
			return "a shared (carrier-grade NAT)";
		if (b[0] >= 224)
			return "a multicast or reserved";
		return NULL;
	}
	if (memcmp(b, zero, 15) == 0 && (b[15] == 1 || b[15] == 0))
		return b[15] == 1 ? "a loopback" : "an unspecified (this host)";
	if ((b[0] & 0xfe) == 0xfc)
		return "a unique local";
	if (b[0] == 0xfe && (b[1] & 0x80) == 0x80)
		return "a link-local";
	if (b[0] == 0xff)
		return "a multicast";
	return NULL;
}

/* ---- local paths ---------------------------------------------------------- */

/* Whether real path p lies in directory d (a real path). */
static bool
path_inside(const char *p, const char *d)
{
	size_t n = strlen(d);

	if (strcmp(d, "/") == 0)
		return true;
	return strncmp(p, d, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

/* False when a relative path has a "." or ".." component. */
static bool
plain_components(const char *rest)
{
	while (*rest != '\0') {
		size_t n = strcspn(rest, "/");
		if ((n == 1 && rest[0] == '.') ||
		    (n == 2 && rest[0] == '.' && rest[1] == '.'))
			return false;
		rest += n;
		rest += strspn(rest, "/");
	}
	return true;
}

/* False when a path has a ".." component. */
static bool
no_dotdot(const char *p)
{
	while (*p != '\0') {
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return false;
		p += n;
		p += strspn(p, "/");
	}
	return true;
}

/* The real path of `path` in out (PATH_MAX bytes). A path that does not
 * exist (yet: a file about to be written) resolves through its deepest
 * existing ancestor with the rest appended as written. False when that
 * rest has a "." or ".." component, or starts with something that exists
 * but does not resolve (a dangling symlink, which open(2) with O_CREAT
 * would follow anywhere), or the path does not fit. */
static bool
resolve_local(const char *path, char *out)
{
	char abs[PATH_MAX], probe[PATH_MAX];
	size_t end, len;
	struct stat st;

	if (realpath(path, out) != NULL)
		return true;
	if (path[0] == '/') {
		len = (size_t)snprintf(abs, sizeof(abs), "%s", path);
	} else {
		if (getcwd(probe, sizeof(probe)) == NULL)
			return false;
		len = (size_t)snprintf(abs, sizeof(abs), "%s/%s", probe, path);
	}
	if (len >= sizeof(abs))
		return false;
	while (len > 1 && abs[len - 1] == '/')
		abs[--len] = '\0';
	for (end = len;;) {
		const char *slash = memrchr(abs, '/', end);
		size_t cut = (size_t)(slash - abs);
		const char *rest = abs + cut + 1;

		memcpy(probe, abs, cut > 0 ? cut : 1);
		probe[cut > 0 ? cut : 1] = '\0';
		if (realpath(probe, out) != NULL) {
			size_t first = strcspn(rest, "/");
			const char *sep = strcmp(out, "/") == 0 ? "" : "/";
			if (!plain_components(rest) ||
			    (size_t)snprintf(probe, sizeof(probe), "%s%s%.*s", out,
				sep, (int)first, rest) >= sizeof(probe) ||
			    lstat(probe, &st) == 0)
				return false;
			len = strlen(out);
			return (size_t)snprintf(out + len, PATH_MAX - len, "%s%s",
				   sep, rest) < PATH_MAX - len;
		}
		if (cut == 0)
			return false;
		end = cut;
	}
}

static bool
local_allowed(const policy *pol, const char *real, bool write)
{
	for (size_t i = 0; i < pol->nwrite; i++)
		if (!pol->write[i].url && path_inside(real, pol->write[i].text))
			return true;
	for (size_t i = 0; !write && i < pol->nread; i++)
		if (!pol->read[i].url && path_inside(real, pol->read[i].text))
			return true;
	return false;
}

/* ---- refusals ------------------------------------------------------------- */

static cachew_err
refuse(const policy *pol, const char *what, const char *real, bool write)
{
	const char *flag = write ? "--cache-root" : "--allow-read";
	const char *allowed = write ? pol->write_text : pol->read_text;

	if (real != NULL && strcmp(real, what) != 0)
		return cwi_fail(CACHEW_EPERM, "%s: resolves to %s, outside the "
		    "worker's %s (allowed: %s)", what, real, flag, allowed);
	return cwi_fail(CACHEW_EPERM, "%s: outside the worker's %s "
	    "(allowed: %s)", what, flag, allowed);
}

static cachew_err
check_local(const policy *pol, const char *path, const char *display,
    bool write)
{
	char real[PATH_MAX];

	if (!resolve_local(path, real))
		return cwi_fail(CACHEW_EPERM, "%s: does not resolve to a path "
		    "under the worker's %s (a '.' or '..' after a missing "
		    "directory, or a dangling symlink)", display,
		    write ? "--cache-root" : "--allow-read");
	if (local_allowed(pol, real, write))
		return CACHEW_OK;
	return refuse(pol, display, real, write);
}

/* The first prefix of the policy's read (or write) list admitting url. */
static const prefix *
url_prefix(const policy *pol, const char *key, bool write)
{
	for (size_t i = 0; i < pol->nwrite; i++)
		if (url_admitted(&pol->write[i], key))
			return &pol->write[i];
	for (size_t i = 0; !write && i < pol->nread; i++)
		if (url_admitted(&pol->read[i], key))
			return &pol->read[i];
	return NULL;
}

static cachew_err
check_url(const policy *pol, const char *url, const char *display,
    bool write)
{
	char *key;
	bool ok;

	if (has_dot_segment(url))
		return cwi_fail(CACHEW_EPERM, "%s: a '.' or '..' path segment, "
		    "which a worker confined by --allow-read does not follow",
		    display);
	key = url_key(url);
	if (key == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	ok = url_prefix(pol, key, write) != NULL;
	free(key);
	return ok ? CACHEW_OK : refuse(pol, display, NULL, write);
}

/* A local path, file:// URL or remote URL, read or written. */
static cachew_err
check_path(const policy *pol, const char *path, bool write)
{
	const char *p = strip_file_scheme(path);

	return is_url(p) ? check_url(pol, p, path, write)
			 : check_local(pol, p, path, write);
}

/* ---- the checks ----------------------------------------------------------- */

cachew_err
cwi_io_check_read(const char *path)
{
	const policy *pol = current();

	return pol != NULL ? check_path(pol, path, false) : CACHEW_OK;
}

cachew_err
cwi_io_check_read_fd(int fd, const char *path)
{
	const policy *pol = current();
	char link[64], real[PATH_MAX];
	ssize_t n;

	if (pol == NULL)
		return CACHEW_OK;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, real, sizeof(real) - 1);
	if (n <= 0 || real[0] != '/')
		return CACHEW_OK; /* no /proc: the check before the open holds */
	real[n] = '\0';
	return local_allowed(pol, real, false) ? CACHEW_OK
					       : refuse(pol, path, real, false);
}

cachew_err
cwi_io_check_glob(const char *pattern)
{
	const policy *pol = current();
	const char *p, *slash;
	size_t lit;
	char *dir;
	cachew_err rv;

	if (pol == NULL)
		return CACHEW_OK;
	p = strip_file_scheme(pattern);
	lit = strcspn(p, "*?[");
	if (is_url(p)) {
		dir = cwi_strndup(p, lit);
		rv = dir != NULL ? check_url(pol, dir, pattern, false)
				 : cwi_fail(CACHEW_ENOMEM, "out of memory");
		free(dir);
		return rv;
	}
	/* Only the directory before the first wildcard is checked before
	 * the listing: a ".." after a wildcard (/data/[x]/../../etc/...)
	 * would list outside it, and the refusals of its matches would
	 * tell what is there. */
	if (!no_dotdot(p))
		return cwi_fail(CACHEW_EPERM, "%s: a '..' in a pattern is not "
		    "allowed under the worker's --allow-read", pattern);
	slash = memrchr(p, '/', lit);
	if (slash == NULL)
		dir = cwi_strdup(".");
	else
		dir = cwi_strndup(p, slash == p ? 1 : (size_t)(slash - p));
	if (dir == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = check_local(pol, dir, pattern, false);
	free(dir);
	return rv;
}

cachew_err
cwi_io_check_write(const char *path)
{
	const policy *pol = current();

	return pol != NULL ? check_path(pol, path, true) : CACHEW_OK;
}

bool
cwi_io_may_write(const char *path)
{
	if (current() == NULL)
		return true;
	if (cwi_io_check_write(path) == CACHEW_OK)
		return true;
	cwi_clear_errmsg();
	return false;
}

/* Whether two URL keys are the same root, trailing slashes aside. */
static bool
same_url_root(const char *a, const char *b)
{
	size_t na = strlen(a), nb = strlen(b);

	while (na > 1 && a[na - 1] == '/')
		na--;
	while (nb > 1 && b[nb - 1] == '/')
		nb--;
	return na == nb && memcmp(a, b, na) == 0;
}

/* The write root that `root` is, or NULL. */
static const prefix *
root_of(const policy *pol, const char *root)
{
	char real[PATH_MAX], *key = NULL;
	const prefix *found = NULL;

	if (is_url(root)) {
		key = url_key(root);
		if (key == NULL)
			return NULL;
	} else if (!resolve_local(root, real)) {
		return NULL;
	}
	for (size_t i = 0; i < pol->nwrite && found == NULL; i++) {
		const prefix *w = &pol->write[i];
		if (w->url != (key != NULL))
			continue;
		if (key != NULL ? same_url_root(key, w->text)
				: strcmp(real, w->text) == 0)
			found = w;
	}
	free(key);
	return found;
}

cachew_err
cwi_io_check_cache_root(const char *root, uint64_t *capacity)
{
	const policy *pol = current();
	const prefix *w;
	cachew_err rv;

	*capacity = 0;
	if (pol == NULL)
		return CACHEW_OK;
	rv = check_path(pol, root, true);
	if (rv != CACHEW_OK)
		return rv;
	w = root_of(pol, strip_file_scheme(root));
	if (w == NULL)
		return cwi_fail(CACHEW_EPERM, "cache root %s: below a "
		    "--cache-root, not one: the worker keeps caches directly "
		    "in one of its cache roots, whose capacity counts them "
		    "(allowed: %s)", root, pol->write_text);
	*capacity = w->capacity;
	return CACHEW_OK;
}

static cachew_err
check_peer(const char *url, ip_addr *a)
{
	const policy *pol = current();
	const char *kind, *scheme_end;
	char ip[INET6_ADDRSTRLEN], *key;
	url_parts u;
	bool ok = false;

	if (pol == NULL)
		return CACHEW_OK;
	unmap(a);
	kind = address_kind(a);
	if (kind == NULL)
		return CACHEW_OK;
	key = url_key(url);
	if (key == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < pol->nread && !ok; i++)
		ok = pol->read[i].literal && ip_equal(&pol->read[i].addr, a) &&
		     url_admitted(&pol->read[i], key);
	free(key);
	if (ok)
		return CACHEW_OK;
	inet_ntop(a->family, a->b, ip, sizeof(ip));
	u = url_split(url);
	scheme_end = strstr(url, "://");
	return cwi_fail(CACHEW_EPERM, "%s: connects to %s, %s address, which "
	    "a worker reaches only through an --allow-read prefix naming that "
	    "address (such as %.*s://%s%s%s%s%.*s/)", url, ip, kind,
	    scheme_end != NULL ? (int)(scheme_end - url) : 4, url,
	    a->family == AF_INET6 ? "[" : "", ip,
	    a->family == AF_INET6 ? "]" : "", u.port_len > 0 ? ":" : "",
	    (int)u.port_len, u.port_len > 0 ? u.port : "");
}

cachew_err
cwi_io_check_peer(const char *url, const struct sockaddr *sa)
{
	ip_addr a;

	if (current() == NULL)
		return CACHEW_OK;
	memset(&a, 0, sizeof(a));
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		a.family = AF_INET;
		memcpy(a.b, &in->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		a.family = AF_INET6;
		memcpy(a.b, &in6->sin6_addr, 16);
	} else {
		return cwi_fail(CACHEW_EPERM, "%s: connects to an address of "
		    "family %d, which a confined worker does not use", url,
		    (int)sa->sa_family);
	}
	return check_peer(url, &a);
}

cachew_err
cwi_io_check_peer_text(const char *url, const char *ip)
{
	ip_addr a;

	if (current() == NULL)
		return CACHEW_OK;
	if (ip == NULL || !parse_ip(ip, strlen(ip), &a))
		return cwi_fail(CACHEW_EPERM, "%s: connects to '%s', not an IP "
		    "address a confined worker can check", url,
		    ip != NULL ? ip : "");
	return check_peer(url, &a);
}

/* ---- installing ----------------------------------------------------------- */

static void
prefixes_free(prefix *v, size_t n)
{
	for (size_t i = 0; v != NULL && i < n; i++) {
		free(v[i].given);
		free(v[i].text);
	}
	free(v);
}

static bool
scheme_ok(const char *url, bool write)
{
	static const char *const schemes[] = {"s3://", "gs://", "http://",
	    "https://"};
	size_t n = write ? 1 : sizeof(schemes) / sizeof(schemes[0]);

	for (size_t i = 0; i < n; i++)
		if (strncasecmp(url, schemes[i], strlen(schemes[i])) == 0)
			return true;
	return false;
}

static cachew_err
prefix_init(prefix *p, const char *given, bool write)
{
	const char *flag = write ? "--cache-root" : "--allow-read";
	const char *s = strip_file_scheme(given);
	char real[PATH_MAX];
	struct stat st;

	p->given = cwi_strdup(given);
	if (p->given == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (*s == '\0')
		return cwi_fail(CACHEW_EINVAL, "%s: an empty path", flag);
	if (is_url(s)) {
		url_parts u;
		if (!scheme_ok(s, write))
			return cwi_fail(CACHEW_EINVAL, "%s %s: not a %s", flag,
			    given, write ? "local directory or s3://bucket/prefix"
					 : "local directory or http://, https://, "
					   "s3:// or gs:// URL prefix");
		if (has_dot_segment(s))
			return cwi_fail(CACHEW_EINVAL, "%s %s: a '.' or '..' "
			    "path segment", flag, given);
		p->url = true;
		p->text = url_key(s);
		if (p->text == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		u = url_split(p->text);
		p->literal = parse_ip(u.host, u.host_len, &p->addr);
		return CACHEW_OK;
	}
	if (realpath(s, real) == NULL || stat(real, &st) != 0)
		return cwi_fail(CACHEW_EINVAL, "%s %s: %s", flag, given,
		    strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return cwi_fail(CACHEW_EINVAL, "%s %s: not a directory", flag,
		    given);
	p->text = cwi_strdup(real);
	return p->text != NULL ? CACHEW_OK
			       : cwi_fail(CACHEW_ENOMEM, "out of memory");
}

/* "a, b, c" of the prefixes as given (and of `more`), or "none". */
static char *
allowed_text(const prefix *v, size_t n, const prefix *more, size_t nmore)
{
	cwi_strbuf sb;
	char *out = NULL;
	size_t len;

	cwi_strbuf_init(&sb);
	for (size_t i = 0; i < n + nmore; i++) {
		const prefix *p = i < n ? &v[i] : &more[i - n];
		if (sb.len > ALLOWED_TEXT_MAX) {
			cwi_strbuf_puts(&sb, ", ...");
			break;
		}
		cwi_strbuf_printf(&sb, "%s%s", i > 0 ? ", " : "", p->given);
	}
	if (sb.len == 0)
		cwi_strbuf_puts(&sb, "none");
	if (cwi_strbuf_finish(&sb, &out, &len) != CACHEW_OK)
		return NULL;
	return out;
}

static void
policy_free(policy *pol)
{
	if (pol == NULL)
		return;
	prefixes_free(pol->read, pol->nread);
	prefixes_free(pol->write, pol->nwrite);
	free(pol->read_text);
	free(pol->write_text);
	free(pol);
}

cachew_err
cwi_io_policy_install(const char *const *read, size_t nread,
    const cwi_io_write_root *write, size_t nwrite)
{
	policy *pol = calloc(1, sizeof(*pol)), *none = NULL;
	cachew_err rv = CACHEW_OK;

	if (pol == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pol->read = calloc(nread + 1, sizeof(*pol->read));
	pol->write = calloc(nwrite + 1, sizeof(*pol->write));
	if (pol->read == NULL || pol->write == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	pol->nread = nread;
	pol->nwrite = nwrite;
	for (size_t i = 0; i < nread && rv == CACHEW_OK; i++)
		rv = prefix_init(&pol->read[i], read[i], false);
	for (size_t i = 0; i < nwrite && rv == CACHEW_OK; i++) {
		rv = prefix_init(&pol->write[i], write[i].path, true);
		pol->write[i].capacity = write[i].capacity;
	}
	if (rv != CACHEW_OK)
		goto fail;
	pol->read_text = allowed_text(pol->read, nread, pol->write, nwrite);
	pol->write_text = allowed_text(pol->write, nwrite, NULL, 0);
	if (pol->read_text == NULL || pol->write_text == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if (!atomic_compare_exchange_strong_explicit(&installed, &none, pol,
		memory_order_acq_rel, memory_order_acquire)) {
		rv = cwi_fail(CACHEW_EEXIST, "this process's access policy is "
		    "installed already");
		goto fail;
	}
	return CACHEW_OK;
fail:
	policy_free(pol);
	return rv;
}
