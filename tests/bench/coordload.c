/* mtcfs-coordload: the coordinator load generator of tests/bench/peerbench.py.
 *
 * Plays ranks 1..N-1 of a job against a real mtcfs rank-0 daemon (its
 * coordinator, net/coord.c), over the real protocol: one authenticated
 * control connection per rank (nconn_connect: the HMAC handshake with the
 * secret of --secret), then requests framed with net/frame.h and driven by
 * one non-blocking epoll loop over all connections (no thread per rank).
 *
 *   mtcfs-coordload --coord HOST:PORT --nodes N --job NAME [--secret FILE]
 *                   [--connect-threads T] [--timeout SECS]
 *
 * Start-up: connect N-1 control connections, send "register" {rank, addr,
 * job, nodes, dp} on every one and wait for all answers; print
 *   {"event":"connected","conns":...,"connect_s":...,"register_s":...,...}
 * Then commands on stdin, one per line, each answered by one JSON line:
 *   round0            a restore round in which ranks 1..N-1 hold nothing
 *   round H100 H200   a restore round with holdings: rank r holds steps 100
 *                     and 200 of itself and of r XOR 1 (rank 0's shards with
 *                     the real hashes H100/H200), except that step 200 of
 *                     rank N-1 is held nowhere: the plan must be step 100,
 *                     every rank restoring from itself
 *   quit
 * A round waits (status requests on an extra tool connection) until the
 * coordinator is collecting, i.e. rank 0's own catalog is in; sends the N-1
 * catalogs (frames built beforehand), waits for the N-1 plan entries; then
 * sends N-1 "ready" and waits for the N-1 "go". It prints
 *   {"event":"round","plan_s":...,"plan_total_s":...,"barrier_s":...,...}
 * plan_s: last catalog written to its socket -> last plan entry received;
 * plan_total_s: first catalog -> last plan entry; barrier_s / barrier_total_s
 * the same for ready -> go. Entries that do not match the expected plan are
 * counted in bad_plans / not_go. Exit 0, or 1 with a message on stderr. */
#include "common/log.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/frame.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define STEP_A 100
#define STEP_B 200

struct lc {
	struct nconn *nc;
	int fd;
	int rank;
	uint32_t next_id;
	/* output: one frame at a time */
	uint8_t *out;
	size_t outlen, outoff;
	bool want_out;           /* EPOLLOUT armed */
	/* input */
	uint8_t hb[NET_HDR_LEN];
	size_t hhave;
	bool have_hdr;
	struct net_hdr h;
	uint8_t *pl;
	size_t plcap, plhave;
	/* the current exchange */
	uint32_t want_id;
	bool done;
	uint32_t plan_id;
};

enum phase { PH_REGISTER, PH_CATALOG, PH_READY };

struct ex {
	enum phase ph;
	int round0;
	size_t pending;          /* answers still missing */
	size_t unsent;           /* connections with output left */
	double t_first_send, t_last_sent, t_last_resp;
	size_t bad, errors, events, resp_bytes;
	bool found;
	uint64_t step;
	uint32_t plan_id;
};

