/*
 * nng_raw.c - the W6 baseline: raw nng push/pull throughput of fixed-size
 * messages between two threads of one process, over tcp://, ipc:// or
 * tls+tcp:// (nng's TLS, mbedTLS).
 * Nothing of cachew is linked: this is what the transport would reach if
 * it added no cost at all.
 *
 *   nng_raw [--url URL] [--size BYTES] [--count N] [--warmup N]
 *           [--tls-dir DIR]
 *
 * A tls+tcp:// URL takes DIR's server.pem and server.key (the listener)
 * and ca.pem (the dialer checks the listener's certificate against it),
 * as bench/w6.py makes them.
 * URL defaults to tcp://127.0.0.1:0 (an ephemeral port); ipc:///tmp/x
 * works too. The sender allocates a fresh message per send (as a worker
 * producing new data would) and fills it once per run, not per message:
 * filling is the producer's cost, not the transfer's. The receiver
 * touches one byte per 4 KiB page so that the data is really delivered,
 * then frees the message. The last stdout line is one JSON object:
 *   {"bench":"nng_raw","url":...,"size":...,"count":...,"seconds":...,
 *    "gbps":...}
 * (gbps = 1e9 bytes per second of message payload).
 *
 * Build: cc -O2 -o build/nng_raw bench/nng_raw.c -lnng -lpthread
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct sender {
	const char *url;
	nng_tls_config *tls; /* tls+tcp: the dialer's */
	size_t size;
	long count;
	int rv;
	const char *what;
} sender;

static double
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *
send_main(void *arg)
{
	sender *s = arg;
	nng_socket push;
	nng_dialer d;
	nng_msg *m;
	int rv;

	if ((rv = nng_push0_open(&push)) != 0) {
		s->what = "push0_open";
		goto out;
	}
	if ((rv = nng_dialer_create(&d, push, s->url)) != 0 ||
	    (s->tls != NULL &&
		(rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, s->tls)) != 0) ||
	    (rv = nng_dialer_start(d, 0)) != 0) {
		s->what = "dial";
		nng_close(push);
		goto out;
	}
	for (long i = 0; i < s->count; i++) {
		if ((rv = nng_msg_alloc(&m, s->size)) != 0) {
			s->what = "msg_alloc";
			break;
		}
		/* A marker per message; the rest is whatever malloc gave. */
		if (s->size >= 8)
			memcpy(nng_msg_body(m), &i, sizeof(i));
		if ((rv = nng_sendmsg(push, m, 0)) != 0) {
			nng_msg_free(m);
			s->what = "sendmsg";
			break;
		}
	}
	/* Linger: nng_close may drop queued messages; the receiver counts
	 * what arrives, and the sender's last send returned once the pipe
	 * took it, so wait for the receiver to finish instead. */
	nng_msleep(200);
	nng_close(push);
out:
	s->rv = rv;
	return NULL;
}

static int
usage(void)
{
	fprintf(stderr, "usage: nng_raw [--url URL] [--size BYTES] "
			"[--count N] [--warmup N] [--tls-dir DIR]\n");
	return 2;
}

/* DIR/name, whole, NUL-terminated; NULL if unreadable. */
static char *
slurp(const char *dir, const char *name)
{
	char path[1024];
	FILE *f;
	char *buf = NULL;
	long n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((f = fopen(path, "r")) == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
		buf[fread(buf, 1, (size_t)n, f)] = '\0';
	}
	fclose(f);
	return buf;
}

/* The TLS configurations of both ends from dir: the listener's (server
 * certificate and key) and the dialer's (the CA; the name 127.0.0.1). */
