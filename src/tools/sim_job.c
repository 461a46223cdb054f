/*
 * sim_job.c - the modelled training job (sim_job.h).
 *
 * A fluid model in 50 ms steps: ready workers produce up to their rate
 * into one bounded buffer (the client's prefetch plus the workers' output
 * queues), stalling when it is full; the consumer takes step_s per batch
 * and waits when the buffer is empty. An epoch's batches are produced
 * once (no extended epochs); the next epoch's production starts when the
 * consumer starts it, so every epoch begins with an empty buffer, the
 * transient that discard_epoch exists for.
 */
#include "sim_job.h"
#include "sim.h"

#include "../core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_S ((double)CWI_SIM_DT_NS / 1e9)

static void
add_worker(cwi_sim_job *j)
{
	cwi_sim_worker *w = &j->w[j->nworkers++];

	w->speed = cwi_sim_jitter(&j->rng, CWI_SIM_WORKER_SPREAD);
	w->noise = 1.0;
	w->ready_at = j->t + CWI_SIM_STARTUP_MIN_S +
	    (CWI_SIM_STARTUP_MAX_S - CWI_SIM_STARTUP_MIN_S) *
		cwi_sim_uniform(&j->rng);
}

static void
provision(cwi_sim_job *j, uint32_t n)
{
	if (n > CWI_SIM_MAX_WORKERS)
		n = CWI_SIM_MAX_WORKERS;
	while (j->nworkers < n)
		add_worker(j);
	/* The newest go first: they are the ones still starting. */
	if (j->nworkers > n)
		j->nworkers = n;
}

cachew_err
cwi_sim_job_init(cwi_sim_job *j, const cwi_sim_setting *set,
    const cwi_scale_config *cfg, uint32_t initial, double t, uint64_t seed)
{
	cachew_err rv;

	memset(j, 0, sizeof(*j));
	j->set = *set;
	j->rng = seed;
	j->t = t;
	j->epoch_began = t;
	j->epoch_flag = true;
	j->step_factor = 1.0;
	rv = cwi_scaler_create(&j->scaler, cfg, initial);
	if (rv != CACHEW_OK)
		return rv;
	j->applied = cwi_scaler_target(j->scaler);
	provision(j, j->applied);
	return CACHEW_OK;
}

void
cwi_sim_job_fini(cwi_sim_job *j)
{
	cwi_scaler_destroy(j->scaler);
	free(j->trace);
	j->scaler = NULL;
	j->trace = NULL;
}

static void
new_interval_noise(cwi_sim_job *j)
{
	for (uint32_t i = 0; i < j->nworkers; i++)
		j->w[i].noise = cwi_sim_jitter(&j->rng,
		    CWI_SIM_INTERVAL_NOISE);
	j->step_factor = cwi_sim_jitter(&j->rng, CWI_SIM_STEP_NOISE);
}

static uint32_t
ready_workers(const cwi_sim_job *j)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < j->nworkers; i++)
		if (j->w[i].ready_at <= j->t)
			n++;
	return n;
}

/* Moves one step of production and consumption. */
static void
flow(cwi_sim_job *j)
{
	double cap = 0, prod_cap, demand, cons, prod;
	double left_c = (double)j->set.epoch_batches - j->consumed_epoch;
	double left_p = (double)j->set.epoch_batches - j->produced_epoch;

	for (uint32_t i = 0; i < j->nworkers; i++)
		if (j->w[i].ready_at <= j->t)
			cap += j->set.worker_rate * j->w[i].speed *
			    j->w[i].noise * DT_S;
	prod_cap = cap < left_p ? cap : left_p;
	demand = DT_S / (j->set.step_s * j->step_factor);
	cons = demand;
	if (cons > j->buffer + prod_cap)
		cons = j->buffer + prod_cap;
	if (cons > left_c)
		cons = left_c;
	prod = prod_cap;
	if (prod > CWI_SIM_BUFFER_BATCHES - j->buffer + cons)
		prod = CWI_SIM_BUFFER_BATCHES - j->buffer + cons;
	if (prod < 0)
		prod = 0;
	j->buffer += prod - cons;
	if (j->buffer < 0)
		j->buffer = 0;
	j->consumed += cons;
	j->consumed_epoch += cons;
	j->produced_epoch += prod;
	/* The step that ends an epoch does not wait for the next one. */
	if (cons < left_c)
		j->acc_wait += DT_S * (1.0 - cons / demand);
	j->acc_prod += prod;
	j->acc_cap += cap;
	j->acc_fill += j->buffer / CWI_SIM_BUFFER_BATCHES;
	j->worker_s += (double)j->nworkers * DT_S;
}