static const char *g_coord;
static const char *g_job;
static uint32_t g_nodes;
static struct net_auth g_auth;
static struct lc *g_c;       /* g_c[r] for r = 1..N-1 */
static int g_ep = -1;
static int g_timeout_s = 120;
static struct nconn *g_tool;
static uint8_t g_r0hash[2][32];

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
	va_list ap;
	fputs("mtcfs-coordload: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* ---- connecting ---- */

struct cthr {
	uint32_t lo, hi;
	int err;
	uint32_t err_rank;
};

static void *connect_range(void *arg)
{
	struct cthr *t = arg;
	for (uint32_t r = t->lo; r < t->hi; r++) {
		int rc = -EAGAIN;
		for (int attempt = 0; attempt < 50 && (rc == -EAGAIN || rc == -EBUSY ||
							  rc == -ECONNREFUSED || rc == -ETIMEDOUT ||
							  rc == -ECONNRESET); attempt++) {
			if (attempt)
				usleep(20000);
			rc = nconn_connect(g_coord, (int)r, "control", &g_auth, 10000, &g_c[r].nc, NULL);
		}
		if (rc < 0) {
			t->err = rc;
			t->err_rank = r;
			return NULL;
		}
		g_c[r].fd = nconn_fd(g_c[r].nc);
		g_c[r].rank = (int)r;
		g_c[r].next_id = 1;
	}
	return NULL;
}

static void connect_all(int nthreads)
{
	uint32_t n = g_nodes - 1;
	struct cthr *t = calloc((size_t)nthreads, sizeof(*t));
	pthread_t *th = calloc((size_t)nthreads, sizeof(*th));

	if (!t || !th)
		fatal("out of memory");
	for (int i = 0; i < nthreads; i++) {
		t[i].lo = 1 + (uint32_t)((uint64_t)n * (uint64_t)i / (uint64_t)nthreads);
		t[i].hi = 1 + (uint32_t)((uint64_t)n * (uint64_t)(i + 1) / (uint64_t)nthreads);
		if (pthread_create(&th[i], NULL, connect_range, &t[i]))
			fatal("pthread_create failed");
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < nthreads; i++)
		if (t[i].err)
			fatal("rank %u: connecting to %s failed: %s", t[i].err_rank, g_coord,
			      strerror(-t[i].err));
	free(t);
	free(th);
	g_ep = epoll_create1(EPOLL_CLOEXEC);
	if (g_ep < 0)
		fatal("epoll_create1: %s", strerror(errno));
	for (uint32_t r = 1; r < g_nodes; r++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = r };
		if (epoll_ctl(g_ep, EPOLL_CTL_ADD, g_c[r].fd, &ev) < 0)
			fatal("epoll_ctl: %s", strerror(errno));
	}
}

/* ---- the non-blocking exchange: one request out, one answer in, on every
 * connection ---- */

