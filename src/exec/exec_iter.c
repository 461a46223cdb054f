/*
 * exec_iter.c - the iterator wrapper (sticky end, counters), the pipeline
 * context, operator-function contexts and the public cachew_iterator's
 * plain-executor form (the front door, src/front, decides which form runs).
 *
 * Locking: pl->lock protects the pipeline's first error. Counters are
 * relaxed atomics. Lock order: an op's own locks are never held while
 * calling cwi_pipeline_fail (it takes pl->lock last).
 */
#include "exec.h"
#include "exec_puller.h"
#include "exec_split.h"
#include "exec_state.h"
#include "exec_tune.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- pipeline ----------------------------------------------------------------- */

cachew_err
cwi_pipeline_fail(cwi_pipeline *pl, cachew_err err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&pl->lock);
	if (pl->err == CACHEW_OK) {
		pl->err = err;
		va_start(ap, fmt);
		if (vsnprintf(pl->errmsg, sizeof(pl->errmsg), fmt, ap) >=
		    (int)sizeof(pl->errmsg))
			cwi_utf8_trim(pl->errmsg);
		va_end(ap);
	}
	pthread_mutex_unlock(&pl->lock);
	cwi_log(CACHEW_LOG_DEBUG, "exec", "pipeline failed: %s", pl->errmsg);
	return err;
}

cwi_stats *
cwi_pipeline_stats(cwi_pipeline *pl, const cwi_node *node)
{
	for (size_t i = 0; i < pl->nstats; i++)
		if (pl->stats[i].node == node)
			return &pl->stats[i];
	return NULL;
}

/* Post-order walk: inputs before the node, each node once. */
static cachew_err
collect_nodes(cwi_pipeline *pl, const cwi_node *node, size_t *cap)
{
	cachew_err rv;
	cwi_stats *s;

	if (cwi_pipeline_stats(pl, node) != NULL)
		return CACHEW_OK;
	for (size_t i = 0; i < node->ninputs; i++) {
		rv = collect_nodes(pl, node->inputs[i], cap);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (pl->nstats == *cap) {
		size_t ncap = *cap != 0 ? *cap * 2 : 16;
		s = realloc(pl->stats, ncap * sizeof(*s));
		if (s == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		pl->stats = s;
		*cap = ncap;
	}
	s = &pl->stats[pl->nstats];
	memset(s, 0, sizeof(*s));
	s->node = node;
	s->name = node->op->name;
	s->detail = node->detail != NULL ? node->detail : "";
	s->index = (int)pl->nstats;
	atomic_store(&s->parallelism, 1);
	pl->nstats++;
	return CACHEW_OK;
}

uint64_t
cwi_fresh_seed(void)
{
	uint64_t s = 0;
	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != (ssize_t)sizeof(s))
		s = cwi_now_ns() ^ ((uint64_t)getpid() << 32);
	return cwi_mix64(s);
}

/* ---- iterators -------------------------------------------------------------------- */

/* Inclusive time of the calls made by this thread's current next() into
 * its inputs, so each node can be charged only for its own work. */
static CWI_TLS_HOT uint64_t tls_child_ns;

cachew_err
cwi_iter_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	cwi_iter *it = NULL;
	cachew_err rv;

	if (cwi_pipeline_cancelled(args->pl))
		return CACHEW_ECANCELED;
	rv = node->op->iter_create(&it, node, args);
	if (rv != CACHEW_OK) {
		/* Ops report through cwi_fail or cwi_pipeline_fail: make
		 * sure the pipeline carries a message either way. */
		if (rv != CACHEW_EOF)
			cwi_pipeline_fail(args->pl, rv, "%s: %s", node->op->name,
			    cwi_errmsg_get()[0] != '\0' ? cwi_errmsg_get()
							: cachew_strerror(rv));
		return rv;
	}
	it->pl = args->pl;
	it->node = node;
	it->stats = cwi_pipeline_stats(args->pl, node);
	it->done = CACHEW_OK;
	it->pending = CACHEW_OK;
	/* An op may mark one iterator async itself (a parallel map is, an
	 * inline one is not); the op flag marks all of them. */
	it->async = it->async || (node->op->flags & CWI_OPF_ASYNC) != 0;
	it->epoch = args->epoch;
	it->drop = args->drop;
	*out = it;
	return CACHEW_OK;
}

/* Payload bytes of out->v[n0..n). Exact for up to 16 elements; larger
 * chunks are estimated from 16 evenly spaced samples, which keeps the
 * counters off the per-element hot path (they are statistics: the RAM
 * budget is enforced where elements are buffered, from exact sizes). */
static uint64_t
chunk_bytes(const cwi_chunk *out, size_t n0)
{
	size_t n = out->n - n0, step;
	uint64_t sum = 0;

	if (n <= 16) {
		for (size_t i = n0; i < out->n; i++)
			sum += cwi_element_nbytes(out->v[i]);
		return sum;
	}
	step = n / 16;
	for (size_t k = 0; k < 16; k++)
		sum += cwi_element_nbytes(out->v[n0 + k * step]);
	return sum * n / 16;
}

