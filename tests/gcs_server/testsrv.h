/* testsrv: the C side of tests/gcs_server/gcs_server.py for unit tests —
 * start it on a loopback port (posix_spawn of /usr/bin/python3, stdin kept as
 * a pipe so the server exits if the test dies), talk to its control
 * endpoints (/_fault, /_reset, /_config, /_log, /_corrupt) and filter its
 * request log. Header-only (static functions); include from one test file.
 * The repository is found via env MTCFS_SRC, else the MTCFS_SRC define. */
#ifndef MTCFS_TESTS_GCS_TESTSRV_H
#define MTCFS_TESTS_GCS_TESTSRV_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#ifndef MTCFS_SRC
#define MTCFS_SRC "."
#endif

extern char **environ;

struct tsrv {
	pid_t pid;
	int port;
	int in_fd;                  /* the server's stdin: closing it stops the server */
	char base[64];              /* "http://127.0.0.1:PORT" */
};

static inline const char *tsrv_src(void)
{
	const char *s = getenv("MTCFS_SRC");
	return s && *s ? s : MTCFS_SRC;
}

static inline int tsrv_start(struct tsrv *s)
{
	char script[4096], line[128];
	int in[2], out[2];
	posix_spawn_file_actions_t fa;
	size_t n = 0;
	char *argv[] = { "/usr/bin/python3", script, "--port", "0", "--exit-on-eof", NULL, NULL };
	int rc;

	memset(s, 0, sizeof(*s));
	snprintf(script, sizeof(script), "%s/tests/gcs_server/gcs_server.py", tsrv_src());
	if (getenv("MTCFS_TEST_VERBOSE"))
		argv[5] = "--verbose";
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
		return -errno;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	if (!getenv("MTCFS_TEST_VERBOSE"))
		posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	rc = posix_spawn(&s->pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(in[0]);
	close(out[1]);
	if (rc != 0) {
		close(in[1]);
		close(out[0]);
		return -rc;
	}
	s->in_fd = in[1];
	/* first line: PORT=NNNN */
	while (n < sizeof(line) - 1) {
		struct pollfd p = { .fd = out[0], .events = POLLIN };
		ssize_t r;
		if (poll(&p, 1, 30000) <= 0)
			break;
		r = read(out[0], line + n, 1);
		if (r <= 0 || line[n] == '\n')
			break;
		n++;
	}
	line[n] = '\0';
	close(out[0]);
	if (strncmp(line, "PORT=", 5) || (s->port = (int)strtol(line + 5, NULL, 10)) <= 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
		close(s->in_fd);
		return -EIO;
	}
	snprintf(s->base, sizeof(s->base), "http://127.0.0.1:%d", s->port);
	return 0;
}

static inline void tsrv_stop(struct tsrv *s)
{
	if (s->pid <= 0)
		return;
	close(s->in_fd);
	kill(s->pid, SIGTERM);
	waitpid(s->pid, NULL, 0);
	s->pid = 0;
}

struct tsrv_buf { char *p; size_t n; };

static inline size_t tsrv_wr(char *p, size_t sz, size_t nm, void *arg)
{
	struct tsrv_buf *b = arg;
	char *np = realloc(b->p, b->n + sz * nm + 1);

	if (!np)
		return 0;
	memcpy(np + b->n, p, sz * nm);
	b->p = np;
	b->n += sz * nm;
	b->p[b->n] = '\0';
	return sz * nm;
}

/* One control request; the JSON answer (NULL on failure), owned by the caller. */
static inline json_t *tsrv_call(struct tsrv *s, const char *method, const char *path, const char *body)
{
	char url[1024];
	struct tsrv_buf b = { 0 };
	CURL *h = curl_easy_init();
	struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
	json_t *j = NULL;
	long code = 0;

	snprintf(url, sizeof(url), "%s%s", s->base, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, tsrv_wr);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	if (body)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	if (curl_easy_perform(h) == CURLE_OK &&
	    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200)
		j = json_loads(b.p ? b.p : "null", JSON_DECODE_ANY, NULL);
	curl_slist_free_all(hl);
	curl_easy_cleanup(h);
	free(b.p);
	return j;
}

static inline bool tsrv_post(struct tsrv *s, const char *path, const char *body)
{
	json_t *j = tsrv_call(s, "POST", path, body);
	bool ok = j != NULL;

	json_decref(j);
	return ok;
}

/* Clear the log and faults; with all, also the objects and the config. */
static inline bool tsrv_reset(struct tsrv *s, bool all)
{
	return tsrv_post(s, "/_reset", all ? "{\"data\": true, \"config\": true}" : "{}");
}

static inline bool tsrv_fault(struct tsrv *s, const char *json) { return tsrv_post(s, "/_fault", json); }
static inline bool tsrv_config(struct tsrv *s, const char *json) { return tsrv_post(s, "/_config", json); }
static inline json_t *tsrv_log(struct tsrv *s) { return tsrv_call(s, "GET", "/_log", NULL); }

/* The log entries of one class ("upload", "download", "meta", "list",
 * "delete", "token", "metadata") as a new array. */
static inline json_t *tsrv_log_class(struct tsrv *s, const char *cls)
{
	json_t *all = tsrv_log(s), *out = json_array(), *e;
	size_t i;

	json_array_foreach(all, i, e) {
		const char *c = json_string_value(json_object_get(e, "class"));
		if (!cls || (c && !strcmp(c, cls)))
			json_array_append(out, e);
	}
	json_decref(all);
	return out;
}

/* Field helpers over one log entry. */
static inline const char *tsrv_q(json_t *e, const char *k)
{
	return json_string_value(json_object_get(json_object_get(e, "query"), k));
}

static inline const char *tsrv_h(json_t *e, const char *k)
{
	return json_string_value(json_object_get(json_object_get(e, "headers"), k));
}

static inline long tsrv_status(json_t *e)
{
	json_t *s = json_object_get(e, "status");
	return json_is_integer(s) ? (long)json_integer_value(s) : -1;
}

static inline const char *tsrv_status_str(json_t *e)
{
	return json_string_value(json_object_get(e, "status"));
}

#endif
