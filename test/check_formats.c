/*
 * check_formats.c - CRC32C, TFRecord reading and writing, tf.train.Example
 * decoding and encoding, and the data generators (issue 3, "Formats" and
 * "Data generator").
 */
#include "cwt.h"

#include "../src/core/crc32c.h"
#include "../src/tools/gen.h"
#include "../src/ops/ops.h"
#include "../src/sources/sources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

/* ---- helpers ------------------------------------------------------------------ */

/* Record i of the sequence that test/data/tfrecord_ref.py also makes. */
static size_t
sample_record(int i, uint8_t *out)
{
	size_t n = (size_t)((i * 37) % 301);
	for (size_t j = 0; j < n; j++)
		out[j] = (uint8_t)((i * 7 + (int)j * 13) & 0xff);
	return n;
}

/* Appends the framed record to a growable buffer. */
static void
frame(uint8_t **buf, size_t *len, const void *data, size_t n)
{
	uint8_t hdr[CWI_TFRECORD_HEADER], ftr[CWI_TFRECORD_FOOTER];

	*buf = realloc(*buf, *len + n + 16);
	ck_assert_ptr_nonnull(*buf);
	cwi_tfrecord_header(hdr, n);
	cwi_tfrecord_footer(ftr, data, n);
	memcpy(*buf + *len, hdr, 12);
	if (n > 0)
		memcpy(*buf + *len + 12, data, n);
	memcpy(*buf + *len + 12 + n, ftr, 4);
	*len += n + 16;
}

/* A file of records of sizes 5, 7, 9, ... (k records), record i filled
 * with 'a' + i. Record i starts at 16 * i + (5 + 7 + ... ). */
static uint8_t *
small_file(int k, size_t *len)
{
	uint8_t *buf = NULL, rec[64];

	*len = 0;
	for (int i = 0; i < k; i++) {
		memset(rec, 'a' + i, sizeof(rec));
		frame(&buf, len, rec, (size_t)(5 + 2 * i));
	}
	return buf;
}

static size_t
small_offset(int i)
{
	size_t off = 0;
	for (int j = 0; j < i; j++)
		off += 16 + 5 + 2 * (size_t)j;
	return off;
}

static uint8_t *
read_whole(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static bool
file_exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0;
}

/* Counts the entries of a directory (no . and ..). */
static int
dir_entries(const char *dir)
{
	char cmd[512];
	FILE *p;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", dir);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(fscanf(p, "%d", &n), 1);
	pclose(p);
	return n;
}

static void
elem_bytes_eq(const cachew_element *e, size_t c, const void *data, size_t len)
{
	const void *p;
	size_t n;

	ck_assert_int_eq(cachew_tensor_dtype(cachew_element_component(e, c)),
	    CACHEW_BYTES);
	ck_assert_int_eq(cachew_tensor_bytes_at(cachew_element_component(e, c),
			     0, &p, &n),
	    CACHEW_OK);
	ck_assert_uint_eq(n, len);
	ck_assert(len == 0 || memcmp(p, data, len) == 0);
}

/* Reads a memory image with the given options: the number of records and
 * the result of the last call; errmsg copied when not NULL. */
static cachew_err
read_mem(const void *data, size_t len, bool skip, bool verify, int64_t bs,
    size_t *count, char *errmsg, size_t errlen, uint64_t *skipped)
{
	cwi_tfr_config cfg = {.verify = verify, .skip_corrupt = skip,
	    .buffer_size = bs};
	cwi_tfr_reader *r = NULL;
	cwi_tensor t;
	cachew_err rv;

	ck_assert_int_eq(cwi_tfr_open_mem(&r, &cfg, "mem.tfrecord", data, len),
	    CACHEW_OK);
	*count = 0;
	while ((rv = cwi_tfr_next(r, &t)) == CACHEW_OK) {
		cwi_tensor_clear(&t);
		(*count)++;
	}
	if (errmsg != NULL)
		snprintf(errmsg, errlen, "%s", cwi_tfr_errmsg(r));
	if (skipped != NULL)
		*skipped = cwi_tfr_skipped(r);
	cwi_tfr_close(r);
	return rv;
}

/* ---- CRC32C ------------------------------------------------------------------------ */

START_TEST(crc32c_known_vectors_software)
{
	uint8_t zeros[32] = {0}, ones[32];

	memset(ones, 0xff, sizeof(ones));
	ck_assert_uint_eq(cwi_crc32c_sw(0, "123456789", 9), 0xE3069283u);
	ck_assert_uint_eq(cwi_crc32c_sw(0, zeros, 32), 0x8A9136AAu);
	ck_assert_uint_eq(cwi_crc32c_sw(0, ones, 32), 0x62A8AB43u);
	ck_assert_uint_eq(cwi_crc32c_sw(0, "", 0), 0u);
}
END_TEST

START_TEST(crc32c_known_vectors_hardware)
{
	uint8_t zeros[32] = {0};

	if (!cwi_crc32c_hw_available())
		return; /* nothing to test on this CPU */
	ck_assert_uint_eq(cwi_crc32c_hw(0, "123456789", 9), 0xE3069283u);
	ck_assert_uint_eq(cwi_crc32c_hw(0, zeros, 32), 0x8A9136AAu);
	ck_assert_uint_eq(cwi_crc32c(0, "123456789", 9), 0xE3069283u);
}
END_TEST

START_TEST(crc32c_paths_agree_at_every_length_and_alignment)
{
	uint8_t buf[600];

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	for (size_t off = 0; off < 8; off++) {
		for (size_t n = 0; n + off <= sizeof(buf); n += 13) {
			uint32_t sw = cwi_crc32c_sw(0, buf + off, n);
			/* Incremental: any split gives the same CRC. */
			uint32_t inc = cwi_crc32c_sw(
			    cwi_crc32c_sw(0, buf + off, n / 3), buf + off + n / 3,
			    n - n / 3);
			ck_assert_uint_eq(sw, inc);
			ck_assert_uint_eq(cwi_crc32c(0, buf + off, n), sw);
		}
	}
}
END_TEST

START_TEST(crc32c_mask_round_trips)
{
	ck_assert_uint_eq(cwi_crc32c_unmask(cwi_crc32c_mask(0xE3069283u)),
	    0xE3069283u);
	ck_assert_uint_eq(cwi_crc32c_mask(0), 0xa282ead8u);
}
END_TEST

/* ---- TFRecord framing ----------------------------------------------------------------- */

START_TEST(tfrecord_header_is_the_documented_bytes)
{
	/* A one-byte record "a": what TensorFlow writes. */
	uint8_t hdr[12], ftr[4];
	static const uint8_t want_hdr[12] = {1, 0, 0, 0, 0, 0, 0, 0, 0x01,
	    0x75, 0xde, 0x41};

	cwi_tfrecord_header(hdr, 1);
	cwi_tfrecord_footer(ftr, "a", 1);
	ck_assert_mem_eq(hdr, want_hdr, 12);
	ck_assert_uint_eq((uint32_t)ftr[0] | (uint32_t)ftr[1] << 8 |
		(uint32_t)ftr[2] << 16 | (uint32_t)ftr[3] << 24,
	    cwi_crc32c_mask(cwi_crc32c(0, "a", 1)));
}
END_TEST

static const size_t round_trip_sizes[] = {0, 1, 2, 11, 12, 13, 100, 4095, 4096,
    4097, 65536, 1 << 20, (1 << 20) + 3};

