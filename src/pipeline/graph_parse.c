/*
 * graph_parse.c - the pipeline-string parser (docs/pipeline-syntax.md):
 * literal values, parameter lists and pipelines of stages.
 *
 * A recursive-descent parser straight over the text, with no token list.
 * Recursion is bounded by the nesting limit: every level of recursion
 * opens a bracket, and more than PARSE_MAX_DEPTH open brackets is an
 * error. Each stage is built with cwi_node_build as soon as its arguments
 * are read, so the operator's own checks report at the stage's column.
 */
#include "pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PARSE_MAX_INPUT (1u << 20) /* bytes of pipeline text */
#define PARSE_MAX_DEPTH 32         /* open brackets at any point */
#define PARSE_MAX_STAGES 4096      /* stages, nested ones included */
#define PARSE_MAX_NAME 255         /* characters of an operator name */
#define PARSE_MAX_NUMBER 400       /* characters of a number literal */

typedef struct parser {
	const char *text;
	size_t len;
	size_t pos;
	unsigned depth;
	size_t stages;
} parser;

/* ---- errors ------------------------------------------------------------- */

/* Writes at most `cap` bytes of the line around `at` into buf, with "..."
 * where it is cut, and sets *caret to the column of `at` in what was
 * written. Control characters become spaces so the caret lines up. */
