/* Unit tests for cluster/rcfg: every accepted form of replicator.yaml, every
 * rejection with the exact key and value its message must name, and the
 * canonical dump round trip. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/rcfg.h"

#define ERRLEN 512

/* Only names rcfg_env_allowed() accepts are ever looked up; SECRET_TOKEN
 * and PATH stand for what a daemon's environment may hold. */
static const char *fake_env(const char *name)
{
	static const struct {
		const char *name, *value;
	} env[] = {
		{ "NODE_RANK", "3" },          { "NNODES", "8" },
		{ "JOBSET_NAME", "llama" },    { "MTCFS_YAML_EMPTY", "" },
		{ "MTCFS_YAML_FW", "pytorch" }, { "MTCFS_YAML_BAD", "x1" },
		{ "MTCFS_YAML_NEG", "-2" },    { "MTCFS_YAML_PEER", "5" },
		{ "SECRET_TOKEN", "s3cr3t" },  { "PATH", "/s3cr3t/bin" },
		{ "MTCFS_YAML_SLASH", "a/s3cr3t" },
	};
	assert_true(rcfg_env_allowed(name));
	for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
		if (!strcmp(env[i].name, name))
			return env[i].value;
	return NULL;
}

static int parse(const char *yaml, struct rcfg *c, char *err)
{
	return rcfg_parse(yaml, strlen(yaml), fake_env, c, err, ERRLEN);
}

/* Warnings collected by parse_w(). */
struct wlog {
	char lines[16][512];
	int n;
};

static void wlog_add(void *arg, const char *line)
{
	struct wlog *w = arg;

	assert_null(strchr(line, '\n'));
	assert_true(w->n < 16);
	snprintf(w->lines[w->n++], sizeof w->lines[0], "%s", line);
}

static int parse_w(const char *yaml, struct rcfg *c, struct wlog *w)
{
	char err[ERRLEN];
	int rc = rcfg_parse_warn(yaml, strlen(yaml), fake_env, wlog_add, w, c, err, ERRLEN);

	if (rc == 0)
		for (int i = 0; i < w->n; i++)
			assert_non_null(strstr(w->lines[i], "WARNING: replicator.yaml: "));
	else
		assert_int_equal(w->n, 0);   /* warnings only for an accepted file */
	return rc;
}

/* Parses yaml, which must be valid; the caller frees *c. */
static void parse_ok(const char *yaml, struct rcfg *c)
{
	char err[ERRLEN];
	int rc = parse(yaml, c, err);

	if (rc != 0) {
		print_error("rcfg_parse returned %d (%s) for:\n%s\n", rc, err, yaml);
		fail();
	}
}

/* yaml must be rejected with -EINVAL, a zeroed *out, and a one-line message
 * containing every string of the NULL-terminated subs. */
static void check_error(const char *yaml, size_t len, const char *const *subs)
{
	struct rcfg c;
	char err[ERRLEN];
	int show = len < 2000 ? (int)len : 2000; /* yaml need not be terminated */
	int rc;

	memset(&c, 0x5a, sizeof c);
	rc = rcfg_parse(yaml, len, fake_env, &c, err, sizeof err);
	if (rc != -EINVAL) {
		print_error("expected -EINVAL, got %d (%s) for:\n%.*s\n", rc, rc ? err : "",
		            show, yaml);
		fail();
	}
	for (; *subs; subs++) {
		if (!strstr(err, *subs)) {
			print_error("message \"%s\" lacks \"%s\"; input:\n%.*s\n", err, *subs,
			            show, yaml);
			fail();
		}
	}
	assert_null(strchr(err, '\n'));
	assert_true(err[0] != '\0');
	assert_null(c.peer_ranks);
	assert_int_equal(c.n_peer_ranks, 0);
	assert_int_equal(c.nodes, 0);
	rcfg_free(&c);
}

#define EXPECT_ERROR(yaml, ...) \
	check_error((yaml), strlen(yaml), (const char *const[]){ __VA_ARGS__, NULL })

/* A minimal valid prefix that tests extend with the key under test. */
#define BASE "job-name: j\nnode-rank: 0\nnodes: 8\n"

/* ---- valid forms ---- */

static void test_direct_values(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("# replicator configuration\n"
	         "job-name: llama-70b_v2.1   # trailing comment\n"
	         "framework: pytorch.distributed\n"
	         "node-rank: 2\n"
	         "nodes: 8\n"
	         "peers-per-node: 2\n"
	         "backup-interval-minutes: 15\n"
	         "assume-data-parallelism: 2\n"
	         "workers-per-node: 4\n",
	         &c);
	assert_string_equal(c.job, "llama-70b_v2.1");
	assert_int_equal(c.framework, RCFG_FW_PYTORCH_DISTRIBUTED);
	assert_int_equal(c.node_rank, 2);
	assert_int_equal(c.nodes, 8);
	assert_null(c.peer_ranks);
	assert_int_equal(c.n_peer_ranks, 0);
	assert_int_equal(c.peers_per_node, 2);
	assert_int_equal(c.backup_interval_minutes, 15);
	assert_int_equal(c.backup_interval_steps, 0);
	assert_int_equal(c.assume_dp, 2);
	assert_int_equal(c.workers_per_node, 4);
	rcfg_free(&c);
}

static void test_defaults(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "j");
	assert_int_equal(c.framework, RCFG_FW_ORBAX);
	assert_int_equal(c.node_rank, 0);
	assert_int_equal(c.nodes, 1);
	assert_null(c.peer_ranks);
	assert_int_equal(c.n_peer_ranks, 0);
	assert_int_equal(c.peers_per_node, 1);
	assert_int_equal(c.backup_interval_minutes, 30);
	assert_int_equal(c.backup_interval_steps, 0);
	assert_int_equal(c.assume_dp, 0);
	assert_int_equal(c.workers_per_node, 1);
	rcfg_free(&c);
}

static void test_frameworks(void **state)
{
	static const struct {
		const char *text;
		enum rcfg_framework fw;
	} cases[] = {
		{ "orbax", RCFG_FW_ORBAX },
		{ "pytorch.distributed", RCFG_FW_PYTORCH_DISTRIBUTED },
		{ "pytorch", RCFG_FW_PYTORCH },
		{ "\"pytorch\"", RCFG_FW_PYTORCH },
		{ "$MTCFS_YAML_FW", RCFG_FW_PYTORCH },
	};
	char yaml[256];
	struct rcfg c;

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(yaml, sizeof yaml, BASE "framework: %s\n", cases[i].text);
		parse_ok(yaml, &c);
		assert_int_equal(c.framework, cases[i].fw);
		rcfg_free(&c);
	}
	assert_string_equal(rcfg_framework_name(RCFG_FW_ORBAX), "orbax");
	assert_string_equal(rcfg_framework_name(RCFG_FW_PYTORCH_DISTRIBUTED),
	                    "pytorch.distributed");
	assert_string_equal(rcfg_framework_name(RCFG_FW_PYTORCH), "pytorch");
	assert_string_equal(rcfg_framework_name((enum rcfg_framework)7), "unknown");
}

