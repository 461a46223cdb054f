/*
 * transport_bench.c - W6's cachew side: element transfer through the
 * transport API (transports/transport.h), the path a worker streams
 * batches to a client on. Compare with bench/nng_raw.c on the same URL
 * kind and element size.
 *
 *   transport_bench [--url URL] [--size BYTES] [--batch K] [--count N]
 *                   [--inflight W] [--warmup N] [--tls-dir DIR]
 *
 * A server answers every get-next request at once with K elements of
 * --size bytes (u8 tensors viewing one shared buffer, as a worker's
 * output would be refcounted); the client keeps W requests in flight on
 * one connection, collects replies as they come (a completion queue),
 * touches one byte per 4 KiB page of every element so the data is really
 * delivered, releases them and asks again. N counts elements. Defaults:
 * tcp://127.0.0.1:0, 1 MiB, K = max(1, 1 MiB / size), N = 2000, W = 4.
 * A tls+tcp:// URL takes DIR's server.pem, server.key and ca.pem (what
 * bench/w6.py makes with openssl).
 *
 * Copies, per element, on nng: one on the sender (encoded straight into
 * the nng_msg, which nng allocates zeroed), none on the receiver (tensors
 * view the received message); then the kernel's on each end. inproc
 * copies nothing. The client's dial tunes malloc as every nng client's
 * does (CACHEW_MALLOPT, transports/nng/nng_transport.c); nng_raw runs
 * with glibc's defaults, which serve its one message at a time well.
 *
 * The last stdout line is one JSON object:
 *   {"bench":"transport","url":...,"size":...,"batch":...,"count":...,
 *    "inflight":...,"seconds":...,"gbps":...}
 *
 * Build: cc -std=c11 -D_GNU_SOURCE -O2 -Iinclude -o build/transport_bench \
 *          bench/transport_bench.c build/libcachew.a <DEP_LIBS of the Makefile>
 */
#include "../transports/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct server {
	cwi_element *elem; /* the shared element every reply carries */
	unsigned batch;
} server;

static void
on_request(void *arg, cwi_request *r)
{
	server *s = arg;
	cwi_msg *m;

	if (cwi_msg_create(&m) != CACHEW_OK ||
	    cwi_msg_set_header(m, "batch", 5) != CACHEW_OK) {
		cwi_msg_destroy(m);
		cwi_request_fail(r, CACHEW_ENOMEM, "out of memory");
		return;
	}
	for (unsigned i = 0; i < s->batch; i++) {
		cwi_element_retain(s->elem);
		if (cwi_msg_push(m, s->elem) != CACHEW_OK) {
			cwi_element_release(s->elem);
			break;
		}
	}
	if (cwi_request_reply(r, m) != CACHEW_OK)
		cwi_msg_destroy(m);
}

static cachew_err
ask(cwi_conn *c, cwi_cq *q, uint64_t tag)
{
	cwi_msg *m;
	cachew_err rv = cwi_msg_create(&m);

	if (rv == CACHEW_OK)
		rv = cwi_msg_set_header(m, "next", 4);
	if (rv == CACHEW_OK)
		rv = cwi_conn_send(c, m, 30000, q, tag);
	if (rv != CACHEW_OK)
		cwi_msg_destroy(m);
	return rv;
}

static int
usage(void)
{
	fprintf(stderr, "usage: transport_bench [--url URL] [--size BYTES] "
			"[--batch K] [--count N] [--inflight W] [--warmup N] "
			"[--tls-dir DIR]\n");
	return 2;
}

