/* Unit tests for net/proto: the op name table, dispatch through a route
 * table, the exact bytes of every message's encoding (a change to the wire
 * shows up here as a changed expected string), decode(encode(x)) == x, and
 * each malformed input a decoder must refuse, by name, with its reason. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "net/frame.h"
#include "net/proto.h"

/* The payload bytes as net_frame_build puts them on the wire. */
static void assert_bytes(json_t *m, const char *want)
{
	char *got;

	assert_non_null(m);
	got = json_dumps(m, JSON_COMPACT);
	assert_non_null(got);
	if (strcmp(got, want))
		fail_msg("wire bytes changed:\n got  %s\n want %s", got, want);
	free(got);
	json_decref(m);
}

static json_t *parse(const char *s)
{
	json_t *o = NULL;
	assert_int_equal(net_json_decode(s, strlen(s), &o), 0);
	return o;
}

static const uint8_t H1[32] = { 0xab, 0xcd, [31] = 0x01 };
#define H1HEX "abcd000000000000000000000000000000000000000000000000000000000001"
static const uint8_t H2[32] = { [0] = 0x10, [31] = 0xff };
#define H2HEX "10000000000000000000000000000000000000000000000000000000000000ff"

/* ---- names and dispatch ---- */

static void test_op_names(void **state)
{
	(void)state;
	for (int i = PROTO_OP_UNKNOWN + 1; i < PROTO_OP_COUNT; i++) {
		const char *n = proto_op_name((enum proto_op)i);
		assert_string_not_equal(n, "?");
		assert_int_equal(proto_op_parse(n), i);
	}
	assert_string_equal(proto_op_name(PROTO_FETCH_FAILED), "fetch_failed");
	assert_string_equal(proto_op_name(PROTO_BACKUP_DONE), "backup_done");
	assert_string_equal(proto_op_name(PROTO_OP_UNKNOWN), "?");
	assert_string_equal(proto_op_name(PROTO_OP_COUNT), "?");
	assert_int_equal(proto_op_parse("Register"), PROTO_OP_UNKNOWN);
	assert_int_equal(proto_op_parse(""), PROTO_OP_UNKNOWN);
	assert_int_equal(proto_op_parse(NULL), PROTO_OP_UNKNOWN);
}

static void test_msg_op(void **state)
{
	enum proto_op op;
	json_t *m;

	(void)state;
	m = parse("{\"op\":\"ready\"}");
	assert_int_equal(proto_msg_op(m, &op), 0);
	assert_int_equal(op, PROTO_READY);
	json_decref(m);
	m = parse("{\"op\":\"nosuchop\"}");
	assert_int_equal(proto_msg_op(m, &op), 0);
	assert_int_equal(op, PROTO_OP_UNKNOWN);
	json_decref(m);
	/* missing, not a string, longer than PROTO_OP_MAX */
	m = parse("{}");
	assert_int_equal(proto_msg_op(m, &op), -EINVAL);
	json_decref(m);
	m = parse("{\"op\":7}");
	assert_int_equal(proto_msg_op(m, &op), -EINVAL);
	json_decref(m);
	m = parse("{\"op\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}");
	assert_int_equal(proto_msg_op(m, &op), -EINVAL);
	json_decref(m);
}

static int hits[PROTO_OP_COUNT];

static void count_hit(void *ctx, const struct proto_in *in)
{
	assert_ptr_equal(ctx, hits);
	hits[in->op]++;
}

static void test_dispatch(void **state)
{
	static const struct proto_route t[] = {
		{ PROTO_READY, PROTO_T(NT_REQ), count_hit },
		{ PROTO_LKG, PROTO_T_ANY, count_hit },
	};
	struct proto_in in = { .type = NT_REQ };

	(void)state;
	memset(hits, 0, sizeof(hits));
	in.msg = parse("{\"op\":\"ready\"}");
	assert_int_equal(proto_dispatch(t, 2, hits, &in), 0);
	assert_int_equal(hits[PROTO_READY], 1);
	/* the right op in a frame type the entry does not take */
	in.type = NT_EVENT;
	assert_int_equal(proto_dispatch(t, 2, hits, &in), -ENOSYS);
	assert_int_equal(hits[PROTO_READY], 1);
	json_decref(in.msg);
	in.msg = parse("{\"op\":\"lkg\"}");
	assert_int_equal(proto_dispatch(t, 2, hits, &in), 0);
	assert_int_equal(hits[PROTO_LKG], 1);
	json_decref(in.msg);
	/* an op with no entry, an unknown op, no op */
	in.msg = parse("{\"op\":\"catalog\"}");
	assert_int_equal(proto_dispatch(t, 2, hits, &in), -ENOSYS);
	assert_int_equal(in.op, PROTO_CATALOG);
	json_decref(in.msg);
	in.msg = parse("{\"op\":\"bogus\"}");
	assert_int_equal(proto_dispatch(t, 2, hits, &in), -ENOSYS);
	json_decref(in.msg);
	in.msg = parse("{\"job\":\"x\"}");
	assert_int_equal(proto_dispatch(t, 2, hits, &in), -EINVAL);
	json_decref(in.msg);
}

/* ---- exact bytes ---- */

