/* auth: the shared-secret HMAC handshake of peer connections. Owns loading
 * the secret (secret_file=) and the two MACs of the mutual challenge:
 *   hello   = HMAC-SHA256(secret, "mtcfs-hello-v1"   || nonce_s || nonce_c || rank || purpose)
 *   welcome = HMAC-SHA256(secret, "mtcfs-welcome-v1" || nonce_c || nonce_s || server_rank)
 * (ranks as decimal ASCII, -1 for tools). Pure functions, any thread. A
 * struct net_auth is a plain value owned by whoever holds it; the server
 * and the client copy what they need. Wipe it with auth_clear(). */
#ifndef MTCFS_NET_AUTH_H
#define MTCFS_NET_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_NONCE_LEN  32
#define AUTH_MAC_LEN    32
#define AUTH_SECRET_MIN 16
#define AUTH_SECRET_MAX 4096
#define AUTH_RANK_TOOL  (-1)      /* admin tools, load generators */
#define AUTH_RANK_MAX   65535

struct ssl_ctx_st;

struct net_auth {
	bool has_secret;    /* false: peers are accepted without MAC checks */
	size_t secret_len;
	uint8_t secret[AUTH_SECRET_MAX];
	/* mutual TLS (net/tls.h): every connection runs inside TLS and both
	 * ends verify the other's certificate; NULL: plain TCP. Borrowed: its
	 * owner frees it after every user of the struct has stopped. */
	struct ssl_ctx_st *tls;
};

/* Read the secret: the first line of path (trailing "\n" or "\r\n"
 * stripped), 16..4096 bytes. Logs the reason on failure. 0, -errno from
 * open/read, or -EINVAL (empty, too short, too long, not a regular file).
 * out->has_secret is false after a failure. */
int auth_load_secret(const char *path, struct net_auth *out);
/* Set a secret from memory (tests, tools). 0 or -EINVAL (length). */
int auth_set_secret(struct net_auth *a, const void *secret, size_t len);
/* Wipe the secret (OPENSSL_cleanse); a becomes "no secret". */
void auth_clear(struct net_auth *a);

/* 32 random bytes (RAND_bytes). 0 or -EIO. */
int auth_nonce(uint8_t out[AUTH_NONCE_LEN]);
/* The MACs above; rank in -1..65535, purpose "control" or "data".
 * 0, -EINVAL (arguments, no secret), -EIO (OpenSSL). */
int auth_hello_mac(const struct net_auth *a, const uint8_t nonce_s[AUTH_NONCE_LEN],
		   const uint8_t nonce_c[AUTH_NONCE_LEN], int rank, const char *purpose,
		   uint8_t mac[AUTH_MAC_LEN]);
int auth_welcome_mac(const struct net_auth *a, const uint8_t nonce_c[AUTH_NONCE_LEN],
		     const uint8_t nonce_s[AUTH_NONCE_LEN], int server_rank,
		     uint8_t mac[AUTH_MAC_LEN]);
/* Constant-time comparison of two MACs. */
bool auth_mac_equal(const uint8_t a[AUTH_MAC_LEN], const uint8_t b[AUTH_MAC_LEN]);

#endif
