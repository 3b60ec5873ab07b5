/* mem_bucket.h: an in-memory bucket backend for unit tests ("mem://NAME"),
 * installed as tiers/bucket.h's bkt_test_backend by mem_bucket_install().
 * Objects are write-once like the real backends'; a listing is in bytewise
 * name order with "/" roll-up; downloads keep holes and write plainly to
 * what is not a regular file. mem_bucket_corrupt() flips a stored byte (the
 * object keeps its size; a get checks the CRC32C stored at put, as gs://
 * checks the server's, and refuses it: -EBADMSG). tests/unit/
 * test_bucket_conformance.c holds it to the same contract as file:// and
 * gs://; mem_bucket_clear() empties it between cases. One store for the whole test program, guarded by a mutex: the bucket
 * code runs transfers in parallel. Header-only. */
#ifndef MTCFS_TESTS_UNIT_MEM_BUCKET_H
#define MTCFS_TESTS_UNIT_MEM_BUCKET_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/bucket.h"
#include "tiers/manifest.h"

struct mem_obj {
	char *name;
	uint8_t *data;
	size_t len;
	uint32_t crc;               /* of the bytes as put */
};

static struct {
	pthread_mutex_t mu;
	struct mem_obj *v;
	size_t n;
	unsigned puts;              /* objects written so far */
} mem_store = { .mu = PTHREAD_MUTEX_INITIALIZER };

static struct mem_obj *mem_find_locked(const char *name)
{
	for (size_t i = 0; i < mem_store.n; i++)
		if (!strcmp(mem_store.v[i].name, name))
			return &mem_store.v[i];
	return NULL;
}

static int mem_open(struct bkt *b, const char *location, void **priv)
{
	*priv = (void *)1;          /* no state of its own: the store is global */
	return 0;
}

static void mem_close(void *priv)
{
}

static int mem_put(struct bkt *b, const char *name, const struct bkt_src *src)
{
	uint8_t *data = malloc(src->size ? src->size : 1);
	struct mem_obj *o;
	int rc = 0;

	if (!data)
		return -ENOMEM;
	if (src->fd >= 0) {
		for (uint64_t off = 0; off < src->size;) {
			ssize_t r = pread(src->fd, data + off, src->size - off, (off_t)off);
			if (r <= 0) {
				free(data);
				return r < 0 ? -errno : -EIO;
			}
			off += (uint64_t)r;
		}
	} else if (src->size) {
		memcpy(data, src->buf, src->size);
	}
	if (mf_crc32c(0, data, src->size) != src->crc32c) {
		free(data);
		return -EBADMSG;
	}
	pthread_mutex_lock(&mem_store.mu);
	if (mem_find_locked(name)) {
		rc = -EEXIST;
	} else {
		o = realloc(mem_store.v, (mem_store.n + 1) * sizeof(*o));
		if (!o) {
			rc = -ENOMEM;
		} else {
			mem_store.v = o;
			o = &mem_store.v[mem_store.n++];
			o->name = strdup(name);
			o->data = data;
			o->len = src->size;
			o->crc = src->crc32c;
			data = NULL;
			mem_store.puts++;
		}
	}
	pthread_mutex_unlock(&mem_store.mu);
	free(data);
	return rc;
}

/* Like the real backends: a regular file is truncated, written with holes
 * for zeros and cut to the object's size; anything else gets plain writes.
 * What is delivered is checked against the CRC32C stored at put (as gs://
 * checks the server's): a damaged object is -EBADMSG. */
static int mem_deliver(int fd, const uint8_t *p, size_t len)
{
	struct stat st;
	int rc;

	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		if (ftruncate(fd, 0) < 0)
			return -errno;
		rc = bkt_pwrite_sparse(fd, p, len, 0);
		if (rc == 0 && ftruncate(fd, (off_t)len) < 0)
			rc = -errno;
		return rc;
	}
	for (size_t off = 0; off < len;) {
		ssize_t w = write(fd, p + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		off += (size_t)w;
	}
	return 0;
}

static int mem_check_locked(const char *name, const struct mem_obj *o, uint32_t *crc32c)
{
	uint32_t crc = mf_crc32c(0, o->data, o->len);

	if (crc32c)
		*crc32c = crc;
	if (crc == o->crc)
		return 0;
	bkt_set_error("mem://%s: the %zu bytes stored have crc32c %08x, put with %08x", name,
		      o->len, crc, o->crc);
	return -EBADMSG;
}

static int mem_get_file(struct bkt *b, const char *name, int fd, unsigned ranges, uint64_t *size,
			uint32_t *crc32c)
{
	struct mem_obj *o;
	int rc;

	pthread_mutex_lock(&mem_store.mu);
	o = mem_find_locked(name);
	if (!o) {
		rc = -ENOENT;
	} else if ((rc = mem_check_locked(name, o, crc32c)) == 0 &&
		   (rc = mem_deliver(fd, o->data, o->len)) == 0) {
		*size = o->len;
	}
	pthread_mutex_unlock(&mem_store.mu);
	return rc;
}

