/*
 * exec_split.c - the split plan of a pipeline (worker part per lease,
 * client part over the service's stream), the client part's placeholder
 * source, split grouping, lease seeds and the helpers of the splittable
 * sources. See exec_split.h for the semantics of running per lease.
 */
#include "exec_split.h"
#include "exec_tune.h"
#include "exec_state.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- which operators run per lease ----------------------------------- */

/*
 * Operators that are correct when run on each lease separately: they work
 * element by element, or on runs of consecutive elements whose cut at a
 * lease end is documented (exec_split.h). Everything else runs on the
 * client; the reasons below are what `explain` shows. Names, not table
 * pointers, so that operators of other modules (the cache operators) need
 * no link-time dependency.
 */
static const char *const per_lease_ops[] = {
    "map", "filter", "flat_map", "interleave", "batch", "padded_batch",
    "unbatch", "shuffle", "prefetch", "autocache", "ignore_errors",
};

static const struct {
	const char *op;
	const char *why;
} client_ops[] = {
    {"take", "selects by position in the whole stream"},
    {"take_while", "ends the whole stream at the first element it rejects"},
    {"unique", "keeps the first occurrence of a value in the whole stream"},
    {"scan", "carries a state across the whole stream"},
    {"reduce", "reduces the whole stream to one element"},
    {"window", "groups elements by position in the whole stream"},
    {"group_by_window", "groups elements by key across the whole stream"},
    {"bucket_by_sequence_length",
	"groups elements by length across the whole stream"},
    {"ragged_batch", "batches consecutive elements of the whole stream"},
    {"rebatch", "regroups rows by position in the whole stream"},
    {"skip", "selects by position in the whole stream"},
    {"shard", "selects by position in the whole stream"},
    {"repeat", "repeats the whole input"},
    {"enumerate", "numbers the elements of the whole stream"},
    {"zip", "joins whole inputs element by element"},
    {"concatenate", "joins whole inputs one after the other"},
    {"sample_from_datasets", "draws from whole inputs at random"},
    {"choose_from_datasets", "draws from whole inputs by a choice dataset"},
    /* One writer per lease would each commit a cache of one lease under
     * the same fingerprint; a distributed write (cache_put with a
     * write_id, which the dispatcher sets) writes a part per lease and
     * runs on the workers (runs_per_lease). */
    {"cache_put", "writes one cache of the whole input (write_id=0)"},
    {"cache", "writes (then reads) one cache of the whole input"},
    {"tfrecord_write", "writes one file of the whole input"},
};

static bool
runs_per_lease(const cwi_node *n)
{
	/* A distributed cache write: each lease writes a part of it. */
	if (strcmp(n->op->name, "cache_put") == 0 &&
	    cwi_node_int(n, "write_id") != 0)
		return n->ninputs == 1;
	for (size_t i = 0; i < sizeof(per_lease_ops) / sizeof(per_lease_ops[0]);
	     i++)
		if (strcmp(n->op->name, per_lease_ops[i]) == 0)
			return n->ninputs == 1;
	return false;
}

static const char *
client_reason(const cwi_node *n)
{
	for (size_t i = 0; i < sizeof(client_ops) / sizeof(client_ops[0]); i++)
		if (strcmp(n->op->name, client_ops[i].op) == 0)
			return client_ops[i].why;
	return "is not known to be correct per lease";
}

/* ---- graph shape -------------------------------------------------------- */

typedef struct node_set {
	const cwi_node **v;
	size_t n, cap;
} node_set;

static bool
set_has(const node_set *s, const cwi_node *node)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == node)
			return true;
	return false;
}

