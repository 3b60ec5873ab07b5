/* Unit tests for the engine's pieces without Python: the data server
 * (cluster/engine_data.c) answering pushes over a socketpair() and fetches
 * from the peer tier over loopback, and tier_obtain() (tiers/tier.h) over
 * the RAM, peer and bucket tiers (an in-memory bucket): bytes restored
 * equal bytes sealed, a corrupt or failing source is refused and the next
 * one is used, nothing is left staged after a failure; the peer tier's put
 * (replication). Each test runs in a private directory holding
 * the nodes' RAMDIRs; a "holder" is a node's RAM tier with its data
 * server on 127.0.0.1 (a struct eng of just what the server reads). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster/engine_int.h"
#include "tiers/restore.h"
#include "tiers/tier.h"
#include "tiers/xfer.h"

#define TESTTMP_NAME "engine"
#include "tests/unit/testtmp.h"
#include "tests/unit/tier_fault.h"
#include "tests/unit/mem_bucket.h"
#include "tiers/backup.h"

#define BIG_SIZE (300u << 10)      /* more than one socket buffer */

struct holder {
	struct ram_tier *ram;
	struct eng *e;
	struct nsrv *srv;
	char addr[64];
};

static void holder_start(struct tmp *tmp, const char *name, int rank, bool serve, struct holder *h)
{
	char dir[PATH_MAX + 16];

	memset(h, 0, sizeof(*h));
	snprintf(dir, sizeof(dir), "%s/%s", tmp->path, name);
	assert_int_equal(mkdir(dir, 0755), 0);
	assert_int_equal(ram_open(dir, 64 << 20, &h->ram), 0);
	h->e = calloc(1, sizeof(*h->e));
	assert_non_null(h->e);
	h->e->ram = h->ram;
	assert_int_equal(jobid_new(&h->e->jid), 0);
	jobid_set_rank(h->e->jid, rank);
	pthread_mutex_init(&h->e->mu, NULL);
	if (!serve)
		return;
	assert_int_equal(nsrv_start("127.0.0.1:0", rank, NULL, &eng_srv_ops, h->e, &h->srv), 0);
	h->e->srv = h->srv;
	snprintf(h->addr, sizeof(h->addr), "127.0.0.1:%d", nsrv_port(h->srv));
}

static void holder_stop(struct holder *h)
{
	nsrv_stop(h->srv);
	pthread_mutex_destroy(&h->e->mu);
	jobid_free(h->e->jid);
	free(h->e);
	ram_close(h->ram);
}

static void key_of(struct shard_key *k, uint64_t step, uint32_t rank)
{
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", "job");
	k->step = step;
	k->rank = rank;
}

static void put_bytes(int dirfd, const char *name, const void *p, size_t len)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

/* The bytes of file "big" of every shard: a pattern no two offsets share
 * within 251 bytes, so that a byte in the wrong place shows. */
static uint8_t *big_bytes(void)
{
	uint8_t *b = malloc(BIG_SIZE);
	assert_non_null(b);
	for (size_t i = 0; i < BIG_SIZE; i++)
		b[i] = (uint8_t)(i % 251);
	return b;
}

/* Seal shard k on h from a step directory {a, sub/b, big, name} made in its
 * namespace; *mf (optional) gets the manifest. */
