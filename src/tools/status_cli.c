/*
 * status_cli.c - `cachew status URL [--json]`: what a dispatcher knows
 * (workers, datasets, jobs, tasks, split progress, throughput), and what
 * it shares with `cachew top` (status_target.h).
 */
#include "tools.h"
#include "../service/service.h"
#include "../service/service_auth.h"
#include "../service/service_rpc.h"
#include "status_target.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* A JSON string: quotes, backslashes and control bytes escaped. */
static void
json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
	     *p != 0; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void
print_text(const cwi_msg_status_reply *s)
{
	char hex[33];

	if (s->lineage != 0)
		printf("dispatcher: state %016" PRIx64 ", start %" PRIu64
		       "; journal %s\n",
		    s->lineage, s->incarnation,
		    s->journal != NULL ? s->journal
				       : "off (the state dies with it)");
	if (s->provisioner != NULL)
		printf("pool: target %u; provisioner %s, %u running, %" PRIu64
		       " actions, %" PRIu64 " failed%s%s\n",
		    s->pool_target, s->provisioner, s->provisioner_running,
		    s->provisioner_requests, s->provisioner_failures,
		    s->provisioner_error != NULL ? "; last error: " : "",
		    s->provisioner_error != NULL ? s->provisioner_error : "");

	printf("workers (%zu)\n", s->nworkers);
	printf("  %-6s %-28s %5s %8s %9s %6s %s\n", "id", "address", "cores",
	    "cpu", "last hb", "tasks", "state");
	for (size_t i = 0; i < s->nworkers; i++) {
		const cwi_worker_status *w = &s->workers[i];
		printf("  %-6" PRIu64 " %-28s %5u %8.2f %7" PRIu64 "ms %6u %s\n",
		    w->worker_id,
		    w->address != NULL && w->address[0] != '\0' ? w->address
								: "-",
		    w->cores, w->cpu_use, w->heartbeat_age_ms, w->tasks,
		    w->draining ? "draining" : "live");
	}
	printf("datasets (%zu)\n", s->ndatasets);
	for (size_t i = 0; i < s->ndatasets; i++) {
		cachew_fingerprint_hex(&s->datasets[i].fingerprint, hex);
		if (s->datasets[i].splittable)
			printf("  %-6" PRIu64 " fingerprint %s, %" PRIu64
			       " split units\n",
			    s->datasets[i].dataset_id, hex,
			    s->datasets[i].split_units);
		else
			printf("  %-6" PRIu64 " fingerprint %s, runs whole (no "
			       "splittable source)\n",
			    s->datasets[i].dataset_id, hex);
	}
	if (s->other_jobs > 0)
		printf("jobs (%zu; %" PRIu64 " of other tenants, with %" PRIu64
		       " tasks, not shown)\n", s->njobs, s->other_jobs,
		    s->other_tasks);
	else
		printf("jobs (%zu)\n", s->njobs);
	for (size_t i = 0; i < s->njobs; i++) {
		const cwi_job_status *j = &s->jobs[i];
		printf("  %-6" PRIu64 " %-16s dataset %" PRIu64 " %s, clients %u, "
		       "tasks %u (target %u)\n",
		    j->job_id, j->name != NULL ? j->name : "(private)",
		    j->dataset_id, cwi_processing_mode_name(j->processing_mode),
		    j->clients, j->tasks, j->target_workers);
		printf("         splits %" PRIu64 " acked / %" PRIu64 " leased / %"
		       PRIu64 " pending of %" PRIu64 "; %" PRIu64 " elements (%"
		       PRIu64 " bytes) received, %.0f elements/s, "
		       "%.1f MB/s, clients wait %.0f%%%s%s\n",
		    j->splits_acked, j->splits_leased, j->splits_pending,
		    j->splits_total, j->elements, j->bytes, j->elements_per_s,
		    j->bytes_per_s / 1e6, j->client_wait * 100,
		    j->data_done ? ", data done" : "",
		    j->finished ? ", finished" : "");
		if (j->scale_policy != NULL)
			printf("         policy %s (weight %g): wants %u, granted "
			       "%u%s; %s\n",
			    j->scale_policy, j->weight, j->want, j->granted,
			    j->settled ? ", settled" : "",
			    j->reason != NULL ? j->reason : "");
		if (j->cache_mode != NULL)
			printf("         cache %s; %s\n", j->cache_mode,
			    j->cache_reason != NULL ? j->cache_reason : "");
		if (j->slowest_op != NULL)
			printf("         slowest operator %s (%.0f%% of the "
			       "operators' time per thread); cache hits %"
			       PRIu64 " bytes\n", j->slowest_op,
			    j->slowest_op_share * 100, j->cache_hit_bytes);
	}
	printf("tasks (%zu)\n", s->ntasks);
	for (size_t i = 0; i < s->ntasks; i++) {
		const cwi_task_status *t = &s->tasks[i];
		printf("  %-6" PRIu64 " job %-6" PRIu64 " worker %-6" PRIu64
		       " %-9s leased %" PRIu64 ", %" PRIu64 " elements, "
		       "%.0f elements/s\n",
		    t->task_id, t->job_id, t->worker_id,
		    cwi_task_state_name(t->state), t->splits_leased, t->elements,
		    t->elements_per_s);
	}
}

