#include "common/par_for.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct par {
	size_t n;
	unsigned flags;
	par_for_fn fn;
	par_for_fail_fn fail;
	void *arg;
	atomic_size_t next;
	atomic_bool stop;
	pthread_mutex_t mu;   /* protects first, rc and the fail callback */
	size_t first;         /* lowest failed index, n if none */
	int rc;
};

static void *par_worker(void *arg)
{
	struct par *p = arg;
	size_t i;

	while ((i = atomic_fetch_add(&p->next, 1)) < p->n) {
		int rc;

		if ((p->flags & PAR_FOR_STOP) && atomic_load(&p->stop))
			break;
		rc = p->fn(p->arg, i);
		if (rc >= 0)
			continue;
		atomic_store(&p->stop, true);
		pthread_mutex_lock(&p->mu);
		if (i < p->first) {
			p->first = i;
			p->rc = rc;
			if (p->fail)
				p->fail(p->arg, i, rc);
		}
		pthread_mutex_unlock(&p->mu);
	}
	return NULL;
}

int par_for(size_t n, size_t threads, unsigned flags, par_for_fn fn, par_for_fail_fn fail,
	    void *arg, size_t *first)
{
	struct par p = { .n = n, .flags = flags, .fn = fn, .fail = fail, .arg = arg, .first = n };
	pthread_t *th = NULL;
	size_t nt = threads < n ? threads : n, started = 0;

	if (first)
		*first = n;
	if (n == 0)
		return 0;
	atomic_init(&p.next, 0);
	atomic_init(&p.stop, false);
	pthread_mutex_init(&p.mu, NULL);
	if (nt > 1)
		th = calloc(nt - 1, sizeof(*th));
	for (size_t i = 0; th && i < nt - 1; i++) {
		if (pthread_create(&th[i], NULL, par_worker, &p) != 0)
			break;
		started++;
	}
	par_worker(&p);   /* the caller's thread works too */
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	free(th);
	pthread_mutex_destroy(&p.mu);
	if (first)
		*first = p.first;
	return p.first < n ? p.rc : 0;
}
