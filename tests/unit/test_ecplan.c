/* Unit tests for tiers/ecplan: the rotation's invariants for every group
 * shape, group sizes, failure-domain dealing, data-parallel units, the
 * restorability rule over every loss pattern, and the RAM figure against
 * replication. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tiers/ecplan.h"

static struct ecplan *build(int nodes, unsigned k, unsigned m, const int *domain, const int *same)
{
	struct ecplan_in in = { .nodes = nodes, .k = k, .m = m, .domain = domain, .same = same };
	struct ecplan *p = NULL;

	assert_int_equal(ecplan_build(&in, &p), 0);
	assert_non_null(p);
	return p;
}

/* Every unit is in every codeword exactly once; data slot t of the codeword
 * ecplan_piece() names is that unit; parity codewords are the other m. */
static void test_rotation(void **state)
{
	(void)state;
	for (unsigned k = 1; k < EC_MAX_N; k++)
		for (unsigned m = 1; k + m <= EC_MAX_N; m++) {
			struct ecplan_group g = { .k = k, .m = m, .n = k + m };
			for (unsigned cw = 0; cw < g.n; cw++) {
				uint64_t seen = 0;
				for (unsigned s = 0; s < g.n; s++) {
					unsigned pos = ecplan_slot_pos(&g, cw, s);
					assert_true(pos < g.n);
					assert_false(seen >> pos & 1);
					seen |= 1ull << pos;
				}
			}
			for (unsigned pos = 0; pos < g.n; pos++) {
				uint64_t cws = 0;
				for (unsigned t = 0; t < k; t++) {
					unsigned cw, slot;
					ecplan_piece(&g, pos, t, &cw, &slot);
					assert_int_equal(slot, t);
					assert_int_equal(ecplan_slot_pos(&g, cw, slot), pos);
					cws |= 1ull << cw;
				}
				for (unsigned j = 0; j < m; j++) {
					unsigned cw = ecplan_parity_cw(&g, pos, j);
					assert_int_equal(ecplan_slot_pos(&g, cw, k + j), pos);
					assert_false(cws >> cw & 1);
					cws |= 1ull << cw;
				}
				assert_int_equal(__builtin_popcountll(cws), g.n);
			}
		}
}

