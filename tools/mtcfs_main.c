/* mtcfs: the per-node daemon (mtcfs [-f] [-d] [-o OPT,...] RAMDIR MOUNTPOINT).
 * Its composition root: the command line, the RAMDIR lock, the FUSE front
 * (fs/fs.h), the RAM tier, the engine (cluster/), the metrics endpoint, and
 * the order they start and stop in. Order matters: the FUSE session is
 * mounted and the process daemonized before any thread starts or LMDB is
 * opened (neither survives fork()). */
#include "tools/daemon_i.h"
#include "cluster/engine.h"
#include "common/jobname.h"
#include "common/log.h"
#include "net/metrics_http.h"
#include "tiers/jobid.h"
#include "tiers/ramtier.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct daemon {
	struct cmdline c;
	struct fuse_args args;
	struct fuse_cmdline_opts fo;
	uint64_t cap;               /* ram_size in bytes; 0: RAMDIR's free space */
	int lock_fd;
	struct fs *fs;
	struct ram_tier *ram;
	struct eng *eng;            /* NULL for a single node without network */
	/* the job this node serves: one record for the front and the engine
	 * (tiers/jobid.h), freed after both */
	struct jobid *jid;
	struct mhttp *mh;
};

/* READY=1 goes out once the kernel's INIT is handled (fs_opts.on_init),
 * i.e. the mount answers, the RAM tier, peers, control thread and metrics
 * all being up before the loop starts. */
static void on_fuse_init(void *arg)
{
	struct daemon *d = arg;
	char msg[PATH_MAX + 64];

	if (snprintf(msg, sizeof(msg), "READY=1\nSTATUS=serving %s\nMAINPID=%d",
		     d->fo.mountpoint, (int)getpid()) < (int)sizeof(msg))
		notify_send(msg);
}

