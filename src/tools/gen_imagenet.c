/*
 * gen_imagenet.c - ImageNet-like TFRecord shards: photo-like JPEGs (a
 * smooth gradient, soft-edged blobs and per-pixel noise, which JPEG cannot
 * predict away, so that 500x375 at quality 90 lands near the ~110 KB of a
 * real ImageNet training image) with labels, in tf.train.Example records.
 * Also the atomic output files shared by the generators.
 */
#include "gen.h"

#include "../ops/ops.h"
#include "../sources/sources.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

/* Noise amplitude: +-NOISE/2 per channel. Tuned (88: ~109 KB) so the default
 * 500x375 q90 images average about 110 KB (docs/formats.md). */
#define NOISE 88

/* ---- output files ------------------------------------------------------------- */

cachew_err
cwi_gen_file_open(cwi_gen_file *gf, const char *dir, const char *name,
    char *err, size_t errlen)
{
	memset(gf, 0, sizeof(*gf));
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		snprintf(err, errlen, "cannot create %s: %s", dir,
		    strerror(errno));
		return CACHEW_EIO;
	}
	gf->path = cwi_asprintf("%s/%s", dir, name);
	gf->tmp = gf->path != NULL
	    ? cwi_asprintf("%s.tmp-%ld", gf->path, (long)getpid())
	    : NULL;
	if (gf->tmp == NULL) {
		cwi_gen_file_abort(gf);
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	gf->f = fopen(gf->tmp, "wbe");
	if (gf->f == NULL) {
		snprintf(err, errlen, "cannot create %s: %s", gf->tmp,
		    strerror(errno));
		cwi_gen_file_abort(gf);
		return CACHEW_EIO;
	}
	return CACHEW_OK;
}

cachew_err
cwi_gen_file_write(cwi_gen_file *gf, const void *data, size_t len, char *err,
    size_t errlen)
{
	if (len > 0 && fwrite(data, 1, len, gf->f) != len) {
		snprintf(err, errlen, "%s: write failed: %s", gf->tmp,
		    strerror(errno));
		return CACHEW_EIO;
	}
	return CACHEW_OK;
}

cachew_err
cwi_gen_file_commit(cwi_gen_file *gf, char *err, size_t errlen)
{
	int rc = fflush(gf->f) != 0 || fsync(fileno(gf->f)) != 0;

	rc |= fclose(gf->f) != 0;
	gf->f = NULL;
	if (rc != 0 || rename(gf->tmp, gf->path) != 0) {
		snprintf(err, errlen, "%s: cannot complete the file: %s",
		    gf->path, strerror(errno));
		cwi_gen_file_abort(gf);
		return CACHEW_EIO;
	}
	free(gf->tmp);
	free(gf->path);
	gf->tmp = gf->path = NULL;
	return CACHEW_OK;
}

void
cwi_gen_file_abort(cwi_gen_file *gf)
{
	if (gf->f != NULL)
		fclose(gf->f);
	if (gf->tmp != NULL)
		(void)unlink(gf->tmp);
	free(gf->tmp);
	free(gf->path);
	memset(gf, 0, sizeof(*gf));
}

/* ---- images ------------------------------------------------------------------ */

