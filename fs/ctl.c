/* ctl.c: the control thread — the replicator protocol of DESIGN §3.1–3.2.
 * It wakes when replicator.yaml is complete (closed after writing, or
 * renamed into place), validates it, cleans the namespace, deletes the yaml
 * ("configured and clean"), plans the restore, writes
 * replicator.prerestore, passes the (single-node) barrier and publishes the
 * .restore markers. It writes into RAMDIR/ns directly; the top level is
 * never cached by the kernel (entry timeout 0), so the app sees it at once. */
#include "fs/fs_i.h"
#include "cluster/rcfg.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "common/walk.h"
#include "tiers/lifecycle.h"
#include "tiers/restore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define YAML      "replicator.yaml"
#define ERRORS    "replicator.errors"
#define FAILED    "replicator.failed"
#define PRERESTORE "replicator.prerestore"
#define JAXINFO   "jax-init-info.txt"

static void set_phase(struct fs *fs, const char *phase)
{
	pthread_mutex_lock(&fs->mu);
	snprintf(fs->phase, sizeof(fs->phase), "%s", phase);
	pthread_mutex_unlock(&fs->mu);
	idx_put_meta(ram_idx(fs->ram), "phase", phase, strlen(phase));
}

static void report_failed(struct fs *fs, const char *msg)
{
	char buf[2048];
	int n = snprintf(buf, sizeof(buf), "%s\n", msg);
	log_err("ctl", "replicator.yaml rejected: %s", msg);
	if (util_write_file_atomic(ram_ns_fd(fs->ram), FAILED, buf,
				   (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1)) < 0)
		log_err("ctl", "cannot write %s: %s", FAILED, strerror(errno));
}

/* Everything at the top except replicator.yaml and jax-init-info.txt goes.
 * Committed steps leave only the app's view: the shard store keeps them. */
