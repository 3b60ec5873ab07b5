/* Peer placement; the rule is documented in placement.h. */
#include "cluster/placement.h"

#include <errno.h>
#include <stdlib.h>

static int check_args(int rank, int nodes, int k, int assume_dp, const int *out, int max)
{
	if (nodes < 1 || rank < 0 || rank >= nodes || k < 0 || assume_dp < 0 || max < 0 ||
	    (max > 0 && !out))
		return -EINVAL;
	return 0;
}

static int mod(long long x, int n)
{
	long long m = x % n;

	return (int)(m < 0 ? m + n : m);
}

struct picks {
	int *out;
	int n, want, self;
};

/* Adds c unless it is self or already picked; returns 1 once `want` are in. */
static int pick(struct picks *p, int c)
{
	if (c == p->self)
		return p->n >= p->want;
	for (int i = 0; i < p->n; i++)
		if (p->out[i] == c)
			return p->n >= p->want;
	p->out[p->n++] = c;
	return p->n >= p->want;
}

/* Writes the first `want` (<= min(k, nodes - 1)) peers of r; arguments valid.
 * The candidates are GKE's, term for term (k itself, not clamped, sets the
 * ring distance as GKE's nodes // peers-per-node does), so wherever GKE's
 * list is k distinct ranks other than r the two sets are equal. */
static int peers(int r, int nodes, int k, int dp, int *out, int want)
{
	struct picks p = { .out = out, .want = want, .self = r };
	int part = dp >= 2 ? nodes / dp : 0;

	if (want <= 0)
		return 0;
	if (part >= 1) {
		for (int i = 0; i < k; i++) {
			long long a = i / 2 + 1;
			if (i % 2 == 0)
				a = -a;
			if (pick(&p, mod(r + a * part, nodes)))
				return p.n;
		}
	} else {
		int dist = nodes / k;
		/* XOR partner; the last rank of an odd count wraps to 0 as in GKE. */
		if (pick(&p, (r ^ 1) % nodes))
			return p.n;
		for (int i = 1; i < k; i++)
			if (pick(&p, mod(r + (long long)i * dist, nodes)))
				return p.n;
	}
	for (int j = 1; j < nodes; j++)
		if (pick(&p, mod((long long)r + j, nodes)))
			break;
	return p.n;
}

int place_peers(int rank, int nodes, int k, int assume_dp, int *out, int max)
{
	int kk, rc = check_args(rank, nodes, k, assume_dp, out, max);

	if (rc)
		return rc;
	kk = k < nodes - 1 ? k : nodes - 1;
	return peers(rank, nodes, k, assume_dp, out, kk < max ? kk : max);
}

int place_holders_of(int rank, int nodes, int k, int assume_dp, int *out, int max)
{
	int kk, n = 0, rc = check_args(rank, nodes, k, assume_dp, out, max);
	int *tmp;

	if (rc)
		return rc;
	kk = k < nodes - 1 ? k : nodes - 1;
	if (kk == 0)
		return 0;
	tmp = malloc((size_t)kk * sizeof *tmp);
	if (!tmp)
		return -ENOMEM;
	for (int q = 0; q < nodes; q++) {
		int cnt;
		if (q == rank)
			continue;
		cnt = peers(q, nodes, k, assume_dp, tmp, kk);
		for (int i = 0; i < cnt; i++) {
			if (tmp[i] != rank)
				continue;
			if (n >= max) {
				rc = -ENOSPC;
				goto out;
			}
			out[n++] = q;
			break;
		}
	}
	rc = n;
out:
	free(tmp);
	return rc;
}