static void test_bytes_register(void **state)
{
	struct proto_register r = { .addr = "127.0.0.1:7000" };
	char *addrs[] = { "127.0.0.1:7000", NULL, "[::1]:7002" };

	(void)state;
	assert_bytes(proto_register_encode(&r), "{\"op\":\"register\",\"addr\":\"127.0.0.1:7000\"}");
	r.job = "llama";
	r.nodes = 4;
	r.dp = 2;
	r.want_table = true;
	assert_bytes(proto_register_encode(&r),
		     "{\"op\":\"register\",\"addr\":\"127.0.0.1:7000\",\"job\":\"llama\","
		     "\"nodes\":4,\"dp\":2,\"want_table\":true}");
	r.has_bi = true;
	r.bi_min = 0;
	r.bi_steps = 5;
	r.want_table = false;
	assert_bytes(proto_register_encode(&r),
		     "{\"op\":\"register\",\"addr\":\"127.0.0.1:7000\",\"job\":\"llama\","
		     "\"nodes\":4,\"dp\":2,\"bi_min\":0,\"bi_steps\":5}");
	{
		struct proto_register g;
		json_t *m = proto_register_encode(&r);
		assert_int_equal(proto_register_decode(m, &g, NULL, 0), 0);
		assert_true(g.has_bi);
		assert_int_equal(g.bi_min, 0);
		assert_int_equal(g.bi_steps, 5);
		json_decref(m);
	}
	assert_bytes(proto_addrs_reply(true, false, addrs, 3, 0), "{\"ok\":true}");
	assert_bytes(proto_addrs_reply(true, true, addrs, 3, 0),
		     "{\"ok\":true,\"addrs\":[\"127.0.0.1:7000\",null,\"[::1]:7002\"]}");
	assert_bytes(proto_addrs_reply(false, true, addrs, 0, 0), "{\"addrs\":[]}");
	/* the table's generation, after what a coordinator before it sent */
	assert_bytes(proto_addrs_reply(true, false, addrs, 3, 5), "{\"ok\":true,\"gen\":5}");
	assert_bytes(proto_addrs_reply(false, true, addrs, 1, 12),
		     "{\"addrs\":[\"127.0.0.1:7000\"],\"gen\":12}");
}

/* peers {op, gen}: the coordinator's table changed; a reply's gen. */
static void test_bytes_peers(void **state)
{
	json_t *o;
	uint64_t gen = 1;

	(void)state;
	assert_bytes(proto_peers_encode(7), "{\"op\":\"peers\",\"gen\":7}");
	o = proto_peers_encode(9);
	assert_int_equal(proto_peers_decode(o, &gen, NULL, 0), 0);
	assert_int_equal(gen, 9);
	json_decref(o);
	o = proto_addrs_reply(true, false, NULL, 0, 3);
	assert_int_equal(proto_addrs_gen(o), 3);
	json_decref(o);
	o = proto_addrs_reply(true, false, NULL, 0, 0);
	assert_int_equal(proto_addrs_gen(o), 0);   /* an older coordinator: none */
	json_decref(o);
	o = parse("{\"ok\":true,\"gen\":\"3\"}");
	assert_int_equal(proto_addrs_gen(o), 0);
	json_decref(o);
	assert_string_equal(proto_op_name(PROTO_PEERS), "peers");
	assert_int_equal(proto_op_parse("peers"), PROTO_PEERS);
}

static void test_bytes_catalog(void **state)
{
	struct proto_hold h[2] = {
		{ .owner = 1, .step = 200, .worker = 0 },
		{ .owner = 0, .step = 100, .worker = 3, .has_worker = true, .has_content = true },
	};
	struct proto_catalog c = { .job = { "llama", 2, 1 }, .holds = h, .nholds = 1 };

	(void)state;
	memcpy(h[0].hash, H1, 32);
	memcpy(h[1].hash, H2, 32);
	memcpy(h[1].content, H1, 32);
	assert_bytes(proto_catalog_encode(&c),
		     "{\"op\":\"catalog\",\"job\":\"llama\",\"nodes\":2,\"dp\":1,"
		     "\"holds\":[[1,200,\"" H1HEX "\"]]}");
	c.workers = 4;
	c.nholds = 2;
	assert_bytes(proto_catalog_encode(&c),
		     "{\"op\":\"catalog\",\"job\":\"llama\",\"nodes\":2,\"dp\":1,\"workers\":4,"
		     "\"holds\":[[1,200,\"" H1HEX "\"],[0,100,\"" H2HEX "\",3,\"" H1HEX "\"]]}");
	c.nholds = 0;
	c.workers = 0;
	assert_bytes(proto_catalog_encode(&c),
		     "{\"op\":\"catalog\",\"job\":\"llama\",\"nodes\":2,\"dp\":1,\"holds\":[]}");
}

static void test_bytes_restore(void **state)
{
	struct proto_fetch_failed f = { .job = "j", .plan = 3, .holder = 2, .owner = 1, .step = 40 };
	struct proto_ready r = { .job = "j", .plan = 3 };
	struct proto_status st = { .job = "j" };

	(void)state;
	assert_bytes(proto_fetch_failed_encode(&f),
		     "{\"op\":\"fetch_failed\",\"job\":\"j\",\"plan\":3,\"holder\":2,\"owner\":1,"
		     "\"step\":40}");
	f.worker = 2;
	f.bucket = true;
	assert_bytes(proto_fetch_failed_encode(&f),
		     "{\"op\":\"fetch_failed\",\"job\":\"j\",\"plan\":3,\"holder\":2,\"owner\":1,"
		     "\"step\":40,\"worker\":2,\"bucket\":true}");
	assert_bytes(proto_ready_encode(&r), "{\"op\":\"ready\",\"job\":\"j\",\"plan\":3}");
	assert_bytes(proto_status_encode(&st), "{\"op\":\"status\",\"job\":\"j\"}");
	assert_bytes(proto_go_encode(3), "{\"op\":\"go\",\"plan\":3}");
	assert_bytes(proto_restart_encode(), "{\"op\":\"restart\"}");
	assert_bytes(proto_list_encode("j"), "{\"op\":\"list\",\"job\":\"j\"}");
}

/* Erasure coding's data requests (engine_ec.c, engine_ec_rst.c): the
 * bytes, a round trip, and an op that is not one of them. */
