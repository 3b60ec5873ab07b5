/* main.c: command line, mount, and the life of the daemon.
 * Order matters: the FUSE session is mounted and the process daemonized
 * before any thread starts or LMDB is opened (neither survives fork()). */
#include "fs/fs.h"
#include "fs/fs_i.h"
#include "common/log.h"
#include "common/util.h"
#include "net/metrics_http.h"
#include "net/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct fs *g_fs;

/* systemd's readiness protocol (sd_notify(3)), written here rather than
 * linked from libsystemd: it is one datagram of "KEY=VALUE" lines to the
 * unix socket named by $NOTIFY_SOCKET (a path, or '@' for the abstract
 * namespace), a stable interface systemd documents, and the binaries and
 * the container image then need no libsystemd. The address is read once,
 * before anything else could change the environment; unset: no-op. */
static struct sockaddr_un notify_addr;
static socklen_t notify_len;

static void notify_init(void)
{
	const char *e = getenv("NOTIFY_SOCKET");
	size_t n;

	if (!e || (e[0] != '/' && e[0] != '@'))
		return;
	n = strlen(e);
	if (n < 2 || n >= sizeof(notify_addr.sun_path))
		return;
	notify_addr.sun_family = AF_UNIX;
	memcpy(notify_addr.sun_path, e, n);
	if (e[0] == '@')
		notify_addr.sun_path[0] = '\0';
	notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
}

/* Best effort: a manager that is gone must not stop the daemon. */
static void notify_send(const char *msg)
{
	int fd;

	if (!notify_len)
		return;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (const struct sockaddr *)&notify_addr,
		   notify_len) < 0)
		log_warn("main", "cannot notify systemd at %s: %s", getenv("NOTIFY_SOCKET"),
			 strerror(errno));
	close(fd);
}

/* The FUSE table with INIT wrapped: READY=1 goes out once the kernel's
 * INIT is handled, i.e. the mount answers (the kernel holds every request
 * until INIT's reply, which libfuse sends as this returns), the RAM tier,
 * peers, control thread and metrics all being up before the loop starts. */
static struct fuse_lowlevel_ops main_ll_ops;

static void main_ll_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;
	char msg[PATH_MAX + 64];

	if (fs_ll_ops.init)
		fs_ll_ops.init(userdata, conn);
	if (snprintf(msg, sizeof(msg), "READY=1\nSTATUS=serving %s\nMAINPID=%d",
		     fs->mountpoint, (int)getpid()) < (int)sizeof(msg))
		notify_send(msg);
}

struct cmdline {
	struct fs_opts o;
	char *ramdir;
	int nonopts;
	int foreground;
	int verbose;
	int show_help;
	int show_version;
	char *log_format;
	char *log_file;
};

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

static void usage(const char *prog)
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

/* Splice moves a request through a pipe, so the pipe must hold the
 * largest one: 1 MiB of data plus its headers. With fs.pipe-max-size at
 * 1 MiB it cannot, and libfuse would fall back to copying on every request
 * (reads ~3x slower) while the kernel still set the connection up for
 * splice; a reader was once seen stuck in D state in that configuration.
 * So splice is only asked for in INIT (fs->splice_ok) when a pipe of
 * 1 MiB + 8 KiB can be had, and the log says which way it went. */
static bool check_pipe_size(void)
{
	bool ok;
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return false;
	ok = fcntl(p[0], F_SETPIPE_SZ, (1 << 20) + 8192) > (1 << 20);
	close(p[0]);
	close(p[1]);
	if (!ok)
		log_warn("fuse", "cannot make pipes larger than 1 MiB (fs.pipe-max-size): "
			 "splice is not requested and reads are slower; raise it with: "
			 "sysctl -w fs.pipe-max-size=4194304");
	else
		log_info("fuse", "pipes can hold a 1 MiB request: splice requested");
	return ok;
}

#define LOCK_NAME "mtcfs.lock"

