/*
 * cachew.h - ML input-data processing as a library and as a service.
 *
 * This is the only public header of libcachew. Every fallible call returns a
 * cachew_err (CACHEW_OK == 0) and passes results through out parameters.
 * Handles follow one life cycle: cachew_X_create(&x, ...), use, then
 * cachew_X_destroy(x) (or _release for refcounted handles); destroying or
 * releasing NULL is a no-op.
 *
 * Functions that have no object to carry an error detail (the parser, the
 * registry, constructors) record it per thread: cachew_errmsg() returns it.
 */
#ifndef CACHEW_H
#define CACHEW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CACHEW_API __attribute__((visibility("default")))
#define CACHEW_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CACHEW_API
#define CACHEW_PRINTF(f, a)
#endif

/* Marks a deprecated name: it keeps working (and stays exported, so
 * programs linked against it keep running), and the compiler points to its
 * replacement. Define CACHEW_NO_DEPRECATION_WARNINGS before including this
 * header to silence the warnings. */
#if defined(__GNUC__) && !defined(CACHEW_NO_DEPRECATION_WARNINGS)
#define CACHEW_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define CACHEW_DEPRECATED(msg)
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define CACHEW_VERSION_MAJOR 0
#define CACHEW_VERSION_MINOR 1
#define CACHEW_VERSION_PATCH 0
#define CACHEW_VERSION_NUMBER                                                 \
	(CACHEW_VERSION_MAJOR * 10000 + CACHEW_VERSION_MINOR * 100 +          \
	    CACHEW_VERSION_PATCH)
#define CACHEW_VERSION_STRING "0.1.0"

/* The version of the library actually linked, as "MAJOR.MINOR.PATCH" and as
 * CACHEW_VERSION_NUMBER would compute it. Thread safe. Since 0.1. */
CACHEW_API const char *cachew_version(void);
CACHEW_API unsigned cachew_version_number(void);

/* ------------------------------------------------------------------------ */
/* Errors and logging                                                       */
/* ------------------------------------------------------------------------ */

/* Error codes. The values are part of the ABI and of the wire protocol:
 * they travel in error frames and `error` messages (docs/protocol.md,
 * "Error codes"), so every enumerator is pinned. The list is append-only:
 * a new code takes the next free number, and a number is never reused or
 * renumbered, even if its code is retired. A caller should treat a value it
 * does not know as a failure (cachew_strerror() names it "unknown error").
 * Since 0.1. */
typedef enum cachew_err {
	CACHEW_OK = 0,
	CACHEW_EOF = 1,        /* end of sequence: not a failure */
	CACHEW_EINVAL = 2,     /* invalid argument, parameter or option */
	CACHEW_ENOMEM = 3,     /* out of memory, or over a memory limit */
	CACHEW_ERANGE = 4,     /* a value is outside its allowed range */
	CACHEW_ENOENT = 5,     /* no such operator, option, file or symbol */
	CACHEW_EPARSE = 6,     /* bad pipeline string or serialized graph */
	CACHEW_ETYPE = 7,      /* dtype or shape mismatch */
	CACHEW_EIO = 8,        /* an I/O operation failed */
	CACHEW_ECORRUPT = 9,   /* input data is corrupt */
	CACHEW_EOP = 10,       /* an operator failed (see the errmsg) */
	CACHEW_ECANCELED = 11, /* the operation was canceled */
	CACHEW_ETIMEDOUT = 12, /* a deadline passed */
	CACHEW_ECLOSED = 13,   /* the object or connection is closed */
	CACHEW_EEXIST = 14,    /* the name is already taken */
	CACHEW_ENOTSUP = 15,   /* not supported by this build or object */
	CACHEW_EPROTO = 16,    /* a peer violated the protocol */
	CACHEW_EINTERNAL = 17  /* an internal invariant failed: a bug */
	/* Next free value: 18. */
} cachew_err;

/* A static, human readable description of an error code. Never NULL. */
CACHEW_API const char *cachew_strerror(cachew_err err);

/* The detail of the last failure of a call made by this thread that has no
 * object of its own to hold it (parsers, constructors, the registry). The
 * string is owned by the library and valid until this thread's next cachew
 * call. Empty, never NULL, when there is no detail. Since 0.1. */
CACHEW_API const char *cachew_errmsg(void);