START_TEST(tfrecord_round_trip_of_many_sizes)
{
	size_t nsizes = sizeof(round_trip_sizes) / sizeof(round_trip_sizes[0]);
	char *dir = cwt_tmpdir(), path[512], pipeline[1024], err[512];
	uint8_t *file = NULL, *data = malloc((1 << 20) + 3);
	cachew_element **v = NULL;
	size_t len = 0, n = 0;
	static const int64_t bufs[] = {1, 1000, 1 << 20};

	ck_assert_ptr_nonnull(data);
	for (size_t i = 0; i < (1 << 20) + 3; i++)
		data[i] = (uint8_t)(i * 2654435761u >> 24);
	for (size_t i = 0; i < nsizes; i++)
		frame(&file, &len, data, round_trip_sizes[i]);
	snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
	cwt_write_file(path, file, len);
	for (size_t b = 0; b < 3; b++) {
		snprintf(pipeline, sizeof(pipeline),
		    "tfrecord(\"%s\", buffer_size=%lld)", path,
		    (long long)bufs[b]);
		ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err,
				     sizeof(err)),
		    CACHEW_OK);
		ck_assert_uint_eq(n, nsizes);
		for (size_t i = 0; i < nsizes; i++)
			elem_bytes_eq(v[i], 0, data, round_trip_sizes[i]);
		cwt_free(v, n);
	}
	free(file);
	free(data);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_write_then_read_is_byte_identical)
{
	char *dir = cwt_tmpdir(), in[512], out[512], pipeline[1200], err[512];
	uint8_t *file = NULL, *back, rec[400];
	cachew_element **v = NULL;
	size_t len = 0, blen, n = 0;

	for (int i = 0; i < 40; i++)
		frame(&file, &len, rec, sample_record(i, rec));
	snprintf(in, sizeof(in), "%s/in.tfrecord", dir);
	snprintf(out, sizeof(out), "%s/out.tfrecord", dir);
	cwt_write_file(in, file, len);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\") | tfrecord_write(\"%s\")", in, out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 40);
	cwt_free(v, n);
	back = read_whole(out, &blen);
	ck_assert_uint_eq(blen, len);
	ck_assert_mem_eq(back, file, len);
	ck_assert_int_eq(dir_entries(dir), 2); /* no temporary left */
	free(back);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- corruption -------------------------------------------------------------------------- */

/* Flips one bit at byte `at` of a 3-record file and expects the read to
 * fail at record 1 with `why`. */
static void
expect_corrupt_at(size_t at, const char *why)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[700], err[700], want[700];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(3, &len);

	file[at] ^= 0x10;
	snprintf(path, sizeof(path), "%s/c.tfrecord", dir);
	cwt_write_file(path, file, len);
	snprintf(pipeline, sizeof(pipeline), "tfrecord(\"%s\")", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	snprintf(want, sizeof(want), "%s: record at byte %zu: %s", path,
	    small_offset(1), why);
	ck_assert_msg(strstr(err, want) != NULL, "'%s' lacks '%s'", err, want);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}

START_TEST(tfrecord_flipped_length_bit_is_corrupt)
{
	expect_corrupt_at(small_offset(1) + 0, "length checksum mismatch");
}
END_TEST

START_TEST(tfrecord_flipped_length_crc_bit_is_corrupt)
{
	expect_corrupt_at(small_offset(1) + 9, "length checksum mismatch");
}
END_TEST

START_TEST(tfrecord_flipped_data_bit_is_corrupt)
{
	expect_corrupt_at(small_offset(1) + 12 + 3, "data checksum mismatch");
}
END_TEST

START_TEST(tfrecord_flipped_data_crc_bit_is_corrupt)
{
	expect_corrupt_at(small_offset(1) + 12 + 7 + 2, "data checksum mismatch");
}
END_TEST

START_TEST(tfrecord_truncation_at_every_byte_is_corrupt)
{
	size_t len, count;
	uint8_t *file = small_file(3, &len);
	char err[512], want[128];

	for (size_t cut = 0; cut <= len; cut++) {
		int rec = 0;
		while (rec < 3 && small_offset(rec + 1) <= cut)
			rec++;
		uint8_t *copy = malloc(cut + 1);
		memcpy(copy, file, cut);
		cachew_err rv = read_mem(copy, cut, false, true, 7, &count, err,
		    sizeof(err), NULL);
		if (cut == small_offset(rec)) {
			/* A cut between records is a shorter, valid file. */
			ck_assert_int_eq(rv, CACHEW_EOF);
			ck_assert_uint_eq(count, (size_t)rec);
		} else {
			ck_assert_int_eq(rv, CACHEW_ECORRUPT);
			ck_assert_uint_eq(count, (size_t)rec);
			snprintf(want, sizeof(want),
			    "mem.tfrecord: record at byte %zu: truncated",
			    small_offset(rec));
			ck_assert_msg(strstr(err, want) == err, "cut %zu: %s",
			    cut, err);
		}
		free(copy);
	}
	free(file);
}
END_TEST

START_TEST(tfrecord_truncated_file_names_file_and_offset)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[700], err[700], want[700];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(3, &len);

	snprintf(path, sizeof(path), "%s/t.tfrecord", dir);
	cwt_write_file(path, file, len - 3);
	snprintf(pipeline, sizeof(pipeline), "tfrecord(\"%s\")", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	snprintf(want, sizeof(want),
	    "%s: record at byte %zu: truncated: the record needs 25 bytes, 22 "
	    "remain", path, small_offset(2));
	ck_assert_msg(strstr(err, want) != NULL, "'%s' lacks '%s'", err, want);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_huge_length_is_rejected_before_allocating)
{
	uint8_t hdr[12];
	size_t count;
	char err[512];

	/* A valid header claiming 1 GiB + 1 bytes, and one claiming 1 KiB
	 * in a 12-byte file. */
	cwi_tfrecord_header(hdr, (1ull << 30) + 1);
	ck_assert_int_eq(read_mem(hdr, 12, false, true, 0, &count, err,
			     sizeof(err), NULL),
	    CACHEW_ECORRUPT);
	ck_assert_str_eq(err, "mem.tfrecord: record at byte 0: length "
			      "1073741825 exceeds the limit of 1073741824 "
			      "bytes");
	cwi_tfrecord_header(hdr, 1024);
	ck_assert_int_eq(read_mem(hdr, 12, false, true, 0, &count, err,
			     sizeof(err), NULL),
	    CACHEW_ECORRUPT);
	ck_assert_str_eq(err, "mem.tfrecord: record at byte 0: truncated: the "
			      "record needs 1040 bytes, 12 remain");
}
END_TEST

/* ---- skip_corrupt and verify ---------------------------------------------------------- */

static char warn_log[1024];

static void
capture_warn(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	(void)ctx;
	if (level == CACHEW_LOG_WARN && strcmp(module, "tfrecord") == 0)
		snprintf(warn_log, sizeof(warn_log), "%s", msg);
}

START_TEST(tfrecord_skip_corrupt_skips_exactly_the_bad_records)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[700], err[512], want[700];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(7, &len);

	file[small_offset(1) + 12] ^= 1; /* data of record 1 */
	file[small_offset(3) + 2] ^= 1;  /* length of record 3 */
	file[small_offset(5) + 9] ^= 1;  /* length crc of record 5 */
	snprintf(path, sizeof(path), "%s/s.tfrecord", dir);
	cwt_write_file(path, file, len);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", skip_corrupt=true, buffer_size=16)", path);
	warn_log[0] = '\0';
	cachew_log_set(capture_warn, NULL, CACHEW_LOG_WARN);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	cachew_log_set(NULL, NULL, CACHEW_LOG_WARN);
	ck_assert_uint_eq(n, 4);
	elem_bytes_eq(v[0], 0, "aaaaa", 5);
	elem_bytes_eq(v[1], 0, "ccccccccc", 9);
	elem_bytes_eq(v[2], 0, "eeeeeeeeeeeee", 13);
	elem_bytes_eq(v[3], 0, "ggggggggggggggggg", 17);
	snprintf(want, sizeof(want), "%s: skipped 3 corrupt records", path);
	ck_assert_str_eq(warn_log, want);
	cwt_free(v, n);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_skip_corrupt_drops_a_truncated_tail)
{
	size_t len, count;
	uint64_t skipped;
	uint8_t *file = small_file(3, &len);

	ck_assert_int_eq(read_mem(file, len - 1, true, true, 0, &count, NULL, 0,
			     &skipped),
	    CACHEW_EOF);
	ck_assert_uint_eq(count, 2);
	ck_assert_uint_eq(skipped, 1);
	free(file);
}
END_TEST

