/* server: a connection's input on the loop thread: the TLS handshake, the
 * HELLO handshake, frame reassembly, and the hand-off of authenticated data
 * connections to their own threads (see server_i.h). */
#include "net/server.h"
#include "net/server_i.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>

/* ---- data connections ---- */

static void dreg_unlink(struct nsrv *s, struct dreg *d)
{
	if (!d->linked)
		return;
	if (d->prev)
		d->prev->next = d->next;
	else
		s->dlist = d->next;
	if (d->next)
		d->next->prev = d->prev;
	d->linked = false;
	pthread_cond_broadcast(&s->data_cv);
}

/* nconn_close of a data connection: forget it before its fd closes. */
static void dreg_unreg(void *arg, struct nconn *c)
{
	struct dreg *d = arg;
	struct nsrv *s = d->s;

	pthread_mutex_lock(&s->mu);
	dreg_unlink(s, d);
	pthread_mutex_unlock(&s->mu);
}

static void *data_main(void *arg)
{
	struct dreg *d = arg;
	struct nsrv *s = d->s;

	pthread_setname_np(pthread_self(), "nsrv-data");
	s->ops.on_data(s->arg, d->c, d->rank);
	pthread_mutex_lock(&s->mu);
	if (d->linked) {
		/* on_data kept c: stop tracking it (its fd is its owner's now),
		 * unless a close is under way: then wait for its unregistration */
		if (nconn_unregister(d->c))
			dreg_unlink(s, d);
		while (d->linked)
			pthread_cond_wait(&s->data_cv, &s->mu);
	}
	s->ndata--;
	pthread_cond_broadcast(&s->data_cv);
	pthread_mutex_unlock(&s->mu);   /* s may be freed from here on */
	free(d);
	return NULL;
}

/* WELCOME is out: move the socket to its own thread. Always -1 (c gone). */
int srv_handoff(struct nsrv *s, struct sconn *c)
{
	struct dreg *d = calloc(1, sizeof(*d));
	struct nconn *nc = NULL;
	pthread_attr_t attr;
	int fd = c->fd, rc;

	if (!d) {
		srv_drop(s, c, true, "out of memory for a data connection");
		return -1;
	}
	d->s = s;
	d->rank = c->peer_rank;
	rc = nconn_from_fd(fd, c->ssl, c->peer_rank, c->addr, c->pre, c->prelen, dreg_unreg, d,
			   &nc);
	if (rc < 0) {
		free(d);
		srv_drop(s, c, true, "out of memory for a data connection");
		return -1;
	}
	d->c = nc;
	nconn_set_peer_sparse(nc, c->sparse);
	/* the socket is the nconn's now; the slot goes to the data thread */
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
	c->fd = -1;
	c->ssl = NULL;
	c->data_slot = false;
	srv_close_conn(s, c);
	nconn_tune_data_socket(fd);

	pthread_mutex_lock(&s->mu);
	d->linked = true;
	d->next = s->dlist;
	if (s->dlist)
		s->dlist->prev = d;
	s->dlist = d;
	pthread_mutex_unlock(&s->mu);

	log_dbg("net", "%s: data connection from rank %d", nconn_peer_addr(nc), d->rank);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&(pthread_t){ 0 }, &attr, data_main, d);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		log_err("net", "%s: cannot start a data connection thread: %s",
			nconn_peer_addr(nc), strerror(rc));
		nconn_close(nc);
		free(d);
		srv_release_data_slot(s);
	}
	return -1;
}

/* ---- input ---- */

