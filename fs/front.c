/* front.c: the FUSE front's life: its session, mount, the RAM tier and the
 * engine it serves, the loop, and the way down (fs.h says in what order the
 * daemon's composition root calls these). */
#include "fs/fs.h"
#include "fs/fs_i.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fs *g_fs;

/* The FUSE table with INIT wrapped: the owner's on_init runs once the
 * kernel's INIT is handled, i.e. the mount answers (the kernel holds every
 * request until INIT's reply, which libfuse sends as this returns). */
static struct fuse_lowlevel_ops front_ll_ops;

static void front_ll_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;

	if (fs_ll_ops.init)
		fs_ll_ops.init(userdata, conn);
	if (fs->o.on_init)
		fs->o.on_init(fs->o.arg);
}

int fs_new(const struct fs_opts *o, struct fuse_args *args, struct fs **out)
{
	struct fs *fs = calloc(1, sizeof(*fs));

	*out = NULL;
	if (!fs)
		return -ENOMEM;
	g_fs = fs;
	fs->front = &fs_ll_front;
	fs->proc_self_fd = -1;
	fs->o = *o;
	pthread_mutex_init(&fs->mu, NULL);
	pthread_mutex_init(&fs->hmu, NULL);
	pthread_rwlock_init(&fs->open_lk, NULL);
	pthread_cond_init(&fs->sealed_cv, NULL);
	fs->jid = o->jobid;
	if (!fs->jid) {
		if (jobid_new(&fs->jid) < 0)
			goto fail;
		fs->jid_own = true;
	}
	fs->hsize = 1u << 16;
	fs->htab = calloc(fs->hsize, sizeof(*fs->htab));
	if (!fs->htab)
		goto fail;

	front_ll_ops = fs_ll_ops;
	front_ll_ops.init = front_ll_init;
	fs->se = fuse_session_new(args, &front_ll_ops, sizeof(front_ll_ops), fs);
	if (!fs->se)
		goto fail;
	if (fuse_set_signal_handlers(fs->se) != 0)
		goto fail;
	fs->handlers = true;
	*out = fs;
	return 0;
fail:
	fs_free(fs);
	return -EIO;
}

int fs_mount(struct fs *fs)
{
	if (fuse_session_mount(fs->se, fs->o.mountpoint) != 0)
		return -EIO;
	fs->mounted = true;
	return 0;
}

int fs_after_fork(struct fs *fs)
{
	fs->proc_self_fd = open("/proc/self/fd", O_PATH | O_CLOEXEC);
	if (fs->proc_self_fd < 0) {
		int rc = -errno;

		log_err("main", "cannot open /proc/self/fd: %s", strerror(-rc));
		return rc;
	}
	return 0;
}

int fs_attach(struct fs *fs, struct ram_tier *ram)
{
	struct stat st;

	fs->ram = ram;
	ram_set_reclaim(fs->ram, retain_reclaim, fs);
	fs->root.fd = openat(ram_ns_fd(fs->ram), ".", O_PATH | O_CLOEXEC);
	fstat(fs->root.fd, &st);
	fs->root.ino = st.st_ino;
	fs->root.dev = st.st_dev;
	fs->root.nlookup = 2;
	pthread_mutex_init(&fs->root.amu, NULL);
	fs_fd_init(fs);
	if (workq_start("mtcfs-seal", &fs->sealq) < 0 ||
	    workq_start("mtcfs-inval", &fs->notifyq) < 0)
		return -ENOMEM;
	return 0;
}

void fs_eng_callbacks(struct fs *fs, struct eng_cb *cb)
{
	*cb = (struct eng_cb){ .on_lkg = retain_on_lkg, .report = fs_report_error, .arg = fs };
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

int fs_start(struct fs *fs, struct eng *eng)
{
	int rc;

	fs->eng = eng;
	if (commit_init(fs) < 0)
		log_err("main", "catalog recovery failed; committed steps may be missing");
	rc = ctl_start(fs);
	if (rc < 0)
		return rc;
	fs->splice_ok = check_pipe_size();   /* before the loop: INIT reads it */
	return 0;
}

int fs_run(struct fs *fs)
{
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	int rc;

	fuse_loop_cfg_set_max_threads(lc, 8);
	fuse_loop_cfg_set_idle_threads(lc, 4);
	fuse_loop_cfg_set_clone_fd(lc, 0);
	/* a signal (SIGTERM, SIGINT) ends the loop cleanly, as an unmount does */
	rc = fuse_session_loop_mt(fs->se, lc);
	fuse_loop_cfg_destroy(lc);
	return rc;
}

void fs_stop(struct fs *fs)
{
	if (!fs)
		return;
	ctl_stop(fs);
	workq_close(fs->sealq);
	workq_close(fs->notifyq);
}

void fs_free(struct fs *fs)
{
	if (!fs)
		return;
	fs->eng = NULL;
	workq_free(fs->sealq);
	fs->sealq = NULL;
	workq_free(fs->notifyq);
	fs->notifyq = NULL;
	if (fs->mounted)
		fuse_session_unmount(fs->se);
	if (fs->handlers)
		fuse_remove_signal_handlers(fs->se);
	if (fs->se)
		fuse_session_destroy(fs->se);
	if (fs->htab)
		fs_nodes_free(fs);
	if (fs->root.fd > 0)
		close(fs->root.fd);
	free(fs->htab);
	fs_steps_free(fs);
	if (fs->proc_self_fd >= 0)
		close(fs->proc_self_fd);
	if (fs->jid_own)
		jobid_free(fs->jid);
	free(fs);
}

void fs_job(struct fs *fs, char *job, size_t len, uint32_t *rank)
{
	struct job_now now;

	fs_identity(fs, &now);
	snprintf(job, len, "%s", now.job);
	*rank = (uint32_t)now.rank;
}
