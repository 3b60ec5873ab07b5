/* redund.c — which redundancy scheme is in force, and the ops every
 * scheme runs (see redund.h). */
#include "cluster/redund.h"
#include "cluster/engine_ec.h"
#include "cluster/engine_int.h"

#include <pthread.h>

static const struct redund_scheme *const schemes[] = { &redund_replication, &redund_rs };
#define NSCHEMES (sizeof(schemes) / sizeof(schemes[0]))

const struct redund_scheme *redund_for(struct eng *e)
{
	struct job_now now;

	jobid_get(e->jid, &now);
	return now.workers == 1 && eng_ec_get(e, NULL) ? &redund_rs : &redund_replication;
}

json_t *redund_status(struct eng *e, const char *job)
{
	struct ec_redundancy red;
	char buf[32];
	json_t *o = json_object();

	if (!o)
		return NULL;
	/* the setting, also under replication: the coordinator names a node
	 * whose setting differs from the others' */
	eng_ec_get(e, &red);
	json_object_set_new(o, "redundancy", json_string(ec_redundancy_str(&red, buf, sizeof(buf))));
	for (size_t i = 0; i < NSCHEMES; i++)
		if (schemes[i]->status)
			schemes[i]->status(e, job, o);
	return o;
}
