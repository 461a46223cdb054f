/*
 * graph.h - pipeline graph nodes, dataset-operator specifications and the
 * operator registry.
 *
 * A node (struct cachew_dataset) is immutable once built: an operator, its
 * canonical parameters (every declared parameter present, defaults filled,
 * keys sorted), the resolved function for map/filter/flat_map-style ops,
 * its inputs and its fingerprint.
 */
#ifndef CWI_GRAPH_H
#define CWI_GRAPH_H

#include "../core/core.h"

typedef struct cachew_dataset cwi_node;
typedef struct cwi_iter cwi_iter;
typedef struct cwi_iter_args cwi_iter_args;

/* ---- element specs and cardinality (graph_spec.c) ----------------------- */

/* What every element of a dataset holds, known when the dataset is built
 * (tf.data's element_spec): per component a dtype, a shape whose unknown
 * dimensions are -1, and an optional name. A user function's output is
 * unknown (the registry does not say what it yields): its spec has
 * known == false and checks downstream of it are skipped, never guessed. */
#define CWI_RANK_UNKNOWN 0xffu

typedef struct cwi_comp_spec {
	uint8_t dtype; /* cachew_dtype; CACHEW_INVALID: unknown */
	uint8_t rank;  /* CWI_RANK_UNKNOWN: unknown */
	int64_t shape[CACHEW_MAX_RANK]; /* -1: unknown dimension */
	char *name;    /* NULL: unnamed */
} cwi_comp_spec;

typedef struct cwi_spec {
	bool known;        /* false: not even the number of components */
	uint32_t n;
	cwi_comp_spec *comp;
} cwi_spec;

void cwi_spec_free(cwi_spec *s);
/* A known spec of n components, each of unknown dtype and rank. */
cachew_err cwi_spec_init(cwi_spec *s, uint32_t n);
cachew_err cwi_spec_copy(cwi_spec *dst, const cwi_spec *src);
/* The spec of one element (every dimension known, unnamed). */
cachew_err cwi_spec_of_element(cwi_spec *s, const cwi_element *e);
cachew_err cwi_comp_spec_name(cwi_comp_spec *c, const char *name);
/* The component named `name`, or -1. */
int cwi_spec_find(const cwi_spec *s, const char *name);
/* Widens a to hold b's elements too (a dimension on which they differ
 * becomes -1). Specs of another structure, dtype, rank or names are
 * refused with CACHEW_ETYPE and a message naming the component and both
 * specs, prefixed with `what`; with `what` NULL they are not refused but
 * become unknown (another structure: the whole spec). Unknown parts are
 * compatible with anything. */
cachew_err cwi_spec_merge(cwi_spec *a, const cwi_spec *b, const char *what);
/* "i64[]", "(i64[], bytes[])", "{image: u8[-1,-1,3], label: i64[]}" or
 * "?" (unknown). */
void cwi_spec_print(cwi_strbuf *sb, const cwi_spec *s);
void cwi_comp_spec_print(cwi_strbuf *sb, const cwi_comp_spec *c);
/* The names of a known spec with at least one named component, for the
 * elements of its dataset (one reference, cwi_names_unref); NULL when
 * none is named or the spec is not known, and on ENOMEM. */
cwi_names *cwi_spec_names(const cwi_spec *s);
/* "component 1" or "component 'label'", for messages. Returns buf. */
const char *cwi_comp_spec_label(const cwi_spec *s, uint32_t i, char *buf,
    size_t len);

/* Parses a spec's text, as cwi_spec_print writes it ("i64[]", "(i64[],
 * bytes[-1])", "{image: u8[-1,-1,3], label: i64[]}", "?" for unknown;
 * '?' also stands for an unknown dimension, "[?]" for an unknown rank).
 * NULL text is unknown. CACHEW_EINVAL with a reason naming the column in
 * err; out is then empty. */
cachew_err cwi_spec_parse(const char *text, cwi_spec *out, char *err,
    size_t errlen);

/* Cardinality: a count, CACHEW_CARDINALITY_INFINITE or _UNKNOWN. */
int64_t cwi_card_add(int64_t a, int64_t b);
int64_t cwi_card_mul(int64_t a, int64_t k);
void cwi_card_print(cwi_strbuf *sb, int64_t card);

