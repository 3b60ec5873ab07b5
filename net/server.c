#include "net/server.h"
#include "net/tls.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAX_PAYLOAD 4096u
#define SCRATCH_SZ        (64u << 10)
#define READS_PER_EVENT   4           /* then let the other connections run */
#define ACCEPTS_PER_EVENT 256
#define CLOSE_LINGER_MS   2000
#define SWEEP_MS          100
#define HASH_BUCKETS      (1u << 14)
#define MAX_EVENTS        256
#define IOV_BATCH         64
#define ADDR_BUCKETS      (1u << 12)
#define FD_RESERVE_MIN    64          /* beyond half the limit, for FUSE and the tiers */

/* Connections counted against one peer address (the IP, port ignored;
 * IPv4 as its v4-mapped v6 form). Loop thread only. */
struct addrent {
	struct addrent *next;
	uint8_t ip[16];
	uint32_t n;
};

struct obuf {
	struct obuf *next;
	size_t len;
	uint8_t *data;      /* a whole frame from net_frame_build */
};

enum cstate {
	CS_HELLO,           /* CHALLENGE sent, waiting for HELLO (or handing off) */
	CS_CONTROL,         /* authenticated control connection */
	CS_CLOSING,         /* flushing output, then close; input discarded */
};

struct sconn {
	uint64_t id;
	int fd;
	int peer_rank;
	char addr[INET6_ADDRSTRLEN + 8];
	struct sconn *hnext;        /* id hash chain; protected by mu */
	bool authed;                /* a control connection: on_close owed; protected by mu */
	struct addrent *ae;         /* loop: counted against its address while set */

	/* protected by mu: what other threads hand to the loop */
	struct obuf *pend_head, *pend_tail;
	size_t pend_bytes;
	bool close_req, overflow, in_dirty;
	struct sconn *dnext;

	/* loop thread only */
	enum cstate state;
	bool in_hs;                 /* counted in nsrv.nhs */
	bool data_slot;             /* holds one of the max_data slots */
	bool handoff;               /* data: hand over once WELCOME is written */
	bool sparse;                /* its HELLO said it takes sparse NT_FILEs */
	bool got_bytes;
	uint8_t nonce_s[AUTH_NONCE_LEN];
	uint64_t deadline_ns;       /* when timed */
	bool timed;
	struct sconn *tprev, *tnext;
	struct sconn *lnext;        /* batch link in process_dirty */
	uint32_t events;            /* current epoll interest */
	uint8_t hbuf[NET_HDR_LEN];
	size_t hhave;
	bool have_hdr;
	struct net_hdr h;
	uint8_t *pl;
	size_t plhave;
	struct obuf *out_head, *out_tail;
	size_t out_off, out_bytes;
	uint8_t *pre;               /* bytes read past a data HELLO */
	size_t prelen;
	/* mutual TLS: the session wraps every byte; until tls_hs is done
	 * nothing of the protocol (not even CHALLENGE) is written */
	SSL *ssl;
	bool tls_hs;                /* handshake under way */
	bool tls_hs_out;            /* ... and it waits for room to write */
	bool rd_wants_out;          /* SSL_read needs the socket writable */
	bool wr_wants_in;           /* SSL_write needs the socket readable */
};

/* A running data connection, for nsrv_stop to shut its socket down. */
struct dreg {
	struct nsrv *s;
	struct nconn *c;
	int rank;
	bool linked;                /* protected by mu */
	struct dreg *prev, *next;   /* protected by mu */
};

struct nsrv {
	int lfd, epfd, evfd;
	int port;
	int my_rank;
	struct net_auth auth;
	struct nsrv_ops ops;
	void *arg;
	pthread_t thr;
	_Atomic bool stop;
	_Atomic int hs_timeout_ms;
	_Atomic int max_data;

	pthread_mutex_t mu;         /* leaf lock; never held across callbacks */
	pthread_cond_t data_cv;     /* a data slot or registration went away */
	struct sconn **tab;         /* id -> conn; protected by mu */
	struct sconn *dirty;        /* conns with queued frames or requests; protected by mu */
	bool wake_pending;          /* an eventfd write is on its way; protected by mu */
	int ndata;                  /* data slots taken; protected by mu */
	struct dreg *dlist;         /* protected by mu */
	size_t ncontrol;            /* protected by mu */

	/* loop thread only */
	struct sconn *thead;        /* connections with a deadline */
	uint64_t next_id;
	size_t nhs;
	uint64_t next_sweep;
	bool accept_paused;
	uint64_t accept_resume;
	uint64_t last_refuse_log;
	size_t nconns;              /* struct sconn alive (data threads are in ndata) */
	size_t max_conns;           /* nconns + ndata bound, from RLIMIT_NOFILE */
	_Atomic int max_per_addr;
	struct addrent **atab;      /* per-address counts */
	uint64_t refused_since_log; /* refused by the bounds since the last log line */
	const char *refused_why;    /* the last refusal's reason (a literal) */
	char refused_from[INET6_ADDRSTRLEN + 8];
	_Atomic uint64_t refused;   /* refused by the bounds, ever */
	uint8_t scratch[SCRATCH_SZ];
};

static __thread struct nsrv *tl_loop;   /* set on the loop thread */