typedef enum cachew_log_level {
	CACHEW_LOG_ERROR = 0,
	CACHEW_LOG_WARN = 1,
	CACHEW_LOG_INFO = 2,
	CACHEW_LOG_DEBUG = 3
} cachew_log_level;

/* A log sink. `module` is a short static name ("exec", "graph"); `msg` is
 * one line without a trailing newline, valid only during the call. Sinks may
 * be called from any library thread and must be thread safe; they must not
 * call back into cachew. */
typedef void (*cachew_log_fn)(
    void *ctx, cachew_log_level level, const char *module, const char *msg);

/* Installs a log sink that receives messages at `max_level` and below. The
 * library is silent until a sink is installed; fn == NULL silences it again.
 * cachew_log_stderr is a ready-made sink that writes to standard error.
 * Thread safe, but messages racing with the change may reach the old sink. */
CACHEW_API void cachew_log_set(
    cachew_log_fn fn, void *ctx, cachew_log_level max_level);
CACHEW_API void cachew_log_stderr(
    void *ctx, cachew_log_level level, const char *module, const char *msg);

/* Frees memory the library returned to the caller (serialized graphs,
 * strings). NULL is a no-op. */
CACHEW_API void cachew_free(void *p);

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

/* Iterator and service options. One table drives these setters, the CLI
 * flags and the environment; `cachew run --help-options` prints it.
 *   threads        int   CPU budget in threads; 0 = online CPUs (default 0)
 *   ram_budget     int   bytes the executor's buffers may hold; 0 = half of
 *                        available memory (default 0)
 *   seed           int   pipeline seed; -1 = a fresh random seed (default -1)
 *   deterministic  bool  keep element order under parallelism (default true)
 *   autotune       bool  tune parallel=auto and prefetch(auto) online
 *                        (default true)
 *   epoch          int   epoch number handed to shuffle(reshuffle=true)
 *                        (default 0)
 *   service        str   where the pipeline runs: a dispatcher address
 *                        (tcp://host:port, ipc://path); "embedded" (a
 *                        dispatcher and a worker in this process, run
 *                        inline), "embedded:N" (N worker threads);
 *                        "local" (the plain executor alone). Empty (the
 *                        default) = CACHEW_SERVICE if set, else embedded,
 *                        falling back to local for a pipeline the service
 *                        cannot split or that holds a cache operator
 * Service options (used when a dispatcher is named):
 *   job_name          str  clients naming the same job share it (default
 *                          "": a private job)
 *   processing_mode   str  distributed_epoch | parallel_epochs
 *   num_consumers     int  coordinated reads in lock-step rounds (0: off)
 *   consumer_index    int  this client's index among num_consumers
 *   workers           int  workers for the job; 0 = the dispatcher decides
 *   compression       str  none | zstd | auto
 *   client_buffer     int  bytes of elements buffered ahead (64 MiB)
 *   service_timeout_ms int how long a service call may take (30000)
 * Unknown names are CACHEW_ENOENT, values of the wrong type CACHEW_ETYPE and
 * out-of-range values CACHEW_ERANGE, each with a cachew_options_errmsg().
 * One thread at a time; an options object is copied when an iterator is
 * created and may be destroyed right after. */
typedef struct cachew_options cachew_options;

CACHEW_API cachew_err cachew_options_create(cachew_options **out);
CACHEW_API void cachew_options_destroy(cachew_options *opts);
CACHEW_API cachew_err cachew_options_set_int(
    cachew_options *opts, const char *name, int64_t value);
CACHEW_API cachew_err cachew_options_set_bool(
    cachew_options *opts, const char *name, int value);
CACHEW_API cachew_err cachew_options_set_str(
    cachew_options *opts, const char *name, const char *value);
/* Sets an option from text ("4", "true", "tcp://h:7070"), converting by the
 * option's type: what flags, environment and config files use. */
CACHEW_API cachew_err cachew_options_set(
    cachew_options *opts, const char *name, const char *text);
CACHEW_API cachew_err cachew_options_get_int(
    const cachew_options *opts, const char *name, int64_t *out);
CACHEW_API cachew_err cachew_options_get_bool(
    const cachew_options *opts, const char *name, int *out);
/* The returned string is owned by opts and valid until the option changes. */
CACHEW_API cachew_err cachew_options_get_str(
    const cachew_options *opts, const char *name, const char **out);
CACHEW_API const char *cachew_options_errmsg(const cachew_options *opts);

