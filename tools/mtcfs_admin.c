/* mtcfs-admin: the operator's view of a node and of a job's bucket. This
 * file has main, the command table, option parsing and help; the node
 * commands (read RAMDIR's catalog read-only, safe while the daemon runs, and
 * ask the running daemons) are admin_node.c's, the bucket commands (backups,
 * restore-version, prune through tiers/backup) admin_bucket.c's. Exit codes:
 * 0 ok, 1 a check failed or the request was refused, 2 usage, 3 cannot read
 * the node's state or the bucket. */
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

bool admin_json;   /* --json: every command prints one JSON document */

void admin_human_bytes(uint64_t v, char *out, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(out, len, "%llu B", (unsigned long long)v);
	else
		snprintf(out, len, "%.1f %s", d, units[u]);
}

/* ---- the command table, options, help ---- */

enum {
	O_JSON = 1u << 0, O_JOB = 1u << 1, O_WATCH = 1u << 2, O_BUCKET = 1u << 3,
	O_NODES = 1u << 4, O_FORCE = 1u << 5, O_DELETE = 1u << 6, O_KEEP = 1u << 7,
	O_VERIFY = 1u << 8,
};

#define BUCKET_OPTS \
	"  --bucket URL          gs://BUCKET[/PREFIX] or file:///PATH (the mount's bucket=)\n" \
	"  --job NAME            the job (the replicator.yaml's job-name)\n" \
	"  --gcs-endpoint URL    Cloud Storage endpoint (else STORAGE_EMULATOR_HOST, else Google's)\n" \
	"  --key-file PATH       service-account JSON key (else GOOGLE_APPLICATION_CREDENTIALS, else\n" \
	"                        the metadata server; none with STORAGE_EMULATOR_HOST)\n" \
	"  --ramdir RAMDIR       a node's RAM tier: --bucket, --gcs-endpoint and --key-file\n" \
	"                        default to the daemon's bucket=, gcs_endpoint=, gcs_key_file=\n" \
	"                        (recorded in RAMDIR's catalog at mount), --job to the job-name\n" \
	"                        of the last replicator.yaml the node accepted\n" \
	"  --json                one JSON document on stdout\n"

#define NODES_OPT \
	"  --nodes N             judge completeness for N nodes (the job's node count); default:\n" \
	"                        the most nodes any backup's .meta names show (a backup complete\n" \
	"                        only for fewer nodes is shown incomplete, and prune keeps it)\n"

#define EXIT_CODES \
	"exit: 0 ok, 1 a check failed or the request was refused, 2 usage, 3 cannot read the\n" \
	"      node or the bucket\n"

struct command {
	const char *name;
	unsigned opts;
	int nargs_min, nargs_max;   /* positional arguments after the command */
	const char *synopsis;
	const char *help;
};

