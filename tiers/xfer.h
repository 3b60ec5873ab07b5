/* xfer: a shard's files and manifest on a data connection (DESIGN §3's
 * data requests), shared by the data server (cluster/engine_data.c), the
 * replication push and the peer tier (tier_peer.c). Keeps no state; runs
 * on the caller's thread and blocks on the connection (at most
 * XFER_TIMEOUT_MS without progress). The caller owns the connection, the
 * stage, the fds and every returned buffer. */
#ifndef MTCFS_TIERS_XFER_H
#define MTCFS_TIERS_XFER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "net/client.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/ramtier.h"

#define XFER_TIMEOUT_MS 60000

/* Base64 of p[0..n), NUL-terminated, malloc'd (caller frees), or NULL. */
char *xfer_b64_encode(const uint8_t *p, size_t n);
/* {job, step, owner, worker} of k (a new reference). */
json_t *xfer_key_json(const struct shard_key *k);
/* The "manifest" field of o (base64 of an encoded manifest), decoded and
 * validated (mf_decode_err: why says what is wrong). *mf owned by the
 * caller. 0, -EBADMSG or -ENOMEM. */
int xfer_decode_manifest(json_t *o, struct manifest **mf, char *why, size_t whylen);
/* Receive the files of mf into stage st on ram (reserving their space):
 * every file must arrive as an NT_FILE with exactly the manifest's path and
 * size, and its CRC32C must match; directories, symlinks and FIFOs come
 * from the manifest. 0 or -errno with why filled. */
int xfer_recv_files(struct ram_tier *ram, struct nconn *c, struct ram_stage *st,
		    const struct manifest *mf, char *why, size_t whylen);
/* Send every regular file of mf from dirfd, in manifest order. 0 or -errno. */
int xfer_send_files(struct nconn *c, int dirfd, const struct manifest *mf);

#endif
