/* fs_ll_i: what the pieces of the FUSE front (fs_ll.c, fs_ll_freeze.c,
 * fs_ll_dir.c, fs_ll_file.c) share and nothing else in fs/ may use: file and
 * directory handles, the names mtcfs gives a meaning, and the helpers each
 * piece documents at its definition. Threads and locks as in fs_i.h: FUSE
 * request threads. */
#ifndef MTCFS_FS_FS_LL_I_H
#define MTCFS_FS_FS_LL_I_H

#include <dirent.h>
#include <stdbool.h>
#include <sys/types.h>

#include "fs/fs_i.h"

#define STORE_NAME ".mtcfs"
#define COMMIT_MARKER "commit_success.txt"
#define YAML_NAME "replicator.yaml"

/* fs_ll_front's entries (see struct fs_front_ops), by name inside fs_ll*.c */
void fs_forget_name(struct fs *fs, const char *name);
void fs_forget_name_now(struct fs *fs, const char *name);
int  fs_node_writers(struct fs *fs, ino_t ino, dev_t dev);
void fs_node_set_frozen(struct fs *fs, ino_t ino, dev_t dev, uint64_t step);
void fs_freeze_subtree(struct fs *fs, int dirfd, uint64_t step);

struct fhandle {
	int fd;
	struct fnode *node;
	bool writable;
	bool cached;                /* read-write open: through the page cache */
	bool pt;                    /* reads go to the backing file in the kernel */
	_Atomic bool kill_priv;     /* the next write clears set-id bits */
	struct fhandle *prev, *next; /* fs->handles, under fs->hmu */
};

struct dhandle {
	DIR *dp;
	struct dirent *entry;
	off_t offset;
	bool is_root;
};

/* Shared by the pieces; each is documented where it is defined. */
struct fs *fs_of(fuse_req_t req);
struct fnode *fs_node_of(struct fs *fs, fuse_ino_t ino);
bool fs_is_frozen(struct fnode *n);
struct fnode *fs_htab_find(struct fs *fs, ino_t ino, dev_t dev);
bool fs_immutable(struct fs *fs, struct fnode *n);
int fs_proc_path(int fd, char *buf, size_t len);
void fs_forget_pages(struct fs *fs, fuse_ino_t ino);
bool fs_frozen_has(struct fs *fs, ino_t ino);
void fs_frozen_load(struct fs *fs);
/* fs_ll_fd.c: n's O_PATH descriptor for the length of one operation
 * (reopened by file handle if it was evicted), or -errno (-ESTALE: the
 * inode is gone); every success is paired with fs_nfd_put(). fs_nfd2: two
 * at once, both or neither. */
int fs_nfd(struct fs *fs, struct fnode *n);
int fs_nfd2(struct fs *fs, struct fnode *a, struct fnode *b, int *fa, int *fb);
void fs_nfd_put(struct fs *fs, struct fnode *n);
/* A new node takes its first descriptor (consumed); a node freed closes it. */
void fs_node_fd_adopt(struct fs *fs, struct fnode *n, int fd);
void fs_node_fd_drop(struct fs *fs, struct fnode *n);
/* Keep n's descriptor open until FORGET (its last name is going): true if
 * this call pinned it (undo with fs_nfd_unpin when the removal failed).
 * Between fs_nfd and fs_nfd_put. */
bool fs_nfd_pin(struct fs *fs, struct fnode *n);
void fs_nfd_unpin(struct fs *fs, struct fnode *n);
void fs_node_unref(struct fs *fs, struct fnode *n, uint64_t count);
int fs_do_lookup(struct fs *fs, struct fnode *parent, const char *name,
		 struct fuse_entry_param *e);
void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid,
		struct fuse_file_info *fi);
void ll_readlink(fuse_req_t req, fuse_ino_t ino);
int fs_may_create(struct fs *fs, struct fnode *parent, const char *name);
int fs_own_new(struct fs *fs, fuse_req_t req, struct fnode *dir, const char *name,
	       struct fnode *n, struct stat *st);
void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name);
void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
	       fuse_ino_t newparent, const char *newname, unsigned int flags);
void fs_fill_fi(struct fuse_file_info *fi, struct fhandle *h, struct fnode *n, int flags);
void fs_handle_attach(fuse_req_t req, struct fs *fs, struct fhandle *h,
		      struct fuse_file_info *fi);
void fs_free_handle(struct fs *fs, struct fhandle *h);
void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
	       struct fuse_file_info *fi);
void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
	     struct fuse_file_info *fi);
void ll_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf,
		  off_t off, struct fuse_file_info *fi);
void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
		  struct fuse_file_info *fi);
void ll_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
	      struct fuse_file_info *fi);
void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
		struct fuse_file_info *fi);
void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);

#endif
