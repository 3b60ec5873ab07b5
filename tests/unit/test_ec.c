/* Unit tests for tiers/ec (with tiers/ecplan's layout): a group of K + M
 * real shard trees on disk is encoded as mtcfs will (data fragments made
 * from each node's shard, parity stored on the nodes the plan names), then
 * every loss pattern of up to M nodes is restored from the survivors'
 * fragments and compared byte for byte (sparse files, empty files, odd
 * sizes, empty shards); a corrupt fragment is passed over; M + 1 losses are
 * -ENODATA with the reason; the RAM each node holds is measured on disk. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define TESTTMP_NAME "ec"
#include "testtmp.h"

#include "tiers/ec.h"
#include "tiers/ecplan.h"
#include "tiers/manifest.h"
#include "common/util.h"

/* ---- the redundancy setting ---- */

static void test_parse_redundancy(void **state)
{
	static const char *const bad[] = {
		"rs:0+1", "rs:4+0", "rs:31+2", "rs:16+17", "rs:4+2x", "RS:4+2", "rs:04+2",
		"rs:4+", "rs:+2", "rs:4 +2", " rs:4+2", "rs:4+2 ", "replicationx", "rs:100+1",
		"rs:-1+2", "rs:4-2", "rs4+2", "rs:", "erasure", "rs:4+02",
	};
	struct ec_redundancy r;
	char err[200], buf[32];

	(void)state;
	assert_int_equal(ec_parse_redundancy("replication", &r, err, sizeof err), 0);
	assert_int_equal(r.kind, EC_REPLICATION);
	assert_int_equal(ec_parse_redundancy(NULL, &r, err, sizeof err), 0);
	assert_int_equal(r.kind, EC_REPLICATION);
	assert_int_equal(ec_parse_redundancy("", &r, NULL, 0), 0);
	assert_int_equal(r.kind, EC_REPLICATION);
	assert_int_equal(ec_parse_redundancy("rs:4+2", &r, err, sizeof err), 0);
	assert_int_equal(r.kind, EC_RS);
	assert_int_equal(r.k, 4);
	assert_int_equal(r.m, 2);
	assert_string_equal(ec_redundancy_str(&r, buf, sizeof buf), "rs:4+2");
	assert_int_equal(ec_parse_redundancy("rs:1+1", &r, err, sizeof err), 0);
	assert_int_equal(ec_parse_redundancy("rs:31+1", &r, err, sizeof err), 0);
	assert_int_equal(r.k + r.m, EC_MAX_N);
	assert_int_equal(ec_parse_redundancy("rs:16+16", &r, err, sizeof err), 0);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		err[0] = '\0';
		if (ec_parse_redundancy(bad[i], &r, err, sizeof err) != -EINVAL) {
			print_error("'%s' accepted\n", bad[i]);
			fail();
		}
		assert_non_null(strstr(err, "redundancy:"));
	}
	ec_parse_redundancy("rs:31+2", &r, err, sizeof err);
	assert_string_equal(err, "redundancy: rs:31+2 needs K >= 1, M >= 1 and K + M <= 32");
	ec_parse_redundancy("rs:4+2x", &r, err, sizeof err);
	assert_string_equal(err,
			    "redundancy: 'rs:4+2x' is neither 'replication' nor 'rs:K+M' (e.g. rs:4+2)");
	assert_string_equal(ec_redundancy_str(&(struct ec_redundancy){ 0 }, buf, sizeof buf),
			    "replication");
}

static void test_split(void **state)
{
	static const uint64_t totals[] = { 0, 1, 4095, 4096, 4097, 16384, 1000003, 1u << 20 };

	(void)state;
	for (size_t i = 0; i < sizeof totals / sizeof totals[0]; i++)
		for (unsigned k = 1; k <= 9; k++) {
			uint64_t next = 0, off, len;
			for (unsigned t = 0; t < k; t++) {
				ec_split(totals[i], k, t, &off, &len);
				assert_true(off == next || len == 0);
				if (len)
					assert_int_equal(off % 4096, 0);
				next = off + len;
			}
			assert_int_equal(next, totals[i]);
		}
}

/* ---- shard trees ---- */

static uint64_t rng_state;

static uint8_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint8_t)(rng_state >> 24);
}

static void put_bytes(int dirfd, const char *path, uint64_t off, size_t len)
{
	uint8_t *b = malloc(len ? len : 1);
	int fd = openat(dirfd, path, O_WRONLY | O_CREAT, 0644);

	assert_non_null(b);
	assert_true(fd >= 0);
	for (size_t i = 0; i < len; i++)
		b[i] = rnd();
	assert_int_equal(pwrite(fd, b, len, (off_t)off), (ssize_t)len);
	close(fd);
	free(b);
}

