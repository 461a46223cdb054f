/*
 * sources.h - dataset sources: range, literals (from_tensors, from_list),
 * files (list_files, text_lines, fixed_length_records) and the file
 * functions (flat_map text_lines / fixed_length_records, map read_file).
 */
#ifndef CWI_SOURCES_H
#define CWI_SOURCES_H

#include "../exec/exec.h"

extern const cwi_dataset_op cwi_op_range;
extern const cwi_dataset_op cwi_op_counter;
extern const cwi_dataset_op cwi_op_random;  /* src_range.c */
extern const cwi_dataset_op cwi_op_from_tensors;
extern const cwi_dataset_op cwi_op_from_list;
extern const cwi_dataset_op cwi_op_list_files;
extern const cwi_dataset_op cwi_op_text_lines;
extern const cwi_dataset_op cwi_op_fixed_length_records;
extern const cwi_dataset_op cwi_op_read_file;

extern const cachew_op_def cwi_fn_text_lines;
extern const cachew_op_def cwi_fn_fixed_length_records;
extern const cachew_op_def cwi_fn_read_file;

extern const cwi_dataset_op cwi_op_tfrecord;   /* src_tfrecord.c */
extern const cwi_dataset_op cwi_op_user_source; /* src_user.c */
extern const cachew_op_def cwi_fn_tfrecord;    /* src_tfrecord.c */

/* Random access into the sequences of the file functions (cwi_fn.resume):
 * text_lines and fixed_length_records, and tfrecord. */
extern const cwi_seq_resume cwi_rec_fn_resume;
extern const cwi_seq_resume cwi_tfr_fn_resume;

/* ---- literals (src_literal.c) ------------------------------------------- */

/* Converts one literal value into an element: a top-level tuple gives one
 * component per item, anything else one component. `path` names the value
 * in error messages ("values[3]"). Errors are CACHEW_EINVAL (or ENOMEM)
 * through cwi_fail, with a message naming the offending sub-value. */
cachew_err cwi_literal_element(
    const cwi_value *v, const char *path, cwi_element **out);

/* ---- record readers (src_reader.c) -------------------------------------- */

/* The default read size of the file sources: 1 MiB. */
#define CWI_READ_BLOCK (1 << 20)
/* The largest read size and record length accepted: 1 GiB. */
#define CWI_READ_BLOCK_MAX (1 << 30)

/* What a record reader splits a file into. */
typedef struct cwi_rec_config {
	int64_t record_bytes; /* 0: text lines; else fixed-length records */
	int64_t header_bytes; /* fixed-length: bytes skipped at the start */
	int64_t footer_bytes; /* fixed-length: bytes ignored at the end */
	int64_t buffer_size;  /* bytes per read(2) */
	/* Fixed-length records of at least CWI_MAP_MIN bytes from a local
	 * file: map blocks of the file (cwi_buffer_map_file) instead of
	 * reading them, where only the kernel reads the records (a worker
	 * sending them: cwi_opts.map_reads). */
	bool map;
} cwi_rec_config;

/* Mapped reading: records of at least this size (smaller ones are copied
 * into the messages that carry them), in blocks of up to CWI_MAP_BLOCK
 * bytes (one mmap and one munmap each). */
#define CWI_MAP_MIN (4 << 10)
#define CWI_MAP_BLOCK (4 << 20)

/*
 * Reads one file as a sequence of bytes scalars. Blocks of buffer_size
 * bytes go into refcounted buffers and each record is a zero-copy view of
 * its block; only a text line that spans blocks is copied (into the next
 * block, together with its continuation). One thread at a time.
 */
typedef struct cwi_rec_reader {
	cwi_rec_config cfg;
	char *path;
	struct cwi_file *file; /* src/io; NULL when closed */
	cwi_buffer *block; /* bytes [0, len) are valid; pos is the next one */
	cwi_map_file *mapped; /* cfg.map: the open file, once mapped */
	size_t pos, len;
	size_t scanned;    /* text: [pos, scanned) holds no newline */
	uint64_t file_off; /* file offset of the next read */
	uint64_t end;      /* fixed-length: where the records end */
	bool eof;          /* no more reads: the block holds the rest */
	char errmsg[512];  /* "path: reason", set on failure */
} cwi_rec_reader;

/* Prepares a closed reader (safe to close). */
void cwi_rec_init(cwi_rec_reader *r, const cwi_rec_config *cfg);
/* Opens path (len bytes, need not be NUL-terminated; a local path or a
 * file://, http(s)://, s3:// or gs:// URL, read through src/io).
 * CACHEW_ENOENT when the file does not exist, CACHEW_ECORRUPT when a
 * fixed-length body is not a multiple of the record length, the io error
 * otherwise; r->errmsg names the file. */
cachew_err cwi_rec_open(cwi_rec_reader *r, const char *path, size_t len);
/* The next record as a bytes scalar in *out (a new reference), CACHEW_EOF
 * at the end of the file, or an error described by r->errmsg. */
