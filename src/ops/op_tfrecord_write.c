/*
 * op_tfrecord_write.c - tfrecord_write(path, compression, index): passes
 * its input through unchanged and appends component 0 (a bytes scalar) of
 * every element as a record to a TFRecord file, and with index=true writes
 * the record index "<path>.idx" (DALI's tfrecord2idx format, one
 * "<offset> <size>" line per record; docs/formats.md).
 *
 * The records go to "<path>.tmp-<pid>"; at the end of the input the file is
 * flushed, fsync'ed and renamed to `path`, so a reader never sees a partial
 * file under the final name. A failure, or an iterator destroyed before the
 * end of its input (`take` downstream), removes the temporary file and
 * leaves no final file. The index goes the same way through
 * "<path>.idx.tmp-<pid>": synced before the data file is renamed, renamed
 * after it. Writing without an index removes a "<path>.idx" left by an
 * earlier write, which would no longer describe the file.
 */
#include "ops.h"

#include "../io/io_policy.h"
#include "../sources/sources.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

typedef struct tfrecord_write_iter {
	cwi_iter base;
	cwi_iter *input;
	gzFile out;     /* the temporary file: gzip, or "T" (transparent) */
	int fd;         /* the temporary file, for fsync */
	char *path;
	char *tmp;
	uint64_t records;
	/* index=true: the temporary index and its final name. */
	FILE *idx;
	char *idx_path;
	char *idx_tmp;
	bool idx_pending; /* idx_tmp exists on disk */
	uint64_t offset;  /* where the next record starts */
} tfrecord_write_iter;

/* Closes and removes the temporary file. */
static void
writer_abort(tfrecord_write_iter *w)
{
	if (w->out != NULL)
		(void)gzclose_w(w->out);
	w->out = NULL;
	if (w->fd >= 0) {
		close(w->fd);
		(void)unlink(w->tmp);
	}
	w->fd = -1;
	if (w->idx != NULL)
		fclose(w->idx);
	w->idx = NULL;
	if (w->idx_pending)
		(void)unlink(w->idx_tmp);
	w->idx_pending = false;
}

static cachew_err
writer_error(tfrecord_write_iter *w, cachew_err rv, const char *what)
{
	int zerr = Z_OK;
	const char *msg = w->out != NULL ? gzerror(w->out, &zerr) : "";

	cwi_pipeline_fail(w->base.pl, rv, "tfrecord_write: %s: %s: %s", w->tmp,
	    what, zerr == Z_ERRNO || msg[0] == '\0' ? strerror(errno) : msg);
	writer_abort(w);
	return rv;
}