static void test_bytes_ec(void **state)
{
	struct proto_ec m = { .job = "j", .step = 7, .group = 1, .cw = 2, .slot = 5, .owner = 3,
			      .manifest = "QUJD" };
	struct proto_ec d;
	json_t *o;

	(void)state;
	assert_bytes(proto_ec_encode(PROTO_EC_META, &m),
		     "{\"op\":\"ec_meta\",\"job\":\"j\",\"step\":7,\"owner\":3,\"manifest\":\"QUJD\"}");
	assert_bytes(proto_ec_encode(PROTO_EC_DATA, &m),
		     "{\"op\":\"ec_data\",\"job\":\"j\",\"step\":7,\"group\":1,\"cw\":2,\"slot\":5}");
	assert_bytes(proto_ec_encode(PROTO_EC_GET, &m),
		     "{\"op\":\"ec_get\",\"job\":\"j\",\"step\":7,\"group\":1,\"cw\":2,\"slot\":5}");
	assert_bytes(proto_ec_encode(PROTO_EC_METAS, &m), "{\"op\":\"ec_metas\",\"job\":\"j\",\"step\":7}");
	assert_null(proto_ec_encode(PROTO_PUSH, &m));
	o = proto_ec_encode(PROTO_EC_META, &m);
	assert_int_equal(proto_ec_decode(PROTO_EC_META, o, &d, NULL, 0), 0);
	assert_false(d.has_to);   /* a sender before "to": not checked */
	json_decref(o);
	/* the rank the sender means to reach, last */
	m.has_to = true;
	m.to = 4;
	assert_bytes(proto_ec_encode(PROTO_EC_META, &m),
		     "{\"op\":\"ec_meta\",\"job\":\"j\",\"step\":7,\"owner\":3,\"manifest\":\"QUJD\","
		     "\"to\":4}");
	assert_bytes(proto_ec_encode(PROTO_EC_DATA, &m),
		     "{\"op\":\"ec_data\",\"job\":\"j\",\"step\":7,\"group\":1,\"cw\":2,\"slot\":5,"
		     "\"to\":4}");
	o = proto_ec_encode(PROTO_EC_META, &m);
	assert_int_equal(proto_ec_decode(PROTO_EC_META, o, &d, NULL, 0), 0);
	assert_true(d.has_to);
	assert_int_equal(d.to, 4);
	assert_string_equal(d.job, "j");
	assert_int_equal(d.step, 7);
	assert_int_equal(d.owner, 3);
	assert_string_equal(d.manifest, "QUJD");
	json_decref(o);
	o = proto_ec_encode(PROTO_EC_GET, &m);
	assert_int_equal(proto_ec_decode(PROTO_EC_GET, o, &d, NULL, 0), 0);
	assert_int_equal(d.group, 1);
	assert_int_equal(d.cw, 2);
	assert_int_equal(d.slot, 5);
	assert_int_equal(proto_ec_decode(PROTO_LIST, o, &d, NULL, 0), -EINVAL);
	json_decref(o);
}

static void test_bytes_status_reply(void **state)
{
	char *addrs[] = { "a:1", NULL };
	struct proto_status_node n[2] = { { .connected = true, .commits = { 20, 10 }, .ncommits = 2 },
					  { .connected = false } };
	struct proto_status_reply r = { .addrs = addrs, .naddrs = 2 };

	(void)state;
	assert_bytes(proto_status_reply_encode(&r), "{\"addrs\":[\"a:1\",null],\"known\":false}");
	r = (struct proto_status_reply){ .addrs = addrs, .naddrs = 2, .known = true, .job = "j",
					 .nodes_total = 2, .dp = 1, .has_lkg = true, .lkg = 20,
					 .restore = "idle", .plan = 3, .nodes = n };
	assert_bytes(proto_status_reply_encode(&r),
		     "{\"addrs\":[\"a:1\",null],\"known\":true,\"job\":\"j\",\"nodes_total\":2,"
		     "\"dp\":1,\"lkg\":20,\"replicated_lkg\":null,\"restore\":\"idle\",\"plan\":3,"
		     "\"last_backup_step\":null,\"backup_running\":null,\"nodes\":["
		     "{\"rank\":0,\"connected\":true,\"commits\":[20,10]},"
		     "{\"rank\":1,\"connected\":false,\"commits\":[]}]}");
	r.has_safe = true;
	r.safe = 10;
	r.has_last_backup = true;
	r.last_backup_step = 10;
	r.backup_running = "j-2";
	r.restore = "collecting";
	r.nodes_total = 0;
	assert_bytes(proto_status_reply_encode(&r),
		     "{\"addrs\":[\"a:1\",null],\"known\":true,\"job\":\"j\",\"nodes_total\":0,"
		     "\"dp\":1,\"lkg\":20,\"replicated_lkg\":10,\"restore\":\"collecting\","
		     "\"plan\":3,\"last_backup_step\":10,\"backup_running\":\"j-2\",\"nodes\":[]}");
}

