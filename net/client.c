/* client.c — see client.h: sockets, framed send/receive, the client's
 * handshake, connect and close. NT_FILE bodies are client_file.c's. */
#include "net/client_i.h"
#include "net/tls.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HANDSHAKE_MAX_PAYLOAD 4096u
#define DATA_SOCKBUF (4 << 20)

/* ---- small helpers ---- */

uint64_t nconn_deadline_after(int ms)
{
	return ms < 0 ? UINT64_MAX : util_now_ns() + (uint64_t)ms * 1000000u;
}

/* Wait until fd is ready for ev or the deadline passes: 0 (ready, or an
 * error the next I/O call will report), -ETIMEDOUT, -errno. */
int nconn_wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = ev };
		int to = -1, n;

		if (deadline != UINT64_MAX) {
			uint64_t now = util_now_ns();
			if (now >= deadline)
				return -ETIMEDOUT;
			uint64_t ms = (deadline - now + 999999u) / 1000000u;
			to = ms > INT_MAX ? INT_MAX : (int)ms;
		}
		n = poll(&p, 1, to);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n > 0)
			return 0;
	}
}

void nconn_tune_control_socket(int fd)
{
	int one = 1, idle = 30, intvl = 10, cnt = 3;
	unsigned int user_to = 60000;

	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	/* unacknowledged data to a dead peer fails in a minute, not in 15 */
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_to, sizeof(user_to));
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void nconn_tune_data_socket(int fd)
{
	int sz = DATA_SOCKBUF;

	set_nodelay(fd);
	nconn_tune_control_socket(fd);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static void fmt_addr(const struct sockaddr *sa, char *out, size_t outlen)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		port = ntohs(s4->sin_port);
		snprintf(out, outlen, "%s:%u", host, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		port = ntohs(s6->sin6_port);
		snprintf(out, outlen, "[%s]:%u", host, port);
	} else {
		snprintf(out, outlen, "?");
	}
}

static struct nconn *conn_new(int fd)
{
	struct nconn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->fd = fd;
	c->peer_rank = AUTH_RANK_TOOL;
	c->pipefd[0] = c->pipefd[1] = -1;
	c->io_timeout_ms = NCONN_IO_TIMEOUT_MS;
	c->next_req = 1;
	pthread_mutex_init(&c->send_mu, NULL);
	pthread_mutex_init(&c->ssl_mu, NULL);
	return c;
}

/* A TLS call failed (ssl_mu held): keep the first reason; log it unless
 * nconn_connect will. */
static void tls_failure(struct nconn *c)
{
	if (c->tls_failed)
		return;
	net_tls_why(c->ssl, c->tls_why, sizeof(c->tls_why));
	c->tls_failed = true;
	if (!c->connecting)
		log_warn("net", "%s: TLS: %s", c->addr, c->tls_why);
}

/* One non-blocking read or write, plain or through TLS: > 0 bytes moved,
 * 0 end of stream (reads), -EAGAIN with *want the poll event to wait for,
 * other -errno. */
ssize_t nconn_io_recv(struct nconn *c, void *buf, size_t len, short *want)
{
	ssize_t n;

	if (c->ssl) {
		pthread_mutex_lock(&c->ssl_mu);
		n = net_tls_read(c->ssl, buf, len, want);
		if (n == -EPROTO)
			tls_failure(c);
		pthread_mutex_unlock(&c->ssl_mu);
		return n;
	}
	for (;;) {
		n = recv(c->fd, buf, len, MSG_DONTWAIT);
		if (n >= 0)
			return n;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			*want = POLLIN;
			return -EAGAIN;
		}
		return -errno;
	}
}

static ssize_t io_send(struct nconn *c, const void *buf, size_t len, short *want)
{
	ssize_t n;

	if (c->ssl) {
		pthread_mutex_lock(&c->ssl_mu);
		n = net_tls_write(c->ssl, buf, len, want);
		if (n == -EPROTO)
			tls_failure(c);
		pthread_mutex_unlock(&c->ssl_mu);
		return n;
	}
	for (;;) {
		n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n >= 0)
			return n;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			*want = POLLOUT;
			return -EAGAIN;
		}
		return -errno;
	}
}

