/*
 * cachew.h - ML input-data processing as a library and as a service.
 *
 * This is the only public header of libcachew. Every fallible call returns a
 * cachew_err (CACHEW_OK == 0) and passes results through out parameters.
 * Handles follow one life cycle: cachew_X_create(&x, ...), use, then
 * cachew_X_destroy(x) for objects with one owner (options, params,
 * iterators), or cachew_X_release(x) for refcounted ones (tensors,
 * elements, datasets), which also have a _retain; destroying or releasing
 * NULL is a no-op.
 *
 * Functions that have no object to carry an error detail (the parser, the
 * registry, constructors) record it per thread: cachew_errmsg() returns it.
 *
 * Every declaration's comment says who owns what it takes and returns, how
 * long a borrowed result lives, and from which threads it may be called;
 * each type's comment ends with its thread safety. The ABI is kept: error
 * values are pinned, structs a caller fills carry a version, and renamed
 * functions stay exported under their old names (CACHEW_DEPRECATED).
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

/* The version of the library actually linked, as "MAJOR.MINOR.PATCH": a
 * static string, never freed. Compare with CACHEW_VERSION_STRING to see
 * whether the header and the library agree. Thread safe. Since 0.1. */
CACHEW_API const char *cachew_version(void);
/* The version of the library actually linked, as CACHEW_VERSION_NUMBER
 * computes it (MAJOR * 10000 + MINOR * 100 + PATCH). Thread safe.
 * Since 0.1. */
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
	CACHEW_EINTERNAL = 17, /* an internal invariant failed: a bug */
	CACHEW_EPERM = 18,     /* the peer may not do this: not
				* authenticated, another role, another
				* tenant's job, or a path or URL outside
				* what a worker may read or write (since
				* 0.4) */
	/* A peer could not be authenticated: a TLS handshake failed (a
	 * certificate not trusted, expired or missing; TLS on one side
	 * only). Not transient: retrying does not help. Since 0.4. */
	CACHEW_EAUTH = 19
	/* Next free value: 20. */
} cachew_err;

/* A static, human readable description of an error code ("not found"),
 * never freed; "unknown error" for a value this library does not know.
 * Never NULL. Thread safe. Since 0.1. */
CACHEW_API const char *cachew_strerror(cachew_err err);

/* The detail of the last failure of a call made by this thread that has no
 * object of its own to hold it (parsers, constructors, the registry). The
 * string is owned by the library and valid until this thread's next cachew
 * call; copy it to keep it. Empty, never NULL, when there is no detail.
 * Each thread has its own, so it is thread safe. Since 0.1. */
CACHEW_API const char *cachew_errmsg(void);

/* The severity of a log line; a sink receives the levels up to the one it
 * was installed with. */
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

/* Installs a log sink that receives messages at `max_level` and below,
 * process-wide, replacing the previous one. The library is silent until a
 * sink is installed; fn == NULL silences it again. ctx is handed to fn
 * untouched and stays the caller's: it must outlive its installation (and
 * any call racing with the change). Thread safe (the sink is swapped under
 * a lock), but messages racing with the change may reach the old sink.
 * Since 0.1. */
CACHEW_API void cachew_log_set(
    cachew_log_fn fn, void *ctx, cachew_log_level max_level);
/* A ready-made sink for cachew_log_set: writes "cachew <level> [<module>]
 * <msg>" and a newline to standard error, ignoring ctx. Thread safe (one
 * fprintf per line). Since 0.1. */
CACHEW_API void cachew_log_stderr(
    void *ctx, cachew_log_level level, const char *module, const char *msg);

/* Frees memory the library returned to the caller for it to free (the
 * strings and buffers of cachew_dataset_to_string and _to_msgpack); never
 * for handles, which have their own destroy or release. NULL is a no-op.
 * Thread safe. Since 0.1. */
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
 *   epoch          int   the epoch: shuffle(reshuffle=true),
 *                        list_files(shuffle=true) and random functions
 *                        draw anew for each (default 0)
 *   max_element_bytes int bytes an operator may allocate for one element
 *                        (read_file, decode_jpeg, resize, batch...); over
 *                        it the element fails with CACHEW_ERANGE (default
 *                        1 GiB)
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
 *   client_buffer     int  bytes of elements buffered ahead, queued and
 *                          asked for (64 MiB)
 *   service_timeout_ms int how long a service call may take (30000)
 * Unknown names are CACHEW_ENOENT, values of the wrong type CACHEW_ETYPE and
 * out-of-range values CACHEW_ERANGE, each with a cachew_options_errmsg().
 * An options object is a plain value the caller owns: it is copied when an
 * iterator is created and may be destroyed right after. One thread at a
 * time, getters included (a failed get records its errmsg in the object).
 */
typedef struct cachew_options cachew_options;

/* Creates an options object holding every option's default; the caller
 * owns it and frees it with cachew_options_destroy(). CACHEW_ENOMEM on
 * failure (*out untouched). Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_options_create(cachew_options **out);
/* Frees opts; iterators created with it keep their copies. NULL is a
 * no-op. Since 0.1. */
CACHEW_API void cachew_options_destroy(cachew_options *opts);
/* Sets an int option. CACHEW_ENOENT for an unknown name, CACHEW_ETYPE for
 * an option of another type, CACHEW_ERANGE for a value outside the
 * option's range; the option keeps its value on failure. Since 0.1. */
CACHEW_API cachew_err cachew_options_set_int(
    cachew_options *opts, const char *name, int64_t value);
/* Sets a bool option (any nonzero value is true). Errors as for
 * cachew_options_set_int. Since 0.1. */
CACHEW_API cachew_err cachew_options_set_bool(
    cachew_options *opts, const char *name, int value);
/* Sets a string option, copying value (at most 255 bytes; a longer one, or
 * one outside the option's choices, is CACHEW_ERANGE). value stays the
 * caller's. Errors otherwise as for cachew_options_set_int. Since 0.1. */
CACHEW_API cachew_err cachew_options_set_str(
    cachew_options *opts, const char *name, const char *value);
/* Sets an option from text ("4", "true", "tcp://h:7070"), converting by the
 * option's type: what flags, environment and config files use. Text that
 * does not convert is CACHEW_ETYPE; other errors as for the typed setters.
 * text is copied for string options. Since 0.1. */
CACHEW_API cachew_err cachew_options_set(
    cachew_options *opts, const char *name, const char *text);
/* Reads an int option into *out. CACHEW_ENOENT for an unknown name,
 * CACHEW_ETYPE for an option of another type (*out untouched on failure).
 * Since 0.1. */
CACHEW_API cachew_err cachew_options_get_int(
    const cachew_options *opts, const char *name, int64_t *out);
/* Reads a bool option into *out as 0 or 1. Errors as for
 * cachew_options_get_int. Since 0.1. */
CACHEW_API cachew_err cachew_options_get_bool(
    const cachew_options *opts, const char *name, int *out);
/* Reads a string option. *out is borrowed from opts: valid until the
 * option is set again or opts is destroyed. Errors as for
 * cachew_options_get_int. Since 0.1. */
CACHEW_API cachew_err cachew_options_get_str(
    const cachew_options *opts, const char *name, const char **out);
/* The detail of the last failed call on opts ("option 'threads' must be in
 * [0, 1024], not -3"); successful calls leave it alone. Owned by opts: the
 * pointer is valid until opts is destroyed, the text is replaced by the
 * next failing call. Empty, never NULL, before any failure. Since 0.1. */
CACHEW_API const char *cachew_options_errmsg(const cachew_options *opts);

/* Describes option i of the table (0-based) for help output: its name,
 * type ("int", "bool", "str"), default as text and one line of help, each
 * a static string never freed. CACHEW_ENOENT past the end, with the out
 * parameters untouched. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_option_info(size_t i, const char **name,
    const char **type, const char **default_text, const char **help);

/* ------------------------------------------------------------------------ */
/* Tensors and elements                                                     */
/* ------------------------------------------------------------------------ */

/* The type of a tensor's values. The numbers are pinned: they are the dtype
 * codes of the element encoding, in cache files and on the wire
 * (docs/cache-format.md). */
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

#define CACHEW_MAX_RANK 8        /* dimensions of a tensor */
#define CACHEW_MAX_COMPONENTS 64 /* tensors of an element */

/* The dtype's name, "u8", "i32", ... "bytes": a static string, never
 * freed; NULL for an invalid dtype. Thread safe. Since 0.1. */
CACHEW_API const char *cachew_dtype_name(cachew_dtype dtype);
/* Bytes per value; 0 for CACHEW_BYTES and invalid dtypes. Thread safe.
 * Since 0.1. */
