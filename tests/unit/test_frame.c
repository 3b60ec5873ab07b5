/* Unit tests for net/frame: the 24-byte header (round trip, the exact
 * bytes, every single-byte corruption, length/type/magic/version bounds
 * with a valid header CRC so that the field is what fails), the payload
 * CRC, frame building, the bounded JSON decoder (non-objects, nesting,
 * NUL escapes, duplicates, size), the validating accessors, hex, the
 * NT_FILE and NT_ERROR payloads and host:port parsing. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "net/frame.h"
#include "common/crc32c.h"

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* Recompute hdr_crc after editing a field, so only that field is wrong. */
static void reseal(uint8_t h[NET_HDR_LEN])
{
	put32(h + 20, mf_crc32c(0, h, 20));
}

/* ---- header ---- */

static void test_hdr_roundtrip(void **state)
{
	static const char payload[] = "{\"op\":\"ping\"}";
	uint32_t len = (uint32_t)strlen(payload);
	uint8_t h[NET_HDR_LEN];
	struct net_hdr d;

	(void)state;
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0x1234, 0xdeadbeef, payload, len), 0);
	/* the exact bytes: little-endian fields in order */
	assert_memory_equal(h, "MTCP", 4);
	assert_int_equal(h[4], 1);
	assert_int_equal(h[5], NT_REQ);
	assert_int_equal(h[6], 0x34);
	assert_int_equal(h[7], 0x12);
	assert_int_equal(h[8], 0xef);
	assert_int_equal(h[11], 0xde);
	assert_int_equal(h[12], len);
	assert_int_equal(h[13], 0);

	assert_int_equal(net_hdr_decode(h, &d), 0);
	assert_int_equal(d.magic, NET_MAGIC);
	assert_int_equal(d.version, NET_VERSION);
	assert_int_equal(d.type, NT_REQ);
	assert_int_equal(d.flags, 0x1234);
	assert_int_equal(d.req_id, 0xdeadbeef);
	assert_int_equal(d.len, len);
	assert_int_equal(d.payload_crc, mf_crc32c(0, payload, len));
	assert_int_equal(d.hdr_crc, mf_crc32c(0, h, 20));
	assert_int_equal(net_payload_check(&d, payload), 0);

	/* every type, empty payload */
	for (uint8_t t = NT_MIN; t <= NT_MAX; t++) {
		assert_int_equal(net_hdr_encode(h, t, 0, 0, NULL, 0), 0);
		assert_int_equal(net_hdr_decode(h, &d), 0);
		assert_int_equal(d.type, t);
		assert_int_equal(d.len, 0);
		assert_int_equal(d.payload_crc, 0);
		assert_int_equal(net_payload_check(&d, NULL), 0);
		assert_string_not_equal(net_type_name(t), "?");
	}
	assert_string_equal(net_type_name(0), "?");
	assert_string_equal(net_type_name(9), "?");
}

static void test_hdr_every_byte_corruption(void **state)
{
	static const uint8_t payload[] = { 1, 2, 3, 4, 5 };
	uint8_t h[NET_HDR_LEN], bad[NET_HDR_LEN];
	struct net_hdr d;
	int rejected = 0;

	(void)state;
	assert_int_equal(net_hdr_encode(h, NT_FILE, 7, 42, payload, sizeof(payload)), 0);
	assert_int_equal(net_hdr_decode(h, &d), 0);
	for (size_t i = 0; i < NET_HDR_LEN; i++) {
		for (unsigned x = 1; x < 256; x++) {
			memcpy(bad, h, sizeof(bad));
			bad[i] ^= (uint8_t)x;
			assert_int_equal(net_hdr_decode(bad, &d), -EBADMSG);
			rejected++;
		}
	}
	assert_int_equal(rejected, NET_HDR_LEN * 255);
}