START_TEST(tfrecord_verify_false_skips_the_data_checksum)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[700], err[512];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(2, &len);

	file[small_offset(1) + 12] = 'X';
	snprintf(path, sizeof(path), "%s/v.tfrecord", dir);
	cwt_write_file(path, file, len);
	snprintf(pipeline, sizeof(pipeline), "tfrecord(\"%s\", verify=false)",
	    path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	elem_bytes_eq(v[1], 0, "Xbbbbbb", 7);
	cwt_free(v, n);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- gzip -------------------------------------------------------------------------------------- */

static void
write_gzip(const char *path, const void *data, size_t len, int members)
{
	gzFile gz;
	size_t at = 0;

	for (int m = 0; m < members; m++) {
		size_t end = m + 1 == members ? len : len * (size_t)(m + 1) /
							  (size_t)members;
		gz = gzopen(path, m == 0 ? "wb" : "ab");
		ck_assert_ptr_nonnull(gz);
		if (end > at)
			ck_assert_int_eq(gzwrite(gz, (const uint8_t *)data + at,
					     (unsigned)(end - at)),
			    (int)(end - at));
		ck_assert_int_eq(gzclose(gz), Z_OK);
		at = end;
	}
}

START_TEST(tfrecord_gzip_round_trip)
{
	char *dir = cwt_tmpdir(), gz[512], out[512], pipeline[1200], err[512];
	uint8_t *file = NULL, rec[400];
	cachew_element **v = NULL;
	size_t len = 0, n = 0;

	for (int i = 0; i < 100; i++)
		frame(&file, &len, rec, sample_record(i, rec));
	snprintf(gz, sizeof(gz), "%s/a.tfrecord.gz", dir);
	snprintf(out, sizeof(out), "%s/b.tfrecord.gz", dir);
	/* Three gzip members: one stream to the reader. */
	write_gzip(gz, file, len, 3);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", compression=gzip, buffer_size=100) | "
	    "tfrecord_write(\"%s\", compression=gzip)", gz, out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 100);
	for (int i = 0; i < 100; i++)
		elem_bytes_eq(v[i], 0, rec, sample_record(i, rec));
	cwt_free(v, n);
	/* What the writer compressed inflates to the same framing. */
	gzFile g = gzopen(out, "rb");
	uint8_t *back = malloc(len + 1);
	ck_assert_int_eq(gzread(g, back, (unsigned)len + 1), (int)len);
	gzclose(g);
	ck_assert_mem_eq(back, file, len);
	free(back);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* One gzip member of exactly `size` bytes holding data (a header comment
 * pads it). */
static void
write_gzip_sized(const char *path, const void *data, size_t len, size_t size)
{
	size_t cap = len + len / 100 + 1024, bare;
	uint8_t *out = malloc(size > cap ? size : cap);
	char *comment = NULL;

	ck_assert_ptr_nonnull(out);
	for (int pass = 0; pass < 2; pass++) {
		z_stream zs = {0};
		gz_header h = {0};

		if (pass == 1) {
			ck_assert_uint_gt(size, bare + 1);
			comment = malloc(size - bare);
			ck_assert_ptr_nonnull(comment);
			/* comment bytes + its NUL = size - bare */
			memset(comment, 'c', size - bare - 1);
			comment[size - bare - 1] = '\0';
			h.comment = (Bytef *)comment;
		}
		ck_assert_int_eq(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8,
				     Z_DEFAULT_STRATEGY), Z_OK);
		ck_assert_int_eq(deflateSetHeader(&zs, &h), Z_OK);
		zs.next_in = (Bytef *)(uintptr_t)data;
		zs.avail_in = (uInt)len;
		zs.next_out = out;
		zs.avail_out = (uInt)(size > cap ? size : cap);
		ck_assert_int_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
		if (pass == 0)
			bare = zs.total_out;
		else
			ck_assert_uint_eq(zs.total_out, size);
		deflateEnd(&zs);
	}
	cwt_write_file(path, out, size);
	free(comment);
	free(out);
}

/* A valid file whose compressed size is a multiple of the reader's raw
 * buffer (256 KiB): the last read fills the buffer, the member ends with
 * nothing left in it, and the next read finds the end of the file. That
 * is the end of the stream, not a truncated one (it failed with "gzip
 * stream truncated" after the last record). One member of 256 KiB, one
 * of 512. */
START_TEST(tfrecord_gzip_of_a_buffer_multiple_reads_to_its_end)
{
	char *dir = cwt_tmpdir(), gz[512], pipeline[700], err[512];
	uint8_t *file = NULL, rec[400];
	cachew_element **v = NULL;
	size_t len = 0, n = 0;

	for (int i = 0; i < 100; i++)
		frame(&file, &len, rec, sample_record(i, rec));
	snprintf(gz, sizeof(gz), "%s/m.tfrecord.gz", dir);
	for (size_t size = 256 * 1024; size <= 512 * 1024; size += 256 * 1024) {
		write_gzip_sized(gz, file, len, size);
		snprintf(pipeline, sizeof(pipeline),
		    "tfrecord(\"%s\", compression=gzip)", gz);
		ck_assert_msg(cwt_run(pipeline, NULL, &v, &n, err,
				  sizeof(err)) == CACHEW_OK, "%zu bytes: %s",
		    size, err);
		ck_assert_uint_eq(n, 100);
		for (int i = 0; i < 100; i++)
			elem_bytes_eq(v[i], 0, rec, sample_record(i, rec));
		cwt_free(v, n);
	}
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_gzip_garbage_is_corrupt)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[700], err[512];
	cachew_element **v = NULL;
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/g.tfrecord.gz", dir);
	cwt_write_file(path, "not gzip at all", 15);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", compression=gzip)", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(err, "g.tfrecord.gz: gzip: ") != NULL, "%s", err);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- interop with an independent implementation ---------------------------------------- */

#define PYTHON "/usr/bin/python3"
#define PY_REF "test/data/tfrecord_ref.py"

START_TEST(tfrecord_agrees_with_the_python_reference_byte_for_byte)
{
	char *dir = cwt_tmpdir(), py[512], c[512], cmd[2048], err[512];
	char pipeline[1200], line[1024], hex[1024];
	uint8_t *file = NULL, *pyfile, *cfile, rec[400];
	cachew_element **v = NULL;
	size_t len = 0, pylen, clen, n = 0;
	FILE *p;

	if (access(PYTHON, X_OK) != 0 || access(PY_REF, R_OK) != 0)
		return; /* no Python: nothing to compare against */
	snprintf(py, sizeof(py), "%s/py.tfrecord", dir);
	snprintf(c, sizeof(c), "%s/c.tfrecord", dir);
	snprintf(cmd, sizeof(cmd), PYTHON " " PY_REF " write '%s' 60", py);
	ck_assert_int_eq(system(cmd), 0);
	/* Python's file: our framing of the same records, byte for byte. */
	for (int i = 0; i < 60; i++)
		frame(&file, &len, rec, sample_record(i, rec));
	pyfile = read_whole(py, &pylen);
	ck_assert_uint_eq(pylen, len);
	ck_assert_mem_eq(pyfile, file, len);
	/* Our reader reads Python's file; our writer rewrites it. */
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\") | tfrecord_write(\"%s\")", py, c);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 60);
	for (int i = 0; i < 60; i++)
		elem_bytes_eq(v[i], 0, rec, sample_record(i, rec));
	cwt_free(v, n);
	cfile = read_whole(c, &clen);
	ck_assert_uint_eq(clen, pylen);
	ck_assert_mem_eq(cfile, pyfile, pylen);
	/* Python's reader reads ours. */
	snprintf(cmd, sizeof(cmd), PYTHON " " PY_REF " read '%s'", c);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	for (int i = 0; i < 60; i++) {
		size_t rl = sample_record(i, rec);
		ck_assert_ptr_nonnull(fgets(line, sizeof(line), p));
		for (size_t j = 0; j < rl; j++)
			snprintf(hex + 2 * j, 3, "%02x", rec[j]);
		hex[2 * rl] = '\0';
		line[strcspn(line, "\n")] = '\0';
		ck_assert_str_eq(line, hex);
	}
	ck_assert_ptr_null(fgets(line, sizeof(line), p));
	ck_assert_int_eq(pclose(p), 0);
	free(pyfile);
	free(cfile);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- tfrecord_write ------------------------------------------------------------------------ */

