/* fsbench.c: the timed I/O of the fs benchmark (tests/bench/run drives it).
 * One process per measurement so that the interpreter driving the benchmark
 * adds nothing to the timed loop: it writes or reads NFILES files of FILESIZE
 * bytes in BLOCK-sized write()/read() calls (open, I/O, close all timed), or
 * times one rename(). It prints one JSON object on stdout and exits 0; on any
 * failed call it names the call on stderr and exits 1 (2 for usage).
 *
 * Every block starts with a 16-byte stamp (file number, block number), so a
 * read checks that each block holds what was written at that place without
 * spending time on the rest of the bytes; the rest is a fixed random pattern.
 * Files are DIR/f00000 ... in one directory. With --threads N, thread t
 * handles files t, t+N, ... and the time runs from before the first thread
 * starts to after the last one ends. Buffers are allocated and touched
 * before the clock starts: one BLOCK buffer per thread (cache-hot), or with
 * --whole one FILESIZE buffer per thread that each file goes through (as an
 * application saving or loading an array: memory-bandwidth bound). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STAMP 16

struct job {
	const char *dir;
	uint64_t nfiles, fsize, block;
	int nthreads;
	bool write;
	bool fsync;
	bool whole;                     /* one FILESIZE buffer per file */
	const unsigned char *pattern;   /* block bytes, shared read-only */
};

struct worker {
	const struct job *j;
	int id;
	int err;                        /* errno of the failed call, or 0 */
	char what[4400];                /* the failed call */
	unsigned char *buf;             /* block (or whole-file) buffer */
	pthread_t th;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mtcfs-fsbench write DIR NFILES FILESIZE BLOCK [--threads N] [--whole] [--fsync]\n"
		"       mtcfs-fsbench read  DIR NFILES FILESIZE BLOCK [--threads N] [--whole]\n"
		"       mtcfs-fsbench rename SRC DST\n"
		"Sizes take K, M, G suffixes (powers of 1024). DIR must exist.\n"
		"--whole: each file goes from (or into) one FILESIZE buffer, in BLOCK\n"
		"calls, as an application saving or loading an array; the default\n"
		"reuses one BLOCK buffer (cache-hot: the memcpy-bound best case).\n"
		"Prints one JSON object: op, files, bytes, block, threads, ns, gib_per_s, files_per_s.\n");
}

/* "64K", "1M", "256M", "1G", "4096": bounded, checked. */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	if (*end) {
		switch (*end) {
		case 'k': case 'K': mul = 1ull << 10; break;
		case 'm': case 'M': mul = 1ull << 20; break;
		case 'g': case 'G': mul = 1ull << 30; break;
		default: return -1;
		}
		end++;
		if (*end == 'i')
			end++;
		if (*end == 'B' || *end == 'b')
			end++;
		if (*end)
			return -1;
	}
	if (v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

static void fail(struct worker *w, const char *call, const char *path)
{
	if (w->err)
		return;
	w->err = errno ? errno : EIO;
	snprintf(w->what, sizeof(w->what), "%s %s", call, path);
}

static void put_stamp(unsigned char *p, uint64_t file, uint64_t blk)
{
	memcpy(p, &file, 8);
	memcpy(p + 8, &blk, 8);
}

static bool stamp_ok(const unsigned char *p, uint64_t file, uint64_t blk)
{
	uint64_t f, b;
	memcpy(&f, p, 8);
	memcpy(&b, p + 8, 8);
	return f == file && b == blk;
}

static void write_file(struct worker *w, unsigned char *buf, uint64_t i)
{
	const struct job *j = w->j;
	char path[4096];
	uint64_t off = 0, blk = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/f%05" PRIu64, j->dir, i);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fail(w, "open", path);
		return;
	}
	while (off < j->fsize) {
		size_t n = j->fsize - off < j->block ? (size_t)(j->fsize - off) : (size_t)j->block;
		size_t done = 0;
		unsigned char *src = j->whole ? buf + off : buf;
		if (n >= STAMP)
			put_stamp(src, i, blk);
		while (done < n) {
			ssize_t r = write(fd, src + done, n - done);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				fail(w, "write", path);
				close(fd);
				return;
			}
			if (r == 0) {
				errno = EIO;
				fail(w, "write (returned 0)", path);
				close(fd);
				return;
			}
			done += (size_t)r;
		}
		off += n;
		blk++;
	}
	if (j->fsync && fsync(fd) < 0) {
		fail(w, "fsync", path);
		close(fd);
		return;
	}
	if (close(fd) < 0)
		fail(w, "close", path);
}