static void test_hdr_bounds(void **state)
{
	uint8_t h[NET_HDR_LEN];
	struct net_hdr d;
	static uint8_t one;

	(void)state;
	/* encode refuses what decode would refuse */
	assert_int_equal(net_hdr_encode(h, 0, 0, 0, NULL, 0), -EINVAL);
	assert_int_equal(net_hdr_encode(h, NT_MAX + 1, 0, 0, NULL, 0), -EINVAL);
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 0, &one, NET_MAX_PAYLOAD + 1), -EMSGSIZE);
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 0, NULL, 5), -EINVAL);

	/* len: the maximum passes, one more fails, huge fails */
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 1, NULL, 0), 0);
	put32(h + 12, NET_MAX_PAYLOAD);
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), 0);
	assert_int_equal(d.len, NET_MAX_PAYLOAD);
	put32(h + 12, NET_MAX_PAYLOAD + 1);
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);
	put32(h + 12, 0xffffffffu);
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);

	/* type 0, 9, 255 with a valid header CRC */
	static const uint8_t badtypes[] = { 0, NT_MAX + 1, 255 };
	for (size_t i = 0; i < sizeof(badtypes); i++) {
		assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 1, NULL, 0), 0);
		h[5] = badtypes[i];
		reseal(h);
		assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);
	}
	/* magic and version with a valid header CRC */
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 1, NULL, 0), 0);
	h[0] = 'X';
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);
	assert_int_equal(net_hdr_encode(h, NT_REQ, 0, 1, NULL, 0), 0);
	h[4] = 2;
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);
	h[4] = 0;
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), -EBADMSG);
}

static void test_payload_crc(void **state)
{
	uint8_t p[100], h[NET_HDR_LEN];
	struct net_hdr d;

	(void)state;
	for (size_t i = 0; i < sizeof(p); i++)
		p[i] = (uint8_t)(i * 7);
	assert_int_equal(net_hdr_encode(h, NT_EVENT, 0, 0, p, sizeof(p)), 0);
	assert_int_equal(net_hdr_decode(h, &d), 0);
	assert_int_equal(net_payload_check(&d, p), 0);
	for (size_t i = 0; i < sizeof(p); i++) {
		p[i] ^= 0x01;
		assert_int_equal(net_payload_check(&d, p), -EBADMSG);
		p[i] ^= 0x01;
	}
	/* a header claiming an empty payload with a non-zero CRC */
	assert_int_equal(net_hdr_encode(h, NT_EVENT, 0, 0, NULL, 0), 0);
	put32(h + 16, 1);
	reseal(h);
	assert_int_equal(net_hdr_decode(h, &d), 0);
	assert_int_equal(net_payload_check(&d, NULL), -EBADMSG);
}