static const struct command commands[] = {
	{ "ls", O_JSON | O_JOB | O_WATCH, 1, 1, "ls RAMDIR [--job NAME] [--json]",
	  "The shards in the node's catalog (readable while the daemon runs) with state, content\n"
	  "hash, and every file's size and CRC32C.\n" EXIT_CODES },
	{ "steps", O_JSON | O_JOB | O_WATCH, 1, 1, "steps RAMDIR [--job NAME] [--json]",
	  "The step x node matrix: for each step and each node's shard, the ranks holding a verified\n"
	  "copy in RAM, whether the step is complete (which nodes' shards are missing when not), and\n"
	  "the LKG. Asks the coordinator and every node (found via RAMDIR's catalog); when they\n"
	  "cannot be reached it says so and shows this node's view.\n" EXIT_CODES },
	{ "status", O_JSON | O_JOB | O_WATCH, 1, 1, "status RAMDIR [--watch] [--json]",
	  "Phase, job, rank, peers and their reachability, RAM use, last commit, replication lag.\n"
	  "--watch redraws every second (clearing the screen on a terminal only).\n"
	  "exit: 0 the daemon runs, 1 it does not, 2 usage, 3 cannot read the node\n" },
	{ "verify", O_JSON | O_JOB | O_WATCH, 1, 1, "verify RAMDIR [--job NAME] [--json]",
	  "Re-read every local shard and check each file's CRC32C against its manifest. Progress\n"
	  "(MiB/s, ETA) on stderr when it is a terminal.\n"
	  "A shard marked bad by mtcfs, or whose seal never finished, fails the check too.\n"
	  "exit: 0 all good, 1 a shard is bad or not sealed, 2 usage, 3 cannot read the node\n" },
	{ "backups", O_JSON | O_JOB | O_BUCKET | O_NODES | O_VERIFY, 0, 0,
	  "backups {--bucket URL --job NAME | --ramdir RAMDIR} [--nodes N] [--verify] [--json]",
	  "The job's backups in the bucket, newest first: step, data bytes, how many nodes' shards\n"
	  "are complete, and for an incomplete backup why, per node (a missing .meta, manifest or\n"
	  "data file, a size or CRC32C mismatch, mixed steps). Says which backup a restore from the\n"
	  "bucket would use: the one restore.version names if it is complete (if it is incomplete\n"
	  "or missing, nothing is restored: no fallback), else the newest complete backup. (The\n"
	  "daemon restores from the bucket when restore.version is set or when no step is complete\n"
	  "in the cluster's RAM.)\n"
	  "Without --verify only listings are read: sizes, and CRC32C where the bucket lists them\n"
	  "(gs://; file:// lists none), so a backup whose bytes were changed in place looks complete.\n"
	  "--verify reads every data file of the backup a restore would use and checks its CRC32C;\n"
	  "one that fails is shown as corrupt and, as the daemon does, the next complete one is\n"
	  "tried (restore.version's: nothing is restored).\n\n" BUCKET_OPTS NODES_OPT
	  "  --verify              read the data of the backup a restore would use\n"
	  "exit: 0 the bucket was read (whatever it holds; JSON \"restore\" is null when nothing\n"
	  "      would be restored), 2 usage, 3 cannot read the bucket\n" },
	{ "restore-version", O_JSON | O_JOB | O_BUCKET | O_NODES | O_FORCE, 1, 2,
	  "restore-version set NAME | clear | show {--bucket URL --job NAME | --ramdir RAMDIR} [--force] [--json]",
	  "JOB/restore.version names the backup the next restore must use (no fallback). The daemon\n"
	  "deletes it after the first commit that follows a restore from it.\n"
	  "  show        first line: the name, or \"none\"; then whether that backup is complete and\n"
	  "              what a restore would do (exit 0; 1 when the file names no valid backup)\n"
	  "  set NAME    refuses (exit 1, with the reason) a backup that does not exist or is\n"
	  "              incomplete, unless --force\n"
	  "  clear       delete it (exit 0 also when it was not set)\n\n" BUCKET_OPTS NODES_OPT
	  "  --force               set even a missing or incomplete backup\n" EXIT_CODES },
	{ "prune", O_JSON | O_JOB | O_BUCKET | O_NODES | O_DELETE | O_KEEP, 0, 0,
	  "prune {--bucket URL --job NAME | --ramdir RAMDIR} [--keep-last N] [--keep-hourly N] [--keep-daily N]\n"
	  "         [--keep-weekly N] [--keep-monthly N] [--keep-yearly N] [--prefer-recent]\n"
	  "         [--incomplete-older-than AGE] [--delete] [--json]",
	  "Retention policy for the job's backups (like restic/borg forget). Backup names are UTC\n"
	  "timestamps YYYY-MM-DD_HH-MM[-N]. Only complete backups count for the policy; a backup is\n"
	  "kept when any rule keeps it:\n"
	  "  --keep-last N     the N newest complete backups\n"
	  "  --keep-hourly N   one backup for each of the N newest UTC hours that have one\n"
	  "  --keep-daily N    ... UTC days ...\n"
	  "  --keep-weekly N   ... ISO 8601 weeks, Monday..Sunday (2027-01-01 is in 2026-W53) ...\n"
	  "  --keep-monthly N  ... UTC months ...\n"
	  "  --keep-yearly N   ... UTC years ...\n"
	  "                    (periods without a complete backup do not count)\n"
	  "  --prefer-recent   a period's NEWEST backup represents it (restic's and borg's rule);\n"
	  "                    by default its OLDEST does (the first backup of a period stays its\n"
	  "                    representative as newer ones arrive)\n"
	  "Never deleted, whatever the policy: the backup a restore would use, the one\n"
	  "restore.version names, the newest complete backup, incomplete backups newer than it\n"
	  "(they may still be uploading), backups complete only for fewer nodes than --nodes\n"
	  "defaults to, names that are not timestamps. Everything else is deleted: complete backups\n"
	  "no rule keeps and incomplete backups older than the newest complete one.\n"
	  "  --incomplete-older-than AGE\n"
	  "                    failed attempts stop accumulating: incomplete backups that started\n"
	  "                    (their name's minute) more than AGE ago (90s, 30m, 2h, 7d) are deleted\n"
	  "                    even when newer than the newest complete one; never the newest of\n"
	  "                    them (it may be uploading now), never a complete backup. Alone, it\n"
	  "                    keeps every complete backup\n"
	  "Dry run by default: prints each backup with keep/delete and the reasons.\n"
	  "  --delete          delete the pruned backups, oldest first: every object under\n"
	  "                    JOB/NAME/, the .meta files first (node 0 first), then the manifests,\n"
	  "                    then the data, so a half-deleted backup is never complete-looking;\n"
	  "                    progress (objects, bytes, rate, ETA) on stderr when it is a terminal\n"
	  "At least one --keep-* above 0 (or --incomplete-older-than) is required.\n\n"
	  BUCKET_OPTS NODES_OPT
	  "exit: 0 planned (dry run) or deleted, 1 refused (restore.version changed meanwhile),\n"
	  "      2 usage, 3 cannot read the bucket or a delete failed\n" },
};

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mtcfs-admin COMMAND [ARGS] [--json]     (mtcfs-admin COMMAND --help: details;\n"
		"       mtcfs-admin --version)\n\n"
		"node commands (RAMDIR: the node's RAM tier directory; its catalog is read read-only):\n"
		"  ls RAMDIR [--job NAME]   shards in the node's catalog with their files, sizes, CRC32C\n"
		"  steps RAMDIR [--job NAME] step x node matrix: which nodes hold each node's shard, the LKG\n"
		"  status RAMDIR [--watch]  phase, job, rank, peers and their reachability, RAM use, last commit, replication lag\n"
		"  verify RAMDIR [--job NAME] re-check the CRC32C of every local shard and erasure-code\n"
		"                            fragment; exit 1 on any mismatch\n\n"
		"bucket commands (--bucket gs://BUCKET[/PREFIX] | file:///PATH --job NAME; also\n"
		"--gcs-endpoint URL, --key-file PATH; STORAGE_EMULATOR_HOST is honoured; or\n"
		"--ramdir RAMDIR: the bucket options that node was mounted with and its job):\n"
		"  backups [--nodes N]      the job's backups: step, size, completeness per node (why not),\n"
		"                           and which one a restore would use\n"
		"  restore-version set NAME [--force] | clear | show\n"
		"                           the backup the next restore must use\n"
		"  prune --keep-{last,hourly,daily,weekly,monthly,yearly} N [--prefer-recent] [--delete]\n"
		"                           retention policy for backups; dry run unless --delete\n"
		"  help [COMMAND]           this text, or a command's\n\n"
		EXIT_CODES);
}