/* Gauges for a scrape (the metrics thread). */
static void gauges(void *arg, struct metrics_gauges *g)
{
	struct daemon *d = arg;
	struct shard_rec *recs = NULL;
	size_t n = 0;
	char job[JOB_NAME_MAX + 1];
	uint32_t rank;

	g->ram_used = ram_used(d->ram);
	g->ram_size = ram_cap(d->ram);
	fs_job(d->fs, job, sizeof(job), &rank);
	if (d->eng) {
		uint32_t nodes;
		bool up;
		uint64_t lkg;
		eng_status(d->eng, &nodes, &up);
		g->peers_total = (int)nodes;
		g->peers_reachable = up ? 1 : 0;
		if (eng_lkg(d->eng, job, &lkg))
			g->lkg_step = (int64_t)lkg;
		if (eng_gc_step(d->eng, job, &lkg))
			g->replicated_lkg_step = (int64_t)lkg;
	}
	if (idx_list_shards(ram_idx(d->ram), job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			if ((recs[i].flags & SHF_OWN) && recs[i].key.rank == rank &&
			    recs[i].state >= SH_COMMITTED && recs[i].state != SH_BAD &&
			    (int64_t)recs[i].key.step > g->last_commit_step)
				g->last_commit_step = (int64_t)recs[i].key.step;
		idx_recs_free(recs, n);
	}
	if (!d->eng && g->last_commit_step >= 0)
		g->lkg_step = g->last_commit_step;
}

/* The command line, checked, to a locked RAMDIR. 0, or < 0 having said why
 * on stderr. */
static int daemon_prepare(struct daemon *d, const char *prog)
{
	struct stat st;
	char *abs, *mabs;

	if (cmdline_apply(&d->c, &d->args) < 0)
		return -EINVAL;
	if (fuse_parse_cmdline(&d->args, &d->fo) != 0 || !d->c.ramdir || !d->fo.mountpoint) {
		cmdline_usage(prog);
		return -EINVAL;
	}
	if (stat(d->c.ramdir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "mtcfs: RAMDIR %s is not a directory\n", d->c.ramdir);
		return -ENOTDIR;
	}
	/* fuse_daemonize() moves to "/": keep absolute paths */
	abs = realpath(d->c.ramdir, NULL);
	mabs = realpath(d->fo.mountpoint, NULL);
	if (!abs || !mabs) {
		fprintf(stderr, "mtcfs: cannot resolve %s or %s: %s\n", d->c.ramdir, d->fo.mountpoint,
			strerror(errno));
		free(abs);
		free(mabs);
		return -ENOENT;
	}
	free(d->c.ramdir);
	d->c.ramdir = abs;
	free(d->fo.mountpoint);
	d->fo.mountpoint = mabs;
	if (ramdir_lock(d->c.ramdir, &d->lock_fd) < 0)
		return -EBUSY;
	return cmdline_check(&d->c, &d->cap);
}

/* The FUSE front mounted, then the process detached (unless -f). */
static int daemon_mount(struct daemon *d)
{
	const struct daemon_opts *o = &d->c.o;
	struct fs_opts fo = {
		.mountpoint = d->fo.mountpoint, .listen = o->listen, .peers = o->peers,
		.coordinator = o->coordinator, .jax_init_info = o->jax_init_info,
		.jax_port = o->jax_port, .rank = o->rank, .rank_hint = o->rank_hint,
		.on_init = on_fuse_init, .arg = d,
	};

	if (jobid_new(&d->jid) < 0)
		return -ENOMEM;
	fo.jobid = d->jid;
	if (fs_new(&fo, &d->args, &d->fs) < 0 || fs_mount(d->fs) < 0)
		return -EIO;
	fuse_daemonize(d->fo.foreground);
	/* detached, stderr is /dev/null now (mount(8), fstab, a mount unit):
	 * the log goes to syslog, i.e. the journal, unless log_file= says */
	if (!d->fo.foreground && log_to_stderr())
		log_use_syslog();
	ramdir_lock_note_pid(d->lock_fd);
	return 0;
}

/* The engine, when the options ask for peers or a bucket. */
static int daemon_start_engine(struct daemon *d)
{
	const struct daemon_opts *o = &d->c.o;
	struct eng_opts eo = {
		.listen = o->listen, .peers = o->peers, .coordinator = o->coordinator,
		.secret_file = o->secret_file, .rank = o->rank, .rank_hint = o->rank_hint,
		.tls_cert = o->tls_cert, .tls_key = o->tls_key, .tls_ca = o->tls_ca,
		.restore_timeout_s = o->restore_timeout, .stop_timeout_s = o->stop_timeout,
		.bucket = o->bucket,
		.gcs_endpoint = o->gcs_endpoint, .gcs_key_file = o->gcs_key_file,
		.redundancy = o->redundancy, .jobid = d->jid,
	};
	struct eng_cb cb;

	if (!o->listen && !o->bucket)
		return 0;
	fs_eng_callbacks(d->fs, &cb);
	if (eng_start(d->ram, &eo, &cb, &d->eng) < 0) {
		log_err("main", "cannot start the peer tier");
		return -EIO;
	}
	return 0;
}

/* For mtcfs-admin: where this daemon serves (status), and the bucket
 * options its bucket commands use when not given them. jansson escapes
 * what a path may hold ('"', '\\'). */
static void daemon_put_meta(struct daemon *d)
{
	const struct daemon_opts *o = &d->c.o;
	json_t *m = json_pack("{s:i,s:s,s:I,s:I}", "pid", (int)getpid(), "mountpoint",
			      d->fo.mountpoint, "ram_size", (json_int_t)ram_cap(d->ram),
			      "started", (json_int_t)time(NULL));
	char *meta;

	if (m && o->bucket)
		json_object_set_new(m, "bucket", json_string(o->bucket));
	if (m && o->gcs_endpoint)
		json_object_set_new(m, "gcs_endpoint", json_string(o->gcs_endpoint));
	if (m && o->gcs_key_file) {
		char *abs = realpath(o->gcs_key_file, NULL);
		json_object_set_new(m, "gcs_key_file", json_string(abs ? abs : o->gcs_key_file));
		free(abs);
	}
	meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
	if (meta)
		idx_put_meta(ram_idx(d->ram), "daemon", meta, strlen(meta));
	free(meta);
	json_decref(m);
}

/* Everything the loop needs, in order: the RAM tier, the front on it, the
 * engine, the front's control thread, the daemon's record, metrics. */
static int daemon_start(struct daemon *d)
{
	int rc;

	/* From here on threads and LMDB are safe, and /proc/self is ours (it
	 * named the parent before fuse_daemonize() forked). */
	if (fs_after_fork(d->fs) < 0)
		return -EIO;
	rc = ram_open(d->c.ramdir, d->cap, &d->ram);
	if (rc < 0) {
		log_err("main", "cannot open the RAM tier in %s: %s", d->c.ramdir, strerror(-rc));
		return rc;
	}
	if (fs_attach(d->fs, d->ram) < 0 || daemon_start_engine(d) < 0 ||
	    fs_start(d->fs, d->eng) < 0)
		return -EIO;
	daemon_put_meta(d);
	log_info("main", "serving ramdir=%s mount=%s ram_size=%llu used=%llu",
		 ram_path(d->ram), d->fo.mountpoint, (unsigned long long)ram_cap(d->ram),
		 (unsigned long long)ram_used(d->ram));
	if (d->c.o.metrics && mhttp_start(d->c.o.metrics, gauges, d, &d->mh) < 0)
		return -EIO;
	return 0;
}

/* What daemon_start() started, stopped in reverse; any part not started
 * is skipped. */
static void daemon_stop(struct daemon *d)
{
	mhttp_stop(d->mh);
	d->mh = NULL;
	if (d->eng)   /* a restore round waiting for other nodes ends now */
		eng_restore_stop(d->eng);
	/* The front's work queues are closed, not freed, until the engine has
	 * stopped: its control reader may still deliver an LKG, whose GC goes
	 * to the seal queue (it found a freed queue). */
	fs_stop(d->fs);
	eng_stop(d->eng);
	d->eng = NULL;
}

/* Unmounted and freed; the RAMDIR lock goes last. */
static void daemon_close(struct daemon *d)
{
	fs_free(d->fs);
	d->fs = NULL;
	jobid_free(d->jid);   /* the engine went in daemon_stop */
	d->jid = NULL;
	ram_close(d->ram);
	d->ram = NULL;
	ramdir_unlock(d->lock_fd);
	d->lock_fd = -1;
	free(d->fo.mountpoint);
	cmdline_free(&d->c);
	fuse_opt_free_args(&d->args);
}

int main(int argc, char **argv)
{
	struct daemon d = { .args = FUSE_ARGS_INIT(argc, argv), .lock_fd = -1 };
	int rc;

	daemon_stdio_reserve();
	notify_init();
	rc = cmdline_parse(argc, argv, &d.c, &d.args);
	if (rc >= 0)
		goto out;
	rc = 1;
	if (daemon_prepare(&d, argv[0]) < 0 || daemon_mount(&d) < 0 || daemon_start(&d) < 0)
		goto out;
	rc = fs_run(d.fs) < 0 ? 1 : 0;
	notify_send("STOPPING=1\nSTATUS=unmounted, sealing and stopping");
out:
	daemon_stop(&d);
	daemon_close(&d);
	return rc;
}
