/* Unit tests for cluster/placement: hand-computed peer sets for the rule in
 * placement.h, its invariants over many cluster shapes, and the inverse. */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/placement.h"

#define MAXN  64
#define BIG_K 64

/* place_peers(rank, nodes, k, dp) must be exactly want[0..n). */
static void check_peers(int rank, int nodes, int k, int dp, const int *want, int n)
{
	int out[MAXN];
	int got;

	memset(out, 0xff, sizeof out);
	got = place_peers(rank, nodes, k, dp, out, MAXN);
	if (got != n)
		goto bad;
	for (int i = 0; i < n; i++)
		if (out[i] != want[i])
			goto bad;
	return;
bad:
	print_error("place_peers(rank %d, nodes %d, k %d, dp %d) = %d:", rank, nodes, k, dp, got);
	for (int i = 0; i < got && i < MAXN; i++)
		print_error(" %d", out[i]);
	print_error(", want %d:", n);
	for (int i = 0; i < n; i++)
		print_error(" %d", want[i]);
	print_error("\n");
	fail();
}

#define PEERS(rank, nodes, k, dp, ...)                                        \
	check_peers((rank), (nodes), (k), (dp), (const int[]){ __VA_ARGS__ }, \
	            (int)(sizeof((const int[]){ __VA_ARGS__ }) / sizeof(int)))
#define NO_PEERS(rank, nodes, k, dp) check_peers((rank), (nodes), (k), (dp), NULL, 0)

static void test_even_no_dp(void **state)
{
	(void)state;
	/* k 1: XOR pairs. */
	PEERS(0, 8, 1, 0, 1);
	PEERS(1, 8, 1, 0, 0);
	PEERS(6, 8, 1, 0, 7);
	PEERS(7, 8, 1, 0, 6);
	/* k 2: XOR partner, then r + floor(8/2) = r + 4. */
	PEERS(0, 8, 2, 0, 1, 4);
	PEERS(3, 8, 2, 0, 2, 7);
	PEERS(5, 8, 2, 0, 4, 1);
	/* k 3: stride floor(8/3) = 2. */
	PEERS(0, 8, 3, 0, 1, 2, 4);
	PEERS(1, 8, 3, 0, 0, 3, 5);
	PEERS(7, 8, 3, 0, 6, 1, 3);
	/* k 4 of 6: stride 1 gives 1 (dup of XOR), 2, 3; fill r + 4. */
	PEERS(0, 6, 4, 0, 1, 2, 3, 4);
	PEERS(3, 6, 4, 0, 2, 4, 5, 0);
	/* k 2 of 4: stride 2. */
	PEERS(0, 4, 2, 0, 1, 2);
	PEERS(2, 4, 2, 0, 3, 0);
}

static void test_odd_no_dp(void **state)
{
	(void)state;
	/* The last rank of an odd count has no XOR partner: (r XOR 1) mod n wraps
	 * to 0, as GKE's (node_rank ^ 1) % node_count does (mtcfs used r - 1). */
	PEERS(4, 5, 1, 0, 0);
	PEERS(3, 5, 1, 0, 2);
	PEERS(0, 5, 1, 0, 1);
	PEERS(2, 3, 1, 0, 0);
	/* k 2 of 5: stride 2; GKE 4 -> {0, 1}. */
	PEERS(4, 5, 2, 0, 0, 1);
	PEERS(1, 5, 2, 0, 0, 3);
	/* k 2 of 3: stride 1; rank 0: XOR 1, then 0 + 1 = 1 again (GKE stops at
	 * one peer), fill 0 + 2.  Rank 2: 0, then 2 + 1 = 0 again, fill 2 + 2 = 1. */
	PEERS(0, 3, 2, 0, 1, 2);
	PEERS(2, 3, 2, 0, 0, 1);
	/* k 3 of 7: stride 2; rank 6: 7 % 7 = 0, 8 % 7 = 1, 10 % 7 = 3 (GKE's). */
	PEERS(6, 7, 3, 0, 0, 1, 3);
	/* k 4 of 9, rank 8: GKE {0, 1, 3, 5}. */
	PEERS(8, 9, 4, 0, 0, 1, 3, 5);
}

static void test_k_at_least_nodes(void **state)
{
	(void)state;
	/* Clamped to nodes - 1 distinct peers: everybody else. */
	PEERS(0, 4, 10, 0, 1, 2, 3);
	PEERS(2, 4, 4, 0, 3, 0, 1);
	PEERS(2, 4, 3, 0, 3, 0, 1);
	PEERS(4, 5, 9, 0, 0, 1, 2, 3);
	PEERS(1, 8, 100, 2, 5, 2, 3, 4, 6, 7, 0);
}