static void test_bytes_plan(void **state)
{
	struct proto_plan_src sh[2] = {
		{ .holder = 1, .owner = 0, .addr = "127.0.0.1:7001" },
		{ .holder = 2, .owner = 0, .addr = "127.0.0.1:7002" },
	};
	struct proto_plan p = { .plan = 5, .found = false, .notes = "" };

	(void)state;
	memcpy(sh[0].hash, H1, 32);
	memcpy(sh[1].hash, H2, 32);
	assert_bytes(proto_plan_encode(&p), "{\"op\":\"plan\",\"plan\":5,\"found\":false}");
	p.notes = "backup x skipped";
	assert_bytes(proto_plan_encode(&p),
		     "{\"op\":\"plan\",\"plan\":5,\"found\":false,\"notes\":\"backup x skipped\"}");
	/* found, but no source for this rank */
	p.notes = NULL;
	p.found = true;
	p.step = 300;
	assert_bytes(proto_plan_encode(&p), "{\"op\":\"plan\",\"plan\":5,\"found\":true}");
	p.bucket = true;
	p.backup = "llama-20261201-1200";
	assert_bytes(proto_plan_encode(&p),
		     "{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":300,\"source\":\"bucket\","
		     "\"backup\":\"llama-20261201-1200\"}");
	/* a backup of a smaller job under D: the column mate's shard */
	p.has_owner = true;
	p.src.owner = 1;
	assert_bytes(proto_plan_encode(&p),
		     "{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":300,\"source\":\"bucket\","
		     "\"backup\":\"llama-20261201-1200\",\"owner\":1}");
	{
		struct proto_plan_src ws[2] = { { .owner = 1 }, { .owner = 3 } }, got[4];
		struct proto_plan q;
		char why[160];
		json_t *m;

		p.shards = ws;
		p.nshards = 2;
		m = proto_plan_encode(&p);
		assert_int_equal(proto_plan_decode(m, &q, got, 4, why, sizeof why), 0);
		assert_true(q.bucket && q.has_owner);
		assert_int_equal(q.src.owner, 1);
		assert_int_equal(q.nshards, 2);
		assert_int_equal(q.shards[1].owner, 3);
		json_decref(m);
		m = json_loads("{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":3,"
			       "\"source\":\"bucket\",\"backup\":\"b\",\"owner\":1,"
			       "\"owners\":[1,-2]}", 0, NULL);
		assert_int_equal(proto_plan_decode(m, &q, got, 4, why, sizeof why), -EINVAL);
		assert_non_null(strstr(why, "owners[1] is not a rank"));
		json_decref(m);
		/* an older coordinator: no owner, the rank's own */
		m = json_loads("{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":3,"
			       "\"source\":\"bucket\",\"backup\":\"b\"}", 0, NULL);
		assert_int_equal(proto_plan_decode(m, &q, got, 4, why, sizeof why), 0);
		assert_false(q.has_owner);
		json_decref(m);
		p.shards = NULL;
		p.nshards = 0;
		p.has_owner = false;
		p.src.owner = 0;
	}
	p.bucket = false;
	p.src = sh[0];
	assert_bytes(proto_plan_encode(&p),
		     "{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":300,\"holder\":1,"
		     "\"owner\":0,\"hash\":\"" H1HEX "\",\"addr\":\"127.0.0.1:7001\"}");
	p.shards = sh;
	p.nshards = 2;
	assert_bytes(proto_plan_encode(&p),
		     "{\"op\":\"plan\",\"plan\":5,\"found\":true,\"step\":300,\"holder\":1,"
		     "\"owner\":0,\"hash\":\"" H1HEX "\",\"addr\":\"127.0.0.1:7001\",\"shards\":["
		     "{\"worker\":0,\"holder\":1,\"owner\":0,\"hash\":\"" H1HEX "\","
		     "\"addr\":\"127.0.0.1:7001\"},"
		     "{\"worker\":1,\"holder\":2,\"owner\":0,\"hash\":\"" H2HEX "\","
		     "\"addr\":\"127.0.0.1:7002\"}]}");
}

static void test_bytes_steps(void **state)
{
	struct proto_step_ev e = { .job = { "llama", 4, 2 }, .step = 100, .workers = 1,
				   .bi_min = 30, .bi_steps = 0 };

	(void)state;
	memcpy(e.hash, H1, 32);
	assert_bytes(proto_committed_encode(&e),
		     "{\"op\":\"committed\",\"job\":\"llama\",\"nodes\":4,\"dp\":2,\"step\":100,"
		     "\"hash\":\"" H1HEX "\",\"bi_min\":30,\"bi_steps\":0}");
	assert_bytes(proto_replicated_encode(&e),
		     "{\"op\":\"replicated\",\"job\":\"llama\",\"nodes\":4,\"dp\":2,\"step\":100}");
	e.worker = 1;
	e.workers = 2;
	assert_bytes(proto_committed_encode(&e),
		     "{\"op\":\"committed\",\"job\":\"llama\",\"nodes\":4,\"dp\":2,\"step\":100,"
		     "\"hash\":\"" H1HEX "\",\"worker\":1,\"workers\":2,\"bi_min\":30,\"bi_steps\":0}");
	assert_bytes(proto_replicated_encode(&e),
		     "{\"op\":\"replicated\",\"job\":\"llama\",\"nodes\":4,\"dp\":2,\"step\":100,"
		     "\"worker\":1,\"workers\":2}");
}

static void test_bytes_backup(void **state)
{
	struct proto_backup_done d = { .job = "j", .name = "j-1", .step = 7, .ok = true };
	struct proto_backup b = { .job = "j", .name = "j-1", .step = 7, .data = false };
	struct proto_lkg l = { .job = "j", .step = 9 };
	struct proto_report r = { .job = "j", .text = "no \"room\"" };

	(void)state;
	assert_bytes(proto_backup_done_encode(&d),
		     "{\"op\":\"backup_done\",\"job\":\"j\",\"name\":\"j-1\",\"step\":7,\"ok\":true}");
	d.ok = false;
	d.error = "upload failed";
	assert_bytes(proto_backup_done_encode(&d),
		     "{\"op\":\"backup_done\",\"job\":\"j\",\"name\":\"j-1\",\"step\":7,\"ok\":false,"
		     "\"error\":\"upload failed\"}");
	assert_bytes(proto_backup_encode(&b),
		     "{\"op\":\"backup\",\"job\":\"j\",\"name\":\"j-1\",\"step\":7,\"data\":false}");
	assert_bytes(proto_lkg_encode(&l), "{\"op\":\"lkg\",\"job\":\"j\",\"step\":9}");
	l.has_safe = true;
	l.safe = 8;
	assert_bytes(proto_lkg_encode(&l), "{\"op\":\"lkg\",\"job\":\"j\",\"step\":9,\"safe\":8}");
	assert_bytes(proto_report_encode(&r),
		     "{\"op\":\"report\",\"job\":\"j\",\"text\":\"no \\\"room\\\"\"}");
}

/* ---- round trips ---- */