/* Sets node->spec and node->card from its op's infer rule (or the default
 * one), after its params are bound and validated; refusals are
 * CACHEW_EINVAL naming the operator. A rule reads no element; cache_get's
 * reads its cache's manifest, bounded (cwi_cache_peek: one short attempt,
 * never a FIFO), and takes a failure as "not known". */
cachew_err cwi_node_infer(cwi_node *node);
/* Rules operators share: the input's spec and cardinality; the input's
 * spec with an unknown cardinality. */
cachew_err cwi_infer_passthrough(cwi_node *node);
cachew_err cwi_infer_same_spec(cwi_node *node);
/* map, filter, flat_map and interleave: the function's rule over the
 * input's spec (unknown without one); map keeps the input's cardinality,
 * the others do not know theirs. */
cachew_err cwi_infer_map(cwi_node *node);
cachew_err cwi_infer_filter(cwi_node *node);
cachew_err cwi_infer_flat(cwi_node *node);
/* Bytes scalars of a count not known (the file sources). */
cachew_err cwi_infer_bytes_scalar(cwi_node *node);
/* s = one unnamed component of dtype and rank 0. */
cachew_err cwi_spec_scalar(cwi_spec *s, cachew_dtype dtype);

/* ---- parameter specifications ------------------------------------------ */

typedef enum cwi_ptype {
	CWI_P_INT,   /* integer; with CWI_PF_AUTO also `auto` -> CACHEW_AUTO */
	CWI_P_FLOAT, /* number (an int is stored as a float) */
	CWI_P_BOOL,
	CWI_P_STR,   /* string or identifier */
	CWI_P_STRS,  /* string or list of strings (file lists, globs) */
	CWI_P_LIST,  /* any list */
	CWI_P_ANY,   /* any value (literals of from_tensors) */
	CWI_P_FLOATS /* a number, a list of numbers or a map of numbers by
		      * name (ints stored as floats); default def_float */
} cwi_ptype;

#define CWI_PF_REQUIRED 0x1u /* no default: must be given */
#define CWI_PF_PERF 0x2u     /* only affects speed: not fingerprinted */
#define CWI_PF_AUTO 0x4u     /* CWI_P_INT that also accepts `auto` */
#define CWI_PF_OPTIONAL 0x8u /* may be absent (no default, stays absent) */

typedef struct cwi_param_spec {
	const char *name;
	cwi_ptype type;
	unsigned flags;
	/* Default when absent (unless REQUIRED or OPTIONAL). */
	int64_t def_int;
	double def_float;
	const char *def_str;
	/* CWI_P_INT range check when min < max (CACHEW_AUTO is exempt). */
	int64_t min, max;
	const char *help;
} cwi_param_spec;

/* ---- dataset operators --------------------------------------------------- */

#define CWI_OPF_SOURCE 0x1u      /* no upstream; inputs only via args */
#define CWI_OPF_PASSTHROUGH 0x2u /* never changes data: fp = input's fp */
#define CWI_OPF_RANDOM 0x4u      /* output depends on a seed */
#define CWI_OPF_FN_MAP 0x10u     /* takes fn= a map function */
#define CWI_OPF_FN_FILTER 0x20u  /* takes fn= a filter function */
#define CWI_OPF_FN_FLAT 0x40u    /* takes fn= a flat_map function */
#define CWI_OPF_FILES 0x80u      /* param "files" lists input files */
#define CWI_OPF_SPLITTABLE 0x100u
#define CWI_OPF_ASYNC 0x200u     /* works on its own threads: time its
				  * consumer spends in next() is wait */
#define CWI_OPF_FP_PARAM 0x400u  /* fp and seed_fp = the param
				  * "fingerprint" (32 hex digits): the node
				  * yields what that pipeline did */

#define CWI_OPF_FN_SOURCE 0x800u /* takes fn= a user source (user_source) */

#define CWI_OPF_FN_ANY \
	(CWI_OPF_FN_MAP | CWI_OPF_FN_FILTER | CWI_OPF_FN_FLAT | CWI_OPF_FN_SOURCE)
