/* frame: the peer wire format. Owns the 24-byte frame header (encode,
 * decode, CRC checks), the bounded JSON payload codec and the validating
 * accessors every receiver uses on untrusted payloads, and host:port
 * parsing. Pure functions with no global state: any thread may call them.
 * Returned json_t objects belong to the caller (json_decref); strings
 * returned by the accessors live as long as the object they came from.
 *
 * Frame on the stream (all integers little-endian):
 *   u32 magic "MTCP" (0x5043544d)  u8 version (1)  u8 type  u16 flags
 *   u32 req_id  u32 len  u32 payload_crc (CRC32C of the payload)
 *   u32 hdr_crc (CRC32C of the 20 bytes before it)
 *   then len payload bytes; after an NT_FILE frame, exactly "size" raw
 *   bytes (from its JSON payload) follow and are not counted in len.
 *   A sparse NT_FILE (its payload has "data": D, sent only to a peer whose
 *   HELLO or WELCOME said "sparse": true) is followed instead by extents
 *   until D bytes have come: u64 off, u64 len (len > 0, in increasing
 *   order, not overlapping, off + len <= size), then len bytes of the
 *   file at off. Everything between them is a hole (zeros); "crc32c" is
 *   over all size logical bytes, holes included. */
#ifndef MTCFS_NET_FRAME_H
#define MTCFS_NET_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define NET_MAGIC        0x5043544du
#define NET_VERSION      1u
#define NET_HDR_LEN      24u
#define NET_MAX_PAYLOAD  (16u << 20)      /* 16 MiB */
#define NET_JSON_MAX_DEPTH 16
#define NET_PATH_MAX     4096u            /* NT_FILE "path" */
#define NET_FILE_MAX     (1ULL << 44)     /* NT_FILE "size": 16 TiB, as MF_MAX_FILE_SIZE */
#define NET_EXT_LEN      16u              /* a sparse NT_FILE's extent header */

enum net_type {
	NT_CHALLENGE = 1,   /* server -> client: 32-byte nonce, binary */
	NT_HELLO     = 2,   /* client -> server: {"rank","purpose","nonce","mac"} */
	NT_WELCOME   = 3,   /* server -> client: {"rank","mac"} */
	NT_REQ       = 4,   /* JSON request, req_id chosen by the sender */
	NT_RESP      = 5,   /* JSON response, the request's req_id */
	NT_EVENT     = 6,   /* JSON one-way message, req_id 0 */
	NT_FILE      = 7,   /* {"path","size","crc32c"} then size raw bytes */
	NT_ERROR     = 8,   /* {"error": str, "errno": int} */
};
#define NT_MIN NT_CHALLENGE
#define NT_MAX NT_ERROR

struct net_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t type;
	uint16_t flags;       /* reserved: sent as given, not interpreted */
	uint32_t req_id;
	uint32_t len;         /* payload bytes, <= NET_MAX_PAYLOAD */
	uint32_t payload_crc;
	uint32_t hdr_crc;
};

/* Name of a frame type for logs ("REQ", ...; "?" when unknown). */
const char *net_type_name(uint8_t type);

/* Fill out[24] for a frame whose payload is payload[0..len) (payload may be
 * NULL when len is 0). 0, or -EINVAL (bad type) / -EMSGSIZE (len too big). */
int net_hdr_encode(uint8_t out[NET_HDR_LEN], uint8_t type, uint16_t flags,
		   uint32_t req_id, const void *payload, uint32_t len);
/* Parse and validate a received header: magic, version, type, len bound and
 * hdr_crc (not the payload CRC). 0 or -EBADMSG; *h is filled either way. */
int net_hdr_decode(const uint8_t in[NET_HDR_LEN], struct net_hdr *h);
/* Payload CRC check: 0 or -EBADMSG. */
int net_payload_check(const struct net_hdr *h, const void *payload);

/* Serialize msg (compact) into one malloc'd buffer holding header + payload,
 * ready for the socket. msg NULL means an empty payload. *frame owned by the
 * caller (free). 0, -EINVAL, -EMSGSIZE (payload > NET_MAX_PAYLOAD), -ENOMEM. */
