/* Unit tests of the one redundancy interface (cluster/redund.h): which
 * scheme is in force for the mount option, the job's yaml and per-worker
 * shards; the status the coordinator and mtcfs-admin read; what rs stores
 * is a RAM-tier record (its holding of a step, which the retention plan
 * drops: no scheme collects anything of its own); the rs scheme is a
 * restore source only for a shard this node has no record of. A struct
 * eng of just what the interface reads, over a real RAM tier. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster/engine_ec.h"
#include "cluster/engine_int.h"
#include "cluster/redund.h"
#include "tiers/lifecycle.h"

#define TESTTMP_NAME "redund"
#include "tests/unit/testtmp.h"

struct fx {
	struct tmp *tmp;
	struct ram_tier *ram;
	struct eng *e;
};

/* An engine on a fresh RAM tier with redundancy mount option `mount`
 * (NULL: replication) and `workers` shards per node and step. */
static void fx_start(void **state, const char *mount, uint32_t workers, struct fx *f)
{
	char err[200];

	memset(f, 0, sizeof(*f));
	f->tmp = *state;
	assert_int_equal(ram_open(f->tmp->path, 64 << 20, &f->ram), 0);
	f->e = calloc(1, sizeof(*f->e));
	assert_non_null(f->e);
	f->e->ram = f->ram;
	assert_int_equal(jobid_new(&f->e->jid), 0);
	jobid_set(f->e->jid, &(struct job_now){ .rank = -1, .workers = workers });
	pthread_mutex_init(&f->e->mu, NULL);
	assert_int_equal(eng_ec_start(f->e, mount, err, sizeof(err)), 0);
}

static void fx_stop(struct fx *f)
{
	eng_ec_stop(f->e);
	pthread_mutex_destroy(&f->e->mu);
	jobid_free(f->e->jid);
	free(f->e);
	ram_close(f->ram);
}

/* The parity holding of job's step: its record and directory
 * (ram_parity_open), with a file of `len` bytes. */
