/* log: one line per event, "LEVEL module: message key=value ...", to stderr.
 * Called from every thread; each line is written with a single write(2) so
 * lines from different threads never interleave. Quiet by default (warnings
 * and errors); -d raises the level to debug. */
#ifndef MTCFS_COMMON_LOG_H
#define MTCFS_COMMON_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);
void log_msg(enum log_level lvl, const char *mod, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_err(mod, ...)   log_msg(LOG_ERROR, mod, __VA_ARGS__)
#define log_warn(mod, ...)  log_msg(LOG_WARN, mod, __VA_ARGS__)
#define log_info(mod, ...)  log_msg(LOG_INFO, mod, __VA_ARGS__)
#define log_dbg(mod, ...) \
	do { if (log_get_level() >= LOG_DEBUG) log_msg(LOG_DEBUG, mod, __VA_ARGS__); } while (0)

#endif
