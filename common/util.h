/* util: small helpers shared by fs/, tiers/ and net/: size parsing, bounded
 * path checks, directory creation and removal. Thread-safe, no global state.
 * Returned strings are owned by the caller unless said otherwise. */
#ifndef MTCFS_COMMON_UTIL_H
#define MTCFS_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
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

/* Write a whole buffer to dirfd/name via name.tmp + rename. 0 or -errno. */
int util_write_file_atomic(int dirfd, const char *name, const void *buf, size_t len);
/* Read a whole small file (<= max bytes) into a malloc'd NUL-terminated buffer. */
int util_read_file_at(int dirfd, const char *name, size_t max, char **buf, size_t *len);
/* Room for element n of the array v of *cap elements of elem bytes: v
 * itself when n < *cap, else v grown to twice *cap (first elements the
 * first time) with *cap updated. NULL when out of memory, v then still
 * valid and *cap unchanged. The array-growing step the tree repeated. */
void *util_grow(void *v, size_t n, size_t *cap, size_t elem, size_t first);
/* Monotonic time in nanoseconds. */
uint64_t util_now_ns(void);
/* A condition variable whose timed waits count CLOCK_MONOTONIC (so a
 * change of the wall clock neither shortens nor stretches them). */
void util_cond_init_monotonic(pthread_cond_t *cv);
/* RLIMIT_NOFILE's soft limit raised to the hard one (which only a
 * CAP_SYS_RESOURCE process may raise), and the result: the soft limit in
 * force, UINT64_MAX for RLIM_INFINITY, 0 when it cannot be read. *raise_rc
 * (may be NULL): 0, or -errno of a failed raise. Any thread; the limit is
 * the process's. */
uint64_t util_nofile_raise(int *raise_rc);

#endif
