/* placement: which peer nodes hold the replicas of a node's shards when the
 * job gives peers-per-node instead of explicit peer-ranks (DESIGN §4), and
 * the inverse.  Pure arithmetic with no state or allocation visible to the
 * caller: any thread may call it.  The caller owns out[].
 */
#ifndef MTCFS_TIERS_PLACEMENT_H
#define MTCFS_TIERS_PLACEMENT_H

/* The rule, for node r of n nodes, k peers per node, D = assume_dp:
 *
 *   K = min(k, n - 1) peers are chosen (n == 1 or k == 0: none).  GKE's
 *   candidates (checkpoint-replicator coordinator.py) are taken in GKE's
 *   order; one equal to r or to an earlier pick is skipped; then, until
 *   there are K picks, (r + j) mod n for j = 1, 2, ...
 *
 *   With D >= 2 and P = floor(n / D) >= 1 (nodes r, r +/- P, ... hold
 *   identical shards when D divides n, so such a peer needs only metadata):
 *     (r + a*P) mod n for a = -1, +1, -2, +2, ... (k terms);
 *   otherwise (no D, D == 1, D > n):
 *     (r XOR 1) mod n (the last rank of an odd count wraps to 0), then
 *     (r + i*floor(n / k)) mod n for i = 1 .. k - 1.
 *
 * Wherever GKE's own answer is k distinct ranks other than r, the set is
 * GKE's (checked for every case with n <= 16 in test_placement.c; the order
 * may differ, GKE's is Python's set order).  Where GKE's answer is
 * degenerate -- r itself (always with D == 1), repeats, so fewer than k --
 * mtcfs still gives K distinct peers, a superset of GKE's other ranks,
 * filled with the nearest following ranks; D == 1 is treated as no D
 * (GKE's D == 1 replicates to the node itself only).
 *
 * Examples: n 8, k 2, no D: 0 -> {1, 4}, 5 -> {4, 1}.  n 5, k 1: 4 -> {0}.
 * n 8, D 2 (P 4), k 2: 1 -> {5, 2} (a = -1 and +1 both give 5, then r + 1).
 * n 8, D 4 (P 2), k 2: 1 -> {7, 3}.
 */

/* Writes the first min(K, max) peers of `rank` (rule above) into out[] and
 * returns that count (>= 0).  -EINVAL: nodes < 1, rank outside 0..nodes-1,
 * k < 0, assume_dp < 0, max < 0, or out NULL with max > 0.  A D that does
 * not divide nodes is placed as GKE places it (P = floor(n / D)). */
int place_peers(int rank, int nodes, int k /* peers-per-node */, int assume_dp /* 0 = none */,
                int *out, int max);

/* Inverse: fills out[] in ascending order with the ranks whose replicas
 * `rank` should hold (ranks q with rank in place_peers(q, ...)), and returns
 * their count.  -EINVAL as place_peers; -ENOSPC if there are more than max
 * (max = nodes - 1 always suffices); -ENOMEM.  Costs O(nodes * K^2). */
int place_holders_of(int rank, int nodes, int k, int assume_dp, int *out, int max);

#endif /* MTCFS_TIERS_PLACEMENT_H */
