/* tier_peer.c — a peer node's RAM tier, fetched from and pushed to over a
 * data connection (see tier.h; the wire is xfer.h's). */
#include "tiers/tier.h"
#include "tiers/xfer.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/frame.h"
#include "net/proto.h"
#include "common/log.h"
#include "common/metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct peer_tier {
	char addr[256];
	uint32_t holder;
	int my_rank;
	const struct net_auth *auth;
	struct tier_cut *cut;       /* NULL: not in a set */
};

struct tier_cut {
	pthread_mutex_t mu;
	bool cut;
	struct nconn **conns;       /* open ones, unordered */
	size_t n, cap;
};

int tier_cut_new(struct tier_cut **out)
{
	struct tier_cut *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	*out = c;
	return 0;
}

void tier_cut_all(struct tier_cut *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->cut = true;
	for (size_t i = 0; i < c->n; i++)
		nconn_shutdown(c->conns[i]);
	pthread_mutex_unlock(&c->mu);
}

void tier_cut_free(struct tier_cut *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->mu);
	free(c->conns);
	free(c);
}

void tier_peer_cut_by(struct tier *t, struct tier_cut *c)
{
	((struct peer_tier *)t->self)->cut = c;
}

/* Connect to the peer, registered in p's cut set: 0 or -errno
 * (-ECANCELED: the set is cut). */
static int peer_connect(struct peer_tier *p, struct nconn **out)
{
	struct tier_cut *c = p->cut;
	int rc;

	if (c) {
		pthread_mutex_lock(&c->mu);
		rc = c->cut ? -ECANCELED : 0;
		pthread_mutex_unlock(&c->mu);
		if (rc < 0)
			return rc;
	}
	rc = nconn_connect(p->addr, p->my_rank, "data", p->auth, 5000, out, NULL);
	if (rc < 0 || !c)
		return rc;
	pthread_mutex_lock(&c->mu);
	if (c->n == c->cap) {
		size_t ncap = c->cap ? 2 * c->cap : 8;
		struct nconn **nc = realloc(c->conns, ncap * sizeof(*nc));
		if (nc) {
			c->conns = nc;
			c->cap = ncap;
		}
	}
	if (c->cut || c->n == c->cap)
		rc = c->cut ? -ECANCELED : -ENOMEM;
	else
		c->conns[c->n++] = *out;
	pthread_mutex_unlock(&c->mu);
	if (rc < 0) {
		nconn_close(*out);
		*out = NULL;
	}
	return rc;
}

/* Close a connection of peer_connect (out of p's cut set first). */
static void peer_disconnect(struct peer_tier *p, struct nconn *conn)
{
	struct tier_cut *c = p->cut;

	if (c && conn) {
		pthread_mutex_lock(&c->mu);
		for (size_t i = 0; i < c->n; i++)
			if (c->conns[i] == conn) {
				c->conns[i] = c->conns[--c->n];
				break;
			}
		pthread_mutex_unlock(&c->mu);
	}
	nconn_close(conn);
}

static int peer_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		    char *why, size_t whylen)
{
	struct peer_tier *p = self;
	struct nconn *conn = NULL;
	json_t *req = NULL, *resp = NULL;
	int rc;

	rc = peer_connect(p, &conn);
	if (rc < 0) {
		snprintf(why, whylen, "connecting to rank %u at %s: %s", p->holder, p->addr,
			 strerror(-rc));
		return rc;
	}
	req = xfer_key_json(&g->want);
	json_object_set_new(req, "op", json_string(proto_op_name(PROTO_FETCH)));
	rc = nconn_call(conn, req, &resp, XFER_TIMEOUT_MS);
	if (rc < 0) {
		snprintf(why, whylen, "rank %u refused the fetch: %s", p->holder, strerror(-rc));
		goto out;
	}
	rc = xfer_decode_manifest(resp, mf, why, whylen);
	if (rc < 0) {
		log_warn("engine", "rank %u sent a manifest that is refused: %s", p->holder, why);
	}
	if (rc < 0 || !g->hash || memcmp((*mf)->hash, g->hash, 32)) {
		snprintf(why, whylen, "rank %u sent a manifest that does not match the plan", p->holder);
		rc = -EBADMSG;
		goto out;
	}
	rc = ram_stage_begin(g->ram, &g->as, st);
	if (rc == 0)
		rc = xfer_recv_files(g->ram, conn, st, *mf, why, whylen);
out:
	json_decref(req);
	json_decref(resp);
	peer_disconnect(p, conn);
	return rc;
}

