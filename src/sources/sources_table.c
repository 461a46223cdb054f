/*
 * sources_table.c - the dataset operators and functions of src/sources.
 */
#include "sources.h"

const cwi_dataset_op *const cwi_source_ops[] = {
    &cwi_op_range,
    NULL,
};

const cachew_op_def *const cwi_source_fns[] = {
    NULL,
};
