/*
 * sim_job.h - the modelled training job of `cachew sim autoscale` and
 * `multitenant`: workers that produce batches into a client buffer, a
 * consumer that takes a fixed step per batch, heartbeats that become
 * cwi_scale_sample, and decisions applied after a provisioning delay.
 * docs/policies.md describes the model and its parameters.
 *
 * Virtual time advances in steps of CWI_SIM_DT_NS; a heartbeat is every
 * CWI_SIM_HEARTBEAT_STEPS steps. Deterministic for a given seed.
 * Thread safety: one thread at a time per job.
 */
#ifndef CWI_SIM_JOB_H
#define CWI_SIM_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../policy/scale.h"

#define CWI_SIM_DT_NS 50000000ull        /* 50 ms per step */
#define CWI_SIM_HEARTBEAT_STEPS 10u      /* 500 ms heartbeats */
#define CWI_SIM_MAX_WORKERS 64u

/* A modelled job: its pipeline and its consumer. */
typedef struct cwi_sim_setting {
	const char *name;        /* "resnet50", ... */
	const char *about;       /* one line for the table */
	double worker_rate;      /* batches/s one worker produces */
	double step_s;           /* consumer seconds per batch */
	uint64_t epoch_batches;  /* batches per epoch */
	uint32_t epochs;         /* epochs to train */
	uint32_t max_workers;    /* the pool */
} cwi_sim_setting;

/* Fixed model constants (docs/policies.md). */
#define CWI_SIM_WORKER_SPREAD 0.03   /* per-worker speed, +-3 % */
#define CWI_SIM_INTERVAL_NOISE 0.05  /* per worker and heartbeat, +-5 % */
#define CWI_SIM_STEP_NOISE 0.02      /* consumer step per heartbeat */
#define CWI_SIM_PROVISION_S 10.0     /* decision -> worker exists */
#define CWI_SIM_STARTUP_MIN_S 5.0    /* worker exists -> produces: */
#define CWI_SIM_STARTUP_MAX_S 15.0   /* uniform in [min, max] */
#define CWI_SIM_BUFFER_BATCHES 32.0  /* client buffer + worker queues */

typedef struct cwi_sim_worker {
	double speed;    /* fixed factor around 1 */
	double noise;    /* this heartbeat's factor */
	double ready_at; /* virtual s when it starts producing */
} cwi_sim_worker;

/* One heartbeat of the trace, for tables and plots. */
typedef struct cwi_sim_point {
	double t;          /* virtual s */
	uint32_t target;   /* the scaler's decision (after fair share) */
	uint32_t workers;  /* provisioned workers */
	uint32_t windows;  /* decision windows so far */
	double rate;       /* batches/s consumed over the heartbeat */
} cwi_sim_point;

typedef struct cwi_sim_job {
	cwi_sim_setting set;
	cwi_scaler *scaler;
	uint64_t rng;
	double t;                 /* virtual s */
	uint64_t steps;

	cwi_sim_worker w[CWI_SIM_MAX_WORKERS];
	uint32_t nworkers;        /* provisioned */
	uint32_t applied;         /* the count being provisioned towards */
	bool pending;
	uint32_t pending_n;
	double pending_at;

	double buffer;            /* batches */
	double step_factor;       /* this heartbeat's consumer noise */
	double consumed;          /* batches, fractional */
	double consumed_epoch;
	double produced_epoch;
	uint64_t reported;        /* whole batches already reported */
	uint32_t epoch;           /* 0-based, the epoch being consumed */
	double epoch_began;
	double epoch_s[64];       /* each finished epoch's duration */
	bool epoch_flag;          /* an epoch began since the last sample */
	bool done;
	double done_at;

	double acc_wait;          /* s, since the last heartbeat */
	double acc_prod, acc_cap; /* batches produced / could have been */
	double acc_fill;          /* sum of fill per step */
	double worker_s;          /* provisioned worker-seconds */
	double last_rate;         /* batches/s of the last heartbeat */

	FILE *log;                /* decisions with reasons (NULL: none) */
	char label[48];           /* "resnet50 model": who decided */

	cwi_sim_point *trace;
	size_t ntrace, captrace;
} cwi_sim_job;

/* Starts a job at t (virtual s) with `initial` workers provisioned at
 * once (ready after their startup) and a scaler from cfg. */
cachew_err cwi_sim_job_init(cwi_sim_job *j, const cwi_sim_setting *set,
    const cwi_scale_config *cfg, uint32_t initial, double t, uint64_t seed);
void cwi_sim_job_fini(cwi_sim_job *j);

/* Advances one step. At a heartbeat (every CWI_SIM_HEARTBEAT_STEPS
 * steps), feeds the sample to the scaler and returns true with *want its
 * decision; the caller then calls cwi_sim_job_grant (fair share or just
 * the decision). */
bool cwi_sim_job_step(cwi_sim_job *j, uint32_t *want);

/* Grants the job n workers (n <= its decision): provisioned after the
 * delay, and told to the scaler when smaller than its decision. Records
 * a trace point. */
void cwi_sim_job_grant(cwi_sim_job *j, uint32_t want, uint32_t n);

/* Mean epoch duration (s) over the finished epochs; 0 before any. */
double cwi_sim_job_epoch_mean(const cwi_sim_job *j);

/* Decision windows until the decision stayed within +-1 of `final` (0:
 * always was), and the virtual s at which that happened. */
uint32_t cwi_sim_job_converged(const cwi_sim_job *j, uint32_t final,
    double *at_s);

#endif /* CWI_SIM_JOB_H */