static void test_frame_build(void **state)
{
	json_t *m = json_pack("{s:s, s:i}", "op", "commit", "step", 100), *back = NULL;
	uint8_t *f = NULL;
	size_t flen = 0;
	struct net_hdr d;

	(void)state;
	assert_int_equal(net_frame_build(NT_REQ, 77, m, &f, &flen), 0);
	assert_true(flen > NET_HDR_LEN);
	assert_int_equal(net_hdr_decode(f, &d), 0);
	assert_int_equal(d.type, NT_REQ);
	assert_int_equal(d.req_id, 77);
	assert_int_equal(d.len, flen - NET_HDR_LEN);
	assert_int_equal(net_payload_check(&d, f + NET_HDR_LEN), 0);
	assert_memory_equal(f + NET_HDR_LEN, "{\"op\":\"commit\",\"step\":100}", d.len);
	assert_int_equal(net_json_decode(f + NET_HDR_LEN, d.len, &back), 0);
	assert_true(json_equal(m, back));
	json_decref(back);
	free(f);

	/* NULL message: empty payload, read back as {} */
	assert_int_equal(net_frame_build(NT_EVENT, 0, NULL, &f, &flen), 0);
	assert_int_equal(flen, NET_HDR_LEN);
	assert_int_equal(net_hdr_decode(f, &d), 0);
	assert_int_equal(net_json_decode(f + NET_HDR_LEN, d.len, &back), 0);
	assert_true(json_is_object(back));
	assert_int_equal(json_object_size(back), 0);
	json_decref(back);
	free(f);

	assert_int_equal(net_frame_build(0, 0, m, &f, &flen), -EINVAL);
	json_decref(m);

	/* too large a payload is refused at build time */
	{
		size_t n = NET_MAX_PAYLOAD;
		char *big = malloc(n + 1);
		assert_non_null(big);
		memset(big, 'a', n);
		big[n] = '\0';
		m = json_pack("{s:s}", "x", big);
		free(big);
		assert_non_null(m);
		assert_int_equal(net_frame_build(NT_REQ, 1, m, &f, &flen), -EMSGSIZE);
		json_decref(m);
	}

	/* raw payload */
	assert_int_equal(net_frame_build_raw(NT_CHALLENGE, 0, "0123456789abcdef0123456789abcdef",
					     32, &f, &flen), 0);
	assert_int_equal(flen, NET_HDR_LEN + 32);
	assert_int_equal(net_hdr_decode(f, &d), 0);
	assert_int_equal(net_payload_check(&d, f + NET_HDR_LEN), 0);
	free(f);
}

/* ---- JSON ---- */

static int decode_str(const char *s, json_t **o)
{
	return net_json_decode(s, strlen(s), o);
}

static void expect_bad(const char *s)
{
	json_t *o = (json_t *)1;

	assert_int_equal(decode_str(s, &o), -EBADMSG);
	assert_null(o);
}

static char *nested(int depth, bool in_string)
{
	size_t cap = (size_t)depth * 16 + 64, n = 0;
	char *s = malloc(cap);

	/* {"a":{"a":...{"z":1}...}} with depth objects */
	for (int i = 0; i < depth; i++)
		n += (size_t)snprintf(s + n, cap - n, "%s", i ? "\"a\":{" : "{");
	n += (size_t)snprintf(s + n, cap - n, "%s",
			      in_string ? "\"s\":\"[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{{{{\\\"{\""
					: "\"z\":1");
	for (int i = 0; i < depth; i++)
		s[n++] = '}';
	s[n] = '\0';
	return s;
}

static void test_json_decode(void **state)
{
	json_t *o = NULL;
	char *s;

	(void)state;
	assert_int_equal(decode_str("{\"a\":1,\"b\":[1,2,{\"c\":null}]}", &o), 0);
	assert_true(json_is_object(o));
	json_decref(o);
	assert_int_equal(net_json_decode("", 0, &o), 0);
	assert_int_equal(json_object_size(o), 0);
	json_decref(o);

	expect_bad("[1,2]");
	expect_bad("\"str\"");
	expect_bad("42");
	expect_bad("null");
	expect_bad("{");
	expect_bad("{} x");
	expect_bad("{}{}");
	expect_bad("{'a':1}");
	expect_bad("{\"a\":1,\"a\":2}");               /* duplicate key */
	expect_bad("{\"a\":\"x\\u0000y\"}");           /* NUL escape */
	expect_bad("{\"a\\u0000\":1}");
	expect_bad("{\"a\":\"\xff\xfe\"}");             /* not UTF-8 */
	assert_int_equal(net_json_decode("{\"a\":1}\0", 8, &o), -EBADMSG);   /* raw NUL */

	/* nesting: 16 levels pass, 17 fail; brackets inside strings don't count */
	s = nested(16, false);
	assert_int_equal(decode_str(s, &o), 0);
	json_decref(o);
	free(s);
	s = nested(17, false);
	expect_bad(s);
	free(s);
	s = nested(16, true);
	assert_int_equal(decode_str(s, &o), 0);
	json_decref(o);
	free(s);
	{
		/* deep arrays, far beyond: refused before jansson recurses */
		size_t n = 100000;
		char *a = malloc(n * 2 + 16);
		memcpy(a, "{\"x\":", 5);
		memset(a + 5, '[', n);
		memset(a + 5 + n, ']', n);
		memcpy(a + 5 + 2 * n, "}", 2);
		expect_bad(a);
		free(a);
	}
	/* size bound */
	assert_int_equal(net_json_decode("{}", (size_t)NET_MAX_PAYLOAD + 1, &o), -EBADMSG);
}

