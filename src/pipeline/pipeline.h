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

/* The user functions (not built in here) a serialized graph's nodes name,
 * each once, with the plugin build the graph says it came from
 * (docs/graph-format.md, section 2), without building the graph: what a
 * process must have to run it, which the dispatcher checks against what
 * its workers have. *out (free(), NULL when none) holds *n. A document
 * that does not decode is CACHEW_EPARSE as for
 * cachew_dataset_from_msgpack; CACHEW_ENOMEM. Thread safe. */
cachew_err cwi_graph_user_fns(const void *buf, size_t len,
    cwi_fn_ident **out, size_t *n);

/* The shuffles of a serialized graph, for the dispatcher, which orders a
 * distributed_epoch job's splits by them (dispatcher_ledger.c) without
 * building the graph (its plugins may not be loaded there). */
typedef struct cwi_graph_shuffles {
	uint32_t n;      /* shuffle nodes; 0: none (the rest is 0) */
	uint64_t buffer; /* the largest buffer */
	uint64_t seed;   /* their `seed` parameters (-1 included), mixed */
	bool reshuffle;  /* one of them reshuffles each iteration */
} cwi_graph_shuffles;

/* Fills *out from the shuffle nodes of a serialized graph (absent
 * parameters: shuffle's defaults). A document that does not decode is
 * CACHEW_EPARSE as for cachew_dataset_from_msgpack (*out zeroed);
 * CACHEW_ENOMEM. Thread safe. */
cachew_err cwi_graph_shuffles_of(const void *buf, size_t len,
    cwi_graph_shuffles *out);

/* Built-in tables, NULL-terminated, one per module. */
extern const cwi_dataset_op *const cwi_source_ops[];    /* src/sources */
extern const cwi_dataset_op *const cwi_transform_ops[]; /* src/ops */
extern const cwi_dataset_op *const cwi_exec_ops[];      /* src/exec */
extern const cwi_dataset_op *const cwi_cache_ops[];     /* src/cache */
extern const cachew_op_def *const cwi_builtin_fns[];    /* src/ops */
extern const cachew_op_def *const cwi_source_fns[];     /* src/sources */
extern const cwi_fn_spec cwi_builtin_fn_specs[];        /* src/ops */

#endif /* CWI_PIPELINE_H */
