/* csi_node.c: RAM tier, job mounts and bind mounts (csi.md "Behaviour").
 *
 * Lock: mu (one, taken by publish/unpublish for their whole run; a first
 * publish holds it while its mtcfs starts, a few seconds; the reaper
 * thread holds it while it stops an idle job mount or frees a stopped
 * job's RAMDIR). Nothing else is shared between RPC threads.
 *
 * A job's life on the node: published (pods bind it) -> idle (no pod; its
 * mtcfs keeps running for idle_s, so a JobSet restart finds it) ->
 * stopped (no mtcfs, no port; its RAMDIR kept: the next pod restarts it on
 * the same data) -> freed (RAMDIR deleted, when the RAM tier is over
 * free_pct full while another job runs, the longest stopped first). A
 * published or idle job's RAM is never freed. */
#include "csi/csi_node.h"
#include "common/log.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MOD "csi"
#define TMPFS_MAGIC_ 0x01021994
#define JOB_READY_MS 30000
#define JOB_STOP_MS 20000
#define OPTS_MAX 4096

struct job {
	char key[160];              /* <namespace>.<job> */
	char ramdir[PATH_MAX];
	char mnt[PATH_MAX];
	char log[PATH_MAX];
	pid_t pid;                  /* -1: not started by us (or exited) */
	bool adopted;               /* serving mount found, not started by us */
	pthread_t pump;             /* its log thread, joined once pid is reaped */
	bool has_pump;
	unsigned rank;
	unsigned peer_port;         /* its listen port; 0 while not running */
	unsigned metrics_port;      /* its /metrics port; 0: none */
	/* the volume attributes its mtcfs was started with, as they became
	 * mount options (valid while has_attrs): a publish with others is
	 * applied (restart) or refused, never dropped */
	bool has_attrs;
	char a_coordinator[CSI_NAME_MAX + 64];
	char a_subdomain[64];
	char a_ram_size[32];
	unsigned a_peer_port;
	char **targets;             /* published targets (also in <state>/<key>/published) */
	size_t n_targets;
	uint64_t idle_mono;         /* now_ms() when its last target went (n_targets 0) */
	time_t idle_wall;           /* the same in wall time (survives restarts: the file's mtime) */
	struct job *next;
};

struct csi_node {
	struct csi_node_opts o;
	pthread_mutex_t mu;
	struct job *jobs;           /* protected by mu */
	uint64_t ram_bytes;         /* tmpfs size= (mu): the config's, then the watch's */
	bool cfg_gone;              /* (mu) the watched configuration is deleted */
	bool ram_freed;             /* (mu) we unmounted the tmpfs for that */
	char pods[PATH_MAX];        /* <kubelet_dir>/pods as targets spell it */
	char pods_real[PATH_MAX];   /* the same resolved (how /proc/self/mountinfo spells it) */
	pthread_cond_t cv;          /* wakes the reaper to stop */
	bool stopping;              /* (mu) destroy: the reaper returns */
	bool has_reaper;
	pthread_t reaper;
	bool quiet;                 /* --status: jobs_load logs nothing */
};

static void ram_pressure(struct csi_node *n, const struct job *self, uint64_t need);
static void jobs_load(struct csi_node *n);
static void *reaper_run(void *arg);
static int unmount_any(const char *path);
static void job_free(struct job *j);

static int fail(char *err, size_t cap, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t cap, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return rc;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* mkdir -p, iteratively over the path's components. */
static int mkdirs(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		char c = buf[i];
		buf[i] = 0;
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = c;
	}
	return 0;
}

/* 1 when path is a mount point (its device differs from its parent's),
 * 0 when not, -errno when it cannot be looked at (-ENOTCONN: a FUSE mount
 * whose daemon is gone). *dev gets the device of path. */
static int mount_point(const char *path, dev_t *dev)
{
	char parent[PATH_MAX + 4];
	struct stat a, b;

	if (stat(path, &a) < 0)
		return -errno;
	snprintf(parent, sizeof(parent), "%s/..", path);
	if (stat(parent, &b) < 0)
		return -errno;
	if (dev)
		*dev = a.st_dev;
	return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

/* /proc/self/mountinfo escapes ' ', '\t', '\n' and '\\' as \ooo. */
static void unescape_octal(char *s)
{
	char *w = s;

	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = 0;
}

/* The file system type of the topmost mount at path (a resolved path, as
 * the kernel shows it) into type: 1; 0 when nothing is mounted there;
 * -errno. Read from the mount table, so a FUSE mount whose daemon is gone
 * (ENOTCONN to stat) is seen like any other. */
static int mount_type(const char *path, char *type, size_t cap)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t lcap = 0;
	int found = 0;

	if (!f)
		return -errno;
	while (getline(&line, &lcap, f) > 0) {
		char *p = line, *mp = NULL, *dash, *t;

		/* id parent maj:min root mountpoint opts [optional...] - type source super */
		for (int i = 0; i < 5 && p; i++)
			mp = strsep(&p, " ");
		if (!p || !mp)
			continue;
		unescape_octal(mp);
		if (strcmp(mp, path))
			continue;
		dash = strstr(p, " - ");
		if (!dash)
			continue;
		t = dash + 3;
		t[strcspn(t, " \n")] = 0;
		snprintf(type, cap, "%s", t);
		found = 1;              /* later lines are mounted on top: keep the last */
	}
	free(line);
	fclose(f);
	return found;
}

/* A target kubelet may give: <kubelet_dir>/pods/<uid>/volumes/<more>,
 * absolute, normalized (no "//", ".", "..", trailing '/'), printable.
 * Returns the part after "<kubelet_dir>/pods/" or NULL with the reason in
 * err. */
static const char *target_rel(const struct csi_node *n, const char *target, char *err, size_t cap)
{
	size_t pl = strlen(n->pods), len = strlen(target), ncomp = 0, cl;
	const char *rel, *c;

	for (const char *q = target; *q; q++)
		if ((unsigned char)*q < 0x20 || *q == 0x7f) {
			fail(err, cap, -EINVAL, "target_path: a control character in it");
			return NULL;
		}
	if (len >= PATH_MAX - 8 || strncmp(target, n->pods, pl) || target[pl] != '/') {
		fail(err, cap, -EINVAL, "target_path %s: not under kubelet's %s/", target, n->pods);
		return NULL;
	}
	rel = target + pl + 1;
	for (c = rel;; c += cl + 1) {
		cl = strcspn(c, "/");
		if (cl == 0 || cl > NAME_MAX || (cl == 1 && c[0] == '.') ||
		    (cl == 2 && c[0] == '.' && c[1] == '.')) {
			fail(err, cap, -EINVAL, "target_path %s: not a normalized path", target);
			return NULL;
		}
		if (++ncomp == 2 && (cl != 7 || strncmp(c, "volumes", 7)))
			break;
		if (!c[cl])
			break;
	}
	if (ncomp < 3) {
		fail(err, cap, -EINVAL, "target_path %s: not %s/<pod uid>/volumes/...", target, n->pods);
		return NULL;
	}
	return rel;
}

/* Open rel (target_rel's) below the pods directory one component at a
 * time, never following a symlink, creating the missing directories when
 * create: an O_PATH fd in *out, and its parent's in *parent (or NULL).
 * 0; -ENOENT (missing, !create); -ELOOP or -ENOTDIR (a symlink or a
 * file on the way); -errno. */
