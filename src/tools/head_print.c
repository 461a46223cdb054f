/*
 * head_print.c - the elements `cachew head` prints: as a line a person
 * reads, or as one JSON object per line for a program.
 *
 * Text follows numpy's print options: a tensor of more than 1000 values is
 * summarised, each axis longer than 6 showing its first and last 3 entries
 * around "..."; floats get 8 significant digits. A scalar prints as its
 * value, a tensor as "dtype[shape] values"; strings are quoted with C
 * escapes and cut after 48 bytes, naming their length. An element of
 * several components prints as a tuple: "(7, "cat", f32[2] [0.5 1.0])".
 *
 * JSON gives every component its dtype and shape, and "value" (nested
 * arrays) when it holds at most 1000 values; a larger one gives "head",
 * its first 6 values in row-major order, and "truncated": true. A string
 * is a JSON string when it is valid UTF-8 of at most 256 bytes, otherwise
 * {"bytes": length, "hex": its first 32 bytes}. NaN and infinities, which
 * JSON numbers cannot hold, are the strings "nan", "inf" and "-inf".
 */
#include "tools.h"

#include "../core/core.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define SUMMARY_THRESHOLD 1000 /* numpy's `threshold` */
#define EDGE_ITEMS 3           /* numpy's `edgeitems` */
#define TEXT_BYTES_MAX 48      /* a string's bytes shown before "..." */
#define JSON_TEXT_MAX 256      /* a string emitted as a JSON string */
#define JSON_HEX_BYTES 32
#define JSON_HEAD 6

/* ---- one value ------------------------------------------------------------ */

/* Value i (flat) of a fixed-width tensor as a double, or *iv for the
 * integer dtypes (is_int set). */
static double
value_at(const cachew_tensor *t, int64_t i, int64_t *iv, bool *is_int)
{
	const void *d = cachew_tensor_data(t);
	uint16_t h;

	*is_int = true;
	switch (cachew_tensor_dtype(t)) {
	case CACHEW_U8:
		*iv = ((const uint8_t *)d)[i];
		return 0;
	case CACHEW_BOOL:
		*iv = ((const uint8_t *)d)[i] != 0;
		return 0;
	case CACHEW_I32:
		*iv = ((const int32_t *)d)[i];
		return 0;
	case CACHEW_I64:
		*iv = ((const int64_t *)d)[i];
		return 0;
	default:
		break;
	}
	*is_int = false;
	switch (cachew_tensor_dtype(t)) {
	case CACHEW_F16:
		memcpy(&h, (const uint16_t *)d + i, sizeof(h));
		return cwi_f16_to_f64(h);
	case CACHEW_BF16:
		memcpy(&h, (const uint16_t *)d + i, sizeof(h));
		return cwi_bf16_to_f64(h);
	case CACHEW_F32:
		return ((const float *)d)[i];
	case CACHEW_F64:
		return ((const double *)d)[i];
	default:
		return NAN;
	}
}

/* A float as numpy shows it: 8 significant digits, and a decimal point
 * even when integral ("1.0"), so that it reads as a float. */
static void
put_float(FILE *out, double v, bool json)
{
	char buf[40];

	if (isnan(v) || isinf(v)) {
		const char *s = isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
		fprintf(out, json ? "\"%s\"" : "%s", s);
		return;
	}
	snprintf(buf, sizeof(buf), "%.8g", v);
	if (strpbrk(buf, ".e") == NULL)
		strcat(buf, ".0");
	fputs(buf, out);
}

static void
put_number(FILE *out, const cachew_tensor *t, int64_t i, bool json)
{
	bool is_int;
	int64_t iv = 0;
	double v = value_at(t, i, &iv, &is_int);

	if (cachew_tensor_dtype(t) == CACHEW_BOOL)
		fputs(iv ? "true" : "false", out);
	else if (is_int)
		fprintf(out, "%" PRId64, iv);
	else
		put_float(out, v, json);
}

/* A string quoted with C escapes, cut after TEXT_BYTES_MAX bytes. */
static void
put_text_string(FILE *out, const uint8_t *s, size_t len)
{
	size_t show = len > TEXT_BYTES_MAX ? TEXT_BYTES_MAX : len;

	fputc('"', out);
	for (size_t i = 0; i < show; i++) {
		uint8_t c = s[i];

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c == '\r')
			fputs("\\r", out);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(out, "\\x%02x", c);
		else
			fputc(c, out);
	}
	if (show < len)
		fprintf(out, "...\" (%zu bytes)", len);
	else
		fputc('"', out);
}

/* The length of the valid UTF-8 sequence at s (1-4), 0 if invalid. */
static size_t
utf8_seq(const uint8_t *s, size_t left)
{
	size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2
	    : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;

	if (n == 0 || n > left || (n == 2 && s[0] < 0xc2) ||
	    (n == 4 && s[0] > 0xf4))
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	/* Overlong three-byte forms and UTF-16 surrogates. */
	if (n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) ||
			  (s[0] == 0xed && s[1] >= 0xa0)))
		return 0;
	if (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) ||
			  (s[0] == 0xf4 && s[1] >= 0x90)))
		return 0;
	return n;
}

static bool
valid_utf8(const uint8_t *s, size_t len)
{
	for (size_t i = 0, n; i < len; i += n)
		if ((n = utf8_seq(s + i, len - i)) == 0)
			return false;
	return true;
}

