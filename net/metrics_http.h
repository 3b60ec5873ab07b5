/* metrics_http: the Prometheus endpoint (metrics=HOST:PORT, GET /metrics)
 * served by libmicrohttpd on its own thread. The gauges callback runs on
 * that thread for every scrape. */
#ifndef MTCFS_NET_METRICS_HTTP_H
#define MTCFS_NET_METRICS_HTTP_H

#include "common/metrics.h"

struct mhttp;
typedef void (*mhttp_gauges_fn)(void *arg, struct metrics_gauges *g);

int  mhttp_start(const char *hostport, mhttp_gauges_fn fn, void *arg, struct mhttp **out);
void mhttp_stop(struct mhttp *m);    /* accepts NULL */

#endif