cachew_err
cwi_iter_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	uint64_t t0, dt, self, saved;
	size_t n0 = out->n;
	cachew_err rv;

	if (it->done != CACHEW_OK)
		return it->done;
	if (it->pending != CACHEW_OK) {
		it->done = it->pending;
		return it->done;
	}
	if (max == 0)
		max = 1;
	rv = cwi_chunk_reserve(out, max);
	if (rv != CACHEW_OK) {
		it->done = cwi_pipeline_fail(it->pl, rv, "%s: out of memory",
		    it->node->op->name);
		return it->done;
	}
	saved = tls_child_ns;
	tls_child_ns = 0;
	t0 = cwi_now_ns();
	rv = it->ops->next(it, out, max);
	dt = cwi_now_ns() - t0;
	self = dt > tls_child_ns ? dt - tls_child_ns : 0;
	tls_child_ns = saved + dt;

	if (rv == CACHEW_OK && out->n == n0)
		rv = cwi_pipeline_fail(it->pl, CACHEW_EINTERNAL,
		    "%s: next() returned no element and no end",
		    it->node->op->name);
	if (rv != CACHEW_OK && out->n > n0) {
		/* Deliver what came before the end or failure first. */
		it->pending = rv;
		/* cwi_pipeline_fail keeps the first error: no unlocked
		 * peek at pl->err (other threads may be failing too). */
		if (rv != CACHEW_EOF)
			cwi_pipeline_fail(it->pl, rv, "%s: %s",
			    it->node->op->name, cachew_strerror(rv));
		rv = CACHEW_OK;
	}
	if (it->stats != NULL) {
		cwi_stats *s = it->stats;
		if (it->async)
			cwi_stat_add(&s->wait_ns, self);
		else
			cwi_stat_add(&s->busy_ns, self);
		if (rv == CACHEW_OK) {
			uint64_t bytes = chunk_bytes(out, n0);
			cwi_stat_add(&s->elements, out->n - n0);
			cwi_stat_add(&s->bytes, bytes);
			if (it->cache_hit)
				cwi_stat_add(&s->cache_hit_bytes, bytes);
		}
	}
	if (rv != CACHEW_OK) {
		/* cwi_pipeline_fail keeps the first error: no unlocked
		 * peek at pl->err (other threads may be failing too). */
		if (rv != CACHEW_EOF)
			cwi_pipeline_fail(it->pl, rv, "%s: %s",
			    it->node->op->name, cachew_strerror(rv));
		it->done = rv;
	}
	return rv;
}

void
cwi_iter_destroy(cwi_iter *it)
{
	if (it != NULL)
		it->ops->destroy(it);
}

/* ---- operator function contexts ------------------------------------------------------- */

/* Keeps a function's per-epoch streams apart from the other seeds derived
 * from its node's. */
#define FN_EPOCH_TAG 0x65706f6368ULL /* "epoch" */

void
cwi_op_ctx_init(cachew_op_ctx *ctx, const cwi_node *node, cwi_pipeline *pl,
    uint64_t epoch)
{
	uint64_t base;

	memset(ctx, 0, sizeof(*ctx));
	ctx->fn = node->fn;
	ctx->state = node->fn_state;
	base = cwi_seed_derive(pl->seed, node->seed_fp.hi ^ node->seed_fp.lo);
	/* Each epoch (each repetition under repeat) draws anew, as a
	 * reshuffling shuffle does; epoch 0 keeps the node's own streams, so
	 * a single pass draws what it drew before epochs reached functions. */
	ctx->base_seed = epoch == 0 ? base
				    : cwi_seed_derive(base ^ FN_EPOCH_TAG, epoch);
	ctx->max_element_bytes = cwi_pipeline_max_element(pl);
}

uint64_t
cwi_pipeline_max_element(const cwi_pipeline *pl)
{
	return pl->opts.max_element_bytes > 0
		   ? (uint64_t)pl->opts.max_element_bytes
		   : (uint64_t)CWI_MAX_ELEMENT_BYTES;
}

/* "<what> would take N bytes, over max_element_bytes (M)" into buf. */
static void
over_limit_text(char *buf, size_t len, uint64_t bytes, uint64_t limit,
    const char *what, va_list ap)
{
	int n = vsnprintf(buf, len, what, ap);

	if (n >= 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, " would take %llu bytes, over "
		    "max_element_bytes (%llu)", (unsigned long long)bytes,
		    (unsigned long long)limit);
}

cachew_err
cwi_op_ctx_check_bytes(cachew_op_ctx *ctx, uint64_t bytes, const char *what,
    ...)
{
	uint64_t limit = cwi_op_ctx_max_element(ctx);
	va_list ap;

	if (bytes <= limit)
		return CACHEW_OK;
	va_start(ap, what);
	over_limit_text(ctx->errmsg, sizeof(ctx->errmsg), bytes, limit, what,
	    ap);
	va_end(ap);
	return CACHEW_ERANGE;
}

