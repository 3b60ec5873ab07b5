/* mtcfs-ecbench: erasure-coding throughput per core and the RAM figure
 * for issue 17, printed as Markdown rows.
 *
 *   mtcfs-ecbench [--dir DIR] [--size MiB] [--reps N] [--configs 4+1,4+2,...]
 *
 * One thread throughout (per core). For each rs:K+M:
 *   kernel   ISA-L ec_encode_data over K members of 1 MiB in memory (what
 *            ec_encode does per segment): encode = K x 1 MiB of data in per
 *            second; decode = the same with M data members lost, rebuilding
 *            one member from K survivors (ec_decode rebuilds one at a time),
 *            counted as K x 1 MiB of survivors read per second.
 *   files    a real group of K + M shards of --size MiB (one random file
 *            each) on DIR (tmpfs by default): data fragments (ec_frag_data),
 *            parity (ec_encode, GiB of data in per second; and ec_enc_*,
 *            the same folded in member by member as from the network),
 *            and the restore
 *            of node 0's whole shard from the survivors' fragments after
 *            node 0 and M - 1 others are lost (K ec_decode calls into the
 *            shard's files, then ec_shard_finish's CRC check): its time and
 *            GiB of shard per second.
 *   network  node 0's share of protecting the step, over loopback TCP: the
 *            K data fragments of each of its M parity codewords streamed by
 *            a sender thread (ec_frag_data into the socket) and folded in
 *            as they arrive (ec_enc_add on the socket), M x S in all;
 *            against replication (S sent with sendfile, received into a
 *            tmpfs file) and raw TCP (S received and discarded). A second
 *            table.
 *   RAM      bytes node 0 holds on DIR for the step (own shard + its parity
 *            files) / S, against replication with one peer (2 S) and the
 *            goal (1 + M/K).
 * Median of --reps (default 5) runs, min..max beside it. Not a test: the
 * machine's other load moves these numbers. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

#include "common/util.h"
#include "tiers/ec.h"
#include "tiers/ecplan.h"
#include "tiers/manifest.h"

#define MAXR 32
#define KERNEL_LEN (1u << 20)

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

struct stat3 {
	double med, min, max;
};

static struct stat3 summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_dbl);
	return (struct stat3){ v[n / 2], v[0], v[n - 1] };
}

static double now_s(void)
{
	return (double)util_now_ns() / 1e9;
}

static void die(const char *what, int rc, const char *err)
{
	fprintf(stderr, "ecbench: %s: %s%s%s\n", what, strerror(rc < 0 ? -rc : rc),
		err && *err ? ": " : "", err ? err : "");
	exit(2);
}

/* ---- in-memory kernel ---- */

static void kernel(unsigned k, unsigned m, int reps, struct stat3 *enc, struct stat3 *dec)
{
	uint8_t *a = malloc((size_t)(k + m) * k), *tbl = malloc((size_t)32 * k * m);
	uint8_t *dtbl = malloc((size_t)32 * k), *buf, *ptr[MAXR], *out;
	uint8_t b[MAXR * MAXR], inv[MAXR * MAXR], row[MAXR];
	unsigned rows[MAXR];
	double ev[64], dv[64];

	buf = aligned_alloc(64, (size_t)(k + m + 1) * KERNEL_LEN);
	if (!a || !tbl || !dtbl || !buf)
		die("malloc", ENOMEM, NULL);
	for (size_t i = 0; i < (size_t)(k + m + 1) * KERNEL_LEN; i++)
		buf[i] = (uint8_t)(i * 2654435761u >> 13);
	for (unsigned j = 0; j < k + m; j++)
		ptr[j] = buf + (size_t)j * KERNEL_LEN;
	out = buf + (size_t)(k + m) * KERNEL_LEN;
	gf_gen_cauchy1_matrix(a, (int)(k + m), (int)k);
	ec_init_tables((int)k, (int)m, a + (size_t)k * k, tbl);
	/* decode: data 0..m-1 lost, survivors m..k+m-1, rebuild member 0 */
	for (unsigned i = 0; i < k; i++)
		rows[i] = m + i;
	for (unsigned i = 0; i < k; i++)
		memcpy(b + (size_t)i * k, a + (size_t)rows[i] * k, k);
	if (gf_invert_matrix(b, inv, (int)k) < 0)
		die("gf_invert_matrix", EIO, NULL);
	for (unsigned j = 0; j < k; j++)
		row[j] = inv[j];   /* row 0 of the inverse: member 0 */
	ec_init_tables((int)k, 1, row, dtbl);
	for (int r = 0; r < reps; r++) {
		double t0, t1;
		unsigned it;
		t0 = now_s();
		for (it = 0; now_s() - t0 < 0.2; it++)
			ec_encode_data(KERNEL_LEN, (int)k, (int)m, tbl, ptr, ptr + k);
		t1 = now_s();
		ev[r] = (double)it * k * KERNEL_LEN / (t1 - t0) / (1u << 30);
		t0 = now_s();
		for (it = 0; now_s() - t0 < 0.2; it++)
			ec_encode_data(KERNEL_LEN, (int)k, 1, dtbl, ptr + m, &out);
		t1 = now_s();
		dv[r] = (double)it * k * KERNEL_LEN / (t1 - t0) / (1u << 30);
	}
	*enc = summarize(ev, reps);
	*dec = summarize(dv, reps);
	free(a);
	free(tbl);
	free(dtbl);
	free(buf);
}

