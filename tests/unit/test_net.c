/* Unit tests for net/auth, net/server and net/client over real sockets on
 * 127.0.0.1 (port 0): the secret file and the exact MAC inputs; the
 * handshake with and without a secret and with a wrong one on either side;
 * hostile clients (garbage, huge length, a non-HELLO first frame, bad CRC,
 * silence past the handshake deadline, a half header) that are dropped
 * with one WARN line while others keep being served; request/response
 * through on_msg with replies from another thread; 1000 concurrent control
 * clients; data connections with 64 MiB sendfile -> recv_file transfers
 * (both receive paths), a sender that dies early, a stalled sender, the
 * data-connection cap, output-queue overflow; nsrv_stop with everything
 * still connected; mutual TLS (certificates made here with the openssl
 * CLI): requests and 64 MiB files through TLS, a certificate from another
 * CA, plain peers on either side, TLS plus a wrong secret, and bad
 * certificate files. The server's log is captured (stderr is teed through a
 * pipe) and searched for the lines it must write.
 *
 * MTCFS_NET_BENCH=1 adds a 1 GiB loopback throughput comparison into
 * tmpfs: raw sendfile -> splice and sendfile -> recv+write baselines next
 * to nconn_send_file -> nconn_recv_file in each receive mode and over
 * mutual TLS. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/log.h"
#include "common/util.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/frame.h"
#include "net/server.h"
#include "net/tls.h"
#include "common/crc32c.h"

#define SECRET_A "correct horse battery staple 0123"
#define SECRET_B "correct horse battery staple 0124"
#define SRV_RANK 3

/* ---- stderr tee: the log is kept in memory and still shown ---- */

static struct {
	pthread_mutex_t mu;
	char *buf;            /* protected by mu */
	size_t len, cap;      /* protected by mu */
	int orig_fd, rfd;
	pthread_t thr;
} logcap = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void *tee_main(void *arg)
{
	char chunk[4096];
	ssize_t n;

	(void)arg;
	while ((n = read(logcap.rfd, chunk, sizeof(chunk))) > 0) {
		if (write(logcap.orig_fd, chunk, (size_t)n) < 0) {
			/* still keep it in memory */
		}
		pthread_mutex_lock(&logcap.mu);
		if (logcap.len + (size_t)n + 1 > logcap.cap) {
			size_t nc = (logcap.cap ? logcap.cap * 2 : 1 << 16) + (size_t)n;
			logcap.buf = realloc(logcap.buf, nc);
			logcap.cap = nc;
		}
		memcpy(logcap.buf + logcap.len, chunk, (size_t)n);
		logcap.len += (size_t)n;
		logcap.buf[logcap.len] = '\0';
		pthread_mutex_unlock(&logcap.mu);
	}
	return NULL;
}

static void logcap_start(void)
{
	int p[2];

	if (pipe(p) < 0)
		abort();
	logcap.orig_fd = dup(STDERR_FILENO);
	dup2(p[1], STDERR_FILENO);
	close(p[1]);
	logcap.rfd = p[0];
	pthread_create(&logcap.thr, NULL, tee_main, NULL);
}

static void logcap_stop(void)
{
	dup2(logcap.orig_fd, STDERR_FILENO);   /* last writer gone: reader sees EOF */
	pthread_join(logcap.thr, NULL);
	close(logcap.rfd);
	close(logcap.orig_fd);
	free(logcap.buf);
}

static size_t log_mark(void)
{
	size_t n;

	pthread_mutex_lock(&logcap.mu);
	n = logcap.len;
	pthread_mutex_unlock(&logcap.mu);
	return n;
}

/* Count log lines after mark containing every one of the needles. */
#define log_count(mark, ...) log_count_((mark), (const char *[]){ __VA_ARGS__, NULL })
static int log_count_(size_t mark, const char *const *needles)
{
	int nn = 0, hits = 0;
	char *p;

	while (needles[nn])
		nn++;
	pthread_mutex_lock(&logcap.mu);
	p = logcap.buf ? logcap.buf + mark : NULL;
	while (p && *p) {
		char *eol = strchr(p, '\n');
		size_t ll = eol ? (size_t)(eol - p) : strlen(p);
		bool all = true;
		for (int i = 0; i < nn && all; i++) {
			char *f = memmem(p, ll, needles[i], strlen(needles[i]));
			all = f != NULL;
		}
		if (all)
			hits++;
		p = eol ? eol + 1 : NULL;
	}
	pthread_mutex_unlock(&logcap.mu);
	return hits;
}

/* Wait (deadline, not a fixed sleep) for a log line with all needles. */
#define wait_log(mark, ms, ...) wait_log_((mark), (ms), (const char *[]){ __VA_ARGS__, NULL })
static bool wait_log_(size_t mark, int ms, const char *const *needles)
{
	uint64_t end = util_now_ns() + (uint64_t)ms * 1000000u;

	do {
		if (log_count_(mark, needles) > 0)
			return true;
		usleep(2000);
	} while (util_now_ns() < end);
	return false;
}

/* Poll an int until it reaches want (or the deadline). */
static bool wait_atomic(_Atomic int *v, int want, int ms)
{
	uint64_t end = util_now_ns() + (uint64_t)ms * 1000000u;

	while (*v < want) {
		if (util_now_ns() >= end)
			return false;
		usleep(1000);
	}
	return true;
}

/* ---- private directory on tmpfs ---- */

static char tdir[256];
static int tdirfd = -1;

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

/* ---- a test server ---- */

enum data_mode { DM_FILES, DM_BLOCK };

struct qitem {
	struct qitem *next;
	uint64_t conn;
	uint32_t req_id;
	json_t *msg;
};

struct tsrv {
	struct nsrv *s;
	char addr[64];
	_Atomic int nreq, nevent, nresp, nclose, ndata_start, ndata_done, nfiles;
	_Atomic int errors;            /* checks that failed on server threads */
	_Atomic uint64_t last_conn;
	/* data side */
	enum data_mode dmode;
	bool discard;
	int open_flags;                /* O_RDWR by default; O_WRONLY, O_APPEND tried too */
	int file_timeout_ms;
	_Atomic int file_rc, data_rc;
	_Atomic uint32_t file_crc;
	/* replies from another thread */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct qitem *qhead, *qtail;   /* protected by mu */
	bool qstop;                    /* protected by mu */
	pthread_t responder;
};

static void reply(struct tsrv *t, uint64_t conn, uint32_t req_id, json_t *msg)
{
	const char *op = NULL;
	json_t *r;

	net_json_str(msg, "op", 64, &op);
	if (op && strcmp(op, "fail") == 0)
		nsrv_send(t->s, conn, NT_ERROR, req_id, net_error_msg(ENOENT, "no such thing"));
	else {
		r = json_pack("{s:O}", "echo", msg);
		if (nsrv_send(t->s, conn, NT_RESP, req_id, r) < 0)
			t->errors++;
	}
	json_decref(msg);
}

static void *responder_main(void *arg)
{
	struct tsrv *t = arg;

	pthread_mutex_lock(&t->mu);
	for (;;) {
		struct qitem *q;
		while (!t->qhead && !t->qstop)
			pthread_cond_wait(&t->cv, &t->mu);
		if (!t->qhead)
			break;
		q = t->qhead;
		t->qhead = q->next;
		if (!t->qhead)
			t->qtail = NULL;
		pthread_mutex_unlock(&t->mu);
		reply(t, q->conn, q->req_id, q->msg);
		free(q);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

/* REQ: {"op": "echo"|"fail", "async": bool, ...} -> RESP {"echo": req}
 * (from the responder thread when async) or NT_ERROR ENOENT. */
static void t_on_msg(void *arg, uint64_t conn, int rank, uint8_t type, uint32_t req_id,
		     json_t *msg)
{
	struct tsrv *t = arg;
	json_t *a;

	if (!msg || !json_is_object(msg))
		t->errors++;
	t->last_conn = conn;
	if (type == NT_EVENT) {
		t->nevent++;
		json_decref(msg);
		return;
	}
	if (type == NT_RESP || type == NT_ERROR) {
		t->nresp++;
		json_decref(msg);
		return;
	}
	t->nreq++;
	a = json_object_get(msg, "async");
	if (json_is_true(a)) {
		struct qitem *q = calloc(1, sizeof(*q));
		q->conn = conn;
		q->req_id = req_id;
		q->msg = msg;
		pthread_mutex_lock(&t->mu);
		if (t->qtail)
			t->qtail->next = q;
		else
			t->qhead = q;
		t->qtail = q;
		pthread_cond_signal(&t->cv);
		pthread_mutex_unlock(&t->mu);
		return;
	}
	json_object_set_new(msg, "rank", json_integer(rank));
	reply(t, conn, req_id, msg);
}

static void t_on_close(void *arg, uint64_t conn, int rank)
{
	struct tsrv *t = arg;

	(void)conn;
	(void)rank;
	t->nclose++;
}

/* DM_FILES: take NT_FILE frames into tdir/recv.bin and answer each with
 * RESP {"rc", "crc"}; echo REQs. DM_BLOCK: wait for anything, forever. */
static void t_on_data(void *arg, struct nconn *c, int rank)
{
	struct tsrv *t = arg;
	int rc = 0;

	(void)rank;
	t->ndata_start++;
	for (;;) {
		struct net_hdr h;
		json_t *m = NULL;

		rc = nconn_recv(c, t->dmode == DM_BLOCK ? -1 : 20000, &h, &m);
		if (rc < 0)
			break;
		if (h.type == NT_FILE) {
			const char *path;
			uint64_t size;
			uint32_t want, got = 0;
			int fd = -1;

			if (net_file_hdr_parse(m, &path, &size, &want) < 0) {
				t->errors++;
				json_decref(m);
				break;
			}
			if (!t->discard)
				fd = openat(tdirfd, "recv.bin", t->open_flags | O_CREAT | O_TRUNC | O_CLOEXEC,
					    0600);
			rc = nconn_recv_file(c, fd, size, t->file_timeout_ms, &got);
			if (fd >= 0)
				close(fd);
			t->file_rc = rc;
			t->file_crc = got;
			t->nfiles++;
			if (rc < 0) {
				json_decref(m);
				break;
			}
			{
				json_t *r = json_pack("{s:i, s:I, s:b}", "rc", rc, "crc",
						      (json_int_t)got, "ok", got == want);
				nconn_send(c, NT_RESP, 0, r);   /* does not take r */
				json_decref(r);
			}
		} else if (h.type == NT_REQ) {
			json_t *r = json_pack("{s:O}", "echo", m);
			nconn_send(c, NT_RESP, h.req_id, r);
			json_decref(r);
		}
		json_decref(m);
	}
	t->data_rc = rc;
	nconn_close(c);
	t->ndata_done++;
}

static const struct nsrv_ops t_ops = {
	.on_msg = t_on_msg,
	.on_close = t_on_close,
	.on_data = t_on_data,
};

static struct tsrv *tsrv_start(const struct net_auth *auth)
{
	struct tsrv *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	t->file_timeout_ms = 10000;
	t->open_flags = O_RDWR;
	t->file_rc = 1;
	t->data_rc = 1;
	assert_int_equal(nsrv_start("127.0.0.1:0", SRV_RANK, auth, &t_ops, t, &t->s), 0);
	assert_true(nsrv_port(t->s) > 0);
	snprintf(t->addr, sizeof(t->addr), "127.0.0.1:%d", nsrv_port(t->s));
	assert_int_equal(pthread_create(&t->responder, NULL, responder_main, t), 0);
	return t;
}

static void tsrv_stop(struct tsrv *t)
{
	nsrv_stop(t->s);
	assert_int_equal(t->errors, 0);
	pthread_mutex_lock(&t->mu);
	t->qstop = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->responder, NULL);
	while (t->qhead) {
		struct qitem *q = t->qhead;
		t->qhead = q->next;
		json_decref(q->msg);
		free(q);
	}
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t);
}