static void test_group_sizes(void **state)
{
	struct ecplan *p;

	(void)state;
	/* 6 nodes, rs:4+2: one group of all */
	p = build(6, 4, 2, NULL, NULL);
	assert_int_equal(p->ngroups, 1);
	assert_int_equal(p->g[0].k, 4);
	assert_int_equal(p->g[0].n, 6);
	for (int r = 0; r < 6; r++) {
		assert_int_equal(p->g[0].unit[r], r);
		assert_int_equal(p->group[r], 0);
		assert_int_equal(p->pos[r], r);
		assert_int_equal(p->rep[r], r);
	}
	assert_true(p->domains_ok);
	assert_string_equal(p->why, "");
	ecplan_free(p);
	/* 8 nodes, rs:4+1: one group of 8 coded 7+1, said so */
	p = build(8, 4, 1, NULL, NULL);
	assert_int_equal(p->ngroups, 1);
	assert_int_equal(p->g[0].k, 7);
	assert_string_equal(p->why, "group 0 is rs:7+1 (8 units)");
	ecplan_free(p);
	/* 10 nodes, rs:4+1: two groups of 5, every node in one */
	p = build(10, 4, 1, NULL, NULL);
	assert_int_equal(p->ngroups, 2);
	assert_int_equal(p->g[0].n + p->g[1].n, 10);
	assert_int_equal(p->g[0].k, 4);
	assert_int_equal(p->g[1].k, 4);
	for (int r = 0; r < 10; r++)
		assert_int_equal(p->g[p->group[r]].unit[p->pos[r]], r);
	ecplan_free(p);
	/* 13 nodes, rs:4+1: 7 + 6 */
	p = build(13, 4, 1, NULL, NULL);
	assert_int_equal(p->ngroups, 2);
	assert_int_equal(p->g[0].n, 7);
	assert_int_equal(p->g[1].n, 6);
	ecplan_free(p);
	/* 4 nodes, rs:4+2: shortened to 2+2 */
	p = build(4, 4, 2, NULL, NULL);
	assert_int_equal(p->ngroups, 1);
	assert_int_equal(p->g[0].k, 2);
	assert_string_equal(p->why, "group 0 is rs:2+2 (4 units)");
	ecplan_free(p);
	/* 2 nodes, rs:4+2: nothing to encode */
	p = build(2, 4, 2, NULL, NULL);
	assert_int_equal(p->ngroups, 0);
	assert_int_equal(p->group[0], -1);
	assert_int_equal(p->group[1], -1);
	assert_string_equal(p->why,
			    "2 distinct shard(s): rs:4+2 needs at least 3; nothing is encoded");
	ecplan_free(p);
	/* 63 nodes, rs:30+2: no group above EC_MAX_N */
	p = build(63, 30, 2, NULL, NULL);
	assert_int_equal(p->ngroups, 2);
	assert_true(p->g[0].n <= EC_MAX_N && p->g[1].n <= EC_MAX_N);
	ecplan_free(p);
	/* 1000 nodes, rs:4+2: 166 groups, sizes 6 or 7 */
	p = build(1000, 4, 2, NULL, NULL);
	assert_int_equal(p->ngroups, 166);
	for (unsigned g = 0; g < p->ngroups; g++)
		assert_true(p->g[g].n == 6 || p->g[g].n == 7);
	ecplan_free(p);
}

static void test_bad_input(void **state)
{
	struct ecplan_in in = { .nodes = 6, .k = 4, .m = 2 };
	struct ecplan *p = NULL;
	int same[6] = { 0, 1, 2, 3, 4, 4 };
	int same_bad[6] = { 0, 1, 2, 3, 5, 5 };   /* 4 -> 5 > 4 */
	int same_chain[6] = { 0, 0, 1, 3, 4, 5 }; /* 2 -> 1, not a representative */
	bool has[6] = { 0 };

	(void)state;
	assert_int_equal(ecplan_build(NULL, &p), -EINVAL);
	in.nodes = 0;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.nodes = 6;
	in.k = 0;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.k = 31;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.k = 4;
	in.m = 0;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.m = 2;
	in.same = same_bad;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.same = same_chain;
	assert_int_equal(ecplan_build(&in, &p), -EINVAL);
	in.same = same;
	assert_int_equal(ecplan_build(&in, &p), 0);
	assert_int_equal(ecplan_restorable(p, has, has, 6, NULL, 0), -EINVAL);
	assert_int_equal(ecplan_restorable(p, NULL, has, 0, NULL, 0), -EINVAL);
	assert_int_equal(ecplan_geom(p, 1, 0, (uint64_t[6]){ 0 }, NULL, &(struct ec_geom){ 0 }),
			 -EINVAL);
	ecplan_free(p);
	ecplan_free(NULL);
	assert_int_equal(ecplan_dp_same(0, 2, same), -EINVAL);
	assert_int_equal(ecplan_dp_same(4, -1, same), -EINVAL);
}

/* Domains are dealt over the groups: racks of 2 among 8 nodes with rs:3+1
 * give each group one node per rack; racks of 4 cannot, and say so. */