int
main(int argc, char **argv)
{
	const char *url = "tcp://127.0.0.1:0", *tls_dir = NULL;
	char cert[512], key[512], ca[512];
	size_t size = 1 << 20;
	long count = 2000, warmup = 50, batch = 0, inflight = 4;
	cwi_transport_opts o;
	cwi_listener *l = NULL;
	cwi_conn *c = NULL;
	cwi_cq *q = NULL;
	server s;
	uint8_t *data;
	int64_t shape[1];
	long got = 0, asked = 0;
	double t0 = 0, t1;
	volatile uint8_t sink = 0;
	cachew_err rv;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
			url = argv[++i];
		else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
			size = strtoull(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
			batch = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
			count = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--inflight") == 0 && i + 1 < argc)
			inflight = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
			warmup = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--tls-dir") == 0 && i + 1 < argc)
			tls_dir = argv[++i];
		else
			return usage();
	}
	if (batch <= 0)
		batch = size >= (1 << 20) ? 1 : (long)((1 << 20) / size);
	if (count <= 0 || warmup < 0 || size == 0 || inflight <= 0)
		return usage();

	s.batch = (unsigned)batch;
	s.elem = cwi_element_new(1);
	shape[0] = (int64_t)size;
	if (s.elem == NULL ||
	    cwi_tensor_init_alloc(&s.elem->comp[0], CACHEW_U8, 1, shape, false,
		&data) != CACHEW_OK) {
		fprintf(stderr, "transport_bench: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < size; i++)
		data[i] = (uint8_t)(i * 7);

	cwi_transport_opts_init(&o);
	o.max_msg_size = (size_t)batch * size + (1 << 20);
	if (tls_dir != NULL) {
		snprintf(cert, sizeof(cert), "%s/server.pem", tls_dir);
		snprintf(key, sizeof(key), "%s/server.key", tls_dir);
		snprintf(ca, sizeof(ca), "%s/ca.pem", tls_dir);
		o.tls_cert = cert;
		o.tls_key = key;
		o.tls_ca = ca;
	}
	if ((rv = cwi_listen(&l, url, &o, on_request, &s)) != CACHEW_OK ||
	    (rv = cwi_dial(&c, cwi_listener_url(l), &o)) != CACHEW_OK ||
	    (rv = cwi_cq_create(&q)) != CACHEW_OK) {
		fprintf(stderr, "transport_bench: %s: %s\n", url,
		    cachew_errmsg());
		return 1;
	}
	/* Elements, counted in replies of `batch`. */
	long replies = (warmup + count + batch - 1) / batch;
	long warm_replies = (warmup + batch - 1) / batch;
	for (; asked < inflight && asked < replies; asked++)
		if (ask(c, q, (uint64_t)asked) != CACHEW_OK)
			goto fail;
	while (got < replies) {
		cwi_completion comp;
		if (got == warm_replies)
			t0 = (double)cwi_now_ns() * 1e-9;
		if (cwi_cq_wait(q, 30000, &comp) != CACHEW_OK ||
		    comp.err != CACHEW_OK)
			goto fail;
		for (size_t i = 0; i < cwi_msg_count(comp.reply); i++) {
			const cwi_tensor *t = &cwi_msg_element(comp.reply, i)
						   ->comp[0];
			const uint8_t *b = cwi_tensor_data(t);
			size_t n = cwi_tensor_nbytes(t);
			for (size_t k = 0; k < n; k += 4096)
				sink ^= b[k];
		}
		cwi_msg_destroy(comp.reply);
		got++;
		if (asked < replies) {
			if (ask(c, q, (uint64_t)asked) != CACHEW_OK)
				goto fail;
			asked++;
		}
	}
	t1 = (double)cwi_now_ns() * 1e-9;
	(void)sink;
	{
		long measured = (replies - warm_replies) * batch;
		printf("{\"bench\":\"transport\",\"url\":\"%s\",\"size\":%zu,"
		       "\"batch\":%ld,\"count\":%ld,\"inflight\":%ld,"
		       "\"seconds\":%.6f,\"gbps\":%.3f}\n",
		    url, size, batch, measured, inflight, t1 - t0,
		    (double)size * (double)measured / (t1 - t0) / 1e9);
	}
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	cwi_listener_destroy(l);
	cwi_element_release(s.elem);
	return 0;

fail:
	fprintf(stderr, "transport_bench: %s: %s\n", url, cachew_errmsg());
	return 1;
}
