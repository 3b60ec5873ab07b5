/* coord_ec.c — see coord_ec.h. */
#include "cluster/coord_ec.h"
#include "cluster/coord_i.h"
#include "net/frame.h"
#include "tiers/ec.h"
#include "tiers/ecplan.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EC_MAX_STEPS 64u          /* parity steps per node's report */

/* reporter stores all its parity of step, and knows owner's hash there */
struct ec_ent {
	uint32_t reporter, owner;
	uint64_t step;
	uint8_t hash[32];
};

struct coord_ec {
	struct ec_redundancy red;
	int red_rank;                 /* who set red; -1 none */
	char mismatch[300];           /* a node runs another redundancy: the note */
	struct ec_ent *v;
	size_t n, cap;
};

void coord_ec_free(struct coord_ec *x)
{
	if (!x)
		return;
	free(x->v);
	free(x);
}

/* Room in *out for hold n (util_grow's doubling). */
static int push_hold(struct lkg_hold **out, size_t n, size_t *cap)
{
	struct lkg_hold *nv = util_grow(*out, n, cap, sizeof(*nv), 16);
	if (!nv)
		return -ENOMEM;
	*out = nv;
	return 0;
}

static void drop_reporter(struct coord_ec *x, uint32_t rank)
{
	size_t k = 0;
	for (size_t i = 0; i < x->n; i++)
		if (x->v[i].reporter != rank)
			x->v[k++] = x->v[i];
	x->n = k;
}

