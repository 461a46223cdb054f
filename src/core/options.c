/*
 * options.c - the option table and the options object. One table drives the
 * typed setters, text parsing (flags, environment, config files) and help.
 */
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum opt_type { OPT_INT, OPT_BOOL, OPT_STR } opt_type;

typedef struct opt_spec {
	const char *name;
	opt_type type;
	int64_t def_int;
	const char *def_str;
	int64_t min, max;
	size_t offset; /* into cwi_opts */
	const char *help;
} opt_spec;

#define OFF(f) offsetof(cwi_opts, f)

static const opt_spec table[] = {
    {"threads", OPT_INT, 0, NULL, 0, 1024, OFF(threads),
	"CPU budget in threads; 0 = the number of online CPUs"},
    {"ram_budget", OPT_INT, 0, NULL, 0, INT64_MAX, OFF(ram_budget),
	"bytes the executor's buffers may hold; 0 = half of available memory"},
    {"seed", OPT_INT, -1, NULL, -1, INT64_MAX, OFF(seed),
	"pipeline seed; -1 = a fresh random seed per iterator"},
    {"deterministic", OPT_BOOL, 1, NULL, 0, 1, OFF(deterministic),
	"keep element order under parallelism"},
    {"autotune", OPT_BOOL, 1, NULL, 0, 1, OFF(autotune),
	"tune parallel=auto and prefetch(auto) online"},
    {"epoch", OPT_INT, 0, NULL, 0, INT64_MAX, OFF(epoch),
	"epoch number handed to shuffle(reshuffle_each_iteration=true)"},
    {"service", OPT_STR, 0, "", 0, 0, OFF(service),
	"dispatcher address (tcp://host:port); empty = embedded"},
};

#define NOPTS (sizeof(table) / sizeof(table[0]))

struct cachew_options {
	cwi_opts v;
	char errmsg[256];
};

static const opt_spec *
find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

void
cwi_opts_defaults(cwi_opts *o)
{
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < NOPTS; i++) {
		const opt_spec *s = &table[i];
		switch (s->type) {
		case OPT_INT:
			*(int64_t *)((char *)o + s->offset) = s->def_int;
			break;
		case OPT_BOOL:
			*(int *)((char *)o + s->offset) = (int)s->def_int;
			break;
		case OPT_STR:
			snprintf((char *)o + s->offset, CWI_OPT_STR_MAX, "%s",
			    s->def_str);
			break;
		}
	}
}

static cachew_err
opts_fail(cachew_options *o, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

static cachew_err
opts_fail(cachew_options *o, cachew_err err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->errmsg, sizeof(o->errmsg), fmt, ap);
	va_end(ap);
	return cwi_fail(err, "%s", o->errmsg);
}

static const opt_spec *
lookup(cachew_options *o, const char *name, opt_type want, cachew_err *rv)
{
	static const char *const tnames[] = {"int", "bool", "str"};
	const opt_spec *s = find(name);

	if (s == NULL) {
		*rv = opts_fail(o, CACHEW_ENOENT, "unknown option '%s'", name);
		return NULL;
	}
	if (s->type != want) {
		*rv = opts_fail(o, CACHEW_ETYPE,
		    "option '%s' is of type %s, not %s", name,
		    tnames[s->type], tnames[want]);
		return NULL;
	}
	*rv = CACHEW_OK;
	return s;
}

cachew_err
cachew_options_create(cachew_options **out)
{
	cachew_options *o = calloc(1, sizeof(*o));
	if (o == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_opts_defaults(&o->v);
	*out = o;
	return CACHEW_OK;
}

void
cachew_options_destroy(cachew_options *opts)
{
	free(opts);
}

cachew_err
cachew_options_set_int(cachew_options *o, const char *name, int64_t value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_INT, &rv);
	if (s == NULL)
		return rv;
	if (value < s->min || value > s->max)
		return opts_fail(o, CACHEW_ERANGE,
		    "option '%s' must be in [%lld, %lld], not %lld", name,
		    (long long)s->min, (long long)s->max, (long long)value);
	*(int64_t *)((char *)&o->v + s->offset) = value;
	return CACHEW_OK;
}