static void
print_json(const cwi_msg_status_reply *s)
{
	char hex[33];

	printf("{\"lineage\":\"%016" PRIx64 "\",\"incarnation\":%" PRIu64
	       ",\"journal\":",
	    s->lineage, s->incarnation);
	if (s->journal != NULL)
		json_str(s->journal);
	else
		printf("null");
	printf(",\"other_jobs\":%" PRIu64 ",\"other_tasks\":%" PRIu64,
	    s->other_jobs, s->other_tasks);
	printf(",\"pool_target\":%u,", s->pool_target);
	if (s->provisioner != NULL) {
		printf("\"provisioner\":{\"kind\":");
		json_str(s->provisioner);
		printf(",\"running\":%u,\"requests\":%" PRIu64
		       ",\"failures\":%" PRIu64 ",\"last_error\":",
		    s->provisioner_running, s->provisioner_requests,
		    s->provisioner_failures);
		json_str(s->provisioner_error);
		printf("},");
	}
	printf("\"workers\":[");
	for (size_t i = 0; i < s->nworkers; i++) {
		const cwi_worker_status *w = &s->workers[i];
		printf("%s{\"id\":%" PRIu64 ",\"address\":\"%s\",\"cores\":%u,"
		       "\"cpu_use\":%.3f,\"heartbeat_age_ms\":%" PRIu64
		       ",\"tasks\":%u,\"draining\":%s}",
		    i > 0 ? "," : "", w->worker_id,
		    w->address != NULL ? w->address : "", w->cores, w->cpu_use,
		    w->heartbeat_age_ms, w->tasks,
		    w->draining ? "true" : "false");
	}
	printf("],\"datasets\":[");
	for (size_t i = 0; i < s->ndatasets; i++) {
		const cwi_dataset_status *ds = &s->datasets[i];
		char units[24];
		if (ds->splittable)
			snprintf(units, sizeof(units), "%" PRIu64,
			    ds->split_units);
		else
			snprintf(units, sizeof(units), "-1");
		cachew_fingerprint_hex(&ds->fingerprint, hex);
		printf("%s{\"id\":%" PRIu64 ",\"fingerprint\":\"%s\","
		       "\"split_units\":%s}",
		    i > 0 ? "," : "", ds->dataset_id, hex, units);
	}
	printf("],\"jobs\":[");
	for (size_t i = 0; i < s->njobs; i++) {
		const cwi_job_status *j = &s->jobs[i];
		printf("%s{\"id\":%" PRIu64 ",\"name\":\"%s\",\"dataset\":%" PRIu64
		       ",\"mode\":\"%s\",\"clients\":%u,\"tasks\":%u,"
		       "\"target_workers\":%u,\"splits_total\":%" PRIu64
		       ",\"splits_pending\":%" PRIu64 ",\"splits_leased\":%" PRIu64
		       ",\"splits_acked\":%" PRIu64 ",\"elements\":%" PRIu64
		       ",\"bytes\":%" PRIu64 ",\"elements_per_s\":%.3f,"
		       "\"bytes_per_s\":%.3f,\"client_wait\":%.3f,"
		       "\"data_done\":%s,\"finished\":%s",
		    i > 0 ? "," : "", j->job_id, j->name != NULL ? j->name : "",
		    j->dataset_id, cwi_processing_mode_name(j->processing_mode),
		    j->clients, j->tasks, j->target_workers, j->splits_total,
		    j->splits_pending, j->splits_leased, j->splits_acked,
		    j->elements, j->bytes, j->elements_per_s, j->bytes_per_s,
		    j->client_wait, j->data_done ? "true" : "false",
		    j->finished ? "true" : "false");
		if (j->scale_policy != NULL) {
			printf(",\"scale_policy\":");
			json_str(j->scale_policy);
			printf(",\"weight\":%g,\"want\":%u,\"granted\":%u,"
			       "\"settled\":%s,\"reason\":",
			    j->weight, j->want, j->granted,
			    j->settled ? "true" : "false");
			json_str(j->reason);
		}
		if (j->cache_mode != NULL) {
			printf(",\"cache_mode\":");
			json_str(j->cache_mode);
			printf(",\"cache\":");
			json_str(j->cache_reason != NULL ? j->cache_reason : "");
		}
		if (j->slowest_op != NULL) {
			printf(",\"slowest_op\":");
			json_str(j->slowest_op);
			printf(",\"slowest_op_share\":%.4f",
			    j->slowest_op_share);
		}
		printf(",\"cache_hit_bytes\":%" PRIu64 "}", j->cache_hit_bytes);
	}
	printf("],\"tasks\":[");
	for (size_t i = 0; i < s->ntasks; i++) {
		const cwi_task_status *t = &s->tasks[i];
		printf("%s{\"id\":%" PRIu64 ",\"job\":%" PRIu64 ",\"worker\":%"
		       PRIu64 ",\"state\":\"%s\",\"splits_leased\":%" PRIu64
		       ",\"elements\":%" PRIu64 ",\"elements_per_s\":%.3f}",
		    i > 0 ? "," : "", t->task_id, t->job_id, t->worker_id,
		    cwi_task_state_name(t->state), t->splits_leased, t->elements,
		    t->elements_per_s);
	}
	printf("]}\n");
}