static void command_help(const struct command *c, FILE *f)
{
	fprintf(f, "usage: mtcfs-admin %s\n\n%s", c->synopsis, c->help);
}

static int parse_count(const char *opt, const char *s, uint64_t max, uint64_t *v)
{
	if (!s || util_parse_u64(s, max, v) < 0) {
		fprintf(stderr, "mtcfs-admin: %s needs a number 0..%llu, not \"%s\"\n", opt,
			(unsigned long long)max, s ? s : "");
		return -EINVAL;
	}
	return 0;
}

/* "90s", "30m", "2h", "7d": seconds into *v; at least 1 s, at most 10 years. */
static int parse_duration(const char *opt, const char *s, uint64_t *v)
{
	static const struct { char unit; uint64_t secs; } units[] = {
		{ 's', 1 }, { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 },
	};
	char num[24];
	size_t l = s ? strlen(s) : 0;
	uint64_t n;

	for (size_t i = 0; l >= 2 && l - 1 < sizeof(num) && i < sizeof(units) / sizeof(units[0]); i++) {
		if (s[l - 1] != units[i].unit)
			continue;
		memcpy(num, s, l - 1);
		num[l - 1] = '\0';
		if (util_parse_u64(num, 10ULL * 366 * 86400 / units[i].secs, &n) < 0 || n == 0)
			break;
		*v = n * units[i].secs;
		return 0;
	}
	fprintf(stderr, "mtcfs-admin: %s needs a duration like 90s, 30m, 2h or 7d, not \"%s\"\n", opt,
		s ? s : "");
	return -EINVAL;
}

