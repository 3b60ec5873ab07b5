/* fuzz_gcs_json: the Cloud Storage client's handling of server answers —
 * object resources (stat, uploads), listing pages, error bodies, the
 * response headers it reads (x-goog-hash, Content-Range, Range,
 * x-goog-generation, Retry-After) and OAuth2 token responses.
 *
 * Those parsers are static in tiers/bucket_gcs.c and tiers/gcs_auth.c, so
 * they are driven through the public entry points: bkt_* on a gs:// handle
 * whose endpoint is a tiny HTTP server in this process (loopback, one
 * thread) that answers with the responses written in the input, and
 * gcs_auth_token() with a gcs_http_fn that returns them directly.
 *
 * Input (text, see corpus/fuzz_gcs_json/):
 *   OP "\n" RESPONSE ( "\n%%\n" RESPONSE )*
 *   RESPONSE = STATUS "\n" ( HEADER "\n" )* "\n" BODY
 * OP is stat, list, listdir, get, getfile, put, putfile, putsmall, del or
 * token (anything else: the first byte picks one). The server hands out the
 * responses in order, one per request, then 404s. Content-Length and
 * framing headers are its own; a Location header is pointed back at it.
 *
 * Aborts on ASan/UBSan errors and on results outside the contract of
 * tiers/bucket.h (return codes, sizes beyond the buffer asked for, listing
 * entries without names). MTCFS_FUZZ_GCS_STRICT=1 also checks what the
 * client takes on trust from the server (listing names inside the prefix
 * and in order across pages; see the report) and repeats the last response
 * instead of 404ing, to expose retry loops as timeouts.
 * MTCFS_FUZZ_GCS_VERBOSE=1 prints each operation's result (for replays). */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "tiers/bucket.h"
#include "tiers/gcs_auth.h"
#include "tiers/manifest.h"

#define MAX_RESP     64
#define MAX_CONNS    16
#define REQ_MAX      (4u << 20)     /* request bytes kept (uploads are read and dropped) */
#define BIG_FILE     (260u << 10)   /* > one 256 KiB chunk: two resumable chunks */
#define SMALL_FILE   512u
#define PREFIX       "pre"

static void die(const char *what)
{
	fprintf(stderr, "fuzz_gcs_json: %s\n", what);
	abort();
}

/* ---- the responses of one input ---- */

struct resp {
	int status;
	const char *hdrs;    /* "\n"-separated lines */
	size_t hlen;
	const char *body;
	size_t blen;
};

static struct {
	pthread_mutex_t mu;          /* protects everything below */
	struct resp r[MAX_RESP];
	size_t n, next;
	unsigned served;
	bool repeat_last;            /* strict mode */
} q = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int port;
static bool strict, verbose;

static const char *memmem_s(const char *h, size_t hl, const char *n)
{
	return memmem(h, hl, n, strlen(n));
}

static void parse_resp(const char *p, size_t len, struct resp *r)
{
	const char *nl = memchr(p, '\n', len), *end;
	int st = 0;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < (nl ? (size_t)(nl - p) : len) && i < 3; i++) {
		if (p[i] < '0' || p[i] > '9')
			break;
		st = st * 10 + (p[i] - '0');
	}
	r->status = st >= 200 && st <= 599 ? st : 200;
	if (!nl)
		return;
	len -= (size_t)(nl + 1 - p);
	p = nl + 1;
	if (len && p[0] == '\n') {                 /* no headers */
		r->body = p + 1;
		r->blen = len - 1;
		return;
	}
	end = memmem_s(p, len, "\n\n");
	r->hdrs = p;
	if (!end) {
		r->hlen = len;
		return;
	}
	r->hlen = (size_t)(end - p);
	r->body = end + 2;
	r->blen = len - r->hlen - 2;
}