void
cwi_status_target_init(cwi_status_target *t)
{
	memset(t, 0, sizeof(*t));
	t->token_file = getenv("CACHEW_TOKEN_FILE");
	cwi_opts_defaults(&t->opts);
}

int
cwi_status_target_flag(cwi_status_target *t, const char *cmd, int argc,
    char **argv, int *i)
{
	static const struct {
		const char *flag;
		size_t off;
	} tls_flags[] = {
	    {"--tls-ca", offsetof(cwi_opts, tls_ca)},
	    {"--tls-cert", offsetof(cwi_opts, tls_cert)},
	    {"--tls-key", offsetof(cwi_opts, tls_key)},
	    {"--tls-server-name", offsetof(cwi_opts, tls_server_name)},
	};
	const char *a = argv[*i];

	for (size_t f = 0; f < sizeof(tls_flags) / sizeof(tls_flags[0]) + 1;
	     f++) {
		bool token = f == sizeof(tls_flags) / sizeof(tls_flags[0]);
		const char *val = NULL;
		int m = cwi_flag_value(argc, argv, i,
		    token ? "--token-file" : tls_flags[f].flag, &val);
		if (m == 0)
			continue;
		if (m < 0) {
			fprintf(stderr, "cachew %s: %s needs a file\n", cmd, a);
			return -1;
		}
		if (token)
			t->token_file = val;
		else
			snprintf((char *)&t->opts + tls_flags[f].off,
			    CWI_OPT_STR_MAX, "%s", val);
		return 1;
	}
	return 0;
}