/* ---- through the files ---- */

struct filebench {
	struct stat3 enc, inc, restore_ms, restore_gibs, copy_ms, net_rs, net_rep, net_raw;
	double ram_x;
};

static int xopen(int at, const char *name, int flags)
{
	int fd = openat(at, name, flags | O_CLOEXEC, 0600);

	if (fd < 0)
		die(name, errno, NULL);
	return fd;
}

static void fill_random(int fd, uint64_t size, unsigned seed)
{
	uint8_t *b = malloc(1u << 20);
	uint64_t x = 0x243f6a8885a308d3ull ^ (seed + 1) * 0x9e3779b97f4a7c15ull;

	if (!b)
		die("malloc", ENOMEM, NULL);
	for (uint64_t off = 0; off < size; off += 1u << 20) {
		size_t n = size - off < (1u << 20) ? (size_t)(size - off) : (1u << 20);
		for (size_t i = 0; i + 8 <= n; i += 8) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			memcpy(b + i, &x, 8);
		}
		if (pwrite(fd, b, n, (off_t)off) != (ssize_t)n)
			die("pwrite", errno, NULL);
	}
	free(b);
}

/* The floor for any restore into RAM: copying the shard's bytes into a
 * new file on the same filesystem (1 MiB pread + pwrite), in ms. */
static double copy_ms(int shard, int root, uint64_t size)
{
	uint8_t *b = malloc(1u << 20);
	int in = xopen(shard, "data.bin", O_RDONLY);
	int out = xopen(root, "copy.bin", O_WRONLY | O_CREAT | O_TRUNC);
	double t0 = now_s(), t;

	if (!b)
		die("malloc", ENOMEM, NULL);
	for (uint64_t off = 0; off < size; off += 1u << 20) {
		ssize_t n = pread(in, b, 1u << 20, (off_t)off);
		if (n <= 0 || pwrite(out, b, (size_t)n, (off_t)off) != n)
			die("copy", errno ? errno : EIO, NULL);
	}
	t = (now_s() - t0) * 1e3;
	close(in);
	close(out);
	unlinkat(root, "copy.bin", 0);
	free(b);
	return t;
}

static void frag_name(char *buf, size_t len, unsigned cw, unsigned slot)
{
	snprintf(buf, len, "cw%u.slot%u", cw, slot);
}

/* ---- over loopback TCP ---- */

/* A connected loopback TCP pair: *a the sending end, *b the receiving. */
static void tcp_pair(int *a, int *b)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 1) < 0 ||
	    getsockname(l, (struct sockaddr *)&sa, &len) < 0)
		die("listen", errno, NULL);
	*a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*a < 0 || connect(*a, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("connect", errno, NULL);
	*b = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (*b < 0)
		die("accept", errno, NULL);
	close(l);
}

/* What the sending thread does: data fragments (ec_frag_data) of the
 * codewords, or one whole file (sendfile), into fd. */