cachew_err
cachew_options_set_bool(cachew_options *o, const char *name, int value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_BOOL, &rv);
	if (s == NULL)
		return rv;
	*(int *)((char *)&o->v + s->offset) = value != 0;
	return CACHEW_OK;
}

cachew_err
cachew_options_set_str(cachew_options *o, const char *name, const char *value)
{
	cachew_err rv;
	const opt_spec *s = lookup(o, name, OPT_STR, &rv);
	if (s == NULL)
		return rv;
	if (strlen(value) >= CWI_OPT_STR_MAX)
		return opts_fail(o, CACHEW_ERANGE,
		    "option '%s' is longer than %d characters", name,
		    CWI_OPT_STR_MAX - 1);
	snprintf((char *)&o->v + s->offset, CWI_OPT_STR_MAX, "%s", value);
	return CACHEW_OK;
}

cachew_err
cachew_options_set(cachew_options *o, const char *name, const char *text)
{
	const opt_spec *s = find(name);
	char *end;
	long long v;

	if (s == NULL)
		return opts_fail(o, CACHEW_ENOENT, "unknown option '%s'", name);
	switch (s->type) {
	case OPT_INT:
		errno = 0;
		v = strtoll(text, &end, 0);
		if (errno != 0 || end == text || *end != '\0')
			return opts_fail(o, CACHEW_ETYPE,
			    "option '%s' needs an integer, not '%s'", name, text);
		return cachew_options_set_int(o, name, (int64_t)v);
	case OPT_BOOL:
		if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0 ||
		    strcmp(text, "yes") == 0 || strcmp(text, "on") == 0)
			return cachew_options_set_bool(o, name, 1);
		if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0 ||
		    strcmp(text, "no") == 0 || strcmp(text, "off") == 0)
			return cachew_options_set_bool(o, name, 0);
		return opts_fail(o, CACHEW_ETYPE,
		    "option '%s' needs true or false, not '%s'", name, text);
	case OPT_STR:
		return cachew_options_set_str(o, name, text);
	}
	return CACHEW_EINTERNAL;
}

cachew_err
cachew_options_get_int(const cachew_options *o, const char *name, int64_t *out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_INT, &rv);
	if (s == NULL)
		return rv;
	*out = *(const int64_t *)((const char *)&o->v + s->offset);
	return CACHEW_OK;
}

cachew_err
cachew_options_get_bool(const cachew_options *o, const char *name, int *out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_BOOL, &rv);
	if (s == NULL)
		return rv;
	*out = *(const int *)((const char *)&o->v + s->offset);
	return CACHEW_OK;
}

cachew_err
cachew_options_get_str(
    const cachew_options *o, const char *name, const char **out)
{
	cachew_err rv;
	const opt_spec *s = lookup((cachew_options *)o, name, OPT_STR, &rv);
	if (s == NULL)
		return rv;
	*out = (const char *)&o->v + s->offset;
	return CACHEW_OK;
}

const char *
cachew_options_errmsg(const cachew_options *o)
{
	return o->errmsg;
}

cachew_err
cachew_option_info(size_t i, const char **name, const char **type,
    const char **default_text, const char **help)
{
	static const char *const tnames[] = {"int", "bool", "str"};
	static const char *const defaults[NOPTS] = {
	    "0", "0", "-1", "true", "true", "0", "\"\""};

	if (i >= NOPTS)
		return CACHEW_ENOENT;
	*name = table[i].name;
	*type = tnames[table[i].type];
	*default_text = defaults[i];
	*help = table[i].help;
	return CACHEW_OK;
}

const cwi_opts *
cwi_options_values(const cachew_options *o)
{
	return &o->v;
}
