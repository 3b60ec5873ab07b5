/* fuzz_peer_frame: the peer wire format of net/frame.h on an arbitrary byte
 * stream, read the way the server and nconn_recv read a connection: a
 * 24-byte header (net_hdr_decode), the payload (net_payload_check), the JSON
 * codec (net_json_decode) and the validating accessors with the keys the
 * handshake, the engine and the coordinator use, NT_FILE headers
 * (net_file_hdr_parse) followed by their raw bytes, NT_ERROR (net_error_errno).
 *
 * The engine's push/fetch validation (engine.c parse_key(),
 * decode_manifest_field()) is static and only reachable over a socket, so
 * this target stops at the frame layer; a "manifest" string is still taken
 * through base64 and mf_decode as decode_manifest_field() does.
 *
 * Two passes per input: as received (a receiver stops at the first bad
 * frame), then with both CRCs of every frame repaired so mutations reach the
 * JSON layer. Checked contracts (abort on breach): a decoded header
 * re-encodes to the same 24 bytes; a decoded payload rebuilt with
 * net_frame_build decodes to an equal object; accessor results respect their
 * bounds; a parsed NT_FILE header rebuilds and parses back equal; every
 * typed-message decoder of net/proto either refuses with a reason or
 * accepts something whose own encoding it accepts again, equal. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "common/util.h"
#include "net/frame.h"
#include "net/proto.h"
#include "tiers/manifest.h"

#define CHALLENGE_LEN 32u

static void die(const char *what)
{
	fprintf(stderr, "fuzz_peer_frame: %s\n", what);
	abort();
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void check_str(json_t *o, const char *key, size_t maxlen)
{
	const char *s = NULL;

	if (net_json_str(o, key, maxlen, &s) == 0 && (!s || strlen(s) > maxlen))
		die("net_json_str returned a string over its bound");
}

static void check_u64(json_t *o, const char *key, uint64_t max)
{
	uint64_t v = 0;

	if (net_json_u64(o, key, max, &v) == 0 && v > max)
		die("net_json_u64 returned a value over its bound");
}

static void check_int(json_t *o, const char *key, int64_t min, int64_t max)
{
	int64_t v = 0;

	if (net_json_int(o, key, min, max, &v) == 0 && (v < min || v > max))
		die("net_json_int returned a value out of its bounds");
}

static void check_hex(json_t *o, const char *key, size_t n)
{
	uint8_t b[32], b2[32];
	char hex[65];

	if (net_json_hex(o, key, b, n) < 0)
		return;
	net_hex_encode(b, n, hex);
	if (net_hex_decode(hex, 2 * n, b2, n) < 0 || memcmp(b, b2, n))
		die("net_hex_encode/net_hex_decode do not round-trip");
}

/* engine.c decode_manifest_field(): base64 of an encoded manifest */
static void check_manifest_field(json_t *o)
{
	const char *s;
	struct manifest *mf = NULL;
	uint8_t *raw;
	size_t slen, pad = 0;
	int n;

	if (net_json_str(o, "manifest", NET_MAX_PAYLOAD, &s) < 0)
		return;
	slen = strlen(s);
	if (slen % 4)
		return;
	raw = malloc(slen / 4 * 3 + 1);
	if (!raw)
		return;
	n = EVP_DecodeBlock(raw, (const unsigned char *)s, (int)slen);
	if (slen >= 1 && s[slen - 1] == '=')
		pad++;
	if (slen >= 2 && s[slen - 2] == '=')
		pad++;
	if (n >= (int)pad && mf_decode(raw, (size_t)n - pad, &mf) == 0)
		mf_free(mf);
	free(raw);
}

static void check_hostport(json_t *o)
{
	const char *s;
	char host[256];
	uint16_t port = 0;

	if (net_json_str(o, "addr", 512, &s) < 0)
		return;
	for (int zero = 0; zero < 2; zero++) {
		if (net_split_hostport(s, host, sizeof(host), &port, zero) == 0 &&
		    ((!zero && port == 0) || strlen(host) >= sizeof(host)))
			die("net_split_hostport accepted a bad port or overflowed host");
	}
}

/* The typed messages (net/proto): every decoder on every object. A refusal
 * must say why; what one accepts must encode to something it accepts
 * again, with the same values (same: a condition on v and v2). */
