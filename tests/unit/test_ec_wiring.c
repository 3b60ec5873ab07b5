/* Unit tests of the `redundancy` wiring (issue 17) that need no daemon:
 * the replicator.yaml key (cluster/rcfg.c) and the coordinator's rule that
 * adds a hold for a lost shard the code rebuilds (cluster/coord_ec.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/coord_ec.h"
#include "cluster/coord_i.h"
#include "cluster/rcfg.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *yaml, struct rcfg *c, char *err, size_t errlen)
{
	err[0] = '\0';
	return rcfg_parse(yaml, strlen(yaml), NULL, c, err, errlen);
}

static void test_yaml_key(void **state)
{
	struct rcfg c;
	char err[1024], buf[2048];
	(void)state;

	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\n", &c, err, sizeof err), 0);
	assert_false(c.has_redundancy);
	rcfg_free(&c);

	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: rs:4+2\n", &c,
			       err, sizeof err), 0);
	assert_true(c.has_redundancy);
	assert_int_equal(c.redundancy.kind, EC_RS);
	assert_int_equal(c.redundancy.k, 4);
	assert_int_equal(c.redundancy.m, 2);
	/* the canonical dump keeps it, and reads back equal */
	assert_true(rcfg_to_yaml(&c, buf, sizeof buf) > 0);
	assert_non_null(strstr(buf, "redundancy: rs:4+2\n"));
	rcfg_free(&c);
	assert_int_equal(parse(buf, &c, err, sizeof err), 0);
	assert_int_equal(c.redundancy.m, 2);
	rcfg_free(&c);

	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: replication\n",
			       &c, err, sizeof err), 0);
	assert_true(c.has_redundancy);
	assert_int_equal(c.redundancy.kind, EC_REPLICATION);
	rcfg_free(&c);
}

static void test_yaml_bad_values(void **state)
{
	struct rcfg c;
	char err[1024];
	(void)state;

	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: rs:4+2x\n", &c,
			       err, sizeof err), -EINVAL);
	assert_string_equal(err, "line 4: redundancy: 'rs:4+2x' is neither 'replication' nor "
			    "'rs:K+M' (e.g. rs:4+2)");
	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: rs:31+2\n", &c,
			       err, sizeof err), -EINVAL);
	assert_string_equal(err, "line 4: redundancy: rs:31+2 needs K >= 1, M >= 1 and K + M <= 32");
	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: [1]\n", &c,
			       err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "'redundancy' expects a string"));
	/* an expanded value is quoted as written, never its expansion */
	setenv("MTCFS_YAML_RED", "secret-value", 1);
	assert_int_equal(parse("job-name: j\nnode-rank: 0\nnodes: 6\nredundancy: $MTCFS_YAML_RED\n",
			       &c, err, sizeof err), -EINVAL);
	assert_null(strstr(err, "secret-value"));
	assert_non_null(strstr(err, "$MTCFS_YAML_RED"));
	unsetenv("MTCFS_YAML_RED");
	/* a folded scalar's newline is quoted: the message stays one line
	 * (fuzz_replicator_yaml found it echoed raw) */
	assert_int_equal(parse("redundancy: >-\n\n le:sr", &c, err, sizeof err), -EINVAL);
	assert_null(strchr(err, '\n'));
	assert_non_null(strstr(err, "'redundancy'"));
}

/* ---- coord_ec ---- */

#define N 6

static json_t *ec_report(const char *red, const unsigned *steps, size_t nsteps)
{
	json_t *par = json_array();
	for (size_t i = 0; i < nsteps; i++) {
		json_t *hs = json_array();
		for (int o = 0; o < N; o++) {
			char hex[65];
			for (int b = 0; b < 32; b++)
				snprintf(hex + 2 * b, 3, "%02x", (unsigned)(o * 16 + steps[i]) & 0xff);
			json_array_append_new(hs, json_pack("[i,s]", o, hex));
		}
		json_array_append_new(par, json_pack("[i,o]", (int)steps[i], hs));
	}
	return json_pack("{s:{s:s,s:o}}", "ec", "redundancy", red, "parity", par);
}

struct fixture {
	struct cjob j;
	struct lkg_hold h[N];
	bool live[N];
};

/* 6 nodes rs:4+2, step 5 protected everywhere; the nodes in lost[] came
 * back empty (live, no holds, no parity). */
static size_t augment(struct fixture *f, const int *lost, size_t nlost, struct lkg_hold **aug)
{
	struct lkg_input in;
	size_t nh = 0;
	unsigned step = 5;

	memset(f, 0, sizeof(*f));
	snprintf(f->j.name, sizeof(f->j.name), "job");
	f->j.nodes = N;
	for (int r = 0; r < N; r++) {
		bool gone = false;
		for (size_t i = 0; i < nlost; i++)
			gone |= lost[i] == r;
		f->live[r] = true;
		json_t *m = gone ? json_object() : ec_report("rs:4+2", &step, 1);
		coord_ec_catalog(&f->j, r, m);
		json_decref(m);
		if (!gone)
			f->h[nh++] = (struct lkg_hold){ .holder = (uint32_t)r, .owner = (uint32_t)r,
							.step = 5 };
	}
	in = (struct lkg_input){ .nodes = N, .h = f->h, .nh = nh, .live = f->live };
	*aug = coord_ec_augment(&f->j, &in);
	return *aug ? in.nh - nh : 0;
}

static void test_coord_augment(void **state)
{
	struct fixture f;
	struct lkg_hold *aug;
	(void)state;

	/* every loss of 1 or 2 nodes: each lost node gets a hold of its own,
	 * with its hash from the survivors' reports */
	for (int a = 0; a < N; a++) {
		for (int b = a; b < N; b++) {
			int lost[2] = { a, b };
			size_t nl = a == b ? 1 : 2;
			assert_int_equal(augment(&f, lost, nl, &aug), nl);
			for (size_t i = 0; i < nl; i++) {
				struct lkg_hold *h = &aug[N - nl + i];
				assert_int_equal(h->holder, h->owner);
				assert_int_equal(h->step, 5);
				assert_int_equal(h->hash[0], (h->owner * 16 + 5) & 0xff);
				assert_true(h->owner == (uint32_t)a || h->owner == (uint32_t)b);
			}
			free(aug);
			coord_ec_free(f.j.ec);
		}
	}
	/* three lost (M + 1): nothing rebuilt */
	int three[3] = { 0, 2, 4 };
	assert_int_equal(augment(&f, three, 3, &aug), 0);
	assert_null(aug);
	coord_ec_free(f.j.ec);
}

static void test_coord_mismatch(void **state)
{
	struct cjob j;
	unsigned step = 5;
	json_t *m;
	(void)state;

	memset(&j, 0, sizeof(j));
	snprintf(j.name, sizeof(j.name), "job");
	j.nodes = N;
	m = ec_report("rs:4+2", &step, 1);
	coord_ec_catalog(&j, 0, m);
	json_decref(m);
	m = ec_report("rs:4+1", &step, 1);
	coord_ec_catalog(&j, 3, m);
	json_decref(m);
	assert_non_null(strstr(j.notes, "node 3 runs redundancy rs:4+1, node 0 rs:4+2"));
	coord_ec_free(j.ec);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_yaml_key),
		cmocka_unit_test(test_yaml_bad_values),
		cmocka_unit_test(test_coord_augment),
		cmocka_unit_test(test_coord_mismatch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