static void clean_namespace(struct fs *fs)
{
	int nsfd = ram_ns_fd(fs->ram), rc;
	const struct dirent *de;
	struct walk_dir d;
	uint64_t freed = 0;

	/* let in-flight commits finish sealing first */
	workq_drain(fs->sealq);
	rc = walk_dir_open(&d, nsfd);
	if (rc < 0) {
		log_err("ctl", "cannot list the namespace: %s", strerror(-rc));
		return;
	}
	while ((de = walk_dir_next(&d)) != NULL) {
		struct stat st;
		uint64_t step;
		if (!strcmp(de->d_name, YAML) || !strcmp(de->d_name, JAXINFO))
			continue;
		if (fstatat(nsfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
		    util_is_step_name(de->d_name, &step) && commit_is_step_dir(fs, step, st.st_ino))
			commit_hide(fs, step);
		util_rmtree_at(nsfd, de->d_name, &freed);
		fs->front->forget_name(fs, de->d_name);
		log_dbg("ctl", "cleaned %s", de->d_name);
	}
	walk_dir_close(&d);
	ram_adjust(fs->ram, -(int64_t)freed);
}

static int write_prerestore(struct fs *fs, const struct restore_plan *p);

static void prerestore_cb(void *arg, const struct restore_plan *p)
{
	struct fs *fs = arg;
	int rc = write_prerestore(fs, p);
	if (rc < 0)
		log_err("ctl", "cannot write %s: %s", PRERESTORE, strerror(-rc));
}

static int write_prerestore(struct fs *fs, const struct restore_plan *p)
{
	char buf[256];
	int n;

	if (!p->found)
		n = snprintf(buf, sizeof(buf), "{}\n");
	else if (p->source == RS_BUCKET)
		/* GKE's text byte for byte: it yaml.dump()s a dict, and PyYAML
		 * sorts the keys, so restore-backup comes first. */
		n = snprintf(buf, sizeof(buf), "restore-backup: %s\nrestore-step: %llu\n",
			     p->backup, (unsigned long long)p->step);
	else
		n = snprintf(buf, sizeof(buf), "restore-step: %llu\n", (unsigned long long)p->step);
	return util_write_file_atomic(ram_ns_fd(fs->ram), PRERESTORE, buf, (size_t)n);
}

/* Markers: a relative symlink per worker into the read-only store view, or
 * empty s0 files when there is nothing. Created under a hidden name and
 * renamed, so a marker is never seen half-made. */
static int publish_markers(struct fs *fs, const struct rcfg *c, const struct restore_plan *p)
{
	int nsfd = ram_ns_fd(fs->ram);

	for (int w = 0; w < c->workers_per_node; w++) {
		char name[256], tmp[300], target[1024];
		int rc = commit_marker(fs, c->job, c->node_rank, p, w, name, sizeof(name), target,
				       sizeof(target));
		if (rc < 0)
			return rc;
		snprintf(tmp, sizeof(tmp), ".%s.mtcfs-tmp", name);
		unlinkat(nsfd, tmp, 0);
		if (p->found) {
			if (symlinkat(target, nsfd, tmp) < 0)
				return -errno;
		} else {
			int fd = openat(nsfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
			if (fd < 0)
				return -errno;
			close(fd);
		}
		if (renameat(nsfd, tmp, nsfd, name) < 0)
			return -errno;
	}
	return 0;
}

static void remember_restored(struct fs *fs, const struct restore_plan *p)
{
	char buf[256];
	int n;

	pthread_mutex_lock(&fs->mu);
	fs->have_restored = p->found;
	fs->restored_step = p->found ? p->step : 0;
	pthread_mutex_unlock(&fs->mu);
	if (p->found) {
		n = snprintf(buf, sizeof(buf), "%s %llu", p->key.job, (unsigned long long)p->step);
		idx_put_meta(ram_idx(fs->ram), "restored", buf, (size_t)n);
		life_restored(ram_idx(fs->ram), &p->key);
	} else {
		idx_del_meta(ram_idx(fs->ram), "restored");
	}
}

/* c is the node's job: with an engine, the engine has taken it already
 * (eng_set_job, eng_take_job: the record's writer in a cluster, after its
 * checks); without one the front writes the shared record itself. */
static void apply_identity(struct fs *fs, const struct rcfg *c)
{
	struct job_now now;

	if (!fs->eng) {
		rcfg_job_now(c, &now);
		jobid_set(fs->jid, &now);
	}
	pthread_mutex_lock(&fs->mu);
	fs->eager_gc = true;
	pthread_mutex_unlock(&fs->mu);
}

static void write_jax_init_info(struct fs *fs, int rank);

/* replicator.yaml's warnings, held until the namespace is clean (the
 * clean-up removes replicator.errors). */
struct warnings {
	char line[10][400];
	int n;
};

static void keep_warning(void *arg, const char *line)
{
	struct warnings *w = arg;

	if (w->n < (int)(sizeof w->line / sizeof w->line[0]))
		snprintf(w->line[w->n++], sizeof w->line[0], "%s", line);
}

/* replicator.yaml read and parsed into *c, its stat in *st; the job set on
 * the engine. 0: configure it; < 0: nothing to do now (not there, still
 * being written, or refused and reported: it was deleted). */
static int read_yaml(struct fs *fs, struct stat *st, struct rcfg *c, struct warnings *warns)
{
	int nsfd = ram_ns_fd(fs->ram);
	char err[1024];
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (fstatat(nsfd, YAML, st, AT_SYMLINK_NOFOLLOW) < 0)
		return -ENOENT;
	if (!S_ISREG(st->st_mode)) {
		report_failed(fs, "replicator.yaml is not a regular file");
		util_rmtree_at(nsfd, YAML, NULL);
		return -EINVAL;
	}
	if (fs->front->node_writers(fs, st->st_ino, st->st_dev) > 0)
		return -EBUSY;   /* still being written: its close wakes us again */
	rc = util_read_file_at(nsfd, YAML, RCFG_INPUT_MAX, &buf, &len);
	if (rc == -EFBIG) {
		report_failed(fs, "replicator.yaml is larger than 1 MiB");
		unlinkat(nsfd, YAML, 0);
		return rc;
	}
	if (rc < 0) {
		log_err("ctl", "cannot read replicator.yaml: %s", strerror(-rc));
		return rc;
	}
	err[0] = '\0';
	rc = rcfg_parse_warn(buf, len, NULL, keep_warning, warns, c, err, sizeof(err));
	if (rc == 0)   /* until the markers are out: a crash in between resumes it */
		idx_put_meta(ram_idx(fs->ram), "pending_yaml", buf, len);
	free(buf);
	if (rc == -ENODATA) {
		log_info("ctl", "replicator.yaml is empty: deleted and ignored");
		unlinkat(nsfd, YAML, 0);
		return rc;
	}
	if (rc < 0) {
		report_failed(fs, err[0] ? err : "replicator.yaml is invalid");
		unlinkat(nsfd, YAML, 0);
		return rc;
	}
	if (fs->eng) {
		rc = eng_set_job(fs->eng, c, err, sizeof(err));
		if (rc < 0) {
			report_failed(fs, err);
			unlinkat(nsfd, YAML, 0);
			rcfg_free(c);
			return rc;
		}
	} else if (c->nodes > 1) {
		snprintf(err, sizeof(err),
			 "nodes: %d needs the peer tier: mount this node with listen= and peers= or coordinator=",
			 c->nodes);
		report_failed(fs, err);
		unlinkat(nsfd, YAML, 0);
		rcfg_free(c);
		return -EINVAL;
	}
	return 0;
}

/* The job of a parsed replicator.yaml (st: its stat) becomes this node's:
 * owner of restored files, identity, a clean namespace with the yaml's
 * warnings in replicator.errors, jax-init-info.txt; the yaml deleted. */
static void configure(struct fs *fs, const struct rcfg *c, const struct stat *st,
		      const struct warnings *warns)
{
	char dump[4096];

	log_info("ctl", "configured job=%s framework=%s rank=%d nodes=%d workers=%d",
		 c->job, rcfg_framework_name(c->framework), c->node_rank, c->nodes, c->workers_per_node);
	if (fs->o.rank_hint >= 0 && fs->o.rank < 0 && c->node_rank != fs->o.rank_hint)
		log_warn("ctl", "replicator.yaml's node-rank %d differs from rank_hint=%d (the pod's "
			 "index): node-rank %d is used", c->node_rank, fs->o.rank_hint, c->node_rank);
	/* the trainer writes replicator.yaml: what this node publishes from a
	 * source that names no owners (a backup in GKE's layout, the .save
	 * files of framework: pytorch backups, an older mtcfs's shards)
	 * becomes its uid's and group's (an fsGroup's, in a set-gid root),
	 * with modes less the umask the yaml's mode shows (0640: 027; a
	 * class that may not read it may not search either) */
	ram_set_owner(fs->ram, (uint32_t)st->st_uid, (uint32_t)st->st_gid,
		      (uint32_t)((~st->st_mode & 066) | ((~st->st_mode & 044) >> 2)));
	set_phase(fs, "restoring");
	apply_identity(fs, c);
	if (rcfg_to_yaml(c, dump, sizeof(dump)) > 0)
		idx_put_meta(ram_idx(fs->ram), "config", dump, strlen(dump));

	clean_namespace(fs);
	/* before the yaml goes: Orbax reads replicator.errors when it does */
	for (int i = 0; i < warns->n; i++) {
		log_warn("ctl", "%s", warns->line[i]);
		fs_report_error(fs, warns->line[i]);
	}
	/* this incarnation's rank (GKE's driver rewrites it per incarnation) */
	if (fs->o.jax_init_info >= 0)
		write_jax_init_info(fs, c->node_rank);
	/* "configured and clean" */
	if (unlinkat(ram_ns_fd(fs->ram), YAML, 0) < 0 && errno != ENOENT)
		log_err("ctl", "cannot delete replicator.yaml: %s", strerror(errno));
}

/* The step to restore, in *plan, and its data here: one restore round
 * (restore_run), planned job-wide by the coordinator through the engine,
 * or by this node alone from its own catalog. 0, or < 0 when the sequence ends
 * here (-ECANCELED: a new replicator.yaml; else the failure is reported). */
static int restore_step(struct fs *fs, const struct rcfg *c, struct restore_plan *plan)
{
	char err[1024];
	int rc;

	if (fs->eng) {
		/* the job-wide plan; prerestore is written as soon as it is known,
		 * before the fetch and the barrier */
		rc = eng_restore(fs->eng, c, fs_report_error, fs, prerestore_cb, plan);
		if (rc == -ECANCELED)   /* a new replicator.yaml: ctl_main takes it next */
			return rc;
		if (rc < 0) {
			metrics_add(MC_RESTORE_FAILURES, 1);
			snprintf(err, sizeof(err), "restore failed: %s; no .restore markers published",
				 strerror(-rc));
			report_failed(fs, err);
			set_phase(fs, "failed");
			idx_del_meta(ram_idx(fs->ram), "pending_yaml");
			return rc;
		}
	} else {
		/* a node on its own: the same round over its own catalog */
		rc = restore_local(fs->ram, c->job, (uint32_t)c->node_rank, rcfg_workers(c),
				   fs_report_error, fs, prerestore_cb, plan);
		if (rc < 0) {
			snprintf(err, sizeof(err), "cannot read the catalog to plan a restore: %s; nothing restored",
				 strerror(-rc));
			fs_report_error(fs, err);
			memset(plan, 0, sizeof(*plan));
			prerestore_cb(fs, plan);
		}
	}
	return 0;
}

/* The restored step published: newer steps dropped, the .restore markers,
 * the log line and metrics (t0: when the yaml was taken), phase ready. */
static void publish_restore(struct fs *fs, const struct rcfg *c, const struct restore_plan *plan,
			    uint64_t t0)
{
	char err[1024];
	int rc;

	retain_drop_newer(fs, c->job, plan->found ? plan->step : 0);
	/* the restore may have replaced a store copy the kernel has cached
	 * entries of (read through an earlier marker) */
	fs->front->forget_name_now(fs, ".mtcfs");
	remember_restored(fs, plan);
	rc = publish_markers(fs, c, plan);
	if (rc < 0) {
		snprintf(err, sizeof(err), "cannot create the .restore markers: %s", strerror(-rc));
		report_failed(fs, err);
	}
	log_info("ctl", "restore job=%s step=%llu source=%s ready_ms=%.1f", c->job,
		 (unsigned long long)(plan->found ? plan->step : 0), restore_source_name(plan->source),
		 (double)(util_now_ns() - t0) / 1e6);
	metrics_add(!plan->found ? MC_RESTORES_NONE : plan->source == RS_PEER ? MC_RESTORES_PEER :
		    plan->source == RS_BUCKET ? MC_RESTORES_BUCKET : MC_RESTORES_LOCAL, 1);
	metrics_observe(MH_RESTORE_SECONDS, (double)(util_now_ns() - t0) / 1e9);
	set_phase(fs, "ready");
	idx_del_meta(ram_idx(fs->ram), "pending_yaml");
	retain_gc(fs);
}

/* A complete replicator.yaml: configure the job, restore, publish. */
static void process_yaml(struct fs *fs)
{
	struct warnings warns = { .n = 0 };
	struct restore_plan plan;
	struct rcfg c = { 0 };
	struct stat st;
	uint64_t t0 = util_now_ns();

	if (read_yaml(fs, &st, &c, &warns) < 0)
		return;
	configure(fs, &c, &st, &warns);
	if (restore_step(fs, &c, &plan) == 0)
		publish_restore(fs, &c, &plan, t0);
	rcfg_free(&c);
}

/* jax-init-info.txt: "RANK\nHOST:PORT\n", what Orbax's and MaxText's
 * _retrieve_jax_init_info read (the first two lines: process id, then the
 * coordinator address for jax.distributed.initialize) and wait 900 s for.
 * HOST is rank 0's host (coordinator= or the first peers= entry; 127.0.0.1
 * for a node on its own), PORT the JAX coordinator's (jax_port, 8476).
 * rank < 0: this node's own, when known -- from peers=/listen=/rank=, or 0
 * for a node without peers; a node that learns its rank only from
 * replicator.yaml (coordinator= alone) writes it once that arrives.
 * Written tmp + rename, so a reader never sees half of it. */
static void write_jax_init_info(struct fs *fs, int rank)
{
	char buf[512];
	char host[256] = "127.0.0.1";
	const char *coord = fs->o.coordinator ? fs->o.coordinator : fs->o.peers;
	int n;

	if (rank < 0) {
		rank = fs->eng ? eng_rank(fs->eng) : fs->o.rank >= 0 ? fs->o.rank : fs->o.rank_hint;
		if (rank < 0 && coord) {
			log_info("ctl", "%s: waiting for replicator.yaml to know this node's rank "
				 "(give rank= to have it at start-up)", JAXINFO);
			return;
		}
		if (rank < 0)
			rank = 0;
	}
	if (coord) {
		/* the JAX coordinator runs beside rank 0: same host, JAX's port */
		size_t hl = strcspn(coord, ",");
		const char *colon = memrchr(coord, ':', hl);
		if (colon && (size_t)(colon - coord) < sizeof(host)) {
			memcpy(host, coord, (size_t)(colon - coord));
			host[colon - coord] = '\0';
		}
	}
	n = snprintf(buf, sizeof(buf), "%d\n%s:%d\n", rank, host, fs->o.jax_port);
	if (util_write_file_atomic(ram_ns_fd(fs->ram), JAXINFO, buf, (size_t)n) < 0)
		log_err("ctl", "cannot write %s: %s", JAXINFO, strerror(errno));
}

/* The last configuration survives a restart of mtcfs: commits made before
 * the app writes a new replicator.yaml belong to that job. */
static void load_identity(struct fs *fs)
{
	struct rcfg c = { 0 };
	char err[256];
	void *v = NULL;
	size_t len;

	if (idx_get_meta(ram_idx(fs->ram), "config", &v, &len) == 0) {
		if (rcfg_parse(v, len, NULL, &c, err, sizeof(err)) == 0) {
			/* the engine checks it first (rank=, peers=): refused,
			 * the front stays on its default job, and the control
			 * thread's resume_identity says why (or a new yaml
			 * waiting there replaces it) */
			if (!fs->eng || eng_take_job(fs->eng, &c, err, sizeof(err)) == 0)
				apply_identity(fs, &c);
			rcfg_free(&c);
		}
		free(v);
		/* framework: pytorch: .save files completed while mtcfs was
		 * down (or whose close it never processed) commit now */
		commit_top_file_done(fs);
	}
	if (idx_get_meta(ram_idx(fs->ram), "restored", &v, &len) == 0) {
		char job[JOB_NAME_MAX + 1];
		unsigned long long step;
		struct job_now now;

		fs_identity(fs, &now);
		if (sscanf(v, "%" JOB_NAME_MAX_S "s %llu", job, &step) == 2 &&
		    !strcmp(job, now.job)) {
			pthread_mutex_lock(&fs->mu);
			fs->have_restored = true;
			fs->restored_step = step;
			pthread_mutex_unlock(&fs->mu);
		}
		free(v);
	}
}

/* mtcfs restarted under a running job (a DaemonSet update, a crash) and
 * no new replicator.yaml is there: the engine takes the last one's job and
 * rank again, so the commits the app goes on making are reported,
 * replicated and backed up as before, instead of the node staying out of
 * its job until the next job restart. No restore: the app did not ask for
 * one. On the control thread: registering may wait for the coordinator. */
static void resume_identity(struct fs *fs)
{
	struct rcfg c = { 0 };
	char err[512];
	struct stat st;
	void *v = NULL;
	size_t len;

	if (!fs->eng || fstatat(ram_ns_fd(fs->ram), YAML, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	    idx_get_meta(ram_idx(fs->ram), "config", &v, &len) < 0)
		return;
	if (rcfg_parse(v, len, NULL, &c, err, sizeof(err)) == 0) {
		log_info("ctl", "resuming job=%s rank=%d from the last replicator.yaml (none new yet)",
			 c.job, c.node_rank);
		if (eng_set_job(fs->eng, &c, err, sizeof(err)) < 0)
			log_warn("ctl", "cannot resume job %s: %s; waiting for a new replicator.yaml",
				 c.job, err);
		rcfg_free(&c);
	}
	free(v);
}

static void *ctl_main(void *arg)
{
	struct fs *fs = arg;

	pthread_setname_np(pthread_self(), "mtcfs-ctl");
	resume_identity(fs);
	for (;;) {
		pthread_mutex_lock(&fs->ctl_mu);
		while (!fs->ctl_pending && !fs->ctl_stop)
			pthread_cond_wait(&fs->ctl_cv, &fs->ctl_mu);
		if (fs->ctl_stop) {
			pthread_mutex_unlock(&fs->ctl_mu);
			break;
		}
		fs->ctl_pending = false;
		pthread_mutex_unlock(&fs->ctl_mu);
		process_yaml(fs);
	}
	return NULL;
}

void ctl_notify(struct fs *fs)
{
	struct stat st;

	/* A replicator.yaml present while a restore runs is a new one (the
	 * restore's own was deleted before it began): that round ends now. */
	if (fs->eng && fstatat(ram_ns_fd(fs->ram), YAML, &st, AT_SYMLINK_NOFOLLOW) == 0)
		eng_restore_interrupt(fs->eng);
	pthread_mutex_lock(&fs->ctl_mu);
	fs->ctl_pending = true;
	pthread_cond_signal(&fs->ctl_cv);
	pthread_mutex_unlock(&fs->ctl_mu);
}

int ctl_start(struct fs *fs)
{
	int rc;

	pthread_mutex_init(&fs->ctl_mu, NULL);
	pthread_cond_init(&fs->ctl_cv, NULL);
	snprintf(fs->phase, sizeof(fs->phase), "waiting-for-config");
	/* before load_identity: the start-up file names the rank of the
	 * mount options (eng_rank), not the last yaml's, which the engine
	 * takes again there */
	if (fs->o.jax_init_info >= 0)   /* default on; -1: no_jax_init_info */
		write_jax_init_info(fs, -1);
	load_identity(fs);
	rc = pthread_create(&fs->ctl_thr, NULL, ctl_main, fs);
	if (rc)
		return -rc;
	fs->ctl_running = true;
	idx_put_meta(ram_idx(fs->ram), "phase", fs->phase, strlen(fs->phase));
	{
		/* mtcfs died after taking a replicator.yaml (and maybe deleting
		 * it) but before the markers: the app still waits for them, so
		 * the sequence runs again from the yaml it had written */
		void *v = NULL;
		size_t len;
		struct stat st;
		/* single node only: in a cluster the other nodes have moved on
		 * and the job restarts as a whole (a new yaml on every node) */
		if (!fs->o.listen && !fs->o.peers && !fs->o.coordinator &&
		    idx_get_meta(ram_idx(fs->ram), "pending_yaml", &v, &len) == 0) {
			if (fstatat(ram_ns_fd(fs->ram), YAML, &st, AT_SYMLINK_NOFOLLOW) < 0) {
				log_warn("ctl", "a restore was interrupted by a restart: running it again");
				util_write_file_atomic(ram_ns_fd(fs->ram), YAML, v, len);
			}
			free(v);
		}
	}
	/* a replicator.yaml written while mtcfs was down */
	ctl_notify(fs);
	return 0;
}

void ctl_stop(struct fs *fs)
{
	if (!fs->ctl_running)
		return;
	pthread_mutex_lock(&fs->ctl_mu);
	fs->ctl_stop = true;
	pthread_cond_signal(&fs->ctl_cv);
	pthread_mutex_unlock(&fs->ctl_mu);
	pthread_join(fs->ctl_thr, NULL);
	fs->ctl_running = false;
}
