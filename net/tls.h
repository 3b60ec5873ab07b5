/* tls: mutual TLS for peer connections (tls_cert=, tls_key=, tls_ca=), the
 * alternative (or an addition) to the shared secret of net/auth. Owns the
 * OpenSSL context both ends use and the non-blocking TLS I/O primitives
 * that net/client.c and net/server.c call instead of recv/send.
 *
 * Policy: TLS 1.3 only; both sides present a certificate and each verifies
 * the other's chain against tls_ca (a certificate signed by the cluster's
 * CA is a member). Host names are not checked: nodes are addressed by IPs
 * and pod names that change on every restart. No session tickets, so no
 * post-handshake messages arrive on an established connection.
 *
 * Threads: a context is immutable once loaded and shared by every
 * connection. One SSL object must not be entered by two threads at once:
 * net/client.c serializes its calls with a mutex, the server's loop thread
 * is alone. */
#ifndef MTCFS_NET_TLS_H
#define MTCFS_NET_TLS_H

#include <stddef.h>
#include <sys/types.h>

#include <openssl/ssl.h>

/* Load the certificate chain (PEM, leaf first), its private key and the CA
 * bundle; check that key and certificate match. *out holds one reference
 * (net_tls_free). On failure err says which file and why.
 * 0, -EINVAL (a bad file), -ENOMEM. */
int net_tls_load(const char *cert, const char *key, const char *ca, SSL_CTX **out,
		 char *err, size_t errlen);
void net_tls_free(SSL_CTX *ctx);   /* accepts NULL */

/* A new connection object on fd, client or server side. NULL on failure. */
SSL *net_tls_new(SSL_CTX *ctx, int fd, int server);

/* One step of the handshake / one I/O call on a non-blocking socket.
 * > 0: done / bytes moved; 0: the peer closed (read only); -EAGAIN with
 * *want set to POLLIN or POLLOUT: wait for that, then call again with the
 * same arguments; other -errno: the connection is broken (-EPROTO for a
 * TLS failure, described in the log line the caller writes from
 * net_tls_why). */
int net_tls_handshake(SSL *ssl, short *want);
ssize_t net_tls_read(SSL *ssl, void *buf, size_t len, short *want);
ssize_t net_tls_write(SSL *ssl, const void *buf, size_t len, short *want);
/* Why the last failed call on this thread failed, e.g. "certificate verify
 * failed (unable to get local issuer certificate)". */
const char *net_tls_why(SSL *ssl, char *buf, size_t len);
/* Send close_notify without waiting, then free. Accepts NULL. */
void net_tls_close(SSL *ssl);

#endif