static struct net_auth *secret(const char *s)
{
	static struct net_auth a[4];
	static int next;
	struct net_auth *r = &a[next++ % 4];

	auth_clear(r);
	if (s)
		assert_int_equal(auth_set_secret(r, s, strlen(s)), 0);
	return r;
}

/* A request through nconn_call; checks the echo. */
static void call_echo(struct nconn *c, int seq, bool async)
{
	json_t *req = json_pack("{s:s, s:i, s:b}", "op", "echo", "seq", seq, "async", async);
	json_t *resp = NULL;
	int64_t got = -1;

	assert_int_equal(nconn_call(c, req, &resp, 10000), 0);
	assert_int_equal(net_json_int(json_object_get(resp, "echo"), "seq", 0, INT32_MAX, &got), 0);
	assert_int_equal(got, seq);
	json_decref(resp);
	json_decref(req);
}

/* ---- raw sockets, for clients that misbehave ---- */

static int raw_connect(const struct tsrv *t, char *local, size_t locallen)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	struct timeval tv = { .tv_sec = 10 };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	sa.sin_port = htons((uint16_t)nsrv_port(t->s));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	if (local)
		snprintf(local, locallen, "127.0.0.1:%u", ntohs(sa.sin_port));
	return fd;
}

static void read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(fd, (char *)buf + got, n - got);
		assert_true(k > 0);
		got += (size_t)k;
	}
}

static void write_full(int fd, const void *buf, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t k = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
		if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			poll(&p, 1, 1000);
			continue;
		}
		assert_true(k > 0);
		done += (size_t)k;
	}
}

/* Read the CHALLENGE every connection starts with; its nonce to *nonce. */
static void raw_challenge(int fd, uint8_t nonce[AUTH_NONCE_LEN])
{
	uint8_t hb[NET_HDR_LEN], p[AUTH_NONCE_LEN];
	struct net_hdr h;

	read_full(fd, hb, sizeof(hb));
	assert_int_equal(net_hdr_decode(hb, &h), 0);
	assert_int_equal(h.type, NT_CHALLENGE);
	assert_int_equal(h.len, AUTH_NONCE_LEN);
	read_full(fd, p, sizeof(p));
	assert_int_equal(net_payload_check(&h, p), 0);
	if (nonce)
		memcpy(nonce, p, AUTH_NONCE_LEN);
}

/* True when the server closes fd within ms (EOF or reset), ignoring what
 * it still sends before that. */