/* RAMDIR's configuration, for the bucket commands: the bucket=,
 * gcs_endpoint= and gcs_key_file= mount options the daemon recorded in the
 * catalog when it started (meta "daemon") and the job-name of the last
 * replicator.yaml it accepted (meta "config"). Only what the command line
 * left out is taken; endpoint and key only with the recorded bucket. The
 * strings live in static storage until exit. 0, or an exit code. */
static int opts_from_ramdir(const char *cmd, struct opts *o)
{
	static char bucket[4096], endpoint[1024], key[PATH_MAX], job[RCFG_JOB_MAX + 1];
	struct idx *x = NULL;
	struct rcfg cfg = { 0 };
	char err[256], *config;
	json_t *d;

	if (admin_open_catalog(o->ramdir, &x) < 0)
		return 3;
	d = admin_meta_json(x, "daemon");
	config = admin_meta_str(x, "config");
	idx_close(x);
	if (!o->bucket) {
		const char *b = json_string_value(json_object_get(d, "bucket"));
		const char *ep = json_string_value(json_object_get(d, "gcs_endpoint"));
		const char *kf = json_string_value(json_object_get(d, "gcs_key_file"));
		if (b && snprintf(bucket, sizeof(bucket), "%s", b) < (int)sizeof(bucket)) {
			o->bucket = bucket;
			if (ep && !o->gcs_endpoint &&
			    snprintf(endpoint, sizeof(endpoint), "%s", ep) < (int)sizeof(endpoint))
				o->gcs_endpoint = endpoint;
			if (kf && !o->key_file && snprintf(key, sizeof(key), "%s", kf) < (int)sizeof(key))
				o->key_file = key;
		} else {
			fprintf(stderr, "mtcfs-admin %s: %s: %s; give --bucket URL\n", cmd, o->ramdir,
				d ? "the node was mounted without bucket=" : "no daemon has recorded its options");
		}
	}
	if (!o->job) {
		if (config && rcfg_parse(config, strlen(config), NULL, &cfg, err, sizeof(err)) == 0 &&
		    snprintf(job, sizeof(job), "%s", cfg.job) < (int)sizeof(job) && job[0])
			o->job = job;
		else
			fprintf(stderr, "mtcfs-admin %s: %s: no replicator.yaml configured a job yet; "
				"give --job NAME\n", cmd, o->ramdir);
		rcfg_free(&cfg);
	}
	json_decref(d);
	free(config);
	return 0;
}

static const char *const keep_opts[PRUNE_NKINDS] = {
	"--keep-last", "--keep-hourly", "--keep-daily", "--keep-weekly", "--keep-monthly",
	"--keep-yearly",
};

/* A flag (an option without a value) into *o, *bit its class; false: a
 * is not one. */
static bool flag_option(const char *a, struct opts *o, unsigned *bit)
{
	if (!strcmp(a, "--json")) {
		admin_json = true;
		*bit = O_JSON;
	} else if (!strcmp(a, "--watch")) {
		o->watch = true;
		*bit = O_WATCH;
	} else if (!strcmp(a, "--force")) {
		o->force = true;
		*bit = O_FORCE;
	} else if (!strcmp(a, "--verify")) {
		o->verify = true;
		*bit = O_VERIFY;
	} else if (!strcmp(a, "--delete")) {
		o->del = true;
		*bit = O_DELETE;
	} else if (!strcmp(a, "--prefer-recent")) {
		o->prefer_recent = true;
		*bit = O_KEEP;
	} else {
		return false;
	}
	return true;
}

