/*
 * value.c - the value model of operator parameters (nil, bool, int, float,
 * string, list, sorted map) and the public cachew_params API over it.
 */
#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void
cwi_value_free(cwi_value *v)
{
	switch (v->type) {
	case CWI_V_STR:
		free(v->u.s.ptr);
		break;
	case CWI_V_LIST:
		for (size_t i = 0; i < v->u.list.n; i++)
			cwi_value_free(&v->u.list.items[i]);
		free(v->u.list.items);
		break;
	case CWI_V_MAP:
		for (size_t i = 0; i < v->u.map.n; i++) {
			free(v->u.map.items[i].key);
			cwi_value_free(&v->u.map.items[i].val);
		}
		free(v->u.map.items);
		break;
	default:
		break;
	}
	memset(v, 0, sizeof(*v));
}

cachew_err
cwi_value_set_str(cwi_value *v, const char *s, size_t len)
{
	char *p = cwi_strndup(s, len);
	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_value_free(v);
	v->type = CWI_V_STR;
	v->u.s.ptr = p;
	v->u.s.len = len;
	v->ident = cwi_is_ident(s, len);
	return CACHEW_OK;
}

cachew_err
cwi_value_copy(cwi_value *dst, const cwi_value *src)
{
	cachew_err rv;

	memset(dst, 0, sizeof(*dst));
	switch (src->type) {
	case CWI_V_STR:
		rv = cwi_value_set_str(dst, src->u.s.ptr, src->u.s.len);
		dst->ident = src->ident;
		return rv;
	case CWI_V_LIST:
		dst->type = CWI_V_LIST;
		dst->tuple = src->tuple;
		if (src->u.list.n == 0)
			return CACHEW_OK;
		dst->u.list.items = calloc(src->u.list.n, sizeof(cwi_value));
		if (dst->u.list.items == NULL)
			goto oom;
		for (size_t i = 0; i < src->u.list.n; i++) {
			dst->u.list.n = i + 1;
			rv = cwi_value_copy(
			    &dst->u.list.items[i], &src->u.list.items[i]);
			if (rv != CACHEW_OK) {
				cwi_value_free(dst);
				return rv;
			}
		}
		return CACHEW_OK;
	case CWI_V_MAP:
		dst->type = CWI_V_MAP;
		if (src->u.map.n == 0)
			return CACHEW_OK;
		dst->u.map.items = calloc(src->u.map.n, sizeof(cwi_kv));
		if (dst->u.map.items == NULL)
			goto oom;
		for (size_t i = 0; i < src->u.map.n; i++) {
			cwi_kv *d = &dst->u.map.items[i];
			dst->u.map.n = i + 1;
			d->key = cwi_strdup(src->u.map.items[i].key);
			if (d->key == NULL) {
				cwi_value_free(dst);
				goto oom;
			}
			rv = cwi_value_copy(&d->val, &src->u.map.items[i].val);
			if (rv != CACHEW_OK) {
				cwi_value_free(dst);
				return rv;
			}
		}
		return CACHEW_OK;
	default:
		*dst = *src;
		return CACHEW_OK;
	}
oom:
	return cwi_fail(CACHEW_ENOMEM, "out of memory");
}

bool
cwi_value_equal(const cwi_value *a, const cwi_value *b)
{
	if (a->type != b->type)
		return false;
	switch (a->type) {
	case CWI_V_NIL:
		return true;
	case CWI_V_BOOL:
		return a->u.b == b->u.b;
	case CWI_V_INT:
		return a->u.i == b->u.i;
	case CWI_V_FLOAT:
		return memcmp(&a->u.f, &b->u.f, sizeof(double)) == 0;
	case CWI_V_STR:
		return a->u.s.len == b->u.s.len &&
		    memcmp(a->u.s.ptr, b->u.s.ptr, a->u.s.len) == 0;
	case CWI_V_LIST:
		if (a->u.list.n != b->u.list.n)
			return false;
		for (size_t i = 0; i < a->u.list.n; i++)
			if (!cwi_value_equal(
				&a->u.list.items[i], &b->u.list.items[i]))
				return false;
		return true;
	case CWI_V_MAP:
		if (a->u.map.n != b->u.map.n)
			return false;
		for (size_t i = 0; i < a->u.map.n; i++) {
			if (strcmp(a->u.map.items[i].key,
				b->u.map.items[i].key) != 0 ||
			    !cwi_value_equal(&a->u.map.items[i].val,
				&b->u.map.items[i].val))
				return false;
		}
		return true;
	}
	return false;
}