struct sender {
	int fd;
	unsigned n;                      /* data fragments to send */
	const struct ec_geom *geom[MAXR * MAXR];
	unsigned index[MAXR * MAXR];
	struct ec_shard shard[MAXR * MAXR];
	int file;                        /* >= 0: sendfile this many bytes instead */
	uint64_t file_len;
	int rc;
};

static void *send_main(void *arg)
{
	struct sender *s = arg;

	if (s->file >= 0) {
		off_t off = 0;
		while (!s->rc && (uint64_t)off < s->file_len) {
			ssize_t n = sendfile(s->fd, s->file, &off, (size_t)(s->file_len - (uint64_t)off));
			if (n <= 0)
				s->rc = n < 0 ? -errno : -EIO;
		}
	}
	for (unsigned i = 0; i < s->n && !s->rc; i++)
		s->rc = ec_frag_data(s->geom[i], s->index[i], &s->shard[i], s->fd, NULL, 0);
	shutdown(s->fd, SHUT_WR);
	return NULL;
}

/* Receiving len bytes: into a new file on root (write) or discarded. */
static void recv_bytes(int fd, int root, uint64_t len, bool keep)
{
	uint8_t *b = malloc(1u << 20);
	int out = keep ? xopen(root, "recv.bin", O_WRONLY | O_CREAT | O_TRUNC) : -1;
	uint64_t got = 0;

	if (!b)
		die("malloc", ENOMEM, NULL);
	while (got < len) {
		ssize_t n = read(fd, b, 1u << 20);
		if (n <= 0)
			die("recv", n < 0 ? errno : EIO, NULL);
		if (keep && pwrite(out, b, (size_t)n, (off_t)got) != n)
			die("pwrite", errno, NULL);
		got += (uint64_t)n;
	}
	if (keep) {
		close(out);
		unlinkat(root, "recv.bin", 0);
	}
	free(b);
}

struct netbench {
	double rs_ms, rep_ms, raw_ms;
};

/* Node 0's share of protecting a step: it stores parity for M codewords,
 * each fed K data fragments (S/K each) over TCP and folded in as they
 * arrive (ec_enc_add on the socket): M x S in. Against replication with one
 * peer (S in, written to tmpfs) and raw TCP (S in, discarded). */
static void net(int root, const struct ecplan *plan, const uint64_t *sz, const uint8_t (*hash)[32],
		const int *shard, const struct manifest *const *mf, struct netbench *nb)
{
	const struct ecplan_group *g = &plan->g[0];
	static struct ec_geom geom[MAXR];
	static struct sender snd;
	int iout[MAXR], a, b, rc;
	pthread_t th;
	double t0;
	char name[64], err[512];

	memset(&snd, 0, sizeof snd);
	snd.file = -1;
	for (unsigned j = 0; j < g->m; j++) {
		unsigned cw = ecplan_parity_cw(g, 0, j);
		ecplan_geom(plan, 0, cw, sz, hash, &geom[j]);
		for (unsigned s = 0; s < g->k; s++) {
			int r = g->unit[ecplan_slot_pos(g, cw, s)];
			snd.geom[snd.n] = &geom[j];
			snd.index[snd.n] = s;
			snd.shard[snd.n++] = (struct ec_shard){ shard[r], mf[r] };
		}
		snprintf(name, sizeof name, "net%u", j);
		iout[j] = xopen(root, name, O_RDWR | O_CREAT | O_TRUNC);
	}
	tcp_pair(&a, &b);
	snd.fd = a;
	t0 = now_s();
	if (pthread_create(&th, NULL, send_main, &snd))
		die("pthread_create", EAGAIN, NULL);
	for (unsigned j = 0; j < g->m; j++) {
		struct ec_enc *e = NULL;
		if ((rc = ec_enc_open(&geom[j], j, 1, &iout[j], &e)))
			die("ec_enc_open", rc, NULL);
		for (unsigned s = 0; s < g->k; s++)
			if ((rc = ec_enc_add(e, b, err, sizeof err)))
				die("ec_enc_add", rc, err);
		if ((rc = ec_enc_finish(e, err, sizeof err)))
			die("ec_enc_finish", rc, err);
		ec_enc_free(e);
	}
	pthread_join(th, NULL);
	nb->rs_ms = (now_s() - t0) * 1e3;
	if (snd.rc)
		die("send", snd.rc, NULL);
	close(a);
	close(b);
	for (unsigned j = 0; j < g->m; j++) {
		close(iout[j]);
		snprintf(name, sizeof name, "net%u", j);
		unlinkat(root, name, 0);
	}
	for (int keep = 1; keep >= 0; keep--) {
		memset(&snd, 0, sizeof snd);
		snd.file = xopen(shard[0], "data.bin", O_RDONLY);
		snd.file_len = sz[0];
		tcp_pair(&a, &b);
		snd.fd = a;
		t0 = now_s();
		if (pthread_create(&th, NULL, send_main, &snd))
			die("pthread_create", EAGAIN, NULL);
		recv_bytes(b, root, sz[0], keep);
		pthread_join(th, NULL);
		*(keep ? &nb->rep_ms : &nb->raw_ms) = (now_s() - t0) * 1e3;
		if (snd.rc)
			die("sendfile", snd.rc, NULL);
		close(snd.file);
		close(a);
		close(b);
	}
}