static void test_one_and_two_nodes(void **state)
{
	(void)state;
	NO_PEERS(0, 1, 0, 0);
	NO_PEERS(0, 1, 1, 0);
	NO_PEERS(0, 1, 5, 0);
	NO_PEERS(0, 1, 1, 1);
	PEERS(0, 2, 1, 0, 1);
	PEERS(1, 2, 1, 0, 0);
	PEERS(0, 2, 3, 0, 1);
	PEERS(1, 2, 1, 2, 0);
	PEERS(1, 2, 1, 1, 0);
	NO_PEERS(1, 2, 0, 0);
	NO_PEERS(3, 8, 0, 2);
}

static void test_with_dp(void **state)
{
	(void)state;
	/* nodes 8, D 2, P 4: rank 1's column is {1, 5}: a = -1 -> (1 - 4) mod 8 = 5,
     * a = +1 -> 5 again; further peers come from r + j. */
	PEERS(1, 8, 1, 2, 5);
	PEERS(1, 8, 2, 2, 5, 2);
	PEERS(1, 8, 3, 2, 5, 2, 3);
	PEERS(5, 8, 2, 2, 1, 6);
	PEERS(7, 8, 2, 2, 3, 0);
	/* nodes 8, D 4, P 2: column of 1 is {1, 3, 5, 7}; a = -1, +1, -2 (+2 dup). */
	PEERS(1, 8, 1, 4, 7);
	PEERS(1, 8, 2, 4, 7, 3);
	PEERS(1, 8, 3, 4, 7, 3, 5);
	PEERS(1, 8, 4, 4, 7, 3, 5, 2);
	PEERS(0, 8, 3, 4, 6, 2, 4);
	/* nodes 8, D 8, P 1: neighbours outwards. */
	PEERS(0, 8, 4, 8, 7, 1, 6, 2);
	/* nodes 12, D 3, P 4: column of 5 is {1, 5, 9}. */
	PEERS(5, 12, 2, 3, 1, 9);
	PEERS(5, 12, 3, 3, 1, 9, 6);
	/* nodes 6, D 6, P 1, k 5: everybody, nearest first. */
	PEERS(0, 6, 5, 6, 5, 1, 4, 2, 3);
}

static void test_dp_one_is_no_dp(void **state)
{
	(void)state;
	for (int nodes = 1; nodes <= 17; nodes++) {
		for (int k = 0; k <= 5; k++) {
			for (int r = 0; r < nodes; r++) {
				int a[MAXN], b[MAXN];
				int na = place_peers(r, nodes, k, 0, a, MAXN);
				int nb = place_peers(r, nodes, k, 1, b, MAXN);
				assert_int_equal(na, nb);
				assert_memory_equal(a, b, (size_t)na * sizeof *a);
			}
		}
	}
}

static void test_truncation(void **state)
{
	int out[4] = { -1, -1, -1, -1 };

	(void)state;
	/* max smaller than k: the first max of the full list, nothing beyond. */
	assert_int_equal(place_peers(0, 8, 3, 0, out, 2), 2);
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 2);
	assert_int_equal(out[2], -1);
	assert_int_equal(place_peers(0, 8, 3, 0, NULL, 0), 0);
	assert_int_equal(place_peers(0, 8, 3, 0, out, 0), 0);
}

static void test_invalid(void **state)
{
	int out[8];

	(void)state;
	assert_int_equal(place_peers(0, 0, 1, 0, out, 8), -EINVAL);
	assert_int_equal(place_peers(0, -3, 1, 0, out, 8), -EINVAL);
	assert_int_equal(place_peers(-1, 8, 1, 0, out, 8), -EINVAL);
	assert_int_equal(place_peers(8, 8, 1, 0, out, 8), -EINVAL);
	assert_int_equal(place_peers(0, 8, -1, 0, out, 8), -EINVAL);
	assert_int_equal(place_peers(0, 8, 1, -2, out, 8), -EINVAL);
	assert_int_equal(place_peers(0, 8, 1, 0, out, -1), -EINVAL);
	assert_int_equal(place_peers(0, 8, 1, 0, NULL, 1), -EINVAL);
	assert_int_equal(place_holders_of(8, 8, 1, 0, out, 8), -EINVAL);
	assert_int_equal(place_holders_of(0, 8, 1, 0, NULL, 8), -EINVAL);
}

/* Every peer set is distinct, excludes self, is in range and has
 * min(k, nodes - 1) members; holders are exactly the inverse relation. */
