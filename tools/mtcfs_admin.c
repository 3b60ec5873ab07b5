/* mtcfs-admin: operator view of a node. Reads RAMDIR's catalog read-only
 * (safe while the daemon runs). Exit codes: 0 ok, 1 a check failed,
 * 2 usage, 3 cannot read the node's state. */
#include "common/util.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/ramtier.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

static bool want_json;

static int open_catalog(const char *ramdir, struct idx **x)
{
	char db[PATH_MAX];
	int rc;

	snprintf(db, sizeof(db), "%s/db", ramdir);
	if (access(db, R_OK) < 0) {
		fprintf(stderr, "mtcfs-admin: %s has no mtcfs catalog (%s)\n", ramdir, strerror(errno));
		return -ENOENT;
	}
	rc = idx_open(db, true, x);
	if (rc < 0)
		fprintf(stderr, "mtcfs-admin: cannot open catalog %s: %s\n", db, strerror(-rc));
	return rc;
}

static const char *type_name(uint8_t t)
{
	return t == MF_FILE ? "file" : t == MF_DIR ? "dir" : "symlink";
}

static json_t *shard_json(const struct shard_rec *r, bool with_files)
{
	json_t *o = json_object();
	char hex[65];

	json_object_set_new(o, "job", json_string(r->key.job));
	json_object_set_new(o, "step", json_integer((json_int_t)r->key.step));
	json_object_set_new(o, "rank", json_integer(r->key.rank));
	json_object_set_new(o, "worker", json_integer(r->key.worker));
	json_object_set_new(o, "state", json_string(shard_state_name(r->state)));
	json_object_set_new(o, "own", json_boolean(r->flags & SHF_OWN));
	json_object_set_new(o, "hidden", json_boolean(r->flags & SHF_HIDDEN));
	json_object_set_new(o, "restored", json_boolean(r->flags & SHF_RESTORED));
	json_object_set_new(o, "commit_time", json_integer((json_int_t)r->commit_time));
	if (r->mf) {
		struct manifest *mf = NULL;
		mf_hash_hex(r->hash, hex);
		json_object_set_new(o, "hash", json_string(hex));
		json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
		json_object_set_new(o, "nfiles", json_integer(r->nfiles));
		if (with_files && mf_decode(r->mf, r->mflen, &mf) == 0) {
			json_t *files = json_array();
			for (size_t i = 0; i < mf->n; i++) {
				const struct mf_entry *e = &mf->e[i];
				json_t *f = json_object();
				char crc[9];
				json_object_set_new(f, "path", json_string(e->path));
				json_object_set_new(f, "type", json_string(type_name(e->type)));
				json_object_set_new(f, "mode", json_integer(e->mode));
				if (e->type == MF_FILE) {
					snprintf(crc, sizeof(crc), "%08x", e->crc32c);
					json_object_set_new(f, "size", json_integer((json_int_t)e->size));
					json_object_set_new(f, "crc32c", json_string(crc));
				}
				if (e->target)
					json_object_set_new(f, "target", json_string(e->target));
				json_array_append_new(files, f);
			}
			json_object_set_new(o, "files", files);
			mf_free(mf);
		}
	} else {
		json_object_set_new(o, "hash", json_null());
		json_object_set_new(o, "bytes", json_integer(0));
		json_object_set_new(o, "files", json_array());
	}
	return o;
}

static int cmd_ls(const char *ramdir, const char *job)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	size_t n = 0;
	int rc;

	if (open_catalog(ramdir, &x) < 0)
		return 3;
	rc = idx_list_shards(x, job, &recs, &n);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading catalog: %s\n", strerror(-rc));
		idx_close(x);
		return 3;
	}
	if (want_json) {
		json_t *root = json_object(), *arr = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(arr, shard_json(&recs[i], true));
		json_object_set_new(root, "shards", arr);
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(root);
	} else {
		printf("%-16s %8s %5s %3s %-10s %6s %14s  %s\n", "JOB", "STEP", "RANK", "W",
		       "STATE", "FILES", "BYTES", "HASH");
		for (size_t i = 0; i < n; i++) {
			struct shard_rec *r = &recs[i];
			struct manifest *mf = NULL;
			char hex[65] = "-";
			if (r->mf)
				mf_hash_hex(r->hash, hex);
			printf("%-16s %8llu %5u %3u %-10s %6u %14llu  %.16s%s\n", r->key.job,
			       (unsigned long long)r->key.step, r->key.rank, r->key.worker,
			       shard_state_name(r->state), r->nfiles, (unsigned long long)r->bytes, hex,
			       (r->flags & SHF_OWN) ? "" : "  (replica)");
			if (r->mf && mf_decode(r->mf, r->mflen, &mf) == 0) {
				for (size_t j = 0; j < mf->n; j++) {
					const struct mf_entry *e = &mf->e[j];
					if (e->type == MF_FILE)
						printf("    %08x %14llu  %s\n", e->crc32c,
						       (unsigned long long)e->size, e->path);
					else
						printf("    %8s %14s  %s%s\n", "", type_name(e->type), e->path,
						       e->type == MF_DIR ? "/" : "");
				}
				mf_free(mf);
			}
		}
	}
	idx_recs_free(recs, n);
	idx_close(x);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mtcfs-admin COMMAND [ARGS] [--json]\n\n"
		"commands:\n"
		"  ls RAMDIR [--job NAME]   shards in the node's catalog with their files, sizes, CRC32C\n"
		"  help                     this text\n");
}

int main(int argc, char **argv)
{
	const char *args[8];
	const char *job = NULL;
	int nargs = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			want_json = true;
		} else if (!strcmp(argv[i], "--job") && i + 1 < argc) {
			job = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (argv[i][0] == '-') {
			fprintf(stderr, "mtcfs-admin: unknown option %s\n", argv[i]);
			usage(stderr);
			return 2;
		} else if (nargs < 8) {
			args[nargs++] = argv[i];
		}
	}
	if (nargs == 0) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(args[0], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(args[0], "ls")) {
		if (nargs != 2) {
			fprintf(stderr, "usage: mtcfs-admin ls RAMDIR [--job NAME] [--json]\n");
			return 2;
		}
		return cmd_ls(args[1], job);
	}
	fprintf(stderr, "mtcfs-admin: unknown command %s\n", args[0]);
	usage(stderr);
	return 2;
}