static void read_file(struct worker *w, unsigned char *buf, uint64_t i)
{
	const struct job *j = w->j;
	char path[4096];
	uint64_t off = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/f%05" PRIu64, j->dir, i);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fail(w, "open", path);
		return;
	}
	/* Like an application: full blocks until read() says end of file. */
	for (;;) {
		size_t got = 0;
		unsigned char *dst = j->whole ? buf + off : buf;
		size_t want = j->block;
		if (j->whole && j->fsize - off < want)
			want = (size_t)(j->fsize - off);
		while (got < want) {
			ssize_t r = read(fd, dst + got, want - got);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				fail(w, "read", path);
				close(fd);
				return;
			}
			if (r == 0)
				break;
			got += (size_t)r;
		}
		if (got >= STAMP && off % j->block == 0 &&
		    !stamp_ok(dst, i, off / j->block)) {
			errno = EILSEQ;
			fail(w, "read (wrong data: block stamp mismatch)", path);
			close(fd);
			return;
		}
		off += got;
		if (got < want)
			break;
		if (j->whole && off == j->fsize) {
			/* the end-of-file read an application makes */
			unsigned char c;
			ssize_t r = read(fd, &c, 1);
			if (r != 0) {
				errno = r < 0 ? errno : EFBIG;
				fail(w, "read (file longer than FILESIZE)", path);
				close(fd);
				return;
			}
			break;
		}
	}
	if (off != j->fsize) {
		errno = EIO;
		fail(w, "read (size differs from FILESIZE)", path);
	}
	close(fd);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	const struct job *j = w->j;

	for (uint64_t i = (uint64_t)w->id; i < j->nfiles && !w->err; i += (uint64_t)j->nthreads) {
		if (j->write)
			write_file(w, w->buf, i);
		else
			read_file(w, w->buf, i);
	}
	return NULL;
}

/* The I/O buffer of a worker, faulted in before the clock starts. */
static int worker_buf(struct worker *w)
{
	const struct job *j = w->j;
	size_t blen = j->whole ? (size_t)j->fsize : (size_t)j->block;

	if (posix_memalign((void **)&w->buf, 4096, blen ? blen : 1) != 0)
		return -1;
	for (size_t o = 0; o < blen; o += (size_t)j->block) {
		size_t n = blen - o < j->block ? blen - o : (size_t)j->block;
		memcpy(w->buf + o, j->pattern, n);
	}
	return 0;
}

