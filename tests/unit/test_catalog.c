/* Unit tests for tiers/catalog: an LMDB environment in a private directory
 * under /dev/shm (or /tmp). Shards round trip with their manifests, list in
 * (job, step, rank, worker) order with exact job filtering, state and flag
 * updates, meta values, and a read-only handle in a second process that
 * sees each commit and refuses every write. LMDB forbids opening one
 * environment twice in a process, hence the fork. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiers/catalog.h"
#include "tiers/manifest.h"

struct fx {
	char path[256];         /* private directory */
	char db[PATH_MAX];      /* path/db: the environment */
	struct idx *x;          /* read-write handle on db */
};

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static int fx_setup(void **state)
{
	static const char *const bases[] = { "/dev/shm", "/tmp" };
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(f->path, sizeof(f->path), "%s/mtcfs-test-catalog-XXXXXX", bases[i]);
		if (mkdtemp(f->path))
			break;
		f->path[0] = '\0';
	}
	if (!f->path[0]) {
		free(f);
		return -1;
	}
	snprintf(f->db, sizeof(f->db), "%s/db", f->path);
	if (idx_open(f->db, false, &f->x) != 0) {
		nftw(f->path, rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;
	int rc;

	if (!f)
		return 0;
	idx_close(f->x);
	rc = nftw(f->path, rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
	free(f);
	return rc;
}

static struct shard_key key(const char *job, uint64_t step, uint32_t rank, uint32_t worker)
{
	struct shard_key k;

	memset(&k, 0, sizeof(k));
	snprintf(k.job, sizeof(k.job), "%s", job);
	k.step = step;
	k.rank = rank;
	k.worker = worker;
	return k;
}

/* A record whose every field derives from its key and seed. */
static struct shard_rec rec_for(const struct shard_key *k, uint32_t seed)
{
	struct shard_rec r;

	memset(&r, 0, sizeof(r));
	r.key = *k;
	r.state = SH_COMMITTED;
	r.flags = SHF_OWN;
	for (int i = 0; i < 32; i++)
		r.hash[i] = (uint8_t)(seed * 31 + (uint32_t)i + (uint32_t)k->step);
	r.bytes = (uint64_t)seed << 33 | k->rank;
	r.nfiles = seed + k->worker;
	r.commit_time = 1700000000u + seed;
	r.ns_ino = k->step ^ seed;
	return r;
}

static void assert_rec_equal(const struct shard_rec *a, const struct shard_rec *b)
{
	assert_string_equal(a->key.job, b->key.job);
	assert_int_equal(a->key.step, b->key.step);
	assert_int_equal(a->key.rank, b->key.rank);
	assert_int_equal(a->key.worker, b->key.worker);
	assert_int_equal(a->state, b->state);
	assert_int_equal(a->flags, b->flags);
	assert_memory_equal(a->hash, b->hash, 32);
	assert_int_equal(a->bytes, b->bytes);
	assert_int_equal(a->nfiles, b->nfiles);
	assert_int_equal(a->commit_time, b->commit_time);
	assert_int_equal(a->ns_ino, b->ns_ino);
	assert_int_equal(a->mflen, b->mflen);
	if (a->mflen)
		assert_memory_equal(a->mf, b->mf, a->mflen);
	else
		assert_null(b->mf);
}

/* A real encoded manifest: one directory and one file in a fresh tree. */
static void real_manifest(const char *base, struct manifest **mp, uint8_t **buf, size_t *len)
{
	char dir[PATH_MAX];
	int dfd, fd;

	snprintf(dir, sizeof(dir), "%s/tree", base);
	assert_int_equal(mkdir(dir, 0755), 0);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	assert_int_equal(mkdirat(dfd, "sub", 0755), 0);
	fd = openat(dfd, "sub/data.bin", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "checkpoint bytes", 16), 16);
	close(fd);
	assert_int_equal(mf_build(dfd, mp), 0);
	close(dfd);
	assert_int_equal(mf_encode(*mp, buf, len), 0);
}

static void test_open_close(void **state)
{
	struct fx *f = *state;
	struct idx *x = (struct idx *)&x;
	char p[PATH_MAX + 16];
	struct stat st;

	assert_int_equal(stat(f->db, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	idx_close(NULL);
	/* read-only: a missing directory is an error, nothing is created */
	snprintf(p, sizeof(p), "%s/absent", f->path);
	assert_true(idx_open(p, true, &x) < 0);
	assert_ptr_equal(x, (struct idx *)&x);
	assert_int_equal(stat(p, &st), -1);
	/* read-write: a parent that does not exist is an error */
	snprintf(p, sizeof(p), "%s/no/such/parent", f->path);
	assert_true(idx_open(p, false, &x) < 0);
	assert_ptr_equal(x, (struct idx *)&x);

	assert_string_equal(shard_state_name(SH_SEALING), "sealing");
	assert_string_equal(shard_state_name(SH_COMMITTED), "committed");
	assert_string_equal(shard_state_name(SH_REPLICATED), "replicated");
	assert_string_equal(shard_state_name(SH_BACKED_UP), "backed-up");
	assert_string_equal(shard_state_name(SH_BAD), "bad");
	assert_string_equal(shard_state_name(0), "unknown");
	assert_string_equal(shard_state_name(SH_DROPPING), "dropping");
	assert_string_equal(shard_state_name(7), "unknown");
	assert_string_equal(shard_state_name(UINT32_MAX), "unknown");
}

static void test_put_get_del(void **state)
{
	struct fx *f = *state;
	struct shard_key k = key("llama", 1000, 3, 1);
	struct shard_key other = key("llama", 1000, 3, 2);
	struct shard_rec r = rec_for(&k, 7), got;
	struct manifest *m, *d = NULL;
	uint8_t *mf;
	size_t mflen;

	real_manifest(f->path, &m, &mf, &mflen);
	r.mf = mf;
	r.mflen = mflen;
	r.nfiles = m->nfiles;
	r.bytes = m->total;
	memcpy(r.hash, m->hash, 32);
	assert_int_equal(idx_put_shard(f->x, &r), 0);

	memset(&got, 0xa5, sizeof(got));
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_rec_equal(&r, &got);
	assert_ptr_not_equal(got.mf, mf);            /* a copy */
	assert_int_equal(mf_decode(got.mf, got.mflen, &d), 0);
	assert_memory_equal(d->hash, m->hash, 32);
	assert_int_equal(d->nfiles, 1);
	mf_free(d);
	idx_rec_clear(&got);
	assert_null(got.mf);
	assert_int_equal(got.mflen, 0);
	idx_rec_clear(&got);
	idx_rec_clear(NULL);

	/* neighbours of the key are absent */
	assert_int_equal(idx_get_shard(f->x, &other, &got), -ENOENT);
	other = key("llama", 1001, 3, 1);
	assert_int_equal(idx_get_shard(f->x, &other, &got), -ENOENT);
	other = key("llam", 1000, 3, 1);
	assert_int_equal(idx_get_shard(f->x, &other, &got), -ENOENT);
	other = key("llamas", 1000, 3, 1);
	assert_int_equal(idx_get_shard(f->x, &other, &got), -ENOENT);

	/* replace: sealing, no manifest yet */
	r = rec_for(&k, 9);
	r.state = SH_SEALING;
	assert_int_equal(idx_put_shard(f->x, &r), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_rec_equal(&r, &got);
	assert_null(got.mf);
	assert_int_equal(got.mflen, 0);
	idx_rec_clear(&got);

	/* and back to one with a manifest */
	r.mf = mf;
	r.mflen = mflen;
	assert_int_equal(idx_put_shard(f->x, &r), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_rec_equal(&r, &got);
	idx_rec_clear(&got);

	/* delete */
	assert_int_equal(idx_del_shard(f->x, &k), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), -ENOENT);
	assert_int_equal(idx_del_shard(f->x, &k), -ENOENT);
	assert_int_equal(idx_set_state(f->x, &k, SH_BAD, 0, 0), -ENOENT);

	free(mf);
	mf_free(m);
}

static void test_large_manifest_and_long_job(void **state)
{
	struct fx *f = *state;
	char job[IDX_JOB_MAX + 1];
	struct shard_key k;
	struct shard_rec r, got, *recs = NULL;
	size_t n = 0, big = 3u << 20;
	uint8_t *blob = malloc(big);

	assert_non_null(blob);
	for (size_t i = 0; i < big; i++)
		blob[i] = (uint8_t)(i * 2654435761u >> 13);
	memset(job, 'j', IDX_JOB_MAX);
	job[IDX_JOB_MAX] = '\0';
	k = key(job, UINT64_MAX, UINT32_MAX, UINT32_MAX);
	assert_int_equal(strlen(k.job), IDX_JOB_MAX);
	r = rec_for(&k, 1);
	r.mf = blob;
	r.mflen = big;
	assert_int_equal(idx_put_shard(f->x, &r), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_rec_equal(&r, &got);
	idx_rec_clear(&got);
	assert_int_equal(idx_list_shards(f->x, job, &recs, &n), 0);
	assert_int_equal(n, 1);
	assert_rec_equal(&r, &recs[0]);
	idx_recs_free(recs, n);
	free(blob);
}

static int cmp_key(const void *pa, const void *pb)
{
	const struct shard_key *a = pa, *b = pb;
	int c = strcmp(a->job, b->job);

	if (c)
		return c;
	if (a->step != b->step)
		return a->step < b->step ? -1 : 1;
	if (a->rank != b->rank)
		return a->rank < b->rank ? -1 : 1;
	if (a->worker != b->worker)
		return a->worker < b->worker ? -1 : 1;
	return 0;
}

static void check_list(struct idx *x, const char *job, const struct shard_key *sorted, size_t nk)
{
	struct shard_rec *recs = NULL;
	size_t n = SIZE_MAX, j = 0;

	assert_int_equal(idx_list_shards(x, job, &recs, &n), 0);
	for (size_t i = 0; i < nk; i++) {
		struct shard_rec want;
		if (job && strcmp(job, sorted[i].job))
			continue;
		if (j >= n) {
			print_error("list(%s): only %zu records\n", job ? job : "(all)", n);
			fail();
		}
		if (cmp_key(&recs[j].key, &sorted[i]) != 0) {
			print_error("list(%s)[%zu] = (%s, %llu, %u, %u), want (%s, %llu, %u, %u)\n",
				    job ? job : "(all)", j, recs[j].key.job,
				    (unsigned long long)recs[j].key.step, recs[j].key.rank,
				    recs[j].key.worker, sorted[i].job,
				    (unsigned long long)sorted[i].step, sorted[i].rank,
				    sorted[i].worker);
			fail();
		}
		want = rec_for(&sorted[i], (uint32_t)(sorted[i].step % 1000));
		assert_rec_equal(&want, &recs[j]);
		j++;
	}
	assert_int_equal(n, j);
	idx_recs_free(recs, n);
}

static void test_list_order(void **state)
{
	struct fx *f = *state;
	static const char *const jobs[] = { "ab", "a", "b", "a-b", "a0", "A" };
	static const uint64_t steps[] = {
		UINT64_MAX, 1, 0, 256, 255, 10, 2,
		(1ULL << 32) + 1, 1ULL << 32, (1ULL << 32) - 1, 1ULL << 63, (1ULL << 40) | 1,
	};
	static const uint32_t ranks[] = { 256, 0, 1, 65536, UINT32_MAX };
	static const uint32_t workers[] = { 1, 0, 0x01000000u };
	size_t nk = 0, cap = sizeof(jobs) / sizeof(jobs[0]) * 3 * 3 * 2 + 64;
	struct shard_key *keys = calloc(cap, sizeof(*keys));
	struct shard_rec *recs = NULL;
	size_t n = 1;
	uint64_t x = 88172645463325252ULL;

	assert_non_null(keys);
	/* an empty catalog lists nothing */
	assert_int_equal(idx_list_shards(f->x, NULL, &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);

	/* a pseudo-random sample of keys, inserted in that (unsorted) order */
	for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++) {
		for (int s = 0; s < 3 * 3 * 2; s++) {
			struct shard_key k;
			bool dup = false;
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			k = key(jobs[j], steps[x % (sizeof(steps) / sizeof(steps[0]))],
				ranks[(x >> 8) % (sizeof(ranks) / sizeof(ranks[0]))],
				workers[(x >> 16) % (sizeof(workers) / sizeof(workers[0]))]);
			for (size_t i = 0; i < nk; i++)
				dup = dup || cmp_key(&keys[i], &k) == 0;
			if (!dup)
				keys[nk++] = k;
		}
	}
	/* and the boundary neighbours, always */
	keys[nk++] = key("a", 1ULL << 32, 0, 0);
	keys[nk++] = key("a", (1ULL << 32) - 1, UINT32_MAX, UINT32_MAX);
	keys[nk++] = key("ab", 0, 0, 0);
	keys[nk++] = key("a", UINT64_MAX, UINT32_MAX, UINT32_MAX);
	keys[nk++] = key("a", 0, 0, 1);
	keys[nk++] = key("a", 0, 1, 0);
	keys[nk++] = key("a", 1, 0, 0);
	for (size_t i = 0; i < nk; i++) {
		bool dup = false;
		struct shard_rec r;
		for (size_t j = 0; j < i; j++)
			dup = dup || cmp_key(&keys[i], &keys[j]) == 0;
		if (dup) {
			keys[i--] = keys[--nk];
			continue;
		}
		r = rec_for(&keys[i], (uint32_t)(keys[i].step % 1000));
		assert_int_equal(idx_put_shard(f->x, &r), 0);
	}
	qsort(keys, nk, sizeof(*keys), cmp_key);

	check_list(f->x, NULL, keys, nk);
	for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++)
		check_list(f->x, jobs[j], keys, nk);
	/* prefixes and extensions of job names match nothing */
	assert_int_equal(idx_list_shards(f->x, "", &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);
	assert_int_equal(idx_list_shards(f->x, "abc", &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);
	assert_int_equal(idx_list_shards(f->x, "a-", &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);

	/* deleting all of "a" leaves "ab" whole */
	for (size_t i = 0; i < nk; i++)
		if (!strcmp(keys[i].job, "a"))
			assert_int_equal(idx_del_shard(f->x, &keys[i]), 0);
	assert_int_equal(idx_list_shards(f->x, "a", &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);
	check_list(f->x, "ab", keys, nk);
	free(keys);
}

static void test_set_state(void **state)
{
	struct fx *f = *state;
	struct shard_key k = key("job", 42, 0, 0);
	struct shard_key nb = key("job", 43, 0, 0);
	struct shard_rec r = rec_for(&k, 5), n2 = rec_for(&nb, 6), got;
	static uint8_t mf[300];

	for (size_t i = 0; i < sizeof(mf); i++)
		mf[i] = (uint8_t)(i ^ 0x5a);
	r.state = SH_SEALING;
	r.flags = SHF_OWN;
	r.mf = mf;
	r.mflen = sizeof(mf);
	assert_int_equal(idx_put_shard(f->x, &r), 0);
	assert_int_equal(idx_put_shard(f->x, &n2), 0);

	assert_int_equal(idx_set_state(f->x, &k, SH_COMMITTED, SHF_HIDDEN, 0), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_int_equal(got.state, SH_COMMITTED);
	assert_int_equal(got.flags, SHF_OWN | SHF_HIDDEN);
	/* everything else untouched, manifest included */
	r.state = SH_COMMITTED;
	r.flags = SHF_OWN | SHF_HIDDEN;
	assert_rec_equal(&r, &got);
	idx_rec_clear(&got);

	/* state 0 keeps the state; clear a flag, set another */
	assert_int_equal(idx_set_state(f->x, &k, 0, SHF_RESTORED, SHF_OWN), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_int_equal(got.state, SH_COMMITTED);
	assert_int_equal(got.flags, SHF_HIDDEN | SHF_RESTORED);
	idx_rec_clear(&got);

	/* a bit both set and cleared ends up clear */
	assert_int_equal(idx_set_state(f->x, &k, SH_REPLICATED, SHF_OWN, SHF_OWN | SHF_HIDDEN), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_int_equal(got.state, SH_REPLICATED);
	assert_int_equal(got.flags, SHF_RESTORED);
	idx_rec_clear(&got);

	/* clearing what is not set, setting what is: no change */
	assert_int_equal(idx_set_state(f->x, &k, SH_BAD, SHF_RESTORED, SHF_OWN), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	r.state = SH_BAD;
	r.flags = SHF_RESTORED;
	assert_rec_equal(&r, &got);
	idx_rec_clear(&got);

	/* the neighbour was never touched */
	assert_int_equal(idx_get_shard(f->x, &nb, &got), 0);
	assert_rec_equal(&n2, &got);
	idx_rec_clear(&got);
}

static void test_meta(void **state)
{
	struct fx *f = *state;
	static const char bin[] = { 'x', '\0', 'y', '\0' };
	void *v = NULL;
	size_t len = 0;

	assert_int_equal(idx_get_meta(f->x, "config", &v, &len), -ENOENT);
	assert_null(v);
	assert_int_equal(idx_put_meta(f->x, "config", "job: a\n", 7), 0);
	assert_int_equal(idx_get_meta(f->x, "config", &v, &len), 0);
	assert_int_equal(len, 7);
	assert_string_equal(v, "job: a\n");    /* NUL-terminated copy */
	free(v);
	/* replace, shorter */
	assert_int_equal(idx_put_meta(f->x, "config", "x", 1), 0);
	assert_int_equal(idx_get_meta(f->x, "config", &v, &len), 0);
	assert_int_equal(len, 1);
	assert_string_equal(v, "x");
	free(v);
	/* binary and empty values; names that prefix each other */
	assert_int_equal(idx_put_meta(f->x, "conf", bin, sizeof(bin)), 0);
	assert_int_equal(idx_put_meta(f->x, "configs", "", 0), 0);
	assert_int_equal(idx_get_meta(f->x, "conf", &v, &len), 0);
	assert_int_equal(len, sizeof(bin));
	assert_memory_equal(v, bin, sizeof(bin));
	assert_int_equal(((char *)v)[len], '\0');
	free(v);
	assert_int_equal(idx_get_meta(f->x, "configs", &v, &len), 0);
	assert_int_equal(len, 0);
	assert_int_equal(((char *)v)[0], '\0');
	free(v);
	assert_int_equal(idx_get_meta(f->x, "config", &v, &len), 0);
	assert_string_equal(v, "x");
	free(v);
	/* delete */
	assert_int_equal(idx_del_meta(f->x, "config"), 0);
	v = NULL;
	assert_int_equal(idx_get_meta(f->x, "config", &v, &len), -ENOENT);
	assert_null(v);
	assert_int_equal(idx_get_meta(f->x, "conf", &v, &len), 0);
	free(v);
	/* current behaviour: deleting a missing name succeeds (unlike shards) */
	assert_int_equal(idx_del_meta(f->x, "config"), 0);
	assert_int_equal(idx_del_meta(f->x, "never-set"), 0);
	/* meta names and shard keys live apart */
	assert_int_equal(idx_put_meta(f->x, "a", "1", 1), 0);
	{
		struct shard_rec *recs = NULL;
		size_t n = 1;
		assert_int_equal(idx_list_shards(f->x, NULL, &recs, &n), 0);
		assert_int_equal(n, 0);
		idx_recs_free(recs, n);
	}
}

static void test_reopen_persists(void **state)
{
	struct fx *f = *state;
	struct shard_key k = key("persist", 7, 1, 0);
	struct shard_rec r = rec_for(&k, 3), got;
	void *v;
	size_t len;

	r.mf = (uint8_t *)"manifest";
	r.mflen = 8;
	assert_int_equal(idx_put_shard(f->x, &r), 0);
	assert_int_equal(idx_put_meta(f->x, "m", "v", 1), 0);
	idx_close(f->x);
	f->x = NULL;
	assert_int_equal(idx_open(f->db, false, &f->x), 0);
	assert_int_equal(idx_get_shard(f->x, &k, &got), 0);
	assert_rec_equal(&r, &got);
	idx_rec_clear(&got);
	assert_int_equal(idx_get_meta(f->x, "m", &v, &len), 0);
	assert_int_equal(len, 1);
	free(v);
}

/* ---- a read-only handle in another process ---- */

#define CHILD_CHECK(cond)                                                             \
	do {                                                                          \
		if (!(cond)) {                                                        \
			dprintf(2, "child: %s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                               \
			_exit(1);                                                     \
		}                                                                     \
	} while (0)

/* Waits (30 s at most, so a parent that failed never leaves us behind). */
static void wait_byte(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;
	int r;

	do
		r = poll(&p, 1, 30000);
	while (r < 0 && errno == EINTR);
	if (r != 1 || read(fd, &c, 1) != 1)
		_exit(3);
}

/* Runs in the child: open read-only, check what the parent committed, tell
 * it, wait for its next commit, check that too. Never returns. */
static void reader_child(const char *db, int to_parent, int from_parent)
{
	struct idx *ro = NULL;
	struct shard_key k1 = key("ro", 1, 0, 0), k2 = key("ro", 2, 0, 0);
	struct shard_rec got, want, r;
	struct shard_rec *recs = NULL;
	void *v = NULL;
	size_t n = 0, len = 0;

	CHILD_CHECK(idx_open(db, true, &ro) == 0);
	CHILD_CHECK(idx_get_shard(ro, &k1, &got) == 0);
	want = rec_for(&k1, 1);
	CHILD_CHECK(got.state == want.state && got.flags == want.flags &&
		    got.bytes == want.bytes && got.mflen == 4 && !memcmp(got.mf, "abcd", 4) &&
		    !memcmp(got.hash, want.hash, 32));
	idx_rec_clear(&got);
	CHILD_CHECK(idx_get_shard(ro, &k2, &got) == -ENOENT);
	CHILD_CHECK(idx_get_meta(ro, "cfg", &v, &len) == 0 && len == 2 && !memcmp(v, "v1", 3));
	free(v);
	CHILD_CHECK(idx_list_shards(ro, "ro", &recs, &n) == 0 && n == 1);
	idx_recs_free(recs, n);

	/* every write is refused, and nothing changes */
	r = rec_for(&k2, 2);
	CHILD_CHECK(idx_put_shard(ro, &r) == -EROFS);
	CHILD_CHECK(idx_del_shard(ro, &k1) == -EROFS);
	CHILD_CHECK(idx_set_state(ro, &k1, SH_BAD, SHF_HIDDEN, 0) == -EROFS);
	CHILD_CHECK(idx_put_meta(ro, "cfg", "zz", 2) == -EROFS);
	CHILD_CHECK(idx_del_meta(ro, "cfg") == -EROFS);
	CHILD_CHECK(idx_get_shard(ro, &k1, &got) == 0 && got.state == want.state);
	idx_rec_clear(&got);

	CHILD_CHECK(write(to_parent, "1", 1) == 1);
	wait_byte(from_parent);

	/* the parent's later commits are visible to the open handle */
	CHILD_CHECK(idx_get_shard(ro, &k2, &got) == 0 && got.state == SH_REPLICATED &&
		    got.mflen == 0 && got.mf == NULL);
	CHILD_CHECK(idx_get_shard(ro, &k1, &got) == 0 && got.state == SH_BAD &&
		    got.flags == (SHF_OWN | SHF_HIDDEN));
	idx_rec_clear(&got);
	CHILD_CHECK(idx_get_meta(ro, "cfg", &v, &len) == 0 && len == 3 && !memcmp(v, "v22", 4));
	free(v);
	CHILD_CHECK(idx_list_shards(ro, "ro", &recs, &n) == 0 && n == 2 &&
		    recs[0].key.step == 1 && recs[1].key.step == 2);
	idx_recs_free(recs, n);
	idx_close(ro);
	_exit(0);
}

static void test_readonly_second_process(void **state)
{
	struct fx *f = *state;
	struct shard_key k1 = key("ro", 1, 0, 0), k2 = key("ro", 2, 0, 0);
	struct shard_rec r1 = rec_for(&k1, 1), r2 = rec_for(&k2, 2);
	int up[2], down[2], status = 0;
	pid_t pid;
	char c = 0;

	r1.mf = (uint8_t *)"abcd";
	r1.mflen = 4;
	assert_int_equal(idx_put_shard(f->x, &r1), 0);
	assert_int_equal(idx_put_meta(f->x, "cfg", "v1", 2), 0);
	/* the child must not inherit an open environment */
	idx_close(f->x);
	f->x = NULL;
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		reader_child(f->db, up[1], down[0]);
	}
	close(up[1]);
	close(down[0]);
	assert_int_equal(idx_open(f->db, false, &f->x), 0);
	if (read(up[0], &c, 1) != 1) {              /* child checked the first state */
		waitpid(pid, &status, 0);
		print_error("read-only child failed early: status 0x%x\n", status);
		fail();
	}
	r2.state = SH_REPLICATED;
	assert_int_equal(idx_put_shard(f->x, &r2), 0);
	assert_int_equal(idx_set_state(f->x, &k1, SH_BAD, SHF_HIDDEN, 0), 0);
	assert_int_equal(idx_put_meta(f->x, "cfg", "v22", 3), 0);
	assert_int_equal(write(down[1], "2", 1), 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	close(up[0]);
	close(down[1]);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		print_error("read-only child: status 0x%x\n", status);
		fail();
	}
}

/* SH_DROPPING (issue 13 item 5): a shard being dropped is gone for every
 * reader at once, cannot be revived by a state change, and only the
 * start-up recovery sees it; forgetting it spares a copy put meanwhile. */
static void test_dropping_invisible(void **state)
{
	struct fx *f = *state;
	struct shard_key a = key("job", 1, 0, 0), b = key("job", 2, 0, 0);
	struct shard_rec ra = rec_for(&a, 1), rb = rec_for(&b, 2), got, *recs = NULL;
	struct shard_key *keys = NULL;
	size_t n = 0;

	assert_int_equal(idx_put_shard(f->x, &ra), 0);
	assert_int_equal(idx_put_shard(f->x, &rb), 0);
	assert_int_equal(idx_set_state(f->x, &a, SH_DROPPING, 0, 0), 0);
	assert_string_equal(shard_state_name(SH_DROPPING), "dropping");

	assert_int_equal(idx_get_shard(f->x, &a, &got), -ENOENT);
	assert_int_equal(idx_list_shards(f->x, NULL, &recs, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(recs[0].key.step, 2);
	idx_recs_free(recs, n);
	assert_int_equal(idx_set_state(f->x, &a, SH_BAD, 0, 0), -ENOENT);
	assert_int_equal(idx_set_state(f->x, &a, 0, SHF_HIDDEN, 0), -ENOENT);
	assert_int_equal(idx_list_dropping(f->x, &keys, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(keys[0].step, 1);
	free(keys);

	/* forgetting only what is still dropping */
	assert_int_equal(idx_forget_dropping(f->x, &b), -EBUSY);
	assert_int_equal(idx_get_shard(f->x, &b, &got), 0);
	idx_rec_clear(&got);
	assert_int_equal(idx_forget_dropping(f->x, &a), 0);
	assert_int_equal(idx_forget_dropping(f->x, &a), -ENOENT);
	assert_int_equal(idx_list_dropping(f->x, &keys, &n), 0);
	assert_int_equal(n, 0);
	free(keys);

	/* a new copy put over a dropping record is a live record again */
	assert_int_equal(idx_set_state(f->x, &b, SH_DROPPING, 0, 0), 0);
	assert_int_equal(idx_put_shard(f->x, &rb), 0);
	assert_int_equal(idx_forget_dropping(f->x, &b), -EBUSY);
	assert_int_equal(idx_get_shard(f->x, &b, &got), 0);
	assert_rec_equal(&rb, &got);
	idx_rec_clear(&got);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_open_close),
		T(test_put_get_del),
		T(test_large_manifest_and_long_job),
		T(test_list_order),
		T(test_set_state),
		T(test_dropping_invisible),
		T(test_meta),
		T(test_reopen_persists),
		T(test_readonly_second_process),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