static int mem_get_buf(struct bkt *b, const char *name, size_t max, void **buf, size_t *len)
{
	struct mem_obj *o;
	int rc = 0;

	pthread_mutex_lock(&mem_store.mu);
	o = mem_find_locked(name);
	if (!o) {
		rc = -ENOENT;
	} else if ((rc = mem_check_locked(name, o, NULL)) < 0) {
		/* damaged: refused */
	} else if (o->len > max) {
		rc = -EFBIG;
	} else if (!(*buf = malloc(o->len + 1))) {
		rc = -ENOMEM;
	} else {
		memcpy(*buf, o->data, o->len);
		((char *)*buf)[o->len] = '\0';
		*len = o->len;
	}
	pthread_mutex_unlock(&mem_store.mu);
	return rc;
}

static int mem_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crc32c)
{
	struct mem_obj *o;
	int rc = 0;

	pthread_mutex_lock(&mem_store.mu);
	o = mem_find_locked(name);
	if (!o) {
		rc = -ENOENT;
	} else {
		if (size)
			*size = o->len;
		if (crc32c)
			*crc32c = o->crc;
	}
	pthread_mutex_unlock(&mem_store.mu);
	return rc;
}

static int mem_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names are copied out first: cb may call back into the bucket. */
static int mem_list(struct bkt *b, const char *prefix, const char *delim,
		    int (*cb)(void *arg, const struct bkt_entry *e), void *arg)
{
	size_t pl = strlen(prefix), n = 0;
	char **names;
	char last[1100] = "";
	int rc = 0;

	pthread_mutex_lock(&mem_store.mu);
	names = calloc(mem_store.n + 1, sizeof(*names));
	for (size_t i = 0; names && i < mem_store.n; i++)
		if (!strncmp(mem_store.v[i].name, prefix, pl))
			names[n++] = strdup(mem_store.v[i].name);
	pthread_mutex_unlock(&mem_store.mu);
	if (!names)
		return -ENOMEM;
	qsort(names, n, sizeof(*names), mem_name_cmp);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct bkt_entry e = { .name = names[i] };
		char *slash = delim ? strchr(names[i] + pl, '/') : NULL;
		uint64_t size = 0;

		if (slash) {
			slash[1] = '\0';            /* the rolled-up "directory" */
			if (!strcmp(last, names[i]))
				continue;
			snprintf(last, sizeof(last), "%s", names[i]);
			e.is_prefix = true;
		} else if (mem_stat(b, names[i], &size, &e.crc32c) == 0) {
			e.size = size;
			e.has_crc = true;
		}
		rc = cb(arg, &e);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return rc;
}

static int mem_del(struct bkt *b, const char *name)
{
	struct mem_obj *o;
	int rc = 0;

	pthread_mutex_lock(&mem_store.mu);
	o = mem_find_locked(name);
	if (!o) {
		rc = -ENOENT;
	} else {
		free(o->name);
		free(o->data);
		*o = mem_store.v[--mem_store.n];
	}
	pthread_mutex_unlock(&mem_store.mu);
	return rc;
}

static const struct bkt_ops mem_bucket_ops = {
	.scheme = "mem",
	.open = mem_open,
	.close = mem_close,
	.put = mem_put,
	.get_file = mem_get_file,
	.get_buf = mem_get_buf,
	.stat = mem_stat,
	.list = mem_list,
	.del = mem_del,
};

static inline void mem_bucket_install(void)
{
	bkt_test_backend = &mem_bucket_ops;
}

/* Forget every object (a fresh bucket for the next test). */
static inline void mem_bucket_clear(void)
{
	pthread_mutex_lock(&mem_store.mu);
	for (size_t i = 0; i < mem_store.n; i++) {
		free(mem_store.v[i].name);
		free(mem_store.v[i].data);
	}
	free(mem_store.v);
	mem_store.v = NULL;
	mem_store.n = 0;
	pthread_mutex_unlock(&mem_store.mu);
}

/* Flip byte off of every object whose name ends with suffix (and is at
 * least off + 1 long). Returns how many were changed. */
static inline int mem_bucket_corrupt(const char *suffix, size_t off)
{
	size_t sl = strlen(suffix);
	int n = 0;

	pthread_mutex_lock(&mem_store.mu);
	for (size_t i = 0; i < mem_store.n; i++) {
		struct mem_obj *o = &mem_store.v[i];
		size_t l = strlen(o->name);
		if (l >= sl && !strcmp(o->name + l - sl, suffix) && o->len > off) {
			o->data[off] ^= 0x55;
			n++;
		}
	}
	pthread_mutex_unlock(&mem_store.mu);
	return n;
}

#endif
