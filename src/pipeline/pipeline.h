/*
 * pipeline.h - names into pipelines: the public calls that build datasets
 * from operator names (the C builders, the pipeline-string parser, the
 * msgpack graph format, cachew_dataset_apply) and register operators, over
 * the graph model (src/graph) and the built-in operator tables.
 *
 * This module sits above exec, ops, sources and cache because it lists
 * their tables (pipeline_builtins.c): the registry in src/graph holds no
 * reference to them, so the module graph stays a DAG. Every public call
 * here makes sure the registry has its built-ins (cwi_builtins_ready)
 * before it names an operator.
 */
#ifndef CWI_PIPELINE_H
#define CWI_PIPELINE_H

#include "../graph/graph.h"

/* Gives the registry the built-in tables, once per process; cheap after
 * the first call. Thread safe. */
void cwi_builtins_ready(void);

/* Built-in tables, NULL-terminated, one per module. */
extern const cwi_dataset_op *const cwi_source_ops[];    /* src/sources */
extern const cwi_dataset_op *const cwi_transform_ops[]; /* src/ops */
extern const cwi_dataset_op *const cwi_exec_ops[];      /* src/exec */
extern const cwi_dataset_op *const cwi_cache_ops[];     /* src/cache */
extern const cachew_op_def *const cwi_builtin_fns[];    /* src/ops */
extern const cachew_op_def *const cwi_source_fns[];     /* src/sources */

#endif /* CWI_PIPELINE_H */