static void fmt_addr(const struct sockaddr *sa, char *out, size_t outlen)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(out, outlen, "%s:%u", host, ntohs(s4->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(out, outlen, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else {
		snprintf(out, outlen, "?");
	}
}

/* ---- id table and dirty list (mu held) ---- */

static struct sconn **bucket(struct nsrv *s, uint64_t id)
{
	return &s->tab[id & (HASH_BUCKETS - 1)];
}

static struct sconn *lookup(struct nsrv *s, uint64_t id)
{
	struct sconn *c;

	for (c = *bucket(s, id); c; c = c->hnext)
		if (c->id == id)
			return c;
	return NULL;
}

static void unhash(struct nsrv *s, struct sconn *c)
{
	struct sconn **pp;

	for (pp = bucket(s, c->id); *pp; pp = &(*pp)->hnext) {
		if (*pp == c) {
			*pp = c->hnext;
			return;
		}
	}
}

static void mark_dirty(struct nsrv *s, struct sconn *c)
{
	if (c->in_dirty)
		return;
	c->in_dirty = true;
	c->dnext = s->dirty;
	s->dirty = c;
}

static void undirty(struct nsrv *s, struct sconn *c)
{
	struct sconn **pp;

	if (!c->in_dirty)
		return;
	for (pp = &s->dirty; *pp; pp = &(*pp)->dnext) {
		if (*pp == c) {
			*pp = c->dnext;
			break;
		}
	}
	c->in_dirty = false;
}

static void wake(struct nsrv *s)
{
	uint64_t one = 1;

	if (write(s->evfd, &one, sizeof(one)) < 0) {
		/* counter saturated or closed: the loop is awake or gone */
	}
}

/* ---- timed list (loop) ---- */

static void timed_set(struct nsrv *s, struct sconn *c, uint64_t deadline)
{
	c->deadline_ns = deadline;
	if (c->timed)
		return;
	c->timed = true;
	c->tprev = NULL;
	c->tnext = s->thead;
	if (s->thead)
		s->thead->tprev = c;
	s->thead = c;
}

static void timed_clear(struct nsrv *s, struct sconn *c)
{
	if (!c->timed)
		return;
	if (c->tprev)
		c->tprev->tnext = c->tnext;
	else
		s->thead = c->tnext;
	if (c->tnext)
		c->tnext->tprev = c->tprev;
	c->timed = false;
	c->tprev = c->tnext = NULL;
}

static void hs_done(struct nsrv *s, struct sconn *c)
{
	if (c->in_hs) {
		c->in_hs = false;
		s->nhs--;
	}
}

static void release_data_slot(struct nsrv *s)
{
	pthread_mutex_lock(&s->mu);
	s->ndata--;
	pthread_cond_broadcast(&s->data_cv);
	pthread_mutex_unlock(&s->mu);
}

static void free_obufs(struct obuf *o)
{
	while (o) {
		struct obuf *n = o->next;
		free(o->data);
		free(o);
		o = n;
	}
}

/* ---- connections per address (loop) ---- */

static void addr_key(const struct sockaddr *sa, uint8_t ip[16])
{
	memset(ip, 0, 16);
	if (sa->sa_family == AF_INET) {
		ip[10] = ip[11] = 0xff;
		memcpy(ip + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(ip, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
	}
}

static struct addrent **addr_slot(struct nsrv *s, const uint8_t ip[16])
{
	uint32_t h = 2166136261u;   /* FNV-1a */
	struct addrent **pp;

	for (int i = 0; i < 16; i++)
		h = (h ^ ip[i]) * 16777619u;
	for (pp = &s->atab[h & (ADDR_BUCKETS - 1)]; *pp; pp = &(*pp)->next)
		if (!memcmp((*pp)->ip, ip, 16))
			break;
	return pp;
}

static void addr_unref(struct nsrv *s, struct addrent *e)
{
	struct addrent **pp;

	if (!e || --e->n > 0)
		return;
	pp = addr_slot(s, e->ip);
	*pp = e->next;
	free(e);
}

/* Stop counting c against its address (it proved the secret, or closed). */
static void addr_put(struct nsrv *s, struct sconn *c)
{
	addr_unref(s, c->ae);
	c->ae = NULL;
}

/* May one more connection from sa be served? NULL and *out = its address
 * entry (counted) when it may; else why not. The total keeps a reserve of
 * file descriptors for FUSE and the tiers: without it, a flood of
 * connections (every one passes HELLO when there is no secret) made every
 * open() of the mount fail with EMFILE. */
static const char *admit(struct nsrv *s, const struct sockaddr *sa, struct addrent **out)
{
	struct addrent **pp, *e;
	uint8_t ip[16];
	int ndata;

	*out = NULL;
	pthread_mutex_lock(&s->mu);
	ndata = s->ndata;
	pthread_mutex_unlock(&s->mu);
	if (s->nconns + (size_t)ndata >= s->max_conns)
		return "connection limit reached";
	if (s->nhs >= NSRV_MAX_HANDSHAKES)
		return "too many connections authenticating";
	addr_key(sa, ip);
	pp = addr_slot(s, ip);
	e = *pp;
	if (e && e->n >= (uint32_t)s->max_per_addr)
		return "too many unauthenticated connections from this address";
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e)
			return "out of memory";
		memcpy(e->ip, ip, sizeof(e->ip));
		*pp = e;
	}
	e->n++;
	*out = e;
	return NULL;
}

static void refuse_log(struct nsrv *s, uint64_t now)
{
	log_warn("net", "refused %llu connection(s) in the last second; the last from %s: %s "
		 "(%zu open, at most %zu; at most %d per address until authenticated)",
		 (unsigned long long)s->refused_since_log, s->refused_from, s->refused_why,
		 s->nconns, s->max_conns, (int)s->max_per_addr);
	s->refused_since_log = 0;
	s->last_refuse_log = now;
}

/* A refused connection is closed at once, counted, and logged at most
 * once a second (a flood must not flood the log too). */
static void refuse(struct nsrv *s, int fd, const struct sockaddr *sa, const char *why)
{
	uint64_t now = util_now_ns();

	close(fd);
	s->refused++;
	s->refused_since_log++;
	s->refused_why = why;
	fmt_addr(sa, s->refused_from, sizeof(s->refused_from));
	if (now - s->last_refuse_log > 1000000000ull)
		refuse_log(s, now);
}

/* ---- closing ---- */

/* Close and free c; on_close for an authenticated control connection. */
static void close_conn(struct nsrv *s, struct sconn *c)
{
	bool authed;

	pthread_mutex_lock(&s->mu);
	unhash(s, c);
	undirty(s, c);
	free_obufs(c->pend_head);
	c->pend_head = c->pend_tail = NULL;
	authed = c->authed;
	if (authed)
		s->ncontrol--;
	pthread_mutex_unlock(&s->mu);

	if (c->data_slot)
		release_data_slot(s);
	timed_clear(s, c);
	hs_done(s, c);
	addr_put(s, c);
	s->nconns--;
	net_tls_close(c->ssl);
	if (c->fd >= 0) {
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	free_obufs(c->out_head);
	free(c->pl);
	free(c->pre);
	if (authed && s->ops.on_close)
		s->ops.on_close(s->arg, c->id, c->peer_rank);
	free(c);
}

/* Log why (WARN before authentication: someone should look; INFO for an
 * authenticated peer going away) and close. */
static void drop(struct nsrv *s, struct sconn *c, bool warn, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void drop(struct nsrv *s, struct sconn *c, bool warn, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (c->authed)
		log_msg(warn ? LOG_WARN : LOG_INFO, "net",
			"%s: closing connection of rank %d: %s", c->addr, c->peer_rank, why);
	else
		log_msg(warn ? LOG_WARN : LOG_INFO, "net",
			"%s: closing unauthenticated connection: %s", c->addr, why);
	close_conn(s, c);
}

/* ---- output ---- */

static void set_events(struct nsrv *s, struct sconn *c)
{
	uint32_t want = (c->handoff ? 0 : EPOLLIN) | (c->out_head ? EPOLLOUT : 0);
	struct epoll_event ev = { .events = 0, .data.ptr = c };

	if (c->tls_hs)
		want = EPOLLIN | (c->tls_hs_out ? EPOLLOUT : 0);
	else if (c->rd_wants_out)
		want |= EPOLLOUT;
	ev.events = want;

	if (want == c->events)
		return;
	if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
		c->events = want;
}

static int handoff(struct nsrv *s, struct sconn *c);

static int tls_step(struct nsrv *s, struct sconn *c);

/* n bytes of the output queue went out: free the frames they finish. */
static void consume_out(struct sconn *c, size_t n)
{
	c->out_bytes -= n;
	while (n > 0) {
		struct obuf *o = c->out_head;
		size_t left = o->len - c->out_off;
		if (n < left) {
			c->out_off += n;
			break;
		}
		n -= left;
		c->out_head = o->next;
		if (!c->out_head)
			c->out_tail = NULL;
		c->out_off = 0;
		free(o->data);
		free(o);
	}
}

/* The TLS way of flush's loop: one frame at a time through SSL_write.
 * 0: wrote all or the socket is full; -1: c dropped. */
static int flush_tls(struct nsrv *s, struct sconn *c)
{
	while (c->out_head) {
		struct obuf *o = c->out_head;
		short want = POLLOUT;
		ssize_t w = net_tls_write(c->ssl, o->data + c->out_off, o->len - c->out_off, &want);

		if (w == -EAGAIN) {
			c->wr_wants_in = want == POLLIN;
			return 0;
		}
		if (w < 0) {
			char why[256];
			drop(s, c, c->state == CS_HELLO && c->got_bytes, "TLS send: %s",
			     net_tls_why(c->ssl, why, sizeof(why)));
			return -1;
		}
		consume_out(c, (size_t)w);
	}
	return 0;
}

/* Write what the socket takes. 0 while c lives, -1 once it is gone (closed
 * after an error or after its last byte, or handed to a data thread). */
static int flush(struct nsrv *s, struct sconn *c)
{
	if (c->tls_hs)
		return tls_step(s, c);
	if (c->ssl && flush_tls(s, c) < 0)
		return -1;
	while (c->out_head && !c->ssl) {
		struct iovec iov[IOV_BATCH];
		struct msghdr mh = { .msg_iov = iov };
		struct obuf *o = c->out_head;
		size_t n = 0, off = c->out_off;
		ssize_t w;

		for (; o && n < IOV_BATCH; o = o->next, off = 0) {
			iov[n].iov_base = o->data + off;
			iov[n].iov_len = o->len - off;
			n++;
		}
		mh.msg_iovlen = n;
		w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			drop(s, c, c->state == CS_HELLO && c->got_bytes, "send: %s", strerror(errno));
			return -1;
		}
		consume_out(c, (size_t)w);
	}
	if (!c->out_head) {
		if (c->state == CS_CLOSING) {
			close_conn(s, c);
			return -1;
		}
		if (c->handoff)
			return handoff(s, c);
	}
	set_events(s, c);
	return 0;
}

static int enqueue(struct sconn *c, uint8_t *frame, size_t len)
{
	struct obuf *o = malloc(sizeof(*o));

	if (!o) {
		free(frame);
		return -ENOMEM;
	}
	o->next = NULL;
	o->len = len;
	o->data = frame;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += len;
	return 0;
}

static int enqueue_json(struct sconn *c, uint8_t type, uint32_t req_id, json_t *msg)
{
	uint8_t *frame;
	size_t len;
	int rc;

	if (!msg)
		return -ENOMEM;
	rc = net_frame_build(type, req_id, msg, &frame, &len);
	json_decref(msg);
	if (rc < 0)
		return rc;
	return enqueue(c, frame, len);
}

/* Flush what is queued, then close (bounded by CLOSE_LINGER_MS). */
static int begin_closing(struct nsrv *s, struct sconn *c)
{
	if (c->state != CS_CLOSING) {
		hs_done(s, c);
		c->state = CS_CLOSING;
		c->handoff = false;
		timed_set(s, c, util_now_ns() + (uint64_t)CLOSE_LINGER_MS * 1000000u);
	}
	return flush(s, c);
}

/* Refuse a HELLO: say why (the client turns it into -errno), then close. */
static int reject(struct nsrv *s, struct sconn *c, int err, const char *text)
{
	enqueue_json(c, NT_ERROR, 0, net_error_msg(err, text));
	return begin_closing(s, c);
}

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
static int handoff(struct nsrv *s, struct sconn *c)
{
	struct dreg *d = calloc(1, sizeof(*d));
	struct nconn *nc = NULL;
	pthread_attr_t attr;
	int fd = c->fd, rc;

	if (!d) {
		drop(s, c, true, "out of memory for a data connection");
		return -1;
	}
	d->s = s;
	d->rank = c->peer_rank;
	rc = nconn_from_fd(fd, c->ssl, c->peer_rank, c->addr, c->pre, c->prelen, dreg_unreg, d,
			   &nc);
	if (rc < 0) {
		free(d);
		drop(s, c, true, "out of memory for a data connection");
		return -1;
	}
	d->c = nc;
	nconn_set_peer_sparse(nc, c->sparse);
	/* the socket is the nconn's now; the slot goes to the data thread */
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
	c->fd = -1;
	c->ssl = NULL;
	c->data_slot = false;
	close_conn(s, c);
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
		release_data_slot(s);
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
		drop(s, c, true, "malformed HELLO");
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
			return reject(s, c, EACCES, "authentication failed");
		}
		if (auth_welcome_mac(&s->auth, nonce_c, c->nonce_s, s->my_rank, want) < 0) {
			drop(s, c, true, "cannot compute WELCOME MAC");
			return -1;
		}
	}
	c->peer_rank = (int)rank;
	/* a proven peer no longer counts against its address: a coordinator
	 * serves thousands of nodes, which may share one (NAT, loopback) */
	if (s->auth.has_secret || s->auth.tls)
		addr_put(s, c);
	if (data) {
		int max = s->max_data;
		bool full;

		if (!s->ops.on_data) {
			log_warn("net", "%s: rank %d asked for a data connection: not served here",
				 c->addr, c->peer_rank);
			return reject(s, c, EOPNOTSUPP, "data connections are not served");
		}
		pthread_mutex_lock(&s->mu);
		full = s->ndata >= max;
		if (!full)
			s->ndata++;
		pthread_mutex_unlock(&s->mu);
		if (full) {
			log_warn("net", "%s: refusing data connection of rank %d: %d running",
				 c->addr, c->peer_rank, max);
			return reject(s, c, EBUSY, "too many data connections");
		}
		c->data_slot = true;
	}
	net_hex_encode(want, sizeof(want), mac_hex);
	w = json_pack("{s:i, s:s, s:b}", "rank", s->my_rank, "mac", mac_hex, "sparse", 1);
	rc = enqueue_json(c, NT_WELCOME, 0, w);
	if (rc < 0) {
		drop(s, c, true, "cannot queue WELCOME: %s", strerror(-rc));
		return -1;
	}
	if (data) {
		/* feed() keeps the bytes that follow, then flushes and hands off */
		c->handoff = true;
		return 0;
	}
	c->state = CS_CONTROL;
	hs_done(s, c);
	timed_clear(s, c);
	pthread_mutex_lock(&s->mu);
	c->authed = true;
	s->ncontrol++;
	pthread_mutex_unlock(&s->mu);
	nconn_tune_control_socket(c->fd);
	log_dbg("net", "%s: control connection %llu from rank %d", c->addr,
		(unsigned long long)c->id, c->peer_rank);
	return flush(s, c);
}

/* A whole frame arrived (header in c->h, payload p, owned here). 0 while c
 * lives, -1 once it is gone. */
static int frame_in(struct nsrv *s, struct sconn *c, uint8_t *p)
{
	json_t *msg = NULL;
	int rc;

	if (net_payload_check(&c->h, p) < 0) {
		free(p);
		drop(s, c, true, "%s frame: payload CRC mismatch", net_type_name(c->h.type));
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
			drop(s, c, true, "malformed JSON in %s frame", net_type_name(c->h.type));
			return -1;
		}
		if (s->ops.on_msg)
			s->ops.on_msg(s->arg, c->id, c->peer_rank, c->h.type, c->h.req_id, msg);
		else
			json_decref(msg);
		return 0;
	default:
		free(p);
		drop(s, c, true, "unexpected %s frame on a control connection",
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
				drop(s, c, true, "bad frame header");
				return -1;
			}
			if (c->state == CS_HELLO && c->h.type != NT_HELLO) {
				drop(s, c, true, "%s frame before authentication",
				     net_type_name(c->h.type));
				return -1;
			}
			if (c->state == CS_HELLO && c->h.len > HELLO_MAX_PAYLOAD) {
				drop(s, c, true, "oversize HELLO (%u bytes)", c->h.len);
				return -1;
			}
			c->have_hdr = true;
			c->plhave = 0;
			if (c->h.len > 0) {
				c->pl = malloc(c->h.len);
				if (!c->pl) {
					drop(s, c, true, "no memory for a %u-byte frame", c->h.len);
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
					drop(s, c, true, "out of memory");
					return -1;
				}
				memcpy(c->pre, p, n);
				c->prelen = n;
			}
			return flush(s, c) < 0 ? -1 : 1;
		}
	}
	return 0;
}

