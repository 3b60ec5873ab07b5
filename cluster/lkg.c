#include "cluster/lkg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Holdings sorted by (step descending, owner, worker, holder): one step's
 * shards are a contiguous run and one (owner, worker)'s holders a sub-run,
 * so a plan over thousands of nodes costs O(n log n). */
static int cmp_hold(const void *a, const void *b)
{
	const struct lkg_hold *x = *(const struct lkg_hold *const *)a;
	const struct lkg_hold *y = *(const struct lkg_hold *const *)b;
	if (x->step != y->step)
		return x->step < y->step ? 1 : -1;
	if (x->owner != y->owner)
		return x->owner < y->owner ? -1 : 1;
	if (x->worker != y->worker)
		return x->worker < y->worker ? -1 : 1;
	return x->holder < y->holder ? -1 : x->holder > y->holder;
}

static bool is_bad(const struct lkg_input *in, const struct lkg_hold *h)
{
	for (size_t i = 0; i < in->nbad; i++)
		if (in->bad[i].holder == h->holder && in->bad[i].owner == h->owner &&
		    in->bad[i].worker == h->worker && in->bad[i].step == h->step)
			return true;
	return false;
}

static uint32_t nworkers(const struct lkg_input *in)
{
	return in->workers ? in->workers : 1;
}

static bool usable(const struct lkg_input *in, const struct lkg_hold *h)
{
	if (h->holder >= in->nodes || h->owner >= in->nodes || h->worker >= nworkers(in))
		return false;
	if (in->live && !in->live[h->holder])
		return false;
	return !is_bad(in, h);
}

/* Within run[0..n) (one step, sorted by owner, worker), the sub-run of
 * (owner, worker). */
static size_t slot_run(struct lkg_hold **run, size_t n, uint32_t owner, uint32_t w, size_t *len)
{
	size_t lo = 0, hi = n, b;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (run[mid]->owner < owner || (run[mid]->owner == owner && run[mid]->worker < w))
			lo = mid + 1;
		else
			hi = mid;
	}
	b = lo;
	while (lo < n && run[lo]->owner == owner && run[lo]->worker == w)
		lo++;
	*len = lo - b;
	return b;
}

/* Pick a source for rank r's worker w among the holders of (o, w). */
static const struct lkg_hold *pick(const struct lkg_input *in, struct lkg_hold **run, size_t n,
				   uint32_t o, uint32_t w, uint32_t r, const uint32_t *load,
				   bool *self)
{
	const struct lkg_hold *best = NULL;
	size_t len, b = slot_run(run, n, o, w, &len);

	for (size_t i = b; i < b + len; i++) {
		const struct lkg_hold *h = run[i];
		if (!usable(in, h))
			continue;
		if (h->holder == r) {
			*self = true;
			return h;
		}
		if (!best || load[h->holder] < load[best->holder])
			best = h;
	}
	return best;
}

/* With D, may rank r's worker-w shard be taken from another owner of its
 * column? Only when every usable worker-w shard of that column at this
 * step has the same content (the content key where both holds carry one,
 * else the hash): Orbax's processes write per-process files, so
 * the shards of one column often differ, and then nothing says which one r
 * had. Per worker, as GKE compares each worker's file hash. */
static bool column_agrees(const struct lkg_input *in, struct lkg_hold **run, size_t n,
			  uint32_t r, uint32_t w, uint32_t P)
{
	const struct lkg_hold *first = NULL;

	for (size_t i = 0; i < n; i++) {
		const struct lkg_hold *h = run[i];
		if (h->owner % P != r % P || h->worker != w || !usable(in, h))
			continue;
		if (!first)
			first = h;
		else if (first->has_content && h->has_content ?
			 memcmp(first->content, h->content, 32) : memcmp(first->hash, h->hash, 32))
			return false;
	}
	return true;
}

static uint32_t columns_of(const struct lkg_input *in)
{
	return (in->dp > 0 && in->nodes % in->dp == 0) ? in->nodes / in->dp : in->nodes;
}

/* A source for rank r's worker w among run[0..n) (one step) into *s. A
 * rank whose own shard has a usable copy always gets it (whatever its
 * column holds, as GKE's replicator does); only a rank without one borrows
 * a same-column shard under D, and only where the column agrees. false
 * (and *gap, when given) when there is none. */
static bool cover_slot(const struct lkg_input *in, struct lkg_hold **run, size_t n, uint32_t r,
		       uint32_t w, struct lkg_src *s, uint32_t *load, struct lkg_gap *gap)
{
	uint32_t P = columns_of(in);
	const struct lkg_hold *best;
	bool self = false, agrees;

	memset(s, 0, sizeof(*s));
	best = pick(in, run, n, r, w, r, load, &self);
	agrees = !best && P != in->nodes && column_agrees(in, run, n, r, w, P);
	if (agrees)
		for (uint32_t o = r % P; !best && o < in->nodes; o += P)
			if (o != r)
				best = pick(in, run, n, o, w, r, load, &self);
	if (!best) {
		if (gap) {
			gap->rank = r;
			gap->worker = w;
			gap->columns = P != in->nodes;
			gap->disagree = gap->columns && !agrees;
		}
		return false;
	}
	s->found = true;
	s->holder = best->holder;
	s->owner = best->owner;
	s->worker = w;
	memcpy(s->hash, best->hash, 32);
	if (!self)
		load[best->holder]++;
	return true;
}

