/* fs_ll_dir.c: the FUSE operations on names: mknod, mkdir, symlink, link,
 * unlink, rmdir, rename (commit detection), readlink and directory
 * handles (see fs_ll_i.h). */
#include "fs/fs_i.h"
#include "fs/fs_ll_i.h"
#include "common/log.h"
#include "common/util.h"

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

void ll_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino);
	char buf[PATH_MAX + 1];
	int fd = fs_nfd(fs, n), e;
	ssize_t r;

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	r = readlinkat(fd, "", buf, sizeof(buf));
	e = errno;
	fs_nfd_put(fs, n);
	if (r < 0) {
		fuse_reply_err(req, e);
		return;
	}
	if (r == (ssize_t)sizeof(buf)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	buf[r] = '\0';
	fuse_reply_readlink(req, buf);
}

/* May the app create `name` under parent? */
int fs_may_create(struct fs *fs, struct fnode *parent, const char *name)
{
	if (fs_is_frozen(parent))
		return -EROFS;
	if (parent == &fs->root && !strcmp(name, STORE_NAME))
		return -EEXIST;
	return 0;
}

/* A new entry belongs to the caller, as on a local filesystem: the daemon
 * made it as root, so give it the request's uid, and its gid unless the
 * parent is setgid (tmpfs then gave it the parent's, as the kernel does).
 * chown clears set-id bits of non-directories: put the created mode back.
 * On failure the entry is removed again. st: in, the entry as created;
 * out, as the caller will see it. 0 or -errno. */
int fs_own_new(struct fs *fs, fuse_req_t req, struct fnode *dir, const char *name,
	       struct fnode *n, struct stat *st)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	uid_t u = ctx->uid;
	gid_t g = ctx->gid;
	char pp[64];
	int rc = 0, dfd, nfd;

	if (st->st_uid == u && st->st_gid == g)
		return 0;
	rc = fs_nfd2(fs, dir, n, &dfd, &nfd);
	if (rc < 0)
		return rc;
	if (st->st_gid != g) {
		struct stat ds;
		if (fstatat(dfd, "", &ds, AT_EMPTY_PATH) == 0 && (ds.st_mode & S_ISGID))
			g = ds.st_gid;
	}
	if (st->st_uid == u && st->st_gid == g)
		goto out;
	if (fchownat(nfd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		rc = -errno;
		goto out;
	}
	fs_proc_path(nfd, pp, sizeof(pp));
	if (!S_ISLNK(st->st_mode) && !S_ISDIR(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)) &&
	    fchmodat(fs->proc_self_fd, pp, st->st_mode & 07777, 0) < 0) {
		rc = -errno;
		goto out;
	}
	if (fstatat(nfd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
out:
	if (rc < 0) {
		log_warn("fs", "cannot give %s to uid %u gid %u: %s", name, (unsigned)u, (unsigned)g,
			 strerror(-rc));
		unlinkat(dfd, name, S_ISDIR(st->st_mode) ? AT_REMOVEDIR : 0);
	}
	fs_nfd_put(fs, n);
	fs_nfd_put(fs, dir);
	return rc;
}

static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      dev_t rdev, const char *link)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = fs_node_of(fs, parent);
	struct fuse_entry_param e;
	int rc = fs_may_create(fs, dir, name), dfd;

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	dfd = fs_nfd(fs, dir);
	if (dfd < 0) {
		fuse_reply_err(req, -dfd);
		return;
	}
	if (S_ISDIR(mode))
		rc = mkdirat(dfd, name, mode);
	else if (link)
		rc = symlinkat(link, dfd, name);
	else
		rc = mknodat(dfd, name, mode, rdev);
	rc = rc < 0 ? errno : 0;
	fs_nfd_put(fs, dir);
	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	rc = fs_do_lookup(fs, dir, name, &e);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	rc = fs_own_new(fs, req, dir, name, fs_node_of(fs, e.ino), &e.attr);
	if (rc < 0) {
		fs_node_unref(fs, fs_node_of(fs, e.ino), 1);
		fuse_reply_err(req, -rc);
		return;
	}
	fuse_reply_entry(req, &e);
}

