/*
 * ops_table.c - the transformation operators of src/ops.
 */
#include "ops.h"

const cwi_dataset_op *const cwi_transform_ops[] = {
    &cwi_op_batch,
    NULL,
};