int nconn_fd(const struct nconn *c)
{
	return c->fd;
}

int nconn_peer_rank(const struct nconn *c)
{
	return c->peer_rank;
}

const char *nconn_peer_addr(const struct nconn *c)
{
	return c->addr;
}

void nconn_set_io_timeout(struct nconn *c, int ms)
{
	c->io_timeout_ms = ms;
}

/* ---- sending ---- */

/* Write all of buf; each wait for room is bounded by the io timeout.
 * *sent tells how far it got. Caller holds send_mu. */
int nconn_write_all(struct nconn *c, const uint8_t *buf, size_t len, size_t *sent)
{
	size_t done = 0;
	int rc = 0;

	while (done < len) {
		short want = POLLOUT;
		ssize_t n = io_send(c, buf + done, len - done, &want);
		if (n >= 0) {
			done += (size_t)n;
			continue;
		}
		if (n == -EAGAIN) {
			rc = nconn_wait_fd(c->fd, want, nconn_deadline_after(c->io_timeout_ms));
			if (rc < 0)
				break;
			continue;
		}
		rc = (int)n;
		break;
	}
	*sent = done;
	return rc;
}

/* Send a built frame; the connection fails for good unless nothing of it
 * left (on plain TCP a timeout with zero bytes written keeps the stream in
 * sync; with TLS any failure is final). */
int nconn_send_frame_locked(struct nconn *c, const uint8_t *frame, size_t len)
{
	size_t sent = 0;
	int rc;

	if (c->send_err)
		return c->send_err;
	rc = nconn_write_all(c, frame, len, &sent);
	/* TLS: a WANT_WRITE leaves a record of this frame inside SSL, which
	 * would go out at the head of the next frame: no second chance there */
	if (rc < 0 && (sent > 0 || rc != -ETIMEDOUT || c->ssl))
		c->send_err = rc;
	return rc;
}

static int send_frame(struct nconn *c, const uint8_t *frame, size_t len)
{
	int rc;

	pthread_mutex_lock(&c->send_mu);
	rc = nconn_send_frame_locked(c, frame, len);
	pthread_mutex_unlock(&c->send_mu);
	return rc;
}

int nconn_send(struct nconn *c, uint8_t type, uint32_t req_id, json_t *msg)
{
	uint8_t *frame = NULL;
	size_t len;
	int rc;

	rc = net_frame_build(type, req_id, msg, &frame, &len);
	if (rc < 0)
		return rc;
	rc = send_frame(c, frame, len);
	free(frame);
	return rc;
}

int nconn_send_raw(struct nconn *c, uint8_t type, uint32_t req_id, const void *p,
		   uint32_t len)
{
	uint8_t *frame = NULL;
	size_t flen;
	int rc;

	rc = net_frame_build_raw(type, req_id, p, len, &frame, &flen);
	if (rc < 0)
		return rc;
	rc = send_frame(c, frame, flen);
	free(frame);
	return rc;
}


/* ---- receiving ---- */

/* Read exactly len bytes (read-ahead first). *got tells how far it got. */
int nconn_read_exact(struct nconn *c, uint8_t *buf, size_t len, uint64_t deadline,
		      size_t *got)
{
	size_t done = 0;
	int rc = 0;

	if (c->pre_off < c->pre_len) {
		size_t k = c->pre_len - c->pre_off;
		if (k > len)
			k = len;
		memcpy(buf, c->pre + c->pre_off, k);
		c->pre_off += k;
		done = k;
	}
	while (done < len) {
		short want = POLLIN;
		ssize_t n = nconn_io_recv(c, buf + done, len - done, &want);
		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n == 0) {
			rc = -ECONNRESET;
			break;
		}
		if (n == -EAGAIN) {
			rc = nconn_wait_fd(c->fd, want, deadline);
			if (rc < 0)
				break;
			continue;
		}
		rc = (int)n;
		break;
	}
	*got = done;
	return rc;
}

