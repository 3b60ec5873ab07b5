/* report.c: replicator.errors, the file the application reads (and
 * deletes) for what went wrong without failing the job: yaml warnings, a
 * step that could not be committed, a special file in a step, the engine's
 * reports. Any thread; called from every part of fs/ and, through
 * struct eng_cb, from the engine. */
#include "fs/fs_i.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ERRORS "replicator.errors"

void fs_report_error(void *arg, const char *line)
{
	struct fs *fs = arg;
	int fd = openat(ram_ns_fd(fs->ram), ERRORS, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

	if (fd < 0) {
		log_err("ctl", "cannot write %s: %s", ERRORS, strerror(errno));
		return;
	}
	if (dprintf(fd, "%s\n", line) < 0)
		log_err("ctl", "cannot write %s: %s", ERRORS, strerror(errno));
	close(fd);
}