static int cmd_io(bool wr, int argc, char **argv)
{
	struct job j = { 0 };
	struct worker *ws = NULL;
	unsigned char *pattern = NULL;
	uint64_t t0, t1, x = 0x9e3779b97f4a7c15ull;
	double secs;
	int rc = 1;

	if (argc < 6) {
		usage(stderr);
		return 2;
	}
	j.dir = argv[2];
	j.write = wr;
	j.nthreads = 1;
	if (parse_size(argv[3], &j.nfiles) < 0 || parse_size(argv[4], &j.fsize) < 0 ||
	    parse_size(argv[5], &j.block) < 0 || j.nfiles == 0 || j.block == 0 ||
	    j.block > (1ull << 30)) {
		fprintf(stderr, "mtcfs-fsbench: bad NFILES, FILESIZE or BLOCK\n");
		return 2;
	}
	for (int a = 6; a < argc; a++) {
		if (!strcmp(argv[a], "--threads") && a + 1 < argc) {
			char *end;
			long v = strtol(argv[++a], &end, 10);
			if (*end || v < 1 || v > 256) {
				fprintf(stderr, "mtcfs-fsbench: bad --threads\n");
				return 2;
			}
			j.nthreads = (int)v;
		} else if (!strcmp(argv[a], "--fsync") && wr) {
			j.fsync = true;
		} else if (!strcmp(argv[a], "--whole")) {
			j.whole = true;
		} else {
			fprintf(stderr, "mtcfs-fsbench: unknown argument %s\n", argv[a]);
			return 2;
		}
	}
	if ((uint64_t)j.nthreads > j.nfiles)
		j.nthreads = (int)j.nfiles;

	pattern = malloc((size_t)j.block);
	ws = calloc((size_t)j.nthreads, sizeof(*ws));
	if (!pattern || !ws) {
		fprintf(stderr, "mtcfs-fsbench: out of memory\n");
		goto out;
	}
	for (uint64_t k = 0; k < j.block; k++) {    /* xorshift64: incompressible */
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		pattern[k] = (unsigned char)(x >> 24);
	}
	j.pattern = pattern;
	for (int t = 0; t < j.nthreads; t++) {
		ws[t].j = &j;
		ws[t].id = t;
		if (worker_buf(&ws[t]) < 0) {
			fprintf(stderr, "mtcfs-fsbench: out of memory for buffers\n");
			goto out;
		}
	}

	t0 = now_ns();
	if (j.nthreads == 1) {
		worker_main(&ws[0]);
	} else {
		for (int t = 0; t < j.nthreads; t++) {
			if (pthread_create(&ws[t].th, NULL, worker_main, &ws[t]) != 0) {
				fprintf(stderr, "mtcfs-fsbench: pthread_create failed\n");
				for (int u = 0; u < t; u++)
					pthread_join(ws[u].th, NULL);
				goto out;
			}
		}
		for (int t = 0; t < j.nthreads; t++)
			pthread_join(ws[t].th, NULL);
	}
	t1 = now_ns();

	for (int t = 0; t < j.nthreads; t++) {
		if (ws[t].err) {
			fprintf(stderr, "mtcfs-fsbench: %s: %s\n", ws[t].what, strerror(ws[t].err));
			goto out;
		}
	}
	secs = (double)(t1 - t0) / 1e9;
	printf("{\"op\": \"%s\", \"files\": %" PRIu64 ", \"bytes\": %" PRIu64
	       ", \"block\": %" PRIu64 ", \"threads\": %d, \"ns\": %" PRIu64
	       ", \"gib_per_s\": %.4f, \"files_per_s\": %.1f}\n",
	       wr ? "write" : "read", j.nfiles, j.nfiles * j.fsize, j.block, j.nthreads,
	       t1 - t0, (double)(j.nfiles * j.fsize) / (double)(1ull << 30) / secs,
	       (double)j.nfiles / secs);
	rc = 0;
out:
	for (int t = 0; ws && t < j.nthreads; t++)
		free(ws[t].buf);
	free(ws);
	free(pattern);
	return rc;
}

static int cmd_rename(int argc, char **argv)
{
	uint64_t t0, t1;
	int r, e;

	if (argc != 4) {
		usage(stderr);
		return 2;
	}
	t0 = now_ns();
	r = rename(argv[2], argv[3]);
	e = errno;
	t1 = now_ns();
	if (r < 0) {
		fprintf(stderr, "mtcfs-fsbench: rename %s %s: %s\n", argv[2], argv[3], strerror(e));
		return 1;
	}
	printf("{\"op\": \"rename\", \"ns\": %" PRIu64 "}\n", t1 - t0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "write"))
		return cmd_io(true, argc, argv);
	if (!strcmp(argv[1], "read"))
		return cmd_io(false, argc, argv);
	if (!strcmp(argv[1], "rename"))
		return cmd_rename(argc, argv);
	fprintf(stderr, "mtcfs-fsbench: unknown mode %s\n", argv[1]);
	usage(stderr);
	return 2;
}
