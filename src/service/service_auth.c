/*
 * service_auth.c - role tokens (service_auth.h).
 *
 * The table is small (one line per tenant, worker pool and operator), so
 * a lookup compares the token with every entry, each in time independent
 * of where the bytes differ: a peer learns nothing from how long a
 * refusal took.
 */
#include "service_auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct auth_entry {
	cwi_auth_role role;
	char name[CWI_AUTH_MAX_NAME + 1];
	char token[CWI_PROTO_MAX_TOKEN + 1];
	size_t token_len;
} auth_entry;

struct cwi_auth_tokens {
	auth_entry *entries;
	size_t n, cap;
};

static const char *const role_names[] = {
	[CWI_ROLE_NONE] = "none",
	[CWI_ROLE_CLIENT] = "client",
	[CWI_ROLE_WORKER] = "worker",
	[CWI_ROLE_ADMIN] = "admin",
};

const char *
cwi_auth_role_name(cwi_auth_role role)
{
	if ((unsigned)role < sizeof(role_names) / sizeof(role_names[0]))
		return role_names[role];
	return "?";
}

static bool
name_ok(const char *s, size_t len)
{
	if (len == 0 || len > CWI_AUTH_MAX_NAME)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_' &&
		    s[i] != '.' && s[i] != '-')
			return false;
	return true;
}

/* Equal in time that depends only on the lengths. */
static bool
token_equal(const auth_entry *e, const char *token, size_t len)
{
	unsigned char diff = (unsigned char)(e->token_len != len);

	for (size_t i = 0; i < len && i < CWI_PROTO_MAX_TOKEN; i++)
		diff |= (unsigned char)(e->token[i < e->token_len ? i : 0] ^
					token[i]);
	return diff == 0;
}

static const auth_entry *
find(const cwi_auth_tokens *t, const char *token)
{
	const auth_entry *hit = NULL;
	size_t len = strlen(token);

	for (size_t i = 0; i < t->n; i++)
		if (token_equal(&t->entries[i], token, len) && hit == NULL)
			hit = &t->entries[i];
	return hit;
}

/* One line's three fields into e; the message names file and line. */
static cachew_err
parse_line(const char *path, unsigned lineno, char *line, auth_entry *e)
{
	char *field[4] = {NULL, NULL, NULL, NULL};
	size_t nf = 0;
	char *save = NULL;

	for (char *tok = strtok_r(line, " \t", &save); tok != NULL && nf < 4;
	     tok = strtok_r(NULL, " \t", &save))
		field[nf++] = tok;
	if (nf != 3)
		return cwi_fail(CACHEW_EINVAL, "%s:%u: expected '<role> <name> "
		    "<token>', found %s%zu fields", path, lineno,
		    nf > 3 ? "more than " : "", nf > 3 ? (size_t)3 : nf);
	memset(e, 0, sizeof(*e));
	for (int r = CWI_ROLE_CLIENT; r <= CWI_ROLE_ADMIN; r++)
		if (strcmp(field[0], role_names[r]) == 0)
			e->role = (cwi_auth_role)r;
	if (e->role == CWI_ROLE_NONE)
		return cwi_fail(CACHEW_EINVAL, "%s:%u: unknown role '%.32s' "
		    "(client, worker or admin)", path, lineno, field[0]);
	if (!name_ok(field[1], strlen(field[1])))
		return cwi_fail(CACHEW_EINVAL, "%s:%u: the name is not 1 to %u "
		    "characters of [A-Za-z0-9_.-]", path, lineno,
		    CWI_AUTH_MAX_NAME);
	e->token_len = strlen(field[2]);
	if (e->token_len < CWI_AUTH_MIN_TOKEN ||
	    e->token_len > CWI_PROTO_MAX_TOKEN)
		return cwi_fail(CACHEW_EINVAL, "%s:%u: the token of '%s' has "
		    "%zu characters; it needs %u to %u", path, lineno, field[1],
		    e->token_len, CWI_AUTH_MIN_TOKEN, CWI_PROTO_MAX_TOKEN);
	memcpy(e->name, field[1], strlen(field[1]) + 1);
	memcpy(e->token, field[2], e->token_len + 1);
	return CACHEW_OK;
}

static cachew_err
add_entry(cwi_auth_tokens *t, const char *path, unsigned lineno,
    const auth_entry *e)
{
	const auth_entry *dup = find(t, e->token);

	if (dup != NULL)
		return cwi_fail(CACHEW_EINVAL, "%s:%u: the token of '%s' is "
		    "also the token of '%s' on an earlier line: every token "
		    "must be unique", path, lineno, e->name, dup->name);
	if (t->n == t->cap) {
		size_t cap = t->cap > 0 ? t->cap * 2 : 8;
		void *v = realloc(t->entries, cap * sizeof(*t->entries));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		t->entries = v;
		t->cap = cap;
	}
	t->entries[t->n++] = *e;
	return CACHEW_OK;
}

/* Opens path for reading, refusing a file its group or others may read:
 * the tokens would be theirs too. */
static cachew_err
open_private(const char *path, FILE **out)
{
	struct stat st;
	FILE *f = fopen(path, "r");

	*out = NULL;
	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "%s: cannot open: %s", path,
		    strerror(errno));
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return cwi_fail(CACHEW_EINVAL, "%s: not a regular file", path);
	}
	if ((st.st_mode & 077) != 0) {
		fclose(f);
		return cwi_fail(CACHEW_EINVAL, "%s: mode %04o lets its group or "
		    "others read the tokens; chmod 600 it", path,
		    (unsigned)(st.st_mode & 07777));
	}
	*out = f;
	return CACHEW_OK;
}

static char *
trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