/* Try to cover every rank with the shards of one step. */
static bool cover(const struct lkg_input *in, struct lkg_hold **run, size_t n,
		  struct lkg_src *src, uint32_t *load, struct lkg_gap *gap)
{
	uint32_t W = nworkers(in);

	memset(load, 0, in->nodes * sizeof(*load));
	for (uint32_t r = 0; r < in->nodes; r++)
		for (uint32_t w = 0; w < W; w++)
			if (!cover_slot(in, run, n, r, w, &src[(size_t)r * W + w], load, gap))
				return false;
	return true;
}

/* The plan's arrays for in (nodes x workers sources, a load per node) and
 * in's holds sorted by cmp_hold in *idx: 0, -EINVAL (no nodes, too many),
 * -ENOMEM. On failure the caller frees what is set (plan_end). */
static int plan_begin(const struct lkg_input *in, struct lkg_plan *out, uint32_t W,
		      uint32_t **load, struct lkg_hold ***idx)
{
	memset(out, 0, sizeof(*out));
	*load = NULL;
	*idx = NULL;
	if (in->nodes == 0 || (size_t)in->nodes * W > SIZE_MAX / sizeof(*out->src))
		return -EINVAL;
	out->nodes = in->nodes;
	out->workers = W;
	out->src = calloc((size_t)in->nodes * W, sizeof(*out->src));
	*load = calloc(in->nodes, sizeof(**load));
	*idx = malloc((in->nh ? in->nh : 1) * sizeof(**idx));
	if (!out->src || !*load || !*idx)
		return -ENOMEM;
	for (size_t i = 0; i < in->nh; i++)
		(*idx)[i] = (struct lkg_hold *)&in->h[i];
	qsort(*idx, in->nh, sizeof(**idx), cmp_hold);
	return 0;
}

static int plan_end(int rc, struct lkg_plan *out, uint32_t *load, struct lkg_hold **idx)
{
	if (rc == 0 && !out->found)
		memset(out->src, 0, (size_t)out->nodes * out->workers * sizeof(*out->src));
	free(idx);
	free(load);
	if (rc < 0)
		lkg_plan_free(out);
	return rc;
}

int lkg_plan(const struct lkg_input *in, struct lkg_plan *out)
{
	struct lkg_hold **idx;
	uint32_t *load;
	int rc = plan_begin(in, out, nworkers(in), &load, &idx);

	for (size_t b = 0; rc == 0 && b < in->nh;) {
		size_t e = b;
		while (e < in->nh && idx[e]->step == idx[b]->step)
			e++;
		if (cover(in, idx + b, e - b, out->src, load, NULL)) {
			out->found = true;
			out->step = idx[b]->step;
			break;
		}
		b = e;
	}
	return plan_end(rc, out, load, idx);
}

int lkg_plan_backup(const struct lkg_input *in, struct lkg_plan *out, struct lkg_gap *gap)
{
	struct lkg_hold **idx;
	uint32_t *load;
	int rc;

	memset(gap, 0, sizeof(*gap));
	for (size_t i = 1; i < in->nh; i++)
		if (in->h[i].step != in->h[0].step) {
			memset(out, 0, sizeof(*out));
			return -EINVAL;     /* one backup holds one step */
		}
	rc = plan_begin(in, out, nworkers(in), &load, &idx);
	if (rc == 0) {
		/* a backup's node holds its own shard: holder == owner, so a
		 * rank with its shard in the backup is its own source, and a
		 * borrowed one names the column mate to fetch */
		out->found = cover(in, idx, in->nh, out->src, load, gap);
		out->step = in->nh ? in->h[0].step : 0;
	}
	return plan_end(rc, out, load, idx);
}

int lkg_step_covered(const struct lkg_input *in, uint64_t step, bool *covered)
{
	struct lkg_hold **idx, **run;
	struct lkg_plan p;
	uint32_t *load, W = nworkers(in);
	size_t b = 0, e;
	int rc = plan_begin(in, &p, W, &load, &idx);

	if (rc == 0) {
		memset(covered, 0, in->nodes * sizeof(*covered));
		while (b < in->nh && idx[b]->step > step)
			b++;
		for (e = b; e < in->nh && idx[e]->step == step; e++)
			;
		run = idx + b;
		for (uint32_t r = 0; r < in->nodes; r++) {
			covered[r] = true;
			for (uint32_t w = 0; w < W && covered[r]; w++)
				covered[r] = cover_slot(in, run, e - b, r, w, &p.src[(size_t)r * W + w],
							load, NULL);
		}
	}
	rc = plan_end(rc, &p, load, idx);
	lkg_plan_free(&p);   /* the sources were only scratch */
	return rc;
}

void lkg_plan_free(struct lkg_plan *p)
{
	if (!p)
		return;
	free(p->src);
	p->src = NULL;
}

bool lkg_newest_complete(uint32_t nodes, uint32_t dp, const struct lkg_hold *h, size_t nh,
			 uint64_t *step)
{
	return lkg_newest_complete_w(nodes, dp, 1, h, nh, step);
}

bool lkg_newest_complete_w(uint32_t nodes, uint32_t dp, uint32_t workers,
			   const struct lkg_hold *h, size_t nh, uint64_t *step)
{
	struct lkg_input in = { .nodes = nodes, .dp = dp, .workers = workers, .h = h, .nh = nh };
	struct lkg_plan p;
	bool found;

	if (lkg_plan(&in, &p) < 0)
		return false;
	found = p.found;
	if (found)
		*step = p.step;
	lkg_plan_free(&p);
	return found;
}
