/*
 * src_records.c - text_lines(files) and fixed_length_records(files,
 * record_bytes): the records of each file in order, as bytes scalars. Each
 * exists twice: as a source over a list of files, and as a flat_map
 * function over the path in component 0 of its input
 * (`list_files("*.txt") | interleave(text_lines)`). Both are a loop over
 * files around the record reader of src_reader.c. Split unit i of a
 * source is the i-th file of its expanded "files" (patterns in order, a
 * glob's matches sorted).
 */
#include "sources.h"

#include "../exec/exec_split.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- the source: iterate files, read each --------------------------------- */

typedef struct records_iter {
	cwi_iter base;
	char **paths;
	size_t npaths;
	size_t next_path;
	bool open;
	uint64_t in_file; /* records read of the open file */
	cwi_rec_reader reader;
	/* An error met after some records of this call were appended: those
	 * are delivered first and the error on the next call. */
	cachew_err pending;
} records_iter;

static cachew_err
records_fail(records_iter *r, cachew_err rv)
{
	return cwi_pipeline_fail(r->base.pl, rv, "%s: %s",
	    r->base.node->op->name, r->reader.errmsg);
}

static cachew_err
records_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	records_iter *r = (records_iter *)it;
	size_t got = 0;
	cachew_err rv = r->pending;

	if (rv != CACHEW_OK)
		return records_fail(r, rv);
	while (got < max) {
		cwi_element *e;
		cwi_tensor t;

		if (!r->open) {
			if (r->next_path == r->npaths)
				break;
			const char *p = r->paths[r->next_path++];
			rv = cwi_rec_open(&r->reader, p, strlen(p));
			if (rv != CACHEW_OK)
				break;
			r->open = true;
			r->in_file = 0;
		}
		rv = cwi_rec_next(&r->reader, &t);
		if (rv == CACHEW_EOF) {
			cwi_rec_close(&r->reader);
			r->open = false;
			rv = CACHEW_OK;
			continue;
		}
		if (rv != CACHEW_OK)
			break;
		e = cwi_element_new(1);
		if (e == NULL) {
			cwi_tensor_clear(&t);
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "%s: out of memory", it->node->op->name);
		}
		e->comp[0] = t;
		cwi_chunk_push(out, e);
		got++;
		r->in_file++;
	}
	if (rv != CACHEW_OK) {
		if (got > 0) {
			r->pending = rv;
			return CACHEW_OK;
		}
		return records_fail(r, rv);
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
records_destroy(cwi_iter *it)
{
	records_iter *r = (records_iter *)it;
	cwi_rec_close(&r->reader);
	cwi_paths_free(r->paths);
	free(r);
}

/* [next file, open, records read of the open file, the byte offset of the
 * next one]. */
static cachew_err
records_save(cwi_iter *it, cwi_state_writer *w)
{
	records_iter *r = (records_iter *)it;

	if (r->pending != CACHEW_OK)
		return cwi_fail(r->pending, "%s: %s", it->node->op->name,
		    r->reader.errmsg);
	cwi_sw_array(w, 4);
	cwi_sw_uint(w, r->next_path);
	cwi_sw_bool(w, r->open);
	cwi_sw_uint(w, r->open ? r->in_file : 0);
	cwi_sw_uint(w, r->open ? cwi_rec_tell(&r->reader) : 0);
	return CACHEW_OK;
}

/* Reopens the file at the saved offset, or where the size is unknown
 * reads past the records already taken. */
static cachew_err
records_reopen(records_iter *r, uint64_t in_file, uint64_t off,
    cwi_state_reader *rd)
{
	const char *p = r->paths[r->next_path - 1];
	cwi_tensor t;
	cachew_err rv;

	rv = cwi_rec_open(&r->reader, p, strlen(p));
	if (rv == CACHEW_OK)
		rv = cwi_rec_seek(&r->reader, off);
	if (rv != CACHEW_OK && rv != CACHEW_ENOTSUP) {
		cwi_sr_fail(rd, rv, "%s", r->reader.errmsg);
		return cwi_sr_error(rd);
	}
	r->open = true;
	if (rv == CACHEW_OK) {
		r->in_file = in_file;
		return CACHEW_OK;
	}
	for (r->in_file = 0; r->in_file < in_file; r->in_file++) {
		rv = cwi_rec_next(&r->reader, &t);
		if (rv == CACHEW_EOF) {
			cwi_sr_fail(rd, CACHEW_ECORRUPT,
			    "%s has %llu records, the state says %llu were "
			    "read",
			    p, (unsigned long long)r->in_file,
			    (unsigned long long)in_file);
			return cwi_sr_error(rd);
		}
		if (rv != CACHEW_OK) {
			cwi_sr_fail(rd, rv, "%s", r->reader.errmsg);
			return cwi_sr_error(rd);
		}
		cwi_tensor_clear(&t);
	}
	return CACHEW_OK;
}

static cachew_err
records_restore(cwi_iter *it, cwi_state_reader *rd)
{
	records_iter *r = (records_iter *)it;
	uint64_t next = 0, in_file = 0, off = 0;
	bool open = false;

	if (!cwi_sr_array(rd, it->node->op->name, 4) ||
	    !cwi_sr_uint(rd, "next file", &next, r->npaths) ||
	    !cwi_sr_bool(rd, "open", &open) ||
	    !cwi_sr_uint(rd, "records read", &in_file, UINT64_MAX) ||
	    !cwi_sr_uint(rd, "byte offset", &off, UINT64_MAX))
		return cwi_sr_error(rd);
	if (open && next == 0) {
		cwi_sr_fail(rd, CACHEW_ECORRUPT,
		    "a file is open before the first");
		return cwi_sr_error(rd);
	}
	r->next_path = (size_t)next;
	return open ? records_reopen(r, in_file, off, rd) : CACHEW_OK;
}

static const cwi_iter_ops records_iter_ops = {
    .next = records_next,
    .destroy = records_destroy,
    .save = records_save,
    .restore = records_restore,
};

static cachew_err
records_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	cwi_rec_config cfg = {
	    .record_bytes = cwi_node_int(node, "record_bytes"),
	    .header_bytes = cwi_node_int(node, "header_bytes"),
	    .footer_bytes = cwi_node_int(node, "footer_bytes"),
	    .buffer_size = cwi_node_int(node, "buffer_size"),
	};
	records_iter *r;
	const char **pats;
	size_t npat = 0;
	cachew_err rv;

	if (cfg.buffer_size <= 0)
		cfg.buffer_size = CWI_READ_BLOCK;
	cfg.map = cfg.record_bytes > 0 && args->pl->opts.map_reads;
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &records_iter_ops;
	cwi_rec_init(&r->reader, &cfg);
	pats = cwi_value_str_list(cwi_node_value(node, "files"), &npat);
	if (pats == NULL) {
		free(r);
		return CACHEW_ENOMEM;
	}
	rv = cwi_paths_expand(pats, npat, &r->paths, &r->npaths);
	free(pats);
	if (rv == CACHEW_OK)
		rv = cwi_split_select_paths(args, node, &r->paths, &r->npaths);
	if (rv != CACHEW_OK) {
		cwi_paths_free(r->paths);
		free(r);
		return rv;
	}
	*out = &r->base;
	return CACHEW_OK;
}

