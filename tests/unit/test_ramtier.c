/* Unit tests for tiers/ramtier: sealing a step into the shard store and
 * dropping it again (files, catalog record, tidy of empty STEP and JOB
 * directories), staged shards (publish, abort), and the race between a seal
 * and a stage that is begun and aborted under the same STEP directory — the
 * abort's tidy may remove a directory the seal has just made. Each test runs
 * in a private RAMDIR under /dev/shm (or /tmp). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "common/walk.h"
#include "tiers/catalog.h"
#include "tiers/lifecycle.h"
#include "tiers/manifest.h"
#include "tiers/ramtier.h"

#define TESTTMP_NAME "ramtier"
#include "tests/unit/testtmp.h"

static void put_file(int dirfd, const char *name, const char *text)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	size_t len = strlen(text);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static void key_of(struct shard_key *k, const char *job, uint64_t step, uint32_t rank)
{
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", job);
	k->step = step;
	k->rank = rank;
}

/* RAMDIR/ns/<name>/{a,sub/b}: a committed step as the namespace holds it. */
static int make_step_dir(struct ram_tier *t, const char *name)
{
	int ns = ram_ns_fd(t), fd, sub;

	assert_int_equal(mkdirat(ns, name, 0755), 0);
	fd = openat(ns, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	put_file(fd, "a", "alpha");
	assert_int_equal(mkdirat(fd, "sub", 0755), 0);
	sub = openat(fd, "sub", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(sub >= 0);
	put_file(sub, "b", "bravo-bravo");
	close(sub);
	return fd;
}

static bool shard_path_exists(struct ram_tier *t, const char *rel)
{
	struct stat st;
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/shards/%s", ram_path(t), rel);
	return stat(path, &st) == 0;
}

static void test_seal_verify_drop(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	char err[256] = "";
	uint64_t freed = 0;
	int src;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "7");
	key_of(&k, "job", 7, 0);
	assert_int_equal(ram_seal(t, &k, src, 42, SHF_OWN, &mf, NULL, 0), 0);
	assert_int_equal(mf->nfiles, 2);
	assert_int_equal(mf->total, strlen("alpha") + strlen("bravo-bravo"));
	assert_true(shard_path_exists(t, "job/7/n0-w0/sub/b"));
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	assert_int_equal(rec.ns_ino, 42);
	assert_memory_equal(rec.hash, mf->hash, 32);
	idx_rec_clear(&rec);
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), 0);

	/* a changed byte in the store is found */
	{
		char path[PATH_MAX];
		int fd;
		snprintf(path, sizeof(path), "%s/shards/job/7/n0-w0/a", ram_path(t));
		fd = open(path, O_WRONLY | O_CLOEXEC);
		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, "A", 1, 0), 1);
		close(fd);
	}
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "a"));

	assert_int_equal(ram_drop(t, &k, &freed), 0);
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), -ENOENT);
	/* the empty STEP and JOB directories went with it */
	assert_false(shard_path_exists(t, "job/7"));
	assert_false(shard_path_exists(t, "job"));
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), -ENOENT);
	mf_free(mf);
	close(src);
	ram_close(t);
}

static void test_stage_publish_and_abort(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct ram_stage st;
	struct shard_key own, rep, other;
	int src;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "3");
	key_of(&own, "job", 3, 0);
	assert_int_equal(ram_seal(t, &own, src, 1, SHF_OWN, &mf, NULL, 0), 0);

	/* a replica of rank 1 with the same content: linked, published */
	key_of(&rep, "job", 3, 1);
	assert_int_equal(ram_stage_begin(t, &rep, &st), 0);
	assert_int_equal(ram_stage_link(t, &st, &own), 0);
	assert_int_equal(ram_stage_publish(t, &st, mf, 0), 0);
	assert_true(shard_path_exists(t, "job/3/n1-w0/sub/b"));
	{
		struct shard_key found;
		assert_int_equal(ram_find_hash(t, mf->hash, &found), 0);
		assert_string_equal(found.job, "job");
	}

	/* a stage that is given up leaves nothing, and tidies what it made */
	key_of(&other, "other", 9, 2);
	assert_int_equal(ram_stage_begin(t, &other, &st), 0);
	put_file(st.fd, "partial", "xx");
	ram_stage_abort(t, &st);
	assert_false(shard_path_exists(t, "other"));

	/* a stage missing a file of its manifest is refused */
	assert_int_equal(ram_stage_begin(t, &other, &st), 0);
	put_file(st.fd, "a", "alpha");
	assert_int_equal(ram_stage_publish(t, &st, mf, 0), -EBADMSG);
	ram_stage_abort(t, &st);
	assert_false(shard_path_exists(t, "other"));

	mf_free(mf);
	close(src);
	ram_close(t);
}