static void seal(struct holder *h, const struct shard_key *k, uint32_t flags, struct manifest **mf)
{
	int ns = ram_ns_fd(h->ram), fd, sub;
	uint8_t *big = big_bytes();
	char name[32];
	struct manifest *m = NULL;

	if (k->worker)
		snprintf(name, sizeof(name), "s%llu-n%u-w%u", (unsigned long long)k->step, k->rank,
			 k->worker);
	else
		snprintf(name, sizeof(name), "s%llu-n%u", (unsigned long long)k->step, k->rank);
	assert_int_equal(mkdirat(ns, name, 0755), 0);
	fd = openat(ns, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	put_bytes(fd, "a", "alpha", 5);
	assert_int_equal(mkdirat(fd, "sub", 0755), 0);
	sub = openat(fd, "sub", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(sub >= 0);
	put_bytes(sub, "b", "bravo-bravo", 11);
	close(sub);
	put_bytes(fd, "big", big, BIG_SIZE);
	put_bytes(fd, "name", name, strlen(name));   /* no two shards alike */
	free(big);
	assert_int_equal(ram_seal(h->ram, k, fd, 1, flags, &m, NULL, 0), 0);
	close(fd);
	if (mf)
		*mf = m;
	else
		mf_free(m);
}

/* Whole content of file rel of shard k on h, malloc'd; *len its size. */
static uint8_t *shard_file(struct holder *h, const struct shard_key *k, const char *rel,
			   size_t *len)
{
	int dfd = ram_shard_open(h->ram, k), fd;
	struct stat sb;
	uint8_t *p;

	assert_true(dfd >= 0);
	fd = openat(dfd, rel, O_RDONLY | O_CLOEXEC);
	close(dfd);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	p = malloc((size_t)sb.st_size + 1);
	assert_non_null(p);
	assert_int_equal(pread(fd, p, (size_t)sb.st_size, 0), sb.st_size);
	close(fd);
	*len = (size_t)sb.st_size;
	return p;
}

/* Shard k on h is committed, restored and own, with exactly the sealed
 * bytes. */
static void assert_restored(struct holder *h, const struct shard_key *k, const uint8_t hash[32])
{
	struct shard_rec rec = { 0 };
	uint8_t *big = big_bytes(), *p;
	size_t len;

	assert_int_equal(idx_get_shard(ram_idx(h->ram), k, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	assert_int_equal(rec.flags & (SHF_OWN | SHF_RESTORED), SHF_OWN | SHF_RESTORED);
	assert_memory_equal(rec.hash, hash, 32);
	idx_rec_clear(&rec);
	p = shard_file(h, k, "a", &len);
	assert_int_equal(len, 5);
	assert_memory_equal(p, "alpha", 5);
	free(p);
	p = shard_file(h, k, "sub/b", &len);
	assert_int_equal(len, 11);
	assert_memory_equal(p, "bravo-bravo", 11);
	free(p);
	p = shard_file(h, k, "big", &len);
	assert_int_equal(len, BIG_SIZE);
	assert_memory_equal(p, big, BIG_SIZE);
	free(p);
	free(big);
}

/* Nothing of job under h's shards/ (no record, no staging directory). */
static void assert_nothing_staged(struct holder *h, const struct shard_key *k)
{
	struct shard_rec rec = { 0 };
	struct stat sb;
	char path[PATH_MAX];

	assert_int_equal(idx_get_shard(ram_idx(h->ram), k, &rec), -ENOENT);
	snprintf(path, sizeof(path), "%s/shards/%s", ram_path(h->ram), k->job);
	assert_int_equal(stat(path, &sb), -1);
}

/* Flip one byte in the middle of "big" of shard k on h (same size). */
static void corrupt(struct holder *h, const struct shard_key *k)
{
	int dfd = ram_shard_open(h->ram, k), fd;
	uint8_t c;

	assert_true(dfd >= 0);
	fd = openat(dfd, "big", O_RDWR | O_CLOEXEC);
	close(dfd);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &c, 1, BIG_SIZE / 2), 1);
	c ^= 0x55;
	assert_int_equal(pwrite(fd, &c, 1, BIG_SIZE / 2), 1);
	close(fd);
}

static void get_of(struct tier_get *g, struct holder *to, const struct shard_key *want,
		   const struct shard_key *as, const uint8_t *hash)
{
	memset(g, 0, sizeof(*g));
	g->ram = to->ram;
	g->want = *want;
	g->as = *as;
	g->hash = hash;
}

/* Node 0 (a, serving) holds a replica of node 1's (b's) shard k of step;
 * *mf (optional) its manifest. */
static void replica_pair(struct tmp *tmp, uint64_t step, struct holder *a, struct holder *b,
			 struct shard_key *k, struct manifest **mf)
{
	holder_start(tmp, "a", 0, true, a);
	holder_start(tmp, "b", 1, false, b);
	key_of(k, step, 1);
	seal(a, k, 0, mf);
}

/* A replica of node 1's shard on node 0, fetched by node 1 through the
 * peer tier: the data server's fetch, the CRC32C checks, the publish. */
static void test_peer_tier_fetches_shard(void **state)
{
	struct holder a, b;
	struct manifest *mf = NULL;
	struct shard_key k;
	struct tier t = { 0 }, *src = &t;
	struct tier_get g;
	char why[512] = "";

	replica_pair(*state, 5, &a, &b, &k, &mf);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &t), 0);
	assert_string_equal(tier_name(&t), "peer");
	get_of(&g, &b, &k, &k, mf->hash);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), 0);
	assert_restored(&b, &k, mf->hash);
	tier_close(&t);
	mf_free(mf);
	holder_stop(&a);
	holder_stop(&b);
}

/* A peer tier in a cut set fetches as any other until the set is cut;
 * then it fails with -ECANCELED before it connects, nothing staged. */
static void test_peer_tier_cut(void **state)
{
	struct holder a, b;
	struct manifest *mf = NULL;
	struct shard_key k, k2;
	struct tier t = { 0 }, *src = &t;
	struct tier_cut *cut = NULL;
	struct tier_get g;
	char why[512] = "";

	replica_pair(*state, 5, &a, &b, &k, &mf);
	assert_int_equal(tier_cut_new(&cut), 0);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &t), 0);
	tier_peer_cut_by(&t, cut);
	get_of(&g, &b, &k, &k, mf->hash);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), 0);
	assert_restored(&b, &k, mf->hash);
	mf_free(mf);
	mf = NULL;
	key_of(&k2, 6, 1);
	seal(&a, &k2, 0, &mf);
	tier_cut_all(cut);
	get_of(&g, &b, &k2, &k2, mf->hash);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), -ECANCELED);
	{
		struct shard_rec rec = { 0 };
		struct stat sb;
		char path[PATH_MAX];

		assert_int_equal(idx_get_shard(ram_idx(b.ram), &k2, &rec), -ENOENT);
		snprintf(path, sizeof(path), "%s/shards/%s/6", ram_path(b.ram), k2.job);
		assert_int_equal(stat(path, &sb), -1);   /* nothing staged */
	}
	tier_close(&t);
	tier_cut_free(cut);
	mf_free(mf);
	holder_stop(&a);
	holder_stop(&b);
}

/* A copy whose bytes changed on its holder fails its CRC32C on the way;
 * alone it is an error with nothing left behind; as the first of two
 * sources the second one's copy is restored. */
