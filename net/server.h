/* server: the peer/coordinator endpoint. Owns the listening socket, one
 * epoll loop thread serving every control connection (non-blocking, with
 * per-connection input state, a bounded output queue and the server side
 * of the HMAC handshake — inside a TLS session first when auth->tls is
 * set), and the threads of "data" connections.
 *
 * Threads: on_msg and on_close run on the loop thread and must not block;
 * nsrv_send and nsrv_close_conn may be called from any thread (the loop
 * is woken through an eventfd); on_data runs on a new detached thread per
 * data connection. nsrv_stop joins the loop and waits for the data
 * threads. Messages handed to on_msg and to nsrv_send change owner as
 * documented there. Lock order: nsrv.mu is a leaf lock, never held while
 * calling back into the application. */
#ifndef MTCFS_NET_SERVER_H
#define MTCFS_NET_SERVER_H

#include <stdint.h>

#include <jansson.h>

#include "net/auth.h"
#include "net/client.h"
#include "net/frame.h"

struct nsrv;

#define NSRV_HANDSHAKE_TIMEOUT_MS 5000
#define NSRV_MAX_OUTQ        (64u << 20)   /* per control connection */
#define NSRV_MAX_DATA_CONNS  64
#define NSRV_MAX_HANDSHAKES  4096          /* connections not yet authenticated */
#define NSRV_MAX_PER_ADDR    256           /* per peer IP, until the secret/TLS is proven */
#define NSRV_MAX_CONNS       32768         /* in total, whatever RLIMIT_NOFILE allows */
#define NSRV_DATA_ROOM       64            /* of those, kept for data connections at rank 0 */
/* The daemon's open-file limit is shared: the FUSE front keeps at most
 * 1/NSRV_FS_FD_SHARE of it open for inodes (fs/fs_ll_fd.c, an LRU reopened
 * by handle), NSRV_FD_RESERVE stays for the application's open files, LMDB,
 * pipes and the tiers, and connections may use the rest (at least half the
 * limit less 64, what small limits keep): at a limit of 20,000, 16,476
 * connections, a coordinator for 16,413 nodes. */
#define NSRV_FS_FD_SHARE     8
#define NSRV_FD_RESERVE      1024

struct nsrv_ops {
	/* A JSON frame (NT_REQ, NT_EVENT, and NT_RESP / NT_ERROR answering
	 * frames the server sent) from an authenticated control connection.
	 * Loop thread: must not block. Takes ownership of msg (json_decref it;
	 * never NULL: an empty payload is {}). Reply now or later with
	 * nsrv_send(). */
	void (*on_msg)(void *arg, uint64_t conn_id, int peer_rank, uint8_t type,
		       uint32_t req_id, json_t *msg);
	/* A control connection closed (peer gone, error, nsrv_close_conn, or
	 * nsrv_stop). Loop thread. conn_id is never reused. May be NULL. */
	void (*on_close)(void *arg, uint64_t conn_id, int peer_rank);
	/* An authenticated "data" connection, on its own new detached thread,
	 * which owns c: close it with nconn_close before returning. May block
	 * (nconn calls have timeouts; nsrv_stop shuts the socket down to end
	 * them). NULL: data connections are refused. */
	void (*on_data)(void *arg, struct nconn *c, int peer_rank);
};

/* Bind listen_hostport ("0.0.0.0:7000", "[::]:7000", ":7000" for every
 * address, "127.0.0.1:0" for a free port) with SO_REUSEADDR, raise
 * RLIMIT_NOFILE's soft limit to the hard one and start the loop thread.
 * Bounds on connections: in total (handshaking, control and data) half
 * the open-file limit less 64, so that FUSE and the tiers keep the rest;
 * per peer IP NSRV_MAX_PER_ADDR until the connection proved the secret or
 * its TLS certificate (without either, for its whole life); a connection
 * that has not finished HELLO within the handshake timeout is closed,
 * with or without a secret. A connection beyond a bound is closed at
 * once, counted (nsrv_refused) and logged at most once a second.
 * my_rank (-1..65535) goes into WELCOME. auth may be NULL (no secret: a
 * warning is logged). ops is copied. 0, -EINVAL, -EADDRINUSE, other -errno. */
int nsrv_start(const char *listen_hostport, int my_rank, const struct net_auth *auth,
	       const struct nsrv_ops *ops, void *arg, struct nsrv **out);
/* The bound port (useful after port 0). */
int nsrv_port(const struct nsrv *s);
/* Handshake deadline for connections accepted from now on (default
 * NSRV_HANDSHAKE_TIMEOUT_MS); tests shorten it. */
void nsrv_set_handshake_timeout_ms(struct nsrv *s, int ms);
/* Cap on concurrent data connections (default NSRV_MAX_DATA_CONNS);
 * beyond it a data HELLO gets NT_ERROR EBUSY. */
void nsrv_set_max_data_conns(struct nsrv *s, int n);
/* Per-address bound (default NSRV_MAX_PER_ADDR; tests lower it). */
void nsrv_set_max_per_addr(struct nsrv *s, int n);
/* The total bound computed at start from RLIMIT_NOFILE. */
size_t nsrv_max_conns(const struct nsrv *s);
/* Connections refused by the bounds so far (any thread). */
uint64_t nsrv_refused(struct nsrv *s);

/* Queue a frame (NT_REQ, NT_RESP, NT_EVENT or NT_ERROR) with payload msg to
 * control connection conn_id. Any thread. Takes ownership of msg (NULL:
 * empty payload). 0 once queued (delivery is not confirmed), -ENOTCONN when
 * the connection is gone or closing, -ENOBUFS when its output queue is
 * over NSRV_MAX_OUTQ (the connection is then dropped), -EINVAL (type),
 * -EMSGSIZE, -ENOMEM. */
int nsrv_send(struct nsrv *s, uint64_t conn_id, uint8_t type, uint32_t req_id, json_t *msg);
/* Close control connection conn_id after its queued output is written
 * (at most 2 s); on_close follows on the loop thread. Any thread.
 * 0 or -ENOTCONN. */
int nsrv_close_conn(struct nsrv *s, uint64_t conn_id);
/* Number of authenticated control connections (any thread; a snapshot). */
size_t nsrv_conn_count(struct nsrv *s);
/* Close every connection (on_close for each control one), stop the loop,
 * shut down the sockets of running data connections and wait until their
 * on_data returned, then free s. Accepts NULL. Not from a callback. */
void nsrv_stop(struct nsrv *s);

#endif