#define CWI_MAX_POSITIONAL 4
#define CWI_MAX_INPUTS 64

typedef struct cwi_dataset_op {
	const char *name;
	const char *doc; /* one line: what it does */
	const cwi_param_spec *params;
	size_t nparams;
	/* positional[k]: the names that k positional values fill, or NULL for
	 * "the first k params in spec order". positional[0] is unused. */
	const char *const *positional[CWI_MAX_POSITIONAL + 1];
	/* Dataset inputs, counting the upstream stage of a pipeline. */
	unsigned min_inputs, max_inputs;
	unsigned flags;
	/* Map aliases: `read_file` is map(fn=read_file). The builder rewrites
	 * the stage to a map node, so the alias never appears in a graph. */
	const char *map_alias;
	/* Optional checks beyond the spec (cross-parameter rules); may
	 * normalise node->params. Errors through cwi_fail. */
	cachew_err (*validate)(cwi_node *node);
	/* Creates the node's iterator. `out` must embed struct cwi_iter
	 * first; cwi_iter_create fills the common fields after this. */
	cachew_err (*iter_create)(
	    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args);
	/* Splittable sources (CWI_OPF_SPLITTABLE): the number of split units
	 * of the node's input -- elements of range/from_list/from_tensors,
	 * files of the file sources, chunks of cache_get. A split is a
	 * contiguous range of units; when the pipeline names this node as its
	 * split source (cwi_pipeline.split_node), the iterator reads only the
	 * pipeline's unit ranges, in the order given. */
	cachew_err (*split_units)(const cwi_node *node, uint64_t *units);
	/* What a saved position of its iterator holds (cachew_iterator_save),
	 * one sentence for docs/operators.md; NULL for a map alias, which has
	 * no iterator of its own. */
	const char *saves;
	/* Sets node->spec and node->card from the inputs' and the params
	 * (graph_spec.c), refusing inputs it cannot take. NULL: the input's
	 * for CWI_OPF_PASSTHROUGH, unknown otherwise. */
	cachew_err (*infer)(cwi_node *node);
	/* Optional: a paragraph for docs/operators.md after doc, for what
	 * a reader of tf.data would not expect (a design choice, a
	 * difference). */
	const char *note;
} cwi_dataset_op;

/* ---- function operators ------------------------------------------------- */

/* A loaded plugin's identity (cachew_plugin_info, and the hash of its
 * file): part of the fingerprint of every node using one of its functions
 * and of the graph document, so that two builds never share a cache and
 * a worker runs only the build a graph was made with. Never freed. */
typedef struct cwi_plugin {
	char name[64];
	char version[64]; /* "" when the plugin does not say */
	cachew_fingerprint hash; /* XXH3-128 of the file's bytes */
	char hash_hex[33];       /* the same, as 32 hex digits */
	char *path;              /* realpath of the file, for messages */
} cwi_plugin;

/* Random access into the sequences of a built-in file function (the
 * tfrecord and record-file functions), for resumable iteration: tell gives
 * an open sequence's position (the byte offset of its next element), seek
 * moves a sequence just opened to a position tell gave. seek may return
 * CACHEW_ENOTSUP (a gzip file): the caller then reads past the elements
 * instead. */
typedef struct cwi_seq_resume {
	uint64_t (*tell)(void *seq);
	cachew_err (*seek)(void *seq, uint64_t pos, char *err, size_t errlen);
} cwi_seq_resume;

/* A built-in map function's typing rule: the spec of its output for an
 * input spec `in` (node is the map node, for its fn_params), or a refusal
 * (CACHEW_EINVAL) naming the component it cannot take. */
typedef cachew_err (*cwi_fn_spec_rule)(
    const cwi_node *node, const cwi_spec *in, cwi_spec *out);

/* The kind of a user source's cwi_fn (cachew_source_register): after
 * cachew_op_kind's values, never one of a cachew_op_def. */
#define CWI_FN_SOURCE 4

