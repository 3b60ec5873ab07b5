/* proto: the typed application messages carried in NT_REQ / NT_RESP /
 * NT_EVENT frames (DESIGN §5). Owns the operation names ("op"), one C struct
 * and one encode/decode pair per message, and the {op, handler} tables each
 * endpoint dispatches through. The JSON is the wire contract: encoders emit
 * the keys in the order peers of this version always sent them (the bytes
 * are pinned by tests/unit/test_proto.c), decoders check every type and
 * bound once, so handlers read plain C fields. Pure functions, no global
 * state: any thread. Decoded strings are borrowed from the json_t they came
 * from and live as long as it; encoders return a new json_t (caller
 * json_decref) or NULL when out of memory. */
#ifndef MTCFS_NET_PROTO_H
#define MTCFS_NET_PROTO_H

#include "common/jobname.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define PROTO_OP_MAX     32u        /* "op" longer than this is malformed */
#define PROTO_JOB_MAX    JOB_NAME_MAX   /* common/jobname.h: the one limit */
#define PROTO_MAX_NODES  65536u
#define PROTO_MAX_HOLDS  4096u      /* per catalog: 64 (steps, owners) x workers */
#define PROTO_MAX_WORKERS 64u       /* RCFG_WORKERS_MAX: shards per node */
#define PROTO_STEP_MAX   (UINT64_MAX >> 1)   /* a step fits a JSON integer */
#define PROTO_ADDR_MAX   256u
#define PROTO_NAME_MAX   63u        /* a backup's name */
#define PROTO_TEXT_MAX   1000u      /* report text */
#define PROTO_ERRTEXT_MAX 4000u     /* backup_done error */

/* Every operation; the comment says who sends it to whom, in which frame. */
enum proto_op {
	PROTO_OP_UNKNOWN = 0,
	/* node -> coordinator, NT_REQ */
	PROTO_REGISTER,       /* -> {ok, [addrs]} */
	PROTO_TABLE,          /* -> {addrs} */
	PROTO_CATALOG,        /* -> a plan entry (when planned) */
	PROTO_FETCH_FAILED,   /* -> a new plan entry */
	PROTO_READY,          /* -> go, restart or a new plan entry */
	PROTO_STATUS,         /* (also mtcfs-admin) -> the job's state */
	/* node -> coordinator, NT_EVENT */
	PROTO_COMMITTED,
	PROTO_REPLICATED,
	PROTO_BACKUP_DONE,
	/* coordinator -> node, NT_RESP carrying an "op" */
	PROTO_PLAN,
	PROTO_GO,
	PROTO_RESTART,
	/* coordinator -> node, NT_EVENT */
	PROTO_LKG,
	PROTO_BACKUP,
	PROTO_REPORT,
	/* node -> node (and mtcfs-admin) on a data connection, NT_REQ */
	PROTO_PUSH,
	PROTO_FETCH,
	PROTO_LIST,
	/* erasure coding (redundancy=rs:K+M), node -> node, NT_REQ */
	PROTO_EC_META,        /* an owner's manifest to its group -> ok */
	PROTO_EC_DATA,        /* + one NT_FILE: a data fragment to a parity holder -> ok */
	PROTO_EC_GET,         /* a codeword member -> ok + one NT_FILE */
	PROTO_EC_METAS,       /* the group's manifests -> {metas} */
	/* coordinator -> node, NT_EVENT (after the others: op numbers are
	 * this build's, the names are the wire's) */
	PROTO_PEERS,          /* the rank -> address table changed */
	PROTO_OP_COUNT
};

/* "register", ...; "?" for PROTO_OP_UNKNOWN or out of range. */
const char *proto_op_name(enum proto_op op);
/* The op named s (exact, case-sensitive); PROTO_OP_UNKNOWN when none. */
enum proto_op proto_op_parse(const char *s);
/* The "op" of a received message: 0 (*op may be PROTO_OP_UNKNOWN for a
 * name this version does not know), or -EINVAL when "op" is missing, not a
 * string or longer than PROTO_OP_MAX. */
int proto_msg_op(json_t *m, enum proto_op *op);

/* ---- dispatch: one table per endpoint ---- */

/* What a handler gets: the decoded op and the frame it came in. */
struct proto_in {
	enum proto_op op;
	uint8_t type;          /* NT_REQ, NT_EVENT, ... */
	uint32_t req_id;
	int rank;              /* the peer's authenticated rank, -1 unknown */
	uint64_t conn;         /* server connection id (message endpoints) */
	void *stream;          /* the connection object (stream endpoints) */
	json_t *msg;           /* borrowed */
};

