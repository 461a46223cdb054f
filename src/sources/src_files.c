/*
 * src_files.c - list_files(files, shuffle, seed): the paths matching glob
 * patterns (local, or s3:// and gs:// listings) as bytes scalars;
 * read_file: the map function (and its dataset alias) that replaces a path
 * or URL by the whole contents of the file, read through src/io.
 */
#include "sources.h"

#include "../exec/exec_split.h"
#include "../exec/exec_state.h"
#include "../io/io.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- list_files ----------------------------------------------------------- */

typedef struct list_files_iter {
	cwi_iter base;
	cwi_buffer *names; /* every path in output order, back to back */
	uint64_t *offs;    /* n + 1 offsets into names */
	size_t n, next;
} list_files_iter;

static cachew_err
list_files_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	list_files_iter *l = (list_files_iter *)it;
	size_t got = 0;

	while (got < max && l->next < l->n) {
		cwi_element *e = cwi_element_new(1);
		size_t i = l->next++;
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "list_files: out of memory");
		cwi_tensor_init_bytes_view(&e->comp[0], l->names,
		    (size_t)l->offs[i], (size_t)(l->offs[i + 1] - l->offs[i]));
		cwi_chunk_push(out, e);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
list_files_destroy(cwi_iter *it)
{
	list_files_iter *l = (list_files_iter *)it;
	cwi_buffer_unref(l->names);
	free(l->offs);
	free(l);
}

/* [next path]: the epoch's order itself follows from the seed. */
static cachew_err
list_files_save(cwi_iter *it, cwi_state_writer *w)
{
	list_files_iter *l = (list_files_iter *)it;

	cwi_sw_array(w, 1);
	cwi_sw_uint(w, l->next);
	return CACHEW_OK;
}

static cachew_err
list_files_restore(cwi_iter *it, cwi_state_reader *r)
{
	list_files_iter *l = (list_files_iter *)it;
	uint64_t next = 0;

	if (!cwi_sr_array(r, "list_files", 1) ||
	    !cwi_sr_uint(r, "next", &next, l->n))
		return cwi_sr_error(r);
	l->next = (size_t)next;
	return CACHEW_OK;
}

static const cwi_iter_ops list_files_iter_ops = {
    .next = list_files_next,
    .destroy = list_files_destroy,
    .save = list_files_save,
    .restore = list_files_restore,
};

static int
path_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted like tf.data's list_files; with shuffle=true, shuffled by a seed
 * mixed with the epoch so that each epoch (each repetition under repeat)
 * has its own order. An explicit seed alone fixes the orders; with seed -1
 * the run's seed is mixed with the node's fingerprint, so two list_files
 * nodes of one pipeline differ.
 * Split unit i is the i-th path of the epoch's order, and the order is
 * drawn from the job's seed (pl->job_seed), never the lease's: the leases
 * of one epoch partition one permutation, which the dispatcher's splits
 * walk in order (a new file order per epoch through the service, as
 * in-process); a lease replayed elsewhere reads the same files; and a
 * lease of every unit from unit 0 is the plain run. */
static void
shuffle_paths(char **paths, size_t n, const cwi_node *node,
    const cwi_iter_args *args)
{
	int64_t seed = cwi_node_int(node, "seed");
	uint64_t base;
	cwi_rng rng;

	base = seed >= 0 ? (uint64_t)seed
			 : cwi_seed_derive(args->pl->job_seed,
			       node->seed_fp.hi ^ node->seed_fp.lo);
	rng.state = cwi_seed_derive(base, args->epoch);
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)cwi_rng_below(&rng, i);
		char *tmp = paths[i - 1];
		paths[i - 1] = paths[j];
		paths[j] = tmp;
	}
}

static cachew_err
order_paths(char ***paths, size_t *n, const cwi_node *node,
    const cwi_iter_args *args)
{
	qsort(*paths, *n, sizeof(char *), path_cmp);
	if (cwi_node_bool(node, "shuffle"))
		shuffle_paths(*paths, *n, node, args);
	return cwi_split_select_paths(args, node, paths, n);
}

/* Packs the paths into one buffer so that each element is a view. */
static cachew_err
pack_paths(list_files_iter *l, char *const *paths, size_t n)
{
	size_t total = 0;
	cachew_err rv;

	for (size_t i = 0; i < n; i++)
		total += strlen(paths[i]);
	l->offs = malloc((n + 1) * sizeof(uint64_t));
	if (l->offs == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_buffer_alloc(&l->names, total, false);
	if (rv != CACHEW_OK)
		return rv;
	l->offs[0] = 0;
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(paths[i]);
		memcpy(l->names->data + l->offs[i], paths[i], len);
		l->offs[i + 1] = l->offs[i] + len;
	}
	l->n = n;
	return CACHEW_OK;
}