static void test_domains(void **state)
{
	int racks2[8] = { 0, 0, 1, 1, 2, 2, 3, 3 };
	int racks4[8] = { 7, 7, 7, 7, 9, 9, 9, 9 };
	int zones[8] = { 5, 5, 5, 5, 5, 5, 6, 6 };
	struct ecplan *p;

	(void)state;
	p = build(8, 3, 1, racks2, NULL);
	assert_int_equal(p->ngroups, 2);
	assert_true(p->domains_ok);
	for (unsigned g = 0; g < 2; g++) {
		int seen[4] = { 0 };
		assert_int_equal(p->g[g].n, 4);
		for (unsigned x = 0; x < 4; x++)
			seen[racks2[p->g[g].unit[x]]]++;
		for (int d = 0; d < 4; d++)
			assert_int_equal(seen[d], 1);
	}
	ecplan_free(p);
	/* rs:2+2 with racks of 4: two of each rack per group -- fine for M 2 */
	p = build(8, 2, 2, racks4, NULL);
	assert_int_equal(p->ngroups, 2);
	assert_true(p->domains_ok);
	for (unsigned g = 0; g < 2; g++) {
		int n7 = 0;
		for (unsigned x = 0; x < 4; x++)
			n7 += racks4[p->g[g].unit[x]] == 7;
		assert_int_equal(n7, 2);
	}
	ecplan_free(p);
	p = build(8, 3, 1, racks4, NULL);
	assert_false(p->domains_ok);
	assert_string_equal(p->why, "failure domain 7 holds 2 units of group 0 (more than M 1)");
	ecplan_free(p);
	/* the big zone is spread first: 3 + 3 of zone 5, 1 + 1 of zone 6 */
	p = build(8, 2, 2, zones, NULL);
	assert_true(!p->domains_ok);
	for (unsigned g = 0; g < 2; g++) {
		int n6 = 0;
		for (unsigned x = 0; x < 4; x++)
			n6 += zones[p->g[g].unit[x]] == 6;
		assert_int_equal(n6, 1);
	}
	ecplan_free(p);
}

/* Data parallelism: D copies of a column are one unit, encoded once; its
 * representative stores the parity; a column is lost only with all its
 * nodes. */
static void test_data_parallel(void **state)
{
	int same[8];
	uint64_t size[8];
	bool has_data[8], has_par[8];
	struct ecplan *p;

	(void)state;
	assert_int_equal(ecplan_dp_same(8, 2, same), 0);
	for (int r = 0; r < 8; r++)
		assert_int_equal(same[r], r % 4);
	assert_int_equal(ecplan_dp_same(7, 2, same), 0);   /* D does not divide n */
	for (int r = 0; r < 7; r++)
		assert_int_equal(same[r], r);
	assert_int_equal(ecplan_dp_same(8, 8, same), 0);   /* all identical */
	for (int r = 0; r < 8; r++)
		assert_int_equal(same[r], 0);
	assert_int_equal(ecplan_dp_same(8, 1, same), 0);   /* D 1 is no D */
	for (int r = 0; r < 8; r++)
		assert_int_equal(same[r], r);

	assert_int_equal(ecplan_dp_same(8, 2, same), 0);
	p = build(8, 2, 1, NULL, same);
	assert_int_equal(p->ngroups, 1);
	assert_int_equal(p->g[0].n, 4);   /* 4 columns, one group rs:3+1 */
	assert_int_equal(p->g[0].k, 3);
	for (int r = 0; r < 8; r++) {
		assert_int_equal(p->rep[r], r % 4);
		assert_int_equal(p->group[r], 0);
		assert_int_equal(p->pos[r], r % 4);
		size[r] = 3u << 20;
	}
	/* only representatives hold parity */
	assert_true(ecplan_ram_bytes(p, 1, size) > size[1]);
	assert_int_equal(ecplan_ram_bytes(p, 5, size), size[5]);
	/* nodes 1 and 5 (column 1) lost: decode from the others */
	for (int r = 0; r < 8; r++)
		has_data[r] = has_par[r] = r != 1 && r != 5;
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 1, NULL, 0), 1);
	/* only node 1 lost: node 5 holds the copy, parity not needed */
	for (int r = 0; r < 8; r++) {
		has_data[r] = r != 1;
		has_par[r] = false;
	}
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 1, NULL, 0), 1);
	/* columns 1 and 2 lost entirely: two of four units, M is 1 */
	for (int r = 0; r < 8; r++)
		has_data[r] = has_par[r] = r % 4 != 1 && r % 4 != 2;
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 1, NULL, 0), 0);
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 0, NULL, 0), 1);
	ecplan_free(p);
	/* D = nodes: one unit, nothing to encode, copies everywhere */
	assert_int_equal(ecplan_dp_same(8, 8, same), 0);
	p = build(8, 2, 1, NULL, same);
	assert_int_equal(p->ngroups, 0);
	for (int r = 0; r < 8; r++)
		has_data[r] = has_par[r] = r == 7;
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 3, NULL, 0), 1);
	for (int r = 0; r < 8; r++)
		has_data[r] = false;
	assert_int_equal(ecplan_restorable(p, has_data, has_par, 3, NULL, 0), 0);
	ecplan_free(p);
}