START_TEST(tfrecord_write_failure_leaves_no_file)
{
	char *dir = cwt_tmpdir(), out[512], pipeline[700], err[512];
	cachew_element **v = NULL;
	size_t n = 0;

	snprintf(out, sizeof(out), "%s/out.tfrecord", dir);
	snprintf(pipeline, sizeof(pipeline),
	    "range(3) | tfrecord_write(\"%s\")", out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ETYPE);
	ck_assert_msg(strstr(err, "tfrecord_write: component 0 of element 0 "
				  "is i64[], expected a bytes scalar") != NULL,
	    "%s", err);
	ck_assert(!file_exists(out));
	ck_assert_int_eq(dir_entries(dir), 0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_write_upstream_failure_leaves_no_file)
{
	char *dir = cwt_tmpdir(), in[512], out[512], pipeline[1200], err[512];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(3, &len);

	file[small_offset(2) + 12] ^= 1;
	snprintf(in, sizeof(in), "%s/in.tfrecord", dir);
	snprintf(out, sizeof(out), "%s/out.tfrecord", dir);
	cwt_write_file(in, file, len);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\") | tfrecord_write(\"%s\")", in, out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	cwt_free(v, n);
	ck_assert(!file_exists(out));
	ck_assert_int_eq(dir_entries(dir), 1);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_write_stopped_early_leaves_no_file)
{
	char *dir = cwt_tmpdir(), out[512], pipeline[700];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	snprintf(out, sizeof(out), "%s/out.tfrecord", dir);
	snprintf(pipeline, sizeof(pipeline),
	    "from_list([\"a\", \"b\", \"c\"]) | tfrecord_write(\"%s\")", out);
	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
	cachew_element_release(e);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	ck_assert(!file_exists(out));
	ck_assert_int_eq(dir_entries(dir), 0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_write_rejects_unknown_compression)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "from_list([\"a\"]) | tfrecord_write(\"x\", "
			     "compression=zstd)"),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "compression must be none or "
					      "gzip, not 'zstd'") != NULL,
	    "%s", cachew_errmsg());
}
END_TEST

/* ---- record indexes and records= ------------------------------------------------------- */

/* Writes dir/in.tfrecord (small_file(10)) and copies it through
 * tfrecord_write(index=true) to dir/<name>; the path in out. */
static void
write_indexed(const char *dir, const char *name, char *out, size_t outlen)
{
	char in[512], pipeline[1200], err[512];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(10, &len);

	snprintf(in, sizeof(in), "%s/in.tfrecord", dir);
	snprintf(out, outlen, "%s/%s", dir, name);
	cwt_write_file(in, file, len);
	free(file);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\") | tfrecord_write(\"%s\", index=true)", in, out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 10);
	cwt_free(v, n);
}

/* Runs the pipeline and checks that it yields exactly small_file's
 * records [first, first + count). */
static void
expect_small_records(const char *pipeline, int first, int count)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char err[512];
	uint8_t rec[64];

	ck_assert_msg(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)) ==
		CACHEW_OK, "%s: %s", pipeline, err);
	ck_assert_uint_eq(n, (size_t)count);
	for (int i = 0; i < count; i++) {
		memset(rec, 'a' + first + i, sizeof(rec));
		elem_bytes_eq(v[i], 0, rec, (size_t)(5 + 2 * (first + i)));
	}
	cwt_free(v, n);
}

START_TEST(tfrecord_write_index_matches_independent_offsets)
{
	char *dir = cwt_tmpdir(), out[512], idx[600], want[512];
	size_t len, wlen = 0;
	uint8_t *got;

	write_indexed(dir, "out.tfrecord", out, sizeof(out));
	for (int i = 0; i < 10; i++)
		wlen += (size_t)snprintf(want + wlen, sizeof(want) - wlen,
		    "%zu %zu\n", small_offset(i), (size_t)(12 + 5 + 2 * i + 4));
	snprintf(idx, sizeof(idx), "%s.idx", out);
	got = read_whole(idx, &len);
	ck_assert_uint_eq(len, wlen);
	ck_assert_mem_eq(got, want, wlen);
	/* in, out and out.idx: no temporary left. */
	ck_assert_int_eq(dir_entries(dir), 3);
	free(got);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_write_index_needs_no_compression)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "from_list([\"a\"]) | tfrecord_write(\"x\", "
			     "compression=gzip, index=true)"),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "index=true needs "
					      "compression=none") != NULL,
	    "%s", cachew_errmsg());
}
END_TEST

START_TEST(tfrecord_records_reads_exactly_the_selected_records)
{
	char *dir = cwt_tmpdir(), out[512], pipeline[1200];

	write_indexed(dir, "out.tfrecord", out, sizeof(out));
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[3, 7], buffer_size=8)", out);
	expect_small_records(pipeline, 3, 4);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[0, 100])", out);
	expect_small_records(pipeline, 0, 10);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[5, 5])", out);
	expect_small_records(pipeline, 0, 0);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[9, 12])", out);
	expect_small_records(pipeline, 9, 1);
	/* The flat_map function takes the same parameter. */
	snprintf(pipeline, sizeof(pipeline),
	    "from_list([\"%s\"]) | interleave(tfrecord, cycle=1, "
	    "records=[3, 7])", out);
	expect_small_records(pipeline, 3, 4);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_records_changes_the_fingerprint)
{
	cachew_dataset *a, *b, *c;
	cachew_fingerprint fa, fb, fc;

	ck_assert_int_eq(cachew_dataset_parse(&a, "tfrecord(\"x\")"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&b,
			     "tfrecord(\"x\", records=[0, 5])"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&c,
			     "tfrecord(\"x\", records=[5, 10])"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(a, &fa), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(b, &fb), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(c, &fc), CACHEW_OK);
	ck_assert(fa.hi != fb.hi || fa.lo != fb.lo);
	ck_assert(fb.hi != fc.hi || fb.lo != fc.lo);
	cachew_dataset_release(a);
	cachew_dataset_release(b);
	cachew_dataset_release(c);
}
END_TEST

START_TEST(tfrecord_records_rejects_bad_ranges_and_gzip)
{
	static const char *const bad[] = {
	    "tfrecord(\"x\", records=[5, 3])",
	    "tfrecord(\"x\", records=[-1, 3])",
	    "tfrecord(\"x\", records=[1])",
	    "tfrecord(\"x\", records=[1, \"2\"])",
	    "tfrecord(\"x\", compression=gzip, records=[0, 1])",
	    "from_list([\"x\"]) | interleave(tfrecord, cycle=1, "
	    "compression=gzip, records=[0, 1])",
	};
	cachew_dataset *ds = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(cachew_dataset_parse(&ds, bad[i]) == CACHEW_EINVAL,
		    "%s", bad[i]);
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "tfrecord(\"x\", compression=gzip, records=[0, 1])"),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "records needs "
					      "compression=none") != NULL,
	    "%s", cachew_errmsg());
}
END_TEST