static bool raw_closed(int fd, int ms)
{
	uint64_t end = util_now_ns() + (uint64_t)ms * 1000000u;
	char buf[4096];

	while (util_now_ns() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

static void send_frame_json(int fd, uint8_t type, uint32_t req_id, json_t *m)
{
	uint8_t *f;
	size_t n;

	assert_int_equal(net_frame_build(type, req_id, m, &f, &n), 0);
	write_full(fd, f, n);
	free(f);
	json_decref(m);
}

static json_t *hello_json(const struct net_auth *a, const uint8_t ns[32], int rank,
			  const char *purpose)
{
	uint8_t nc[32], mac[32] = { 0 };
	char nch[65], mach[65];

	assert_int_equal(auth_nonce(nc), 0);
	if (a && a->has_secret)
		assert_int_equal(auth_hello_mac(a, ns, nc, rank, purpose, mac), 0);
	net_hex_encode(nc, 32, nch);
	net_hex_encode(mac, 32, mach);
	return json_pack("{s:i, s:s, s:s, s:s}", "rank", rank, "purpose", purpose,
			 "nonce", nch, "mac", mach);
}

/* ======================= auth ======================= */

static void put(const char *name, const void *data, size_t len)
{
	int fd = openat(tdirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	close(fd);
}

static int load(const char *name, struct net_auth *a)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", tdir, name);
	return auth_load_secret(p, a);
}

static void test_auth_secret_file(void **state)
{
	struct net_auth *a = calloc(1, sizeof(*a));
	char big[AUTH_SECRET_MAX + 2];
	size_t mark = log_mark();

	(void)state;
	put("s1", "0123456789abcdef\n", 17);
	assert_int_equal(load("s1", a), 0);
	assert_true(a->has_secret);
	assert_int_equal(a->secret_len, 16);
	assert_memory_equal(a->secret, "0123456789abcdef", 16);

	put("s2", "0123456789abcdefXY\r\nsecond line ignored\n", 40);
	assert_int_equal(load("s2", a), 0);
	assert_int_equal(a->secret_len, 18);
	assert_memory_equal(a->secret, "0123456789abcdefXY", 18);

	put("s3", "0123456789abcdef", 16);   /* no newline */
	assert_int_equal(load("s3", a), 0);
	assert_int_equal(a->secret_len, 16);

	put("s4", "0123456789abcde\n", 16);  /* 15 bytes */
	assert_int_equal(load("s4", a), -EINVAL);
	assert_false(a->has_secret);
	assert_true(wait_log(mark, 1000, "secret_file", "s4", "15 bytes"));

	put("s5", "", 0);
	assert_int_equal(load("s5", a), -EINVAL);
	put("s6", "\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n", 33);
	assert_int_equal(load("s6", a), -EINVAL);

	memset(big, 'k', sizeof(big));
	big[AUTH_SECRET_MAX] = '\n';
	put("s7", big, AUTH_SECRET_MAX + 1);
	assert_int_equal(load("s7", a), 0);
	assert_int_equal(a->secret_len, AUTH_SECRET_MAX);
	put("s8", big, AUTH_SECRET_MAX + 1 - 1);   /* 4096 bytes, no newline */
	assert_int_equal(load("s8", a), 0);
	memset(big, 'k', sizeof(big));
	put("s9", big, AUTH_SECRET_MAX + 1);        /* 4097 bytes */
	assert_int_equal(load("s9", a), -EINVAL);
	assert_false(a->has_secret);

	assert_int_equal(load("missing", a), -ENOENT);
	assert_true(wait_log(mark, 1000, "secret_file", "missing", "No such file"));
	assert_int_equal(mkdirat(tdirfd, "sdir", 0700), 0);
	assert_int_equal(load("sdir", a), -EINVAL);

	auth_clear(a);
	assert_false(a->has_secret);
	assert_int_equal(a->secret_len, 0);
	free(a);
}

/* The MAC inputs, pinned with an independent HMAC over the documented
 * concatenation. */
static void test_auth_macs(void **state)
{
	struct net_auth *a = secret(SECRET_A), *none = secret(NULL);
	uint8_t ns[32], nc[32], mac[32], ref[32], msg[256];
	unsigned int ml;
	size_t n;

	(void)state;
	for (int i = 0; i < 32; i++) {
		ns[i] = (uint8_t)i;
		nc[i] = (uint8_t)(0xff - i);
	}
	n = 0;
	memcpy(msg, "mtcfs-hello-v1", 14);
	n += 14;
	memcpy(msg + n, ns, 32);
	n += 32;
	memcpy(msg + n, nc, 32);
	n += 32;
	memcpy(msg + n, "-1control", 9);
	n += 9;
	HMAC(EVP_sha256(), SECRET_A, (int)strlen(SECRET_A), msg, n, ref, &ml);
	assert_int_equal(auth_hello_mac(a, ns, nc, -1, "control", mac), 0);
	assert_memory_equal(mac, ref, 32);
	assert_true(auth_mac_equal(mac, ref));

	n = 14 + 64;
	memcpy(msg + n, "65535data", 9);
	HMAC(EVP_sha256(), SECRET_A, (int)strlen(SECRET_A), msg, n + 9, ref, &ml);
	assert_int_equal(auth_hello_mac(a, ns, nc, 65535, "data", mac), 0);
	assert_memory_equal(mac, ref, 32);

	n = 0;
	memcpy(msg, "mtcfs-welcome-v1", 16);
	n += 16;
	memcpy(msg + n, nc, 32);
	n += 32;
	memcpy(msg + n, ns, 32);
	n += 32;
	memcpy(msg + n, "3", 1);
	n += 1;
	HMAC(EVP_sha256(), SECRET_A, (int)strlen(SECRET_A), msg, n, ref, &ml);
	assert_int_equal(auth_welcome_mac(a, nc, ns, 3, mac), 0);
	assert_memory_equal(mac, ref, 32);
	mac[31] ^= 1;
	assert_false(auth_mac_equal(mac, ref));

	assert_int_equal(auth_hello_mac(a, ns, nc, -2, "control", mac), -EINVAL);
	assert_int_equal(auth_hello_mac(a, ns, nc, 65536, "control", mac), -EINVAL);
	assert_int_equal(auth_hello_mac(a, ns, nc, 0, "admin", mac), -EINVAL);
	assert_int_equal(auth_hello_mac(none, ns, nc, 0, "control", mac), -EINVAL);
	assert_int_equal(auth_welcome_mac(a, nc, ns, 70000, mac), -EINVAL);
	assert_int_equal(auth_set_secret(none, "short", 5), -EINVAL);

	/* two nonces are not equal (RAND_bytes works) */
	assert_int_equal(auth_nonce(ns), 0);
	assert_int_equal(auth_nonce(nc), 0);
	assert_memory_not_equal(ns, nc, 32);
}

/* ======================= handshake ======================= */

static void test_handshake_no_secret(void **state)
{
	size_t mark = log_mark();
	(void)mark;
	struct tsrv *t = tsrv_start(NULL);
	struct nconn *c = NULL, *d = NULL;
	int peer = -5;

	(void)state;
	/* on loopback the missing secret is only an INFO line (not captured at WARN) */
	assert_int_equal(nconn_connect(t->addr, 7, "control", NULL, 5000, &c, &peer), 0);
	assert_int_equal(peer, SRV_RANK);
	assert_int_equal(nconn_peer_rank(c), SRV_RANK);
	call_echo(c, 1, false);
	call_echo(c, 2, true);
	assert_int_equal(nconn_connect(t->addr, -1, "data", secret(NULL), 5000, &d, NULL), 0);
	nconn_close(d);
	assert_true(wait_atomic(&t->ndata_done, 1, 5000));
	nconn_close(c);
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	tsrv_stop(t);
}

static void test_handshake_secret(void **state)
{
	size_t mark = log_mark();
	struct tsrv *t = tsrv_start(secret(SECRET_A));
	struct nconn *c = NULL, *d = NULL;
	int peer = -5;

	(void)state;
	assert_int_equal(nconn_connect(t->addr, 65535, "control", secret(SECRET_A), 5000, &c,
				       &peer), 0);
	assert_int_equal(peer, SRV_RANK);
	call_echo(c, 10, false);
	{
		/* the server saw the rank the client announced */
		json_t *req = json_pack("{s:s}", "op", "echo"), *resp = NULL;
		int64_t r = 0;
		assert_int_equal(nconn_call(c, req, &resp, 5000), 0);
		assert_int_equal(net_json_int(json_object_get(resp, "echo"), "rank", -1, 65535, &r), 0);
		assert_int_equal(r, 65535);
		json_decref(req);
		json_decref(resp);
	}
	assert_int_equal(nconn_connect(t->addr, 0, "data", secret(SECRET_A), 5000, &d, &peer), 0);
	assert_int_equal(peer, SRV_RANK);
	{
		json_t *req = json_pack("{s:i}", "seq", 5), *resp = NULL;
		assert_int_equal(nconn_call(d, req, &resp, 5000), 0);   /* echoed by on_data */
		json_decref(req);
		json_decref(resp);
	}
	nconn_close(d);
	nconn_close(c);
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	assert_true(wait_atomic(&t->ndata_done, 1, 5000));
	/* no warning about missing authentication with a secret */
	assert_int_equal(log_count(mark, "not authenticated"), 0);
	/* bad arguments */
	assert_int_equal(nconn_connect(t->addr, 0, "bulk", NULL, 5000, &c, NULL), -EINVAL);
	assert_int_equal(nconn_connect(t->addr, -2, "data", NULL, 5000, &c, NULL), -EINVAL);
	assert_int_equal(nconn_connect("127.0.0.1", 0, "data", NULL, 5000, &c, NULL), -EINVAL);
	assert_int_equal(nconn_connect(t->addr, 0, "data", NULL, 0, &c, NULL), -EINVAL);
	tsrv_stop(t);
}

static void test_wrong_secret(void **state)
{
	struct tsrv *t = tsrv_start(secret(SECRET_A)), *open_srv;
	struct nconn *c = NULL;
	size_t mark;

	(void)state;
	/* client has another secret: the server refuses, says why, logs it */
	mark = log_mark();
	assert_int_equal(nconn_connect(t->addr, 4, "control", secret(SECRET_B), 5000, &c, NULL),
			 -EACCES);
	assert_null(c);
	assert_true(wait_log(mark, 2000, "WARN", "authentication failed", "rank 4"));
	assert_true(wait_log(mark, 2000, "WARN", "127.0.0.1:", "authentication failed"));
	/* same for data connections, and for a client without a secret */
	assert_int_equal(nconn_connect(t->addr, 4, "data", secret(SECRET_B), 5000, &c, NULL),
			 -EACCES);
	assert_int_equal(nconn_connect(t->addr, 4, "control", NULL, 5000, &c, NULL), -EACCES);
	assert_int_equal(t->ndata_start, 0);

	/* server without a secret, client with one: the client refuses */
	open_srv = tsrv_start(NULL);
	mark = log_mark();
	assert_int_equal(nconn_connect(open_srv->addr, 4, "control", secret(SECRET_A), 5000, &c,
				       NULL), -EACCES);
	assert_true(wait_log(mark, 2000, "WARN", "peer failed authentication"));
	tsrv_stop(open_srv);

	/* and the right secret still works afterwards */
	assert_int_equal(nconn_connect(t->addr, 4, "control", secret(SECRET_A), 5000, &c, NULL), 0);
	call_echo(c, 1, false);
	nconn_close(c);
	assert_int_equal(t->nreq, 1);
	tsrv_stop(t);
}

/* ======================= hostile clients ======================= */

struct hostile {
	const char *name;
	const char *reason;   /* in the server's WARN line */
};

/* Connection bounds (issue 13): without a secret every connection passes
 * HELLO, so the per-address bound holds for a connection's whole life;
 * beyond it a connection is closed at once, counted and logged once; with
 * a secret a proven connection stops counting against its address. */
static void test_connection_bounds(void **state)
{
	struct nconn *c[6] = { 0 };
	struct tsrv *t;
	size_t mark;
	int rc;

	(void)state;
	t = tsrv_start(NULL);
	assert_true(nsrv_max_conns(t->s) >= 16);
	nsrv_set_max_per_addr(t->s, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(nconn_connect(t->addr, i, "control", NULL, 5000, &c[i], NULL), 0);
	mark = log_mark();
	rc = nconn_connect(t->addr, 4, "control", NULL, 5000, &c[4], NULL);
	assert_true(rc == -ECONNRESET || rc == -EPIPE);
	assert_null(c[4]);
	assert_int_equal(nsrv_refused(t->s), 1);
	assert_true(wait_log(mark, 2000, "WARN", "refused 1 connection(s)",
			     "too many unauthenticated connections from this address"));
	call_echo(c[0], 1, false);   /* the admitted ones are served */
	nconn_close(c[3]);           /* a slot comes back when one closes */
	c[3] = NULL;
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	assert_int_equal(nconn_connect(t->addr, 3, "control", NULL, 5000, &c[3], NULL), 0);
	call_echo(c[3], 2, false);
	for (int i = 0; i < 6; i++)
		nconn_close(c[i]);
	tsrv_stop(t);

	/* with a secret, six proven connections from one address are fine */
	t = tsrv_start(secret(SECRET_A));
	nsrv_set_max_per_addr(t->s, 4);
	for (int i = 0; i < 6; i++)
		assert_int_equal(nconn_connect(t->addr, i, "control", secret(SECRET_A), 5000, &c[i],
					       NULL), 0);
	call_echo(c[5], 3, false);
	assert_int_equal(nsrv_refused(t->s), 0);
	for (int i = 0; i < 6; i++)
		nconn_close(c[i]);
	tsrv_stop(t);
}

static void test_hostile_clients(void **state)
{
	struct tsrv *t = tsrv_start(secret(SECRET_A));
	struct nconn *good = NULL;
	char local[64];
	uint8_t ns[32], hb[NET_HDR_LEN];
	size_t mark;
	int fd;

	(void)state;
	nsrv_set_handshake_timeout_ms(t->s, 400);
	assert_int_equal(nconn_connect(t->addr, 1, "control", secret(SECRET_A), 5000, &good, NULL),
			 0);
	call_echo(good, 0, false);

	/* 1. garbage instead of a frame */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, NULL);
	write_full(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "bad frame header"));
	assert_int_equal(log_count(mark, local), 1);   /* exactly one line */
	call_echo(good, 1, false);

	/* 2. a HELLO header announcing 16 MiB (valid CRC): refused at once */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, NULL);
	{
		static uint8_t one;
		assert_int_equal(net_hdr_encode(hb, NT_HELLO, 0, 0, &one, 1), 0);
		hb[12] = 0, hb[13] = 0, hb[14] = 0, hb[15] = 1;   /* len = 16 MiB */
		{
			uint32_t crc = mf_crc32c(0, hb, 20);
			hb[20] = (uint8_t)crc, hb[21] = (uint8_t)(crc >> 8);
			hb[22] = (uint8_t)(crc >> 16), hb[23] = (uint8_t)(crc >> 24);
		}
		write_full(fd, hb, sizeof(hb));
	}
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "oversize HELLO"));

	/* 3. a REQ as first frame: nothing is dispatched */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, NULL);
	send_frame_json(fd, NT_REQ, 9, json_pack("{s:s}", "op", "echo"));
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "REQ frame before authentication"));

	/* 4. silence: dropped at the handshake deadline */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, NULL);
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "handshake timeout"));

	/* 5. half a header then silence: the others are served meanwhile */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, NULL);
	write_full(fd, "MTCP\x01\x02", 6);
	call_echo(good, 2, false);
	call_echo(good, 3, true);
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "handshake timeout"));

	/* 6. a HELLO whose payload CRC is wrong */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, ns);
	{
		uint8_t *f;
		size_t n;
		json_t *hj = hello_json(secret(SECRET_A), ns, 1, "control");
		assert_int_equal(net_frame_build(NT_HELLO, 0, hj, &f, &n), 0);
		json_decref(hj);
		f[n - 2] ^= 0x20;
		write_full(fd, f, n);
		free(f);
	}
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "CRC mismatch"));

	/* 7. a HELLO that is not valid JSON / misses fields / bad purpose / bad rank */
	static const char *const bad_hellos[] = {
		"{\"rank\":1,\"purpose\":\"control\"}",
		"{\"rank\":1,\"purpose\":\"admin\",\"nonce\":\"00\",\"mac\":\"00\"}",
		"not json at all",
		"{\"rank\":70000,\"purpose\":\"control\","
		"\"nonce\":\"0000000000000000000000000000000000000000000000000000000000000000\","
		"\"mac\":\"0000000000000000000000000000000000000000000000000000000000000000\"}",
	};
	for (size_t i = 0; i < sizeof(bad_hellos) / sizeof(bad_hellos[0]); i++) {
		uint8_t *f;
		size_t n;
		mark = log_mark();
		fd = raw_connect(t, local, sizeof(local));
		raw_challenge(fd, NULL);
		assert_int_equal(net_frame_build_raw(NT_HELLO, 0, bad_hellos[i],
						     (uint32_t)strlen(bad_hellos[i]), &f, &n), 0);
		write_full(fd, f, n);
		free(f);
		assert_true(raw_closed(fd, 3000));
		close(fd);
		assert_true(wait_log(mark, 2000, "WARN", local, "malformed HELLO"));
	}

	/* 8. a correct HELLO with a MAC from the wrong secret: NT_ERROR EACCES */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	raw_challenge(fd, ns);
	send_frame_json(fd, NT_HELLO, 0, hello_json(secret(SECRET_B), ns, 2, "control"));
	{
		uint8_t p[512];
		struct net_hdr h;
		json_t *e = NULL;
		read_full(fd, hb, sizeof(hb));
		assert_int_equal(net_hdr_decode(hb, &h), 0);
		assert_int_equal(h.type, NT_ERROR);
		assert_true(h.len < sizeof(p));
		read_full(fd, p, h.len);
		assert_int_equal(net_json_decode(p, h.len, &e), 0);
		assert_int_equal(net_error_errno(e), -EACCES);
		json_decref(e);
	}
	assert_true(raw_closed(fd, 3000));
	close(fd);
	assert_true(wait_log(mark, 2000, "WARN", local, "authentication failed"));

	/* 9. connect and go away without a byte: not worth a warning */
	mark = log_mark();
	fd = raw_connect(t, local, sizeof(local));
	close(fd);
	call_echo(good, 4, false);

	assert_int_equal(log_count(mark, local, "WARN"), 0);

	/* nothing from any of them reached on_msg */
	assert_int_equal(t->nreq, 5);
	assert_int_equal(t->ndata_start, 0);
	nconn_close(good);
	tsrv_stop(t);
}