cachew_err
cwi_pipeline_check_bytes(cwi_pipeline *pl, const cwi_node *node,
    uint64_t bytes, const char *what, ...)
{
	uint64_t limit = cwi_pipeline_max_element(pl);
	char text[512];
	va_list ap;

	if (bytes <= limit)
		return CACHEW_OK;
	va_start(ap, what);
	over_limit_text(text, sizeof(text), bytes, limit, what, ap);
	va_end(ap);
	return cwi_pipeline_fail(pl, CACHEW_ERANGE, "%s: %s", node->op->name,
	    text);
}

void *
cachew_op_ctx_state(cachew_op_ctx *ctx)
{
	return ctx->state;
}

uint64_t
cachew_op_ctx_seed(cachew_op_ctx *ctx)
{
	return cwi_seed_derive(ctx->base_seed, ctx->index);
}

uint64_t
cachew_op_ctx_random(cachew_op_ctx *ctx)
{
	if (!ctx->rng_started) {
		ctx->rng.state = cachew_op_ctx_seed(ctx);
		ctx->rng_started = true;
	}
	return cwi_rng_next(&ctx->rng);
}

cachew_err
cachew_op_ctx_fail(cachew_op_ctx *ctx, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ctx->errmsg, sizeof(ctx->errmsg), fmt, ap);
	va_end(ap);
	return CACHEW_EOP;
}

cachew_err
cwi_fn_failed(cachew_op_ctx *ctx, const cwi_node *node, cwi_pipeline *pl,
    cachew_err rv)
{
	if (rv == CACHEW_EOF || rv == CACHEW_OK)
		rv = CACHEW_EOP;
	return cwi_pipeline_fail(pl, rv, "%s(%s): %s (element %llu)",
	    node->op->name, node->fn->name,
	    ctx->errmsg[0] != '\0' ? ctx->errmsg : cachew_strerror(rv),
	    (unsigned long long)ctx->index);
}

bool
cwi_err_is_data(cachew_err rv)
{
	return rv == CACHEW_ECORRUPT || rv == CACHEW_ETYPE ||
	    rv == CACHEW_ERANGE || rv == CACHEW_EOP;
}

bool
cwi_iter_drop(const cwi_iter *it, const cachew_op_ctx *ctx, cachew_err rv)
{
	const cwi_drop *d = it->drop;
	uint64_t n = 1;

	if (d == NULL || !cwi_err_is_data(rv))
		return false;
	if (d->stats != NULL)
		n += atomic_fetch_add_explicit(&d->stats->dropped, 1,
		    memory_order_relaxed);
	if (d->log)
		cwi_log(CACHEW_LOG_WARN, "ignore_errors",
		    "dropped element %llu of %s(%s): %s (%llu dropped so far)",
		    (unsigned long long)ctx->index, it->node->op->name,
		    it->node->fn != NULL ? it->node->fn->name : "",
		    ctx->errmsg[0] != '\0' ? ctx->errmsg : cachew_strerror(rv),
		    (unsigned long long)n);
	return true;
}

cachew_err
cwi_apply_filter(cachew_op_ctx *ctx, const cwi_iter *it, bool may_drop,
    const cwi_element *in, bool *keep)
{
	int k = 0;
	cachew_err rv = it->node->fn->def.filter(ctx, in, &k);
	if (rv != CACHEW_OK && may_drop && cwi_iter_drop(it, ctx, rv)) {
		*keep = false;
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK)
		return cwi_fn_failed(ctx, it->node, it->pl, rv);
	*keep = k != 0;
	return CACHEW_OK;
}

cachew_err
cwi_seq_open(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    uint64_t epoch, const cwi_element *in, uint64_t index)
{
	cachew_err rv;

	memset(s, 0, sizeof(*s));
	s->fn = node->fn;
	cwi_op_ctx_init(&s->ctx, node, pl, epoch);
	cwi_op_ctx_at(&s->ctx, index);
	rv = s->fn->def.flat_open(&s->ctx, in, &s->state);
	if (rv != CACHEW_OK)
		return cwi_fn_failed(&s->ctx, node, pl, rv);
	s->open = true;
	/* The function keeps what it needs of in; the reference is for a
	 * save (exec_state.h). */
	s->in = (cwi_element *)in;
	cwi_element_retain(s->in);
	s->index = index;
	return CACHEW_OK;
}