/* Sources for a piece: every surviving member once, the piece's own slot
 * never, data from a live copy of the member's unit (its representative
 * first), parity only from the representative that stores it; the count
 * agrees with ecplan_restorable. */
static void test_piece_sources(void **state)
{
	int same[8];
	bool data[8], par[8];
	struct ecplan_src src[EC_MAX_N];
	struct ecplan *p;
	unsigned cw;
	bool all = true;
	int n;

	(void)state;
	/* D = 2 over 8 nodes: units 0..3, nodes r and r + 4 identical; rs:3+1 */
	assert_int_equal(ecplan_dp_same(8, 2, same), 0);
	p = build(8, 2, 1, NULL, same);
	/* column 1 lost entirely; node 2 (representative of column 2) too,
	 * node 6 still holds column 2's shard */
	for (int r = 0; r < 8; r++)
		data[r] = par[r] = r != 1 && r != 5 && r != 2;
	for (unsigned t = 0; t < p->g[0].k; t++) {
		bool seen[EC_MAX_N] = { false };
		unsigned slot;
		n = ecplan_piece_sources(p, data, par, 5, t, &cw, src);
		ecplan_piece(&p->g[0], 1, t, &cw, &slot);
		/* 4 members, piece's own lost; column 2's parity (on node 2) lost
		 * when it stores one of this codeword */
		assert_true(n == 3 || n == 2);
		for (int i = 0; i < n; i++) {
			int unit = p->g[0].unit[ecplan_slot_pos(&p->g[0], cw, src[i].slot)];
			assert_false(seen[src[i].slot]);
			seen[src[i].slot] = true;
			assert_int_not_equal(src[i].slot, slot);
			if (src[i].slot < p->g[0].k)
				assert_int_equal(src[i].rank, unit == 2 ? 6 : unit);
			else
				assert_int_equal(src[i].rank, unit);
			assert_int_not_equal(src[i].rank, 2);
		}
		all &= n >= (int)p->g[0].k;
	}
	assert_int_equal(all, ecplan_restorable(p, data, par, 5, NULL, 0));
	assert_false(all);   /* the piece whose parity was on node 2 is short */
	assert_int_equal(ecplan_piece_sources(p, data, par, 5, 3, &cw, src), -EINVAL);
	ecplan_free(p);
	/* every loss pattern of rs:4+2: restorable iff every piece has >= k */
	p = build(6, 4, 2, NULL, NULL);
	for (uint32_t lost = 1; lost < 64; lost++) {
		bool has[6];
		for (int r = 0; r < 6; r++)
			has[r] = !(lost >> r & 1);
		for (int r = 0; r < 6; r++) {
			all = true;
			if (has[r])
				continue;
			for (unsigned t = 0; t < 4; t++) {
				n = ecplan_piece_sources(p, has, has, r, t, &cw, src);
				assert_true(n >= 0);
				assert_int_equal(n, 6 - __builtin_popcount(lost));
				all &= n >= 4;
			}
			assert_int_equal(all, ecplan_restorable(p, has, has, r, NULL, 0));
		}
	}
	ecplan_free(p);
	/* no group: nothing encoded */
	assert_int_equal(ecplan_dp_same(8, 8, same), 0);
	p = build(8, 2, 1, NULL, same);
	assert_int_equal(ecplan_piece_sources(p, data, par, 0, 0, &cw, src), -EINVAL);
	ecplan_free(p);
}

