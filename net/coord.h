/* coord: the coordinator of a job (runs on node-rank 0), DESIGN §5. Nodes
 * hold one control connection to it. It keeps the rank -> address table,
 * the commits reported by every node (the steady-state LKG, broadcast as it
 * moves), and runs restore rounds: collect every node's catalog (waiting up
 * to restore_timeout for all), plan with lkg_plan(), answer each node with
 * its source, re-plan on fetch failures, and release the job-wide barrier.
 * Called on the server's loop thread (messages, closes) and on its own tick
 * thread (timeouts); one mutex inside. Messages are borrowed. */
#ifndef MTCFS_NET_COORD_H
#define MTCFS_NET_COORD_H

#include <stdint.h>

#include <jansson.h>

struct coord;
struct nsrv;

int  coord_start(struct nsrv *srv, int restore_timeout_s, struct coord **out);
/* Stop the timer thread (no more sends from it); messages may still be
 * handled. Then stop the server, then coord_stop() frees. */
void coord_quiesce(struct coord *c);
void coord_stop(struct coord *c);     /* accepts NULL */
void coord_on_msg(struct coord *c, uint64_t conn, int rank, uint8_t type, uint32_t req_id,
		  json_t *msg);
void coord_on_close(struct coord *c, uint64_t conn, int rank);

#endif