static int
tls_configs(const char *dir, nng_tls_config **srv, nng_tls_config **cli)
{
	char *cert = slurp(dir, "server.pem"), *key = slurp(dir, "server.key");
	char *ca = slurp(dir, "ca.pem");
	int rv = NNG_ENOENT;

	if (cert != NULL && key != NULL && ca != NULL &&
	    (rv = nng_tls_config_alloc(srv, NNG_TLS_MODE_SERVER)) == 0 &&
	    (rv = nng_tls_config_own_cert(*srv, cert, key, NULL)) == 0 &&
	    (rv = nng_tls_config_alloc(cli, NNG_TLS_MODE_CLIENT)) == 0 &&
	    (rv = nng_tls_config_ca_chain(*cli, ca, NULL)) == 0)
		rv = nng_tls_config_server_name(*cli, "127.0.0.1");
	free(cert);
	free(key);
	free(ca);
	return rv;
}

int
main(int argc, char **argv)
{
	const char *url = "tcp://127.0.0.1:0", *tls_dir = NULL;
	nng_tls_config *tls_srv = NULL, *tls_cli = NULL;
	size_t size = 1 << 20;
	long count = 2000, warmup = 50;
	char bound[256];
	nng_socket pull;
	nng_listener l;
	pthread_t tid;
	sender s;
	double t0 = 0, t1;
	volatile uint8_t sink = 0;
	int rv;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
			url = argv[++i];
		else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
			size = strtoull(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
			count = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
			warmup = strtol(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--tls-dir") == 0 && i + 1 < argc)
			tls_dir = argv[++i];
		else
			return usage();
	}
	if (count <= 0 || warmup < 0 || size == 0)
		return usage();

	if (tls_dir != NULL &&
	    (rv = tls_configs(tls_dir, &tls_srv, &tls_cli)) != 0) {
		fprintf(stderr, "nng_raw: TLS files of %s: %s\n", tls_dir,
		    nng_strerror(rv));
		return 1;
	}
	if ((rv = nng_pull0_open(&pull)) != 0 ||
	    (rv = nng_socket_set_size(pull, NNG_OPT_RECVMAXSZ, size + 1024)) !=
		0 ||
	    (rv = nng_listener_create(&l, pull, url)) != 0 ||
	    (tls_srv != NULL &&
		(rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tls_srv)) !=
		    0) ||
	    (rv = nng_listener_start(l, 0)) != 0) {
		fprintf(stderr, "nng_raw: listen %s: %s\n", url,
		    nng_strerror(rv));
		return 1;
	}
	snprintf(bound, sizeof(bound), "%s", url);
	if (strncmp(url, "tcp://", 6) == 0 ||
	    strncmp(url, "tls+tcp://", 10) == 0) {
		int port;
		const char *colon = strrchr(url, ':');
		if (nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) ==
			0 &&
		    colon != NULL)
			snprintf(bound, sizeof(bound), "%.*s:%d",
			    (int)(colon - url), url, port);
	}

	s = (sender){.url = bound, .tls = tls_cli, .size = size,
	    .count = warmup + count};
	if (pthread_create(&tid, NULL, send_main, &s) != 0) {
		fprintf(stderr, "nng_raw: pthread_create failed\n");
		return 1;
	}
	for (long i = 0; i < warmup + count; i++) {
		nng_msg *m;
		if (i == warmup)
			t0 = now_s();
		if ((rv = nng_recvmsg(pull, &m, 0)) != 0) {
			fprintf(stderr, "nng_raw: recv: %s\n", nng_strerror(rv));
			return 1;
		}
		{
			const uint8_t *b = nng_msg_body(m);
			size_t n = nng_msg_len(m);
			for (size_t k = 0; k < n; k += 4096)
				sink ^= b[k];
		}
		nng_msg_free(m);
	}
	t1 = now_s();
	pthread_join(tid, NULL);
	nng_close(pull);
	if (s.rv != 0) {
		fprintf(stderr, "nng_raw: sender %s: %s\n", s.what,
		    nng_strerror(s.rv));
		return 1;
	}
	(void)sink;
	printf("{\"bench\":\"nng_raw\",\"url\":\"%s\",\"size\":%zu,"
	       "\"count\":%ld,\"seconds\":%.6f,\"gbps\":%.3f}\n",
	    url, size, count, t1 - t0,
	    (double)size * (double)count / (t1 - t0) / 1e9);
	return 0;
}