static void test_env_expansion(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("job-name: run-${JOBSET_NAME}-$JOBSET_NAME\n"
	         "node-rank: $NODE_RANK\n"
	         "nodes: ${NNODES}0\n"
	         "peer-ranks: [$MTCFS_YAML_PEER, \"${NODE_RANK}0\"]\n"
	         "workers-per-node: '$NODE_RANK'\n",
	         &c);
	assert_string_equal(c.job, "run-llama-llama");
	assert_int_equal(c.node_rank, 3);
	assert_int_equal(c.nodes, 80);
	assert_int_equal(c.n_peer_ranks, 2);
	assert_int_equal(c.peer_ranks[0], 5);
	assert_int_equal(c.peer_ranks[1], 30);
	assert_int_equal(c.workers_per_node, 3);
	rcfg_free(&c);

	/* "30" is out of range for 8 nodes: expansion happened inside the list. */
	EXPECT_ERROR("job-name: j\nnode-rank: $NODE_RANK\nnodes: $NNODES\n"
	             "peer-ranks: [$MTCFS_YAML_PEER, \"${NODE_RANK}0\"]\n",
	             "'peer-ranks' entry 30 is out of range");

	parse_ok("job-name: \"${JOBSET_NAME}\"\nnode-rank: \"${NODE_RANK}\"\nnodes: \"$NNODES\"\n"
	         "peer-ranks: [$MTCFS_YAML_PEER]\n",
	         &c);
	assert_string_equal(c.job, "llama");
	assert_int_equal(c.node_rank, 3);
	assert_int_equal(c.nodes, 8);
	assert_int_equal(c.n_peer_ranks, 1);
	assert_int_equal(c.peer_ranks[0], 5);
	rcfg_free(&c);

	/* GKE (os.path.expandvars, run side by side): an unset variable, "${"
	 * without '}', a bare '$' and "${}" stay as written. */
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 1\nmaster: \"$MASTER_ADDR:${X\"\n"
	         "framework: \"orbax\"\n", &c);
	rcfg_free(&c);
}

static void test_env_real_getenv(void **state)
{
	struct rcfg c;
	char err[ERRLEN];
	const char *yaml = "job-name: j\nnode-rank: ${MTCFS_YAML_TEST_RANK}\nnodes: 4\n";

	(void)state;
	assert_int_equal(setenv("MTCFS_YAML_TEST_RANK", "2", 1), 0);
	assert_int_equal(rcfg_parse(yaml, strlen(yaml), NULL, &c, err, sizeof err), 0);
	assert_int_equal(c.node_rank, 2);
	rcfg_free(&c);
	assert_int_equal(unsetenv("MTCFS_YAML_TEST_RANK"), 0);
	assert_int_equal(rcfg_parse(yaml, strlen(yaml), NULL, &c, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "got \"${MTCFS_YAML_TEST_RANK}\" ($MTCFS_YAML_TEST_RANK "
	                            "is not set)"));
}

/* The daemon's environment never reaches a file a mount user reads. */
static void test_env_secrets(void **state)
{
	struct rcfg c;
	char err[ERRLEN];
	struct wlog w = { 0 };
	static const char *const bad[] = {
		"job-name: $SECRET_TOKEN\nnode-rank: 0\nnodes: 1\n",
		"job-name: \"${SECRET_TOKEN}\"\nnode-rank: 0\nnodes: 1\n",
		"job-name: x-$PATH\nnode-rank: 0\nnodes: 1\n",
		"job-name: j\nnode-rank: $SECRET_TOKEN\nnodes: 1\n",
		"job-name: j\nnode-rank: 0\nnodes: 1\nframework: $PATH\n",
		/* allowed but invalid: quoted as written, not expanded */
		"job-name: $MTCFS_YAML_SLASH\nnode-rank: 0\nnodes: 1\n",
		"job-name: j\nnode-rank: 0\nnodes: ${MTCFS_YAML_SLASH}\n",
	};

	(void)state;
	assert_true(rcfg_env_allowed("NODE_RANK"));
	assert_true(rcfg_env_allowed("MTCFS_YAML_X"));
	assert_false(rcfg_env_allowed("MTCFS_YAML_"));
	assert_false(rcfg_env_allowed("SECRET_TOKEN"));
	assert_false(rcfg_env_allowed("GOOGLE_APPLICATION_CREDENTIALS"));
	assert_false(rcfg_env_allowed("PATH"));
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		memset(err, 0, sizeof err);
		assert_int_equal(rcfg_parse(bad[i], strlen(bad[i]), fake_env, &c, err, sizeof err),
		                 -EINVAL);
		if (strstr(err, "s3cr3t")) {
			print_error("secret in \"%s\"\n", err);
			fail();
		}
	}
	EXPECT_ERROR("job-name: $SECRET_TOKEN\nnode-rank: 0\nnodes: 1\n",
	             "line 1: 'job-name' \"$SECRET_TOKEN\" cannot be used as a file name",
	             "$SECRET_TOKEN is not expanded: not a variable mtcfs reads");
	EXPECT_ERROR("job-name: $MTCFS_YAML_SLASH\nnode-rank: 0\nnodes: 1\n",
	             "'job-name' \"$MTCFS_YAML_SLASH\" cannot be used as a file name",
	             "(after $VAR expansion)");
	/* a secret in an accepted value: kept literal, the warning names only
	 * the variable */
	memset(&w, 0, sizeof w);
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 1\nmaster: $SECRET_TOKEN\n",
	                         &c, &w), 0);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "line 4: 'master': $SECRET_TOKEN is not a variable "
	                                   "mtcfs expands"));
	assert_null(strstr(w.lines[0], "s3cr3t"));
	rcfg_free(&c);
}

/* GKE: plain scalars are YAML 1.1 ints (PyYAML), anything else Python's
 * int() -- checked by running util.read_config on each of these. */
