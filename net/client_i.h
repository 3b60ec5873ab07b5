/* client_i: struct nconn and the I/O primitives shared by the two halves
 * of net/client (see client.h): client.c (sockets, frames, handshake,
 * connect/close) and client_file.c (NT_FILE bodies out and in: sendfile,
 * sparse extents, splice or recv+write, CRC32C). Same threads and locking
 * as client.h says; only net/ includes this. */
#ifndef MTCFS_NET_CLIENT_I_H
#define MTCFS_NET_CLIENT_I_H

#include "net/client.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <openssl/ssl.h>

/* Receiving a file, measured on the 2-vCPU class of PERF-NOTES (kernel 6.18,
 * 1 GiB over loopback into tmpfs, medians of 7): raw sendfile->splice 2.22,
 * raw recv+write 2.05, our recv + CRC32C + pwrite in 1 MiB chunks 2.04,
 * splice + CRC read back through mmap 1.55-1.70, through pread 1.63; 256 KiB
 * chunks 1.60, 2-4 MiB chunks no better. So the copy path is the default:
 * the CRC runs on bytes still in L2, and it works on O_WRONLY fds. */
#define RX_CHUNK     (1u << 20)      /* copy path: recv/CRC/pwrite unit */
#define RX_PIPE_SZ   (1u << 20)      /* splice path: pipe capacity asked for */
#define RX_SPLICE_MIN (256u << 10)   /* smaller files take the copy path */

struct nconn {
	int fd;
	int peer_rank;
	char addr[INET6_ADDRSTRLEN + 8];
	_Atomic int io_timeout_ms;
	_Atomic uint32_t next_req;

	pthread_mutex_t send_mu;   /* one frame (or NT_FILE transfer) at a time */
	int send_err;              /* sticky send failure; protected by send_mu */

	/* receive side: one thread at a time, no lock */
	int recv_err;              /* sticky receive failure */
	bool file_pending;         /* an NT_FILE's raw bytes are next on the stream */
	uint64_t file_left;
	bool file_sparse;          /* ... as extents ("data" in its header) */
	uint64_t file_data;        /* ... of this many data bytes */
	_Atomic bool peer_sparse;  /* the other side takes sparse NT_FILEs */
	uint8_t *pre;              /* bytes read ahead by the server, served first */
	size_t pre_len, pre_off;
	int pipefd[2];             /* splice pipe, created on first use */
	size_t pipe_sz;
	uint8_t *rxbuf;            /* copy-path buffer, RX_CHUNK bytes */

	/* mutual TLS: every byte goes through ssl, one call at a time (ssl_mu:
	 * a sender and the receiver may run together); splice and sendfile
	 * give way to the copy paths */
	SSL *ssl;
	pthread_mutex_t ssl_mu;
	bool connecting;           /* in nconn_connect: it reports TLS failures */
	_Atomic bool tls_failed;   /* a TLS error (not a socket one) broke c */
	char tls_why[256];         /* its reason; written once, before tls_failed */

	void (*unreg_fn)(void *, struct nconn *);
	_Atomic(void *) unreg_arg; /* non-NULL while a server tracks c */
};

/* client.c */
/* The monotonic-ns deadline ms from now (UINT64_MAX: ms < 0, no deadline). */
uint64_t nconn_deadline_after(int ms);
/* poll fd for ev until deadline: 0, -ETIMEDOUT or -errno. */
int nconn_wait_fd(int fd, short ev, uint64_t deadline);
/* One recv through TLS or the socket: bytes, 0 at EOF, -EAGAIN (*want
 * says what to wait for) or -errno. */
ssize_t nconn_io_recv(struct nconn *c, void *buf, size_t len, short *want);
/* Write all of buf (send_mu held); *sent tells how far it got. */
int nconn_write_all(struct nconn *c, const uint8_t *buf, size_t len, size_t *sent);
/* Send a built frame with send_mu held; see client.c for when it sticks. */
int nconn_send_frame_locked(struct nconn *c, const uint8_t *frame, size_t len);
/* Read exactly len bytes, read-ahead first; *got tells how far it got. */
int nconn_read_exact(struct nconn *c, uint8_t *buf, size_t len, uint64_t deadline, size_t *got);

/* client_file.c */
/* Close the splice pipe (it may hold bytes of a failed transfer). */
void nconn_pipe_drop(struct nconn *c);

#endif