/* Read one whole frame, payload of at most max_len bytes (NULL when empty).
 * Only a timeout before its first byte leaves the connection usable. */
static int recv_frame(struct nconn *c, int timeout_ms, uint32_t max_len,
		      struct net_hdr *h, uint8_t **payload)
{
	uint64_t deadline = nconn_deadline_after(timeout_ms);
	uint8_t hb[NET_HDR_LEN], *p = NULL;
	size_t got = 0;
	int rc;

	*payload = NULL;
	if (c->recv_err)
		return c->recv_err;
	if (c->file_pending)
		return -EPROTO;
	rc = nconn_read_exact(c, hb, sizeof(hb), deadline, &got);
	if (rc < 0) {
		if (got > 0 || rc != -ETIMEDOUT)
			c->recv_err = rc;
		return rc;
	}
	rc = net_hdr_decode(hb, h);
	if (rc == 0 && h->len > max_len)
		rc = -EBADMSG;
	if (rc < 0)
		goto fail;
	if (h->len > 0) {
		p = malloc(h->len);
		if (!p) {
			rc = -ENOMEM;
			goto fail;
		}
		rc = nconn_read_exact(c, p, h->len, deadline, &got);
		if (rc < 0)
			goto fail;
	}
	rc = net_payload_check(h, p);
	if (rc < 0)
		goto fail;
	*payload = p;
	return 0;
fail:
	free(p);
	c->recv_err = rc;
	return rc;
}

int nconn_recv_raw(struct nconn *c, int timeout_ms, struct net_hdr *h, uint8_t **payload)
{
	return recv_frame(c, timeout_ms, NET_MAX_PAYLOAD, h, payload);
}

int nconn_recv(struct nconn *c, int timeout_ms, struct net_hdr *h, json_t **msg)
{
	uint8_t *p = NULL;
	uint64_t size;
	json_t *o = NULL;
	int rc;

	*msg = NULL;
	rc = recv_frame(c, timeout_ms, NET_MAX_PAYLOAD, h, &p);
	if (rc < 0)
		return rc;
	if (h->type == NT_CHALLENGE) {
		rc = -EPROTO;
		goto out;
	}
	rc = net_json_decode(p, h->len, &o);
	if (rc < 0) {
		if (h->type == NT_FILE)
			c->recv_err = rc;   /* cannot know how many raw bytes follow */
		goto out;
	}
	if (h->type == NT_FILE) {
		if (net_json_u64(o, "size", NET_FILE_MAX, &size) < 0 ||
		    net_file_hdr_data(o, size, &c->file_sparse, &c->file_data) < 0) {
			rc = c->recv_err = -EBADMSG;
			json_decref(o);
			goto out;
		}
		c->file_pending = true;
		c->file_left = size;
	}
	*msg = o;
out:
	free(p);
	return rc;
}

int nconn_call(struct nconn *c, json_t *req, json_t **resp, int timeout_ms)
{
	uint64_t deadline = nconn_deadline_after(timeout_ms);
	struct net_hdr h;
	json_t *m = NULL;
	uint32_t id;
	int rc;

	*resp = NULL;
	do
		id = atomic_fetch_add(&c->next_req, 1);
	while (id == 0);
	rc = nconn_send(c, NT_REQ, id, req);
	if (rc < 0)
		return rc;
	for (;;) {
		int left = -1;
		if (deadline != UINT64_MAX) {
			uint64_t now = util_now_ns();
			if (now >= deadline)
				return -ETIMEDOUT;
			left = (int)((deadline - now + 999999u) / 1000000u);
		}
		rc = nconn_recv(c, left, &h, &m);
		if (rc < 0)
			return rc;
		if (h.type == NT_RESP && h.req_id == id) {
			*resp = m;
			return 0;
		}
		if (h.type == NT_ERROR && (h.req_id == id || h.req_id == 0)) {
			*resp = m;
			return net_error_errno(m);
		}
		log_warn("net", "%s: expected RESP %u, got %s %u", c->addr, id,
			 net_type_name(h.type), h.req_id);
		json_decref(m);
		if (h.type == NT_FILE)
			c->recv_err = -EPROTO;   /* its raw bytes are not ours to take */
		return -EPROTO;
	}
}