static void test_quoted_ints(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("job-name: j\nnode-rank: '3'\nnodes: \"8\"\nworkers-per-node: !!int \"2\"\n"
	         "backup-interval-minutes: !!str 45\npeers-per-node: +2\n"
	         "assume-data-parallelism: 004\n",
	         &c);
	assert_int_equal(c.node_rank, 3);
	assert_int_equal(c.nodes, 8);
	assert_int_equal(c.workers_per_node, 2);
	assert_int_equal(c.backup_interval_minutes, 45);
	assert_int_equal(c.peers_per_node, 2);
	assert_int_equal(c.assume_dp, 4);
	rcfg_free(&c);
	/* GKE: nodes: 010 -> 8, "010" -> 10, 08 -> 8, 0b11 -> 3, 0x10 -> 16,
	 * 1_0 -> 10, "1_0" -> 10, " 7 " -> 7, 1:30 -> 90, "-0" -> 0 */
	parse_ok("job-name: j\nnode-rank: 08\nnodes: 0x10\nworkers-per-node: \" 7 \"\n"
	         "backup-interval-minutes: 1:30\npeers-per-node: 0b11\n"
	         "assume-data-parallelism: \"1_6\"\n", &c);
	assert_int_equal(c.node_rank, 8);
	assert_int_equal(c.nodes, 16);
	assert_int_equal(c.workers_per_node, 7);
	assert_int_equal(c.backup_interval_minutes, 90);
	assert_int_equal(c.peers_per_node, 3);
	assert_int_equal(c.assume_dp, 16);
	rcfg_free(&c);
	parse_ok("job-name: j\nnode-rank: 010\nnodes: \"010\"\n", &c);
	assert_int_equal(c.node_rank, 8);
	assert_int_equal(c.nodes, 10);
	rcfg_free(&c);
	/* GKE: job-name: 010 is the int 8, and its files are named 8-s... */
	parse_ok("job-name: 010\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "8");
	rcfg_free(&c);
	/* GKE (run): "010" -> 10, 08 -> 8, " 5 " -> 5, 1_1 -> 11 (util.try_parse_int) */
	parse_ok("job-name: \"010\"\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "10");
	rcfg_free(&c);
	parse_ok("job-name: 08\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "8");
	rcfg_free(&c);
	parse_ok("job-name: \" 5 \"\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "5");
	rcfg_free(&c);
	parse_ok("job-name: \"1_1\"\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "11");
	rcfg_free(&c);
	parse_ok("job-name: 123\nnode-rank: 0\nnodes: 1\n", &c);
	assert_string_equal(c.job, "123");
	rcfg_free(&c);
}

static void test_peer_ranks(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	parse_ok(BASE "peer-ranks: [1, 2, 7]\n", &c);
	assert_int_equal(c.n_peer_ranks, 3);
	assert_int_equal(c.peers_per_node, 3);
	assert_int_equal(c.peer_ranks[0], 1);
	assert_int_equal(c.peer_ranks[1], 2);
	assert_int_equal(c.peer_ranks[2], 7);
	rcfg_free(&c);
	assert_null(c.peer_ranks);
	assert_int_equal(c.n_peer_ranks, 0);

	parse_ok(BASE "peer-ranks:\n  - 4\n  - \"6\"\n", &c);
	assert_int_equal(c.n_peer_ranks, 2);
	assert_int_equal(c.peers_per_node, 2);
	assert_int_equal(c.peer_ranks[0], 4);
	assert_int_equal(c.peer_ranks[1], 6);
	rcfg_free(&c);

	/* An empty list: no replication, same as peers-per-node: 0. */
	parse_ok(BASE "peer-ranks: []\n", &c);
	assert_null(c.peer_ranks);
	assert_int_equal(c.n_peer_ranks, 0);
	assert_int_equal(c.peers_per_node, 0);
	rcfg_free(&c);

	/* GKE replicates to the ranks as listed, itself and twice included;
	 * mtcfs drops those with a warning. */
	assert_int_equal(parse_w("job-name: j\nnode-rank: 2\nnodes: 8\n"
	                         "peer-ranks: [1, 2, 3, 1]\n", &c, &w), 0);
	assert_int_equal(c.n_peer_ranks, 2);
	assert_int_equal(c.peer_ranks[0], 1);
	assert_int_equal(c.peer_ranks[1], 3);
	assert_int_equal(c.peers_per_node, 2);
	assert_int_equal(w.n, 2);
	assert_non_null(strstr(w.lines[0], "'peer-ranks' entry 2 is this node's own "
	                                   "'node-rank': ignored"));
	assert_non_null(strstr(w.lines[1], "'peer-ranks' lists 1 twice"));
	rcfg_free(&c);
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 1\npeer-ranks: [0]\n", &c);
	assert_int_equal(c.n_peer_ranks, 0);
	assert_int_equal(c.peers_per_node, 0);
	rcfg_free(&c);
}

/* GKE precedence (restore.py sends peer-ranks when present and the
 * coordinator then ignores peers-per-node; run side by side: peer-ranks
 * [3] with peers-per-node 1 on 4 nodes -> peer 3; [] with 2 -> none). */
static void test_both_peer_keys(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 4\npeer-ranks: [3]\n"
	                         "peers-per-node: 1\n", &c, &w), 0);
	assert_int_equal(c.n_peer_ranks, 1);
	assert_int_equal(c.peer_ranks[0], 3);
	assert_int_equal(c.peers_per_node, 1);
	assert_int_equal(w.n, 0);
	rcfg_free(&c);
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 4\npeers-per-node: 2\npeer-ranks: []\n", &c);
	assert_null(c.peer_ranks);
	assert_int_equal(c.peers_per_node, 0);
	rcfg_free(&c);
	/* GKE (run): with peer-ranks, a peers-per-node that is no number
	 * ("$PPN" unset, -1) is never read; alone it is still an error */
	memset(&w, 0, sizeof w);
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 4\npeers-per-node: $PPN\n"
	                         "peer-ranks: [1]\n", &c, &w), 0);
	assert_int_equal(c.peers_per_node, 1);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "'peers-per-node' (line 4) ignored: peer-ranks is "
	                                   "given (line 4: 'peers-per-node' expects a "
	                                   "non-negative integer, got \"$PPN\""));
	rcfg_free(&c);
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 4\npeer-ranks: [1]\npeers-per-node: -1\n", &c);
	rcfg_free(&c);
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 4\npeers-per-node: $PPN\n",
	             "line 4: 'peers-per-node' expects a non-negative integer, got \"$PPN\"");
	/* the first error is still the one reported */
	EXPECT_ERROR("job-name: j\nnode-rank: x\nnodes: 4\npeers-per-node: -1\n",
	             "'node-rank' expects");
	/* peers-per-node may then be anything GKE would not look at */
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 4\npeers-per-node: 9\npeer-ranks: [1, 2]\n",
	         &c);
	assert_int_equal(c.peers_per_node, 2);
	rcfg_free(&c);
}

/* What the NeMo reference writes, with GKE's own master keys. */
static void test_nemo_reference_yaml(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	assert_int_equal(parse_w("job-name: nemo-run\nframework: pytorch.distributed\n"
	                         "node-rank: 1\nnodes: 2\npeer-ranks: [0]\npeers-per-node: 1\n"
	                         "backup-interval-minutes: 30\n"
	                         "master: tcp://nemo-run-0.nemo:4242\nmaster-port: 4242\n",
	                         &c, &w), 0);
	assert_string_equal(c.job, "nemo-run");
	assert_int_equal(c.framework, RCFG_FW_PYTORCH_DISTRIBUTED);
	assert_int_equal(c.node_rank, 1);
	assert_int_equal(c.nodes, 2);
	assert_int_equal(c.n_peer_ranks, 1);
	assert_int_equal(c.peer_ranks[0], 0);
	assert_int_equal(w.n, 0);
	rcfg_free(&c);
	/* a value that cannot be read at all is an error, also here */
	EXPECT_ERROR(BASE "master-port: \"1\\0\"\n", "'master-port'", "contains a NUL character");
	EXPECT_ERROR(BASE "master: \"a\\0\"\n", "'master'", "contains a NUL character");
	/* a port GKE could not bind: ignored (mtcfs does not use it) */
	assert_int_equal(parse_w(BASE "master-port: http\nmaster: [a]\n", &c, &w), -EINVAL);
	memset(&w, 0, sizeof w);
	assert_int_equal(parse_w(BASE "master-port: 70000\nmaster: \"\"\n", &c, &w), 0);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "line 4: 'master-port' \"70000\" is not a port"));
	rcfg_free(&c);
}