static void test_peer_tier_corrupt_copy_falls_back(void **state)
{
	struct holder a, c, b;
	struct manifest *mf = NULL;
	struct shard_key k;
	struct tier ta = { 0 }, tc = { 0 };
	struct tier *both[2] = { &ta, &tc }, *one = &ta;
	struct tier_get g;
	char why[512] = "";

	holder_start(*state, "a", 0, true, &a);
	holder_start(*state, "c", 2, true, &c);
	holder_start(*state, "b", 1, false, &b);
	key_of(&k, 7, 1);
	seal(&a, &k, 0, &mf);
	mf_free(mf);
	seal(&c, &k, 0, &mf);
	corrupt(&a, &k);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &ta), 0);
	assert_int_equal(tier_peer_open(c.addr, 2, 1, NULL, &tc), 0);

	get_of(&g, &b, &k, &k, mf->hash);
	assert_int_equal(tier_obtain(&one, 1, &g, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "big: crc32c"));
	assert_nothing_staged(&b, &k);

	why[0] = '\0';
	assert_int_equal(tier_obtain(both, 2, &g, why, sizeof(why)), 0);
	assert_restored(&b, &k, mf->hash);
	tier_close(&ta);
	tier_close(&tc);
	mf_free(mf);
	holder_stop(&a);
	holder_stop(&c);
	holder_stop(&b);
}

/* The holder's manifest must be the one the plan names. */
static void test_peer_tier_refuses_other_manifest(void **state)
{
	struct holder a, b;
	struct shard_key k;
	struct tier t = { 0 }, *src = &t;
	struct tier_get g;
	uint8_t other[32] = { 1 };
	char why[512] = "";

	replica_pair(*state, 5, &a, &b, &k, NULL);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &t), 0);
	get_of(&g, &b, &k, &k, other);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), -EBADMSG);
	assert_string_equal(why, "rank 0 sent a manifest that does not match the plan");
	assert_nothing_staged(&b, &k);
	tier_close(&t);
	holder_stop(&a);
	holder_stop(&b);
}

/* A source that fails (the fault wrapper's first get) is passed over
 * without the inner tier being asked; when every source fails the last
 * error comes back and nothing is published. */
static void test_obtain_falls_back_from_failing_tier(void **state)
{
	struct holder a, b;
	struct manifest *mf = NULL;
	struct shard_key k;
	struct tier_fault f = { .fail_nth = 1, .fail_rc = -EIO };
	struct tier tf, tp = { 0 };
	struct tier *srcs[2] = { &tf, &tp };
	struct tier_get g;
	char why[512] = "";

	replica_pair(*state, 9, &a, &b, &k, &mf);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &f.inner), 0);
	assert_int_equal(tier_peer_open(a.addr, 0, 1, NULL, &tp), 0);
	tier_fault_init(&f, &tf);
	get_of(&g, &b, &k, &k, mf->hash);

	assert_int_equal(tier_obtain(srcs, 1, &g, why, sizeof(why)), -EIO);
	assert_string_equal(why, "injected failure of get 1");
	assert_int_equal(f.inner_calls, 0);
	assert_nothing_staged(&b, &k);

	f.calls = 0;
	assert_int_equal(tier_obtain(srcs, 2, &g, why, sizeof(why)), 0);
	assert_int_equal(f.calls, 1);
	assert_int_equal(f.inner_calls, 0);
	assert_restored(&b, &k, mf->hash);

	/* the wrapper passes the second get through to its inner tier */
	assert_int_equal(tier_obtain(srcs, 1, &g, why, sizeof(why)), 0);
	assert_int_equal(f.inner_calls, 1);
	assert_restored(&b, &k, mf->hash);
	tier_close(&f.inner);
	tier_close(&tp);
	mf_free(mf);
	holder_stop(&a);
	holder_stop(&b);
}

/* The RAM tier: this node's own copy is taken in place (flags only), a
 * column mate's copy is linked under this node's key, and a copy that
 * fails verification is refused and marked bad. */
static void test_ram_tier(void **state)
{
	struct holder a;
	struct manifest *mf = NULL;
	struct shard_key own, mate, bad;
	struct shard_rec rec = { 0 };
	struct tier t, *src = &t;
	struct tier_get g;
	struct stat s1, s2;
	char why[512] = "";
	int d1, d2;

	holder_start(*state, "a", 0, false, &a);
	tier_ram_init(a.ram, &t);
	assert_string_equal(tier_name(&t), "local");
	key_of(&own, 3, 0);
	seal(&a, &own, SHF_OWN, &mf);

	get_of(&g, &a, &own, &own, NULL);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), 0);
	assert_restored(&a, &own, mf->hash);

	key_of(&mate, 3, 2);
	get_of(&g, &a, &own, &mate, NULL);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), 0);
	assert_restored(&a, &mate, mf->hash);
	/* linked, not copied */
	d1 = ram_shard_open(a.ram, &own);
	d2 = ram_shard_open(a.ram, &mate);
	assert_int_equal(fstatat(d1, "big", &s1, 0), 0);
	assert_int_equal(fstatat(d2, "big", &s2, 0), 0);
	assert_int_equal(s1.st_ino, s2.st_ino);
	close(d1);
	close(d2);

	key_of(&bad, 4, 0);
	mf_free(mf);
	seal(&a, &bad, SHF_OWN, &mf);
	corrupt(&a, &bad);
	get_of(&g, &a, &bad, &bad, NULL);
	assert_int_equal(tier_obtain(&src, 1, &g, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "local copy of node 0's shard fails verification"));
	assert_int_equal(idx_get_shard(ram_idx(a.ram), &bad, &rec), 0);
	assert_int_equal(rec.state, SH_BAD);
	idx_rec_clear(&rec);
	mf_free(mf);
	holder_stop(&a);
}

