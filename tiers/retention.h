/* retention: executes the retention plan (tiers/lifecycle.h's
 * life_plan_gc and life_plan_newer) on the RAM tier. What may go is a value
 * (struct life_in: the kept step, pins, the restored step); what the FUSE
 * front must learn of a drop comes back through two callbacks, so the
 * front, the engine and their structures stay above this layer.
 *
 * An own shard goes with its namespace view (its step directory, the
 * top-level symlinks into its store directory, its .save names) when that
 * view is still the shard's (release() says so); a replica is store files
 * and a record only. Every drop is crash-safe (ram_drop marks the record
 * DROPPING before a file goes). Any thread but a FUSE request thread (a
 * forget may wait for the kernel). */
#ifndef MTCFS_TIERS_RETENTION_H
#define MTCFS_TIERS_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/lifecycle.h"
#include "tiers/ramtier.h"

struct ret_hooks {
	/* Own shard k is about to go: the front forgets its step record.
	 * Returns true when the namespace entry name (written to name, len
	 * bytes) is still the app's view of k (then it is removed with k);
	 * false leaves name empty. May be NULL: no view is removed but the
	 * symlinks and .save names that point into k's store. */
	bool (*release)(void *arg, const struct shard_key *k, uint64_t ns_ino, char *name,
			size_t len);
	/* A top-level name of the namespace went (or .mtcfs changed): the
	 * kernel's caches of it must go. May be NULL. */
	void (*forget)(void *arg, const char *name);
	void *arg;
};

/* Drop what life_plan_gc(in) chooses, first to last, until in->want bytes
 * are free (in->want 0: everything it chooses). A step in->pinned pins
 * when its turn comes stays. Returns the bytes freed. */
uint64_t ret_collect(struct ram_tier *ram, const struct life_in *in, const struct ret_hooks *h);

/* After a restore of `step`: drop every shard of job newer than it
 * (life_plan_newer). */
void ret_drop_newer(struct ram_tier *ram, const char *job, uint32_t rank, uint64_t step,
		    const struct ret_hooks *h);

#endif
