/* mtcfs-fuzz-seeds: writes the binary seed corpora of the fuzz targets from
 * the real encoders, so the seeds follow the formats when they change:
 *   corpus/fuzz_peer_frame/  streams of frames built with net_frame_build*
 *                            (handshake, engine push/fetch/list, coordinator
 *                            messages, NT_FILE + raw bytes, NT_ERROR)
 *   corpus/fuzz_manifest/    mf_encode of mf_build over small real trees
 * Usage: mtcfs-fuzz-seeds DIR  (DIR = tests/fuzz/corpus). The YAML and GCS
 * seeds are hand-written text files in the same tree. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "common/util.h"
#include "net/frame.h"
#include "tiers/manifest.h"

static const char *outdir;

static void fail(const char *what)
{
	fprintf(stderr, "mtcfs-fuzz-seeds: %s: %s\n", what, strerror(errno));
	exit(1);
}

struct stream {
	uint8_t *p;
	size_t n;
};

static void add(struct stream *s, const void *p, size_t n)
{
	uint8_t *np = realloc(s->p, s->n + n);

	if (!np)
		fail("realloc");
	memcpy(np + s->n, p, n);
	s->p = np;
	s->n += n;
}

static void add_json(struct stream *s, uint8_t type, uint32_t id, json_t *msg)
{
	uint8_t *f;
	size_t n;

	if (net_frame_build(type, id, msg, &f, &n) != 0)
		fail("net_frame_build");
	add(s, f, n);
	free(f);
	json_decref(msg);
}

static void add_raw(struct stream *s, uint8_t type, uint32_t id, const void *p, uint32_t len)
{
	uint8_t *f;
	size_t n;

	if (net_frame_build_raw(type, id, p, len, &f, &n) != 0)
		fail("net_frame_build_raw");
	add(s, f, n);
	free(f);
}

static void add_file(struct stream *s, const char *path, const char *data)
{
	size_t n = strlen(data);
	json_t *h;

	if (net_file_hdr_build(path, n, mf_crc32c(0, data, n), &h) != 0)
		fail("net_file_hdr_build");
	add_json(s, NT_FILE, 0, h);
	add(s, data, n);
}

static void write_seed(const char *target, const char *name, const void *p, size_t n)
{
	char path[4096];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", outdir, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, p, n) != (ssize_t)n || close(fd) < 0)
		fail(path);
}

static void emit(const char *name, struct stream *s)
{
	write_seed("fuzz_peer_frame", name, s->p, s->n);
	free(s->p);
	memset(s, 0, sizeof(*s));
}

static char *hex_of(const uint8_t *p, size_t n)
{
	static char buf[2][129];
	static int k;
	char *h = buf[k++ & 1];

	net_hex_encode(p, n, h);
	return h;
}

/* ---- manifests ---- */

static void put_file(int dfd, const char *name, const char *content, mode_t mode)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	if (fd < 0 || write(fd, content, strlen(content)) != (ssize_t)strlen(content) ||
	    close(fd) < 0)
		fail(name);
}

/* A small checkpoint-like tree; returns its encoded manifest. */
static uint8_t *tree_manifest(int variant, size_t *len)
{
	char dir[] = "/tmp/mtcfs-fuzz-seeds-XXXXXX";
	struct manifest *m;
	uint8_t *enc = NULL;
	int dfd;

	if (!mkdtemp(dir))
		fail("mkdtemp");
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		fail(dir);
	if (variant >= 1) {
		put_file(dfd, "_CHECKPOINT_METADATA", "{\"step\": 100}\n", 0644);
		if (mkdirat(dfd, "state", 0755) < 0 || mkdirat(dfd, "state/d", 0750) < 0)
			fail("mkdirat");
		put_file(dfd, "state/d/0.0", "tensor bytes 0.0", 0600);
		put_file(dfd, "state/d/1.0", "tensor bytes 1.0, a little longer", 0644);
		put_file(dfd, "state/manifest.ocdbt", "", 0644);
		if (symlinkat("d/0.0", dfd, "state/latest") < 0)
			fail("symlinkat");
	}
	if (variant >= 2) {
		if (mkdirat(dfd, "empty", 0700) < 0)
			fail("mkdirat");
		put_file(dfd, "a b (c) \xc3\xa9.bin", "utf-8 name", 0755);
	}
	if (mf_build(dfd, &m) != 0 || mf_encode(m, &enc, len) != 0)
		fail("mf_build/mf_encode");
	mf_free(m);
	close(dfd);
	{
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fail("rm -rf");
	}
	return enc;
}