/* ======================= messages ======================= */

static _Atomic int blocked_rc;

static void *blocked_reader(void *arg)
{
	struct net_hdr h;
	json_t *m = NULL;

	blocked_rc = nconn_recv(arg, -1, &h, &m);
	json_decref(m);
	return NULL;
}

static void test_req_resp_events(void **state)
{
	struct tsrv *t = tsrv_start(secret(SECRET_A));
	struct nconn *c = NULL;
	struct net_hdr h;
	json_t *m = NULL, *req, *resp = NULL;
	uint64_t conn;
	int64_t v;

	(void)state;
	assert_int_equal(nconn_connect(t->addr, 2, "control", secret(SECRET_A), 5000, &c, NULL), 0);
	for (int i = 0; i < 50; i++)
		call_echo(c, i, i % 2);

	/* client -> server event */
	m = json_pack("{s:s}", "ev", "commit");
	assert_int_equal(nconn_send(c, NT_EVENT, 0, m), 0);
	json_decref(m);
	assert_true(wait_atomic(&t->nevent, 1, 5000));
	conn = t->last_conn;
	assert_int_equal(nsrv_conn_count(t->s), 1);

	/* server -> client event, from this (non-loop) thread */
	assert_int_equal(nsrv_send(t->s, conn, NT_EVENT, 0, json_pack("{s:i}", "lkg", 42)), 0);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), 0);
	assert_int_equal(h.type, NT_EVENT);
	assert_int_equal(net_json_int(m, "lkg", 0, 100, &v), 0);
	assert_int_equal(v, 42);
	json_decref(m);
	/* empty payload reads as {} on both sides */
	assert_int_equal(nsrv_send(t->s, conn, NT_EVENT, 0, NULL), 0);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), 0);
	assert_true(json_is_object(m));
	assert_int_equal(json_object_size(m), 0);
	json_decref(m);

	/* server-initiated request; the client's RESP reaches on_msg */
	assert_int_equal(nsrv_send(t->s, conn, NT_REQ, 77, json_pack("{s:s}", "op", "status")), 0);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), 0);
	assert_int_equal(h.type, NT_REQ);
	assert_int_equal(h.req_id, 77);
	json_decref(m);
	assert_int_equal(nconn_send(c, NT_RESP, 77, NULL), 0);
	assert_true(wait_atomic(&t->nresp, 1, 5000));

	/* an NT_ERROR reply */
	req = json_pack("{s:s}", "op", "fail");
	assert_int_equal(nconn_call(c, req, &resp, 5000), -ENOENT);
	assert_non_null(resp);
	assert_string_equal(json_string_value(json_object_get(resp, "error")), "no such thing");
	json_decref(resp);
	json_decref(req);

	/* a reply nobody asked for in the middle of a call: -EPROTO */
	assert_int_equal(nsrv_send(t->s, conn, NT_EVENT, 0, json_object()), 0);
	req = json_pack("{s:s}", "op", "echo");
	assert_int_equal(nconn_call(c, req, &resp, 5000), -EPROTO);
	json_decref(req);
	/* the stream is still in sync: the echo for that call arrives next */
	assert_int_equal(nconn_recv(c, 5000, &h, &m), 0);
	assert_int_equal(h.type, NT_RESP);
	json_decref(m);
	/* nothing more: a short receive times out and the conn stays usable */
	assert_int_equal(nconn_recv(c, 50, &h, &m), -ETIMEDOUT);
	call_echo(c, 99, true);
	/* a reader blocked without a deadline is released by nconn_shutdown */
	{
		struct nconn *c2 = NULL;
		pthread_t thr;
		assert_int_equal(nconn_connect(t->addr, 2, "control", secret(SECRET_A), 5000, &c2,
					       NULL), 0);
		assert_int_equal(pthread_create(&thr, NULL, blocked_reader, c2), 0);
		usleep(20000);   /* let it block; correctness does not depend on it */
		nconn_shutdown(c2);
		pthread_join(thr, NULL);
		assert_int_equal(blocked_rc, -ECONNRESET);
		nconn_close(c2);
		assert_true(wait_atomic(&t->nclose, 1, 5000));
		t->nclose = 0;
	}

	/* bad uses of nsrv_send */
	assert_int_equal(nsrv_send(t->s, conn + 1000, NT_EVENT, 0, json_object()), -ENOTCONN);
	assert_int_equal(nsrv_send(t->s, conn, NT_FILE, 0, json_object()), -EINVAL);
	assert_int_equal(nsrv_send(t->s, conn, NT_WELCOME, 0, NULL), -EINVAL);
	assert_int_equal(nsrv_close_conn(t->s, conn + 1000), -ENOTCONN);

	/* the server closes: queued output still arrives, then EOF, on_close */
	assert_int_equal(nsrv_send(t->s, conn, NT_EVENT, 0, json_pack("{s:s}", "bye", "now")), 0);
	assert_int_equal(nsrv_close_conn(t->s, conn), 0);
	assert_int_equal(nsrv_send(t->s, conn, NT_EVENT, 0, json_object()), -ENOTCONN);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), 0);
	assert_int_equal(h.type, NT_EVENT);
	json_decref(m);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), -ECONNRESET);
	assert_int_equal(nconn_recv(c, 5000, &h, &m), -ECONNRESET);   /* sticky */
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	assert_int_equal(nsrv_conn_count(t->s), 0);
	nconn_close(c);
	tsrv_stop(t);
}

/* A control client that never reads while the server keeps sending:
 * dropped once its queue passes the bound, others unaffected. */
static void test_output_queue_bound(void **state)
{
	struct tsrv *t = tsrv_start(NULL);
	struct nconn *slow = NULL, *good = NULL;
	size_t mark = log_mark(), big = 1u << 20;
	char *s = malloc(big);
	uint64_t conn;
	int rc = 0, i;

	(void)state;
	memset(s, 'x', big - 1);
	s[big - 1] = '\0';
	assert_int_equal(nconn_connect(t->addr, 5, "control", NULL, 5000, &slow, NULL), 0);
	assert_int_equal(nconn_send(slow, NT_EVENT, 0, NULL), 0);
	assert_true(wait_atomic(&t->nevent, 1, 5000));
	conn = t->last_conn;
	assert_int_equal(nconn_connect(t->addr, 6, "control", NULL, 5000, &good, NULL), 0);
	for (i = 0; i < 400 && rc == 0; i++) {
		rc = nsrv_send(t->s, conn, NT_EVENT, 0, json_pack("{s:s}", "blob", s));
		if (i % 16 == 0)
			call_echo(good, i, false);   /* the loop stays responsive */
	}
	assert_true(rc == -ENOBUFS || rc == -ENOTCONN);
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	assert_true(wait_log(mark, 2000, "WARN", "output queue over 64 MiB"));
	call_echo(good, 1000, true);
	free(s);
	nconn_close(slow);
	nconn_close(good);
	tsrv_stop(t);
}

/* ======================= many clients ======================= */

#define NCLIENTS 1000
#define NTHREADS 10

struct many {
	struct tsrv *t;
	const struct net_auth *auth;
	int idx;
	pthread_barrier_t *bar;
	int rc;
};

