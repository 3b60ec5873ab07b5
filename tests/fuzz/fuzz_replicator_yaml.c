/* fuzz_replicator_yaml: rcfg_parse() on arbitrary bytes, as the control
 * thread gets them from a replicator.yaml the application wrote.
 *
 * Besides memory and UB errors (ASan/UBSan) it aborts on a broken contract
 * of cluster/rcfg.h: a result outside {0, -ENODATA, -EINVAL}; on error a non-zero
 * *out, an -EINVAL without a message or with a newline or one that does not
 * fit 1024 bytes, an -ENODATA with a message; on success a config that
 * breaks the documented invariants, or whose canonical dump (rcfg_to_yaml)
 * does not parse back to an equal struct and to the same dump; a warning
 * with a newline; an error, warning or job name holding the value of a
 * variable rcfg_env_allowed() refuses ("s3cr3t"), or a lookup of one.
 * $VARs expand from a fixed table, so every input is deterministic. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* memmem */
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/rcfg.h"
#include "common/jobname.h"

#define ERRLEN 1024
#define DUMP_MAX 4096

static char long_value[5000];   /* longer than a scalar may become */

static const char *fuzz_env(const char *name)
{
	static const struct {
		const char *name, *value;
	} env[] = {
		{ "NODE_RANK", "3" },            { "NNODES", "8" },
		{ "JOBSET_NAME", "llama" },      { "MTCFS_YAML_EMPTY", "" },
		{ "MTCFS_YAML_FW", "pytorch" },  { "MTCFS_YAML_BAD", "x1" },
		{ "MTCFS_YAML_NEG", "-2" },      { "MTCFS_YAML_PEER", "5" },
		{ "MTCFS_YAML_DOLLAR", "$NNODES" }, { "MTCFS_YAML_ZERO", "0" },
		{ "MTCFS_YAML_BIG", "2147483648" }, { "MTCFS_YAML_A", "1" },
		{ "MTCFS_YAML_HALF", "0.5" },    { "MTCFS_YAML__", "pytorch.distributed" },
		{ "SECRET_TOKEN", "s3cr3t" },    { "PATH", "s3cr3t" },
	};

	if (!rcfg_env_allowed(name))
		abort();   /* rcfg looked up a variable it must not read */
	if (!strcmp(name, "MTCFS_YAML_LONG"))
		return long_value;
	for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++)
		if (!strcmp(env[i].name, name))
			return env[i].value;
	return NULL;
}

/* set when the input itself holds "s3cr3t": then it may be echoed */
static int secret_in_input;

static void check_warning(void *arg, const char *line)
{
	(void)arg;
	if (strchr(line, '\n') || (!secret_in_input && strstr(line, "s3cr3t")) ||
	    strncmp(line, "WARNING: ", 9))
		abort();
}

static void die(const char *what, const uint8_t *data, size_t size, const char *err)
{
	fprintf(stderr, "fuzz_replicator_yaml: %s (err \"%s\", input %zu bytes:\n%.*s\n)\n",
		what, err ? err : "", size, (int)(size < 2000 ? size : 2000), (const char *)data);
	abort();
}