/* The bucket tier: a shard put into a backup in the in-memory bucket
 * comes back byte for byte; put without its data (another node of the
 * column uploads them) leaves a backup it cannot come back from alone; a
 * data object whose bytes changed in the bucket fails its CRC32C and the
 * next source (a peer holding the shard) is used. */
static void test_bucket_tier_restores_backup(void **state)
{
	static const char backup[] = "2026-12-01_16-30";
	struct holder owner, b, c;
	struct manifest *mf = NULL;
	struct bkt *bk = NULL;
	struct shard_key k;
	struct shard_rec rec = { 0 };
	struct tier tb, tp = { 0 }, put = { 0 };
	struct tier *both[2] = { &tb, &tp }, *one = &tb;
	struct tier_get g;
	char why[512] = "";

	holder_start(*state, "owner", 1, true, &owner);
	holder_start(*state, "b", 1, false, &b);
	holder_start(*state, "c", 1, false, &c);
	key_of(&k, 13, 1);
	seal(&owner, &k, SHF_OWN, &mf);
	assert_int_equal(bkt_open("mem://unit", NULL, &bk), 0);
	assert_int_equal(idx_get_shard(ram_idx(owner.ram), &k, &rec), 0);
	assert_int_equal(tier_bucket_backup_open(bk, "job", backup, true, &put), 0);
	assert_int_equal(tier_put(&put, owner.ram, &k, rec.mf, rec.mflen, mf), 0);
	tier_close(&put);
	assert_int_equal(tier_bucket_backup_open(bk, "job", "2026-12-01_16-31", false, &put), 0);
	assert_int_equal(tier_put(&put, owner.ram, &k, rec.mf, rec.mflen, mf), 0);
	tier_close(&put);
	idx_rec_clear(&rec);

	tier_bucket_init(bk, &tb);
	assert_string_equal(tier_name(&tb), "bucket");
	get_of(&g, &b, &k, &k, NULL);
	g.backup = backup;
	g.workers_per_node = 1;
	assert_int_equal(tier_obtain(&one, 1, &g, why, sizeof(why)), 0);
	assert_false(g.whole);
	assert_restored(&b, &k, mf->hash);

	g.backup = "2026-12-01_16-31";
	g.ram = c.ram;
	assert_int_equal(tier_obtain(&one, 1, &g, why, sizeof(why)), -ENOENT);
	assert_nothing_staged(&c, &k);
	g.backup = backup;

	assert_int_equal(mem_bucket_corrupt(".data/big", BIG_SIZE / 2), 1);
	g.ram = c.ram;
	assert_int_equal(tier_obtain(&one, 1, &g, why, sizeof(why)), -EBADMSG);
	assert_memory_equal(why, "backup 2026-12-01_16-30: ", strlen("backup 2026-12-01_16-30: "));
	assert_nothing_staged(&c, &k);

	assert_int_equal(tier_peer_open(owner.addr, 1, 1, NULL, &tp), 0);
	g.hash = mf->hash;
	assert_int_equal(tier_obtain(both, 2, &g, why, sizeof(why)), 0);
	assert_restored(&c, &k, mf->hash);
	tier_close(&tp);
	bkt_close(bk);
	mf_free(mf);
	holder_stop(&owner);
	holder_stop(&b);
	holder_stop(&c);
}

/* Replication's way out: the peer tier's put pushes a shard to the
 * peer's data server, which keeps it as a replica; a second put finds it
 * there (TIER_HAD); a put the wrapper fails never reaches the peer; a
 * replica the peer refuses while its files are still coming (a file
 * failing its CRC32C) fails with the peer's reason, not with the broken
 * pipe of the files that were still to go. */
