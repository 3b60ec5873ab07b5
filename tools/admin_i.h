/* admin_i: what the three files of mtcfs-admin share: mtcfs_admin.c (main,
 * the command table, options, help), admin_node.c (ls, steps, verify,
 * status: RAMDIR's catalog and the running daemons) and admin_bucket.c
 * (backups, restore-version, prune: the bucket). Single-threaded except
 * prune --delete's workers. Every admin_cmd_* returns the process's exit
 * code: 0 ok, 1 a check failed or the request was refused, 2 usage, 3 cannot
 * read the node's state or the bucket. */
#ifndef MTCFS_TOOLS_ADMIN_I_H
#define MTCFS_TOOLS_ADMIN_I_H

#include "cluster/prune.h"
#include "tiers/catalog.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define NODES_MAX (1u << 20)        /* --nodes bound: the completeness check walks nodes x workers */

struct opts {
	const char *job, *bucket, *gcs_endpoint, *key_file;
	const char *ramdir;             /* --ramdir: bucket and job from its configuration */
	bool watch, force, del, prefer_recent;
	bool verify;                    /* backups --verify: read the pick's data */
	bool nodes_set;
	uint32_t nodes;
	bool keep_set[PRUNE_NKINDS];
	unsigned keep[PRUNE_NKINDS];
	bool incomplete_set;            /* --incomplete-older-than given */
	uint64_t incomplete_older_s;    /* its value in seconds */
	const char *incomplete_arg;     /* as given, for the plan's words */
	const char *args[8];
	int nargs;
};

extern bool admin_json;      /* --json given */

/* mtcfs_admin.c */
/* "1.5 MiB" (or "12 B") into out. */
void admin_human_bytes(uint64_t v, char *out, size_t len);

/* admin_node.c */
/* RAMDIR's catalog, read-only. 0 or -errno (said on stderr). */
int admin_open_catalog(const char *ramdir, struct idx **x);
/* A JSON (or string) value of the catalog's metadata; NULL when absent.
 * Caller frees (json_decref / free). */
json_t *admin_meta_json(struct idx *x, const char *name);
char *admin_meta_str(struct idx *x, const char *name);
int admin_cmd_ls(const char *ramdir, const char *job);
int admin_cmd_steps(const char *ramdir, const char *job);
int admin_cmd_verify(const char *ramdir, const char *job);
int admin_cmd_status(const char *ramdir, bool watch);

/* admin_bucket.c */
int admin_cmd_backups(const struct opts *o);
int admin_cmd_restore_version(const struct opts *o);
int admin_cmd_prune(const struct opts *o);

#endif