static void test_peers_per_node_forms(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	parse_ok(BASE "peers-per-node: 7\n", &c);
	assert_int_equal(c.peers_per_node, 7);
	rcfg_free(&c);
	parse_ok(BASE "peers-per-node: 0\n", &c);
	assert_int_equal(c.peers_per_node, 0);
	rcfg_free(&c);
	/* A single node has no peers whatever is asked; not an error. */
	parse_ok("job-name: j\nnode-rank: 0\nnodes: 1\npeers-per-node: 3\n", &c);
	assert_int_equal(c.peers_per_node, 3);
	rcfg_free(&c);
	/* GKE (run): peers-per-node = nodes gives every other node, silently */
	assert_int_equal(parse_w(BASE "peers-per-node: 8\n", &c, &w), 0);
	assert_int_equal(c.peers_per_node, 7);
	assert_int_equal(w.n, 0);
	rcfg_free(&c);
	/* GKE (run): more than nodes gives {r^1, r} -- the node itself; mtcfs
	 * uses every other node and says so */
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 2\npeers-per-node: 3\n",
	                         &c, &w), 0);
	assert_int_equal(c.peers_per_node, 1);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "'peers-per-node' 3 is more than this job can use: "
	                                   "clamped to 1"));
	rcfg_free(&c);
	memset(&w, 0, sizeof w);
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 1000\npeers-per-node: 65\n",
	                         &c, &w), 0);
	assert_int_equal(c.peers_per_node, RCFG_PEERS_MAX);
	assert_int_equal(w.n, 1);
	rcfg_free(&c);
}

static void test_steps_interval(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	parse_ok(BASE "backup-interval-steps: 100\n", &c);
	assert_int_equal(c.backup_interval_steps, 100);
	assert_int_equal(c.backup_interval_minutes, 0);
	rcfg_free(&c);
	parse_ok(BASE "backup-interval-minutes: 1\n", &c);
	assert_int_equal(c.backup_interval_minutes, 1);
	assert_int_equal(c.backup_interval_steps, 0);
	rcfg_free(&c);
	/* GKE reads only the minutes (coordinator.sync) */
	assert_int_equal(parse_w(BASE "backup-interval-minutes: 10\nbackup-interval-steps: 100\n",
	                         &c, &w), 0);
	assert_int_equal(c.backup_interval_minutes, 10);
	assert_int_equal(c.backup_interval_steps, 0);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "both given: the minutes are used"));
	rcfg_free(&c);
}

/* GKE: yaml.safe_load gives 0.5 a float, and the coordinator backs up every
 * 0.5 * 60 s; backups are named by the minute, so mtcfs rounds up. 0 is a
 * backup of every step in GKE: backup-interval-steps 1 here. */
static void test_fractional_minutes(void **state)
{
	static const struct {
		const char *text;
		int minutes, warns;
	} cases[] = {
		{ "0.5", 1, 1 },  { ".5", 1, 1 },    { "1.5", 2, 1 },    { "\"0.5\"", 1, 1 },
		{ "2.0", 2, 0 },  { "1e1", 10, 0 },  { "0", 0, 0 },      { "0.0", 0, 0 },
		{ "0.001", 1, 1 },
		{ "90.25", 91, 1 }, { "1_0.5", 11, 1 },
	};
	char yaml[256];
	struct rcfg c;

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct wlog w = { 0 };
		snprintf(yaml, sizeof yaml, BASE "backup-interval-minutes: %s\n", cases[i].text);
		if (parse_w(yaml, &c, &w) != 0) {
			print_error("rejected %s\n", cases[i].text);
			fail();
		}
		assert_int_equal(c.backup_interval_minutes, cases[i].minutes);
		/* 0: GKE backs up every step, as backup-interval-steps: 1 does */
		assert_int_equal(c.backup_interval_steps, cases[i].minutes ? 0 : 1);
		assert_int_equal(w.n, cases[i].warns);
		if (w.n)
			assert_non_null(strstr(w.lines[0], "is rounded up to"));
		rcfg_free(&c);
	}
	EXPECT_ERROR(BASE "backup-interval-minutes: -0.5\n",
	             "'backup-interval-minutes' must not be negative, got \"-0.5\"");
	EXPECT_ERROR(BASE "backup-interval-minutes: .inf\n",
	             "'backup-interval-minutes' expects a number of minutes, got \".inf\"");
	EXPECT_ERROR(BASE "backup-interval-minutes: nan\n", "expects a number of minutes");
	EXPECT_ERROR(BASE "backup-interval-minutes: 1e9\n",
	             "'backup-interval-minutes' must be at most 525600");
	EXPECT_ERROR(BASE "backup-interval-minutes: 0x1p3\n", "expects a number of minutes");
	/* Python float(): '_' only between digits (diffed against GKE's reading
	 * of 867 forms: these were accepted before) */
	EXPECT_ERROR(BASE "backup-interval-minutes: \"_1\"\n", "expects a number of minutes");
	EXPECT_ERROR(BASE "backup-interval-minutes: +_0\n", "expects a number of minutes");
	EXPECT_ERROR(BASE "backup-interval-minutes: \"1__0.5\"\n", "expects a number of minutes");
	EXPECT_ERROR(BASE "backup-interval-minutes: \"1_.5\"\n", "expects a number of minutes");
	EXPECT_ERROR(BASE "backup-interval-minutes: \"1. 5\"\n", "expects a number of minutes");
	/* plain: YAML 1.1 floats take '_' after the first digit (GKE: 5._ = 5.0) */
	parse_ok(BASE "backup-interval-minutes: 5._\n", &c);
	assert_int_equal(c.backup_interval_minutes, 5);
	rcfg_free(&c);
	parse_ok(BASE "backup-interval-minutes: 0_.5_\n", &c);
	assert_int_equal(c.backup_interval_minutes, 1);
	rcfg_free(&c);
	EXPECT_ERROR(BASE "backup-interval-minutes: ._5\n", "expects a number of minutes");
}

static void test_dp_and_workers(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("job-name: j\nnode-rank: 5\nnodes: 12\nassume-data-parallelism: 3\n"
	         "workers-per-node: 64\n",
	         &c);
	assert_int_equal(c.assume_dp, 3);
	assert_int_equal(c.workers_per_node, 64);
	rcfg_free(&c);
	parse_ok(BASE "assume-data-parallelism: 1\nworkers-per-node: 1\n", &c);
	assert_int_equal(c.assume_dp, 1);
	assert_int_equal(c.workers_per_node, 1);
	rcfg_free(&c);
	parse_ok(BASE "assume-data-parallelism: 8\n", &c);
	assert_int_equal(c.assume_dp, 8);
	rcfg_free(&c);
}

static void test_document_forms(void **state)
{
	struct rcfg c;

	(void)state;
	/* Directive, explicit markers, flow mapping, CRLF, BOM. */
	parse_ok("%YAML 1.1\n---\njob-name: a\nnode-rank: 1\nnodes: 2\n...\n", &c);
	assert_int_equal(c.node_rank, 1);
	rcfg_free(&c);
	parse_ok("{job-name: a, node-rank: 1, nodes: 2, peer-ranks: [0]}", &c);
	assert_int_equal(c.peer_ranks[0], 0);
	rcfg_free(&c);
	parse_ok("job-name: a\r\nnode-rank: 1\r\nnodes: 2\r\n", &c);
	assert_string_equal(c.job, "a");
	rcfg_free(&c);
	parse_ok("\xEF\xBB\xBFjob-name: a\nnode-rank: 1\nnodes: 2", &c);
	assert_int_equal(c.nodes, 2);
	rcfg_free(&c);
	parse_ok("\"job-name\": a\n'node-rank': 0\nnodes: 65536\n", &c);
	assert_int_equal(c.nodes, 65536);
	rcfg_free(&c);
}