static cachew_err
set_add(node_set *s, const cwi_node *node)
{
	if (s->n == s->cap) {
		size_t cap = s->cap != 0 ? s->cap * 2 : 16;
		const cwi_node **v = realloc(s->v, cap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = node;
	return CACHEW_OK;
}

/* Every node once (a shared subgraph is visited once). */
static cachew_err
collect_all(node_set *all, const cwi_node *node)
{
	cachew_err rv;

	if (set_has(all, node))
		return CACHEW_OK;
	rv = set_add(all, node);
	for (size_t i = 0; i < node->ninputs && rv == CACHEW_OK; i++)
		rv = collect_all(all, node->inputs[i]);
	return rv;
}

/* Appends "a, b, c" of the op names of the nodes matching `want`, each name
 * once. */
static void
names_of(cwi_strbuf *sb, const node_set *all, bool sources)
{
	size_t k = 0;

	for (size_t i = 0; i < all->n; i++) {
		const cwi_node *n = all->v[i];
		bool dup = false;
		if (sources ? n->ninputs != 0 : n->ninputs < 2)
			continue;
		/* zip(range(3), range(3)) names range twice: two sources. */
		for (size_t j = 0; !sources && j < i; j++)
			if (all->v[j]->ninputs >= 2 &&
			    strcmp(all->v[j]->op->name, n->op->name) == 0)
				dup = true;
		if (dup)
			continue;
		cwi_strbuf_printf(sb, "%s%s", k++ > 0 ? ", " : "", n->op->name);
	}
}

/* Why the plan of root has no split source, in terms of its operators,
 * into why (e.g. "the pipeline has 2 sources (range, range) joined by
 * zip"); bottom is the lowest node of root's top chain, which is not a
 * splittable source. Fails only with CACHEW_ENOMEM. */
static cachew_err
whole_reason(const cwi_node *root, const cwi_node *bottom, char *why,
    size_t len)
{
	node_set all = {0};
	size_t nsrc = 0;
	cwi_strbuf src, join;
	cachew_err rv = CACHEW_OK;

	if (bottom->ninputs == 0) {
		snprintf(why, len, "the source %s is not splittable",
		    bottom->op->name);
		return CACHEW_OK;
	}
	rv = collect_all(&all, root);
	if (rv != CACHEW_OK) {
		free(all.v);
		return rv;
	}
	for (size_t i = 0; i < all.n; i++)
		nsrc += all.v[i]->ninputs == 0;
	cwi_strbuf_init(&src);
	cwi_strbuf_init(&join);
	names_of(&src, &all, true);
	names_of(&join, &all, false);
	if (src.oom || join.oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	else if (nsrc > 1)
		snprintf(why, len, "the pipeline has %zu sources (%s) joined by "
				   "%s",
		    nsrc, src.data, join.data);
	else
		snprintf(why, len, "%s reads the source %s through several "
				   "inputs",
		    join.data, src.data);
	cwi_strbuf_free(&src);
	cwi_strbuf_free(&join);
	free(all.v);
	return rv;
}

/* ---- the plan ------------------------------------------------------------- */

static const char *
unit_kind(const cwi_node *source)
{
	if (source->op->flags & CWI_OPF_FILES)
		return "files";
	if (strcmp(source->op->name, "cache_get") == 0)
		return "chunks";
	if (strcmp(source->op->name, "user_source") == 0)
		return "splits";
	return "elements";
}

bool
cwi_split_possible(const cwi_node *root)
{
	const cwi_node *c = root;

	while (c->ninputs == 1)
		c = c->inputs[0];
	return c->ninputs == 0 && c->op->split_units != NULL;
}

static bool
op_is_named(const char *name, const char *const *names, size_t nnames)
{
	for (size_t i = 0; i < nnames; i++)
		if (strcmp(name, names[i]) == 0)
			return true;
	return false;
}

static bool
op_is(const cwi_node *n, const char *const *names, size_t nnames)
{
	return op_is_named(n->op->name, names, nnames);
}

static bool
holds_op(const cwi_node *n, const char *const *names, size_t nnames)
{
	if (op_is(n, names, nnames))
		return true;
	for (size_t i = 0; i < n->ninputs; i++)
		if (holds_op(n->inputs[i], names, nnames))
			return true;
	return false;
}

const char *
cwi_split_local_reason(const cwi_node *root)
{
	static const char *const cache_ops[] = {"cache", "cache_put",
	    "cache_get"};
	static const char *const repeat_op[] = {"repeat"};

	if (!cwi_split_possible(root))
		return "it cannot be split";
	if (holds_op(root, cache_ops, sizeof(cache_ops) / sizeof(*cache_ops)))
		return "it holds a cache operator";
	if (holds_op(root, repeat_op, 1))
		return "it repeats on the client";
	return NULL;
}

/* The grouping operators of the worker part chain[0..nworker) whose tails
 * the client stitches: only when every operator from the first of them up
 * can run on the client as well (no per-lease cache write). */
static void
plan_groups(cwi_split_plan *p, const cwi_node *const *chain, size_t nworker)
{
	static const char *const grouping[] = {"batch", "padded_batch"};
	static const char *const stitchable[] = {"batch", "padded_batch",
	    "map", "filter", "flat_map", "unbatch", "shuffle", "prefetch",
	    "interleave"};
	size_t n = 0;
	bool seen = false;

	for (size_t i = 1; i < nworker; i++) {
		if (op_is(chain[i], grouping, 2)) {
			if (n == CWI_SPLIT_MAX_GROUPS)
				return;
			p->groups[n++] = chain[i];
			seen = true;
		} else if (seen && !op_is(chain[i], stitchable,
				       sizeof(stitchable) /
					   sizeof(stitchable[0]))) {
			return;
		}
	}
	p->ngroups = n;
}

/* ---- the client tail ------------------------------------------------------ */

/*
 * Built-in map functions that may run on the client in place of the
 * workers when they widen the elements: element-wise (one element in, one
 * out, the same number of values per component), deterministic (no seed:
 * nothing depends on the lease or the process), cheap next to what the
 * worker part did before them (normalize: 0.1 ms per 224x224x3 image,
 * against ~1.4 ms of decoding and cropping in W2), and the same code on
 * every process (so the same bytes on the client as on a worker). A
 * function of a plugin or registered from C is never moved: the client
 * need not load what the workers run. decode_jpeg and resize widen too,
 * but they are the expensive part that the workers are there for.
 */
static const char *const widening_fns[] = {"normalize", "cast"};

/* Whether n is a map of a widening function whose output, per the specs,
 * is wider than its input: no component narrower, one wider at least
 * (normalize of f32 or a cast to a narrower dtype stay). Appends what it
 * widens ("u8 -> f32 (image)") to how. */
static bool
widens(const cwi_node *n, cwi_strbuf *how)
{
	const cwi_spec *in, *out;
	bool wider = false;

	if (strcmp(n->op->name, "map") != 0 || n->ninputs != 1 ||
	    n->fn == NULL || !n->fn->builtin ||
	    (n->fn->def.flags & CACHEW_OP_RANDOM) != 0 ||
	    n->fn->def.kind != CACHEW_OP_MAP ||
	    !op_is_named(n->fn->name, widening_fns,
		sizeof(widening_fns) / sizeof(widening_fns[0])))
		return false;
	in = &n->inputs[0]->spec;
	out = &n->spec;
	/* Unknown dtypes say nothing about the bytes: it stays. */
	if (!in->known || !out->known || in->n != out->n)
		return false;
	for (uint32_t c = 0; c < in->n; c++) {
		const cwi_comp_spec *a = &in->comp[c], *b = &out->comp[c];
		if (a->dtype == CACHEW_INVALID || b->dtype == CACHEW_INVALID)
			return false;
		if (cwi_dtype_sizes[b->dtype & 15] <
		    cwi_dtype_sizes[a->dtype & 15])
			return false;
	}
	for (uint32_t c = 0; c < in->n; c++) {
		const cwi_comp_spec *a = &in->comp[c], *b = &out->comp[c];
		if (cwi_dtype_sizes[b->dtype & 15] ==
		    cwi_dtype_sizes[a->dtype & 15])
			continue;
		if (!wider)
			cwi_strbuf_printf(how, "%smap(%s): ",
			    how->len > 0 ? ", " : "", n->fn->name);
		else
			cwi_strbuf_puts(how, " and ");
		cwi_strbuf_printf(how, "%s -> %s (", cachew_dtype_name(
		    (cachew_dtype)a->dtype), cachew_dtype_name(
		    (cachew_dtype)b->dtype));
		if (b->name != NULL)
			cwi_strbuf_printf(how, "%s)", b->name);
		else
			cwi_strbuf_printf(how, "component %u)", c);
		wider = true;
	}
	return wider;
}

/* The client tail of the worker part chain[0..w] (chain[w] its top): how
 * many operators from the top down form a run of widening maps, with the
 * prefetches among and above them (a trailing prefetch alone does not
 * move: it holds no bytes of its own). The source, chain[0], never moves.
 * Writes what the run widens into why. Fails only with CACHEW_ENOMEM. */
static cachew_err
client_tail(const cwi_node *const *chain, size_t w, size_t *ntail,
    char *why, size_t len)
{
	cwi_strbuf how;
	size_t n = 0;

	*ntail = 0;
	cwi_strbuf_init(&how);
	for (size_t i = w; i >= 1; i--) {
		if (strcmp(chain[i]->op->name, "prefetch") == 0)
			continue;
		if (!widens(chain[i], &how))
			break;
		n = w - i + 1;
	}
	if (how.oom) {
		cwi_strbuf_free(&how);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if (n > 0)
		snprintf(why, len, "%s", how.data);
	cwi_strbuf_free(&how);
	*ntail = n;
	return CACHEW_OK;
}

/* Counts the split units of the plan's source into p->units. */
static cachew_err
count_units(cwi_split_plan *p)
{
	cachew_err rv = p->source->op->split_units(p->source, &p->units);
	char msg[512];

	if (rv == CACHEW_OK)
		return CACHEW_OK;
	snprintf(msg, sizeof(msg), "%s", cwi_errmsg_get());
	return cwi_fail(rv, "split: %s: %s", p->source->op->name,
	    msg[0] != '\0' ? msg : cachew_strerror(rv));
}

cachew_err
cwi_split_plan_create(cwi_split_plan **out, cwi_node *root)
{
	return cwi_split_plan_create_for(out, root, 0);
}

cachew_err
cwi_split_plan_create_for(cwi_split_plan **out, cwi_node *root,
    unsigned flags)
{
	cwi_split_plan *p;
	const cwi_node **chain = NULL; /* chain[0] = bottom ... root */
	size_t len = 1, w;
	const cwi_node *c;
	cachew_err rv;

	if (out == NULL || root == NULL)
		return cwi_fail(CACHEW_EINVAL, "split: NULL argument");
	for (c = root; c->ninputs == 1; c = c->inputs[0])
		len++;
	p = calloc(1, sizeof(*p));
	chain = malloc(len * sizeof(*chain));
	if (p == NULL || chain == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	c = root;
	for (size_t i = len; i > 0; i--) {
		chain[i - 1] = c;
		if (c->ninputs == 1)
			c = c->inputs[0];
	}
	/* The top chain ends at a splittable source (split it), or at a
	 * join or a source that cannot be split (the pipeline is one unit). */
	if (chain[0]->ninputs == 0 && chain[0]->op->split_units != NULL) {
		p->source = chain[0];
		p->unit_kind = unit_kind(p->source);
		rv = count_units(p);
	} else {
		p->units = 1;
		p->unit_kind = "pipeline";
		rv = whole_reason(root, chain[0], p->whole, sizeof(p->whole));
	}
	if (rv != CACHEW_OK)
		goto fail;
	for (w = 0; w + 1 < len && runs_per_lease(chain[w + 1]); w++)
		;
	p->boundary = w + 1 < len ? chain[w + 1] : NULL;
	if (p->boundary != NULL)
		snprintf(p->why, sizeof(p->why), "%s",
		    client_reason(p->boundary));
	rv = client_tail(chain, w, &p->ncandidate, p->tail_why,
	    sizeof(p->tail_why));
	if (rv != CACHEW_OK)
		goto fail;
	if (flags & CWI_SPLIT_CLIENT_TAIL) {
		p->ntail = p->ncandidate;
		w -= p->ntail;
	}
	p->root = cachew_dataset_retain(root);
	p->worker = (cwi_node *)chain[w];
	p->nworker = w + 1;
	p->nclient = len - p->nworker;
	p->worker_fp = *cwi_node_fp(p->worker);
	/* Over the worker part that runs on the workers: a batch below the
	 * tail is stitched, and the tail widens the stitched batch. */
	plan_groups(p, chain, p->nworker);
	free(chain);
	*out = p;
	return CACHEW_OK;
fail:
	free(chain);
	free(p);
	return rv;
}

void
cwi_split_plan_destroy(cwi_split_plan *p)
{
	if (p == NULL)
		return;
	cachew_dataset_release(p->root);
	free(p);
}

cachew_err
cwi_split_plan_describe(const cwi_split_plan *p, cwi_strbuf *sb)
{
	cwi_node *client = NULL;
	char hex[33];
	cachew_err rv;

	cachew_fingerprint_hex(&p->worker_fp, hex);
	if (p->source != NULL)
		cwi_strbuf_printf(sb, "split source: %s (%llu %s)\n",
		    p->source->op->name, (unsigned long long)p->units,
		    p->unit_kind);
	else
		cwi_strbuf_printf(sb, "split source: none, the worker part runs "
				      "whole as one unit (%s)\n",
		    p->whole);
	cwi_strbuf_puts(sb, "worker part:  ");
	rv = cwi_node_to_string(p->worker, sb);
	if (rv != CACHEW_OK)
		return rv;
	cwi_strbuf_printf(sb, "  fp=%s\n", hex);
	cwi_strbuf_puts(sb, "client part:  ");
	if (p->nclient == 0) {
		cwi_strbuf_puts(sb, "none\n");
	} else {
		rv = cwi_split_client_graph(p, NULL, &client);
		if (rv == CACHEW_OK)
			rv = cwi_node_to_string(client, sb);
		cachew_dataset_release(client);
		if (rv != CACHEW_OK)
			return rv;
		cwi_strbuf_puts(sb, "\n");
	}
	if (p->ntail > 0)
		cwi_strbuf_printf(sb, "client tail:  %s runs on the client "
		    "over a remote service (client_tail=auto): it widens the "
		    "elements element-wise and deterministically, so the "
		    "workers send the narrower ones; it stays on the workers "
		    "on the embedded service, for a named job and with "
		    "client_tail=off\n", p->tail_why);
	else if (p->ncandidate > 0)
		cwi_strbuf_printf(sb, "client tail:  %s stays on the workers "
		    "(a remote service's client with client_tail=auto runs "
		    "it)\n", p->tail_why);
	if (p->boundary != NULL)
		cwi_strbuf_printf(sb, "boundary:     %s %s\n",
		    p->boundary->op->name, p->why);
	if (sb->oom)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

cachew_err
cwi_split_explain(cwi_node *root, cwi_strbuf *sb)
{
	cwi_split_plan *p = NULL;
	cachew_err rv = cwi_split_plan_create_for(&p, root,
	    CWI_SPLIT_CLIENT_TAIL);

	if (rv == CACHEW_OK) {
		rv = cwi_split_plan_describe(p, sb);
		cwi_split_plan_destroy(p);
	}
	if (rv != CACHEW_OK && rv != CACHEW_ENOMEM) {
		const char *msg = cwi_errmsg_get();
		cwi_strbuf_printf(sb, "%s%s\n",
		    strncmp(msg, "split: ", 7) == 0 ? "" : "split: ", msg);
		rv = CACHEW_OK;
	}
	if (rv == CACHEW_OK && sb->oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	return rv;
}

cachew_err
cwi_split_group(uint64_t nunits, uint64_t target_splits, cwi_unit_range **out,
    size_t *n)
{
	uint64_t k, base, extra, at = 0;
	cwi_unit_range *v;

	if (out == NULL || n == NULL || target_splits == 0)
		return cwi_fail(CACHEW_EINVAL,
		    "split: group needs a target of at least one split");
	*out = NULL;
	*n = 0;
	if (nunits == 0)
		return CACHEW_OK;
	k = target_splits < nunits ? target_splits : nunits;
	if (k > SIZE_MAX / sizeof(*v))
		return cwi_fail(CACHEW_ENOMEM,
		    "split: %llu splits do not fit in memory",
		    (unsigned long long)k);
	v = malloc((size_t)k * sizeof(*v));
	if (v == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	base = nunits / k;
	extra = nunits % k; /* the first `extra` splits get one more */
	for (uint64_t i = 0; i < k; i++) {
		uint64_t size = base + (i < extra ? 1 : 0);
		v[i].begin = at;
		v[i].end = at + size;
		at += size;
	}
	*out = v;
	*n = (size_t)k;
	return CACHEW_OK;
}

/* ---- the client part's placeholder ------------------------------------------ */

typedef struct stream_iter {
	cwi_iter base;
	const cwi_stream_source *src;
	void *stream;
	bool open;
	/* Attached to the pipeline's tuner while the stream can be
	 * canceled, so that cachew_iterator_cancel wakes its next(). */
	cwi_tune_op tune;
	bool attached;
} stream_iter;

static void
stream_wake(void *arg)
{
	stream_iter *s = arg;

	s->src->ops->cancel(s->stream);
}

static cachew_err
stream_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	stream_iter *s = (stream_iter *)it;
	char err[512] = "";
	cachew_err rv;

	rv = s->src->ops->next(s->stream, out, max, err, sizeof(err));
	if (rv == CACHEW_OK || rv == CACHEW_EOF)
		return rv;
	/* As the stream gives it: a worker's pipeline error names its
	 * operator as in-process, the client's own errors the service. */
	return cwi_pipeline_fail(it->pl, rv, "%s",
	    err[0] != '\0' ? err : cachew_strerror(rv));
}

static void
stream_destroy(cwi_iter *it)
{
	stream_iter *s = (stream_iter *)it;

	if (s->attached)
		cwi_tune_detach(&s->tune);
	if (s->open && s->src->ops->close != NULL)
		s->src->ops->close(s->stream);
	free(s);
}

/* The stream's position is the service's side of the iterator: what the
 * session received and holds (client_exact.c). */
static cachew_err
stream_save(cwi_iter *it, cwi_state_writer *w)
{
	stream_iter *s = (stream_iter *)it;

	if (s->src->ops->save == NULL)
		return cwi_fail(CACHEW_ENOTSUP,
		    "service_stream: this stream cannot save its position");
	return s->src->ops->save(s->stream, w);
}

static cachew_err
stream_restore(cwi_iter *it, cwi_state_reader *r)
{
	stream_iter *s = (stream_iter *)it;

	if (s->src->ops->restore == NULL) {
		cwi_sr_fail(r, CACHEW_ENOTSUP,
		    "this stream cannot restore a position");
		return cwi_sr_error(r);
	}
	return s->src->ops->restore(s->stream, r);
}

static const cwi_iter_ops stream_iter_ops = {
    .next = stream_next,
    .destroy = stream_destroy,
    .save = stream_save,
    .restore = stream_restore,
};

/* The node's fn_state holds the borrowed cwi_stream_source (the node has
 * no function, so nothing else reads or frees it). */
static cachew_err
stream_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	const cwi_stream_source *src = node->fn_state;
	char err[512] = "";
	stream_iter *s;
	cachew_err rv;

	if (src == NULL || src->ops == NULL || src->ops->open == NULL ||
	    src->ops->next == NULL)
		return cwi_fail(CACHEW_EINVAL,
		    "no stream is attached (the client part was built for "
		    "printing only)");
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->base.ops = &stream_iter_ops;
	s->src = src;
	rv = src->ops->open(src->ctx, args->epoch, &s->stream, err, sizeof(err));
	if (rv != CACHEW_OK) {
		free(s);
		return cwi_fail(rv, "%s", err[0] != '\0' ? err
							  : cachew_strerror(rv));
	}
	s->open = true;
	if (src->ops->cancel != NULL) {
		rv = cwi_tune_attach(&s->tune, args->pl, stream_wake, s);
		if (rv != CACHEW_OK) {
			stream_destroy(&s->base);
			return rv;
		}
		s->attached = true;
	}
	*out = &s->base;
	return CACHEW_OK;
}

static const cwi_param_spec stream_params[] = {
    {.name = "fingerprint", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the fingerprint of the worker part it stands for"},
};

/* Internal: never in a registry table (so absent from `cachew ops` and
 * unknown to the parser and the graph decoder). */
static const cwi_dataset_op stream_op = {
    .name = "service_stream",
    .doc = "internal: the elements of a pipeline's worker part, streamed "
	   "from the service to the client part",
    .params = stream_params,
    .nparams = 1,
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_ASYNC,
    .iter_create = stream_create,
};

static cachew_err
placeholder_new(const cwi_split_plan *p, const cwi_stream_source *src,
    cwi_node **out)
{
	cwi_node *n = calloc(1, sizeof(*n));
	cwi_value v = {0};
	char hex[33];
	cachew_err rv;

	if (n == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	atomic_init(&n->refs, 1);
	n->op = &stream_op;
	n->params.map.type = CWI_V_MAP;
	cachew_fingerprint_hex(&p->worker_fp, hex);
	rv = cwi_value_set_str(&v, hex, strlen(hex));
	if (rv == CACHEW_OK)
		rv = cwi_map_set(&n->params.map, "fingerprint", &v);
	/* It yields what the worker part does: the client part's operators
	 * see the same spec and count as in the whole pipeline (reduce of an
	 * empty stream shapes its initial state by it). */
	if (rv == CACHEW_OK)
		rv = cwi_spec_copy(&n->spec, &p->worker->spec);
	if (rv != CACHEW_OK) {
		cwi_value_free(&v);
		cachew_dataset_release(n);
		return rv;
	}
	n->card = p->worker->card;
	n->fn_state = (void *)src;
	n->fp_value = p->worker_fp;
	n->seed_fp = p->worker->seed_fp;
	*out = n;
	return CACHEW_OK;
}

cachew_err
cwi_split_client_graph(const cwi_split_plan *p, const cwi_stream_source *src,
    cwi_node **out)
{
	const cwi_node **chain;
	size_t len = p->nclient;
	cwi_node *cur = NULL, *next;
	const cwi_node *c;
	cachew_err rv;

	rv = placeholder_new(p, src, &cur);
	if (rv != CACHEW_OK || len == 0)
		goto done;
	chain = malloc(len * sizeof(*chain));
	if (chain == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	c = p->root;
	for (size_t i = len; i > 0; i--) {
		chain[i - 1] = c;
		c = c->inputs[0]; /* the worker part is below the chain */
	}
	/* Same operator, same canonical parameters, the placeholder below:
	 * the same fingerprints as in the whole pipeline. */
	for (size_t i = 0; i < len && rv == CACHEW_OK; i++) {
		rv = cwi_node_build(&next, chain[i]->op->name, &cur, 1, NULL,
		    &chain[i]->params.map);
		cachew_dataset_release(cur);
		cur = rv == CACHEW_OK ? next : NULL;
	}
	free(chain);
done:
	if (rv != CACHEW_OK) {
		cachew_dataset_release(cur);
		return rv;
	}
	*out = cur;
	return CACHEW_OK;
}

/* ---- stitching -------------------------------------------------------------- */

uint64_t
cwi_split_group_n(const cwi_split_plan *p, size_t k)
{
	return k < p->ngroups ? (uint64_t)cwi_node_int(p->groups[k], "n") : 1;
}

cachew_err
cwi_split_stitch_graph(const cwi_split_plan *p, size_t k,
    const cwi_stream_source *src, cwi_node **out)
{
	const cwi_node *chain[64];
	const cwi_node *stop = k + 1 < p->ngroups ? p->groups[k + 1] : NULL;
	const cwi_node *c;
	size_t len = 0;
	cwi_node *cur = NULL, *next;
	cachew_err rv;

	if (k >= p->ngroups)
		return cwi_fail(CACHEW_EINVAL, "stitch: no grouping operator "
		    "%zu", k);
	/* From the top of the worker part down to groups[k]. */
	c = p->worker;
	if (stop != NULL)
		while (c != stop)
			c = c->inputs[0];
	if (stop != NULL)
		c = c->inputs[0];
	for (;; c = c->inputs[0]) {
		if (len == sizeof(chain) / sizeof(chain[0]))
			return cwi_fail(CACHEW_ENOTSUP, "stitch: more than %zu "
			    "operators between two batches", len);
		chain[len++] = c;
		if (c == p->groups[k])
			break;
	}
	rv = placeholder_new(p, src, &cur);
	/* Same operators and parameters, source first. */
	for (size_t i = len; i > 0 && rv == CACHEW_OK; i--) {
		rv = cwi_node_build(&next, chain[i - 1]->op->name, &cur, 1,
		    NULL, &chain[i - 1]->params.map);
		cachew_dataset_release(cur);
		cur = rv == CACHEW_OK ? next : NULL;
	}
	if (rv != CACHEW_OK) {
		cachew_dataset_release(cur);
		return rv;
	}
	*out = cur;
	return CACHEW_OK;
}

/* ---- leases ----------------------------------------------------------------- */

/* Keeps lease seeds apart from the other seeds derived from the job's. */
#define LEASE_SEED_TAG 0x6c65617365ULL /* "lease" */

uint64_t
cwi_split_lease_seed(
    uint64_t seed, const cwi_unit_range *ranges, size_t nranges)
{
	if (nranges == 0 || ranges[0].begin == 0)
		return seed;
	return cwi_seed_derive(seed ^ LEASE_SEED_TAG, ranges[0].begin);
}

/* ---- for the splittable sources ------------------------------------------ */

cachew_err
cwi_split_source_ranges(const cwi_iter_args *args, const cwi_node *node,
    uint64_t units, bool *split, const cwi_unit_range **ranges, size_t *n)
{
	const cwi_pipeline *pl = args->pl;

	*split = false;
	*ranges = NULL;
	*n = 0;
	if (pl->split_node != node)
		return CACHEW_OK;
	for (size_t i = 0; i < pl->nsplit_ranges; i++) {
		const cwi_unit_range *r = &pl->split_ranges[i];
		if (r->begin > r->end || r->end > units)
			return cwi_fail(CACHEW_ERANGE,
			    "split units [%llu, %llu) are outside the source's "
			    "%llu units (did the input change since the plan?)",
			    (unsigned long long)r->begin,
			    (unsigned long long)r->end,
			    (unsigned long long)units);
	}
	*split = true;
	*ranges = pl->split_ranges;
	*n = pl->nsplit_ranges;
	return CACHEW_OK;
}

cachew_err
cwi_split_select_paths(const cwi_iter_args *args, const cwi_node *node,
    char ***paths, size_t *n)
{
	const cwi_unit_range *ranges;
	cwi_unit_cursor cur;
	size_t nranges, k = 0, total = 0;
	bool split;
	uint64_t u;
	char **sel;
	cachew_err rv;

	rv = cwi_split_source_ranges(args, node, *n, &split, &ranges, &nranges);
	if (rv != CACHEW_OK || !split)
		return rv;
	for (size_t i = 0; i < nranges; i++) {
		uint64_t d = ranges[i].end - ranges[i].begin;
		if (d >= SIZE_MAX / sizeof(char *) - total)
			return cwi_fail(CACHEW_ENOMEM,
			    "split: the lease names too many files");
		total += (size_t)d;
	}
	sel = calloc(total + 1, sizeof(char *));
	if (sel == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_unit_cursor_init(&cur, ranges, nranges);
	while (cwi_unit_cursor_next(&cur, &u)) {
		sel[k] = cwi_strdup((*paths)[u]);
		if (sel[k] == NULL) {
			cwi_paths_free(sel);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		k++;
	}
	cwi_paths_free(*paths);
	*paths = sel;
	*n = k;
	return CACHEW_OK;
}

cachew_err
cwi_split_units_files(const cwi_node *node, uint64_t *units)
{
	const char **pats;
	char **paths = NULL;
	size_t npat = 0, n = 0;
	cachew_err rv;

	pats = cwi_value_str_list(cwi_node_value(node, "files"), &npat);
	if (pats == NULL)
		return CACHEW_ENOMEM;
	rv = cwi_paths_expand(pats, npat, &paths, &n);
	free(pats);
	if (rv != CACHEW_OK)
		return rv;
	cwi_paths_free(paths);
	*units = n;
	return CACHEW_OK;
}