/* Server side of the TLS handshake, one step. When it completes, the
 * queued CHALLENGE goes out. 0 while c lives, -1 once it is gone. */
static int tls_step(struct nsrv *s, struct sconn *c)
{
	short want = POLLIN;
	char why[256];
	int rc = net_tls_handshake(c->ssl, &want);

	if (rc == -EAGAIN) {
		c->tls_hs_out = want == POLLOUT;
		set_events(s, c);
		return 0;
	}
	if (rc < 0) {
		/* a probe that connects and leaves is not news; a refused
		 * certificate is */
		drop(s, c, rc == -EPROTO, "TLS handshake failed: %s",
		     net_tls_why(c->ssl, why, sizeof(why)));
		return -1;
	}
	c->tls_hs = false;
	c->tls_hs_out = false;
	return flush(s, c);
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

static int on_readable(struct nsrv *s, struct sconn *c)
{
	if (c->tls_hs) {
		if (tls_step(s, c) < 0)
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
				set_events(s, c);
				return 0;
			}
			if ((size_t)n < SCRATCH_SZ && !(c->ssl && SSL_pending(c->ssl) > 0))
				return 0;
			continue;
		}
		if (n == 0) {
			if (c->state == CS_CLOSING)
				close_conn(s, c);
			else if (c->state == CS_HELLO)
				drop(s, c, c->got_bytes, "peer closed during the handshake");
			else
				drop(s, c, false, "peer closed the connection");
			return -1;
		}
		if (n == -EAGAIN) {
			if (c->rd_wants_out)
				set_events(s, c);   /* TLS: wait for room to write */
			return 0;
		}
		/* a reset before the peer said anything: a port probe, not news */
		if (c->ssl) {
			char why[256];
			drop(s, c, c->state == CS_HELLO && c->got_bytes, "TLS recv: %s",
			     net_tls_why(c->ssl, why, sizeof(why)));
		} else {
			drop(s, c, c->state == CS_HELLO && c->got_bytes, "recv: %s",
			     strerror((int)-n));
		}
		return -1;
	}
	return 0;
}