cachew_err
cwi_value_list_push(cwi_value *list, cwi_value *item)
{
	size_t n = list->u.list.n;
	cwi_value *items;

	if (list->type != CWI_V_LIST) {
		memset(list, 0, sizeof(*list));
		list->type = CWI_V_LIST;
		n = 0;
	}
	if (n >= CWI_VALUE_MAX_ITEMS)
		return cwi_fail(CACHEW_ERANGE, "list has too many items");
	/* Capacity: 4, then doubling; it is full when n is 4, 8, 16... */
	if (n == 0 || (n >= 4 && (n & (n - 1)) == 0)) {
		size_t cap = n == 0 ? 4 : n * 2;
		items = realloc(list->u.list.items, cap * sizeof(cwi_value));
		if (items == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		list->u.list.items = items;
	}
	list->u.list.items[n] = *item;
	list->u.list.n = n + 1;
	memset(item, 0, sizeof(*item));
	return CACHEW_OK;
}

/* Binary search; returns the index of key or where it would go. */
static size_t
map_find(const cwi_value *map, const char *key, bool *found)
{
	size_t lo = 0, hi = map->u.map.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(map->u.map.items[mid].key, key);
		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

const cwi_value *
cwi_map_get(const cwi_value *map, const char *key)
{
	bool found;
	size_t i;

	if (map == NULL || map->type != CWI_V_MAP)
		return NULL;
	i = map_find(map, key, &found);
	return found ? &map->u.map.items[i].val : NULL;
}

cachew_err
cwi_map_set(cwi_value *map, const char *key, cwi_value *val)
{
	bool found;
	size_t i, n;
	cwi_kv *items;
	char *k;

	if (map->type != CWI_V_MAP) {
		memset(map, 0, sizeof(*map));
		map->type = CWI_V_MAP;
	}
	i = map_find(map, key, &found);
	if (found) {
		cwi_value_free(&map->u.map.items[i].val);
		map->u.map.items[i].val = *val;
		memset(val, 0, sizeof(*val));
		return CACHEW_OK;
	}
	n = map->u.map.n;
	if (n >= CWI_VALUE_MAX_ITEMS)
		return cwi_fail(CACHEW_ERANGE, "map has too many keys");
	k = cwi_strdup(key);
	if (k == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	items = realloc(map->u.map.items, (n + 1) * sizeof(cwi_kv));
	if (items == NULL) {
		free(k);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	memmove(&items[i + 1], &items[i], (n - i) * sizeof(cwi_kv));
	items[i].key = k;
	items[i].val = *val;
	memset(val, 0, sizeof(*val));
	map->u.map.items = items;
	map->u.map.n = n + 1;
	return CACHEW_OK;
}

bool
cwi_map_del(cwi_value *map, const char *key)
{
	bool found;
	size_t i;

	if (map->type != CWI_V_MAP)
		return false;
	i = map_find(map, key, &found);
	if (!found)
		return false;
	free(map->u.map.items[i].key);
	cwi_value_free(&map->u.map.items[i].val);
	memmove(&map->u.map.items[i], &map->u.map.items[i + 1],
	    (map->u.map.n - i - 1) * sizeof(cwi_kv));
	map->u.map.n--;
	return true;
}

bool
cwi_is_ident(const char *s, size_t len)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    c == '_';
		if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
			return false;
	}
	return true;
}

static void
print_string(cwi_strbuf *sb, const char *s, size_t len)
{
	cwi_strbuf_append(sb, "\"", 1);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		switch (c) {
		case '"':
			cwi_strbuf_puts(sb, "\\\"");
			break;
		case '\\':
			cwi_strbuf_puts(sb, "\\\\");
			break;
		case '\n':
			cwi_strbuf_puts(sb, "\\n");
			break;
		case '\t':
			cwi_strbuf_puts(sb, "\\t");
			break;
		default:
			if (c < 0x20 || c == 0x7f)
				cwi_strbuf_printf(sb, "\\x%02x", c);
			else
				cwi_strbuf_append(sb, &s[i], 1);
		}
	}
	cwi_strbuf_append(sb, "\"", 1);
}

static bool
is_keyword(const char *s, size_t len)
{
	return (len == 4 && memcmp(s, "true", 4) == 0) ||
	    (len == 5 && memcmp(s, "false", 5) == 0) ||
	    (len == 4 && memcmp(s, "null", 4) == 0) ||
	    (len == 3 && (memcmp(s, "nan", 3) == 0 || memcmp(s, "inf", 3) == 0));
}

void
cwi_value_print(cwi_strbuf *sb, const cwi_value *v)
{
	char num[64];

	switch (v->type) {
	case CWI_V_NIL:
		cwi_strbuf_puts(sb, "null");
		break;
	case CWI_V_BOOL:
		cwi_strbuf_puts(sb, v->u.b ? "true" : "false");
		break;
	case CWI_V_INT:
		cwi_strbuf_printf(sb, "%lld", (long long)v->u.i);
		break;
	case CWI_V_FLOAT:
		if (isnan(v->u.f)) {
			cwi_strbuf_puts(sb, "nan");
		} else if (isinf(v->u.f)) {
			cwi_strbuf_puts(sb, v->u.f < 0 ? "-inf" : "inf");
		} else {
			/* Shortest form that round trips, always marked
			 * as a float by '.', 'e' or the like. */
			for (int prec = 1; prec <= 17; prec++) {
				snprintf(num, sizeof(num), "%.*g", prec, v->u.f);
				if (strtod(num, NULL) == v->u.f)
					break;
			}
			if (strpbrk(num, ".eE") == NULL)
				strcat(num, ".0");
			cwi_strbuf_puts(sb, num);
		}
		break;
	case CWI_V_STR:
		if (v->ident && cwi_is_ident(v->u.s.ptr, v->u.s.len) &&
		    !is_keyword(v->u.s.ptr, v->u.s.len))
			cwi_strbuf_append(sb, v->u.s.ptr, v->u.s.len);
		else
			print_string(sb, v->u.s.ptr, v->u.s.len);
		break;
	case CWI_V_LIST:
		cwi_strbuf_puts(sb, v->tuple ? "(" : "[");
		for (size_t i = 0; i < v->u.list.n; i++) {
			if (i > 0)
				cwi_strbuf_puts(sb, ", ");
			cwi_value_print(sb, &v->u.list.items[i]);
		}
		/* A one-item tuple needs its comma to stay a tuple. */
		if (v->tuple && v->u.list.n == 1)
			cwi_strbuf_puts(sb, ",");
		cwi_strbuf_puts(sb, v->tuple ? ")" : "]");
		break;
	case CWI_V_MAP:
		cwi_strbuf_puts(sb, "{");
		for (size_t i = 0; i < v->u.map.n; i++) {
			if (i > 0)
				cwi_strbuf_puts(sb, ", ");
			cwi_strbuf_puts(sb, v->u.map.items[i].key);
			cwi_strbuf_puts(sb, "=");
			cwi_value_print(sb, &v->u.map.items[i].val);
		}
		cwi_strbuf_puts(sb, "}");
		break;
	}
}

const char **
cwi_value_str_list(const cwi_value *v, size_t *n)
{
	const char **out;

	if (v != NULL && v->type == CWI_V_STR) {
		out = calloc(2, sizeof(char *));
		if (out == NULL)
			goto oom;
		out[0] = v->u.s.ptr;
		*n = 1;
		return out;
	}
	if (v == NULL || v->type != CWI_V_LIST) {
		cwi_fail(CACHEW_ETYPE, "expected a string or a list of strings");
		return NULL;
	}
	out = calloc(v->u.list.n + 1, sizeof(char *));
	if (out == NULL)
		goto oom;
	for (size_t i = 0; i < v->u.list.n; i++) {
		if (v->u.list.items[i].type != CWI_V_STR) {
			free(out);
			cwi_fail(CACHEW_ETYPE,
			    "expected a list of strings (item %zu is not)", i);
			return NULL;
		}
		out[i] = v->u.list.items[i].u.s.ptr;
	}
	*n = v->u.list.n;
	return out;
oom:
	cwi_fail(CACHEW_ENOMEM, "out of memory");
	return NULL;
}

/* ---- cachew_params ----------------------------------------------------- */

cachew_err
cachew_params_create(cachew_params **out)
{
	cachew_params *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	p->map.type = CWI_V_MAP;
	*out = p;
	return CACHEW_OK;
}

void
cachew_params_destroy(cachew_params *p)
{
	if (p == NULL)
		return;
	cwi_value_free(&p->map);
	free(p);
}

static cachew_err
check_key(const char *key)
{
	if (key == NULL || !cwi_is_ident(key, strlen(key)))
		return cwi_fail(CACHEW_EINVAL,
		    "parameter name '%s' is not an identifier",
		    key != NULL ? key : "(null)");
	return CACHEW_OK;
}

cachew_err
cachew_params_set_int(cachew_params *p, const char *key, int64_t v)
{
	cwi_value val = {.type = CWI_V_INT, .u.i = v};
	cachew_err rv = check_key(key);
	return rv != CACHEW_OK ? rv : cwi_map_set(&p->map, key, &val);
}

cachew_err
cachew_params_set_double(cachew_params *p, const char *key, double v)
{
	cwi_value val = {.type = CWI_V_FLOAT, .u.f = v};
	cachew_err rv = check_key(key);
	return rv != CACHEW_OK ? rv : cwi_map_set(&p->map, key, &val);
}

cachew_err
cachew_params_set_bool(cachew_params *p, const char *key, int v)
{
	cwi_value val = {.type = CWI_V_BOOL, .u.b = v != 0};
	cachew_err rv = check_key(key);
	return rv != CACHEW_OK ? rv : cwi_map_set(&p->map, key, &val);
}

cachew_err
cachew_params_set_str(cachew_params *p, const char *key, const char *v)
{
	cwi_value val = {0};
	cachew_err rv = check_key(key);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_value_set_str(&val, v, strlen(v));
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_map_set(&p->map, key, &val);
	cwi_value_free(&val);
	return rv;
}

static cachew_err
set_list(cachew_params *p, const char *key, const int64_t *iv,
    const double *dv, size_t n)
{
	cwi_value list = {.type = CWI_V_LIST};
	cachew_err rv = check_key(key);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = 0; i < n; i++) {
		cwi_value item = {0};
		if (iv != NULL) {
			item.type = CWI_V_INT;
			item.u.i = iv[i];
		} else {
			item.type = CWI_V_FLOAT;
			item.u.f = dv[i];
		}
		rv = cwi_value_list_push(&list, &item);
		if (rv != CACHEW_OK) {
			cwi_value_free(&list);
			return rv;
		}
	}
	rv = cwi_map_set(&p->map, key, &list);
	cwi_value_free(&list);
	return rv;
}