static void test_empty(void **state)
{
	struct rcfg c;
	char err[ERRLEN];

	(void)state;
	assert_int_equal(rcfg_parse("", 0, fake_env, &c, err, sizeof err), -ENODATA);
	assert_string_equal(err, "");
	assert_int_equal(rcfg_parse(NULL, 0, fake_env, &c, err, sizeof err), -ENODATA);
	assert_int_equal(parse("  \n\t\r\n  \n", &c, err), -ENODATA);
	assert_int_equal(parse("\xEF\xBB\xBF\n", &c, err), -ENODATA);
	rcfg_free(&c);
	rcfg_free(NULL);
}

/* ---- errors ---- */

static void test_err_args(void **state)
{
	struct rcfg c;
	char err[ERRLEN];

	(void)state;
	assert_int_equal(rcfg_parse("a: 1", 4, fake_env, NULL, err, sizeof err), -EINVAL);
	assert_int_equal(rcfg_parse(NULL, 4, fake_env, &c, err, sizeof err), -EINVAL);
	/* No error buffer at all, and a tiny one: truncated, terminated. */
	assert_int_equal(rcfg_parse("nodes: x", 8, fake_env, &c, NULL, 0), -EINVAL);
	memset(err, 'z', sizeof err);
	assert_int_equal(rcfg_parse("nodes: x", 8, fake_env, &c, err, 8), -EINVAL);
	assert_int_equal(strlen(err), 7);
}

static void test_err_yaml_syntax(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "peer-ranks: [1, 2\n", "invalid YAML at line 5",
	             "did not find expected ',' or ']'");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 1 a: b\n", "invalid YAML at line 3",
	             "mapping values are not allowed");
	EXPECT_ERROR("job-name: \"unterminated\n", "invalid YAML",
	             "found unexpected end of stream");
	EXPECT_ERROR("job-name: \t\x01\n", "invalid YAML", "control characters");
	EXPECT_ERROR("job-name: \xff\xfe\n", "invalid YAML", "invalid");
	EXPECT_ERROR("# only a comment\n", "no YAML document", "only comments");
}

static void test_err_top_level(void **state)
{
	(void)state;
	EXPECT_ERROR("- job-name\n- nodes\n", "top level must be a mapping", "a list");
	EXPECT_ERROR("job-name\n", "top level must be a mapping", "a scalar");
	EXPECT_ERROR("---\n", "top level must be a mapping", "an empty value");
	EXPECT_ERROR(BASE "---\n" BASE, "line 4", "only one YAML document");
	EXPECT_ERROR("? [job-name]\n: j\n", "line 1", "keys must be names", "a list");
}

/* GKE ignores keys it does not read: mtcfs warns, in replicator.errors. */
static void test_err_unknown_key(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	assert_int_equal(parse_w(BASE "peer-rank: 1\nNodes: 2\nextra: {a: [1, {b: 2}]}\n"
	                         "${NNODES}: 2\n", &c, &w), 0);
	assert_int_equal(c.nodes, 8);
	assert_int_equal(w.n, 4);
	assert_string_equal(w.lines[0], "WARNING: replicator.yaml: line 4: unknown key "
	                                "\"peer-rank\" ignored");
	assert_non_null(strstr(w.lines[1], "line 5: unknown key \"Nodes\" ignored"));
	assert_non_null(strstr(w.lines[2], "line 6: unknown key \"extra\" ignored"));
	assert_non_null(strstr(w.lines[3], "unknown key \"${NNODES}\" ignored"));
	rcfg_free(&c);
	/* an unknown key does not make a bad file good */
	EXPECT_ERROR("colour: red\n", "missing required keys");
	/* more than fit: one summary line */
	memset(&w, 0, sizeof w);
	assert_int_equal(parse_w(BASE "a: 1\nb: 1\nc: 1\nd: 1\ne: 1\nf: 1\ng: 1\nh: 1\ni: 1\nj: 1\n",
	                         &c, &w), 0);
	assert_int_equal(w.n, 9);
	assert_string_equal(w.lines[8], "WARNING: replicator.yaml: 2 more warnings not shown");
	rcfg_free(&c);
}

/* PyYAML keeps the last of repeated keys (run: job-name a, b -> b). */
static void test_err_duplicate_key(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	assert_int_equal(parse_w("job-name: a\njob-name: b\nnodes: 8\nnode-rank: 0\nnodes: 3\n"
	                         "peer-ranks: [1]\npeer-ranks: [2, 1]\n", &c, &w), 0);
	assert_string_equal(c.job, "b");
	assert_int_equal(c.nodes, 3);
	assert_int_equal(c.n_peer_ranks, 2);
	assert_int_equal(c.peer_ranks[0], 2);
	assert_int_equal(w.n, 3);
	assert_non_null(strstr(w.lines[0], "line 2: duplicate key 'job-name' (first given at "
	                                   "line 1): the last one counts"));
	rcfg_free(&c);
	/* the first value is still checked */
	EXPECT_ERROR("job-name: a/b\njob-name: b\nnode-rank: 0\nnodes: 1\n", "'job-name' \"a/b\"");
}

static void test_err_wrong_type(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: [8]\n", "line 3",
	             "'nodes' expects an integer, got a list");
	EXPECT_ERROR("job-name: j\nnode-rank: {a: 1}\nnodes: 8\n",
	             "'node-rank' expects an integer, got a mapping");
	EXPECT_ERROR(BASE "workers-per-node: abc\n", "'workers-per-node'", "\"abc\"");
	/* GKE: 1.5 is a float, 1e3 and true not ints: range() would fail */
	EXPECT_ERROR(BASE "workers-per-node: 1.5\n", "'workers-per-node'", "\"1.5\"");
	EXPECT_ERROR(BASE "workers-per-node: 1e3\n", "'workers-per-node'", "\"1e3\"");
	EXPECT_ERROR(BASE "workers-per-node: \"0x10\"\n", "'workers-per-node'", "\"0x10\"");
	EXPECT_ERROR(BASE "workers-per-node: true\n", "'workers-per-node'", "\"true\"");
	EXPECT_ERROR(BASE "workers-per-node: \"4 x\"\n", "'workers-per-node'", "\"4 x\"");
	EXPECT_ERROR(BASE "workers-per-node: \"+\"\n", "'workers-per-node'", "\"+\"");
	EXPECT_ERROR(BASE "workers-per-node: \"1__0\"\n", "'workers-per-node'", "\"1__0\"");
	EXPECT_ERROR(BASE "workers-per-node: \"_1\"\n", "'workers-per-node'", "\"_1\"");
	EXPECT_ERROR(BASE "workers-per-node:\n", "'workers-per-node' expects an integer",
	             "empty value");
	EXPECT_ERROR(BASE "workers-per-node: !!float 2\n", "'workers-per-node'",
	             "unsupported tag \"tag:yaml.org,2002:float\"");
	EXPECT_ERROR("job-name: [a]\n", "'job-name' expects a string, got a list");
	EXPECT_ERROR("framework: {a: b}\n", "'framework' expects a string, got a mapping");
	EXPECT_ERROR(BASE "framework: tensorflow\n", "'framework'", "\"tensorflow\"",
	             "not one of orbax, pytorch.distributed, pytorch");
	EXPECT_ERROR(BASE "framework: Orbax\n", "'framework'", "\"Orbax\"");
	EXPECT_ERROR(BASE "peer-ranks: 1\n", "'peer-ranks' expects a list of integers", "\"1\"");
	EXPECT_ERROR(BASE "peer-ranks: {a: 1}\n", "'peer-ranks' expects a list", "a mapping");
	EXPECT_ERROR(BASE "peer-ranks: [1, [2]]\n", "'peer-ranks' entry must be an integer",
	             "a list");
	EXPECT_ERROR(BASE "peer-ranks: [1, two]\n", "'peer-ranks' entry", "\"two\"");
	EXPECT_ERROR(BASE "peer-ranks: [1, 2.0]\n", "'peer-ranks' entry", "\"2.0\"");
	EXPECT_ERROR(BASE "master: {a: 1}\n", "'master' expects a scalar, got a mapping");
}