void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	make_node(req, parent, name, mode, rdev, NULL);
}

void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | mode, 0, NULL);
}

void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	make_node(req, parent, name, S_IFLNK, 0, link);
}

void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino), *dir = fs_node_of(fs, parent);
	struct fuse_entry_param e;
	char pp[64];
	int rc = fs_may_create(fs, dir, name), nfd, dfd;

	/* A committed file gets no new names: a link outside its step would
	 * be a writable way to the shard's bytes (and the store is ours). */
	if (rc == 0 && fs_is_frozen(n))
		rc = -EROFS;
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	rc = fs_nfd2(fs, n, dir, &nfd, &dfd);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	fs_proc_path(nfd, pp, sizeof(pp));
	rc = linkat(fs->proc_self_fd, pp, dfd, name, AT_SYMLINK_FOLLOW) < 0 ? errno : 0;
	fs_nfd_put(fs, dir);
	fs_nfd_put(fs, n);
	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	rc = fs_do_lookup(fs, dir, name, &e);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	fuse_reply_entry(req, &e);
}

/* Removing an entry inside a committed step only takes it out of the app's
 * view: the shard keeps its own links. Wait until those exist. */
static int before_remove(struct fs *fs, struct fnode *dir, const char *name)
{
	if (atomic_load(&dir->flags) & FN_STORE)
		return -EROFS;
	if (dir == &fs->root && !strcmp(name, STORE_NAME))
		return -EPERM;
	if (atomic_load(&dir->flags) & FN_FROZEN)
		commit_wait_sealed(fs, dir->step);
	else if (fs_is_frozen(dir))
		workq_drain(fs->sealq);   /* frozen through an ancestor: its seal is queued */
	return 0;
}

/* The last name of an inode the kernel may still use (an open file, a
 * cwd) is going: pin its descriptor (fs_ll_fd.c), or tmpfs frees the inode
 * once an evicted descriptor is gone and its handle finds nothing. Returns
 * the node, referenced, when this call pinned it; NULL when there is
 * nothing to do. doomed_done() after the removal. */
static struct fnode *doomed_pin(struct fs *fs, const struct stat *st)
{
	struct fnode *n;
	bool pinned = false;
	int fd;

	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1)
		return NULL;
	pthread_mutex_lock(&fs->mu);
	n = fs_htab_find(fs, st->st_ino, st->st_dev);
	if (n)
		n->nlookup++;   /* it must outlive a FORGET meanwhile */
	pthread_mutex_unlock(&fs->mu);
	if (!n)
		return NULL;
	fd = fs_nfd(fs, n);
	if (fd >= 0) {
		pinned = fs_nfd_pin(fs, n);
		fs_nfd_put(fs, n);
	}
	if (!pinned) {
		fs_node_unref(fs, n, 1);
		return NULL;
	}
	return n;
}

static void doomed_done(struct fs *fs, struct fnode *n, bool removed)
{
	if (!n)
		return;
	if (!removed)
		fs_nfd_unpin(fs, n);
	fs_node_unref(fs, n, 1);
}

void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = fs_node_of(fs, parent), *doomed;
	struct stat st;
	int rc = before_remove(fs, dir, name), dfd;

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	dfd = fs_nfd(fs, dir);
	if (dfd < 0) {
		fuse_reply_err(req, -dfd);
		return;
	}
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		rc = errno;
		goto out;
	}
	doomed = doomed_pin(fs, &st);
	rc = unlinkat(dfd, name, 0) < 0 ? errno : 0;
	doomed_done(fs, doomed, rc == 0);
	if (rc == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1)
		ram_adjust(fs->ram, -(int64_t)st.st_blocks * 512);
out:
	fs_nfd_put(fs, dir);
	fuse_reply_err(req, rc);
}

