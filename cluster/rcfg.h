/* rcfg: parses and validates replicator.yaml, the per-job configuration the
 * application writes into the mount (DESIGN §3.1), and dumps it canonically
 * for the catalog.  Pure functions with no global state: the control thread
 * calls them; any thread may, given a thread-safe getenv_fn.  The caller owns
 * struct rcfg and releases it with rcfg_free() (frees peer_ranks only).
 */
#ifndef MTCFS_FS_RCFG_H
#define MTCFS_FS_RCFG_H

#include <stddef.h>

#include "common/jobname.h"
#include "tiers/ec.h"
#include "tiers/jobid.h"

#include <stdbool.h>
#include <stdint.h>

enum rcfg_framework { RCFG_FW_ORBAX, RCFG_FW_PYTORCH_DISTRIBUTED, RCFG_FW_PYTORCH };

#define RCFG_JOB_MAX     JOB_NAME_MAX   /* job-name length limit, bytes (128) */
#define RCFG_INPUT_MAX   (1 << 20)  /* replicator.yaml size limit, bytes */
#define RCFG_NODES_MAX   65536
#define RCFG_PEERS_MAX   64         /* peer-ranks entries / peers-per-node */
#define RCFG_WORKERS_MAX 64
#define RCFG_MINUTES_MAX 525600     /* one year */
#define RCFG_STEPS_MAX   1000000000

struct rcfg {
	char job[RCFG_JOB_MAX + 1];     /* [A-Za-z0-9._-], not starting with '.' or '-' */
	enum rcfg_framework framework;  /* default orbax if key absent */
	int node_rank, nodes;           /* 0 <= node_rank < nodes <= RCFG_NODES_MAX */
	int *peer_ranks; int n_peer_ranks; /* owned; NULL/0 when peers-per-node was
	                                      given (or peer-ranks was an empty list) */
	int peers_per_node;             /* == n_peer_ranks when peer-ranks given;
	                                   default 1 if neither key; at most
	                                   nodes - 1 when nodes > 1 */
	int backup_interval_minutes;    /* 0 when backup-interval-steps given
	                                   or the minutes were 0; default 30 if
	                                   neither; whole minutes (fractions
	                                   rounded up), else >= 1 */
	int backup_interval_steps;      /* 0 unless given; 1 for minutes 0
	                                   (GKE: a backup every step) */
	int assume_dp;                  /* assume-data-parallelism, 0 = not set;
	                                   else divides nodes */
	int workers_per_node;           /* default 1; 1..RCFG_WORKERS_MAX */
	bool has_redundancy;            /* redundancy: given (else the mount option's) */
	struct ec_redundancy redundancy; /* replication or rs:K+M (tiers/ec.h) */
};

