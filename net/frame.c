#include "net/frame.h"
#include "common/util.h"
#include "common/crc32c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

const char *net_type_name(uint8_t type)
{
	static const char *const names[] = {
		[NT_CHALLENGE] = "CHALLENGE", [NT_HELLO] = "HELLO",
		[NT_WELCOME] = "WELCOME", [NT_REQ] = "REQ", [NT_RESP] = "RESP",
		[NT_EVENT] = "EVENT", [NT_FILE] = "FILE", [NT_ERROR] = "ERROR",
	};

	if (type < NT_MIN || type > NT_MAX)
		return "?";
	return names[type];
}

int net_hdr_encode(uint8_t out[NET_HDR_LEN], uint8_t type, uint16_t flags,
		   uint32_t req_id, const void *payload, uint32_t len)
{
	if (type < NT_MIN || type > NT_MAX)
		return -EINVAL;
	if (len > NET_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (len > 0 && !payload)
		return -EINVAL;
	put_le32(out, NET_MAGIC);
	out[4] = NET_VERSION;
	out[5] = type;
	put_le16(out + 6, flags);
	put_le32(out + 8, req_id);
	put_le32(out + 12, len);
	put_le32(out + 16, len ? mf_crc32c(0, payload, len) : 0);
	put_le32(out + 20, mf_crc32c(0, out, 20));
	return 0;
}

int net_hdr_decode(const uint8_t in[NET_HDR_LEN], struct net_hdr *h)
{
	h->magic = get_le32(in);
	h->version = in[4];
	h->type = in[5];
	h->flags = get_le16(in + 6);
	h->req_id = get_le32(in + 8);
	h->len = get_le32(in + 12);
	h->payload_crc = get_le32(in + 16);
	h->hdr_crc = get_le32(in + 20);
	if (h->magic != NET_MAGIC || h->version != NET_VERSION)
		return -EBADMSG;
	if (h->hdr_crc != mf_crc32c(0, in, 20))
		return -EBADMSG;
	if (h->type < NT_MIN || h->type > NT_MAX || h->len > NET_MAX_PAYLOAD)
		return -EBADMSG;
	return 0;
}

int net_payload_check(const struct net_hdr *h, const void *payload)
{
	uint32_t crc = h->len ? mf_crc32c(0, payload, h->len) : 0;

	return crc == h->payload_crc ? 0 : -EBADMSG;
}

int net_frame_build_raw(uint8_t type, uint32_t req_id, const void *p, uint32_t len,
			uint8_t **frame, size_t *frame_len)
{
	uint8_t *buf;
	int rc;

	if (len > NET_MAX_PAYLOAD)
		return -EMSGSIZE;
	buf = malloc(NET_HDR_LEN + (size_t)len);
	if (!buf)
		return -ENOMEM;
	if (len)
		memcpy(buf + NET_HDR_LEN, p, len);
	rc = net_hdr_encode(buf, type, 0, req_id, len ? buf + NET_HDR_LEN : NULL, len);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	*frame = buf;
	*frame_len = NET_HDR_LEN + (size_t)len;
	return 0;
}

int net_frame_build(uint8_t type, uint32_t req_id, json_t *msg,
		    uint8_t **frame, size_t *frame_len)
{
	const size_t flags = JSON_COMPACT;
	uint8_t *buf;
	size_t n, m;
	int rc;

	if (type < NT_MIN || type > NT_MAX)
		return -EINVAL;
	if (!msg)
		return net_frame_build_raw(type, req_id, NULL, 0, frame, frame_len);
	/* First pass sizes, second fills: one allocation, no extra copy. */
	n = json_dumpb(msg, NULL, 0, flags);
	if (n == 0)
		return -EINVAL;   /* not serializable (e.g. NaN) */
	if (n > NET_MAX_PAYLOAD)
		return -EMSGSIZE;
	buf = malloc(NET_HDR_LEN + n);
	if (!buf)
		return -ENOMEM;
	m = json_dumpb(msg, (char *)buf + NET_HDR_LEN, n, flags);
	if (m != n) {
		free(buf);
		return -EINVAL;
	}
	rc = net_hdr_encode(buf, type, 0, req_id, buf + NET_HDR_LEN, (uint32_t)n);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	*frame = buf;
	*frame_len = NET_HDR_LEN + n;
	return 0;
}

/* Nesting depth of JSON text, counted outside strings; jansson has no
 * runtime limit of its own (2048, compiled in), so bound it before parsing. */
static bool depth_ok(const char *p, size_t len)
{
	bool in_str = false, esc = false;
	int depth = 0;

	for (size_t i = 0; i < len; i++) {
		char ch = p[i];
		if (in_str) {
			if (esc)
				esc = false;
			else if (ch == '\\')
				esc = true;
			else if (ch == '"')
				in_str = false;
			continue;
		}
		if (ch == '"') {
			in_str = true;
		} else if (ch == '{' || ch == '[') {
			if (++depth > NET_JSON_MAX_DEPTH)
				return false;
		} else if (ch == '}' || ch == ']') {
			depth--;
		}
	}
	return true;
}

int net_json_decode(const void *p, size_t len, json_t **out)
{
	json_error_t err;
	json_t *o;

	*out = NULL;
	if (len > NET_MAX_PAYLOAD)
		return -EBADMSG;
	if (len == 0) {
		o = json_object();
		if (!o)
			return -ENOMEM;
		*out = o;
		return 0;
	}
	if (!depth_ok(p, len))
		return -EBADMSG;
	/* No JSON_DECODE_ANY (top level must be a container), no
	 * JSON_ALLOW_NUL (\u0000 is an error), duplicate keys rejected. */
	o = json_loadb(p, len, JSON_REJECT_DUPLICATES, &err);
	if (!o)
		return -EBADMSG;
	if (!json_is_object(o)) {
		json_decref(o);
		return -EBADMSG;
	}
	*out = o;
	return 0;
}

static json_t *get(json_t *o, const char *key)
{
	return json_is_object(o) ? json_object_get(o, key) : NULL;
}

int net_json_int(json_t *o, const char *key, int64_t min, int64_t max, int64_t *out)
{
	json_t *v = get(o, key);
	json_int_t i;

	if (!v)
		return -ENOENT;
	if (!json_is_integer(v))
		return -EBADMSG;
	i = json_integer_value(v);
	if ((int64_t)i < min || (int64_t)i > max)
		return -EBADMSG;
	*out = (int64_t)i;
	return 0;
}

int net_json_u64(json_t *o, const char *key, uint64_t max, uint64_t *out)
{
	int64_t i;
	/* jansson holds integers as long long: values above INT64_MAX do not
	 * parse at all, so the largest representable u64 here is INT64_MAX. */
	int rc = net_json_int(o, key, 0, max > INT64_MAX ? INT64_MAX : (int64_t)max, &i);

	if (rc == 0)
		*out = (uint64_t)i;
	return rc;
}

int net_json_str(json_t *o, const char *key, size_t maxlen, const char **out)
{
	json_t *v = get(o, key);
	const char *s;
	size_t n;

	if (!v)
		return -ENOENT;
	if (!json_is_string(v))
		return -EBADMSG;
	s = json_string_value(v);
	n = json_string_length(v);
	if (n > maxlen || memchr(s, '\0', n))
		return -EBADMSG;
	*out = s;
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int net_hex_decode(const char *s, size_t slen, uint8_t *out, size_t n)
{
	if (slen != 2 * n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

void net_hex_encode(const uint8_t *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int net_json_hex(json_t *o, const char *key, uint8_t *out, size_t n)
{
	json_t *v = get(o, key);

	if (!v)
		return -ENOENT;
	if (!json_is_string(v))
		return -EBADMSG;
	if (net_hex_decode(json_string_value(v), json_string_length(v), out, n) < 0)
		return -EBADMSG;
	return 0;
}

int net_file_hdr_build(const char *path, uint64_t size, uint32_t crc32c, json_t **out)
{
	char hex[9];
	size_t plen = strnlen(path, NET_PATH_MAX);
	json_t *o;

	if (plen >= NET_PATH_MAX || !util_safe_relpath(path, plen) || size > NET_FILE_MAX)
		return -EINVAL;
	snprintf(hex, sizeof(hex), "%08x", crc32c);
	o = json_pack("{s:s, s:I, s:s}", "path", path, "size", (json_int_t)size,
		      "crc32c", hex);
	if (!o)
		return -ENOMEM;
	*out = o;
	return 0;
}

int net_file_hdr_parse(json_t *msg, const char **path, uint64_t *size, uint32_t *crc32c)
{
	uint8_t c[4];
	const char *p;

	if (net_json_str(msg, "path", NET_PATH_MAX - 1, &p) < 0 ||
	    !util_safe_relpath(p, strlen(p)) ||
	    net_json_u64(msg, "size", NET_FILE_MAX, size) < 0 ||
	    net_json_hex(msg, "crc32c", c, sizeof(c)) < 0)
		return -EBADMSG;
	*path = p;
	*crc32c = (uint32_t)c[0] << 24 | (uint32_t)c[1] << 16 | (uint32_t)c[2] << 8 | c[3];
	return 0;
}

int net_file_hdr_build_sparse(const char *path, uint64_t size, uint32_t crc32c, uint64_t data,
			      json_t **out)
{
	int rc;

	if (data > size)
		return -EINVAL;
	rc = net_file_hdr_build(path, size, crc32c, out);
	if (rc < 0)
		return rc;
	if (json_object_set_new(*out, "data", json_integer((json_int_t)data)) < 0) {
		json_decref(*out);
		*out = NULL;
		return -ENOMEM;
	}
	return 0;
}

int net_file_hdr_data(json_t *msg, uint64_t size, bool *sparse, uint64_t *data)
{
	int rc = net_json_u64(msg, "data", size, data);

	*sparse = rc == 0;
	if (rc == -ENOENT) {
		*data = size;
		return 0;
	}
	return rc < 0 ? -EBADMSG : 0;
}

void net_ext_encode(uint8_t out[NET_EXT_LEN], uint64_t off, uint64_t len)
{
	for (int i = 0; i < 8; i++) {
		out[i] = (uint8_t)(off >> (8 * i));
		out[8 + i] = (uint8_t)(len >> (8 * i));
	}
}

int net_ext_decode(const uint8_t in[NET_EXT_LEN], uint64_t size, uint64_t done_to,
		   uint64_t data_left, uint64_t *off, uint64_t *len)
{
	uint64_t o = 0, l = 0;

	for (int i = 7; i >= 0; i--) {
		o = o << 8 | in[i];
		l = l << 8 | in[8 + i];
	}
	/* in order, not overlapping, inside the file, within what was announced */
	if (l == 0 || o < done_to || o > size || l > size - o || l > data_left)
		return -EBADMSG;
	*off = o;
	*len = l;
	return 0;
}

/* GF(2) 32x32 matrix times vector, and the square of a matrix: the way
 * zlib's crc32_combine moves a CRC over zeros without reading them. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;

	for (; vec; vec >>= 1, mat++)
		if (vec & 1)
			sum ^= *mat;
	return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		sq[n] = gf2_times(mat, mat[n]);
}

uint32_t net_crc32c_zeros(uint32_t crc, uint64_t n)
{
	uint32_t odd[32], even[32], reg;
	uint32_t row = 1;

	if (n == 0)
		return crc;
	odd[0] = 0x82f63b78u;           /* one zero bit: the reflected polynomial */
	for (int i = 1; i < 32; i++) {
		odd[i] = row;
		row <<= 1;
	}
	gf2_square(even, odd);          /* two zero bits */
	gf2_square(odd, even);          /* four */
	reg = ~crc;                     /* the raw register, as mf_crc32c keeps it */
	do {
		gf2_square(even, odd);      /* 1, 4, 16, ... bytes */
		if (n & 1)
			reg = gf2_times(even, reg);
		n >>= 1;
		if (!n)
			break;
		gf2_square(odd, even);      /* 2, 8, 32, ... bytes */
		if (n & 1)
			reg = gf2_times(odd, reg);
		n >>= 1;
	} while (n);
	return ~reg;
}

json_t *net_error_msg(int err, const char *text)
{
	if (err < 0)
		err = -err;
	return json_pack("{s:s, s:i}", "error", text ? text : "", "errno", err);
}

int net_error_errno(json_t *msg)
{
	int64_t e;

	if (net_json_int(msg, "errno", 1, 4095, &e) < 0)
		return -EIO;
	return (int)-e;
}

int net_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
		       bool allow_zero)
{
	const char *colon, *h, *pstr;
	size_t hl;
	uint64_t v;

	if (!s || hostlen == 0)
		return -EINVAL;
	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			return -EINVAL;
		h = s + 1;
		hl = (size_t)(rb - h);
		pstr = rb + 2;
		if (hl == 0)
			return -EINVAL;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		h = s;
		hl = (size_t)(colon - s);
		if (memchr(h, ':', hl))
			return -EINVAL;   /* bare IPv6 needs brackets */
		pstr = colon + 1;
	}
	if (hl >= hostlen)
		return -EINVAL;
	if (util_parse_u64(pstr, 65535, &v) < 0 || (v == 0 && !allow_zero))
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	*port = (uint16_t)v;
	return 0;
}