cachew_err cwi_rec_next(cwi_rec_reader *r, cwi_tensor *out);
/* Closes the file and drops the block; the reader may be opened again. */
void cwi_rec_close(cwi_rec_reader *r);
/* The byte offset in the file of the next record (resumable iteration). */
uint64_t cwi_rec_tell(const cwi_rec_reader *r);
/* Moves a reader just opened (nothing read yet) to the record at byte
 * offset off, which cwi_rec_tell gave for the same file: the file is
 * reopened from there, nothing before is read. CACHEW_ENOTSUP when the
 * size is unknown (a chunked response): read past the records instead.
 * CACHEW_ERANGE for an offset outside the records (or, fixed-length, not
 * on a record boundary); r->errmsg names the file. */
cachew_err cwi_rec_seek(cwi_rec_reader *r, uint64_t off);

/* Reads the configuration of a file function from its params (the keys
 * record_bytes, header_bytes, footer_bytes, buffer_size as allowed by
 * `fixed`); writes a reason into err on failure. */
cachew_err cwi_rec_config_from_params(const cachew_params *params, bool fixed,
    cwi_rec_config *cfg, char *err, size_t errlen);

/* The path in component 0 of a function's input element, as a fresh
 * NUL-terminated string (free with free), or an error in ctx. */
cachew_err cwi_input_path(
    cachew_op_ctx *ctx, const cwi_element *in, char **path);

/* ---- TFRecord (src_tfrecord.c; docs/formats.md) --------------------------- */

/* Framing: u64 LE length, u32 masked CRC32C of those 8 bytes, the data,
 * u32 masked CRC32C of the data. */
#define CWI_TFRECORD_HEADER 12
#define CWI_TFRECORD_FOOTER 4
/* The longest record accepted: 1 GiB. */
#define CWI_TFRECORD_MAX_LEN ((uint64_t)CWI_READ_BLOCK_MAX)

/* Writes the 12-byte header of a record of len bytes. */
void cwi_tfrecord_header(uint8_t hdr[CWI_TFRECORD_HEADER], uint64_t len);
/* Writes the 4-byte footer (masked CRC32C) of the data. */
void cwi_tfrecord_footer(
    uint8_t ftr[CWI_TFRECORD_FOOTER], const void *data, size_t len);

typedef struct cwi_tfr_config {
	bool gzip;         /* the file is gzip (one or more members) */
	bool verify;       /* check data checksums */
	bool skip_corrupt; /* skip corrupt records, counted, with a warning */
	int64_t buffer_size; /* bytes per block; <= 0: CWI_READ_BLOCK */
	/* records=[start, stop]: read only records [rec_start, rec_stop) of
	 * each file, found through its "<file>.idx" (docs/formats.md). */
	bool ranged;
	uint64_t rec_start, rec_stop;
} cwi_tfr_config;

/*
 * Reads the records of one TFRecord file as bytes scalars that view its
 * read blocks. A corrupt or truncated record is CACHEW_ECORRUPT with an
 * errmsg "path: record at byte N: reason" (N counts decompressed bytes for
 * gzip), unless skip_corrupt. One thread at a time.
 */
typedef struct cwi_tfr_reader cwi_tfr_reader;

/* Opens a file through src/io (local, file://, http(s)://, s3://, gs://).
 * With cfg->ranged, loads "<path>.idx" and opens only the byte range of the
 * selected records: a missing index is CACHEW_ENOENT, a malformed one (or
 * one that does not fit the file) CACHEW_ECORRUPT. On failure *out may still hold a reader whose errmsg names the file and
 * the reason (close it); when *out is NULL the reason is in
 * cachew_errmsg(). */
cachew_err cwi_tfr_open(
    cwi_tfr_reader **out, const cwi_tfr_config *cfg, const char *path);
/* Reads `len` bytes of memory (borrowed until close) as the file `name`:
 * what the fuzzer and the tests use. Errors as cwi_tfr_open. */
cachew_err cwi_tfr_open_mem(cwi_tfr_reader **out, const cwi_tfr_config *cfg,
    const char *name, const void *data, size_t len);
/* The next record in *out (a new reference), CACHEW_EOF at the end, or an
 * error described by cwi_tfr_errmsg(). Errors are sticky. */
cachew_err cwi_tfr_next(cwi_tfr_reader *r, cwi_tensor *out);
const char *cwi_tfr_errmsg(const cwi_tfr_reader *r);
/* Corrupt records skipped so far (skip_corrupt). */
uint64_t cwi_tfr_skipped(const cwi_tfr_reader *r);
/* NULL is a no-op. */
void cwi_tfr_close(cwi_tfr_reader *r);
/* The offset of the next record in the decoded stream (the file's bytes
 * unless gzip), for resumable iteration. */
uint64_t cwi_tfr_tell(const cwi_tfr_reader *r);
/* Moves a reader just opened (nothing read yet) to stream offset off,
 * which cwi_tfr_tell gave for the same file: an uncompressed file is
 * reopened from there. CACHEW_ENOTSUP for gzip (no random access: read
 * past the records instead); CACHEW_ERANGE for an offset outside the
 * file or range; errors in cwi_tfr_errmsg. */
cachew_err cwi_tfr_seek(cwi_tfr_reader *r, uint64_t off);

/* The configuration of the tfrecord function from its params; writes a
 * reason into err on failure. */
cachew_err cwi_tfr_config_from_params(const cachew_params *params,
    cwi_tfr_config *cfg, char *err, size_t errlen);

#endif /* CWI_SOURCES_H */
