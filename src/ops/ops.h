/*
 * ops.h - transformation operators (src/ops) and the built-in functions.
 */
#ifndef CWI_OPS_H
#define CWI_OPS_H

#include "../exec/exec.h"

extern const cwi_dataset_op cwi_op_batch;

/* Stacks k >= 1 elements of equal structure into one element whose
 * components gain a leading dimension of k. On a structure mismatch
 * returns CACHEW_ETYPE with a message in err naming the element and
 * component. The inputs stay the caller's. */
cachew_err cwi_stack(cwi_element *const *elems, size_t k, cwi_element **out,
    char *err, size_t errlen);

#endif /* CWI_OPS_H */
