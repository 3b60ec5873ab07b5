/* fs_ll_freeze.c: the set of frozen (committed, read-only) steps that a
 * restart remembers, and freezing a subtree (see fs_ll_i.h). */
#include "fs/fs_i.h"
#include "fs/fs_ll_i.h"
#include "common/log.h"
#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* --- inodes a shard holds --------------------------------------------------- */

static size_t frozen_slot(ino_t ino, size_t cap)
{
	return (size_t)((uint64_t)ino * 0x9e3779b97f4a7c15ULL) & (cap - 1);
}

/* fs->mu held. Is this backing inode part of a committed shard? */
bool fs_frozen_has(struct fs *fs, ino_t ino)
{
	if (!fs->frozen_cap || ino == 0)
		return false;
	for (size_t i = frozen_slot(ino, fs->frozen_cap);; i = (i + 1) & (fs->frozen_cap - 1)) {
		if (fs->frozen_ino[i] == ino)
			return true;
		if (fs->frozen_ino[i] == 0)
			return false;
	}
}

/* fs->mu held. 0 or -ENOMEM (the inode then stays writable under names
 * outside the step: logged by the caller). */
static int frozen_add(struct fs *fs, ino_t ino)
{
	size_t i;

	if (ino == 0 || fs_frozen_has(fs, ino))
		return 0;
	if ((fs->frozen_n + 1) * 2 > fs->frozen_cap) {
		size_t ncap = fs->frozen_cap ? fs->frozen_cap * 2 : 1024;
		ino_t *nt = calloc(ncap, sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		for (size_t j = 0; j < fs->frozen_cap; j++) {
			if (!fs->frozen_ino[j])
				continue;
			for (i = frozen_slot(fs->frozen_ino[j], ncap); nt[i]; i = (i + 1) & (ncap - 1))
				;
			nt[i] = fs->frozen_ino[j];
		}
		free(fs->frozen_ino);
		fs->frozen_ino = nt;
		fs->frozen_cap = ncap;
	}
	for (i = frozen_slot(ino, fs->frozen_cap); fs->frozen_ino[i]; i = (i + 1) & (fs->frozen_cap - 1))
		;
	fs->frozen_ino[i] = ino;
	fs->frozen_n++;
	return 0;
}

/* FIFOs are part of the shard (by their mode); these are not. */
static const char *special_kind(mode_t m)
{
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return NULL;
}

struct freeze_arg {
	struct fs *fs;
	uint64_t step;
	unsigned reported;
};

static int freeze_one(void *arg, const struct walk_ent *e)
{
	struct freeze_arg *a = arg;
	struct fs *fs = a->fs;
	const struct stat *st = e->st;
	const char *rel = e->path;
	const char *kind = special_kind(st->st_mode);
	int rc = 0;

	/* Only a file with other names needs its inode remembered: the seal
	 * has not linked it into the store yet, and from now on link() of it
	 * is refused. So the set holds what hard links the application made,
	 * not every committed file. */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && st->st_dev == fs->root.dev) {
		pthread_mutex_lock(&fs->mu);
		rc = frozen_add(fs, st->st_ino);
		pthread_mutex_unlock(&fs->mu);
		if (rc < 0)
			log_warn("commit", "step %llu: %s stays writable through other hard links: %s",
				 (unsigned long long)a->step, rel, strerror(-rc));
	}
	fs_node_set_frozen(fs, st->st_ino, st->st_dev, a->step);
	if (kind && a->reported++ < 16) {
		/* The shard (and so every peer and backup copy, and a restore)
		 * holds regular files, directories, symlinks and FIFOs only. */
		char line[PATH_MAX + 256];
		snprintf(line, sizeof(line),
			 "step %llu: %s is %s: not checkpointed (a shard holds regular files, directories, symlinks and FIFOs only)",
			 (unsigned long long)a->step, rel, kind);
		log_warn("commit", "%s", line);
		fs_report_error(fs, line);
	}
	/* a tree deeper than a shard may be is refused by the seal (marked
	 * bad): what lies below that need not be frozen */
	if (S_ISDIR(st->st_mode) && e->depth > MF_MAX_DEPTH)
		return WALK_SKIP;
	return 0;
}

/* Iterative (walk_tree): the depth of the tree is the application's. */
void fs_freeze_subtree(struct fs *fs, int dirfd, uint64_t step)
{
	struct freeze_arg a = { .fs = fs, .step = step };
	int rc = walk_tree(dirfd, MF_MAX_DEPTH + 2, 0, freeze_one, &a);
	if (rc < 0)
		log_warn("commit", "step %llu: freezing its tree stopped early: %s",
			 (unsigned long long)step, strerror(-rc));
}

struct load_arg {
	struct fs *fs;
	int err;
};

static int load_one(void *arg, const struct walk_ent *e)
{
	struct load_arg *a = arg;
	struct fs *fs = a->fs;
	const struct stat *st = e->st;

	/* one link is the store's own: no name in the namespace can reach it */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && st->st_dev == fs->root.dev) {
		pthread_mutex_lock(&fs->mu);
		if (frozen_add(fs, st->st_ino) < 0)
			a->err = -ENOMEM;
		pthread_mutex_unlock(&fs->mu);
	}
	return 0;
}

/* Before the first request: the inodes every shard in RAMDIR/shards holds
 * (own steps and replicas), so a hard link made before a daemon restart
 * stays read-only after it. */
void fs_frozen_load(struct fs *fs)
{
	int sfd = openat(ram_root_fd(fs->ram), "shards", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct load_arg a = { .fs = fs };
	int err, rc;

	if (sfd < 0)
		return;
	/* shards/JOB/STEP/nR-wW/ above a tree of at most MF_MAX_DEPTH levels */
	rc = walk_tree(sfd, MF_MAX_DEPTH + 4, WALK_NOPATH, load_one, &a);
	err = a.err;
	close(sfd);
	if (rc < 0 || err < 0)
		log_warn("main", "cannot list every committed inode: %s; hard links to committed files made outside their step may be writable",
			 strerror(-(rc < 0 ? rc : err)));
	else
		log_info("main", "%zu committed inodes have other names", fs->frozen_n);
}