static uint8_t
clamp_u8(int v)
{
	return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int64_t
cwi_gen_imagenet_label(uint64_t seed, int64_t index)
{
	cwi_rng rng = {cwi_seed_derive(seed ^ 0x6c6162656cULL, (uint64_t)index)};
	return (int64_t)cwi_rng_below(&rng, 1000);
}

/* A linear gradient between two random colours. */
static void
paint_gradient(cwi_rng *rng, uint8_t *px, int w, int h)
{
	int c0[3], c1[3];

	for (int c = 0; c < 3; c++) {
		c0[c] = (int)cwi_rng_below(rng, 256);
		c1[c] = (int)cwi_rng_below(rng, 256);
	}
	for (int y = 0; y < h; y++) {
		uint8_t *row = px + (size_t)y * (size_t)w * 3;
		for (int x = 0; x < w; x++) {
			int t = (x * 256 / w + y * 256 / h) / 2; /* 0..255 */
			for (int c = 0; c < 3; c++)
				row[3 * x + c] = (uint8_t)(c0[c] +
				    (c1[c] - c0[c]) * t / 256);
		}
	}
}

/* Soft-edged ellipses blended over the picture. */
static void
paint_blobs(cwi_rng *rng, uint8_t *px, int w, int h)
{
	int nblobs = 6 + (int)cwi_rng_below(rng, 8);

	for (int b = 0; b < nblobs; b++) {
		int cx = (int)cwi_rng_below(rng, (uint64_t)w);
		int cy = (int)cwi_rng_below(rng, (uint64_t)h);
		int rx = 10 + (int)cwi_rng_below(rng, (uint64_t)w / 3);
		int ry = 10 + (int)cwi_rng_below(rng, (uint64_t)h / 3);
		int col[3];
		for (int c = 0; c < 3; c++)
			col[c] = (int)cwi_rng_below(rng, 256);
		int y0 = cy - ry < 0 ? 0 : cy - ry;
		int y1 = cy + ry >= h ? h - 1 : cy + ry;
		int x0 = cx - rx < 0 ? 0 : cx - rx;
		int x1 = cx + rx >= w ? w - 1 : cx + rx;
		for (int y = y0; y <= y1; y++) {
			int dy = (y - cy) * 256 / ry;
			uint8_t *row = px + (size_t)y * (size_t)w * 3;
			for (int x = x0; x <= x1; x++) {
				int dx = (x - cx) * 256 / rx;
				int d2 = (dx * dx + dy * dy) >> 8; /* 0..256 in */
				if (d2 >= 256)
					continue;
				int a = 256 - d2; /* opacity falls off outward */
				for (int c = 0; c < 3; c++) {
					int v = row[3 * x + c];
					row[3 * x + c] = (uint8_t)(v +
					    (col[c] - v) * a / 256);
				}
			}
		}
	}
}

/* Per-pixel noise: xorshift32, one draw per pixel for three channels. */
static void
paint_noise(cwi_rng *rng, uint8_t *px, int w, int h)
{
	uint32_t s = (uint32_t)cwi_rng_next(rng) | 1u;
	size_t n = (size_t)w * (size_t)h;

	for (size_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 17;
		s ^= s << 5;
		for (int c = 0; c < 3; c++) {
			int r = (int)((s >> (8 * c)) & 0xffu) * NOISE / 256 -
			    NOISE / 2;
			px[3 * i + (size_t)c] = clamp_u8(px[3 * i + (size_t)c] + r);
		}
	}
}

static cachew_err
encode_jpeg(tjhandle tj, uint64_t seed, int64_t index, int w, int h, int q,
    uint8_t *px, uint8_t **jpeg, size_t *len, char *err, size_t errlen)
{
	cwi_rng rng = {cwi_seed_derive(seed, (uint64_t)index)};
	unsigned char *out = NULL;
	unsigned long olen = 0;

	paint_gradient(&rng, px, w, h);
	paint_blobs(&rng, px, w, h);
	paint_noise(&rng, px, w, h);
	if (tjCompress2(tj, px, w, 0, h, TJPF_RGB, &out, &olen, TJSAMP_420, q,
		0) != 0) {
		snprintf(err, errlen, "JPEG compression failed: %s",
		    tjGetErrorStr2(tj));
		tjFree(out);
		return CACHEW_EOP;
	}
	*jpeg = malloc(olen);
	if (*jpeg == NULL) {
		tjFree(out);
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	memcpy(*jpeg, out, olen);
	*len = olen;
	tjFree(out);
	return CACHEW_OK;
}

static cachew_err
check_size(int w, int h, int q, char *err, size_t errlen)
{
	if (w < 16 || h < 16 || w > 8192 || h > 8192 || q < 1 || q > 100) {
		snprintf(err, errlen,
		    "width and height must be in [16, 8192] and quality in "
		    "[1, 100]");
		return CACHEW_ERANGE;
	}
	return CACHEW_OK;
}

cachew_err
cwi_gen_imagenet_jpeg(uint64_t seed, int64_t index, int width, int height,
    int quality, uint8_t **jpeg, size_t *len, char *err, size_t errlen)
{
	tjhandle tj;
	uint8_t *px;
	cachew_err rv = check_size(width, height, quality, err, errlen);

	if (rv != CACHEW_OK)
		return rv;
	tj = tjInitCompress();
	px = malloc((size_t)width * (size_t)height * 3);
	if (tj == NULL || px == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = CACHEW_ENOMEM;
	} else {
		rv = encode_jpeg(tj, seed, index, width, height, quality, px,
		    jpeg, len, err, errlen);
	}
	free(px);
	if (tj != NULL)
		tjDestroy(tj);
	return rv;
}

/* ---- shards ------------------------------------------------------------------ */

typedef struct gen_state {
	const cwi_gen_imagenet_config *cfg;
	tjhandle tj;
	uint8_t *px;
	cwi_strbuf rec;
	uint64_t bytes;
} gen_state;

/* Appends the record of image i to the shard, and its "<offset> <size>"
 * line to the shard's record index (docs/formats.md). */
static cachew_err
write_image(gen_state *g, cwi_gen_file *gf, cwi_gen_file *idx, int64_t i,
    uint64_t *offset, char *err, size_t errlen)
{
	const cwi_gen_imagenet_config *cfg = g->cfg;
	int64_t label = cwi_gen_imagenet_label(cfg->seed, i);
	int64_t height = cfg->height, width = cfg->width;
	uint8_t hdr[CWI_TFRECORD_HEADER], ftr[CWI_TFRECORD_FOOTER];
	uint8_t *jpeg = NULL;
	size_t jlen = 0, total;
	char line[48];
	int n;
	const void *items[1];
	size_t lens[1];
	cwi_example_enc enc;
	cachew_err rv;

	rv = encode_jpeg(g->tj, cfg->seed, i, cfg->width, cfg->height,
	    cfg->quality, g->px, &jpeg, &jlen, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	cwi_example_enc_init(&enc);
	items[0] = jpeg;
	lens[0] = jlen;
	cwi_example_enc_bytes(&enc, "image/encoded", items, lens, 1);
	items[0] = "jpeg";
	lens[0] = 4;
	cwi_example_enc_bytes(&enc, "image/format", items, lens, 1);
	cwi_example_enc_int64(&enc, "image/class/label", &label, 1, true);
	cwi_example_enc_int64(&enc, "image/height", &height, 1, true);
	cwi_example_enc_int64(&enc, "image/width", &width, 1, true);
	g->rec.len = 0;
	rv = cwi_example_enc_finish(&enc, &g->rec);
	cwi_example_enc_free(&enc);
	free(jpeg);
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "out of memory");
		return rv;
	}
	cwi_tfrecord_header(hdr, g->rec.len);
	cwi_tfrecord_footer(ftr, g->rec.data, g->rec.len);
	rv = cwi_gen_file_write(gf, hdr, sizeof(hdr), err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_gen_file_write(gf, g->rec.data, g->rec.len, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_gen_file_write(gf, ftr, sizeof(ftr), err, errlen);
	total = sizeof(hdr) + g->rec.len + sizeof(ftr);
	n = snprintf(line, sizeof(line), "%llu %llu\n",
	    (unsigned long long)*offset, (unsigned long long)total);
	if (rv == CACHEW_OK)
		rv = cwi_gen_file_write(idx, line, (size_t)n, err, errlen);
	*offset += total;
	g->bytes += total;
	return rv;
}

static cachew_err
write_shard(gen_state *g, int64_t s, char *err, size_t errlen)
{
	const cwi_gen_imagenet_config *cfg = g->cfg;
	int64_t first = s * cfg->images / cfg->shards;
	int64_t end = (s + 1) * cfg->images / cfg->shards;
	char name[64], idx_name[72];
	cwi_gen_file gf, idx;
	uint64_t offset = 0;
	cachew_err rv;

	memset(&idx, 0, sizeof(idx));
	snprintf(name, sizeof(name), "train-%05lld-of-%05lld.tfrecord",
	    (long long)s, (long long)cfg->shards);
	snprintf(idx_name, sizeof(idx_name), "%s.idx", name);
	rv = cwi_gen_file_open(&gf, cfg->out_dir, name, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_gen_file_open(&idx, cfg->out_dir, idx_name, err, errlen);
	for (int64_t i = first; rv == CACHEW_OK && i < end; i++)
		rv = write_image(g, &gf, &idx, i, &offset, err, errlen);
	/* The index is renamed after its shard, as tfrecord_write does. */
	if (rv == CACHEW_OK)
		rv = cwi_gen_file_commit(&gf, err, errlen);
	if (rv == CACHEW_OK)
		return cwi_gen_file_commit(&idx, err, errlen);
	cwi_gen_file_abort(&gf);
	cwi_gen_file_abort(&idx);
	return rv;
}

cachew_err
cwi_gen_imagenet(const cwi_gen_imagenet_config *cfg, uint64_t *bytes,
    char *err, size_t errlen)
{
	gen_state g = {.cfg = cfg};
	cachew_err rv;

	if (cfg->images < 0 || cfg->shards < 1 || cfg->shards > 99999) {
		snprintf(err, errlen, "images must be >= 0 and shards in "
				      "[1, 99999]");
		return CACHEW_ERANGE;
	}
	rv = check_size(cfg->width, cfg->height, cfg->quality, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	cwi_strbuf_init(&g.rec);
	g.tj = tjInitCompress();
	g.px = malloc((size_t)cfg->width * (size_t)cfg->height * 3);
	if (g.tj == NULL || g.px == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = CACHEW_ENOMEM;
	}
	for (int64_t s = 0; rv == CACHEW_OK && s < cfg->shards; s++)
		rv = write_shard(&g, s, err, errlen);
	if (g.tj != NULL)
		tjDestroy(g.tj);
	free(g.px);
	cwi_strbuf_free(&g.rec);
	if (bytes != NULL)
		*bytes = g.bytes;
	return rv;
}