static int hello_in(struct nsrv *s, struct sconn *c, const uint8_t *p)
{
	uint8_t nonce_c[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN], want[AUTH_MAC_LEN] = { 0 };
	char mac_hex[2 * AUTH_MAC_LEN + 1];
	const char *purpose;
	json_t *o = NULL, *w;
	int64_t rank;
	bool data;
	int rc = 0;

	if (net_json_decode(p, c->h.len, &o) < 0 ||
	    net_json_int(o, "rank", AUTH_RANK_TOOL, AUTH_RANK_MAX, &rank) < 0 ||
	    net_json_str(o, "purpose", 16, &purpose) < 0 ||
	    (strcmp(purpose, "control") != 0 && strcmp(purpose, "data") != 0) ||
	    net_json_hex(o, "nonce", nonce_c, sizeof(nonce_c)) < 0 ||
	    net_json_hex(o, "mac", mac, sizeof(mac)) < 0) {
		json_decref(o);
		srv_drop(s, c, true, "malformed HELLO");
		return -1;
	}
	data = purpose[0] == 'd';
	c->sparse = json_is_true(json_object_get(o, "sparse"));
	json_decref(o);

	if (s->auth.has_secret) {
		if (auth_hello_mac(&s->auth, c->nonce_s, nonce_c, (int)rank,
				   data ? "data" : "control", want) < 0 ||
		    !auth_mac_equal(want, mac)) {
			log_warn("net", "%s: authentication failed: bad HELLO MAC for rank %d "
				 "(different secret_file?)", c->addr, (int)rank);
			return srv_reject(s, c, EACCES, "authentication failed");
		}
		if (auth_welcome_mac(&s->auth, nonce_c, c->nonce_s, s->my_rank, want) < 0) {
			srv_drop(s, c, true, "cannot compute WELCOME MAC");
			return -1;
		}
	}
	c->peer_rank = (int)rank;
	/* a proven peer no longer counts against its address: a coordinator
	 * serves thousands of nodes, which may share one (NAT, loopback) */
	if (s->auth.has_secret || s->auth.tls)
		srv_addr_put(s, c);
	if (data) {
		int max = s->max_data;
		bool full;

		if (!s->ops.on_data) {
			log_warn("net", "%s: rank %d asked for a data connection: not served here",
				 c->addr, c->peer_rank);
			return srv_reject(s, c, EOPNOTSUPP, "data connections are not served");
		}
		pthread_mutex_lock(&s->mu);
		full = s->ndata >= max;
		if (!full)
			s->ndata++;
		pthread_mutex_unlock(&s->mu);
		if (full) {
			log_warn("net", "%s: refusing data connection of rank %d: %d running",
				 c->addr, c->peer_rank, max);
			return srv_reject(s, c, EBUSY, "too many data connections");
		}
		c->data_slot = true;
	}
	net_hex_encode(want, sizeof(want), mac_hex);
	w = json_pack("{s:i, s:s, s:b}", "rank", s->my_rank, "mac", mac_hex, "sparse", 1);
	rc = srv_enqueue_json(c, NT_WELCOME, 0, w);
	if (rc < 0) {
		srv_drop(s, c, true, "cannot queue WELCOME: %s", strerror(-rc));
		return -1;
	}
	if (data) {
		/* feed() keeps the bytes that follow, then flushes and hands off */
		c->handoff = true;
		return 0;
	}
	c->state = CS_CONTROL;
	srv_hs_done(s, c);
	srv_timed_clear(s, c);
	pthread_mutex_lock(&s->mu);
	c->authed = true;
	s->ncontrol++;
	pthread_mutex_unlock(&s->mu);
	nconn_tune_control_socket(c->fd);
	log_dbg("net", "%s: control connection %llu from rank %d", c->addr,
		(unsigned long long)c->id, c->peer_rank);
	return srv_flush(s, c);
}

/* A whole frame arrived (header in c->h, payload p, owned here). 0 while c
 * lives, -1 once it is gone. */
static int frame_in(struct nsrv *s, struct sconn *c, uint8_t *p)
{
	json_t *msg = NULL;
	int rc;

	if (net_payload_check(&c->h, p) < 0) {
		free(p);
		srv_drop(s, c, true, "%s frame: payload CRC mismatch", net_type_name(c->h.type));
		return -1;
	}
	if (c->state == CS_HELLO) {
		rc = hello_in(s, c, p);
		free(p);
		return rc;
	}
	switch (c->h.type) {
	case NT_REQ:
	case NT_EVENT:
	case NT_RESP:
	case NT_ERROR:
		rc = net_json_decode(p, c->h.len, &msg);
		free(p);
		if (rc < 0) {
			srv_drop(s, c, true, "malformed JSON in %s frame", net_type_name(c->h.type));
			return -1;
		}
		if (s->ops.on_msg)
			s->ops.on_msg(s->arg, c->id, c->peer_rank, c->h.type, c->h.req_id, msg);
		else
			json_decref(msg);
		return 0;
	default:
		free(p);
		srv_drop(s, c, true, "unexpected %s frame on a control connection",
		     net_type_name(c->h.type));
		return -1;
	}
}

/* Bytes from the socket. 0: go on reading; 1: c lives but stop reading
 * (handing off); -1: c is gone. */