/* Describes option i of the table (0-based) for help output; returns
 * CACHEW_ENOENT past the end. The strings are static. */
CACHEW_API cachew_err cachew_option_info(size_t i, const char **name,
    const char **type, const char **default_text, const char **help);

/* ------------------------------------------------------------------------ */
/* Tensors and elements                                                     */
/* ------------------------------------------------------------------------ */

typedef enum cachew_dtype {
	CACHEW_INVALID = 0,
	CACHEW_U8 = 1,
	CACHEW_I32 = 2,
	CACHEW_I64 = 3,
	CACHEW_F16 = 4,
	CACHEW_BF16 = 5,
	CACHEW_F32 = 6,
	CACHEW_F64 = 7,
	CACHEW_BOOL = 8,  /* one byte, 0 or 1 */
	CACHEW_BYTES = 9  /* variable-length byte strings */
} cachew_dtype;

#define CACHEW_MAX_RANK 8
#define CACHEW_MAX_COMPONENTS 64

/* "u8", "i32", ... "bytes"; NULL for an invalid dtype. */
CACHEW_API const char *cachew_dtype_name(cachew_dtype dtype);
/* Bytes per value; 0 for CACHEW_BYTES and invalid dtypes. */
CACHEW_API size_t cachew_dtype_size(cachew_dtype dtype);
CACHEW_API cachew_err cachew_dtype_from_name(
    const char *name, cachew_dtype *out);

/* A tensor: a dtype, a shape (rank <= 8) and a view of a refcounted,
 * immutable buffer. Fixed-width tensors are dense, row-major. BYTES tensors
 * hold numel variable-length strings (Arrow-style offsets + data).
 * Tensors are values: retaining one shares its buffer and never copies data.
 * A tensor handle is used by one thread at a time; the buffers it shares are
 * immutable and may be read from any thread. */
typedef struct cachew_tensor cachew_tensor;

CACHEW_API cachew_dtype cachew_tensor_dtype(const cachew_tensor *t);
CACHEW_API unsigned cachew_tensor_rank(const cachew_tensor *t);
/* The shape, `rank` entries, borrowed from t. */
CACHEW_API const int64_t *cachew_tensor_shape(const cachew_tensor *t);
CACHEW_API int64_t cachew_tensor_numel(const cachew_tensor *t);
/* Fixed-width: numel * dtype size. BYTES: the total length of the strings. */
CACHEW_API size_t cachew_tensor_nbytes(const cachew_tensor *t);
/* Fixed-width: the values, borrowed, valid while t (or the element holding
 * it) lives. BYTES: the start of the string data (use _bytes_at). */
CACHEW_API const void *cachew_tensor_data(const cachew_tensor *t);
/* String i (flat, row-major index) of a BYTES tensor, borrowed. */
CACHEW_API cachew_err cachew_tensor_bytes_at(
    const cachew_tensor *t, int64_t i, const void **data, size_t *len);

/* Creates a fixed-width tensor over a new zeroed buffer and returns a
 * writable pointer to it in *data. The pointer may be written until the
 * tensor is first shared (retained, sliced or put into an element). */
CACHEW_API cachew_err cachew_tensor_create(cachew_tensor **out,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void **data);
/* Wraps caller memory without copying. On success the tensor owns `data` and
 * calls free_fn(ctx, data) once the last view is gone (free_fn may be NULL
 * for static memory); on failure the caller still owns it. nbytes must equal
 * numel * dtype size. */
CACHEW_API cachew_err cachew_tensor_wrap(cachew_tensor **out,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void *data,
    size_t nbytes, void (*free_fn)(void *ctx, void *data), void *ctx);
/* Creates a BYTES tensor of the given shape from numel strings (copied). */
CACHEW_API cachew_err cachew_tensor_create_bytes(cachew_tensor **out,
    unsigned rank, const int64_t *shape, const void *const *items,
    const size_t *lens);
/* Creates a rank-0 tensor holding one value of a fixed-width dtype, read
 * from `value` (dtype size bytes). */
CACHEW_API cachew_err cachew_tensor_create_scalar(
    cachew_tensor **out, cachew_dtype dtype, const void *value);
/* A zero-copy view of rows [start, start + count) along dimension 0. */
CACHEW_API cachew_err cachew_tensor_slice(cachew_tensor **out,
    const cachew_tensor *t, int64_t start, int64_t count);