/* A replica arriving on the engine thread begins and aborts stages under
 * job/STEP while the seal worker seals this node's own shard of the same
 * STEP: the abort's tidy removes job/STEP (and job) whenever they are empty
 * for an instant, which must never fail the seal. */
struct racer {
	struct ram_tier *t;
	int rounds;
	int rc;
};

static void *stage_churn(void *arg)
{
	struct racer *r = arg;
	for (int i = 0; i < r->rounds && r->rc == 0; i++) {
		struct ram_stage st;
		struct shard_key k;
		key_of(&k, "job", (uint64_t)(i % 4), 1);
		r->rc = ram_stage_begin(r->t, &k, &st);
		if (r->rc == 0)
			ram_stage_abort(r->t, &st);
	}
	return NULL;
}

static void test_seal_races_stage_tidy(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct racer churn = { 0 };
	pthread_t th;
	int src, rounds = 3000;

	assert_int_equal(ram_open(tmp->path, 256 << 20, &t), 0);
	src = make_step_dir(t, "0");
	churn.t = t;
	churn.rounds = rounds * 4;
	assert_int_equal(pthread_create(&th, NULL, stage_churn, &churn), 0);
	for (int i = 0; i < rounds; i++) {
		struct shard_key k;
		uint64_t freed = 0;
		int rc;
		key_of(&k, "job", (uint64_t)(i % 4), 0);
		rc = ram_seal(t, &k, src, 1, SHF_OWN, NULL, NULL, 0);
		if (rc != 0)
			fail_msg("seal %d of step %d failed: %s", i, i % 4, strerror(-rc));
		assert_int_equal(ram_drop(t, &k, &freed), 0);
	}
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(churn.rc, 0);
	close(src);
	ram_close(t);
}

/* Bytes of the regular files under RAMDIR's ns/ and shards/, every inode
 * once: what ram_used must be after a recount. */
struct du { uint64_t total; ino_t seen[4096]; size_t n; };

static int du_cb(void *arg, const struct walk_ent *e)
{
	struct du *d = arg;
	if (!S_ISREG(e->st->st_mode))
		return 0;
	for (size_t i = 0; i < d->n; i++)
		if (d->seen[i] == e->st->st_ino)
			return 0;
	assert_true(d->n < 4096);
	d->seen[d->n++] = e->st->st_ino;
	d->total += (uint64_t)e->st->st_blocks * 512;
	return 0;
}