static void files(const char *dir, unsigned k, unsigned m, uint64_t size, int reps,
		  struct filebench *fb)
{
	unsigned n = k + m;
	int root, node[MAXR], shard[MAXR];
	struct manifest *mf[MAXR];
	uint64_t sz[MAXR];
	uint8_t hash[MAXR][32];
	struct ecplan *plan = NULL;
	struct ecplan_in in = { .nodes = (int)n, .k = k, .m = m };
	const struct ecplan_group *g;
	char path[4096], name[64], err[512] = "";
	double ev[64], iv[64], rv[64], gv[64], cv[64], nrs[64], nrep[64], nraw[64];
	int rc;

	snprintf(path, sizeof path, "%s/mtcfs-ecbench-%d-%u+%u", dir, (int)getpid(), k, m);
	if (mkdir(path, 0700) < 0)
		die(path, errno, NULL);
	root = xopen(AT_FDCWD, path, O_RDONLY | O_DIRECTORY);
	for (unsigned r = 0; r < n; r++) {
		int fd;
		snprintf(name, sizeof name, "node%u", r);
		if (mkdirat(root, name, 0700) < 0)
			die(name, errno, NULL);
		node[r] = xopen(root, name, O_RDONLY | O_DIRECTORY);
		if (mkdirat(node[r], "shard", 0700) < 0)
			die("shard", errno, NULL);
		shard[r] = xopen(node[r], "shard", O_RDONLY | O_DIRECTORY);
		fd = xopen(shard[r], "data.bin", O_WRONLY | O_CREAT | O_TRUNC);
		fill_random(fd, size, r);
		close(fd);
		if ((rc = mf_build(shard[r], &mf[r])))
			die("mf_build", rc, NULL);
		sz[r] = mf[r]->total;
		memcpy(hash[r], mf[r]->hash, 32);
	}
	if ((rc = ecplan_build(&in, &plan)))
		die("ecplan_build", rc, NULL);
	g = &plan->g[0];
	for (int rep = 0; rep < reps; rep++) {
		double tenc = 0, tinc = 0, t0;
		uint64_t encoded = 0;
		/* protect the step: every codeword's data fragments, then parity */
		for (unsigned cw = 0; cw < n; cw++) {
			struct ec_geom geom;
			int din[MAXR], pout[MAXR];
			ecplan_geom(plan, 0, cw, sz, (const uint8_t(*)[32])hash, &geom);
			for (unsigned j = 0; j < k; j++) {
				unsigned r = (unsigned)g->unit[ecplan_slot_pos(g, cw, j)];
				struct ec_shard src = { shard[r], mf[r] };
				frag_name(name, sizeof name, cw, j);
				din[j] = xopen(node[r], name, O_RDWR | O_CREAT | O_TRUNC);
				if ((rc = ec_frag_data(&geom, j, &src, din[j], err, sizeof err)))
					die("ec_frag_data", rc, err);
				encoded += geom.d[j].len;
			}
			for (unsigned j = 0; j < m; j++) {
				unsigned r = (unsigned)g->unit[ecplan_slot_pos(g, cw, k + j)];
				frag_name(name, sizeof name, cw, k + j);
				pout[j] = xopen(node[r], name, O_RDWR | O_CREAT | O_TRUNC);
			}
			t0 = now_s();
			if ((rc = ec_encode(din, k, pout, m, err, sizeof err)))
				die("ec_encode", rc, err);
			tenc += now_s() - t0;
			/* the same parity folded in member by member (ec_enc_*) */
			{
				struct ec_enc *e = NULL;
				int iout[MAXR];
				for (unsigned j = 0; j < m; j++) {
					snprintf(name, sizeof name, "inc%u", j);
					iout[j] = xopen(root, name, O_RDWR | O_CREAT | O_TRUNC);
				}
				t0 = now_s();
				if ((rc = ec_enc_open(&geom, 0, m, iout, &e)))
					die("ec_enc_open", rc, NULL);
				for (unsigned j = 0; j < k; j++) {
					if (lseek(din[j], 0, SEEK_SET) != 0)
						die("lseek", errno, NULL);
					if ((rc = ec_enc_add(e, din[j], err, sizeof err)))
						die("ec_enc_add", rc, err);
				}
				if ((rc = ec_enc_finish(e, err, sizeof err)))
					die("ec_enc_finish", rc, err);
				tinc += now_s() - t0;
				ec_enc_free(e);
				for (unsigned j = 0; j < m; j++) {
					close(iout[j]);
					snprintf(name, sizeof name, "inc%u", j);
					unlinkat(root, name, 0);
				}
			}
			for (unsigned j = 0; j < k; j++)
				close(din[j]);
			for (unsigned j = 0; j < m; j++)
				close(pout[j]);
		}
		ev[rep] = (double)encoded / tenc / (1u << 30);
		iv[rep] = (double)encoded / tinc / (1u << 30);
		/* RAM: node 0's own shard and parity files (data fragments are
		 * what peers stream; they are not kept) */
		{
			uint64_t held = sz[0];
			struct stat st;
			for (unsigned j = 0; j < m; j++) {
				frag_name(name, sizeof name, ecplan_parity_cw(g, 0, j), k + j);
				if (fstatat(node[0], name, &st, 0) == 0)
					held += (uint64_t)st.st_size;
			}
			fb->ram_x = (double)held / (double)sz[0];
		}
		/* restore node 0 with nodes 0..m-1 lost */
		{
			struct ec_shard dst;
			int rdir;
			snprintf(name, sizeof name, "restore%d", rep);
			if (mkdirat(root, name, 0700) < 0)
				die(name, errno, NULL);
			rdir = xopen(root, name, O_RDONLY | O_DIRECTORY);
			dst = (struct ec_shard){ rdir, mf[0] };
			t0 = now_s();
			if ((rc = ec_shard_prepare(&dst)))
				die("ec_shard_prepare", rc, NULL);
			for (unsigned t = 0; t < k; t++) {
				unsigned cw, slot, nc = 0;
				int fds[MAXR];
				struct ec_sink sink = { .shard = &dst, .fd = -1 };
				ecplan_piece(g, 0, t, &cw, &slot);
				for (unsigned s = 0; s < n; s++) {
					unsigned r = (unsigned)g->unit[ecplan_slot_pos(g, cw, s)];
					if (r < m)
						continue;
					frag_name(name, sizeof name, cw, s);
					fds[nc++] = xopen(node[r], name, O_RDONLY);
				}
				if ((rc = ec_decode(fds, nc, slot, &sink, err, sizeof err)))
					die("ec_decode", rc, err);
				for (unsigned i = 0; i < nc; i++)
					close(fds[i]);
			}
			if ((rc = ec_shard_finish(&dst, err, sizeof err)))
				die("ec_shard_finish", rc, err);
			rv[rep] = (now_s() - t0) * 1e3;
			gv[rep] = (double)sz[0] / (rv[rep] / 1e3) / (1u << 30);
			close(rdir);
			snprintf(name, sizeof name, "restore%d", rep);
			util_rmtree_at(root, name, NULL);
		}
		cv[rep] = copy_ms(shard[0], root, sz[0]);
		{
			struct netbench nb;
			net(root, plan, sz, (const uint8_t(*)[32])hash, shard,
			    (const struct manifest *const *)mf, &nb);
			nrs[rep] = nb.rs_ms;
			nrep[rep] = nb.rep_ms;
			nraw[rep] = nb.raw_ms;
		}
	}
	fb->enc = summarize(ev, reps);
	fb->inc = summarize(iv, reps);
	fb->restore_ms = summarize(rv, reps);
	fb->restore_gibs = summarize(gv, reps);
	fb->copy_ms = summarize(cv, reps);
	fb->net_rs = summarize(nrs, reps);
	fb->net_rep = summarize(nrep, reps);
	fb->net_raw = summarize(nraw, reps);
	for (unsigned r = 0; r < n; r++) {
		close(shard[r]);
		close(node[r]);
		mf_free(mf[r]);
	}
	ecplan_free(plan);
	close(root);
	util_rmtree_at(AT_FDCWD, path, NULL);
}