static int feed(struct nsrv *s, struct sconn *c, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t k;
		int rc;

		if (c->state == CS_CLOSING)
			return 0;   /* discard: reading on keeps RST from eating our reply */
		if (!c->have_hdr) {
			k = NET_HDR_LEN - c->hhave;
			if (k > n)
				k = n;
			memcpy(c->hbuf + c->hhave, p, k);
			c->hhave += k;
			p += k;
			n -= k;
			if (c->hhave < NET_HDR_LEN)
				break;
			if (net_hdr_decode(c->hbuf, &c->h) < 0) {
				srv_drop(s, c, true, "bad frame header");
				return -1;
			}
			if (c->state == CS_HELLO && c->h.type != NT_HELLO) {
				srv_drop(s, c, true, "%s frame before authentication",
				     net_type_name(c->h.type));
				return -1;
			}
			if (c->state == CS_HELLO && c->h.len > HELLO_MAX_PAYLOAD) {
				srv_drop(s, c, true, "oversize HELLO (%u bytes)", c->h.len);
				return -1;
			}
			c->have_hdr = true;
			c->plhave = 0;
			if (c->h.len > 0) {
				c->pl = malloc(c->h.len);
				if (!c->pl) {
					srv_drop(s, c, true, "no memory for a %u-byte frame", c->h.len);
					return -1;
				}
			}
		}
		k = c->h.len - c->plhave;
		if (k > n)
			k = n;
		if (k) {
			memcpy(c->pl + c->plhave, p, k);
			c->plhave += k;
			p += k;
			n -= k;
		}
		if (c->plhave < c->h.len)
			break;
		{
			uint8_t *pl = c->pl;
			c->pl = NULL;
			c->have_hdr = false;
			c->hhave = 0;
			rc = frame_in(s, c, pl);
		}
		if (rc < 0)
			return -1;
		if (c->handoff) {
			/* a data HELLO: what follows belongs to the data thread */
			if (n > 0) {
				c->pre = malloc(n);
				if (!c->pre) {
					srv_drop(s, c, true, "out of memory");
					return -1;
				}
				memcpy(c->pre, p, n);
				c->prelen = n;
			}
			return srv_flush(s, c) < 0 ? -1 : 1;
		}
	}
	return 0;
}

/* Server side of the TLS handshake, one step. When it completes, the
 * queued CHALLENGE goes out. 0 while c lives, -1 once it is gone. */
int srv_tls_step(struct nsrv *s, struct sconn *c)
{
	short want = POLLIN;
	char why[256];
	int rc = net_tls_handshake(c->ssl, &want);

	if (rc == -EAGAIN) {
		c->tls_hs_out = want == POLLOUT;
		srv_set_events(s, c);
		return 0;
	}
	if (rc < 0) {
		/* a probe that connects and leaves is not news; a refused
		 * certificate is */
		srv_drop(s, c, rc == -EPROTO, "TLS handshake failed: %s",
		     net_tls_why(c->ssl, why, sizeof(why)));
		return -1;
	}
	c->tls_hs = false;
	c->tls_hs_out = false;
	return srv_flush(s, c);
}

/* One read from the socket, through TLS when it is on: > 0 bytes, 0 end
 * of stream, -EAGAIN (nothing now), other -errno. */
static ssize_t srv_recv(struct sconn *c, void *buf, size_t len)
{
	ssize_t n;

	if (c->ssl) {
		short want = POLLIN;
		n = net_tls_read(c->ssl, buf, len, &want);
		if (n == -EAGAIN)
			c->rd_wants_out = want == POLLOUT;
		return n;
	}
	do
		n = recv(c->fd, buf, len, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return n;
}

int srv_on_readable(struct nsrv *s, struct sconn *c)
{
	if (c->tls_hs) {
		if (srv_tls_step(s, c) < 0)
			return -1;
		if (c->tls_hs)
			return 0;
	}
	/* TLS may hold decrypted bytes the socket no longer signals: drain them */
	for (int i = 0; i < READS_PER_EVENT || (c->ssl && SSL_pending(c->ssl) > 0); i++) {
		ssize_t n = srv_recv(c, s->scratch, SCRATCH_SZ);
		int rc;

		if (n > 0) {
			c->got_bytes = true;
			rc = feed(s, c, s->scratch, (size_t)n);
			if (rc < 0)
				return -1;
			if (rc > 0) {
				srv_set_events(s, c);
				return 0;
			}
			if ((size_t)n < SCRATCH_SZ && !(c->ssl && SSL_pending(c->ssl) > 0))
				return 0;
			continue;
		}
		if (n == 0) {
			if (c->state == CS_CLOSING)
				srv_close_conn(s, c);
			else if (c->state == CS_HELLO)
				srv_drop(s, c, c->got_bytes, "peer closed during the handshake");
			else
				srv_drop(s, c, false, "peer closed the connection");
			return -1;
		}
		if (n == -EAGAIN) {
			if (c->rd_wants_out)
				srv_set_events(s, c);   /* TLS: wait for room to write */
			return 0;
		}
		/* a reset before the peer said anything: a port probe, not news */
		if (c->ssl) {
			char why[256];
			srv_drop(s, c, c->state == CS_HELLO && c->got_bytes, "TLS recv: %s",
			     net_tls_why(c->ssl, why, sizeof(why)));
		} else {
			srv_drop(s, c, c->state == CS_HELLO && c->got_bytes, "recv: %s",
			     strerror((int)-n));
		}
		return -1;
	}
	return 0;
}
