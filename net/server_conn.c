/* server: one control connection's life on the loop thread: the id table,
 * per-address admission, timers, the output queue (plain and TLS) and
 * closing (see server_i.h). */
#include "net/server.h"
#include "net/server_i.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

void srv_fmt_addr(const struct sockaddr *sa, char *out, size_t outlen)
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

struct sconn **srv_bucket(struct nsrv *s, uint64_t id)
{
	return &s->tab[id & (HASH_BUCKETS - 1)];
}

struct sconn *srv_lookup(struct nsrv *s, uint64_t id)
{
	struct sconn *c;

	for (c = *srv_bucket(s, id); c; c = c->hnext)
		if (c->id == id)
			return c;
	return NULL;
}

static void unhash(struct nsrv *s, struct sconn *c)
{
	struct sconn **pp;

	for (pp = srv_bucket(s, c->id); *pp; pp = &(*pp)->hnext) {
		if (*pp == c) {
			*pp = c->hnext;
			return;
		}
	}
}

void srv_mark_dirty(struct nsrv *s, struct sconn *c)
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

void srv_wake(struct nsrv *s)
{
	uint64_t one = 1;

	if (write(s->evfd, &one, sizeof(one)) < 0) {
		/* counter saturated or closed: the loop is awake or gone */
	}
}

/* ---- timed list (loop) ---- */

void srv_timed_set(struct nsrv *s, struct sconn *c, uint64_t deadline)
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

void srv_timed_clear(struct nsrv *s, struct sconn *c)
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

/* c is unauthenticated now: the newest on the list admission sheds from. */
void srv_hs_add(struct nsrv *s, struct sconn *c)
{
	c->in_hs = true;
	s->nhs++;
	c->hs_next = NULL;
	c->hs_prev = s->hs_tail;
	if (s->hs_tail)
		s->hs_tail->hs_next = c;
	else
		s->hs_head = c;
	s->hs_tail = c;
}

void srv_hs_done(struct nsrv *s, struct sconn *c)
{
	if (!c->in_hs)
		return;
	c->in_hs = false;
	s->nhs--;
	if (c->hs_prev)
		c->hs_prev->hs_next = c->hs_next;
	else
		s->hs_head = c->hs_next;
	if (c->hs_next)
		c->hs_next->hs_prev = c->hs_prev;
	else
		s->hs_tail = c->hs_prev;
	c->hs_prev = c->hs_next = NULL;
}

void srv_release_data_slot(struct nsrv *s)
{
	pthread_mutex_lock(&s->mu);
	s->ndata--;
	pthread_cond_broadcast(&s->data_cv);
	pthread_mutex_unlock(&s->mu);
}

void srv_free_obufs(struct obuf *o)
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

void srv_addr_unref(struct nsrv *s, struct addrent *e)
{
	struct addrent **pp;

	if (!e || --e->n > 0)
		return;
	pp = addr_slot(s, e->ip);
	*pp = e->next;
	free(e);
}

/* Stop counting c against its address (it proved the secret, or closed). */
void srv_addr_put(struct nsrv *s, struct sconn *c)
{
	srv_addr_unref(s, c->ae);
	c->ae = NULL;
}

/* Turn away the oldest connection still in its handshake (from address e
 * only, unless NULL) to make room for a new one: a flood of idle
 * connections then cannot keep a peer out, whose own handshake takes a
 * round trip (it must only not be the oldest of 4096, or of its address's
 * max_per_addr). Its counts go now; it is closed after the event batch
 * (events for it may still be in the batch). why: the reason counted and
 * logged, as for a refusal. false when there is none to shed. */
static bool shed_oldest(struct nsrv *s, const struct addrent *e, const char *why)
{
	struct sconn *c;

	for (c = s->hs_head; c; c = c->hs_next)
		if (c->state == CS_HELLO && !c->handoff && (!e || c->ae == e))
			break;
	if (!c)
		return false;
	srv_hs_done(s, c);
	srv_addr_put(s, c);
	c->shed = true;
	c->shed_next = s->shed;
	s->shed = c;
	s->refused++;
	s->refused_since_log++;
	s->refused_why = why;
	snprintf(s->refused_from, sizeof(s->refused_from), "%s", c->addr);
	return true;
}

/* Close what shed_oldest turned away (after an event batch). */
void srv_close_shed(struct nsrv *s)
{
	while (s->shed) {
		struct sconn *c = s->shed;
		s->shed = c->shed_next;
		srv_close_conn(s, c);
	}
}

/* May one more connection from sa be served? NULL and *out = its address
 * entry (counted) when it may; else why not. The total keeps a reserve of
 * file descriptors for FUSE and the tiers: without it, a flood of
 * connections (every one passes HELLO when there is no secret) made every
 * open() of the mount fail with EMFILE. At a bound the oldest
 * unauthenticated connection (of the address, for its bound) is shed for
 * the new one; only when there is none is the new one refused. */