/* ---- accepting ---- */

static void new_conn(struct nsrv *s, int fd, const struct sockaddr *sa, struct addrent *ae)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct sconn *c = calloc(1, sizeof(*c));
	uint8_t *frame = NULL;
	size_t flen;
	int one = 1;

	if (!c) {
		close(fd);
		addr_unref(s, ae);
		return;
	}
	c->fd = fd;
	c->ae = ae;
	c->id = ++s->next_id;
	c->state = CS_HELLO;
	c->peer_rank = AUTH_RANK_TOOL;
	fmt_addr(sa, c->addr, sizeof(c->addr));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (auth_nonce(c->nonce_s) < 0 ||
	    net_frame_build_raw(NT_CHALLENGE, 0, c->nonce_s, AUTH_NONCE_LEN, &frame, &flen) < 0 ||
	    enqueue(c, frame, flen) < 0) {
		log_err("net", "%s: cannot build CHALLENGE", c->addr);
		goto fail;
	}
	if (s->auth.tls) {
		c->ssl = net_tls_new(s->auth.tls, fd, 1);
		if (!c->ssl) {
			log_err("net", "%s: cannot start a TLS session", c->addr);
			goto fail;
		}
		c->tls_hs = true;
	}
	ev.data.ptr = c;
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		log_err("net", "%s: epoll_ctl: %s", c->addr, strerror(errno));
		goto fail;
	}
	c->events = EPOLLIN;
	pthread_mutex_lock(&s->mu);
	c->hnext = *bucket(s, c->id);
	*bucket(s, c->id) = c;
	pthread_mutex_unlock(&s->mu);
	s->nconns++;
	c->in_hs = true;
	s->nhs++;
	timed_set(s, c, util_now_ns() + (uint64_t)s->hs_timeout_ms * 1000000u);
	flush(s, c);
	return;