static void queue_set(const char *p, size_t len)
{
	pthread_mutex_lock(&q.mu);
	q.n = q.next = 0;
	q.served = 0;
	q.repeat_last = strict;
	while (q.n < MAX_RESP) {
		const char *sep = memmem_s(p, len, "\n%%\n");
		size_t l = sep ? (size_t)(sep - p) : len;
		parse_resp(p, l, &q.r[q.n++]);
		if (!sep)
			break;
		len -= l + 4;
		p = sep + 4;
	}
	pthread_mutex_unlock(&q.mu);
}

static void queue_clear(void)
{
	pthread_mutex_lock(&q.mu);
	q.n = q.next = 0;
	pthread_mutex_unlock(&q.mu);
}

/* ---- building one HTTP answer ---- */

struct buf {
	char *p;
	size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n)
{
	if (b->n + n > b->cap) {
		size_t nc = b->cap ? b->cap : 1024;
		char *np;
		while (nc < b->n + n)
			nc *= 2;
		np = realloc(b->p, nc);
		if (!np)
			die("out of memory");
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

static bool hdr_name_is(const char *l, size_t n, const char *name)
{
	size_t k = strlen(name);

	return n > k && l[k] == ':' && !strncasecmp(l, name, k);
}

/* The input's header lines that keep the HTTP framing intact. */
static void put_headers(struct buf *b, const struct resp *r)
{
	const char *p = r->hdrs, *e;
	unsigned lines = 0;
	char loc[96];

	if (!p)
		return;
	e = p + r->hlen;
	while (p < e && lines < 32) {
		const char *nl = memchr(p, '\n', (size_t)(e - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(e - p);
		const char *colon = memchr(p, ':', n);
		bool ok = colon && colon > p && n < 2048 && !memchr(p, '\0', n) &&
			  !memchr(p, '\r', n);

		for (const char *c = p; ok && c < colon; c++)
			ok = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
			     (*c >= '0' && *c <= '9') || *c == '-' || *c == '_';
		if (ok && (hdr_name_is(p, n, "content-length") ||
			   hdr_name_is(p, n, "transfer-encoding") ||
			   hdr_name_is(p, n, "connection") || hdr_name_is(p, n, "keep-alive") ||
			   hdr_name_is(p, n, "content-encoding") || hdr_name_is(p, n, "trailer") ||
			   hdr_name_is(p, n, "upgrade")))
			ok = false;
		if (ok && hdr_name_is(p, n, "location")) {
			snprintf(loc, sizeof(loc),
				 "Location: http://127.0.0.1:%d/upload/session?upload_id=%u\r\n",
				 port, lines);
			puts_(b, loc);
		} else if (ok) {
			put(b, p, n);
			puts_(b, "\r\n");
		}
		lines++;
		p = nl ? nl + 1 : e;
	}
}

static void answer(struct buf *b)
{
	static const struct resp none = {
		.status = 404,
		.body = "{\"error\":{\"code\":404,\"message\":\"No such object: fuzz\"}}",
		.blen = 55,
	};
	struct resp r;
	char line[128];
	bool nobody;

	pthread_mutex_lock(&q.mu);
	if (q.next < q.n)
		r = q.r[q.next++];
	else if (q.repeat_last && q.n)
		r = q.r[q.n - 1];
	else
		r = none;
	q.served++;
	b->n = 0;
	nobody = r.status == 204 || r.status == 304;
	snprintf(line, sizeof(line), "HTTP/1.1 %d Fuzz\r\nContent-Length: %zu\r\n", r.status,
		 nobody ? 0 : r.blen);
	puts_(b, line);
	put_headers(b, &r);
	puts_(b, "\r\n");
	if (!nobody && r.blen)
		put(b, r.body, r.blen);
	pthread_mutex_unlock(&q.mu);
}

/* ---- the server: one thread, poll over a few keep-alive connections ---- */

struct conn {
	int fd;
	char *in;
	size_t have, cap;
};

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			struct pollfd pf = { .fd = fd, .events = POLLOUT };
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN || poll(&pf, 1, 2000) <= 0)
				return -1;
			continue;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Whole requests in c->in are answered; -1 closes the connection. */
static int serve_input(struct conn *c, struct buf *out)
{
	for (;;) {
		const char *end = memmem_s(c->in, c->have, "\r\n\r\n");
		size_t hl, cl = 0, total;
		const char *l;

		if (!end)
			return c->have > 65536 ? -1 : 0;
		hl = (size_t)(end - c->in) + 4;
		for (l = c->in; l && l < end; l = memchr(l, '\n', (size_t)(end - l))) {
			if (*l == '\n')
				l++;
			if (!strncasecmp(l, "content-length:", 15))
				cl = strtoul(l + 15, NULL, 10);
			if (!strncasecmp(l, "transfer-encoding:", 18))
				return -1;          /* never sent by the client */
		}
		if (cl > REQ_MAX)
			return -1;
		total = hl + cl;
		if (c->have < total)
			return 0;
		answer(out);
		if (write_all(c->fd, out->p, out->n) < 0)
			return -1;
		memmove(c->in, c->in + total, c->have - total);
		c->have -= total;
	}
}

static void conn_close(struct conn *c)
{
	close(c->fd);
	free(c->in);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static void *server_main(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	struct conn cs[MAX_CONNS];
	struct buf out = { 0 };

	for (int i = 0; i < MAX_CONNS; i++) {
		memset(&cs[i], 0, sizeof(cs[i]));
		cs[i].fd = -1;
	}
	for (;;) {
		struct pollfd pf[MAX_CONNS + 1];
		int map[MAX_CONNS + 1], n = 0;

		pf[n].fd = lfd;
		pf[n].events = POLLIN;
		map[n++] = -1;
		for (int i = 0; i < MAX_CONNS; i++) {
			if (cs[i].fd < 0)
				continue;
			pf[n].fd = cs[i].fd;
			pf[n].events = POLLIN;
			map[n++] = i;
		}
		if (poll(pf, (nfds_t)n, -1) < 0)
			continue;
		if (pf[0].revents & POLLIN) {
			int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
			int slot = -1;
			for (int i = 0; fd >= 0 && i < MAX_CONNS; i++)
				if (cs[i].fd < 0) {
					slot = i;
					break;
				}
			if (fd >= 0 && slot < 0)
				close(fd);          /* the client is sequential: cannot happen */
			else if (fd >= 0)
				cs[slot].fd = fd;
		}
		for (int k = 1; k < n; k++) {
			struct conn *c = &cs[map[k]];
			ssize_t r;

			if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (c->cap - c->have < 65536) {
				size_t nc = c->cap ? c->cap * 2 : 131072;
				char *np = realloc(c->in, nc);
				if (!np)
					die("out of memory");
				c->in = np;
				c->cap = nc;
			}
			r = recv(c->fd, c->in + c->have, c->cap - c->have, 0);
			if (r < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (r <= 0) {
				conn_close(c);
				continue;
			}
			c->have += (size_t)r;
			if (serve_input(c, &out) < 0)
				conn_close(c);
		}
	}
	return NULL;
}

/* ---- the client side ---- */

static struct bkt *bkt;
static int big_fd = -1, small_fd = -1, sink_fd = -1;
static uint32_t big_crc, small_crc;

static int make_file(size_t size, uint32_t *crc)
{
	char *p = malloc(size);
	int fd = memfd_create("fuzz-gcs", MFD_CLOEXEC);

	if (!p || fd < 0)
		die("memfd");
	for (size_t i = 0; i < size; i++)
		p[i] = (char)(i * 131 + 7);
	if (write(fd, p, size) != (ssize_t)size)
		die("memfd write");
	*crc = mf_crc32c(0, p, size);
	free(p);
	return fd;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	struct bkt_opts o = { 0 };
	char ep[64];
	pthread_t th;
	int lfd;

	(void)argc;
	(void)argv;
	strict = getenv("MTCFS_FUZZ_GCS_STRICT") && !strcmp(getenv("MTCFS_FUZZ_GCS_STRICT"), "1");
	verbose = getenv("MTCFS_FUZZ_GCS_VERBOSE") != NULL;
	log_set_level(LOG_ERROR);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 64) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &al) < 0)
		die("cannot listen on loopback");
	port = ntohs(a.sin_port);
	if (pthread_create(&th, NULL, server_main, (void *)(intptr_t)lfd) != 0)
		die("pthread_create");
	pthread_detach(th);

	/* no credentials, no proxy, one attempt, no backoff, short stalls */
	snprintf(ep, sizeof(ep), "127.0.0.1:%d", port);
	setenv("STORAGE_EMULATOR_HOST", ep, 1);
	unsetenv("GOOGLE_APPLICATION_CREDENTIALS");
	unsetenv("http_proxy");
	unsetenv("HTTP_PROXY");
	unsetenv("all_proxy");
	unsetenv("ALL_PROXY");
	setenv("NO_PROXY", "*", 1);
	setenv("MTCFS_GCS_RETRY", "0,0,1", 1);
	setenv("MTCFS_GCS_TIMEOUTS", "2000,2", 1);
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", port);
	o.gcs_endpoint = ep;
	o.parallelism = 2;
	o.simple_max = 1024;             /* BIG_FILE goes resumable, SMALL_FILE media */
	o.chunk = 256u << 10;
	o.list_page = 10;
	if (bkt_open("gs://fuzz-bucket/" PREFIX, &o, &bkt) != 0)
		die("bkt_open");
	big_fd = make_file(BIG_FILE, &big_crc);
	small_fd = make_file(SMALL_FILE, &small_crc);
	sink_fd = memfd_create("fuzz-gcs-sink", MFD_CLOEXEC);
	if (sink_fd < 0)
		die("memfd");
	return 0;
}

enum op { OP_STAT, OP_LIST, OP_LISTDIR, OP_GET, OP_GETFILE, OP_PUT, OP_PUTFILE, OP_PUTSMALL,
	  OP_DEL, OP_TOKEN, OP_COUNT };

static const char *const op_names[OP_COUNT] = {
	[OP_STAT] = "stat",       [OP_LIST] = "list",         [OP_LISTDIR] = "listdir",
	[OP_GET] = "get",         [OP_GETFILE] = "getfile",   [OP_PUT] = "put",
	[OP_PUTFILE] = "putfile", [OP_PUTSMALL] = "putsmall", [OP_DEL] = "del",
	[OP_TOKEN] = "token",
};

/* The result of a bkt_ call: 0 or a negative errno, with words set. */
static void check_rc(int rc)
{
	if (rc > 0 || rc < -4095)
		die("result is neither 0 nor -errno");
	if (rc < 0 && !bkt_last_error()[0])
		die("a failure without words in bkt_last_error()");
}

struct list_state {
	const char *prefix;
	char last[2048];
	bool any;
	unsigned n;
};

static int list_cb(void *arg, const struct bkt_entry *e)
{
	struct list_state *s = arg;
	size_t pl = strlen(s->prefix);

	if (!e->name || !e->name[0])
		die("a listing entry without a name");
	if (strict) {
		if (strncmp(e->name, s->prefix, pl))
			die("STRICT: a listed name outside the prefix asked for");
		if (s->any && strcmp(s->last, e->name) >= 0)
			die("STRICT: listing not in bytewise order (or a name twice)");
	}
	snprintf(s->last, sizeof(s->last), "%s", e->name);
	s->any = true;
	s->n++;
	return 0;
}

static int list(const char *prefix, const char *delim)
{
	struct list_state s = { .prefix = prefix };

	return bkt_list_ex(bkt, prefix, delim, list_cb, &s);
}

/* gcs_http_fn for the token source: answers from the queue, no network. */
static int token_http(void *arg, const char *url, const char *const *hdrs, const char *body,
		      long *status, char **resp, size_t *resp_len, char *err, size_t errlen)
{
	struct resp r = { .status = 404 };

	(void)arg;
	(void)url;
	(void)hdrs;
	(void)body;
	pthread_mutex_lock(&q.mu);
	if (q.next < q.n)
		r = q.r[q.next++];
	else if (q.n == 0 || !q.repeat_last)
		r.status = 0;
	else
		r = q.r[q.n - 1];
	pthread_mutex_unlock(&q.mu);
	if (!r.status) {
		snprintf(err, errlen, "connection refused (fuzz)");
		return -ECONNREFUSED;
	}
	*status = r.status;
	*resp = malloc(r.blen + 1);
	if (!*resp)
		return -ENOMEM;
	memcpy(*resp, r.body ? r.body : "", r.blen);
	(*resp)[r.blen] = '\0';
	*resp_len = r.blen;
	return 0;
}

static void token_op(void)
{
	struct gcs_auth_cfg cfg = { .kind = GCS_AUTH_METADATA, .metadata_host = "127.0.0.1:1",
				    .http = token_http };
	struct gcs_auth *a = NULL;
	char tok[GCS_TOKEN_MAX], err[1024];
	int rc;

	if (gcs_auth_new(&cfg, &a, err, sizeof(err)) != 0)
		die("gcs_auth_new");
	for (int i = 0; i < 2; i++) {
		memset(tok, 'X', sizeof(tok));
		err[0] = '\0';
		rc = gcs_auth_token(a, tok, sizeof(tok), err, sizeof(err));
		if (rc == 0 && (!memchr(tok, '\0', sizeof(tok)) || !tok[0]))
			die("gcs_auth_token: success without a NUL-terminated token");
		if (rc < 0 && (!err[0] || !memchr(err, '\0', sizeof(err))))
			die("gcs_auth_token: failure without words");
		if (rc == 0)
			gcs_auth_invalidate(a, tok);   /* the next call fetches again */
	}
	gcs_auth_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = (const char *)data, *nl;
	size_t oplen;
	int op = -1, rc = 0;

	if (size == 0)
		return 0;
	nl = memchr(p, '\n', size);
	oplen = nl ? (size_t)(nl - p) : size;
	for (int i = 0; i < OP_COUNT; i++)
		if (strlen(op_names[i]) == oplen && !memcmp(op_names[i], p, oplen))
			op = i;
	if (op < 0)
		op = (unsigned char)p[0] % OP_COUNT;
	if (nl)
		queue_set(nl + 1, size - oplen - 1);
	else
		queue_set("", 0);

	switch (op) {
	case OP_STAT: {
		uint64_t sz = 0;
		uint32_t crc = 0;
		rc = bkt_stat(bkt, "obj", &sz, &crc);
		check_rc(rc);
		rc = bkt_stat(bkt, "obj", &sz, NULL);
		break;
	}
	case OP_LIST:
		rc = list("", NULL);
		break;
	case OP_LISTDIR:
		rc = list("dir/", "/");
		break;
	case OP_GET: {
		void *buf = NULL;
		size_t len = 0;
		rc = bkt_get_buf(bkt, "obj", 100, &buf, &len);
		if (rc == 0 && (!buf || len > 100 || ((char *)buf)[len] != '\0'))
			die("bkt_get_buf: more than max bytes or no NUL");
		free(buf);
		break;
	}
	case OP_GETFILE: {
		uint64_t sz = 0;
		if (ftruncate(sink_fd, 0) < 0)
			die("ftruncate");
		rc = bkt_get_file(bkt, "obj", sink_fd, &sz, data[size - 1] & 1, 0x12345678u);
		break;
	}
	case OP_PUT:
		rc = bkt_put_buf(bkt, "obj", "hello, bucket", 13);
		break;
	case OP_PUTFILE:
		rc = bkt_put_file(bkt, "big", big_fd, BIG_FILE, big_crc);
		break;
	case OP_PUTSMALL:
		rc = bkt_put_file(bkt, "small", small_fd, SMALL_FILE, small_crc);
		break;
	case OP_DEL:
		rc = bkt_delete(bkt, "obj");
		break;
	case OP_TOKEN:
		token_op();
		break;
	}
	check_rc(rc);
	if (verbose)
		fprintf(stderr, "fuzz_gcs_json: %s -> %d (%s), %u requests served\n", op_names[op],
			rc, rc ? bkt_last_error() : "", q.served);
	queue_clear();
	return 0;
}
