/* daemon_opts.c: the daemon's command line: the mount options it parses
 * (docs/options.tsv lists them; tests/unit/test_options_doc.py holds this
 * file to it), usage, and the checks that need no mount. */
#include "tools/daemon_i.h"
#include "cluster/engine.h"
#include "common/log.h"
#include "common/util.h"
#include "net/tls.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct cmdline cmdline_defaults = { .o = { .jax_port = 8476, .rank = -1, .rank_hint = -1,
							.restore_timeout = ENG_RESTORE_TIMEOUT_S,
							.stop_timeout = ENG_STOP_BUDGET_S } };

#define OPT(t, p) { t, offsetof(struct cmdline, p), 1 }
static const struct fuse_opt opt_spec[] = {
	OPT("ram_size=%s", o.ram_size),
	OPT("bucket=%s", o.bucket),
	OPT("listen=%s", o.listen),
	OPT("peers=%s", o.peers),
	OPT("coordinator=%s", o.coordinator),
	OPT("secret_file=%s", o.secret_file),
	OPT("tls_cert=%s", o.tls_cert),
	OPT("tls_key=%s", o.tls_key),
	OPT("tls_ca=%s", o.tls_ca),
	OPT("metrics=%s", o.metrics),
	OPT("log_format=%s", log_format),
	OPT("log_file=%s", log_file),
	OPT("gcs_endpoint=%s", o.gcs_endpoint),
	OPT("gcs_key_file=%s", o.gcs_key_file),
	OPT("redundancy=%s", o.redundancy),
	OPT("jax_init_info", o.jax_init_info),
	{ "no_jax_init_info", offsetof(struct cmdline, o.jax_init_info), -1 },
	{ "jax_init_info=0", offsetof(struct cmdline, o.jax_init_info), -1 },
	OPT("restore_timeout=%d", o.restore_timeout),
	OPT("stop_timeout=%d", o.stop_timeout),
	OPT("jax_port=%d", o.jax_port),
	OPT("rank=%d", o.rank),
	OPT("rank_hint=%d", o.rank_hint),
	OPT("-h", show_help),
	OPT("--help", show_help),
	OPT("-V", show_version),
	OPT("--version", show_version),
	OPT("-f", foreground),
	OPT("-d", verbose),
	OPT("--debug", verbose),
	FUSE_OPT_END
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct cmdline *c = data;
	if (key == FUSE_OPT_KEY_NONOPT) {
		if (c->nonopts++ == 0) {
			c->ramdir = strdup(arg);
			return 0;
		}
		return 1;   /* the mountpoint, for fuse_parse_cmdline */
	}
	return 1;
}

void cmdline_usage(const char *prog)
{
	printf("usage: %s [-f] [-d] [-o OPT[,OPT...]] RAMDIR MOUNTPOINT\n\n"
	       "mtcfs options:\n"
	       "    -f                     stay in the foreground\n"
	       "    -d                     debug log (default: INFO, one line per lifecycle event)\n"
	       "    -o log_format=json     one JSON object per line (Cloud Logging); default text\n"
	       "    -o log_file=PATH       append the log to PATH (default: stderr with -f, else syslog)\n"
	       "    -o ram_size=SIZE       RAM tier capacity (512M, 4G, 200Gi); default: free space of RAMDIR\n"
	       "    -o no_jax_init_info    do not write jax-init-info.txt (written by default);\n"
	       "                           jax_init_info=0 is the same\n"
	       "    -o jax_port=PORT       JAX coordinator port written there (default 8476)\n"
	       "    -o rank=N              this node's rank when no peer table says it (default 0)\n"
	       "    -o rank_hint=N         with coordinator=: the rank until replicator.yaml\n"
	       "                           gives one; the yaml's node-rank wins (mtcfs-csi)\n"
	       "    -o restore_timeout=S   seconds to wait for all nodes when planning a restore,\n"
	       "                           and again at the barrier (default 120)\n"
	       "    -o stop_timeout=S      seconds a stop lets the last pushes run before it\n"
	       "                           cuts them (default 20)\n"
	       "    -o listen=HOST:PORT    this node's peer/coordinator endpoint\n"
	       "    -o peers=A0,A1,...     static table: rank i at Ai (rank 0 runs the coordinator)\n"
	       "    -o coordinator=H:P     rank 0's endpoint for dynamic registration\n"
	       "    -o secret_file=PATH    shared secret peers must prove (HMAC challenge)\n"
	       "    -o tls_cert=PEM,tls_key=PEM,tls_ca=PEM\n"
	       "                           mutual TLS for peer traffic: this node's certificate\n"
	       "                           chain and key; peers must present one signed by tls_ca\n"
	       "    -o metrics=HOST:PORT   Prometheus text endpoint at /metrics ([ADDR]:PORT: IPv6)\n"
	       "    -o bucket=URL          backup tier: gs://BUCKET[/PREFIX] or file:///PATH\n"
	       "    -o gcs_endpoint=URL    Cloud Storage endpoint (STORAGE_EMULATOR_HOST is honoured)\n"
	       "    -o gcs_key_file=PATH   service-account key (else the metadata server)\n"
	       "    -o redundancy=R        replication (default: whole replicas on the peers) or\n"
	       "                           rs:K+M (Reed-Solomon across groups of K+M nodes)\n\n"
	       "RAMDIR should be a tmpfs directory; mount -t tmpfs -o huge=within_size gives large\n"
	       "files huge pages without spending 2 MiB on every small file (huge=always does).\n",
	       prog);
}