/* Takes another reference to t's buffer as a new handle in *out: the
 * values are shared, not copied (a tensor of at most 16 bytes keeps its
 * values in the handle, and they come along). Unlike
 * cachew_element_retain, the reference is a second handle: release each
 * handle once with cachew_tensor_release(). CACHEW_ENOMEM if the handle
 * cannot be allocated (*out untouched). t is only read, and after this
 * call neither handle's values may be written. The new handle may be
 * passed to another thread. Since 0.1 (formerly cachew_tensor_copy). */
CACHEW_API cachew_err cachew_tensor_retain(
    cachew_tensor **out, const cachew_tensor *t);
/* Frees the handle t and drops its reference to the buffer, which is freed
 * (or handed to cachew_tensor_wrap's free_fn) when its last view, in a
 * handle or an element, is gone. NULL is a no-op. Tensors share
 * refcounted buffers, so they are released like elements and datasets.
 * Since 0.1 (formerly cachew_tensor_destroy). */
CACHEW_API void cachew_tensor_release(cachew_tensor *t);
/* Deprecated: the former name of cachew_tensor_retain, which it calls. It
 * never copied the values, despite its name. Kept, and exported, so
 * existing programs and plugins build and run. */
CACHEW_API CACHEW_DEPRECATED("use cachew_tensor_retain: it shares the buffer")
cachew_err cachew_tensor_copy(cachew_tensor **out, const cachew_tensor *t);
/* Deprecated: the former name of cachew_tensor_release, which it calls.
 * Kept, and exported, so existing programs and plugins build and run. */
CACHEW_API CACHEW_DEPRECATED("use cachew_tensor_release")
void cachew_tensor_destroy(cachew_tensor *t);

/* An element: an ordered tuple of 1..64 tensors (its components), the unit
 * a pipeline yields. Refcounted; an element is immutable once shared
 * (refcount > 1). Handles may be passed between threads; one thread at a
 * time may modify an unshared element. */
typedef struct cachew_element cachew_element;

/* Creates an element of n components, each an empty rank-0 I64 zero until
 * set. The caller holds one reference. */
CACHEW_API cachew_err cachew_element_create(cachew_element **out, size_t n);
CACHEW_API size_t cachew_element_size(const cachew_element *e);
/* Component i, borrowed: valid while the caller holds its reference to e. */
CACHEW_API const cachew_tensor *cachew_element_component(
    const cachew_element *e, size_t i);
/* Sets component i to share t's buffer (t is not consumed). e must be
 * unshared. */
CACHEW_API cachew_err cachew_element_set(
    cachew_element *e, size_t i, const cachew_tensor *t);
/* Sets component i to a view of rows [start, start+count) of t. */
CACHEW_API cachew_err cachew_element_set_slice(cachew_element *e, size_t i,
    const cachew_tensor *t, int64_t start, int64_t count);
/* Sets component i to a new zeroed fixed-width tensor and returns a writable
 * pointer to its values (valid while e is unshared). */
CACHEW_API cachew_err cachew_element_alloc(cachew_element *e, size_t i,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void **data);
/* Makes component i's values writable in place and returns them: copies the
 * buffer first unless e and the buffer are exclusively owned. Not for BYTES. */
CACHEW_API cachew_err cachew_element_mutable_data(
    cachew_element *e, size_t i, void **data);
CACHEW_API cachew_element *cachew_element_retain(cachew_element *e);
CACHEW_API void cachew_element_release(cachew_element *e);
/* A 64-bit hash (XXH3) of the element's canonical bytes: per component the
 * dtype, rank, shape and values (BYTES: each string's length and bytes), so
 * equal elements hash equally however their buffers are laid out. Summing
 * the hashes modulo 2^64 gives an order-independent digest of a multiset
 * of elements (`cachew run --json` reports it as "digest"). Safe from any
 * thread. Since 0.1. */
CACHEW_API uint64_t cachew_element_hash(const cachew_element *e);

/* ------------------------------------------------------------------------ */
/* Operator parameters                                                      */
/* ------------------------------------------------------------------------ */

/* A set of named parameter values (int, float, bool, string, lists), the
 * msgpack map of a graph node. One thread at a time. */
typedef struct cachew_params cachew_params;

CACHEW_API cachew_err cachew_params_create(cachew_params **out);
/* Parses "value=1, size=[224, 224], mode=bilinear". */
CACHEW_API cachew_err cachew_params_parse(
    cachew_params **out, const char *text);
