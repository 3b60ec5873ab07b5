/* rcfg_i: what the two halves of the replicator.yaml reader (rcfg.c: event
 * passes, grammar, rules; rcfg_scalar.c: one scalar's expansion and number
 * forms) share and nothing else may use: the parse state and the helpers
 * each documents at its definition. One parse, one thread. */
#ifndef MTCFS_CLUSTER_RCFG_I_H
#define MTCFS_CLUSTER_RCFG_I_H

#include <stddef.h>

#include <yaml.h>

#include "cluster/rcfg.h"

#define VALUE_MAX   4096 /* a scalar after $VAR expansion, bytes */
#define VARNAME_MAX 255
#define DEPTH_MAX   8    /* collection nesting; the grammar needs 2 */
#define QUOTE_SHOW  64   /* value bytes shown in a message before "..." */
#define QBUF        (QUOTE_SHOW * 4 + 8)

#define TAG_STR "tag:yaml.org,2002:str"
#define TAG_INT "tag:yaml.org,2002:int"
#define TAG_SEQ "tag:yaml.org,2002:seq"
#define TAG_MAP "tag:yaml.org,2002:map"

enum key_id {
	K_JOB, K_FRAMEWORK, K_NODE_RANK, K_NODES, K_PEER_RANKS, K_PEERS_PER_NODE,
	K_MINUTES, K_STEPS, K_DP, K_WORKERS, K_MASTER, K_MASTER_PORT, K_REDUNDANCY, K_COUNT
};

/* T_MINUTES: a number, fractions allowed (GKE multiplies it by 60);
 * T_IGNORED: GKE's own coordinator address (master, master-port): mtcfs
 * takes its coordinator from mount options, so any scalar is accepted. */
enum key_type { T_STR, T_INT, T_INTLIST, T_MINUTES, T_IGNORED };

#define WARN_MAX  8      /* warnings kept per file; one more says "and more" */
#define WARN_LEN  400

struct parse {
	yaml_parser_t yp;
	const char *(*getenv_fn)(const char *name);
	char *err;
	size_t errlen;
	int failed;

	unsigned seen;                  /* bit per enum key_id */
	size_t line[K_COUNT];           /* 1-based line of each key seen */
	long long ival[K_COUNT];
	int *list;                      /* peer-ranks, RCFG_PEERS_MAX slots */
	int nlist;
	char job[RCFG_JOB_MAX + 1];
	enum rcfg_framework fw;
	struct ec_redundancy red;        /* redundancy (tiers/ec.h) */

	double minutes;                 /* backup-interval-minutes as written */

	char val[VALUE_MAX + 1];        /* the current scalar, expanded */
	size_t vlen;
	char raw[QBUF];                 /* the current scalar as written, quoted */
	int expanded;                   /* a $VAR of it was replaced */
	char literal[VARNAME_MAX + 1];  /* first $VAR of it kept literally, or "" */
	int literal_allowed;            /* ... because it is unset (1) or not
	                                   on the list (0) */

	char warn[WARN_MAX][WARN_LEN];  /* delivered only if the parse succeeds */
	int nwarn, warn_dropped;
	char ppn_err[512];              /* why peers-per-node could not be read:
	                                   fatal only without peer-ranks */
};

/* Shared by the halves; each is documented where it is defined. */
int rcfg_fail(struct parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *rcfg_quote(char dst[QBUF], const char *s, size_t n);
const char *rcfg_quote_z(char dst[QBUF], const yaml_char_t *s);
size_t rcfg_ev_line(const yaml_event_t *ev);
const char *rcfg_env_default(const char *name);
int rcfg_expand(struct parse *p, const yaml_event_t *ev, const char *subj);
const char *rcfg_note(const struct parse *p, char buf[VARNAME_MAX + 128]);
int rcfg_digits(const char *s, size_t n, int base, int yaml_us, long long *out);
int rcfg_is_space(char c);
int rcfg_scalar_to_int(const struct parse *p, const yaml_event_t *ev, long long *out);
int rcfg_scalar_int(struct parse *p, const yaml_event_t *ev, const char *subj, long long min,
		    long long max, long long *out);

#endif
