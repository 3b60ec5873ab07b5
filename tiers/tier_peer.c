/* tier_peer.c — a peer node's RAM tier, fetched from over a data
 * connection (see tier.h; the wire is xfer.h's). */
#include "tiers/tier.h"
#include "tiers/xfer.h"
#include "net/auth.h"
#include "net/client.h"
#include "common/log.h"
#include "common/metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct peer_tier {
	char addr[256];
	uint32_t holder;
	int my_rank;
	const struct net_auth *auth;
};

static int peer_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		    char *why, size_t whylen)
{
	struct peer_tier *p = self;
	struct nconn *conn = NULL;
	json_t *req = NULL, *resp = NULL;
	int rc;

	rc = nconn_connect(p->addr, p->my_rank, "data", p->auth, 5000, &conn, NULL);
	if (rc < 0) {
		snprintf(why, whylen, "connecting to rank %u at %s: %s", p->holder, p->addr,
			 strerror(-rc));
		return rc;
	}
	req = xfer_key_json(&g->want);
	json_object_set_new(req, "op", json_string("fetch"));
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
	nconn_close(conn);
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

static void peer_close(void *self)
{
	free(self);
}

static const struct tier_ops peer_tier_ops = {
	.name = "peer",
	.get = peer_get,
	.got = peer_got,
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
