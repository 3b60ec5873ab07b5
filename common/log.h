/* log: one line per event, to stderr (or the file of log_open_file(), or
 * syslog after log_use_syslog()). Called from every thread; each line is
 * written with a single write(2) (one syslog(3) call) so lines from
 * different threads never interleave. The destination is chosen once at
 * startup, before threads start.
 *
 * Text (default): "TIME LEVEL module: message key=value ...".
 * JSON (-o log_format=json): one object per line for Cloud Logging's agent,
 *   {"time":"2026-01-02T03:04:05.678Z","severity":"INFO","component":"engine",
 *    "message":"...", "job":"...", ...}
 * where the trailing key=value words of the message are repeated as string
 * fields (the message keeps them too, so nothing is lost when a value has a
 * space and the split stops early).
 *
 * Level: INFO by default (lifecycle events: mounted, job configured, commit,
 * replicated, backup started/complete, restore plan and source; one line per
 * event, never per file); -d raises it to DEBUG. */
#ifndef MTCFS_COMMON_LOG_H
#define MTCFS_COMMON_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };
enum log_format { LOG_FMT_TEXT = 0, LOG_FMT_JSON };

void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);
void log_set_format(enum log_format f);
/* "text" or "json": 0, else -EINVAL (the format is left unchanged). */
int log_set_format_name(const char *name);
/* Append every later line to path (created 0640), from any process the
 * caller forks into: 0, or -errno (the destination is left unchanged). */
int log_open_file(const char *path);
/* Send every later line to syslog(3) as "mtcfs[PID]" (facility daemon):
 * for a daemon whose stderr is /dev/null (started by mount(8)). A
 * log_open_file() destination takes precedence. */
void log_use_syslog(void);
/* True when lines go to stderr (no file, no syslog). */
int log_to_stderr(void);
void log_msg(enum log_level lvl, const char *mod, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The line log_msg would write (with its '\n'), into buf; returns its
 * length. For tests; ts_sec/ts_nsec is the time to stamp. */
size_t log_format_line(char *buf, size_t cap, enum log_format f, enum log_level lvl,
		       const char *mod, const char *msg, long long ts_sec, long ts_nsec);

#define log_err(mod, ...)   log_msg(LOG_ERROR, mod, __VA_ARGS__)
#define log_warn(mod, ...)  log_msg(LOG_WARN, mod, __VA_ARGS__)
#define log_info(mod, ...)  log_msg(LOG_INFO, mod, __VA_ARGS__)
#define log_dbg(mod, ...) \
	do { if (log_get_level() >= LOG_DEBUG) log_msg(LOG_DEBUG, mod, __VA_ARGS__); } while (0)

#endif