static void make_frag(struct fx *f, uint64_t step, size_t len)
{
	char *buf = calloc(1, len ? len : 1);
	int dfd, fd;

	assert_non_null(buf);
	dfd = ram_parity_open(f->ram, "job", step, true);
	assert_true(dfd >= 0);
	fd = openat(dfd, "g0-c0-s2.frag", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
	close(dfd);
	free(buf);
}

static bool frag_there(struct fx *f, uint64_t step)
{
	char p[PATH_MAX + 64];
	struct stat st;

	snprintf(p, sizeof(p), "%s/shards/job/%llu/parity", f->tmp->path, (unsigned long long)step);
	return stat(p, &st) == 0;
}

static void test_scheme_in_force(void **state)
{
	struct fx f;
	struct ec_redundancy rep = { EC_REPLICATION, 0, 0 }, rs = { EC_RS, 2, 1 };

	fx_start(state, NULL, 1, &f);
	assert_ptr_equal(redund_for(f.e), &redund_replication);
	eng_ec_set_job(f.e, true, &rs);            /* the yaml says rs:2+1 */
	assert_ptr_equal(redund_for(f.e), &redund_rs);
	/* per-worker shards: replicated */
	jobid_set(f.e->jid, &(struct job_now){ .rank = -1, .workers = 2 });
	assert_ptr_equal(redund_for(f.e), &redund_replication);
	fx_stop(&f);

	fx_start(state, "rs:2+1", 1, &f);
	assert_ptr_equal(redund_for(f.e), &redund_rs);
	eng_ec_set_job(f.e, true, &rep);           /* the yaml overrides the mount */
	assert_ptr_equal(redund_for(f.e), &redund_replication);
	eng_ec_set_job(f.e, false, NULL);          /* a yaml without the key: the mount's */
	assert_ptr_equal(redund_for(f.e), &redund_rs);
	fx_stop(&f);
}

static void test_every_scheme_has_the_required_ops(void **state)
{
	const struct redund_scheme *s[] = { &redund_replication, &redund_rs };
	(void)state;

	for (size_t i = 0; i < 2; i++) {
		assert_non_null(s[i]->name);
		assert_non_null(s[i]->protect);
		assert_non_null(s[i]->reprotect);
	}
	assert_string_equal(redund_replication.name, "replication");
	assert_string_equal(redund_rs.name, "rs");
}

static void test_status(void **state)
{
	struct fx f;
	json_t *o;
	char *txt;

	fx_start(state, NULL, 1, &f);
	o = redund_status(f.e, "job");
	txt = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	assert_string_equal(txt, "{\"redundancy\":\"replication\"}");
	free(txt);
	json_decref(o);
	fx_stop(&f);

	/* rs: the parity of steps marked protected (none yet: an unfinished
	 * step's fragments are not reported) */
	fx_start(state, "rs:2+1", 1, &f);
	make_frag(&f, 4, 100);
	o = redund_status(f.e, "job");
	txt = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	assert_string_equal(txt, "{\"parity\":[],\"redundancy\":\"rs:2+1\"}");
	free(txt);
	json_decref(o);
	fx_stop(&f);
}

/* A holding made under rs is a record of the RAM tier whatever scheme
 * is in force now: not a shard (idx_list_shards leaves it out, the
 * restore catalog and the namespace never see it), one of the records the
 * retention plan and the RAM tier's scan get, and ram_drop removes it. */
static void test_parity_holding_is_a_record(void **state)
{
	struct fx f;
	struct ec_redundancy rep = { EC_REPLICATION, 0, 0 };
	struct shard_rec *recs = NULL;
	struct shard_key k;
	size_t n = 0;

	fx_start(state, "rs:2+1", 1, &f);
	make_frag(&f, 3, 4096);
	make_frag(&f, 5, 4096);
	eng_ec_set_job(f.e, true, &rep);
	assert_ptr_equal(redund_for(f.e), &redund_replication);
	assert_int_equal(idx_list_shards(ram_idx(f.ram), "job", &recs, &n), 0);
	assert_int_equal(n, 0);
	idx_recs_free(recs, n);
	assert_int_equal(idx_list_records(ram_idx(f.ram), "job", &recs, &n), 0);
	assert_int_equal(n, 2);
	for (size_t i = 0; i < n; i++) {
		assert_true(life_is_parity(&recs[i].key));
		assert_true(recs[i].flags & SHF_PARITY);
		assert_int_equal(recs[i].state, SH_COMMITTED);
	}
	idx_recs_free(recs, n);
	life_parity_key("job", 3, &k);
	assert_int_equal(ram_drop(f.ram, &k, NULL), 0);
	assert_false(frag_there(&f, 3));
	assert_true(frag_there(&f, 5));
	/* opened again without create: no holding is made */
	assert_int_equal(ram_parity_open(f.ram, "job", 3, false), -ENOENT);
	assert_false(frag_there(&f, 3));
	fx_stop(&f);
}

static void test_rs_source_only_without_a_record(void **state)
{
	struct fx f;
	struct shard_key k = { .step = 6, .rank = 0, .worker = 0 };
	struct tier t = { 0 };

	snprintf(k.job, sizeof(k.job), "job");
	fx_start(state, NULL, 1, &f);
	assert_int_equal(redund_source(f.e, &k, 3, 0, &t), 0);   /* replication: the plan's holder */
	assert_null(t.ops);
	fx_stop(&f);

	fx_start(state, "rs:2+1", 1, &f);
	assert_int_equal(redund_source(f.e, &k, 3, 0, &t), 1);   /* no record: the code rebuilds it */
	assert_non_null(t.ops);
	tier_close(&t);
	memset(&t, 0, sizeof(t));
	assert_int_equal(life_seal_begin(ram_idx(f.ram), &k, SHF_OWN, 0), 0);
	assert_int_equal(redund_source(f.e, &k, 3, 0, &t), 0);   /* held here: the RAM tier's */
	assert_null(t.ops);
	fx_stop(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_scheme_in_force, tmp_setup, tmp_teardown),
		cmocka_unit_test(test_every_scheme_has_the_required_ops),
		cmocka_unit_test_setup_teardown(test_status, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_parity_holding_is_a_record, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rs_source_only_without_a_record, tmp_setup,
						tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