/* `-o ...,peers=A0,A1,A2,...` (DESIGN §8): the table's commas would split
 * it into options, so the HOST:PORT entries that follow peers= (tokens with
 * a ':' and no '=') are joined back with escaped commas, which fuse_opt
 * understands. Returns a new malloc'd option string. */
static char *join_peer_tokens(const char *opts)
{
	size_t n = strlen(opts);
	char *out = malloc(2 * n + 1), *o = out;
	const char *p = opts;
	bool in_peers = false, first = true;

	if (!out)
		return NULL;
	while (*p) {
		size_t len = strcspn(p, ",");
		bool hostport = memchr(p, ':', len) && !memchr(p, '=', len);
		if (!first) {
			if (in_peers && hostport)
				*o++ = '\\';
			*o++ = ',';
		}
		if (!(in_peers && hostport))
			in_peers = len > 6 && !strncmp(p, "peers=", 6);
		memcpy(o, p, len);
		o += len;
		p += len;
		if (*p == ',')
			p++;
		first = false;
	}
	*o = '\0';
	return out;
}

static void fix_peer_options(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		char *v = NULL;
		if (!strcmp(argv[i], "-o") && i + 1 < argc)
			v = argv[++i];
		else if (!strncmp(argv[i], "-o", 2) && argv[i][2])
			v = argv[i] + 2;
		if (v && strstr(v, "peers=")) {
			char *j = join_peer_tokens(v);
			if (!j)
				continue;
			if (v == argv[i]) {
				argv[i] = j;
			} else {
				char *w = malloc(strlen(j) + 3);
				if (w) {
					snprintf(w, strlen(j) + 3, "-o%s", j);
					argv[i] = w;
				}
				free(j);
			}
		}
	}
}

int cmdline_parse(int argc, char **argv, struct cmdline *c, struct fuse_args *args)
{
	*c = cmdline_defaults;
	fix_peer_options(argc, argv);
	args->argv = argv;
	if (fuse_opt_parse(args, c, opt_spec, opt_proc) < 0)
		return 1;
	if (c->show_help) {
		cmdline_usage(argv[0]);
		return 0;
	}
	if (c->show_version) {
		/* what the container image and the package are checked for;
		 * whether the kernel offers it too, the mount's log says */
		printf("mtcfs %s (libfuse %s; FUSE passthrough: %s)\n", MTCFS_VERSION,
		       fuse_pkgversion(),
		       MTCFS_PASSTHROUGH ? "available" : "not available, built with libfuse < 3.17");
		return 0;
	}
	return -1;
}