static int target_open(const struct csi_node *n, const char *rel, bool create, int *out, int *parent)
{
	char comp[NAME_MAX + 1];
	int fd, nfd, pfd = -1, rc;

	fd = open(n->pods_real, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (*rel) {
		size_t cl = strcspn(rel, "/");
		memcpy(comp, rel, cl);
		comp[cl] = 0;
		nfd = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0 && errno == ENOENT && create) {
			/* the bind covers the target's own mode; parents kubelet did
			 * not make must let the pod's uid through */
			if (mkdirat(fd, comp, 0755) < 0 && errno != EEXIST) {
				rc = -errno;
				goto fail;
			}
			nfd = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		if (nfd < 0) {
			rc = errno == ENOTDIR ? -ENOTDIR : -errno;
			goto fail;
		}
		if (pfd >= 0)
			close(pfd);
		pfd = fd;
		fd = nfd;
		rel += cl;
		if (*rel == '/')
			rel++;
	}
	*out = fd;
	if (parent)
		*parent = pfd;
	else if (pfd >= 0)
		close(pfd);
	return 0;
fail:
	close(fd);
	if (pfd >= 0)
		close(pfd);
	return rc;
}

/* The target as the mount table spells it (the pods directory resolved). */
static void target_real(const struct csi_node *n, const char *rel, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s", n->pods_real, rel);
}

/* Mount the RAM tier's tmpfs on root: bytes big (0: the kernel's default
 * size), with huge pages if asked; the options used in opts. 0 or -errno. */
static int mount_ram(const char *root, bool huge, uint64_t bytes, char *opts, size_t cap)
{
	int n = snprintf(opts, cap, "%smode=0700", huge ? "huge=always," : "");

	if (bytes && n > 0 && (size_t)n < cap)
		snprintf(opts + n, cap - (size_t)n, ",size=%llu", (unsigned long long)bytes);
	return mount("mtcfs-ram", root, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0 ? -errno : 0;
}

static int ram_tier(struct csi_node *n, char *err, size_t cap)
{
	const uint64_t ram_bytes = n->ram_bytes;
	char opts[128];
	struct statfs sf;
	int rc;

	rc = mkdirs(n->o.ram_root, 0700);
	if (rc < 0)
		return fail(err, cap, rc, "mkdir %s: %s", n->o.ram_root, strerror(-rc));
	if (n->o.no_tmpfs)
		return 0;
	rc = mount_point(n->o.ram_root, NULL);
	if (rc == 1 && statfs(n->o.ram_root, &sf) == 0 && sf.f_type == TMPFS_MAGIC_) {
		/* a driver restart: the tmpfs and its RAMDIRs are the node's data */
		log_info(MOD, "RAM tier %s: tmpfs already mounted, kept", n->o.ram_root);
		return 0;
	}
	if (rc == 1)
		return fail(err, cap, -EEXIST, "%s is a mount point but not a tmpfs", n->o.ram_root);
	rc = mount_ram(n->o.ram_root, true, ram_bytes, opts, sizeof(opts));
	if (rc == -EINVAL) {
		/* a kernel without transparent huge pages for shmem refuses huge= */
		log_warn(MOD, "tmpfs huge=always refused (no THP for shmem?): mounting without it");
		rc = mount_ram(n->o.ram_root, false, ram_bytes, opts, sizeof(opts));
	}
	if (rc < 0)
		return fail(err, cap, rc, "mount tmpfs on %s: %s", n->o.ram_root, strerror(-rc));
	log_info(MOD, "RAM tier mounted at %s (tmpfs %s)", n->o.ram_root, opts);
	return 0;
}

int csi_node_create(const struct csi_node_opts *o, struct csi_node **out, char *err, size_t errcap)
{
	struct csi_node *n;
	int rc;

	*out = NULL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->o = *o;
	n->ram_bytes = o->cfg->ram_bytes;
	pthread_mutex_init(&n->mu, NULL);
	util_cond_init_monotonic(&n->cv);
	/* kubelet names targets under its root as it was given (a symlink
	 * there is the admin's); the mount table shows them resolved */
	if (snprintf(n->pods, sizeof(n->pods), "%s/pods",
		     o->kubelet_dir ? o->kubelet_dir : "/var/lib/kubelet") >= (int)sizeof(n->pods)) {
		rc = fail(err, errcap, -ENAMETOOLONG, "--kubelet-dir too long");
		goto out;
	}
	if (!realpath(n->pods, n->pods_real))
		snprintf(n->pods_real, sizeof(n->pods_real), "%s", n->pods);
	rc = mkdirs(o->state_dir, 0755);
	if (rc < 0) {
		fail(err, errcap, rc, "mkdir %s: %s", o->state_dir, strerror(-rc));
		goto out;
	}
	rc = ram_tier(n, err, errcap);
	if (rc < 0)
		goto out;
	jobs_load(n);
	rc = -pthread_create(&n->reaper, NULL, reaper_run, n);
	if (rc < 0)
		fail(err, errcap, rc, "reaper thread: %s", strerror(-rc));
	n->has_reaper = rc == 0;
out:
	if (rc < 0) {
		while (n->jobs) {
			struct job *j = n->jobs;
			n->jobs = j->next;
			job_free(j);
		}
		pthread_cond_destroy(&n->cv);
		pthread_mutex_destroy(&n->mu);
		free(n);
		return rc;
	}
	*out = n;
	return 0;
}

/* The job's mtcfs has exited? Reaps it; an exit we did not ask for
 * (stopping false) is a warning. */
/* The job's mtcfs is gone (reaped): free its ports; its log thread sees
 * EOF now, so joining it waits only for the last lines to be copied. */
static void job_reaped(struct job *j)
{
	j->pid = -1;
	j->peer_port = j->metrics_port = 0;
	if (j->has_pump) {
		pthread_join(j->pump, NULL);
		j->has_pump = false;
	}
}

static bool job_exited_(struct job *j, bool stopping)
{
	int st;

	if (j->pid <= 0)
		return true;
	if (waitpid(j->pid, &st, WNOHANG) == j->pid) {
		log_msg(stopping && WIFEXITED(st) && !WEXITSTATUS(st) ? LOG_INFO : LOG_WARN, MOD,
			"job %s: mtcfs pid %d exited (%s %d); see %s", j->key, (int)j->pid,
			WIFEXITED(st) ? "status" : "signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), j->log);
		job_reaped(j);
		return true;
	}
	return false;
}

static bool job_exited(struct job *j)
{
	return job_exited_(j, false);
}

/* Is the job's mount up (a FUSE mount on j->mnt that answers)? */
static bool job_mounted(struct job *j)
{
	return mount_point(j->mnt, NULL) == 1;
}

static void job_stop(struct job *j)
{
	uint64_t end;

	if (j->pid > 0) {
		kill(j->pid, SIGTERM);
		end = now_ms() + JOB_STOP_MS;
		while (!job_exited_(j, true) && now_ms() < end)
			sleep_ms(20);
		if (j->pid > 0) {
			log_warn(MOD, "job %s: mtcfs pid %d did not stop in %d s: killed", j->key,
				 (int)j->pid, JOB_STOP_MS / 1000);
			kill(j->pid, SIGKILL);
			waitpid(j->pid, NULL, 0);
			job_reaped(j);
		}
	}
	/* a killed daemon leaves its mount behind (ENOTCONN) */
	if (mount_point(j->mnt, NULL) != 0)
		umount2(j->mnt, MNT_DETACH);
}

static void job_free(struct job *j)
{
	for (size_t i = 0; i < j->n_targets; i++)
		free(j->targets[i]);
	free(j->targets);
	free(j);
}

void csi_node_destroy(struct csi_node *n)
{
	struct job *j, *next;

	if (!n)
		return;
	pthread_mutex_lock(&n->mu);
	n->stopping = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
	if (n->has_reaper)
		pthread_join(n->reaper, NULL);
	pthread_mutex_lock(&n->mu);
	for (j = n->jobs; j; j = next) {
		next = j->next;
		if (j->pid > 0) {
			log_info(MOD, "job %s: stopping its mtcfs (RAM tier kept)", j->key);
			job_stop(j);
		}
		job_free(j);
	}
	n->jobs = NULL;
	pthread_mutex_unlock(&n->mu);
	pthread_cond_destroy(&n->cv);
	pthread_mutex_destroy(&n->mu);
	free(n);
}

/* Append ",word" (or "word" first) to opts; -ENAMETOOLONG when full. */
static int opt_add(char *opts, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int opt_add(char *opts, size_t cap, const char *fmt, ...)
{
	size_t len = strlen(opts);
	va_list ap;
	int w;

	if (len && len + 1 < cap)
		opts[len++] = ',';
	va_start(ap, fmt);
	w = vsnprintf(opts + len, cap - len, fmt, ap);
	va_end(ap);
	return w < 0 || (size_t)w >= cap - len ? -ENAMETOOLONG : 0;
}

/* A rank for log lines: "?" when the yaml will tell. */
static const char *rank_str(unsigned rank, char buf[16])
{
	if (rank == CSI_RANK_NONE)
		return "?";
	snprintf(buf, 16, "%u", rank);
	return buf;
}

static int host_port(char *out, size_t cap, const char *host, unsigned port)
{
	int w = strchr(host, ':') ? snprintf(out, cap, "[%s]:%u", host, port)
				  : snprintf(out, cap, "%s:%u", host, port);
	return w < 0 || (size_t)w >= cap ? -ENAMETOOLONG : 0;
}

/* The lowest port from base up that no other running job of this node
 * serves /metrics on: metrics are scraped per node, so the ports need not
 * agree across nodes (unlike the peer port). */
static unsigned metrics_port_for(struct csi_node *n, const struct job *self, unsigned base)
{
	for (unsigned port = base; port <= 65535; port++) {
		bool used = false;
		for (struct job *j = n->jobs; j && !used; j = j->next)
			used = j != self && j->metrics_port == port && !job_exited(j);
		if (!used)
			return port;
	}
	return 0;
}

static int job_options(struct csi_node *n, struct job *self, const struct csi_pod *p,
		       char *opts, size_t cap)
{
	const struct csi_cfg *c = n->o.cfg;
	unsigned port = p->peer_port ? p->peer_port : c->peer_port;
	char hp[300], coord[CSI_NAME_MAX + 64];
	int rc;

	opts[0] = 0;
	if ((rc = host_port(hp, sizeof(hp), n->o.node_address, port)) < 0 ||
	    (rc = csi_pod_coordinator(p, port, coord, sizeof(coord))) < 0)
		return rc;
	rc = opt_add(opts, cap, "listen=%s", hp);
	if (!rc)
		rc = opt_add(opts, cap, "coordinator=%s", coord);
	if (!rc)
		/* a hint: the yaml's node-rank wins (as GKE takes it), the
		 * pod's index only names the node until then */
		rc = p->rank == CSI_RANK_NONE ? 0 : opt_add(opts, cap, "rank_hint=%u", p->rank);
	if (!rc && p->ram_size[0])
		rc = opt_add(opts, cap, "ram_size=%s", p->ram_size);
	if (!rc && c->bucket)
		rc = opt_add(opts, cap, "bucket=%s", c->bucket);
	if (!rc && c->secret_file)
		rc = opt_add(opts, cap, "secret_file=%s", c->secret_file);
	if (!rc && c->gcs_key_file)
		rc = opt_add(opts, cap, "gcs_key_file=%s", c->gcs_key_file);
	if (!rc && c->gcs_endpoint)
		rc = opt_add(opts, cap, "gcs_endpoint=%s", c->gcs_endpoint);
	if (!rc && c->restore_timeout)
		rc = opt_add(opts, cap, "restore_timeout=%u", c->restore_timeout);
	self->metrics_port = c->metrics_port ? metrics_port_for(n, self, c->metrics_port) : 0;
	if (!rc && self->metrics_port) {
		rc = host_port(hp, sizeof(hp), n->o.node_address, self->metrics_port);
		if (!rc)
			rc = opt_add(opts, cap, "metrics=%s", hp);
	}
	if (!rc && n->o.log_json)
		rc = opt_add(opts, cap, "log_format=json");
	for (size_t i = 0; !rc && i < c->n_mount_opts; i++)
		rc = opt_add(opts, cap, "%s", c->mount_opts[i]);
	return rc;
}

static void write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;         /* a log that cannot be written is not fatal */
		p += w;
		n -= (size_t)w;
	}
}

struct pump {
	int in;                     /* read end of the job's stdout+stderr */
	int file;                   /* its mtcfs.log */
};

/* One thread per job mount, for its life: copies the mtcfs output to its
 * log file and, whole lines at a time so jobs never interleave inside a
 * line, to the driver's stderr (kubectl logs, Cloud Logging). Ends at EOF
 * (the mtcfs exited); owns and closes both fds. */
static void *pump_run(void *arg)
{
	struct pump *pu = arg;
	char buf[65536];
	size_t have = 0;

	for (;;) {
		ssize_t r = read(pu->in, buf + have, sizeof(buf) - have);
		size_t upto;

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		write_all(pu->file, buf + have, (size_t)r);
		have += (size_t)r;
		for (upto = have; upto > 0 && buf[upto - 1] != '\n'; upto--)
			;
		if (!upto && have == sizeof(buf))
			upto = have;    /* a line longer than the buffer: let it go in pieces */
		write_all(2, buf, upto);
		memmove(buf, buf + upto, have - upto);
		have -= upto;
	}
	if (have)
		write_all(2, buf, have);
	close(pu->in);
	close(pu->file);
	free(pu);
	return NULL;
}

/* The pod's coordinator endpoint and peer port as its job mount would
 * get them (the attribute, else the derived name; the configuration's
 * port unless peerPort). */
static void job_attrs_of(const struct csi_node *n, const struct csi_pod *p, char *coord,
			 size_t cap, unsigned *port)
{
	*port = p->peer_port ? p->peer_port : n->o.cfg->peer_port;
	if (csi_pod_coordinator(p, *port, coord, cap) < 0)
		snprintf(coord, cap, "?");
}

/* The subdomain as far as it shapes the mount: only in a derived
 * coordinator name. */
static const char *attr_subdomain(const struct csi_pod *p)
{
	return p->coordinator[0] ? "" : p->subdomain;
}

static void diff_add(char *out, size_t cap, size_t *len, const char *name, const char *old,
		     const char *new_)
{
	int w;

	if (!strcmp(old, new_) || *len >= cap)
		return;
	w = snprintf(out + *len, cap - *len, "%s%s %s -> %s", *len ? "; " : "", name,
		     *old ? old : "(none)", *new_ ? new_ : "(none)");
	*len = w < 0 ? cap : *len + (size_t)w;
}

/* The attributes in which pod p differs from what j's mtcfs runs with,
 * "name old -> new" joined by "; " into out (empty: none). An attribute
 * not given is "(none)"; subdomain and coordinator are both named when
 * one changes the other. */
static void job_attrs_diff(const struct csi_node *n, const struct job *j, const struct csi_pod *p,
			   char *out, size_t cap)
{
	char coord[CSI_NAME_MAX + 64], a[32], b[32];
	unsigned port;
	size_t len = 0;

	out[0] = 0;
	if (!j->has_attrs)
		return;
	job_attrs_of(n, p, coord, sizeof(coord), &port);
	snprintf(a, sizeof(a), "%u", j->a_peer_port);
	snprintf(b, sizeof(b), "%u", port);
	diff_add(out, cap, &len, "peerPort", a, b);
	diff_add(out, cap, &len, "ramSize", j->a_ram_size, p->ram_size);
	diff_add(out, cap, &len, "subdomain", j->a_subdomain, attr_subdomain(p));
	diff_add(out, cap, &len, "coordinator", j->a_coordinator, coord);
	if (len >= cap && cap > 4)
		memcpy(out + cap - 4, "...", 4);
}

/* <state_dir>/<key>/attrs: the attributes the job's mtcfs runs with, so
 * that a driver that finds the mount serving (adopts it) still compares
 * them. Lines name=value; tmp + rename. A failure is a WARN. */
static void attrs_save(const struct csi_node *n, const struct job *j)
{
	char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/attrs", n->o.state_dir, j->key);
	snprintf(tmp, sizeof(tmp), "%s/%s/.attrs.tmp", n->o.state_dir, j->key);
	f = fopen(tmp, "we");
	if (!f) {
		log_warn(MOD, "job %s: %s: %s", j->key, tmp, strerror(errno));
		return;
	}
	fprintf(f, "peerPort=%u\nramSize=%s\nsubdomain=%s\ncoordinator=%s\n", j->a_peer_port,
		j->a_ram_size, j->a_subdomain, j->a_coordinator);
	if (fclose(f) != 0 || rename(tmp, path) < 0) {
		log_warn(MOD, "job %s: writing %s: %s", j->key, path, strerror(errno));
		unlink(tmp);
	}
}

static void attrs_load(const struct csi_node *n, struct job *j)
{
	char path[PATH_MAX + 16], line[CSI_NAME_MAX + 80];
	int seen = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/attrs", n->o.state_dir, j->key);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *v = strchr(line, '=');
		uint64_t u;

		if (!v)
			continue;
		*v++ = 0;
		v[strcspn(v, "\n")] = 0;
		if (!strcmp(line, "peerPort") && util_parse_u64(v, 65535, &u) == 0) {
			j->a_peer_port = (unsigned)u;
			seen |= 1;
		} else if (!strcmp(line, "ramSize")) {
			snprintf(j->a_ram_size, sizeof(j->a_ram_size), "%s", v);
			seen |= 2;
		} else if (!strcmp(line, "subdomain")) {
			snprintf(j->a_subdomain, sizeof(j->a_subdomain), "%s", v);
			seen |= 4;
		} else if (!strcmp(line, "coordinator")) {
			snprintf(j->a_coordinator, sizeof(j->a_coordinator), "%s", v);
			seen |= 8;
		}
	}
	fclose(f);
	j->has_attrs = seen == 15;
}

/* Start the job's mtcfs and wait until its mount answers. Called with mu
 * held. */
static int job_start(struct csi_node *n, struct job *j, const struct csi_pod *p,
		     char *err, size_t cap)
{
	char opts[OPTS_MAX], rs[16];
	char *argv[8];
	int argc = 0, logfd = -1, rc, out[2];
	struct pump *pu;

	unsigned port;
	uint64_t end;
	pid_t pid;

	port = p->peer_port ? p->peer_port : n->o.cfg->peer_port;
	for (struct job *o = n->jobs; o; o = o->next) {
		if (o == j || o->peer_port != port || job_exited(o))
			continue;
		if (o->n_targets)
			/* every node of a job must agree on rank 0's port, so the
			 * driver cannot pick another one by itself */
			return fail(err, cap, -EBUSY, "job %s: peer port %u is used by job %s on this "
				    "node: give one of the JobSets another peerPort volume attribute",
				    j->key, port, o->key);
		/* no pod uses that one: its RAMDIR stays, its port is this job's */
		log_info(MOD, "job %s: no pod, stopping its mtcfs (its RAMDIR stays): job %s needs "
			 "peer port %u", o->key, j->key, port);
		job_stop(o);
	}
	{
		uint64_t need = 0;

		if (p->ram_size[0] && util_parse_size(p->ram_size, &need) < 0)
			need = 0;
		ram_pressure(n, j, need);
	}
	rc = job_options(n, j, p, opts, sizeof(opts));
	if (rc < 0)
		return fail(err, cap, -EINVAL, "job %s: mount options too long", j->key);
	if ((rc = mkdirs(j->ramdir, 0700)) < 0 || (rc = mkdirs(j->mnt, 0755)) < 0)
		return fail(err, cap, rc, "job %s: mkdir: %s", j->key, strerror(-rc));
	/* a mount left by a daemon that died (ENOTCONN) would fail the new one */
	if (mount_point(j->mnt, NULL) != 0)
		umount2(j->mnt, MNT_DETACH);
	logfd = open(j->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (logfd < 0)
		return fail(err, cap, -errno, "job %s: %s: %s", j->key, j->log, strerror(errno));
	pu = malloc(sizeof(*pu));
	if (!pu || pipe2(out, O_CLOEXEC) < 0) {
		rc = pu ? -errno : -ENOMEM;
		free(pu);
		close(logfd);
		return fail(err, cap, rc, "job %s: log pipe: %s", j->key, strerror(-rc));
	}
	argv[argc++] = (char *)n->o.mtcfs_bin;
	argv[argc++] = "-f";
	if (n->o.debug)
		argv[argc++] = "-d";
	argv[argc++] = "-o";
	argv[argc++] = opts;
	argv[argc++] = j->ramdir;
	argv[argc++] = j->mnt;
	argv[argc] = NULL;
	log_info(MOD, "job %s: starting mtcfs rank=%s: %s -f -o %s %s %s", j->key,
		 rank_str(p->rank, rs), n->o.mtcfs_bin, opts, j->ramdir, j->mnt);
	pid = fork();
	if (pid < 0) {
		rc = -errno;
		close(logfd);
		close(out[0]);
		close(out[1]);
		free(pu);
		return fail(err, cap, rc, "job %s: fork: %s", j->key, strerror(-rc));
	}
	if (pid == 0) {
		/* no orphan mounts: the job mount ends with the driver (the RAM
		 * tier does not) */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		dup2(out[1], 1);
		dup2(out[1], 2);
		int nullfd = open("/dev/null", O_RDONLY);
		if (nullfd >= 0)
			dup2(nullfd, 0);
		sigset_t none;
		sigemptyset(&none);
		pthread_sigmask(SIG_SETMASK, &none, NULL);
		execvp(argv[0], argv);
		dprintf(2, "mtcfs-csi: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(out[1]);
	pu->in = out[0];
	pu->file = logfd;
	rc = pthread_create(&j->pump, NULL, pump_run, pu);
	if (rc != 0) {
		/* nobody would read its output: it would block on a full pipe */
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		close(out[0]);
		close(logfd);
		free(pu);
		return fail(err, cap, -rc, "job %s: no log thread: %s", j->key, strerror(rc));
	}
	j->has_pump = true;
	j->pid = pid;
	j->rank = p->rank;
	j->peer_port = port;
	job_attrs_of(n, p, j->a_coordinator, sizeof(j->a_coordinator), &j->a_peer_port);
	snprintf(j->a_subdomain, sizeof(j->a_subdomain), "%s", attr_subdomain(p));
	snprintf(j->a_ram_size, sizeof(j->a_ram_size), "%s", p->ram_size);
	j->has_attrs = true;
	attrs_save(n, j);
	end = now_ms() + JOB_READY_MS;
	for (;;) {
		if (job_mounted(j))
			break;
		if (job_exited(j))
			return fail(err, cap, -EIO, "job %s: mtcfs exited before mounting; see %s",
				    j->key, j->log);
		if (now_ms() >= end) {
			job_stop(j);
			return fail(err, cap, -EIO, "job %s: mtcfs not mounted after %d s; see %s",
				    j->key, JOB_READY_MS / 1000, j->log);
		}
		sleep_ms(10);
	}
	/* the trainer may run as any uid: the root is open like an emptyDir's
	 * (0777); mtcfs gives new entries the caller's uid. Not persisted by
	 * mtcfs, so set on every start. */
	if (chmod(j->mnt, 0777) < 0)
		log_warn(MOD, "job %s: chmod 0777 %s: %s", j->key, j->mnt, strerror(errno));
	log_info(MOD, "job %s: mounted at %s (RAMDIR %s, rank %s)", j->key, j->mnt, j->ramdir,
		 rank_str(p->rank, rs));
	return 0;
}

static struct job *job_find(struct csi_node *n, const char *key)
{
	for (struct job *j = n->jobs; j; j = j->next)
		if (!strcmp(j->key, key))
			return j;
	return NULL;
}

/* A job key as this driver makes them (<namespace>.<job>): a safe single
 * directory name. Names found in ram_root/state_dir that are not are
 * someone else's and left alone. */
static bool key_ok(const char *k)
{
	size_t n = strlen(k);

	if (!n || n >= 160 || k[0] == '.' || !strchr(k, '.'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') ||
		      (k[i] >= '0' && k[i] <= '9') || k[i] == '-' || k[i] == '_' || k[i] == '.'))
			return false;
	return true;
}

static int job_new_key(struct csi_node *n, const char *key, struct job **out)
{
	struct job *j = calloc(1, sizeof(*j));
	int w1, w2, w3, w4;

	if (!j)
		return -ENOMEM;
	w1 = snprintf(j->key, sizeof(j->key), "%s", key);
	w2 = snprintf(j->ramdir, sizeof(j->ramdir), "%s/%s", n->o.ram_root, j->key);
	w3 = snprintf(j->mnt, sizeof(j->mnt), "%s/%s/mnt", n->o.state_dir, j->key);
	w4 = snprintf(j->log, sizeof(j->log), "%s/%s/mtcfs.log", n->o.state_dir, j->key);
	if (w1 < 0 || (size_t)w1 >= sizeof(j->key) || w2 < 0 || (size_t)w2 >= sizeof(j->ramdir) ||
	    w3 < 0 || (size_t)w3 >= sizeof(j->mnt) || w4 < 0 || (size_t)w4 >= sizeof(j->log)) {
		free(j);
		return -ENAMETOOLONG;
	}
	j->pid = -1;
	j->idle_mono = now_ms();
	j->idle_wall = time(NULL);
	j->next = n->jobs;
	n->jobs = j;
	*out = j;
	return 0;
}

/* <state_dir>/<key>/published: the targets this driver bound for the job,
 * one a line (target_rel refuses control characters), rewritten whole at
 * every change (tmp + rename). A later driver reads it: unpublish then
 * knows the target is ours, and its mtime says since when the job has had
 * no pod. Called with mu held; a failure is a WARN (the bind is made). */
static void record_save(const struct csi_node *n, const struct job *j)
{
	char dir[PATH_MAX], path[PATH_MAX + 16], tmp[PATH_MAX + 32];
	FILE *f;
	int rc;

	snprintf(dir, sizeof(dir), "%s/%s", n->o.state_dir, j->key);
	snprintf(path, sizeof(path), "%s/published", dir);
	snprintf(tmp, sizeof(tmp), "%s/.published.tmp", dir);
	if ((rc = mkdirs(dir, 0755)) < 0) {
		log_warn(MOD, "job %s: mkdir %s: %s", j->key, dir, strerror(-rc));
		return;
	}
	f = fopen(tmp, "we");
	if (!f) {
		log_warn(MOD, "job %s: %s: %s", j->key, tmp, strerror(errno));
		return;
	}
	for (size_t i = 0; i < j->n_targets; i++)
		fprintf(f, "%s\n", j->targets[i]);
	if (fflush(f) != 0 || fsync(fileno(f)) < 0 || ferror(f)) {
		log_warn(MOD, "job %s: writing %s: %s", j->key, tmp, strerror(errno));
		fclose(f);
		unlink(tmp);
		return;
	}
	fclose(f);
	if (rename(tmp, path) < 0)
		log_warn(MOD, "job %s: rename %s: %s", j->key, path, strerror(errno));
}

static ssize_t target_index(const struct job *j, const char *target)
{
	for (size_t i = 0; i < j->n_targets; i++)
		if (!strcmp(j->targets[i], target))
			return (ssize_t)i;
	return -1;
}

static int target_add_(struct job *j, const char *target)
{
	char **t;

	if (target_index(j, target) >= 0)
		return 0;
	t = realloc(j->targets, (j->n_targets + 1) * sizeof(*t));
	if (!t)
		return -ENOMEM;
	j->targets = t;
	t[j->n_targets] = strdup(target);
	if (!t[j->n_targets])
		return -ENOMEM;
	j->n_targets++;
	return 0;
}

static int target_add(struct csi_node *n, struct job *j, const char *target)
{
	int rc = target_add_(j, target);

	if (rc == 0)
		record_save(n, j);
	return rc;
}

/* The job that published target, or NULL. */
static struct job *target_owner(struct csi_node *n, const char *target)
{
	for (struct job *j = n->jobs; j; j = j->next)
		if (target_index(j, target) >= 0)
			return j;
	return NULL;
}

static void target_remove(struct csi_node *n, struct job *j, const char *target)
{
	ssize_t i = target_index(j, target);

	if (i < 0)
		return;
	free(j->targets[i]);
	j->targets[i] = j->targets[--j->n_targets];
	if (!j->n_targets) {
		/* its last pod is gone: the reaper stops its mtcfs after idle_s */
		j->idle_mono = now_ms();
		j->idle_wall = time(NULL);
	}
	record_save(n, j);
}

/* At start: the jobs an earlier driver left, from their records (targets
 * still holding an mtcfs bind stay published: kubelet will unpublish
 * them) and from the RAMDIRs in ram_root (stopped jobs, whose RAM the
 * reaper may free). Their mtcfs are not running (an earlier driver's stop
 * ended them; a mount that outlived it is adopted at the next publish). */
static void jobs_load(struct csi_node *n)
{
	const char *roots[2] = { n->o.state_dir, n->o.ram_root };
	char path[PATH_MAX + 200], type[64];
	struct dirent *e;
	struct stat st;
	time_t now = time(NULL);
	uint64_t ago;

	for (int r = 0; r < 2; r++) {
		DIR *d = opendir(roots[r]);

		while (d && (e = readdir(d))) {
			struct job *j;
			char *line = NULL;
			size_t lcap = 0;
			ssize_t len;
			FILE *f;

			if (!key_ok(e->d_name) || job_find(n, e->d_name))
				continue;
			snprintf(path, sizeof(path), "%s/%s", roots[r], e->d_name);
			if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
				continue;
			if (job_new_key(n, e->d_name, &j) < 0)
				continue;
			j->idle_wall = st.st_mtime;
			snprintf(path, sizeof(path), "%s/%s/published", n->o.state_dir, j->key);
			if (stat(path, &st) == 0)
				j->idle_wall = st.st_mtime;
			f = fopen(path, "re");
			while (f && (len = getline(&line, &lcap, f)) > 0) {
				char real[PATH_MAX + 8], why[8];
				const char *rel;

				if (line[len - 1] == '\n')
					line[len - 1] = 0;
				rel = target_rel(n, line, why, sizeof(why));
				if (!rel)
					continue;
				target_real(n, rel, real, sizeof(real));
				if (mount_type(real, type, sizeof(type)) == 1 && !strcmp(type, "fuse.mtcfs") &&
				    target_add_(j, line) < 0)
					break;
			}
			free(line);
			if (f)
				fclose(f);
			ago = now > j->idle_wall ? (uint64_t)(now - j->idle_wall) * 1000 : 0;
			j->idle_mono = j->idle_mono > ago ? j->idle_mono - ago : 0;
			if (j->n_targets && !n->quiet)
				log_info(MOD, "job %s: %zu target(s) published by an earlier driver", j->key,
					 j->n_targets);
		}
		if (d)
			closedir(d);
	}
}

/* The job's mount, started (or restarted) as needed. Called with mu held. */
static int job_ensure(struct csi_node *n, const struct csi_pod *p, struct job **out,
		      char *err, size_t cap)
{
	char key[160];
	struct job *j;
	int rc;

	/* unambiguous: a namespace has no '.' (csi_pod) */
	snprintf(key, sizeof(key), "%s.%s", p->namespace_, p->job);
	j = job_find(n, key);
	if (!j) {
		rc = job_new_key(n, key, &j);
		if (rc < 0)
			return fail(err, cap, rc, "job %s: %s", key, strerror(-rc));
		j->rank = p->rank;
	}
	*out = j;
	if (j->pid <= 0 && !j->adopted && job_mounted(j)) {
		/* a live mount we did not start (a daemon that outlived an earlier
		 * driver): use it rather than fight it for the RAMDIR's lock */
		log_warn(MOD, "job %s: adopting the mount already at %s (rank assumed %u)", j->key,
			 j->mnt, p->rank);
		j->adopted = true;
		j->rank = p->rank;
		attrs_load(n, j);
	}
	if ((j->adopted || !job_exited(j)) && job_mounted(j)) {
		char diff[1024];

		job_attrs_diff(n, j, p, diff, sizeof(diff));
		if (j->rank == p->rank && !diff[0])
			return 0;
		if (j->adopted && j->rank != p->rank)
			return fail(err, cap, -EBUSY, "job %s: the adopted mount at %s is not ours to "
				    "restart for rank %u", j->key, j->mnt, p->rank);
		if (j->adopted)
			return fail(err, cap, -EBUSY, "job %s: volume attributes differ from the adopted "
				    "mount's at %s (%s), which is not ours to restart: refused", j->key,
				    j->mnt, diff);
		/* the pod's index names the mount until its yaml (rank_hint=, and
		 * jax-init-info.txt): a pod of another index on this node (the
		 * restarted JobSet placed ranks differently) gets the same RAMDIR
		 * under a restarted daemon, once nobody uses it; so do changed
		 * attributes. While pods of the job use the old mount, changing
		 * it under them would move their checkpoints. */
		if (j->n_targets && j->rank != p->rank)
			return fail(err, cap, -EBUSY,
				    "job %s runs as rank %u on this node and is published at %s; "
				    "pod %s wants rank %u", j->key, j->rank, j->targets[0], p->pod, p->rank);
		if (j->n_targets)
			return fail(err, cap, -EBUSY,
				    "job %s: volume attributes differ from the running job mount's "
				    "(%s) while pod(s) of the job still use it (%s): refused; they apply "
				    "when no pod of the job is published (a JobSet restart)",
				    j->key, diff, j->targets[0]);
		if (j->rank != p->rank)
			log_info(MOD, "job %s: rank %u -> %u: restarting its mtcfs on the same RAMDIR",
				 j->key, j->rank, p->rank);
		if (diff[0])
			log_info(MOD, "job %s: volume attributes changed (%s) and no pod uses its "
				 "mount: restarting its mtcfs with them on the same RAMDIR", j->key, diff);
		job_stop(j);
	} else if (j->pid > 0) {
		job_stop(j);    /* running but not answering */
	}
	j->adopted = false;
	return job_start(n, j, p, err, cap);
}

/* Bind the job's mount on target (rel: target_rel's), created without
 * following symlinks; the bind goes through an fd of it, so the directory
 * checked is the one mounted on. */
static int bind_target(struct csi_node *n, struct job *j, const char *target, const char *rel,
		       bool ro, char *err, size_t cap)
{
	char real[PATH_MAX + 8], type[64], fdp[40];
	struct stat ts, js;
	int rc, fd = -1, mt;

	target_real(n, rel, real, sizeof(real));
	rc = target_open(n, rel, true, &fd, NULL);
	if (rc == -ELOOP || rc == -ENOTDIR)
		return fail(err, cap, -EINVAL, "target_path %s: a symlink or a file on the way", target);
	if (rc < 0)
		return fail(err, cap, rc, "%s: %s", target, strerror(-rc));
	mt = mount_type(real, type, sizeof(type));
	if (mt == 1 && !strcmp(type, "fuse.mtcfs") && fstat(fd, &ts) < 0 && errno == ENOTCONN) {
		/* a bind of a job mount whose daemon died: replace it */
		close(fd);
		umount2(real, MNT_DETACH | UMOUNT_NOFOLLOW);
		rc = target_open(n, rel, true, &fd, NULL);
		if (rc < 0)
			return fail(err, cap, rc, "%s: %s", target, strerror(-rc));
		mt = mount_type(real, type, sizeof(type));
	}
	if (mt < 0) {
		rc = mt;
		fail(err, cap, rc, "mount table: %s", strerror(-rc));
		goto out;
	}
	if (mount_point(j->mnt, NULL) != 1 || stat(j->mnt, &js) < 0) {
		rc = fail(err, cap, -EIO, "job %s: mount gone; see %s", j->key, j->log);
		goto out;
	}
	snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", fd);
	if (mt == 1) {
		struct statvfs sv;

		if (fstat(fd, &ts) < 0 || ts.st_dev != js.st_dev) {
			rc = fail(err, cap, -EEXIST, "%s already holds another mount", target);
			goto out;
		}
		/* published already: the same volume again is fine, the same
		 * volume with the other readonly flag is not (CSI: ALREADY_EXISTS) */
		if (statvfs(fdp, &sv) == 0 && !!(sv.f_flag & ST_RDONLY) != ro)
			rc = fail(err, cap, -EEXIST, "%s is already published %s", target,
				  ro ? "read-write" : "read-only");
		goto out;
	}
	if (mount(j->mnt, fdp, NULL, MS_BIND, NULL) < 0) {
		rc = fail(err, cap, -errno, "bind %s on %s: %s", j->mnt, target, strerror(errno));
		goto out;
	}
	if (ro) {
		/* the fd is the directory under the bind: the remount goes to a
		 * new one of the bind's root */
		close(fd);
		fd = -1;
		rc = target_open(n, rel, false, &fd, NULL);
		snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", fd);
		if (rc < 0 || mount(NULL, fdp, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0) {
			rc = rc < 0 ? rc : -errno;
			umount2(real, MNT_DETACH | UMOUNT_NOFOLLOW);
			fail(err, cap, rc, "read-only remount of %s: %s", target, strerror(-rc));
			goto out;
		}
	}
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

static void free_ram(struct csi_node *n);

static bool ip_ok(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F') ||
		      *s == '.' || *s == ':'))
			return false;
	return true;
}

/* What the pod's name and attributes leave open, from the API (JobSet
 * pods only, no RPC lock held: each is one GET):
 * - podsPerJob: the Job <jobset>-<rjob>-<jobIndex>'s spec.parallelism;
 * - the coordinator: rank 0's pod's node (status.hostIP), where its
 *   node's mtcfs listens whatever network the pods use (on the pod
 *   network the headless Service's name is the pod's address).
 * Without an API (outside a cluster) or when a read fails: the defaults
 * (no podsPerJob: csi_pod's; the coordinator: the headless Service's
 * name), with a WARN for a failure. -EAGAIN (kubelet retries) while rank
 * 0's pod is not scheduled; -EINVAL when the parallelism contradicts the
 * pod index. */
static int pod_from_api(struct csi_node *n, struct csi_pod *p, char *err, size_t cap)
{
	const struct csi_kube *k = n->o.kube;
	unsigned port = p->peer_port ? p->peer_port : n->o.cfg->peer_port, ppj;
	char name[200], host[64], pod0[CSI_NAME_MAX + 1] = "";
	int rc;

	if (!k || !p->jobset[0])
		return 0;
	/* job index 0: rank = podIndex whatever the parallelism */
	if (!p->pods_per_job_given && !p->rank_given && p->job_index > 0) {
		snprintf(name, sizeof(name), "%s-%s-%u", p->jobset, p->rjob, p->job_index);
		rc = csi_kube_job_parallelism(k, p->namespace_, name, &ppj, err, cap);
		if (rc == 0) {
			rc = csi_pod_set_pods_per_job(p, ppj, err, cap);
			if (rc < 0)
				return rc;
		} else {
			log_warn(MOD, "pod %s/%s: podsPerJob from the API: %s (rank %s)", p->namespace_,
				 p->pod, err, p->rank == CSI_RANK_NONE ? "left to replicator.yaml" :
				 "from the pod's index");
		}
	}
	if (p->coordinator[0])
		return 0;
	rc = csi_kube_rank0_host(k, p->namespace_, p->jobset, p->rjob, host, sizeof(host), pod0,
				 sizeof(pod0), err, cap);
	if (rc == -EAGAIN)
		return rc;
	if (rc == 0 && ip_ok(host) && host_port(p->coordinator, sizeof(p->coordinator), host, port) == 0) {
		log_info(MOD, "pod %s/%s: rank 0 is pod %s on node %s: coordinator %s", p->namespace_,
			 p->pod, pod0, host, p->coordinator);
		return 0;
	}
	p->coordinator[0] = 0;
	log_warn(MOD, "pod %s/%s: rank 0's node from the API: %s: the headless Service's name is "
		 "used", p->namespace_, p->pod, rc == 0 ? "not an IP address" : err);
	err[0] = 0;
	return 0;
}

int csi_node_publish(struct csi_node *n, const struct csi_publish *rq, char *err, size_t errcap)
{
	char rs[16];
	struct csi_pod p;
	struct job *j = NULL;
	const char *rel;
	int rc;

	err[0] = 0;
	rel = target_rel(n, rq->target, err, errcap);
	if (!rel)
		return -EINVAL;
	rc = csi_pod_parse(&p, rq->ctx, rq->n_ctx, err, errcap);
	if (rc < 0)
		return rc;
	rc = pod_from_api(n, &p, err, errcap);
	if (rc < 0) {
		log_warn(MOD, "publish of volume %s at %s: %s", rq->volume_id, rq->target, err);
		return rc;
	}
	pthread_mutex_lock(&n->mu);
	rc = 0;
	if (n->cfg_gone)
		rc = fail(err, errcap, -EBUSY, "the node's checkpoint configuration %s is deleted "
			  "(its RAM tier is freed): re-create it to publish",
			  n->o.watch ? n->o.watch : "");
	else if (n->ram_freed && (rc = ram_tier(n, err, errcap)) == 0)
		n->ram_freed = false;   /* the configuration came back: a new tmpfs */
	if (rc == 0) {
		/* a symlink on the way is refused before any job starts for it */
		int fd = -1;

		rc = target_open(n, rel, true, &fd, NULL);
		if (fd >= 0)
			close(fd);
		if (rc == -ELOOP || rc == -ENOTDIR)
			rc = fail(err, errcap, -EINVAL, "target_path %s: a symlink or a file on the way",
				  rq->target);
		else if (rc < 0)
			fail(err, errcap, rc, "%s: %s", rq->target, strerror(-rc));
	}
	if (rc == 0)
		rc = job_ensure(n, &p, &j, err, errcap);
	if (rc == 0)
		rc = bind_target(n, j, rq->target, rel, rq->readonly, err, errcap);
	if (rc == 0)
		rc = target_add(n, j, rq->target);
	pthread_mutex_unlock(&n->mu);
	if (rc == 0)
		log_info(MOD, "published volume %s of job %s (pod %s, rank %s) at %s%s", rq->volume_id,
			 j->key, p.pod[0] ? p.pod : "-", rank_str(p.rank, rs), rq->target,
			 rq->readonly ? " (ro)" : "");
	else if (rc == -EINVAL || rc == -EEXIST || rc == -EBUSY)
		/* the request's fault: kubelet shows it on the pod */
		log_warn(MOD, "publish of volume %s at %s refused: %s", rq->volume_id, rq->target, err);
	else
		log_err(MOD, "publish of volume %s at %s: %s", rq->volume_id, rq->target, err);
	return rc;
}

int csi_node_unpublish(struct csi_node *n, const char *volume_id, const char *target,
		       char *err, size_t errcap)
{
	char real[PATH_MAX + 8], type[64] = "";
	const char *rel;
	struct job *owner;
	int rc, mp, fd = -1;

	err[0] = 0;
	rel = target_rel(n, target, err, errcap);
	if (!rel)
		return -EINVAL;
	target_real(n, rel, real, sizeof(real));
	pthread_mutex_lock(&n->mu);
	owner = target_owner(n, target);
	rc = target_open(n, rel, false, &fd, NULL);
	if (fd >= 0)
		close(fd);
	if (rc == -ENOENT) {
		mp = 0;                 /* gone already: idempotent */
		rc = 0;
		goto done;
	}
	if (rc == -ELOOP || rc == -ENOTDIR) {
		rc = fail(err, errcap, -EINVAL, "target_path %s: a symlink or a file on the way",
			  target);
		goto out;
	}
	if (rc < 0) {
		fail(err, errcap, rc, "%s: %s", target, strerror(-rc));
		goto out;
	}
	mp = mount_type(real, type, sizeof(type));
	if (mp < 0) {
		rc = fail(err, errcap, mp, "mount table: %s", strerror(-mp));
		goto out;
	}
	if (mp == 1 && strcmp(type, "fuse.mtcfs")) {
		/* what is mounted there is not a bind of ours: not ours to remove */
		rc = fail(err, errcap, -EPERM, "%s holds a %s mount this driver did not publish: "
			  "left alone", target, type);
		goto out;
	}
	if (mp == 1 && !owner)
		/* an mtcfs bind without a record: a driver before the records */
		log_warn(MOD, "unpublish %s: an mtcfs bind this driver has no record of: unmounted",
			 target);
	if (mp == 1 && umount2(real, UMOUNT_NOFOLLOW) < 0) {
		if (errno == EBUSY) {
			/* the pod is gone but something holds a file open: detach now,
			 * the kernel frees it at the last close; the job mount is
			 * untouched either way */
			log_warn(MOD, "unpublish %s: busy, detached lazily", target);
			if (umount2(real, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
				rc = -errno;
		} else if (errno != EINVAL) {
			rc = -errno;
		}
		if (rc < 0) {
			fail(err, errcap, rc, "unmount %s: %s", target, strerror(-rc));
			goto out;
		}
	}
	if (rmdir(real) < 0 && errno != ENOENT)
		log_warn(MOD, "unpublish %s: rmdir: %s", target, strerror(errno));
done:
	if (owner)
		target_remove(n, owner, target);
	if (n->cfg_gone)
		free_ram(n);    /* its last pod gone: what waited for it goes now */
	pthread_mutex_unlock(&n->mu);
	log_info(MOD, "unpublished volume %s at %s%s", volume_id, target,
		 mp == 0 ? " (was not mounted)" : "");
	return 0;
out:
	pthread_mutex_unlock(&n->mu);
	return rc;
}

static int unmount_any(const char *path)
{
	int mp = mount_point(path, NULL);

	if (mp == 0 || mp == -ENOENT)
		return 0;
	if (umount2(path, 0) == 0)
		return 1;
	if (errno != EBUSY && errno != EINVAL)
		return -errno;
	return umount2(path, MNT_DETACH) == 0 ? 1 : -errno;
}

int csi_node_release(const struct csi_node_opts *o, char *err, size_t errcap)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *d;
	int rc = 0, r;

	err[0] = 0;
	d = opendir(o->state_dir);
	if (!d && errno != ENOENT)
		return fail(err, errcap, -errno, "%s: %s", o->state_dir, strerror(errno));
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (snprintf(path, sizeof(path), "%s/%s/mnt", o->state_dir, e->d_name) >=
		    (int)sizeof(path))
			continue;
		r = unmount_any(path);
		if (r < 0 && !rc)
			rc = fail(err, errcap, r, "unmount %s: %s", path, strerror(-r));
		else if (r > 0)
			log_info(MOD, "released job mount %s", path);
	}
	if (d)
		closedir(d);
	if (o->no_tmpfs)
		return rc;
	r = unmount_any(o->ram_root);
	if (r < 0 && !rc)
		rc = fail(err, errcap, r, "unmount %s: %s", o->ram_root, strerror(-r));
	else if (r > 0)
		log_info(MOD, "released the RAM tier at %s", o->ram_root);
	return rc;
}

/* The configuration is deleted: stop and forget every job mount no target
 * uses (its RAMDIR goes with the tmpfs), then unmount the tmpfs if no job
 * is left. Called with mu held; again at each unpublish while gone. */
static void free_ram(struct csi_node *n)
{
	struct job **pp = &n->jobs, *j;
	int r;

	while ((j = *pp)) {
		if (j->n_targets) {
			pp = &j->next;
			continue;
		}
		log_info(MOD, "job %s: configuration deleted: stopping its mtcfs, freeing its RAM",
			 j->key);
		job_stop(j);
		r = unmount_any(j->mnt);        /* an adopted mount is not our child */
		if (r < 0)
			log_warn(MOD, "job %s: unmount %s: %s", j->key, j->mnt, strerror(-r));
		*pp = j->next;
		job_free(j);
	}
	if (n->jobs || n->ram_freed || n->o.no_tmpfs)
		return;
	r = unmount_any(n->o.ram_root);
	if (r < 0) {
		log_warn(MOD, "configuration deleted: unmount the RAM tier %s: %s", n->o.ram_root,
			 strerror(-r));
		return;
	}
	n->ram_freed = true;
	log_info(MOD, "configuration %s deleted: the RAM tier at %s is unmounted (its "
		 "checkpoints with it)", n->o.watch ? n->o.watch : "", n->o.ram_root);
}

/* ---- the reaper: idle job mounts stop, stopped jobs' RAM is freed ---- */

static int g_rm_errors;         /* (mu) rm_tree's failures, for its caller */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if ((flag == FTW_DP || flag == FTW_DNR ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT)
		g_rm_errors++;
	return 0;
}

/* Delete dir and everything below it, on its own file system only (a
 * mount below is not crossed). Called with mu held. 0 or -EIO. */
static int rm_tree(const char *dir)
{
	g_rm_errors = 0;
	if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0 && errno != ENOENT)
		return -errno;
	return g_rm_errors ? -EIO : 0;
}

/* Is anything of the job alive here: a pod, or its mtcfs? (Reaps it.) */
static bool job_running(struct job *j)
{
	return j->n_targets || j->adopted || !job_exited(j);
}

/* Free a stopped job's RAM: its RAMDIR goes, and the job with it (a later
 * pod of it starts on an empty RAMDIR and restores from peers or the
 * bucket). Called with mu held. */
static void job_free_ram(struct csi_node *n, struct job *j, unsigned pct)
{
	struct statfs a, b;
	char when[32];
	struct tm tm;
	int rc;

	gmtime_r(&j->idle_wall, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	if (job_mounted(j)) {
		/* a mount nobody started (it appeared since): leave it all */
		log_warn(MOD, "job %s: not freeing its RAM: something is mounted at %s", j->key, j->mnt);
		j->adopted = true;
		return;
	}
	statfs(n->o.ram_root, &a);
	rc = rm_tree(j->ramdir);
	if (statfs(n->o.ram_root, &b) < 0)
		b = a;
	log_msg(rc < 0 ? LOG_WARN : LOG_INFO, MOD,
		"job %s: no pod since %s and the RAM tier %u%% full while another job runs: "
		"freed its RAMDIR %s (%llu bytes)%s", j->key, when, pct, j->ramdir,
		(unsigned long long)(b.f_bfree > a.f_bfree ?
				     (uint64_t)(b.f_bfree - a.f_bfree) * (uint64_t)b.f_bsize : 0),
		rc < 0 ? ", some files could not be removed" : "");
	for (struct job **pp = &n->jobs; *pp; pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			break;
		}
	job_free(j);
}

/* Under pressure (the RAM tier more than free_pct full, or less free than
 * a starting job's ramSize), free stopped jobs' RAMDIRs, the longest
 * without a pod first, as long as another job runs (self: the one about
 * to start counts): a node whose only job is between two pods keeps its
 * data however full. Never a published or idle (mtcfs running) job's.
 * Called with mu held. */
static void ram_pressure(struct csi_node *n, const struct job *self, uint64_t need)
{
	struct statfs sf;

	if (!n->o.free_pct || n->ram_freed || n->cfg_gone)
		return;
	for (;;) {
		struct job *victim = NULL;
		bool other = self != NULL;
		struct stat st;
		uint64_t size, used, avail;

		if (statfs(n->o.ram_root, &sf) < 0 || !sf.f_blocks)
			return;
		size = (uint64_t)sf.f_blocks * (uint64_t)sf.f_bsize;
		used = (uint64_t)(sf.f_blocks - sf.f_bfree) * (uint64_t)sf.f_bsize;
		avail = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
		if (used * 100 <= size * n->o.free_pct && avail >= need)
			return;
		for (struct job *j = n->jobs; j; j = j->next) {
			if (j == self)
				continue;
			if (job_running(j)) {
				other = true;
				continue;
			}
			if (stat(j->ramdir, &st) < 0)
				continue;
			if (!victim || j->idle_wall < victim->idle_wall)
				victim = j;
		}
		if (!other || !victim)
			return;
		job_free_ram(n, victim, (unsigned)(used * 100 / size));
	}
}

/* Stop the mtcfs of jobs no pod has used for idle_s: it frees their port
 * (and metrics port) and the process; the RAMDIR stays. Called with mu. */
static void reap_idle(struct csi_node *n)
{
	uint64_t now = now_ms();

	for (struct job *j = n->jobs; j; j = j->next) {
		if (j->n_targets || (!j->adopted && job_exited(j)))
			continue;
		if (now - j->idle_mono < (uint64_t)n->o.idle_s * 1000)
			continue;
		log_info(MOD, "job %s: no pod for %u s: stopping its mtcfs (its RAMDIR stays for "
			 "the job's next pods)", j->key, n->o.idle_s);
		job_stop(j);
		if (j->adopted) {
			int r = unmount_any(j->mnt);
			if (r < 0)
				log_warn(MOD, "job %s: unmount %s: %s", j->key, j->mnt, strerror(-r));
			j->adopted = false;
		}
	}
}

static void *reaper_run(void *arg)
{
	struct csi_node *n = arg;
	unsigned tick = n->o.idle_s ? n->o.idle_s * 250 : 100;

	if (tick > 1000)
		tick = 1000;
	if (tick < 100)
		tick = 100;
	pthread_mutex_lock(&n->mu);
	while (!n->stopping) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (long)(tick % 1000) * 1000000L;
		ts.tv_sec += tick / 1000 + ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&n->cv, &n->mu, &ts);
		if (n->stopping)
			break;
		reap_idle(n);
		ram_pressure(n, NULL, 0);
	}
	pthread_mutex_unlock(&n->mu);
	return NULL;
}

void csi_node_config_gone(struct csi_node *n)
{
	pthread_mutex_lock(&n->mu);
	if (!n->cfg_gone) {
		n->cfg_gone = true;
		log_info(MOD, "configuration %s deleted: refusing new publishes, freeing the RAM "
			 "tier (job mounts still published go at their last unpublish)",
			 n->o.watch ? n->o.watch : "");
		free_ram(n);
	}
	pthread_mutex_unlock(&n->mu);
}

/* Resize the mounted tmpfs to n->ram_bytes: never below what it holds
 * (the kernel would refuse, and a smaller size would fail the next save). */
static void ram_resize(struct csi_node *n)
{
	struct statfs sf;
	uint64_t cur, used;
	char opts[64];

	if (n->o.no_tmpfs || n->ram_freed || !n->ram_bytes)
		return;
	if (mount_point(n->o.ram_root, NULL) != 1 || statfs(n->o.ram_root, &sf) < 0 ||
	    sf.f_type != TMPFS_MAGIC_)
		return;
	cur = (uint64_t)sf.f_blocks * (uint64_t)sf.f_bsize;
	used = (uint64_t)(sf.f_blocks - sf.f_bfree) * (uint64_t)sf.f_bsize;
	if (cur == n->ram_bytes)
		return;
	if (n->ram_bytes < used) {
		log_warn(MOD, "inMemoryVolumeSize %llu is below the %llu bytes the RAM tier %s holds: "
			 "not shrunk (still %llu)", (unsigned long long)n->ram_bytes,
			 (unsigned long long)used, n->o.ram_root, (unsigned long long)cur);
		return;
	}
	snprintf(opts, sizeof(opts), "size=%llu", (unsigned long long)n->ram_bytes);
	if (mount(NULL, n->o.ram_root, NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts) < 0) {
		log_warn(MOD, "remount %s %s: %s", n->o.ram_root, opts, strerror(errno));
		return;
	}
	log_info(MOD, "RAM tier %s resized %llu -> %llu bytes (inMemoryVolumeSize changed)",
		 n->o.ram_root, (unsigned long long)cur, (unsigned long long)n->ram_bytes);
}

void csi_node_config_present(struct csi_node *n, uint64_t ram_bytes)
{
	pthread_mutex_lock(&n->mu);
	if (n->cfg_gone) {
		n->cfg_gone = false;
		log_info(MOD, "configuration %s is back: publishes work again%s",
			 n->o.watch ? n->o.watch : "",
			 n->ram_freed ? " (the RAM tier is mounted at the next)" : "");
	}
	/* 0 (no size, or a spec that does not parse): keep what runs */
	if (ram_bytes && ram_bytes != n->ram_bytes) {
		n->ram_bytes = ram_bytes;
		ram_resize(n);
	}
	pthread_mutex_unlock(&n->mu);
}

/* ---- mtcfs-csi --status ------------------------------------------------- */

static uint64_t g_du_bytes;     /* du_one's sum (--status runs one thread) */

static int du_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)path;
	(void)flag;
	(void)ftw;
	g_du_bytes += (uint64_t)st->st_blocks * 512;
	return 0;
}