cachew_err
cwi_seq_next(cwi_seq *s, const cwi_node *node, cwi_pipeline *pl,
    cwi_chunk *out, size_t max)
{
	size_t got = 0;
	cachew_err rv;

	if (s->eof)
		return CACHEW_EOF;
	rv = cwi_chunk_reserve(out, max);
	if (rv != CACHEW_OK)
		return cwi_pipeline_fail(pl, rv, "%s: out of memory",
		    node->op->name);
	while (got < max) {
		cwi_element *e = NULL;
		rv = s->fn->def.flat_next(&s->ctx, s->state, &e);
		if (rv == CACHEW_EOF) {
			s->eof = true;
			break;
		}
		if (rv == CACHEW_OK && e == NULL)
			rv = cachew_op_ctx_fail(&s->ctx, "yielded no element");
		if (rv != CACHEW_OK) {
			/* A function that fails owns nothing it set; what it
			 * yielded before comes first (exec.h). */
			cwi_element_release(e);
			s->eof = true;
			return cwi_fn_failed(&s->ctx, node, pl, rv);
		}
		cwi_chunk_push(out, e);
		got++;
		s->yielded++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

void
cwi_seq_close(cwi_seq *s)
{
	if (s->open && s->fn->def.flat_close != NULL)
		s->fn->def.flat_close(s->state);
	s->open = false;
	s->state = NULL;
	cwi_element_release(s->in);
	s->in = NULL;
}

/* ---- public iterator ---------------------------------------------------------------------- */

/* The tails a lease keeps (cwi_iterator_create_lease_tails): one slot per
 * grouping node. */
struct cwi_tails {
	const cwi_node **nodes;
	cwi_chunk *held;
	size_t n;
};

cwi_chunk *
cwi_pipeline_tail_slot(cwi_pipeline *pl, const cwi_node *node)
{
	if (pl->tails == NULL)
		return NULL;
	for (size_t i = 0; i < pl->tails->n; i++)
		if (pl->tails->nodes[i] == node)
			return &pl->tails->held[i];
	return NULL;
}

static void
tails_free(struct cwi_tails *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->n; i++)
		cwi_chunk_free(&t->held[i]);
	free(t->held);
	free(t->nodes);
	free(t);
}

struct cachew_iterator {
	cwi_pipeline pl;
	cachew_dataset *ds;
	cwi_iter *root;
	cwi_chunk ready; /* pulled, not yet handed out: v[pos..n) */
	size_t pos;
	size_t want; /* adaptive request size */
	cachew_err done;
	cwi_unit_range *lease; /* a lease iterator's copy of its ranges */
	void (*release)(void *arg); /* called last by destroy (owned) */
	void *release_arg;
	cwi_part_stats_fn part_stats; /* rows run elsewhere (release_arg) */
	bool service; /* a service client's (cwi_iterator_create_owned) */
	bool user; /* the user's: its end drops the reuse list (destroy) */
	pid_t pid; /* the process that created it (fork: see destroy) */
	unsigned forks; /* fork_count when it was created */
	/* cachew_iterator_cancel: set from any thread; the consumer then
	 * returns CACHEW_ECANCELED. */
	atomic_bool canceled;
	/* next_timeout's pulling thread (exec_puller.h), made at its first
	 * call; once it exists every pull goes through it. puller_lock
	 * orders its creation against a cancel from another thread. */
	cwi_puller *puller;
	pthread_mutex_t puller_lock;
	cwi_names *names; /* of the dataset's components, or NULL */
};

/*
 * fork(). An iterator does not cross it: its threads stay in the parent.
 * The child's copy of fork_count is one higher than the count an
 * inherited iterator recorded, which is how next() tells, in one load and
 * without a getpid() system call per element, that it runs in a child.
 */
static unsigned fork_count;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_child(void)
{
	fork_count++;
}

static void
fork_watch_once(void)
{
	(void)pthread_atfork(NULL, NULL, fork_child);
}

#define WANT_MAX 256

/* A new iterator of ds with resolved options; the caller sets the seed
 * (and a lease) and then calls iterator_start. */
static cachew_iterator *
iterator_alloc(cachew_dataset *ds, const cachew_options *opts)
{
	cachew_iterator *it = calloc(1, sizeof(*it));

	if (it == NULL)
		return NULL;
	if (opts != NULL)
		it->pl.opts = *cwi_options_values(opts);
	else
		cwi_opts_defaults(&it->pl.opts);
	if (it->pl.opts.threads <= 0)
		it->pl.opts.threads = cwi_online_cpus();
	if (it->pl.opts.ram_budget <= 0)
		it->pl.opts.ram_budget = (int64_t)(cwi_available_ram() / 2);
	atomic_init(&it->pl.cancelled, false);
	pthread_mutex_init(&it->pl.lock, NULL);
	it->ds = cachew_dataset_retain(ds);
	it->want = 1;
	pthread_once(&fork_once, fork_watch_once);
	it->pid = getpid();
	it->forks = fork_count;
	atomic_init(&it->canceled, false);
	pthread_mutex_init(&it->puller_lock, NULL);
	it->names = cwi_spec_names(&ds->spec);
	return it;
}

/* Creates the iterator tree; destroys `it` on failure. */
static cachew_err
iterator_start(cachew_iterator **out, cachew_iterator *it)
{
	cwi_iter_args args = {0};
	size_t cap = 0;
	cachew_err rv;

	rv = collect_nodes(&it->pl, it->ds, &cap);
	if (rv == CACHEW_OK && it->pl.split_node != NULL &&
	    cwi_pipeline_stats(&it->pl, it->pl.split_node) == NULL)
		rv = cwi_fail(CACHEW_EINVAL,
		    "lease: the split source %s is not a node of the pipeline",
		    it->pl.split_node->op->name);
	if (rv == CACHEW_OK) {
		args.pl = &it->pl;
		args.epoch = (uint64_t)it->pl.opts.epoch;
		rv = cwi_iter_create(&it->root, it->ds, &args);
		if (rv != CACHEW_OK)
			cwi_fail(rv, "%s", it->pl.errmsg);
	}
	if (rv != CACHEW_OK) {
		cachew_iterator_destroy(it);
		return rv;
	}
	*out = it;
	return CACHEW_OK;
}

cachew_err
cwi_exec_iterator_create(
    cachew_iterator **out, cachew_dataset *ds, const cachew_options *opts)
{
	cachew_iterator *it;

	it = iterator_alloc(ds, opts);
	if (it == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	it->pl.seed = it->pl.opts.seed >= 0 ? (uint64_t)it->pl.opts.seed
					    : cwi_fresh_seed();
	it->pl.job_seed = it->pl.seed;
	return iterator_start(out, it);
}

cachew_err
cwi_exec_iterator_create_seeded(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, uint64_t seed, uint64_t job_seed)
{
	cachew_iterator *it;

	it = iterator_alloc(ds, opts);
	if (it == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	it->pl.seed = seed;
	it->pl.job_seed = job_seed;
	return iterator_start(out, it);
}

cachew_err
cwi_iterator_create_lease(cachew_iterator **out, cwi_node *root,
    const cachew_options *opts, const cwi_node *split_node,
    const cwi_unit_range *ranges, size_t nranges, uint64_t seed)
{
	return cwi_iterator_create_lease_tails(out, root, opts, split_node,
	    ranges, nranges, seed, NULL, 0);
}

cachew_err
cwi_iterator_take_tails(cachew_iterator *it, size_t k, cwi_chunk *out)
{
	if (it->pl.tails == NULL || k >= it->pl.tails->n)
		return CACHEW_OK;
	if (!cwi_chunk_move_all(out, &it->pl.tails->held[k]))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

static struct cwi_tails *
tails_new(const cwi_node *const *groups, size_t ngroups)
{
	struct cwi_tails *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return NULL;
	t->nodes = calloc(ngroups, sizeof(*t->nodes));
	t->held = calloc(ngroups, sizeof(*t->held));
	if (t->nodes == NULL || t->held == NULL) {
		tails_free(t);
		return NULL;
	}
	memcpy(t->nodes, groups, ngroups * sizeof(*groups));
	t->n = ngroups;
	return t;
}

cachew_err
cwi_iterator_create_lease_tails(cachew_iterator **out, cwi_node *root,
    const cachew_options *opts, const cwi_node *split_node,
    const cwi_unit_range *ranges, size_t nranges, uint64_t seed,
    const cwi_node *const *groups, size_t ngroups)
{
	cachew_iterator *it;
	cachew_err rv;

	uint64_t whole_units = 0; /* without a split node: units leased */

	cwi_clear_errmsg();
	if (out == NULL || root == NULL || (nranges > 0 && ranges == NULL))
		return cwi_fail(CACHEW_EINVAL, "lease: NULL argument");
	if (split_node != NULL && split_node->op->split_units == NULL)
		return cwi_fail(CACHEW_EINVAL, "lease: %s is not splittable",
		    split_node->op->name);
	for (size_t i = 0; i < nranges; i++) {
		if (ranges[i].begin > ranges[i].end)
			return cwi_fail(CACHEW_EINVAL,
			    "lease: range %zu is [%llu, %llu), which ends "
			    "before it begins",
			    i, (unsigned long long)ranges[i].begin,
			    (unsigned long long)ranges[i].end);
		if (split_node == NULL && ranges[i].end > 1)
			return cwi_fail(CACHEW_ERANGE,
			    "lease: range %zu is [%llu, %llu), but a pipeline "
			    "without a split source is one unit, [0, 1)",
			    i, (unsigned long long)ranges[i].begin,
			    (unsigned long long)ranges[i].end);
		whole_units += ranges[i].end - ranges[i].begin;
	}
	if (split_node == NULL && whole_units > 1)
		return cwi_fail(CACHEW_ERANGE,
		    "lease: the ranges name unit 0 %llu times, but a pipeline "
		    "without a split source runs once per lease",
		    (unsigned long long)whole_units);
	it = iterator_alloc(root, opts);
	if (it == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (nranges > 0) {
		it->lease = malloc(nranges * sizeof(*ranges));
		if (it->lease == NULL) {
			cachew_iterator_destroy(it);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		memcpy(it->lease, ranges, nranges * sizeof(*ranges));
	}
	if (ngroups > 0 && (it->pl.tails = tails_new(groups, ngroups)) ==
	    NULL) {
		cachew_iterator_destroy(it);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	it->pl.split_node = split_node;
	it->pl.split_ranges = it->lease;
	it->pl.nsplit_ranges = nranges;
	it->pl.seed = cwi_split_lease_seed(seed, ranges, nranges);
	it->pl.job_seed = seed;
	rv = iterator_start(out, it);
	/* Without a split node, a lease of no unit yields nothing. */
	if (rv == CACHEW_OK && split_node == NULL && whole_units == 0)
		(*out)->done = CACHEW_EOF;
	return rv;
}

cachew_err
cwi_iterator_create_owned(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, uint64_t seed, void (*release)(void *arg),
    void *arg)
{
	cachew_iterator *it;

	it = iterator_alloc(ds, opts);
	if (it == NULL) {
		if (release != NULL)
			release(arg);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	it->pl.seed = seed;
	it->pl.job_seed = seed;
	it->service = true;
	it->release = release;
	it->release_arg = arg;
	return iterator_start(out, it);
}

/* One pull into out, growing the request while pulls are cheap: ask for
 * more per call while calls are cheap, fewer when slow, so the first
 * element of an expensive pipeline comes without delay. Runs on the
 * consumer's thread, or on the puller's for next_timeout. */
static cachew_err
iterator_pull(void *arg, cwi_chunk *out)
{
	cachew_iterator *it = arg;
	uint64_t t0, dt;
	cachew_err rv;

	t0 = cwi_now_ns();
	rv = cwi_iter_next(it->root, out, it->want);
	dt = cwi_now_ns() - t0;
	if (rv != CACHEW_OK)
		return rv;
	if (dt < 50000 && it->want < WANT_MAX)
		it->want *= 2;
	else if (dt > 2000000 && it->want > 1)
		it->want /= 2;
	return CACHEW_OK;
}

/* Inherited through fork(), or canceled: the sticky error next() returns
 * from now on. The child's copy of the iterator is the child's own, so
 * its message is written without the pipeline lock, which a thread of the
 * parent may have held at the fork. */
static cachew_err
iterator_stopped(cachew_iterator *it)
{
	if (it->forks != fork_count) {
		if (it->done != CACHEW_ECLOSED) {
			it->done = CACHEW_ECLOSED;
			it->pl.err = CACHEW_ECLOSED;
			snprintf(it->pl.errmsg, sizeof(it->pl.errmsg),
			    "iterator: inherited through fork() (created by "
			    "pid %ld, this is pid %ld): its threads stayed in "
			    "the parent; create a new iterator in this "
			    "process", (long)it->pid, (long)getpid());
		}
		return CACHEW_ECLOSED;
	}
	it->done = CACHEW_ECANCELED;
	return CACHEW_ECANCELED;
}

static cachew_err
puller_start(cachew_iterator *it)
{
	cachew_err rv;

	pthread_mutex_lock(&it->puller_lock);
	rv = cwi_puller_create(&it->puller, iterator_pull, it);
	pthread_mutex_unlock(&it->puller_lock);
	return rv;
}

/* it->ready is used up: pulls more into it, on this thread, or through
 * the puller when there is one or a timeout is asked for. *waited_out:
 * the wait ended before the pull (a CACHEW_ETIMEDOUT that is not the
 * pipeline's own, as a service's deadline is). */
static cachew_err
iterator_refill(cachew_iterator *it, uint64_t timeout_ns, bool *waited_out)
{
	cachew_err rv, result;

	*waited_out = false;
	it->ready.n = 0;
	it->pos = 0;
	if (it->puller == NULL && timeout_ns == UINT64_MAX)
		return iterator_pull(it, &it->ready);
	if (it->puller == NULL) {
		rv = puller_start(it);
		if (rv != CACHEW_OK)
			return rv;
		/* A cancel that ran before the puller existed. */
		if (atomic_load(&it->canceled))
			return CACHEW_ECANCELED;
	}
	rv = cwi_puller_wait(it->puller, timeout_ns, &it->ready, &result);
	*waited_out = rv == CACHEW_ETIMEDOUT;
	return rv == CACHEW_OK ? result : rv;
}

static cachew_err
iterator_next(cachew_iterator *it, cachew_element **out, uint64_t timeout_ns)
{
	bool waited_out;
	cachew_err rv;

	if (it->forks != fork_count ||
	    atomic_load_explicit(&it->canceled, memory_order_relaxed))
		return iterator_stopped(it);
	if (it->pos < it->ready.n) {
		*out = it->ready.v[it->pos++];
		return CACHEW_OK;
	}
	if (it->done != CACHEW_OK)
		return it->done;
	rv = iterator_refill(it, timeout_ns, &waited_out);
	if (atomic_load(&it->canceled))
		return iterator_stopped(it);
	if (waited_out) {
		/* Nothing yet, which is not an error: the pull goes on. (Not
		 * CACHEW_ETIMEDOUT, which a pipeline fails with when a
		 * service call times out, for good.) */
		*out = NULL;
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK) {
		it->done = rv;
		return rv;
	}
	*out = it->ready.v[it->pos++];
	return CACHEW_OK;
}

void
cwi_iterator_set_names(cachew_iterator *it, const cachew_dataset *ds)
{
	cwi_names_unref(it->names);
	it->names = cwi_spec_names(&ds->spec);
}

/* Gives an element the names of the dataset's components. Elements
 * yielded while shared (a literal's, a cache's held in memory) are cloned
 * first: a shared element is immutable. ENOMEM leaves it unnamed. */
static cwi_element *
name_element(cachew_iterator *it, cwi_element *e)
{
	cwi_element *c;

	if (e->names == it->names || e->n != it->names->n)
		return e;
	if (cwi_element_unique(e)) {
		cwi_element_set_names(e, it->names);
		return e;
	}
	c = cwi_element_clone(e);
	if (c == NULL)
		return e;
	cwi_element_set_names(c, it->names);
	cwi_element_release(e);
	return c;
}

/* iterator_next, and the element named. */
static cachew_err
iterator_next_named(cachew_iterator *it, cachew_element **out,
    uint64_t timeout_ns)
{
	cachew_err rv = iterator_next(it, out, timeout_ns);

	if (rv == CACHEW_OK && *out != NULL && it->names != NULL)
		*out = name_element(it, *out);
	return rv;
}

cachew_err
cachew_iterator_next(cachew_iterator *it, cachew_element **out)
{
	return iterator_next_named(it, out, UINT64_MAX);
}

cachew_err
cachew_iterator_next_timeout(
    cachew_iterator *it, cachew_element **out, int64_t timeout_ms)
{
	if (it == NULL || out == NULL)
		return cwi_fail(CACHEW_EINVAL, "iterator: NULL argument");
	if (timeout_ms < 0)
		return iterator_next_named(it, out, UINT64_MAX);
	return iterator_next_named(it, out, (uint64_t)timeout_ms * 1000000u);
}

void
cachew_iterator_cancel(cachew_iterator *it)
{
	if (it == NULL)
		return;
	/* Inherited: none of its threads are here to wake. */
	if (it->forks != fork_count) {
		atomic_store(&it->canceled, true);
		return;
	}
	if (atomic_exchange(&it->canceled, true))
		return;
	cwi_pipeline_fail(&it->pl, CACHEW_ECANCELED,
	    "iterator: canceled (cachew_iterator_cancel)");
	pthread_mutex_lock(&it->puller_lock);
	if (it->puller != NULL)
		cwi_puller_cancel(it->puller);
	pthread_mutex_unlock(&it->puller_lock);
	/* Wake what the pull may be blocked on: threaded operators and the
	 * service's stream (exec_tune.h), so that it returns and destroy
	 * need not wait for it. */
	atomic_store(&it->pl.cancelled, true);
	cwi_tune_cancel(&it->pl);
}

cachew_err
cwi_iterator_next_chunk(cachew_iterator *it, cwi_chunk *out, size_t max)
{
	size_t n0 = out->n;
	cachew_err rv;

	while (out->n - n0 < max && it->pos < it->ready.n)
		cwi_chunk_push(out, it->ready.v[it->pos++]);
	if (out->n > n0)
		return CACHEW_OK;
	if (it->done != CACHEW_OK)
		return it->done;
	it->ready.n = 0;
	it->pos = 0;
	rv = cwi_iter_next(it->root, &it->ready, max);
	if (rv != CACHEW_OK) {
		it->done = rv;
		return rv;
	}
	while (it->pos < it->ready.n)
		cwi_chunk_push(out, it->ready.v[it->pos++]);
	return CACHEW_OK;
}

const char *
cachew_iterator_errmsg(const cachew_iterator *it)
{
	return it->pl.errmsg;
}

void
cachew_iterator_destroy(cachew_iterator *it)
{
	if (it == NULL)
		return;
	/* Inherited through fork(): its threads (a prefetch's, the
	 * service client's fetch thread) stayed in the parent, so joining
	 * them or destroying a condition variable they waited on would
	 * crash or wait forever. The child leaves it be (its memory stays,
	 * unused), as it does the embedded service's instances; the
	 * parent's copy is unaffected. */
	if (it->forks != fork_count)
		return;
	atomic_store(&it->pl.cancelled, true);
	/* Wake every blocked thread first, then join them top-down: the
	 * puller first, whose pull runs the tree. */
	cwi_tune_cancel(&it->pl);
	cwi_puller_destroy(it->puller);
	cwi_iter_destroy(it->root);
	for (size_t i = it->pos; i < it->ready.n; i++)
		cwi_element_release(it->ready.v[i]);
	free(it->ready.v);
	free(it->pl.stats);
	free(it->lease);
	tails_free(it->pl.tails);
	pthread_mutex_destroy(&it->puller_lock);
	pthread_mutex_destroy(&it->pl.lock);
	cachew_dataset_release(it->ds);
	cwi_names_unref(it->names);
	bool user = it->user;

	if (it->release != NULL)
		it->release(it->release_arg);
	free(it);
	/* The elements in flight just went into the reuse list (tensor.c)
	 * all at once, up to its 256 MiB: an iterator per epoch would keep
	 * them past its end until a later allocation found them stale. Only
	 * the user's: the list is the process's, and the iterators the
	 * library makes and ends while the user's runs (a worker's per
	 * lease, the service client's per stitched run) emptied it under
	 * the running pipeline, which then page-faulted its next batches in
	 * again (W2 through the service: the client's 38.5 MB batches every
	 * few hundred milliseconds). */
	if (user)
		cwi_buffer_cache_drop();
}

void
cwi_iterator_mark_user(cachew_iterator *it)
{
	it->user = true;
}

void
cwi_iterator_set_part_stats(cachew_iterator *it, cwi_part_stats_fn fn)
{
	it->part_stats = fn;
}

cachew_err
cachew_iterator_stats(
    cachew_iterator *it, cachew_op_stats *out, size_t cap, size_t *n)
{
	size_t hide = 0, own;
	size_t k = it->part_stats != NULL
	    ? it->part_stats(it->release_arg, out, cap, &hide) : 0;

	if (hide > it->pl.nstats)
		hide = it->pl.nstats;
	own = it->pl.nstats - hide;
	if (k >= cap) {
		cap = 0;
	} else {
		out += k;
		cap -= k;
	}
	for (size_t i = 0; i < own && i < cap; i++) {
		cwi_stats *s = &it->pl.stats[i + hide];
		out[i].name = s->name;
		out[i].detail = s->detail;
		out[i].node = s->index - (int)hide + (int)k;
		out[i].elements = atomic_load_explicit(&s->elements, memory_order_relaxed);
		out[i].bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
		out[i].busy_ns = atomic_load_explicit(&s->busy_ns, memory_order_relaxed);
		out[i].wait_ns = atomic_load_explicit(&s->wait_ns, memory_order_relaxed);
		out[i].parallelism = atomic_load_explicit(&s->parallelism, memory_order_relaxed);
		out[i].buffer_limit = atomic_load_explicit(&s->buffer_limit, memory_order_relaxed);
		out[i].buffered = atomic_load_explicit(&s->buffered, memory_order_relaxed);
		out[i].dropped = atomic_load_explicit(&s->dropped, memory_order_relaxed);
		out[i].cache_hit_bytes = atomic_load_explicit(
		    &s->cache_hit_bytes, memory_order_relaxed);
	}
	if (n != NULL)
		*n = k + own;
	return CACHEW_OK;
}

/* ---- saving and restoring a position (exec_state.h) ---------------------- */

bool
cwi_exec_iterator_is_service(const cachew_iterator *it)
{
	return it->service;
}

void
cwi_exec_iterator_run(const cachew_iterator *it, cwi_exec_run *out)
{
	out->fp = *cwi_node_fp(it->ds);
	out->seed = it->pl.seed;
	out->job_seed = it->pl.job_seed;
	out->epoch = it->pl.opts.epoch;
	out->deterministic = it->pl.opts.deterministic != 0;
}

/* [ready elements, root state]. The ready chunk is what a restored
 * iterator hands out first. */
cachew_err
cwi_exec_iterator_save(cachew_iterator *it, cwi_state_writer *w)
{
	cachew_err rv, result;

	if (it->forks != fork_count || atomic_load(&it->canceled))
		return cwi_fail(iterator_stopped(it),
		    "iterator: %s: there is no position to save",
		    it->pl.errmsg);
	/* A pull that a timeout left running: its elements are part of the
	 * position, the first ones a restored iterator hands out. */
	if (it->puller != NULL && cwi_puller_pending(it->puller)) {
		it->ready.n = 0;
		it->pos = 0;
		rv = cwi_puller_wait(it->puller, UINT64_MAX, &it->ready,
		    &result);
		if (rv != CACHEW_OK)
			return cwi_fail(iterator_stopped(it),
			    "iterator: %s: there is no position to save",
			    it->pl.errmsg);
		if (result != CACHEW_OK)
			it->done = result;
	}
	if (it->done != CACHEW_OK && it->done != CACHEW_EOF)
		return cwi_fail(it->done,
		    "iterator: it failed (%s): there is no position to save",
		    it->pl.errmsg);
	cwi_sw_array(w, 2);
	rv = cwi_sw_elements(w, it->ready.v + it->pos, it->ready.n - it->pos);
	if (rv != CACHEW_OK)
		return rv;
	if (it->done == CACHEW_EOF) {
		/* Its end is sticky here, whatever the root's state. */
		cwi_sw_array(w, 3);
		cwi_sw_str(w, it->root->node->op->name);
		cwi_sw_bool(w, true);
		cwi_sw_array(w, 0);
	} else {
		rv = cwi_iter_save(it->root, w);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (w->sb.oom)
		return cwi_fail(CACHEW_ENOMEM, "iterator state: out of memory");
	return CACHEW_OK;
}

cachew_err
cwi_exec_iterator_restore(cachew_iterator *it, cwi_state_reader *r)
{
	if (!cwi_sr_array(r, "iterator", 2) ||
	    !cwi_sr_elements(r, "pulled elements", &it->ready))
		return cwi_sr_error(r);
	it->pos = 0;
	if (cwi_iter_restore(it->root, r) != CACHEW_OK)
		return cwi_sr_error(r);
	if (it->root->done == CACHEW_EOF)
		it->done = CACHEW_EOF;
	return CACHEW_OK;
}
