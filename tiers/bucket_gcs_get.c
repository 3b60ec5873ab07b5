/* bucket_gcs: downloads: one object into a file (parallel ranged GETs
 * pinned to one generation, CRC32C checked) or a buffer (see the top of
 * bucket_gcs.c and bucket_gcs_i.h). Threads: any. */
#include "tiers/bucket.h"
#include "tiers/bucket_gcs_i.h"
#include "common/log.h"
#include "tiers/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- downloads ---- */

struct part {
	uint64_t start, end;        /* inclusive */
	uint32_t crc;
	int rc;
};

struct dl {
	struct gcs *g;
	const char *url, *what;
	int fd;
	bool seek;
	int64_t gen;
	struct part *parts;
	size_t nparts;
	atomic_size_t next;
	atomic_bool stop;
	pthread_mutex_t mu;         /* protects first, first_err */
	size_t first;
	char first_err[512];
};

static int fetch_part(struct dl *d, struct part *p)
{
	struct req r;
	int rc;

	gcs_req_init(&r, d->g, "GET", d->url, d->what, "storage.objects.get");
	r.media = true;
	r.sink_fd = d->fd;
	r.sink_seek = d->seek;
	r.rstart = (int64_t)p->start;
	r.rend = (int64_t)p->end;
	r.pin_gen = d->gen;
	rc = gcs_run(&r);
	if (rc == 0 && r.status != 206 && r.status != 200)
		rc = gcs_http_fail(&r);
	if (rc == 0 && r.got != p->end - p->start + 1) {
		bkt_set_error("%s: range %" PRIu64 "-%" PRIu64 " came with %" PRIu64 " bytes",
			      d->what, p->start, p->end, r.got);
		rc = -EPROTO;
	}
	p->crc = r.crc;
	gcs_req_free(&r);
	return rc;
}

static void *dl_worker(void *arg)
{
	struct dl *d = arg;
	size_t i;

	while ((i = atomic_fetch_add(&d->next, 1)) < d->nparts) {
		struct part *p = &d->parts[i];
		if (atomic_load(&d->stop)) {
			p->rc = -ECANCELED;
			continue;
		}
		p->rc = fetch_part(d, p);
		if (p->rc < 0) {
			atomic_store(&d->stop, true);
			pthread_mutex_lock(&d->mu);
			if (i < d->first) {
				d->first = i;
				snprintf(d->first_err, sizeof(d->first_err), "%s", bkt_last_error());
			}
			pthread_mutex_unlock(&d->mu);
		}
	}
	return NULL;
}

/* Fetch [start, total) in parts, up to ranges at once; *crc extended. */
static int fetch_rest(struct dl *d, uint64_t start, uint64_t total, uint64_t part,
		      unsigned ranges, uint32_t *crc)
{
	size_t n = (size_t)((total - start + part - 1) / part), nt;
	pthread_t *th = NULL;
	size_t started = 0;
	int rc = 0;

	d->parts = calloc(n, sizeof(*d->parts));
	if (!d->parts)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		d->parts[i].start = start + i * part;
		d->parts[i].end = (i + 1 == n ? total : start + (i + 1) * part) - 1;
	}
	d->nparts = n;
	d->first = n;
	atomic_init(&d->next, 0);
	atomic_init(&d->stop, false);
	pthread_mutex_init(&d->mu, NULL);
	nt = d->seek ? (ranges < n ? ranges : n) : 1;   /* a pipe takes bytes in order */
	if (nt > 1)
		th = calloc(nt - 1, sizeof(*th));
	for (size_t i = 0; th && i < nt - 1; i++) {
		if (pthread_create(&th[i], NULL, dl_worker, d) != 0)
			break;
		started++;
	}
	dl_worker(d);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	free(th);
	pthread_mutex_destroy(&d->mu);
	if (d->first < n) {
		rc = d->parts[d->first].rc;
		bkt_set_error("%s", d->first_err);
	} else {
		for (size_t i = 0; i < n; i++)
			*crc = bkt_crc32c_combine(*crc, d->parts[i].crc,
						  d->parts[i].end - d->parts[i].start + 1);
	}
	free(d->parts);
	d->parts = NULL;
	return rc;
}

static int check_crc(struct gcs *g, const char *full, const char *what, bool has_hash,
		     uint32_t server, int64_t gen, uint64_t total, uint32_t crc)
{
	if (!has_hash) {
		/* no x-goog-hash on this answer: ask the object resource */
		uint64_t sz;
		bool has = false;
		int rc = gcs_stat_full(g, full, what, &sz, &has, &server, gen);
		if (rc < 0)
			return rc;
		if (!has) {
			bkt_set_error("%s: the server gives no crc32c for the object", what);
			return -EPROTO;
		}
	}
	if (server != crc) {
		bkt_set_error("%s: the %" PRIu64 " bytes received have crc32c %08x, the server's is "
			      "%08x", what, total, crc, server);
		log_warn(MOD, "%s", bkt_last_error());
		return -EBADMSG;
	}
	return 0;
}