static uint64_t du_ramdir(struct ram_tier *t)
{
	static struct du d;
	int fd;

	memset(&d, 0, sizeof(d));
	assert_int_equal(walk_tree(ram_ns_fd(t), 64, 0, du_cb, &d), 0);
	fd = openat(ram_root_fd(t), "shards", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(walk_tree(fd, 64, 0, du_cb, &d), 0);
	close(fd);
	return d.total;
}

/* A 5000-level tree committed (issue 13 item 3): sealing it used to
 * overflow the worker's stack, and the resumed seal after every restart
 * again. Now the seal refuses it with the reason, records the step bad (no
 * manifest, nothing to resume), leaves no staging behind, and the RAMDIR
 * opens again. */
static void test_seal_deep_tree_marked_bad(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	char err[256] = "";
	int src, fd;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	assert_int_equal(mkdirat(ram_ns_fd(t), "9", 0755), 0);
	src = openat(ram_ns_fd(t), "9", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(src >= 0);
	fd = dup(src);
	for (int i = 0; i < 5000; i++) {
		int sub;
		assert_int_equal(mkdirat(fd, "d", 0755), 0);
		sub = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		assert_true(sub >= 0);
		close(fd);
		fd = sub;
	}
	put_file(fd, "leaf", "deep");
	close(fd);
	key_of(&k, "job", 9, 0);
	/* the FUSE thread's SEALING record, as commit_begin writes it */
	rec.key = k;
	rec.state = SH_SEALING;
	rec.flags = SHF_OWN;
	assert_int_equal(idx_put_shard(ram_idx(t), &rec), 0);
	assert_int_equal(ram_seal(t, &k, src, 77, SHF_OWN, &mf, err, sizeof(err)), -EBADMSG);
	assert_null(mf);
	assert_non_null(strstr(err, "more than 48 levels deep"));
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_BAD);
	assert_null(rec.mf);
	assert_int_equal(rec.ns_ino, 77);
	assert_int_equal(rec.flags, SHF_OWN);
	assert_false(shard_path_exists(t, "job/9/n0-w0"));
	assert_false(shard_path_exists(t, "job/9/.n0-w0.staging"));
	close(src);
	ram_close(t);
	t = NULL;
	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_BAD);
	idx_rec_clear(&rec);
	assert_int_equal(util_rmtree_at(ram_ns_fd(t), "9", NULL), 0);
	ram_close(t);
}

/* A symlink out of the shard is refused at seal time (issue 13 item 7),
 * with its name and target, and a re-commit under the same key removes the
 * older copy, which the bad record no longer describes. */
static void test_seal_refuses_escaping_symlink(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	char err[256] = "";
	int src;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "3");
	key_of(&k, "job", 3, 0);
	assert_int_equal(ram_seal(t, &k, src, 1, SHF_OWN, &mf, NULL, 0), 0);
	mf_free(mf);
	mf = NULL;
	assert_int_equal(symlinkat("../../../etc/passwd", src, "sub/pw"), 0);
	assert_int_equal(ram_seal(t, &k, src, 1, SHF_OWN, &mf, err, sizeof(err)), -EBADMSG);
	assert_string_equal(err, "symlink sub/pw -> ../../../etc/passwd: the target leaves the shard "
				 "(a shard's symlinks must point inside it)");
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_BAD);
	assert_false(shard_path_exists(t, "job/3/n0-w0"));
	/* one inside is fine */
	assert_int_equal(unlinkat(src, "sub/pw", 0), 0);
	assert_int_equal(symlinkat("../a", src, "sub/pw"), 0);
	assert_int_equal(ram_seal(t, &k, src, 1, SHF_OWN, &mf, err, sizeof(err)), 0);
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	idx_rec_clear(&rec);
	mf_free(mf);
	close(src);
	ram_close(t);
}

/* Issue 13 item 5: a crash in the middle of a drop (here: SIGKILL right
 * after the record is marked, injected through MTCFS_TEST_CRASH in a child
 * process) used to leave the files without a record, counted in ram_used
 * forever. The next ram_open() finishes the drop; it also removes shard
 * directories that no record names, and leaves staging names to their own
 * rule and recorded shards alone. */