int net_frame_build(uint8_t type, uint32_t req_id, json_t *msg,
		    uint8_t **frame, size_t *frame_len);
/* Same for a binary payload p[0..len). */
int net_frame_build_raw(uint8_t type, uint32_t req_id, const void *p, uint32_t len,
			uint8_t **frame, size_t *frame_len);

/* Decode an untrusted JSON payload: must be one object, at most
 * NET_JSON_MAX_DEPTH levels of nesting, len <= NET_MAX_PAYLOAD, no duplicate
 * keys, no NUL escapes. An empty payload (len 0) decodes to {}.
 * 0 or -EBADMSG; *out owned by the caller. */
int net_json_decode(const void *p, size_t len, json_t **out);

/* Validating accessors for untrusted objects. All return 0, -ENOENT when
 * the key is missing (or o is not an object), -EBADMSG when the value has
 * the wrong type or is out of bounds. */
/* Non-negative integer <= max (reals, booleans and negatives rejected). */
int net_json_u64(json_t *o, const char *key, uint64_t max, uint64_t *out);
/* Integer in [min, max]. */
int net_json_int(json_t *o, const char *key, int64_t min, int64_t max, int64_t *out);
/* String of at most maxlen bytes without NUL; *out valid while o lives. */
int net_json_str(json_t *o, const char *key, size_t maxlen, const char **out);
/* String of exactly 2n hex digits (either case) -> out[0..n). */
int net_json_hex(json_t *o, const char *key, uint8_t *out, size_t n);

/* Lower-case hex of in[0..n) into out (2n + 1 bytes, NUL-terminated). */
void net_hex_encode(const uint8_t *in, size_t n, char *out);
/* Exactly 2n hex digits -> out[0..n). 0 or -EINVAL. */
int net_hex_decode(const char *s, size_t slen, uint8_t *out, size_t n);

/* NT_FILE payload: build {"path","size","crc32c":"%08x"} (path must pass
 * util_safe_relpath and be < NET_PATH_MAX, size <= NET_FILE_MAX: else
 * -EINVAL), and parse/validate a received one (-EBADMSG). *path valid
 * while msg lives. */
int net_file_hdr_build(const char *path, uint64_t size, uint32_t crc32c, json_t **out);
int net_file_hdr_parse(json_t *msg, const char **path, uint64_t *size, uint32_t *crc32c);

/* Sparse NT_FILE: the same object plus "data" (bytes of data extents that
 * follow, <= size: else -EINVAL). net_file_hdr_data reads it from a parsed
 * NT_FILE (size from net_file_hdr_parse): *sparse false and *data = size
 * when absent; -EBADMSG when not an integer in 0..size. */
int net_file_hdr_build_sparse(const char *path, uint64_t size, uint32_t crc32c, uint64_t data,
			      json_t **out);
int net_file_hdr_data(json_t *msg, uint64_t size, bool *sparse, uint64_t *data);
/* An extent header (off, len as two u64 LE) and its validating decode:
 * done_to is where the previous extent ended (0 at first), data_left the
 * announced data bytes not yet received. 0 or -EBADMSG. */
void net_ext_encode(uint8_t out[NET_EXT_LEN], uint64_t off, uint64_t len);
int net_ext_decode(const uint8_t in[NET_EXT_LEN], uint64_t size, uint64_t done_to,
		   uint64_t data_left, uint64_t *off, uint64_t *len);
/* The CRC32C (mf_crc32c's convention) of what crc covered followed by n
 * zero bytes, in O(log n) without touching them: holes of sparse files. */
uint32_t net_crc32c_zeros(uint32_t crc, uint64_t n);

/* NT_ERROR payload {"error": text, "errno": err} (err positive or negative,
 * stored positive) and its parse, which returns the negative errno
 * (-EIO when the field is missing or out of 1..4095). */
json_t *net_error_msg(int err, const char *text);
int net_error_errno(json_t *msg);

/* Split "host:port", "[v6]:port" or ":port" (host "" = any). host gets at
 * most hostlen-1 bytes; port 1..65535, or 0 when allow_zero. 0 or -EINVAL. */
int net_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
		       bool allow_zero);

#endif