static void test_json_u64_int(void **state)
{
	json_t *o = NULL;
	uint64_t u = 12345;
	int64_t i = 0;

	(void)state;
	assert_int_equal(decode_str("{\"ok\":7,\"zero\":0,\"neg\":-1,\"real\":1.0,\"t\":true,"
				    "\"s\":\"7\",\"n\":null,\"big\":9223372036854775807,"
				    "\"arr\":[1],\"obj\":{}}", &o), 0);
	assert_int_equal(net_json_u64(o, "ok", 100, &u), 0);
	assert_int_equal(u, 7);
	assert_int_equal(net_json_u64(o, "ok", 7, &u), 0);
	assert_int_equal(net_json_u64(o, "ok", 6, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "zero", 0, &u), 0);
	assert_int_equal(u, 0);
	assert_int_equal(net_json_u64(o, "big", UINT64_MAX, &u), 0);
	assert_int_equal(u, 9223372036854775807ull);
	u = 99;
	assert_int_equal(net_json_u64(o, "neg", UINT64_MAX, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "real", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "t", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "s", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "n", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "arr", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "obj", 100, &u), -EBADMSG);
	assert_int_equal(net_json_u64(o, "missing", 100, &u), -ENOENT);
	assert_int_equal(u, 99);   /* untouched on failure */

	assert_int_equal(net_json_int(o, "neg", -1, 65535, &i), 0);
	assert_int_equal(i, -1);
	assert_int_equal(net_json_int(o, "neg", 0, 65535, &i), -EBADMSG);
	assert_int_equal(net_json_int(o, "ok", -1, 6, &i), -EBADMSG);
	assert_int_equal(net_json_int(o, "real", -1, 6, &i), -EBADMSG);
	assert_int_equal(net_json_int(o, "missing", -1, 6, &i), -ENOENT);
	/* not an object at all */
	assert_int_equal(net_json_u64(NULL, "ok", 100, &u), -ENOENT);
	json_decref(o);

	/* integers beyond int64 do not parse */
	expect_bad("{\"x\":18446744073709551615}");
}

static void test_json_str(void **state)
{
	json_t *o = NULL, *n;
	const char *s = NULL;

	(void)state;
	assert_int_equal(decode_str("{\"a\":\"hello\",\"e\":\"\",\"i\":5,\"u\":\"h\\u00e9\"}", &o), 0);
	assert_int_equal(net_json_str(o, "a", 5, &s), 0);
	assert_string_equal(s, "hello");
	assert_int_equal(net_json_str(o, "a", 4, &s), -EBADMSG);
	assert_int_equal(net_json_str(o, "e", 0, &s), 0);
	assert_string_equal(s, "");
	assert_int_equal(net_json_str(o, "i", 10, &s), -EBADMSG);
	assert_int_equal(net_json_str(o, "missing", 10, &s), -ENOENT);
	/* the bound is in bytes: "hé" is 3 bytes of UTF-8 */
	assert_int_equal(net_json_str(o, "u", 3, &s), 0);
	assert_int_equal(net_json_str(o, "u", 2, &s), -EBADMSG);

	/* an embedded NUL (only possible in objects built locally) */
	n = json_stringn_nocheck("ab\0cd", 5);
	assert_non_null(n);
	json_object_set_new(o, "nul", n);
	assert_int_equal(net_json_str(o, "nul", 100, &s), -EBADMSG);
	json_decref(o);
}

