/* daemon_i: what the files of the mtcfs daemon share. mtcfs_main.c is the
 * composition root (the order of start-up and shutdown, the wiring of the
 * FUSE front, the RAM tier, the engine and the metrics endpoint);
 * daemon_opts.c the command line (the options table, usage, checks);
 * daemon.c the process (its std streams, systemd's notify socket, the
 * RAMDIR lock). All on the main thread, except notify_send() (also a FUSE
 * thread, at INIT). */
#ifndef MTCFS_TOOLS_DAEMON_I_H
#define MTCFS_TOOLS_DAEMON_I_H

#include "fs/fs.h"

#include <stdint.h>

/* The mount options as given (malloc'd strings, NULL when not given). */
struct daemon_opts {
	char *ram_size;
	char *bucket, *listen, *peers, *coordinator, *secret_file;
	char *tls_cert, *tls_key, *tls_ca, *metrics, *gcs_endpoint, *gcs_key_file;
	char *redundancy;             /* redundancy=replication|rs:K+M */
	int jax_init_info;
	int jax_port;
	int rank;                   /* -1: from peers/listen, else 0 */
	int rank_hint;              /* -1; else the rank until a yaml gives one (it wins) */
	int restore_timeout;
	int stop_timeout;           /* seconds the last pushes of a stop may take */
};

struct cmdline {
	struct daemon_opts o;
	char *ramdir;
	int nonopts;
	int foreground;
	int verbose;
	int show_help;
	int show_version;
	char *log_format;
	char *log_file;
};

/* daemon_opts.c */
/* Parses argv into *c and *args (which must be FUSE_ARGS_INIT(argc, argv)),
 * `-o peers=` tables rejoined first; answers --help and --version. -1: go
 * on; else the exit code (0 after --help/--version, 1 on a bad option). */
int  cmdline_parse(int argc, char **argv, struct cmdline *c, struct fuse_args *args);
/* The log's format, file and level; the FUSE options mtcfs always adds.
 * 0, or -EINVAL having said why on stderr. */
int  cmdline_apply(struct cmdline *c, struct fuse_args *args);
void cmdline_usage(const char *prog);
/* Checks the options that need no mount (ram_size into *cap, TLS files
 * loaded once and made absolute, bucket=, listen=). 0 or -EINVAL, having
 * said why on stderr. */
int  cmdline_check(struct cmdline *c, uint64_t *cap);
void cmdline_free(struct cmdline *c);

/* daemon.c */
/* Makes sure fds 0-2 are open (on /dev/null if they were closed). */
void daemon_stdio_reserve(void);
/* systemd's readiness protocol: notify_init() reads $NOTIFY_SOCKET once;
 * notify_send() sends msg, a no-op without it. */
void notify_init(void);
void notify_send(const char *msg);
/* The RAMDIR lock: one daemon per RAMDIR. ramdir_lock() takes it (0,
 * -EBUSY or -errno, reported on stderr), *fd_out open until
 * ramdir_unlock(fd) (accepts -1); ramdir_lock_note_pid() after the fork. */
int  ramdir_lock(const char *ramdir, int *fd_out);
void ramdir_lock_note_pid(int fd);
void ramdir_unlock(int fd);

#endif
