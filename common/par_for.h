/* par_for: run items 0..n-1 of a job on up to `threads` threads (the
 * caller's thread is one of them), and report the failure of the lowest
 * failed index. The pools of the tree (bucket transfers, ranged downloads,
 * manifest checksums) were three hand-written copies of this loop. */
#ifndef MTCFS_COMMON_PAR_FOR_H
#define MTCFS_COMMON_PAR_FOR_H

#include <stddef.h>

/* Runs item i: 0 or -errno. Called from any of the threads, each item once. */
typedef int (*par_for_fn)(void *arg, size_t i);
/* Called, serialised, when item i failed with rc and is the lowest failed
 * index so far, on the thread that ran it: the place to copy that thread's
 * error text. May be NULL. */
typedef void (*par_for_fail_fn)(void *arg, size_t i, int rc);

/* After a failure, items not yet started are not run at all. Without it
 * every item runs (callers that report a result per item). */
#define PAR_FOR_STOP 0x1u

/* Returns 0 when every item that ran returned 0, else the rc of the lowest
 * failed index (its index in *first if first is not NULL; n when none).
 * Threads that cannot be created are not an error: fewer threads work. */
int par_for(size_t n, size_t threads, unsigned flags, par_for_fn fn, par_for_fail_fn fail,
	    void *arg, size_t *first);

#endif