static void test_peer_tier_put(void **state)
{
	struct holder owner, to;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	struct tier_fault f = { .fail_nth = 1, .fail_rc = -EIO };
	struct tier tf;
	uint8_t *big = big_bytes(), *p;
	size_t len;

	holder_start(*state, "owner", 1, false, &owner);
	holder_start(*state, "to", 0, true, &to);
	key_of(&k, 21, 1);
	seal(&owner, &k, SHF_OWN, &mf);
	assert_int_equal(idx_get_shard(ram_idx(owner.ram), &k, &rec), 0);
	assert_int_equal(tier_peer_open(to.addr, 0, 1, NULL, &f.inner), 0);
	tier_fault_init(&f, &tf);

	assert_int_equal(tier_put(&tf, owner.ram, &k, rec.mf, rec.mflen, mf), -EIO);
	assert_int_equal(f.inner_calls, 0);
	assert_int_equal(idx_get_shard(ram_idx(to.ram), &k, &(struct shard_rec){ 0 }), -ENOENT);

	assert_int_equal(tier_put(&tf, owner.ram, &k, rec.mf, rec.mflen, mf), 0);
	p = shard_file(&to, &k, "big", &len);
	assert_int_equal(len, BIG_SIZE);
	assert_memory_equal(p, big, BIG_SIZE);
	free(p);
	assert_int_equal(tier_put(&tf, owner.ram, &k, rec.mf, rec.mflen, mf), TIER_HAD);
	assert_int_equal(f.inner_calls, 2);

	{
		struct shard_key k2;
		struct shard_rec r2 = { 0 };
		struct manifest *m2 = NULL;
		int dfd, fd;

		key_of(&k2, 22, 1);
		seal(&owner, &k2, SHF_OWN, &m2);
		dfd = ram_shard_open(owner.ram, &k2);
		fd = openat(dfd, "a", O_RDWR | O_CLOEXEC);   /* the first file sent */
		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, "A", 1, 0), 1);
		close(fd);
		close(dfd);
		assert_int_equal(idx_get_shard(ram_idx(owner.ram), &k2, &r2), 0);
		/* the race it was lost in came out either way: several tries */
		for (int i = 0; i < 20; i++)
			assert_int_equal(tier_put(&f.inner, owner.ram, &k2, r2.mf, r2.mflen, m2),
					 -EBADMSG);
		assert_int_equal(idx_get_shard(ram_idx(to.ram), &k2, &(struct shard_rec){ 0 }),
				 -ENOENT);
		idx_rec_clear(&r2);
		mf_free(m2);
	}

	/* the RAM tier takes no shards this way */
	{
		struct tier t;
		tier_ram_init(owner.ram, &t);
		assert_int_equal(tier_put(&t, owner.ram, &k, rec.mf, rec.mflen, mf), -EOPNOTSUPP);
	}
	idx_rec_clear(&rec);
	tier_close(&f.inner);
	free(big);
	mf_free(mf);
	holder_stop(&owner);
	holder_stop(&to);
}

/* A push names the rank it is for: a node that is another rank refuses it
 * with ESTALE and stores nothing (a sender's table older than a rank
 * change or a move); the rank it is, accepts it. */
static void test_push_for_another_rank_refused(void **state)
{
	struct holder owner, to;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	struct tier t;

	holder_start(*state, "owner", 1, false, &owner);
	holder_start(*state, "to", 2, true, &to);
	key_of(&k, 31, 1);
	seal(&owner, &k, SHF_OWN, &mf);
	assert_int_equal(idx_get_shard(ram_idx(owner.ram), &k, &rec), 0);

	assert_int_equal(tier_peer_open(to.addr, 3, 1, NULL, &t), 0);
	assert_int_equal(tier_put(&t, owner.ram, &k, rec.mf, rec.mflen, mf), -ESTALE);
	tier_close(&t);
	assert_int_equal(idx_get_shard(ram_idx(to.ram), &k, &(struct shard_rec){ 0 }), -ENOENT);

	/* a node without a rank yet (restarted, no replicator.yaml) is no rank */
	jobid_set_rank(to.e->jid, -1);
	assert_int_equal(tier_peer_open(to.addr, 2, 1, NULL, &t), 0);
	assert_int_equal(tier_put(&t, owner.ram, &k, rec.mf, rec.mflen, mf), -ESTALE);
	tier_close(&t);
	jobid_set_rank(to.e->jid, 2);

	assert_int_equal(tier_peer_open(to.addr, 2, 1, NULL, &t), 0);
	assert_int_equal(tier_put(&t, owner.ram, &k, rec.mf, rec.mflen, mf), 0);
	tier_close(&t);
	{
		struct shard_rec got = { 0 };
		assert_int_equal(idx_get_shard(ram_idx(to.ram), &k, &got), 0);
		idx_rec_clear(&got);
	}
	idx_rec_clear(&rec);
	mf_free(mf);
	holder_stop(&owner);
	holder_stop(&to);
}

/* ---- the data server's push handler over a socketpair ---- */

struct serve {
	struct eng *e;
	struct nconn *c;
	int peer;
};

static void *serve_one(void *arg)
{
	struct serve *s = arg;
	eng_srv_ops.on_data(s->e, s->c, s->peer);   /* closes s->c */
	return NULL;
}

/* A data connection to `to`'s data server from rank peer over a
 * socketpair: the server's side runs on_data on *thr; *cc is ours. */
static void pair_open(struct holder *to, int peer, struct serve *s, pthread_t *thr,
		      struct nconn **cc)
{
	int sv[2];

	s->e = to->e;
	s->peer = peer;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(nconn_from_fd(sv[0], NULL, peer, "pair", NULL, 0, NULL, NULL, &s->c), 0);
	assert_int_equal(nconn_from_fd(sv[1], NULL, eng_rank(to->e), "pair", NULL, 0, NULL, NULL, cc), 0);
	assert_int_equal(pthread_create(thr, NULL, serve_one, s), 0);
}

/* Push shard k of `from` to `to` as rank `peer` over a socketpair, as
 * replication does: 0 when the replica was accepted, else the -errno the
 * server answered. *sent: the files went (the server asked for them). */
