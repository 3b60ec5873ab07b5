/* util: small helpers shared by fs/, tiers/ and net/: size parsing, bounded
 * path checks, directory walking and removal. Thread-safe, no global state.
 * Returned strings are owned by the caller unless said otherwise. */
#ifndef MTCFS_COMMON_UTIL_H
#define MTCFS_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* "512M", "4G", "200Gi", "1048576", "1.5G" -> bytes. 0 or -EINVAL. */
int util_parse_size(const char *s, uint64_t *out);
/* Non-negative decimal integer without sign/space, <= max. 0 or -EINVAL. */
int util_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* True when name is 1..UTIL_STEP_NAME_MAX ASCII digits whose value is at
 * most INT64_MAX (a step directory name; leading zeros allowed). */
#define UTIL_STEP_NAME_MAX 64
bool util_is_step_name(const char *name, uint64_t *step);
/* Relative path safe to use under a root: no "..", no "." components, not
 * absolute, no empty components, no NUL, bounded length. */
bool util_safe_relpath(const char *p, size_t len);
/* mkdir -p of relative path under dirfd (mode 0755). 0 or -errno. */
int util_mkdirs_at(int dirfd, const char *rel, unsigned mode);
/* rm -rf of name under dirfd; missing is not an error. Counts freed bytes
 * (st_blocks*512 of files whose last link went) into *freed if not NULL.
 * Any depth, without recursion and with two descriptors at a time: the
 * chain of names lives on the heap and the way up is "..", checked against
 * the inode recorded on the way down (-ESTALE if the tree moved). */
int util_rmtree_at(int dirfd, const char *name, uint64_t *freed);

/* ---- directory walks: iterative and bounded ----
 * util_walk() visits every entry below rootfd depth-first, a directory
 * before its entries, entries of a directory in readdir order. There is no
 * recursion: open directories live on a heap stack, one descriptor per
 * level, so a walk needs at most max_depth descriptors. A directory at
 * depth max_depth that would be entered fails the walk with -ELOOP; a path
 * of PATH_MAX or more fails it with -ENAMETOOLONG (unless UTIL_WALK_NOPATH).
 * Entries that vanish during the walk are skipped. */
struct util_walk_ent {
	int dirfd;               /* the entry's parent directory; borrowed, valid during the call */
	const char *name;        /* its name in dirfd */
	const char *path;        /* relative to the root ("a/b/c"); NULL with UTIL_WALK_NOPATH */
	size_t pathlen;
	unsigned depth;          /* 1 for the entries directly in the root */
	const struct stat *st;   /* lstat of the entry */
};
/* The callback returns 0 to go on (and enter a directory), UTIL_WALK_SKIP
 * not to enter this directory, or -errno to stop the walk with that error. */
#define UTIL_WALK_SKIP 1
#define UTIL_WALK_NOPATH 0x1u
typedef int (*util_walk_fn)(void *arg, const struct util_walk_ent *e);
int util_walk(int rootfd, unsigned max_depth, unsigned flags, util_walk_fn fn, void *arg);
/* Write a whole buffer to dirfd/name via name.tmp + rename. 0 or -errno. */
int util_write_file_atomic(int dirfd, const char *name, const void *buf, size_t len);
/* Read a whole small file (<= max bytes) into a malloc'd NUL-terminated buffer. */
int util_read_file_at(int dirfd, const char *name, size_t max, char **buf, size_t *len);
/* Monotonic time in nanoseconds. */
uint64_t util_now_ns(void);

#endif