static void test_roundtrip(void **state)
{
	struct proto_hold h[2] = {
		{ .owner = 1, .step = 200 },
		{ .owner = 0, .step = 100, .worker = 3, .has_worker = true, .has_content = true },
	};
	struct proto_catalog c = { .job = { "llama", 2, 1 }, .workers = 4, .holds = h, .nholds = 2 }, c2;
	struct proto_step_ev e = { .job = { "llama", 4, 2 }, .step = (UINT64_MAX >> 1), .worker = 1,
				   .workers = 2, .has_bi_min = true, .bi_min = 30,
				   .has_bi_steps = true, .bi_steps = 1u << 30 }, e2;
	struct proto_fetch_failed f = { .job = "j", .plan = UINT32_MAX, .holder = 65535,
					.owner = 1, .step = 40, .worker = 63, .bucket = true }, f2;
	struct proto_register r = { .addr = "a:1", .job = "j", .nodes = 65536, .dp = 2,
				    .want_table = true }, r2;
	struct proto_backup_done d = { .job = "j", .name = "n", .step = 3, .ok = false,
				       .error = "e" }, d2;
	struct proto_ready rd = { .job = "j", .plan = 9 }, rd2;
	struct proto_lkg l = { .job = "j", .step = 9, .has_safe = true, .safe = 9 }, l2;
	struct proto_backup b = { .job = "j", .name = "n", .step = 1, .data = true }, b2;
	struct proto_report rp = { .job = "j", .text = "t" }, rp2;
	json_t *m;

	(void)state;
	memcpy(h[0].hash, H1, 32);
	memcpy(h[1].hash, H2, 32);
	memcpy(h[1].content, H1, 32);
	memcpy(e.hash, H2, 32);

	m = proto_catalog_encode(&c);
	assert_int_equal(proto_catalog_decode(m, &c2, NULL, 0), 0);
	assert_string_equal(c2.job.name, "llama");
	assert_int_equal(c2.job.nodes, 2);
	assert_int_equal(c2.job.dp, 1);
	assert_int_equal(c2.workers, 4);
	assert_int_equal(c2.nholds, 2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(c2.holds[i].owner, h[i].owner);
		assert_int_equal(c2.holds[i].step, h[i].step);
		assert_int_equal(c2.holds[i].worker, h[i].worker);
		assert_int_equal(c2.holds[i].has_worker, h[i].has_worker);
		assert_int_equal(c2.holds[i].has_content, h[i].has_content);
		assert_memory_equal(c2.holds[i].hash, h[i].hash, 32);
	}
	assert_memory_equal(c2.holds[1].content, H1, 32);
	proto_catalog_free(&c2);
	json_decref(m);

	m = proto_committed_encode(&e);
	assert_int_equal(proto_committed_decode(m, &e2, NULL, 0), 0);
	assert_string_equal(e2.job.name, "llama");
	assert_int_equal(e2.job.nodes, 4);
	assert_int_equal(e2.job.dp, 2);
	assert_int_equal(e2.step, UINT64_MAX >> 1);
	assert_int_equal(e2.worker, 1);
	assert_int_equal(e2.workers, 2);
	assert_memory_equal(e2.hash, H2, 32);
	assert_true(e2.has_bi_min && e2.has_bi_steps);
	assert_int_equal(e2.bi_min, 30);
	assert_int_equal(e2.bi_steps, 1u << 30);
	json_decref(m);
	m = proto_replicated_encode(&e);
	assert_int_equal(proto_replicated_decode(m, &e2, NULL, 0), 0);
	assert_int_equal(e2.step, e.step);
	assert_int_equal(e2.worker, 1);
	assert_int_equal(e2.workers, 2);
	assert_false(e2.has_bi_min);
	json_decref(m);

	m = proto_fetch_failed_encode(&f);
	assert_int_equal(proto_fetch_failed_decode(m, &f2, NULL, 0), 0);
	assert_string_equal(f2.job, "j");
	assert_int_equal(f2.plan, UINT32_MAX);
	assert_int_equal(f2.holder, 65535);
	assert_int_equal(f2.owner, 1);
	assert_int_equal(f2.step, 40);
	assert_int_equal(f2.worker, 63);
	assert_true(f2.bucket);
	json_decref(m);

	m = proto_register_encode(&r);
	assert_int_equal(proto_register_decode(m, &r2, NULL, 0), 0);
	assert_string_equal(r2.addr, "a:1");
	assert_string_equal(r2.job, "j");
	assert_int_equal(r2.nodes, 65536);
	assert_int_equal(r2.dp, 2);
	assert_true(r2.want_table);
	json_decref(m);

	m = proto_backup_done_encode(&d);
	assert_int_equal(proto_backup_done_decode(m, &d2, NULL, 0), 0);
	assert_string_equal(d2.name, "n");
	assert_string_equal(d2.error, "e");
	assert_int_equal(d2.step, 3);
	assert_false(d2.ok);
	json_decref(m);

	m = proto_ready_encode(&rd);
	assert_int_equal(proto_ready_decode(m, &rd2, NULL, 0), 0);
	assert_int_equal(rd2.plan, 9);
	json_decref(m);

	m = proto_lkg_encode(&l);
	assert_int_equal(proto_lkg_decode(m, &l2, NULL, 0), 0);
	assert_true(l2.has_safe);
	assert_int_equal(l2.safe, 9);
	assert_int_equal(l2.step, 9);
	json_decref(m);

	m = proto_backup_encode(&b);
	assert_int_equal(proto_backup_decode(m, &b2, NULL, 0), 0);
	assert_true(b2.data);
	assert_int_equal(b2.step, 1);
	assert_string_equal(b2.name, "n");
	json_decref(m);

	{
		struct proto_plan_src sh[2] = { { .holder = 1, .owner = 0, .addr = "h:1" },
						{ .holder = 2, .owner = 1, .addr = "" } }, got[2];
		struct proto_plan pl = { .plan = 7, .found = true, .notes = "n", .step = 300,
					 .src = sh[0], .shards = sh, .nshards = 2 }, pl2;
		memcpy(sh[0].hash, H1, 32);
		memcpy(sh[1].hash, H2, 32);
		pl.src = sh[0];
		m = proto_plan_encode(&pl);
		assert_int_equal(proto_plan_decode(m, &pl2, got, 2, NULL, 0), 0);
		assert_int_equal(pl2.plan, 7);
		assert_true(pl2.found && !pl2.bucket);
		assert_string_equal(pl2.notes, "n");
		assert_int_equal(pl2.step, 300);
		assert_int_equal(pl2.src.holder, 1);
		assert_string_equal(pl2.src.addr, "h:1");
		assert_memory_equal(pl2.src.hash, H1, 32);
		assert_int_equal(pl2.nshards, 2);
		assert_int_equal(got[1].holder, 2);
		assert_int_equal(got[1].owner, 1);
		assert_memory_equal(got[1].hash, H2, 32);
		assert_string_equal(got[1].addr, "");
		json_decref(m);
		/* with room for one shard only: refused */
		m = proto_plan_encode(&pl);
		assert_int_equal(proto_plan_decode(m, &pl2, got, 1, NULL, 0), -EINVAL);
		json_decref(m);
		pl = (struct proto_plan){ .plan = 8, .found = true, .step = 9, .bucket = true,
					  .backup = "b-1" };
		m = proto_plan_encode(&pl);
		assert_int_equal(proto_plan_decode(m, &pl2, got, 2, NULL, 0), 0);
		assert_true(pl2.bucket);
		assert_string_equal(pl2.backup, "b-1");
		assert_int_equal(pl2.step, 9);
		assert_null(pl2.notes);
		json_decref(m);
	}

	m = proto_report_encode(&rp);
	assert_int_equal(proto_report_decode(m, &rp2, NULL, 0), 0);
	assert_string_equal(rp2.text, "t");
	assert_string_equal(rp2.job, "j");
	json_decref(m);
}