void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = fs_node_of(fs, parent), *doomed = NULL;
	struct stat st;
	uint64_t step;
	bool was_step = false;
	int rc = before_remove(fs, dir, name), dfd;

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	dfd = fs_nfd(fs, dir);
	if (dfd < 0) {
		fuse_reply_err(req, -dfd);
		return;
	}
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (dir == &fs->root && util_is_step_name(name, &step) &&
		    commit_is_step_dir(fs, step, st.st_ino)) {
			commit_wait_sealed(fs, step);
			was_step = true;
		}
		if (S_ISDIR(st.st_mode))
			doomed = doomed_pin(fs, &st);
	}
	rc = unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? errno : 0;
	doomed_done(fs, doomed, rc == 0);
	fs_nfd_put(fs, dir);
	if (rc == 0 && was_step)
		commit_hide(fs, step);
	fuse_reply_err(req, rc);
}

void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
	       fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	struct fs *fs = fs_of(req);
	struct fnode *src = fs_node_of(fs, parent), *dst = fs_node_of(fs, newparent);
	struct fnode *doomed = NULL;
	struct stat st, tst;
	uint64_t step = 0, tstep;
	bool commit = false, marker = false, have_tst;
	ino_t marker_dir = 0;
	int rc, sfd, dfd;

	if (fs_is_frozen(src) || fs_is_frozen(dst)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if ((src == &fs->root && !strcmp(name, STORE_NAME)) ||
	    (dst == &fs->root && !strcmp(newname, STORE_NAME))) {
		fuse_reply_err(req, EPERM);
		return;
	}
	rc = fs_nfd2(fs, src, dst, &sfd, &dfd);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		rc = errno;
		goto fail;
	}
	have_tst = fstatat(dfd, newname, &tst, AT_SYMLINK_NOFOLLOW) == 0;
	/* A committed step can be neither moved nor replaced. */
	if (src == &fs->root && S_ISDIR(st.st_mode) && util_is_step_name(name, &tstep) &&
	    commit_is_step_dir(fs, tstep, st.st_ino)) {
		rc = EROFS;
		goto fail;
	}
	if (dst == &fs->root && util_is_step_name(newname, &tstep) && have_tst &&
	    S_ISDIR(tst.st_mode) && commit_is_step_dir(fs, tstep, tst.st_ino)) {
		rc = EROFS;
		goto fail;
	}
	if (dst == &fs->root && S_ISDIR(st.st_mode) && !(flags & RENAME_EXCHANGE) &&
	    util_is_step_name(newname, &step)) {
		rc = commit_begin(fs, step, newname, st.st_ino);
		if (rc < 0) {
			rc = -rc;
			goto fail;
		}
		commit = true;
	}
	/* a rename over another inode removes one of its names */
	if (have_tst && !(flags & RENAME_EXCHANGE) &&
	    (tst.st_ino != st.st_ino || tst.st_dev != st.st_dev))
		doomed = doomed_pin(fs, &tst);
	if (renameat2(sfd, name, dfd, newname, flags) < 0) {
		rc = errno;
		doomed_done(fs, doomed, false);
		if (commit)
			commit_abort(fs, step);
		goto fail;
	}
	doomed_done(fs, doomed, true);
	fs_nfd_put(fs, dst);
	fs_nfd_put(fs, src);
	/* Reclassify the moved node if the kernel holds it. */
	pthread_mutex_lock(&fs->mu);
	{
		struct fnode *n = fs_htab_find(fs, st.st_ino, st.st_dev);
		struct fnode *oldp = NULL;
		if (n && n->parent != (dst == &fs->root ? NULL : dst)) {
			/* the moved node now hangs under dst */
			oldp = n->parent;
			n->parent = dst == &fs->root ? NULL : dst;
			if (n->parent)
				n->parent->nlookup++;
		}
		if (oldp) {
			pthread_mutex_unlock(&fs->mu);
			fs_node_unref(fs, oldp, 1);
			pthread_mutex_lock(&fs->mu);
			n = fs_htab_find(fs, st.st_ino, st.st_dev);
		}
		if (n) {
			if (dst == &fs->root && S_ISDIR(st.st_mode) && util_is_step_name(newname, &tstep)) {
				n->step = tstep;
				atomic_fetch_or(&n->flags, FN_STEPDIR);
			} else {
				atomic_fetch_and(&n->flags, ~FN_STEPDIR);
			}
			if (dst == &fs->root && S_ISREG(st.st_mode) && !strcmp(newname, YAML_NAME))
				atomic_fetch_or(&n->flags, FN_YAML);
			else
				atomic_fetch_and(&n->flags, ~FN_YAML);
			n->marker_step = 0;
			if (S_ISREG(st.st_mode) && !strcmp(newname, COMMIT_MARKER) &&
			    (atomic_load(&dst->flags) & FN_STEPDIR)) {
				n->marker_step = dst->step + 1;
				n->marker_dir_ino = dst->ino;
			}
			if (commit)
				n->step = step;
		}
		/* commit_success.txt renamed into a top-level step directory
		 * (written as a tmp, then renamed): complete unless still open */
		if (S_ISREG(st.st_mode) && !strcmp(newname, COMMIT_MARKER) && dst != &fs->root &&
		    !dst->parent && (atomic_load(&dst->flags) & (FN_STEPDIR | FN_FROZEN)) == FN_STEPDIR &&
		    !(n && atomic_load(&n->writers) > 0)) {
			marker = true;
			marker_dir = dst->ino;
		}
	}
	pthread_mutex_unlock(&fs->mu);
	if (commit)
		fs_node_set_frozen(fs, st.st_ino, st.st_dev, step);
	fuse_reply_err(req, 0);
	/* the seal worker's wake-up stays off the rename's latency */
	if (commit)
		commit_queue(fs, step);
	if (marker)
		commit_marker_done(fs, marker_dir);
	if (dst == &fs->root && S_ISREG(st.st_mode))
		commit_top_file_done(fs);
	if (dst == &fs->root && !strcmp(newname, YAML_NAME))
		ctl_notify(fs);
	return;