static void
excerpt(const parser *p, size_t ls, size_t le, size_t at, char *buf,
    size_t cap, size_t *caret)
{
	const size_t before = 40, width = 72;
	size_t start = ls, end = le, n = 0;
	bool cut_left = false, cut_right = false;

	if (at - ls > before) {
		start = at - (before - 4);
		while (start < at && ((unsigned char)p->text[start] & 0xc0) == 0x80)
			start++;
		cut_left = true;
	}
	if (end - start > width) {
		end = start + width;
		while (end > at && ((unsigned char)p->text[end] & 0xc0) == 0x80)
			end--;
		cut_right = true;
	}
	*caret = 0;
	if (cut_left) {
		memcpy(buf, "...", 3);
		n = 3;
		*caret = 3;
	}
	for (size_t i = start; i < end && n + 4 < cap; i++) {
		unsigned char c = (unsigned char)p->text[i];
		buf[n++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
		if (i < at && (c & 0xc0) != 0x80)
			(*caret)++;
	}
	if (cut_right) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
}

/* Writes "column C" (or "line L, column C" past the first line) for the
 * text offset `at` and returns the offset where its line starts. Columns
 * count characters from 1; a UTF-8 sequence counts once. */
static size_t
where(const parser *p, size_t at, char *buf, size_t cap)
{
	size_t line = 1, ls = 0, col = 1;

	for (size_t i = 0; i < at; i++)
		if (p->text[i] == '\n') {
			line++;
			ls = i + 1;
		}
	for (size_t i = ls; i < at; i++)
		if (((unsigned char)p->text[i] & 0xc0) != 0x80)
			col++;
	if (line > 1)
		snprintf(buf, cap, "line %zu, column %zu", line, col);
	else
		snprintf(buf, cap, "column %zu", col);
	return ls;
}

/* Fails with `code` and "column C: <msg>", the line of the text holding
 * `at` and a caret under it. */
static cachew_err
perr_msg(const parser *p, size_t at, cachew_err code, const char *msg)
{
	size_t ls, le, caret;
	char pos[64], text[128], head[301];

	if (at > p->len)
		at = p->len;
	/* An error at the end points just past the last token. */
	if (at == p->len)
		while (at > 0 && strchr(" \t\r\n\f\v", p->text[at - 1]) != NULL)
			at--;
	ls = where(p, at, pos, sizeof(pos));
	for (le = ls; le < p->len && p->text[le] != '\n'; le++)
		;
	excerpt(p, ls, le, at, text, sizeof(text), &caret);
	/* At most 300 bytes of the message, cut at a character. */
	if (snprintf(head, sizeof(head), "%s", msg) >= (int)sizeof(head))
		cwi_utf8_trim(head);
	return cwi_fail(code, "%s: %s\n%s\n%*s^", pos, head, text,
	    (int)caret, "");
}

static cachew_err
perr(const parser *p, size_t at, cachew_err code, const char *fmt, ...)
    CACHEW_PRINTF(4, 5);

static cachew_err
perr(const parser *p, size_t at, cachew_err code, const char *fmt, ...)
{
	char msg[320];
	va_list ap;

	va_start(ap, fmt);
	if (vsnprintf(msg, sizeof(msg), fmt, ap) >= (int)sizeof(msg))
		cwi_utf8_trim(msg);
	va_end(ap);
	return perr_msg(p, at, code, msg);
}

/* Keeps the code and message of a failure from below (an operator's
 * check) and adds the position of the stage that failed. */
static cachew_err
perr_wrap(const parser *p, size_t at, cachew_err code)
{
	char msg[320];

	snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
	return perr_msg(p, at, code, msg);
}

/* ---- characters and tokens ------------------------------------------------ */

static bool
is_name_start(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool
is_name_char(char c)
{
	return is_name_start(c) || (c >= '0' && c <= '9');
}

static bool
is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Skips whitespace and comments; returns the next character ('\0' at the
 * end: the text holds no NUL bytes). */
static char
peek(parser *p)
{
	while (p->pos < p->len) {
		char c = p->text[p->pos];
		if (c == ' ' || c == '\t' || c == '\r' || c == '\n' ||
		    c == '\f' || c == '\v') {
			p->pos++;
		} else if (c == '#') {
			while (p->pos < p->len && p->text[p->pos] != '\n')
				p->pos++;
		} else {
			return c;
		}
	}
	return '\0';
}

static size_t
name_len(const parser *p, size_t at)
{
	size_t n = 0;

	if (at < p->len && is_name_start(p->text[at]))
		for (n = 1; at + n < p->len && is_name_char(p->text[at + n]); n++)
			;
	return n;
}

/* Describes what stands at `at` for "found ..." in messages. */
static const char *
found(const parser *p, size_t at, char *buf, size_t cap)
{
	size_t n = name_len(p, at);
	unsigned char c;

	if (at >= p->len)
		return "end of input";
	c = (unsigned char)p->text[at];
	if (n > 0)
		snprintf(buf, cap, "'%.*s'", (int)(n < 40 ? n : 40), p->text + at);
	else if (c >= 0x20 && c < 0x7f)
		snprintf(buf, cap, "'%c'", c);
	else
		snprintf(buf, cap, "byte 0x%02x", c);
	return buf;
}

static bool
is_keyword(const char *s, size_t n)
{
	static const char *const kw[] = {"true", "false", "null", "nan", "inf"};

	for (size_t i = 0; i < sizeof(kw) / sizeof(kw[0]); i++)
		if (strlen(kw[i]) == n && memcmp(kw[i], s, n) == 0)
			return true;
	return false;
}

/* True if a pipeline starts at `at`: a name (not a keyword) followed by
 * '(' or '|'. Leaves p->pos alone. */
static bool
starts_pipeline(parser *p, size_t at)
{
	size_t n = name_len(p, at), saved = p->pos;
	char c;

	if (n == 0 || is_keyword(p->text + at, n))
		return false;
	p->pos = at + n;
	c = peek(p);
	p->pos = saved;
	return c == '(' || c == '|';
}

static cachew_err
open_bracket(parser *p)
{
	if (p->depth >= PARSE_MAX_DEPTH)
		return perr(p, p->pos, CACHEW_EPARSE,
		    "nesting deeper than %d levels", PARSE_MAX_DEPTH);
	p->depth++;
	p->pos++;
	return CACHEW_OK;
}

/* ---- named values: collected, then sorted into a map ---------------------- */

typedef struct kv_item {
	char *key;
	cwi_value val;
	size_t at;
} kv_item;

typedef struct kv_list {
	kv_item *v;
	size_t n, cap;
} kv_list;

static void
kv_list_free(kv_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->v[i].key);
		cwi_value_free(&l->v[i].val);
	}
	free(l->v);
	memset(l, 0, sizeof(*l));
}