/* Lenient fields keep the old handlers' tolerance: ignored, not fatal. */
static void test_lenient(void **state)
{
	struct proto_register r;
	struct proto_lkg l;
	struct proto_backup b;
	struct proto_catalog c;
	struct proto_status st;
	json_t *m;

	(void)state;
	/* a register whose job hint is malformed still registers */
	m = parse("{\"op\":\"register\",\"addr\":\"a:1\",\"job\":5,\"nodes\":2}");
	assert_int_equal(proto_register_decode(m, &r, NULL, 0), 0);
	assert_null(r.job);
	json_decref(m);
	m = parse("{\"op\":\"register\",\"addr\":\"a:1\",\"job\":\"j\",\"nodes\":\"2\"}");
	assert_int_equal(proto_register_decode(m, &r, NULL, 0), 0);
	assert_null(r.job);
	json_decref(m);
	/* safe above step is dropped */
	m = parse("{\"op\":\"lkg\",\"job\":\"j\",\"step\":5,\"safe\":6}");
	assert_int_equal(proto_lkg_decode(m, &l, NULL, 0), 0);
	assert_false(l.has_safe);
	json_decref(m);
	/* backup data absent: true */
	m = parse("{\"op\":\"backup\",\"job\":\"j\",\"name\":\"n\",\"step\":5}");
	assert_int_equal(proto_backup_decode(m, &b, NULL, 0), 0);
	assert_true(b.data);
	json_decref(m);
	/* catalog workers out of range: ignored */
	m = parse("{\"op\":\"catalog\",\"job\":\"j\",\"nodes\":1,\"workers\":65,\"holds\":[]}");
	assert_int_equal(proto_catalog_decode(m, &c, NULL, 0), 0);
	assert_int_equal(c.workers, 0);
	proto_catalog_free(&c);
	json_decref(m);
	m = parse("{\"op\":\"status\",\"job\":[]}");
	assert_int_equal(proto_status_decode(m, &st, NULL, 0), 0);
	assert_null(st.job);
	json_decref(m);
}

/* ---- rejects ---- */

struct reject {
	const char *name;
	enum proto_op op;
	const char *json;
	const char *why;          /* a part of the reason */
};

#define LONG129 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HOLD "\"" H1HEX "\""