static const cwi_param_spec text_lines_params[] = {
    {.name = "files", .type = CWI_P_STRS, .flags = CWI_PF_REQUIRED,
	.help = "files or glob patterns, read in order"},
    {.name = "buffer_size", .type = CWI_P_INT, .flags = CWI_PF_PERF,
	.def_int = CWI_READ_BLOCK, .min = 1, .max = CWI_READ_BLOCK_MAX,
	.help = "bytes per read"},
};

const cwi_dataset_op cwi_op_text_lines = {
    .name = "text_lines",
    .doc = "the lines of text files, without their \\n or \\r\\n, as bytes "
	   "scalars",
    .params = text_lines_params,
    .nparams = sizeof(text_lines_params) / sizeof(text_lines_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_FILES | CWI_OPF_SPLITTABLE,
    .iter_create = records_create,
    .split_units = cwi_split_units_files,
    .saves = "the file, the lines read of it and the byte offset of the "
	"next one: a restore reopens the file there",
    .infer = cwi_infer_bytes_scalar,
};

static const cwi_param_spec fixed_params[] = {
    {.name = "files", .type = CWI_P_STRS, .flags = CWI_PF_REQUIRED,
	.help = "files or glob patterns, read in order"},
    {.name = "record_bytes", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED,
	.min = 1, .max = CWI_READ_BLOCK_MAX, .help = "bytes per record"},
    {.name = "header_bytes", .type = CWI_P_INT, .def_int = 0, .min = 0,
	.max = INT64_MAX / 4, .help = "bytes skipped at the start of a file"},
    {.name = "footer_bytes", .type = CWI_P_INT, .def_int = 0, .min = 0,
	.max = INT64_MAX / 4, .help = "bytes ignored at the end of a file"},
    {.name = "buffer_size", .type = CWI_P_INT, .flags = CWI_PF_PERF,
	.def_int = CWI_READ_BLOCK, .min = 1, .max = CWI_READ_BLOCK_MAX,
	.help = "bytes per read (rounded down to whole records)"},
};

const cwi_dataset_op cwi_op_fixed_length_records = {
    .name = "fixed_length_records",
    .doc = "fixed-length records of binary files, as bytes scalars",
    .params = fixed_params,
    .nparams = sizeof(fixed_params) / sizeof(fixed_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_FILES | CWI_OPF_SPLITTABLE,
    .iter_create = records_create,
    .split_units = cwi_split_units_files,
    .saves = "the file, the records read of it and the byte offset of the "
	"next one: a restore reopens the file there",
    .infer = cwi_infer_bytes_scalar,
};

/* ---- the functions: one file per input element ------------------------------ */

static cachew_err
text_lines_fn_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	cwi_rec_config *cfg = malloc(sizeof(*cfg));
	cachew_err rv;

	if (cfg == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_rec_config_from_params(params, false, cfg, err, errlen);
	if (rv != CACHEW_OK) {
		free(cfg);
		return rv;
	}
	*state = cfg;
	return CACHEW_OK;
}

static cachew_err
fixed_fn_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	cwi_rec_config *cfg = malloc(sizeof(*cfg));
	cachew_err rv;

	if (cfg == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_rec_config_from_params(params, true, cfg, err, errlen);
	if (rv != CACHEW_OK) {
		free(cfg);
		return rv;
	}
	*state = cfg;
	return CACHEW_OK;
}

static void
records_fn_fini(void *state)
{
	free(state);
}

static cachew_err
records_fn_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	const cwi_rec_config *cfg = cachew_op_ctx_state(ctx);
	cwi_rec_reader *r;
	char *path = NULL;
	cachew_err rv;

	rv = cwi_input_path(ctx, in, &path);
	if (rv != CACHEW_OK)
		return rv;
	r = malloc(sizeof(*r));
	if (r == NULL) {
		free(path);
		cachew_op_ctx_fail(ctx, "out of memory");
		return CACHEW_ENOMEM;
	}
	cwi_rec_init(r, cfg);
	rv = cwi_rec_open(r, path, strlen(path));
	free(path);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "%s", r->errmsg);
		cwi_rec_close(r);
		free(r);
		return rv;
	}
	*seq = r;
	return CACHEW_OK;
}

