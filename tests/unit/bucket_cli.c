/* mtcfs-bucket-cli: a test-only command line over tiers/bucket and
 * tiers/backup, for tests/integration/bucket/test_gcs_client.py and
 * tests/gcs_server/bench.sh. Not installed. One operation per run; exit 0,
 * or 1 with the error's words on stderr ("error: -ERRNO: words").
 *
 *   mtcfs-bucket-cli [OPTIONS] URL COMMAND [ARGS]
 *   options: --endpoint URL --key-file F --metadata-host H --parallel N
 *            --simple-max SIZE --chunk SIZE --part SIZE --list-page N -v
 *   put NAME FILE | putbuf NAME TEXT | get NAME FILE | cat NAME | stat NAME
 *   ls [PREFIX [/]] | rm NAME
 *   put-tree PREFIX DIR       every file of DIR, in parallel (timed)
 *   get-tree PREFIX DIR       every object under PREFIX/, in parallel (timed)
 *   upload-shard JOB BACKUP STEP NODE WORKER DIR [no-data]   (timed)
 *   fetch-shard JOB BACKUP NODE WORKER DIR                    (timed)
 *   new-name JOB UNIXTIME | backups JOB NODES WORKERS | verify JOB BACKUP NODES WORKERS
 *   restore-version JOB show|clear|set NAME
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "common/util.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "tiers/manifest.h"

static int fail(int rc)
{
	fprintf(stderr, "error: %d (%s): %s\n", rc, strerror(-rc), bkt_last_error());
	return 1;
}

static int num(const char *s, uint64_t max, uint64_t *v)
{
	if (util_parse_u64(s, max, v) < 0) {
		fprintf(stderr, "not a number: %s\n", s);
		return -EINVAL;
	}
	return 0;
}

static double secs(uint64_t t0) { return (double)(util_now_ns() - t0) / 1e9; }

static void report(const char *what, uint64_t files, uint64_t bytes, uint64_t t0)
{
	double s = secs(t0);
	printf("%s: %" PRIu64 " files, %" PRIu64 " bytes in %.3f s = %.1f MiB/s\n", what, files,
	       bytes, s, s > 0 ? (double)bytes / (1 << 20) / s : 0.0);
}

static int ls_cb(void *arg, const struct bkt_entry *e)
{
	(void)arg;
	if (e->is_prefix)
		printf("%s\n", e->name);
	else if (e->has_crc)
		printf("%s %" PRIu64 " %08x\n", e->name, e->size, e->crc32c);
	else
		printf("%s %" PRIu64 "\n", e->name, e->size);
	return 0;
}

static int open_dir(const char *p)
{
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "%s: %s\n", p, strerror(errno));
	return fd;
}

static int put_tree(struct bkt *b, const char *prefix, const char *dir)
{
	struct manifest *mf = NULL;
	struct bkt_xfer *x;
	char **names;
	size_t n = 0;
	uint64_t t0, bytes = 0;
	int dfd = open_dir(dir), rc;

	if (dfd < 0)
		return 1;
	t0 = util_now_ns();
	rc = mf_build(dfd, &mf);          /* sizes and CRC32C, as the RAM tier has them */
	if (rc < 0)
		return fail(rc);
	report("crc32c (mf_build)", mf->nfiles, mf->total, t0);
	x = calloc(mf->nfiles + 1, sizeof(*x));
	names = calloc(mf->nfiles + 1, sizeof(*names));
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *e = &mf->e[i];
		size_t l;
		if (e->type != MF_FILE)
			continue;
		l = strlen(prefix) + strlen(e->path) + 2;
		names[n] = malloc(l);
		snprintf(names[n], l, "%s/%s", prefix, e->path);
		x[n] = (struct bkt_xfer){ .name = names[n], .fd = -1, .dirfd = dfd, .path = e->path,
					  .size = e->size, .crc32c = e->crc32c };
		bytes += e->size;
		n++;
	}
	t0 = util_now_ns();
	rc = bkt_put_files(b, x, n);
	if (rc == 0)
		report("put-tree", n, bytes, t0);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(x);
	mf_free(mf);
	close(dfd);
	return rc < 0 ? fail(rc) : 0;
}