/* Over every loss pattern of a group: a lost shard is restorable exactly
 * when at most M of the group's units are lost; shards of survivors always
 * are. A node that lost only its parity (has_data, no has_parity) counts
 * against the codewords it stores parity for. */
static void test_restorable_exhaustive(void **state)
{
	static const unsigned km[][2] = { { 1, 1 }, { 2, 1 }, { 4, 1 }, { 4, 2 }, { 3, 3 }, { 6, 2 } };

	(void)state;
	for (size_t c = 0; c < sizeof km / sizeof km[0]; c++) {
		unsigned k = km[c][0], m = km[c][1], n = k + m;
		struct ecplan *p = build((int)n, k, m, NULL, NULL);
		for (uint32_t lost = 0; lost < (1u << n); lost++) {
			bool has[EC_MAX_N];
			int nl = __builtin_popcount(lost);
			for (unsigned r = 0; r < n; r++)
				has[r] = !(lost >> r & 1);
			for (unsigned r = 0; r < n; r++) {
				char why[200];
				int want = has[r] || nl <= (int)m;
				assert_int_equal(ecplan_restorable(p, has, has, (int)r, why, sizeof why),
						 want);
				if (!want)
					assert_non_null(strstr(why, "members it needs"));
			}
		}
		/* M nodes lost and one more survivor's parity gone: short */
		{
			bool data[EC_MAX_N], par[EC_MAX_N];
			for (unsigned r = 0; r < n; r++)
				data[r] = par[r] = r >= m;
			par[m] = false;
			assert_int_equal(ecplan_restorable(p, data, par, 0, NULL, 0), 0);
			par[m] = true;
			assert_int_equal(ecplan_restorable(p, data, par, 0, NULL, 0), 1);
		}
		ecplan_free(p);
	}
}

/* The figure: RAM per node for one protected step, equal shards of
 * S = 64 MiB: replication with one peer holds 2 S; rs:4+1 1.25 S and
 * rs:4+2 1.5 S, plus the fragments' headers and the 4 KiB rounding of pieces. */
static void test_ram_figure(void **state)
{
	static const unsigned km[][3] = { { 4, 1, 125 }, { 4, 2, 150 }, { 6, 2, 134 }, { 8, 2, 125 } };
	const uint64_t S = 64ull << 20;
	uint64_t size[16];

	(void)state;
	for (size_t c = 0; c < sizeof km / sizeof km[0]; c++) {
		unsigned k = km[c][0], m = km[c][1];
		struct ecplan *p = build((int)(k + m), k, m, NULL, NULL);
		for (unsigned r = 0; r < k + m; r++)
			size[r] = S;
		for (unsigned r = 0; r < k + m; r++) {
			uint64_t held = ecplan_ram_bytes(p, (int)r, size);
			uint64_t goal = S + S * m / k;
			assert_true(held >= goal);
			/* pieces round up to 4 KiB */
			assert_true(held <= goal + m * (4096 + EC_HDR_LEN(k) + EC_TRL_LEN(k)));
			/* the percentage the bench table prints */
			assert_true(held * 100 / S <= km[c][2]);
			assert_true(held < 2 * S);
		}
		ecplan_free(p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rotation),
		cmocka_unit_test(test_group_sizes),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_domains),
		cmocka_unit_test(test_data_parallel),
		cmocka_unit_test(test_piece_sources),
		cmocka_unit_test(test_restorable_exhaustive),
		cmocka_unit_test(test_ram_figure),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