static void make_file(int dirfd, const char *path, uint64_t size, unsigned mode)
{
	int fd = openat(dirfd, path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

/* variant 0: random + sparse + empty + odd files; 1: an empty shard (one
 * empty file); 2: one big random file (many segments). */
/* variant >= 100: a random shape from seed variant (1 to 3 files of 0 to
 * 200 KB, some with holes and data at random offsets). */
static void random_shard(int dirfd)
{
	unsigned nf = 1 + rnd() % 3;

	for (unsigned i = 0; i < nf; i++) {
		char name[16];
		uint64_t size = ((uint64_t)rnd() << 10 | rnd() << 2) % 200000;
		snprintf(name, sizeof name, "f%u", i);
		make_file(dirfd, name, size, 0600);
		if (!size)
			continue;
		if (rnd() & 1) {
			put_bytes(dirfd, name, 0, (size_t)size);    /* dense */
		} else {
			for (unsigned x = rnd() % 4; x > 0; x--) {  /* sparse */
				uint64_t off = ((uint64_t)rnd() << 10 | rnd()) % size;
				size_t len = (size_t)(rnd() * 37u % 9000 + 1);
				if (len > size - off)
					len = (size_t)(size - off);
				put_bytes(dirfd, name, off, len);
			}
		}
	}
}

static void make_shard(int dirfd, unsigned r, int variant)
{
	rng_state = 0x9e3779b97f4a7c15ull * (r + 1) + (uint64_t)variant;
	if (variant >= 100) {
		random_shard(dirfd);
		return;
	}
	if (variant == 1) {
		make_file(dirfd, "empty", 0, 0644);
		return;
	}
	if (variant == 2) {
		make_file(dirfd, "big", 0, 0600);
		put_bytes(dirfd, "big", 0, 300000 + 4099u * r);
		return;
	}
	make_file(dirfd, "a.bin", 0, 0644);
	put_bytes(dirfd, "a.bin", 0, 1000 + 4099u * r);
	assert_int_equal(mkdirat(dirfd, "sub", 0755), 0);
	make_file(dirfd, "sub/sparse.dat", 300000 + r, 0640);
	put_bytes(dirfd, "sub/sparse.dat", 70000, 5000);
	put_bytes(dirfd, "sub/sparse.dat", 299990, 10);
	make_file(dirfd, "sub/empty", 0, 0444);
	make_file(dirfd, "z.odd", 0, 0600);
	put_bytes(dirfd, "z.odd", 0, 1 + 17u * r);
	assert_int_equal(symlinkat("a.bin", dirfd, "link"), 0);
}

static int open_dir(int at, const char *name)
{
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

static int open_file(int at, const char *name, int flags)
{
	int fd = openat(at, name, flags | O_CLOEXEC, 0600);

	if (fd < 0)
		print_error("open %s: %s\n", name, strerror(errno));
	assert_true(fd >= 0);
	return fd;
}

/* Extra 512-byte blocks a restored file may have over the original. */
static blkcnt_t sparse_slack;
#define HOLE_SLACK (4096 / 512)

/* The two trees hold the same bytes in every file of mf, and a sparse
 * original stays as sparse. */
static void assert_same_files(int a, int b, const struct manifest *mf)
{
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *e = &mf->e[i];
		struct stat sa, sb;
		uint8_t ba[65536], bb[65536];
		int fa, fb;
		if (e->type != MF_FILE)
			continue;
		fa = open_file(a, e->path, O_RDONLY);
		fb = open_file(b, e->path, O_RDONLY);
		assert_int_equal(fstat(fa, &sa), 0);
		assert_int_equal(fstat(fb, &sb), 0);
		assert_int_equal(sa.st_size, sb.st_size);
		assert_int_equal(sa.st_mode & 07777, sb.st_mode & 07777);
		/* sparse stays sparse: a zero 4 KiB block is never written, so
		 * never more blocks than the original (after a corrupt survivor,
		 * plus the pages straddling a member's ends that the failed
		 * attempt wrote: sparse_slack) */
		if (sb.st_blocks > sa.st_blocks + sparse_slack) {
			print_error("%s: %lld blocks, the original %lld\n", e->path,
				    (long long)sb.st_blocks, (long long)sa.st_blocks);
			fail();
		}
		for (off_t off = 0; off < sa.st_size; off += (off_t)sizeof ba) {
			ssize_t na = pread(fa, ba, sizeof ba, off), nb = pread(fb, bb, sizeof bb, off);
			assert_int_equal(na, nb);
			assert_true(na > 0);
			assert_memory_equal(ba, bb, (size_t)na);
		}
		close(fa);
		close(fb);
	}
}

/* ---- one group, as the engine will lay it out ---- */

struct group {
	struct tmp *t;
	unsigned k, m, n;
	uint32_t seg;
	int node[EC_MAX_N];              /* node<r>/: shard/ and its fragments */
	int shard[EC_MAX_N];             /* node<r>/shard */
	struct manifest *mf[EC_MAX_N];
	uint64_t size[EC_MAX_N];
	uint8_t hash[EC_MAX_N][32];
	struct ecplan *plan;
};

static void geom_of(struct group *G, unsigned cw, struct ec_geom *g)
{
	assert_int_equal(ecplan_geom(G->plan, 0, cw, G->size, (const uint8_t(*)[32])G->hash, g), 0);
	g->seg = G->seg;
	memset(g->label, 0, sizeof g->label);
	g->label[0] = (uint8_t)cw;
	memcpy(g->label + 1, "test-step-7", 11);
}

static void frag_name(char *buf, size_t len, unsigned cw, unsigned slot)
{
	snprintf(buf, len, "cw%u.slot%u", cw, slot);
}

/* Slot `slot` of codeword cw of group pg, opened on the node that holds it. */
static int open_frag(const struct group *G, const struct ecplan_group *pg, unsigned cw,
		     unsigned slot, int flags)
{
	char name[64];

	frag_name(name, sizeof name, cw, slot);
	return open_file(G->node[pg->unit[ecplan_slot_pos(pg, cw, slot)]], name, flags);
}

/* fd's fragment header is refused with exactly this reason. */
static void assert_frag_refused(int fd, const char *want)
{
	char err[200] = "";

	assert_int_equal(ec_frag_info(fd, NULL, NULL, err, sizeof err), -EBADMSG);
	assert_string_equal(err, want);
}

/* Builds K + M nodes with shards of `variant` (variants[r] if given),
 * writes every data fragment on its owner (what it would send) and the
 * parity on the node the plan names. */
static void group_build(struct group *G, struct tmp *t, unsigned k, unsigned m, uint32_t seg,
			const int *variants, int variant)
{
	struct ecplan_in in = { .nodes = (int)(k + m), .k = k, .m = m };
	char name[64];

	memset(G, 0, sizeof *G);
	G->t = t;
	G->k = k;
	G->m = m;
	G->n = k + m;
	G->seg = seg;
	for (unsigned r = 0; r < G->n; r++) {
		snprintf(name, sizeof name, "node%u", r);
		assert_int_equal(mkdirat(t->fd, name, 0755), 0);
		G->node[r] = open_dir(t->fd, name);
		assert_int_equal(mkdirat(G->node[r], "shard", 0755), 0);
		G->shard[r] = open_dir(G->node[r], "shard");
		make_shard(G->shard[r], r, variants ? variants[r] : variant);
		assert_int_equal(mf_build(G->shard[r], &G->mf[r]), 0);
		G->size[r] = G->mf[r]->total;
		memcpy(G->hash[r], G->mf[r]->hash, 32);
	}
	assert_int_equal(ecplan_build(&in, &G->plan), 0);
	assert_int_equal(G->plan->ngroups, 1);
	assert_int_equal(G->plan->g[0].n, G->n);
	assert_int_equal(G->plan->g[0].k, k);
	for (unsigned cw = 0; cw < G->n; cw++) {
		const struct ecplan_group *pg = &G->plan->g[0];
		struct ec_geom g;
		int in_fd[EC_MAX_N], out_fd[EC_MAX_N];
		geom_of(G, cw, &g);
		for (unsigned j = 0; j < k; j++) {
			unsigned r = (unsigned)pg->unit[ecplan_slot_pos(pg, cw, j)];
			struct ec_shard src = { G->shard[r], G->mf[r] };
			char err[200] = "";
			frag_name(name, sizeof name, cw, j);
			in_fd[j] = open_file(G->node[r], name, O_RDWR | O_CREAT | O_TRUNC);
			if (ec_frag_data(&g, j, &src, in_fd[j], err, sizeof err)) {
				print_error("ec_frag_data: %s\n", err);
				fail();
			}
			assert_int_equal(lseek(in_fd[j], 0, SEEK_END), (off_t)ec_frag_size(&g, j));
		}
		for (unsigned j = 0; j < m; j++) {
			unsigned r = (unsigned)pg->unit[ecplan_slot_pos(pg, cw, k + j)];
			frag_name(name, sizeof name, cw, k + j);
			out_fd[j] = open_file(G->node[r], name, O_RDWR | O_CREAT | O_TRUNC);
		}
		assert_int_equal(ec_encode(in_fd, k, out_fd, m, NULL, 0), 0);
		for (unsigned j = 0; j < k; j++)
			close(in_fd[j]);
		for (unsigned j = 0; j < m; j++) {
			assert_int_equal(lseek(out_fd[j], 0, SEEK_END),
					 (off_t)ec_frag_size(&g, k + j));
			close(out_fd[j]);
		}
	}
}

static void group_free(struct group *G)
{
	for (unsigned r = 0; r < G->n; r++) {
		close(G->shard[r]);
		close(G->node[r]);
		mf_free(G->mf[r]);
	}
	ecplan_free(G->plan);
}

/* Opens the fragments of codeword cw that survive `lost` (bit per node);
 * returns their count. */
static unsigned survivors(struct group *G, unsigned cw, uint32_t lost, int *fds)
{
	const struct ecplan_group *pg = &G->plan->g[0];
	unsigned n = 0;
	char name[64];

	for (unsigned s = 0; s < G->n; s++) {
		unsigned r = (unsigned)pg->unit[ecplan_slot_pos(pg, cw, s)];
		if (lost >> r & 1)
			continue;
		frag_name(name, sizeof name, cw, s);
		fds[n++] = open_file(G->node[r], name, O_RDONLY);
	}
	return n;
}

static void close_all(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* Restores node x's shard into restore<x>/ from the nodes not in `lost`:
 * 0, or the first error (err says why). */
static int restore_node(struct group *G, unsigned x, uint32_t lost, char *err, size_t errlen)
{
	const struct ecplan_group *pg = &G->plan->g[0];
	char name[64];
	int dir, rc;
	struct ec_shard dst;

	snprintf(name, sizeof name, "restore%u", x);
	assert_int_equal(mkdirat(G->t->fd, name, 0755), 0);
	dir = open_dir(G->t->fd, name);
	dst = (struct ec_shard){ dir, G->mf[x] };
	rc = ec_shard_prepare(&dst);
	for (unsigned t = 0; !rc && t < G->k; t++) {
		unsigned cw, slot, n;
		int fds[EC_MAX_N];
		struct ec_sink sink = { .shard = &dst, .fd = -1 };
		struct ecplan_src src[EC_MAX_N];
		bool has[EC_MAX_N];
		int ns;
		/* the sources the coordinator's plan would name */
		for (unsigned r = 0; r < G->n; r++)
			has[r] = !(lost >> r & 1);
		ns = ecplan_piece_sources(G->plan, has, has, (int)x, t, &cw, src);
		assert_true(ns >= 0);
		ecplan_piece(pg, (unsigned)G->plan->pos[x], t, &cw, &slot);
		n = survivors(G, cw, lost, fds);
		assert_int_equal(n, (unsigned)ns);
		close_all(fds, n);
		for (int i = 0; i < ns; i++) {
			char fname[64];
			frag_name(fname, sizeof fname, cw, src[i].slot);
			fds[i] = open_file(G->node[src[i].rank], fname, O_RDONLY);
		}
		rc = ec_decode(fds, n, slot, &sink, err, errlen);
		close_all(fds, n);
	}
	if (!rc)
		rc = ec_shard_finish(&dst, err, errlen);
	if (!rc)
		assert_same_files(G->shard[x], dir, G->mf[x]);
	close(dir);
	assert_int_equal(util_rmtree_at(G->t->fd, name, NULL), 0);
	return rc;
}

/* Every pattern of 1..M lost nodes restores every lost shard exactly and
 * the plan calls each restorable; one M + 1 pattern is -ENODATA. */
static void all_losses(unsigned k, unsigned m, uint32_t seg, const int *variants, int variant,
		       void **state)
{
	struct group G;
	unsigned patterns = 0;

	group_build(&G, *state, k, m, seg, variants, variant);
	for (uint32_t lost = 1; lost < (1u << G.n); lost++) {
		bool has[EC_MAX_N];
		int cnt = __builtin_popcount(lost);
		if (cnt > (int)m)
			continue;
		for (unsigned r = 0; r < G.n; r++)
			has[r] = !(lost >> r & 1);
		for (unsigned x = 0; x < G.n; x++) {
			char err[400] = "";
			if (!(lost >> x & 1))
				continue;
			assert_int_equal(ecplan_restorable(G.plan, has, has, (int)x, NULL, 0), 1);
			if (restore_node(&G, x, lost, err, sizeof err)) {
				print_error("rs:%u+%u lost %#x node %u: %s\n", k, m, lost, x, err);
				fail();
			}
		}
		patterns++;
	}
	assert_true(patterns > 0);
	{
		/* M + 1 lost: nodes 0..M */
		uint32_t lost = (1u << (m + 1)) - 1;
		bool has[EC_MAX_N];
		char err[600] = "", why[200];
		for (unsigned r = 0; r < G.n; r++)
			has[r] = !(lost >> r & 1);
		assert_int_equal(ecplan_restorable(G.plan, has, has, 0, why, sizeof why), 0);
		assert_non_null(strstr(why, "members it needs"));
		assert_int_equal(restore_node(&G, 0, lost, err, sizeof err), -ENODATA);
		assert_non_null(strstr(err, "needed to rebuild member"));
	}
	group_free(&G);
}

static void test_rs_1_1(void **state) { all_losses(1, 1, EC_SEG_MIN, NULL, 0, state); }
static void test_rs_2_1(void **state) { all_losses(2, 1, EC_SEG_MIN, NULL, 0, state); }
static void test_rs_4_1(void **state) { all_losses(4, 1, EC_SEG_MIN, NULL, 0, state); }
static void test_rs_4_2(void **state) { all_losses(4, 2, EC_SEG_MIN, NULL, 0, state); }
static void test_rs_3_3(void **state) { all_losses(3, 3, 8192, NULL, 0, state); }
static void test_rs_6_2_big(void **state) { all_losses(6, 2, 65536, NULL, 2, state); }

/* Random groups: rs:K+M with K 1..8, M 1..4, random shard shapes and
 * segment sizes, one random loss of up to M nodes, sometimes a corrupt
 * surviving parity byte; every lost shard restored exactly. Seeded, so a
 * failure names a reproducible case. */
static void test_rs_random(void **state)
{
	struct tmp *t = *state;
	static const uint32_t segs[] = { EC_SEG_MIN, 8192, 65536, EC_SEG_DEFAULT };

	for (unsigned it = 0; it < 24; it++) {
		unsigned k, m, n;
		uint32_t seg, lost = 0;
		int v[EC_MAX_N];
		struct group G;
		char name[64];
		rng_state = 0x243f6a8885a308d3ull + it;
		k = 1 + rnd() % 8;
		m = 1 + rnd() % 4;
		n = k + m;
		seg = segs[rnd() % 4];
		for (unsigned r = 0; r < n; r++)
			v[r] = 100 + (int)(it * 64 + r);
		for (unsigned c = 1 + rnd() % m; c > 0;) {
			unsigned r = rnd() % n;
			if (!(lost >> r & 1)) {
				lost |= 1u << r;
				c--;
			}
		}
		group_build(&G, t, k, m, seg, v, 0);
		sparse_slack = 0;
		if (n - (unsigned)__builtin_popcount(lost) > k && (rnd() & 1)) {
			/* the one garbage byte may land in a page shared with the
			 * next member: one page of zeros may stay allocated */
			sparse_slack = HOLE_SLACK;
			/* corrupt one byte of a surviving parity fragment */
			for (unsigned r = 0; r < n; r++) {
				struct stat st;
				int fd;
				uint8_t b;
				unsigned cw = ecplan_parity_cw(&G.plan->g[0], (unsigned)G.plan->pos[r], 0);
				if (lost >> r & 1)
					continue;
				frag_name(name, sizeof name, cw, k);
				fd = open_file(G.node[r], name, O_RDWR);
				assert_int_equal(fstat(fd, &st), 0);
				if (st.st_size > (off_t)(EC_HDR_LEN(k) + EC_TRL_LEN(k))) {
					off_t at = EC_HDR_LEN(k) +
						   (off_t)(rnd() % (st.st_size - EC_HDR_LEN(k) - EC_TRL_LEN(k)));
					assert_int_equal(pread(fd, &b, 1, at), 1);
					b ^= 0x10;
					assert_int_equal(pwrite(fd, &b, 1, at), 1);
				}
				close(fd);
				break;
			}
		}
		for (unsigned x = 0; x < n; x++) {
			char err[600] = "";
			if (!(lost >> x & 1))
				continue;
			if (restore_node(&G, x, lost, err, sizeof err)) {
				print_error("case %u: rs:%u+%u seg %u lost %#x node %u: %s\\n", it, k, m,
					    seg, lost, x, err);
				fail();
			}
		}
		group_free(&G);
		for (unsigned r = 0; r < n; r++) {
			snprintf(name, sizeof name, "node%u", r);
			assert_int_equal(util_rmtree_at(t->fd, name, NULL), 0);
		}
	}
	sparse_slack = 0;
}

/* Shards of different shapes in one group: empty, small, big. */
static void test_rs_mixed_sizes(void **state)
{
	static const int v[] = { 1, 0, 2, 1, 0, 2 };

	all_losses(4, 2, EC_SEG_MIN, v, 0, state);
}

/* A corrupt parity fragment is passed over while another is left; with
 * exactly K candidates it makes the decode -ENODATA, saying why. */
static void test_corrupt_fragment(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	unsigned x = 0, cw, slot, n;
	int fds[EC_MAX_N], fd;
	uint32_t lost = 1u << x;
	char err[600] = "";
	uint8_t b;
	struct ec_geom g;

	group_build(&G, *state, 4, 2, EC_SEG_MIN, NULL, 0);
	pg = &G.plan->g[0];
	ecplan_piece(pg, (unsigned)G.plan->pos[x], 0, &cw, &slot);
	geom_of(&G, cw, &g);
	/* flip one payload byte of parity slot K in codeword cw, where node
	 * 0's piece 0 is a hole (stream offset 20000: sub/sparse.dat at
	 * 19000), so the decode that used it wrote a block into the hole */
	fd = open_frag(&G, pg, cw, 4, O_RDWR);
	assert_int_equal(pread(fd, &b, 1, EC_HDR_LEN(4) + 20000), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, EC_HDR_LEN(4) + 20000), 1);
	assert_int_equal(ec_frag_info(fd, NULL, NULL, err, sizeof err), 0);
	assert_int_equal(ec_frag_verify(fd, NULL, NULL, err, sizeof err), -EBADMSG);
	assert_string_equal(err, "fragment 4: payload CRC32C mismatch");
	close(fd);
	/* both parities survive: the other one is used, restore is exact and
	 * the hole a hole again */
	assert_int_equal(restore_node(&G, x, lost, err, sizeof err), 0);
	/* lose node 0 and the holder of the good parity (slot 5): only the
	 * corrupt one is left for codeword cw */
	lost |= 1u << pg->unit[ecplan_slot_pos(pg, cw, 5)];
	{
		struct ec_shard dst;
		struct ec_sink sink;
		int dir;
		assert_int_equal(mkdirat(G.t->fd, "r", 0755), 0);
		dir = open_dir(G.t->fd, "r");
		dst = (struct ec_shard){ dir, G.mf[x] };
		sink = (struct ec_sink){ .shard = &dst, .fd = -1 };
		assert_int_equal(ec_shard_prepare(&dst), 0);
		n = survivors(&G, cw, lost, fds);
		assert_int_equal(n, 4);
		assert_int_equal(ec_decode(fds, n, slot, &sink, err, sizeof err), -ENODATA);
		assert_non_null(strstr(err, "fragment 4 refused: payload CRC32C mismatch"));
		assert_non_null(strstr(err, "3 good fragments of 4+2, 4 needed"));
		close_all(fds, n);
		close(dir);
	}
	/* a corrupt header is refused too, as is a data fragment given to
	 * ec_encode with a bad payload */
	fd = open_frag(&G, pg, cw, 0, O_RDWR);
	assert_int_equal(pread(fd, &b, 1, 30), 1);
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, 30), 1);
	assert_frag_refused(fd, "fragment header CRC32C mismatch");
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, 30), 1);
	assert_int_equal(pread(fd, &b, 1, EC_HDR_LEN(4)), 1);
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, EC_HDR_LEN(4)), 1);
	close(fd);
	{
		int in[4], out[2];
		for (unsigned j = 0; j < 4; j++)
			in[j] = open_frag(&G, pg, cw, j, O_RDONLY);
		out[0] = open_file(G.t->fd, "p0", O_RDWR | O_CREAT | O_TRUNC);
		out[1] = open_file(G.t->fd, "p1", O_RDWR | O_CREAT | O_TRUNC);
		assert_int_equal(ec_encode(in, 4, out, 2, err, sizeof err), -EBADMSG);
		assert_string_equal(err, "data fragment 0: payload CRC32C mismatch");
		/* and what it wrote is no fragment */
		assert_int_equal(ec_frag_info(out[0], NULL, NULL, NULL, 0), -EBADMSG);
		assert_int_equal(ec_frag_info(out[1], NULL, NULL, NULL, 0), -EBADMSG);
		close_all(in, 4);
		close_all(out, 2);
	}
	group_free(&G);
}

