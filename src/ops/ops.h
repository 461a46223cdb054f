/*
 * ops.h - transformation operators (src/ops) and the built-in functions.
 */
#ifndef CWI_OPS_H
#define CWI_OPS_H

#include "../exec/exec.h"
#include "../exec/exec_state.h"

/* The group a batching operator fills before it combines it (op_batch.c):
 * batch, padded_batch and ragged_batch share how it is filled, saved and
 * restored; they differ in how the group becomes one element. */
typedef struct cwi_batch_group {
	cwi_iter *input;
	size_t n;               /* elements per group */
	bool input_done;
	cwi_chunk pending;      /* the group so far */
	uint64_t pending_bytes; /* of the pending elements */
} cwi_batch_group;

/* Sets n (from the node's "n"), reserves the group's room and creates the
 * input's iterator; on failure nothing is left to free. */
cachew_err cwi_batch_group_init(cwi_batch_group *g, const cwi_node *node,
    const cwi_iter_args *args);
void cwi_batch_group_fini(cwi_batch_group *g);
/* Pulls from the input until the group holds n elements or the input
 * ended, failing (through it->pl) once the group would pass
 * max_element_bytes. */
cachew_err cwi_batch_group_fill(cwi_batch_group *g, cwi_iter *it);
/* [input done, the partial group, input]. */
cachew_err cwi_batch_group_save(const cwi_batch_group *g,
    cwi_state_writer *w);
cachew_err cwi_batch_group_restore(cwi_batch_group *g, cwi_state_reader *r,
    const char *op);

extern const cwi_dataset_op cwi_op_batch;         /* op_batch.c */
extern const cwi_dataset_op cwi_op_padded_batch;  /* op_batch.c */
extern const cwi_dataset_op cwi_op_unbatch;       /* op_unbatch.c */
extern const cwi_dataset_op cwi_op_filter;        /* op_filter.c */
extern const cwi_dataset_op cwi_op_flat_map;      /* op_filter.c */
extern const cwi_dataset_op cwi_op_take_while;    /* op_filter.c */
extern const cwi_dataset_op cwi_op_unique;        /* op_unique.c */
extern const cwi_dataset_op cwi_op_scan;          /* op_scan.c */
extern const cwi_dataset_op cwi_op_reduce;        /* op_scan.c */
extern const cwi_dataset_op cwi_op_window;        /* op_window.c */
extern const cwi_dataset_op cwi_op_group_by_window; /* op_group_by_window.c */
extern const cwi_dataset_op cwi_op_bucket_by_sequence_length; /* same */
extern const cwi_dataset_op cwi_op_ragged_batch;  /* op_ragged_batch.c */
extern const cwi_dataset_op cwi_op_ignore_errors; /* op_ignore_errors.c */
extern const cwi_dataset_op cwi_op_rebatch;       /* op_rebatch.c */
extern const cwi_dataset_op cwi_op_shuffle;       /* op_shuffle.c */
extern const cwi_dataset_op cwi_op_repeat;        /* op_repeat.c */
extern const cwi_dataset_op cwi_op_take;          /* op_repeat.c */
extern const cwi_dataset_op cwi_op_skip;          /* op_repeat.c */
extern const cwi_dataset_op cwi_op_shard;         /* op_repeat.c */
extern const cwi_dataset_op cwi_op_zip;           /* op_zip.c */
extern const cwi_dataset_op cwi_op_concatenate;   /* op_zip.c */
extern const cwi_dataset_op cwi_op_sample_from_datasets; /* op_sample.c */
extern const cwi_dataset_op cwi_op_choose_from_datasets; /* op_sample.c */
extern const cwi_dataset_op cwi_op_enumerate;     /* op_zip.c */
extern const cwi_dataset_op cwi_op_autocache;     /* op_autocache.c */
extern const cwi_dataset_op cwi_op_tfrecord_write; /* op_tfrecord_write.c */
extern const cwi_dataset_op cwi_op_parse_example; /* fn_example.c */
extern const cachew_op_def cwi_fn_parse_example;  /* fn_example.c */

