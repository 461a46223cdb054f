/*
 * options.h - the resolved values of a cachew_options object.
 */
#ifndef CWI_OPTIONS_H
#define CWI_OPTIONS_H

#include "core.h"

#define CWI_OPT_STR_MAX 256
/* The default of max_element_bytes: 1 GiB. Above every legitimate element
 * of the workloads this library serves (a batch of 1024 224x224x3 u8
 * crops is 154 MB; the largest JPEG decode_jpeg accepts, 2^27 pixels, is
 * 384 MiB), and below what one pipeline thread can allocate on a worker
 * without being killed: a 7 KB JPEG resized to 65535 x 65535 would ask
 * for 12.6 GB. */
#define CWI_MAX_ELEMENT_BYTES ((int64_t)1 << 30)

typedef struct cwi_opts {
	int64_t threads;    /* 0 = online CPUs */
	int64_t ram_budget; /* 0 = half of available memory */
	int64_t seed;       /* -1 = random */
	int deterministic;
	int autotune;
	int64_t epoch;
	int64_t max_element_bytes; /* what an operator may allocate for one
				    * element's output */
	char service[CWI_OPT_STR_MAX];
	/* service mode (the client) */
	char job_name[CWI_OPT_STR_MAX];
	char processing_mode[CWI_OPT_STR_MAX];
	int64_t num_consumers;
	int64_t consumer_index;
	int64_t workers;
	char compression[CWI_OPT_STR_MAX];
	char client_tail[CWI_OPT_STR_MAX];
	int64_t client_buffer;
	int exactly_once;
	int64_t dispatcher_absence_ms;
	int64_t service_timeout_ms;
	char token_file[CWI_OPT_STR_MAX]; /* "" = CACHEW_TOKEN_FILE */
	/* service autoscaling of this job */
	char scale_policy[CWI_OPT_STR_MAX]; /* "" = the dispatcher's */
	int64_t job_weight;
	int64_t min_workers; /* 0 = the policy's default */
	int64_t max_workers; /* 0 = no bound but the pool */
	/* TLS of tls+tcp:// services ("" = CACHEW_TLS_<NAME>, else none) */
	char tls_ca[CWI_OPT_STR_MAX];
	char tls_cert[CWI_OPT_STR_MAX];
	char tls_key[CWI_OPT_STR_MAX];
	char tls_server_name[CWI_OPT_STR_MAX];
	/* Not an option a user sets (no table entry): a worker sets it for
	 * the leases of a task whose records only the kernel reads, so file
	 * sources may map files rather than read them (cwi_rec_config.map). */
	int map_reads;
} cwi_opts;

void cwi_opts_defaults(cwi_opts *o);
const cwi_opts *cwi_options_values(const cachew_options *o);
/* A new options object holding v (cachew_options_destroy); NULL on ENOMEM. */
cachew_options *cwi_options_from_values(const cwi_opts *v);

#endif /* CWI_OPTIONS_H */
