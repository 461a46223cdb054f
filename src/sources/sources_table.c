/*
 * sources_table.c - the dataset operators and functions of src/sources.
 */
#include "sources.h"

const cwi_dataset_op *const cwi_source_ops[] = {
    &cwi_op_range,
    &cwi_op_counter,
    &cwi_op_random, /* issue 15, part A */
    &cwi_op_from_tensors,
    &cwi_op_from_list,
    &cwi_op_list_files,
    &cwi_op_text_lines,
    &cwi_op_fixed_length_records,
    &cwi_op_read_file,
    &cwi_op_tfrecord,
    &cwi_op_user_source,
    NULL,
};

/* Function names are their own namespace: `interleave(text_lines)` names
 * the flat_map function, `text_lines(files)` the source. */
const cachew_op_def *const cwi_source_fns[] = {
    &cwi_fn_text_lines,
    &cwi_fn_fixed_length_records,
    &cwi_fn_read_file,
    &cwi_fn_tfrecord,
    NULL,
};