const char *srv_admit(struct nsrv *s, const struct sockaddr *sa, struct addrent **out)
{
	struct addrent **pp, *e;
	uint8_t ip[16];
	int ndata;

	*out = NULL;
	pthread_mutex_lock(&s->mu);
	ndata = s->ndata;
	pthread_mutex_unlock(&s->mu);
	addr_key(sa, ip);
	e = *addr_slot(s, ip);
	if (e && e->n >= (uint32_t)s->max_per_addr &&
	    !shed_oldest(s, e, "too many unauthenticated connections from this address "
			 "(shed its oldest)"))
		return "too many unauthenticated connections from this address";
	/* shed connections still hold their descriptor until the batch ends:
	 * at most ACCEPTS_PER_EVENT over, within the reserve */
	if (s->nconns + (size_t)ndata >= s->max_conns + ACCEPTS_PER_EVENT ||
	    (s->nconns + (size_t)ndata >= s->max_conns &&
	     !shed_oldest(s, NULL, "connection limit reached (shed the oldest unauthenticated)")))
		return "connection limit reached";
	if (s->nhs >= NSRV_MAX_HANDSHAKES &&
	    !shed_oldest(s, NULL, "too many connections authenticating (shed the oldest)"))
		return "too many connections authenticating";
	pp = addr_slot(s, ip);   /* again: shedding may have freed the entry */
	e = *pp;
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

void srv_refuse_log(struct nsrv *s, uint64_t now)
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
void srv_refuse(struct nsrv *s, int fd, const struct sockaddr *sa, const char *why)
{
	uint64_t now = util_now_ns();

	/* counted before the close: a peer that sees its connection reset
	 * finds it in nsrv_refused() already */
	s->refused++;
	s->refused_since_log++;
	s->refused_why = why;
	srv_fmt_addr(sa, s->refused_from, sizeof(s->refused_from));
	close(fd);
	if (now - s->last_refuse_log > 1000000000ull)
		srv_refuse_log(s, now);
}

/* ---- closing ---- */

/* Close and free c; on_close for an authenticated control connection. */
void srv_close_conn(struct nsrv *s, struct sconn *c)
{
	bool authed;

	pthread_mutex_lock(&s->mu);
	unhash(s, c);
	undirty(s, c);
	srv_free_obufs(c->pend_head);
	c->pend_head = c->pend_tail = NULL;
	authed = c->authed;
	if (authed)
		s->ncontrol--;
	pthread_mutex_unlock(&s->mu);

	if (c->data_slot)
		srv_release_data_slot(s);
	srv_timed_clear(s, c);
	srv_hs_done(s, c);
	srv_addr_put(s, c);
	s->nconns--;
	net_tls_close(c->ssl);
	if (c->fd >= 0) {
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	srv_free_obufs(c->out_head);
	free(c->pl);
	free(c->pre);
	if (authed && s->ops.on_close)
		s->ops.on_close(s->arg, c->id, c->peer_rank);
	free(c);
}

/* Log why (WARN before authentication: someone should look; INFO for an
 * authenticated peer going away) and close. */

void srv_drop(struct nsrv *s, struct sconn *c, bool warn, const char *fmt, ...)
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
	srv_close_conn(s, c);
}

/* ---- output ---- */

void srv_set_events(struct nsrv *s, struct sconn *c)
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
			srv_drop(s, c, c->state == CS_HELLO && c->got_bytes, "TLS send: %s",
			     net_tls_why(c->ssl, why, sizeof(why)));
			return -1;
		}
		consume_out(c, (size_t)w);
	}
	return 0;
}

/* Write what the socket takes. 0 while c lives, -1 once it is gone (closed
 * after an error or after its last byte, or handed to a data thread). */
int srv_flush(struct nsrv *s, struct sconn *c)
{
	if (c->tls_hs)
		return srv_tls_step(s, c);
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
			srv_drop(s, c, c->state == CS_HELLO && c->got_bytes, "send: %s", strerror(errno));
			return -1;
		}
		consume_out(c, (size_t)w);
	}
	if (!c->out_head) {
		if (c->state == CS_CLOSING) {
			srv_close_conn(s, c);
			return -1;
		}
		if (c->handoff)
			return srv_handoff(s, c);
	}
	srv_set_events(s, c);
	return 0;
}

/* An output queue entry for a whole frame: takes frame, which is freed
 * when there is no memory for the entry (NULL). Any thread. */
struct obuf *srv_obuf_new(uint8_t *frame, size_t len)
{
	struct obuf *o = malloc(sizeof(*o));

	if (!o) {
		free(frame);
		return NULL;
	}
	o->next = NULL;
	o->len = len;
	o->data = frame;
	return o;
}

int srv_enqueue(struct sconn *c, uint8_t *frame, size_t len)
{
	struct obuf *o = srv_obuf_new(frame, len);

	if (!o)
		return -ENOMEM;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += len;
	return 0;
}

int srv_enqueue_json(struct sconn *c, uint8_t type, uint32_t req_id, json_t *msg)
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
	return srv_enqueue(c, frame, len);
}

/* Flush what is queued, then close (bounded by CLOSE_LINGER_MS). */
int srv_begin_closing(struct nsrv *s, struct sconn *c)
{
	if (c->state != CS_CLOSING) {
		srv_hs_done(s, c);
		c->state = CS_CLOSING;
		c->handoff = false;
		srv_timed_set(s, c, util_now_ns() + (uint64_t)CLOSE_LINGER_MS * 1000000u);
	}
	return srv_flush(s, c);
}

/* Refuse a HELLO: say why (the client turns it into -errno), then close. */
int srv_reject(struct nsrv *s, struct sconn *c, int err, const char *text)
{
	srv_enqueue_json(c, NT_ERROR, 0, net_error_msg(err, text));
	return srv_begin_closing(s, c);
}