static cachew_err
write_record(tfrecord_write_iter *w, const cwi_element *e)
{
	const cwi_tensor *t = &e->comp[0];
	uint8_t hdr[CWI_TFRECORD_HEADER], ftr[CWI_TFRECORD_FOOTER];
	const uint8_t *data;
	size_t len;
	char spec[64];

	if (t->dtype != CACHEW_BYTES || t->rank != 0) {
		cwi_pipeline_fail(w->base.pl, CACHEW_ETYPE,
		    "tfrecord_write: component 0 of element %llu is %s, "
		    "expected a bytes scalar",
		    (unsigned long long)w->records,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		writer_abort(w);
		return CACHEW_ETYPE;
	}
	data = cwi_tensor_str(t, 0, &len);
	cwi_tfrecord_header(hdr, len);
	cwi_tfrecord_footer(ftr, data, len);
	if (gzwrite(w->out, hdr, sizeof(hdr)) != (int)sizeof(hdr) ||
	    (len > 0 && gzfwrite(data, 1, len, w->out) != len) ||
	    gzwrite(w->out, ftr, sizeof(ftr)) != (int)sizeof(ftr))
		return writer_error(w, CACHEW_EIO, "write failed");
	if (w->idx != NULL &&
	    fprintf(w->idx, "%llu %llu\n", (unsigned long long)w->offset,
		(unsigned long long)(sizeof(hdr) + len + sizeof(ftr))) < 0) {
		cwi_pipeline_fail(w->base.pl, CACHEW_EIO,
		    "tfrecord_write: %s: write failed: %s", w->idx_tmp,
		    strerror(errno));
		writer_abort(w);
		return CACHEW_EIO;
	}
	w->offset += sizeof(hdr) + len + sizeof(ftr);
	w->records++;
	return CACHEW_OK;
}

/* Flushes, syncs and closes the temporary index, before the data file is
 * renamed so that a failure leaves neither. */
static cachew_err
index_sync(tfrecord_write_iter *w)
{
	int rc = fflush(w->idx) != 0 || fsync(fileno(w->idx)) != 0;
	int err = errno;

	rc |= fclose(w->idx) != 0;
	w->idx = NULL;
	if (rc == 0)
		return CACHEW_OK;
	return cwi_pipeline_fail(w->base.pl, CACHEW_EIO,
	    "tfrecord_write: %s: cannot complete the index: %s", w->idx_tmp,
	    strerror(err != 0 ? err : errno));
}

/* Renames the synced index after the data file, or without an index
 * removes a stale one. */
static cachew_err
index_commit(tfrecord_write_iter *w)
{
	char *stale;
	int err;

	if (w->idx_tmp != NULL) {
		w->idx_pending = false;
		if (rename(w->idx_tmp, w->idx_path) == 0)
			return CACHEW_OK;
		err = errno;
		(void)unlink(w->idx_tmp);
		return cwi_pipeline_fail(w->base.pl, CACHEW_EIO,
		    "tfrecord_write: cannot rename %s to %s: %s", w->idx_tmp,
		    w->idx_path, strerror(err));
	}
	stale = cwi_asprintf("%s.idx", w->path);
	if (stale != NULL)
		(void)unlink(stale);
	free(stale);
	return CACHEW_OK;
}

/* Flushes, syncs and renames the temporary file to its final name. */
static cachew_err
writer_commit(tfrecord_write_iter *w)
{
	int zrv = gzclose_w(w->out);

	w->out = NULL;
	if (zrv != Z_OK)
		return writer_error(w, CACHEW_EIO, "close failed");
	if (fsync(w->fd) != 0)
		return writer_error(w, CACHEW_EIO, "fsync failed");
	if (w->idx != NULL && index_sync(w) != CACHEW_OK) {
		writer_abort(w);
		return CACHEW_EIO;
	}
	if (close(w->fd) != 0) {
		w->fd = -1;
		(void)unlink(w->tmp);
		return cwi_pipeline_fail(w->base.pl, CACHEW_EIO,
		    "tfrecord_write: %s: close failed: %s", w->tmp,
		    strerror(errno));
	}
	w->fd = -1;
	if (rename(w->tmp, w->path) != 0) {
		int err = errno;
		(void)unlink(w->tmp);
		return cwi_pipeline_fail(w->base.pl, CACHEW_EIO,
		    "tfrecord_write: cannot rename %s to %s: %s", w->tmp,
		    w->path, strerror(err));
	}
	if (index_commit(w) != CACHEW_OK)
		return CACHEW_EIO;
	cwi_log(CACHEW_LOG_INFO, "tfrecord", "wrote %llu records to %s",
	    (unsigned long long)w->records, w->path);
	return CACHEW_OK;
}

static cachew_err
tfrecord_write_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	tfrecord_write_iter *w = (tfrecord_write_iter *)it;
	size_t first = out->n;
	cachew_err rv = cwi_iter_next(w->input, out, max);

	if (rv != CACHEW_OK && rv != CACHEW_EOF) {
		writer_abort(w);
		return rv;
	}
	for (size_t i = first; i < out->n; i++) {
		cachew_err wrv = write_record(w, out->v[i]);
		if (wrv != CACHEW_OK) {
			/* Deliver what was written, then the error. */
			for (size_t j = i; j < out->n; j++)
				cwi_element_release(out->v[j]);
			out->n = i;
			return wrv;
		}
	}
	if (rv == CACHEW_EOF && w->out != NULL) {
		cachew_err crv = writer_commit(w);
		if (crv != CACHEW_OK)
			return crv;
	}
	return rv;
}

static void
tfrecord_write_destroy(cwi_iter *it)
{
	tfrecord_write_iter *w = (tfrecord_write_iter *)it;

	writer_abort(w);
	cwi_iter_destroy(w->input);
	free(w->path);
	free(w->tmp);
	free(w->idx_path);
	free(w->idx_tmp);
	free(w);
}

/* The file is written under a temporary name owned by this process and
 * renamed when the pass completes: another process cannot continue it, and
 * a restored pass would leave out the records before its position. */
static cachew_err
tfrecord_write_save(cwi_iter *it, struct cwi_state_writer *w)
{
	(void)it;
	(void)w;
	return cwi_fail(CACHEW_ENOTSUP,
	    "tfrecord_write: cannot save its position: the file is written "
	    "whole by one pass (a temporary file renamed at its end), which a "
	    "restored run cannot continue");
}

static const cwi_iter_ops tfrecord_write_iter_ops = {
    .next = tfrecord_write_next,
    .destroy = tfrecord_write_destroy,
    .save = tfrecord_write_save,
};