/* ---- connecting ---- */

static int gai_errno(int e)
{
	switch (e) {
	case EAI_SYSTEM:
		return errno ? -errno : -EIO;
	case EAI_MEMORY:
		return -ENOMEM;
	case EAI_AGAIN:
		return -EAGAIN;
	default:
		return -EHOSTUNREACH;
	}
}

static int connect_one(const struct addrinfo *ai, bool data, uint64_t deadline, int *fd_out)
{
	socklen_t elen = sizeof(int);
	int fd, err = 0, rc;

	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (data)
		nconn_tune_data_socket(fd);   /* before connect: window scaling */
	else
		set_nodelay(fd);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			rc = -errno;
			goto fail;
		}
		rc = nconn_wait_fd(fd, POLLOUT, deadline);
		if (rc < 0)
			goto fail;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0) {
			rc = -errno;
			goto fail;
		}
		if (err) {
			rc = -err;
			goto fail;
		}
	}
	nconn_tune_control_socket(fd);
	*fd_out = fd;
	return 0;
fail:
	close(fd);
	return rc;
}

static int ms_left(uint64_t deadline)
{
	uint64_t now = util_now_ns();

	return now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
}

/* Handshake reply that is not the expected frame: the server's NT_ERROR
 * carries the reason (EACCES, EBUSY); anything else is not our protocol. */
static int unexpected(struct nconn *c, const struct net_hdr *h, const uint8_t *p,
		      const char *want)
{
	json_t *o = NULL;
	const char *why = "?";
	int rc = -EPROTO;

	if (h->type == NT_ERROR && net_json_decode(p, h->len, &o) == 0) {
		rc = net_error_errno(o);
		net_json_str(o, "error", 256, &why);
		log_warn("net", "%s: refused by peer: %s", c->addr, why);
		json_decref(o);
		return rc;
	}
	log_warn("net", "%s: expected %s, got %s frame", c->addr, want, net_type_name(h->type));
	return rc;
}