static void peer_got(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		     char *why, size_t whylen)
{
	struct peer_tier *p = self;

	if (rc < 0)
		return;
	metrics_add(MC_RESTORE_BYTES, mf->total);
	log_info("engine", "restored job=%s step=%llu from rank %u bytes=%llu worker=%u",
		 g->as.job, (unsigned long long)g->as.step, p->holder,
		 (unsigned long long)mf->total, g->as.worker);
}

static int peer_put(void *self, struct ram_tier *ram, const struct shard_key *k, const uint8_t *raw,
		    size_t rawlen, const struct manifest *mf)
{
	struct peer_tier *p = self;
	struct nconn *c = NULL;
	struct net_hdr h;
	json_t *req, *resp = NULL;
	char *b64;
	int dfd = -1, rc, sent;

	rc = peer_connect(p, &c);
	if (rc < 0)
		return rc;
	b64 = xfer_b64_encode(raw, rawlen);
	req = json_object();
	json_object_set_new(req, "op", json_string(proto_op_name(PROTO_PUSH)));
	json_object_set_new(req, "key", xfer_key_json(k));
	json_object_set_new(req, "manifest", json_string(b64 ? b64 : ""));
	/* the rank this replica is for: the receiver refuses it (ESTALE)
	 * when it is another, so a stale address table cannot put it on the
	 * wrong node */
	json_object_set_new(req, "to", json_integer((json_int_t)p->holder));
	free(b64);
	rc = nconn_call(c, req, &resp, XFER_TIMEOUT_MS);
	json_decref(req);
	if (rc < 0)
		goto out;
	if (json_is_true(json_object_get(resp, "have"))) {
		rc = TIER_HAD;   /* the peer had the content: nothing sent */
		goto out;
	}
	if (!json_is_true(json_object_get(resp, "send"))) {
		rc = -EPROTO;
		goto out;
	}
	json_decref(resp);
	resp = NULL;
	dfd = ram_shard_open(ram, k);
	if (dfd < 0) {
		rc = dfd;
		goto out;
	}
	sent = xfer_send_files(c, dfd, mf);
	/* A peer that refuses a file (its CRC32C, no room) answers and closes
	 * while the rest is still coming: the send breaks (EPIPE, ECONNRESET)
	 * but the answer is there to read, and it says why. */
	rc = nconn_recv(c, sent < 0 ? 1000 : XFER_TIMEOUT_MS, &h, &resp);
	if (rc == 0 && h.type == NT_ERROR)
		rc = net_error_errno(resp);
	else if (sent < 0)
		rc = sent;
	else if (rc == 0 && !json_is_true(json_object_get(resp, "ok")))
		rc = -EPROTO;
out:
	if (dfd >= 0)
		close(dfd);
	json_decref(resp);
	peer_disconnect(p, c);
	return rc;
}

static void peer_close(void *self)
{
	free(self);
}

static const struct tier_ops peer_tier_ops = {
	.name = "peer",
	.get = peer_get,
	.got = peer_got,
	.put = peer_put,
	.close = peer_close,
};

int tier_peer_open(const char *addr, uint32_t holder, int my_rank, const struct net_auth *auth,
		   struct tier *t)
{
	struct peer_tier *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->holder = holder;
	p->my_rank = my_rank;
	p->auth = auth;
	t->ops = &peer_tier_ops;
	t->self = p;
	return 0;
}
