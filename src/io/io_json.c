/*
 * io_json.c - reading replies of outside services in JSON (io_json.h).
 */
#include "io_json.h"

#include <stdio.h>
#include <string.h>

json_t *
cwi_json_parse(const char *body, size_t len, char *why, size_t whylen)
{
	json_error_t err;
	json_t *root;

	/* REJECT_DUPLICATES: a reply naming a field twice is ambiguous, and
	 * which copy a reader takes differs between parsers. */
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
	if (root == NULL)
		snprintf(why, whylen, "line %d, column %d (byte %d): %s",
		    err.line, err.column, err.position, err.text);
	return root;
}

const char *
cwi_json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a fractional number";
	case JSON_TRUE: return "true";
	case JSON_FALSE: return "false";
	case JSON_NULL: return "null";
	}
	return "an unknown value";
}

static const char *
wanted_name(json_type type)
{
	switch (type) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "true or false";
	case JSON_NULL: return "null";
	}
	return "a value";
}

static bool
type_fits(const json_t *v, json_type type)
{
	if (type == JSON_TRUE || type == JSON_FALSE)
		return json_is_boolean(v);
	if (type == JSON_REAL)
		return json_is_number(v);
	return json_typeof(v) == type;
}

json_t *
cwi_json_member(json_t *root, const char *path, json_type type,
    bool *absent, char *why, size_t whylen)
{
	json_t *v = root;
	const char *p = path;
	char name[128];

	*absent = false;
	for (;;) {
		size_t n = strcspn(p, ".");
		/* Field names are ours, short and fixed. */
		if (n >= sizeof(name))
			n = sizeof(name) - 1;
		memcpy(name, p, n);
		name[n] = '\0';
		if (!json_is_object(v)) {
			if (p == path)
				snprintf(why, whylen, "the reply is %s, not an "
				    "object", cwi_json_type_name(v));
			else
				snprintf(why, whylen, "%.*s is %s, not an object",
				    (int)(p - path - 1), path,
				    cwi_json_type_name(v));
			return NULL;
		}
		v = json_object_get(v, name);
		if (v == NULL) {
			*absent = true;
			snprintf(why, whylen, "%.*s is missing", (int)(p - path + n),
			    path);
			return NULL;
		}
		if (p[n] == '\0')
			break;
		p += n + 1;
	}
	if (!type_fits(v, type)) {
		snprintf(why, whylen, "%s is %s, not %s", path,
		    cwi_json_type_name(v), wanted_name(type));
		return NULL;
	}
	return v;
}