/* Takes ownership of *val (reset to NIL). */
static cachew_err
kv_list_push(kv_list *l, const char *key, size_t keylen, cwi_value *val,
    size_t at)
{
	if (l->n == l->cap) {
		size_t ncap = l->cap != 0 ? l->cap * 2 : 8;
		kv_item *v = realloc(l->v, ncap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		l->v = v;
		l->cap = ncap;
	}
	if (l->n >= CWI_VALUE_MAX_ITEMS)
		return cwi_fail(CACHEW_EPARSE, "more than %d keys",
		    CWI_VALUE_MAX_ITEMS);
	l->v[l->n].key = cwi_strndup(key, keylen);
	if (l->v[l->n].key == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l->v[l->n].val = *val;
	l->v[l->n].at = at;
	memset(val, 0, sizeof(*val));
	l->n++;
	return CACHEW_OK;
}

static int
kv_item_cmp(const void *a, const void *b)
{
	const kv_item *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	if (c != 0)
		return c;
	return x->at < y->at ? -1 : x->at > y->at;
}

/* Moves the items into the sorted map *out (emptying l); a key given twice
 * is an error at its second place. Sorting once keeps a long map from
 * costing one insertion shift per key. */
static cachew_err
kv_list_finish(parser *p, kv_list *l, cwi_value *out, const char *dup_fmt)
{
	memset(out, 0, sizeof(*out));
	out->type = CWI_V_MAP;
	if (l->n == 0)
		return CACHEW_OK;
	qsort(l->v, l->n, sizeof(kv_item), kv_item_cmp);
	for (size_t i = 1; i < l->n; i++)
		if (strcmp(l->v[i - 1].key, l->v[i].key) == 0)
			return perr(p, l->v[i].at, CACHEW_EPARSE, dup_fmt,
			    l->v[i].key);
	out->u.map.items = malloc(l->n * sizeof(cwi_kv));
	if (out->u.map.items == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < l->n; i++) {
		out->u.map.items[i].key = l->v[i].key;
		out->u.map.items[i].val = l->v[i].val;
	}
	out->u.map.n = l->n;
	free(l->v);
	memset(l, 0, sizeof(*l));
	return CACHEW_OK;
}

/* ---- literal values ---------------------------------------------------------- */

static cachew_err parse_value(parser *p, cwi_value *out);

static int
hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static cachew_err
parse_string(parser *p, cwi_value *out)
{
	char quote = p->text[p->pos];
	size_t at = p->pos;
	cwi_strbuf sb;
	cachew_err rv = CACHEW_OK;

	cwi_strbuf_init(&sb);
	p->pos++;
	for (;;) {
		char c, e;
		int h1, h2;

		if (p->pos >= p->len) {
			rv = perr(p, at, CACHEW_EPARSE, "unterminated string");
			goto done;
		}
		c = p->text[p->pos];
		if (c == quote) {
			p->pos++;
			break;
		}
		if (c == '\n') {
			rv = perr(p, p->pos, CACHEW_EPARSE,
			    "newline inside a string (write \\n)");
			goto done;
		}
		if (c != '\\') {
			cwi_strbuf_append(&sb, &c, 1);
			p->pos++;
			continue;
		}
		e = p->pos + 1 < p->len ? p->text[p->pos + 1] : '\0';
		switch (e) {
		case '"':
		case '\'':
		case '\\':
			c = e;
			break;
		case 'n':
			c = '\n';
			break;
		case 't':
			c = '\t';
			break;
		case 'r':
			c = '\r';
			break;
		case '0':
			c = '\0';
			break;
		case 'x':
			h1 = p->pos + 2 < p->len ? hex_digit(p->text[p->pos + 2])
						 : -1;
			h2 = h1 >= 0 && p->pos + 3 < p->len
			    ? hex_digit(p->text[p->pos + 3])
			    : -1;
			if (h2 < 0) {
				rv = perr(p, p->pos, CACHEW_EPARSE,
				    "\\x needs two hex digits");
				goto done;
			}
			c = (char)(h1 * 16 + h2);
			p->pos += 2;
			break;
		default:
			if (e >= 0x20 && e < 0x7f)
				rv = perr(p, p->pos, CACHEW_EPARSE,
				    "unknown escape '\\%c' in a string", e);
			else
				rv = perr(p, p->pos, CACHEW_EPARSE,
				    "unknown escape in a string");
			goto done;
		}
		cwi_strbuf_append(&sb, &c, 1);
		p->pos += 2;
	}
	if (sb.oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	else
		rv = cwi_value_set_str(out, sb.len > 0 ? sb.data : "", sb.len);
done:
	cwi_strbuf_free(&sb);
	return rv;
}

/* Unsigned digits in base 10 or 16 into *u; false on overflow. */
static bool
accumulate(const char *s, size_t n, unsigned base, uint64_t *u)
{
	uint64_t x = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t d = (uint64_t)hex_digit(s[i]);
		if (x > (UINT64_MAX - d) / base)
			return false;
		x = x * base + d;
	}
	*u = x;
	return true;
}

static cachew_err
parse_number(parser *p, cwi_value *out)
{
	const char *t = p->text;
	size_t at = p->pos, i = p->pos, digits_at, ndigits = 0;
	bool neg = false, is_float = false, hex = false;
	uint64_t u;
	char buf[PARSE_MAX_NUMBER + 1];
	char fb[16];

	if (t[i] == '+' || t[i] == '-')
		neg = t[i++] == '-';
	if (name_len(p, i) == 3 && memcmp(t + i, "inf", 3) == 0) {
		out->type = CWI_V_FLOAT;
		out->u.f = neg ? -INFINITY : INFINITY;
		p->pos = i + 3;
		return CACHEW_OK;
	}
	if (t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'X')) {
		hex = true;
		i += 2;
		digits_at = i;
		while (i < p->len && hex_digit(t[i]) >= 0)
			i++;
		ndigits = i - digits_at;
		if (ndigits == 0)
			return perr(p, i, CACHEW_EPARSE,
			    "expected hex digits after '0x'");
	} else {
		digits_at = i;
		while (i < p->len && is_digit(t[i]))
			i++;
		ndigits = i - digits_at;
		if (i < p->len && t[i] == '.') {
			is_float = true;
			i++;
			while (i < p->len && is_digit(t[i])) {
				i++;
				ndigits++;
			}
		}
		if (ndigits == 0)
			return perr(p, at, CACHEW_EPARSE,
			    "expected a number, found %s",
			    found(p, at, fb, sizeof(fb)));
		if (i < p->len && (t[i] == 'e' || t[i] == 'E')) {
			size_t e = ++i;
			is_float = true;
			if (i < p->len && (t[i] == '+' || t[i] == '-'))
				e = ++i;
			while (i < p->len && is_digit(t[i]))
				i++;
			if (i == e)
				return perr(p, i, CACHEW_EPARSE,
				    "expected digits in the exponent");
		}
	}
	if (i < p->len && (is_name_char(t[i]) || t[i] == '.'))
		return perr(p, i, CACHEW_EPARSE,
		    "unexpected '%c' after the number", t[i]);
	if (i - at > PARSE_MAX_NUMBER)
		return perr(p, at, CACHEW_EPARSE,
		    "number literal longer than %d characters",
		    PARSE_MAX_NUMBER);
	if (is_float) {
		memcpy(buf, t + at, i - at);
		buf[i - at] = '\0';
		/* Overflow gives +-inf and underflow 0 or a subnormal, as
		 * strtod rounds them; both are values. */
		out->type = CWI_V_FLOAT;
		out->u.f = strtod(buf, NULL);
		p->pos = i;
		return CACHEW_OK;
	}
	if (!accumulate(t + digits_at, ndigits, hex ? 16 : 10, &u) ||
	    u > (uint64_t)INT64_MAX + (neg ? 1 : 0))
		return perr(p, at, CACHEW_EPARSE,
		    "integer %.*s%s is out of range (64-bit signed)",
		    (int)(i - at > 40 ? 40 : i - at), t + at,
		    i - at > 40 ? "..." : "");
	out->type = CWI_V_INT;
	out->u.i = neg ? (int64_t)(0 - u) : (int64_t)u;
	p->pos = i;
	return CACHEW_OK;
}

/* The items of [a, b] or (a, b) up to the closing bracket; *commas says
 * whether any comma was seen (a one-item tuple needs one). */
static cachew_err
parse_items(parser *p, char close, cwi_value *out, bool *comma)
{
	size_t open_at = p->pos;
	char fb[64], opened[64];
	cachew_err rv = open_bracket(p);

	*comma = false;
	out->type = CWI_V_LIST;
	if (rv != CACHEW_OK)
		return rv;
	for (;;) {
		cwi_value item = {0};
		char c = peek(p);

		if (c == close)
			break;
		rv = parse_value(p, &item);
		if (rv == CACHEW_OK)
			rv = cwi_value_list_push(out, &item);
		cwi_value_free(&item);
		if (rv != CACHEW_OK)
			return rv;
		c = peek(p);
		if (c == ',') {
			*comma = true;
			p->pos++;
			continue;
		}
		if (c == close)
			break;
		where(p, open_at, opened, sizeof(opened));
		return perr(p, p->pos, CACHEW_EPARSE,
		    "expected ',' or '%c' to close the %s opened at %s, found %s",
		    close, close == ']' ? "list" : "tuple", opened,
		    found(p, p->pos, fb, sizeof(fb)));
	}
	p->pos++;
	p->depth--;
	return CACHEW_OK;
}

static cachew_err
parse_tuple(parser *p, cwi_value *out)
{
	bool comma;
	cachew_err rv = parse_items(p, ')', out, &comma);

	if (rv != CACHEW_OK)
		return rv;
	out->tuple = true;
	if (out->u.list.n == 1 && !comma)
		return perr(p, p->pos - 1, CACHEW_EPARSE,
		    "a one-item tuple needs a trailing comma: (x,)");
	return CACHEW_OK;
}

static cachew_err
parse_map(parser *p, cwi_value *out)
{
	kv_list l = {0};
	char fb[64];
	cachew_err rv = open_bracket(p);

	while (rv == CACHEW_OK) {
		cwi_value v = {0};
		size_t at, n;
		char c = peek(p);

		if (c == '}')
			break;
		at = p->pos;
		n = name_len(p, at);
		if (n == 0) {
			rv = perr(p, at, CACHEW_EPARSE,
			    "expected a key name in the map, found %s",
			    found(p, at, fb, sizeof(fb)));
			break;
		}
		p->pos += n;
		if (peek(p) != '=') {
			rv = perr(p, p->pos, CACHEW_EPARSE,
			    "expected '=' after the map key '%.*s'",
			    (int)(n < 64 ? n : 64), p->text + at);
			break;
		}
		p->pos++;
		rv = parse_value(p, &v);
		if (rv == CACHEW_OK)
			rv = kv_list_push(&l, p->text + at, n, &v, at);
		cwi_value_free(&v);
		if (rv != CACHEW_OK)
			break;
		c = peek(p);
		if (c == ',') {
			p->pos++;
			continue;
		}
		if (c != '}')
			rv = perr(p, p->pos, CACHEW_EPARSE,
			    "expected ',' or '}' in the map, found %s",
			    found(p, p->pos, fb, sizeof(fb)));
	}
	if (rv == CACHEW_OK) {
		p->pos++;
		p->depth--;
		rv = kv_list_finish(p, &l, out, "key '%s' appears twice in the map");
	}
	kv_list_free(&l);
	return rv;
}

static cachew_err
parse_word(parser *p, cwi_value *out)
{
	size_t at = p->pos, n = name_len(p, at);
	const char *s = p->text + at;

	if (starts_pipeline(p, at))
		return perr(p, at, CACHEW_EPARSE,
		    "'%.*s' starts a pipeline, which may only be a positional "
		    "argument of a stage",
		    (int)(n < 64 ? n : 64), s);
	p->pos += n;
	memset(out, 0, sizeof(*out));
	if (n == 4 && memcmp(s, "true", 4) == 0) {
		out->type = CWI_V_BOOL;
		out->u.b = true;
	} else if (n == 5 && memcmp(s, "false", 5) == 0) {
		out->type = CWI_V_BOOL;
	} else if (n == 4 && memcmp(s, "null", 4) == 0) {
		out->type = CWI_V_NIL;
	} else if (n == 3 && memcmp(s, "nan", 3) == 0) {
		out->type = CWI_V_FLOAT;
		out->u.f = NAN;
	} else if (n == 3 && memcmp(s, "inf", 3) == 0) {
		out->type = CWI_V_FLOAT;
		out->u.f = INFINITY;
	} else {
		return cwi_value_set_str(out, s, n);
	}
	return CACHEW_OK;
}

static cachew_err
parse_value(parser *p, cwi_value *out)
{
	char fb[64];
	char c = peek(p);

	memset(out, 0, sizeof(*out));
	if (c == '"' || c == '\'')
		return parse_string(p, out);
	if (c == '[') {
		bool comma;
		return parse_items(p, ']', out, &comma);
	}
	if (c == '(')
		return parse_tuple(p, out);
	if (c == '{')
		return parse_map(p, out);
	if (is_digit(c) || c == '.' || c == '+' || c == '-')
		return parse_number(p, out);
	if (is_name_start(c))
		return parse_word(p, out);
	return perr(p, p->pos, CACHEW_EPARSE, "expected a value, found %s",
	    found(p, p->pos, fb, sizeof(fb)));
}

/* ---- pipelines ------------------------------------------------------------------- */

/* What a stage collects before it is built. */
typedef struct stage_args {
	cwi_node *inputs[CWI_MAX_INPUTS];
	size_t ninputs;
	cwi_value pos; /* list of positional literals */
	kv_list named;
	bool seen_named;
} stage_args;

static void
stage_args_free(stage_args *a)
{
	for (size_t i = 0; i < a->ninputs; i++)
		cachew_dataset_release(a->inputs[i]);
	cwi_value_free(&a->pos);
	kv_list_free(&a->named);
}

static cachew_err parse_pipeline(parser *p, cwi_node **out);

static cachew_err
parse_arg(parser *p, const char *stage, stage_args *a)
{
	size_t at = p->pos, n = name_len(p, at);
	cwi_value v = {0};
	cachew_err rv;

	if (n > 0) {
		p->pos = at + n;
		if (peek(p) == '=') {
			p->pos++;
			rv = parse_value(p, &v);
			if (rv == CACHEW_OK)
				rv = kv_list_push(&a->named, p->text + at, n, &v,
				    at);
			cwi_value_free(&v);
			a->seen_named = true;
			return rv;
		}
		p->pos = at;
	}
	if (a->seen_named)
		return perr(p, at, CACHEW_EPARSE,
		    "positional argument of '%s' after a named one", stage);
	if (starts_pipeline(p, at)) {
		/* Its stages open a bracket each: printed back, even one
		 * written without parentheses gets "()". */
		if (p->depth >= PARSE_MAX_DEPTH)
			return perr(p, at, CACHEW_EPARSE,
			    "nesting deeper than %d levels", PARSE_MAX_DEPTH);
		if (a->ninputs >= CWI_MAX_INPUTS)
			return perr(p, at, CACHEW_EPARSE,
			    "'%s' has more than %d input pipelines", stage,
			    CWI_MAX_INPUTS);
		return parse_pipeline(p, &a->inputs[a->ninputs++]);
	}
	rv = parse_value(p, &v);
	if (rv == CACHEW_OK)
		rv = cwi_value_list_push(&a->pos, &v);
	cwi_value_free(&v);
	return rv;
}

static cachew_err
parse_args(parser *p, const char *stage, stage_args *a)
{
	char fb[64];
	cachew_err rv = open_bracket(p);

	while (rv == CACHEW_OK) {
		char c = peek(p);

		if (c == ')')
			break;
		if (c == ',' || c == '\0') {
			rv = perr(p, p->pos, CACHEW_EPARSE,
			    "expected an argument of '%s', found %s", stage,
			    found(p, p->pos, fb, sizeof(fb)));
			break;
		}
		rv = parse_arg(p, stage, a);
		if (rv != CACHEW_OK)
			break;
		c = peek(p);
		if (c == ',') {
			p->pos++;
			continue;
		}
		if (c != ')')
			rv = perr(p, p->pos, CACHEW_EPARSE,
			    "expected ')' to close the arguments of '%s', found "
			    "%s",
			    stage, found(p, p->pos, fb, sizeof(fb)));
	}
	if (rv == CACHEW_OK) {
		p->pos++;
		p->depth--;
	}
	return rv;
}

/* One stage: `name` or `name(args)`, applied to `upstream` (borrowed; may
 * be NULL). */
static cachew_err
parse_stage(parser *p, cwi_node *upstream, cwi_node **out)
{
	stage_args a;
	cwi_value named = {0};
	char name[PARSE_MAX_NAME + 1], fb[64];
	size_t at, n;
	cachew_err rv;

	memset(&a, 0, sizeof(a));
	peek(p);
	at = p->pos;
	n = name_len(p, at);
	if (n == 0)
		return perr(p, at, CACHEW_EPARSE,
		    "expected an operator name, found %s",
		    found(p, at, fb, sizeof(fb)));
	if (n > PARSE_MAX_NAME)
		return perr(p, at, CACHEW_EPARSE,
		    "operator name longer than %d characters", PARSE_MAX_NAME);
	if (++p->stages > PARSE_MAX_STAGES)
		return perr(p, at, CACHEW_EPARSE,
		    "more than %d stages", PARSE_MAX_STAGES);
	memcpy(name, p->text + at, n);
	name[n] = '\0';
	p->pos += n;
	if (upstream != NULL)
		a.inputs[a.ninputs++] = cachew_dataset_retain(upstream);
	rv = CACHEW_OK;
	if (peek(p) == '(')
		rv = parse_args(p, name, &a);
	if (rv == CACHEW_OK)
		rv = kv_list_finish(p, &a.named, &named,
		    "argument '%s' is given twice");
	if (rv == CACHEW_OK) {
		rv = cwi_node_build(out, name, a.inputs, a.ninputs,
		    a.pos.type == CWI_V_LIST ? &a.pos : NULL, &named);
		if (rv != CACHEW_OK)
			rv = perr_wrap(p, at, rv);
	}
	cwi_value_free(&named);
	stage_args_free(&a);
	return rv;
}

static cachew_err
parse_pipeline(parser *p, cwi_node **out)
{
	cwi_node *cur = NULL, *next;
	cachew_err rv = parse_stage(p, NULL, &cur);

	while (rv == CACHEW_OK && peek(p) == '|') {
		p->pos++;
		rv = parse_stage(p, cur, &next);
		cachew_dataset_release(cur);
		cur = rv == CACHEW_OK ? next : NULL;
	}
	if (rv != CACHEW_OK)
		return rv;
	*out = cur;
	return CACHEW_OK;
}

/* ---- entry points ----------------------------------------------------------------- */

static cachew_err
parser_init(parser *p, const char *text, const char *what)
{
	memset(p, 0, sizeof(*p));
	if (text == NULL)
		return cwi_fail(CACHEW_EINVAL, "%s is NULL", what);
	p->text = text;
	p->len = strnlen(text, (size_t)PARSE_MAX_INPUT + 1);
	if (p->len > PARSE_MAX_INPUT)
		return cwi_fail(CACHEW_EPARSE, "%s is longer than %u bytes", what,
		    PARSE_MAX_INPUT);
	return CACHEW_OK;
}

cachew_err
cwi_value_parse(cwi_value *out, const char *text)
{
	parser p;
	char fb[64];
	cachew_err rv = parser_init(&p, text, "value");

	if (rv != CACHEW_OK)
		return rv;
	rv = parse_value(&p, out);
	if (rv == CACHEW_OK && peek(&p) != '\0')
		rv = perr(&p, p.pos, CACHEW_EPARSE,
		    "unexpected %s after the value",
		    found(&p, p.pos, fb, sizeof(fb)));
	if (rv != CACHEW_OK)
		cwi_value_free(out);
	return rv;
}

cachew_err
cachew_params_parse(cachew_params **out, const char *text)
{
	parser p;
	kv_list l = {0};
	cachew_params *params = NULL;
	char fb[64];
	cachew_err rv;

	cwi_clear_errmsg();
	if (out == NULL)
		return cwi_fail(CACHEW_EINVAL, "params_parse: out is NULL");
	rv = parser_init(&p, text, "parameter text");
	while (rv == CACHEW_OK && peek(&p) != '\0') {
		cwi_value v = {0};
		size_t at = p.pos, n = name_len(&p, at);

		if (n == 0) {
			rv = perr(&p, at, CACHEW_EPARSE,
			    "expected a parameter name, found %s",
			    found(&p, at, fb, sizeof(fb)));
			break;
		}
		p.pos += n;
		if (peek(&p) != '=') {
			rv = perr(&p, p.pos, CACHEW_EPARSE,
			    "expected '=' after the parameter name '%.*s'",
			    (int)(n < 64 ? n : 64), p.text + at);
			break;
		}
		p.pos++;
		rv = parse_value(&p, &v);
		if (rv == CACHEW_OK)
			rv = kv_list_push(&l, p.text + at, n, &v, at);
		cwi_value_free(&v);
		if (rv != CACHEW_OK)
			break;
		if (peek(&p) == ',')
			p.pos++;
		else if (peek(&p) != '\0')
			rv = perr(&p, p.pos, CACHEW_EPARSE,
			    "expected ',' or the end after a parameter, found "
			    "%s",
			    found(&p, p.pos, fb, sizeof(fb)));
	}
	if (rv == CACHEW_OK)
		rv = cachew_params_create(&params);
	if (rv == CACHEW_OK)
		rv = kv_list_finish(&p, &l, &params->map,
		    "parameter '%s' is given twice");
	kv_list_free(&l);
	if (rv != CACHEW_OK) {
		cachew_params_destroy(params);
		return rv;
	}
	*out = params;
	return CACHEW_OK;
}

cachew_err
cachew_dataset_parse(cachew_dataset **out, const char *pipeline)
{
	parser p;
	cwi_node *node = NULL;
	char fb[64];
	cachew_err rv;

	cwi_builtins_ready();
	cwi_clear_errmsg();
	if (out == NULL)
		return cwi_fail(CACHEW_EINVAL, "dataset_parse: out is NULL");
	rv = parser_init(&p, pipeline, "pipeline");
	if (rv == CACHEW_OK)
		rv = parse_pipeline(&p, &node);
	if (rv == CACHEW_OK && peek(&p) != '\0') {
		rv = perr(&p, p.pos, CACHEW_EPARSE,
		    "expected '|' or the end of the pipeline, found %s",
		    found(&p, p.pos, fb, sizeof(fb)));
		cachew_dataset_release(node);
	}
	if (rv != CACHEW_OK)
		return rv;
	*out = node;
	return CACHEW_OK;
}