static int all_zero(const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/* The invariants cluster/rcfg.h promises for a parsed config. */
static const char *check_invariants(const struct rcfg *c)
{
	if (!job_name_ok(c->job))
		return "job-name is not a valid name";
	if ((int)c->framework < RCFG_FW_ORBAX || c->framework > RCFG_FW_PYTORCH)
		return "framework outside the enum";
	if (c->node_rank < 0 || c->node_rank >= c->nodes || c->nodes > RCFG_NODES_MAX)
		return "node-rank/nodes out of range";
	if (c->nodes > 1 && c->peers_per_node > c->nodes - 1)
		return "peers-per-node not clamped to nodes - 1";
	if ((c->peer_ranks == NULL) != (c->n_peer_ranks == 0))
		return "peer_ranks and n_peer_ranks disagree";
	if (c->n_peer_ranks > 0 && c->peers_per_node != c->n_peer_ranks)
		return "peers_per_node != n_peer_ranks with peer-ranks given";
	if (c->n_peer_ranks > RCFG_PEERS_MAX || c->peers_per_node < 0 ||
	    c->peers_per_node > RCFG_PEERS_MAX)
		return "too many peers";
	for (int i = 0; i < c->n_peer_ranks; i++) {
		int v = c->peer_ranks[i];
		if (v < 0 || v >= c->nodes || v == c->node_rank)
			return "peer rank out of range or own rank";
		for (int k = 0; k < i; k++)
			if (c->peer_ranks[k] == v)
				return "peer rank listed twice";
	}
	if ((c->backup_interval_minutes > 0) == (c->backup_interval_steps > 0))
		return "not exactly one of backup interval minutes/steps";
	if (c->backup_interval_minutes < 0 || c->backup_interval_minutes > RCFG_MINUTES_MAX ||
	    c->backup_interval_steps < 0 || c->backup_interval_steps > RCFG_STEPS_MAX)
		return "backup interval out of range";
	if (c->assume_dp < 0 || (c->assume_dp > 0 && c->nodes % c->assume_dp))
		return "assume-data-parallelism does not divide nodes";
	if (c->workers_per_node < 1 || c->workers_per_node > RCFG_WORKERS_MAX)
		return "workers-per-node out of range";
	return NULL;
}

static int rcfg_equal(const struct rcfg *a, const struct rcfg *b)
{
	return !strcmp(a->job, b->job) && a->framework == b->framework &&
	       a->node_rank == b->node_rank && a->nodes == b->nodes &&
	       a->n_peer_ranks == b->n_peer_ranks &&
	       (a->n_peer_ranks == 0 ||
		!memcmp(a->peer_ranks, b->peer_ranks, (size_t)a->n_peer_ranks * sizeof(int))) &&
	       a->peers_per_node == b->peers_per_node &&
	       a->backup_interval_minutes == b->backup_interval_minutes &&
	       a->backup_interval_steps == b->backup_interval_steps &&
	       a->assume_dp == b->assume_dp && a->workers_per_node == b->workers_per_node;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	memset(long_value, '7', sizeof(long_value) - 1);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rcfg c, c2;
	char err[ERRLEN], err2[ERRLEN];
	char dump[DUMP_MAX], dump2[DUMP_MAX];
	const char *why;
	int rc, n, n2;

	if (size > RCFG_INPUT_MAX + 1)
		return 0;
	memset(err, 'X', sizeof(err));
	secret_in_input = memmem(data, size, "s3cr3t", 6) != NULL;
	rc = rcfg_parse_warn((const char *)data, size, fuzz_env, check_warning, NULL, &c, err,
			     sizeof(err));
	if (!memchr(err, '\0', sizeof(err)))
		die("err is not NUL-terminated", data, size, NULL);
	if (!secret_in_input && strstr(err, "s3cr3t"))
		die("the message shows a refused variable's value", data, size, err);
	if (rc == -ENODATA) {
		if (err[0] || !all_zero(&c, sizeof(c)))
			die("-ENODATA with a message or a non-zero *out", data, size, err);
		return 0;
	}
	if (rc == -EINVAL) {
		if (!err[0])
			die("-EINVAL without a message", data, size, err);
		if (strchr(err, '\n'))
			die("the message has a newline", data, size, err);
		if (strlen(err) >= ERRLEN - 1)
			die("the message does not fit 1024 bytes", data, size, err);
		if (!all_zero(&c, sizeof(c)))
			die("*out not zeroed on error", data, size, err);
		return 0;
	}
	if (rc != 0)
		die("unexpected return code", data, size, err);
	if (size > RCFG_INPUT_MAX)
		die("accepted an input over RCFG_INPUT_MAX", data, size, err);
	if (err[0])
		die("accepted, but with an error message", data, size, err);

	if (!secret_in_input && strstr(c.job, "s3cr3t"))
		die("the job name holds a refused variable's value", data, size, err);
	why = check_invariants(&c);
	if (why)
		die(why, data, size, err);

	/* the canonical dump parses back to the same config and the same dump */
	n = rcfg_to_yaml(&c, dump, sizeof(dump));
	if (n <= 0 || (size_t)n >= sizeof(dump) || strlen(dump) != (size_t)n)
		die("rcfg_to_yaml failed on a parsed config", data, size, err);
	rc = rcfg_parse(dump, (size_t)n, fuzz_env, &c2, err2, sizeof(err2));
	if (rc != 0)
		die("the canonical dump does not parse", (const uint8_t *)dump, (size_t)n, err2);
	if (!rcfg_equal(&c, &c2))
		die("the canonical dump parses to a different config", data, size, dump);
	n2 = rcfg_to_yaml(&c2, dump2, sizeof(dump2));
	if (n2 != n || memcmp(dump, dump2, (size_t)n))
		die("the canonical dump is not stable", data, size, dump2);
	rcfg_free(&c2);
	rcfg_free(&c);
	if (c.peer_ranks || c.n_peer_ranks)
		die("rcfg_free did not reset peer_ranks", data, size, NULL);
	return 0;
}
