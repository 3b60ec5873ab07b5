/* fuzz_manifest: mf_decode() on untrusted bytes, as a manifest arrives from
 * a peer (push requests, fetch answers) or from the bucket.
 *
 * The encoding ends in a SHA-256 over everything after the 40-byte prefix
 * (magic, version, hash), so almost every mutation dies at the hash check.
 * Each input is therefore decoded twice: as it is, and with bytes 8..40
 * replaced by the right hash, which takes mutations of the entries all the
 * way through the parser. On success the contract of tiers/manifest.h is
 * checked: the encoding is canonical (mf_encode gives back exactly the
 * input), decoding that again gives the same manifest, entries are sorted,
 * unique, with safe paths and consistent totals. Aborts on any breach. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/util.h"
#include "tiers/manifest.h"

#define PREFIX_LEN 40u    /* u32 magic, u32 version, u8[32] hash */

static void die(const char *what, size_t size)
{
	fprintf(stderr, "fuzz_manifest: %s (input %zu bytes)\n", what, size);
	abort();
}

static int str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return !strcmp(a, b);
}

static void check_manifest(const struct manifest *m, size_t size)
{
	uint64_t total = 0;
	uint32_t nfiles = 0;

	if (m->n > MF_MAX_ENTRIES || (m->n && !m->e))
		die("entry count out of bounds", size);
	for (size_t i = 0; i < m->n; i++) {
		const struct mf_entry *e = &m->e[i];
		if (!e->path || !util_safe_relpath(e->path, strlen(e->path)))
			die("unsafe or missing path", size);
		if (i > 0 && strcmp(m->e[i - 1].path, e->path) >= 0)
			die("entries unsorted or duplicated", size);
		if (e->type < MF_FILE || e->type > MF_FIFO || (e->mode & ~07777u))
			die("bad type or mode", size);
		if ((e->target != NULL) != (e->type == MF_SYMLINK))
			die("symlink target without a symlink (or the reverse)", size);
		if (e->type == MF_FILE) {
			if (e->size > MF_MAX_FILE_SIZE)
				die("file size over MF_MAX_FILE_SIZE", size);
			total += e->size;
			nfiles++;
		} else if (e->size || e->crc32c) {
			die("size/crc on a non-file", size);
		}
	}
	if (m->total != total || m->nfiles != nfiles)
		die("totals do not match the entries", size);
}

static void check_same(const struct manifest *a, const struct manifest *b, size_t size)
{
	if (a->n != b->n || a->total != b->total || a->nfiles != b->nfiles ||
	    memcmp(a->hash, b->hash, 32))
		die("re-decoded manifest differs (header)", size);
	for (size_t i = 0; i < a->n; i++) {
		const struct mf_entry *x = &a->e[i], *y = &b->e[i];
		if (!str_eq(x->path, y->path) || !str_eq(x->target, y->target) ||
		    x->type != y->type || x->mode != y->mode || x->size != y->size ||
		    x->crc32c != y->crc32c)
			die("re-decoded manifest differs (entry)", size);
	}
}

static void one(const uint8_t *buf, size_t size)
{
	struct manifest *m = NULL, *m2 = NULL;
	uint8_t *enc = NULL;
	size_t elen = 0;
	char hex[65];
	uint8_t h2[32];
	int rc;

	rc = mf_decode(buf, size, &m);
	if (rc == -EBADMSG || rc == -ENOMEM)
		return;
	if (rc != 0 || !m)
		die("mf_decode: unexpected result", size);
	check_manifest(m, size);
	if (mf_encode(m, &enc, &elen) != 0)
		die("mf_encode failed on a decoded manifest", size);
	if (elen != size || memcmp(enc, buf, size))
		die("encoding is not canonical: mf_encode(mf_decode(x)) != x", size);
	if (mf_decode(enc, elen, &m2) != 0)
		die("mf_decode rejects mf_encode's output", size);
	check_same(m, m2, size);
	mf_hash_hex(m->hash, hex);
	if (strlen(hex) != 64 || mf_hash_parse(hex, h2) != 0 || memcmp(h2, m->hash, 32))
		die("mf_hash_hex/mf_hash_parse do not round-trip", size);
	free(enc);
	mf_free(m2);
	mf_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *fixed;
	unsigned int hl = 0;

	one(data, size);
	if (size < PREFIX_LEN)
		return 0;
	/* the same bytes with a correct hash of what follows the prefix */
	fixed = malloc(size);
	if (!fixed)
		return 0;
	memcpy(fixed, data, size);
	if (EVP_Digest(fixed + PREFIX_LEN, size - PREFIX_LEN, fixed + 8, &hl, EVP_sha256(),
		       NULL) && hl == 32 && memcmp(fixed + 8, data + 8, 32))
		one(fixed, size);
	free(fixed);
	return 0;
}
