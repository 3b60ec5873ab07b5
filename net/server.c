/* server: the epoll loop, accepting, the timers' sweep and the public
 * nsrv_* calls (see server.h). Connection state and output: server_conn.c;
 * handshake and frame input: server_recv.c; what they share: server_i.h. */
#include "net/server.h"
#include "net/server_i.h"
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static __thread struct nsrv *tl_loop;   /* set on the loop thread */

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
		srv_addr_unref(s, ae);
		return;
	}
	c->fd = fd;
	c->ae = ae;
	c->id = ++s->next_id;
	c->state = CS_HELLO;
	c->peer_rank = AUTH_RANK_TOOL;
	srv_fmt_addr(sa, c->addr, sizeof(c->addr));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (auth_nonce(c->nonce_s) < 0 ||
	    net_frame_build_raw(NT_CHALLENGE, 0, c->nonce_s, AUTH_NONCE_LEN, &frame, &flen) < 0 ||
	    srv_enqueue(c, frame, flen) < 0) {
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
	c->hnext = *srv_bucket(s, c->id);
	*srv_bucket(s, c->id) = c;
	pthread_mutex_unlock(&s->mu);
	s->nconns++;
	srv_hs_add(s, c);
	srv_timed_set(s, c, util_now_ns() + (uint64_t)s->hs_timeout_ms * 1000000u);
	srv_flush(s, c);
	return;
fail:
	net_tls_close(c->ssl);
	close(fd);
	srv_free_obufs(c->out_head);
	srv_addr_put(s, c);
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
		why = srv_admit(s, (struct sockaddr *)&ss, &ae);
		if (why) {
			srv_refuse(s, fd, (struct sockaddr *)&ss, why);
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
			srv_drop(s, c, true, "output queue over %u MiB (peer not reading)",
			     NSRV_MAX_OUTQ >> 20);
			continue;
		}
		if (close_req && c->state != CS_CLOSING) {
			srv_begin_closing(s, c);
			continue;
		}
		srv_flush(s, c);
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
			srv_close_conn(s, c);
		else
			srv_drop(s, c, true, "handshake timeout");
	}
	if (s->refused_since_log > 0 && now - s->last_refuse_log > 1000000000ull)
		srv_refuse_log(s, now);
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
		srv_close_conn(s, c);
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
				if (c->shed)
					continue;   /* closed after the batch */
				if ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->handoff) {
					if (srv_on_readable(s, c) < 0)
						continue;
					if (c->wr_wants_in) {
						/* a TLS write waited for input */
						c->wr_wants_in = false;
						if (srv_flush(s, c) < 0)
							continue;
					}
				}
				if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
					if (srv_flush(s, c) < 0)
						continue;
					if (c->rd_wants_out && !c->handoff) {
						/* a TLS read waited for room to write */
						c->rd_wants_out = false;
						srv_on_readable(s, c);
					}
				}
			}
		}
		srv_close_shed(s);
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

/* Raise RLIMIT_NOFILE's soft limit to the hard one and return what
 * connections may use of it: the limit less the FUSE front's inode share
 * and NSRV_FD_RESERVE (server.h), or half of it less FD_RESERVE_MIN when
 * that is more (small limits). */
static size_t fd_budget(void)
{
	int rrc;
	uint64_t lim = util_nofile_raise(&rrc);

	if (rrc < 0)
		log_warn("net", "cannot raise the open-file limit: %s", strerror(-rrc));
	if (lim == 0)
		return 16;
	if (lim > (1u << 20))
		lim = 1u << 20;
	{
		uint64_t half = lim / 2 > FD_RESERVE_MIN + 16 ? lim / 2 - FD_RESERVE_MIN : 16;
		uint64_t rest = lim - lim / NSRV_FS_FD_SHARE;
		rest = rest > NSRV_FD_RESERVE ? rest - NSRV_FD_RESERVE : 0;
		lim = rest > half ? rest : half;
	}
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

/* What nsrv_start set up, but the listening socket (closed first by
 * nsrv_stop, last by a failed start), and s itself. */
static void free_server(struct nsrv *s)
{
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
	if (my_rank == 0) {
		/* every other node keeps one control connection to rank 0; the
		 * rest is room for data connections (pushes, fetches) */
		size_t nodes = s->max_conns > NSRV_DATA_ROOM ? s->max_conns - NSRV_DATA_ROOM + 1 : 1;
		log_info("net", "as the coordinator this node takes a job of up to %zu nodes%s", nodes,
			 s->max_conns < NSRV_MAX_CONNS ?
			 " (bound by RLIMIT_NOFILE: raise LimitNOFILE= or the container's nofile limit for more)" :
			 " (mtcfs's own bound)");
	}
	*out = s;
	return 0;
fail:
	if (s->lfd >= 0)
		close(s->lfd);
	free_server(s);
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
	o = srv_obuf_new(frame, len);
	if (!o)
		return -ENOMEM;

	pthread_mutex_lock(&s->mu);
	c = srv_lookup(s, conn_id);
	if (!c || !c->authed || c->close_req) {
		rc = -ENOTCONN;
	} else if (c->pend_bytes + len > NSRV_MAX_OUTQ) {
		c->overflow = true;   /* the loop drops it */
		srv_mark_dirty(s, c);
		rc = -ENOBUFS;
	} else {
		if (c->pend_tail)
			c->pend_tail->next = o;
		else
			c->pend_head = o;
		c->pend_tail = o;
		c->pend_bytes += len;
		o = NULL;
		srv_mark_dirty(s, c);
		rc = 0;
	}
	if (c && c->in_dirty && tl_loop != s && !s->wake_pending) {
		s->wake_pending = true;
		need_wake = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (need_wake)
		srv_wake(s);
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
	c = srv_lookup(s, conn_id);
	if (!c || !c->authed) {
		rc = -ENOTCONN;
	} else if (!c->close_req) {
		c->close_req = true;
		srv_mark_dirty(s, c);
		if (tl_loop != s && !s->wake_pending) {
			s->wake_pending = true;
			need_wake = true;
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (need_wake)
		srv_wake(s);
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
	srv_wake(s);
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

	/* every connection was closed, so every entry of atab is gone already */
	free_server(s);
}