START_TEST(tfrecord_records_without_an_index_is_enoent)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[1200], err[1024],
	     want[700];
	cachew_element **v = NULL;
	size_t len, n = 0;
	uint8_t *file = small_file(3, &len);

	snprintf(path, sizeof(path), "%s/plain.tfrecord", dir);
	cwt_write_file(path, file, len);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[0, 2])", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ENOENT);
	ck_assert_uint_eq(n, 0);
	snprintf(want, sizeof(want),
	    "%s.idx: no record index; write one with "
	    "tfrecord_write(index=true) or cachew gen", path);
	ck_assert_msg(strstr(err, want) != NULL, "%s", err);
	cwt_free(v, n);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Replaces the index of `out` with `text` and checks that records= fails
 * with ECORRUPT and a message holding "<out>.idx: <want>". */
static void
expect_bad_index(const char *out, const char *text, const char *want)
{
	char idx[600], pipeline[1200], err[1024], msg[1200];
	cachew_element **v = NULL;
	size_t n = 0;

	snprintf(idx, sizeof(idx), "%s.idx", out);
	cwt_write_file(idx, text, strlen(text));
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", records=[0, 2])", out);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	ck_assert_uint_eq(n, 0);
	snprintf(msg, sizeof(msg), "%s: %s", idx, want);
	ck_assert_msg(strstr(err, msg) != NULL, "%s", err);
	cwt_free(v, n);
}

