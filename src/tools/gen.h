/*
 * gen.h - synthetic data sets, deterministic for a seed: ImageNet-like
 * TFRecord shards of tf.train.Example (photo-like JPEGs and labels) and
 * Zipf-distributed text. `cachew gen` is a thin front end; `make demo`
 * and the benchmarks generate their inputs with it.
 */
#ifndef CWI_GEN_H
#define CWI_GEN_H

#include "../core/core.h"

#include <stdio.h>

typedef struct cwi_gen_imagenet_config {
	const char *out_dir; /* created if missing (one level) */
	int64_t images;      /* >= 0 */
	int64_t shards;      /* >= 1 */
	uint64_t seed;
	int width, height;   /* 500 x 375 by default */
	int quality;         /* JPEG quality, 90 by default */
} cwi_gen_imagenet_config;

/* Writes shards "train-%05d-of-%05d.tfrecord" into out_dir, each through
 * a temporary file renamed when complete; shard s holds images
 * [s*N/K, (s+1)*N/K). Each record is an Example with "image/encoded"
 * (JPEG bytes), "image/format" ("jpeg"), "image/class/label" (int64 in
 * [0, 1000)), "image/height" and "image/width" (int64). Image i depends
 * only on (seed, i, size, quality), not on the sharding. *bytes (may be
 * NULL) gets the total size written. On failure a reason goes to err and
 * shards already complete stay. */
cachew_err cwi_gen_imagenet(const cwi_gen_imagenet_config *cfg,
    uint64_t *bytes, char *err, size_t errlen);

/* The label of image `index` for a seed: what the generator writes. */
int64_t cwi_gen_imagenet_label(uint64_t seed, int64_t index);

/* Encodes image `index` as a JPEG into a malloc'ed buffer (free with
 * free). */
cachew_err cwi_gen_imagenet_jpeg(uint64_t seed, int64_t index, int width,
    int height, int quality, uint8_t **jpeg, size_t *len, char *err,
    size_t errlen);

typedef struct cwi_gen_text_config {
	const char *out_dir;
	int64_t lines;  /* >= 0 */
	int64_t files;  /* >= 1 */
	uint64_t seed;
} cwi_gen_text_config;

/* Writes files "text-%05d-of-%05d.txt" of lines of 4 to 24 words drawn
 * from a 50,000-word synthetic vocabulary with Zipf frequencies
 * (s = 1.1), atomically like cwi_gen_imagenet. */
cachew_err cwi_gen_text(const cwi_gen_text_config *cfg, uint64_t *bytes,
    char *err, size_t errlen);

/* ---- output files (gen_imagenet.c) ------------------------------------------ */

/* A file written under "<path>.tmp-<pid>" and renamed to path by commit
 * after an fsync; abort (or a failed commit) removes it. */
typedef struct cwi_gen_file {
	FILE *f;
	char *path;
	char *tmp;
} cwi_gen_file;

/* Creates dir (one level) if needed and opens dir/name for writing. */
cachew_err cwi_gen_file_open(cwi_gen_file *gf, const char *dir,
    const char *name, char *err, size_t errlen);
cachew_err cwi_gen_file_write(cwi_gen_file *gf, const void *data, size_t len,
    char *err, size_t errlen);
cachew_err cwi_gen_file_commit(cwi_gen_file *gf, char *err, size_t errlen);
/* Safe on a closed or never opened (zeroed) file. */
void cwi_gen_file_abort(cwi_gen_file *gf);

#endif /* CWI_GEN_H */