static void test_err_missing(void **state)
{
	(void)state;
	EXPECT_ERROR("node-rank: 0\nnodes: 1\n", "missing required key: job-name");
	EXPECT_ERROR("job-name: j\nnodes: 1\n", "missing required key: node-rank");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\n", "missing required key: nodes");
	EXPECT_ERROR("framework: orbax\n", "missing required keys: job-name, node-rank, nodes");
	EXPECT_ERROR("{}", "missing required keys: job-name, node-rank, nodes");
}

static void test_err_nodes_and_rank(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 0\n", "line 3",
	             "'nodes' must be at least 1, got 0");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 65537\n",
	             "'nodes' must be at most 65536, got 65537");
	EXPECT_ERROR("job-name: j\nnode-rank: 4\nnodes: 4\n", "line 2",
	             "'node-rank' 4 must be less than 'nodes' 4", "0..3");
	EXPECT_ERROR("job-name: j\nnode-rank: 9\nnodes: 4\n",
	             "'node-rank' 9 must be less than 'nodes' 4");
	EXPECT_ERROR("job-name: j\nnode-rank: 99999999999999999999\nnodes: 4\n", "'node-rank'",
	             "\"99999999999999999999\" is too large");
	EXPECT_ERROR("job-name: j\nnode-rank: 2147483648\nnodes: 4\n", "'node-rank'",
	             "\"2147483648\" is too large");
}

static void test_err_negative(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: -1\nnodes: 4\n",
	             "'node-rank' must not be negative, got -1");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: -4\n",
	             "'nodes' must not be negative, got -4");
	EXPECT_ERROR(BASE "peers-per-node: -1\n", "'peers-per-node' must not be negative, got -1");
	EXPECT_ERROR(BASE "peer-ranks: [1, -3]\n",
	             "'peer-ranks' entry must not be negative, got -3");
	EXPECT_ERROR(BASE "backup-interval-minutes: -5\n",
	             "'backup-interval-minutes' must not be negative, got -5");
	EXPECT_ERROR(BASE "backup-interval-steps: \"-5\"\n",
	             "'backup-interval-steps' must not be negative, got -5");
	EXPECT_ERROR(BASE "assume-data-parallelism: -2\n",
	             "'assume-data-parallelism' must not be negative, got -2");
	/* expanded: the value as written, not its expansion */
	EXPECT_ERROR(BASE "workers-per-node: $MTCFS_YAML_NEG\n",
	             "'workers-per-node' must not be negative, got \"$MTCFS_YAML_NEG\" "
	             "(after $VAR expansion)");
}

static void test_err_peer_ranks(void **state)
{
	(void)state;
	/* GKE: KeyError in the coordinator (run side by side) */
	EXPECT_ERROR(BASE "peer-ranks: [1, 8]\n", "line 4", "'peer-ranks' entry 8 is out of range",
	             "'nodes' 8", "0..7");
	EXPECT_ERROR(BASE "peer-ranks: [1]\npeers-per-node: 1\npeer-ranks: [9]\n",
	             "'peer-ranks' entry 9 is out of range");
}

static void test_err_peers_per_node(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "peers-per-node: 99999999999\n", "'peers-per-node'", "is too large");
	EXPECT_ERROR(BASE "peers-per-node: x\n", "'peers-per-node' expects a non-negative integer");
}

static void test_err_peer_ranks_too_many(void **state)
{
	char yaml[1024];
	size_t o;

	(void)state;
	o = (size_t)snprintf(yaml, sizeof yaml,
	                     "job-name: j\nnode-rank: 0\nnodes: 1000\n"
	                     "peer-ranks: [");
	for (int i = 1; i <= 65; i++)
		o += (size_t)snprintf(yaml + o, sizeof yaml - o, "%s%d", i > 1 ? ", " : "", i);
	snprintf(yaml + o, sizeof yaml - o, "]\n");
	EXPECT_ERROR(yaml, "'peer-ranks' has more than 64 entries");
}

static void test_err_intervals(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "backup-interval-steps: 0\n",
	             "'backup-interval-steps' must be at least 1, got 0");
	EXPECT_ERROR(BASE "backup-interval-minutes: 525601\n",
	             "'backup-interval-minutes' must be at most 525600, got 525601");
}

static void test_err_dp(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	EXPECT_ERROR(BASE "assume-data-parallelism: 0\n",
	             "'assume-data-parallelism' must be at least 1, got 0");
	/* GKE logs an error and infers nothing (infer_missing_meta) */
	assert_int_equal(parse_w("job-name: j\nnode-rank: 0\nnodes: 6\nassume-data-parallelism: 4\n",
	                         &c, &w), 0);
	assert_int_equal(c.assume_dp, 0);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "line 4: 'nodes' 6 is not divisible by "
	                                   "'assume-data-parallelism' 4: data parallelism is not "
	                                   "assumed"));
	rcfg_free(&c);
}

static void test_err_workers(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "workers-per-node: 0\n", "'workers-per-node' must be at least 1, got 0");
	EXPECT_ERROR(BASE "workers-per-node: 65\n",
	             "'workers-per-node' must be at most 64, got 65");
}

static void test_err_job_name(void **state)
{
	char yaml[512], name[130];

	(void)state;
	EXPECT_ERROR("job-name: a/b\n", "'job-name' \"a/b\" cannot be used as a file name",
	             "found '/'");
	EXPECT_ERROR("job-name: \"a b\"\n", "'job-name' \"a b\"", "found ' '");
	EXPECT_ERROR("job-name: \"a$ b\"\n", "'job-name' \"a$ b\"", "found '$'");
	EXPECT_ERROR("job-name: .hidden\n", "'job-name' \".hidden\"",
	             "must not start with '.' or '-'");
	EXPECT_ERROR("job-name: \"-x\"\n", "'job-name' \"-x\"", "must not start with '.' or '-'");
	EXPECT_ERROR("job-name: .\n", "'job-name' \".\"", "cannot be used as a file name");
	EXPECT_ERROR("job-name: ..\n", "'job-name' \"..\"", "cannot be used as a file name");
	EXPECT_ERROR("job-name: \"\"\n", "'job-name' \"\"", "it is empty");
	EXPECT_ERROR("job-name: $MTCFS_YAML_EMPTY\n", "'job-name' \"$MTCFS_YAML_EMPTY\"",
	             "it is empty (after $VAR expansion)");
	EXPECT_ERROR("job-name: j\xc3\xb6\n", "'job-name' \"j\\xC3\\xB6\"", "found byte 0xC3");
	EXPECT_ERROR("job-name: \"a\\0b\"\n", "'job-name'", "contains a NUL character");
	EXPECT_ERROR("job-name: \"a\\tb\"\n", "'job-name' \"a\\x09b\"", "found byte 0x09");

	memset(name, 'n', 129);
	name[129] = '\0';
	snprintf(yaml, sizeof yaml, "job-name: %s\nnode-rank: 0\nnodes: 1\n", name);
	EXPECT_ERROR(yaml, "'job-name' \"nnnnnnnnnn", "...\"", "longer than 128 bytes");
	name[128] = '\0';
	{
		struct rcfg c;
		snprintf(yaml, sizeof yaml, "job-name: %s\nnode-rank: 0\nnodes: 1\n", name);
		parse_ok(yaml, &c);
		assert_string_equal(c.job, name);
		rcfg_free(&c);
	}
}