static void *many_main(void *arg)
{
	struct many *m = arg;
	struct nconn *c[NCLIENTS / NTHREADS] = { 0 };
	const int n = NCLIENTS / NTHREADS;
	int rc = 0;

	for (int i = 0; i < n && rc == 0; i++)
		rc = nconn_connect(m->t->addr, m->idx * n + i, "control", m->auth, 30000,
				   &c[i], NULL);
	/* everyone is connected before anyone asks */
	pthread_barrier_wait(m->bar);
	for (int i = 0; i < n && rc == 0; i++) {
		json_t *req = json_pack("{s:s, s:i, s:b}", "op", "echo", "seq",
					m->idx * n + i, "async", i % 2);
		rc = nconn_send(c[i], NT_REQ, (uint32_t)(i + 1), req);
		json_decref(req);
	}
	for (int i = 0; i < n && rc == 0; i++) {
		struct net_hdr h;
		json_t *resp = NULL;
		int64_t seq = -1;
		rc = nconn_recv(c[i], 30000, &h, &resp);
		if (rc == 0 && (h.type != NT_RESP || h.req_id != (uint32_t)(i + 1) ||
				net_json_int(json_object_get(resp, "echo"), "seq", 0, INT32_MAX,
					     &seq) < 0 || seq != m->idx * n + i))
			rc = -EPROTO;
		json_decref(resp);
	}
	pthread_barrier_wait(m->bar);
	for (int i = 0; i < n; i++)
		nconn_close(c[i]);
	m->rc = rc;
	return NULL;
}

static void test_1000_clients(void **state)
{
	struct rlimit rl;
	struct net_auth *auth;
	struct tsrv *t;
	struct many m[NTHREADS];
	pthread_t thr[NTHREADS];
	pthread_barrier_t bar;
	uint64_t t0;

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = rl.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 2 * NCLIENTS + 100) {
		print_message("RLIMIT_NOFILE hard limit %llu is too low: skipped\n",
			      (unsigned long long)rl.rlim_cur);
		skip();
	}
	auth = secret(SECRET_A);
	t = tsrv_start(auth);
	pthread_barrier_init(&bar, NULL, NTHREADS + 1);
	t0 = util_now_ns();
	for (int i = 0; i < NTHREADS; i++) {
		m[i] = (struct many){ .t = t, .auth = auth, .idx = i, .bar = &bar };
		assert_int_equal(pthread_create(&thr[i], NULL, many_main, &m[i]), 0);
	}
	pthread_barrier_wait(&bar);   /* all connected (or failed) */
	print_message("  %d clients connected in %.0f ms; %zu control connections\n", NCLIENTS,
		      (double)(util_now_ns() - t0) / 1e6, nsrv_conn_count(t->s));
	assert_int_equal(nsrv_conn_count(t->s), NCLIENTS);
	pthread_barrier_wait(&bar);   /* all answered */
	print_message("  %d requests answered %.0f ms after the start\n", NCLIENTS,
		      (double)(util_now_ns() - t0) / 1e6);
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(thr[i], NULL);
		assert_int_equal(m[i].rc, 0);
	}
	assert_int_equal(t->nreq, NCLIENTS);
	assert_true(wait_atomic(&t->nclose, NCLIENTS, 10000));
	assert_int_equal(nsrv_conn_count(t->s), 0);
	pthread_barrier_destroy(&bar);
	tsrv_stop(t);
}

/* ======================= data connections ======================= */