fail:
	net_tls_close(c->ssl);
	close(fd);
	free_obufs(c->out_head);
	addr_put(s, c);
	free(c);
}

static void pause_accept(struct nsrv *s, uint64_t now)
{
	struct epoll_event ev = { .events = 0, .data.ptr = &s->lfd };

	epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &ev);
	s->accept_paused = true;
	s->accept_resume = now + (uint64_t)SWEEP_MS * 1000000u;
}

static void do_accept(struct nsrv *s)
{
	for (int i = 0; i < ACCEPTS_PER_EVENT; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		struct addrent *ae;
		const char *why;
		uint64_t now;
		int fd;

		fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			now = util_now_ns();
			if (now - s->last_refuse_log > 1000000000ull) {
				log_warn("net", "accept: %s (pausing accepts)", strerror(errno));
				s->last_refuse_log = now;
			}
			/* EMFILE & co: the listener would stay readable; back off */
			pause_accept(s, now);
			return;
		}
		why = admit(s, (struct sockaddr *)&ss, &ae);
		if (why) {
			refuse(s, fd, (struct sockaddr *)&ss, why);
			continue;
		}
		new_conn(s, fd, (struct sockaddr *)&ss, ae);
	}
}

/* ---- the loop ---- */

/* Take what other threads queued: frames, close requests, overflows. */
static void process_dirty(struct nsrv *s)
{
	struct sconn *batch = NULL, *c, *next;

	pthread_mutex_lock(&s->mu);
	for (c = s->dirty; c; c = c->dnext) {
		c->in_dirty = false;
		if (c->pend_head) {
			if (c->out_tail)
				c->out_tail->next = c->pend_head;
			else
				c->out_head = c->pend_head;
			c->out_tail = c->pend_tail;
			c->out_bytes += c->pend_bytes;
			c->pend_head = c->pend_tail = NULL;
			c->pend_bytes = 0;
		}
		c->lnext = batch;
		batch = c;
	}
	s->dirty = NULL;
	s->wake_pending = false;
	pthread_mutex_unlock(&s->mu);

	for (c = batch; c; c = next) {
		bool close_req, overflow;

		next = c->lnext;
		pthread_mutex_lock(&s->mu);
		close_req = c->close_req;
		overflow = c->overflow;
		pthread_mutex_unlock(&s->mu);
		if (overflow || c->out_bytes > NSRV_MAX_OUTQ) {
			drop(s, c, true, "output queue over %u MiB (peer not reading)",
			     NSRV_MAX_OUTQ >> 20);
			continue;
		}
		if (close_req && c->state != CS_CLOSING) {
			begin_closing(s, c);
			continue;
		}
		flush(s, c);
	}
}

