/* placement: which peer nodes hold the replicas of a node's shards when the
 * job gives peers-per-node instead of explicit peer-ranks (DESIGN §4), and
 * the inverse.  Pure arithmetic with no state or allocation visible to the
 * caller: any thread may call it.  The caller owns out[].
 */
#ifndef MTCFS_TIERS_PLACEMENT_H
#define MTCFS_TIERS_PLACEMENT_H

/* The rule, for node r of n nodes, k peers per node, D = assume_dp:
 *
 *   K = min(k, n - 1) peers are chosen (n == 1 or k == 0: none).  Candidates
 *   are taken in the order below; one equal to r or to an earlier pick is
 *   skipped; the first K picks are the peers, in that order.
 *
 *   With D >= 2 (P = n / D nodes per data-parallel replica; nodes r, r +/- P,
 *   r +/- 2P, ... hold identical shards, so such a peer needs only metadata):
 *     1. (r + a*P) mod n for a = -1, +1, -2, +2, ..., +/-floor(D/2)
 *        (these are the D - 1 other members of r's column);
 *   with no D (0), or D == 1 (P = n: r's column has no other member):
 *     1. r XOR 1 if that is < n, else r - 1 (r = n - 1 with n odd, n >= 3:
 *        the last rank has no XOR partner; with k = 1 rank n - 2 then holds
 *        the replicas of two nodes, n - 3 and n - 1);
 *     2. (r + i*floor(n / K)) mod n for i = 1 .. K - 1;
 *   then in both cases, until there are K picks:
 *     3. (r + j) mod n for j = 1, 2, ...
 *
 * Examples: n 8, k 2, no D: 0 -> {1, 4}, 5 -> {4, 1}.  n 5, k 1: 4 -> {3}.
 * n 8, D 2 (P 4), k 2: 1 -> {5, 2} (a = -1 and +1 both give 5, then r + 1).
 * n 8, D 4 (P 2), k 2: 1 -> {7, 3}.
 */

/* Writes the first min(K, max) peers of `rank` (rule above) into out[] and
 * returns that count (>= 0).  -EINVAL: nodes < 1, rank outside 0..nodes-1,
 * k < 0, assume_dp < 0 or not dividing nodes, max < 0, or out NULL with
 * max > 0. */
int place_peers(int rank, int nodes, int k /* peers-per-node */, int assume_dp /* 0 = none */,
                int *out, int max);

/* Inverse: fills out[] in ascending order with the ranks whose replicas
 * `rank` should hold (ranks q with rank in place_peers(q, ...)), and returns
 * their count.  -EINVAL as place_peers; -ENOSPC if there are more than max
 * (max = nodes - 1 always suffices); -ENOMEM.  Costs O(nodes * K^2). */
int place_holders_of(int rank, int nodes, int k, int assume_dp, int *out, int max);

#endif /* MTCFS_TIERS_PLACEMENT_H */