CACHEW_API size_t cachew_dtype_size(cachew_dtype dtype);
/* The dtype named `name`: the names cachew_dtype_name gives, or the numpy
 * and torch spellings ("uint8", "float32", "string"). CACHEW_EINVAL for any
 * other name, with a cachew_errmsg() (*out untouched). Thread safe.
 * Since 0.1. */
CACHEW_API cachew_err cachew_dtype_from_name(
    const char *name, cachew_dtype *out);

/* A tensor: a dtype, a shape (rank <= 8) and a view of a refcounted,
 * immutable buffer. Fixed-width tensors are dense, row-major. BYTES tensors
 * hold numel variable-length strings (Arrow-style offsets + data).
 * Tensors are values: retaining one shares its buffer and never copies data.
 * A handle the caller gets from a constructor is the caller's, released with
 * cachew_tensor_release(); one from cachew_element_component() is borrowed
 * from its element. Buffer references are counted atomically, so handles
 * sharing one buffer may live on different threads. A tensor handle is used
 * by one thread at a time; the buffers it shares are immutable and may be
 * read from any thread. */
typedef struct cachew_tensor cachew_tensor;

/* The tensor's dtype. Never fails. Same thread safety as reading t.
 * Since 0.1. */
CACHEW_API cachew_dtype cachew_tensor_dtype(const cachew_tensor *t);
/* The number of dimensions, 0 to CACHEW_MAX_RANK. Since 0.1. */
CACHEW_API unsigned cachew_tensor_rank(const cachew_tensor *t);
/* The shape, `rank` entries, borrowed from t: valid while t lives.
 * Since 0.1. */
CACHEW_API const int64_t *cachew_tensor_shape(const cachew_tensor *t);
/* The number of values (strings for BYTES): the product of the shape, 1
 * for rank 0. Since 0.1. */
CACHEW_API int64_t cachew_tensor_numel(const cachew_tensor *t);
/* Fixed-width: numel * dtype size. BYTES: the total length of the strings.
 * Since 0.1. */
CACHEW_API size_t cachew_tensor_nbytes(const cachew_tensor *t);
/* Fixed-width: the values, borrowed, valid while t (or the element holding
 * it) lives; small tensors keep their values in the handle itself, so the
 * pointer is not valid past t even if another handle shares the values.
 * BYTES: the start of the string data (use _bytes_at). Read-only.
 * Since 0.1. */
CACHEW_API const void *cachew_tensor_data(const cachew_tensor *t);
/* String i (flat, row-major index) of a BYTES tensor: *data and *len,
 * borrowed from t like cachew_tensor_data. CACHEW_ETYPE for another dtype,
 * CACHEW_ERANGE for i outside [0, numel). Since 0.1. */
CACHEW_API cachew_err cachew_tensor_bytes_at(
    const cachew_tensor *t, int64_t i, const void **data, size_t *len);

/* Creates a fixed-width tensor over a new zeroed buffer and returns a
 * writable pointer to it in *data (data may be NULL). The pointer may be
 * written until the tensor is first shared (retained, sliced or put into an
 * element) and is valid while the handle lives. The caller owns *out.
 * CACHEW_EINVAL for BYTES or an invalid dtype, a rank over CACHEW_MAX_RANK
 * or a negative dimension, CACHEW_ERANGE for a shape too large,
 * CACHEW_ENOMEM; each with a cachew_errmsg(). Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_tensor_create(cachew_tensor **out,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void **data);
/* Wraps caller memory without copying. On success the tensor owns `data` and
 * calls free_fn(ctx, data) once the last view is gone, on whichever thread
 * drops it (free_fn may be NULL for static memory); on failure the caller
 * still owns it and free_fn is never called. nbytes must equal numel *
 * dtype size (CACHEW_EINVAL otherwise; shape errors as for
 * cachew_tensor_create). The memory must not change while the tensor
 * lives. The caller owns *out. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_tensor_wrap(cachew_tensor **out,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void *data,
    size_t nbytes, void (*free_fn)(void *ctx, void *data), void *ctx);
/* Creates a BYTES tensor of the given shape from numel strings: items[i]
 * and lens[i], copied (the arrays stay the caller's). The caller owns
 * *out. Shape errors as for cachew_tensor_create; CACHEW_ERANGE when the
 * strings are too large; CACHEW_ENOMEM. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_tensor_create_bytes(cachew_tensor **out,
    unsigned rank, const int64_t *shape, const void *const *items,
    const size_t *lens);
/* Creates a rank-0 tensor holding one value of a fixed-width dtype, copied
 * from `value` (dtype size bytes). The caller owns *out. CACHEW_EINVAL for
 * BYTES or an invalid dtype, CACHEW_ENOMEM. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_tensor_create_scalar(
    cachew_tensor **out, cachew_dtype dtype, const void *value);
/* A new handle in *out viewing rows [start, start + count) along dimension
 * 0 of t: it shares t's buffer (a slice of at most 16 bytes is copied into
 * the handle instead). The caller owns *out; t is only read and both stay
 * valid independently. CACHEW_ETYPE for a rank-0 tensor, CACHEW_ERANGE for
 * rows outside dimension 0, CACHEW_ENOMEM. Since 0.1. */
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
 * a pipeline yields. Refcounted (atomically): each holder of a reference
 * releases it once with cachew_element_release(). An element is immutable
 * once shared (refcount > 1). Handles may be passed between threads, and
 * references to one element may be retained and released on several
 * threads at once; one thread at a time may modify an unshared element. */
typedef struct cachew_element cachew_element;

/* Creates an element of n components, each an empty rank-0 I64 zero until
 * set. The caller holds its one reference. CACHEW_EINVAL unless 1 <= n <=
 * CACHEW_MAX_COMPONENTS, CACHEW_ENOMEM; with a cachew_errmsg(). Thread
 * safe. Since 0.1. */
CACHEW_API cachew_err cachew_element_create(cachew_element **out, size_t n);
/* The number of components. Since 0.1. */
CACHEW_API size_t cachew_element_size(const cachew_element *e);
/* Component i, borrowed: valid while the caller holds its reference to e
 * and the component is not replaced. Never release it; retain it
 * (cachew_tensor_retain) to keep it longer. NULL for i out of range.
 * Since 0.1. */
CACHEW_API const cachew_tensor *cachew_element_component(
    const cachew_element *e, size_t i);
/* Sets component i to share t's buffer, dropping the component's previous
 * value; t is not consumed and stays the caller's. e must be unshared:
 * CACHEW_EINVAL when it is shared, CACHEW_ERANGE for i out of range, with
 * a cachew_errmsg() (e unchanged on failure). Since 0.1. */
CACHEW_API cachew_err cachew_element_set(
    cachew_element *e, size_t i, const cachew_tensor *t);
/* Sets component i to a view of rows [start, start+count) of t, as
 * cachew_tensor_slice makes it; t stays the caller's. Errors as for
 * cachew_element_set and cachew_tensor_slice (e unchanged on failure).
 * Since 0.1. */
CACHEW_API cachew_err cachew_element_set_slice(cachew_element *e, size_t i,
    const cachew_tensor *t, int64_t start, int64_t count);
/* Sets component i to a new zeroed fixed-width tensor and returns a writable
 * pointer to its values, owned by e: valid while e is unshared and the
 * component is not replaced. Errors as for cachew_element_set and
 * cachew_tensor_create (e unchanged on failure). Since 0.1. */
CACHEW_API cachew_err cachew_element_alloc(cachew_element *e, size_t i,
    cachew_dtype dtype, unsigned rank, const int64_t *shape, void **data);
/* Makes component i's values writable in place and returns them, owned by
 * e (valid as for cachew_element_alloc): copies the buffer first unless e
 * and the buffer are exclusively owned and the buffer is the library's
 * (memory from cachew_tensor_wrap is never written). CACHEW_ETYPE for a
 * BYTES component, CACHEW_ENOMEM for a failed copy; errors otherwise as for
 * cachew_element_set. Since 0.1. */
CACHEW_API cachew_err cachew_element_mutable_data(
    cachew_element *e, size_t i, void **data);
/* Takes another reference to e and returns e (NULL stays NULL). Thread
 * safe: the count is atomic. The element is shared, hence immutable, until
 * the references are back to one. Since 0.1. */
CACHEW_API cachew_element *cachew_element_retain(cachew_element *e);
/* Drops one reference; the last frees e and drops its references to the
 * component buffers. NULL is a no-op. Thread safe with respect to other
 * references to e. Since 0.1. */