cachew_err
cachew_params_set_int_list(
    cachew_params *p, const char *key, const int64_t *v, size_t n)
{
	return set_list(p, key, v, NULL, n);
}

cachew_err
cachew_params_set_double_list(
    cachew_params *p, const char *key, const double *v, size_t n)
{
	return set_list(p, key, NULL, v, n);
}

int
cachew_params_has(const cachew_params *p, const char *key)
{
	return p != NULL && cwi_map_get(&p->map, key) != NULL;
}

static const cwi_value *
get_value(const cachew_params *p, const char *key)
{
	const cwi_value *v = p != NULL ? cwi_map_get(&p->map, key) : NULL;
	if (v == NULL)
		cwi_fail(CACHEW_ENOENT, "no parameter '%s'", key);
	return v;
}

static cachew_err
value_to_int(const cwi_value *v, const char *key, int64_t *out)
{
	if (v->type == CWI_V_INT) {
		*out = v->u.i;
		return CACHEW_OK;
	}
	if (v->type == CWI_V_FLOAT && v->u.f == floor(v->u.f) &&
	    fabs(v->u.f) < 9.2e18) {
		*out = (int64_t)v->u.f;
		return CACHEW_OK;
	}
	return cwi_fail(CACHEW_ETYPE, "parameter '%s' must be an integer", key);
}