/* Parse and validate replicator.yaml held in buf[0..len) (need not be
 * NUL-terminated; buf is only read during the call; at most RCFG_INPUT_MAX).
 * What GKE's replicator runs is accepted (README: "GKE replicator vs mtcfs").
 *
 * Grammar: one YAML document whose top level is a mapping.  Keys read:
 * job-name, framework (orbax | pytorch.distributed | pytorch), node-rank,
 * nodes, peer-ranks (sequence of ints), peers-per-node, backup-interval-
 * minutes (a number; fractions are rounded up to whole minutes; 0 is every
 * step, i.e. backup-interval-steps 1) or
 * backup-interval-steps, assume-data-parallelism, workers-per-node,
 * redundancy (mtcfs's own: replication | rs:K+M, ec_parse_redundancy), and
 * GKE's master / master-port (accepted, not used: the coordinator comes from
 * mount options).  Any other key, a repeated key (the last one counts), both
 * peer keys (peer-ranks wins, as in GKE), peer-ranks naming this node or a
 * rank twice (dropped), peers-per-node above what nodes allow (clamped to
 * min(nodes - 1, RCFG_PEERS_MAX)), both interval keys (minutes win) and an
 * assume-data-parallelism that does not divide nodes (ignored) are accepted
 * with a warning line.
 *
 * $VARs: in every value scalar, whatever its quoting, $NAME (NAME =
 * [A-Za-z0-9_]+, longest) and ${NAME} are replaced as Python's
 * os.path.expandvars does, but only for names rcfg_env_allowed() accepts,
 * read through getenv_fn (NULL: getenv).  Others, and unset ones, stay as
 * written.  Values are not re-expanded; keys never are.
 *
 * Integers are read as GKE reads them: a plain scalar that YAML 1.1 resolves
 * as an int (0x1f, 0b11, 010 = 8, 1_000, 1:30 = 90) is that int; any other
 * text (quoted, or after expansion) as Python's int() ("010" = 10, " 7 ").
 * Anchors, aliases and tags other than !, !!str, !!int (scalars), !!seq and
 * !!map are rejected.  YAML syntax errors are reported before any other
 * error; collections nested deeper than 8 are refused.
 *
 * Returns 0 and fills *out (release with rcfg_free), then passes each
 * warning to warn_fn(warn_arg, line) (one line, no newline, starting
 * "WARNING: "; warn_fn may be NULL); or:
 *   -ENODATA  buf is empty or only whitespace (optionally after a UTF-8 BOM):
 *             the caller deletes and ignores the file; err is left empty.
 *             A file of only comments is -EINVAL ("no YAML document");
 *   -EINVAL   anything else wrong (bad arguments included); err receives one
 *             message naming the key (with its line) and the offending value
 *             quoted AS WRITTEN -- never its expansion, which may come from
 *             the environment -- unprintable bytes escaped, no newline; no
 *             warnings are passed;
 *   -ENOMEM   allocation failed.
 * On any error *out is zeroed (no allocation to free).  err may be NULL or
 * errlen 0; messages are truncated to errlen (1024 bytes hold any of them).
 */
typedef void (*rcfg_warn_fn)(void *arg, const char *line);
int rcfg_parse_warn(const char *buf, size_t len, const char *(*getenv_fn)(const char *name),
                    rcfg_warn_fn warn_fn, void *warn_arg, struct rcfg *out, char *err,
                    size_t errlen);

/* rcfg_parse_warn() without warnings. */
int rcfg_parse(const char *buf, size_t len, const char *(*getenv_fn)(const char *name),
               struct rcfg *out, char *err, size_t errlen);

/* 1 if a $NAME in replicator.yaml may read the daemon's environment: the
 * names Kubernetes/JobSet/torchrun give a training pod (JOBSET_NAME,
 * JOB_NAME, REPLICATED_JOB_NAME, JOB_INDEX, JOB_COMPLETION_INDEX,
 * JOB_GLOBAL_INDEX, NODE_RANK, NNODES, NUM_NODES, WORLD_SIZE, RANK,
 * MASTER_ADDR, MASTER_PORT, NODE_NAME, KUBE_NODE_NAME, POD_NAME,
 * POD_NAMESPACE, POD_IP, HOSTNAME) and MTCFS_YAML_<anything>; else 0. */
int rcfg_env_allowed(const char *name);

/* Frees c->peer_ranks and resets it to NULL/0; accepts NULL. */
void rcfg_free(struct rcfg *c);

/* Canonical YAML dump of a valid config (one key per line in a fixed order,
 * job-name double-quoted, optional keys only when set), NUL-terminated in
 * buf.  rcfg_parse() of the result yields an equal struct.  Returns the
 * length without the NUL, -ENOSPC if buf is too small (contents then
 * unspecified), -EINVAL if c or buf is NULL or c->job is not a valid name. */
int rcfg_to_yaml(const struct rcfg *c, char *buf, size_t len);

/* The key value of f ("orbax", "pytorch.distributed", "pytorch"); a static
 * string, "unknown" for values outside the enum. */
const char *rcfg_framework_name(enum rcfg_framework f);

/* Shards per node and step of job c: workers-per-node with framework:
 * pytorch (each worker's .save file is its own shard), else 1. */
uint32_t rcfg_workers(const struct rcfg *c);

/* The job c makes this node's, as the record tiers/jobid.h holds it (set,
 * its name, node-rank, nodes, assume-data-parallelism, workers and
 * save_files from framework and workers-per-node): the one place a yaml
 * becomes an identity, for the engine and for a node without one. */
void rcfg_job_now(const struct rcfg *c, struct job_now *out);

#endif /* MTCFS_FS_RCFG_H */
