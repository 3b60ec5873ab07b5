#include "net/auth.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define HELLO_LABEL   "mtcfs-hello-v1"
#define WELCOME_LABEL "mtcfs-welcome-v1"

int auth_set_secret(struct net_auth *a, const void *secret, size_t len)
{
	if (len < AUTH_SECRET_MIN || len > AUTH_SECRET_MAX)
		return -EINVAL;
	memcpy(a->secret, secret, len);
	a->secret_len = len;
	a->has_secret = true;
	return 0;
}

void auth_clear(struct net_auth *a)
{
	if (!a)
		return;
	OPENSSL_cleanse(a->secret, sizeof(a->secret));
	a->secret_len = 0;
	a->has_secret = false;
}

int auth_load_secret(const char *path, struct net_auth *out)
{
	/* one byte more than the longest line plus "\r\n" tells "too long" */
	uint8_t buf[AUTH_SECRET_MAX + 3];
	size_t have = 0, line;
	struct stat st;
	uint8_t *nl;
	int fd = -1, rc;

	out->has_secret = false;
	out->secret_len = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		rc = -errno;
		log_err("auth", "secret_file %s: %s", path, strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		log_err("auth", "secret_file %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		log_err("auth", "secret_file %s: not a regular file", path);
		goto out;
	}
	while (have < sizeof(buf)) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - have);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			log_err("auth", "secret_file %s: %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		have += (size_t)n;
		if (memchr(buf, '\n', have))
			break;
	}
	nl = memchr(buf, '\n', have);
	line = nl ? (size_t)(nl - buf) : have;
	if (line > 0 && buf[line - 1] == '\r')
		line--;
	if (line < AUTH_SECRET_MIN || line > AUTH_SECRET_MAX) {
		rc = -EINVAL;
		if (line > AUTH_SECRET_MAX)
			log_err("auth", "secret_file %s: first line is longer than %d bytes",
				path, AUTH_SECRET_MAX);
		else
			log_err("auth", "secret_file %s: first line is %zu bytes, need %d..%d",
				path, line, AUTH_SECRET_MIN, AUTH_SECRET_MAX);
		goto out;
	}
	rc = auth_set_secret(out, buf, line);
out:
	OPENSSL_cleanse(buf, sizeof(buf));
	if (fd >= 0)
		close(fd);
	return rc;
}

int auth_nonce(uint8_t out[AUTH_NONCE_LEN])
{
	return RAND_bytes(out, AUTH_NONCE_LEN) == 1 ? 0 : -EIO;
}

static int hmac(const struct net_auth *a, const uint8_t *msg, size_t len,
		uint8_t mac[AUTH_MAC_LEN])
{
	unsigned int mlen = 0;

	if (!a || !a->has_secret)
		return -EINVAL;
	if (!HMAC(EVP_sha256(), a->secret, (int)a->secret_len, msg, len, mac, &mlen) ||
	    mlen != AUTH_MAC_LEN)
		return -EIO;
	return 0;
}

static bool rank_ok(int rank)
{
	return rank >= AUTH_RANK_TOOL && rank <= AUTH_RANK_MAX;
}

/* HMAC of label || first || second || decimal rank || tail: the one layout
 * of both handshake messages (tail is "" for the welcome). */
static int mac_of(const struct net_auth *a, const char *label, const uint8_t first[AUTH_NONCE_LEN],
		  const uint8_t second[AUTH_NONCE_LEN], int rank, const char *tail,
		  uint8_t mac[AUTH_MAC_LEN])
{
	uint8_t msg[sizeof(WELCOME_LABEL) + sizeof(HELLO_LABEL) + 2 * AUTH_NONCE_LEN + 16 + 16];
	size_t n = 0, llen = strlen(label), tlen = strlen(tail);
	int k;

	memcpy(msg, label, llen);
	n += llen;
	memcpy(msg + n, first, AUTH_NONCE_LEN);
	n += AUTH_NONCE_LEN;
	memcpy(msg + n, second, AUTH_NONCE_LEN);
	n += AUTH_NONCE_LEN;
	k = snprintf((char *)msg + n, sizeof(msg) - n, "%d", rank);
	n += (size_t)k;
	memcpy(msg + n, tail, tlen);
	n += tlen;
	k = hmac(a, msg, n, mac);
	OPENSSL_cleanse(msg, sizeof(msg));
	return k;
}

int auth_hello_mac(const struct net_auth *a, const uint8_t nonce_s[AUTH_NONCE_LEN],
		   const uint8_t nonce_c[AUTH_NONCE_LEN], int rank, const char *purpose,
		   uint8_t mac[AUTH_MAC_LEN])
{
	if (!rank_ok(rank) || !purpose ||
	    (strcmp(purpose, "control") != 0 && strcmp(purpose, "data") != 0))
		return -EINVAL;
	return mac_of(a, HELLO_LABEL, nonce_s, nonce_c, rank, purpose, mac);
}

int auth_welcome_mac(const struct net_auth *a, const uint8_t nonce_c[AUTH_NONCE_LEN],
		     const uint8_t nonce_s[AUTH_NONCE_LEN], int server_rank,
		     uint8_t mac[AUTH_MAC_LEN])
{
	if (!rank_ok(server_rank))
		return -EINVAL;
	return mac_of(a, WELCOME_LABEL, nonce_c, nonce_s, server_rank, "", mac);
}

bool auth_mac_equal(const uint8_t a[AUTH_MAC_LEN], const uint8_t b[AUTH_MAC_LEN])
{
	return CRYPTO_memcmp(a, b, AUTH_MAC_LEN) == 0;
}