cachew_err
cwi_auth_tokens_load(cwi_auth_tokens **out, const char *path)
{
	cwi_auth_tokens *t;
	FILE *f = NULL;
	char buf[1024];
	unsigned lineno = 0;
	auth_entry e;
	cachew_err rv;

	*out = NULL;
	t = calloc(1, sizeof(*t));
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = open_private(path, &f);
	while (rv == CACHEW_OK && fgets(buf, sizeof(buf), f) != NULL) {
		char *line = trim(buf);
		lineno++;
		if (strlen(buf) == sizeof(buf) - 1 && !feof(f)) {
			rv = cwi_fail(CACHEW_EINVAL, "%s:%u: line longer than "
			    "%zu bytes", path, lineno, sizeof(buf) - 2);
			break;
		}
		if (*line == '\0' || *line == '#')
			continue;
		rv = parse_line(path, lineno, line, &e);
		if (rv == CACHEW_OK)
			rv = add_entry(t, path, lineno, &e);
	}
	if (rv == CACHEW_OK && ferror(f))
		rv = cwi_fail(CACHEW_EIO, "%s: read error", path);
	if (rv == CACHEW_OK && t->n == 0)
		rv = cwi_fail(CACHEW_EINVAL, "%s: no tokens", path);
	if (f != NULL)
		fclose(f);
	explicit_bzero(buf, sizeof(buf));
	explicit_bzero(&e, sizeof(e));
	if (rv != CACHEW_OK) {
		cwi_auth_tokens_destroy(t);
		return rv;
	}
	*out = t;
	return CACHEW_OK;
}

void
cwi_auth_tokens_destroy(cwi_auth_tokens *t)
{
	if (t == NULL)
		return;
	if (t->entries != NULL)
		explicit_bzero(t->entries, t->cap * sizeof(*t->entries));
	free(t->entries);
	free(t);
}

/* The roles that may send a message type, as a bit set of 1 << role. */
static unsigned
roles_for(cwi_msg_type type)
{
	const unsigned client = 1u << CWI_ROLE_CLIENT | 1u << CWI_ROLE_ADMIN;

	switch (type) {
	case CWI_MSG_WORKER_REGISTER:
	case CWI_MSG_WORKER_HEARTBEAT:
	case CWI_MSG_WORKER_DEREGISTER:
	case CWI_MSG_SPLIT_LEASE:
	case CWI_MSG_TASK_COUNTERS:
		return 1u << CWI_ROLE_WORKER;
	case CWI_MSG_DATASET_REGISTER:
	case CWI_MSG_JOB_GET_OR_CREATE:
	case CWI_MSG_CLIENT_HEARTBEAT:
	case CWI_MSG_SPLIT_ACK:
	case CWI_MSG_JOB_RELEASE:
		return client;
	case CWI_MSG_STATUS:
		return client | 1u << CWI_ROLE_WORKER;
	default:
		return 0;
	}
}

cachew_err
cwi_auth_check(const cwi_auth_tokens *t, const cwi_pmsg *req,
    cwi_auth_role *role, const char **identity)
{
	const auth_entry *e;

	*role = CWI_ROLE_NONE;
	*identity = NULL;
	if (req->token == NULL)
		return cwi_fail(CACHEW_EPERM, "not authenticated: %s carries "
		    "no token, and this dispatcher requires one (the token "
		    "file option: token_file / CACHEW_TOKEN_FILE, or a "
		    "worker's --token-file)", cwi_msg_type_name(req->type));
	e = find(t, req->token);
	if (e == NULL)
		return cwi_fail(CACHEW_EPERM, "not authenticated: the token of "
		    "%s is not one of this dispatcher's",
		    cwi_msg_type_name(req->type));
	if ((roles_for(req->type) >> e->role & 1) == 0)
		return cwi_fail(CACHEW_EPERM, "role %s may not send %s "
		    "(token of '%s')", role_names[e->role],
		    cwi_msg_type_name(req->type), e->name);
	*role = e->role;
	*identity = e->name;
	return CACHEW_OK;
}

cachew_err
cwi_auth_token_read(const char *path, char **token)
{
	char buf[CWI_PROTO_MAX_TOKEN + 64], *s;
	FILE *f = fopen(path, "r");
	cachew_err rv = CACHEW_OK;

	*token = NULL;
	if (f == NULL)
		return cwi_fail(CACHEW_EIO, "token file %s: cannot open: %s",
		    path, strerror(errno));
	if (fgets(buf, sizeof(buf), f) == NULL)
		buf[0] = '\0';
	fclose(f);
	s = trim(buf);
	if (*s == '\0' || strlen(s) > CWI_PROTO_MAX_TOKEN)
		rv = cwi_fail(CACHEW_EINVAL, "token file %s: the first line "
		    "must hold the token (1 to %u characters)", path,
		    CWI_PROTO_MAX_TOKEN);
	else if ((*token = cwi_strdup(s)) == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	explicit_bzero(buf, sizeof(buf));
	return rv;
}

static bool
host_is_local(const char *host, size_t len)
{
	if ((len == 9 && memcmp(host, "localhost", 9) == 0) ||
	    (len == 5 && memcmp(host, "[::1]", 5) == 0) ||
	    (len == 3 && memcmp(host, "::1", 3) == 0))
		return true;
	return len > 4 && memcmp(host, "127.", 4) == 0 &&
	       strspn(host, "0123456789.") == len;
}

bool
cwi_auth_listen_is_local(const char *url)
{
	const char *host, *colon;

	if (strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0)
		return true;
	if (strncmp(url, "tcp://", 6) == 0)
		host = url + 6;
	else if (strncmp(url, "tls+tcp://", 10) == 0)
		host = url + 10;
	else
		return false;
	colon = strrchr(host, ':');
	return host_is_local(host, colon != NULL ? (size_t)(colon - host)
						 : strlen(host));
}