static void
put_json_string(FILE *out, const uint8_t *s, size_t len)
{
	if (len > JSON_TEXT_MAX || !valid_utf8(s, len)) {
		size_t show = len < JSON_HEX_BYTES ? len : JSON_HEX_BYTES;

		fprintf(out, "{\"bytes\":%zu,\"hex\":\"", len);
		for (size_t i = 0; i < show; i++)
			fprintf(out, "%02x", s[i]);
		fputs("\"}", out);
		return;
	}
	fputc('"', out);
	for (size_t i = 0; i < len; i++) {
		uint8_t c = s[i];

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

static void
put_value(FILE *out, const cachew_tensor *t, int64_t i, bool json)
{
	const void *s;
	size_t len;

	if (cachew_tensor_dtype(t) != CACHEW_BYTES) {
		put_number(out, t, i, json);
		return;
	}
	if (cachew_tensor_bytes_at(t, i, &s, &len) != CACHEW_OK) {
		s = "";
		len = 0;
	}
	if (json)
		put_json_string(out, s, len);
	else
		put_text_string(out, s, len);
}

/* ---- tensors ---------------------------------------------------------------- */

/* The values of axis `axis` onwards starting at flat index `base`, nested
 * in brackets; with `summarise`, axes longer than 2 * EDGE_ITEMS show
 * their edges around "...". */
static void
put_nested(FILE *out, const cachew_tensor *t, unsigned axis, int64_t base,
    bool summarise, bool json)
{
	const int64_t *shape = cachew_tensor_shape(t);
	unsigned rank = cachew_tensor_rank(t);
	int64_t stride = 1, n = shape[axis];
	bool cut = summarise && n > 2 * EDGE_ITEMS;

	for (unsigned k = axis + 1; k < rank; k++)
		stride *= shape[k];
	fputc('[', out);
	for (int64_t i = 0; i < n; i++) {
		if (cut && i == EDGE_ITEMS) {
			fputs(" ...", out); /* text only: JSON never cuts */
			i = n - EDGE_ITEMS;
		}
		if (i > 0)
			fputs(json ? "," : " ", out);
		if (axis + 1 == rank)
			put_value(out, t, base + i * stride, json);
		else
			put_nested(out, t, axis + 1, base + i * stride,
			    summarise, json);
	}
	fputc(']', out);
}

static void
put_text_tensor(FILE *out, const cachew_tensor *t)
{
	unsigned rank = cachew_tensor_rank(t);
	const int64_t *shape = cachew_tensor_shape(t);

	if (rank == 0) {
		put_value(out, t, 0, false);
		return;
	}
	fprintf(out, "%s[", cachew_dtype_name(cachew_tensor_dtype(t)));
	for (unsigned k = 0; k < rank; k++)
		fprintf(out, "%s%" PRId64, k > 0 ? "," : "", shape[k]);
	fputs("] ", out);
	put_nested(out, t, 0, 0,
	    cachew_tensor_numel(t) > SUMMARY_THRESHOLD, false);
}

/* A tensor's JSON fields and the object's closing brace (the caller wrote
 * the opening one, and a name before them if it has one). */
static void
put_json_tensor_fields(FILE *out, const cachew_tensor *t)
{
	unsigned rank = cachew_tensor_rank(t);
	const int64_t *shape = cachew_tensor_shape(t);
	int64_t numel = cachew_tensor_numel(t);

	fprintf(out, "\"dtype\":\"%s\",\"shape\":[",
	    cachew_dtype_name(cachew_tensor_dtype(t)));
	for (unsigned k = 0; k < rank; k++)
		fprintf(out, "%s%" PRId64, k > 0 ? "," : "", shape[k]);
	fputs("],", out);
	if (numel <= SUMMARY_THRESHOLD) {
		fputs("\"value\":", out);
		if (rank == 0)
			put_value(out, t, 0, true);
		else
			put_nested(out, t, 0, 0, false, true);
		fputc('}', out);
		return;
	}
	fputs("\"head\":[", out);
	for (int64_t i = 0; i < JSON_HEAD; i++) {
		if (i > 0)
			fputc(',', out);
		put_value(out, t, i, true);
	}
	fputs("],\"truncated\":true}", out);
}

/* A tensor as one JSON object: dtype, shape, then value or head. */
static void
put_json_tensor(FILE *out, const cachew_tensor *t)
{
	fputc('{', out);
	put_json_tensor_fields(out, t);
}

void
cwi_head_print(FILE *out, const cachew_element *e, uint64_t index, bool json)
{
	size_t n = cachew_element_size(e);
	/* Named components (parse_example's, a map literal's) print as a
	 * dict, as Python sees them; unnamed ones as a tuple. */
	bool named = n > 0 && cachew_element_name(e, 0) != NULL;

	if (json) {
		fprintf(out, "{\"index\":%" PRIu64 ",\"components\":[", index);
		for (size_t c = 0; c < n; c++) {
			const char *name = cachew_element_name(e, c);

			if (c > 0)
				fputc(',', out);
			if (name != NULL) {
				/* {"name":...,"dtype":...}: the tensor's object
				 * with the name first */
				fputs("{\"name\":", out);
				put_json_string(out, (const uint8_t *)name,
				    strlen(name));
				fputc(',', out);
				put_json_tensor_fields(out,
				    cachew_element_component(e, c));
			} else {
				put_json_tensor(out, cachew_element_component(e, c));
			}
		}
		fputs("]}\n", out);
		return;
	}
	fprintf(out, "%" PRIu64 ": %s", index, named ? "{" : n == 1 ? "" : "(");
	for (size_t c = 0; c < n; c++) {
		const char *name = cachew_element_name(e, c);

		if (c > 0)
			fputs(", ", out);
		if (named && name != NULL)
			fprintf(out, "%s: ", name);
		put_text_tensor(out, cachew_element_component(e, c));
	}
	fputs(named ? "}\n" : n == 1 ? "\n" : ")\n", out);
}
