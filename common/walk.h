/* walk: the one directory-tree walk of the tree, iterative and bounded, so
 * that a tree as deep as an application makes it cannot overflow the stack.
 * Thread-safe, no global state. */
#ifndef MTCFS_COMMON_WALK_H
#define MTCFS_COMMON_WALK_H

#include <dirent.h>
#include <stddef.h>
#include <sys/stat.h>

/* walk_tree() visits every entry below rootfd depth-first, a directory
 * before its entries, entries of a directory in readdir order. There is no
 * recursion: open directories live on a heap stack, one descriptor per
 * level, so a walk needs at most max_depth descriptors. A directory at
 * depth max_depth that would be entered fails the walk with -ELOOP; a path
 * of PATH_MAX or more fails it with -ENAMETOOLONG (unless WALK_NOPATH).
 * Entries that vanish during the walk are skipped. */
struct walk_ent {
	int dirfd;               /* the entry's parent directory; borrowed, valid during the call */
	const char *name;        /* its name in dirfd */
	const char *path;        /* relative to the root ("a/b/c"); NULL with WALK_NOPATH */
	size_t pathlen;
	unsigned depth;          /* 1 for the entries directly in the root */
	const struct stat *st;   /* lstat of the entry */
};
/* The callback returns 0 to go on (and enter a directory), WALK_SKIP
 * not to enter this directory, or -errno to stop the walk with that error. */
#define WALK_SKIP 1
#define WALK_NOPATH 0x1u
typedef int (*walk_fn)(void *arg, const struct walk_ent *e);
int walk_tree(int rootfd, unsigned max_depth, unsigned flags, walk_fn fn, void *arg);

/* One directory's entries, one level, "." and ".." left out, in readdir
 * order: the loop that many callers wrote by hand around opendir. The
 * directory is read through its own open of dirfd/".", so dirfd (and any
 * other reader of it) keeps its offset and stays the caller's.
 *
 *	struct walk_dir w;
 *	const struct dirent *de;
 *	if (walk_dir_open(&w, dirfd) == 0) {
 *		while ((de = walk_dir_next(&w)) != NULL)
 *			...;
 *		walk_dir_close(&w);
 *	}
 * A dirent is valid until the next call. Reading stops at the first error
 * as at the end; walk_dir_close() returns it (0 or -errno). */
struct walk_dir {
	DIR *d;
	int err;
};
int walk_dir_open(struct walk_dir *w, int dirfd);
const struct dirent *walk_dir_next(struct walk_dir *w);
/* The directory being read, for *at() calls on its entries; valid until
 * walk_dir_close(). */
int walk_dir_fd(const struct walk_dir *w);
int walk_dir_close(struct walk_dir *w);

#endif