static int gcs_get_file_once(struct bkt *b, const char *name, int fd, unsigned ranges,
			     uint64_t *size, uint32_t *crcp);

/* A CRC32C mismatch may be one damaged transfer of an intact object: a
 * regular file as the sink is truncated and the object fetched once more
 * before the mismatch counts. */
int gcs_get_file(struct bkt *b, const char *name, int fd, unsigned ranges,
		 uint64_t *size, uint32_t *crcp)
{
	struct stat st;
	int rc;

	/* zeros are skipped, not written (holes stay holes): what was there must go */
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0) {
		rc = -errno;
		bkt_set_error("%s: truncating the local file: %s", name, strerror(-rc));
		return rc;
	}
	rc = gcs_get_file_once(b, name, fd, ranges, size, crcp);

	if (rc == -EBADMSG && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) == 0) {
		log_warn(MOD, "%s: %s; fetching it once more", name, bkt_last_error());
		rc = gcs_get_file_once(b, name, fd, ranges, size, crcp);
	}
	return rc;
}

static int gcs_get_file_once(struct bkt *b, const char *name, int fd, unsigned ranges,
			     uint64_t *size, uint32_t *crcp)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, name), *what = full ? gcs_what_of(g, full) : NULL;
	char *url = full ? gcs_obj_url(g, full, "alt=media") : NULL;
	struct stat st;
	struct req r;
	uint64_t total;
	uint32_t crc;
	int rc;

	if (!full || !what || !url) {
		free(full);
		free(what);
		free(url);
		return -ENOMEM;
	}
	gcs_req_init(&r, g, "GET", url, what, "storage.objects.get");
	r.media = true;
	r.sink_fd = fd;
	r.sink_seek = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
	r.rstart = 0;
	r.rend = (int64_t)g->part - 1;
	rc = gcs_run(&r);
	if (rc == 0 && r.status == 416) {
		/* an empty object has no byte 0 */
		r.rstart = r.rend = -1;
		rc = gcs_run(&r);
	}
	if (rc == 0 && r.status != 200 && r.status != 206)
		rc = gcs_http_fail(&r);
	if (rc < 0)
		goto out;
	total = r.status == 206 && r.cr_total >= 0 ? (uint64_t)r.cr_total : r.got;
	if (total > MF_MAX_FILE_SIZE) {
		/* a Content-Range total sizes the part array: never trust it past
		 * the largest file a manifest may hold */
		bkt_set_error("%s: the server announced %llu bytes, more than any shard file may hold",
			      what, (unsigned long long)total);
		rc = -EPROTO;
		goto out;
	}
	crc = r.crc;
	if (r.got < total) {
		struct dl d = { .g = g, .url = url, .what = what, .fd = fd, .seek = r.sink_seek,
				.gen = r.generation };
		rc = fetch_rest(&d, r.got, total, g->part, ranges, &crc);
		if (rc < 0)
			goto out;
	}
	rc = check_crc(g, full, what, r.has_hash, r.hash_crc, r.generation, total, crc);
	if (rc < 0)
		goto out;
	if (r.sink_seek && ftruncate(fd, (off_t)total) < 0) {
		rc = -errno;
		bkt_set_error("%s: truncating the local file: %s", what, strerror(-rc));
		goto out;
	}
	*size = total;
	*crcp = crc;
out:
	gcs_req_free(&r);
	free(url);
	free(what);
	free(full);
	return rc;
}

int gcs_get_buf(struct bkt *b, const char *name, size_t max, void **bufp, size_t *lenp)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, name), *what = full ? gcs_what_of(g, full) : NULL;
	char *url = full ? gcs_obj_url(g, full, "alt=media") : NULL;
	struct req r;
	int rc = -ENOMEM;

	if (!full || !what || !url)
		goto out0;
	gcs_req_init(&r, g, "GET", url, what, "storage.objects.get");
	r.media = true;
	r.mmax = max;
	rc = gcs_run(&r);
	if (rc == 0 && r.status != 200 && r.status != 206)
		rc = gcs_http_fail(&r);
	if (rc == 0)
		rc = check_crc(g, full, what, r.has_hash, r.hash_crc, r.generation, r.got, r.crc);
	if (rc == 0) {
		if (!r.mbuf && !(r.mbuf = malloc(1)))
			rc = -ENOMEM;
		else {
			r.mbuf[r.got] = '\0';
			*bufp = r.mbuf;
			*lenp = (size_t)r.got;
			r.mbuf = NULL;
		}
	}
	gcs_req_free(&r);
out0:
	free(url);
	free(what);
	free(full);
	return rc;
}