static void sweep(struct nsrv *s, uint64_t now)
{
	struct sconn *c, *next;

	for (c = s->thead; c; c = next) {
		next = c->tnext;
		if (c->deadline_ns > now)
			continue;
		if (c->state == CS_CLOSING)
			close_conn(s, c);
		else
			drop(s, c, true, "handshake timeout");
	}
	if (s->refused_since_log > 0 && now - s->last_refuse_log > 1000000000ull)
		refuse_log(s, now);
	if (s->accept_paused && now >= s->accept_resume) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &s->lfd };
		epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &ev);
		s->accept_paused = false;
	}
}

static void close_all(struct nsrv *s)
{
	for (;;) {
		struct sconn *c = NULL;

		pthread_mutex_lock(&s->mu);
		for (size_t i = 0; i < HASH_BUCKETS && !c; i++)
			c = s->tab[i];
		pthread_mutex_unlock(&s->mu);
		if (!c)
			break;
		close_conn(s, c);
	}
}

static void *loop_main(void *arg)
{
	struct nsrv *s = arg;
	struct epoll_event evs[MAX_EVENTS];

	tl_loop = s;
	pthread_setname_np(pthread_self(), "nsrv-loop");
	while (!s->stop) {
		int to = (s->thead || s->accept_paused || s->refused_since_log) ? SWEEP_MS : -1;
		int n = epoll_wait(s->epfd, evs, MAX_EVENTS, to);
		uint64_t now;

		if (n < 0 && errno != EINTR) {
			log_err("net", "epoll_wait: %s", strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			uint32_t e = evs[i].events;

			if (p == &s->lfd) {
				do_accept(s);
			} else if (p == &s->evfd) {
				uint64_t v;
				if (read(s->evfd, &v, sizeof(v)) < 0) {
					/* EAGAIN: already drained */
				}
			} else {
				struct sconn *c = p;
				if ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->handoff) {
					if (on_readable(s, c) < 0)
						continue;
					if (c->wr_wants_in) {
						/* a TLS write waited for input */
						c->wr_wants_in = false;
						if (flush(s, c) < 0)
							continue;
					}
				}
				if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
					if (flush(s, c) < 0)
						continue;
					if (c->rd_wants_out && !c->handoff) {
						/* a TLS read waited for room to write */
						c->rd_wants_out = false;
						on_readable(s, c);
					}
				}
			}
		}
		process_dirty(s);
		now = util_now_ns();
		if (now >= s->next_sweep) {
			sweep(s, now);
			s->next_sweep = now + (uint64_t)SWEEP_MS * 1000000u;
		}
	}
	close_all(s);
	return NULL;
}