CACHEW_API void cachew_params_destroy(cachew_params *p);
CACHEW_API cachew_err cachew_params_set_int(
    cachew_params *p, const char *key, int64_t v);
CACHEW_API cachew_err cachew_params_set_double(
    cachew_params *p, const char *key, double v);
CACHEW_API cachew_err cachew_params_set_bool(
    cachew_params *p, const char *key, int v);
CACHEW_API cachew_err cachew_params_set_str(
    cachew_params *p, const char *key, const char *v);
CACHEW_API cachew_err cachew_params_set_int_list(
    cachew_params *p, const char *key, const int64_t *v, size_t n);
CACHEW_API cachew_err cachew_params_set_double_list(
    cachew_params *p, const char *key, const double *v, size_t n);
CACHEW_API int cachew_params_has(const cachew_params *p, const char *key);
/* Getters return CACHEW_ENOENT when the key is absent (leaving *out alone)
 * and CACHEW_ETYPE when the value has another type. Ints convert to double;
 * a double converts to int only when it is integral. Strings are borrowed
 * from p. List getters copy up to cap values and report the full length. */
CACHEW_API cachew_err cachew_params_get_int(
    const cachew_params *p, const char *key, int64_t *out);
CACHEW_API cachew_err cachew_params_get_double(
    const cachew_params *p, const char *key, double *out);
CACHEW_API cachew_err cachew_params_get_bool(
    const cachew_params *p, const char *key, int *out);
CACHEW_API cachew_err cachew_params_get_str(
    const cachew_params *p, const char *key, const char **out);
CACHEW_API cachew_err cachew_params_get_int_list(const cachew_params *p,
    const char *key, int64_t *out, size_t cap, size_t *n);
CACHEW_API cachew_err cachew_params_get_double_list(const cachew_params *p,
    const char *key, double *out, size_t cap, size_t *n);
/* The number of keys and key i (in sorted order), borrowed from p. */
CACHEW_API size_t cachew_params_count(const cachew_params *p);
CACHEW_API const char *cachew_params_key(const cachew_params *p, size_t i);

/* ------------------------------------------------------------------------ */
/* Operator registry: user functions for map, filter and flat_map            */
/* ------------------------------------------------------------------------ */

typedef enum cachew_op_kind {
	CACHEW_OP_MAP = 1,     /* one element in, one element out */
	CACHEW_OP_FILTER = 2,  /* one element in, keep or drop */
	CACHEW_OP_FLAT_MAP = 3 /* one element in, a sequence out */
} cachew_op_kind;

/* Property flags. */
#define CACHEW_OP_RANDOM 0x1u /* uses cachew_op_ctx randomness */

/* The per-call context of an operator function: its state, its
 * per-element random stream and its error slot. Valid during the call. */
typedef struct cachew_op_ctx cachew_op_ctx;

/* The state returned by the op's init, shared read-only by all threads. */
CACHEW_API void *cachew_op_ctx_state(cachew_op_ctx *ctx);
/* A 64-bit seed derived from (pipeline seed, node, element index): the same
 * element gets the same seed in every run with the same pipeline seed, at
 * any parallelism. */
CACHEW_API uint64_t cachew_op_ctx_seed(cachew_op_ctx *ctx);
/* The next value of a random stream started from cachew_op_ctx_seed. */
CACHEW_API uint64_t cachew_op_ctx_random(cachew_op_ctx *ctx);
/* Records why the call failed; the iterator reports it as its errmsg,
 * prefixed with the operator name. Returns CACHEW_EOP for convenience. */
CACHEW_API cachew_err cachew_op_ctx_fail(cachew_op_ctx *ctx, const char *fmt,
    ...) CACHEW_PRINTF(2, 3);

/* Map: takes ownership of `in` and stores the result in *out (which may be
 * `in` itself, modified in place when unshared). On failure the function
 * releases `in` and stores nothing. */
typedef cachew_err (*cachew_map_fn)(
    cachew_op_ctx *ctx, cachew_element *in, cachew_element **out);
/* Filter: sets *keep to 1 to keep the element; `in` stays the caller's. */
typedef cachew_err (*cachew_filter_fn)(
    cachew_op_ctx *ctx, const cachew_element *in, int *keep);

