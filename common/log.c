#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static volatile int cur_level = LOG_INFO;
static volatile int cur_format = LOG_FMT_TEXT;
/* set at startup, before threads: a log file's fd, else stderr; syslog wins
 * over stderr (not over a file) */
static int out_fd = STDERR_FILENO;
static bool to_syslog;

int log_open_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);

	if (fd < 0)
		return -errno;
	if (out_fd != STDERR_FILENO)
		close(out_fd);
	out_fd = fd;
	return 0;
}

void log_use_syslog(void)
{
	if (out_fd != STDERR_FILENO)
		return;
	openlog("mtcfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	to_syslog = true;
}

int log_to_stderr(void)
{
	return out_fd == STDERR_FILENO && !to_syslog;
}

void log_set_level(enum log_level lvl) { cur_level = lvl; }
enum log_level log_get_level(void) { return (enum log_level)cur_level; }
void log_set_format(enum log_format f) { cur_format = f; }

int log_set_format_name(const char *name)
{
	if (!name || !strcmp(name, "text"))
		log_set_format(LOG_FMT_TEXT);
	else if (!strcmp(name, "json"))
		log_set_format(LOG_FMT_JSON);
	else
		return -EINVAL;
	return 0;
}

/* A bounded writer: never writes past cap - KEEP, so the closing of the
 * JSON object always fits; a write that does not fit sets full and writes
 * nothing more. */
#define KEEP 4      /* "\"}\n" + NUL spare */
struct w { char *p; size_t n, cap; bool full; };

static void w_raw(struct w *w, const char *s, size_t len)
{
	if (w->full || w->n + len + KEEP > w->cap) {
		w->full = true;
		return;
	}
	memcpy(w->p + w->n, s, len);
	w->n += len;
}

/* Length of the valid UTF-8 sequence at s (at most len bytes), 0 if invalid.
 * Cloud Logging rejects entries that are not UTF-8, and file names need not be. */
static size_t utf8_len(const unsigned char *s, size_t len)
{
	unsigned char c = s[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xbf;

	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		if (c == 0xe0)
			lo = 0xa0;          /* overlong */
		else if (c == 0xed)
			hi = 0x9f;          /* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;          /* past U+10FFFF */
	} else
		return 0;
	if (len < n || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

/* s[0..len) as the inside of a JSON string; stops (at a character
 * boundary) when the line is full. */
static void w_str(struct w *w, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0;
	char esc[8];

	while (i < len && !w->full) {
		unsigned char c = u[i];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			w_raw(w, esc, 2);
			i++;
		} else if (c == '\n') {
			w_raw(w, "\\n", 2);
			i++;
		} else if (c == '\t') {
			w_raw(w, "\\t", 2);
			i++;
		} else if (c < 0x20 || c == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			w_raw(w, esc, 6);
			i++;
		} else if (c < 0x80) {
			w_raw(w, (const char *)&u[i], 1);
			i++;
		} else {
			size_t n = utf8_len(u + i, len - i);
			if (n) {
				w_raw(w, (const char *)&u[i], n);
				i += n;
			} else {
				w_raw(w, "\\ufffd", 6);
				i++;
			}
		}
	}
}

static bool is_key_char(char c, bool first)
{
	return (c >= 'a' && c <= 'z') || c == '_' || (!first && c >= '0' && c <= '9');
}

static bool reserved_key(const char *k, size_t kl)
{
	static const char *const names[] = { "time", "severity", "component", "message" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i]) == kl && !memcmp(names[i], k, kl))
			return true;
	return false;
}

/* Every "key=value" word of the message as a string field, first one of a
 * key wins (an object with a key twice is not portable JSON). A field that
 * does not fit is left out whole. */