static void test_json_hex(void **state)
{
	uint8_t out[4] = { 0 }, h32[32];
	json_t *o = NULL;
	char hex[65];

	(void)state;
	assert_int_equal(decode_str("{\"h\":\"00ff7FaB\",\"short\":\"00ff7f\",\"odd\":\"00ff7fa\","
				    "\"bad\":\"00fg7fab\",\"num\":5,\"long\":\"00ff7fab00\"}", &o), 0);
	assert_int_equal(net_json_hex(o, "h", out, 4), 0);
	assert_int_equal(out[0], 0x00);
	assert_int_equal(out[1], 0xff);
	assert_int_equal(out[2], 0x7f);
	assert_int_equal(out[3], 0xab);
	assert_int_equal(net_json_hex(o, "short", out, 4), -EBADMSG);
	assert_int_equal(net_json_hex(o, "odd", out, 4), -EBADMSG);
	assert_int_equal(net_json_hex(o, "bad", out, 4), -EBADMSG);
	assert_int_equal(net_json_hex(o, "long", out, 4), -EBADMSG);
	assert_int_equal(net_json_hex(o, "num", out, 4), -EBADMSG);
	assert_int_equal(net_json_hex(o, "missing", out, 4), -ENOENT);
	json_decref(o);

	for (int i = 0; i < 32; i++)
		h32[i] = (uint8_t)(i * 9 + 1);
	net_hex_encode(h32, 32, hex);
	assert_int_equal(strlen(hex), 64);
	assert_memory_equal(hex, "010a131c252e37404952", 20);
	memset(out, 0, sizeof(out));
	{
		uint8_t back[32];
		assert_int_equal(net_hex_decode(hex, 64, back, 32), 0);
		assert_memory_equal(back, h32, 32);
		assert_int_equal(net_hex_decode(hex, 63, back, 32), -EINVAL);
		hex[10] = ' ';
		assert_int_equal(net_hex_decode(hex, 64, back, 32), -EINVAL);
	}
}

/* ---- typed payloads ---- */

static void test_file_hdr(void **state)
{
	json_t *m = NULL;
	const char *path;
	uint64_t size;
	uint32_t crc;

	(void)state;
	assert_int_equal(net_file_hdr_build("step/0/data.bin", 1ull << 33, 0x0a0b0c0d, &m), 0);
	assert_string_equal(json_string_value(json_object_get(m, "crc32c")), "0a0b0c0d");
	assert_int_equal(net_file_hdr_parse(m, &path, &size, &crc), 0);
	assert_string_equal(path, "step/0/data.bin");
	assert_int_equal(size, 1ull << 33);
	assert_int_equal(crc, 0x0a0b0c0d);
	json_decref(m);

	assert_int_equal(net_file_hdr_build("../etc/passwd", 1, 0, &m), -EINVAL);
	assert_int_equal(net_file_hdr_build("/abs", 1, 0, &m), -EINVAL);
	assert_int_equal(net_file_hdr_build("", 1, 0, &m), -EINVAL);
	assert_int_equal(net_file_hdr_build("a/./b", 1, 0, &m), -EINVAL);
	assert_int_equal(net_file_hdr_build("ok", NET_FILE_MAX + 1, 0, &m), -EINVAL);

	static const char *const bad[] = {
		"{\"path\":\"../x\",\"size\":1,\"crc32c\":\"00000000\"}",
		"{\"path\":\"/x\",\"size\":1,\"crc32c\":\"00000000\"}",
		"{\"path\":\"x\",\"size\":-1,\"crc32c\":\"00000000\"}",
		"{\"path\":\"x\",\"size\":17592186044417,\"crc32c\":\"00000000\"}",
		"{\"path\":\"x\",\"size\":1,\"crc32c\":\"0000000\"}",
		"{\"path\":\"x\",\"size\":1,\"crc32c\":12}",
		"{\"path\":\"x\",\"size\":1}",
		"{\"size\":1,\"crc32c\":\"00000000\"}",
		"{\"path\":5,\"size\":1,\"crc32c\":\"00000000\"}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(decode_str(bad[i], &m), 0);
		assert_int_equal(net_file_hdr_parse(m, &path, &size, &crc), -EBADMSG);
		json_decref(m);
	}
}