/* The layout version of cachew_op_def this header declares. A definition
 * states the version it was written for in its first field, as SQLite's
 * extension structs do with iVersion, so the library knows which fields it
 * may read: a definition from an older version registers and the fields
 * added after its version read as absent; a newer or unknown version is
 * refused. Versions only grow, fields are only appended, and `version` and
 * `name` keep their place in every version.
 *   1  version, name, kind, flags, cost_ns, init, fini, map, filter,
 *      flat_open, flat_next, flat_close
 *   2  adds doc
 * Since 0.1. */
#define CACHEW_OP_DEF_VERSION 2

/* A function operator's definition: what a plugin or a C program fills in
 * (designated initialisers, `.version = CACHEW_OP_DEF_VERSION` first) and
 * hands to cachew_op_register(), which copies the struct and the name. The
 * doc string, the functions and the code behind them must stay valid for
 * the life of the process (plugins are never unloaded). init runs on the
 * thread that builds a dataset naming the operator, fini on the thread that
 * releases that dataset's last reference; map, filter and flat_open may run
 * on several executor threads at once (parallel map, interleave), sharing
 * init's state read-only, so they must be thread safe; one sequence's
 * flat_next and flat_close are called by one thread at a time. The struct
 * itself is read only during cachew_op_register(). */
typedef struct cachew_op_def {
	/* CACHEW_OP_DEF_VERSION of the header the definition was written
	 * against. 0 (unset) is refused. Version 1 and later. */
	unsigned version;
	const char *name; /* [a-z_][a-z0-9_]*, at most 63 characters */
	cachew_op_kind kind;
	unsigned flags;   /* CACHEW_OP_* */
	double cost_ns;   /* expected ns per element; 0 = unknown */
	/* Optional: validates params and builds the state shared by all
	 * calls. Reject unknown keys so typos surface when the pipeline is
	 * built. Writes a reason into err (errlen bytes) on failure. */
	cachew_err (*init)(const cachew_params *params, void **state,
	    char *err, size_t errlen);
	void (*fini)(void *state);
	cachew_map_fn map;       /* CACHEW_OP_MAP */
	cachew_filter_fn filter; /* CACHEW_OP_FILTER */
	/* CACHEW_OP_FLAT_MAP: open a sequence for one input element, yield
	 * its elements (CACHEW_EOF at its end) and close it. The sequence
	 * must copy or retain whatever it keeps of `in`. */
	cachew_err (*flat_open)(
	    cachew_op_ctx *ctx, const cachew_element *in, void **seq);
	cachew_err (*flat_next)(
	    cachew_op_ctx *ctx, void *seq, cachew_element **out);
	void (*flat_close)(void *seq);
	/* Version 2. Optional: one line for `cachew ops`, naming the
	 * parameters, e.g. "add(value=1): adds value to every numeric
	 * component". */
	const char *doc;
} cachew_op_def;

/* Registers a function operator under def->name; the definition is copied
 * (def is only read during the call and stays the caller's). Returns
 * CACHEW_EEXIST when the name is taken (built-ins included), CACHEW_EINVAL
 * for a malformed definition or a version of 0 (unset), and CACHEW_ENOTSUP
 * for a def->version newer than CACHEW_OP_DEF_VERSION of this library:
 * cachew_errmsg() then names the operator, the plugin being loaded (if any)
 * and both versions. A definition of an older version registers; the
 * fields its version lacks read as absent. Thread safe; pipelines built
 * earlier keep the definitions they resolved. Since 0.1. */
CACHEW_API cachew_err cachew_op_register(const cachew_op_def *def);

/* The symbol a plugin exports, and its signature. The plugin registers its
 * operators with cachew_op_register() and returns CACHEW_OK. abi is
 * CACHEW_VERSION_NUMBER of the loading library. */
#define CACHEW_PLUGIN_INIT_SYMBOL "cachew_plugin_init"
typedef cachew_err (*cachew_plugin_init_fn)(unsigned abi);

/* dlopens a plugin .so and runs its init symbol. Loading the same path
 * twice is a no-op. The library is never unloaded. Thread safe. */
CACHEW_API cachew_err cachew_plugin_load(const char *path);

/* ------------------------------------------------------------------------ */
/* Datasets: the pipeline graph                                             */
/* ------------------------------------------------------------------------ */