static cachew_err
records_fn_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	cwi_rec_reader *r = seq;
	cwi_element *e;
	cwi_tensor t;
	cachew_err rv = cwi_rec_next(r, &t);

	if (rv == CACHEW_EOF)
		return rv;
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "%s", r->errmsg);
		return rv;
	}
	e = cwi_element_new(1);
	if (e == NULL) {
		cwi_tensor_clear(&t);
		cachew_op_ctx_fail(ctx, "out of memory");
		return CACHEW_ENOMEM;
	}
	e->comp[0] = t;
	*out = e;
	return CACHEW_OK;
}

static void
records_fn_close(void *seq)
{
	cwi_rec_reader *r = seq;
	cwi_rec_close(r);
	free(r);
}

static uint64_t
records_fn_tell(void *seq)
{
	return cwi_rec_tell(seq);
}

static cachew_err
records_fn_seek(void *seq, uint64_t pos, char *err, size_t errlen)
{
	cwi_rec_reader *r = seq;
	cachew_err rv = cwi_rec_seek(r, pos);

	if (rv != CACHEW_OK && rv != CACHEW_ENOTSUP)
		snprintf(err, errlen, "%s", r->errmsg);
	return rv;
}

const cwi_seq_resume cwi_rec_fn_resume = {
    .tell = records_fn_tell,
    .seek = records_fn_seek,
};

const cachew_op_def cwi_fn_text_lines = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "text_lines",
    .doc = "text_lines(buffer_size=1048576): the lines of the file named by component 0, without line ends",
    .kind = CACHEW_OP_FLAT_MAP,
    .cost_ns = 100,
    .init = text_lines_fn_init,
    .fini = records_fn_fini,
    .flat_open = records_fn_open,
    .flat_next = records_fn_next,
    .flat_close = records_fn_close,
};

const cachew_op_def cwi_fn_fixed_length_records = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "fixed_length_records",
    .doc = "fixed_length_records(record_bytes, header_bytes=0, footer_bytes=0, buffer_size=1048576): the records of the file named by component 0",
    .kind = CACHEW_OP_FLAT_MAP,
    .cost_ns = 100,
    .init = fixed_fn_init,
    .fini = records_fn_fini,
    .flat_open = records_fn_open,
    .flat_next = records_fn_next,
    .flat_close = records_fn_close,
};