/* The sparse NT_FILE (issue 13): the "data" key, the exact bytes of an
 * extent header, every bound of its decode, and the CRC over holes. */
static void test_sparse_file(void **state)
{
	static const uint8_t want[NET_EXT_LEN] = {
		0x00, 0x10, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,   /* off 0x100001000 LE */
		0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,   /* len 0x2000 LE */
	};
	uint8_t eh[NET_EXT_LEN], buf[4096 + 3 + 5000] = { 0 };
	uint64_t size, data, off, len;
	const char *path;
	uint32_t crc;
	bool sparse;
	json_t *m = NULL;
	char *txt;

	(void)state;
	assert_int_equal(net_file_hdr_build_sparse("a/b", 1ull << 34, 0x01020304, 8192, &m), 0);
	txt = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
	assert_string_equal(txt, "{\"crc32c\":\"01020304\",\"data\":8192,\"path\":\"a/b\","
			    "\"size\":17179869184}");
	free(txt);
	assert_int_equal(net_file_hdr_parse(m, &path, &size, &crc), 0);
	assert_int_equal(net_file_hdr_data(m, size, &sparse, &data), 0);
	assert_true(sparse);
	assert_int_equal(data, 8192);
	json_decref(m);
	assert_int_equal(net_file_hdr_build_sparse("a", 10, 0, 11, &m), -EINVAL);

	/* a dense header: no "data", all of it is data */
	assert_int_equal(net_file_hdr_build("a", 10, 0, &m), 0);
	assert_int_equal(net_file_hdr_data(m, 10, &sparse, &data), 0);
	assert_false(sparse);
	assert_int_equal(data, 10);
	json_decref(m);
	static const char *const bad[] = {
		"{\"path\":\"x\",\"size\":10,\"crc32c\":\"00000000\",\"data\":11}",
		"{\"path\":\"x\",\"size\":10,\"crc32c\":\"00000000\",\"data\":-1}",
		"{\"path\":\"x\",\"size\":10,\"crc32c\":\"00000000\",\"data\":\"5\"}",
		"{\"path\":\"x\",\"size\":10,\"crc32c\":\"00000000\",\"data\":1.5}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(decode_str(bad[i], &m), 0);
		assert_int_equal(net_file_hdr_parse(m, &path, &size, &crc), 0);
		assert_int_equal(net_file_hdr_data(m, size, &sparse, &data), -EBADMSG);
		json_decref(m);
	}

	net_ext_encode(eh, 0x100001000ull, 0x2000);
	assert_memory_equal(eh, want, NET_EXT_LEN);
	assert_int_equal(net_ext_decode(eh, 0x100003000ull, 0, 0x2000, &off, &len), 0);
	assert_int_equal(off, 0x100001000ull);
	assert_int_equal(len, 0x2000);
	/* past the end, overlapping the previous extent, beyond "data", empty */
	assert_int_equal(net_ext_decode(eh, 0x100002fffull, 0, 0x2000, &off, &len), -EBADMSG);
	assert_int_equal(net_ext_decode(eh, 0x100003000ull, 0x100001001ull, 0x2000, &off, &len),
			 -EBADMSG);
	assert_int_equal(net_ext_decode(eh, 0x100003000ull, 0, 0x1fff, &off, &len), -EBADMSG);
	net_ext_encode(eh, 5, 0);
	assert_int_equal(net_ext_decode(eh, 100, 0, 100, &off, &len), -EBADMSG);
	net_ext_encode(eh, UINT64_MAX - 1, 4);   /* off + len wraps */
	assert_int_equal(net_ext_decode(eh, UINT64_MAX, 0, 100, &off, &len), -EBADMSG);
	net_ext_encode(eh, 100, 0);
	eh[8] = 1;
	assert_int_equal(net_ext_decode(eh, 101, 100, 1, &off, &len), 0);   /* ends at size */

	/* zeros appended by arithmetic = zeros read */
	memcpy(buf + 4096, "abc", 3);
	for (uint64_t n = 0; n <= 5000; n += (n < 70 ? 1 : 977))
		assert_int_equal(net_crc32c_zeros(mf_crc32c(0, buf + 4096, 3), n),
				 mf_crc32c(0, buf + 4096, 3 + n));
	assert_int_equal(net_crc32c_zeros(0, 4096), mf_crc32c(0, buf, 4096));
	assert_int_equal(net_crc32c_zeros(mf_crc32c(0, "x", 1), 0), mf_crc32c(0, "x", 1));
}