/* A dataset is a node of a pipeline graph: an operator, its parameters and
 * its inputs. Immutable once built and safe to share between threads;
 * refcounted (builders take their own references to their inputs, so the
 * caller may release an input right after using it). */
typedef struct cachew_dataset cachew_dataset;

/* `parallel` and prefetch sizes accept CACHEW_AUTO: tuned online. */
#define CACHEW_AUTO (-1)

/* Parses a pipeline string: stages joined by '|', each `name(args)` where
 * args are positional values, `key=value` pairs, or pipelines (for zip and
 * concatenate). A syntax error is CACHEW_EPARSE with cachew_errmsg() naming
 * the column; an unknown operator or bad parameter is ENOENT / EINVAL. */
CACHEW_API cachew_err cachew_dataset_parse(
    cachew_dataset **out, const char *pipeline);

/* The uniform builder: applies operator `op` to `inputs` with `params`
 * (NULL = none). Every per-operator builder below is a thin wrapper. */
CACHEW_API cachew_err cachew_dataset_apply(cachew_dataset **out,
    const char *op, cachew_dataset *const *inputs, size_t ninputs,
    const cachew_params *params);

CACHEW_API cachew_dataset *cachew_dataset_retain(cachew_dataset *ds);
CACHEW_API void cachew_dataset_release(cachew_dataset *ds);

/* Sources. `files` arguments accept glob patterns. */
CACHEW_API cachew_err cachew_dataset_range(
    cachew_dataset **out, int64_t start, int64_t stop, int64_t step);
/* One element: the literal in `values` ("[1, 2, 3]", "(1, \"a\")"). */
CACHEW_API cachew_err cachew_dataset_from_tensors(
    cachew_dataset **out, const char *values);
/* One element per item of the literal list ("[1, 2, 3]"). */
CACHEW_API cachew_err cachew_dataset_from_list(
    cachew_dataset **out, const char *values);
CACHEW_API cachew_err cachew_dataset_list_files(
    cachew_dataset **out, const char *glob, int shuffle, int64_t seed);
CACHEW_API cachew_err cachew_dataset_text_lines(
    cachew_dataset **out, const char *const *files, size_t nfiles);
CACHEW_API cachew_err cachew_dataset_fixed_length_records(cachew_dataset **out,
    const char *const *files, size_t nfiles, int64_t record_bytes);

/* Transformations. `fn` names a registered operator of the right kind;
 * fn_params (may be NULL) go to its init. parallel: 0 or 1 = inline,
 * N > 1 threads, CACHEW_AUTO. */
CACHEW_API cachew_err cachew_dataset_map(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params,
    int parallel);
CACHEW_API cachew_err cachew_dataset_read_file(
    cachew_dataset **out, cachew_dataset *in);
CACHEW_API cachew_err cachew_dataset_filter(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params);
CACHEW_API cachew_err cachew_dataset_flat_map(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params);
CACHEW_API cachew_err cachew_dataset_interleave(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params,
    int64_t cycle, int64_t block, int parallel);
CACHEW_API cachew_err cachew_dataset_batch(cachew_dataset **out,
    cachew_dataset *in, int64_t n, int drop_remainder);
CACHEW_API cachew_err cachew_dataset_padded_batch(cachew_dataset **out,
    cachew_dataset *in, int64_t n, double pad_value, int drop_remainder);
CACHEW_API cachew_err cachew_dataset_unbatch(
    cachew_dataset **out, cachew_dataset *in);
/* seed -1: derived from the pipeline seed. */
CACHEW_API cachew_err cachew_dataset_shuffle(cachew_dataset **out,
    cachew_dataset *in, int64_t buffer, int64_t seed, int reshuffle);
/* count -1: forever. */
CACHEW_API cachew_err cachew_dataset_repeat(
    cachew_dataset **out, cachew_dataset *in, int64_t count);
