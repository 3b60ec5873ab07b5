/* admin_bucket.c — mtcfs-admin's bucket commands (see admin_i.h): backups,
 * restore-version and prune, through tiers/backup over the bucket URL;
 * prune --delete removes a backup's objects with DEL_THREADS workers. */
#include "tools/admin_i.h"
#include "common/log.h"
#include "common/util.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "cluster/prune.h"
#include "tiers/ramtier.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/rcfg.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/tls.h"
#include "net/frame.h"
#include "net/proto.h"

#define DEL_THREADS 8               /* concurrent deletes of one backup's manifests and data */

/* ---- bucket commands: backups, restore-version, prune ---- */

static void print_json(json_t *root)
{
	json_dumpf(root, stdout, JSON_INDENT(1));
	putchar('\n');
	json_decref(root);
}

/* A bucket URL as given on the command line: 0, 2 (usage) or 3 (cannot read). */
static int open_bucket(const struct opts *o, struct bkt **b)
{
	struct bkt_opts bo = { .gcs_endpoint = o->gcs_endpoint, .gcs_key_file = o->key_file };
	struct stat st;
	int rc;

	if (strncmp(o->bucket, "gs://", 5) && strncmp(o->bucket, "file://", 7)) {
		fprintf(stderr, "mtcfs-admin: --bucket %s: not gs://BUCKET[/PREFIX] or file:///PATH\n",
			o->bucket);
		return 2;
	}
	/* bkt_open creates a missing file:// directory: an admin reading a bucket must not */
	if (!strncmp(o->bucket, "file://", 7) && o->bucket[7] == '/') {
		if (stat(o->bucket + 7, &st) < 0) {
			fprintf(stderr, "mtcfs-admin: cannot read bucket %s: %s\n", o->bucket, strerror(errno));
			return 3;
		}
		if (!S_ISDIR(st.st_mode)) {
			fprintf(stderr, "mtcfs-admin: cannot read bucket %s: not a directory\n", o->bucket);
			return 3;
		}
	}
	rc = bkt_open(o->bucket, &bo, b);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: cannot open bucket %s: %s\n", o->bucket,
			bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
		return 3;
	}
	return 0;
}

/* What the bucket holds for a job, judged the way a restore judges it. */
struct bview {
	struct bkt *b;
	struct bk_backup *v;
	size_t n;
	uint32_t nodes;             /* the node count completeness is judged for */
	bool nodes_given;
	uint32_t *own;              /* [n] nodes each backup's .meta names show */
	bool *ambiguous;            /* [n] complete for its own count, short of nodes */
	struct prune_item *items;   /* [n] for tiers/prune */
	int rv_rc;                  /* restore.version: 0, -ENOENT (absent), -EBADMSG (invalid) */
	char rv[BK_NAME_MAX];
	long rv_idx;                /* restore.version's backup in v[], or -1 */
	long pick;                  /* the backup a restore from the bucket would use, or -1 */
	bool verified;              /* --verify read the pick's data and found it good */
	char pick_note[640];        /* the pick, or why there is none, in words */
};

static void bview_free(struct bview *w)
{
	bk_backups_free(w->v, w->n);
	free(w->own);
	free(w->ambiguous);
	free(w->items);
	bkt_close(w->b);
	memset(w, 0, sizeof(*w));
}

