#include "common/workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct job {
	struct job *next;
	workq_fn fn;
	void *arg;
};

struct workq {
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* work arrived or stop */
	pthread_cond_t idle;    /* a job finished */
	struct job *head, *tail;   /* protected by mu */
	int pending;               /* queued + running; protected by mu */
	bool stop;                 /* protected by mu */
	pthread_t thr;
	char name[16];
};

static void *worker(void *p)
{
	struct workq *q = p;

	pthread_setname_np(pthread_self(), q->name);
	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct job *j;
		while (!q->head && !q->stop)
			pthread_cond_wait(&q->cv, &q->mu);
		if (!q->head)
			break;
		j = q->head;
		q->head = j->next;
		if (!q->head)
			q->tail = NULL;
		pthread_mutex_unlock(&q->mu);
		j->fn(j->arg);
		free(j);
		pthread_mutex_lock(&q->mu);
		q->pending--;
		pthread_cond_broadcast(&q->idle);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int workq_start(const char *name, struct workq **out)
{
	struct workq *q = calloc(1, sizeof(*q));
	int rc;

	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	pthread_cond_init(&q->idle, NULL);
	strncpy(q->name, name, sizeof(q->name) - 1);
	rc = pthread_create(&q->thr, NULL, worker, q);
	if (rc) {
		free(q);
		return -rc;
	}
	*out = q;
	return 0;
}

int workq_submit(struct workq *q, workq_fn fn, void *arg)
{
	struct job *j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->next = NULL;
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&q->mu);
	if (q->stop) {
		pthread_mutex_unlock(&q->mu);
		free(j);
		return -ESHUTDOWN;
	}
	if (q->tail)
		q->tail->next = j;
	else
		q->head = j;
	q->tail = j;
	q->pending++;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return 0;
}

void workq_drain(struct workq *q)
{
	pthread_mutex_lock(&q->mu);
	while (q->pending > 0)
		pthread_cond_wait(&q->idle, &q->mu);
	pthread_mutex_unlock(&q->mu);
}

int workq_pending(struct workq *q)
{
	int n;
	pthread_mutex_lock(&q->mu);
	n = q->pending;
	pthread_mutex_unlock(&q->mu);
	return n;
}

void workq_close(struct workq *q)
{
	bool join;

	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	join = !q->stop;
	q->stop = true;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	if (join)
		pthread_join(q->thr, NULL);
}

void workq_stop(struct workq *q)
{
	workq_free(q);
}

void workq_free(struct workq *q)
{
	if (!q)
		return;
	workq_close(q);
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
	pthread_cond_destroy(&q->idle);
	free(q);
}