typedef struct cwi_fn {
	cachew_op_def def; /* def.name points at name below; a source's
			    * kind is CWI_FN_SOURCE, its init and fini
			    * are the source's */
	char name[64];
	bool builtin;
	const cwi_plugin *plugin; /* the plugin that registered it, or NULL
				   * (built in, or registered from C) */
	const cwi_seq_resume *resume; /* a built-in flat function's, or NULL */
	cwi_fn_spec_rule spec;        /* a built-in map function's, or NULL */
	/* CWI_FN_SOURCE: the definition (doc and name pointing at this
	 * entry's copies) and the element spec it declared. */
	cachew_source_def source;
	cwi_spec source_spec;
} cwi_fn;

/* What identifies a user function (one that is not built in) across
 * processes: its name and, for a plugin's, the plugin's identity. Two
 * processes run the same function when their idents are equal. */
typedef struct cwi_fn_ident {
	char name[64];
	char plugin[64];  /* "": not from a plugin (registered from C) */
	char version[64]; /* the plugin's; "" when it does not say */
	char hash[33];    /* the plugin file's XXH3-128, 32 hex digits */
} cwi_fn_ident;

/* 1 to 63 characters of [A-Za-z0-9_.+-] (or none, with `empty`): what a
 * plugin's name and version may hold. */
bool cwi_plugin_text_ok(const char *s, bool empty);
/* fn's ident (the plugin fields empty for a function of no plugin). */
void cwi_fn_ident_of(const cwi_fn *fn, cwi_fn_ident *out);
bool cwi_fn_ident_equal(const cwi_fn_ident *a, const cwi_fn_ident *b);
/* "'square' of plugin plugin_example 1.0 (build 0123456789abcdef)", or
 * "'f' (registered from C, of no plugin)", or without a version "... of
 * plugin p (no version) (build ...)": for messages. Returns buf. */
const char *cwi_fn_ident_describe(const cwi_fn_ident *f, char *buf,
    size_t len);
/* The user functions of this process's registry (not the built-in ones),
 * in registration order: *out (free()) holds *n. CACHEW_ENOMEM. */
cachew_err cwi_registry_user_fns(cwi_fn_ident **out, size_t *n);

/* ---- nodes --------------------------------------------------------------- */

struct cachew_dataset {
	atomic_uint refs;
	const cwi_dataset_op *op;
	cachew_params params;   /* canonical; includes fn and fn_params */
	const cwi_fn *fn;       /* resolved params["fn"], or NULL */
	void *fn_state;         /* fn->def.init result, shared read-only */
	cachew_params *fn_params; /* view of params["fn_params"] (or empty) */
	size_t ninputs;
	cwi_node **inputs;
	/* Read through cwi_node_fp(): set when the node is built, or on
	 * first use when it needs a bucket listing (fp_state). */
	cachew_fingerprint fp_value;
	atomic_int fp_state;
	/* The structure alone, without the identity (size, mtime, ETag) of
	 * input files: what seeds derive from, so touching or copying a file
	 * does not change a seeded shuffle's order or an augmentation. */
	cachew_fingerprint seed_fp;
	char *detail; /* "add" for map(add): for stats and explain */
	cwi_spec spec; /* what its elements hold (graph_spec.c) */
	int64_t card;  /* elements per epoch, or CACHEW_CARDINALITY_* */
	/* The one mutable part of a built node: state its operator keeps
	 * across the node's iterators (the in-memory cache's elements),
	 * set once under the operator's own lock and freed with the node
	 * by op_state_free. NULL when the operator keeps none. */
	_Atomic(void *) op_state;
	void (*op_state_free)(void *state);
};

/* Typed accessors of canonical params (values are present and typed after
 * building, so these cannot fail for declared parameters). */
int64_t cwi_node_int(const cwi_node *n, const char *key);
double cwi_node_float(const cwi_node *n, const char *key);
bool cwi_node_bool(const cwi_node *n, const char *key);
const char *cwi_node_str(const cwi_node *n, const char *key);
const cwi_value *cwi_node_value(const cwi_node *n, const char *key);

