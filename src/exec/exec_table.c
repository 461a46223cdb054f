/*
 * exec_table.c - the dataset operators of src/exec.
 */
#include "exec_ops.h"

const cwi_dataset_op *const cwi_exec_ops[] = {
    &cwi_op_map,
    &cwi_op_prefetch,
    &cwi_op_interleave,
    NULL,
};