static void test_error_msg(void **state)
{
	json_t *m;

	(void)state;
	m = net_error_msg(-EACCES, "authentication failed");
	assert_int_equal(json_integer_value(json_object_get(m, "errno")), EACCES);
	assert_int_equal(net_error_errno(m), -EACCES);
	json_decref(m);
	m = net_error_msg(EBUSY, NULL);
	assert_int_equal(net_error_errno(m), -EBUSY);
	json_decref(m);
	m = json_pack("{s:s, s:i}", "error", "x", "errno", 0);
	assert_int_equal(net_error_errno(m), -EIO);
	json_decref(m);
	m = json_pack("{s:s, s:i}", "error", "x", "errno", 100000);
	assert_int_equal(net_error_errno(m), -EIO);
	json_decref(m);
	m = json_pack("{s:s}", "error", "x");
	assert_int_equal(net_error_errno(m), -EIO);
	json_decref(m);
}

static void test_hostport(void **state)
{
	char host[64];
	uint16_t port = 0;

	(void)state;
	assert_int_equal(net_split_hostport("127.0.0.1:7000", host, sizeof(host), &port, false), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 7000);
	assert_int_equal(net_split_hostport("[::1]:65535", host, sizeof(host), &port, false), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 65535);
	assert_int_equal(net_split_hostport("localhost:1", host, sizeof(host), &port, false), 0);
	assert_string_equal(host, "localhost");
	assert_int_equal(net_split_hostport(":7000", host, sizeof(host), &port, false), 0);
	assert_string_equal(host, "");
	assert_int_equal(net_split_hostport("127.0.0.1:0", host, sizeof(host), &port, true), 0);
	assert_int_equal(port, 0);

	static const char *const bad[] = {
		"127.0.0.1:0", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
		"127.0.0.1:+80", "127.0.0.1:80x", "::1:7000", "[::1]7000", "[::1]", "[]:80",
		"[::1:80", "h:99999999999999999999999",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(net_split_hostport(bad[i], host, sizeof(host), &port, false),
				 -EINVAL);
	/* host longer than the buffer */
	assert_int_equal(net_split_hostport("abcdefghij:1", host, 10, &port, false), -EINVAL);
	assert_int_equal(net_split_hostport("abcdefghi:1", host, 10, &port, false), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hdr_roundtrip),
		cmocka_unit_test(test_hdr_every_byte_corruption),
		cmocka_unit_test(test_hdr_bounds),
		cmocka_unit_test(test_payload_crc),
		cmocka_unit_test(test_frame_build),
		cmocka_unit_test(test_json_decode),
		cmocka_unit_test(test_json_u64_int),
		cmocka_unit_test(test_json_str),
		cmocka_unit_test(test_json_hex),
		cmocka_unit_test(test_file_hdr),
		cmocka_unit_test(test_sparse_file),
		cmocka_unit_test(test_error_msg),
		cmocka_unit_test(test_hostport),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