/* The node's fingerprint (docs/graph-format.md, section 5), valid as long
 * as the node. Building a node computes it, except where the node or one
 * upstream of it reads s3:// or gs:// globs: listing the bucket for the
 * objects' identity is network I/O of any length (pages, retries), which
 * building never waits for (cache_get's one bounded manifest read is the
 * only I/O of a build), so the first call lists it (and may then block
 * for as long as that takes).
 * Cannot fail: a listing that fails hashes the pattern's text instead.
 * Thread-safe. */
const cachew_fingerprint *cwi_node_fp(const cwi_node *n);

/* Builds a node: looks up `op` (expanding map aliases), binds positional
 * values (list `pos`, may be NULL) and named ones (map `named`, may be NULL;
 * the key "fn_params" may hold a map of function params), checks and
 * canonicalises them, resolves fn, validates and fingerprints. Unknown keys
 * of an fn-taking op go to fn_params. Takes new references on inputs. */
cachew_err cwi_node_build(cwi_node **out, const char *op,
    cwi_node *const *inputs, size_t ninputs, const cwi_value *pos,
    const cwi_value *named);

/* ---- registry ------------------------------------------------------------ */

/* The registry knows no operator until cwi_registry_init gives it the
 * built-in tables, which live in the modules above it (the list of them is
 * src/pipeline/pipeline_builtins.c's). Every public call that names an
 * operator passes through src/pipeline, which makes sure of that first
 * (cwi_builtins_ready); code below it only looks up names of nodes built
 * that way. Before that, lookups find nothing. */
typedef struct cwi_fn_resume {
	const cachew_op_def *def;
	const cwi_seq_resume *resume;
} cwi_fn_resume;

typedef struct cwi_fn_spec {
	const char *name; /* a built-in function's */
	cwi_fn_spec_rule rule;
} cwi_fn_spec;

typedef struct cwi_builtins {
	/* NULL-terminated tables of dataset operators and of functions */
	const cwi_dataset_op *const *const *op_tables;
	size_t nop_tables;
	const cachew_op_def *const *const *fn_tables;
	size_t nfn_tables;
	/* The built-in functions whose sequences can seek (cwi_fn.resume) */
	const cwi_fn_resume *resumes;
	size_t nresumes;
	/* The built-in functions' typing rules (cwi_fn.spec), ending with
	 * a NULL name */
	const cwi_fn_spec *specs;
} cwi_builtins;

/* Fills the registry with b's tables, once per process (later calls do
 * nothing); b must live as long as the process. Thread safe. */
void cwi_registry_init(const cwi_builtins *b);
const cwi_dataset_op *cwi_dataset_op_lookup(const char *name);
size_t cwi_dataset_op_count(void);
const cwi_dataset_op *cwi_dataset_op_at(size_t i);
const cwi_fn *cwi_fn_lookup(const char *name);
size_t cwi_fn_count(void);
const cwi_fn *cwi_fn_at(size_t i);
/* cachew_op_register and cachew_plugin_load (cachew.h), once the registry
 * has its built-ins. */
cachew_err cwi_registry_register(const cachew_op_def *def);
cachew_err cwi_registry_register_source(const cachew_source_def *def);
cachew_err cwi_registry_plugin_load(const char *path);

/* ---- parsing, printing, serialisation (graph_parse.c etc.) --------------- */

/* Parses a literal value ("[1, 2]", "\"a\"", "(1, 2.5)") in pipeline-string
 * syntax into *out. */
cachew_err cwi_value_parse(cwi_value *out, const char *text);
/* Canonical pipeline string of a node and its inputs. */
cachew_err cwi_node_to_string(const cwi_node *n, cwi_strbuf *sb);

/* ---- files --------------------------------------------------------------- */

/* Expands each pattern (a plain path, a glob or a URL, kept as is) into
 * paths, in pattern order; a glob's matches come sorted. A pattern that
 * matches nothing is CACHEW_ENOENT naming it. The
 * result is a NULL-terminated array of strings; free with cwi_paths_free. */
cachew_err cwi_paths_expand(
    const char *const *patterns, size_t npatterns, char ***out, size_t *n);
void cwi_paths_free(char **paths);

#endif /* CWI_GRAPH_H */
