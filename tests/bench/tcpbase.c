/* mtcfs-tcpbase: the raw loopback TCP baseline of tests/bench/peerbench.py.
 *
 * Copies files from one directory into another over one loopback TCP
 * connection, the least a replica or a restore over the network has to do:
 * a sender thread sendfile()s each source file (an 8-byte little-endian
 * size first), the receiving thread stores the bytes in DST_DIR/<basename>
 * either with recv + write (1 MiB chunks, "copy") or socket -> pipe -> file
 * with splice ("splice"). No CRC, no framing beyond the size, no fsync.
 *
 *   mtcfs-tcpbase [--mode copy|splice] [--chunk BYTES] [--no-tune] DST_DIR SRC...
 *
 * Times from just before the connection is made to the close of the last
 * destination file (sender joined) and prints one JSON object:
 *   {"mode":"copy","files":4,"bytes":1073741824,"secs":0.61,"gib_per_s":1.64}
 * By default the sockets get what mtcfs gives its data connections
 * (net/client.c nconn_tune_data_socket: TCP_NODELAY, 4 MiB SO_SNDBUF and
 * SO_RCVBUF); --no-tune leaves the kernel's autotuning alone.
 * Exit 0, or 1 with a message on stderr. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SOCKBUF (4 << 20)

static const char *g_mode = "copy";
static size_t g_chunk = 1u << 20;
static bool g_tune = true;
static int g_port;
static char **g_src;
static int g_nsrc;
static int g_send_err;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "mtcfs-tcpbase: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void tune(int fd)
{
	int one = 1, sz = SOCKBUF;
	if (!g_tune)
		return;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t k = write(fd, b, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

static int read_exact(int fd, void *p, size_t n)
{
	uint8_t *b = p;
	while (n > 0) {
		ssize_t k = recv(fd, b, n, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

static void *sender(void *arg)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)g_port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	(void)arg;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		goto fail;
	tune(fd);   /* before connect: window scaling */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	for (int i = 0; i < g_nsrc; i++) {
		int sfd = open(g_src[i], O_RDONLY | O_CLOEXEC);
		struct stat st;
		uint64_t size, le;
		off_t off = 0;

		if (sfd < 0 || fstat(sfd, &st) < 0)
			goto fail;
		size = (uint64_t)st.st_size;
		le = htole64(size);
		if (write_all(fd, &le, sizeof(le)) < 0)
			goto fail;
		while ((uint64_t)off < size) {
			uint64_t left = size - (uint64_t)off;
			ssize_t n = sendfile(fd, sfd, &off, left > (1u << 30) ? (1u << 30) : (size_t)left);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				goto fail;
		}
		close(sfd);
	}
	close(fd);
	return NULL;
fail:
	g_send_err = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	return NULL;
}

static int recv_copy(int sfd, int dfd, uint64_t size, uint8_t *buf)
{
	uint64_t off = 0;
	while (off < size) {
		size_t want = size - off > g_chunk ? g_chunk : (size_t)(size - off);
		ssize_t n = recv(sfd, buf, want, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		if (write_all(dfd, buf, (size_t)n) < 0)
			return -1;
		off += (uint64_t)n;
	}
	return 0;
}

static int recv_splice(int sfd, int dfd, uint64_t size, int pfd[2], size_t psz)
{
	uint64_t off = 0;
	while (off < size) {
		size_t want = size - off > psz ? psz : (size_t)(size - off);
		ssize_t n = splice(sfd, NULL, pfd[1], NULL, want, SPLICE_F_MOVE);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		for (size_t m = (size_t)n; m > 0;) {
			ssize_t k = splice(pfd[0], NULL, dfd, NULL, m, SPLICE_F_MOVE);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				return -1;
			m -= (size_t)k;
		}
		off += (uint64_t)n;
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: mtcfs-tcpbase [--mode copy|splice] [--chunk BYTES] [--no-tune] "
			"DST_DIR SRC...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t slen = sizeof(sa);
	const char *dst;
	uint64_t total = 0;
	uint8_t *buf = NULL;
	int pfd[2] = { -1, -1 };
	size_t psz = 0;
	pthread_t thr;
	double t0, t1;
	int lfd, cfd, i, one = 1;

	for (i = 1; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
		if (!strcmp(argv[i], "--mode") && i + 1 < argc)
			g_mode = argv[++i];
		else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
			g_chunk = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--no-tune"))
			g_tune = false;
		else
			usage();
	}
	if (argc - i < 2 || g_chunk == 0 || (strcmp(g_mode, "copy") && strcmp(g_mode, "splice")))
		usage();
	dst = argv[i++];
	g_src = argv + i;
	g_nsrc = argc - i;
	signal(SIGPIPE, SIG_IGN);

	if (!strcmp(g_mode, "copy")) {
		buf = malloc(g_chunk);
		if (!buf)
			die("malloc");
		memset(buf, 0, g_chunk);   /* fault it in before the clock runs */
	} else {
		int sz;
		if (pipe2(pfd, O_CLOEXEC) < 0)
			die("pipe2");
		/* the same pipe mtcfs's splice path asks for (1 MiB) */
		sz = fcntl(pfd[1], F_SETPIPE_SZ, (int)g_chunk);
		if (sz < 0)
			sz = fcntl(pfd[1], F_GETPIPE_SZ);
		psz = sz > 0 ? (size_t)sz : 65536;
	}

	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	tune(lfd);   /* inherited by the accepted socket */
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 1) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &slen) < 0)
		die("bind/listen on 127.0.0.1");
	g_port = ntohs(sa.sin_port);

	t0 = now_s();
	if (pthread_create(&thr, NULL, sender, NULL))
		die("pthread_create");
	cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (cfd < 0)
		die("accept");
	for (int f = 0; f < g_nsrc; f++) {
		char path[4096], *tmp = strdup(g_src[f]);
		uint64_t le;
		int dfd, rc;

		if (read_exact(cfd, &le, sizeof(le)) < 0) {
			fprintf(stderr, "mtcfs-tcpbase: short stream before file %d (sender: %s)\n", f,
				strerror(g_send_err));
			return 1;
		}
		snprintf(path, sizeof(path), "%s/%s", dst, basename(tmp));
		free(tmp);
		dfd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (dfd < 0)
			die(path);
		rc = buf ? recv_copy(cfd, dfd, le64toh(le), buf)
			 : recv_splice(cfd, dfd, le64toh(le), pfd, psz);
		if (rc < 0)
			die("receiving");
		if (close(dfd) < 0)
			die("close");
		total += le64toh(le);
	}
	pthread_join(thr, NULL);
	t1 = now_s();
	if (g_send_err) {
		errno = g_send_err;
		die("sending");
	}
	close(cfd);
	close(lfd);
	printf("{\"mode\":\"%s\",\"tuned\":%s,\"files\":%d,\"bytes\":%llu,\"secs\":%.6f,"
	       "\"gib_per_s\":%.4f}\n",
	       g_mode, g_tune ? "true" : "false", g_nsrc, (unsigned long long)total, t1 - t0,
	       (double)total / (double)(1u << 30) / (t1 - t0));
	free(buf);
	return 0;
}