int main(int argc, char **argv)
{
	const char *dir = "/dev/shm", *configs = "4+1,4+2,8+2,10+4";
	uint64_t size_mib = 64, reps = 5;
	char cfg[256], netrow[16][512];
	unsigned nnet = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
			if (util_parse_u64(argv[++i], 1u << 20, &size_mib) || !size_mib)
				die("--size", EINVAL, NULL);
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			if (util_parse_u64(argv[++i], 63, &reps) || !reps)
				die("--reps", EINVAL, NULL);
		} else if (!strcmp(argv[i], "--configs") && i + 1 < argc)
			configs = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--dir DIR] [--size MiB] [--reps N] "
					"[--configs 4+1,4+2,...]\n", argv[0]);
			return 2;
		}
	}
	printf("| redundancy | RAM per node (x S) | goal | kernel encode GiB/s/core | "
	       "kernel decode GiB/s/core | ec_encode files GiB/s | ec_enc incremental GiB/s | restore lost shard (%llu MiB) ms | "
	       "restore GiB/s | copy S on DIR ms (floor) |\n",
	       (unsigned long long)size_mib);
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	printf("| replication (1 peer) | 2.00 | 2.00 | - | - | - | - | - | - | - |\n");
	snprintf(cfg, sizeof cfg, "%s", configs);
	for (char *p = cfg, *next; p && *p; p = next) {
		struct ec_redundancy red;
		char spec[300], err[200];
		struct stat3 enc, dec;
		struct filebench fb = { 0 };
		next = strchr(p, ',');
		if (next)
			*next++ = '\0';
		snprintf(spec, sizeof spec, "rs:%s", p);
		if (ec_parse_redundancy(spec, &red, err, sizeof err) || red.kind != EC_RS)
			die(spec, EINVAL, err);
		kernel(red.k, red.m, (int)reps, &enc, &dec);
		files(dir, red.k, red.m, size_mib << 20, (int)reps, &fb);
		printf("| %s | %.3f | %.3f | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | %.2f | "
		       "%.0f (%.0f..%.0f) | %.2f | %.0f |\n",
		       spec, fb.ram_x, 1.0 + (double)red.m / red.k, enc.med, enc.min, enc.max,
		       dec.med, dec.min, dec.max, fb.enc.med, fb.enc.min, fb.enc.max, fb.inc.med,
		       fb.restore_ms.med, fb.restore_ms.min, fb.restore_ms.max,
		       fb.restore_gibs.med, fb.copy_ms.med);
		fflush(stdout);
		if (nnet < sizeof netrow / sizeof netrow[0])
			snprintf(netrow[nnet++], sizeof netrow[0],
				 "| %s | %.0f (%.0f..%.0f) | %.2f | %.0f (%.0f..%.0f) | %.0f (%.0f..%.0f) |",
				 spec, fb.net_rs.med, fb.net_rs.min, fb.net_rs.max,
				 fb.net_rs.med / fb.net_rep.med, fb.net_rep.med, fb.net_rep.min,
				 fb.net_rep.max, fb.net_raw.med, fb.net_raw.min, fb.net_raw.max);
	}
	printf("\n| redundancy | time to redundancy, one node's share over loopback TCP ms "
	       "(M x S folded in) | / replication | replication (1 peer): S over TCP into tmpfs ms | "
	       "raw TCP: S discarded ms |\n|---|---|---|---|---|\n");
	for (unsigned i = 0; i < nnet; i++)
		printf("%s\n", netrow[i]);
	return 0;
}