static cachew_err
writer_open(tfrecord_write_iter *w, bool gzip)
{
	int dup_fd;

	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0)
		return cwi_fail(errno == ENOENT || errno == ENOTDIR
			? CACHEW_ENOENT
			: CACHEW_EIO,
		    "cannot create %s: %s", w->tmp, strerror(errno));
	/* gzclose closes its descriptor; ours stays open for fsync. */
	dup_fd = fcntl(w->fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0 ||
	    (w->out = gzdopen(dup_fd, gzip ? "wb6" : "wbT")) == NULL) {
		if (dup_fd >= 0)
			close(dup_fd);
		writer_abort(w);
		return cwi_fail(CACHEW_ENOMEM, "cannot set up the writer");
	}
	(void)gzbuffer(w->out, 1u << 20);
	return CACHEW_OK;
}

static cachew_err
index_open(tfrecord_write_iter *w)
{
	w->idx_path = cwi_asprintf("%s.idx", w->path);
	w->idx_tmp = cwi_asprintf("%s.idx.tmp-%ld", w->path, (long)getpid());
	if (w->idx_path == NULL || w->idx_tmp == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	w->idx = fopen(w->idx_tmp, "we");
	w->idx_pending = w->idx != NULL;
	if (w->idx == NULL)
		return cwi_fail(errno == ENOENT || errno == ENOTDIR
			? CACHEW_ENOENT
			: CACHEW_EIO,
		    "cannot create %s: %s", w->idx_tmp, strerror(errno));
	return CACHEW_OK;
}

static cachew_err
tfrecord_write_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	tfrecord_write_iter *w = calloc(1, sizeof(*w));
	bool gzip = strcmp(cwi_node_str(node, "compression"), "gzip") == 0;
	cachew_err rv;

	if (w == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	w->base.ops = &tfrecord_write_iter_ops;
	w->fd = -1;
	w->path = cwi_strdup(cwi_node_str(node, "path"));
	w->tmp = cwi_asprintf("%s.tmp-%ld", w->path != NULL ? w->path : "",
	    (long)getpid());
	if (w->path == NULL || w->tmp == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	/* A confined worker writes only under its cache roots, its
	 * temporary files and index too: they sit beside the file, so a
	 * path that is a root itself would put them in its parent. */
	rv = cwi_io_check_write(w->path);
	if (rv == CACHEW_OK)
		rv = cwi_io_check_write(w->tmp);
	if (rv == CACHEW_OK)
		rv = writer_open(w, gzip);
	if (rv == CACHEW_OK && cwi_node_bool(node, "index"))
		rv = index_open(w);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cwi_iter_create(&w->input, node->inputs[0], args);
	if (rv != CACHEW_OK)
		goto fail;
	*out = &w->base;
	return CACHEW_OK;
fail:
	writer_abort(w);
	free(w->path);
	free(w->tmp);
	free(w->idx_path);
	free(w->idx_tmp);
	free(w);
	return rv;
}

static cachew_err
tfrecord_write_validate(cwi_node *node)
{
	const char *c = cwi_node_str(node, "compression");

	if (strcmp(c, "none") != 0 && strcmp(c, "gzip") != 0)
		return cwi_fail(CACHEW_EINVAL,
		    "tfrecord_write: compression must be none or gzip, not "
		    "'%s'", c);
	if (cwi_node_bool(node, "index") && strcmp(c, "none") != 0)
		return cwi_fail(CACHEW_EINVAL,
		    "tfrecord_write: index=true needs compression=none: a "
		    "gzip file cannot be read by byte range");
	if (cwi_node_str(node, "path")[0] == '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "tfrecord_write: path must not be empty");
	return CACHEW_OK;
}

static const cwi_param_spec tfrecord_write_params[] = {
    {.name = "path", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the TFRecord file to write (replaced atomically at the end "
		"of the input)"},
    {.name = "compression", .type = CWI_P_STR, .def_str = "none",
	.help = "none or gzip"},
    {.name = "index", .type = CWI_P_BOOL, .def_int = 0,
	.help = "also write the record index PATH.idx (compression=none), "
		"for tfrecord(records=...)"},
};

const cwi_dataset_op cwi_op_tfrecord_write = {
    .name = "tfrecord_write",
    .doc = "passes elements through and writes component 0 (bytes "
	   "scalars) as the records of a TFRecord file",
    .params = tfrecord_write_params,
    .nparams = sizeof(tfrecord_write_params) /
	sizeof(tfrecord_write_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .validate = tfrecord_write_validate,
    .iter_create = tfrecord_write_create,
    .saves = "cannot be saved (CACHEW_ENOTSUP): the file is written whole "
	"by one pass, which a restored run cannot continue",
};
