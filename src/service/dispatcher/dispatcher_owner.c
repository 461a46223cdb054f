/*
 * dispatcher_owner.c - who owns what in the state machine: a job belongs
 * to the identity that created it (its clients all joined with it), a
 * worker to the identity that registered it. A request that names a job,
 * a client or a worker of another identity is CACHEW_EPERM, whatever the
 * ids it guessed (docs/protocol.md, "Authorisation").
 *
 * The identity is the request's envelope "i", which the server layer sets
 * from the request's token (dispatcher_server.c) and the journal keeps, so
 * a replay makes the same decisions. A dispatcher without tokens gives
 * every request the empty identity: everything matches, nothing changes.
 */
#include "dispatcher_int.h"
#include "../../core/siphash.h"

#include <inttypes.h>
#include <stdlib.h>

bool
cwi_owner_same(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "") == 0;
}

static cachew_err
job_owned(const cwi_dispatcher *d, uint64_t job_id, const char *identity)
{
	const job *j = cwi_disp_find_job(d, job_id);

	/* An unknown job is the handler's ENOENT. */
	if (j == NULL || cwi_owner_same(j->owner, identity))
		return CACHEW_OK;
	return cwi_fail(CACHEW_EPERM, "job %" PRIu64 " belongs to another "
	    "tenant", job_id);
}

static cachew_err
worker_owned(const cwi_dispatcher *d, uint64_t worker_id,
    const char *identity)
{
	const worker *w = cwi_disp_find_worker(d, worker_id);

	if (w == NULL || cwi_owner_same(w->owner, identity))
		return CACHEW_OK;
	return cwi_fail(CACHEW_EPERM, "worker %" PRIu64 " belongs to another "
	    "identity", worker_id);
}

/* A registration with a live worker's address replaces it: only its own
 * identity may. */
static cachew_err
address_owned(const cwi_dispatcher *d, const char *address,
    const char *identity)
{
	const worker *w = address != NULL
	    ? cwi_disp_find_worker_by_address(d, address)
	    : NULL;

	if (w != NULL && !cwi_owner_same(w->owner, identity))
		return cwi_fail(CACHEW_EPERM, "worker_register: address %s is "
		    "worker %" PRIu64 "'s, of another identity", address,
		    w->id);
	return CACHEW_OK;
}

/* A job runs a dataset's graph only for an identity that registered
 * it: dataset ids are sequential, and a tenant trying 1, 2, ... would
 * otherwise run another's graph and read its output (the graph itself
 * is the capability: registering the same bytes gets the same id). */
static cachew_err
dataset_registered_by(const cwi_dispatcher *d, uint64_t dataset_id,
    const char *identity)
{
	const dataset *ds = cwi_disp_find_dataset(d, dataset_id);

	/* Unknown: the handler's ENOENT. No identity: no tokens. */
	if (ds == NULL || !ds->tenants_known || identity == NULL ||
	    identity[0] == '\0')
		return CACHEW_OK;
	for (size_t i = 0; i < ds->ntenants; i++)
		if (strcmp(ds->tenants[i], identity) == 0)
			return CACHEW_OK;
	return cwi_fail(CACHEW_EPERM, "dataset %" PRIu64 " was registered by "
	    "another tenant: register its graph first", dataset_id);
}

/* A join names a job by its name, or by the client a retry made (its
 * client_id, or its nonce in whatever job), and a dataset this identity
 * registered. */
static cachew_err
join_owned(const cwi_dispatcher *d, const cwi_msg_job_get_or_create *req,
    const char *identity)
{
	const job *j;

	for (size_t i = 0; i < d->jobs.n; i++) {
		j = JOB(d, i);
		for (size_t m = 0; req->nonce != 0 && m < j->nclients; m++)
			if (j->clients[m].nonce == req->nonce)
				return job_owned(d, j->id, identity);
		for (size_t m = 0; req->client_id != 0 && m < j->nclients; m++)
			if (j->clients[m].id == req->client_id &&
			    !cwi_owner_same(j->owner, identity))
				return cwi_fail(CACHEW_EPERM, "client %" PRIu64
				    " belongs to another tenant",
				    req->client_id);
	}
	if (req->job_name != NULL) {
		j = cwi_disp_find_named_job(d, req->job_name, req->iteration);
		if (j != NULL && !cwi_owner_same(j->owner, identity))
			return cwi_fail(CACHEW_EPERM, "job %" PRIu64 " ('%s') "
			    "belongs to another tenant", j->id, req->job_name);
	}
	return dataset_registered_by(d, req->dataset_id, identity);
}