struct tree { struct bkt_xfer *x; char **names, **paths; size_t n, cap; size_t skip; };

static int tree_cb(void *arg, const struct bkt_entry *e)
{
	struct tree *t = arg;

	if (e->is_prefix)
		return 0;
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 256;
		t->x = realloc(t->x, t->cap * sizeof(*t->x));
		t->names = realloc(t->names, t->cap * sizeof(char *));
		t->paths = realloc(t->paths, t->cap * sizeof(char *));
		if (!t->x || !t->names || !t->paths)
			return -ENOMEM;
	}
	t->names[t->n] = strdup(e->name);
	t->paths[t->n] = strdup(e->name + t->skip);
	t->x[t->n] = (struct bkt_xfer){ .name = t->names[t->n], .fd = -1, .path = t->paths[t->n],
					.has_crc = e->has_crc, .crc32c = e->crc32c };
	t->n++;
	return 0;
}

static int get_tree(struct bkt *b, const char *prefix, const char *dir)
{
	struct tree t = { 0 };
	char p[PATH_MAX];
	uint64_t t0, bytes = 0;
	int dfd, rc;

	mkdir(dir, 0755);
	dfd = open_dir(dir);
	if (dfd < 0)
		return 1;
	snprintf(p, sizeof(p), "%s/", prefix);
	t.skip = strlen(p);
	t0 = util_now_ns();
	rc = bkt_list_ex(b, p, NULL, tree_cb, &t);
	if (rc < 0)
		return fail(rc);
	for (size_t i = 0; i < t.n; i++)
		t.x[i].dirfd = dfd;
	rc = bkt_get_files(b, t.x, t.n);
	for (size_t i = 0; i < t.n; i++) {
		bytes += t.x[i].size;
		free(t.names[i]);
		free(t.paths[i]);
	}
	if (rc == 0)
		report("get-tree", t.n, bytes, t0);
	free(t.x);
	free(t.names);
	free(t.paths);
	close(dfd);
	return rc < 0 ? fail(rc) : 0;
}

static void print_backup(json_t *arr, const struct bk_backup *v)
{
	json_t *o = json_pack("{s:s, s:I, s:i, s:b, s:I, s:s, s:[]}", "name", v->name,
			      "step", (json_int_t)v->step, "nodes_seen", (int)v->nodes_seen,
			      "complete", v->complete, "bytes", (json_int_t)v->bytes, "why", v->why,
			      "shards");
	json_t *sh = json_object_get(o, "shards");

	for (size_t i = 0; i < v->nshards; i++) {
		char hex[65];
		mf_hash_hex(v->shards[i].hash, hex);
		json_array_append_new(sh, json_pack("{s:i, s:i, s:I, s:s, s:b, s:s}", "node",
						    (int)v->shards[i].node, "worker",
						    (int)v->shards[i].worker, "step",
						    (json_int_t)v->shards[i].step, "hash", hex,
						    "complete", v->shards[i].complete, "why",
						    v->shards[i].why));
	}
	json_array_append_new(arr, o);
}