CACHEW_API void cachew_element_release(cachew_element *e);
/* The name of component i (borrowed: valid while the caller holds its
 * reference to e and does not rename it), or NULL when it is unnamed or i
 * is out of range. Elements an iterator yields carry the names of their
 * dataset's element spec (cachew_dataset_component), so a dict-structured
 * element from from_tensors({image=..., label=...}) or parse_example reads
 * by name, in-process and through the service alike. Names are not part
 * of cachew_element_hash. Thread safe with respect to other readers of e.
 * Since 0.2. */
CACHEW_API const char *cachew_element_name(const cachew_element *e, size_t i);
/* The index of e's component named `name` in *index. CACHEW_ENOENT when
 * no component has that name, CACHEW_EINVAL for a NULL argument; with a
 * cachew_errmsg(). Thread safe with respect to other readers of e.
 * Since 0.2. */
CACHEW_API cachew_err cachew_element_find(
    const cachew_element *e, const char *name, size_t *index);
/* Names component i of an unshared element (NULL: unnamed), copying name:
 * how a function registered from C names what it builds. A name has 1 to
 * 255 bytes, no control character (caches and the service carry names by
 * that rule), and is unique within the element. CACHEW_ERANGE for i out of
 * range, CACHEW_EINVAL for a shared element or a bad name, CACHEW_EEXIST
 * when another component has the name, CACHEW_ENOMEM; e unchanged on
 * failure. One thread at a time, as for cachew_element_set. Since 0.2. */