/* Whether a is an option that takes a value (k: its index in keep_opts,
 * PRUNE_NKINDS if none). */
static bool takes_value(const char *a, int k)
{
	return !strcmp(a, "--job") || !strcmp(a, "--bucket") || !strcmp(a, "--gcs-endpoint") ||
	       !strcmp(a, "--key-file") || !strcmp(a, "--nodes") || !strcmp(a, "--ramdir") ||
	       !strcmp(a, "--incomplete-older-than") || k < PRUNE_NKINDS;
}

/* The value of option a (takes_value) into *o, *bit its class. 0, or 2:
 * a bad value (said on stderr). */
static int value_option(const char *a, const char *val, int k, struct opts *o, unsigned *bit)
{
	uint64_t v;

	if (!strcmp(a, "--job")) {
		o->job = val;
		*bit = O_JOB;
	} else if (!strcmp(a, "--bucket")) {
		o->bucket = val;
		*bit = O_BUCKET;
	} else if (!strcmp(a, "--gcs-endpoint")) {
		o->gcs_endpoint = val;
		*bit = O_BUCKET;
	} else if (!strcmp(a, "--key-file")) {
		o->key_file = val;
		*bit = O_BUCKET;
	} else if (!strcmp(a, "--ramdir")) {
		o->ramdir = val;
		*bit = O_BUCKET;
	} else if (!strcmp(a, "--nodes")) {
		if (parse_count(a, val, NODES_MAX, &v) < 0)
			return 2;
		o->nodes_set = v > 0;       /* 0: as the .meta names show */
		o->nodes = (uint32_t)v;
		*bit = O_NODES;
	} else if (!strcmp(a, "--incomplete-older-than")) {
		if (parse_duration(a, val, &o->incomplete_older_s) < 0)
			return 2;
		o->incomplete_set = true;
		o->incomplete_arg = val;
		*bit = O_KEEP;
	} else {
		if (parse_count(a, val, 1000000, &v) < 0)
			return 2;
		o->keep[k] = (unsigned)v;
		o->keep_set[k] = true;
		*bit = O_KEEP;
	}
	return 0;
}

/* argv's options into *o (*used: their classes; *help: -h was given), its
 * other words into o->args. -1: go on; else the exit code (0 after
 * --version, 2 for a bad option: said on stderr). */
static int parse_args(int argc, char **argv, struct opts *o, unsigned *used, bool *help)
{
	for (int i = 1; i < argc; i++) {
		char optbuf[64];
		const char *a = argv[i], *val = NULL, *eq;
		unsigned bit = 0;
		int k, rc;

		if (a[0] != '-' || a[1] == '\0') {
			if (o->nargs == 8) {
				fprintf(stderr, "mtcfs-admin: too many arguments\n");
				return 2;
			}
			o->args[o->nargs++] = a;
			continue;
		}
		/* --opt=value */
		eq = strchr(a, '=');
		if (eq && !strncmp(a, "--", 2) && (size_t)(eq - a) < sizeof(optbuf)) {
			memcpy(optbuf, a, (size_t)(eq - a));
			optbuf[eq - a] = '\0';
			val = eq + 1;
			a = optbuf;
		}
		for (k = 0; k < PRUNE_NKINDS && strcmp(a, keep_opts[k]); k++)
			;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			*help = true;
			continue;
		} else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
			printf("mtcfs-admin %s\n", MTCFS_VERSION);
			return 0;
		} else if (flag_option(a, o, &bit)) {
			if (val) {
				fprintf(stderr, "mtcfs-admin: %s takes no value\n", a);
				return 2;
			}
			*used |= bit;
			continue;
		} else if (!takes_value(a, k)) {
			fprintf(stderr, "mtcfs-admin: unknown option %s\n", argv[i]);
			usage(stderr);
			return 2;
		}
		if (!val) {
			if (i + 1 >= argc) {
				fprintf(stderr, "mtcfs-admin: %s needs a value\n", a);
				return 2;
			}
			val = argv[++i];
		}
		rc = value_option(a, val, k, o, &bit);
		if (rc)
			return rc;
		*used |= bit;
	}
	return -1;
}

