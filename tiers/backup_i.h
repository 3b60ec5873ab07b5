/* backup_i: what the pieces of tiers/backup (backup.c, backup_put.c,
 * backup_check.c, backup_get.c) share and nothing else may use: a bucket
 * listing in memory and the helpers each piece documents at its
 * definition. Threads: any; no state beyond the caller's arguments. */
#ifndef MTCFS_TIERS_BACKUP_I_H
#define MTCFS_TIERS_BACKUP_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/backup.h"

#define MOD "backup"
#define META_MAX 256                  /* a .meta holds 64 hex digits */
#define SUFFIX_MAX 9999u              /* "-N" of colliding backup names */

/* A bucket listing in memory (bk_list_into, backup.c). */
struct obj {
	char *name;
	uint64_t size;
	bool has_crc, is_prefix;
	uint32_t crc;
};

struct objs {
	struct obj *v;
	size_t n, cap;
	size_t skip;                /* bytes of the listed prefix to drop from names */
};

/* Shared by the pieces; each is documented where it is defined. */
int bk_check_names(const char *job, const char *backup);
int bk_meta_name(char *out, size_t len, const char *job, const struct shard_key *k);
bool bk_parse_meta_name(const char *s, const char *job, uint64_t *step, uint32_t *node,
			uint32_t *worker);
int bk_path3(char *out, size_t len, const char *a, const char *b, const char *c);
void bk_objs_free(struct objs *o);
int bk_list_into(struct bkt *b, const char *prefix, const char *delim, struct objs *o);
const struct obj *bk_objs_find(const struct objs *o, const char *name);
int bk_read_meta(struct bkt *b, const char *name, uint8_t hash[32], bool *gke_dir);
void bk_data_base(const uint8_t hash[32], bool gke_dir, char out[67]);
int bk_gke_objects(const struct objs *all, const char *base, size_t *first, size_t *count,
		   char *why, size_t whylen);
int bk_read_manifest(struct bkt *b, const char *name, const uint8_t want[32],
		     struct manifest **mf);

#endif