static void w_fields(struct w *w, const char *msg)
{
	struct { const char *k; size_t kl; } seen[24];
	size_t nseen = 0;
	const char *p = msg;

	while (*p && nseen < sizeof(seen) / sizeof(seen[0])) {
		const char *word = p, *end, *eq;
		size_t kl;
		bool dup = false;

		end = strchr(p, ' ');
		if (!end)
			end = p + strlen(p);
		p = *end ? end + 1 : end;
		eq = memchr(word, '=', (size_t)(end - word));
		if (!eq || eq == word || eq + 1 == end || !is_key_char(word[0], true))
			continue;
		kl = (size_t)(eq - word);
		for (size_t i = 1; i < kl; i++)
			if (!is_key_char(word[i], false))
				goto next;
		if (reserved_key(word, kl))
			continue;
		for (size_t i = 0; i < nseen; i++)
			if (seen[i].kl == kl && !memcmp(seen[i].k, word, kl))
				dup = true;
		if (dup)
			continue;
		{
			size_t mark = w->n;
			w_raw(w, ",\"", 2);
			w_raw(w, word, kl);
			w_raw(w, "\":\"", 3);
			w_str(w, eq + 1, (size_t)(end - eq - 1));
			w_raw(w, "\"", 1);
			if (w->full) {
				w->n = mark;
				return;
			}
		}
		seen[nseen].k = word;
		seen[nseen].kl = kl;
		nseen++;
next:;
	}
}

size_t log_format_line(char *buf, size_t cap, enum log_format f, enum log_level lvl,
		       const char *mod, const char *msg, long long ts_sec, long ts_nsec)
{
	static const char *text_names[] = { "ERROR", "WARN", "INFO", "DEBUG" };
	/* Cloud Logging's LogSeverity names */
	static const char *gcl_names[] = { "ERROR", "WARNING", "INFO", "DEBUG" };
	time_t t = (time_t)ts_sec;
	struct tm tm;
	char stamp[96];   /* room for any int the compiler cannot bound */
	int n;

	if (cap < 64)
		return 0;
	if ((unsigned)lvl > LOG_DEBUG)
		lvl = LOG_DEBUG;
	gmtime_r(&t, &tm);
	snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
		 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (ts_nsec / 1000000) % 1000);
	if (f == LOG_FMT_JSON) {
		struct w w = { buf, 0, cap, false };
		size_t mark;

		w_raw(&w, "{\"time\":\"", 9);
		w_raw(&w, stamp, strlen(stamp));
		w_raw(&w, "\",\"severity\":\"", 14);
		w_raw(&w, gcl_names[lvl], strlen(gcl_names[lvl]));
		w_raw(&w, "\",\"component\":\"", 15);
		w_str(&w, mod, strlen(mod));
		w_raw(&w, "\",\"message\":\"", 13);
		w_str(&w, msg, strlen(msg));
		mark = w.n;
		w_raw(&w, "\"", 1);
		if (!w.full)
			w_fields(&w, msg);
		else
			w.n = mark;
		/* KEEP bytes were held back for exactly this */
		if (w.full && w.n == mark) {
			memcpy(buf + w.n, "\"}\n", 3);
			return w.n + 3;
		}
		memcpy(buf + w.n, "}\n", 2);
		return w.n + 2;
	}
	n = snprintf(buf, cap - 1, "%s %s %s: %s", stamp, text_names[lvl], mod, msg);
	if (n < 0)
		n = 0;
	if ((size_t)n > cap - 2)
		n = (int)(cap - 2);
	buf[n++] = '\n';
	return (size_t)n;
}

void log_msg(enum log_level lvl, const char *mod, const char *fmt, ...)
{
	char msg[2048], line[8192];
	struct timespec ts;
	va_list ap;
	size_t n;

	if ((int)lvl > cur_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	va_start(ap, fmt);
	if (vsnprintf(msg, sizeof(msg), fmt, ap) < 0)
		msg[0] = '\0';
	va_end(ap);
	if (to_syslog) {
		static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
		/* syslog stamps time and level itself; JSON stays one object */
		if ((enum log_format)cur_format == LOG_FMT_JSON) {
			n = log_format_line(line, sizeof(line), LOG_FMT_JSON, lvl, mod, msg,
					    (long long)ts.tv_sec, ts.tv_nsec);
			syslog(prio[(unsigned)lvl <= LOG_DEBUG ? lvl : LOG_DEBUG], "%.*s",
			       (int)(n ? n - 1 : 0), line);
		} else {
			syslog(prio[(unsigned)lvl <= LOG_DEBUG ? lvl : LOG_DEBUG], "%s: %s", mod, msg);
		}
		return;
	}
	n = log_format_line(line, (enum log_format)cur_format == LOG_FMT_JSON ? sizeof(line) : 2048,
			    (enum log_format)cur_format, lvl, mod, msg, (long long)ts.tv_sec,
			    ts.tv_nsec);
	if (write(out_fd, line, n) < 0) {
		/* nowhere left to report it */
	}
}