static const struct reject rejects[] = {
	{ "catalog: no job", PROTO_CATALOG, "{\"nodes\":2,\"holds\":[]}", "missing job" },
	{ "catalog: job not a string", PROTO_CATALOG, "{\"job\":1,\"nodes\":2,\"holds\":[]}",
	  "job is not a string" },
	{ "catalog: job over 128 bytes", PROTO_CATALOG,
	  "{\"job\":\"" LONG129 "\",\"nodes\":2,\"holds\":[]}", "at most 128 bytes" },
	{ "catalog: empty job", PROTO_CATALOG, "{\"job\":\"\",\"nodes\":2,\"holds\":[]}",
	  "empty job" },
	{ "catalog: no nodes", PROTO_CATALOG, "{\"job\":\"j\",\"holds\":[]}", "missing nodes" },
	{ "catalog: nodes 0", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":0,\"holds\":[]}",
	  "nodes is 0" },
	{ "catalog: nodes over 65536", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":65537,\"holds\":[]}",
	  "nodes is not an integer in 0..65536" },
	{ "catalog: nodes negative", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":-1,\"holds\":[]}",
	  "nodes is not" },
	{ "catalog: nodes a real", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":2.0,\"holds\":[]}",
	  "nodes is not" },
	{ "catalog: dp not dividing nodes", PROTO_CATALOG,
	  "{\"job\":\"j\",\"nodes\":3,\"dp\":2,\"holds\":[]}", "dp 2 does not divide nodes 3" },
	{ "catalog: dp a string", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":3,\"dp\":\"1\",\"holds\":[]}",
	  "dp is not" },
	{ "catalog: no holds", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":2}", "holds is not an array" },
	{ "catalog: holds an object", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":2,\"holds\":{}}",
	  "holds is not an array" },
	{ "catalog: owner out of range", PROTO_CATALOG,
	  "{\"job\":\"j\",\"nodes\":2,\"holds\":[[0,1," HOLD "],[2,1," HOLD "]]}",
	  "holds[1]: owner is not a rank below 2" },
	{ "catalog: negative step", PROTO_CATALOG,
	  "{\"job\":\"j\",\"nodes\":2,\"holds\":[[0,-1," HOLD "]]}", "holds[0]: step" },
	{ "catalog: short hash", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":2,\"holds\":[[0,1,\"abcd\"]]}",
	  "holds[0]: hash is not 64 hex digits" },
	{ "catalog: hold not an array", PROTO_CATALOG, "{\"job\":\"j\",\"nodes\":2,\"holds\":[7]}",
	  "holds[0]: owner" },
	{ "catalog: worker 64", PROTO_CATALOG,
	  "{\"job\":\"j\",\"nodes\":2,\"holds\":[[0,1," HOLD ",64]]}", "holds[0]: worker is not in 0..63" },
	{ "catalog: content not hex", PROTO_CATALOG,
	  "{\"job\":\"j\",\"nodes\":2,\"holds\":[[0,1," HOLD ",1,\"zz\"]]}",
	  "holds[0]: content is not 64 hex digits" },
	{ "committed: no hash", PROTO_COMMITTED, "{\"job\":\"j\",\"nodes\":2,\"step\":1}", "missing hash" },
	{ "committed: no step", PROTO_COMMITTED, "{\"job\":\"j\",\"nodes\":2,\"hash\":" HOLD "}",
	  "missing step" },
	{ "committed: negative step", PROTO_COMMITTED,
	  "{\"job\":\"j\",\"nodes\":2,\"step\":-5,\"hash\":" HOLD "}", "step is not an integer" },
	{ "committed: workers 0", PROTO_COMMITTED,
	  "{\"job\":\"j\",\"nodes\":2,\"step\":1,\"hash\":" HOLD ",\"workers\":0}", "workers is 0" },
	{ "committed: workers 65", PROTO_COMMITTED,
	  "{\"job\":\"j\",\"nodes\":2,\"step\":1,\"hash\":" HOLD ",\"workers\":65}", "workers is not" },
	{ "committed: worker not below workers", PROTO_COMMITTED,
	  "{\"job\":\"j\",\"nodes\":2,\"step\":1,\"hash\":" HOLD ",\"worker\":2,\"workers\":2}",
	  "worker 2 is not below workers 2" },
	{ "replicated: no job", PROTO_REPLICATED, "{\"nodes\":2,\"step\":1}", "missing job" },
	{ "replicated: worker without workers", PROTO_REPLICATED,
	  "{\"job\":\"j\",\"nodes\":2,\"step\":1,\"worker\":1}", "worker 1 is not below workers 1" },
	{ "fetch_failed: no job", PROTO_FETCH_FAILED, "{\"holder\":1,\"owner\":1,\"step\":1}",
	  "missing job" },
	{ "fetch_failed: no holder", PROTO_FETCH_FAILED, "{\"job\":\"j\",\"owner\":1,\"step\":1}",
	  "missing holder" },
	{ "fetch_failed: holder 65536", PROTO_FETCH_FAILED,
	  "{\"job\":\"j\",\"holder\":65536,\"owner\":1,\"step\":1}", "holder is not an integer in 0..65535" },
	{ "fetch_failed: owner a string", PROTO_FETCH_FAILED,
	  "{\"job\":\"j\",\"holder\":1,\"owner\":\"1\",\"step\":1}", "owner is not" },
	{ "ready: no plan", PROTO_READY, "{\"job\":\"j\"}", "missing plan" },
	{ "ready: plan over 2^32-1", PROTO_READY, "{\"job\":\"j\",\"plan\":4294967296}",
	  "plan is not an integer in 0..4294967295" },
	{ "register: no addr", PROTO_REGISTER, "{\"job\":\"j\"}", "missing addr" },
	{ "register: addr over 256 bytes", PROTO_REGISTER,
	  "{\"addr\":\"" LONG129 LONG129 "\"}", "addr is not a string of at most 256 bytes" },
	{ "backup_done: no name", PROTO_BACKUP_DONE, "{\"job\":\"j\",\"ok\":true}", "missing name" },
	{ "backup_done: name over 63 bytes", PROTO_BACKUP_DONE,
	  "{\"job\":\"j\",\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
	  "name is not a string of at most 63 bytes" },
	{ "lkg: no step", PROTO_LKG, "{\"job\":\"j\"}", "missing step" },
	{ "backup: no name", PROTO_BACKUP, "{\"job\":\"j\",\"step\":1}", "missing name" },
	{ "report: no text", PROTO_REPORT, "{\"job\":\"j\"}", "missing text" },
	{ "report: text not a string", PROTO_REPORT, "{\"text\":[]}", "text is not a string" },
	{ "plan: no plan", PROTO_PLAN, "{\"found\":false}", "missing plan" },
	{ "plan: found without step", PROTO_PLAN, "{\"plan\":1,\"found\":true}", "missing step" },
	{ "plan: bucket without backup", PROTO_PLAN,
	  "{\"plan\":1,\"found\":true,\"step\":5,\"source\":\"bucket\"}", "missing backup" },
	{ "plan: no holder", PROTO_PLAN,
	  "{\"plan\":1,\"found\":true,\"step\":5,\"owner\":0,\"hash\":" HOLD "}", "missing holder" },
	{ "plan: bad hash", PROTO_PLAN,
	  "{\"plan\":1,\"found\":true,\"step\":5,\"holder\":0,\"owner\":0,\"hash\":\"x\"}",
	  "hash is not 64 hex digits" },
	{ "plan: shards out of order", PROTO_PLAN,
	  "{\"plan\":1,\"found\":true,\"step\":5,\"holder\":0,\"owner\":0,\"hash\":" HOLD ","
	  "\"shards\":[{\"worker\":1,\"holder\":0,\"owner\":0,\"hash\":" HOLD "}]}",
	  "shards[0] names worker 1" },
	{ "plan: more shards than workers", PROTO_PLAN,
	  "{\"plan\":1,\"found\":true,\"step\":5,\"holder\":0,\"owner\":0,\"hash\":" HOLD ","
	  "\"shards\":[{},{},{}]}", "shards is not an array of at most 2" },
	{ "ec_data: job not a job name", PROTO_EC_DATA,
	  "{\"job\":\".x\",\"step\":1,\"group\":0,\"cw\":0,\"slot\":0}", "job is not a job name" },
	{ "ec_data: no step", PROTO_EC_DATA, "{\"job\":\"j\",\"group\":0,\"cw\":0,\"slot\":0}",
	  "missing step" },
	{ "ec_get: cw beyond the code", PROTO_EC_GET,
	  "{\"job\":\"j\",\"step\":1,\"group\":0,\"cw\":32,\"slot\":0}",
	  "cw is not an integer in 0..31" },
	{ "ec_get: no slot", PROTO_EC_GET, "{\"job\":\"j\",\"step\":1,\"group\":0,\"cw\":0}",
	  "missing slot" },
	{ "ec_data: group over the nodes", PROTO_EC_DATA,
	  "{\"job\":\"j\",\"step\":1,\"group\":65536,\"cw\":0,\"slot\":0}",
	  "group is not an integer in 0..65535" },
	{ "ec_meta: no manifest", PROTO_EC_META, "{\"job\":\"j\",\"step\":1,\"owner\":0}",
	  "missing manifest" },
	{ "ec_meta: owner not a rank", PROTO_EC_META,
	  "{\"job\":\"j\",\"step\":1,\"owner\":-1,\"manifest\":\"\"}", "owner is not" },
	{ "ec_data: to not a rank", PROTO_EC_DATA,
	  "{\"job\":\"j\",\"step\":1,\"group\":0,\"cw\":0,\"slot\":0,\"to\":-1}",
	  "to is not an integer" },
	{ "peers: no gen", PROTO_PEERS, "{}", "missing gen" },
	{ "peers: gen 0", PROTO_PEERS, "{\"gen\":0}", "gen is 0" },
	{ "ec_metas: step a string", PROTO_EC_METAS, "{\"job\":\"j\",\"step\":\"1\"}",
	  "step is not" },
};