static void test_err_env(void **state)
{
	struct rcfg c;
	struct wlog w = { 0 };

	(void)state;
	/* GKE keeps unset variables as written: they fail where the literal
	 * text is not a valid value, and the message says why */
	EXPECT_ERROR("job-name: j\nnode-rank: $NODE_RANK_X\nnodes: 4\n", "line 2", "'node-rank'",
	             "got \"$NODE_RANK_X\"", "$NODE_RANK_X is not expanded");
	EXPECT_ERROR("job-name: j\nnode-rank: \"${JOB_INDEX}\"\nnodes: 4\n",
	             "got \"${JOB_INDEX}\" ($JOB_INDEX is not set)");
	/* $NAME takes the longest name: JOBSET_NAME_x is not JOBSET_NAME. */
	EXPECT_ERROR("job-name: $JOBSET_NAME_x\n", "'job-name' \"$JOBSET_NAME_x\"",
	             "$JOBSET_NAME_x is not expanded");
	EXPECT_ERROR("job-name: j\nnode-rank: ${NODE_RANK\nnodes: 4\n", "'node-rank'",
	             "\"${NODE_RANK\"");
	EXPECT_ERROR("job-name: j\nnode-rank: ${1X}\nnodes: 4\n", "'node-rank'", "\"${1X}\"");
	EXPECT_ERROR("job-name: j\nnode-rank: ${}\nnodes: 4\n", "\"${}\"");
	/* fuzzing: "${\n}" is a reference to a name with a newline; the one
	 * line of the message stays one line */
	EXPECT_ERROR("job-name: j\nnode-rank: \"${a\\nb}\"\nnodes: 4\n", "\"${a\\x0Ab}\"");
	EXPECT_ERROR("job-name: j\nnode-rank: $MTCFS_YAML_BAD\nnodes: 4\n",
	             "'node-rank' expects a non-negative integer, got \"$MTCFS_YAML_BAD\" "
	             "(after $VAR expansion)");
	EXPECT_ERROR("job-name: j\nnode-rank: $MTCFS_YAML_EMPTY\nnodes: 4\n",
	             "'node-rank' expects a non-negative integer, got \"$MTCFS_YAML_EMPTY\"");
	EXPECT_ERROR("job-name: j\nnode-rank: $\nnodes: 4\n", "'node-rank'", "\"$\"");
	EXPECT_ERROR("job-name: j\nnode-rank: 1$NODE_RANK\nnodes: 4\n",
	             "'node-rank' 13 must be less than 'nodes' 4");
	/* accepted with an unset variable: a warning */
	assert_int_equal(parse_w(BASE "master: $MASTER_ADDR\n", &c, &w), 0);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.lines[0], "'master': $MASTER_ADDR is not set; kept as written"));
	rcfg_free(&c);
}

static void test_err_anchors_tags(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnodes: &n 4\nnode-rank: 0\n", "line 2", "'nodes'",
	             "anchors are not supported", "\"n\"");
	EXPECT_ERROR("job-name: j\nnode-rank: *n\nnodes: 4\n", "'node-rank'",
	             "aliases are not supported");
	EXPECT_ERROR("&top {job-name: j}\n", "top level", "anchors are not supported");
	EXPECT_ERROR(BASE "peer-ranks: !!set [1]\n", "'peer-ranks'", "unsupported tag");
	EXPECT_ERROR("job-name: !custom j\n", "'job-name'", "unsupported tag \"!custom\"");
}

static void test_err_bounds(void **state)
{
	size_t big = RCFG_INPUT_MAX + 1, depth = 100000;
	char *buf;

	(void)state;
	buf = malloc(big + depth + 64);
	assert_non_null(buf);

	memset(buf, ' ', big);
	memcpy(buf, "job-name: j\n", 12);
	check_error(buf, big, (const char *const[]){ "too large", "1048577 bytes", NULL });

	/* Deep nesting is refused, whatever the key, before the grammar. */
	memcpy(buf, "nodes: ", 7);
	memset(buf + 7, '[', depth);
	check_error(
	    buf, 7 + depth,
	    (const char *const[]){ "line 1", "collections are nested more than 8 deep", NULL });
	memset(buf, '[', depth);
	check_error(buf, depth, (const char *const[]){ "nested more than 8 deep", NULL });
	memset(buf, '{', depth);
	check_error(buf, depth, (const char *const[]){ "nested more than 8 deep", NULL });
	/* Block style, one level per line. */
	{
		size_t o = 0;
		for (int d = 0; d < 12; d++) {
			memset(buf + o, ' ', (size_t)d * 2);
			o += (size_t)d * 2;
			memcpy(buf + o, "-\n", 2);
			o += 2;
		}
		memset(buf + o, ' ', 24);
		memcpy(buf + o + 24, "x\n", 2);
		check_error(buf, o + 26, (const char *const[]){ "nested more than 8 deep", NULL });
	}
	/* Within the bound, the grammar still names the key. */
	check_error(
	    "peer-ranks: [[[1]]]\n", 20,
	    (const char *const[]){ "'peer-ranks' entry must be an integer, got a list", NULL });
	free(buf);

	/* Exactly the limit is accepted. */
	buf = malloc(RCFG_INPUT_MAX);
	assert_non_null(buf);
	memset(buf, '\n', RCFG_INPUT_MAX);
	memcpy(buf, BASE, strlen(BASE));
	{
		struct rcfg c;
		char err[ERRLEN];
		assert_int_equal(rcfg_parse(buf, RCFG_INPUT_MAX, fake_env, &c, err, sizeof err), 0);
		rcfg_free(&c);
	}
	free(buf);
}

/* ---- canonical dump ---- */

static void assert_rcfg_equal(const struct rcfg *a, const struct rcfg *b)
{
	assert_string_equal(a->job, b->job);
	assert_int_equal(a->framework, b->framework);
	assert_int_equal(a->node_rank, b->node_rank);
	assert_int_equal(a->nodes, b->nodes);
	assert_int_equal(a->n_peer_ranks, b->n_peer_ranks);
	for (int i = 0; i < a->n_peer_ranks; i++)
		assert_int_equal(a->peer_ranks[i], b->peer_ranks[i]);
	assert_int_equal(a->peer_ranks == NULL, b->peer_ranks == NULL);
	assert_int_equal(a->peers_per_node, b->peers_per_node);
	assert_int_equal(a->backup_interval_minutes, b->backup_interval_minutes);
	assert_int_equal(a->backup_interval_steps, b->backup_interval_steps);
	assert_int_equal(a->assume_dp, b->assume_dp);
	assert_int_equal(a->workers_per_node, b->workers_per_node);
}