int main(int argc, char **argv)
{
	struct bkt_opts o = { 0 };
	struct bkt *b = NULL;
	const char *url, *cmd;
	uint64_t v;
	int i = 1, rc = 0, ret = 0;

	for (; i < argc && !strncmp(argv[i], "-", 1); i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-v")) {
			log_set_level(LOG_DEBUG);
			continue;
		}
		if (i + 1 >= argc)
			goto usage;
		if (!strcmp(a, "--endpoint"))
			o.gcs_endpoint = argv[++i];
		else if (!strcmp(a, "--key-file"))
			o.gcs_key_file = argv[++i];
		else if (!strcmp(a, "--metadata-host"))
			o.metadata_host = argv[++i];
		else if (!strcmp(a, "--parallel") && num(argv[++i], 256, &v) == 0)
			o.parallelism = (int)v;
		else if (!strcmp(a, "--list-page") && num(argv[++i], 1000, &v) == 0)
			o.list_page = (unsigned)v;
		else if ((!strcmp(a, "--simple-max") || !strcmp(a, "--chunk") || !strcmp(a, "--part")) &&
			 util_parse_size(argv[i + 1], &v) == 0) {
			if (!strcmp(a, "--simple-max"))
				o.simple_max = v;
			else if (!strcmp(a, "--chunk"))
				o.chunk = v;
			else
				o.part = v;
			i++;
		} else
			goto usage;
	}
	if (argc - i < 2)
		goto usage;
	url = argv[i++];
	cmd = argv[i++];
	argc -= i;
	argv += i;
	rc = bkt_open(url, &o, &b);
	if (rc < 0)
		return fail(rc);
	if (!strcmp(cmd, "put") && argc == 2) {
		int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
		uint32_t crc;
		uint64_t size, t0 = util_now_ns();
		if (fd < 0 || mf_crc32c_fd(fd, &crc, &size) < 0) {
			perror(argv[1]);
			ret = 1;
		} else if ((rc = bkt_put_file(b, argv[0], fd, size, crc)) == 0) {
			report("put", 1, size, t0);
		}
		if (fd >= 0)
			close(fd);
	} else if (!strcmp(cmd, "putbuf") && argc == 2) {
		rc = bkt_put_buf(b, argv[0], argv[1], strlen(argv[1]));
	} else if (!strcmp(cmd, "get") && argc == 2) {
		int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		uint64_t size = 0, t0 = util_now_ns();
		if (fd < 0) {
			perror(argv[1]);
			ret = 1;
		} else {
			rc = bkt_get_file(b, argv[0], fd, &size, false, 0);
			if (rc == 0)
				report("get", 1, size, t0);
			close(fd);
		}
	} else if (!strcmp(cmd, "cat") && argc == 1) {
		rc = bkt_get_file(b, argv[0], STDOUT_FILENO, NULL, false, 0);
	} else if (!strcmp(cmd, "stat") && argc == 1) {
		uint64_t size;
		uint32_t crc;
		if ((rc = bkt_stat(b, argv[0], &size, &crc)) == 0)
			printf("%" PRIu64 " %08x\n", size, crc);
	} else if (!strcmp(cmd, "ls") && argc <= 2) {
		rc = bkt_list_ex(b, argc ? argv[0] : "", argc == 2 ? argv[1] : NULL, ls_cb, NULL);
	} else if (!strcmp(cmd, "rm") && argc == 1) {
		rc = bkt_delete(b, argv[0]);
	} else if (!strcmp(cmd, "put-tree") && argc == 2) {
		ret = put_tree(b, argv[0], argv[1]);
	} else if (!strcmp(cmd, "get-tree") && argc == 2) {
		ret = get_tree(b, argv[0], argv[1]);
	} else if (!strcmp(cmd, "upload-shard") && (argc == 6 || argc == 7)) {
		struct shard_key k = { 0 };
		struct manifest *mf = NULL;
		uint64_t step, node, w, t0;
		int dfd;
		if (num(argv[2], UINT64_MAX, &step) < 0 || num(argv[3], UINT32_MAX, &node) < 0 ||
		    num(argv[4], UINT32_MAX, &w) < 0 || (dfd = open_dir(argv[5])) < 0) {
			ret = 1;
			goto out;
		}
		k.step = step;
		k.rank = (uint32_t)node;
		k.worker = (uint32_t)w;
		t0 = util_now_ns();
		rc = mf_build(dfd, &mf);
		if (rc == 0) {
			report("crc32c (mf_build)", mf->nfiles, mf->total, t0);
			t0 = util_now_ns();
			rc = bk_upload_shard(b, argv[0], argv[1], &k, dfd, mf,
					     !(argc == 7 && !strcmp(argv[6], "no-data")));
			if (rc == 0)
				report("upload-shard", mf->nfiles, mf->total, t0);
		}
		mf_free(mf);
		close(dfd);
	} else if (!strcmp(cmd, "fetch-shard") && argc == 5) {
		struct manifest *mf = NULL;
		uint64_t node, w, t0 = util_now_ns();
		int dfd;
		mkdir(argv[4], 0755);
		if (num(argv[2], UINT32_MAX, &node) < 0 || num(argv[3], UINT32_MAX, &w) < 0 ||
		    (dfd = open_dir(argv[4])) < 0) {
			ret = 1;
			goto out;
		}
		rc = bk_fetch_shard(b, argv[0], argv[1], (uint32_t)node, (uint32_t)w, dfd, &mf, 0);
		if (rc == 0)
			report("fetch-shard", mf->nfiles, mf->total, t0);
		mf_free(mf);
		close(dfd);
	} else if (!strcmp(cmd, "new-name") && argc == 2) {
		char name[BK_NAME_MAX];
		if (num(argv[1], INT64_MAX, &v) < 0) {
			ret = 1;
			goto out;
		}
		if ((rc = bk_new_name(b, argv[0], (time_t)v, name)) == 0)
			printf("%s\n", name);
	} else if ((!strcmp(cmd, "backups") && argc == 3) || (!strcmp(cmd, "verify") && argc == 4)) {
		uint64_t nodes, workers;
		bool verify = !strcmp(cmd, "verify");
		json_t *arr = json_array();
		if (num(argv[argc - 2], UINT32_MAX, &nodes) < 0 ||
		    num(argv[argc - 1], UINT32_MAX, &workers) < 0) {
			ret = 1;
			goto out;
		}
		if (verify) {
			struct bk_backup one;
			rc = bk_verify_backup(b, argv[0], argv[1], (uint32_t)nodes, (uint32_t)workers, &one);
			if (rc == 0 || rc == -EBADMSG)
				print_backup(arr, &one);
			bk_backup_clear(&one);
		} else {
			struct bk_backup *vs = NULL;
			size_t n = 0;
			rc = bk_list_backups(b, argv[0], (uint32_t)nodes, (uint32_t)workers, &vs, &n);
			for (size_t k = 0; k < n; k++)
				print_backup(arr, &vs[k]);
			bk_backups_free(vs, n);
		}
		json_dumpf(arr, stdout, JSON_INDENT(1));
		printf("\n");
		json_decref(arr);
	} else if (!strcmp(cmd, "restore-version") && argc >= 2) {
		char name[BK_NAME_MAX];
		if (!strcmp(argv[1], "show") && (rc = bk_get_restore_version(b, argv[0], name)) == 0)
			printf("%s\n", name);
		else if (!strcmp(argv[1], "clear"))
			rc = bk_clear_restore_version(b, argv[0]);
		else if (!strcmp(argv[1], "set") && argc == 3)
			rc = bk_set_restore_version(b, argv[0], argv[2]);
		else if (strcmp(argv[1], "show"))
			goto usage_close;
	} else {
		goto usage_close;
	}
out:
	bkt_close(b);
	if (rc < 0)
		return fail(rc);
	return ret;
usage_close:
	bkt_close(b);
usage:
	fprintf(stderr, "usage: mtcfs-bucket-cli [--endpoint URL] [--key-file F] [--metadata-host H] "
		"[--parallel N] [--simple-max S] [--chunk S] [--part S] [--list-page N] [-v] URL "
		"COMMAND ...\n(see the comment at the top of tests/unit/bucket_cli.c)\n");
	return 2;
}