static int decode_any(enum proto_op op, json_t *m, char *why, size_t n)
{
	union {
		struct proto_catalog c;
		struct proto_step_ev e;
		struct proto_fetch_failed f;
		struct proto_ready r;
		struct proto_register g;
		struct proto_backup_done d;
		struct proto_lkg l;
		struct proto_backup b;
		struct proto_report p;
		struct proto_plan n;
	} u;
	struct proto_plan_src sh[2];
	int rc;

	switch (op) {
	case PROTO_CATALOG:
		rc = proto_catalog_decode(m, &u.c, why, n);
		if (rc == 0)
			proto_catalog_free(&u.c);
		return rc;
	case PROTO_COMMITTED: return proto_committed_decode(m, &u.e, why, n);
	case PROTO_REPLICATED: return proto_replicated_decode(m, &u.e, why, n);
	case PROTO_FETCH_FAILED: return proto_fetch_failed_decode(m, &u.f, why, n);
	case PROTO_READY: return proto_ready_decode(m, &u.r, why, n);
	case PROTO_REGISTER: return proto_register_decode(m, &u.g, why, n);
	case PROTO_BACKUP_DONE: return proto_backup_done_decode(m, &u.d, why, n);
	case PROTO_LKG: return proto_lkg_decode(m, &u.l, why, n);
	case PROTO_BACKUP: return proto_backup_decode(m, &u.b, why, n);
	case PROTO_REPORT: return proto_report_decode(m, &u.p, why, n);
	case PROTO_PLAN: return proto_plan_decode(m, &u.n, sh, 2, why, n);
	case PROTO_PEERS: {
		uint64_t gen;
		return proto_peers_decode(m, &gen, why, n);
	}
	case PROTO_EC_META:
	case PROTO_EC_DATA:
	case PROTO_EC_GET:
	case PROTO_EC_METAS: {
		struct proto_ec x;
		return proto_ec_decode(op, m, &x, why, n);
	}
	default: return -ENOSYS;
	}
}

static void test_rejects(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(rejects) / sizeof(rejects[0]); i++) {
		const struct reject *r = &rejects[i];
		char why[160] = "";
		json_t *m = parse(r->json);
		int rc = decode_any(r->op, m, why, sizeof(why));
		json_decref(m);
		if (rc != -EINVAL)
			fail_msg("%s: rc %d, want -EINVAL", r->name, rc);
		if (!strstr(why, r->why))
			fail_msg("%s: reason \"%s\", want \"%s\" in it", r->name, why, r->why);
	}
}

/* More holds than PROTO_MAX_HOLDS: refused before any is read. */
static void test_reject_too_many_holds(void **state)
{
	json_t *m = parse("{\"job\":\"j\",\"nodes\":1,\"holds\":[]}"), *h = json_object_get(m, "holds");
	struct proto_catalog c;
	char why[160] = "";

	(void)state;
	for (unsigned i = 0; i <= PROTO_MAX_HOLDS; i++)
		json_array_append_new(h, json_pack("[i,i,s]", 0, (int)i, H1HEX));
	assert_int_equal(proto_catalog_decode(m, &c, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "more than 4096 holds");
	json_array_remove(h, 0);
	assert_int_equal(proto_catalog_decode(m, &c, why, sizeof(why)), 0);
	assert_int_equal(c.nholds, PROTO_MAX_HOLDS);
	proto_catalog_free(&c);
	json_decref(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_names),
		cmocka_unit_test(test_msg_op),
		cmocka_unit_test(test_dispatch),
		cmocka_unit_test(test_bytes_register),
		cmocka_unit_test(test_bytes_peers),
		cmocka_unit_test(test_bytes_catalog),
		cmocka_unit_test(test_bytes_restore),
		cmocka_unit_test(test_bytes_status_reply),
		cmocka_unit_test(test_bytes_plan),
		cmocka_unit_test(test_bytes_steps),
		cmocka_unit_test(test_bytes_backup),
		cmocka_unit_test(test_bytes_ec),
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_lenient),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_reject_too_many_holds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
