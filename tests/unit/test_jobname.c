/* Unit tests for common/jobname: the rule (every boundary: length 0, 128,
 * 129; the first byte; each allowed and a sample of refused characters;
 * NUL inside), the reasons and the offending byte, and that the places
 * which check a job name (replicator.yaml, the backup tier) agree with it
 * on every case: once there were three rules and the backup tier's
 * accepted a leading '.' or '-'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/jobname.h"
#include "cluster/rcfg.h"
#include "tiers/backup.h"

struct ncase {
	const char *name;
	bool ok;
};

static const struct ncase cases[] = {
	{ "j", true },            { "job-1", true },        { "Job_2.v3", true },
	{ "0", true },            { "9lives", true },       { "a..b", true },
	{ "a-", true },           { "a.", true },           { "_x", true },
	{ "", false },            { ".", false },           { "..", false },
	{ ".hidden", false },     { "-x", false },          { "-", false },
	{ "a/b", false },         { "a b", false },         { "a$b", false },
	{ "a\tb", false },        { "j\xc3\xb6", false },   { "a:b", false },
	{ "a\\b", false },        { "*", false },           { "a\nb", false },
};

static void test_rule(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char bad = 0;
		const char *why = job_name_problem(cases[i].name, strlen(cases[i].name), &bad);
		if ((why == NULL) != cases[i].ok || job_name_ok(cases[i].name) != cases[i].ok)
			fail_msg("\"%s\": expected %s, got %s", cases[i].name,
			         cases[i].ok ? "valid" : "invalid", why ? why : "valid");
	}
	assert_false(job_name_ok(NULL));
}

static void test_length(void **state)
{
	char name[JOB_NAME_MAX + 2], bad = 0;

	(void)state;
	memset(name, 'n', sizeof name);
	name[JOB_NAME_MAX] = '\0';
	assert_true(job_name_ok(name));
	assert_null(job_name_problem(name, JOB_NAME_MAX, &bad));
	name[JOB_NAME_MAX] = 'n';
	name[JOB_NAME_MAX + 1] = '\0';
	assert_false(job_name_ok(name));
	assert_string_equal(job_name_problem(name, JOB_NAME_MAX + 1, &bad),
	                    "it is longer than 128 bytes");
}

static void test_reasons(void **state)
{
	char bad = 0;

	(void)state;
	assert_string_equal(job_name_problem("", 0, &bad), "it is empty");
	assert_string_equal(job_name_problem(".x", 2, &bad), "it must not start with '.' or '-'");
	assert_string_equal(job_name_problem("-x", 2, &bad), "it must not start with '.' or '-'");
	assert_int_equal(bad, 0);   /* left alone but for a bad character */
	assert_string_equal(job_name_problem("ab c", 4, &bad),
	                    "it may contain only letters, digits, '.', '_' and '-'");
	assert_int_equal(bad, ' ');
	/* only n bytes are read: the '/' after them does not count */
	assert_null(job_name_problem("ab/", 2, &bad));
	/* a NUL inside the counted bytes is a bad character */
	bad = 'x';
	assert_non_null(job_name_problem("a\0b", 3, &bad));
	assert_int_equal(bad, '\0');
}

/* The backup tier takes job names from mtcfs-admin --job and its callers:
 * the same answer for every case. */
static void test_backup_agrees(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (bk_job_name_ok(cases[i].name) != cases[i].ok)
			fail_msg("bk_job_name_ok(\"%s\") is %d", cases[i].name, !cases[i].ok);
}

/* replicator.yaml's job-name (double-quoted, escapes for the control
 * characters) is accepted exactly when the rule says. Names that read as
 * integers are renamed by GKE's rule ("0" stays "0"). */
static void test_rcfg_agrees(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char yaml[512], q[64], err[1024];
		struct rcfg c;
		size_t o = 0;
		int rc;

		for (const char *p = cases[i].name; *p && o + 5 < sizeof q; p++) {
			if (*p == '\t' || *p == '\n' || *p == '\\' || *p == '"')
				o += (size_t)snprintf(q + o, sizeof q - o, "\\%c",
				                      *p == '\t' ? 't' : *p == '\n' ? 'n' : *p);
			else
				q[o++] = *p;
		}
		q[o] = '\0';
		snprintf(yaml, sizeof yaml, "job-name: \"%s\"\nnode-rank: 0\nnodes: 1\n", q);
		rc = rcfg_parse(yaml, strlen(yaml), NULL, &c, err, sizeof err);
		if ((rc == 0) != cases[i].ok)
			fail_msg("job-name \"%s\": rcfg_parse %d (%s)", cases[i].name, rc, err);
		if (rc == 0) {
			assert_string_equal(c.job, cases[i].name);
			rcfg_free(&c);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rule),
		cmocka_unit_test(test_length),
		cmocka_unit_test(test_reasons),
		cmocka_unit_test(test_backup_agrees),
		cmocka_unit_test(test_rcfg_agrees),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
