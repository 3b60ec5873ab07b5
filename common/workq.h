/* workq: a FIFO of jobs run in order by one worker thread (Redis bio.c
 * style). Any thread may submit; the job function runs on the worker and
 * owns its argument. workq_drain() waits until everything submitted so far
 * has run. */
#ifndef MTCFS_COMMON_WORKQ_H
#define MTCFS_COMMON_WORKQ_H

struct workq;
typedef void (*workq_fn)(void *arg);

int  workq_start(const char *name, struct workq **out);
int  workq_submit(struct workq *q, workq_fn fn, void *arg);   /* 0 or -ENOMEM/-ESHUTDOWN */
void workq_drain(struct workq *q);
/* Run what is queued, then stop the thread and free. Accepts NULL. */
void workq_stop(struct workq *q);
/* workq_stop in two halves, for a queue that other threads may still
 * submit to while it stops (an engine callback during the daemon's stop):
 * workq_close runs what is queued and stops the thread, and from then on
 * workq_submit returns -ESHUTDOWN (the queue stays valid); workq_free frees
 * it once nobody can submit any more. Both accept NULL; workq_free closes
 * a queue that is still open. */
void workq_close(struct workq *q);
void workq_free(struct workq *q);
int  workq_pending(struct workq *q);

#endif