/* The options (used: their classes) and arguments fit command c; a bucket
 * command has its bucket and job (from --ramdir's node if not given). 0,
 * or the exit code (said on stderr). */
static int check_command(const struct command *c, struct opts *o, unsigned used)
{
	if (used & ~c->opts) {
		static const struct { unsigned bit; const char *words; } names[] = {
			{ O_BUCKET, "--bucket/--gcs-endpoint/--key-file/--ramdir" }, { O_NODES, "--nodes" },
			{ O_FORCE, "--force" }, { O_DELETE, "--delete" }, { O_VERIFY, "--verify" },
			{ O_KEEP, "--keep-*/--prefer-recent/--incomplete-older-than" }, { O_WATCH, "--watch" }, { O_JOB, "--job" },
		};
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (used & ~c->opts & names[i].bit)
				fprintf(stderr, "mtcfs-admin %s: %s is not an option of this command\n", c->name,
					names[i].words);
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (o->nargs - 1 < c->nargs_min || o->nargs - 1 > c->nargs_max) {
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (c->opts & O_BUCKET) {
		if (o->ramdir && (!o->bucket || !o->job)) {
			int e = opts_from_ramdir(c->name, o);
			if (e)
				return e;
		}
		if (!o->bucket || !o->job) {
			fprintf(stderr, "mtcfs-admin %s: --bucket URL and --job NAME are required (or "
				"--ramdir RAMDIR of a node mounted with bucket= and configured by a "
				"replicator.yaml)\n"
				"usage: mtcfs-admin %s\n", c->name, c->synopsis);
			return 2;
		}
		if (!bk_job_name_ok(o->job)) {
			fprintf(stderr, "mtcfs-admin %s: \"%s\" cannot be a job name\n", c->name, o->job);
			return 2;
		}
	}
	return 0;
}

/* Runs command c; its exit code. */
static int run_command(const struct command *c, const struct opts *o)
{
	if (!strcmp(c->name, "ls"))
		return admin_cmd_ls(o->args[1], o->job);
	if (!strcmp(c->name, "steps"))
		return admin_cmd_steps(o->args[1], o->job);
	if (!strcmp(c->name, "status"))
		return admin_cmd_status(o->args[1], o->watch);
	if (!strcmp(c->name, "verify"))
		return admin_cmd_verify(o->args[1], o->job);
	if (!strcmp(c->name, "backups"))
		return admin_cmd_backups(o);
	if (!strcmp(c->name, "prune"))
		return admin_cmd_prune(o);
	/* restore-version */
	if (!strcmp(o->args[1], "set") ? o->nargs != 3
	    : (strcmp(o->args[1], "show") && strcmp(o->args[1], "clear")) || o->nargs != 2) {
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (o->force && strcmp(o->args[1], "set")) {
		fprintf(stderr, "mtcfs-admin restore-version: --force goes with set\n");
		return 2;
	}
	return admin_cmd_restore_version(o);
}

int main(int argc, char **argv)
{
	const struct command *c = NULL;
	struct opts o = { 0 };
	unsigned used = 0;
	bool help = false;
	int rc;

	/* a command's output is its answer: the library's INFO lines (the
	 * daemon's default) stay out of it; warnings and errors still show */
	log_set_level(LOG_WARN);
	rc = parse_args(argc, argv, &o, &used, &help);
	if (rc >= 0)
		return rc;
	if (o.nargs == 0) {
		usage(help ? stdout : stderr);
		return help ? 0 : 2;
	}
	if (!strcmp(o.args[0], "help")) {
		if (o.nargs > 1 && (c = find_command(o.args[1])) != NULL)
			command_help(c, stdout);
		else if (o.nargs > 1) {
			fprintf(stderr, "mtcfs-admin: unknown command %s\n", o.args[1]);
			return 2;
		} else
			usage(stdout);
		return 0;
	}
	c = find_command(o.args[0]);
	if (!c) {
		fprintf(stderr, "mtcfs-admin: unknown command %s\n", o.args[0]);
		usage(stderr);
		return 2;
	}
	if (help) {
		command_help(c, stdout);
		return 0;
	}
	rc = check_command(c, &o, used);
	if (rc)
		return rc;
	return run_command(c, &o);
}