int csi_node_status(const struct csi_node_opts *o, FILE *out, char *err, size_t errcap)
{
	struct csi_node *n;
	struct statfs sf;
	struct job *j;

	err[0] = 0;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->o = *o;
	n->quiet = true;
	snprintf(n->pods, sizeof(n->pods), "%s/pods", o->kubelet_dir ? o->kubelet_dir : "/var/lib/kubelet");
	if (!realpath(n->pods, n->pods_real))
		snprintf(n->pods_real, sizeof(n->pods_real), "%s", n->pods);
	jobs_load(n);
	if (statfs(o->ram_root, &sf) == 0 && sf.f_blocks)
		fprintf(out, "RAM tier %s: %llu of %llu bytes used (%llu%%)\n", o->ram_root,
			(unsigned long long)((uint64_t)(sf.f_blocks - sf.f_bfree) * sf.f_bsize),
			(unsigned long long)((uint64_t)sf.f_blocks * sf.f_bsize),
			(unsigned long long)((sf.f_blocks - sf.f_bfree) * 100 / sf.f_blocks));
	fprintf(out, "%-40s %-9s %14s %4s %s\n", "JOB", "STATE", "RAM_BYTES", "PODS", "NO_POD_SINCE");
	for (j = n->jobs; j; j = j->next) {
		char when[32] = "-";
		struct stat st;
		const char *state;

		g_du_bytes = 0;
		if (stat(j->ramdir, &st) == 0)
			nftw(j->ramdir, du_one, 16, FTW_PHYS | FTW_MOUNT);
		else if (!j->n_targets && !job_mounted(j))
			continue;       /* a state directory only: its RAM is gone */
		if (j->n_targets)
			state = "published";
		else if (job_mounted(j))
			state = "idle";
		else
			state = "stopped";
		if (!j->n_targets) {
			struct tm tm;
			gmtime_r(&j->idle_wall, &tm);
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
		}
		fprintf(out, "%-40s %-9s %14llu %4zu %s\n", j->key, state,
			(unsigned long long)g_du_bytes, j->n_targets, when);
	}
	while ((j = n->jobs)) {
		n->jobs = j->next;
		job_free(j);
	}
	free(n);
	return 0;
}
