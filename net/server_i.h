/* server_i: what the pieces of net/server (server.c: loop, accept, public
 * calls; server_conn.c: connection table, admission, output, closing;
 * server_recv.c: input, handshakes, data hand-off) share, and nothing
 * outside them may use. Every function here runs on the loop thread unless
 * its comment (at its definition) says otherwise; locking as in server.h. */
#ifndef MTCFS_NET_SERVER_I_H
#define MTCFS_NET_SERVER_I_H

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "net/server.h"
#include "net/tls.h"

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
	bool in_hs;                 /* counted in nsrv.nhs, on its hs_* list */
	bool shed;                  /* turned away for a newer one: closed after the batch */
	struct sconn *hs_prev, *hs_next;   /* nsrv.hs_*: unauthenticated, oldest first */
	struct sconn *shed_next;    /* nsrv.shed */
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
	struct sconn *hs_head, *hs_tail;   /* the nhs connections, by age */
	struct sconn *shed;         /* shed by admission, closed after the event batch */
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

/* Shared by the pieces; each is documented where it is defined. */
void srv_fmt_addr(const struct sockaddr *sa, char *out, size_t outlen);
struct sconn **srv_bucket(struct nsrv *s, uint64_t id);
struct sconn *srv_lookup(struct nsrv *s, uint64_t id);
void srv_mark_dirty(struct nsrv *s, struct sconn *c);
void srv_wake(struct nsrv *s);
void srv_timed_set(struct nsrv *s, struct sconn *c, uint64_t deadline);
void srv_timed_clear(struct nsrv *s, struct sconn *c);
void srv_hs_done(struct nsrv *s, struct sconn *c);
void srv_release_data_slot(struct nsrv *s);
void srv_free_obufs(struct obuf *o);
void srv_addr_unref(struct nsrv *s, struct addrent *e);
void srv_addr_put(struct nsrv *s, struct sconn *c);
const char *srv_admit(struct nsrv *s, const struct sockaddr *sa, struct addrent **out);
void srv_hs_add(struct nsrv *s, struct sconn *c);
void srv_close_shed(struct nsrv *s);
void srv_refuse_log(struct nsrv *s, uint64_t now);
void srv_refuse(struct nsrv *s, int fd, const struct sockaddr *sa, const char *why);
void srv_close_conn(struct nsrv *s, struct sconn *c);
void srv_drop(struct nsrv *s, struct sconn *c, bool warn, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void srv_set_events(struct nsrv *s, struct sconn *c);
int srv_flush(struct nsrv *s, struct sconn *c);
struct obuf *srv_obuf_new(uint8_t *frame, size_t len);
int srv_enqueue(struct sconn *c, uint8_t *frame, size_t len);
int srv_enqueue_json(struct sconn *c, uint8_t type, uint32_t req_id, json_t *msg);
int srv_begin_closing(struct nsrv *s, struct sconn *c);
int srv_reject(struct nsrv *s, struct sconn *c, int err, const char *text);
int srv_handoff(struct nsrv *s, struct sconn *c);
int srv_tls_step(struct nsrv *s, struct sconn *c);
int srv_on_readable(struct nsrv *s, struct sconn *c);

#endif