/* Stacks k >= 1 elements of equal structure into one element whose
 * components gain a leading dimension of k. On a structure mismatch
 * returns CACHEW_ETYPE with a message in err naming the element and
 * component. The inputs stay the caller's. */
cachew_err cwi_stack(cwi_element *const *elems, size_t k, cwi_element **out,
    char *err, size_t errlen);
/* cwi_stack with the copy of a batch of 1 MiB or more shared by up to
 * `parallel` threads (this one included; at most CWI_STACK_MAX_PARALLEL).
 * The result is the same at any parallelism. */
#define CWI_STACK_MAX_PARALLEL 64
cachew_err cwi_stack_parallel(cwi_element *const *elems, size_t k,
    int parallel, cwi_element **out, char *err, size_t errlen);

/* How padded_batch pads one batch: the value that fills the padding and
 * the optional target shapes. */
typedef struct cwi_pad_spec {
	double pad_value; /* every component's, when npad == 0 */
	/* pad_value given per component (a list, or a map by name resolved
	 * against the input's spec): pad_values[c] for component c < npad,
	 * which must be the element's component count. */
	size_t npad;
	double pad_values[CACHEW_MAX_COMPONENTS];
	/* Per component: shape[c] has rank[c] dims, -1 = the batch maximum.
	 * ncomp == 0: pad every dimension to the batch maximum. ncomp == 1
	 * with `shared`: the one shape applies to every component. */
	size_t ncomp;
	bool shared;
	unsigned rank[CACHEW_MAX_COMPONENTS];
	int64_t shape[CACHEW_MAX_COMPONENTS][CACHEW_MAX_RANK];
} cwi_pad_spec;

/* Reads padded_batch's `shape` parameter (absent, a list of ints, or a list
 * of such lists, one per component) and `pad_value` (a number, a list of
 * one per component, or a map by component name of the input's spec, the
 * components it leaves out padding with 0) into spec. CACHEW_EINVAL
 * through cwi_fail when one is malformed or names no component. */
cachew_err cwi_pad_spec_init(cwi_pad_spec *spec, const cwi_node *node);

/* Stacks k >= 1 elements whose components agree in dtype and rank, padding
 * each component to the largest size of every dimension in the batch (or
 * to spec's shape) with spec->pad_value converted to the dtype (bytes
 * components pad with empty strings). Errors as cwi_stack, and
 * CACHEW_ERANGE for a padded component over max_bytes (the pipeline's
 * max_element_bytes), before it is allocated. */
cachew_err cwi_stack_padded(cwi_element *const *elems, size_t k,
    const cwi_pad_spec *spec, uint64_t max_bytes, cwi_element **out,
    char *err, size_t errlen);

/* node->spec = its input's, every component of known rank gaining a
 * leading dimension of `lead` (-1: unknown), as batch, window and the
 * grouping operators give it; nothing when the input's spec is not known.
 * A rank-8 component is CACHEW_ETYPE naming the operator (op_window.c). */
cachew_err cwi_spec_batched(cwi_node *node, int64_t lead);

/* "i64[2]" for a one-component element, "(i64[2], f32[])" otherwise, into
 * buf; returns buf. */
const char *cwi_element_spec_str(const cwi_element *e, char *buf, size_t len);

/* Image and text preprocessing (fn_image.c, fn_text.c): map functions and
 * their dataset-operator aliases (`decode_jpeg(...)` is map(decode_jpeg)). */