#define PROTO_T(nt)  (1u << (nt))     /* frame type bit for proto_route.types */
#define PROTO_T_ANY  0xffffu

struct proto_route {
	enum proto_op op;
	uint16_t types;        /* PROTO_T(NT_REQ) | ...: frames it is accepted in */
	void (*fn)(void *ctx, const struct proto_in *in);
};

/* Find in->msg's op in t[0..n) and call its handler with ctx. 0 when a
 * handler ran; -EINVAL when the op is missing or malformed, -ENOSYS when no
 * entry takes that op in that frame type (the caller answers a request
 * with an NT_ERROR; events are dropped). in->op is filled either way. */
int proto_dispatch(const struct proto_route *t, size_t n, void *ctx, struct proto_in *in);

/* ---- messages ----
 * Every decoder: 0, or -EINVAL with the reason in why[0..whylen) (why may
 * be NULL). Optional fields have their documented "absent" value. */

/* register {op, addr, [job, nodes, dp, [bi_min, bi_steps]]}: a node's data
 * address. The job fields are a hint (the coordinator notes the connection
 * for the job's events) and are sent together or not at all; as ever, a
 * malformed hint is ignored rather than failing the registration (job
 * NULL). bi_*: the job's backup interval, as committed carries it, so that
 * a restarted coordinator knows it before the next commit (it backed up a
 * restored step only then). */
struct proto_register {
	const char *addr;      /* <= PROTO_ADDR_MAX bytes */
	const char *job;       /* NULL: no hint */
	uint32_t nodes, dp;
	bool has_bi;           /* with job: bi_min and bi_steps are sent */
	uint32_t bi_min, bi_steps;   /* <= 1 << 20, <= 1 << 30 */
	bool want_table;       /* the reply carries "addrs" */
};
json_t *proto_register_encode(const struct proto_register *m);
int proto_register_decode(json_t *o, struct proto_register *m, char *why, size_t whylen);
/* register's reply {ok: true, [addrs], [gen]} and table's {addrs, [gen]}:
 * addrs is rank -> address, NULL where unknown (JSON null); gen the
 * table's generation (sent when > 0: a coordinator before generations
 * sent none, and a node reads its absence as 0). */
json_t *proto_addrs_reply(bool ok, bool with_addrs, char *const *addrs, uint32_t naddrs,
			  uint64_t gen);
/* The generation in a register or table reply: 0 when absent (an older
 * coordinator) or malformed. */
uint64_t proto_addrs_gen(json_t *reply);

/* peers {op, gen} (event): the coordinator's rank -> address table is at
 * generation gen (it bumps on every change); a node whose copy is older
 * fetches it again before its next push. gen >= 1. */
json_t *proto_peers_encode(uint64_t gen);
int proto_peers_decode(json_t *o, uint64_t *gen, char *why, size_t whylen);

/* The job a message is about: {job, nodes, dp}. job non-empty, nodes in
 * 1..PROTO_MAX_NODES, dp 0 (absent) or a divisor of nodes. */
struct proto_job {
	const char *name;
	uint32_t nodes, dp;
};

/* One holding in a catalog: [owner, step, hash, (worker, (content))]. */
struct proto_hold {
	uint32_t owner;        /* < the job's nodes */
	uint32_t worker;       /* < PROTO_MAX_WORKERS; 0 when absent */
	uint64_t step;
	uint8_t hash[32];
	bool has_worker;       /* encode: emit worker (always with >1 worker) */
	bool has_content;
	uint8_t content[32];   /* the content key of a worker's file */
};
/* catalog {op, job, nodes, dp, [workers], holds}: what a node holds, at
 * the start of a restore round. Decode allocates holds (proto_catalog_free). */
struct proto_catalog {
	struct proto_job job;
	uint32_t workers;      /* 0: absent (one shard per step) */
	struct proto_hold *holds;
	size_t nholds;         /* <= PROTO_MAX_HOLDS */
};
json_t *proto_catalog_encode(const struct proto_catalog *m);
int proto_catalog_decode(json_t *o, struct proto_catalog *m, char *why, size_t whylen);
void proto_catalog_free(struct proto_catalog *m);