static int bucket_fail(const struct bview *w, const char *what, int rc)
{
	fprintf(stderr, "mtcfs-admin: cannot read bucket %s (%s): %s\n", bkt_url(w->b), what,
		bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
	return 3;
}

/* Nodes [from, to) have no .meta in v: add their entries, as bk_check_backup
 * does for a gap when it is told the node count. */
static int add_missing_nodes(struct bk_backup *v, uint32_t from, uint32_t to)
{
	struct bk_shard *ns;

	if (from >= to)
		return 0;
	ns = realloc(v->shards, (v->nshards + (to - from)) * sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	v->shards = ns;
	for (uint32_t nd = from; nd < to; nd++) {
		struct bk_shard *s = &v->shards[v->nshards++];
		memset(s, 0, sizeof(*s));
		s->node = nd;
		snprintf(s->why, sizeof(s->why), "no .meta");
	}
	return 0;
}

/* Load every backup of o->job with restore.version and the restore pick.
 * Without --nodes, a backup is judged for the most nodes any backup of the
 * job shows: one that is complete only for fewer (an upload in progress, a
 * node whose .meta never came, or a job that shrank) is incomplete and
 * `ambiguous` (prune never deletes it). 0, or an exit code. */
static int load_view(const struct opts *o, struct bview *w)
{
	int rc;

	memset(w, 0, sizeof(*w));
	w->rv_idx = w->pick = -1;
	rc = open_bucket(o, &w->b);
	if (rc)
		return rc;
	w->nodes_given = o->nodes_set;
	/* workers 0: as many as the .meta names show (framework: pytorch
	 * backups hold one shard per worker) */
	rc = bk_list_backups(w->b, o->job, o->nodes_set ? o->nodes : 0, 0, &w->v, &w->n);
	if (rc < 0)
		return bucket_fail(w, "listing the backups", rc);
	w->own = calloc(w->n ? w->n : 1, sizeof(*w->own));
	w->ambiguous = calloc(w->n ? w->n : 1, sizeof(*w->ambiguous));
	w->items = calloc(w->n ? w->n : 1, sizeof(*w->items));
	if (!w->own || !w->ambiguous || !w->items)
		return bucket_fail(w, "memory", -ENOMEM);
	w->nodes = o->nodes_set ? o->nodes : 0;
	for (size_t i = 0; i < w->n; i++) {
		for (size_t k = 0; k < w->v[i].nshards; k++)
			if (w->v[i].shards[k].node + 1 > w->own[i])
				w->own[i] = w->v[i].shards[k].node + 1;
		if (!o->nodes_set && w->own[i] > w->nodes)
			w->nodes = w->own[i];
	}
	for (size_t i = 0; !o->nodes_set && i < w->n; i++) {
		struct bk_backup *v = &w->v[i];
		if (w->own[i] == 0 || w->own[i] >= w->nodes)
			continue;
		if (v->complete) {
			char which[48];
			v->complete = false;
			w->ambiguous[i] = true;
			if (w->nodes - w->own[i] > 1)
				snprintf(which, sizeof(which), "nodes %u..%u", w->own[i], w->nodes - 1);
			else
				snprintf(which, sizeof(which), "node %u", w->own[i]);
			snprintf(v->why, sizeof(v->why), "no .meta for %s: its .meta names show %u node%s, "
				 "other backups %u (complete if the job has %u; --nodes decides)", which,
				 w->own[i], w->own[i] == 1 ? "" : "s", w->nodes, w->own[i]);
		}
		if (add_missing_nodes(v, w->own[i], w->nodes) < 0)
			return bucket_fail(w, "memory", -ENOMEM);
	}
	for (size_t i = 0; i < w->n; i++)
		w->items[i] = (struct prune_item){ .name = w->v[i].name, .complete = w->v[i].complete,
						   .hold = w->ambiguous[i],
						   .hold_why = "complete only for fewer nodes (--nodes decides)" };

	w->rv_rc = bk_get_restore_version(w->b, o->job, w->rv);
	if (w->rv_rc < 0 && w->rv_rc != -ENOENT && w->rv_rc != -EBADMSG)
		return bucket_fail(w, "reading restore.version", w->rv_rc);
	for (size_t i = 0; w->rv_rc == 0 && i < w->n; i++)
		if (!strcmp(w->v[i].name, w->rv))
			w->rv_idx = (long)i;
	w->pick = prune_restore_pick(w->items, w->n, w->rv_rc == 0 ? w->rv : NULL, w->rv_rc == -EBADMSG);
	/* --verify: read the pick's data as a restore would; a corrupt one
	 * makes the daemon ask for another backup (restore.version's: none) */
	while (o->verify && w->pick >= 0) {
		struct bk_backup chk;
		struct bk_backup *v = &w->v[w->pick];

		memset(&chk, 0, sizeof(chk));
		rc = bk_verify_backup(w->b, o->job, v->name, w->nodes, 0, &chk);
		if (rc == 0) {
			w->verified = true;
			bk_backup_clear(&chk);
			break;
		}
		if (rc != -EBADMSG && rc != -ENOENT) {
			bk_backup_clear(&chk);
			return bucket_fail(w, "reading a backup's data", rc);
		}
		v->complete = false;
		w->items[w->pick].complete = false;
		snprintf(v->why, sizeof(v->why), "corrupt: %.480s",
			 chk.why[0] ? chk.why : bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
		bk_backup_clear(&chk);
		w->pick = prune_restore_pick(w->items, w->n, w->rv_rc == 0 ? w->rv : NULL,
					     w->rv_rc == -EBADMSG);
	}
	if (w->pick >= 0 && w->rv_rc == 0)
		snprintf(w->pick_note, sizeof(w->pick_note), "restore.version names %s (complete, step %llu%s): "
			 "a restore from the bucket would use it", w->rv,
			 (unsigned long long)w->v[w->pick].step, w->verified ? ", data verified" : "");
	else if (w->pick >= 0)
		snprintf(w->pick_note, sizeof(w->pick_note), "a restore from the bucket would use %s "
			 "(step %llu), the newest complete backup%s", w->v[w->pick].name,
			 (unsigned long long)w->v[w->pick].step,
			 w->verified ? " (data verified)" :
			 !o->verify && !strncmp(bkt_url(w->b), "file://", 7) ?
			 "; file:// lists no checksums, so its data was not read (--verify reads it)" : "");
	else if (w->rv_rc == -EBADMSG)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version does not name a backup: nothing would be restored");
	else if (w->rv_rc == 0 && w->rv_idx >= 0)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version names %s (incomplete): nothing would be restored", w->rv);
	else if (w->rv_rc == 0)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version names %s (no such backup): nothing would be restored", w->rv);
	else
		snprintf(w->pick_note, sizeof(w->pick_note), "no complete backup: nothing would be restored");
	return 0;
}

static const char *nodes_note(const struct bview *w)
{
	static char s[160];

	if (w->nodes_given)
		snprintf(s, sizeof(s), "judged for %u node%s (--nodes)", w->nodes, w->nodes == 1 ? "" : "s");
	else
		snprintf(s, sizeof(s), "judged for %u node%s (the most any backup's .meta names show; "
			 "--nodes N sets the job's count)", w->nodes, w->nodes == 1 ? "" : "s");
	return s;
}

/* Nodes of v whose every shard is complete. */
static uint32_t nodes_ok(const struct bk_backup *v, uint32_t nodes)
{
	uint32_t ok = 0;

	for (uint32_t nd = 0; nd < nodes; nd++) {
		bool any = false, good = true;
		for (size_t k = 0; k < v->nshards; k++) {
			if (v->shards[k].node != nd)
				continue;
			any = true;
			good &= v->shards[k].complete;
		}
		ok += any && good;
	}
	return ok;
}

static json_t *backup_json(const struct bview *w, size_t i)
{
	const struct bk_backup *v = &w->v[i];
	json_t *o = json_object(), *sh = json_array();
	char hex[65];

	json_object_set_new(o, "name", json_string(v->name));
	json_object_set_new(o, "step", json_integer((json_int_t)v->step));
	json_object_set_new(o, "bytes", json_integer((json_int_t)v->bytes));
	json_object_set_new(o, "complete", json_boolean(v->complete));
	json_object_set_new(o, "why", v->complete ? json_null() : json_string(v->why));
	json_object_set_new(o, "nodes_seen", json_integer(v->nodes_seen));
	json_object_set_new(o, "nodes_complete", json_integer(nodes_ok(v, w->nodes)));
	json_object_set_new(o, "complete_for_fewer_nodes", w->ambiguous[i] ? json_integer(w->own[i]) : json_null());
	json_object_set_new(o, "restore", json_boolean((long)i == w->pick));
	json_object_set_new(o, "restore_version", json_boolean((long)i == w->rv_idx));
	for (size_t k = 0; k < v->nshards; k++) {
		const struct bk_shard *s = &v->shards[k];
		bool has_hash = false;
		for (int j = 0; j < 32; j++)
			has_hash |= s->hash[j] != 0;
		mf_hash_hex(s->hash, hex);
		json_array_append_new(sh, json_pack("{s:i,s:i,s:I,s:o,s:b,s:o}", "node", (int)s->node,
			"worker", (int)s->worker, "step", (json_int_t)s->step,
			"hash", has_hash ? json_string(hex) : json_null(), "complete", s->complete,
			"why", s->complete ? json_null() : json_string(s->why)));
	}
	json_object_set_new(o, "shards", sh);
	return o;
}

static void json_bucket_head(json_t *root, const struct opts *o, const struct bview *w)
{
	json_object_set_new(root, "bucket", json_string(bkt_url(w->b)));
	json_object_set_new(root, "job", json_string(o->job));
	json_object_set_new(root, "nodes", json_integer(w->nodes));
	json_object_set_new(root, "nodes_given", json_boolean(w->nodes_given));
	json_object_set_new(root, "restore_version",
			    w->rv_rc == 0 ? json_string(w->rv) : json_null());
	json_object_set_new(root, "restore_version_invalid", json_boolean(w->rv_rc == -EBADMSG));
	json_object_set_new(root, "restore", w->pick >= 0 ? json_pack("{s:s,s:I}", "name",
			    w->v[w->pick].name, "step", (json_int_t)w->v[w->pick].step) : json_null());
	json_object_set_new(root, "restore_note", json_string(w->pick_note));
}

static void rv_line(const struct bview *w)
{
	if (w->rv_rc == -ENOENT)
		printf("restore.version: none\n");
	else if (w->rv_rc == -EBADMSG)
		printf("restore.version: invalid (does not name a backup)\n");
	else if (w->rv_idx < 0)
		printf("restore.version: %s (no such backup)\n", w->rv);
	else if (w->v[w->rv_idx].complete)
		printf("restore.version: %s (complete)\n", w->rv);
	else
		printf("restore.version: %s (incomplete: %s)\n", w->rv, w->v[w->rv_idx].why);
}

int admin_cmd_backups(const struct opts *o)
{
	struct bview w;
	int rc = load_view(o, &w);

	if (rc) {
		bview_free(&w);
		return rc;
	}
	if (admin_json) {
		json_t *root = json_object(), *arr = json_array();
		json_bucket_head(root, o, &w);
		for (size_t i = 0; i < w.n; i++)
			json_array_append_new(arr, backup_json(&w, i));
		json_object_set_new(root, "backups", arr);
		print_json(root);
		bview_free(&w);
		return 0;
	}
	printf("bucket %s, job %s: %zu backup%s, %s\n", bkt_url(w.b), o->job, w.n, w.n == 1 ? "" : "s",
	       nodes_note(&w));
	rv_line(&w);
	if (w.n)
		printf("%-24s %10s %9s %12s  %s\n", "BACKUP", "STEP", "NODES OK", "DATA", "STATUS");
	for (size_t i = 0; i < w.n; i++) {
		const struct bk_backup *v = &w.v[i];
		char sz[32], nd[32];
		size_t shown = 0, bad = 0;

		admin_human_bytes(v->bytes, sz, sizeof(sz));
		snprintf(nd, sizeof(nd), "%u/%u", nodes_ok(v, w.nodes), w.nodes);
		printf("%-24s %10llu %9s %12s  %s%s%s\n", v->name, (unsigned long long)v->step, nd, sz,
		       v->complete ? "complete" : "incomplete", (long)i == w.pick ? "  <- restore" : "",
		       (long)i == w.rv_idx ? "  (restore.version)" : "");
		if (v->complete)
			continue;
		/* why, per node: the first reason (unless it is the first shard's),
		 * then each shard in trouble */
		for (size_t k = 0; k < v->nshards; k++) {
			const struct bk_shard *s = &v->shards[k];
			char line[200];
			if (s->complete)
				continue;
			snprintf(line, sizeof(line), "node %u worker %u: %s", s->node, s->worker, s->why);
			if (bad == 0 && strcmp(line, v->why))
				printf("    %s\n", v->why);
			if (bad++ >= 8)
				continue;
			printf("    %s\n", line);
			shown++;
		}
		if (bad == 0)
			printf("    %s\n", v->why);
		if (bad > shown)
			printf("      ... and %zu more\n", bad - shown);
	}
	if (w.n == 0)
		printf("(no backups)\n");
	printf("%s\n", w.pick_note);
	bview_free(&w);
	return 0;
}

int admin_cmd_restore_version(const struct opts *o)
{
	const char *sub = o->args[1];
	struct bview w;
	int rc;

	if (!strcmp(sub, "clear")) {
		char old[BK_NAME_MAX] = "";
		int had;
		memset(&w, 0, sizeof(w));
		if ((rc = open_bucket(o, &w.b)) != 0)
			return rc;
		had = bk_get_restore_version(w.b, o->job, old);
		if (had < 0 && had != -ENOENT && had != -EBADMSG) {
			rc = bucket_fail(&w, "reading restore.version", had);
		} else if ((rc = bk_clear_restore_version(w.b, o->job)) < 0) {
			rc = bucket_fail(&w, "deleting restore.version", rc);
		} else if (admin_json) {
			print_json(json_pack("{s:s,s:s,s:o,s:b}", "bucket", bkt_url(w.b), "job", o->job,
					     "previous", had == 0 ? json_string(old) : json_null(),
					     "cleared", had != -ENOENT));
		} else if (had == -ENOENT) {
			printf("restore.version was not set\n");
		} else {
			printf("restore.version cleared (was %s)\n", had == 0 ? old : "invalid");
		}
		bview_free(&w);
		return rc;
	}
	if (!strcmp(sub, "set") && !bk_backup_name_ok(o->args[2])) {
		fprintf(stderr, "mtcfs-admin: restore-version set: \"%s\" cannot be a backup name\n", o->args[2]);
		return 2;
	}
	if ((rc = load_view(o, &w)) != 0) {
		bview_free(&w);
		return rc;
	}
	if (!strcmp(sub, "show")) {
		const struct bk_backup *v = w.rv_idx >= 0 ? &w.v[w.rv_idx] : NULL;
		if (admin_json) {
			json_t *root = json_object();
			json_bucket_head(root, o, &w);
			json_object_set_new(root, "exists", json_boolean(v != NULL));
			json_object_set_new(root, "complete", json_boolean(v && v->complete));
			json_object_set_new(root, "step", v ? json_integer((json_int_t)v->step) : json_null());
			json_object_set_new(root, "why", v && !v->complete ? json_string(v->why) : json_null());
			print_json(root);
		} else if (w.rv_rc == -ENOENT) {
			printf("none\n%s\n", w.pick_note);
		} else if (w.rv_rc == -EBADMSG) {
			printf("invalid\nrestore.version does not name a backup: nothing would be restored "
			       "(`restore-version clear` removes it)\n");
		} else if (!v) {
			printf("%s\nno such backup: %s\n", w.rv, w.pick_note);
		} else if (v->complete) {
			printf("%s\ncomplete (step %llu): a restore from the bucket would use it\n", w.rv,
			       (unsigned long long)v->step);
		} else {
			printf("%s\nincomplete: %s\n%s\n", w.rv, v->why, w.pick_note);
		}
		rc = w.rv_rc == -EBADMSG ? 1 : 0;
		bview_free(&w);
		return rc;
	}
	/* set NAME */
	{
		const char *name = o->args[2];
		const struct bk_backup *v = NULL;
		char why[700] = "";
		for (size_t i = 0; i < w.n; i++)
			if (!strcmp(w.v[i].name, name))
				v = &w.v[i];
		if (!v)
			snprintf(why, sizeof(why), "job %s has no backup %s in %s", o->job, name, bkt_url(w.b));
		else if (!v->complete)
			snprintf(why, sizeof(why), "backup %s is incomplete: %s", name, v->why);
		if (why[0] && !o->force) {
			fprintf(stderr, "mtcfs-admin: restore-version set refused: %s (a restore would find "
				"nothing to restore; --force sets it anyway)\n", why);
			if (admin_json)
				print_json(json_pack("{s:s,s:s,s:b,s:s}", "bucket", bkt_url(w.b), "job", o->job,
						     "refused", 1, "reason", why));
			bview_free(&w);
			return 1;
		}
		rc = bk_set_restore_version(w.b, o->job, name);
		if (rc < 0) {
			rc = bucket_fail(&w, "writing restore.version", rc);
			bview_free(&w);
			return rc;
		}
		if (admin_json) {
			print_json(json_pack("{s:s,s:s,s:s,s:o,s:b,s:b,s:o}", "bucket", bkt_url(w.b),
					     "job", o->job, "restore_version", name, "previous",
					     w.rv_rc == 0 ? json_string(w.rv) : json_null(),
					     "complete", v && v->complete, "forced", why[0] != 0,
					     "why", why[0] ? json_string(why) : json_null()));
		} else {
			printf("restore.version = %s (was %s)%s%s\n", name,
			       w.rv_rc == 0 ? w.rv : w.rv_rc == -EBADMSG ? "invalid" : "none",
			       why[0] ? "; forced: " : "", why);
		}
		bview_free(&w);
		return 0;
	}
}

/* ---- prune --delete: every object of a backup, the .meta files first ---- */

struct dobj {
	char *name;
	uint64_t size;
	int phase;                  /* 0 .meta, 1 .manifest, 2 data and the rest */
	uint64_t node, worker;      /* .meta: the order within phase 0 */
};

struct dlist {
	struct dobj *v;
	size_t n, cap;
	const char *job;
	size_t skip;                /* "JOB/NAME/" */
};

static int dlist_add(void *arg, const struct bkt_entry *e)
{
	struct dlist *d = arg;
	const char *rel = e->name + d->skip;
	struct dobj *o;
	size_t rl = strlen(rel);

	if (e->is_prefix || strlen(e->name) < d->skip)
		return 0;
	if (d->n == d->cap) {
		size_t nc = d->cap ? d->cap * 2 : 64;
		struct dobj *nv = realloc(d->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		d->v = nv;
		d->cap = nc;
	}
	o = &d->v[d->n];
	memset(o, 0, sizeof(*o));
	o->name = strdup(e->name);
	if (!o->name)
		return -ENOMEM;
	o->size = e->size;
	o->phase = 2;
	o->node = o->worker = UINT64_MAX;
	if (!strchr(rel, '/') && rl > 5 && !strcmp(rel + rl - 5, ".meta")) {
		/* "<job>-s<step>-n<node>-w<w>.meta": node 0 first, so what is left of a
		 * half-deleted backup never looks complete, even judged by its own names */
		const char *n = strrchr(rel, 'n'), *w = strrchr(rel, 'w');
		char *end;
		o->phase = 0;
		if (n && w && n > rel && n[-1] == '-' && w > n) {
			unsigned long long nv = strtoull(n + 1, &end, 10), wv;
			if (*end == '-' && end + 1 == w) {
				wv = strtoull(w + 1, &end, 10);
				if (!strcmp(end, ".meta")) {
					o->node = nv;
					o->worker = wv;
				}
			}
		}
	} else if (!strchr(rel, '/') && rl > 9 && !strcmp(rel + rl - 9, ".manifest")) {
		o->phase = 1;
	}
	d->n++;
	return 0;
}

static int dobj_cmp(const void *pa, const void *pb)
{
	const struct dobj *a = pa, *b = pb;

	if (a->phase != b->phase)
		return a->phase - b->phase;
	if (a->node != b->node)
		return a->node < b->node ? -1 : 1;
	if (a->worker != b->worker)
		return a->worker < b->worker ? -1 : 1;
	return strcmp(a->name, b->name);
}

static void dlist_free(struct dlist *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->v[i].name);
	free(d->v);
	memset(d, 0, sizeof(*d));
}

struct delrun {
	struct bkt *b;
	const struct dobj *v;
	size_t from, to;            /* this phase's objects */
	atomic_size_t next;
	atomic_size_t done;         /* over the whole prune */
	atomic_uint_fast64_t bytes;
	pthread_mutex_t mu;
	int rc;                     /* first failure; protected by mu */
	char err[768];              /* protected by mu */
};

static void *del_worker(void *arg)
{
	struct delrun *r = arg;

	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		int rc;

		if (i >= r->to)
			break;
		pthread_mutex_lock(&r->mu);
		rc = r->rc;
		pthread_mutex_unlock(&r->mu);
		if (rc)
			break;              /* stop at the first failure */
		rc = bkt_delete(r->b, r->v[i].name);
		if (rc == -ENOENT)
			rc = 0;             /* gone already */
		if (rc < 0) {
			pthread_mutex_lock(&r->mu);
			if (!r->rc) {
				r->rc = rc;
				snprintf(r->err, sizeof(r->err), "%s: %s", r->v[i].name,
					 bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
			}
			pthread_mutex_unlock(&r->mu);
			break;
		}
		atomic_fetch_add(&r->done, 1);
		atomic_fetch_add(&r->bytes, r->v[i].size);
	}
	return NULL;
}

static void del_progress(struct delrun *r, const char *name, size_t total, uint64_t total_bytes,
			 uint64_t t0)
{
	size_t done = atomic_load(&r->done);
	uint64_t bytes = atomic_load(&r->bytes);
	double secs = (double)(util_now_ns() - t0) / 1e9, rate = secs > 0 ? (double)done / secs : 0;
	char b1[32], b2[32];

	admin_human_bytes(bytes, b1, sizeof(b1));
	admin_human_bytes(total_bytes, b2, sizeof(b2));
	fprintf(stderr, "\r%-24.24s %zu/%zu objects  %s/%s  %.0f obj/s  ETA %4.0fs ", name, done, total,
		b1, b2, rate, rate > 0 ? (double)(total - done) / rate : 0.0);
}

/* Delete objects [from, to) of v with up to threads at once, showing progress. */
static int del_phase(struct delrun *r, size_t from, size_t to, int threads, bool tty,
		     const char *name, size_t total, uint64_t total_bytes, uint64_t t0)
{
	pthread_t th[DEL_THREADS];
	int nt = 0;

	if (from >= to)
		return r->rc;
	r->from = from;
	r->to = to;
	atomic_store(&r->next, from);
	if (threads > DEL_THREADS)
		threads = DEL_THREADS;
	if ((size_t)threads > to - from)
		threads = (int)(to - from);
	for (int i = 1; i < threads; i++)
		if (pthread_create(&th[nt], NULL, del_worker, r) == 0)
			nt++;
	if (!tty) {
		del_worker(r);
	} else {
		/* a helper thread deletes too; this one draws the progress line */
		pthread_t self_th;
		bool started = pthread_create(&self_th, NULL, del_worker, r) == 0;
		if (!started)
			del_worker(r);
		/* until the helper is done: it stops when the objects run out or
		 * at the first failure, like every worker */
		while (started && pthread_tryjoin_np(self_th, NULL) == EBUSY) {
			struct timespec ts = { 0, 200 * 1000 * 1000 };
			del_progress(r, name, total, total_bytes, t0);
			nanosleep(&ts, NULL);
		}
	}
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	if (tty)
		del_progress(r, name, total, total_bytes, t0);
	return r->rc;
}

/* ---- prune ---- */

static void policy_words(const struct opts *o, char *out, size_t len)
{
	size_t l = 0;

	out[0] = '\0';
	for (int k = 0; k < PRUNE_NKINDS; k++)
		if (o->keep[k] && l < len)
			l += (size_t)snprintf(out + l, len - l, "%skeep-%s %u", l ? ", " : "",
					      prune_kind_name((enum prune_kind)k), o->keep[k]);
	if (!l)
		l += (size_t)snprintf(out, len, "every complete backup");
	else if (l < len)
		l += (size_t)snprintf(out + l, len - l, "; a period keeps its %s backup%s",
				      o->prefer_recent ? "newest" : "oldest",
				      o->prefer_recent ? " (--prefer-recent)" : "");
	if (o->incomplete_set && l < len)
		snprintf(out + l, len - l, "; incomplete backups that started more than %s ago go, "
			 "but the newest", o->incomplete_arg);
}

static json_t *reasons_json(const struct prune_item *it)
{
	json_t *a = json_array();
	char buf[64];
	static const struct { unsigned bit; const char *word; } prot[] = {
		{ PRUNE_RESTORE_PICK, "restore-pick" }, { PRUNE_RESTORE_VERSION, "restore-version" },
		{ PRUNE_NEWEST_COMPLETE, "newest-complete" }, { PRUNE_IN_PROGRESS, "in-progress" },
		{ PRUNE_UNDATED, "not-a-timestamp" }, { PRUNE_HELD, "complete-for-fewer-nodes" },
	};

	if (it->flags & (1u << PRUNE_LAST)) {
		snprintf(buf, sizeof(buf), "last #%u", it->last_rank);
		json_array_append_new(a, json_string(buf));
	}
	for (int k = PRUNE_HOURLY; k < PRUNE_NKINDS; k++) {
		if (!(it->flags & (1u << k)))
			continue;
		snprintf(buf, sizeof(buf), "%s %s", prune_kind_name((enum prune_kind)k), it->label[k]);
		json_array_append_new(a, json_string(buf));
	}
	for (size_t i = 0; i < sizeof(prot) / sizeof(prot[0]); i++)
		if (it->flags & prot[i].bit)
			json_array_append_new(a, json_string(prot[i].word));
	return a;
}

/* The policy the --keep-* and --incomplete-older-than options give. 0, or
 * 2: refused, it would keep nothing. */
static int prune_policy_of(const struct opts *o, struct prune_policy *pol)
{
	bool any = false;

	*pol = (struct prune_policy){ .prefer_recent = o->prefer_recent };
	for (int k = 0; k < PRUNE_NKINDS; k++) {
		pol->keep[k] = o->keep[k];
		any |= o->keep[k] > 0;
	}
	if (!any && !o->incomplete_set) {
		fprintf(stderr, "mtcfs-admin prune: no --keep-* option above 0: the policy would keep nothing "
			"(refusing; see mtcfs-admin prune --help)\n");
		return 2;
	}
	/* --incomplete-older-than alone removes failed attempts only: every
	 * complete backup stays */
	if (!any)
		pol->keep[PRUNE_LAST] = UINT_MAX;
	if (o->incomplete_set) {
		time_t now = time(NULL);
		pol->incomplete_before = (int64_t)now - (int64_t)o->incomplete_older_s;
		if (pol->incomplete_before < 1)
			pol->incomplete_before = 1;
	}
	return 0;
}

/* The plan's head: the bucket, the policy, whether it is a dry run (members
 * of root; the text's first lines and the table's column heads). */
static void prune_head(const struct opts *o, const struct bview *w, json_t *root)
{
	char policy[256];

	policy_words(o, policy, sizeof(policy));
	json_bucket_head(root, o, w);
	json_object_set_new(root, "policy", json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:b}",
		"keep_last", (int)o->keep[PRUNE_LAST], "keep_hourly", (int)o->keep[PRUNE_HOURLY],
		"keep_daily", (int)o->keep[PRUNE_DAILY], "keep_weekly", (int)o->keep[PRUNE_WEEKLY],
		"keep_monthly", (int)o->keep[PRUNE_MONTHLY], "keep_yearly", (int)o->keep[PRUNE_YEARLY],
		"prefer_recent", o->prefer_recent));
	json_object_set_new(json_object_get(root, "policy"), "incomplete_older_than_s",
			    o->incomplete_set ? json_integer((json_int_t)o->incomplete_older_s) : json_null());
	json_object_set_new(root, "dry_run", json_boolean(!o->del));
	if (!admin_json) {
		printf("bucket %s, job %s: %zu backup%s, %s\n", bkt_url(w->b), o->job, w->n, w->n == 1 ? "" : "s",
		       nodes_note(w));
		printf("policy: %s\n", policy);
		rv_line(w);
		printf("%s\n", w->pick_note);
		if (w->n)
			printf("%-6s %-24s %10s %-11s %12s  %s\n", "ACTION", "BACKUP", "STEP", "COMPLETE", "DATA",
			       "REASON");
	}
}

/* The plan, a row per backup: keep or delete, and why (root's "backups").
 * *nplan: how many it deletes, *bytes: their data. */
static void prune_rows(const struct bview *w, json_t *root, size_t *nplan, uint64_t *bytes)
{
	json_t *arr = json_array();
	char why[1024];

	for (size_t i = 0; i < w->n; i++) {
		const struct prune_item *it = &w->items[i];
		const struct bk_backup *v = &w->v[i];
		char sz[32];

		snprintf(why, sizeof(why), "%s", it->why);
		if (!it->keep && !v->complete) {
			size_t l = strlen(why);
			snprintf(why + l, sizeof(why) - l, " (%s)", v->why);
		}
		if (!it->keep) {
			(*nplan)++;
			*bytes += v->bytes;
		}
		json_array_append_new(arr, json_pack("{s:s,s:I,s:b,s:I,s:s,s:o,s:s}", "name", v->name,
			"step", (json_int_t)v->step, "complete", v->complete, "bytes", (json_int_t)v->bytes,
			"action", it->keep ? "keep" : "delete", "reasons", reasons_json(it), "why", why));
		if (!admin_json) {
			admin_human_bytes(v->bytes, sz, sizeof(sz));
			printf("%-6s %-24s %10llu %-11s %12s  %s\n", it->keep ? "keep" : "delete", v->name,
			       (unsigned long long)v->step, v->complete ? "yes" : w->ambiguous[i] ? "fewer-nodes" : "no",
			       sz, why);
		}
	}
	json_object_set_new(root, "backups", arr);
}

/* --delete. restore.version may have changed since the plan: read it
 * again. 0, or the exit code (1: the plan deletes what it names now). */
static int prune_recheck_rv(const struct opts *o, const struct bview *w)
{
	char rv2[BK_NAME_MAX] = "";
	int rc2 = bk_get_restore_version(w->b, o->job, rv2);

	if (rc2 < 0 && rc2 != -ENOENT && rc2 != -EBADMSG)
		return bucket_fail(w, "reading restore.version", rc2);
	for (size_t i = 0; rc2 == 0 && i < w->n; i++) {
		if (!w->items[i].keep && !strcmp(w->v[i].name, rv2)) {
			fprintf(stderr, "mtcfs-admin prune: restore.version changed to %s, which this plan "
				"deletes; nothing deleted, run prune again\n", rv2);
			return 1;
		}
	}
	return 0;
}

/* The objects of each backup the plan deletes, into dl[i], in the order
 * they go; *total of them, *bytes their size. 0 or the exit code. */
static int prune_list(const struct opts *o, const struct bview *w, struct dlist *dl, size_t *total,
		      uint64_t *bytes)
{
	int rc;

	*bytes = 0;
	for (size_t i = 0; i < w->n; i++) {
		char prefix[PATH_MAX];
		if (w->items[i].keep)
			continue;
		snprintf(prefix, sizeof(prefix), "%s/%s/", o->job, w->v[i].name);
		dl[i].skip = strlen(prefix);
		dl[i].job = o->job;
		rc = bkt_list_ex(w->b, prefix, NULL, dlist_add, &dl[i]);
		if (rc < 0)
			return bucket_fail(w, "listing a backup to delete", rc);
		if (dl[i].n)
			qsort(dl[i].v, dl[i].n, sizeof(*dl[i].v), dobj_cmp);
		*total += dl[i].n;
		for (size_t k = 0; k < dl[i].n; k++)
			*bytes += dl[i].v[k].size;
	}
	return 0;
}

/* Deletes the backups the plan deletes, oldest first (an interrupted prune
 * leaves the newer ones), with r's workers; root's "deleted" and the
 * summary line. 0, or 3: a delete failed (reported). */
static int prune_delete(const struct bview *w, struct dlist *dl, struct delrun *r, json_t *root,
			size_t nplan, size_t total, uint64_t total_bytes, bool tty)
{
	json_t *deleted = json_array();
	uint64_t t0 = util_now_ns();
	size_t ndel = 0;
	double secs;
	char sz[32];

	for (size_t i = w->n; i-- > 0;) {
		size_t m = 0, f = 0, done0 = atomic_load(&r->done);
		uint64_t bytes0 = atomic_load(&r->bytes);
		struct dlist *d = &dl[i];

		if (w->items[i].keep)
			continue;
		while (m < d->n && d->v[m].phase == 0)
			m++;
		f = m;
		while (f < d->n && d->v[f].phase == 1)
			f++;
		r->v = d->v;
		/* the .meta files first, one at a time, node 0 first; then the
		 * manifests; then the data: never a complete-looking half backup */
		if (del_phase(r, 0, m, 1, tty, w->v[i].name, total, total_bytes, t0) == 0 &&
		    del_phase(r, m, f, DEL_THREADS, tty, w->v[i].name, total, total_bytes, t0) == 0)
			del_phase(r, f, d->n, DEL_THREADS, tty, w->v[i].name, total, total_bytes, t0);
		if (tty)
			fprintf(stderr, "\r%-100s\r", "");
		if (r->rc) {
			fprintf(stderr, "mtcfs-admin prune: deleting backup %s failed: %s (its .meta files go "
				"first: what is left is incomplete and the next prune deletes it)\n",
				w->v[i].name, r->err);
			break;
		}
		ndel++;
		json_array_append_new(deleted, json_pack("{s:s,s:I,s:I}", "name", w->v[i].name, "objects",
			(json_int_t)(atomic_load(&r->done) - done0), "bytes",
			(json_int_t)(atomic_load(&r->bytes) - bytes0)));
		if (!admin_json)
			printf("deleted %s: %zu objects, %llu bytes\n", w->v[i].name, atomic_load(&r->done) - done0,
			       (unsigned long long)(atomic_load(&r->bytes) - bytes0));
	}
	secs = (double)(util_now_ns() - t0) / 1e9;
	admin_human_bytes(atomic_load(&r->bytes), sz, sizeof(sz));
	json_object_set_new(root, "deleted", json_pack("{s:o,s:I,s:I,s:f,s:b}", "backups", deleted,
		"objects", (json_int_t)atomic_load(&r->done), "bytes", (json_int_t)atomic_load(&r->bytes),
		"seconds", secs, "ok", r->rc == 0));
	if (!admin_json)
		printf("deleted %zu of %zu backup%s: %zu objects, %s in %.2f s\n", ndel, nplan,
		       nplan == 1 ? "" : "s", atomic_load(&r->done), sz, secs);
	return r->rc ? 3 : 0;
}

int admin_cmd_prune(const struct opts *o)
{
	struct prune_policy pol;
	struct prune_result res;
	struct bview w;
	struct delrun *r = NULL;
	struct dlist *dl = NULL;
	json_t *root = NULL;
	size_t nplan = 0, total = 0;
	uint64_t total_bytes = 0;
	bool tty = isatty(STDERR_FILENO) && !admin_json;
	int rc = prune_policy_of(o, &pol);

	if (rc)
		return rc;
	if ((rc = load_view(o, &w)) != 0) {
		bview_free(&w);
		return rc;
	}
	if (prune_plan(&pol, w.rv_rc == 0 ? w.rv : NULL, w.rv_rc == -EBADMSG, w.items, w.n, &res) < 0) {
		rc = bucket_fail(&w, "memory", -ENOMEM);
		goto out;
	}
	root = json_object();
	prune_head(o, &w, root);
	prune_rows(&w, root, &nplan, &total_bytes);
	json_object_set_new(root, "keep", json_integer((json_int_t)res.kept));
	json_object_set_new(root, "delete", json_integer((json_int_t)res.pruned));
	if (!o->del) {
		if (!admin_json) {
			char sz[32];
			admin_human_bytes(total_bytes, sz, sizeof(sz));
			printf("dry run: would delete %zu of %zu backup%s (%s of data), keep %zu; --delete deletes them\n",
			       nplan, w.n, w.n == 1 ? "" : "s", sz, res.kept);
		}
		rc = 0;
		goto out;
	}
	if ((rc = prune_recheck_rv(o, &w)) != 0)
		goto out;
	dl = calloc(w.n ? w.n : 1, sizeof(*dl));
	r = calloc(1, sizeof(*r));
	if (!dl || !r) {
		rc = bucket_fail(&w, "memory", -ENOMEM);
		goto out;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->b = w.b;
	if ((rc = prune_list(o, &w, dl, &total, &total_bytes)) != 0)
		goto out;
	rc = prune_delete(&w, dl, r, root, nplan, total, total_bytes, tty);
out:
	if (root && admin_json && (rc == 0 || r))
		print_json(root);   /* a failed delete still reports what it did */
	else
		json_decref(root);
	for (size_t i = 0; dl && i < w.n; i++)
		dlist_free(&dl[i]);
	free(dl);
	if (r)
		pthread_mutex_destroy(&r->mu);
	free(r);
	bview_free(&w);
	return rc;
}