extern const cachew_op_def cwi_fn_decode_jpeg;          /* fn_image.c */
extern const cachew_op_def cwi_fn_is_valid_jpeg;        /* fn_image.c */
extern const cachew_op_def cwi_fn_random_resized_crop;  /* fn_image.c */
extern const cachew_op_def cwi_fn_resize;               /* fn_image.c */
extern const cachew_op_def cwi_fn_center_crop;          /* fn_image.c */
extern const cachew_op_def cwi_fn_flip_left_right;      /* fn_image.c */
extern const cachew_op_def cwi_fn_normalize;            /* fn_image.c */
extern const cachew_op_def cwi_fn_transpose;            /* fn_image.c */
extern const cachew_op_def cwi_fn_tokenize;             /* fn_text.c */
extern const cachew_op_def cwi_fn_pad_truncate;         /* fn_text.c */
extern const cwi_dataset_op cwi_op_decode_jpeg;         /* fn_image.c */
extern const cwi_dataset_op cwi_op_random_resized_crop; /* fn_image.c */
extern const cwi_dataset_op cwi_op_resize;              /* fn_image.c */
extern const cwi_dataset_op cwi_op_center_crop;         /* fn_image.c */
extern const cwi_dataset_op cwi_op_flip_left_right;     /* fn_image.c */
extern const cwi_dataset_op cwi_op_normalize;           /* fn_image.c */
extern const cwi_dataset_op cwi_op_transpose;           /* fn_image.c */
extern const cwi_dataset_op cwi_op_tokenize;            /* fn_text.c */
extern const cwi_dataset_op cwi_op_pad_truncate;        /* fn_text.c */

/* Parameter helpers of function inits (fn_image.c). check_keys fails
 * naming the first key of params not in `known` (comma-separated); the
 * getters store the default when the key is absent and write a reason
 * into err otherwise (EINVAL for a wrong type, ERANGE outside [min, max]). */
cachew_err cwi_fn_check_keys(const cachew_params *params, const char *known,
    char *err, size_t errlen);
cachew_err cwi_fn_get_int(const cachew_params *params, const char *key,
    int64_t def, int64_t min, int64_t max, int64_t *out, char *err,
    size_t errlen);
cachew_err cwi_fn_get_bool(const cachew_params *params, const char *key,
    bool def, bool *out, char *err, size_t errlen);

/* ---- tf.train.Example (fn_example.c; docs/formats.md) ------------------------ */

/* The features parse_example extracts: one per param, "name" =
 * "key:dtype[:[shape]][:default=V]", in param-name order. Immutable. */
typedef struct cwi_example_spec cwi_example_spec;

/* Builds a spec from parse_example's params; CACHEW_EINVAL with a reason
 * in err when one is malformed. */
cachew_err cwi_example_spec_create(const cachew_params *params,
    cwi_example_spec **out, char *err, size_t errlen);
void cwi_example_spec_destroy(cwi_example_spec *s);
size_t cwi_example_spec_size(const cwi_example_spec *s);
/* The element spec parse_example yields: one component per param, in name
 * order, named after it (fn_spec.c's rule). */
cachew_err cwi_example_spec_out(const cwi_example_spec *s, cwi_spec *out);

/* Decodes the serialized Example in the bytes scalar `serialized` into
 * out[0 .. spec size) (overwritten without being released). Single values
 * of bytes features are zero-copy views of serialized's buffer. Errors:
 * CACHEW_ECORRUPT for malformed wire data, CACHEW_ETYPE for a dtype or
 * shape mismatch, CACHEW_EOP for a missing feature without a default;
 * the reason goes to err and out is left holding i64 zeros. Thread safe
 * for a shared spec. */
cachew_err cwi_example_decode(const cwi_example_spec *s,
    const cwi_tensor *serialized, cwi_tensor *out, char *err, size_t errlen);

/* Builds serialized Examples: add features, then finish appends the
 * Example to a byte string and starts a new one. Keys are added in the
 * order given (a key added twice: the last wins when decoded). */
typedef struct cwi_example_enc {
	cwi_strbuf features; /* the Features message body so far */
} cwi_example_enc;

void cwi_example_enc_init(cwi_example_enc *e);
void cwi_example_enc_free(cwi_example_enc *e);
void cwi_example_enc_bytes(cwi_example_enc *e, const char *key,
    const void *const *items, const size_t *lens, size_t n);
void cwi_example_enc_int64(cwi_example_enc *e, const char *key,
    const int64_t *v, size_t n, bool packed);
void cwi_example_enc_float(cwi_example_enc *e, const char *key,
    const float *v, size_t n, bool packed);
/* CACHEW_ENOMEM if any append failed. */
cachew_err cwi_example_enc_finish(cwi_example_enc *e, cwi_strbuf *out);

#endif /* CWI_OPS_H */