static void
end_of_epoch(cwi_sim_job *j)
{
	if (j->epoch < sizeof(j->epoch_s) / sizeof(j->epoch_s[0]))
		j->epoch_s[j->epoch] = j->t - j->epoch_began;
	j->epoch++;
	if (j->epoch >= j->set.epochs) {
		j->done = true;
		j->done_at = j->t;
		return;
	}
	j->consumed_epoch = 0;
	j->produced_epoch = 0;
	j->buffer = 0;
	j->epoch_began = j->t;
	j->epoch_flag = true;
}

static void
heartbeat(cwi_sim_job *j, uint32_t *want)
{
	cwi_scale_sample smp;
	cwi_scale_decision dec;
	uint64_t whole = (uint64_t)floor(j->consumed + 1e-6);

	memset(&smp, 0, sizeof(smp));
	smp.now_ns = (uint64_t)llround(j->t * 1e9);
	smp.batches = whole - j->reported;
	smp.elapsed_ns = CWI_SIM_HEARTBEAT_STEPS * CWI_SIM_DT_NS;
	smp.wait_ns = (uint64_t)llround(j->acc_wait * 1e9);
	if (smp.wait_ns > smp.elapsed_ns)
		smp.wait_ns = smp.elapsed_ns;
	smp.buffer_fill = j->acc_fill / CWI_SIM_HEARTBEAT_STEPS;
	smp.epoch_start = j->epoch_flag;
	smp.workers = ready_workers(j);
	/* CPU-bound workers: busy time is CPU time. */
	smp.worker_busy = j->acc_cap > 0 ? j->acc_prod / j->acc_cap : -1.0;
	smp.worker_cpu = smp.worker_busy;
	j->reported = whole;
	j->epoch_flag = false;
	j->acc_wait = j->acc_prod = j->acc_cap = j->acc_fill = 0;
	memset(&dec, 0, sizeof(dec));
	cwi_scaler_observe(j->scaler, &smp, &dec);
	*want = dec.workers;
	if (j->log != NULL && dec.changed)
		fprintf(j->log, "%9.1f s  %-15s %s\n", j->t, j->label,
		    dec.reason);
	/* The trace's rate: this heartbeat's consumption. */
	j->last_rate = (double)smp.batches /
	    ((double)smp.elapsed_ns / 1e9);
}

bool
cwi_sim_job_step(cwi_sim_job *j, uint32_t *want)
{
	if (j->done)
		return false;
	if (j->steps % CWI_SIM_HEARTBEAT_STEPS == 0)
		new_interval_noise(j);
	if (j->pending && j->t >= j->pending_at - 1e-9) {
		provision(j, j->pending_n);
		j->pending = false;
	}
	flow(j);
	j->t += DT_S;
	j->steps++;
	if (j->consumed_epoch >= (double)j->set.epoch_batches - 1e-6)
		end_of_epoch(j);
	if (j->steps % CWI_SIM_HEARTBEAT_STEPS != 0)
		return false;
	heartbeat(j, want);
	return true;
}

void
cwi_sim_job_grant(cwi_sim_job *j, uint32_t want, uint32_t n)
{
	cwi_sim_point *p;

	if (n != j->applied) {
		j->applied = n;
		j->pending = true;
		j->pending_n = n;
		j->pending_at = j->t + CWI_SIM_PROVISION_S;
	}
	if (n < want && n >= 1)
		cwi_scaler_granted(j->scaler, n);
	if (j->ntrace == j->captrace) {
		size_t cap = j->captrace ? j->captrace * 2 : 1024;
		cwi_sim_point *np = realloc(j->trace, cap * sizeof(*np));

		if (np == NULL)
			return; /* the trace stops growing; the run goes on */
		j->trace = np;
		j->captrace = cap;
	}
	p = &j->trace[j->ntrace++];
	p->t = j->t;
	p->target = n;
	p->workers = j->nworkers;
	p->windows = cwi_scaler_windows(j->scaler);
	p->rate = j->last_rate;
}

double
cwi_sim_job_epoch_mean(const cwi_sim_job *j)
{
	size_t n = j->epoch < sizeof(j->epoch_s) / sizeof(j->epoch_s[0])
	    ? j->epoch
	    : sizeof(j->epoch_s) / sizeof(j->epoch_s[0]);
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += j->epoch_s[i];
	return n ? sum / (double)n : 0;
}

uint32_t
cwi_sim_job_converged(const cwi_sim_job *j, uint32_t final, double *at_s)
{
	size_t last_out = SIZE_MAX;

	*at_s = 0;
	for (size_t i = 0; i < j->ntrace; i++) {
		uint32_t c = j->trace[i].target;

		if (c > final + 1 || c + 1 < final)
			last_out = i;
	}
	if (last_out == SIZE_MAX)
		return 0;
	if (last_out + 1 >= j->ntrace) {
		*at_s = j->trace[last_out].t;
		return j->trace[last_out].windows + 1;
	}
	*at_s = j->trace[last_out + 1].t;
	return j->trace[last_out + 1].windows;
}
