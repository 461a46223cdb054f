/*
 * gen_text.c - Zipf-distributed text: lines of words drawn from a 50,000-
 * word synthetic vocabulary whose rank-r word has probability
 * proportional to 1 / r^1.1, like the words of natural language. Frequent
 * words are short, as they are in natural language.
 */
#include "gen.h"

#include <math.h>
#include <stdlib.h>

#define VOCAB 50000
#define ZIPF_S 1.1
#define WORD_MAX 12

typedef struct vocab {
	char words[VOCAB][WORD_MAX + 1];
	uint8_t lens[VOCAB];
	double cdf[VOCAB];
} vocab;

static void
vocab_build(vocab *v, uint64_t seed)
{
	static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
	double total = 0;

	for (size_t r = 0; r < VOCAB; r++) {
		cwi_rng rng = {cwi_seed_derive(seed ^ 0x766f636162ULL, r)};
		/* 2 letters for the top words, up to 12 for the rare ones. */
		size_t len = 2 + (size_t)cwi_rng_below(&rng,
		    1 + (uint64_t)(log2((double)r + 2.0) * 0.7));
		if (len > WORD_MAX)
			len = WORD_MAX;
		for (size_t i = 0; i < len; i++) {
			/* Skewed toward common letters. */
			uint64_t a = cwi_rng_below(&rng, 26);
			uint64_t b = cwi_rng_below(&rng, 26);
			v->words[r][i] = letters[a < b ? a : b];
		}
		v->words[r][len] = '\0';
		v->lens[r] = (uint8_t)len;
		total += 1.0 / pow((double)(r + 1), ZIPF_S);
		v->cdf[r] = total;
	}
	for (size_t r = 0; r < VOCAB; r++)
		v->cdf[r] /= total;
}

static size_t
vocab_sample(const vocab *v, cwi_rng *rng)
{
	double u = cwi_rng_double(rng);
	size_t lo = 0, hi = VOCAB - 1;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (v->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static cachew_err
write_text_file(const cwi_gen_text_config *cfg, const vocab *v, int64_t f,
    uint64_t *bytes, char *err, size_t errlen)
{
	int64_t first = f * cfg->lines / cfg->files;
	int64_t end = (f + 1) * cfg->lines / cfg->files;
	char name[64];
	cwi_gen_file gf;
	cwi_strbuf sb;
	cachew_err rv;

	snprintf(name, sizeof(name), "text-%05lld-of-%05lld.txt", (long long)f,
	    (long long)cfg->files);
	rv = cwi_gen_file_open(&gf, cfg->out_dir, name, err, errlen);
	cwi_strbuf_init(&sb);
	for (int64_t i = first; rv == CACHEW_OK && i < end; i++) {
		/* Line i depends on (seed, i) alone, not on the file split. */
		cwi_rng rng = {cwi_seed_derive(cfg->seed, (uint64_t)i)};
		int words = 4 + (int)cwi_rng_below(&rng, 21);
		for (int k = 0; k < words; k++) {
			size_t w = vocab_sample(v, &rng);
			if (k > 0)
				cwi_strbuf_append(&sb, " ", 1);
			cwi_strbuf_append(&sb, v->words[w], v->lens[w]);
		}
		cwi_strbuf_append(&sb, "\n", 1);
		if (sb.oom) {
			snprintf(err, errlen, "out of memory");
			rv = CACHEW_ENOMEM;
		} else if (sb.len >= (1u << 20) || i + 1 == end) {
			rv = cwi_gen_file_write(&gf, sb.data, sb.len, err,
			    errlen);
			*bytes += sb.len;
			sb.len = 0;
		}
	}
	cwi_strbuf_free(&sb);
	if (rv == CACHEW_OK)
		return cwi_gen_file_commit(&gf, err, errlen);
	cwi_gen_file_abort(&gf);
	return rv;
}

cachew_err
cwi_gen_text(const cwi_gen_text_config *cfg, uint64_t *bytes, char *err,
    size_t errlen)
{
	uint64_t total = 0;
	vocab *v;
	cachew_err rv = CACHEW_OK;

	if (cfg->lines < 0 || cfg->files < 1 || cfg->files > 99999) {
		snprintf(err, errlen,
		    "lines must be >= 0 and files in [1, 99999]");
		return CACHEW_ERANGE;
	}
	v = malloc(sizeof(*v));
	if (v == NULL) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	vocab_build(v, cfg->seed);
	for (int64_t f = 0; rv == CACHEW_OK && f < cfg->files; f++)
		rv = write_text_file(cfg, v, f, &total, err, errlen);
	free(v);
	if (bytes != NULL)
		*bytes = total;
	return rv;
}