CACHEW_API cachew_err cachew_element_set_name(
    cachew_element *e, size_t i, const char *name);
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
 * msgpack map of a graph node, kept sorted by key. A params object the
 * caller creates is the caller's, freed with cachew_params_destroy();
 * builders and cachew_dataset_apply copy what they are given. One from
 * cachew_dataset_params() or handed to an operator's init is borrowed and
 * read-only. Setters need one thread at a time; the getters only read
 * (their error detail goes to the calling thread's cachew_errmsg()), so a
 * params object nobody modifies may be read from several threads at once.
 */
typedef struct cachew_params cachew_params;

/* Creates an empty params object; the caller owns it. CACHEW_ENOMEM on
 * failure. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_params_create(cachew_params **out);
/* Parses "value=1, size=[224, 224], mode=bilinear" (pipeline-string
 * syntax) into a new params object the caller owns. CACHEW_EPARSE with a
 * cachew_errmsg() naming the column for bad text (*out untouched). Thread
 * safe. Since 0.1. */
CACHEW_API cachew_err cachew_params_parse(
    cachew_params **out, const char *text);
/* Frees p and every value in it; strings borrowed from it die with it.
 * NULL is a no-op. Since 0.1. */
CACHEW_API void cachew_params_destroy(cachew_params *p);
/* Sets key to an int, replacing any value it had (a string borrowed from
 * that value is then gone). key is copied; CACHEW_EINVAL unless it is an
 * identifier ([A-Za-z_][A-Za-z0-9_]*), CACHEW_ENOMEM. Since 0.1. */
CACHEW_API cachew_err cachew_params_set_int(
    cachew_params *p, const char *key, int64_t v);
/* Sets key to a double. As cachew_params_set_int. Since 0.1. */
CACHEW_API cachew_err cachew_params_set_double(
    cachew_params *p, const char *key, double v);
/* Sets key to a bool (any nonzero v is true). As cachew_params_set_int.
 * Since 0.1. */
CACHEW_API cachew_err cachew_params_set_bool(
    cachew_params *p, const char *key, int v);
/* Sets key to a copy of the string v, which stays the caller's. As
 * cachew_params_set_int. Since 0.1. */
CACHEW_API cachew_err cachew_params_set_str(
    cachew_params *p, const char *key, const char *v);
/* Sets key to a list of n ints copied from v. As cachew_params_set_int.
 * Since 0.1. */
CACHEW_API cachew_err cachew_params_set_int_list(
    cachew_params *p, const char *key, const int64_t *v, size_t n);
/* Sets key to a list of n doubles copied from v. As
 * cachew_params_set_int. Since 0.1. */
CACHEW_API cachew_err cachew_params_set_double_list(
    cachew_params *p, const char *key, const double *v, size_t n);
/* 1 if p holds key, else 0 (also for p == NULL). Only reads. Since 0.1. */
CACHEW_API int cachew_params_has(const cachew_params *p, const char *key);
/* Getters return CACHEW_ENOENT when the key is absent (leaving *out alone)
 * and CACHEW_ETYPE when the value has another type, each with a
 * cachew_errmsg(). Ints convert to double; a double converts to int only
 * when it is integral. Strings are borrowed from p: valid until the key is
 * set again or p is destroyed. List getters copy up to cap values into the
 * caller's out, report the full length in *n (call with cap 0 to size
 * the array) and read a single number as a list of one. Getters only read
 * p. Since 0.1. */
CACHEW_API cachew_err cachew_params_get_int(
    const cachew_params *p, const char *key, int64_t *out);
/* Reads key as a double; see the getters' rules above. Since 0.1. */
CACHEW_API cachew_err cachew_params_get_double(
    const cachew_params *p, const char *key, double *out);
/* Reads key as a bool (0 or 1); see the getters' rules above. Since 0.1. */
CACHEW_API cachew_err cachew_params_get_bool(
    const cachew_params *p, const char *key, int *out);
/* Reads key as a string, borrowed from p; see the getters' rules above. A
 * string holding a NUL byte is CACHEW_EINVAL (as a C string it would end
 * early). Since 0.1. */
CACHEW_API cachew_err cachew_params_get_str(
    const cachew_params *p, const char *key, const char **out);
/* Reads key as a list of ints; see the getters' rules above. On
 * CACHEW_ETYPE for a list item, the items before it may have been
 * written. Since 0.1. */
CACHEW_API cachew_err cachew_params_get_int_list(const cachew_params *p,
    const char *key, int64_t *out, size_t cap, size_t *n);
/* Reads key as a list of doubles; as cachew_params_get_int_list.
 * Since 0.1. */
CACHEW_API cachew_err cachew_params_get_double_list(const cachew_params *p,
    const char *key, double *out, size_t cap, size_t *n);
/* The number of keys (0 for p == NULL). Only reads. Since 0.1. */
CACHEW_API size_t cachew_params_count(const cachew_params *p);
/* Key i in sorted order, borrowed from p (valid until p changes or is
 * destroyed); NULL for i out of range. Only reads. Since 0.1. */
CACHEW_API const char *cachew_params_key(const cachew_params *p, size_t i);

/* ------------------------------------------------------------------------ */
/* Operator registry: user functions for map, filter and flat_map            */
/* ------------------------------------------------------------------------ */

/* What a function operator does with each element; the values are pinned
 * (cachew_op_def.kind). */
typedef enum cachew_op_kind {
	CACHEW_OP_MAP = 1,     /* one element in, one element out */
	CACHEW_OP_FILTER = 2,  /* one element in, keep or drop */
	CACHEW_OP_FLAT_MAP = 3 /* one element in, a sequence out */
} cachew_op_kind;

/* Property flags. */
#define CACHEW_OP_RANDOM 0x1u /* uses cachew_op_ctx randomness */

/* The per-call context of an operator function: its state, its
 * per-element random stream and its error slot. Owned by the library and
 * valid only during the call it is passed to (never keep it). Calls that
 * run at once get different contexts: one thread at a time. */
typedef struct cachew_op_ctx cachew_op_ctx;

/* The state returned by the op's init, shared read-only by all threads;
 * the operator owns it and its fini frees it. Since 0.1. */
CACHEW_API void *cachew_op_ctx_state(cachew_op_ctx *ctx);
/* A 64-bit seed derived from (pipeline seed, node, epoch, element index):
 * the same element gets the same seed in every run with the same pipeline
 * seed and epoch, at any parallelism, and another in each epoch (the
 * `epoch` option, or each repetition under repeat). Since 0.1. */
CACHEW_API uint64_t cachew_op_ctx_seed(cachew_op_ctx *ctx);
/* The next value of a random stream started from cachew_op_ctx_seed; the
 * stream restarts for each element, so it is as reproducible as the seed.
 * Since 0.1. */
CACHEW_API uint64_t cachew_op_ctx_random(cachew_op_ctx *ctx);
/* Records why the call failed (printf-style, at most 511 bytes kept in
 * ctx); the iterator reports it as its errmsg, prefixed with the operator
 * name. Returns CACHEW_EOP for convenience; the function still returns an
 * error code itself. Since 0.1. */
CACHEW_API cachew_err cachew_op_ctx_fail(cachew_op_ctx *ctx, const char *fmt,
    ...) CACHEW_PRINTF(2, 3);

/* Map: takes ownership of `in` and stores the result in *out (which may be
 * `in` itself, modified in place when unshared); the caller then owns
 * *out. On failure the function releases `in` and stores nothing. Called
 * on executor threads, several at once under parallel map: thread safe. */
typedef cachew_err (*cachew_map_fn)(
    cachew_op_ctx *ctx, cachew_element *in, cachew_element **out);
/* Filter: sets *keep to 1 to keep the element, 0 to drop it; `in` is
 * borrowed for the call and stays the caller's (retain it to keep it).
 * Called on executor threads, possibly several at once: thread safe. */
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
 * hands to cachew_op_register(), which copies the struct and the name (the
 * struct itself is read only during that call). The doc string, the
 * functions and the code behind them must stay valid for the life of the
 * process (plugins are never unloaded). init runs on the thread that builds
 * a dataset naming the operator, fini on the thread that releases that
 * dataset's last reference; map, filter and flat_open may run on several
 * executor threads at once (parallel map, interleave), sharing init's
 * state read-only, so they must be thread safe; one sequence's flat_next
 * and flat_close are called by one thread at a time. */
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

/* ------------------------------------------------------------------------ */
/* User sources: datasets made by callbacks (tf.data's from_generator)      */
/* ------------------------------------------------------------------------ */

/* The layout version of cachew_source_def this header declares, under the
 * rules of CACHEW_OP_DEF_VERSION (the first field states it; versions only
 * grow, fields are only appended).
 *   1  version, name, doc, flags, element_spec, init, fini, splits, open,
 *      next, close
 * Since 0.2. */
#define CACHEW_SOURCE_DEF_VERSION 1

/* A source defined by callbacks, registered by name with
 * cachew_source_register(): a pipeline names it as an operator with its
 * parameters, `my_source(n=10, path="...")` (or, in the canonical form,
 * `user_source(fn=my_source, n=10, ...)`), which go to init as they go to
 * a function's init.
 *
 * Its output is a sequence of splits, 0 .. nsplits-1 in order, each opened
 * on its own: open(ctx, split) starts split `split`, next yields its
 * elements one by one (CACHEW_EOF at its end), close ends it. With a
 * splits callback the service hands splits to several workers
 * (distributed_epoch: each split to one worker, each element once), so a
 * split must yield the same elements whichever process opens it; without
 * one the source is one split, run whole by one worker. In-process, every
 * split is read in order. A saved iterator position (cachew_iterator_save)
 * is the split and the count of its elements read: restoring opens the
 * split again and reads past that many.
 *
 * element_spec declares what every element holds, in the text that
 * cachew_dataset_spec_str() prints: "i64[]", "(i64[], bytes[])",
 * "{id: i64[], text: bytes[]}" (named components), with -1 for a
 * dimension that varies; NULL or "?" leaves it unknown (checks downstream
 * are then skipped, as after a user map function). An element that does
 * not match the declared spec (component count, dtype, rank or a declared
 * dimension) fails the iteration with CACHEW_ETYPE naming the source, the
 * split and the element: a spec is a promise the library checks.
 *
 * Lifetimes and threads: as cachew_op_def. name, doc and element_spec are
 * copied when registering; the functions, and the code behind them, must
 * stay valid for the life of the process. init runs on the thread that
 * builds a dataset naming the source (its state is shared read-only by
 * every iterator of that dataset, fini frees it with the dataset's last
 * reference); splits runs when a pipeline is built or planned, from any
 * thread; open may run on several threads at once (several iterators,
 * several leases on a worker), each sequence's next and close on one
 * thread at a time. ctx (cachew_op_ctx_seed, _random, _fail) is valid
 * only during the call it is passed to. */
typedef struct cachew_source_def {
	/* CACHEW_SOURCE_DEF_VERSION of the header the definition was written
	 * against. 0 (unset) is refused. */
	unsigned version;
	const char *name;         /* [a-z_][a-z0-9_]*, at most 63 characters;
				   * not a built-in operator's name */
	const char *doc;          /* optional: one line for `cachew ops` */
	unsigned flags;           /* CACHEW_OP_RANDOM when it uses ctx's
				   * randomness */
	const char *element_spec; /* optional: see above */
	/* Optional: validates params (reject unknown keys) and builds the
	 * state shared by its sequences; a reason into err on failure. */
	cachew_err (*init)(const cachew_params *params, void **state,
	    char *err, size_t errlen);
	void (*fini)(void *state);
	/* Optional: the number of splits (>= 0) into *nsplits; NULL: one.
	 * A reason into err on failure. */
	cachew_err (*splits)(void *state, uint64_t *nsplits, char *err,
	    size_t errlen);
	/* Required: opens split `split` (< nsplits) into *seq.
	 * cachew_op_ctx_state(ctx) is init's state. */
	cachew_err (*open)(cachew_op_ctx *ctx, uint64_t split, void **seq);
	/* Required: the next element into *out (the caller owns it), or
	 * CACHEW_EOF at the end of the split, or an error (with
	 * cachew_op_ctx_fail for its reason). */
	cachew_err (*next)(cachew_op_ctx *ctx, void *seq, cachew_element **out);
	/* Optional: ends a sequence open returned (after its EOF, or
	 * earlier when the iterator is destroyed). */
	void (*close)(void *seq);
} cachew_source_def;

/* Registers a user source under def->name; the definition is copied (def
 * is only read during the call). From a plugin's init, the source carries
 * the plugin's identity as its functions do: workers that load the same
 * plugin build run it, and its fingerprint names that build. CACHEW_EEXIST
 * when the name is taken by a function, a source or a built-in operator;
 * CACHEW_EINVAL for a malformed definition (a bad name, no open or next,
 * an element_spec that does not parse: cachew_errmsg() names the column)
 * or version 0; CACHEW_ENOTSUP for a version newer than
 * CACHEW_SOURCE_DEF_VERSION. Thread safe. Since 0.2. */
CACHEW_API cachew_err cachew_source_register(const cachew_source_def *def);

/* The symbol a plugin exports, and its signature. The plugin registers its
 * operators with cachew_op_register() (and its sources with
 * cachew_source_register()) and returns CACHEW_OK, or an error
 * (CACHEW_ENOTSUP for a library it was not built for) to fail the load.
 * abi is CACHEW_VERSION_NUMBER of the loading library. It runs once per
 * plugin file, on the loading thread, with the load serialised against
 * other loads. */
#define CACHEW_PLUGIN_INIT_SYMBOL "cachew_plugin_init"
typedef cachew_err (*cachew_plugin_init_fn)(unsigned abi);

/* The layout version of cachew_plugin_info this header declares (its
 * first field, as in cachew_op_def: versions only grow, fields are only
 * appended).
 *   1  version, name, plugin_version
 * Since 0.1. */
#define CACHEW_PLUGIN_INFO_VERSION 1

/* What a plugin says about itself: an optional exported object named
 * CACHEW_PLUGIN_INFO_SYMBOL, read when the plugin is loaded, before its
 * init runs:
 *
 *   CACHEW_API const cachew_plugin_info cachew_plugin_identity = {
 *       .version = CACHEW_PLUGIN_INFO_VERSION,
 *       .name = "my_ops", .plugin_version = "1.2.0"};
 *
 * A plugin's identity is its name, its version and a hash of its file's
 * bytes (XXH3-128, computed at load). It is part of the fingerprint of
 * every pipeline that uses one of its functions, so caches made with one
 * build of a plugin are never read with another, and the service runs a
 * job's tasks only on workers that loaded the same build
 * (docs/graph-format.md, section 5.3). Without this object the name is
 * the file's name without directory and extension and the version is
 * empty. name and plugin_version are 1 to 63 characters of
 * [A-Za-z0-9_.+-] (plugin_version may be NULL or empty: unknown);
 * anything else fails the load with CACHEW_EINVAL. The strings are read
 * during the load only. */
#define CACHEW_PLUGIN_INFO_SYMBOL "cachew_plugin_identity"
typedef struct cachew_plugin_info {
	unsigned version;           /* CACHEW_PLUGIN_INFO_VERSION */
	const char *name;           /* e.g. "my_ops" */
	const char *plugin_version; /* e.g. "1.2.0"; NULL: unknown */
} cachew_plugin_info;

/* dlopens a plugin .so, reads its identity (cachew_plugin_info above, and
 * the hash of the file's bytes) and runs its init symbol; the operators
 * the init registers carry that identity. Loading the same path (after
 * realpath) twice is a no-op that returns the first load's outcome. The
 * library is never unloaded, and operators its init registered stay even
 * if it then failed. CACHEW_ENOENT for a missing file or one without the
 * init symbol, CACHEW_EINVAL for a file dlopen refuses or a malformed
 * cachew_plugin_info, CACHEW_EIO for a file that cannot be read, else
 * what the init returned; each with a cachew_errmsg() naming the path.
 * path is only read. Thread safe (loads are serialised). Since 0.1.
 */
CACHEW_API cachew_err cachew_plugin_load(const char *path);

/* ------------------------------------------------------------------------ */
/* Datasets: the pipeline graph                                             */
/* ------------------------------------------------------------------------ */

/* A dataset is a node of a pipeline graph: an operator, its parameters and
 * its inputs. Refcounted (atomically): every call that returns a dataset
 * gives the caller one reference, dropped with cachew_dataset_release().
 * Builders take their own references to their inputs, so the caller may
 * release an input right after using it; string and params arguments are
 * copied. Immutable once built and safe to share between threads: every
 * call that reads a dataset, and retain and release, may run on any thread
 * at once. */
typedef struct cachew_dataset cachew_dataset;

/* `parallel` and prefetch sizes accept CACHEW_AUTO: tuned online. */
#define CACHEW_AUTO (-1)

/* Parses a pipeline string: stages joined by '|', each `name(args)` where
 * args are positional values, `key=value` pairs, or pipelines (for zip and
 * concatenate). A syntax error is CACHEW_EPARSE with cachew_errmsg() naming
 * the column; an unknown operator or bad parameter is ENOENT / EINVAL. On
 * success the caller owns *out (one reference); pipeline is only read.
 * Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_parse(
    cachew_dataset **out, const char *pipeline);

/* The uniform builder: applies operator `op` to `inputs` with `params`
 * (NULL = none). Every per-operator builder below is a thin wrapper, and
 * they share its contract: on success *out is a new dataset and the
 * caller owns its one reference; inputs are not consumed (the new dataset
 * holds references of its own) and params is copied. CACHEW_ENOENT for an
 * unknown operator or function, CACHEW_EINVAL for a wrong number of inputs
 * or a missing, unknown or ill-typed parameter, CACHEW_ERANGE for a value
 * outside its range, CACHEW_ENOMEM; each with a cachew_errmsg() naming the
 * operator and parameter, *out untouched. A function's init runs here, on
 * the calling thread. A missing input file is not an error here but the
 * iterator's. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_apply(cachew_dataset **out,
    const char *op, cachew_dataset *const *inputs, size_t ninputs,
    const cachew_params *params);

/* Takes another reference to ds and returns ds (NULL stays NULL). Thread
 * safe. Since 0.1. */
CACHEW_API cachew_dataset *cachew_dataset_retain(cachew_dataset *ds);
/* Drops one reference; the last frees ds (running its function's fini)
 * and drops its references to its inputs. Iterators hold references of
 * their own. NULL is a no-op. Thread safe. Since 0.1. */
CACHEW_API void cachew_dataset_release(cachew_dataset *ds);

/* Sources, each with cachew_dataset_apply's contract (docs/operators.md
 * has every operator's parameters). `files` arguments accept glob
 * patterns. */

/* i64 scalars start, start + step, ... up to stop (exclusive). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_range(
    cachew_dataset **out, int64_t start, int64_t stop, int64_t step);
/* i64 scalars start, start + step, ... without end (tf.data's Counter;
 * values wrap modulo 2^64, step 0 repeats start): cardinality
 * CACHEW_CARDINALITY_INFINITE. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_counter(
    cachew_dataset **out, int64_t start, int64_t step);
/* One element: the literal in `values` ("[1, 2, 3]", "(1, \"a\")"); a
 * tuple gives several components. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_from_tensors(
    cachew_dataset **out, const char *values);
/* One element per item of the literal list ("[1, 2, 3]"). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_from_list(
    cachew_dataset **out, const char *values);
/* The paths matching glob, as bytes scalars: sorted, or when shuffle is
 * nonzero shuffled anew each epoch (seed -1: derived from the pipeline
 * seed). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_list_files(
    cachew_dataset **out, const char *glob, int shuffle, int64_t seed);
/* The lines of nfiles text files, without their line ends, as bytes
 * scalars. The array and its strings are copied. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_text_lines(
    cachew_dataset **out, const char *const *files, size_t nfiles);
/* The record_bytes-long records of nfiles binary files, as bytes scalars.
 * The array and its strings are copied. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_fixed_length_records(cachew_dataset **out,
    const char *const *files, size_t nfiles, int64_t record_bytes);

/* Transformations, each with cachew_dataset_apply's contract: `in` is not
 * consumed. `fn` names a registered operator of the right kind (copied, as
 * are fn_params, which may be NULL and go to its init). parallel: 0 or 1 =
 * inline, N > 1 threads, CACHEW_AUTO. */

/* Applies the map function fn to every element. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_map(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params,
    int parallel);
/* Replaces the path in component 0 by the file's contents
 * (map(read_file)). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_read_file(
    cachew_dataset **out, cachew_dataset *in);
/* Keeps the elements the filter function fn accepts. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_filter(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params);
/* Yields in's elements while the filter function fn accepts them; the
 * first it rejects ends the stream, which reads no further (tf.data's
 * take_while). Since 0.2. */
CACHEW_API cachew_err cachew_dataset_take_while(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params);
/* Yields the first occurrence of each distinct value of in, in in's order
 * (tf.data's unique). in's elements must be one scalar integer (u8, i32,
 * i64) or string component: other specs are CACHEW_ETYPE here. Every
 * distinct value is held (strings copied) until the iterator is
 * destroyed. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_unique(cachew_dataset **out,
    cachew_dataset *in);
/* Yields the running state of a built-in reducer after each element of in
 * (tf.data's scan with a function whose output is its new state).
 * reducer is "sum", "prod", "min" or "max", combining the elements value
 * by value (every element must have the first's dtypes and shapes: u8,
 * i32, i64, f32 or f64; integers wrap), or "count" (an i64 scalar
 * counting the elements). initial is the state's first value in every
 * value, as a number literal ("0", "-3", "0.5"), or NULL for the
 * reducer's own (sum 0, prod 1, count 0; min and max start from the first
 * element). Reducers are named rather than user functions because a
 * function (cachew_op_def) carries no running state. Unknown reducers are
 * CACHEW_EINVAL, elements they cannot take CACHEW_ETYPE. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_scan(cachew_dataset **out,
    cachew_dataset *in, const char *reducer, const char *initial);
/* Reads the whole of in and yields one element, the reducer's final state
 * (tf.data's Dataset.reduce, as a dataset of one element); reducer and
 * initial as for cachew_dataset_scan. An empty input yields the initial
 * state, shaped by in's element spec (which must then be known, with
 * initial given for min and max). An infinite in is CACHEW_EINVAL here.
 * Since 0.2. */
CACHEW_API cachew_err cachew_dataset_reduce(cachew_dataset **out,
    cachew_dataset *in, const char *reducer, const char *initial);
/* Yields windows of in (tf.data's window): window k starts at position
 * k * shift (shift 0: size) and holds the elements at start, start +
 * stride, ..., size of them, or fewer at the end of in unless
 * drop_remainder. tf.data yields each window as a nested dataset; here a
 * window is one element, its elements stacked as batch stacks them (a
 * leading dimension of the window's length), i.e. tf.data's
 * window(...).flat_map(lambda w: w.batch(size)). size, shift and stride
 * from 1 to INT32_MAX (CACHEW_ERANGE otherwise). Since 0.2. */
CACHEW_API cachew_err cachew_dataset_window(cachew_dataset **out,
    cachew_dataset *in, int64_t size, int64_t shift, int64_t stride,
    int drop_remainder);
/* Groups the elements of in by key and yields each group of window_size
 * elements as one batch (tf.data's group_by_window with the reduce_func
 * `lambda key, window: window.batch(window_size)`). key_fn names a
 * registered map function (built-in such as "mod", registered from C or
 * from a plugin) whose output for an element is its key, one i64 scalar;
 * key_fn_params (NULL: none) go to its init. A group yields its batch as
 * soon as it holds window_size elements; at the end of in the groups
 * left are yielded in ascending key order, or dropped when drop_remainder
 * is nonzero. Every element of a group must have one shape (as for
 * batch). window_size from 1 to INT32_MAX (CACHEW_ERANGE otherwise); a
 * key function whose known output is not one i64 scalar is CACHEW_ETYPE
 * here, one that yields another key while iterating fails the iterator
 * with CACHEW_ETYPE. The groups hold their elements (references, no
 * copy) until they fill or in ends. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_group_by_window(cachew_dataset **out,
    cachew_dataset *in, const char *key_fn, const cachew_params *key_fn_params,
    int64_t window_size, int drop_remainder);
/* Batches elements of similar length (tf.data's
 * bucket_by_sequence_length). An element's length is dimension 0 of its
 * component element_length: a component's name, or its index in decimal
 * ("0", "2"); NULL is "0". The nboundaries bucket_boundaries must
 * increase strictly (each >= 1); bucket i holds the lengths in
 * [bucket_boundaries[i-1], bucket_boundaries[i]) and yields a batch when
 * it holds bucket_batch_sizes[i] elements (nboundaries + 1 sizes, each >=
 * 1). A batch is padded with pad_value (converted to each dtype; bytes
 * pad with empty strings) to its longest element, or with
 * pad_to_bucket_boundary nonzero every dimension in's element spec does
 * not know is padded to the bucket's boundary - 1 (an element of the
 * last bucket then fails the iterator with CACHEW_ERANGE, as in
 * tf.data); with no_padding nonzero it is stacked as batch stacks.
 * At the end of in the partial batches are yielded in bucket order, or
 * dropped when drop_remainder is nonzero. The arrays are copied.
 * Malformed boundaries or sizes are CACHEW_EINVAL, an unknown component
 * name CACHEW_ENOENT, a scalar length component CACHEW_ETYPE. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_bucket_by_sequence_length(
    cachew_dataset **out, cachew_dataset *in, const char *element_length,
    const int64_t *bucket_boundaries, size_t nboundaries,
    const int64_t *bucket_batch_sizes, double pad_value,
    int pad_to_bucket_boundary, int no_padding, int drop_remainder);
/* Batches n consecutive elements whose dimension 0 may vary (tf.data's
 * ragged_batch). A component whose shape in's element spec does not fully
 * know becomes two components: its flat values (the elements' rows one
 * after the other) and its row splits, a rank-1 tensor of n + 1 values of
 * row_splits_dtype (CACHEW_I64 or CACHEW_I32, else CACHEW_EINVAL) where
 * element i's rows are values[splits[i] .. splits[i+1]); the layout of a
 * tf.RaggedTensor of ragged_rank 1 (docs/element-spec.md). Components of
 * a fully known shape are stacked as batch stacks them. The elements'
 * dimensions after the first must agree within a batch (the iterator
 * fails with CACHEW_ETYPE otherwise). A short last batch is dropped when
 * drop_remainder is nonzero. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_ragged_batch(cachew_dataset **out,
    cachew_dataset *in, int64_t n, int drop_remainder,
    cachew_dtype row_splits_dtype);
/* Yields in's elements, dropping those whose map or filter function (below
 * it in the pipeline) failed with a data error: CACHEW_ECORRUPT (a corrupt
 * image given to decode_jpeg), CACHEW_ETYPE, CACHEW_ERANGE or CACHEW_EOP
 * (a function refused the element), as tf.data's ignore_errors. Other
 * errors (I/O, memory, cancellation, bad parameters) still end the
 * stream. Each dropped element counts in the node's `dropped`
 * (cachew_iterator_stats); with log_warning each is also logged at
 * CACHEW_LOG_WARN with the count so far. Cardinality unknown. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_ignore_errors(
    cachew_dataset **out, cachew_dataset *in, int log_warning);
/* Regroups the rows of in's batched elements (every component with the
 * same leading dimension) into batches of sizes[0] rows, or with nsizes >
 * 1 of sizes[0], sizes[1], ... in turn, taking rows across in's batch
 * boundaries (tf.data's rebatch). The last batch is smaller, or dropped
 * with drop_remainder, when the rows run out. sizes is read during the
 * call only. nsizes from 1 to 1024 and each size from 1 to INT32_MAX
 * (CACHEW_ERANGE otherwise); a scalar component is CACHEW_ETYPE. Since
 * 0.2. */
CACHEW_API cachew_err cachew_dataset_rebatch(cachew_dataset **out,
    cachew_dataset *in, const int64_t *sizes, size_t nsizes,
    int drop_remainder);
/* cachew_dataset_range with values of output_type (tf.data's
 * range(output_type=)): CACHEW_I64, CACHEW_I32, CACHEW_U8, CACHEW_F32 or
 * CACHEW_F64 (others are CACHEW_EINVAL). Integer dtypes must hold every
 * value (CACHEW_ERANGE otherwise); floats take the nearest value.
 * CACHEW_I64 builds the same dataset as cachew_dataset_range. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_range_typed(cachew_dataset **out,
    int64_t start, int64_t stop, int64_t step, cachew_dtype output_type);
/* Endless i64 pseudorandom values, uniform over [0, 2^63) (tf.data's
 * Dataset.random): cardinality CACHEW_CARDINALITY_INFINITE. seed >= 0
 * fixes the values; -1 derives them from the pipeline seed (the seed
 * option). With rerandomize_each_iteration each epoch (and each
 * repetition under repeat) gets new values, else every epoch repeats the
 * first's. seed below -1 is CACHEW_ERANGE. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_random(cachew_dataset **out,
    int64_t seed, int rerandomize_each_iteration);
/* cachew_dataset_padded_batch with a padding value per component
 * (tf.data's padding_values): pad_values is a literal in pipeline syntax,
 * a number ("0"), a list of one number per component ("[-1, 100]") or a
 * map by component name ("{label=-1}", the components it leaves out pad
 * with 0; it needs in's component names). Each value is converted to its
 * component's dtype (bytes components pad with empty strings). A list of
 * the wrong length, a name of no component or a non-number is
 * CACHEW_EINVAL here; a value a dtype cannot hold fails the iterator.
 * pad_values is read during the call only. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_padded_batch_values(
    cachew_dataset **out, cachew_dataset *in, int64_t n,
    const char *pad_values, int drop_remainder);
/* cachew_dataset_batch whose copy of each batch of 1 MiB or more is shared
 * by `parallel` threads (tf.data's num_parallel_calls for batch; 1 to 64,
 * or CACHEW_AUTO for the threads option, which also caps it): worth it for
 * large elements (decoded images). The batches are the same at any
 * parallelism and come in input order; deterministic is accepted for
 * tf.data's sake (nonzero or zero: the same order). Neither changes the
 * fingerprint. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_batch_parallel(cachew_dataset **out,
    cachew_dataset *in, int64_t n, int drop_remainder, int parallel,
    int deterministic);
/* Caches in's elements in memory (tf.data's cache() without a filename):
 * the first pass over the result that reads to its end keeps its
 * elements (references, no copy) with the dataset; later passes (new
 * iterators of *out, or repetitions under repeat) read them without
 * running in. A pass cut short keeps nothing. memory_limit bounds the
 * bytes held (0: the ram_budget option): a pass past it fails with
 * CACHEW_ENOMEM. The memory is freed with the dataset. Negative
 * memory_limit is CACHEW_ERANGE. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_cache_memory(cachew_dataset **out,
    cachew_dataset *in, int64_t memory_limit);
/* Replaces every element by the sequence the flat_map function fn yields
 * for it. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_flat_map(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params);
/* Takes blocks of `block` elements in turn from the sequences the
 * flat_map function fn opens for `cycle` input elements at a time, with
 * `parallel` threads reading ahead. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_interleave(cachew_dataset **out,
    cachew_dataset *in, const char *fn, const cachew_params *fn_params,
    int64_t cycle, int64_t block, int parallel);
/* Stacks n consecutive elements along a new leading dimension; a short
 * last batch is dropped when drop_remainder is nonzero. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_batch(cachew_dataset **out,
    cachew_dataset *in, int64_t n, int drop_remainder);
/* Stacks n consecutive elements, padding each component with pad_value to
 * a common shape. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_padded_batch(cachew_dataset **out,
    cachew_dataset *in, int64_t n, double pad_value, int drop_remainder);
/* Splits every element along dimension 0 into its rows. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_unbatch(
    cachew_dataset **out, cachew_dataset *in);
/* Shuffles through a buffer of `buffer` elements. seed -1: derived from
 * the pipeline seed; reshuffle: a new order each epoch (each repetition
 * under repeat). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_shuffle(cachew_dataset **out,
    cachew_dataset *in, int64_t buffer, int64_t seed, int reshuffle);
/* Repeats the input count times; count -1: forever. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_repeat(
    cachew_dataset **out, cachew_dataset *in, int64_t count);
/* The first n elements (-1: all). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_take(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
/* Drops the first n elements (-1: all) and yields the rest. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_skip(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
/* Produces up to n elements (or CACHEW_AUTO) ahead of the consumer on a
 * background thread. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_prefetch(
    cachew_dataset **out, cachew_dataset *in, int64_t n);
/* Keeps every num-th element, starting at position index. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_shard(cachew_dataset **out,
    cachew_dataset *in, int64_t num, int64_t index);
/* Joins the components of one element from each of the n inputs (1 to
 * 64); ends with the shortest input. The inputs array stays the caller's.
 * Since 0.1. */
CACHEW_API cachew_err cachew_dataset_zip(
    cachew_dataset **out, cachew_dataset *const *inputs, size_t n);
/* Yields a's elements, then b's (same components and dtypes). Since 0.1. */
CACHEW_API cachew_err cachew_dataset_concatenate(
    cachew_dataset **out, cachew_dataset *a, cachew_dataset *b);
/* Draws each element from one of the n inputs (1 to 64) at random, input
 * i with probability weights[i] / sum(weights) (tf.data's
 * sample_from_datasets: the data mixtures of pre-training). weights holds
 * n finite values >= 0, not all 0, and is copied; NULL draws uniformly.
 * seed -1 derives the draws from the pipeline seed; they change each
 * epoch. An input that ends leaves the draw and the others go on, unless
 * stop_on_empty_dataset is nonzero: then the first input found empty
 * ends the dataset. The inputs' element specs must agree (CACHEW_ETYPE
 * here otherwise); a weights array of another length or with a negative
 * value is CACHEW_EINVAL. The inputs array stays the caller's.
 * Since 0.2. */
CACHEW_API cachew_err cachew_dataset_sample_from_datasets(cachew_dataset **out,
    cachew_dataset *const *inputs, size_t n, const double *weights,
    int64_t seed, int stop_on_empty_dataset);
/* For each element of choice (scalar integers), yields the next element
 * of inputs[that integer] (tf.data's choose_from_datasets): deterministic
 * given the choice dataset. With stop_on_empty_dataset nonzero (tf.data's
 * default) the first choice of an input that has ended ends the dataset;
 * with 0 such choices are skipped. A choice outside [0, n) fails the
 * iteration with CACHEW_EINVAL. n from 1 to 63; the inputs' element specs
 * must agree and choice's must be a scalar integer (CACHEW_ETYPE here
 * otherwise). The inputs array stays the caller's. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_choose_from_datasets(cachew_dataset **out,
    cachew_dataset *const *inputs, size_t n, cachew_dataset *choice,
    int stop_on_empty_dataset);
/* Prepends an i64 counter component, counting from start. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_enumerate(
    cachew_dataset **out, cachew_dataset *in, int64_t start);
/* Marks a point the cache policy may cache; passes elements through.
 * Since 0.1. */
CACHEW_API cachew_err cachew_dataset_autocache(
    cachew_dataset **out, cachew_dataset *in);

/* Introspection. Each result is borrowed from ds and valid while the
 * caller holds its reference to ds; ds is immutable, so these never
 * change and are safe from any thread. */

/* The operator's name ("map", "range"). Since 0.1. */
CACHEW_API const char *cachew_dataset_op(const cachew_dataset *ds);
/* The number of input pipelines (0 for a source). Since 0.1. */
CACHEW_API size_t cachew_dataset_num_inputs(const cachew_dataset *ds);
/* Input i, borrowed (retain it to keep it past ds); NULL for i out of
 * range. Since 0.1. */
CACHEW_API cachew_dataset *cachew_dataset_input(
    const cachew_dataset *ds, size_t i);
/* The canonical parameters, every one explicit, read-only and borrowed.
 * Since 0.1. */
CACHEW_API const cachew_params *cachew_dataset_params(const cachew_dataset *ds);

/* The canonical pipeline string (every parameter explicit, keys in a fixed
 * order); it parses back to a dataset with the same fingerprint. The caller
 * owns *out and frees it with cachew_free. CACHEW_EINVAL for a NULL
 * argument, CACHEW_ENOMEM. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_to_string(
    const cachew_dataset *ds, char **out);
/* Canonical msgpack (docs/graph-format.md) in *buf, *len bytes; the caller
 * owns *buf and frees it with cachew_free. CACHEW_EINVAL for a NULL
 * argument, CACHEW_ENOMEM. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_to_msgpack(
    const cachew_dataset *ds, void **buf, size_t *len);
/* Decodes and validates a serialized graph: hostile input gets an error
 * with a cachew_errmsg() naming the node, never a crash or a huge
 * allocation. Malformed bytes are CACHEW_EPARSE; each node is then built
 * as cachew_dataset_apply builds it, with its errors. buf is only read;
 * the caller owns *out (one reference). Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_from_msgpack(
    cachew_dataset **out, const void *buf, size_t len);

/* 128-bit structural fingerprint (XXH3-128) of ds and everything upstream:
 * operators, every parameter that changes the data (not parallelism or
 * buffer sizes), and the identity (path, size, mtime) of input files. Equal
 * across runs, machines and serialization round trips. A plain value,
 * copied freely: thread safe. */
typedef struct cachew_fingerprint {
	uint64_t hi;
	uint64_t lo;
} cachew_fingerprint;

/* Copies ds's fingerprint, computed when ds was built, into *out.
 * CACHEW_EINVAL for a NULL argument. Thread safe. Since 0.1. */
CACHEW_API cachew_err cachew_dataset_fingerprint(
    const cachew_dataset *ds, cachew_fingerprint *out);
/* Writes fp as 32 lowercase hex digits (hi, then lo) and a NUL into the
 * caller's out. Thread safe. Since 0.1. */
CACHEW_API void cachew_fingerprint_hex(
    const cachew_fingerprint *fp, char out[33]);

/* Element specs and cardinality, computed when a dataset is built (tf.data's
 * element_spec and cardinality()). Each operator's rule, and how
 * components are named, is in docs/element-spec.md. */

/* Cardinalities other than a count: the dataset never ends (repeat()), or
 * how many elements it yields is not known before iterating it (filter,
 * files not yet read, user functions). The same values as tf.data's
 * INFINITE_CARDINALITY and UNKNOWN_CARDINALITY. Since 0.2. */
#define CACHEW_CARDINALITY_INFINITE (-1)
#define CACHEW_CARDINALITY_UNKNOWN (-2)

/* Elements per epoch of ds (0 or more), CACHEW_CARDINALITY_INFINITE or
 * CACHEW_CARDINALITY_UNKNOWN; UNKNOWN for a NULL ds. Thread safe.
 * Since 0.2. */
CACHEW_API int64_t cachew_dataset_cardinality(const cachew_dataset *ds);
/* The number of components of ds's elements, or 0 when their structure is
 * not known when building (downstream of a function registered from C or
 * a plugin, which does not declare what it yields). Thread safe.
 * Since 0.2. */
CACHEW_API size_t cachew_dataset_num_components(const cachew_dataset *ds);
/* Component i of ds's element spec: its dtype (CACHEW_INVALID when not
 * known), rank (-1 when not known), dimensions (shape holds
 * CACHEW_MAX_RANK entries; the first rank are set, -1 for a dimension
 * not known, such as a batch's without drop_remainder) and name (borrowed
 * for the life of ds; NULL when unnamed). Each out pointer may be NULL.
 * CACHEW_EINVAL for a NULL ds or i >= cachew_dataset_num_components.
 * Thread safe. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_component(const cachew_dataset *ds,
    size_t i, cachew_dtype *dtype, int *rank, int64_t *shape,
    const char **name);
/* The index of ds's component named `name` in *index. CACHEW_ENOENT when
 * no component has that name (cachew_errmsg() lists the names there are),
 * CACHEW_EINVAL for a NULL argument. Thread safe. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_component_find(
    const cachew_dataset *ds, const char *name, size_t *index);
/* ds's element spec as text, as `cachew explain` prints it: "i64[]" (one
 * component), "(i64[], bytes[])", "{image: u8[-1,-1,3], label: i64[]}"
 * (named components) or "?" (not known); "u8[?]" is a component whose
 * rank is not known, "?[]" one whose dtype is not. The caller owns *out
 * and frees it with cachew_free. CACHEW_EINVAL, CACHEW_ENOMEM. Thread
 * safe. Since 0.2. */
CACHEW_API cachew_err cachew_dataset_spec_str(
    const cachew_dataset *ds, char **out);

/* ------------------------------------------------------------------------ */
/* Iterators: the executor                                                  */
/* ------------------------------------------------------------------------ */

/* Runs a dataset. The caller owns an iterator and frees it with
 * cachew_iterator_destroy(); it holds its own reference to the dataset and
 * its own copy of the options. Destroying an iterator mid-stream stops its
 * threads and frees all. An iterator does not cross fork(): its threads
 * stay in the parent. A child creates its own iterators (datasets and
 * options cross fine); an inherited iterator is left alone by
 * cachew_iterator_destroy in the child, and must not be read there.
 * One thread at a time (cachew_iterator_stats and cachew_iterator_cancel
 * excepted); its worker threads are internal, and operator functions run
 * on them. Since 0.2,
 * cachew_iterator_next on an inherited iterator fails at once with
 * CACHEW_ECLOSED ("inherited through fork()"), and a child of a process
 * that used a remote service (nng: tcp://, ipc://, tls+tcp://) cannot use
 * one itself: its iterators through one fail with CACHEW_ENOTSUP saying
 * so, where nng would abort the process; the embedded service and the
 * plain executor work in any child. */
typedef struct cachew_iterator cachew_iterator;

/* Starts running ds, where the "service" option says (the embedded
 * default, a dispatcher, or the plain executor). opts may be NULL (all
 * defaults) and is copied, so it may be destroyed right after; ds is not
 * consumed: the iterator takes its own reference. On success the caller
 * owns *out. CACHEW_EINVAL for a NULL argument; a service that cannot be
 * reached or refuses the pipeline, or a pipeline that cannot start, gives
 * its error with a cachew_errmsg() (*out untouched). Thread safe: several
 * threads may create iterators, over one dataset too. Since 0.1. */
CACHEW_API cachew_err cachew_iterator_create(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts);
/* Yields the next element (the caller owns one reference and releases it
 * with cachew_element_release; it may go to another thread), CACHEW_EOF
 * at the end, or the error that stopped the pipeline, with its detail in
 * cachew_iterator_errmsg(); after an error or EOF every later call returns
 * the same code and leaves *out alone. One thread at a time. Since 0.1. */
CACHEW_API cachew_err cachew_iterator_next(
    cachew_iterator *it, cachew_element **out);
/* cachew_iterator_next with a bound on the wait: when no element, end or
 * error came within timeout_ms (0: only what is ready at once; negative:
 * no bound, as cachew_iterator_next), it returns CACHEW_OK with *out set
 * to NULL. That is not CACHEW_ETIMEDOUT on purpose: a pipeline fails with
 * CACHEW_ETIMEDOUT, for good, when a service call times out, and a
 * caller that waited again on it would wait forever. A wait that runs out
 * is not sticky and loses nothing: the pull it started goes on in the
 * background (on a thread the first timed call starts, which every later
 * pull then runs on), and the next call, timed or not, gets its result.
 * So a caller can wait in slices and look at other things in between (a
 * Python binding checks for Ctrl-C every 50 ms). Whatever the pipeline is
 * doing (decoding, or waiting for a worker that does not answer), the
 * call returns on time. Nothing runs ahead of the caller: the elements,
 * their order and a saved position are those of cachew_iterator_next.
 * Other results, and cachew_iterator_errmsg(), as for
 * cachew_iterator_next; CACHEW_EINVAL for a NULL argument; CACHEW_ENOMEM
 * when its thread cannot start (then sticky). One thread at a time (with
 * cachew_iterator_next and the other calls on it). Since 0.2. */
CACHEW_API cachew_err cachew_iterator_next_timeout(
    cachew_iterator *it, cachew_element **out, int64_t timeout_ms);
/* Stops the iterator from another thread: a cachew_iterator_next or
 * cachew_iterator_next_timeout blocked on it returns CACHEW_ECANCELED
 * promptly (a timed one at once; an untimed one as soon as what it waits
 * on wakes: threaded operators and the service's stream do at once, a
 * function running on the caller's thread when it returns), and so does
 * every later call, with cachew_iterator_errmsg() "iterator: canceled"
 * unless an error was recorded first. Elements already returned stay
 * valid; the iterator must still be destroyed, which then does not wait
 * for the stream the canceled call was reading. Canceling twice, or after
 * the end, is harmless. Thread safe with respect to the iterator's other
 * calls, except cachew_iterator_destroy: it must not race with or follow
 * it. NULL is a no-op. Since 0.2. */
CACHEW_API void cachew_iterator_cancel(cachew_iterator *it);
/* The detail of the error that stopped the pipeline ("map(add): ...
 * (element 17)"), the first one recorded: empty, never NULL, before any.
 * Owned by it and valid until it is destroyed; it no longer changes once
 * cachew_iterator_next has returned the error. Since 0.1. */
CACHEW_API const char *cachew_iterator_errmsg(const cachew_iterator *it);
/* Stops the iterator's threads, releases the elements it still holds and
 * its reference to the dataset, and frees it; elements already returned
 * stay valid. Must not race with another call on it. NULL is a no-op; in
 * a forked child, an inherited iterator is left alone (see above).
 * Since 0.1. */
CACHEW_API void cachew_iterator_destroy(cachew_iterator *it);

/* Saves the iterator's position, for a training program to checkpoint it
 * with its model: the elements cachew_iterator_next has returned so far
 * are behind it, every other element of the run is ahead (those its
 * operators computed or buffered but did not yet return are in the state,
 * and come again after a restore). The iterator is left as it was:
 * iteration may go on, and saving again later is fine. *state is a
 * malloc'd document of *len bytes (free it with free()); it holds the
 * buffered elements, so its size follows the buffers (a shuffle's above
 * all). An iterator that reads from a service (the embedded default or a
 * dispatcher's URL) saves what it received of its job and still holds;
 * only a private, exactly-once job can (a job_name, num_consumers or
 * exactly_once=false is CACHEW_ENOTSUP, saying which). Errors:
 * CACHEW_EINVAL for a NULL argument; CACHEW_ENOTSUP when an operator of
 * the pipeline cannot save its position (the message names it) or the job
 * cannot; an iterator that failed gives its error; CACHEW_ENOMEM. Details
 * in cachew_errmsg(). One thread at a time, with the iterator's other
 * calls. Since 0.3 (through a service: 0.4). */
CACHEW_API cachew_err cachew_iterator_save(
    cachew_iterator *it, void **state, size_t *len);
/* Creates an iterator of ds that continues from a state that
 * cachew_iterator_save wrote: it yields exactly the elements the saved
 * iterator had not yet returned (in the same order where the run is
 * deterministic). ds must be the same pipeline (its fingerprint is
 * checked) and opts (may be NULL) must agree with the saved run on what
 * changes the data: seed (an unset seed takes the saved one), epoch and
 * deterministic; threads, buffer sizes and the RAM budget may differ. A
 * position the plain executor saved continues on it (options naming a
 * service are CACHEW_EINVAL); one saved through a service continues on
 * the service the options name, the embedded one when they name none
 * (service=local is CACHEW_EINVAL), in a new job that leaves out what the
 * saved iterator had received: any dispatcher and workers will do, the
 * same or others, as long as the input is the same. state is only read
 * (the caller keeps it). Errors: CACHEW_EINVAL for a NULL argument,
 * another pipeline or an option that differs (the message names it), or
 * an input whose split units changed; CACHEW_ECORRUPT for a state that
 * is not well formed (the message says what and at which byte);
 * CACHEW_ENOTSUP for a state of a newer format; the service's and the
 * pipeline's own errors as cachew_iterator_create. On success the caller
 * owns *out. Thread safe. Since 0.3 (through a service: 0.4). */
CACHEW_API cachew_err cachew_iterator_restore(cachew_iterator **out,
    cachew_dataset *ds, const cachew_options *opts, const void *state,
    size_t len);

/* Per-operator counters, one row per graph node in pipeline order (sources
 * first). Through a service the rows are the same: those of the operators
 * that run on workers are summed over the job's workers, and exact once
 * an epoch has been read to its end (before that, as recently reported).
 * A plain value in the caller's memory; its strings are borrowed from the
 * iterator and valid until it is destroyed. Thread safe to read once
 * filled. */
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
	uint64_t dropped;     /* ignore_errors: elements dropped for a data
			       * error below it (0 for other operators).
			       * Since 0.2. */
	uint64_t cache_hit_bytes; /* of bytes, those read from a cache rather
				   * than computed: all of a cache_get's, a
				   * cache's on a pass that found its cache
				   * complete, an in-memory cache()'s after
				   * its first pass (0 for other
				   * operators). Since 0.4. */
} cachew_op_stats;

/* Copies up to cap rows into the caller's out and the total count into *n
 * (call with cap 0 to size the array). The counters are read atomically,
 * each on its own, so a row is a recent snapshot rather than one instant.
 * Thread safe with respect to cachew_iterator_next on the same iterator
 * (a monitoring thread may poll it), not with its destruction. Since 0.1.
 */
CACHEW_API cachew_err cachew_iterator_stats(
    cachew_iterator *it, cachew_op_stats *out, size_t cap, size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* CACHEW_H */
