/* ecplan: which nodes form the erasure-coded groups of `redundancy: rs:K+M`,
 * which node holds which fragment, what a node's RAM holds, and when a lost
 * shard is restorable (issue 17). Pure: no I/O, no clock, no global state;
 * any thread may call it. A plan is allocated by ecplan_build() and freed
 * by ecplan_free() (NULL allowed); it borrows nothing from its input.
 *
 * Why the code runs across shards. Every node keeps its own shard S whole
 * in RAM (a local restore is a rename, as with replication). A code inside
 * one shard would then need K + M - 1 of its fragments on other nodes
 * (they must survive the owner and M - 1 more): (K + M - 1) / K x S extra
 * per node, no better than one replica. Instead, as RAID 5 rotates parity
 * and SCR encodes partner sets, a group of G = K + M units (a unit is a
 * distinct shard: identical data-parallel shards are encoded once) forms G
 * codewords. Each unit's shard is cut into K pieces (ec_split); codeword c
 * takes its parity from the units at positions c, c+1, ..., c+M-1 (mod G)
 * and its K data members from the other K positions in order:
 *     data slot j of codeword c   = piece j of the unit at (c + M + j) mod G
 *     parity slot j of codeword c = stored by the unit at (c + j) mod G
 * so every unit is in every codeword exactly once: data in K of them (its
 * own shard, no extra RAM), parity in M (M pieces of S / K). RAM per node:
 * (1 + M / K) x S plus the fragments' headers; losing any M units of a
 * group loses at most M members of each codeword, and K remain.
 *
 * Failure domains (placement.c's only one is the node itself; a domain
 * here is any label the caller gives: node, rack, zone) are dealt round
 * robin over the groups, largest domain first, so no domain has more than
 * M units in a group whenever ceil(|domain| / groups) <= M allows it. A
 * unit counts in its representative's domain: that node stores its parity
 * (its data twins elsewhere only make the unit harder to lose). */
#ifndef MTCFS_TIERS_ECPLAN_H
#define MTCFS_TIERS_ECPLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/ec.h"

struct ecplan_in {
	int nodes;             /* 1 .. 65536 */
	unsigned k, m;         /* rs:K+M, as ec_parse_redundancy() accepts */
	const int *domain;     /* [nodes] failure domain labels; NULL: each node its own */
	const int *same;       /* [nodes] the representative (lowest) rank of the unit whose
	                        * shard is identical; NULL: all distinct. same[same[r]] must
	                        * be same[r] <= r. ecplan_dp_same() gives GKE's columns. */
};

struct ecplan_group {
	unsigned k, m, n;      /* n = k + m units; k may differ from the asked K (below) */
	int unit[EC_MAX_N];    /* representative ranks, in position order (ascending) */
};

struct ecplan {
	int nodes;
	unsigned ngroups;
	struct ecplan_group *g;  /* [ngroups] */
	int *group;              /* [nodes] group of the node's unit, -1 when not encoded */
	int *pos;                /* [nodes] its unit's position in that group */
	int *rep;                /* [nodes] its unit's representative (holds the parity) */
	bool domains_ok;         /* no domain holds more than m units of any group */
	char why[200];           /* a note when k differs, domains_ok is false or ngroups 0 */
};

/* Group sizes: U distinct units, G = K + M. U >= G: floor(U / G) groups
 * (more if a group would exceed EC_MAX_N), sizes as equal as possible, each
 * group's k = size - M (>= K: less RAM, the same M losses per group).
 * M < U < G: one shortened group of k = U - M (more RAM per node than
 * (1 + M / K), said in why). U <= M: ngroups 0, nothing encoded (why). */

/* With assume-data-parallelism D >= 2 dividing nodes (P = nodes / D >= 1):
 * same[r] = r mod P (placement.h: r, r +/- P, ... are identical); else
 * same[r] = r. 0 or -EINVAL (nodes < 1, dp < 0, same NULL). */
int ecplan_dp_same(int nodes, int assume_dp, int *same);

/* 0, -EINVAL (bad input: nodes, k, m, a same[] that is not a
 * representative map), -ENOMEM. *out owned by the caller. */
int ecplan_build(const struct ecplan_in *in, struct ecplan **out);
void ecplan_free(struct ecplan *p);

/* Position in g of the unit that holds slot `slot` (0..k-1 data, k..k+m-1
 * parity) of codeword cw (0..n-1). */
unsigned ecplan_slot_pos(const struct ecplan_group *g, unsigned cw, unsigned slot);
/* Where piece t (0..k-1) of the unit at position pos is coded: codeword
 * and data slot (slot == t). */
void ecplan_piece(const struct ecplan_group *g, unsigned pos, unsigned t, unsigned *cw,
		  unsigned *slot);
/* Codeword whose parity slot k + j (j < m) the unit at pos stores. */
unsigned ecplan_parity_cw(const struct ecplan_group *g, unsigned pos, unsigned j);

/* The geometry of codeword cw of group gi for ec_frag_data/ec_encode:
 * size[r] and hash[r] are the step's shard bytes and content hash of every
 * node r (only representatives are read). seg = EC_SEG_DEFAULT, label
 * zeroed (the caller names job/step/group/cw). 0 or -EINVAL. */
int ecplan_geom(const struct ecplan *p, unsigned gi, unsigned cw, const uint64_t *size,
		const uint8_t (*hash)[32], struct ec_geom *out);

/* RAM node `rank` holds for one protected step: its own shard plus the
 * parity fragment files it stores (header, payload, trailer). size[] as
 * above. A node outside any group holds its shard only. */
uint64_t ecplan_ram_bytes(const struct ecplan *p, int rank, const uint64_t *size);

/* The restorability rule the coordinator's plan calls. has_data[r]: node r
 * is alive and holds its own shard of the step, complete; has_parity[r]:
 * node r is alive and holds all its parity fragments of the step. The
 * shard of `rank` is restorable when a node of its unit has the data, or
 * when, for each of its K pieces, at least k members of that codeword
 * survive (data: some node of the member's unit has_data; parity: the
 * storing representative has_parity). 1 restorable, 0 not (why says which
 * piece is short, may be NULL), -EINVAL. */
int ecplan_restorable(const struct ecplan *p, const bool *has_data, const bool *has_parity,
		      int rank, char *why, size_t whylen);

/* Where the restoring node fetches piece t (0..k-1) of rank's shard from:
 * *cw is the piece's codeword, and out[] (k + m entries) receives every
 * member of it that survives, the piece's own slot excluded, as (slot,
 * rank to ask): a data member from a node of its unit that has_data (the
 * representative first, else the lowest such rank), a parity member from
 * the representative that stores it if has_parity. Returns how many
 * (fewer than k: not restorable; ask for more than k when there are, so a
 * corrupt one costs no round trip), or -EINVAL (no group, bad arguments). */
struct ecplan_src {
	unsigned slot;
	int rank;
};
int ecplan_piece_sources(const struct ecplan *p, const bool *has_data, const bool *has_parity,
			 int rank, unsigned t, unsigned *cw, struct ecplan_src *out);

#endif /* MTCFS_TIERS_ECPLAN_H */