static void arm_out(struct lc *c, bool on)
{
	struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0),
				  .data.u32 = (uint32_t)c->rank };
	if (c->want_out == on)
		return;
	if (epoll_ctl(g_ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		fatal("epoll_ctl: %s", strerror(errno));
	c->want_out = on;
}

/* Write what the socket takes; true when the frame is out. */
static bool flush_out(struct lc *c)
{
	while (c->outoff < c->outlen) {
		ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->outoff += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return false;
		fatal("rank %d: send: %s", c->rank, n < 0 ? strerror(errno) : "closed");
	}
	free(c->out);
	c->out = NULL;
	c->outlen = c->outoff = 0;
	return true;
}

static void handle_answer(struct ex *x, struct lc *c, json_t *m)
{
	const char *op = "";
	uint64_t v;

	net_json_str(m, "op", 32, &op);
	switch (x->ph) {
	case PH_REGISTER:
		if (!json_is_true(json_object_get(m, "ok")))
			x->bad++;
		break;
	case PH_CATALOG: {
		bool found = json_is_true(json_object_get(m, "found"));
		uint64_t step = 0, holder = UINT64_MAX, owner = UINT64_MAX;
		if (strcmp(op, "plan") || net_json_u64(m, "plan", UINT32_MAX, &v) < 0) {
			x->bad++;
			break;
		}
		c->plan_id = (uint32_t)v;
		x->plan_id = c->plan_id;
		x->found = found;
		if (found) {
			net_json_u64(m, "step", UINT64_MAX >> 1, &step);
			net_json_u64(m, "holder", UINT32_MAX, &holder);
			net_json_u64(m, "owner", UINT32_MAX, &owner);
			x->step = step;
		}
		if (x->round0 ? found
			      : (!found || step != STEP_A || holder != (uint64_t)c->rank ||
				 owner != (uint64_t)c->rank))
			x->bad++;
		break;
	}
	case PH_READY:
		if (strcmp(op, "go"))
			x->bad++;
		break;
	}
}

/* A whole frame arrived on c. */
static void on_frame(struct ex *x, struct lc *c)
{
	json_t *m = NULL;

	if (net_payload_check(&c->h, c->pl) < 0)
		fatal("rank %d: payload CRC mismatch", c->rank);
	x->resp_bytes += NET_HDR_LEN + c->h.len;
	if (c->h.type == NT_EVENT) {
		x->events++;
		return;
	}
	if ((c->h.type != NT_RESP && c->h.type != NT_ERROR) || c->h.req_id != c->want_id || c->done) {
		fprintf(stderr, "mtcfs-coordload: rank %d: unexpected %s frame (req %u, waiting for %u)\n",
			c->rank, net_type_name(c->h.type), c->h.req_id, c->want_id);
		x->errors++;
		return;
	}
	c->done = true;
	x->pending--;
	if (x->pending == 0)
		x->t_last_resp = now_s();
	if (c->h.type == NT_ERROR) {
		const char *why = "?";
		if (net_json_decode(c->pl, c->h.len, &m) == 0)
			net_json_str(m, "error", 256, &why);
		if (x->errors < 5)
			fprintf(stderr, "mtcfs-coordload: rank %d: error answer: %s\n", c->rank, why);
		x->errors++;
		json_decref(m);
		return;
	}
	/* register answers carry the whole address table (O(N) each): only
	 * the last one is decoded, the others are checked by CRC and type */
	if (x->ph == PH_REGISTER && x->pending != 0)
		return;
	if (net_json_decode(c->pl, c->h.len, &m) < 0) {
		x->bad++;
		return;
	}
	handle_answer(x, c, m);
	json_decref(m);
}

/* Read all the socket has; frames are handled as they complete. */
static void read_in(struct ex *x, struct lc *c)
{
	for (;;) {
		uint8_t *dst;
		size_t want;
		ssize_t n;

		if (!c->have_hdr) {
			dst = c->hb + c->hhave;
			want = NET_HDR_LEN - c->hhave;
		} else {
			dst = c->pl + c->plhave;
			want = c->h.len - c->plhave;
		}
		n = recv(c->fd, dst, want, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0)
			fatal("rank %d: the coordinator closed the connection (%s)", c->rank,
			      n < 0 ? strerror(errno) : "EOF");
		if (!c->have_hdr) {
			c->hhave += (size_t)n;
			if (c->hhave < NET_HDR_LEN)
				continue;
			if (net_hdr_decode(c->hb, &c->h) < 0)
				fatal("rank %d: bad frame header", c->rank);
			c->have_hdr = true;
			c->plhave = 0;
			if (c->h.len > c->plcap) {
				free(c->pl);
				c->plcap = c->h.len;
				c->pl = malloc(c->plcap);
				if (!c->pl)
					fatal("out of memory");
			}
		} else {
			c->plhave += (size_t)n;
		}
		if (c->have_hdr && c->plhave == c->h.len) {
			on_frame(x, c);
			c->have_hdr = false;
			c->hhave = 0;
		}
	}
}

typedef json_t *(*build_fn)(struct lc *c, void *arg);

/* Send build(c) as NT_REQ on every connection, wait for every answer. */
static void exchange(struct ex *x, build_fn build, void *arg)
{
	struct epoll_event evs[512];
	double deadline;
	uint32_t r;

	x->pending = g_nodes - 1;
	x->unsent = 0;
	for (r = 1; r < g_nodes; r++) {
		struct lc *c = &g_c[r];
		json_t *m = build(c, arg);
		c->want_id = c->next_id++;
		c->done = false;
		if (net_frame_build(NT_REQ, c->want_id, m, &c->out, &c->outlen) < 0)
			fatal("cannot build a frame");
		c->outoff = 0;
		json_decref(m);
	}
	/* the clock starts here: frames are built */
	x->t_first_send = now_s();
	for (r = 1; r < g_nodes; r++) {
		if (!flush_out(&g_c[r])) {
			x->unsent++;
			arm_out(&g_c[r], true);
		}
	}
	if (x->unsent == 0)
		x->t_last_sent = now_s();
	deadline = now_s() + g_timeout_s;
	while (x->pending > 0 || x->unsent > 0) {
		int n, to = (int)((deadline - now_s()) * 1000);
		if (to <= 0)
			fatal("timed out: %zu answers and %zu sends missing after %d s", x->pending,
			      x->unsent, g_timeout_s);
		n = epoll_wait(g_ep, evs, 512, to);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			fatal("epoll_wait: %s", strerror(errno));
		for (int i = 0; i < n; i++) {
			struct lc *c = &g_c[evs[i].data.u32];
			if ((evs[i].events & EPOLLOUT) && c->out && flush_out(c)) {
				arm_out(c, false);
				if (--x->unsent == 0)
					x->t_last_sent = now_s();
			}
			if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				read_in(x, c);
		}
	}
}

/* ---- messages ---- */

static json_t *msg_register(struct lc *c, void *arg)
{
	char addr[64];
	(void)arg;
	/* an address nobody dials: every rank restores from itself */
	snprintf(addr, sizeof(addr), "127.0.0.2:%d", 10000 + c->rank % 50000);
	return json_pack("{s:s,s:s,s:s,s:i,s:i}", "op", "register", "addr", addr, "job", g_job,
			 "nodes", (int)g_nodes, "dp", 0);
}

static void fake_hash(uint32_t owner, uint64_t step, char hex[65])
{
	uint8_t h[32];
	for (int i = 0; i < 32; i++)
		h[i] = (uint8_t)((owner * 2654435761u >> (i % 4 * 8)) ^ (step * 40503u >> (i % 3)) ^
				 (uint8_t)(i * 37));
	net_hex_encode(h, 32, hex);
}

static void add_hold(json_t *holds, uint32_t owner, uint64_t step)
{
	char hex[65];
	if (owner == 0)
		net_hex_encode(g_r0hash[step == STEP_B], 32, hex);
	else
		fake_hash(owner, step, hex);
	json_array_append_new(holds, json_pack("[i,I,s]", (int)owner, (json_int_t)step, hex));
}

static json_t *msg_catalog(struct lc *c, void *arg)
{
	int round0 = *(int *)arg;
	uint32_t r = (uint32_t)c->rank, nb = r ^ 1u, missing = g_nodes - 1;
	json_t *holds = json_array();

	if (!round0) {
		uint32_t owners[2] = { r, nb };
		for (int k = 0; k < 2; k++) {
			if (owners[k] >= g_nodes)
				continue;
			add_hold(holds, owners[k], STEP_A);
			if (owners[k] != missing)
				add_hold(holds, owners[k], STEP_B);
		}
	}
	return json_pack("{s:s,s:s,s:i,s:i,s:o}", "op", "catalog", "job", g_job, "nodes",
			 (int)g_nodes, "dp", 0, "holds", holds);
}

static json_t *msg_ready(struct lc *c, void *arg)
{
	(void)arg;
	return json_pack("{s:s,s:s,s:I}", "op", "ready", "job", g_job, "plan",
			 (json_int_t)c->plan_id);
}

/* ---- the tool connection: status polling ---- */

static const char *coord_state(json_t **keep)
{
	json_t *req = json_pack("{s:s,s:s}", "op", "status", "job", g_job), *resp = NULL;
	const char *st = "?";
	int rc = nconn_call(g_tool, req, &resp, 10000);

	json_decref(req);
	if (rc < 0)
		fatal("status request failed: %s", strerror(-rc));
	if (!json_is_true(json_object_get(resp, "known")))
		st = "unknown";
	else
		net_json_str(resp, "restore", 32, &st);
	*keep = resp;
	return st;
}

static double wait_collecting(void)
{
	double t0 = now_s(), deadline = t0 + g_timeout_s;
	for (;;) {
		json_t *keep = NULL;
		bool ok = !strcmp(coord_state(&keep), "collecting");
		json_decref(keep);
		if (ok)
			return now_s() - t0;
		if (now_s() > deadline)
			fatal("the coordinator did not start collecting within %d s "
			      "(did rank 0 write replicator.yaml?)", g_timeout_s);
		usleep(1000);
	}
}

static void do_round(int round0)
{
	struct ex cat = { .ph = PH_CATALOG, .round0 = round0 };
	struct ex rdy = { .ph = PH_READY, .round0 = round0 };
	double waited = wait_collecting();

	exchange(&cat, msg_catalog, &round0);
	exchange(&rdy, msg_ready, NULL);
	printf("{\"event\":\"round\",\"kind\":\"%s\",\"nodes\":%u,\"status_wait_s\":%.6f,"
	       "\"plan_id\":%u,\"found\":%s,\"step\":%" PRIu64 ",\"catalog_send_s\":%.6f,"
	       "\"plan_s\":%.6f,\"plan_total_s\":%.6f,\"ready_send_s\":%.6f,\"barrier_s\":%.6f,"
	       "\"barrier_total_s\":%.6f,\"bad_plans\":%zu,\"not_go\":%zu,\"errors\":%zu,"
	       "\"events\":%zu,\"plan_bytes\":%zu}\n",
	       round0 ? "round0" : "round", g_nodes, waited, cat.plan_id, cat.found ? "true" : "false",
	       cat.step, cat.t_last_sent - cat.t_first_send, cat.t_last_resp - cat.t_last_sent,
	       cat.t_last_resp - cat.t_first_send, rdy.t_last_sent - rdy.t_first_send,
	       rdy.t_last_resp - rdy.t_last_sent, rdy.t_last_resp - rdy.t_first_send, cat.bad,
	       rdy.bad, cat.errors + rdy.errors, cat.events + rdy.events, cat.resp_bytes);
	fflush(stdout);
}

static void usage(void)
{
	fprintf(stderr, "usage: mtcfs-coordload --coord HOST:PORT --nodes N --job NAME "
			"[--secret FILE] [--connect-threads T] [--timeout SECS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *secret = NULL;
	int threads = 4;
	struct rlimit rl;
	struct ex reg = { .ph = PH_REGISTER };
	double t0, t1;
	char line[512];

	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--coord"))
			g_coord = argv[++i];
		else if (!strcmp(argv[i], "--nodes"))
			g_nodes = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--job"))
			g_job = argv[++i];
		else if (!strcmp(argv[i], "--secret"))
			secret = argv[++i];
		else if (!strcmp(argv[i], "--connect-threads"))
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--timeout"))
			g_timeout_s = atoi(argv[++i]);
		else
			usage();
	}
	if (!g_coord || !g_job || g_nodes < 4 || g_nodes > 65536 || threads < 1 || g_timeout_s < 1)
		usage();
	log_set_level(LOG_WARN);
	signal(SIGPIPE, SIG_IGN);
	/* one process with thousands of sockets */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)g_nodes + 64)
		fatal("RLIMIT_NOFILE is %llu: too low for %u connections",
		      (unsigned long long)rl.rlim_cur, g_nodes - 1);
	if (secret && auth_load_secret(secret, &g_auth) < 0)
		fatal("cannot load the secret from %s", secret);
	g_c = calloc(g_nodes, sizeof(*g_c));
	if (!g_c)
		fatal("out of memory");

	t0 = now_s();
	connect_all(threads);
	t1 = now_s();
	{
		int rc = nconn_connect(g_coord, AUTH_RANK_TOOL, "control", &g_auth, 10000, &g_tool, NULL);
		if (rc < 0)
			fatal("tool connection: %s", strerror(-rc));
	}
	exchange(&reg, msg_register, NULL);
	if (reg.bad || reg.errors)
		fatal("register: %zu bad answers, %zu errors", reg.bad, reg.errors);
	printf("{\"event\":\"connected\",\"conns\":%u,\"connect_s\":%.6f,\"register_s\":%.6f,"
	       "\"register_bytes\":%zu}\n",
	       g_nodes - 1, t1 - t0, reg.t_last_resp - reg.t_first_send, reg.resp_bytes);
	fflush(stdout);

	while (fgets(line, sizeof(line), stdin)) {
		char h1[80], h2[80];
		line[strcspn(line, "\r\n")] = '\0';
		if (!strcmp(line, "quit"))
			break;
		if (!strcmp(line, "round0")) {
			do_round(1);
		} else if (sscanf(line, "round %79s %79s", h1, h2) == 2 &&
			   net_hex_decode(h1, strlen(h1), g_r0hash[0], 32) == 0 &&
			   net_hex_decode(h2, strlen(h2), g_r0hash[1], 32) == 0) {
			do_round(0);
		} else {
			fprintf(stderr, "mtcfs-coordload: unknown command: %s\n", line);
			printf("{\"event\":\"error\",\"error\":\"unknown command\"}\n");
			fflush(stdout);
		}
	}
	for (uint32_t r = 1; r < g_nodes; r++) {
		nconn_close(g_c[r].nc);
		free(g_c[r].pl);
		free(g_c[r].out);
	}
	nconn_close(g_tool);
	if (g_ep >= 0)
		close(g_ep);
	free(g_c);
	auth_clear(&g_auth);
	return 0;
}