/* ---- public ---- */

/* Raise RLIMIT_NOFILE's soft limit to the hard one and return the
 * result. Connections may use half of it, less FD_RESERVE_MIN: the rest
 * stays for FUSE (one O_PATH descriptor per inode the kernel remembers,
 * open files), LMDB and the tiers. */
static size_t fd_budget(void)
{
	struct rlimit rl;
	uint64_t lim;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 16;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t cur = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			log_warn("net", "cannot raise the open-file limit: %s", strerror(errno));
			rl.rlim_cur = cur;
		} else {
			log_dbg("net", "open-file limit raised to %llu",
				(unsigned long long)rl.rlim_cur);
		}
	}
	lim = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : (uint64_t)rl.rlim_cur;
	if (lim > (1u << 20))
		lim = 1u << 20;
	lim = lim / 2 > FD_RESERVE_MIN + 16 ? lim / 2 - FD_RESERVE_MIN : 16;
	return lim > NSRV_MAX_CONNS ? NSRV_MAX_CONNS : (size_t)lim;
}

static int listen_on(const char *hostport, int *fd_out, int *port_out)
{
	struct addrinfo hints = {
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
	};
	struct addrinfo *res = NULL, *ai;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256], port_s[8];
	bool any;
	uint16_t port;
	int fd = -1, rc, one = 1, zero = 0;

	if (net_split_hostport(hostport, host, sizeof(host), &port, true) < 0) {
		log_err("net", "listen address %s: want HOST:PORT, [V6]:PORT or :PORT", hostport);
		return -EINVAL;
	}
	any = !host[0] || strcmp(host, "*") == 0;
	snprintf(port_s, sizeof(port_s), "%u", port);
	rc = getaddrinfo(any ? NULL : host, port_s, &hints, &res);
	if (rc != 0) {
		log_err("net", "listen address %s: %s", hostport, gai_strerror(rc));
		return -EINVAL;
	}
	rc = -EADDRNOTAVAIL;
	/* the wildcard: one dual-stack IPv6 socket when there is IPv6 */
	for (int pass = 0; pass < 2 && fd < 0; pass++) {
		for (ai = res; ai; ai = ai->ai_next) {
			if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
				continue;
			if (any && (pass == 0) != (ai->ai_family == AF_INET6))
				continue;
			if (!any && pass == 1)
				break;
			fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (fd < 0) {
				rc = -errno;
				continue;
			}
			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			if (any && ai->ai_family == AF_INET6)
				setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
			if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 4096) == 0)
				break;
			rc = -errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0) {
		log_err("net", "cannot listen on %s: %s", hostport, strerror(-rc));
		return rc;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	return 0;
}

int nsrv_start(const char *listen_hostport, int my_rank, const struct net_auth *auth,
	       const struct nsrv_ops *ops, void *arg, struct nsrv **out)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct nsrv *s;
	int rc;

	*out = NULL;
	if (!listen_hostport || !ops || my_rank < AUTH_RANK_TOOL || my_rank > AUTH_RANK_MAX)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lfd = s->epfd = s->evfd = -1;
	s->my_rank = my_rank;
	s->ops = *ops;
	s->arg = arg;
	s->hs_timeout_ms = NSRV_HANDSHAKE_TIMEOUT_MS;
	s->max_data = NSRV_MAX_DATA_CONNS;
	if (auth && (auth->has_secret || auth->tls))
		s->auth = *auth;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->data_cv, NULL);
	s->tab = calloc(HASH_BUCKETS, sizeof(*s->tab));
	if (!s->tab) {
		rc = -ENOMEM;
		goto fail;
	}
	s->max_conns = fd_budget();
	s->max_per_addr = NSRV_MAX_PER_ADDR;
	s->atab = calloc(ADDR_BUCKETS, sizeof(*s->atab));
	if (!s->atab) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = listen_on(listen_hostport, &s->lfd, &s->port);
	if (rc < 0)
		goto fail;
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->epfd < 0 || s->evfd < 0) {
		rc = -errno;
		goto fail;
	}
	ev.data.ptr = &s->lfd;
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &ev) < 0) {
		rc = -errno;
		goto fail;
	}
	ev.data.ptr = &s->evfd;
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &ev) < 0) {
		rc = -errno;
		goto fail;
	}
	if (s->auth.tls)
		log_info("net", "peer traffic runs over mutual TLS%s",
			 s->auth.has_secret ? " and proves the shared secret" : "");
	else if (!s->auth.has_secret && strncmp(listen_hostport, "127.", 4) &&
		 strncmp(listen_hostport, "localhost:", 10) && strncmp(listen_hostport, "[::1]:", 6))
		log_warn("net", "peer traffic is not authenticated: set secret_file or tls_*");
	else if (!s->auth.has_secret)
		log_info("net", "peer traffic is not authenticated (loopback only)");
	rc = pthread_create(&s->thr, NULL, loop_main, s);
	if (rc != 0) {
		rc = -rc;
		goto fail;
	}
	log_info("net", "listening on %s (port %d) as rank %d; at most %zu connections, %d per "
		 "address until authenticated", listen_hostport, s->port, my_rank, s->max_conns,
		 NSRV_MAX_PER_ADDR);
	*out = s;
	return 0;