fail:
	fs_nfd_put(fs, dst);
	fs_nfd_put(fs, src);
	fuse_reply_err(req, rc);
}

void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino);
	struct dhandle *d = calloc(1, sizeof(*d));
	int fd;

	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fd = fs_nfd(fs, n);
	if (fd >= 0) {
		int pfd = fd;
		fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		fs_nfd_put(fs, n);
	} else {
		errno = -fd;
		fd = -1;
	}
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		free(d);
		fuse_reply_err(req, e);
		return;
	}
	d->is_root = n == &fs->root;
	fi->fh = (uintptr_t)d;
	/* An immutable directory's listing stays in the kernel across opens;
	 * an unlink or rmdir in it through the mount invalidates it there. */
	fi->cache_readdir = fs_immutable(fs, n) ? 1 : 0;
	fi->keep_cache = fi->cache_readdir;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		closedir(d->dp);
		free(d);
	}
}

void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
		struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	char *buf = calloc(1, size), *p = buf;
	size_t rem = size;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (offset != d->offset) {
		seekdir(d->dp, offset);
		d->entry = NULL;
		d->offset = offset;
	}
	for (;;) {
		struct stat st;
		size_t es;
		off_t next;

		if (!d->entry) {
			errno = 0;
			d->entry = readdir(d->dp);
			if (!d->entry) {
				if (errno && rem == size) {
					free(buf);
					fuse_reply_err(req, errno);
					return;
				}
				break;
			}
		}
		next = d->entry->d_off;
		if (d->is_root && d->entry->d_name[0] == '.' &&
		    strstr(d->entry->d_name, ".mtcfs-tmp")) {
			/* our own tmp files of tmp+rename writes */
			d->entry = NULL;
			d->offset = next;
			continue;
		}
		memset(&st, 0, sizeof(st));
		st.st_ino = d->entry->d_ino;
		st.st_mode = (mode_t)d->entry->d_type << 12;
		es = fuse_add_direntry(req, p, rem, d->entry->d_name, &st, next);
		if (es > rem)
			break;
		p += es;
		rem -= es;
		d->entry = NULL;
		d->offset = next;
	}
	fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

void ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	int rc = datasync ? fdatasync(dirfd(d->dp)) : fsync(dirfd(d->dp));
	fuse_reply_err(req, rc < 0 ? errno : 0);
}