/* fetch_failed {op, job, plan, holder, owner, step, [worker], [bucket]}:
 * the node could not restore its shard from the plan's source. holder,
 * owner and step are required (every sender always sent them, for a
 * backup too); plan and worker are ignored when malformed. */
struct proto_fetch_failed {
	const char *job;
	uint32_t plan;
	uint32_t holder, owner;      /* < PROTO_MAX_NODES */
	uint64_t step;
	uint32_t worker;             /* 0 and not sent when the first shard failed */
	bool bucket;                 /* the source was a backup */
};
json_t *proto_fetch_failed_encode(const struct proto_fetch_failed *m);
int proto_fetch_failed_decode(json_t *o, struct proto_fetch_failed *m, char *why, size_t whylen);

/* ready {op, job, plan}: the node has its shard of plan (the barrier). */
struct proto_ready {
	const char *job;
	uint32_t plan;
};
json_t *proto_ready_encode(const struct proto_ready *m);
int proto_ready_decode(json_t *o, struct proto_ready *m, char *why, size_t whylen);

/* status {op, [job]}: job NULL when absent or not a short string (the
 * reply then says known: false). */
struct proto_status {
	const char *job;
};
json_t *proto_status_encode(const struct proto_status *m);
int proto_status_decode(json_t *o, struct proto_status *m, char *why, size_t whylen);
/* status's reply {addrs, known, then when known: job, nodes_total, dp, lkg,
 * replicated_lkg, restore, plan, last_backup_step, backup_running, nodes:
 * [{rank, connected, commits: [step...]}]} (lkg, replicated_lkg,
 * last_backup_step and backup_running are null while unknown). Read by
 * mtcfs-admin, which passes its fields on in its own --json output. */
#define PROTO_STATUS_COMMITS 4
struct proto_status_node {
	bool connected;
	uint64_t commits[PROTO_STATUS_COMMITS];   /* newest first */
	uint32_t ncommits;
};
struct proto_status_reply {
	char *const *addrs;          /* rank -> address, NULL unknown */
	uint32_t naddrs;
	bool known;
	const char *job;
	uint32_t nodes_total, dp;
	bool has_lkg, has_safe, has_last_backup;
	uint64_t lkg, safe, last_backup_step;
	const char *restore;         /* "idle", "collecting", "planned" */
	uint32_t plan;
	const char *backup_running;  /* its name, NULL: none */
	const struct proto_status_node *nodes;   /* [nodes_total], rank = index */
};
json_t *proto_status_reply_encode(const struct proto_status_reply *m);

/* committed {op, job, nodes, dp, step, hash, [worker, workers], bi_min,
 * bi_steps} and replicated {op, job, nodes, dp, step, [worker, workers]}
 * (events): a node committed / replicated one of its (worker's) steps. */
struct proto_step_ev {
	struct proto_job job;
	uint64_t step;
	uint32_t worker, workers;    /* workers 1 (and neither sent) for one shard per step */
	uint8_t hash[32];            /* committed only */
	bool has_bi_min, has_bi_steps;   /* committed: the job's backup interval */
	uint32_t bi_min, bi_steps;   /* <= 1 << 20, <= 1 << 30 */
};
json_t *proto_committed_encode(const struct proto_step_ev *m);
int proto_committed_decode(json_t *o, struct proto_step_ev *m, char *why, size_t whylen);
json_t *proto_replicated_encode(const struct proto_step_ev *m);
int proto_replicated_decode(json_t *o, struct proto_step_ev *m, char *why, size_t whylen);

/* backup_done {op, job, name, step, ok, [error]} (event): a node's part
 * of a backup ended. */
struct proto_backup_done {
	const char *job;
	const char *name;            /* <= PROTO_NAME_MAX */
	uint64_t step;
	bool ok;
	const char *error;           /* NULL: absent; <= PROTO_ERRTEXT_MAX */
};
json_t *proto_backup_done_encode(const struct proto_backup_done *m);
int proto_backup_done_decode(json_t *o, struct proto_backup_done *m, char *why, size_t whylen);

/* A plan entry {op: "plan", plan, found, [notes], then when found either
 * step, source: "bucket", backup, [owner, [owners: [w0's, w1's, ...]]], or
 * step, holder, owner, hash, addr, [shards: [{worker, holder, owner, hash,
 * addr}...]]} (NT_RESP). A bucket entry's owner is the backup's node whose
 * shard the rank restores when that is not the rank itself (a backup of
 * another job size, under assume-data-parallelism); absent: its own. */