static char *b64(const uint8_t *p, size_t n)
{
	char *o = malloc(4 * ((n + 2) / 3) + 1);

	if (!o)
		fail("malloc");
	EVP_EncodeBlock((unsigned char *)o, p, (int)n);
	return o;
}

int main(int argc, char **argv)
{
	struct stream s = { 0 };
	uint8_t nonce[32], mac[32], *mf;
	size_t mflen;
	char *m64;

	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];
	for (int i = 0; i < 32; i++) {
		nonce[i] = (uint8_t)(i * 7 + 1);
		mac[i] = (uint8_t)(255 - i * 3);
	}

	/* manifests */
	for (int v = 0; v < 3; v++) {
		char name[32];
		mf = tree_manifest(v, &mflen);
		snprintf(name, sizeof(name), "tree%d.mf", v);
		write_seed("fuzz_manifest", name, mf, mflen);
		free(mf);
	}
	mf = tree_manifest(1, &mflen);
	m64 = b64(mf, mflen);

	/* server -> client: CHALLENGE, WELCOME */
	add_raw(&s, NT_CHALLENGE, 0, nonce, sizeof(nonce));
	add_json(&s, NT_WELCOME, 0, json_pack("{s:i, s:s}", "rank", 0, "mac", hex_of(mac, 32)));
	emit("server_handshake", &s);

	/* client -> server: HELLO, then a push with its files */
	add_json(&s, NT_HELLO, 0, json_pack("{s:i, s:s, s:s, s:s}", "rank", 1, "purpose", "data",
					    "nonce", hex_of(nonce, 32), "mac", hex_of(mac, 32)));
	add_json(&s, NT_REQ, 1, json_pack("{s:s, s:{s:s, s:I, s:i, s:i}, s:s}", "op", "push",
					  "key", "job", "llama", "step", (json_int_t)100,
					  "owner", 1, "worker", 0, "manifest", m64));
	add_file(&s, "_CHECKPOINT_METADATA", "{\"step\": 100}\n");
	add_file(&s, "state/d/0.0", "tensor bytes 0.0");
	emit("push_stream", &s);

	/* a fetch and its answer */
	add_json(&s, NT_REQ, 2, json_pack("{s:s, s:s, s:I, s:i, s:i}", "op", "fetch", "job",
					  "llama", "step", (json_int_t)100, "owner", 1,
					  "worker", 0));
	add_json(&s, NT_RESP, 2, json_pack("{s:s}", "manifest", m64));
	add_file(&s, "state/d/1.0", "tensor bytes 1.0, a little longer");
	emit("fetch_stream", &s);

	/* answers */
	add_json(&s, NT_RESP, 1, json_pack("{s:b}", "send", 1));
	add_json(&s, NT_RESP, 1, json_pack("{s:b}", "ok", 1));
	add_json(&s, NT_RESP, 3, json_pack("{s:i, s:[{s:s, s:I, s:i, s:s, s:b, s:I}]}", "rank", 2,
					   "shards", "job", "llama", "step", (json_int_t)100,
					   "owner", 2, "state", "committed", "own", 1,
					   "bytes", (json_int_t)4096));
	add_json(&s, NT_ERROR, 4, net_error_msg(EINVAL, "bad push request"));
	emit("responses", &s);

	/* the coordinator's control connection */
	add_json(&s, NT_REQ, 1, json_pack("{s:s, s:s, s:s, s:i, s:i}", "op", "register", "addr",
					  "10.0.0.2:7000", "job", "llama", "nodes", 4, "dp", 1));
	add_json(&s, NT_EVENT, 0, json_pack("{s:s, s:s, s:i, s:i, s:I, s:s}", "op", "committed",
					    "job", "llama", "nodes", 4, "dp", 1,
					    "step", (json_int_t)100, "hash", hex_of(nonce, 32)));
	add_json(&s, NT_REQ, 2, json_pack("{s:s, s:s, s:i, s:i, s:[[i, I, s]]}", "op", "catalog",
					  "job", "llama", "nodes", 4, "dp", 1, "holds", 1,
					  (json_int_t)100, hex_of(mac, 32)));
	add_json(&s, NT_RESP, 2, json_pack("{s:s, s:i, s:b, s:I, s:i, s:i, s:s, s:s}", "op",
					   "plan", "plan", 7, "found", 1, "step", (json_int_t)100,
					   "holder", 2, "owner", 1, "hash", hex_of(nonce, 32),
					   "addr", "[::1]:7002"));
	add_json(&s, NT_EVENT, 0, json_pack("{s:s, s:s, s:I}", "op", "lkg", "job", "llama",
					    "step", (json_int_t)100));
	add_json(&s, NT_REQ, 3, NULL);
	emit("control_stream", &s);

	free(m64);
	free(mf);
	return 0;
}