START_TEST(tfrecord_records_corrupt_index_names_the_line)
{
	char *dir = cwt_tmpdir(), out[512];

	write_indexed(dir, "out.tfrecord", out, sizeof(out));
	/* Records are 21, 23, 25, ... bytes from offset 0. */
	expect_bad_index(out, "0 21\n21 23\n44 x\n",
	    "line 3: expected \"<offset> <size>\" in decimal");
	expect_bad_index(out, "0 21\n21 23\n\n",
	    "line 3: expected \"<offset> <size>\" in decimal");
	expect_bad_index(out, "0 21\n21 23\n99999999999999999999999 5\n",
	    "line 3: expected");
	expect_bad_index(out, "0 21\n22 23\n",
	    "line 2: offset 22 is not where the previous record ends (21)");
	expect_bad_index(out, "0 21\n21 7\n",
	    "line 2: record size 7 is not in [16, ");
	expect_bad_index(out, "0 21\n21 23\n44 1000\n",
	    "line 3: record [44, 1044) is past the end of ");
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(gen_imagenet_writes_an_index_per_shard)
{
	cwi_gen_imagenet_config cfg = {.out_dir = NULL, .images = 7,
	    .shards = 2, .seed = 3, .width = 32, .height = 24, .quality = 80};
	char *dir = cwt_tmpdir(), err[256], path[512], idx[600],
	     pipeline[1400];
	static const int per_shard[2] = {3, 4};

	cfg.out_dir = dir;
	ck_assert_int_eq(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(dir_entries(dir), 4); /* two shards, two indexes */
	for (int s = 0; s < 2; s++) {
		size_t len, ilen, lines = 0;
		uint8_t *data, *text;
		unsigned long long off = 0, size = 0, end = 0;
		cachew_element **v = NULL;
		size_t n = 0;

		snprintf(path, sizeof(path),
		    "%s/train-%05d-of-00002.tfrecord", dir, s);
		snprintf(idx, sizeof(idx), "%s.idx", path);
		data = read_whole(path, &len);
		text = read_whole(idx, &ilen);
		text[ilen] = '\0';
		/* Each line starts where the previous record ended; the last
		 * ends where the shard ends. */
		for (char *p = (char *)text; *p != '\0'; lines++) {
			ck_assert_int_eq(sscanf(p, "%llu %llu", &off, &size), 2);
			ck_assert_uint_eq(off, end);
			end = off + size;
			p = strchr(p, '\n');
			ck_assert_ptr_nonnull(p);
			p++;
		}
		ck_assert_uint_eq(lines, (size_t)per_shard[s]);
		ck_assert_uint_eq(end, len);
		snprintf(pipeline, sizeof(pipeline),
		    "tfrecord(\"%s\", records=[1, 3])", path);
		ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err,
				     sizeof(err)),
		    CACHEW_OK);
		ck_assert_uint_eq(n, 2);
		cwt_free(v, n);
		free(data);
		free(text);
	}
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- tf.train.Example: hand-built protos ------------------------------------------------ */

typedef struct pb {
	uint8_t b[4096];
	size_t n;
} pb;

static void
pb_byte(pb *p, uint8_t v)
{
	ck_assert_uint_lt(p->n, sizeof(p->b));
	p->b[p->n++] = v;
}

static void
pb_varint(pb *p, uint64_t v)
{
	while (v >= 0x80) {
		pb_byte(p, (uint8_t)(v | 0x80));
		v >>= 7;
	}
	pb_byte(p, (uint8_t)v);
}

static void
pb_raw(pb *p, const void *d, size_t n)
{
	for (size_t i = 0; i < n; i++)
		pb_byte(p, ((const uint8_t *)d)[i]);
}

static void
pb_msg(pb *p, unsigned field, const pb *sub)
{
	pb_varint(p, field << 3 | 2);
	pb_varint(p, sub->n);
	pb_raw(p, sub->b, sub->n);
}

/* Wraps a Feature into an Example with one map entry for key. */
static void
pb_example(pb *ex, const char *key, const pb *feature)
{
	pb entry = {.n = 0}, features = {.n = 0};

	pb_varint(&entry, 1 << 3 | 2);
	pb_varint(&entry, strlen(key));
	pb_raw(&entry, key, strlen(key));
	pb_msg(&entry, 2, feature);
	pb_msg(&features, 1, &entry);
	ex->n = 0;
	pb_msg(ex, 1, &features);
}

/* Decodes ex with one feature spec "v" = spec. */
static cachew_err
decode_one(const pb *ex, const char *spec, cwi_tensor *out, char *err,
    size_t errlen)
{
	cachew_params *params;
	cwi_example_spec *s = NULL;
	cwi_tensor in;
	cachew_err rv;

	ck_assert_int_eq(cachew_params_create(&params), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_str(params, "v", spec), CACHEW_OK);
	ck_assert_int_eq(cwi_example_spec_create(params, &s, err, errlen),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_tensor_init_bytes_copy(&in, ex->b, ex->n),
	    CACHEW_OK);
	rv = cwi_example_decode(s, &in, out, err, errlen);
	cwi_tensor_clear(&in);
	cwi_example_spec_destroy(s);
	cachew_params_destroy(params);
	return rv;
}

START_TEST(example_unpacked_int64_values)
{
	pb list = {.n = 0}, feat = {.n = 0}, ex;
	cwi_tensor t;
	char err[256];
	const int64_t want[] = {5, -1, 300};

	for (int i = 0; i < 3; i++) {
		pb_varint(&list, 1 << 3 | 0);
		pb_varint(&list, (uint64_t)want[i]);
	}
	pb_msg(&feat, 3, &list);
	pb_example(&ex, "k", &feat);
	ck_assert_int_eq(decode_one(&ex, "k:i64", &t, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.dtype, CACHEW_I64);
	ck_assert_int_eq(t.rank, 1);
	ck_assert_int_eq(t.shape[0], 3);
	ck_assert_mem_eq(cwi_tensor_data(&t), want, sizeof(want));
	cwi_tensor_clear(&t);
}
END_TEST

START_TEST(example_packed_int64_across_two_lists)
{
	pb packed = {.n = 0}, list = {.n = 0}, feat = {.n = 0}, ex;
	cwi_tensor t;
	char err[256];
	const int64_t want[] = {1, 2, 1000000, 7};

	for (int i = 0; i < 3; i++)
		pb_varint(&packed, (uint64_t)want[i]);
	pb_msg(&list, 1, &packed);
	pb_varint(&list, 1 << 3 | 0); /* one unpacked value after */
	pb_varint(&list, 7);
	pb_msg(&feat, 3, &list);
	pb_example(&ex, "k", &feat);
	ck_assert_int_eq(decode_one(&ex, "k:i64:[2, -1]", &t, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.rank, 2);
	ck_assert_int_eq(t.shape[0], 2);
	ck_assert_int_eq(t.shape[1], 2);
	ck_assert_mem_eq(cwi_tensor_data(&t), want, sizeof(want));
	cwi_tensor_clear(&t);
}
END_TEST

START_TEST(example_packed_and_unpacked_floats)
{
	pb packed = {.n = 0}, list = {.n = 0}, feat = {.n = 0}, ex;
	cwi_tensor t;
	char err[256];
	const float want[] = {1.5f, -2.0f, 3.25f};

	pb_raw(&packed, want, 8);
	pb_msg(&list, 1, &packed);
	pb_varint(&list, 1 << 3 | 5);
	pb_raw(&list, &want[2], 4);
	pb_msg(&feat, 2, &list);
	pb_example(&ex, "f", &feat);
	ck_assert_int_eq(decode_one(&ex, "f:f32", &t, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.dtype, CACHEW_F32);
	ck_assert_int_eq(t.rank, 1);
	ck_assert_int_eq(t.shape[0], 3);
	ck_assert_mem_eq(cwi_tensor_data(&t), want, sizeof(want));
	cwi_tensor_clear(&t);
}
END_TEST

START_TEST(example_single_bytes_value_is_a_zero_copy_scalar)
{
	pb list = {.n = 0}, feat = {.n = 0}, ex;
	cachew_params *params;
	cwi_example_spec *s = NULL;
	cwi_tensor in, out;
	char err[256];
	const uint8_t *p;
	size_t n;

	pb_varint(&list, 1 << 3 | 2);
	pb_varint(&list, 5);
	pb_raw(&list, "hello", 5);
	pb_msg(&feat, 1, &list);
	pb_example(&ex, "image/encoded", &feat);
	ck_assert_int_eq(cachew_params_create(&params), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_str(params, "img",
			     "image/encoded:bytes"),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_example_spec_create(params, &s, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_tensor_init_bytes_copy(&in, ex.b, ex.n),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_example_decode(s, &in, &out, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(out.rank, 0);
	ck_assert_ptr_eq(out.buf, in.buf);
	p = cwi_tensor_str(&out, 0, &n);
	ck_assert_uint_eq(n, 5);
	ck_assert_mem_eq(p, "hello", 5);
	cwi_tensor_clear(&out);
	cwi_tensor_clear(&in);
	cwi_example_spec_destroy(s);
	cachew_params_destroy(params);
}
END_TEST

START_TEST(example_last_map_entry_and_last_kind_win)
{
	pb l1 = {.n = 0}, l2 = {.n = 0}, f1 = {.n = 0}, f2 = {.n = 0};
	pb ex1, ex2, ex = {.n = 0};
	cwi_tensor t;
	char err[256];

	pb_varint(&l1, 1 << 3 | 0);
	pb_varint(&l1, 1);
	pb_msg(&f1, 3, &l1);
	pb_varint(&l2, 1 << 3 | 0);
	pb_varint(&l2, 2);
	/* f2: a bytes_list first, then the int64_list that wins. */
	pb_msg(&f2, 1, &l1);
	pb_msg(&f2, 3, &l2);
	pb_example(&ex1, "k", &f1);
	pb_example(&ex2, "k", &f2);
	pb_raw(&ex, ex1.b, ex1.n);
	pb_raw(&ex, ex2.b, ex2.n); /* concatenated messages merge */
	ck_assert_int_eq(decode_one(&ex, "k:i64", &t, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.rank, 0);
	ck_assert_int_eq(*(const int64_t *)cwi_tensor_data(&t), 2);
	cwi_tensor_clear(&t);
}
END_TEST

START_TEST(example_missing_feature_is_an_error_naming_it)
{
	pb list = {.n = 0}, feat = {.n = 0}, ex;
	cwi_tensor t;
	char err[256];

	pb_msg(&feat, 3, &list);
	pb_example(&ex, "other", &feat);
	ck_assert_int_eq(decode_one(&ex, "label:i64", &t, err, sizeof(err)),
	    CACHEW_EOP);
	ck_assert_str_eq(err, "feature 'label' (v) is missing");
}
END_TEST

START_TEST(example_missing_feature_takes_its_default)
{
	pb ex = {.n = 0};
	cwi_tensor t;
	char err[256];
	const uint8_t *p;
	size_t n;

	ck_assert_int_eq(decode_one(&ex, "label:i64:default=-3", &t, err,
			     sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.rank, 0);
	ck_assert_int_eq(*(const int64_t *)cwi_tensor_data(&t), -3);
	cwi_tensor_clear(&t);
	ck_assert_int_eq(decode_one(&ex, "x:f32:[2]:default=0.5", &t, err,
			     sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(t.rank, 1);
	ck_assert_int_eq(t.shape[0], 2);
	ck_assert(((const float *)cwi_tensor_data(&t))[1] == 0.5f);
	cwi_tensor_clear(&t);
	ck_assert_int_eq(decode_one(&ex, "s:bytes:default=a:b", &t, err,
			     sizeof(err)),
	    CACHEW_OK);
	p = cwi_tensor_str(&t, 0, &n);
	ck_assert_uint_eq(n, 3);
	ck_assert_mem_eq(p, "a:b", 3);
	cwi_tensor_clear(&t);
}
END_TEST

START_TEST(example_wrong_kind_and_wrong_shape_are_type_errors)
{
	pb list = {.n = 0}, feat = {.n = 0}, ex;
	cwi_tensor t;
	char err[256];

	pb_varint(&list, 1 << 3 | 0);
	pb_varint(&list, 9);
	pb_varint(&list, 1 << 3 | 0);
	pb_varint(&list, 9);
	pb_msg(&feat, 3, &list);
	pb_example(&ex, "k", &feat);
	ck_assert_int_eq(decode_one(&ex, "k:f32", &t, err, sizeof(err)),
	    CACHEW_ETYPE);
	ck_assert_str_eq(err, "feature 'k' (v) is a int64_list, not f32");
	ck_assert_int_eq(decode_one(&ex, "k:i64:[3]", &t, err, sizeof(err)),
	    CACHEW_ETYPE);
	ck_assert_str_eq(err,
	    "feature 'k' (v) has 2 values, which do not fit its shape");
}
END_TEST

/* Each malformed input with the message it must give. */
START_TEST(example_malformed_inputs_are_corrupt)
{
	static const struct {
		uint8_t b[24];
		size_t n;
		const char *msg;
	} cases[] = {
	    {{0x0a}, 1, "at byte 1: varint runs past the end"},
	    {{0x0a, 0x05, 0x0a}, 3, "at byte 2: length runs past the end"},
	    {{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		 0xff, 0x01},
		12, "at byte 10: varint overflows 64 bits"},
	    {{0x13}, 1, "at byte 1: unsupported wire type"},
	    {{0x00, 0x00}, 2, "at byte 0: invalid field number"},
	    {{0x08, 0x01}, 2, "at byte 0: message field with a wrong wire"},
	    /* Example{Features{entry{"k": Feature{int64_list, wire type 0}}}} */
	    {{0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, 'k', 0x12, 0x02, 0x18, 0x01},
		11, "at byte 9: Feature list with a wrong wire type"},
	    /* ... Feature{Int64List{an int64 with wire type 1}} */
	    {{0x0a, 0x12, 0x0a, 0x10, 0x0a, 0x01, 'k', 0x12, 0x0b, 0x1a, 0x09,
		 0x09, 1, 2, 3, 4, 5, 6, 7, 8},
		20, "at byte 11: list value with a wrong wire type"},
	    /* ... Feature{FloatList{packed, 3 bytes}} */
	    {{0x0a, 0x0e, 0x0a, 0x0c, 0x0a, 0x01, 'k', 0x12, 0x07, 0x12, 0x05,
		 0x0a, 0x03, 1, 2, 3},
		16, "packed floats are not a multiple of 4 bytes"},
	};
	char err[256];
	cwi_tensor t;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		pb ex = {.n = 0};
		pb_raw(&ex, cases[i].b, cases[i].n);
		ck_assert_int_eq(decode_one(&ex, "k:i64:default=0", &t, err,
				     sizeof(err)),
		    CACHEW_ECORRUPT);
		ck_assert_msg(strstr(err, cases[i].msg) != NULL,
		    "case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
	}
}
END_TEST

START_TEST(example_bad_specs_are_rejected_when_building)
{
	static const char *const bad[] = {"nokey", ":i64", "k:int", "k:i64:[2",
	    "k:i64:[-1,-1]", "k:i64:default=x", "k:i64:junk"};
	char pipeline[256];
	cachew_dataset *ds = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(pipeline, sizeof(pipeline),
		    "from_list([\"\"]) | parse_example(v=\"%s\")", bad[i]);
		ck_assert_msg(cachew_dataset_parse(&ds, pipeline) ==
			CACHEW_EINVAL,
		    "%s", bad[i]);
		ck_assert_msg(strstr(cachew_errmsg(), "feature v:") != NULL,
		    "%s: %s", bad[i], cachew_errmsg());
	}
}
END_TEST

START_TEST(example_encoder_round_trips_in_name_order)
{
	char *dir = cwt_tmpdir(), path[512], pipeline[1200], err[512];
	cwi_example_enc enc;
	cwi_strbuf sb;
	uint8_t *file = NULL;
	size_t len = 0, n = 0;
	cachew_element **v = NULL;
	const void *items[2] = {"ab", "cde"};
	const size_t lens[2] = {2, 3};
	const int64_t ints[] = {42};
	const float fl[] = {0.25f, 4.0f};

	cwi_example_enc_init(&enc);
	cwi_strbuf_init(&sb);
	cwi_example_enc_bytes(&enc, "b", items, lens, 2);
	cwi_example_enc_int64(&enc, "i", ints, 1, false);
	cwi_example_enc_float(&enc, "f", fl, 2, true);
	ck_assert_int_eq(cwi_example_enc_finish(&enc, &sb), CACHEW_OK);
	frame(&file, &len, sb.data, sb.len);
	cwi_strbuf_free(&sb);
	cwi_example_enc_free(&enc);
	snprintf(path, sizeof(path), "%s/e.tfrecord", dir);
	cwt_write_file(path, file, len);
	/* Names z, a, m: components come in name order a, m, z. */
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\") | parse_example(z=\"i:i64\", a=\"b:bytes\", "
	    "m=\"f:f32\")", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(cachew_element_size(v[0]), 3);
	/* Each component is named after its parameter. */
	ck_assert_str_eq(cachew_element_name(v[0], 0), "a");
	ck_assert_str_eq(cachew_element_name(v[0], 1), "m");
	ck_assert_str_eq(cachew_element_name(v[0], 2), "z");
	const cachew_tensor *a = cachew_element_component(v[0], 0);
	const cachew_tensor *m = cachew_element_component(v[0], 1);
	const void *p;
	size_t pl;
	ck_assert_int_eq(cachew_tensor_numel(a), 2);
	ck_assert_int_eq(cachew_tensor_bytes_at(a, 1, &p, &pl), CACHEW_OK);
	ck_assert_uint_eq(pl, 3);
	ck_assert_mem_eq(p, "cde", 3);
	ck_assert_int_eq(cachew_tensor_numel(m), 2);
	ck_assert_mem_eq(cachew_tensor_data(m), fl, sizeof(fl));
	ck_assert_int_eq(cwt_i64(v[0], 2), 42);
	cwt_free(v, n);
	free(file);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- generators ---------------------------------------------------------------------------- */

static uint8_t *
gen_small(const char *dir, uint64_t seed, size_t *len)
{
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 3,
	    .shards = 1, .seed = seed, .width = 64, .height = 48,
	    .quality = 90};
	char err[256], path[512];

	ck_assert_int_eq(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)),
	    CACHEW_OK);
	snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord", dir);
	return read_whole(path, len);
}

START_TEST(gen_imagenet_is_deterministic_for_a_seed)
{
	char *d1 = cwt_tmpdir(), *d2 = cwt_tmpdir(), *d3 = cwt_tmpdir();
	size_t l1, l2, l3;
	uint8_t *a = gen_small(d1, 7, &l1), *b = gen_small(d2, 7, &l2);
	uint8_t *c = gen_small(d3, 8, &l3);

	ck_assert_uint_eq(l1, l2);
	ck_assert_mem_eq(a, b, l1);
	ck_assert(l1 != l3 || memcmp(a, c, l1) != 0);
	free(a);
	free(b);
	free(c);
	cwt_rmtree(d1);
	cwt_rmtree(d2);
	cwt_rmtree(d3);
	free(d1);
	free(d2);
	free(d3);
}
END_TEST

START_TEST(gen_imagenet_jpeg_is_500x375_and_photo_sized)
{
	uint8_t *jpeg = NULL;
	size_t len = 0;
	char err[256];
	int w = 0, h = 0, sub = -1, cs = -1;
	tjhandle tj = tjInitDecompress();

	ck_assert_int_eq(cwi_gen_imagenet_jpeg(1, 0, 500, 375, 90, &jpeg, &len,
			     err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_int_eq(tjDecompressHeader3(tj, jpeg, (unsigned long)len, &w,
			     &h, &sub, &cs),
	    0);
	ck_assert_int_eq(w, 500);
	ck_assert_int_eq(h, 375);
	ck_assert_int_eq(sub, TJSAMP_420);
	ck_assert_msg(len > 80000 && len < 140000, "%zu bytes", len);
	tjDestroy(tj);
	free(jpeg);
}
END_TEST

START_TEST(gen_text_is_deterministic_zipf_text)
{
	char *d1 = cwt_tmpdir(), *d2 = cwt_tmpdir(), p1[512], p2[512], err[256];
	cwi_gen_text_config cfg = {.out_dir = d1, .lines = 2000, .files = 1,
	    .seed = 3};
	uint8_t *a, *b;
	size_t l1, l2, lines = 0;

	ck_assert_int_eq(cwi_gen_text(&cfg, NULL, err, sizeof(err)), CACHEW_OK);
	cfg.out_dir = d2;
	ck_assert_int_eq(cwi_gen_text(&cfg, NULL, err, sizeof(err)), CACHEW_OK);
	snprintf(p1, sizeof(p1), "%s/text-00000-of-00001.txt", d1);
	snprintf(p2, sizeof(p2), "%s/text-00000-of-00001.txt", d2);
	a = read_whole(p1, &l1);
	b = read_whole(p2, &l2);
	ck_assert_uint_eq(l1, l2);
	ck_assert_mem_eq(a, b, l1);
	for (size_t i = 0; i < l1; i++)
		lines += a[i] == '\n';
	ck_assert_uint_eq(lines, 2000);
	free(b);
	cfg.seed = 4;
	ck_assert_int_eq(cwi_gen_text(&cfg, NULL, err, sizeof(err)), CACHEW_OK);
	b = read_whole(p2, &l2);
	ck_assert(l1 != l2 || memcmp(a, b, l1) != 0);
	free(a);
	free(b);
	cwt_rmtree(d1);
	cwt_rmtree(d2);
	free(d1);
	free(d2);
}
END_TEST

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* The README's glob, train-*, matches the shards and the record indexes
 * cachew gen writes beside them: both the source and interleave read the
 * records of the shards alone (issue 17). */
START_TEST(gen_imagenet_train_star_reads_the_shards_not_their_indexes)
{
	char *dir = cwt_tmpdir(), pipeline[1200], err[512];
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 6,
	    .shards = 2, .seed = 3, .width = 64, .height = 48,
	    .quality = 80};
	const char *forms[] = {
	    "list_files(\"%s/train-*\", shuffle=false) | "
	    "interleave(tfrecord, cycle=2)",
	    "tfrecord(\"%s/train-*\")",
	    "tfrecord(\"%s/train-*\", records=[0, 100])",
	};
	char idx[700];

	ck_assert_int_eq(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)),
	    CACHEW_OK);
	snprintf(idx, sizeof(idx), "%s/train-00000-of-00002.tfrecord.idx", dir);
	ck_assert_int_eq(access(idx, R_OK), 0);
	for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
		cachew_element **v = NULL;
		size_t n = 0;

		snprintf(pipeline, sizeof(pipeline), forms[f], dir);
		ck_assert_msg(cwt_run(pipeline, NULL, &v, &n, err,
				  sizeof(err)) == CACHEW_OK,
		    "%s: %s", pipeline, err);
		ck_assert_uint_eq(n, 6);
		cwt_free(v, n);
	}
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(gen_imagenet_end_to_end_through_interleave_and_parse_example)
{
	char *dir = cwt_tmpdir(), pipeline[1200], err[512];
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 8,
	    .shards = 2, .seed = 11, .width = 500, .height = 375,
	    .quality = 90};
	cachew_element **v = NULL;
	size_t n = 0;
	int64_t got[8], want[8];

	ck_assert_int_eq(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)),
	    CACHEW_OK);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/train-*.tfrecord\", shuffle=false) | "
	    "interleave(tfrecord, cycle=2) | "
	    "parse_example(image=\"image/encoded:bytes\", "
	    "label=\"image/class/label:i64\", width=\"image/width:i64\")",
	    dir);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 8);
	for (size_t i = 0; i < 8; i++) {
		const cachew_tensor *img = cachew_element_component(v[i], 0);
		const void *p;
		size_t len;
		ck_assert_int_eq(cachew_tensor_bytes_at(img, 0, &p, &len),
		    CACHEW_OK);
		ck_assert_mem_eq(p, "\xff\xd8", 2); /* a JPEG */
		got[i] = cwt_i64(v[i], 1);
		ck_assert_int_eq(cwt_i64(v[i], 2), 500);
		want[i] = cwi_gen_imagenet_label(11, (int64_t)i);
	}
	/* Shard 0 holds images 0-3, shard 1 images 4-7, interleaved. */
	ck_assert_int_eq(got[0], want[0]);
	ck_assert_int_eq(got[1], want[4]);
	qsort(got, 8, sizeof(got[0]), cmp_i64);
	qsort(want, 8, sizeof(want[0]), cmp_i64);
	ck_assert_mem_eq(got, want, sizeof(got));
	cwt_free(v, n);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_formats_suite(void)
{
	Suite *s = suite_create("formats");
	TCase *crc = tcase_create("crc32c");
	TCase *tfr = tcase_create("tfrecord");
	TCase *ex = tcase_create("example");
	TCase *gen = tcase_create("gen");

	tcase_add_test(crc, crc32c_known_vectors_software);
	tcase_add_test(crc, crc32c_known_vectors_hardware);
	tcase_add_test(crc, crc32c_paths_agree_at_every_length_and_alignment);
	tcase_add_test(crc, crc32c_mask_round_trips);
	suite_add_tcase(s, crc);

	tcase_add_test(tfr, tfrecord_header_is_the_documented_bytes);
	tcase_add_test(tfr, tfrecord_round_trip_of_many_sizes);
	tcase_add_test(tfr, tfrecord_write_then_read_is_byte_identical);
	tcase_add_test(tfr, tfrecord_flipped_length_bit_is_corrupt);
	tcase_add_test(tfr, tfrecord_flipped_length_crc_bit_is_corrupt);
	tcase_add_test(tfr, tfrecord_flipped_data_bit_is_corrupt);
	tcase_add_test(tfr, tfrecord_flipped_data_crc_bit_is_corrupt);
	tcase_add_test(tfr, tfrecord_truncation_at_every_byte_is_corrupt);
	tcase_add_test(tfr, tfrecord_truncated_file_names_file_and_offset);
	tcase_add_test(tfr, tfrecord_huge_length_is_rejected_before_allocating);
	tcase_add_test(tfr, tfrecord_skip_corrupt_skips_exactly_the_bad_records);
	tcase_add_test(tfr, tfrecord_skip_corrupt_drops_a_truncated_tail);
	tcase_add_test(tfr, tfrecord_verify_false_skips_the_data_checksum);
	tcase_add_test(tfr, tfrecord_gzip_round_trip);
	tcase_add_test(tfr, tfrecord_gzip_garbage_is_corrupt);
	tcase_add_test(tfr, tfrecord_gzip_of_a_buffer_multiple_reads_to_its_end);
	tcase_add_test(tfr, tfrecord_agrees_with_the_python_reference_byte_for_byte);
	tcase_add_test(tfr, tfrecord_write_failure_leaves_no_file);
	tcase_add_test(tfr, tfrecord_write_upstream_failure_leaves_no_file);
	tcase_add_test(tfr, tfrecord_write_stopped_early_leaves_no_file);
	tcase_add_test(tfr, tfrecord_write_rejects_unknown_compression);
	tcase_add_test(tfr, tfrecord_write_index_matches_independent_offsets);
	tcase_add_test(tfr, tfrecord_write_index_needs_no_compression);
	tcase_add_test(tfr, tfrecord_records_reads_exactly_the_selected_records);
	tcase_add_test(tfr, tfrecord_records_changes_the_fingerprint);
	tcase_add_test(tfr, tfrecord_records_rejects_bad_ranges_and_gzip);
	tcase_add_test(tfr, tfrecord_records_without_an_index_is_enoent);
	tcase_add_test(tfr, tfrecord_records_corrupt_index_names_the_line);
	tcase_set_timeout(tfr, 60);
	suite_add_tcase(s, tfr);

	tcase_add_test(ex, example_unpacked_int64_values);
	tcase_add_test(ex, example_packed_int64_across_two_lists);
	tcase_add_test(ex, example_packed_and_unpacked_floats);
	tcase_add_test(ex, example_single_bytes_value_is_a_zero_copy_scalar);
	tcase_add_test(ex, example_last_map_entry_and_last_kind_win);
	tcase_add_test(ex, example_missing_feature_is_an_error_naming_it);
	tcase_add_test(ex, example_missing_feature_takes_its_default);
	tcase_add_test(ex, example_wrong_kind_and_wrong_shape_are_type_errors);
	tcase_add_test(ex, example_malformed_inputs_are_corrupt);
	tcase_add_test(ex, example_bad_specs_are_rejected_when_building);
	tcase_add_test(ex, example_encoder_round_trips_in_name_order);
	suite_add_tcase(s, ex);

	tcase_add_test(gen, gen_imagenet_is_deterministic_for_a_seed);
	tcase_add_test(gen, gen_imagenet_jpeg_is_500x375_and_photo_sized);
	tcase_add_test(gen, gen_text_is_deterministic_zipf_text);
	tcase_add_test(gen, gen_imagenet_end_to_end_through_interleave_and_parse_example);
	tcase_add_test(gen, gen_imagenet_train_star_reads_the_shards_not_their_indexes);
	tcase_add_test(gen, gen_imagenet_writes_an_index_per_shard);
	tcase_set_timeout(gen, 60);
	suite_add_tcase(s, gen);
	return s;
}
