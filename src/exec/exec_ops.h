/*
 * exec_ops.h - the dataset operators implemented in src/exec (those that
 * run their own threads: map, prefetch, interleave).
 */
#ifndef CWI_EXEC_OPS_H
#define CWI_EXEC_OPS_H

#include "exec.h"

extern const cwi_dataset_op cwi_op_map;
extern const cwi_dataset_op cwi_op_prefetch;
extern const cwi_dataset_op cwi_op_interleave;

#endif /* CWI_EXEC_OPS_H */
