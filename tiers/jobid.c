/* jobid.c — see jobid.h. */
#include "tiers/jobid.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct jobid {
	/* a leaf lock (jobid.h): taken last, never held across a call */
	pthread_mutex_t mu;
	struct job_now now;             /* protected by mu */
};

int jobid_new(struct jobid **out)
{
	struct jobid *j = calloc(1, sizeof(*j));

	*out = NULL;
	if (!j)
		return -ENOMEM;
	pthread_mutex_init(&j->mu, NULL);
	j->now.rank = -1;
	j->now.workers = 1;
	*out = j;
	return 0;
}

void jobid_free(struct jobid *j)
{
	if (!j)
		return;
	pthread_mutex_destroy(&j->mu);
	free(j);
}

/* The mutex is the record's, not its value's: a const record still locks. */
static pthread_mutex_t *mu_of(const struct jobid *j)
{
	return (pthread_mutex_t *)&j->mu;
}

void jobid_get(const struct jobid *j, struct job_now *out)
{
	pthread_mutex_lock(mu_of(j));
	*out = j->now;
	pthread_mutex_unlock(mu_of(j));
}

int jobid_rank(const struct jobid *j)
{
	int r;

	pthread_mutex_lock(mu_of(j));
	r = j->now.rank;
	pthread_mutex_unlock(mu_of(j));
	return r;
}

void jobid_set(struct jobid *j, const struct job_now *now)
{
	pthread_mutex_lock(&j->mu);
	j->now = *now;
	if (j->now.workers == 0)
		j->now.workers = 1;
	pthread_mutex_unlock(&j->mu);
}

void jobid_set_rank(struct jobid *j, int rank)
{
	pthread_mutex_lock(&j->mu);
	j->now.rank = rank;
	pthread_mutex_unlock(&j->mu);
}