int
cwi_status_connect(cwi_status_target *t, const char *cmd, cwi_conn **c,
    char **token)
{
	cwi_transport_opts topts;

	*c = NULL;
	*token = NULL;
	if (t->url == NULL)
		t->url = getenv("CACHEW_SERVICE");
	if (t->url == NULL || t->url[0] == '\0') {
		fprintf(stderr, "cachew %s: name the dispatcher (cachew %s "
				"tcp://host:port)\n", cmd, cmd);
		return 2;
	}
	if (t->token_file != NULL && t->token_file[0] != '\0' &&
	    cwi_auth_token_read(t->token_file, token) != CACHEW_OK) {
		fprintf(stderr, "cachew %s: %s\n", cmd, cachew_errmsg());
		return 2;
	}
	cwi_transport_opts_init(&topts);
	cwi_rpc_client_tls(&t->opts, &topts);
	if (cwi_dial(c, t->url, &topts) != CACHEW_OK) {
		free(*token);
		*token = NULL;
		fprintf(stderr, "cachew %s: %s\n", cmd, cachew_errmsg());
		return 1;
	}
	return 0;
}

cachew_err
cwi_status_fetch(cwi_conn *c, const char *token, cwi_pmsg *rep)
{
	cwi_pmsg req;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	if (token != NULL && (req.token = cwi_strdup(token)) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_rpc_call(c, &req, CWI_MSG_STATUS_REPLY, 5000, rep);
	cwi_pmsg_free(&req);
	return rv;
}

int
cwi_status_cli(int argc, char **argv)
{
	cwi_status_target t;
	char *token;
	bool json = false;
	cwi_conn *c;
	cwi_pmsg rep;
	cachew_err rv;
	int st;

	cwi_status_target_init(&t);
	for (int i = 1; i < argc; i++) {
		st = cwi_status_target_flag(&t, "status", argc, argv, &i);
		if (st < 0)
			return 2;
		if (st > 0)
			continue;
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else if (strcmp(argv[i], "--help") == 0 ||
			 strcmp(argv[i], "-h") == 0) {
			printf("usage: cachew status [URL] [--json] [--token-file "
			       "FILE] [--tls-ca FILE]\n"
			       "                     [--tls-cert FILE --tls-key "
			       "FILE] [--tls-server-name NAME]\n"
			       "  URL defaults to $CACHEW_SERVICE, FILE to "
			       "$CACHEW_TOKEN_FILE; the TLS files\n"
			       "  of a tls+tcp:// URL to $CACHEW_TLS_CA, "
			       "$CACHEW_TLS_CERT, $CACHEW_TLS_KEY\n"
			       "  ($CACHEW_TLS_SERVER_NAME)\n");
			return 0;
		} else if (t.url == NULL && argv[i][0] != '-')
			t.url = argv[i];
		else {
			fprintf(stderr, "cachew status: unexpected '%s'\n",
			    argv[i]);
			return 2;
		}
	}
	st = cwi_status_connect(&t, "status", &c, &token);
	if (st != 0)
		return st;
	rv = cwi_status_fetch(c, token, &rep);
	free(token);
	cwi_conn_destroy(c);
	if (rv != CACHEW_OK) {
		fprintf(stderr, "cachew status: %s\n", cachew_errmsg());
		return 1;
	}
	if (json)
		print_json(&rep.u.status_reply);
	else
		print_text(&rep.u.status_reply);
	cwi_pmsg_free(&rep);
	return 0;
}
