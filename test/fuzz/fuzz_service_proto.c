/*
 * fuzz_service_proto.c - the service message decoder (hostile bytes), and
 * the dispatcher's state machine fed what decodes.
 *
 * Decoding must fail with CACHEW_EPROTO and a message, or give a message
 * that encodes, decodes again and re-encodes to the same bytes (the
 * encoding is canonical). A decoded request then goes to a dispatcher
 * that already knows a worker, a dataset and a job: handling it must give
 * a reply or an error reply, and the status must still encode. A broken
 * round trip abort()s.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/service/dispatcher/dispatcher_state.h"
#include "../../src/service/service_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
must(bool ok)
{
	if (!ok)
		abort();
}

/* A dispatcher with worker 1 (task 1 of job 1), dataset 1 of 10 units and
 * job 1 with client 1. */
static cwi_dispatcher *
populated(void)
{
	cwi_dispatcher *d = NULL;
	cwi_msg_worker_register wr = {.address = "tcp://w:1", .cores = 2};
	cwi_msg_worker_register_reply wrr;
	/* range(3): the dispatcher reads the functions a graph needs. */
	static const char graph[] =
	    "\x84\xa6" "format" "\xac" "cachew-graph" "\xa5" "nodes"
	    "\x91\x83\xa6" "inputs" "\x90\xa2" "op" "\xa5" "range" "\xa6" "params"
	    "\x81\xa4" "stop" "\x03\xa4" "root" "\x00\xa7" "version" "\x01";
	cwi_msg_dataset_register dr = {.fingerprint = {1, 2},
	    .graph = (uint8_t *)graph, .graph_len = sizeof(graph) - 1,
	    .split_units = 10, .splittable = true};
	cwi_msg_dataset_register_reply drr;
	cwi_msg_job_get_or_create jr;
	cwi_msg_job_get_or_create_reply jrr;
	cwi_dispatcher_config cfg;

	/* With the policy engine on, so hostile heartbeats reach the
	 * scalers too. */
	cwi_dispatcher_config_default(&cfg);
	cfg.autoscale = true;
	must(cwi_dispatcher_create(&d, &cfg) == CACHEW_OK);
	must(cwi_dispatcher_worker_register(d, 1, &wr, &wrr) == CACHEW_OK);
	must(cwi_dispatcher_dataset_register(d, 1, &dr, &drr) == CACHEW_OK);
	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE, &jr);
	jr.dataset_id = drr.dataset_id;
	jr.job_name = "fuzz";
	must(cwi_dispatcher_job_get_or_create(d, 1, &jr, &jrr) == CACHEW_OK);
	return d;
}

static void
drive_dispatcher(const cwi_pmsg *m)
{
	cwi_dispatcher *d = populated();
	cwi_pmsg rep, st;
	cwi_strbuf sb;
	cachew_err rv;

	rv = cwi_dispatcher_handle(d, 2, m, &rep);
	must((rv == CACHEW_OK) == (rep.type != CWI_MSG_ERROR));
	cwi_strbuf_init(&sb);
	must(cwi_pmsg_encode(&rep, &sb) == CACHEW_OK);
	cwi_pmsg_free(&rep);
	/* Then everything times out. */
	cwi_dispatcher_tick(d, UINT64_MAX / 2);
	cwi_pmsg_init(&st, CWI_MSG_STATUS);
	must(cwi_dispatcher_handle(d, UINT64_MAX / 2, &st, &rep) == CACHEW_OK);
	sb.len = 0;
	must(cwi_pmsg_encode(&rep, &sb) == CACHEW_OK);
	cwi_pmsg_free(&rep);
	cwi_strbuf_free(&sb);
	cwi_dispatcher_destroy(d);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cwi_pmsg m, back;
	cwi_strbuf a, b;
	cachew_err rv;

	rv = cwi_pmsg_decode(data, size, &m);
	if (rv != CACHEW_OK) {
		must(rv == CACHEW_EPROTO && cachew_errmsg()[0] != '\0');
		must(m.type == CWI_MSG_NONE);
		return 0;
	}
	cwi_strbuf_init(&a);
	cwi_strbuf_init(&b);
	must(cwi_pmsg_encode(&m, &a) == CACHEW_OK);
	must(cwi_pmsg_decode((const uint8_t *)a.data, a.len, &back) == CACHEW_OK);
	must(back.type == m.type);
	must(cwi_pmsg_encode(&back, &b) == CACHEW_OK);
	must(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
	drive_dispatcher(&m);
	cwi_pmsg_free(&back);
	cwi_pmsg_free(&m);
	cwi_strbuf_free(&a);
	cwi_strbuf_free(&b);
	return 0;
}
