/* engine_ec.h: the erasure-coded scheme `redundancy=rs:K+M` (redund_rs of
 * cluster/redund.h) inside the engine. Shared by engine_ec.c (settings,
 * what a step's parity holding holds, protecting a step, the data
 * requests) and engine_ec_rst.c (restoring a lost shard from fragments);
 * the holding itself (record, directory, scan, drop) is the RAM tier's
 * (ram_parity_open), collected by the retention plan;
 * the engine's other files reach the scheme through redund.h, and call
 * only the setting and data-request hooks below. Under rs the step's
 * replication is replaced by the code: no replica is pushed.
 *
 * Protect, after a seal, on the replication worker:
 *   1. the owner stores its manifest as m<R>.mf in its holding of the step
 *      (RAMDIR/shards/JOB/STEP/parity/) and sends it
 *      (ec_meta) to every other unit of its group;
 *   2. a node holding every manifest of its group (sizes and hashes: the
 *      geometry) sends, for each piece t of its own shard, the data
 *      fragment (ec_frag_data) to the M parity holders of its codeword
 *      (ec_data + one NT_FILE);
 *   3. a holder folds each arriving fragment into its parity slot
 *      (ec_enc_add) and, with all K folded, writes g<G>-c<CW>-s<SLOT>.frag;
 *      once all its M slots are written it tells the coordinator
 *      "replicated": the coordinator's safe step (GC) then means protected.
 * Restore: the coordinator plans a lost shard on the node itself when
 * ecplan_restorable says so (coord_ec.c); the node's restore then takes
 * its shard from eng_ec_tier(), which fetches the members (ec_get) and
 * decodes them into a stage. */
#ifndef MTCFS_CLUSTER_ENGINE_EC_H
#define MTCFS_CLUSTER_ENGINE_EC_H

#include "cluster/engine_int.h"
#include "tiers/ec.h"
#include "tiers/ecplan.h"
#include "tiers/tier.h"
#include "net/proto.h"

#include <stdbool.h>
#include <stdint.h>

/* The mount option (NULL: replication). 0 or -EINVAL with the line in err. */
int  eng_ec_start(struct eng *e, const char *redundancy, char *err, size_t errlen);
void eng_ec_stop(struct eng *e);
/* The job's replicator.yaml says `redundancy` (has false: the mount's). */
void eng_ec_set_job(struct eng *e, bool has, const struct ec_redundancy *r);
/* The redundancy in force; true when it is rs. */
bool eng_ec_get(struct eng *e, struct ec_redundancy *r);
/* A data request PROTO_EC_META, _DATA, _GET or _METAS (data server
 * thread, through engine_data.c's route table). */
void eng_ec_serve(struct eng *e, struct nconn *c, int peer, uint32_t id, json_t *req,
		  enum proto_op op);

/* ---- between engine_ec.c and engine_ec_rst.c ---- */
/* The scheme's reprotect (redund_rs): the job restored step from the
 * cluster; this node's manifest of it is stored and sent again, the parity
 * of it that is missing here (encoding cut short by a lost node, or a wiped
 * node) is rebuilt in the background, and once all of it is here the
 * coordinator is told "replicated" (at once on a node that stores no
 * parity). */
void eng_ec_restored(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp);
/* The erasure-coded tier as a restore source for this node's shards of
 * a job of `nodes`/`dp` (redund_rs's source). tier_close frees. 0 or
 * -ENOMEM. */
int eng_ec_tier(struct eng *e, uint32_t nodes, uint32_t dp, struct tier *t);
struct eng_ec_ctx {
	struct eng *e;
	struct ec_redundancy red;
	uint32_t nodes, dp;
	int rank;
	struct ecplan *plan;
	int gi, pos;            /* this node's group and position; gi -1: none */
};
/* Build the plan for this node (rank from e). 0, -ENOENT (not rs / no
 * group) or -errno. ctx_free releases it. */
int  ecx_ctx(struct eng *e, uint32_t nodes, uint32_t dp, struct eng_ec_ctx *x);
void ecx_ctx_free(struct eng_ec_ctx *x);
/* The manifest bytes buf as dirfd/name (m<R>.mf), counted in ram_size:
 * 0 when written, or when those very bytes are there already; -EEXIST
 * when other bytes are (an owner's manifest of a step is written once: a
 * restore drops the fragments of the steps it leaves behind first), or
 * -ENOSPC / -errno. */
int  ecx_store_meta(struct eng *e, int dirfd, const char *name, const void *buf, size_t len);
/* This node's own manifest of k stored (ecx_store_meta) and sent (ec_meta)
 * to every other unit of its group, each tried EC_SEND_TRIES times; on the
 * replication worker. 0, or -errno when the shard or its manifest cannot
 * be had or stored (a failed send is logged, not returned). */
int  ecx_own_meta(struct eng_ec_ctx *x, int dirfd, const struct shard_key *k);
/* Tell the coordinator: this node's part of protecting step is done. */
void ecx_send_replicated(struct eng *e, const char *job, uint64_t step, uint32_t nodes,
			 uint32_t dp);
/* The step's parity holding (ram_parity_open: record and directory made
 * when create). A dirfd or -errno. */
int  ecx_dir(struct eng *e, const char *job, uint64_t step, bool create);
/* The label of (job, step, group, cw): no fragment of another is mixed in. */
void ecx_label(const char *job, uint64_t step, unsigned gi, unsigned cw, uint8_t out[16]);
/* Read the manifests of every unit of group gi stored in dirfd: size[]
 * and hash[] (nodes entries) for ecplan_geom. 0 or -ENOENT (one missing:
 * its rank in *missing). mine (optional) gets rank's own manifest. */
int  ecx_load_metas(const struct eng_ec_ctx *x, int dirfd, uint64_t *size, uint8_t (*hash)[32],
		    int rank, struct manifest **mine, int *missing);
/* Connect a data connection to rank. 0 or -errno. */
int  ecx_connect(struct eng *e, uint32_t rank, struct nconn **c);
/* After a request answered with one NT_FILE: its bytes into a new
 * temporary file of the holding dirfd, staged through the RAM tier (*pf:
 * reserved before it is written; the caller ram_pfile_aborts it once
 * used). The fd (pf->fd) at offset 0, or -errno (nothing left behind). */
int  ecx_recv_frag(struct eng *e, struct nconn *c, int dirfd, const char *prefix,
		   struct ram_pfile *pf);
/* Work about one step of a job, run fn(job) on the replication worker
 * (fn frees it). 0 or -errno. */
struct ecx_step_job {
	struct eng *e;
	char job[RCFG_JOB_MAX + 1];
	uint64_t step;
	uint32_t nodes, dp;
};
int  ecx_submit(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp,
		void (*fn)(void *));

#endif