fail:
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->epfd >= 0)
		close(s->epfd);
	if (s->evfd >= 0)
		close(s->evfd);
	auth_clear(&s->auth);
	free(s->tab);
	free(s->atab);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->data_cv);
	free(s);
	return rc;
}

int nsrv_port(const struct nsrv *s)
{
	return s->port;
}

void nsrv_set_handshake_timeout_ms(struct nsrv *s, int ms)
{
	s->hs_timeout_ms = ms > 0 ? ms : NSRV_HANDSHAKE_TIMEOUT_MS;
}

void nsrv_set_max_data_conns(struct nsrv *s, int n)
{
	s->max_data = n >= 0 ? n : NSRV_MAX_DATA_CONNS;
}

void nsrv_set_max_per_addr(struct nsrv *s, int n)
{
	s->max_per_addr = n > 0 ? n : NSRV_MAX_PER_ADDR;
}

size_t nsrv_max_conns(const struct nsrv *s)
{
	return s->max_conns;
}

uint64_t nsrv_refused(struct nsrv *s)
{
	return atomic_load(&s->refused);
}

int nsrv_send(struct nsrv *s, uint64_t conn_id, uint8_t type, uint32_t req_id, json_t *msg)
{
	struct obuf *o = NULL;
	struct sconn *c;
	uint8_t *frame = NULL;
	size_t len;
	bool need_wake = false;
	int rc;

	if (type != NT_REQ && type != NT_RESP && type != NT_EVENT && type != NT_ERROR) {
		json_decref(msg);
		return -EINVAL;
	}
	rc = net_frame_build(type, req_id, msg, &frame, &len);
	json_decref(msg);
	if (rc < 0)
		return rc;
	o = malloc(sizeof(*o));
	if (!o) {
		free(frame);
		return -ENOMEM;
	}
	o->next = NULL;
	o->len = len;
	o->data = frame;

	pthread_mutex_lock(&s->mu);
	c = lookup(s, conn_id);
	if (!c || !c->authed || c->close_req) {
		rc = -ENOTCONN;
	} else if (c->pend_bytes + len > NSRV_MAX_OUTQ) {
		c->overflow = true;   /* the loop drops it */
		mark_dirty(s, c);
		rc = -ENOBUFS;
	} else {
		if (c->pend_tail)
			c->pend_tail->next = o;
		else
			c->pend_head = o;
		c->pend_tail = o;
		c->pend_bytes += len;
		o = NULL;
		mark_dirty(s, c);
		rc = 0;
	}
	if (c && c->in_dirty && tl_loop != s && !s->wake_pending) {
		s->wake_pending = true;
		need_wake = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (need_wake)
		wake(s);
	if (o) {
		free(o->data);
		free(o);
	}
	return rc;
}

int nsrv_close_conn(struct nsrv *s, uint64_t conn_id)
{
	struct sconn *c;
	bool need_wake = false;
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	c = lookup(s, conn_id);
	if (!c || !c->authed) {
		rc = -ENOTCONN;
	} else if (!c->close_req) {
		c->close_req = true;
		mark_dirty(s, c);
		if (tl_loop != s && !s->wake_pending) {
			s->wake_pending = true;
			need_wake = true;
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (need_wake)
		wake(s);
	return rc;
}

size_t nsrv_conn_count(struct nsrv *s)
{
	size_t n;

	pthread_mutex_lock(&s->mu);
	n = s->ncontrol;
	pthread_mutex_unlock(&s->mu);
	return n;
}

void nsrv_stop(struct nsrv *s)
{
	struct timespec ts;

	if (!s)
		return;
	s->stop = true;
	wake(s);
	pthread_join(s->thr, NULL);
	close(s->lfd);

	/* data threads own their sockets: shut them down so that whatever
	 * they wait for fails now, then wait for their on_data to return */
	pthread_mutex_lock(&s->mu);
	while (s->ndata > 0) {
		for (struct dreg *d = s->dlist; d; d = d->next)
			shutdown(nconn_fd(d->c), SHUT_RDWR);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 5;
		if (pthread_cond_timedwait(&s->data_cv, &s->mu, &ts) == ETIMEDOUT && s->ndata > 0)
			log_warn("net", "stopping: still waiting for %d data connection thread(s)",
				 s->ndata);
	}
	pthread_mutex_unlock(&s->mu);

	close(s->epfd);
	close(s->evfd);
	auth_clear(&s->auth);
	free(s->tab);
	/* every connection was closed, so every entry is gone already */
	free(s->atab);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->data_cv);
	free(s);
}