static int push_pair(struct holder *from, struct holder *to, const struct shard_key *k, int peer,
		     bool *sent)
{
	struct serve s;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	struct nconn *cc = NULL;
	json_t *req, *resp = NULL;
	pthread_t thr;
	char *b64;
	int rc, src, dfd;

	*sent = false;
	pair_open(to, peer, &s, &thr, &cc);

	assert_int_equal(idx_get_shard(ram_idx(from->ram), k, &rec), 0);
	assert_int_equal(mf_decode(rec.mf, rec.mflen, &mf), 0);
	b64 = xfer_b64_encode(rec.mf, rec.mflen);
	req = json_pack("{s:s,s:o,s:s}", "op", "push", "key", xfer_key_json(k), "manifest", b64);
	free(b64);
	rc = nconn_call(cc, req, &resp, 10000);
	json_decref(req);
	if (rc == 0 && json_is_true(json_object_get(resp, "send"))) {
		struct net_hdr h;
		*sent = true;
		json_decref(resp);
		resp = NULL;
		dfd = ram_shard_open(from->ram, k);
		assert_true(dfd >= 0);
		src = xfer_send_files(cc, dfd, mf);
		close(dfd);
		/* a server that refuses a file may close before the last ones
		 * went: its answer is still there to read */
		rc = nconn_recv(cc, 10000, &h, &resp);
		if (rc == 0 && h.type == NT_ERROR)
			rc = net_error_errno(resp);
		else if (rc == 0 && src < 0)
			rc = src;
		else if (rc == 0 && !json_is_true(json_object_get(resp, "ok")))
			rc = -EPROTO;
	} else if (rc == 0 && !json_is_true(json_object_get(resp, "have"))) {
		rc = -EPROTO;
	}
	json_decref(resp);
	nconn_close(cc);
	assert_int_equal(pthread_join(thr, NULL), 0);
	mf_free(mf);
	idx_rec_clear(&rec);
	return rc;
}