static void check_shape(int nodes, int k, int dp)
{
	static int peers[MAXN][MAXN];
	int kk = k < nodes - 1 ? k : nodes - 1;
	int total = 0;

	for (int r = 0; r < nodes; r++) {
		int n = place_peers(r, nodes, k, dp, peers[r], MAXN);
		assert_int_equal(n, kk);
		for (int i = 0; i < n; i++) {
			assert_true(peers[r][i] >= 0 && peers[r][i] < nodes);
			assert_int_not_equal(peers[r][i], r);
			for (int j = 0; j < i; j++)
				assert_int_not_equal(peers[r][i], peers[r][j]);
		}
	}
	for (int r = 0; r < nodes; r++) {
		int holders[MAXN], want[MAXN], nw = 0;
		int nh = place_holders_of(r, nodes, k, dp, holders, MAXN);

		for (int q = 0; q < nodes; q++)
			for (int i = 0; i < kk; i++)
				if (peers[q][i] == r)
					want[nw++] = q;
		if (nh != nw || memcmp(holders, want, (size_t)nw * sizeof *want) != 0) {
			print_error("holders of %d (nodes %d, k %d, dp %d): got %d, want %d\n", r,
			            nodes, k, dp, nh, nw);
			fail();
		}
		total += nh;
		/* With exactly as much room as needed it fits; one less does not. */
		assert_int_equal(place_holders_of(r, nodes, k, dp, holders, nw), nw);
		if (nw > 0)
			assert_int_equal(place_holders_of(r, nodes, k, dp, holders, nw - 1),
			                 -ENOSPC);
	}
	assert_int_equal(total, nodes * kk);
}

static void test_invariants_and_inverse(void **state)
{
	(void)state;
	for (int nodes = 1; nodes <= 17; nodes++) {
		for (int k = 0; k <= 5; k++) {
			check_shape(nodes, k, 0);
			for (int dp = 1; dp <= nodes; dp++)
				if (nodes % dp == 0)
					check_shape(nodes, k, dp);
		}
	}
	check_shape(64, 63, 0);
	check_shape(64, 7, 8);
	check_shape(63, 64, 0);
}

static void test_dp_prefers_column(void **state)
{
	(void)state;
	/* With D, the first min(k, D - 1) peers lie in r's column (same r mod P). */
	for (int nodes = 2; nodes <= 24; nodes++) {
		for (int dp = 2; dp <= nodes; dp++) {
			int cols;
			if (nodes % dp)
				continue;
			cols = nodes / dp;
			for (int k = 1; k <= 4; k++) {
				for (int r = 0; r < nodes; r++) {
					int out[MAXN];
					int n = place_peers(r, nodes, k, dp, out, MAXN);
					int in_col = k < dp - 1 ? k : dp - 1;
					assert_true(n >= in_col);
					for (int i = 0; i < in_col; i++)
						assert_int_equal(out[i] % cols, r % cols);
				}
			}
		}
	}
}

static void test_holders_by_hand(void **state)
{
	int out[8];

	(void)state;
	/* nodes 5, k 1: 0->1 1->0 2->3 3->2 4->0, so 0 holds 1 and 4, nobody holds 4's. */
	assert_int_equal(place_holders_of(0, 5, 1, 0, out, 8), 2);
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 4);
	assert_int_equal(place_holders_of(4, 5, 1, 0, out, 8), 0);
	assert_int_equal(place_holders_of(0, 5, 1, 0, out, 1), -ENOSPC);
	assert_int_equal(place_holders_of(0, 1, 3, 0, out, 8), 0);
	assert_int_equal(place_holders_of(0, 1, 3, 0, NULL, 0), 0);
	/* nodes 8, D 2, k 1: 5 holds 1's replicas and 1 holds 5's. */
	assert_int_equal(place_holders_of(5, 8, 1, 2, out, 8), 1);
	assert_int_equal(out[0], 1);
}

static void test_large_cluster(void **state)
{
	int out[BIG_K];

	(void)state;
	/* No overflow in r + i * stride at the configuration limits. */
	assert_int_equal(place_peers(65535, 65536, 64, 0, out, BIG_K), 64);
	assert_int_equal(out[0], 65534);
	assert_int_equal(out[1], (65535 + 1024) % 65536);
	assert_int_equal(out[63], (65535 + 63 * 1024) % 65536);
	assert_int_equal(place_peers(7, 65536, 64, 65536, out, BIG_K), 64);
	assert_int_equal(out[0], 6);
	assert_int_equal(out[1], 8);
	/* 1 by XOR; 16384 * (4 - i) + i * 16384 = 65536 for i = 3, 2, 1. */
	assert_int_equal(place_holders_of(0, 65536, 4, 0, out, BIG_K), 4);
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 16384);
	assert_int_equal(out[2], 32768);
	assert_int_equal(out[3], 49152);
}

