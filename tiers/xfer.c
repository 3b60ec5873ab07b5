/* xfer.c — see xfer.h. */
#include "tiers/xfer.h"
#include "net/frame.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

char *xfer_b64_encode(const uint8_t *p, size_t n)
{
	size_t outlen = 4 * ((n + 2) / 3) + 1;
	char *o = malloc(outlen);
	if (o)
		EVP_EncodeBlock((unsigned char *)o, p, (int)n);
	return o;
}

static int b64_decode(const char *s, size_t slen, uint8_t **out, size_t *outlen)
{
	uint8_t *o;
	int n;
	size_t pad = 0;

	if (slen % 4 || slen > NET_MAX_PAYLOAD)
		return -EBADMSG;
	o = malloc(slen / 4 * 3 + 1);
	if (!o)
		return -ENOMEM;
	n = EVP_DecodeBlock(o, (const unsigned char *)s, (int)slen);
	if (n < 0) {
		free(o);
		return -EBADMSG;
	}
	if (slen >= 1 && s[slen - 1] == '=')
		pad++;
	if (slen >= 2 && s[slen - 2] == '=')
		pad++;
	*out = o;
	*outlen = (size_t)n - pad;
	return 0;
}

json_t *xfer_key_json(const struct shard_key *k)
{
	json_t *o = json_object();
	json_object_set_new(o, "job", json_string(k->job));
	json_object_set_new(o, "step", json_integer((json_int_t)k->step));
	json_object_set_new(o, "owner", json_integer(k->rank));
	json_object_set_new(o, "worker", json_integer(k->worker));
	return o;
}

/* Receive the files of mf into the stage: every file must arrive as an
 * NT_FILE with exactly the manifest's path and size, and its CRC32C must
 * match. Directories and symlinks come from the manifest itself. */
int xfer_recv_files(struct ram_tier *ram, struct nconn *c, struct ram_stage *st,
		    const struct manifest *mf, char *why, size_t whylen)
{
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		if (en->type == MF_DIR) {
			/* modes come from the network: no setuid/setgid/sticky bits */
			if (mkdirat(st->fd, en->path, mf_restore_mode(en) | 0700) < 0 && errno != EEXIST) {
				snprintf(why, whylen, "mkdir %s: %s", en->path, strerror(errno));
				return -errno;
			}
		} else if (en->type == MF_SYMLINK) {
			/* its target passed mf_validate in mf_decode: the rule the
			 * owner applied when it sealed the shard */
			if (symlinkat(en->target, st->fd, en->path) < 0) {
				snprintf(why, whylen, "symlink %s: %s", en->path, strerror(errno));
				return -errno;
			}
		} else if (en->type == MF_FIFO) {
			if (mkfifoat(st->fd, en->path, 0600) < 0 ||
			    fchmodat(st->fd, en->path, mf_restore_mode(en), 0) < 0) {
				snprintf(why, whylen, "mkfifo %s: %s", en->path, strerror(errno));
				return -errno;
			}
		}
	}
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		struct net_hdr h;
		json_t *m = NULL;
		const char *path;
		uint64_t size, resv;
		uint32_t crc, got;
		struct stat sb;
		int fd, rc;

		if (en->type != MF_FILE)
			continue;
		rc = nconn_recv(c, XFER_TIMEOUT_MS, &h, &m);
		if (rc < 0) {
			snprintf(why, whylen, "receiving %s: %s", en->path, strerror(-rc));
			return rc;
		}
		if (h.type == NT_ERROR) {
			rc = net_error_errno(m);
			snprintf(why, whylen, "sender failed: %s",
				 json_string_value(json_object_get(m, "error")) ?: "?");
			json_decref(m);
			return rc;
		}
		if (h.type != NT_FILE || net_file_hdr_parse(m, &path, &size, &crc) < 0 ||
		    strcmp(path, en->path) || size != en->size || crc != en->crc32c) {
			snprintf(why, whylen, "unexpected frame instead of %s", en->path);
			json_decref(m);
			return -EPROTO;
		}
		json_decref(m);
		/* a sparse file costs its data extents, not its size */
		resv = nconn_file_data(c) + 4096;
		if (ram_reserve(ram, resv) < 0) {
			snprintf(why, whylen, "RAM tier full (%s needs %llu bytes)", en->path,
				 (unsigned long long)resv);
			return -ENOSPC;
		}
		fd = openat(st->fd, en->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    mf_restore_mode(en) | 0400);
		if (fd < 0) {
			rc = -errno;
			ram_adjust(ram, -(int64_t)resv);
			snprintf(why, whylen, "create %s: %s", en->path, strerror(-rc));
			return rc;
		}
		rc = nconn_recv_file(c, fd, size, XFER_TIMEOUT_MS, &got);
		if (fstat(fd, &sb) == 0)
			ram_adjust(ram, (int64_t)sb.st_blocks * 512 - (int64_t)resv);
		close(fd);
		if (rc < 0) {
			snprintf(why, whylen, "receiving %s: %s", en->path, strerror(-rc));
			return rc;
		}
		if (got != en->crc32c) {
			snprintf(why, whylen, "%s: crc32c %08x, manifest says %08x", en->path, got,
				 en->crc32c);
			return -EBADMSG;
		}
	}
	return 0;
}

int xfer_send_files(struct nconn *c, int dirfd, const struct manifest *mf)
{
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		int fd, rc;
		if (en->type != MF_FILE)
			continue;
		fd = openat(dirfd, en->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		rc = nconn_send_file(c, en->path, fd, en->size, en->crc32c);
		close(fd);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int xfer_decode_manifest(json_t *o, struct manifest **mf, char *why, size_t whylen)
{
	const char *s;
	uint8_t *raw = NULL;
	size_t rawlen;
	int rc;

	if (net_json_str(o, "manifest", NET_MAX_PAYLOAD, &s) < 0)
		return -EBADMSG;
	rc = b64_decode(s, strlen(s), &raw, &rawlen);
	if (rc < 0)
		return rc;
	rc = mf_decode_err(raw, rawlen, mf, why, whylen);
	free(raw);
	return rc;
}