/* tdir/name filled with size pseudo-random bytes; returns its CRC32C. */
static uint32_t make_file(const char *name, uint64_t size)
{
	int fd = openat(tdirfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	uint64_t x = 0x9e3779b97f4a7c15ull ^ size;
	uint8_t *p;
	uint32_t crc;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (size == 0) {
		close(fd);
		return 0;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	for (uint64_t i = 0; i + 8 <= size; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (uint64_t i = size & ~7ull; i < size; i++)
		p[i] = (uint8_t)i;
	crc = mf_crc32c(0, p, size);
	munmap(p, size);
	close(fd);
	return crc;
}

static bool same_files(const char *a, const char *b)
{
	int fa = openat(tdirfd, a, O_RDONLY | O_CLOEXEC), fb = openat(tdirfd, b, O_RDONLY | O_CLOEXEC);
	struct stat sa, sb;
	bool same = false;

	assert_true(fa >= 0 && fb >= 0);
	fstat(fa, &sa);
	fstat(fb, &sb);
	if (sa.st_size == sb.st_size) {
		if (sa.st_size == 0) {
			same = true;
		} else {
			void *pa = mmap(NULL, (size_t)sa.st_size, PROT_READ, MAP_SHARED, fa, 0);
			void *pb = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fb, 0);
			same = memcmp(pa, pb, (size_t)sa.st_size) == 0;
			munmap(pa, (size_t)sa.st_size);
			munmap(pb, (size_t)sb.st_size);
		}
	}
	close(fa);
	close(fb);
	return same;
}

/* Send tdir/name over c and wait for the server's RESP: its crc. */
static uint32_t send_and_ack(struct tsrv *t, struct nconn *c, const char *name, uint64_t size,
			     uint32_t crc)
{
	int fd = openat(tdirfd, name, O_RDONLY | O_CLOEXEC);
	struct net_hdr h;
	json_t *m = NULL;
	uint64_t got = 0;
	int64_t rc = -1;

	assert_true(fd >= 0);
	assert_int_equal(nconn_send_file(c, name, fd, size, crc), 0);
	close(fd);
	assert_int_equal(nconn_recv(c, 30000, &h, &m), 0);
	assert_int_equal(h.type, NT_RESP);
	assert_int_equal(net_json_int(m, "rc", -4095, 0, &rc), 0);
	assert_int_equal(rc, 0);
	assert_int_equal(net_json_u64(m, "crc", UINT32_MAX, &got), 0);
	assert_true(json_is_true(json_object_get(m, "ok")));
	json_decref(m);
	assert_int_equal(t->file_rc, 0);
	return (uint32_t)got;
}

static void test_file_transfer(void **state)
{
	struct tsrv *t = tsrv_start(secret(SECRET_A));
	const uint64_t big = 64ull << 20;
	struct nconn *c = NULL;
	uint32_t crc_big, crc_small, crc_odd;

	(void)state;
	crc_big = make_file("big.bin", big);
	crc_small = make_file("small.bin", 1000);
	crc_odd = make_file("odd.bin", (3ull << 20) + 12345);
	make_file("empty.bin", 0);
	assert_int_equal(nconn_connect(t->addr, 1, "data", secret(SECRET_A), 5000, &c, NULL), 0);

	/* 64 MiB, each receive path; CRC and bytes equal */
	nconn_set_rx_mode(NCONN_RX_AUTO);
	assert_int_equal(send_and_ack(t, c, "big.bin", big, crc_big), crc_big);
	assert_true(same_files("big.bin", "recv.bin"));
	nconn_set_rx_mode(NCONN_RX_COPY);
	assert_int_equal(send_and_ack(t, c, "big.bin", big, crc_big), crc_big);
	assert_true(same_files("big.bin", "recv.bin"));
	nconn_set_rx_mode(NCONN_RX_SPLICE);
	assert_int_equal(send_and_ack(t, c, "odd.bin", (3ull << 20) + 12345, crc_odd), crc_odd);
	assert_true(same_files("odd.bin", "recv.bin"));
	/* splice asked for, but the fd cannot be read back (copy path) or
	 * cannot take splice (O_APPEND: bytes already in the pipe are moved
	 * by hand, then the copy path) */
	t->open_flags = O_WRONLY;
	assert_int_equal(send_and_ack(t, c, "odd.bin", (3ull << 20) + 12345, crc_odd), crc_odd);
	assert_true(same_files("odd.bin", "recv.bin"));
	t->open_flags = O_RDWR | O_APPEND;
	assert_int_equal(send_and_ack(t, c, "odd.bin", (3ull << 20) + 12345, crc_odd), crc_odd);
	assert_true(same_files("odd.bin", "recv.bin"));
	t->open_flags = O_RDWR;
	nconn_set_rx_mode(NCONN_RX_AUTO);
	t->open_flags = O_WRONLY;   /* as the engine opens them */
	assert_int_equal(send_and_ack(t, c, "big.bin", big, crc_big), crc_big);
	assert_true(same_files("big.bin", "recv.bin"));
	t->open_flags = O_RDWR;
	/* small, empty, and one discarded by the receiver */
	assert_int_equal(send_and_ack(t, c, "small.bin", 1000, crc_small), crc_small);
	assert_true(same_files("small.bin", "recv.bin"));
	assert_int_equal(send_and_ack(t, c, "empty.bin", 0, 0), 0);
	assert_true(same_files("empty.bin", "recv.bin"));
	t->discard = true;
	assert_int_equal(send_and_ack(t, c, "odd.bin", (3ull << 20) + 12345, crc_odd), crc_odd);
	t->discard = false;
	/* sparse (issue 13): only the data extents travel; the received file
	 * has the holes back, the same bytes and the CRC over all of them;
	 * the same file into an O_APPEND fd gets its holes written as zeros */
	{
		static const char a[] = "start", b[] = "middle", z[] = "end";
		const uint64_t sz = 64ull << 20;
		int fd = openat(tdirfd, "sparse.bin", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		uint32_t crc_sparse, crc;
		struct stat sb;

		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, (off_t)sz), 0);
		assert_int_equal(pwrite(fd, a, 5, 0), 5);
		assert_int_equal(pwrite(fd, b, 6, 20 << 20), 6);
		assert_int_equal(pwrite(fd, z, 3, (off_t)sz - 3), 3);
		assert_int_equal(mf_crc32c_fd(fd, &crc_sparse, &(uint64_t){ 0 }), 0);
		close(fd);
		nconn_set_rx_mode(NCONN_RX_AUTO);
		t->open_flags = O_WRONLY;
		assert_int_equal(send_and_ack(t, c, "sparse.bin", sz, crc_sparse), crc_sparse);
		/* no same_files yet: its mmap reads would fill the holes of tmpfs
		 * (pread does not) */
		assert_int_equal(fstatat(tdirfd, "recv.bin", &sb, 0), 0);
		assert_int_equal((uint64_t)sb.st_size, sz);
		assert_true((uint64_t)sb.st_blocks * 512 <= 64 * 1024);
		fd = openat(tdirfd, "recv.bin", O_RDONLY | O_CLOEXEC);
		assert_int_equal(mf_crc32c_fd(fd, &crc, &(uint64_t){ 0 }), 0);
		close(fd);
		assert_int_equal(crc, crc_sparse);
		t->open_flags = O_RDWR | O_APPEND;
		assert_int_equal(send_and_ack(t, c, "sparse.bin", sz, crc_sparse), crc_sparse);
		assert_true(same_files("sparse.bin", "recv.bin"));
		t->open_flags = O_RDWR;
		t->nfiles -= 2;
	}
	/* requests interleave with files on the same connection */
	{
		json_t *req = json_pack("{s:i}", "seq", 1), *resp = NULL;
		assert_int_equal(nconn_call(c, req, &resp, 5000), 0);
		json_decref(req);
		json_decref(resp);
	}
	assert_int_equal(t->nfiles, 9);

	/* refused by the sender: unsafe path, fd shorter than announced */
	{
		int fd = openat(tdirfd, "small.bin", O_RDONLY | O_CLOEXEC);
		assert_int_equal(nconn_send_file(c, "../x", fd, 10, 0), -EINVAL);
		assert_int_equal(nconn_send_file(c, "/x", fd, 10, 0), -EINVAL);
		assert_int_equal(nconn_send_file(c, "x", -1, 10, 0), -EINVAL);
		/* 1000 bytes, 5000 announced: the stream is broken, the conn failed */
		assert_int_equal(nconn_send_file(c, "small.bin", fd, 5000, 0), -EIO);
		assert_int_equal(nconn_send(c, NT_EVENT, 0, NULL), -EIO);
		close(fd);
	}
	nconn_close(c);
	/* the receiver sees the short file as the peer closing early */
	assert_true(wait_atomic(&t->ndata_done, 1, 10000));
	assert_int_equal(t->file_rc, -ECONNRESET);
	tsrv_stop(t);
}

/* A sender announces 64 MiB, sends 1 MiB and dies: the receiver returns an
 * error, not a hang. A stalled sender: the receiver times out. */
static void test_sender_dies(void **state)
{
	struct tsrv *t = tsrv_start(NULL);
	struct nconn *c = NULL;
	json_t *hdr = NULL;
	char *buf = calloc(1, 1u << 20);
	uint64_t t0;

	(void)state;
	assert_int_equal(nconn_connect(t->addr, 1, "data", NULL, 5000, &c, NULL), 0);
	assert_int_equal(net_file_hdr_build("f", 64ull << 20, 0, &hdr), 0);
	assert_int_equal(nconn_send(c, NT_FILE, 0, hdr), 0);
	json_decref(hdr);
	write_full(nconn_fd(c), buf, 1u << 20);
	t0 = util_now_ns();
	nconn_close(c);
	assert_true(wait_atomic(&t->ndata_done, 1, 10000));
	assert_int_equal(t->file_rc, -ECONNRESET);
	assert_true(util_now_ns() - t0 < 5000000000ull);

	/* stalled: 100 bytes of 1 MiB, connection left open */
	t->file_timeout_ms = 300;
	assert_int_equal(nconn_connect(t->addr, 1, "data", NULL, 5000, &c, NULL), 0);
	assert_int_equal(net_file_hdr_build("f", 1u << 20, 0, &hdr), 0);
	assert_int_equal(nconn_send(c, NT_FILE, 0, hdr), 0);
	json_decref(hdr);
	write_full(nconn_fd(c), buf, 100);
	assert_true(wait_atomic(&t->ndata_done, 2, 10000));
	assert_int_equal(t->file_rc, -ETIMEDOUT);
	nconn_close(c);

	/* bytes pipelined right behind the data HELLO (before WELCOME is
	 * read) are not lost in the hand-over to the data thread */
	{
		int fd = raw_connect(t, NULL, 0);
		uint8_t ns[32], *f1, *f2;
		size_t n1, n2;
		uint32_t crc = mf_crc32c(0, buf, 4096);

		t->file_timeout_ms = 5000;
		raw_challenge(fd, ns);
		json_t *hj = hello_json(NULL, ns, 1, "data");
		assert_int_equal(net_frame_build(NT_HELLO, 0, hj, &f1, &n1), 0);
		json_decref(hj);
		assert_int_equal(net_file_hdr_build("p", 4096, crc, &hdr), 0);
		assert_int_equal(net_frame_build(NT_FILE, 0, hdr, &f2, &n2), 0);
		json_decref(hdr);
		f1 = realloc(f1, n1 + n2 + 4096);
		memcpy(f1 + n1, f2, n2);
		memcpy(f1 + n1 + n2, buf, 4096);
		write_full(fd, f1, n1 + n2 + 4096);   /* one segment */
		free(f1);
		free(f2);
		assert_true(wait_atomic(&t->nfiles, 3, 10000));
		assert_int_equal(t->file_rc, 0);
		assert_int_equal(t->file_crc, crc);
		close(fd);
		assert_true(wait_atomic(&t->ndata_done, 3, 10000));
	}
	free(buf);
	tsrv_stop(t);
}

static void test_data_cap(void **state)
{
	struct tsrv *t = tsrv_start(NULL);
	struct nconn *a = NULL, *b = NULL;
	size_t mark = log_mark();

	(void)state;
	t->dmode = DM_BLOCK;
	nsrv_set_max_data_conns(t->s, 1);
	assert_int_equal(nconn_connect(t->addr, 1, "data", NULL, 5000, &a, NULL), 0);
	assert_true(wait_atomic(&t->ndata_start, 1, 5000));
	assert_int_equal(nconn_connect(t->addr, 2, "data", NULL, 5000, &b, NULL), -EBUSY);
	assert_true(wait_log(mark, 2000, "WARN", "refusing data connection of rank 2"));
	nconn_close(a);
	assert_true(wait_atomic(&t->ndata_done, 1, 5000));
	assert_int_equal(nconn_connect(t->addr, 2, "data", NULL, 5000, &b, NULL), 0);
	nconn_close(b);
	assert_true(wait_atomic(&t->ndata_done, 2, 5000));
	tsrv_stop(t);
}

/* nsrv_stop with authenticated control connections, a half-open
 * handshake and a data thread blocked in an unbounded receive. */
static void test_stop_live(void **state)
{
	struct tsrv *t = tsrv_start(secret(SECRET_A));
	struct nconn *c[5] = { 0 }, *d = NULL;
	struct net_hdr h;
	json_t *m = NULL;
	uint64_t t0;
	int raw;

	(void)state;
	t->dmode = DM_BLOCK;
	for (int i = 0; i < 5; i++)
		assert_int_equal(nconn_connect(t->addr, i, "control", secret(SECRET_A), 5000, &c[i],
					       NULL), 0);
	call_echo(c[0], 1, true);
	assert_int_equal(nconn_connect(t->addr, 9, "data", secret(SECRET_A), 5000, &d, NULL), 0);
	assert_true(wait_atomic(&t->ndata_start, 1, 5000));
	raw = raw_connect(t, NULL, 0);
	raw_challenge(raw, NULL);
	/* an event in flight at stop time */
	assert_int_equal(nconn_send(c[1], NT_EVENT, 0, NULL), 0);

	t0 = util_now_ns();
	nsrv_stop(t->s);
	t->s = NULL;
	assert_true(util_now_ns() - t0 < 3000000000ull);
	assert_int_equal(t->nclose, 5);
	assert_int_equal(t->ndata_done, 1);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(nconn_recv(c[i], 5000, &h, &m), -ECONNRESET);
		nconn_close(c[i]);
	}
	assert_true(raw_closed(raw, 2000));
	close(raw);
	nconn_close(d);
	tsrv_stop(t);   /* nsrv_stop(NULL) */
}

static void test_addresses(void **state)
{
	static const struct nsrv_ops no_ops = { 0 };
	struct nsrv *s = NULL;
	struct tsrv *t = tsrv_start(NULL);
	struct nconn *c = NULL;
	char a[64];
	int rc;

	(void)state;
	/* refused, unresolvable, in use, malformed */
	snprintf(a, sizeof(a), "127.0.0.1:%d", nsrv_port(t->s));
	assert_int_equal(nsrv_start(a, 0, NULL, &t_ops, t, &s), -EADDRINUSE);
	assert_int_equal(nsrv_start("127.0.0.1", 0, NULL, &t_ops, t, &s), -EINVAL);
	assert_int_equal(nsrv_start("127.0.0.1:0", 70000, NULL, &t_ops, t, &s), -EINVAL);
	rc = nconn_connect("no-such-host.invalid:1", 0, "control", NULL, 2000, &c, NULL);
	assert_true(rc == -EHOSTUNREACH || rc == -EAGAIN);
	{
		/* a port nobody listens on: bind one, close it, connect */
		struct nsrv *tmp = NULL;
		int port;
		assert_int_equal(nsrv_start("127.0.0.1:0", 0, NULL, &t_ops, t, &tmp), 0);
		port = nsrv_port(tmp);
		nsrv_stop(tmp);
		snprintf(a, sizeof(a), "127.0.0.1:%d", port);
		assert_int_equal(nconn_connect(a, 0, "control", NULL, 2000, &c, NULL), -ECONNREFUSED);
	}
	/* localhost resolves (to ::1 and/or 127.0.0.1) */
	snprintf(a, sizeof(a), "localhost:%d", nsrv_port(t->s));
	assert_int_equal(nconn_connect(a, 0, "control", NULL, 5000, &c, NULL), 0);
	call_echo(c, 1, false);
	nconn_close(c);
	tsrv_stop(t);

	/* IPv6 loopback, when the host has it; and the dual-stack wildcard */
	rc = nsrv_start("[::1]:0", 0, NULL, &no_ops, NULL, &s);
	if (rc == 0) {
		snprintf(a, sizeof(a), "[::1]:%d", nsrv_port(s));
		assert_int_equal(nconn_connect(a, 0, "control", NULL, 5000, &c, NULL), 0);
		assert_string_equal(nconn_peer_addr(c), a);
		nconn_close(c);
		nsrv_stop(s);
	} else {
		print_message("  no IPv6 loopback (%s): [::1] part skipped\n", strerror(-rc));
	}
	assert_int_equal(nsrv_start(":0", 0, NULL, &no_ops, NULL, &s), 0);
	snprintf(a, sizeof(a), "127.0.0.1:%d", nsrv_port(s));
	assert_int_equal(nconn_connect(a, 0, "control", NULL, 5000, &c, NULL), 0);
	nconn_close(c);
	nsrv_stop(s);
}