/* One daemon per RAMDIR: two would share the LMDB catalog and the shard
 * tree, each believing it owns them. An OFD lock on RAMDIR/mtcfs.lock is
 * held for the daemon's life; it belongs to the open file description, so
 * it survives fuse_daemonize()'s fork and goes away with the process
 * however it ends (kill -9 included). The file holds the holder's PID for
 * the refusal message (an OFD lock does not name its owner). Taken before
 * the mount so a refused daemon never shows a mount. *fd_out stays open
 * until exit. 0, -EBUSY (held: reported on stderr), other -errno. */
static int ramdir_lock(const char *ramdir, int *fd_out)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	char path[PATH_MAX], buf[32] = "";
	ssize_t n;
	int fd, rc;

	*fd_out = -1;
	if (snprintf(path, sizeof(path), "%s/" LOCK_NAME, ramdir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		fprintf(stderr, "mtcfs: cannot open %s: %s\n", path, strerror(-rc));
		return rc;
	}
	if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
		*fd_out = fd;
		return 0;
	}
	rc = -errno;
	if (rc != -EAGAIN && rc != -EACCES) {
		fprintf(stderr, "mtcfs: cannot lock %s: %s\n", path, strerror(-rc));
		close(fd);
		return rc;
	}
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	if (buf[0])
		fprintf(stderr, "mtcfs: RAMDIR %s is in use by another mtcfs (pid %s, holding %s)\n",
			ramdir, buf, path);
	else
		fprintf(stderr, "mtcfs: RAMDIR %s is in use by another mtcfs that is starting "
			"(it holds %s)\n", ramdir, path);
	return -EBUSY;
}

/* After fuse_daemonize(): our PID is final now. */
static void ramdir_lock_note_pid(int fd)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
		log_warn("main", "cannot write the PID into " LOCK_NAME ": %s", strerror(errno));
}

static void opts_free(struct fs_opts *o)
{
	char **strs[] = { &o->ram_size, &o->bucket, &o->listen, &o->peers, &o->coordinator,
			  &o->secret_file, &o->tls_cert, &o->tls_key, &o->tls_ca, &o->metrics,
			  &o->gcs_endpoint, &o->gcs_key_file, &o->redundancy };
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
}