int cmdline_apply(struct cmdline *c, struct fuse_args *args)
{
	if (log_set_format_name(c->log_format) < 0) {
		fprintf(stderr, "mtcfs: log_format=%s: give text or json\n", c->log_format);
		return -EINVAL;
	}
	if (c->log_file) {
		int e = log_open_file(c->log_file);
		if (e < 0) {
			fprintf(stderr, "mtcfs: log_file=%s: %s\n", c->log_file, strerror(-e));
			return -EINVAL;
		}
	}
	if (c->verbose) {
		log_set_level(LOG_DEBUG);
		c->foreground = 1;
	} else {
		log_set_level(LOG_INFO);
	}
	if (c->foreground)
		fuse_opt_add_arg(args, "-f");
	fuse_opt_add_arg(args, "-osubtype=mtcfs,fsname=mtcfs");
	if (geteuid() == 0) {
		fuse_opt_add_arg(args, "-oallow_other,default_permissions");
		/* A checkpoint store has no use for set-user-ID programs or
		 * device nodes, and a trainer must not gain either through it
		 * (fusermount3 forces the same on unprivileged mounts). Last,
		 * because libfuse applies mount flags in order and mount.fuse3
		 * (fstab, mount -t fuse.mtcfs) passes suid,dev unless told
		 * otherwise. */
		fuse_opt_add_arg(args, "-onosuid,nodev");
	}
	return 0;
}

int cmdline_check(struct cmdline *c, uint64_t *cap)
{
	*cap = 0;
	if (c->o.ram_size && util_parse_size(c->o.ram_size, cap) < 0) {
		fprintf(stderr, "mtcfs: invalid ram_size=%s (use e.g. 512M, 4G, 200Gi)\n", c->o.ram_size);
		return -EINVAL;
	}
	if (c->o.ram_size && *cap < (1 << 20)) {
		fprintf(stderr, "mtcfs: ram_size=%s is too small (at least 1M)\n", c->o.ram_size);
		return -EINVAL;
	}
	if (c->o.tls_cert || c->o.tls_key || c->o.tls_ca) {
		char err[512];
		SSL_CTX *ctx = NULL;
		char **files[] = { &c->o.tls_cert, &c->o.tls_key, &c->o.tls_ca };
		static const char *const names[] = { "tls_cert", "tls_key", "tls_ca" };
		if (!c->o.tls_cert || !c->o.tls_key || !c->o.tls_ca) {
			fprintf(stderr, "mtcfs: mutual TLS needs all of tls_cert=, tls_key= and tls_ca=\n");
			return -EINVAL;
		}
		/* absolute: a daemon that is not -f runs from / */
		for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
			char *abs = realpath(*files[i], NULL);
			if (!abs) {
				fprintf(stderr, "mtcfs: %s=%s: %s\n", names[i], *files[i], strerror(errno));
				return -EINVAL;
			}
			free(*files[i]);
			*files[i] = abs;
		}
		/* load once now so a bad file fails the mount with its reason */
		if (net_tls_load(c->o.tls_cert, c->o.tls_key, c->o.tls_ca, &ctx, err, sizeof(err)) < 0) {
			fprintf(stderr, "mtcfs: %s\n", err);
			return -EINVAL;
		}
		net_tls_free(ctx);
		if (!c->o.listen) {
			fprintf(stderr, "mtcfs: tls_cert=/tls_key=/tls_ca= need listen=HOST:PORT\n");
			return -EINVAL;
		}
	}
	if (c->o.bucket && strncmp(c->o.bucket, "gs://", 5) && strncmp(c->o.bucket, "file:///", 8)) {
		fprintf(stderr, "mtcfs: bucket=%s: use gs://BUCKET[/PREFIX] or file:///ABSOLUTE/PATH\n", c->o.bucket);
		return -EINVAL;
	}
	if ((c->o.peers || c->o.coordinator || c->o.secret_file) && !c->o.listen) {
		fprintf(stderr, "mtcfs: peers=/coordinator= need listen=HOST:PORT\n");
		return -EINVAL;
	}
	return 0;
}

static void opts_free(struct daemon_opts *o)
{
	char **strs[] = { &o->ram_size, &o->bucket, &o->listen, &o->peers, &o->coordinator,
			  &o->secret_file, &o->tls_cert, &o->tls_key, &o->tls_ca, &o->metrics,
			  &o->gcs_endpoint, &o->gcs_key_file, &o->redundancy };
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
}

void cmdline_free(struct cmdline *c)
{
	free(c->ramdir);
	c->ramdir = NULL;
	free(c->log_format);
	c->log_format = NULL;
	free(c->log_file);
	c->log_file = NULL;
	opts_free(&c->o);
}