/* ======================= throughput (opt-in) ======================= */

struct bench_rx {
	int lfd;
	int mode;     /* 0: raw splice, 1: raw recv+write, 2: nconn (rx mode set globally) */
	uint64_t size;
	double secs;
	uint32_t crc;
	int rc;
};

static void *bench_raw_rx(void *arg)
{
	struct bench_rx *b = arg;
	int s = accept(b->lfd, NULL, NULL), fd, p[2];
	uint64_t left = b->size, t0;
	loff_t off = 0;
	char *buf = malloc(1u << 20);

	fd = openat(tdirfd, "bench.out", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(pipe(p) == 0);
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	t0 = util_now_ns();
	while (left > 0) {
		ssize_t n;
		if (b->mode == 0) {
			n = splice(s, NULL, p[1], NULL, left > (1u << 20) ? (1u << 20) : left,
				   SPLICE_F_MOVE);
			if (n <= 0)
				break;
			for (ssize_t m = n; m > 0;) {
				ssize_t k = splice(p[0], NULL, fd, &off, (size_t)m, SPLICE_F_MOVE);
				if (k <= 0)
					abort();
				m -= k;
			}
		} else {
			n = recv(s, buf, left > (1u << 20) ? (1u << 20) : left, 0);
			if (n <= 0)
				break;
			if (pwrite(fd, buf, (size_t)n, off) != n)
				abort();
			off += n;
		}
		left -= (uint64_t)n;
	}
	b->secs = (double)(util_now_ns() - t0) / 1e9;
	b->rc = left ? -EIO : 0;
	close(p[0]);
	close(p[1]);
	close(fd);
	close(s);
	free(buf);
	return NULL;
}

static double bench_raw(int mode, uint64_t size)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct bench_rx b = { .mode = mode, .size = size };
	pthread_t thr;
	int c, fd;
	off_t off = 0;
	uint64_t t0;

	b.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(b.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(b.lfd, 1), 0);
	getsockname(b.lfd, (struct sockaddr *)&sa, &sl);
	pthread_create(&thr, NULL, bench_raw_rx, &b);
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
	fd = openat(tdirfd, "bench.in", O_RDONLY | O_CLOEXEC);
	t0 = util_now_ns();
	while ((uint64_t)off < size)
		if (sendfile(c, fd, &off, size - (uint64_t)off) <= 0)
			abort();
	pthread_join(thr, NULL);
	(void)t0;
	close(c);
	close(fd);
	close(b.lfd);
	assert_int_equal(b.rc, 0);
	return (double)size / b.secs / (1u << 30);
}

static _Atomic uint64_t bench_ns;

