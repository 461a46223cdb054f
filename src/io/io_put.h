/*
 * io_put.h - writing and deleting whole remote objects (s3://bucket/key),
 * for the cache store's S3 roots. Reading goes through io.h.
 *
 * An object PUT is atomic on S3: readers see the old object or the whole
 * new one, never a part. Errors follow io.h's mapping and name the URL.
 */
#ifndef CWI_IO_PUT_H
#define CWI_IO_PUT_H

#include "io.h"

/* Uploads len bytes as the object at url (s3:// only), replacing it.
 * Retries like reads do. CACHEW_ENOTSUP for other schemes. Thread safe. */
cachew_err cwi_io_put(const char *url, const void *data, size_t len,
    const cwi_io_opts *opts);
/* Deletes the object at url; an absent object is not an error. */
cachew_err cwi_io_delete(const char *url, const cwi_io_opts *opts);

#endif /* CWI_IO_PUT_H */
