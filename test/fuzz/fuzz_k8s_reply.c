/*
 * fuzz_k8s_reply.c - the kubernetes provisioner's reading of replies
 * (jansson, io_json.h) over hostile bytes (an API server, or whatever
 * answers at its address).
 *
 * Both readers must return without reading past `size`, whatever the
 * nesting, escapes or truncation; a refused Scale says why; a message
 * must be NUL-terminated within its buffer and free of control
 * characters.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/provision/provision.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* An exact-size copy: ASan sees any read past the end. */
	char *body = malloc(size > 0 ? size : 1);
	char msg[64], why[128];
	uint32_t replicas = 0;

	if (body == NULL)
		return 0;
	if (size > 0)
		memcpy(body, data, size);
	why[0] = '\0';
	if (!cwi_k8s_scale_replicas(body, size, &replicas, why, sizeof(why)) &&
	    why[0] == '\0')
		abort();
	memset(msg, 'x', sizeof(msg));
	if (cwi_k8s_status_message(body, size, msg, sizeof(msg))) {
		size_t n = strnlen(msg, sizeof(msg));
		if (n == sizeof(msg))
			abort();
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)msg[i] < 0x20)
				abort();
	}
	free(body);
	return 0;
}
