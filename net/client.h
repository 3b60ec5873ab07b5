/* client: one authenticated peer connection (struct nconn), both ends: the
 * connecting side (nconn_connect) and the accepted "data" side that the
 * server hands to on_data. Owns the socket, the mutual HMAC handshake of
 * the client, framed send/receive with deadlines, and bulk file transfer
 * (sendfile out; splice or recv+write in, CRC32C on the way). With
 * auth->tls every byte runs through a TLS session (net/tls.h) made before
 * the HMAC handshake; file transfer then takes the copy paths.
 *
 * Threads: any number of threads may nconn_send (one send mutex keeps
 * frames, and a whole NT_FILE transfer, contiguous); one thread at a time
 * receives (nconn_recv, nconn_call, nconn_recv_file). The socket is
 * non-blocking; every wait is a poll() with a deadline. Whoever gets a
 * struct nconn owns it and frees it with nconn_close(), after the threads
 * using it have stopped. A receive or send error in the middle of a frame
 * leaves the connection failed: later calls return the same error. */
#ifndef MTCFS_NET_CLIENT_H
#define MTCFS_NET_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "net/auth.h"
#include "net/frame.h"

struct nconn;

#define NCONN_IO_TIMEOUT_MS 30000   /* default: longest wait for send progress */

/* Connect to hostport ("127.0.0.1:7000", "[::1]:7000", "localhost:7000"),
 * authenticate both ways and announce purpose "control" or "data";
 * my_rank is -1..65535 (-1: a tool). timeout_ms bounds connect and
 * handshake together. auth may be NULL (no secret). *out owned by the
 * caller; *peer_rank_out (may be NULL) gets the server's rank.
 * 0, -EINVAL (arguments), -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH (name
 * does not resolve), -EACCES (either side failed the MAC check), -EBUSY
 * (server refuses more data connections), -EBADMSG/-EPROTO (not an mtcfs
 * peer), -ECONNRESET, other -errno. With auth->tls, a certificate
 * refused by either side is -EACCES too (the reason is logged). */
int nconn_connect(const char *hostport, int my_rank, const char *purpose,
		  const struct net_auth *auth, int timeout_ms, struct nconn **out,
		  int *peer_rank_out);
/* The socket, for poll() only (it is O_NONBLOCK; read it via nconn_recv). */
int nconn_fd(const struct nconn *c);
/* The authenticated rank of the other side. */
int nconn_peer_rank(const struct nconn *c);
/* "ip:port" of the other side; valid while c lives. */
const char *nconn_peer_addr(const struct nconn *c);
/* Longest wait for send progress (nconn_send, nconn_send_file); default
 * NCONN_IO_TIMEOUT_MS; ms < 0 means wait forever. */
void nconn_set_io_timeout(struct nconn *c, int ms);

/* Send one frame with JSON payload msg (NULL: empty payload, read as {}).
 * Does NOT take ownership of msg. Thread-safe. 0, -EINVAL (type), -EMSGSIZE,
 * -ETIMEDOUT, -EPIPE/-ECONNRESET, or the sticky error of a failed conn. */
int nconn_send(struct nconn *c, uint8_t type, uint32_t req_id, json_t *msg);
/* Same with a binary payload p[0..len). */
int nconn_send_raw(struct nconn *c, uint8_t type, uint32_t req_id, const void *p,
		   uint32_t len);

/* Receive the next frame within timeout_ms (< 0: no limit, the peer's
 * death is then found by TCP keepalive). *h gets the header; *msg the
 * decoded JSON object (never NULL on success; caller decrefs). After an
 * NT_FILE frame the caller must take its raw bytes with nconn_recv_file
 * before receiving again (-EPROTO otherwise). 0, -ETIMEDOUT (nothing
 * arrived: the connection stays usable), -ECONNRESET (peer closed),
 * -EBADMSG (bad frame or JSON), -EPROTO (NT_CHALLENGE: binary, see
 * nconn_recv_raw), other -errno. */
int nconn_recv(struct nconn *c, int timeout_ms, struct net_hdr *h, json_t **msg);
/* Receive the next frame with its payload as bytes: *payload malloc'd
 * (NULL when h->len is 0), owned by the caller. Same errors. */
int nconn_recv_raw(struct nconn *c, int timeout_ms, struct net_hdr *h, uint8_t **payload);

/* Send NT_REQ req with a fresh req_id and wait up to timeout_ms for the
 * NT_RESP with that id; any other frame in between -> -EPROTO. An NT_ERROR
 * reply returns its -errno and *resp holds the error object. On success
 * *resp is the response (caller decrefs). Does not take ownership of req.
 * Use on a connection whose frames only this thread reads. */