static cachew_err
value_to_double(const cwi_value *v, const char *key, double *out)
{
	if (v->type == CWI_V_FLOAT) {
		*out = v->u.f;
		return CACHEW_OK;
	}
	if (v->type == CWI_V_INT) {
		*out = (double)v->u.i;
		return CACHEW_OK;
	}
	return cwi_fail(CACHEW_ETYPE, "parameter '%s' must be a number", key);
}

cachew_err
cachew_params_get_int(const cachew_params *p, const char *key, int64_t *out)
{
	const cwi_value *v = get_value(p, key);
	return v == NULL ? CACHEW_ENOENT : value_to_int(v, key, out);
}

cachew_err
cachew_params_get_double(const cachew_params *p, const char *key, double *out)
{
	const cwi_value *v = get_value(p, key);
	return v == NULL ? CACHEW_ENOENT : value_to_double(v, key, out);
}

cachew_err
cachew_params_get_bool(const cachew_params *p, const char *key, int *out)
{
	const cwi_value *v = get_value(p, key);
	if (v == NULL)
		return CACHEW_ENOENT;
	if (v->type != CWI_V_BOOL)
		return cwi_fail(CACHEW_ETYPE,
		    "parameter '%s' must be true or false", key);
	*out = v->u.b;
	return CACHEW_OK;
}