static int client_handshake(struct nconn *c, int my_rank, const char *purpose,
			    const struct net_auth *auth, uint64_t deadline)
{
	uint8_t nonce_s[AUTH_NONCE_LEN], nonce_c[AUTH_NONCE_LEN];
	uint8_t mac[AUTH_MAC_LEN] = { 0 }, smac[AUTH_MAC_LEN], want[AUTH_MAC_LEN];
	char nc_hex[2 * AUTH_NONCE_LEN + 1], mac_hex[2 * AUTH_MAC_LEN + 1];
	bool secret = auth && auth->has_secret;
	json_t *hello = NULL, *w = NULL;
	uint8_t *p = NULL;
	struct net_hdr h;
	int64_t srank;
	int rc;

	rc = recv_frame(c, ms_left(deadline), HANDSHAKE_MAX_PAYLOAD, &h, &p);
	if (rc == -ETIMEDOUT && !c->ssl)
		log_warn("net", "%s: no CHALLENGE before the deadline (a peer that expects TLS, "
			 "tls_*, while this node has none?)", c->addr);
	if (rc < 0)
		goto out;
	if (h.type != NT_CHALLENGE || h.len != AUTH_NONCE_LEN) {
		rc = unexpected(c, &h, p, "CHALLENGE");
		goto out;
	}
	memcpy(nonce_s, p, AUTH_NONCE_LEN);
	free(p);
	p = NULL;

	rc = auth_nonce(nonce_c);
	if (rc < 0)
		goto out;
	if (secret) {
		rc = auth_hello_mac(auth, nonce_s, nonce_c, my_rank, purpose, mac);
		if (rc < 0)
			goto out;
	}
	net_hex_encode(nonce_c, sizeof(nonce_c), nc_hex);
	net_hex_encode(mac, sizeof(mac), mac_hex);
	/* "sparse": we take sparse NT_FILEs (not covered by the MAC: a
	 * man in the middle could only strip it, and dense files are fine) */
	hello = json_pack("{s:i, s:s, s:s, s:s, s:b}", "rank", my_rank, "purpose", purpose,
			  "nonce", nc_hex, "mac", mac_hex, "sparse", 1);
	if (!hello) {
		rc = -ENOMEM;
		goto out;
	}
	rc = nconn_send(c, NT_HELLO, 0, hello);
	if (rc < 0)
		goto out;

	rc = recv_frame(c, ms_left(deadline), HANDSHAKE_MAX_PAYLOAD, &h, &p);
	if (rc < 0)
		goto out;
	if (h.type != NT_WELCOME) {
		rc = unexpected(c, &h, p, "WELCOME");
		goto out;
	}
	if (net_json_decode(p, h.len, &w) < 0 ||
	    net_json_int(w, "rank", AUTH_RANK_TOOL, AUTH_RANK_MAX, &srank) < 0 ||
	    net_json_hex(w, "mac", smac, sizeof(smac)) < 0) {
		log_warn("net", "%s: malformed WELCOME", c->addr);
		rc = -EBADMSG;
		goto out;
	}
	if (secret) {
		rc = auth_welcome_mac(auth, nonce_c, nonce_s, (int)srank, want);
		if (rc < 0)
			goto out;
		if (!auth_mac_equal(want, smac)) {
			log_warn("net", "%s: peer failed authentication (wrong or missing secret_file?)",
				 c->addr);
			rc = -EACCES;
			goto out;
		}
	}
	c->peer_rank = (int)srank;
	c->peer_sparse = json_is_true(json_object_get(w, "sparse"));
	rc = 0;
out:
	json_decref(hello);
	json_decref(w);
	free(p);
	return rc;
}

/* TLS client handshake within the deadline; a certificate either side
 * refuses is an authentication failure (-EACCES). */
static int tls_connect(struct nconn *c, struct ssl_ctx_st *ctx, uint64_t deadline)
{
	char why[256];
	int rc;

	c->ssl = net_tls_new(ctx, c->fd, 0);
	if (!c->ssl)
		return -ENOMEM;
	for (;;) {
		short want = POLLIN;
		rc = net_tls_handshake(c->ssl, &want);
		if (rc > 0)
			return 0;
		if (rc != -EAGAIN)
			break;
		rc = nconn_wait_fd(c->fd, want, deadline);
		if (rc < 0) {
			log_warn("net", "%s: TLS handshake timed out", c->addr);
			return rc;
		}
	}
	if (rc == -EPROTO) {
		log_warn("net", "%s: TLS handshake failed: %s (a peer without tls_*, or a "
			 "certificate not signed by tls_ca?)", c->addr,
			 net_tls_why(c->ssl, why, sizeof(why)));
		return -EACCES;
	}
	log_warn("net", "%s: TLS handshake: %s", c->addr, net_tls_why(c->ssl, why, sizeof(why)));
	return rc;
}