static void bench_on_data(void *arg, struct nconn *c, int rank)
{
	struct net_hdr h;
	json_t *m = NULL;
	const char *path;
	uint64_t size, t0;
	uint32_t want, got = 0;
	int fd;

	(void)arg;
	(void)rank;
	if (nconn_recv(c, 20000, &h, &m) == 0 && h.type == NT_FILE &&
	    net_file_hdr_parse(m, &path, &size, &want) == 0) {
		fd = openat(tdirfd, "bench.out", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		t0 = util_now_ns();
		if (nconn_recv_file(c, fd, size, 20000, &got) == 0 && got == want)
			bench_ns = util_now_ns() - t0;
		else
			bench_ns = 0;
		close(fd);
		nconn_send(c, NT_RESP, 0, NULL);
	}
	json_decref(m);
	nconn_close(c);
}

static struct net_auth *tls_auth(const char *leaf, const char *ca, const char *s);
static void tls_auth_free(struct net_auth *a);

static double bench_nconn(int rx_mode, uint64_t size, uint32_t crc, bool tls)
{
	static const struct nsrv_ops ops = { .on_data = bench_on_data };
	struct net_auth *sa = tls ? tls_auth("node", "ca", SECRET_A) : secret(SECRET_A);
	struct net_auth *ca = tls ? tls_auth("peer", "ca", SECRET_A) : secret(SECRET_A);
	struct nsrv *s = NULL;
	struct nconn *c = NULL;
	struct net_hdr h;
	json_t *m = NULL;
	char a[64];
	int fd;

	nconn_set_rx_mode(rx_mode);
	assert_int_equal(nsrv_start("127.0.0.1:0", 0, sa, &ops, NULL, &s), 0);
	snprintf(a, sizeof(a), "127.0.0.1:%d", nsrv_port(s));
	assert_int_equal(nconn_connect(a, 1, "data", ca, 5000, &c, NULL), 0);
	fd = openat(tdirfd, "bench.in", O_RDONLY | O_CLOEXEC);
	bench_ns = 0;
	assert_int_equal(nconn_send_file(c, "bench.in", fd, size, crc), 0);
	assert_int_equal(nconn_recv(c, 30000, &h, &m), 0);
	json_decref(m);
	close(fd);
	nconn_close(c);
	nsrv_stop(s);
	if (tls) {
		tls_auth_free(sa);
		tls_auth_free(ca);
	}
	nconn_set_rx_mode(NCONN_RX_AUTO);
	assert_true(bench_ns > 0);
	return (double)size / ((double)bench_ns / 1e9) / (1u << 30);
}


/* ======================= mutual TLS ======================= */

/* Two CAs, a node certificate from each, a second key that matches
 * neither: made with the openssl CLI in tdir once. */
static void make_certs(void)
{
	static bool done;
	char cmd[4096];

	if (done)
		return;
	snprintf(cmd, sizeof(cmd),
		 "( set -e; cd '%s'; "
		 "ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout $1.key -out $1.pem -days 2 -subj /CN=$1 "
		 "-addext basicConstraints=critical,CA:true "
		 "-addext keyUsage=critical,keyCertSign,cRLSign; }; "
		 "leaf() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout $1.key -out $1.csr -subj /CN=$1; "
		 "printf 'extendedKeyUsage=serverAuth,clientAuth\\nsubjectAltName=IP:127.0.0.1\\n' > $1.ext; "
		 "openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial "
		 "-out $1.pem -days 2 -extfile $1.ext; }; "
		 "ca ca; ca rogue; leaf node ca; leaf peer ca; leaf evil rogue; "
		 "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out other.key; "
		 "echo 'not a certificate' > junk.pem ) >/dev/null 2>&1",
		 tdir);
	assert_int_equal(system(cmd), 0);
	done = true;
}

/* An auth value with TLS from tdir/<leaf>.{pem,key} and tdir/<ca>.pem,
 * plus a secret when s is set. Free with tls_auth_free. */
static struct net_auth *tls_auth(const char *leaf, const char *ca, const char *s)
{
	struct net_auth *a = calloc(1, sizeof(*a));
	char cert[PATH_MAX], key[PATH_MAX], cap[PATH_MAX], err[512];

	assert_non_null(a);
	make_certs();
	snprintf(cert, sizeof(cert), "%s/%s.pem", tdir, leaf);
	snprintf(key, sizeof(key), "%s/%s.key", tdir, leaf);
	snprintf(cap, sizeof(cap), "%s/%s.pem", tdir, ca);
	if (s)
		assert_int_equal(auth_set_secret(a, s, strlen(s)), 0);
	if (net_tls_load(cert, key, cap, &a->tls, err, sizeof(err)) != 0)
		fail_msg("net_tls_load: %s", err);
	return a;
}

static void tls_auth_free(struct net_auth *a)
{
	net_tls_free(a->tls);
	auth_clear(a);
	free(a);
}

static void test_tls_load_errors(void **state)
{
	char cert[PATH_MAX], key[PATH_MAX], ca[PATH_MAX], other[PATH_MAX], junk[PATH_MAX];
	char missing[PATH_MAX], err[512];
	SSL_CTX *ctx = NULL;

	(void)state;
	make_certs();
	snprintf(cert, sizeof(cert), "%s/node.pem", tdir);
	snprintf(key, sizeof(key), "%s/node.key", tdir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", tdir);
	snprintf(other, sizeof(other), "%s/other.key", tdir);
	snprintf(junk, sizeof(junk), "%s/junk.pem", tdir);
	snprintf(missing, sizeof(missing), "%s/missing.pem", tdir);

	assert_int_equal(net_tls_load(cert, key, ca, &ctx, err, sizeof(err)), 0);
	assert_non_null(ctx);
	net_tls_free(ctx);
	ctx = NULL;
	assert_int_equal(net_tls_load(cert, NULL, ca, &ctx, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "go together"));
	assert_int_equal(net_tls_load(cert, other, ca, &ctx, err, sizeof(err)), -EINVAL);
	if (!strstr(err, "does not belong"))
		fail_msg("%s", err);
	assert_int_equal(net_tls_load(cert, key, junk, &ctx, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "tls_ca="));
	assert_int_equal(net_tls_load(junk, key, ca, &ctx, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "tls_cert="));
	assert_int_equal(net_tls_load(cert, missing, ca, &ctx, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "missing.pem"));
	assert_null(ctx);
}

/* A TLS sender whose peer stopped reading: a send that times out may have
 * left a record of its frame inside SSL, so the connection is failed for
 * good (on plain TCP a timeout with nothing written keeps it usable). */
static _Atomic int stall_go;

static void stall_on_data(void *arg, struct nconn *c, int rank)
{
	(void)arg;
	(void)rank;
	while (!stall_go)
		usleep(5000);
	for (;;) {
		struct net_hdr h;
		uint8_t *p = NULL;
		if (nconn_recv_raw(c, 2000, &h, &p) < 0)
			break;
		free(p);
	}
	nconn_close(c);
}

static void test_tls_send_timeout_is_final(void **state)
{
	static const struct nsrv_ops ops = { .on_data = stall_on_data };
	struct net_auth *sa = tls_auth("node", "ca", NULL), *ca = tls_auth("peer", "ca", NULL);
	struct nsrv *s = NULL;
	struct nconn *c = NULL;
	uint8_t buf[1000];
	char a[64];
	int rc = 0, i;

	(void)state;
	stall_go = 0;
	assert_int_equal(nsrv_start("127.0.0.1:0", 0, sa, &ops, NULL, &s), 0);
	snprintf(a, sizeof(a), "127.0.0.1:%d", nsrv_port(s));
	assert_int_equal(nconn_connect(a, 1, "data", ca, 5000, &c, NULL), 0);
	nconn_set_io_timeout(c, 300);
	memset(buf, 'x', sizeof(buf));
	for (i = 0; i < 200000 && rc == 0; i++)
		rc = nconn_send_raw(c, NT_EVENT, 0, buf, sizeof(buf));
	assert_int_equal(rc, -ETIMEDOUT);
	stall_go = 1;
	/* the reader drains now, but this connection must not send again */
	assert_true(nconn_send_raw(c, NT_EVENT, 0, buf, sizeof(buf)) < 0);
	nconn_close(c);
	nsrv_stop(s);
	tls_auth_free(sa);
	tls_auth_free(ca);
}

static void test_tls(void **state)
{
	struct net_auth *srv_auth = tls_auth("node", "ca", NULL);
	struct net_auth *cli = tls_auth("peer", "ca", NULL);
	struct net_auth *evil = tls_auth("evil", "ca", NULL);
	struct net_auth *distrust = tls_auth("peer", "rogue", NULL);
	struct tsrv *t = tsrv_start(srv_auth), *plain;
	const uint64_t big = 64ull << 20;
	struct nconn *c = NULL, *d = NULL;
	uint32_t crc_big, crc_odd;
	size_t mark;
	int peer = -5;

	(void)state;
	nsrv_set_handshake_timeout_ms(t->s, 1000);
	crc_big = make_file("big.bin", big);
	crc_odd = make_file("odd.bin", (3ull << 20) + 12345);
	make_file("empty.bin", 0);

	/* control: requests and replies from another thread, through TLS */
	assert_int_equal(nconn_connect(t->addr, 2, "control", cli, 5000, &c, &peer), 0);
	assert_int_equal(peer, SRV_RANK);
	for (int i = 0; i < 20; i++)
		call_echo(c, i, i & 1);
	/* data: files whose bytes and CRC arrive intact, interleaved with requests */
	assert_int_equal(nconn_connect(t->addr, 2, "data", cli, 5000, &d, NULL), 0);
	nconn_set_rx_mode(NCONN_RX_SPLICE);   /* asked for; TLS takes the copy path */
	assert_int_equal(send_and_ack(t, d, "big.bin", big, crc_big), crc_big);
	assert_true(same_files("big.bin", "recv.bin"));
	nconn_set_rx_mode(NCONN_RX_AUTO);
	t->open_flags = O_WRONLY;
	assert_int_equal(send_and_ack(t, d, "odd.bin", (3ull << 20) + 12345, crc_odd), crc_odd);
	assert_true(same_files("odd.bin", "recv.bin"));
	t->open_flags = O_RDWR;
	assert_int_equal(send_and_ack(t, d, "empty.bin", 0, 0), 0);
	{
		json_t *req = json_pack("{s:i}", "seq", 1), *resp = NULL;
		assert_int_equal(nconn_call(d, req, &resp, 5000), 0);
		json_decref(req);
		json_decref(resp);
	}
	assert_int_equal(t->nfiles, 3);
	nconn_close(d);
	assert_true(wait_atomic(&t->ndata_done, 1, 10000));
	assert_int_equal(t->data_rc, -ECONNRESET);   /* the client went away */

	/* the server keeps nothing in clear: a plain client gets no CHALLENGE
	 * and is dropped at the handshake deadline */
	mark = log_mark();
	{
		int fd = raw_connect(t, NULL, 0);
		struct pollfd p = { .fd = fd, .events = POLLIN };
		assert_int_equal(poll(&p, 1, 300), 0);
		assert_true(raw_closed(fd, 5000));
		close(fd);
	}
	/* an mtcfs client without TLS fails (the server never says CHALLENGE) */
	assert_true(nconn_connect(t->addr, 2, "control", secret(NULL), 3000, &d, NULL) < 0);
	assert_null(d);

	/* a certificate from another CA: refused, with the reason in the log */
	mark = log_mark();
	assert_int_equal(nconn_connect(t->addr, 4, "control", evil, 5000, &d, NULL), -EACCES);
	assert_true(wait_log(mark, 2000, "WARN", "TLS handshake failed"));
	/* a client that does not trust the server's CA refuses the server */
	mark = log_mark();
	assert_int_equal(nconn_connect(t->addr, 4, "data", distrust, 5000, &d, NULL), -EACCES);
	assert_true(wait_log(mark, 2000, "WARN", "TLS handshake failed", "certificate verify failed"));
	assert_int_equal(t->ndata_start, 1);

	/* the first connection kept working through all of that */
	call_echo(c, 100, true);
	nconn_close(c);
	assert_true(wait_atomic(&t->nclose, 1, 5000));
	tsrv_stop(t);

	/* a TLS client and a plain server: refused by the client */
	plain = tsrv_start(NULL);
	assert_int_equal(nconn_connect(plain->addr, 4, "control", cli, 5000, &d, NULL), -EACCES);
	assert_int_equal(plain->nreq, 0);
	tsrv_stop(plain);

	/* TLS and a secret together: both must hold */
	{
		struct net_auth *sa = tls_auth("node", "ca", SECRET_A);
		struct net_auth *ok = tls_auth("peer", "ca", SECRET_A);
		struct net_auth *bad = tls_auth("peer", "ca", SECRET_B);
		t = tsrv_start(sa);
		assert_int_equal(nconn_connect(t->addr, 5, "control", bad, 5000, &d, NULL), -EACCES);
		assert_int_equal(nconn_connect(t->addr, 5, "control", ok, 5000, &d, NULL), 0);
		call_echo(d, 1, false);
		nconn_close(d);
		tsrv_stop(t);
		tls_auth_free(sa);
		tls_auth_free(ok);
		tls_auth_free(bad);
	}
	tls_auth_free(srv_auth);
	tls_auth_free(cli);
	tls_auth_free(evil);
	tls_auth_free(distrust);
}

/* CPU seconds of the whole process (sender and receiver both live here). */
static double cpu_secs(void)
{
	struct rusage u;

	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
	       (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void test_bench_1g(void **state)
{
	const uint64_t size = 1ull << 30;
	uint64_t runs_env = 5;
	int runs;
	static const char *const names[] = {
		"raw sendfile -> splice", "raw sendfile -> recv+write",
		"nconn (copy: recv+crc+pwrite)", "nconn splice (+mmap crc)",
		"nconn over mutual TLS",
	};
	double r[5][16], cpu[5][16];
	uint32_t crc;

	(void)state;
	if (!getenv("MTCFS_NET_BENCH"))
		skip();
	if (getenv("MTCFS_NET_BENCH_RUNS") &&
	    util_parse_u64(getenv("MTCFS_NET_BENCH_RUNS"), 16, &runs_env) < 0)
		runs_env = 5;
	runs = runs_env ? (int)runs_env : 5;
	crc = make_file("bench.in", size);
	for (int i = 0; i < runs; i++) {
		/* interleaved, so drift hits every variant alike */
		for (int v = 0; v < 5; v++) {
			double c0 = cpu_secs();
			r[v][i] = v < 2 ? bench_raw(v, size)
				       : bench_nconn(v == 3 ? NCONN_RX_SPLICE : NCONN_RX_AUTO, size, crc,
						     v == 4);
			cpu[v][i] = cpu_secs() - c0;
		}
	}
	for (int v = 0; v < 5; v++) {
		qsort(r[v], (size_t)runs, sizeof(double), cmp_double);
		qsort(cpu[v], (size_t)runs, sizeof(double), cmp_double);
		print_message("  %-30s median %.2f GiB/s (min %.2f, max %.2f, %d runs), "
			      "%.2f CPU-s per GiB\n", names[v], r[v][runs / 2], r[v][0],
			      r[v][runs - 1], runs, cpu[v][runs / 2]);
	}
	unlinkat(tdirfd, "bench.in", 0);
	unlinkat(tdirfd, "bench.out", 0);
}

/* ======================= main ======================= */

static int group_setup(void **state)
{
	static const char *const bases[] = { "/dev/shm", "/tmp" };

	(void)state;
	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(tdir, sizeof(tdir), "%s/mtcfs-test-net-XXXXXX", bases[i]);
		if (mkdtemp(tdir))
			break;
		tdir[0] = '\0';
	}
	if (!tdir[0])
		return -1;
	tdirfd = open(tdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return tdirfd < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	close(tdirfd);
	return nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_auth_secret_file),
		cmocka_unit_test(test_auth_macs),
		cmocka_unit_test(test_handshake_no_secret),
		cmocka_unit_test(test_handshake_secret),
		cmocka_unit_test(test_wrong_secret),
		cmocka_unit_test(test_hostile_clients),
		cmocka_unit_test(test_connection_bounds),
		cmocka_unit_test(test_req_resp_events),
		cmocka_unit_test(test_output_queue_bound),
		cmocka_unit_test(test_1000_clients),
		cmocka_unit_test(test_file_transfer),
		cmocka_unit_test(test_sender_dies),
		cmocka_unit_test(test_data_cap),
		cmocka_unit_test(test_stop_live),
		cmocka_unit_test(test_addresses),
		cmocka_unit_test(test_tls_load_errors),
		cmocka_unit_test(test_tls),
		cmocka_unit_test(test_tls_send_timeout_is_final),
		cmocka_unit_test(test_bench_1g),
	};
	int rc;

	signal(SIGPIPE, SIG_DFL);   /* the code under test must not need SIG_IGN */
	if (getenv("MTCFS_NET_BENCH"))
		cmocka_set_test_filter("test_bench_1g");
	logcap_start();
	rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
	logcap_stop();
	return rc;
}