/* GKE's peers-per-node choice (coordinator.py _get_node_peer_ranks),
 * restated term for term: a set, so repeats collapse and r itself may be in
 * it.  Returns its size; *self tells whether r is a member. */
static int gke_peer_set(int r, int n, int k, int dp, int *set, bool *self)
{
	int cnt = 0;

	*self = false;
	for (int i = 0; i < k; i++) {
		long long c;
		if (dp) {
			long long a = i / 2 + 1;
			c = (r + (i % 2 == 0 ? -a : a) * (long long)(n / dp)) % n;
			if (c < 0)
				c += n;
		} else if (i == 0) {
			c = (r ^ 1) % n;
		} else {
			c = (r + (long long)(n / k) * i) % n;
		}
		bool dup = false;
		for (int j = 0; j < cnt; j++)
			dup |= set[j] == c;
		if (!dup)
			set[cnt++] = (int)c;
		*self |= c == r;
	}
	return cnt;
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

static uint64_t fnv(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return h;
}

/* Facts recorded by running GKE's own function (checkpoint-replicator
 * coordinator.py, Python 3.11) for nodes 1..16, D 0 (none) and 1..nodes
 * (divisors or not: GKE runs both), k 1..nodes+1, every rank: 21,624
 * cases.  13,960 of them are "valid" (k distinct ranks, none the node
 * itself); FNV-1a 64 over the lines "n D k r: p1 p2 ...\n" (peers sorted)
 * of the valid cases, in that loop order, is GKE_VALID_FNV.  The other
 * 7,664 are degenerate: fewer than k ranks (repeats), or the node itself
 * (always with D 1, or when a*P is a multiple of nodes). */
#define GKE_CASES      21624
#define GKE_VALID      13960
#define GKE_VALID_FNV  0x79f7922373c8490aULL

/* Where GKE's answer is valid, mtcfs's set equals it (order is not
 * compared: GKE returns list(set), Python's iteration order).  Where it is
 * degenerate, mtcfs gives min(k, n - 1) distinct peers, none itself, that
 * contain every rank of GKE's set other than r, and any further ones are the
 * nearest r + 1, r + 2, ... not yet taken. */
static void test_gke_table(void **state)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	int cases = 0, valid = 0;

	(void)state;
	for (int n = 1; n <= 16; n++) {
		for (int dp = 0; dp <= n; dp++) {
			for (int k = 1; k <= n + 1; k++) {
				for (int r = 0; r < n; r++) {
					int g[MAXN], m[MAXN], ng, nm, kk = k < n - 1 ? k : n - 1;
					bool self;
					char line[256];
					size_t off;

					cases++;
					ng = gke_peer_set(r, n, k, dp, g, &self);
					nm = place_peers(r, n, k, dp, m, MAXN);
					assert_int_equal(nm, kk);
					qsort(g, (size_t)ng, sizeof *g, cmp_int);
					qsort(m, (size_t)nm, sizeof *m, cmp_int);
					if (!self && ng == k) {
						valid++;
						if (nm != ng || memcmp(g, m, (size_t)ng * sizeof *g)) {
							print_error("n %d D %d k %d r %d differs from GKE\n", n, dp, k, r);
							fail();
						}
						off = (size_t)snprintf(line, sizeof line, "%d %d %d %d:", n, dp, k, r);
						for (int i = 0; i < nm; i++)
							off += (size_t)snprintf(line + off, sizeof line - off, " %d", m[i]);
						snprintf(line + off, sizeof line - off, "\n");
						h = fnv(h, line);
						continue;
					}
					for (int i = 0; i < nm; i++) {
						assert_int_not_equal(m[i], r);
						if (i)
							assert_int_not_equal(m[i], m[i - 1]);
					}
					for (int i = 0; i < ng; i++)
						if (g[i] != r)
							assert_non_null(bsearch(&g[i], m, (size_t)nm, sizeof *m, cmp_int));
				}
			}
		}
	}
	assert_int_equal(cases, GKE_CASES);
	assert_int_equal(valid, GKE_VALID);
	assert_int_equal(h, GKE_VALID_FNV);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_even_no_dp),
		cmocka_unit_test(test_odd_no_dp),
		cmocka_unit_test(test_k_at_least_nodes),
		cmocka_unit_test(test_one_and_two_nodes),
		cmocka_unit_test(test_with_dp),
		cmocka_unit_test(test_dp_one_is_no_dp),
		cmocka_unit_test(test_truncation),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_invariants_and_inverse),
		cmocka_unit_test(test_dp_prefers_column),
		cmocka_unit_test(test_holders_by_hand),
		cmocka_unit_test(test_large_cluster),
		cmocka_unit_test(test_gke_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