/* Gauges for a scrape (the metrics thread). */
static void gauges(void *arg, struct metrics_gauges *g)
{
	struct fs *fs = arg;
	struct shard_rec *recs = NULL;
	size_t n = 0;
	char job[JOB_NAME_MAX + 1];
	uint32_t rank;

	g->ram_used = ram_used(fs->ram);
	g->ram_size = ram_cap(fs->ram);
	pthread_mutex_lock(&fs->mu);
	snprintf(job, sizeof(job), "%s", fs->job);
	rank = fs->rank;
	pthread_mutex_unlock(&fs->mu);
	if (fs->eng) {
		uint32_t nodes;
		bool up;
		uint64_t lkg;
		eng_status(fs->eng, &nodes, &up);
		g->peers_total = (int)nodes;
		g->peers_reachable = up ? 1 : 0;
		if (eng_lkg(fs->eng, job, &lkg))
			g->lkg_step = (int64_t)lkg;
		if (eng_gc_step(fs->eng, job, &lkg))
			g->replicated_lkg_step = (int64_t)lkg;
	}
	if (idx_list_shards(ram_idx(fs->ram), job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			if ((recs[i].flags & SHF_OWN) && recs[i].key.rank == rank &&
			    recs[i].state >= SH_COMMITTED && recs[i].state != SH_BAD &&
			    (int64_t)recs[i].key.step > g->last_commit_step)
				g->last_commit_step = (int64_t)recs[i].key.step;
		idx_recs_free(recs, n);
	}
	if (!fs->eng && g->last_commit_step >= 0)
		g->lkg_step = g->last_commit_step;
}

static int parse_opts(struct fs *fs, struct cmdline *c, uint64_t *cap)
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

int fs_main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts fo = { 0 };
	struct fuse_loop_config *lc = NULL;
	struct cmdline c = { .o = { .jax_port = 8476, .rank = -1, .rank_hint = -1,
				    .restore_timeout = ENG_RESTORE_TIMEOUT_S } };
	struct fs *fs = NULL;
	struct stat st;
	uint64_t cap;
	struct mhttp *mh = NULL;
	int lock_fd = -1;
	int rc = 1;

	/* Started by mount(8) or a supervisor with stdio closed, the first
	 * files opened would take fds 0-2: the RAMDIR lock among them, which
	 * fuse_daemonize() then replaces with /dev/null (the lock gone, a
	 * second daemon let in) and log lines would land in it. */
	for (;;) {
		int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (fd < 0 || fd > STDERR_FILENO) {
			if (fd >= 0)
				close(fd);
			break;
		}
		fcntl(fd, F_SETFD, 0);   /* a std stream is inherited like one */
	}
	notify_init();
	fix_peer_options(argc, argv);
	args.argv = argv;
	if (fuse_opt_parse(&args, &c, opt_spec, opt_proc) < 0)
		return 1;
	if (c.show_help) {
		usage(argv[0]);
		fuse_opt_free_args(&args);
		return 0;
	}
	if (c.show_version) {
		/* what the container image and the package are checked for;
		 * whether the kernel offers it too, the mount's log says */
		printf("mtcfs %s (libfuse %s; FUSE passthrough: %s)\n", MTCFS_VERSION,
		       fuse_pkgversion(),
		       MTCFS_PASSTHROUGH ? "available" : "not available, built with libfuse < 3.17");
		fuse_opt_free_args(&args);
		return 0;
	}
	if (log_set_format_name(c.log_format) < 0) {
		fprintf(stderr, "mtcfs: log_format=%s: give text or json\n", c.log_format);
		goto out;
	}
	if (c.log_file) {
		int e = log_open_file(c.log_file);
		if (e < 0) {
			fprintf(stderr, "mtcfs: log_file=%s: %s\n", c.log_file, strerror(-e));
			goto out;
		}
	}
	if (c.verbose) {
		log_set_level(LOG_DEBUG);
		c.foreground = 1;
	} else {
		log_set_level(LOG_INFO);
	}
	if (c.foreground)
		fuse_opt_add_arg(&args, "-f");
	fuse_opt_add_arg(&args, "-osubtype=mtcfs,fsname=mtcfs");
	if (geteuid() == 0) {
		fuse_opt_add_arg(&args, "-oallow_other,default_permissions");
		/* A checkpoint store has no use for set-user-ID programs or
		 * device nodes, and a trainer must not gain either through it
		 * (fusermount3 forces the same on unprivileged mounts). Last,
		 * because libfuse applies mount flags in order and mount.fuse3
		 * (fstab, mount -t fuse.mtcfs) passes suid,dev unless told
		 * otherwise. */
		fuse_opt_add_arg(&args, "-onosuid,nodev");
	}
	if (fuse_parse_cmdline(&args, &fo) != 0 || !c.ramdir || !fo.mountpoint) {
		usage(argv[0]);
		goto out;
	}
	if (stat(c.ramdir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "mtcfs: RAMDIR %s is not a directory\n", c.ramdir);
		goto out;
	}
	{
		/* fuse_daemonize() moves to "/": keep absolute paths */
		char *abs = realpath(c.ramdir, NULL), *mabs = realpath(fo.mountpoint, NULL);
		if (!abs || !mabs) {
			fprintf(stderr, "mtcfs: cannot resolve %s or %s: %s\n", c.ramdir, fo.mountpoint,
				strerror(errno));
			free(abs);
			free(mabs);
			goto out;
		}
		free(c.ramdir);
		c.ramdir = abs;
		free(fo.mountpoint);
		fo.mountpoint = mabs;
	}
	if (ramdir_lock(c.ramdir, &lock_fd) < 0)
		goto out;
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		goto out;
	g_fs = fs;
	fs->proc_self_fd = -1;
	fs->o = c.o;
	fs->ramdir = c.ramdir;
	fs->mountpoint = fo.mountpoint;
	if (parse_opts(fs, &c, &cap) < 0)
		goto out;
	fs->o = c.o;   /* again: parse_opts replaced some strings (tls_* made absolute) */
	pthread_mutex_init(&fs->mu, NULL);
	pthread_mutex_init(&fs->hmu, NULL);
	pthread_rwlock_init(&fs->open_lk, NULL);
	pthread_cond_init(&fs->sealed_cv, NULL);
	snprintf(fs->job, sizeof(fs->job), "default");
	fs->hsize = 1u << 16;
	fs->htab = calloc(fs->hsize, sizeof(*fs->htab));
	if (!fs->htab)
		goto out;

	main_ll_ops = fs_ll_ops;
	main_ll_ops.init = main_ll_init;
	fs->se = fuse_session_new(&args, &main_ll_ops, sizeof(main_ll_ops), fs);
	if (!fs->se)
		goto out;
	if (fuse_set_signal_handlers(fs->se) != 0)
		goto out;
	if (fuse_session_mount(fs->se, fo.mountpoint) != 0)
		goto out_handlers;
	fuse_daemonize(fo.foreground);
	/* detached, stderr is /dev/null now (mount(8), fstab, a mount unit):
	 * the log goes to syslog, i.e. the journal, unless log_file= says */
	if (!fo.foreground && log_to_stderr())
		log_use_syslog();
	ramdir_lock_note_pid(lock_fd);

	/* From here on threads and LMDB are safe, and /proc/self is ours (it
	 * named the parent before fuse_daemonize() forked). */
	fs->proc_self_fd = open("/proc/self/fd", O_PATH | O_CLOEXEC);
	if (fs->proc_self_fd < 0) {
		log_err("main", "cannot open /proc/self/fd: %s", strerror(errno));
		goto out_unmount;
	}
	rc = ram_open(c.ramdir, cap, &fs->ram);
	if (rc < 0) {
		log_err("main", "cannot open the RAM tier in %s: %s", c.ramdir, strerror(-rc));
		rc = 1;
		goto out_unmount;
	}
	rc = 1;
	ram_set_reclaim(fs->ram, commit_reclaim, fs);
	fs->root.fd = openat(ram_ns_fd(fs->ram), ".", O_PATH | O_CLOEXEC);
	fstat(fs->root.fd, &st);
	fs->root.ino = st.st_ino;
	fs->root.dev = st.st_dev;
	fs->root.nlookup = 2;
	pthread_mutex_init(&fs->root.amu, NULL);
	fs_fd_init(fs);
	if (workq_start("mtcfs-seal", &fs->sealq) < 0 ||
	    workq_start("mtcfs-inval", &fs->notifyq) < 0)
		goto out_unmount;
	if (fs->o.listen || fs->o.bucket) {
		struct eng_opts eo = {
			.listen = fs->o.listen, .peers = fs->o.peers, .coordinator = fs->o.coordinator,
			.secret_file = fs->o.secret_file, .rank = fs->o.rank, .rank_hint = fs->o.rank_hint,
			.tls_cert = fs->o.tls_cert, .tls_key = fs->o.tls_key, .tls_ca = fs->o.tls_ca,
			.restore_timeout_s = fs->o.restore_timeout, .bucket = fs->o.bucket,
			.gcs_endpoint = fs->o.gcs_endpoint, .gcs_key_file = fs->o.gcs_key_file,
			.redundancy = fs->o.redundancy,
		};
		struct eng_cb cb = { .on_lkg = commit_on_lkg, .report = ctl_report_error, .arg = fs };
		if (eng_start(fs->ram, &eo, &cb, &fs->eng) < 0) {
			log_err("main", "cannot start the peer tier");
			goto out_unmount;
		}
	}
	if (commit_init(fs) < 0)
		log_err("main", "catalog recovery failed; committed steps may be missing");
	if (ctl_start(fs) < 0)
		goto out_unmount;
	fs->splice_ok = check_pipe_size();   /* before the loop: INIT reads it */
	{
		/* for mtcfs-admin: where this daemon serves (status), and the
		 * bucket options its bucket commands use when not given them.
		 * jansson escapes what a path may hold ('"', '\\'). */
		json_t *m = json_pack("{s:i,s:s,s:I,s:I}", "pid", (int)getpid(), "mountpoint",
				      fo.mountpoint, "ram_size", (json_int_t)ram_cap(fs->ram),
				      "started", (json_int_t)time(NULL));
		char *meta;
		if (m && fs->o.bucket)
			json_object_set_new(m, "bucket", json_string(fs->o.bucket));
		if (m && fs->o.gcs_endpoint)
			json_object_set_new(m, "gcs_endpoint", json_string(fs->o.gcs_endpoint));
		if (m && fs->o.gcs_key_file) {
			char *abs = realpath(fs->o.gcs_key_file, NULL);
			json_object_set_new(m, "gcs_key_file", json_string(abs ? abs : fs->o.gcs_key_file));
			free(abs);
		}
		meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
		if (meta)
			idx_put_meta(ram_idx(fs->ram), "daemon", meta, strlen(meta));
		free(meta);
		json_decref(m);
	}
	log_info("main", "serving ramdir=%s mount=%s ram_size=%llu used=%llu",
		 ram_path(fs->ram), fo.mountpoint, (unsigned long long)ram_cap(fs->ram),
		 (unsigned long long)ram_used(fs->ram));
	if (fs->o.metrics && mhttp_start(fs->o.metrics, gauges, fs, &mh) < 0)
		goto out_unmount;

	lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(lc, 8);
	fuse_loop_cfg_set_idle_threads(lc, 4);
	fuse_loop_cfg_set_clone_fd(lc, 0);
	/* a signal (SIGTERM, SIGINT) ends the loop cleanly, as an unmount does */
	rc = fuse_session_loop_mt(fs->se, lc) < 0 ? 1 : 0;
	fuse_loop_cfg_destroy(lc);
	notify_send("STOPPING=1\nSTATUS=unmounted, sealing and stopping");

	mhttp_stop(mh);
	if (fs->eng)   /* a restore round waiting for other nodes ends now */
		eng_restore_stop(fs->eng);
	ctl_stop(fs);
	/* Closed, not freed, until the engine has stopped: its control reader
	 * may still deliver an LKG, whose GC goes to the seal queue (it found
	 * a freed queue). */
	workq_close(fs->sealq);
	workq_close(fs->notifyq);
	eng_stop(fs->eng);
	fs->eng = NULL;
	workq_free(fs->sealq);
	fs->sealq = NULL;
	workq_free(fs->notifyq);
	fs->notifyq = NULL;
out_unmount:
	fuse_session_unmount(fs->se);
out_handlers:
	fuse_remove_signal_handlers(fs->se);
out:
	if (fs) {
		if (fs->se)
			fuse_session_destroy(fs->se);
		ram_close(fs->ram);
		if (fs->htab)
			fs_nodes_free(fs);
		if (fs->root.fd > 0)
			close(fs->root.fd);
		free(fs->htab);
		commit_free(fs);
		if (fs->proc_self_fd >= 0)
			close(fs->proc_self_fd);
		free(fs);
	}
	if (lock_fd >= 0) {
		/* no stale PID for the next one to name; the lock goes with the fd */
		if (ftruncate(lock_fd, 0) < 0) {
			/* harmless: the next daemon overwrites it */
		}
		close(lock_fd);
	}
	free(fo.mountpoint);
	free(c.ramdir);
	free(c.log_format);
	free(c.log_file);
	opts_free(&c.o);
	fuse_opt_free_args(&args);
	return rc;
}
