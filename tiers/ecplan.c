/* Erasure-coded groups and fragment placement; the rule is in ecplan.h. */
#include "tiers/ecplan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ECPLAN_MAX_NODES 65536

int ecplan_dp_same(int nodes, int assume_dp, int *same)
{
	int part;

	if (nodes < 1 || assume_dp < 0 || !same)
		return -EINVAL;
	part = assume_dp >= 2 ? nodes / assume_dp : 0;
	for (int r = 0; r < nodes; r++)
		same[r] = part >= 1 && nodes % assume_dp == 0 ? r % part : r;
	return 0;
}

struct unit {
	int rank, dom, cnt;
};

static int by_dom(const void *a, const void *b)
{
	const struct unit *x = a, *y = b;

	if (x->dom != y->dom)
		return x->dom < y->dom ? -1 : 1;
	return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Largest domain first, then label, then rank: the dealing order. */
static int by_cnt(const void *a, const void *b)
{
	const struct unit *x = a, *y = b;

	if (x->cnt != y->cnt)
		return x->cnt > y->cnt ? -1 : 1;
	return by_dom(a, b);
}

static int by_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

void ecplan_free(struct ecplan *p)
{
	if (!p)
		return;
	free(p->g);
	free(p->group);
	free(p->pos);
	free(p->rep);
	free(p);
}

static void note(struct ecplan *p, const char *s)
{
	size_t used = strnlen(p->why, sizeof p->why);

	if (used + 1 < sizeof p->why)
		snprintf(p->why + used, sizeof p->why - used, "%s%s", used ? "; " : "", s);
}

int ecplan_build(const struct ecplan_in *in, struct ecplan **out)
{
	struct ecplan *p = NULL;
	struct unit *u = NULL;
	unsigned nu = 0, ng, G;
	char buf[160];
	int rc = -ENOMEM;

	if (!in || !out || in->nodes < 1 || in->nodes > ECPLAN_MAX_NODES || in->k < 1 ||
	    in->m < 1 || in->k + in->m > EC_MAX_N)
		return -EINVAL;
	for (int r = 0; in->same && r < in->nodes; r++) {
		int s = in->same[r];
		if (s < 0 || s > r || in->same[s] != s)
			return -EINVAL;
	}
	p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->nodes = in->nodes;
	p->domains_ok = true;
	p->group = malloc((size_t)in->nodes * sizeof *p->group);
	p->pos = malloc((size_t)in->nodes * sizeof *p->pos);
	p->rep = malloc((size_t)in->nodes * sizeof *p->rep);
	u = malloc((size_t)in->nodes * sizeof *u);
	if (!p->group || !p->pos || !p->rep || !u)
		goto out;
	for (int r = 0; r < in->nodes; r++) {
		p->rep[r] = in->same ? in->same[r] : r;
		p->group[r] = -1;
		p->pos[r] = -1;
		if (p->rep[r] == r)
			u[nu++] = (struct unit){ .rank = r, .dom = in->domain ? in->domain[r] : r };
	}
	G = in->k + in->m;
	if (nu <= in->m) {
		snprintf(buf, sizeof buf,
			 "%u distinct shard(s): rs:%u+%u needs at least %u; nothing is encoded", nu,
			 in->k, in->m, in->m + 1);
		note(p, buf);
		rc = 0;
		goto out;
	}
	ng = nu < G ? 1 : nu / G;
	if (ng < (nu + EC_MAX_N - 1) / EC_MAX_N)
		ng = (nu + EC_MAX_N - 1) / EC_MAX_N;
	p->ngroups = ng;
	p->g = calloc(ng, sizeof *p->g);
	if (!p->g)
		goto out;
	/* Count each domain's units, then deal largest domains first. */
	qsort(u, nu, sizeof *u, by_dom);
	for (unsigned i = 0, j; i < nu; i = j) {
		for (j = i; j < nu && u[j].dom == u[i].dom; j++)
			;
		for (unsigned x = i; x < j; x++)
			u[x].cnt = (int)(j - i);
	}
	qsort(u, nu, sizeof *u, by_cnt);
	for (unsigned i = 0; i < nu; i++) {
		struct ecplan_group *g = &p->g[i % ng];
		g->unit[g->n++] = u[i].rank;
	}
	for (unsigned gi = 0; gi < ng; gi++) {
		struct ecplan_group *g = &p->g[gi];
		g->m = in->m;
		g->k = g->n - in->m;
		qsort(g->unit, g->n, sizeof g->unit[0], by_int);
		for (unsigned x = 0; x < g->n; x++) {
			p->group[g->unit[x]] = (int)gi;
			p->pos[g->unit[x]] = (int)x;
		}
		/* at most M units of one domain in the group, else M losses of
		 * that one domain take more than M members of every codeword */
		for (unsigned x = 0; x < g->n && p->domains_ok; x++) {
			int d = in->domain ? in->domain[g->unit[x]] : g->unit[x];
			unsigned c = 0;
			for (unsigned y = 0; y < g->n; y++)
				c += (in->domain ? in->domain[g->unit[y]] : g->unit[y]) == d;
			if (c > in->m) {
				p->domains_ok = false;
				snprintf(buf, sizeof buf,
					 "failure domain %d holds %u units of group %u (more than M %u)",
					 d, c, gi, in->m);
				note(p, buf);
			}
		}
		if (g->k != in->k) {
			snprintf(buf, sizeof buf, "group %u is rs:%u+%u (%u units)", gi, g->k, g->m, g->n);
			note(p, buf);
		}
	}
	for (int r = 0; r < in->nodes; r++) {
		p->group[r] = p->group[p->rep[r]];
		p->pos[r] = p->pos[p->rep[r]];
	}
	rc = 0;
out:
	free(u);
	if (rc) {
		ecplan_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

unsigned ecplan_slot_pos(const struct ecplan_group *g, unsigned cw, unsigned slot)
{
	return slot < g->k ? (cw + g->m + slot) % g->n : (cw + slot - g->k) % g->n;
}

void ecplan_piece(const struct ecplan_group *g, unsigned pos, unsigned t, unsigned *cw,
		  unsigned *slot)
{
	*cw = (pos + 2 * g->n - g->m - t) % g->n;
	*slot = t;
}

unsigned ecplan_parity_cw(const struct ecplan_group *g, unsigned pos, unsigned j)
{
	return (pos + g->n - j) % g->n;
}

int ecplan_geom(const struct ecplan *p, unsigned gi, unsigned cw, const uint64_t *size,
		const uint8_t (*hash)[32], struct ec_geom *out)
{
	const struct ecplan_group *g;

	if (!p || gi >= p->ngroups || !size || !out || cw >= p->g[gi].n)
		return -EINVAL;
	g = &p->g[gi];
	memset(out, 0, sizeof *out);
	out->k = g->k;
	out->m = g->m;
	out->seg = EC_SEG_DEFAULT;
	for (unsigned j = 0; j < g->k; j++) {
		int r = g->unit[ecplan_slot_pos(g, cw, j)];
		ec_split(size[r], g->k, j, &out->d[j].off, &out->d[j].len);
		if (hash)
			memcpy(out->d[j].shard, hash[r], 32);
	}
	return 0;
}

uint64_t ecplan_ram_bytes(const struct ecplan *p, int rank, const uint64_t *size)
{
	const struct ecplan_group *g;
	uint64_t total;

	if (!p || !size || rank < 0 || rank >= p->nodes)
		return 0;
	total = size[rank];
	if (p->group[rank] < 0 || p->rep[rank] != rank)
		return total;
	g = &p->g[p->group[rank]];
	for (unsigned j = 0; j < g->m; j++) {
		struct ec_geom geom;
		unsigned cw = ecplan_parity_cw(g, (unsigned)p->pos[rank], j);
		if (!ecplan_geom(p, (unsigned)p->group[rank], cw, size, NULL, &geom))
			total += ec_frag_size(&geom, g->k + j);
	}
	return total;
}

int ecplan_restorable(const struct ecplan *p, const bool *has_data, const bool *has_parity,
		      int rank, char *why, size_t whylen)
{
	const struct ecplan_group *g;
	bool *ualive = NULL;
	int rc = 1;

	if (why && whylen)
		why[0] = '\0';
	if (!p || !has_data || !has_parity || rank < 0 || rank >= p->nodes)
		return -EINVAL;
	ualive = calloc((size_t)p->nodes, sizeof *ualive);
	if (!ualive)
		return -ENOMEM;
	for (int r = 0; r < p->nodes; r++)
		if (has_data[r])
			ualive[p->rep[r]] = true;
	if (ualive[p->rep[rank]])
		goto out;   /* a whole copy: no decode */
	if (p->group[rank] < 0) {
		if (why && whylen)
			snprintf(why, whylen, "rank %d: no copy and not erasure-coded", rank);
		rc = 0;
		goto out;
	}
	g = &p->g[p->group[rank]];
	for (unsigned t = 0; t < g->k; t++) {
		unsigned cw, slot, have = 0;
		ecplan_piece(g, (unsigned)p->pos[rank], t, &cw, &slot);
		for (unsigned s = 0; s < g->k + g->m; s++) {
			int holder = g->unit[ecplan_slot_pos(g, cw, s)];
			have += s < g->k ? ualive[holder] : has_parity[holder];
		}
		if (have < g->k) {
			if (why && whylen)
				snprintf(why, whylen,
					 "rank %d: piece %u (codeword %u of group %d) has %u of the %u "
					 "members it needs",
					 rank, t, cw, p->group[rank], have, g->k);
			rc = 0;
			goto out;
		}
	}
out:
	free(ualive);
	return rc;
}

/* A live node holding the unit's shard: the representative, else the
 * lowest rank of the unit that has it; -1 if none. */
static int data_holder(const struct ecplan *p, const bool *has_data, int unit)
{
	if (has_data[unit])
		return unit;
	for (int r = unit + 1; r < p->nodes; r++)
		if (p->rep[r] == unit && has_data[r])
			return r;
	return -1;
}

int ecplan_piece_sources(const struct ecplan *p, const bool *has_data, const bool *has_parity,
			 int rank, unsigned t, unsigned *cw, struct ecplan_src *out)
{
	const struct ecplan_group *g;
	unsigned slot, n = 0;

	if (!p || !has_data || !has_parity || !cw || !out || rank < 0 || rank >= p->nodes ||
	    p->group[rank] < 0)
		return -EINVAL;
	g = &p->g[p->group[rank]];
	if (t >= g->k)
		return -EINVAL;
	ecplan_piece(g, (unsigned)p->pos[rank], t, cw, &slot);
	for (unsigned s = 0; s < g->k + g->m; s++) {
		int unit = g->unit[ecplan_slot_pos(g, *cw, s)];
		int from = s < g->k ? data_holder(p, has_data, unit) : (has_parity[unit] ? unit : -1);
		if (s == slot || from < 0)
			continue;
		out[n++] = (struct ecplan_src){ .slot = s, .rank = from };
	}
	return (int)n;
}