static void test_serve_push_over_socketpair(void **state)
{
	struct holder owner, to;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k, k2;
	uint8_t *big = big_bytes(), *p;
	size_t len;
	bool sent;

	holder_start(*state, "owner", 1, false, &owner);
	holder_start(*state, "to", 0, false, &to);
	key_of(&k, 11, 1);
	seal(&owner, &k, SHF_OWN, &mf);

	/* the owner's push: files sent, checked, published as a replica */
	assert_int_equal(push_pair(&owner, &to, &k, 1, &sent), 0);
	assert_true(sent);
	assert_int_equal(idx_get_shard(ram_idx(to.ram), &k, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	assert_int_equal(rec.flags & SHF_OWN, 0);
	assert_memory_equal(rec.hash, mf->hash, 32);
	idx_rec_clear(&rec);
	p = shard_file(&to, &k, "big", &len);
	assert_int_equal(len, BIG_SIZE);
	assert_memory_equal(p, big, BIG_SIZE);
	free(p);

	/* again: already held, nothing sent */
	assert_int_equal(push_pair(&owner, &to, &k, 1, &sent), 0);
	assert_false(sent);

	/* only a shard's owner may push it, and never under the receiver's key */
	key_of(&k2, 12, 1);
	seal(&owner, &k2, SHF_OWN, NULL);
	assert_int_equal(push_pair(&owner, &to, &k2, 2, &sent), -EPERM);
	assert_false(sent);
	assert_int_equal(idx_get_shard(ram_idx(to.ram), &k2, &rec), -ENOENT);

	/* a replica whose bytes changed on the way is refused: nothing kept */
	corrupt(&owner, &k2);
	assert_int_equal(push_pair(&owner, &to, &k2, 1, &sent), -EBADMSG);
	assert_true(sent);
	assert_int_equal(idx_get_shard(ram_idx(to.ram), &k2, &rec), -ENOENT);

	free(big);
	mf_free(mf);
	holder_stop(&owner);
	holder_stop(&to);
}

/* One request on a socketpair data connection to h's server: rc and the
 * answer (*resp, the caller's). */
static int ask_pair(struct holder *h, json_t *req, json_t **resp)
{
	struct serve s;
	struct nconn *cc = NULL;
	pthread_t thr;
	int rc;

	pair_open(h, 1, &s, &thr, &cc);
	rc = nconn_call(cc, req, resp, 10000);
	nconn_close(cc);
	assert_int_equal(pthread_join(thr, NULL), 0);
	return rc;
}

/* The list request (mtcfs-admin's cluster view) names what the node holds
 * and its rank; an unknown request is ENOSYS. */
static void test_serve_list_and_unknown_op(void **state)
{
	struct holder h;
	struct shard_key own, rep;
	json_t *req, *resp = NULL, *shards, *x;
	size_t i;
	int found = 0;

	holder_start(*state, "h", 4, false, &h);
	key_of(&own, 30, 4);
	seal(&h, &own, SHF_OWN, NULL);
	key_of(&rep, 30, 2);
	seal(&h, &rep, 0, NULL);
	req = json_pack("{s:s,s:s}", "op", "list", "job", "job");
	assert_int_equal(ask_pair(&h, req, &resp), 0);
	json_decref(req);
	assert_int_equal(json_integer_value(json_object_get(resp, "rank")), 4);
	shards = json_object_get(resp, "shards");
	assert_int_equal(json_array_size(shards), 2);
	json_array_foreach(shards, i, x) {
		int owner = (int)json_integer_value(json_object_get(x, "owner"));
		assert_int_equal(json_integer_value(json_object_get(x, "step")), 30);
		assert_string_equal(json_string_value(json_object_get(x, "state")), "committed");
		assert_int_equal(json_is_true(json_object_get(x, "own")), owner == 4);
		found |= owner == 4 ? 1 : owner == 2 ? 2 : 4;
	}
	assert_int_equal(found, 3);
	json_decref(resp);
	resp = NULL;

	req = json_pack("{s:s}", "op", "frobnicate");
	assert_int_equal(ask_pair(&h, req, &resp), -ENOSYS);
	json_decref(req);
	json_decref(resp);
	holder_stop(&h);
}

/* ---------- restore_run() and a node's own round ---------- */

struct seen {
	char lines[8][800];
	int nlines;
	uint64_t pre[8];            /* steps prerestore saw (0: none) */
	int npre;
};

static void seen_report(void *arg, const char *line)
{
	struct seen *s = arg;

	if (s->nlines < 8)
		snprintf(s->lines[s->nlines++], sizeof(s->lines[0]), "%s", line);
}

static void seen_pre(void *arg, const struct restore_plan *p)
{
	struct seen *s = arg;

	if (s->npre < 8)
		s->pre[s->npre++] = p->found ? p->step : 0;
}

static uint32_t rec_flags(struct holder *h, const struct shard_key *k, enum shard_state *st)
{
	struct shard_rec rec = { 0 };
	uint32_t f;

	assert_int_equal(idx_get_shard(ram_idx(h->ram), k, &rec), 0);
	f = rec.flags;
	*st = rec.state;
	idx_rec_clear(&rec);
	return f;
}

/* A node on its own: the newest step is corrupt, so its round reports it,
 * marks it bad and restores the next older one, in place and verified;
 * prerestore saw both plans. A second round passes over the bad step with
 * the start-up words and plans the older one at once. */
static void test_restore_local_falls_back(void **state)
{
	struct holder a;
	struct shard_key k3, k4, k5;
	struct restore_plan p;
	struct seen s = { .nlines = 0 };
	enum shard_state st;

	holder_start(*state, "a", 0, false, &a);
	key_of(&k3, 3, 0);
	key_of(&k4, 4, 0);
	key_of(&k5, 5, 0);
	seal(&a, &k3, SHF_OWN, NULL);
	seal(&a, &k4, SHF_OWN, NULL);
	seal(&a, &k5, SHF_OWN, NULL);
	corrupt(&a, &k5);

	assert_int_equal(restore_local(a.ram, "job", 0, 1, seen_report, &s, seen_pre, &p), 0);
	assert_true(p.found);
	assert_int_equal(p.step, 4);
	assert_int_equal(p.source, RS_LOCAL);
	assert_int_equal(p.key.rank, 0);
	assert_int_equal(s.npre, 2);
	assert_int_equal(s.pre[0], 5);
	assert_int_equal(s.pre[1], 4);
	assert_int_equal(s.nlines, 1);
	assert_non_null(strstr(s.lines[0], "job job step 5 node 0: "));
	assert_non_null(strstr(s.lines[0], "fails verification"));
	rec_flags(&a, &k5, &st);
	assert_int_equal(st, SH_BAD);
	assert_true(rec_flags(&a, &k4, &st) & SHF_RESTORED);
	assert_false(rec_flags(&a, &k3, &st) & SHF_RESTORED);

	memset(&s, 0, sizeof(s));
	assert_int_equal(restore_local(a.ram, "job", 0, 1, seen_report, &s, seen_pre, &p), 0);
	assert_int_equal(p.step, 4);
	assert_int_equal(s.npre, 1);
	assert_int_equal(s.nlines, 1);
	assert_non_null(strstr(s.lines[0], "step 5 node 0: its files no longer match"));

	/* another rank's shards are not this node's: nothing to restore */
	memset(&s, 0, sizeof(s));
	assert_int_equal(restore_local(a.ram, "job", 1, 1, seen_report, &s, seen_pre, &p), 0);
	assert_false(p.found);
	assert_int_equal(s.npre, 1);
	assert_int_equal(s.pre[0], 0);
	holder_stop(&a);
}

/* One shard per worker (framework: pytorch, 2 workers): a step needs
 * worker 0's shard (a step directory of worker 0's alone counts whole);
 * a step only worker 1 saved is passed over, and a corrupt worker 1 shard
 * sends the round to the older step, naming the worker. */
static void test_restore_local_workers(void **state)
{
	struct holder a;
	struct shard_key k;
	struct restore_plan p;
	struct seen s = { .nlines = 0 };
	enum shard_state st;

	holder_start(*state, "a", 0, false, &a);
	for (uint64_t step = 1; step <= 3; step++) {
		key_of(&k, step, 0);
		if (step != 3)
			seal(&a, &k, SHF_OWN, NULL);
		k.worker = 1;
		seal(&a, &k, SHF_OWN, NULL);
	}
	assert_int_equal(restore_local(a.ram, "job", 0, 2, seen_report, &s, seen_pre, &p), 0);
	assert_int_equal(p.step, 2);
	assert_int_equal(s.nlines, 0);
	key_of(&k, 2, 0);
	k.worker = 1;
	assert_true(rec_flags(&a, &k, &st) & SHF_RESTORED);

	corrupt(&a, &k);
	memset(&s, 0, sizeof(s));
	assert_int_equal(restore_local(a.ram, "job", 0, 2, seen_report, &s, seen_pre, &p), 0);
	assert_int_equal(p.step, 1);
	assert_int_equal(s.nlines, 1);
	assert_non_null(strstr(s.lines[0], "step 2 node 0 worker 1: "));
	rec_flags(&a, &k, &st);
	assert_int_equal(st, SH_BAD);
	holder_stop(&a);
}

/* restore_run() with a planner of the test's: worker 1 is skipped, a
 * failing source asks for another plan with the failing worker and the
 * tier's words, a barrier that answers RESTORE_REPLAN runs the new plan,
 * and an error of an op ends the round with it. */
struct fake_pl {
	struct holder *h;
	uint64_t steps[4];          /* the plans, in order */
	int next;
	int failed_w, nfailed, nready;
	char why[512];
	int replan_at;              /* ready answers RESTORE_REPLAN for this plan */
	int fail_plan;              /* plan() fails with this (0: no) */
};

static void fake_next(struct fake_pl *f, struct restore_plan *p)
{
	memset(p, 0, sizeof(*p));
	if (!f->steps[f->next])
		return;
	p->found = true;
	p->step = f->steps[f->next++];
	p->source = RS_LOCAL;
	key_of(&p->key, p->step, 0);
}

static int fake_plan(void *arg, struct restore_plan *p)
{
	struct fake_pl *f = arg;

	if (f->fail_plan)
		return f->fail_plan;
	fake_next(f, p);
	return 0;
}

static int fake_source(void *arg, const struct restore_plan *p, uint32_t w, struct tier *t,
		       struct tier_get *g, char *why, size_t whylen)
{
	struct fake_pl *f = arg;

	(void)p;
	(void)why;
	(void)whylen;
	assert_int_equal(g->as.worker, w);
	assert_memory_equal(&g->want, &g->as, sizeof(g->as));
	if (w == 1)
		return RESTORE_SKIP;
	tier_ram_init(f->h->ram, t);
	return 0;
}

static int fake_failed(void *arg, struct restore_plan *p, uint32_t w, const char *why)
{
	struct fake_pl *f = arg;

	f->nfailed++;
	f->failed_w = (int)w;
	snprintf(f->why, sizeof(f->why), "%s", why);
	fake_next(f, p);
	return 0;
}

static int fake_ready(void *arg, struct restore_plan *p)
{
	struct fake_pl *f = arg;

	if (++f->nready == f->replan_at) {
		fake_next(f, p);
		return RESTORE_REPLAN;
	}
	return 0;
}

static void test_restore_run_planner(void **state)
{
	struct holder a;
	struct shard_key k;
	struct restore_plan p;
	struct fake_pl f = { 0 };
	struct restore_planner pl = {
		.arg = &f, .workers = 3, .plan = fake_plan, .source = fake_source,
		.failed = fake_failed, .ready = fake_ready,
	};
	enum shard_state st;

	holder_start(*state, "a", 0, false, &a);
	f.h = &a;
	pl.ram = a.ram;
	for (uint64_t step = 6; step <= 8; step++) {
		key_of(&k, step, 0);
		seal(&a, &k, SHF_OWN, NULL);
	}
	/* 9 is not held: its worker 0 fails; worker 2 of 8 is not held
	 * either; 7 passes its worker 0, skips 1, fails 2 ... so the test
	 * gives worker 2 a shard of 6 only */
	key_of(&k, 6, 0);
	k.worker = 2;
	seal(&a, &k, SHF_OWN, NULL);
	f.steps[0] = 9;
	f.steps[1] = 8;
	f.steps[2] = 6;
	assert_int_equal(restore_run(&pl, &p), 0);
	assert_int_equal(p.step, 6);
	assert_int_equal(f.nfailed, 2);
	assert_int_equal(f.failed_w, 2);   /* 8's worker 2: 9's worker 0 failed first */
	assert_non_null(strstr(f.why, "fails verification"));
	assert_int_equal(f.nready, 1);
	assert_true(rec_flags(&a, &k, &st) & SHF_RESTORED);

	/* the barrier sends the round to another plan */
	memset(&f, 0, sizeof(f));
	f.h = &a;
	f.steps[0] = 6;
	f.steps[1] = 7;
	f.replan_at = 1;
	pl.workers = 1;
	assert_int_equal(restore_run(&pl, &p), 0);
	assert_int_equal(p.step, 7);
	assert_int_equal(f.nready, 2);
	assert_int_equal(f.nfailed, 0);

	/* an op's error ends the round */
	f.fail_plan = -EIO;
	assert_int_equal(restore_run(&pl, &p), -EIO);
	holder_stop(&a);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);   /* a closed connection is an error, not a death */
	mem_bucket_install();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_peer_tier_fetches_shard, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_peer_tier_cut, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_peer_tier_corrupt_copy_falls_back, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_peer_tier_refuses_other_manifest, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_obtain_falls_back_from_failing_tier, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_ram_tier, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_restore_local_falls_back, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_restore_local_workers, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_restore_run_planner, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_peer_tier_put, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_push_for_another_rank_refused, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_bucket_tier_restores_backup, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_serve_push_over_socketpair, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_serve_list_and_unknown_op, tmp_setup,
						tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