cachew_err
cwi_owner_check(const cwi_dispatcher *d, const cwi_pmsg *req)
{
	const char *id = req->identity;

	switch (req->type) {
	case CWI_MSG_WORKER_REGISTER:
		return address_owned(d, req->u.worker_register.address, id);
	case CWI_MSG_WORKER_HEARTBEAT:
		return worker_owned(d, req->u.worker_heartbeat.worker_id, id);
	case CWI_MSG_WORKER_DEREGISTER:
		return worker_owned(d, req->u.worker_deregister.worker_id, id);
	case CWI_MSG_SPLIT_LEASE:
		return worker_owned(d, req->u.split_lease.worker_id, id);
	case CWI_MSG_TASK_COUNTERS:
		return worker_owned(d, req->u.task_counters.worker_id, id);
	case CWI_MSG_JOB_GET_OR_CREATE:
		return join_owned(d, &req->u.job_get_or_create, id);
	case CWI_MSG_CLIENT_HEARTBEAT:
		return job_owned(d, req->u.client_heartbeat.job_id, id);
	case CWI_MSG_SPLIT_ACK:
		return job_owned(d, req->u.split_ack.job_id, id);
	case CWI_MSG_JOB_RELEASE:
		return job_owned(d, req->u.job_release.job_id, id);
	default:
		return CACHEW_OK;
	}
}

static void
set_owner(char **owner, const char *identity)
{
	free(*owner);
	*owner = identity != NULL && identity[0] != '\0'
		     ? cwi_strdup(identity) : NULL;
}

/* Out of memory leaves the identity out: its joins are then refused
 * (EPERM) until it registers again, never another's let in. */
static void
add_tenant(dataset *ds, const char *identity)
{
	char **v;

	if (ds == NULL || identity == NULL || identity[0] == '\0')
		return;
	for (size_t i = 0; i < ds->ntenants; i++)
		if (strcmp(ds->tenants[i], identity) == 0)
			return;
	v = realloc(ds->tenants, (ds->ntenants + 1) * sizeof(*v));
	if (v == NULL)
		return;
	ds->tenants = v;
	if ((v[ds->ntenants] = cwi_strdup(identity)) != NULL)
		ds->ntenants++;
}

void
cwi_owner_record(cwi_dispatcher *d, const cwi_pmsg *req, const cwi_pmsg *rep)
{
	worker *w;
	job *j;

	if (rep->type == CWI_MSG_WORKER_REGISTER_REPLY &&
	    (w = cwi_disp_find_worker(d,
		 rep->u.worker_register_reply.worker_id)) != NULL)
		set_owner(&w->owner, req->identity);
	if (rep->type == CWI_MSG_DATASET_REGISTER_REPLY)
		add_tenant(cwi_disp_find_dataset(d,
			       rep->u.dataset_register_reply.dataset_id),
		    req->identity);
	if (rep->type == CWI_MSG_JOB_GET_OR_CREATE_REPLY &&
	    rep->u.job_get_or_create_reply.created &&
	    (j = cwi_disp_find_job(d, rep->u.job_get_or_create_reply.job_id)) !=
		NULL)
		set_owner(&j->owner, req->identity);
}

/* Never 0 when on: 0 means "no secret" to a worker. */
uint64_t
cwi_owner_task_secret(const cwi_dispatcher *d, uint64_t task_id)
{
	uint8_t msg[16];

	if (!d->cfg.task_secrets)
		return 0;
	for (unsigned i = 0; i < 8; i++) {
		msg[i] = (uint8_t)(task_id >> (8 * i));
		msg[8 + i] = (uint8_t)(d->lineage >> (8 * i));
	}
	return cwi_siphash24(d->cfg.task_key, msg, sizeof(msg)) | 1;
}

/* ---- what a tenant's status shows ------------------------------------------ */

static bool
job_of(const cwi_dispatcher *d, uint64_t job_id, const char *identity)
{
	const job *j = cwi_disp_find_job(d, job_id);

	return j != NULL && cwi_owner_same(j->owner, identity);
}

static void
job_status_free(cwi_job_status *js)
{
	free(js->name);
	free(js->scale_policy);
	free(js->reason);
	free(js->cache_mode);
	free(js->cache_reason);
	free(js->slowest_op);
}

void
cwi_dispatcher_status_redact(const cwi_dispatcher *d, const char *identity,
    cwi_msg_status_reply *st)
{
	size_t n = 0;

	for (size_t i = 0; i < st->njobs; i++) {
		if (job_of(d, st->jobs[i].job_id, identity))
			st->jobs[n++] = st->jobs[i];
		else
			job_status_free(&st->jobs[i]);
	}
	st->other_jobs = st->njobs - n;
	st->njobs = n;
	n = 0;
	for (size_t i = 0; i < st->ntasks; i++)
		if (job_of(d, st->tasks[i].job_id, identity))
			st->tasks[n++] = st->tasks[i];
	st->other_tasks = st->ntasks - n;
	st->ntasks = n;
	n = 0;
	for (size_t i = 0; i < st->ndatasets; i++) {
		bool used = false;
		for (size_t k = 0; k < st->njobs && !used; k++)
			used = st->jobs[k].dataset_id ==
			       st->datasets[i].dataset_id;
		if (used)
			st->datasets[n++] = st->datasets[i];
	}
	st->ndatasets = n;
	for (size_t i = 0; i < st->nworkers; i++) {
		free(st->workers[i].address);
		st->workers[i].address = NULL;
	}
}