/* A lost parity fragment is rebuilt byte for byte; a fragment of another
 * codeword among the candidates is ignored, a corrupt one passed over. */
static void test_rebuild_parity(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	int fds[EC_MAX_N + 1], out, orig;
	unsigned n, holder;
	char name[64], err[400] = "";
	struct ec_sink sink;
	struct stat sa, sb;

	group_build(&G, *state, 4, 2, EC_SEG_MIN, NULL, 0);
	pg = &G.plan->g[0];
	holder = (unsigned)pg->unit[ecplan_slot_pos(pg, 3, 5)];
	n = survivors(&G, 3, 1u << holder, fds);
	assert_int_equal(n, 5);
	/* a stranger first: parity 4 of codeword 2 */
	memmove(fds + 1, fds, n * sizeof fds[0]);
	fds[0] = open_frag(&G, pg, 2, 4, O_RDONLY);
	n++;
	/* and data slot 0 corrupt: checked before any byte goes out, passed
	 * over for parity 4 */
	{
		uint8_t b;
		int fd = open_frag(&G, pg, 3, 0, O_RDWR);
		assert_int_equal(pread(fd, &b, 1, EC_HDR_LEN(4) + 100), 1);
		b ^= 0x80;
		assert_int_equal(pwrite(fd, &b, 1, EC_HDR_LEN(4) + 100), 1);
		close(fd);
	}
	out = open_file(G.t->fd, "rebuilt", O_RDWR | O_CREAT | O_TRUNC);
	sink = (struct ec_sink){ .shard = NULL, .fd = out };
	assert_int_equal(ec_decode(fds, n, 5, &sink, err, sizeof err), 0);
	orig = open_file(G.node[holder], (frag_name(name, sizeof name, 3, 5), name), O_RDONLY);
	assert_int_equal(fstat(out, &sa), 0);
	assert_int_equal(fstat(orig, &sb), 0);
	assert_int_equal(sa.st_size, sb.st_size);
	{
		uint8_t *a = malloc((size_t)sa.st_size), *b = malloc((size_t)sb.st_size);
		assert_int_equal(pread(out, a, (size_t)sa.st_size, 0), sa.st_size);
		assert_int_equal(pread(orig, b, (size_t)sb.st_size, 0), sb.st_size);
		assert_memory_equal(a, b, (size_t)sa.st_size);
		free(a);
		free(b);
	}
	close(orig);
	close(out);
	close_all(fds, n);
	/* want out of range */
	n = survivors(&G, 3, 0, fds);
	assert_int_equal(ec_decode(fds, n, 6, &sink, err, sizeof err), -EINVAL);
	close_all(fds, n);
	group_free(&G);
}