cachew_err
cachew_params_get_str(const cachew_params *p, const char *key, const char **out)
{
	const cwi_value *v = get_value(p, key);
	if (v == NULL)
		return CACHEW_ENOENT;
	if (v->type != CWI_V_STR)
		return cwi_fail(CACHEW_ETYPE, "parameter '%s' must be a string",
		    key);
	/* A C string ends at its first NUL: one inside would cut it. */
	if (memchr(v->u.s.ptr, '\0', v->u.s.len) != NULL)
		return cwi_fail(CACHEW_EINVAL, "parameter '%s' holds a NUL byte",
		    key);
	*out = v->u.s.ptr;
	return CACHEW_OK;
}

static cachew_err
get_list(const cachew_params *p, const char *key, int64_t *iout,
    double *dout, size_t cap, size_t *n)
{
	const cwi_value *v = get_value(p, key);
	cachew_err rv;

	if (v == NULL)
		return CACHEW_ENOENT;
	if (v->type != CWI_V_LIST) {
		/* A single number is a list of one. */
		if (v->type == CWI_V_INT || v->type == CWI_V_FLOAT) {
			*n = 1;
			if (cap == 0)
				return CACHEW_OK;
			return iout != NULL ? value_to_int(v, key, iout)
					    : value_to_double(v, key, dout);
		}
		return cwi_fail(CACHEW_ETYPE,
		    "parameter '%s' must be a list of numbers", key);
	}
	for (size_t i = 0; i < v->u.list.n && i < cap; i++) {
		rv = iout != NULL
		    ? value_to_int(&v->u.list.items[i], key, &iout[i])
		    : value_to_double(&v->u.list.items[i], key, &dout[i]);
		if (rv != CACHEW_OK)
			return rv;
	}
	*n = v->u.list.n;
	return CACHEW_OK;
}

cachew_err
cachew_params_get_int_list(const cachew_params *p, const char *key,
    int64_t *out, size_t cap, size_t *n)
{
	return get_list(p, key, out, NULL, cap, n);
}

cachew_err
cachew_params_get_double_list(const cachew_params *p, const char *key,
    double *out, size_t cap, size_t *n)
{
	return get_list(p, key, NULL, out, cap, n);
}

size_t
cachew_params_count(const cachew_params *p)
{
	return p != NULL && p->map.type == CWI_V_MAP ? p->map.u.map.n : 0;
}

const char *
cachew_params_key(const cachew_params *p, size_t i)
{
	return i < cachew_params_count(p) ? p->map.u.map.items[i].key : NULL;
}
