#include "net/metrics_http.h"
#include "net/frame.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

struct mhttp {
	struct MHD_Daemon *d;
	mhttp_gauges_fn fn;
	void *arg;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **con_cls)
{
	struct mhttp *m = cls;
	struct MHD_Response *r;
	struct metrics_gauges g = { .peers_total = -1, .peers_reachable = -1, .lkg_step = -1,
				    .replicated_lkg_step = -1, .last_commit_step = -1 };
	enum MHD_Result ret;
	char *buf = NULL;
	size_t len = 0;
	unsigned status = MHD_HTTP_OK;

	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		static const char msg[] = "only GET\n";
		r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics")) {
		static const char msg[] = "mtcfs: metrics are at /metrics\n";
		r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_NOT_FOUND;
	} else {
		if (m->fn)
			m->fn(m->arg, &g);
		if (metrics_render(&g, &buf, &len) < 0)
			return MHD_NO;
		r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
		MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	}
	if (!r)
		return MHD_NO;
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

int mhttp_start(const char *hostport, mhttp_gauges_fn fn, void *arg, struct mhttp **out)
{
	struct mhttp *m = calloc(1, sizeof(*m));
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct sockaddr_in6 sa6 = { .sin6_family = AF_INET6 };
	struct sockaddr *addr = (struct sockaddr *)&sa;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
	char host[256];
	uint16_t port;

	if (!m)
		return -ENOMEM;
	if (net_split_hostport(hostport, host, sizeof(host), &port, false) < 0) {
		log_err("metrics", "metrics=%s is not HOST:PORT ([ADDR]:PORT for IPv6)", hostport);
		free(m);
		return -EINVAL;
	}
	/* IPv6 in the bracket form ([::1]:9311, [::]:9311): net_split_hostport
	 * has stripped the brackets, so a ':' in host says which family. */
	if (strchr(host, ':')) {
		if (inet_pton(AF_INET6, host, &sa6.sin6_addr) != 1) {
			log_err("metrics", "metrics=%s: not an IPv6 address", hostport);
			free(m);
			return -EINVAL;
		}
		sa6.sin6_port = htons(port);
		addr = (struct sockaddr *)&sa6;
		flags |= MHD_USE_IPv6;
	} else if (!host[0] || !strcmp(host, "0.0.0.0")) {
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
	} else if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &sa.sin_addr) != 1) {
		log_err("metrics", "metrics=%s: give an IPv4 address or [IPv6]:PORT", hostport);
		free(m);
		return -EINVAL;
	}
	sa.sin_port = htons(port);
	m->fn = fn;
	m->arg = arg;
	m->d = MHD_start_daemon(flags, port, NULL, NULL, answer, m,
				MHD_OPTION_SOCK_ADDR, addr,
				MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
				MHD_OPTION_END);
	if (!m->d) {
		log_err("metrics", "cannot serve metrics on %s", hostport);
		free(m);
		return -EADDRINUSE;
	}
	log_info("metrics", "Prometheus metrics at http://%s/metrics", hostport);
	*out = m;
	return 0;
}

void mhttp_stop(struct mhttp *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	free(m);
}