/* Every single-bit flip in a fragment's header or trailer, every
 * truncation and an extension are refused by the parser, for a data and a
 * parity fragment. */
static void test_frag_damage(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	char name[64], err[200];

	group_build(&G, *state, 2, 1, EC_SEG_MIN, NULL, 1);   /* empty shards: tiny fragments */
	pg = &G.plan->g[0];
	for (unsigned slot = 0; slot < 3; slot += 2) {
		unsigned r = (unsigned)pg->unit[ecplan_slot_pos(pg, 0, slot)];
		struct ec_geom g;
		unsigned idx;
		struct stat st;
		uint8_t *buf;
		int fd;
		frag_name(name, sizeof name, 0, slot);
		fd = open_file(G.node[r], name, O_RDWR);
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(ec_frag_info(fd, &g, &idx, err, sizeof err), 0);
		assert_int_equal(idx, slot);
		assert_int_equal(g.k, 2);
		assert_int_equal(g.m, 1);
		assert_int_equal(g.label[0], 0);
		assert_memory_equal(g.label + 1, "test-step-7", 11);
		buf = malloc((size_t)st.st_size);
		assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
		for (off_t i = 0; i < st.st_size; i++)
			for (int bit = 0; bit < 8; bit++) {
				uint8_t b = buf[i] ^ (uint8_t)(1u << bit);
				assert_int_equal(pwrite(fd, &b, 1, i), 1);
				if (ec_frag_info(fd, NULL, NULL, err, sizeof err) != -EBADMSG) {
					print_error("slot %u: flip of bit %d of byte %lld accepted\n", slot,
						    bit, (long long)i);
					fail();
				}
				assert_int_equal(pwrite(fd, buf + i, 1, i), 1);
			}
		for (off_t len = 0; len < st.st_size; len++) {
			assert_int_equal(ftruncate(fd, len), 0);
			assert_int_equal(ec_frag_info(fd, NULL, NULL, err, sizeof err), -EBADMSG);
		}
		assert_int_equal(pwrite(fd, buf, (size_t)st.st_size, 0), st.st_size);
		assert_int_equal(pwrite(fd, "x", 1, st.st_size), 1);
		assert_int_equal(ec_frag_info(fd, NULL, NULL, err, sizeof err), -EBADMSG);
		assert_int_equal(ftruncate(fd, st.st_size), 0);
		assert_int_equal(ec_frag_info(fd, NULL, NULL, err, sizeof err), 0);
		free(buf);
		close(fd);
	}
	group_free(&G);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A crafted header whose CRC is right and whose member length is 2^64 - 1:
 * header + payload + trailer wraps to one byte less than header + trailer,
 * so a file of that size would pass the size check and its "trailer" be
 * read from inside the header. The label is ground until the header CRC's
 * last byte is a valid trailer mask, the rest of the trailer is forged. */
static void test_frag_huge_length(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	enum { H = EC_HDR_LEN(2), T = EC_TRL_LEN(2) };
	uint8_t f[H + T - 1];
	uint8_t *tb = f + H - 1;
	uint32_t crc = 0;
	int fd;

	group_build(&G, *state, 2, 1, EC_SEG_MIN, NULL, 1);   /* empty shards */
	pg = &G.plan->g[0];
	fd = open_frag(&G, pg, 0, 0, O_RDWR);
	assert_int_equal(pread(fd, f, H, 0), (ssize_t)H);
	for (int i = 0; i < 8; i++) {
		f[44 + i] = 0xff;   /* member 0's length */
		f[20 + i] = 0xff;   /* so the codeword length */
	}
	for (unsigned salt = 0;; salt++) {
		assert_true(salt < 1u << 20);
		put_le32(f + 28 + 12, salt);   /* label bytes 12..15 */
		crc = mf_crc32c(0, f, H - 4);
		if ((crc >> 24) == 1)          /* mask: member 0 known, < 1 << K */
			break;
	}
	put_le32(f + H - 4, crc);
	memset(tb + 1, 0, T - 1);            /* mask 1; crc[0] = crc[1] = payload = 0 */
	put_le32(tb + T - 4, mf_crc32c(0, tb, T - 4));
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(pwrite(fd, f, sizeof f, 0), (ssize_t)sizeof f);
	assert_frag_refused(fd, "fragment header: segment size or lengths inconsistent");
	close(fd);
	group_free(&G);
}

/* The segment size in a header sizes the reader's buffers ((K + 1) x seg
 * in ec_decode): a peer claiming 64 MiB segments must not make a decode of
 * rs:31+1 allocate 2 GiB. Headers beyond EC_SEG_MAX (1 MiB) are refused. */
static void test_frag_huge_segment(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	uint8_t h[EC_HDR_LEN(2)];
	uint32_t crc;
	int fd;

	group_build(&G, *state, 2, 1, EC_SEG_MIN, NULL, 1);
	pg = &G.plan->g[0];
	fd = open_frag(&G, pg, 0, 2, O_RDWR);
	assert_int_equal(pread(fd, h, sizeof h, 0), (ssize_t)sizeof h);
	put_le32(h + 16, 64u << 20);
	crc = mf_crc32c(0, h, sizeof h - 4);
	put_le32(h + sizeof h - 4, crc);
	assert_int_equal(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
	assert_frag_refused(fd, "fragment header: segment size or lengths inconsistent");
	close(fd);
	group_free(&G);
}

/* ec_encode is told K by its caller: a first data fragment whose header
 * claims more members than the caller passed must be refused, not make it
 * read descriptors past the end of in[]. */
static void test_encode_k_from_caller(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	char err[200] = "";
	int in[2], out[2];

	group_build(&G, *state, 4, 2, EC_SEG_MIN, NULL, 0);
	pg = &G.plan->g[0];
	for (unsigned j = 0; j < 2; j++)
		in[j] = open_frag(&G, pg, 0, j, O_RDONLY);
	out[0] = open_file(G.t->fd, "p0", O_RDWR | O_CREAT | O_TRUNC);
	out[1] = open_file(G.t->fd, "p1", O_RDWR | O_CREAT | O_TRUNC);
	assert_int_equal(ec_encode(in, 2, out, 2, err, sizeof err), -EBADMSG);
	assert_string_equal(err, "data fragment 0 is for rs:4+2, the caller asked for rs:2+2");
	close_all(in, 2);
	close_all(out, 2);
	group_free(&G);
}

/* A node lost during encoding leaves a parity fragment cut short: it is
 * refused (by its size) and another used; a data fragment cut short (its
 * sender died mid-stream) makes ec_encode refuse to produce parity. */
static void test_lost_during_encoding(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	unsigned cw, slot, n;
	int fds[EC_MAX_N], fd, in[4], out[2];
	char err[400] = "";
	struct stat st;

	group_build(&G, *state, 4, 2, EC_SEG_MIN, NULL, 0);
	pg = &G.plan->g[0];
	ecplan_piece(pg, (unsigned)G.plan->pos[0], 1, &cw, &slot);
	fd = open_frag(&G, pg, cw, 4, O_RDWR);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(ftruncate(fd, st.st_size / 2), 0);
	close(fd);
	assert_int_equal(restore_node(&G, 0, 1u, err, sizeof err), 0);
	/* and with only K candidates left, it says which one and why */
	n = survivors(&G, cw, 1u | 1u << pg->unit[ecplan_slot_pos(pg, cw, 5)], fds);
	{
		struct ec_sink sink = { .shard = NULL, .fd = -1 };
		assert_int_equal(n, 4);
		sink.fd = open_file(G.t->fd, "out", O_RDWR | O_CREAT | O_TRUNC);
		assert_int_equal(ec_decode(fds, n, slot, &sink, err, sizeof err), -ENODATA);
		assert_non_null(strstr(err, "refused: fragment 4 is "));
		assert_non_null(strstr(err, "3 good fragments of 4+2, 4 needed to rebuild member 1"));
		close(sink.fd);
	}
	close_all(fds, n);
	/* a data fragment cut short */
	fd = open_frag(&G, pg, cw, 2, O_RDWR);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(ftruncate(fd, st.st_size - 1), 0);
	close(fd);
	for (unsigned j = 0; j < 4; j++)
		in[j] = open_frag(&G, pg, cw, j, O_RDONLY);
	out[0] = open_file(G.t->fd, "p0", O_RDWR | O_CREAT | O_TRUNC);
	out[1] = open_file(G.t->fd, "p1", O_RDWR | O_CREAT | O_TRUNC);
	assert_int_equal(ec_encode(in, 4, out, 2, err, sizeof err), -EBADMSG);
	assert_non_null(strstr(err, "fragment 2 is "));
	close_all(in, 4);
	close_all(out, 2);
	group_free(&G);
}

/* Streaming in bounded memory: in a child whose address space may grow by
 * only 24 MiB, four 16 MiB members (64 MiB of data) are encoded (by
 * ec_encode and by ec_enc_*) and one is decoded again. An implementation that held a member, let alone a shard,
 * in memory would fail to allocate. (Not under ASan, whose shadow memory
 * needs the address space.) */
static void test_bounded_memory(void **state)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	(void)state;
	skip();
#else
	struct tmp *t = *state;
	char name[64];
	pid_t pid;
	int status;

	for (unsigned r = 0; r < 4; r++) {
		snprintf(name, sizeof name, "m%u", r);
		make_file(t->fd, name, 0, 0600);
		rng_state = r + 1;
		put_bytes(t->fd, name, 0, 1u << 20);               /* data at the start */
		make_file(t->fd, name, 16u << 20, 0600);          /* and 15 MiB of hole */
		put_bytes(t->fd, name, (16u << 20) - 4096, 4096); /* and data at the end */
	}
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct ec_geom g = { .k = 4, .m = 2, .seg = EC_SEG_DEFAULT };
		struct manifest *mf[4];
		int shard[4], in[4], out[2], dec[5], rc = 0;
		FILE *f = fopen("/proc/self/statm", "r");
		unsigned long pages = 0;
		struct rlimit rl;
		struct ec_shard dst;
		struct ec_sink sink;
		/* every member is a whole one-file shard: its own directory */
		for (unsigned r = 0; r < 4 && !rc; r++) {
			snprintf(name, sizeof name, "d%u", r);
			rc |= mkdirat(t->fd, name, 0700);
			shard[r] = openat(t->fd, name, O_RDONLY | O_DIRECTORY);
			snprintf(name, sizeof name, "../m%u", r);
			rc |= renameat(shard[r], name, shard[r], "f");
			rc |= mf_build(shard[r], &mf[r]);
			g.d[r].len = mf[r]->total;
			memcpy(g.d[r].shard, mf[r]->hash, 32);
		}
		for (unsigned r = 0; r < 4 && !rc; r++) {
			snprintf(name, sizeof name, "frag%u", r);
			in[r] = openat(t->fd, name, O_RDWR | O_CREAT | O_TRUNC, 0600);
		}
		out[0] = openat(t->fd, "par0", O_RDWR | O_CREAT | O_TRUNC, 0600);
		out[1] = openat(t->fd, "par1", O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (rc || !f || fscanf(f, "%lu", &pages) != 1)
			_exit(10);
		fclose(f);
		rl.rlim_cur = rl.rlim_max = pages * (unsigned long)sysconf(_SC_PAGESIZE) + (24u << 20);
		if (setrlimit(RLIMIT_AS, &rl))
			_exit(11);
		if (malloc(64u << 20))
			_exit(12);   /* the limit works */
		for (unsigned r = 0; r < 4; r++)
			if (ec_frag_data(&g, r, &(struct ec_shard){ shard[r], mf[r] }, in[r], NULL, 0))
				_exit(13);
		if (ec_encode(in, 4, out, 2, NULL, 0))
			_exit(14);
		{
			/* the same parity folded in member by member */
			int inc[2] = { openat(t->fd, "inc0", O_RDWR | O_CREAT | O_TRUNC, 0600),
				       openat(t->fd, "inc1", O_RDWR | O_CREAT | O_TRUNC, 0600) };
			struct ec_enc *e = NULL;
			if (ec_enc_open(&g, 0, 2, inc, &e))
				_exit(18);
			for (unsigned r = 0; r < 4; r++)
				if (lseek(in[r], 0, SEEK_SET) != 0 || ec_enc_add(e, in[r], NULL, 0))
					_exit(19);
			if (ec_enc_finish(e, NULL, 0))
				_exit(20);
			ec_enc_free(e);
		}
		/* member 0 lost: decode it from 1, 2, 3 and parity 0 */
		if (mkdirat(t->fd, "r0", 0700))
			_exit(15);
		dst = (struct ec_shard){ openat(t->fd, "r0", O_RDONLY | O_DIRECTORY), mf[0] };
		sink = (struct ec_sink){ .shard = &dst, .fd = -1 };
		dec[0] = in[1];
		dec[1] = in[2];
		dec[2] = in[3];
		dec[3] = out[0];
		if (ec_shard_prepare(&dst) || ec_decode(dec, 4, 0, &sink, NULL, 0))
			_exit(16);
		if (ec_shard_finish(&dst, NULL, 0))
			_exit(17);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
#endif
}

static void assert_same_file(int a, int b)
{
	struct stat sa, sb;
	uint8_t *x, *y;

	assert_int_equal(fstat(a, &sa), 0);
	assert_int_equal(fstat(b, &sb), 0);
	assert_int_equal(sa.st_size, sb.st_size);
	x = malloc((size_t)sa.st_size + 1);
	y = malloc((size_t)sb.st_size + 1);
	assert_int_equal(pread(a, x, (size_t)sa.st_size, 0), sa.st_size);
	assert_int_equal(pread(b, y, (size_t)sb.st_size, 0), sb.st_size);
	assert_memory_equal(x, y, (size_t)sa.st_size);
	free(x);
	free(y);
}

/* Incremental parity: the data fragments of a codeword folded in one at a
 * time, in reverse order, one of them through a pipe from another process
 * (as from a socket), give the very parity fragments ec_encode wrote. A
 * fragment of another codeword or one added twice is refused and changes
 * nothing; a missing one is -ENODATA; a corrupt payload spoils the encoder
 * for good. */
static void test_incremental_encode(void **state)
{
	struct group G;
	const struct ecplan_group *pg;
	struct ec_geom g;
	struct ec_enc *e = NULL;
	char err[200];
	int out[2], in[4], stranger, pfd[2], status;
	unsigned cw = 2;
	pid_t pid;

	group_build(&G, *state, 4, 2, EC_SEG_MIN, NULL, 0);
	pg = &G.plan->g[0];
	geom_of(&G, cw, &g);
	for (unsigned j = 0; j < 4; j++)
		in[j] = open_frag(&G, pg, cw, j, O_RDONLY);
	stranger = open_frag(&G, pg, cw + 1, 0, O_RDONLY);
	out[0] = open_file(G.t->fd, "inc0", O_RDWR | O_CREAT | O_TRUNC);
	out[1] = open_file(G.t->fd, "inc1", O_RDWR | O_CREAT | O_TRUNC);
	assert_int_equal(ec_enc_open(&g, 0, 2, out, &e), 0);
	for (int j = 3; j >= 1; j--)
		assert_int_equal(ec_enc_add(e, in[j], err, sizeof err), 0);
	/* a holder that dies here leaves parity files no reader accepts */
	assert_int_equal(ec_frag_info(out[0], NULL, NULL, err, sizeof err), -EBADMSG);
	assert_string_equal(err, "fragment 4: trailer CRC32C mismatch");
	assert_int_equal(ec_frag_verify(out[1], NULL, NULL, err, sizeof err), -EBADMSG);
	assert_int_equal(ec_enc_finish(e, err, sizeof err), -ENODATA);
	assert_string_equal(err, "data fragment 0 was not added");
	assert_int_equal(ec_enc_add(e, stranger, err, sizeof err), -EBADMSG);
	assert_string_equal(err, "data fragment 0: from another codeword");
	assert_int_equal(lseek(in[2], 0, SEEK_SET), 0);
	assert_int_equal(ec_enc_add(e, in[2], err, sizeof err), -EBADMSG);
	assert_string_equal(err, "data fragment 2: added twice");
	/* member 0 from a pipe, written by a child from node's shard */
	assert_int_equal(pipe(pfd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		unsigned r = (unsigned)pg->unit[ecplan_slot_pos(pg, cw, 0)];
		struct ec_shard src = { G.shard[r], G.mf[r] };
		close(pfd[0]);
		_exit(ec_frag_data(&g, 0, &src, pfd[1], NULL, 0) ? 1 : 0);
	}
	close(pfd[1]);
	assert_int_equal(ec_enc_add(e, pfd[0], err, sizeof err), 0);
	close(pfd[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(ec_enc_finish(e, err, sizeof err), 0);
	for (unsigned j = 0; j < 2; j++) {
		int orig = open_frag(&G, pg, cw, 4 + j, O_RDONLY);
		unsigned idx = 0;
		assert_same_file(out[j], orig);
		assert_int_equal(ec_frag_verify(out[j], NULL, &idx, err, sizeof err), 0);
		assert_int_equal(idx, 4 + j);
		close(orig);
	}
	ec_enc_free(e);
	/* two holders, one slot each, as the plan places them: the same bytes */
	for (unsigned j = 0; j < 2; j++) {
		int orig = open_frag(&G, pg, cw, 4 + j, O_RDONLY);
		int one = open_file(G.t->fd, "one", O_RDWR | O_CREAT | O_TRUNC);
		assert_int_equal(ec_enc_open(&g, j, 1, &one, &e), 0);
		for (unsigned d = 0; d < 4; d++) {
			assert_int_equal(lseek(in[d], 0, SEEK_SET), 0);
			assert_int_equal(ec_enc_add(e, in[d], err, sizeof err), 0);
		}
		assert_int_equal(ec_enc_finish(e, err, sizeof err), 0);
		assert_same_file(one, orig);
		ec_enc_free(e);
		close(one);
		close(orig);
	}
	assert_int_equal(ec_enc_open(&g, 1, 2, out, &e), -EINVAL);
	assert_int_equal(ec_enc_open(&g, 2, 1, out, &e), -EINVAL);
	assert_int_equal(ec_enc_open(&g, 0, 0, out, &e), -EINVAL);
	/* a corrupt payload: failed, and stays failed */
	{
		uint8_t b;
		int fd = open_frag(&G, pg, cw, 1, O_RDWR);
		assert_int_equal(pread(fd, &b, 1, EC_HDR_LEN(4) + 3), 1);
		b ^= 4;
		assert_int_equal(pwrite(fd, &b, 1, EC_HDR_LEN(4) + 3), 1);
		close(fd);
	}
	assert_int_equal(ec_enc_open(&g, 0, 2, out, &e), 0);
	assert_int_equal(lseek(in[1], 0, SEEK_SET), 0);
	assert_int_equal(ec_enc_add(e, in[1], err, sizeof err), -EBADMSG);
	assert_string_equal(err, "data fragment 1: payload CRC32C mismatch");
	assert_int_equal(lseek(in[0], 0, SEEK_SET), 0);
	assert_int_equal(ec_enc_add(e, in[0], err, sizeof err), -EBADMSG);
	assert_int_equal(ec_enc_finish(e, err, sizeof err), -EBADMSG);
	ec_enc_free(e);
	ec_enc_free(NULL);
	close_all(in, 4);
	close_all(out, 2);
	close(stranger);
	group_free(&G);
}

/* The RAM figure: each node holds its own shard S plus M parity fragments
 * of about S / K, measured as the bytes of the files on disk, within the
 * (1 + M/K) x S goal plus the fragments' headers; ecplan_ram_bytes()
 * predicts it to the byte. Replication with one peer would hold 2 S. */
static void test_ram_figure(void **state)
{
	static const unsigned km[][2] = { { 4, 1 }, { 4, 2 } };

	for (size_t c = 0; c < sizeof km / sizeof km[0]; c++) {
		unsigned k = km[c][0], m = km[c][1];
		struct group G;
		char name[64];
		int v[EC_MAX_N];
		for (unsigned r = 0; r < k + m; r++)
			v[r] = 2;
		group_build(&G, *state, k, m, 65536, v, 0);
		for (unsigned r = 0; r < G.n; r++) {
			uint64_t held = G.size[r], bound;
			for (unsigned j = 0; j < m; j++) {
				struct stat st;
				unsigned cw = ecplan_parity_cw(&G.plan->g[0], (unsigned)G.plan->pos[r], j);
				frag_name(name, sizeof name, cw, k + j);
				assert_int_equal(fstatat(G.node[r], name, &st, 0), 0);
				held += (uint64_t)st.st_size;
			}
			assert_int_equal(held, ecplan_ram_bytes(G.plan, (int)r, G.size));
			/* S of the largest shard in the group: the pieces are padded
			 * to the longest member */
			bound = 0;
			for (unsigned q = 0; q < G.n; q++)
				bound = G.size[q] > bound ? G.size[q] : bound;
			/* pieces round up to 4 KiB: + M x (4 KiB + header + trailer) */
			assert_true(held * k <= (uint64_t)(k + m) * bound +
						(uint64_t)k * m * (4096 + EC_HDR_LEN(k) + EC_TRL_LEN(k)));
			assert_true(held < 2 * G.size[r]);
		}
		group_free(&G);
		for (unsigned r = 0; r < k + m; r++) {
			snprintf(name, sizeof name, "node%u", r);
			assert_int_equal(util_rmtree_at((*(struct tmp **)state)->fd, name, NULL), 0);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_redundancy),
		cmocka_unit_test(test_split),
		cmocka_unit_test_setup_teardown(test_rs_1_1, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_2_1, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_4_1, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_4_2, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_3_3, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_6_2_big, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_mixed_sizes, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_random, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_fragment, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rebuild_parity, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_incremental_encode, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_frag_damage, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_frag_huge_length, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_frag_huge_segment, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_encode_k_from_caller, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_bounded_memory, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_lost_during_encoding, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_ram_figure, tmp_setup, tmp_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