CACHEW_API cachew_err cachew_dataset_take(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
CACHEW_API cachew_err cachew_dataset_skip(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
CACHEW_API cachew_err cachew_dataset_prefetch(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
CACHEW_API cachew_err cachew_dataset_shard(cachew_dataset **out,
    cachew_dataset *in, int64_t num, int64_t index);
CACHEW_API cachew_err cachew_dataset_zip(
    cachew_dataset **out, cachew_dataset *const *inputs, size_t n);
CACHEW_API cachew_err cachew_dataset_concatenate(
    cachew_dataset **out, cachew_dataset *a, cachew_dataset *b);
CACHEW_API cachew_err cachew_dataset_enumerate(
    cachew_dataset **out, cachew_dataset *in, int64_t start);
CACHEW_API cachew_err cachew_dataset_autocache(
    cachew_dataset **out, cachew_dataset *in);

/* Introspection, borrowed from ds. */
CACHEW_API const char *cachew_dataset_op(const cachew_dataset *ds);
CACHEW_API size_t cachew_dataset_num_inputs(const cachew_dataset *ds);
CACHEW_API cachew_dataset *cachew_dataset_input(
    const cachew_dataset *ds, size_t i);
CACHEW_API const cachew_params *cachew_dataset_params(const cachew_dataset *ds);

/* The canonical pipeline string (every parameter explicit, keys in a fixed
 * order); it parses back to a dataset with the same fingerprint. Free *out
 * with cachew_free. */
CACHEW_API cachew_err cachew_dataset_to_string(
    const cachew_dataset *ds, char **out);
/* Canonical msgpack (docs/graph-format.md). Free *buf with cachew_free. */
CACHEW_API cachew_err cachew_dataset_to_msgpack(
    const cachew_dataset *ds, void **buf, size_t *len);
/* Decodes and validates a serialized graph: hostile input gets
 * CACHEW_EPARSE with a cachew_errmsg(), never a crash or a huge allocation. */
CACHEW_API cachew_err cachew_dataset_from_msgpack(
    cachew_dataset **out, const void *buf, size_t len);

/* 128-bit structural fingerprint (XXH3-128) of ds and everything upstream:
 * operators, every parameter that changes the data (not parallelism or
 * buffer sizes), and the identity (path, size, mtime) of input files. Equal
 * across runs, machines and serialization round trips. */
typedef struct cachew_fingerprint {
	uint64_t hi;
	uint64_t lo;
} cachew_fingerprint;

CACHEW_API cachew_err cachew_dataset_fingerprint(
    const cachew_dataset *ds, cachew_fingerprint *out);
/* Writes 32 lowercase hex digits and a NUL. */
CACHEW_API void cachew_fingerprint_hex(
    const cachew_fingerprint *fp, char out[33]);

/* ------------------------------------------------------------------------ */
/* Iterators: the executor                                                  */
/* ------------------------------------------------------------------------ */

/* Runs a dataset. One thread at a time; its worker threads are internal.
 * Destroying an iterator mid-stream stops its threads and frees all.
 * An iterator does not cross fork(): its threads stay in the parent. A
 * child creates its own iterators (datasets and options cross fine); an
 * inherited iterator is left alone by cachew_iterator_destroy in the
 * child, and must not be read there. */
typedef struct cachew_iterator cachew_iterator;

/* opts may be NULL (the embedded default) and is copied. */
CACHEW_API cachew_err cachew_iterator_create(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts);
/* Yields the next element (the caller owns one reference), CACHEW_EOF at
 * the end, or the error that stopped the pipeline; after an error or EOF
 * every later call returns the same code. */
CACHEW_API cachew_err cachew_iterator_next(
    cachew_iterator *it, cachew_element **out);
CACHEW_API const char *cachew_iterator_errmsg(const cachew_iterator *it);
CACHEW_API void cachew_iterator_destroy(cachew_iterator *it);

/* Per-operator counters, one row per graph node in pipeline order (sources
 * first). Strings are borrowed from the iterator. */
typedef struct cachew_op_stats {
	const char *name;     /* operator name, e.g. "map" */
	const char *detail;   /* e.g. the map function, "add" */
	int node;             /* index of the node in pipeline order */
	uint64_t elements;    /* elements produced */
	uint64_t bytes;       /* payload bytes produced; for large chunks
			       * estimated from 16 samples per chunk */
	uint64_t busy_ns;     /* time spent in this operator's own work */
	uint64_t wait_ns;     /* time its consumer spent blocked on it */
	int parallelism;      /* current threads (1 when inline) */
	int64_t buffer_limit; /* elements it may buffer (0 = none) */
	int64_t buffered;     /* elements buffered now */
} cachew_op_stats;

/* Copies up to cap rows into out and the total count into *n. Thread safe
 * with respect to cachew_iterator_next on the same iterator. */
CACHEW_API cachew_err cachew_iterator_stats(
    cachew_iterator *it, cachew_op_stats *out, size_t cap, size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* CACHEW_H */