int nconn_connect(const char *hostport, int my_rank, const char *purpose,
		  const struct net_auth *auth, int timeout_ms, struct nconn **out,
		  int *peer_rank_out)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *res = NULL, *ai;
	char host[256], port_s[8];
	uint64_t deadline;
	struct nconn *c = NULL;
	uint16_t port;
	bool data;
	int fd = -1, rc, grc;

	*out = NULL;
	if (!purpose || my_rank < AUTH_RANK_TOOL || my_rank > AUTH_RANK_MAX || timeout_ms <= 0)
		return -EINVAL;
	if (strcmp(purpose, "data") == 0)
		data = true;
	else if (strcmp(purpose, "control") == 0)
		data = false;
	else
		return -EINVAL;
	if (net_split_hostport(hostport, host, sizeof(host), &port, false) < 0 || !host[0])
		return -EINVAL;
	deadline = nconn_deadline_after(timeout_ms);
	snprintf(port_s, sizeof(port_s), "%u", port);
	grc = getaddrinfo(host, port_s, &hints, &res);
	if (grc != 0) {
		rc = gai_errno(grc);
		log_warn("net", "%s: %s", hostport, gai_strerror(grc));
		return rc;
	}
	rc = -EHOSTUNREACH;
	for (ai = res; ai; ai = ai->ai_next) {
		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		rc = connect_one(ai, data, deadline, &fd);
		if (rc == 0)
			break;
		if (rc == -ETIMEDOUT)
			break;
	}
	if (rc < 0)
		goto out;
	c = conn_new(fd);
	if (!c) {
		close(fd);
		rc = -ENOMEM;
		goto out;
	}
	fmt_addr(ai->ai_addr, c->addr, sizeof(c->addr));
	if (auth && auth->tls) {
		rc = tls_connect(c, auth->tls, deadline);
		if (rc < 0)
			goto out;
	}
	c->connecting = true;
	rc = client_handshake(c, my_rank, purpose, auth, deadline);
	c->connecting = false;
	if (rc < 0 && c->tls_failed) {
		/* TLS 1.3: the server judges our certificate after our side of
		 * the handshake is done; its verdict comes as an alert here */
		log_warn("net", "%s: TLS handshake failed: the peer refused this node: %s "
			 "(a certificate not signed by its tls_ca?)", c->addr, c->tls_why);
		rc = -EACCES;
	}
	if (rc < 0)
		goto out;
	if (peer_rank_out)
		*peer_rank_out = c->peer_rank;
	*out = c;
	c = NULL;
out:
	nconn_close(c);
	if (res)
		freeaddrinfo(res);
	return rc;
}

int nconn_from_fd(int fd, struct ssl_st *ssl, int peer_rank, const char *peer_addr,
		  const void *pre, size_t prelen, void (*unreg_fn)(void *, struct nconn *),
		  void *unreg_arg, struct nconn **out)
{
	struct nconn *c = conn_new(fd);
	int fl;

	if (!c)
		return -ENOMEM;
	if (prelen > 0) {
		c->pre = malloc(prelen);
		if (!c->pre) {
			pthread_mutex_destroy(&c->send_mu);
			pthread_mutex_destroy(&c->ssl_mu);
			free(c);
			return -ENOMEM;
		}
		memcpy(c->pre, pre, prelen);
		c->pre_len = prelen;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	c->ssl = ssl;
	c->peer_rank = peer_rank;
	snprintf(c->addr, sizeof(c->addr), "%s", peer_addr ? peer_addr : "?");
	c->unreg_fn = unreg_fn;
	c->unreg_arg = unreg_fn ? unreg_arg : NULL;
	*out = c;
	return 0;
}

void nconn_set_peer_sparse(struct nconn *c, bool yes)
{
	c->peer_sparse = yes;
}

uint64_t nconn_file_data(const struct nconn *c)
{
	return c->file_sparse ? c->file_data : c->file_left;
}

bool nconn_unregister(struct nconn *c)
{
	return atomic_exchange(&c->unreg_arg, NULL) != NULL;
}

void nconn_shutdown(struct nconn *c)
{
	if (c && c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
}

void nconn_close(struct nconn *c)
{
	void *reg;

	if (!c)
		return;
	reg = atomic_exchange(&c->unreg_arg, NULL);
	if (reg)
		c->unreg_fn(reg, c);
	net_tls_close(c->ssl);
	if (c->fd >= 0)
		close(c->fd);
	nconn_pipe_drop(c);
	free(c->pre);
	free(c->rxbuf);
	pthread_mutex_destroy(&c->send_mu);
	pthread_mutex_destroy(&c->ssl_mu);
	free(c);
}