#define PROTO_CHECK(T, dec, enc, v, same)                                            \
	do {                                                                         \
		T v2;                                                                \
		json_t *e;                                                           \
		why[0] = '\0';                                                       \
		rc = dec(o, &v, why, sizeof(why));                                   \
		if (rc == -EINVAL && !why[0])                                        \
			die(#dec " refused without a reason");                       \
		if (rc != 0)                                                         \
			break;                                                       \
		e = enc(&v);                                                         \
		if (!e || dec(e, &v2, why, sizeof(why)) != 0 || !(same))             \
			die(#dec ": its own encoding is refused or changed");        \
		json_decref(e);                                                      \
	} while (0)

static bool holds_in_range(const struct proto_catalog *c)
{
	for (size_t i = 0; i < c->nholds; i++)
		if (c->holds[i].owner >= c->job.nodes || c->holds[i].worker >= PROTO_MAX_WORKERS)
			return false;
	return true;
}

/* Frees both catalogs: the condition of the catalog's PROTO_CHECK. */
static bool catalogs_equal(struct proto_catalog *a, struct proto_catalog *b)
{
	bool eq = holds_in_range(a) && a->nholds == b->nholds && a->job.nodes == b->job.nodes &&
		  (a->nholds == 0 || !memcmp(a->holds[0].hash, b->holds[0].hash, 32));
	proto_catalog_free(a);
	proto_catalog_free(b);
	return eq;
}

/* The plan decoder takes its shard array: wrapped to PROTO_CHECK's shape. */
static struct proto_plan_src plan_sh[PROTO_MAX_WORKERS];
static int plan_decode(json_t *o, struct proto_plan *m, char *why, size_t whylen)
{
	return proto_plan_decode(o, m, plan_sh, PROTO_MAX_WORKERS, why, whylen);
}

static void check_proto(json_t *o)
{
	char why[160];
	enum proto_op op;
	struct proto_catalog c;
	struct proto_step_ev se;
	struct proto_fetch_failed ff;
	struct proto_ready rd;
	struct proto_register rg;
	struct proto_backup_done bd;
	struct proto_lkg lk;
	struct proto_backup bk;
	struct proto_report rp;
	struct proto_plan pl;
	int rc;

	if (proto_msg_op(o, &op) == 0 && (op < PROTO_OP_UNKNOWN || op >= PROTO_OP_COUNT))
		die("proto_msg_op returned an op out of range");
	PROTO_CHECK(struct proto_catalog, proto_catalog_decode, proto_catalog_encode, c,
		    catalogs_equal(&c, &v2));
	PROTO_CHECK(struct proto_step_ev, proto_committed_decode, proto_committed_encode, se,
		    v2.step == se.step && v2.worker == se.worker && v2.workers == se.workers &&
		    !memcmp(v2.hash, se.hash, 32));
	PROTO_CHECK(struct proto_step_ev, proto_replicated_decode, proto_replicated_encode, se,
		    v2.step == se.step && v2.worker == se.worker);
	PROTO_CHECK(struct proto_fetch_failed, proto_fetch_failed_decode, proto_fetch_failed_encode,
		    ff, v2.holder == ff.holder && v2.step == ff.step && v2.worker == ff.worker);
	PROTO_CHECK(struct proto_ready, proto_ready_decode, proto_ready_encode, rd,
		    v2.plan == rd.plan);
	PROTO_CHECK(struct proto_register, proto_register_decode, proto_register_encode, rg,
		    !strcmp(v2.addr, rg.addr) && !v2.job == !rg.job);
	PROTO_CHECK(struct proto_backup_done, proto_backup_done_decode, proto_backup_done_encode,
		    bd, v2.ok == bd.ok && !strcmp(v2.name, bd.name));
	PROTO_CHECK(struct proto_lkg, proto_lkg_decode, proto_lkg_encode, lk,
		    v2.step == lk.step && v2.has_safe == lk.has_safe && lk.safe <= lk.step);
	PROTO_CHECK(struct proto_backup, proto_backup_decode, proto_backup_encode, bk,
		    v2.data == bk.data && v2.step == bk.step);
	PROTO_CHECK(struct proto_report, proto_report_decode, proto_report_encode, rp,
		    !strcmp(v2.text, rp.text));
	PROTO_CHECK(struct proto_plan, plan_decode, proto_plan_encode, pl,
		    v2.plan == pl.plan && v2.found == pl.found && v2.step == pl.step &&
		    v2.bucket == pl.bucket && pl.nshards <= PROTO_MAX_WORKERS);
	/* erasure coding's requests: one decoder for the four, by op */
	for (int eo = PROTO_EC_META; eo <= PROTO_EC_METAS; eo++) {
		struct proto_ec ec, ec2;
		json_t *e;
		why[0] = '\0';
		rc = proto_ec_decode((enum proto_op)eo, o, &ec, why, sizeof(why));
		if (rc == -EINVAL && !why[0])
			die("proto_ec_decode refused without a reason");
		if (rc != 0)
			continue;
		e = proto_ec_encode((enum proto_op)eo, &ec);
		if (!e || proto_ec_decode((enum proto_op)eo, e, &ec2, why, sizeof(why)) != 0 ||
		    ec2.step != ec.step || ec2.cw != ec.cw || ec2.slot != ec.slot ||
		    strcmp(ec2.job, ec.job))
			die("proto_ec_decode: its own encoding is refused or changed");
		json_decref(e);
	}
}

/* Everything the receivers ask of a decoded JSON payload. */
static void check_object(uint8_t type, uint32_t req_id, json_t *o)
{
	uint8_t *frame = NULL;
	size_t flen = 0;
	struct net_hdr h2;
	json_t *o2 = NULL;
	int rc;

	if (!json_is_object(o))
		die("net_json_decode returned a non-object");
	/* handshake (server.c hello_in, client.c) */
	check_int(o, "rank", -1, 65535);
	check_str(o, "purpose", 16);
	check_hex(o, "nonce", 32);
	check_hex(o, "mac", 32);
	/* engine and coordinator requests */
	check_str(o, "op", 32);
	check_str(o, "job", 128);
	check_u64(o, "step", UINT64_MAX >> 1);
	check_u64(o, "owner", 65535);
	check_u64(o, "worker", 63);
	check_u64(o, "holder", 65535);
	check_u64(o, "plan", UINT32_MAX);
	check_u64(o, "nodes", 65536);
	check_u64(o, "dp", 65536);
	check_hex(o, "hash", 32);
	check_str(o, "error", 4096);
	check_u64(o, "size", NET_FILE_MAX);
	if (json_is_object(json_object_get(o, "key"))) {
		json_t *k = json_object_get(o, "key");
		check_str(k, "job", 128);
		check_u64(k, "step", UINT64_MAX >> 1);
		check_u64(k, "owner", 65535);
		check_u64(k, "worker", 63);
	}
	check_manifest_field(o);
	check_hostport(o);
	check_proto(o);
	if (type == NT_ERROR) {
		rc = net_error_errno(o);
		if (rc > -1 || rc < -4095)
			die("net_error_errno outside -4095..-1");
	}

	/* the object survives a trip through the encoder */
	rc = net_frame_build(type, req_id, o, &frame, &flen);
	if (rc == -EMSGSIZE)
		return;
	if (rc != 0 || flen < NET_HDR_LEN)
		die("net_frame_build failed on a decoded object");
	if (net_hdr_decode(frame, &h2) != 0 || h2.type != type || h2.req_id != req_id ||
	    h2.len != flen - NET_HDR_LEN || net_payload_check(&h2, frame + NET_HDR_LEN) != 0)
		die("net_frame_build wrote a header that does not decode");
	if (net_json_decode(frame + NET_HDR_LEN, h2.len, &o2) != 0)
		die("a rebuilt payload does not decode");
	if (!json_equal(o, o2))
		die("a rebuilt payload decodes to a different object");
	json_decref(o2);
	free(frame);
}

/* NT_FILE: the header and the count of raw bytes that follow (or -1). */
static int64_t check_file_hdr(json_t *o)
{
	const char *path = NULL, *path2 = NULL;
	uint64_t size = 0, size2 = 0;
	uint32_t crc = 0, crc2 = 0;
	json_t *b = NULL;

	if (net_file_hdr_parse(o, &path, &size, &crc) < 0)
		return -1;
	if (!path || strlen(path) >= NET_PATH_MAX || !util_safe_relpath(path, strlen(path)) ||
	    size > NET_FILE_MAX)
		die("net_file_hdr_parse accepted an unsafe path or size");
	if (net_file_hdr_build(path, size, crc, &b) != 0)
		die("net_file_hdr_build rejects what net_file_hdr_parse accepted");
	if (net_file_hdr_parse(b, &path2, &size2, &crc2) != 0 || strcmp(path, path2) ||
	    size != size2 || crc != crc2)
		die("NT_FILE header does not round-trip");
	json_decref(b);
	return (int64_t)size;
}

/* One pass over the stream; repair: fix both CRCs of every frame first. */
static void pass(const uint8_t *data, size_t size, int repair)
{
	size_t off = 0;

	while (size - off >= NET_HDR_LEN) {
		uint8_t hb[NET_HDR_LEN], re[NET_HDR_LEN];
		const uint8_t *p;
		struct net_hdr h;
		json_t *o = NULL;
		int64_t skip = 0;
		uint32_t len;

		memcpy(hb, data + off, NET_HDR_LEN);
		off += NET_HDR_LEN;
		len = get_le32(hb + 12);
		if (repair) {
			if (len <= size - off)
				put_le32(hb + 16, len ? mf_crc32c(0, data + off, len) : 0);
			put_le32(hb + 20, mf_crc32c(0, hb, 20));
		}
		(void)net_type_name(hb[5]);
		if (net_hdr_decode(hb, &h) < 0)
			return;
		if (h.len != len || h.type < NT_MIN || h.type > NT_MAX || h.len > NET_MAX_PAYLOAD)
			die("net_hdr_decode accepted a header out of bounds");
		if (h.len > size - off)
			return;                 /* the connection ends mid-frame */
		p = data + off;
		off += h.len;
		if (net_payload_check(&h, h.len ? p : NULL) < 0)
			return;
		if (net_hdr_encode(re, h.type, h.flags, h.req_id, h.len ? p : NULL, h.len) != 0 ||
		    memcmp(re, hb, NET_HDR_LEN))
			die("a decoded header does not re-encode to the same bytes");
		if (h.type == NT_CHALLENGE) {
			if (h.len != CHALLENGE_LEN)
				return;
			continue;
		}
		if (net_json_decode(h.len ? p : NULL, h.len, &o) < 0)
			return;
		check_object(h.type, h.req_id, o);
		if (h.type == NT_FILE)
			skip = check_file_hdr(o);
		json_decref(o);
		if (skip < 0)
			return;
		if ((uint64_t)skip > size - off)
			return;                 /* the file's bytes end early */
		off += (size_t)skip;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pass(data, size, 0);
	pass(data, size, 1);
	return 0;
}