int nconn_call(struct nconn *c, json_t *req, json_t **resp, int timeout_ms);

/* Send an NT_FILE frame {"path","size","crc32c"} and then exactly size
 * bytes of fd from offset 0 (sendfile). When the other side announced
 * "sparse" in its handshake, only fd's data extents go (SEEK_DATA /
 * SEEK_HOLE, the sparse NT_FILE of net/frame.h): a 256 MiB file with
 * 8 KiB of data costs 8 KiB on the wire and on the receiver.
 * path must be a safe relative path
 * (util_safe_relpath). The send mutex is held for the whole transfer.
 * 0, -EINVAL, -EIO (fd shorter than size: the connection is failed),
 * -ETIMEDOUT, -EPIPE/-ECONNRESET, other -errno. */
int nconn_send_file(struct nconn *c, const char *path, int fd, uint64_t size,
		    uint32_t crc32c);
/* After nconn_recv returned an NT_FILE frame: take exactly its size raw
 * bytes (size must equal the frame's "size") and write them to fd at
 * offsets 0..size-1 (fd < 0: discard them); a sparse one sets fd's length
 * with ftruncate (fd must be a new, empty file) and writes its extents
 * only, leaving holes. *crc_out gets the CRC32C of all size logical bytes;
 * comparing it with the frame's crc32c is the caller's job. fd may be
 * O_WRONLY; it is written with pwrite, its offset is not moved. timeout_ms
 * bounds the wait for each piece of progress, not the whole transfer
 * (< 0: no limit). Never reads past size. 0, -EINVAL, -EPROTO (no NT_FILE
 * pending), -ETIMEDOUT, -ECONNRESET (peer closed early), -errno of the
 * write (-ENOSPC...). Any error leaves the connection failed. */
int nconn_recv_file(struct nconn *c, int fd, uint64_t size, int timeout_ms,
		    uint32_t *crc_out);

/* After nconn_recv returned an NT_FILE frame: the bytes it will write
 * (its data extents when sparse, else its size): what to reserve. */
uint64_t nconn_file_data(const struct nconn *c);

/* Shut the socket down both ways without freeing c: a thread blocked in
 * nconn_recv/nconn_send on c returns (-ECONNRESET/-EPIPE) at once. Any
 * thread; c stays valid until nconn_close. */
void nconn_shutdown(struct nconn *c);
/* Close the socket and free c; accepts NULL. No other thread may still be
 * using c (nconn_shutdown first, join, then close). */
void nconn_close(struct nconn *c);

/* ---- for net/server.c and benchmarks ---- */

/* Wrap an accepted, authenticated socket (made non-blocking here) as a
 * "data" connection; ssl (may be NULL) is its established TLS session,
 * owned by the nconn from now on; pre[0..prelen) are bytes the server
 * already read past the handshake and are returned first. When unreg_fn is set, nconn_close
 * calls unreg_fn(unreg_arg, c) before closing the fd (the server's registry
 * of live data connections). 0 or -ENOMEM; fd is not closed on failure. */
struct ssl_st;
int nconn_from_fd(int fd, struct ssl_st *ssl, int peer_rank, const char *peer_addr,
		  const void *pre, size_t prelen, void (*unreg_fn)(void *, struct nconn *),
		  void *unreg_arg, struct nconn **out);
/* The other side takes sparse NT_FILEs (the server, from a data HELLO). */
void nconn_set_peer_sparse(struct nconn *c, bool yes);
/* Take the registration back (the server, when on_data returned without
 * closing c): true when it was still registered. */
bool nconn_unregister(struct nconn *c);
/* Socket options: keepalive (30 s idle, 3 probes 10 s apart) and a 60 s
 * TCP_USER_TIMEOUT for every peer connection; data connections also get
 * 4 MiB socket buffers and no Nagle. */
void nconn_tune_control_socket(int fd);
void nconn_tune_data_socket(int fd);

/* How nconn_recv_file moves bytes into a file (benchmarks, tests):
 * NCONN_RX_AUTO (default: the copy path, measured fastest here),
 * NCONN_RX_COPY (recv + CRC + pwrite in 1 MiB chunks), NCONN_RX_SPLICE
 * (socket -> pipe -> file, CRC read back through a mapping; needs a
 * readable fd, else it falls back to copying). Process-wide. */
enum { NCONN_RX_AUTO = 0, NCONN_RX_COPY = 1, NCONN_RX_SPLICE = 2 };
void nconn_set_rx_mode(int mode);

#endif
