/*
 * cache_table.c - the dataset operators of src/cache.
 */
#include "cache.h"

const cwi_dataset_op *const cwi_cache_ops[] = {
    &cwi_op_cache_put,
    &cwi_op_cache_get,
    &cwi_op_cache,
    NULL,
};