static void test_drop_crash_finished_at_open(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k, keep;
	struct shard_key *keys = NULL;
	size_t n = 0;
	pid_t pid;
	int src, wst, fd;
	static char big[1 << 20];

	assert_int_equal(ram_open(tmp->path, 256 << 20, &t), 0);
	src = make_step_dir(t, "5");
	fd = openat(src, "big", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	memset(big, 'z', sizeof(big));
	assert_int_equal(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
	close(fd);
	key_of(&k, "job", 5, 0);
	key_of(&keep, "job", 6, 0);
	assert_int_equal(ram_seal(t, &k, src, 1, SHF_OWN, &mf, NULL, 0), 0);
	mf_free(mf);
	assert_int_equal(ram_seal(t, &keep, src, 2, SHF_OWN, &mf, NULL, 0), 0);
	mf_free(mf);
	close(src);
	/* the namespace copy goes (as drop_own does), so only the store holds it */
	assert_int_equal(util_rmtree_at(ram_ns_fd(t), "5", NULL), 0);
	ram_recount(t);

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		setenv("MTCFS_TEST_CRASH", "drop-marked", 1);
		ram_drop(t, &k, NULL);
		_exit(3);   /* not reached */
	}
	assert_int_equal(waitpid(pid, &wst, 0), pid);
	assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
	ram_close(t);
	t = NULL;

	/* the state the crash left: files there, record marked and invisible */
	{
		struct idx *x = NULL;
		char db[PATH_MAX + 64];
		snprintf(db, sizeof(db), "%s/db", tmp->path);
		assert_int_equal(idx_open(db, false, &x), 0);
		assert_int_equal(idx_get_shard(x, &k, &rec), -ENOENT);
		assert_int_equal(idx_list_dropping(x, &keys, &n), 0);
		assert_int_equal(n, 1);
		assert_int_equal(keys[0].step, 5);
		free(keys);
		idx_close(x);
	}
	{
		char p[PATH_MAX + 64];
		snprintf(p, sizeof(p), "%s/shards/job/5/n0-w0/big", tmp->path);
		assert_int_equal(access(p, F_OK), 0);
		/* and an orphan: a shard directory nothing names (a cut-short publish) */
		snprintf(p, sizeof(p), "%s/shards/job/8/n1-w0", tmp->path);
		assert_int_equal(util_mkdirs_at(AT_FDCWD, p, 0700), 0);
		snprintf(p, sizeof(p), "%s/shards/job/8/n1-w0/orphan", tmp->path);
		fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
		close(fd);
	}

	assert_int_equal(ram_open(tmp->path, 256 << 20, &t), 0);
	assert_false(shard_path_exists(t, "job/5"));
	assert_false(shard_path_exists(t, "job/8"));
	assert_true(shard_path_exists(t, "job/6/n0-w0/big"));
	assert_int_equal(idx_list_dropping(ram_idx(t), &keys, &n), 0);
	assert_int_equal(n, 0);
	free(keys);
	assert_int_equal(idx_get_shard(ram_idx(t), &keep, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	idx_rec_clear(&rec);
	assert_int_equal(ram_used(t), du_ramdir(t));
	assert_true(ram_used(t) >= sizeof(big) && ram_used(t) < 2 * sizeof(big));
	ram_close(t);
}

/* A replica published under a key while that key is being dropped (a peer
 * re-sends rank 1 of step 3 just as GC drops the old copy). The hook stops
 * the drop after it marked the record and before it deleted a file, starts
 * the publish on another thread and lets the drop go on only once the
 * publish has either finished or is waiting for the drop. Either order is
 * fine; what must not happen is the drop deleting the published files
 * (the record of the new copy would then name files that are gone). */
struct race {
	struct ram_tier *t;
	struct manifest *mf;
	struct shard_key own, rep;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool started, waiting, done;
	int publish_rc;
	pthread_t th;
};
static struct race *the_race;

static void *publish_thread(void *arg)
{
	struct race *r = arg;
	struct ram_stage st;
	int rc = ram_stage_begin(r->t, &r->rep, &st);

	if (rc == 0)
		rc = ram_stage_link(r->t, &st, &r->own);
	if (rc == 0)
		rc = ram_stage_publish(r->t, &st, r->mf, 0);
	if (rc < 0)
		ram_stage_abort(r->t, &st);
	pthread_mutex_lock(&r->mu);
	r->publish_rc = rc;
	r->done = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static void race_hook(const char *point, const struct shard_key *k)
{
	struct race *r = the_race;
	struct timespec dl;

	if (!r || k->rank != r->rep.rank)
		return;
	if (!strcmp(point, "key-wait")) {
		pthread_mutex_lock(&r->mu);
		r->waiting = true;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		return;
	}
	if (strcmp(point, "drop-marked") || r->started)
		return;
	r->started = true;
	assert_int_equal(pthread_create(&r->th, NULL, publish_thread, r), 0);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	pthread_mutex_lock(&r->mu);
	while (!r->waiting && !r->done)
		if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0)
			break;
	pthread_mutex_unlock(&r->mu);
}

static void test_publish_during_drop_keeps_files(void **state)
{
	struct tmp *tmp = *state;
	struct race r = { 0 };
	struct shard_rec rec = { 0 };
	struct ram_stage st;
	char err[256] = "";
	int src;

	pthread_mutex_init(&r.mu, NULL);
	pthread_cond_init(&r.cv, NULL);
	assert_int_equal(ram_open(tmp->path, 64 << 20, &r.t), 0);
	src = make_step_dir(r.t, "3");
	key_of(&r.own, "job", 3, 0);
	key_of(&r.rep, "job", 3, 1);
	assert_int_equal(ram_seal(r.t, &r.own, src, 1, SHF_OWN, &r.mf, NULL, 0), 0);
	close(src);
	/* the old copy of the replica, which the drop is for */
	assert_int_equal(ram_stage_begin(r.t, &r.rep, &st), 0);
	assert_int_equal(ram_stage_link(r.t, &st, &r.own), 0);
	assert_int_equal(ram_stage_publish(r.t, &st, r.mf, 0), 0);

	the_race = &r;
	ram_test_hook = race_hook;
	assert_int_equal(ram_drop(r.t, &r.rep, NULL), 0);
	assert_true(r.started);
	assert_int_equal(pthread_join(r.th, NULL), 0);
	ram_test_hook = NULL;
	the_race = NULL;

	/* the publish ended last (or waited for the drop): its copy is whole */
	assert_int_equal(r.publish_rc, 0);
	assert_int_equal(idx_get_shard(ram_idx(r.t), &r.rep, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	idx_rec_clear(&rec);
	assert_true(shard_path_exists(r.t, "job/3/n1-w0/a"));
	assert_true(shard_path_exists(r.t, "job/3/n1-w0/sub/b"));
	assert_int_equal(ram_verify(r.t, &r.rep, err, sizeof(err)), 0);

	mf_free(r.mf);
	ram_close(r.t);
	pthread_cond_destroy(&r.cv);
	pthread_mutex_destroy(&r.mu);
}

/* A FIFO in a step is part of its shard (mode only, exactly, whatever the
 * umask), and a stage linked from that shard carries it too. */
static void test_seal_keeps_fifo(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct ram_stage st;
	struct shard_key own, rep;
	char p[PATH_MAX + 64], err[256] = "";
	struct stat sb;
	int src;
	mode_t old = umask(022);

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "4");
	assert_int_equal(mkfifoat(src, "sub/pipe", 0600), 0);
	assert_int_equal(fchmodat(src, "sub/pipe", 0666, 0), 0);
	key_of(&own, "job", 4, 0);
	assert_int_equal(ram_seal(t, &own, src, 1, SHF_OWN, &mf, NULL, 0), 0);
	close(src);
	{
		bool seen = false;
		for (size_t i = 0; i < mf->n; i++)
			if (!strcmp(mf->e[i].path, "sub/pipe")) {
				assert_int_equal(mf->e[i].type, MF_FIFO);
				assert_int_equal(mf->e[i].mode, 0666);
				seen = true;
			}
		assert_true(seen);
	}
	snprintf(p, sizeof(p), "%s/shards/job/4/n0-w0/sub/pipe", tmp->path);
	assert_int_equal(lstat(p, &sb), 0);
	assert_true(S_ISFIFO(sb.st_mode));
	assert_int_equal(sb.st_mode & 07777, 0666);
	assert_int_equal(ram_verify(t, &own, err, sizeof(err)), 0);

	key_of(&rep, "job", 4, 1);
	assert_int_equal(ram_stage_begin(t, &rep, &st), 0);
	assert_int_equal(ram_stage_link(t, &st, &own), 0);
	assert_int_equal(ram_stage_publish(t, &st, mf, 0), 0);
	snprintf(p, sizeof(p), "%s/shards/job/4/n1-w0/sub/pipe", tmp->path);
	assert_int_equal(lstat(p, &sb), 0);
	assert_true(S_ISFIFO(sb.st_mode));
	assert_int_equal(sb.st_mode & 07777, 0666);
	assert_int_equal(ram_verify(t, &rep, err, sizeof(err)), 0);

	mf_free(mf);
	ram_close(t);
	umask(old);
}

static bool parity_has(struct ram_tier *t, uint64_t step, const char *name)
{
	char rel[256];

	snprintf(rel, sizeof(rel), "j/%llu/parity%s%s", (unsigned long long)step, name ? "/" : "",
		 name ? name : "");
	return shard_path_exists(t, rel);
}

static bool parity_rec(struct ram_tier *t, uint64_t step)
{
	struct shard_rec r = { 0 };
	struct shard_key k;
	int rc;

	life_parity_key("j", step, &k);
	rc = idx_get_shard(ram_idx(t), &k, &r);
	if (rc == 0)
		assert_true(r.flags & SHF_PARITY);
	idx_rec_clear(&r);
	return rc == 0;
}

/* A step's erasure-code holding is a record of the tier: ram_parity_open
 * makes it (record, then directory) only when asked; ram_open scans it as
 * it scans shards: a half-written file and a fragment whose header does
 * not check go (and with them the "protected" marker), the RAM account is
 * what is left; a record whose directory is gone is forgotten, a holding
 * directory no record names is removed, and an older mtcfs's
 * RAMDIR/frags/JOB/STEP becomes a record in place; ram_drop removes it. */
static void test_parity_holding_scanned_at_open(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct shard_key k;
	char path[PATH_MAX + 64];
	uint64_t freed = 0, before;
	int dfd;

	assert_int_equal(ram_open(tmp->path, 1ull << 30, &t), 0);
	assert_int_equal(ram_parity_open(t, "j", 4, false), -ENOENT);
	assert_false(parity_rec(t, 4));
	assert_int_equal(ram_parity_open(t, "../x", 4, true), -EINVAL);
	dfd = ram_parity_open(t, "j", 4, true);
	assert_true(dfd >= 0);
	assert_true(parity_rec(t, 4));
	put_file(dfd, "g0-c0-s2.frag.tmp", "half written");
	put_file(dfd, "g0-c1-s2.frag", "not a fragment");
	put_file(dfd, "protected", "");
	put_file(dfd, "sent", "");
	close(dfd);
	dfd = ram_parity_open(t, "j", 6, true);
	assert_true(dfd >= 0);
	close(dfd);
	ram_close(t);
	/* step 6's directory lost, an orphan holding of step 8, and step 9
	 * in the old layout */
	snprintf(path, sizeof(path), "%s/shards/j/6/parity", tmp->path);
	assert_int_equal(rmdir(path), 0);
	snprintf(path, sizeof(path), "%s/shards/j/8", tmp->path);
	assert_int_equal(mkdir(path, 0711), 0);
	snprintf(path, sizeof(path), "%s/shards/j/8/parity", tmp->path);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/frags", tmp->path);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/frags/j", tmp->path);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/frags/j/9", tmp->path);
	assert_int_equal(mkdir(path, 0700), 0);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	put_file(dfd, "sent", "");
	close(dfd);

	assert_int_equal(ram_open(tmp->path, 1ull << 30, &t), 0);
	assert_true(parity_rec(t, 4));
	assert_false(parity_has(t, 4, "g0-c0-s2.frag.tmp"));
	assert_false(parity_has(t, 4, "g0-c1-s2.frag"));
	assert_false(parity_has(t, 4, "protected"));
	assert_true(parity_has(t, 4, "sent"));
	assert_false(parity_rec(t, 6));
	assert_false(parity_has(t, 8, NULL));
	assert_true(parity_rec(t, 9));
	assert_true(parity_has(t, 9, "sent"));
	snprintf(path, sizeof(path), "%s/frags", tmp->path);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(ram_used(t), du_ramdir(t));

	/* it goes as a record does */
	dfd = ram_parity_open(t, "j", 4, false);
	assert_true(dfd >= 0);
	put_file(dfd, "m0.mf", "some bytes of a manifest");
	close(dfd);
	ram_recount(t);
	before = ram_used(t);
	life_parity_key("j", 4, &k);
	assert_int_equal(ram_drop(t, &k, &freed), 0);
	assert_true(freed > 0);
	assert_int_equal(ram_used(t), before - freed);
	assert_false(parity_rec(t, 4));
	assert_false(parity_has(t, 4, NULL));
	ram_close(t);
}

/* A holding's files are staged through the tier: reserved before they
 * are written (refused past ram_size when nothing may be reclaimed),
 * published with the account corrected to what they take, or aborted with
 * the reservation given back, also when the holding's drop took the file
 * first (only the rest then); a file published over another is counted
 * once. */
static void test_parity_files_staged(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct ram_pfile f;
	struct shard_key k;
	char buf[8192];
	uint64_t base;
	int dfd;

	memset(buf, 7, sizeof(buf));
	assert_int_equal(ram_open(tmp->path, 1 << 20, &t), 0);
	dfd = ram_parity_open(t, "j", 3, true);
	assert_true(dfd >= 0);
	base = ram_used(t);
	/* published: the account is what the file takes */
	assert_int_equal(ram_pfile_reserve(t, dfd, 64 << 10, &f), 0);
	assert_int_equal(ram_used(t), base + (64 << 10));
	assert_int_equal(ram_pfile_create(&f, NULL, "par"), 0);
	assert_int_equal(write(f.fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	assert_int_equal(ram_pfile_publish(t, &f, "g0-c0-s2.frag"), 0);
	assert_int_equal(f.fd, -1);
	assert_true(parity_has(t, 3, "g0-c0-s2.frag"));
	assert_int_equal(ram_used(t), du_ramdir(t));
	ram_pfile_abort(t, &f);   /* after a publish: nothing */
	assert_int_equal(ram_used(t), du_ramdir(t));
	/* published over a file of that name: the replaced one's bytes go
	 * out of the account with it */
	assert_int_equal(ram_pfile_reserve(t, dfd, 64 << 10, &f), 0);
	assert_int_equal(ram_pfile_create(&f, NULL, "par"), 0);
	assert_int_equal(write(f.fd, buf, 4096), 4096);
	assert_int_equal(ram_pfile_publish(t, &f, "g0-c0-s2.frag"), 0);
	assert_int_equal(ram_used(t), du_ramdir(t));
	/* aborted: removed, given back */
	base = ram_used(t);
	assert_int_equal(ram_pfile_reserve(t, dfd, 16 << 10, &f), 0);
	assert_int_equal(ram_pfile_create(&f, "g0-c1-s2.frag.tmp", NULL), 0);
	assert_int_equal(write(f.fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	ram_pfile_abort(t, &f);
	assert_false(parity_has(t, 3, "g0-c1-s2.frag.tmp"));
	assert_int_equal(ram_used(t), base);
	/* past ram_size, nothing to reclaim: refused before a byte is written */
	assert_int_equal(ram_pfile_reserve(t, dfd, 2 << 20, &f), -ENOSPC);
	assert_int_equal(ram_used(t), base);
	ram_pfile_abort(t, &f);
	assert_int_equal(ram_used(t), base);
	/* the holding dropped under a file being written: its drop counted
	 * what the file held, the abort gives back the rest */
	assert_int_equal(ram_pfile_reserve(t, dfd, 32 << 10, &f), 0);
	assert_int_equal(ram_pfile_create(&f, NULL, "in"), 0);
	assert_int_equal(write(f.fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	life_parity_key("j", 3, &k);
	assert_int_equal(ram_drop(t, &k, NULL), 0);
	assert_int_equal(ram_pfile_publish(t, &f, "g0-c2-s2.frag"), -ENOENT);
	assert_int_equal(ram_used(t), du_ramdir(t));
	close(dfd);
	ram_close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_seal_verify_drop, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_stage_publish_and_abort, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_seal_races_stage_tidy, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_seal_deep_tree_marked_bad, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_seal_refuses_escaping_symlink, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_drop_crash_finished_at_open, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_publish_during_drop_keeps_files, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_seal_keeps_fifo, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_parity_holding_scanned_at_open, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_parity_files_staged, tmp_setup, tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