static cachew_err
list_files_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	list_files_iter *l = NULL;
	const char **pats;
	char **paths = NULL;
	size_t npat = 0, n = 0;
	cachew_err rv;

	pats = cwi_value_str_list(cwi_node_value(node, "files"), &npat);
	if (pats == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_paths_expand(pats, npat, &paths, &n);
	free(pats);
	if (rv != CACHEW_OK)
		return rv;
	rv = order_paths(&paths, &n, node, args);
	if (rv != CACHEW_OK)
		goto fail;
	l = calloc(1, sizeof(*l));
	if (l == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	l->base.ops = &list_files_iter_ops;
	rv = pack_paths(l, paths, n);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_paths_free(paths);
	*out = &l->base;
	return CACHEW_OK;
fail:
	if (l != NULL)
		list_files_destroy(&l->base);
	cwi_paths_free(paths);
	return rv;
}

static const cwi_param_spec list_files_params[] = {
    {.name = "files", .type = CWI_P_STRS, .flags = CWI_PF_REQUIRED,
	.help = "glob patterns (or paths)"},
    {.name = "shuffle", .type = CWI_P_BOOL, .def_int = 1,
	.help = "shuffle the paths, again each epoch (else sorted)"},
    {.name = "seed", .type = CWI_P_INT, .def_int = -1, .min = -1,
	.max = INT64_MAX, .help = "shuffle seed; -1 = from the pipeline seed"},
};

const cwi_dataset_op cwi_op_list_files = {
    .name = "list_files",
    .doc = "the paths matching glob patterns, as bytes scalars",
    .params = list_files_params,
    .nparams = sizeof(list_files_params) / sizeof(list_files_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_FILES | CWI_OPF_SPLITTABLE |
	CWI_OPF_RANDOM,
    .iter_create = list_files_create,
    .split_units = cwi_split_units_files,
    .saves = "the index of the next path; the epoch's order follows from "
	"the seed again",
    .infer = cwi_infer_bytes_scalar,
};

/* ---- read_file -------------------------------------------------------------- */

static cachew_err
read_file_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	(void)state;
	if (cachew_params_count(params) > 0) {
		snprintf(err, errlen,
		    "unknown parameter '%s' (read_file takes none)",
		    cachew_params_key(params, 0));
		return CACHEW_EINVAL;
	}
	return CACHEW_OK;
}

static cachew_err
read_file_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	cwi_element *e = NULL;
	cwi_buffer *b = NULL;
	cwi_io_opts io;
	char *path = NULL;
	size_t len = 0;
	cachew_err rv;

	rv = cwi_input_path(ctx, in, &path);
	if (rv != CACHEW_OK)
		goto fail;
	/* One allocation of the file's size when it is known (regular files,
	 * HTTP responses with a length), within max_element_bytes; only a
	 * regular file, so that /dev/zero or a FIFO neither grows without
	 * end nor blocks. The message names the path. */
	cwi_io_opts_default(&io);
	io.regular_only = true;
	rv = cwi_file_read_max(path, &io, (size_t)cwi_op_ctx_max_element(ctx),
	    &b, &len);
	if (rv == CACHEW_ERANGE) {
		cachew_op_ctx_fail(ctx, "%s (max_element_bytes)",
		    cwi_errmsg_get());
		goto fail;
	}
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "%s", cwi_errmsg_get());
		goto fail;
	}
	e = cwi_element_make_unique(in);
	in = NULL;
	if (e == NULL) {
		cachew_op_ctx_fail(ctx, "out of memory");
		rv = CACHEW_ENOMEM;
		goto fail;
	}
	cwi_tensor_clear(&e->comp[0]);
	cwi_tensor_init_bytes_view(&e->comp[0], b, 0, len);
	cwi_buffer_unref(b);
	free(path);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_buffer_unref(b);
	free(path);
	cwi_element_release(in);
	return rv;
}

const cachew_op_def cwi_fn_read_file = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "read_file",
    .doc = "read_file(): replaces the path in component 0 with the file's contents (a regular file, at most max_element_bytes)",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 10000,
    .init = read_file_init,
    .map = read_file_map,
};

const cwi_dataset_op cwi_op_read_file = {
    .name = "read_file",
    .doc = "replaces the path in component 0 by the contents of the file "
	   "(map(read_file)): a regular file (not a FIFO or a device) of at "
	   "most max_element_bytes",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "read_file",
};