struct proto_plan_src {
	uint32_t holder, owner;
	uint8_t hash[32];
	const char *addr;
};
struct proto_plan {
	uint32_t plan;
	bool found;
	const char *notes;           /* NULL or "": not sent */
	uint64_t step;
	bool bucket;                 /* found in a backup: backup names it */
	const char *backup;
	struct proto_plan_src src;   /* found, not bucket: worker 0's source;
				      * src.addr NULL: none for this rank */
	const struct proto_plan_src *shards;   /* nshards > 1: every worker's */
	uint32_t nshards;
	/* bucket: src.owner (and, with nshards > 1, each shards[w].owner) is
	 * the backup's node to fetch; false: the rank's own */
	bool has_owner;
};
json_t *proto_plan_encode(const struct proto_plan *m);
/* Decode into m, the shards into shards[0..maxshards) (m->shards points
 * there; each must name its own index as worker). Required: plan; when
 * found, step and either backup (source "bucket") or holder, owner, hash.
 * Lenient: notes (<= PROTO_NOTES_MAX) and addr (<= 255 bytes; "" when
 * absent or malformed). */
#define PROTO_NOTES_MAX 1023u
int proto_plan_decode(json_t *o, struct proto_plan *m, struct proto_plan_src *shards,
		      size_t maxshards, char *why, size_t whylen);

/* go {op, plan} (the barrier is released), restart {op} (a new round
 * began: send the catalog again), NT_RESP. */
json_t *proto_go_encode(uint32_t plan);
json_t *proto_restart_encode(void);

/* lkg {op, job, step, [safe]} (event): the job's newest complete step, and
 * the newest step complete and replicated (has_safe). Decode drops a safe
 * above step (has_safe false). */
struct proto_lkg {
	const char *job;
	uint64_t step;
	bool has_safe;
	uint64_t safe;
};
json_t *proto_lkg_encode(const struct proto_lkg *m);
int proto_lkg_decode(json_t *o, struct proto_lkg *m, char *why, size_t whylen);

/* backup {op, job, name, step, data} (event): upload the step under name;
 * data false: only the manifest and .meta (a column mate uploads the data).
 * Decode: data absent means true. */
struct proto_backup {
	const char *job;
	const char *name;
	uint64_t step;
	bool data;
};
json_t *proto_backup_encode(const struct proto_backup *m);
int proto_backup_decode(json_t *o, struct proto_backup *m, char *why, size_t whylen);

/* report {op, job, text} (event): a line for the node's replicator.errors. */
struct proto_report {
	const char *job;
	const char *text;            /* <= PROTO_TEXT_MAX */
};
json_t *proto_report_encode(const struct proto_report *m);
int proto_report_decode(json_t *o, struct proto_report *m, char *why, size_t whylen);

/* list {op, job} (data connection, mtcfs-admin): the node's shards. */
json_t *proto_list_encode(const char *job);

/* ---- erasure coding (data connection) ----
 * ec_metas {op, job, step}; ec_data / ec_get {op, job, step, group, cw,
 * slot}; ec_meta {op, job, step, owner, manifest}; each then [to]: the rank
 * the sender means to reach (its receiver refuses the request, ESTALE, when
 * it is another rank; absent from a sender before it, then not checked). job follows the job-name
 * rule (common/jobname.h), step <= PROTO_STEP_MAX, group < PROTO_MAX_NODES,
 * cw and slot < PROTO_EC_MAX_N (tiers/ec.h's EC_MAX_N), owner a rank,
 * manifest the base64 text tiers/xfer decodes (<= NET_MAX_PAYLOAD bytes). */
#define PROTO_EC_MAX_N   32u
struct proto_ec {
	const char *job;
	uint64_t step;
	uint32_t group, cw, slot;    /* ec_data, ec_get */
	uint32_t owner;              /* ec_meta */
	const char *manifest;        /* ec_meta */
	bool has_to;                 /* "to" sent / received */
	uint32_t to;                 /* < PROTO_MAX_NODES */
};
/* op is PROTO_EC_META, _DATA, _GET or _METAS; the fields it carries are
 * encoded, in that order. NULL for another op or out of memory. */
json_t *proto_ec_encode(enum proto_op op, const struct proto_ec *m);
int proto_ec_decode(enum proto_op op, json_t *o, struct proto_ec *m, char *why, size_t whylen);

#endif