static int add(struct coord_ec *x, const struct ec_ent *e)
{
	if (x->n == x->cap) {
		size_t nc = x->cap ? x->cap * 2 : 64;
		struct ec_ent *nv = realloc(x->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		x->v = nv;
		x->cap = nc;
	}
	x->v[x->n++] = *e;
	return 0;
}

int coord_ec_report(struct coord_ec **xp, uint32_t nodes, int rank, json_t *msg, char *note,
		    size_t notelen)
{
	json_t *ec = json_object_get(msg, "ec"), *par, *st;
	struct ec_redundancy red;
	struct coord_ec *x = *xp;
	const char *rs;
	size_t i;

	if (x)
		drop_reporter(x, (uint32_t)rank);
	if (!json_is_object(ec) || net_json_str(ec, "redundancy", 32, &rs) < 0 ||
	    ec_parse_redundancy(rs, &red, NULL, 0) < 0)
		return 0;
	if (!x) {
		x = *xp = calloc(1, sizeof(*x));
		if (!x)
			return 0;
		x->red = red;
		x->red_rank = rank;
	}
	if (x->red_rank != rank && (red.kind != x->red.kind || red.k != x->red.k || red.m != x->red.m)) {
		char a[32], b[32];
		ec_redundancy_str(&red, a, sizeof(a));
		ec_redundancy_str(&x->red, b, sizeof(b));
		snprintf(x->mismatch, sizeof(x->mismatch), "node %d runs redundancy %s, node %d %s: every node of a job needs the same; its fragments are not used",
			 rank, a, x->red_rank, b);
		if (note)
			snprintf(note, notelen, "%s", x->mismatch);
		return 1;
	}
	if (x->red_rank == rank)
		x->mismatch[0] = '\0';
	x->red = red;
	x->red_rank = rank;
	par = json_object_get(ec, "parity");
	json_array_foreach(par, i, st) {
		json_int_t step;
		json_t *hs, *h;
		size_t k;
		if (i >= EC_MAX_STEPS || !json_is_array(st) || json_array_size(st) != 2 ||
		    !json_is_integer(json_array_get(st, 0)) ||
		    (step = json_integer_value(json_array_get(st, 0))) < 0 ||
		    !json_is_array(hs = json_array_get(st, 1)))
			continue;
		json_array_foreach(hs, k, h) {
			struct ec_ent e = { .reporter = (uint32_t)rank, .step = (uint64_t)step };
			json_int_t owner;
			const char *hex;
			if (k >= EC_MAX_N || !json_is_array(h) || json_array_size(h) != 2 ||
			    !json_is_integer(json_array_get(h, 0)) ||
			    (owner = json_integer_value(json_array_get(h, 0))) < 0 ||
			    (uint64_t)owner >= nodes || !(hex = json_string_value(json_array_get(h, 1))) ||
			    net_hex_decode(hex, strlen(hex), e.hash, 32) < 0)
				continue;
			e.owner = (uint32_t)owner;
			if (add(x, &e) < 0)
				return 0;
		}
	}
	return 0;
}

bool coord_ec_parity(const struct coord_ec *x, uint32_t rank, uint64_t step)
{
	for (size_t i = 0; x && i < x->n; i++)
		if (x->v[i].reporter == rank && x->v[i].step == step)
			return true;
	return false;
}

const char *coord_ec_red(const struct coord_ec *x, char *buf, size_t len)
{
	if (!x || x->red.kind != EC_RS)
		return NULL;
	return ec_redundancy_str(&x->red, buf, len);
}

void coord_ec_catalog(struct cjob *j, int rank, json_t *msg)
{
	if (coord_ec_report(&j->ec, j->nodes, rank, msg, NULL, 0) == 1) {
		log_warn("coord", "job %s: %s", j->name, j->ec->mismatch);
		coord_ec_note(j);
	}
}

void coord_ec_note(struct cjob *j)
{
	struct coord_ec *x = j->ec;
	size_t n = strlen(j->notes);

	if (!x || !x->mismatch[0] || strstr(j->notes, x->mismatch))
		return;
	snprintf(j->notes + n, sizeof(j->notes) - n, "%s%s", n ? "; " : "", x->mismatch);
}

static bool holds_own(const struct lkg_input *in, uint32_t r, uint64_t step)
{
	for (size_t i = 0; i < in->nh; i++)
		if (in->h[i].holder == r && in->h[i].owner == r && in->h[i].step == step &&
		    in->h[i].worker == 0)
			return true;
	return false;
}

static bool held_anywhere(const struct lkg_input *in, uint32_t o, uint64_t step)
{
	for (size_t i = 0; i < in->nh; i++)
		if (in->h[i].owner == o && in->h[i].step == step &&
		    (!in->live || in->live[in->h[i].holder]))
			return true;
	return false;
}

static const struct ec_ent *hash_of(const struct coord_ec *x, uint32_t o, uint64_t step)
{
	for (size_t i = 0; i < x->n; i++)
		if (x->v[i].owner == o && x->v[i].step == step)
			return &x->v[i];
	return NULL;
}

/* A live data-parallel twin of representative o holds its own shard of
 * step with o's content: lkg_plan restores o from it (a copy), so the
 * code must not rebuild o (a decode from K+M-1 members) in its place. */
static bool twin_holds(const struct lkg_input *in, const struct ecplan *plan, uint32_t o,
		       uint64_t step, const uint8_t *hash)
{
	for (size_t i = 0; i < in->nh; i++) {
		const struct lkg_hold *h = &in->h[i];
		if (h->owner != h->holder || h->owner == o || h->owner >= in->nodes ||
		    h->step != step || h->worker != 0 || plan->rep[h->owner] != (int)o ||
		    (in->live && !in->live[h->holder]))
			continue;
		if (memcmp(h->hash, hash, 32) == 0)
			return true;
	}
	return false;
}

/* Holds the code adds at one step: appended to *out. */
static int augment_step(const char *job, bool quiet, const struct coord_ec *x,
			const struct ecplan *plan, const struct lkg_input *in, uint64_t step,
			bool *has_data, bool *has_parity, struct lkg_hold **out, size_t *n, size_t *cap)
{
	uint32_t N = in->nodes;

	for (uint32_t r = 0; r < N; r++) {
		bool live = !in->live || in->live[r];
		has_data[r] = live && holds_own(in, r, step);
		has_parity[r] = false;
	}
	for (size_t i = 0; i < x->n; i++)
		if (x->v[i].step == step && x->v[i].reporter < N &&
		    (!in->live || in->live[x->v[i].reporter]))
			has_parity[x->v[i].reporter] = true;
	for (uint32_t o = 0; o < N; o++) {
		const struct ec_ent *h;
		char why[200] = "";
		/* a data-parallel twin's shard comes from its column mates
		 * (lkg_plan); the code rebuilds representatives only */
		if ((in->live && !in->live[o]) || held_anywhere(in, o, step) || plan->rep[o] != (int)o)
			continue;
		h = hash_of(x, o, step);
		if (h && twin_holds(in, plan, o, step, h->hash))
			continue;
		if (ecplan_restorable(plan, has_data, has_parity, (int)o, why, sizeof(why)) != 1) {
			if (!quiet)
				log_warn("coord", "job %s step %" PRIu64 ": node %u's shard is held nowhere and the erasure code cannot rebuild it: %s",
					 job, step, o, why[0] ? why : "no group");
			continue;
		}
		if (!h)
			continue;
		if (push_hold(out, *n, cap) < 0)
			return -ENOMEM;
		struct lkg_hold lh = { .holder = o, .owner = o, .step = step };
		memcpy(lh.hash, h->hash, 32);
		(*out)[(*n)++] = lh;
		if (!quiet)
			log_info("coord", "job %s step %" PRIu64 ": node %u's shard is rebuilt from the erasure code (rs:%u+%u)",
				 job, step, o, x->red.k, x->red.m);
		/* its live twins that lost their copy too rebuild the same
		 * shard themselves: borrowing it from o would fetch a shard
		 * that o is still decoding (refused, and the step abandoned) */
		for (uint32_t t = 0; t < N; t++) {
			if (t == o || plan->rep[t] != (int)o || (in->live && !in->live[t]) ||
			    held_anywhere(in, t, step))
				continue;
			if (push_hold(out, *n, cap) < 0)
				return -ENOMEM;
			lh.holder = lh.owner = t;
			(*out)[(*n)++] = lh;
			if (!quiet)
				log_info("coord", "job %s step %" PRIu64 ": node %u's shard (node %u's twin) is rebuilt from the erasure code",
					 job, step, t, o);
		}
	}
	return 0;
}

struct lkg_hold *coord_ec_augment(struct cjob *j, struct lkg_input *in)
{
	return coord_ec_rebuilt(j->ec, j->name, in, false);
}

struct lkg_hold *coord_ec_rebuilt(struct coord_ec *x, const char *job, struct lkg_input *in,
				  bool quiet)
{
	struct ecplan *plan = NULL;
	struct lkg_hold *out = NULL;
	bool *has_data = NULL, *has_parity = NULL;
	int *same = NULL;
	size_t n = 0, cap = 0;
	uint64_t done[EC_MAX_STEPS];
	size_t ndone = 0;

	/* per-worker shards (framework: pytorch with workers) are not coded */
	if (!x || x->red.kind != EC_RS || !x->n || (in->workers > 1))
		return NULL;
	same = calloc(in->nodes, sizeof(int));
	has_data = calloc(in->nodes, sizeof(bool));
	has_parity = calloc(in->nodes, sizeof(bool));
	if (!same || !has_data || !has_parity || ecplan_dp_same((int)in->nodes, (int)in->dp, same) < 0)
		goto fail;
	struct ecplan_in pin = { .nodes = (int)in->nodes, .k = x->red.k, .m = x->red.m, .same = same };
	if (ecplan_build(&pin, &plan) < 0)
		goto fail;
	cap = in->nh + 16;
	out = malloc(cap * sizeof(*out));
	if (!out)
		goto fail;
	memcpy(out, in->h, in->nh * sizeof(*out));
	n = in->nh;
	for (size_t i = 0; i < x->n; i++) {
		uint64_t s = x->v[i].step;
		size_t d;
		for (d = 0; d < ndone && done[d] != s; d++)
			;
		if (d < ndone || ndone == EC_MAX_STEPS)
			continue;
		done[ndone++] = s;
		if (augment_step(job, quiet, x, plan, in, s, has_data, has_parity, &out, &n, &cap) < 0)
			goto fail;
	}
	if (n == in->nh)
		goto fail;     /* nothing added */
	in->h = out;
	in->nh = n;
	goto done;
fail:
	free(out);
	out = NULL;
done:
	ecplan_free(plan);
	free(same);
	free(has_data);
	free(has_parity);
	return out;
}
