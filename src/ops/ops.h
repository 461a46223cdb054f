/*
 * ops.h - transformation operators (src/ops) and the built-in functions.
 */
#ifndef CWI_OPS_H
#define CWI_OPS_H

#include "../exec/exec.h"

extern const cwi_dataset_op cwi_op_batch;         /* op_batch.c */
extern const cwi_dataset_op cwi_op_padded_batch;  /* op_batch.c */
extern const cwi_dataset_op cwi_op_unbatch;       /* op_unbatch.c */
extern const cwi_dataset_op cwi_op_filter;        /* op_filter.c */
extern const cwi_dataset_op cwi_op_flat_map;      /* op_filter.c */
extern const cwi_dataset_op cwi_op_shuffle;       /* op_shuffle.c */
extern const cwi_dataset_op cwi_op_repeat;        /* op_repeat.c */
extern const cwi_dataset_op cwi_op_take;          /* op_repeat.c */
extern const cwi_dataset_op cwi_op_skip;          /* op_repeat.c */
extern const cwi_dataset_op cwi_op_shard;         /* op_repeat.c */
extern const cwi_dataset_op cwi_op_zip;           /* op_zip.c */
extern const cwi_dataset_op cwi_op_concatenate;   /* op_zip.c */
extern const cwi_dataset_op cwi_op_enumerate;     /* op_zip.c */
extern const cwi_dataset_op cwi_op_autocache;     /* op_autocache.c */

/* Stacks k >= 1 elements of equal structure into one element whose
 * components gain a leading dimension of k. On a structure mismatch
 * returns CACHEW_ETYPE with a message in err naming the element and
 * component. The inputs stay the caller's. */
cachew_err cwi_stack(cwi_element *const *elems, size_t k, cwi_element **out,
    char *err, size_t errlen);

/* How padded_batch pads one batch: the value that fills the padding and
 * the optional target shapes. */
typedef struct cwi_pad_spec {
	double pad_value;
	/* Per component: shape[c] has rank[c] dims, -1 = the batch maximum.
	 * ncomp == 0: pad every dimension to the batch maximum. ncomp == 1
	 * with `shared`: the one shape applies to every component. */
	size_t ncomp;
	bool shared;
	unsigned rank[CACHEW_MAX_COMPONENTS];
	int64_t shape[CACHEW_MAX_COMPONENTS][CACHEW_MAX_RANK];
} cwi_pad_spec;

/* Reads padded_batch's `shape` parameter (absent, a list of ints, or a list
 * of such lists, one per component) into spec. CACHEW_EINVAL through
 * cwi_fail when it is malformed. */
cachew_err cwi_pad_spec_init(cwi_pad_spec *spec, const cwi_node *node);

/* Stacks k >= 1 elements whose components agree in dtype and rank, padding
 * each component to the largest size of every dimension in the batch (or
 * to spec's shape) with spec->pad_value converted to the dtype (bytes
 * components pad with empty strings). Errors as cwi_stack. */
cachew_err cwi_stack_padded(cwi_element *const *elems, size_t k,
    const cwi_pad_spec *spec, cwi_element **out, char *err, size_t errlen);

/* "i64[2]" for a one-component element, "(i64[2], f32[])" otherwise, into
 * buf; returns buf. */
const char *cwi_element_spec_str(const cwi_element *e, char *buf, size_t len);

#endif /* CWI_OPS_H */
