/* Unit tests for fs/rcfg: every accepted form of replicator.yaml, every
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

#include "fs/rcfg.h"

#define ERRLEN 512

static const char *fake_env(const char *name)
{
	static const struct {
		const char *name, *value;
	} env[] = {
		{ "NODE_RANK", "3" }, { "NODES", "8" }, { "JOB", "llama" }, { "EMPTY", "" },
		{ "FW", "pytorch" },  { "BAD", "x1" },  { "NEG", "-2" },    { "PEER", "5" },
	};
	for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
		if (!strcmp(env[i].name, name))
			return env[i].value;
	return NULL;
}

static int parse(const char *yaml, struct rcfg *c, char *err)
{
	return rcfg_parse(yaml, strlen(yaml), fake_env, c, err, ERRLEN);
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
		{ "$FW", RCFG_FW_PYTORCH },
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
	parse_ok("job-name: run-${JOB}-$JOB\n"
	         "node-rank: $NODE_RANK\n"
	         "nodes: ${NODES}0\n"
	         "peer-ranks: [$PEER, \"${NODE_RANK}0\"]\n"
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
	EXPECT_ERROR("job-name: j\nnode-rank: $NODE_RANK\nnodes: $NODES\n"
	             "peer-ranks: [$PEER, \"${NODE_RANK}0\"]\n",
	             "'peer-ranks' entry 30 is out of range");

	parse_ok("job-name: \"${JOB}\"\nnode-rank: \"${NODE_RANK}\"\nnodes: \"$NODES\"\n"
	         "peer-ranks: [$PEER]\n",
	         &c);
	assert_string_equal(c.job, "llama");
	assert_int_equal(c.node_rank, 3);
	assert_int_equal(c.nodes, 8);
	assert_int_equal(c.n_peer_ranks, 1);
	assert_int_equal(c.peer_ranks[0], 5);
	rcfg_free(&c);
}

static void test_env_real_getenv(void **state)
{
	struct rcfg c;
	char err[ERRLEN];
	const char *yaml = "job-name: j\nnode-rank: ${MTCFS_TEST_RANK}\nnodes: 4\n";

	(void)state;
	assert_int_equal(setenv("MTCFS_TEST_RANK", "2", 1), 0);
	assert_int_equal(rcfg_parse(yaml, strlen(yaml), NULL, &c, err, sizeof err), 0);
	assert_int_equal(c.node_rank, 2);
	rcfg_free(&c);
	assert_int_equal(unsetenv("MTCFS_TEST_RANK"), 0);
	assert_int_equal(rcfg_parse(yaml, strlen(yaml), NULL, &c, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "MTCFS_TEST_RANK is not set"));
}

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
}

static void test_peer_ranks(void **state)
{
	struct rcfg c;

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
}

static void test_peers_per_node_forms(void **state)
{
	struct rcfg c;

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
}

static void test_steps_interval(void **state)
{
	struct rcfg c;

	(void)state;
	parse_ok(BASE "backup-interval-steps: 100\n", &c);
	assert_int_equal(c.backup_interval_steps, 100);
	assert_int_equal(c.backup_interval_minutes, 0);
	rcfg_free(&c);
	parse_ok(BASE "backup-interval-minutes: 1\n", &c);
	assert_int_equal(c.backup_interval_minutes, 1);
	assert_int_equal(c.backup_interval_steps, 0);
	rcfg_free(&c);
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

static void test_err_unknown_key(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "peer-rank: 1\n", "line 4", "unknown key \"peer-rank\"");
	EXPECT_ERROR("Nodes: 2\n", "line 1", "unknown key \"Nodes\"");
	EXPECT_ERROR("${NODES}: 2\n", "unknown key \"${NODES}\"");
}

static void test_err_duplicate_key(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnodes: 8\nnode-rank: 0\nnodes: 8\n", "line 4",
	             "duplicate key 'nodes'", "first given at line 2");
	EXPECT_ERROR("job-name: a\njob-name: b\n", "duplicate key 'job-name'");
}

static void test_err_wrong_type(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: [8]\n", "line 3",
	             "'nodes' expects an integer, got a list");
	EXPECT_ERROR("job-name: j\nnode-rank: {a: 1}\nnodes: 8\n",
	             "'node-rank' expects an integer, got a mapping");
	EXPECT_ERROR(BASE "workers-per-node: abc\n", "'workers-per-node'", "\"abc\"");
	EXPECT_ERROR(BASE "workers-per-node: 1.5\n", "'workers-per-node'", "\"1.5\"");
	EXPECT_ERROR(BASE "workers-per-node: 1e3\n", "'workers-per-node'", "\"1e3\"");
	EXPECT_ERROR(BASE "workers-per-node: 0x10\n", "'workers-per-node'", "\"0x10\"");
	EXPECT_ERROR(BASE "workers-per-node: true\n", "'workers-per-node'", "\"true\"");
	EXPECT_ERROR(BASE "workers-per-node: \"4 \"\n", "'workers-per-node'", "\"4 \"");
	EXPECT_ERROR(BASE "workers-per-node: \"+\"\n", "'workers-per-node'", "\"+\"");
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
	EXPECT_ERROR(BASE "workers-per-node: $NEG\n", "'workers-per-node' must not be negative, "
	                                              "got -2 (from \"$NEG\")");
}

static void test_err_peer_ranks(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "peer-ranks: [1, 8]\n", "line 4", "'peer-ranks' entry 8 is out of range",
	             "'nodes' 8", "0..7");
	EXPECT_ERROR(BASE "peer-ranks: [1, 3, 1]\n", "'peer-ranks' lists 1 twice");
	EXPECT_ERROR("job-name: j\nnode-rank: 2\nnodes: 8\npeer-ranks: [1, 2]\n",
	             "'peer-ranks' entry 2 is this node's own 'node-rank'");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 1\npeer-ranks: [0]\n",
	             "'peer-ranks' entry 0 is this node's own 'node-rank'");
	EXPECT_ERROR(BASE "peer-ranks: [1]\npeers-per-node: 1\n", "'peer-ranks' (line 4)",
	             "'peers-per-node' (line 5)", "mutually exclusive");
	EXPECT_ERROR(BASE "peers-per-node: 1\npeer-ranks: []\n", "'peer-ranks' (line 5)",
	             "'peers-per-node' (line 4)", "mutually exclusive");
}

static void test_err_peers_per_node(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "peers-per-node: 8\n", "line 4",
	             "'peers-per-node' 8 must be less than 'nodes' 8",
	             "a node cannot be its own peer", "at most 7 peers");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 2\npeers-per-node: 2\n",
	             "'peers-per-node' 2 must be less than 'nodes' 2");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 1000\npeers-per-node: 65\n",
	             "'peers-per-node' must be at most 64, got 65");
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
	EXPECT_ERROR(BASE "backup-interval-minutes: 10\nbackup-interval-steps: 100\n",
	             "'backup-interval-minutes' (line 4)", "'backup-interval-steps' (line 5)",
	             "mutually exclusive");
	EXPECT_ERROR(BASE "backup-interval-minutes: 0\n",
	             "'backup-interval-minutes' must be at least 1, got 0");
	EXPECT_ERROR(BASE "backup-interval-steps: 0\n",
	             "'backup-interval-steps' must be at least 1, got 0");
	EXPECT_ERROR(BASE "backup-interval-minutes: 525601\n",
	             "'backup-interval-minutes' must be at most 525600, got 525601");
}

static void test_err_dp(void **state)
{
	(void)state;
	EXPECT_ERROR(BASE "assume-data-parallelism: 0\n",
	             "'assume-data-parallelism' must be at least 1, got 0");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 6\nassume-data-parallelism: 4\n", "line 4",
	             "'nodes' 6 is not divisible by 'assume-data-parallelism' 4");
	EXPECT_ERROR("job-name: j\nnode-rank: 0\nnodes: 6\nassume-data-parallelism: 12\n",
	             "'nodes' 6 is not divisible by 'assume-data-parallelism' 12");
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
	EXPECT_ERROR("job-name: $EMPTY\n", "'job-name' \"\" (from \"$EMPTY\")", "it is empty");
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
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: $NOPE\nnodes: 4\n", "line 2", "'node-rank'",
	             "environment variable NOPE is not set");
	EXPECT_ERROR("job-name: j\nnode-rank: \"${NOPE_2}\"\nnodes: 4\n",
	             "environment variable NOPE_2 is not set");
	/* $NAME takes the longest name: JOB_x is not JOB. */
	EXPECT_ERROR("job-name: $JOB_x\n", "'job-name'", "environment variable JOB_x is not set");
	EXPECT_ERROR("job-name: j\nnode-rank: ${NODE_RANK\nnodes: 4\n", "'node-rank'",
	             "unterminated \"${\"", "\"${NODE_RANK\"");
	EXPECT_ERROR("job-name: j\nnode-rank: ${1X}\nnodes: 4\n", "'node-rank'",
	             "invalid variable reference", "\"${1X}\"");
	EXPECT_ERROR("job-name: j\nnode-rank: ${}\nnodes: 4\n", "invalid variable reference");
	EXPECT_ERROR("job-name: j\nnode-rank: $BAD\nnodes: 4\n",
	             "'node-rank' expects a non-negative integer, got \"x1\" (from \"$BAD\")");
	EXPECT_ERROR("job-name: j\nnode-rank: $EMPTY\nnodes: 4\n",
	             "'node-rank' expects an integer, got an empty value (from \"$EMPTY\")");
	EXPECT_ERROR("job-name: j\nnode-rank: $\nnodes: 4\n", "'node-rank'", "\"$\"");
	EXPECT_ERROR("job-name: j\nnode-rank: 1$NODE_RANK\nnodes: 4\n",
	             "'node-rank' 13 must be less than 'nodes' 4");
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
		"job-name: ${JOB}\nnode-rank: $NODE_RANK\nnodes: ${NODES}\npeers-per-node: 0\n",
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

/* fuzzing: "-0" forms were accepted as 0 */
static void test_minus_zero(void **state)
{
	(void)state;
	EXPECT_ERROR("job-name: j\nnode-rank: -0\nnodes: 4\n", "line 2", "must not be negative");
	EXPECT_ERROR(BASE "peer-ranks: [1, -00]\n", "must not be negative");
	EXPECT_ERROR(BASE "peers-per-node: \"-0\"\n", "must not be negative");
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