static void test_round_trip(void **state)
{
	static const char *const inputs[] = {
		"job-name: j\nnode-rank: 0\nnodes: 1\n",
		"job-name: \"123\"\nnode-rank: 0\nnodes: 1\n",
		"job-name: 'null'\nnode-rank: 0\nnodes: 1\n",
		"job-name: llama_3.1-405b\nframework: pytorch\nnode-rank: 7\nnodes: 8\n"
		"peer-ranks: [0, 3, 6]\nbackup-interval-steps: 500\nworkers-per-node: 8\n",
		"job-name: x\nframework: pytorch.distributed\nnode-rank: 3\nnodes: 12\n"
		"peers-per-node: 2\nbackup-interval-minutes: 5\nassume-data-parallelism: 3\n",
		"job-name: x\nnode-rank: 3\nnodes: 12\npeer-ranks: []\n",
		"job-name: ${JOBSET_NAME}\nnode-rank: $NODE_RANK\nnodes: ${NNODES}\npeers-per-node: 0\n",
		"job-name: j\nnode-rank: 0\nnodes: 2\npeer-ranks: [1]\npeers-per-node: 1\n"
		"backup-interval-minutes: 0.5\nmaster: h\nmaster-port: 1\nx: y\n",
	};
	char buf[1024], err[ERRLEN];

	(void)state;
	for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
		struct rcfg a, b;
		int n;

		parse_ok(inputs[i], &a);
		n = rcfg_to_yaml(&a, buf, sizeof buf);
		assert_true(n > 0);
		assert_int_equal((size_t)n, strlen(buf));
		assert_int_equal(rcfg_parse(buf, (size_t)n, NULL, &b, err, sizeof err), 0);
		assert_rcfg_equal(&a, &b);
		/* Canonical: dumping the re-parsed config gives the same text. */
		{
			char again[1024];
			assert_int_equal(rcfg_to_yaml(&b, again, sizeof again), n);
			assert_string_equal(again, buf);
		}
		rcfg_free(&a);
		rcfg_free(&b);
	}
}

static void test_to_yaml_exact(void **state)
{
	struct rcfg c;
	char buf[512];
	int n;

	(void)state;
	parse_ok("workers-per-node: 2\nnodes: 8\nassume-data-parallelism: 2\nnode-rank: 1\n"
	         "peer-ranks: [5, 2]\njob-name: j\nframework: pytorch\n"
	         "backup-interval-steps: 10\n",
	         &c);
	n = rcfg_to_yaml(&c, buf, sizeof buf);
	assert_int_equal(n, (int)strlen(buf));
	assert_string_equal(buf, "job-name: \"j\"\n"
	                         "framework: pytorch\n"
	                         "node-rank: 1\n"
	                         "nodes: 8\n"
	                         "peer-ranks: [5, 2]\n"
	                         "backup-interval-steps: 10\n"
	                         "assume-data-parallelism: 2\n"
	                         "workers-per-node: 2\n");
	rcfg_free(&c);

	parse_ok("job-name: j\nnode-rank: 0\nnodes: 1\n", &c);
	n = rcfg_to_yaml(&c, buf, sizeof buf);
	assert_int_equal(n, (int)strlen(buf));
	assert_string_equal(buf, "job-name: \"j\"\n"
	                         "framework: orbax\n"
	                         "node-rank: 0\n"
	                         "nodes: 1\n"
	                         "peers-per-node: 1\n"
	                         "backup-interval-minutes: 30\n"
	                         "workers-per-node: 1\n");
	rcfg_free(&c);
}

static void test_to_yaml_errors(void **state)
{
	struct rcfg c;
	char buf[512];
	int n;

	(void)state;
	parse_ok(BASE "peer-ranks: [1, 2, 3]\n", &c);
	n = rcfg_to_yaml(&c, buf, sizeof buf);
	assert_true(n > 0);
	for (int len = 0; len <= n; len++)
		assert_int_equal(rcfg_to_yaml(&c, buf, (size_t)len), -ENOSPC);
	assert_int_equal(rcfg_to_yaml(&c, buf, (size_t)n + 1), n);
	assert_int_equal(rcfg_to_yaml(NULL, buf, sizeof buf), -EINVAL);
	assert_int_equal(rcfg_to_yaml(&c, NULL, 0), -EINVAL);
	rcfg_free(&c);

	parse_ok(BASE, &c);
	snprintf(c.job, sizeof c.job, "a\"b");
	assert_int_equal(rcfg_to_yaml(&c, buf, sizeof buf), -EINVAL);
	memset(c.job, 'a', sizeof c.job); /* not terminated */
	assert_int_equal(rcfg_to_yaml(&c, buf, sizeof buf), -EINVAL);
	rcfg_free(&c);
}

/* GKE: int("-0") is 0 (fuzzing found "-0" forms; they are zero) */
static void test_minus_zero(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok("job-name: j\nnode-rank: -0\nnodes: 4\npeer-ranks: [1, -00]\n", &c);
	assert_int_equal(c.node_rank, 0);
	assert_int_equal(c.peer_ranks[1], 0);
	rcfg_free(&c);
	EXPECT_ERROR(BASE "peers-per-node: \"-1\"\n", "must not be negative");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_direct_values),
		cmocka_unit_test(test_minus_zero),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_frameworks),
		cmocka_unit_test(test_env_expansion),
		cmocka_unit_test(test_env_real_getenv),
		cmocka_unit_test(test_env_secrets),
		cmocka_unit_test(test_both_peer_keys),
		cmocka_unit_test(test_nemo_reference_yaml),
		cmocka_unit_test(test_fractional_minutes),
		cmocka_unit_test(test_quoted_ints),
		cmocka_unit_test(test_peer_ranks),
		cmocka_unit_test(test_peers_per_node_forms),
		cmocka_unit_test(test_steps_interval),
		cmocka_unit_test(test_dp_and_workers),
		cmocka_unit_test(test_document_forms),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_err_args),
		cmocka_unit_test(test_err_yaml_syntax),
		cmocka_unit_test(test_err_top_level),
		cmocka_unit_test(test_err_unknown_key),
		cmocka_unit_test(test_err_duplicate_key),
		cmocka_unit_test(test_err_wrong_type),
		cmocka_unit_test(test_err_missing),
		cmocka_unit_test(test_err_nodes_and_rank),
		cmocka_unit_test(test_err_negative),
		cmocka_unit_test(test_err_peer_ranks),
		cmocka_unit_test(test_err_peers_per_node),
		cmocka_unit_test(test_err_peer_ranks_too_many),
		cmocka_unit_test(test_err_intervals),
		cmocka_unit_test(test_err_dp),
		cmocka_unit_test(test_err_workers),
		cmocka_unit_test(test_err_job_name),
		cmocka_unit_test(test_err_env),
		cmocka_unit_test(test_err_anchors_tags),
		cmocka_unit_test(test_err_bounds),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_to_yaml_exact),
		cmocka_unit_test(test_to_yaml_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
