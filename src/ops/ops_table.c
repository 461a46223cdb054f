/*
 * ops_table.c - the transformation operators of src/ops.
 */
#include "ops.h"

const cwi_dataset_op *const cwi_transform_ops[] = {
    &cwi_op_batch,
    &cwi_op_padded_batch,
    &cwi_op_unbatch,
    &cwi_op_filter,
    &cwi_op_flat_map,
    &cwi_op_take_while,
    &cwi_op_unique,
    &cwi_op_scan,
    &cwi_op_reduce,
    &cwi_op_window,
    /* issue 15, part A */
    &cwi_op_ignore_errors,
    &cwi_op_rebatch,
    &cwi_op_shuffle,
    &cwi_op_repeat,
    &cwi_op_take,
    &cwi_op_skip,
    &cwi_op_shard,
    &cwi_op_zip,
    &cwi_op_concatenate,
    &cwi_op_enumerate,
    &cwi_op_autocache,
    &cwi_op_tfrecord_write,
    &cwi_op_parse_example,
    &cwi_op_decode_jpeg,
    &cwi_op_random_resized_crop,
    &cwi_op_resize,
    &cwi_op_center_crop,
    &cwi_op_flip_left_right,
    &cwi_op_normalize,
    &cwi_op_transpose,
    &cwi_op_tokenize,
    &cwi_op_pad_truncate,
    NULL,
};
