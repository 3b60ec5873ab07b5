/* Unit tests for cluster/prune: the retention policy over synthetic backup
 * names. Calendar boundaries (hour, day, ISO week across a year change,
 * month, year), "-N" names, keep-last combined with period rules, the
 * protections, oldest-vs-newest representatives, and no dependence on the
 * local time zone. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cluster/prune.h"

#define MAXB 64

/* Names in any order; a leading '!' marks an incomplete backup, '^' one the
 * caller holds. kept: the kept names, space-separated, in input order. */
struct run {
	struct prune_item it[MAXB];
	char names[MAXB][64];
	size_t n;
	struct prune_result res;
	char kept[4096];
};

static void plan_rv(struct run *r, const struct prune_policy *p, const char *rv, bool rv_invalid,
		    const char *const *names)
{
	size_t l = 0;

	memset(r, 0, sizeof(*r));
	for (; names[r->n]; r->n++) {
		const char *s = names[r->n];
		struct prune_item *it = &r->it[r->n];
		it->complete = true;
		for (;; s++) {
			if (*s == '!')
				it->complete = false;
			else if (*s == '^')
				it->hold = true;
			else
				break;
		}
		snprintf(r->names[r->n], sizeof(r->names[0]), "%s", s);
		it->name = r->names[r->n];
	}
	assert_int_equal(prune_plan(p, rv, rv_invalid, r->it, r->n, &r->res), 0);
	for (size_t i = 0; i < r->n; i++) {
		assert_true(r->it[i].why[0] != '\0');
		if (r->it[i].keep)
			l += (size_t)snprintf(r->kept + l, sizeof(r->kept) - l, "%s%s", l ? " " : "",
					      r->it[i].name);
	}
	assert_int_equal(r->res.kept + r->res.pruned, r->n);
}

static void plan(struct run *r, const struct prune_policy *p, const char *const *names)
{
	plan_rv(r, p, NULL, false, names);
}

static const struct prune_item *find(const struct run *r, const char *name)
{
	for (size_t i = 0; i < r->n; i++)
		if (!strcmp(r->it[i].name, name))
			return &r->it[i];
	fail_msg("no %s", name);
	return NULL;
}

/* ---- names and periods ---- */

static void test_parse_names(void **state)
{
	struct prune_time t;

	(void)state;
	assert_true(prune_parse_name("2026-12-31_23-59", &t));
	assert_int_equal(t.year, 2026);
	assert_int_equal(t.month, 12);
	assert_int_equal(t.day, 31);
	assert_int_equal(t.hour, 23);
	assert_int_equal(t.minute, 59);
	assert_int_equal(t.n, 1);
	assert_true(prune_parse_name("2024-02-29_00-00-2", &t));
	assert_int_equal(t.n, 2);
	assert_true(prune_parse_name("2024-02-29_00-00-9999", &t));
	assert_int_equal(t.n, 9999);
	assert_true(prune_parse_name("2000-02-29_00-00", NULL));
	assert_false(prune_parse_name("1900-02-29_00-00", NULL));    /* not a leap year */
	assert_false(prune_parse_name("2026-02-29_00-00", NULL));
	assert_false(prune_parse_name("2026-04-31_00-00", NULL));
	assert_false(prune_parse_name("2026-13-01_00-00", NULL));
	assert_false(prune_parse_name("2026-00-01_00-00", NULL));
	assert_false(prune_parse_name("2026-01-00_00-00", NULL));
	assert_false(prune_parse_name("2026-01-01_24-00", NULL));
	assert_false(prune_parse_name("2026-01-01_00-60", NULL));
	assert_false(prune_parse_name("2026-01-01_00-00-1", NULL));
	assert_false(prune_parse_name("2026-01-01_00-00-02", NULL));
	assert_false(prune_parse_name("2026-01-01_00-00-10000", NULL));
	assert_false(prune_parse_name("2026-01-01_00-00-", NULL));
	assert_false(prune_parse_name("2026-01-01_00-00x", NULL));
	assert_false(prune_parse_name("2026-01-01T00-00", NULL));
	assert_false(prune_parse_name("2026-01-01_00-0", NULL));
	assert_false(prune_parse_name("manual-save", NULL));
	assert_false(prune_parse_name("", NULL));
}

static void test_order(void **state)
{
	(void)state;
	assert_true(prune_name_cmp("2026-01-01_00-01", "2026-01-01_00-00") < 0);
	assert_true(prune_name_cmp("2026-01-01_00-00-2", "2026-01-01_00-00") < 0);
	assert_true(prune_name_cmp("2026-01-01_00-00-10", "2026-01-01_00-00-9") < 0);
	assert_true(prune_name_cmp("2026-01-01_00-00-9", "2026-01-01_00-00-10") > 0);
	assert_true(prune_name_cmp("2026-01-01_00-01", "2026-01-01_00-00-99") < 0);
	assert_true(prune_name_cmp("2027-01-01_00-00", "2026-12-31_23-59") < 0);
	assert_true(prune_name_cmp("1999-01-01_00-00", "zzz") < 0);        /* undated last */
	assert_true(prune_name_cmp("zzz", "aaa") < 0);
	assert_int_equal(prune_name_cmp("2026-01-01_00-00", "2026-01-01_00-00"), 0);
}

static void check_week(const char *name, const char *want)
{
	struct prune_time t;
	char label[PRUNE_LABEL_MAX];

	assert_true(prune_parse_name(name, &t));
	prune_period(&t, PRUNE_WEEKLY, label);
	if (strcmp(label, want))
		fail_msg("%s: week %s, want %s", name, label, want);
}

static void test_iso_weeks(void **state)
{
	(void)state;
	/* expected values from Python's date.isocalendar() */
	check_week("2026-12-28_00-00", "2026-W53");   /* Monday */
	check_week("2026-12-31_23-59", "2026-W53");   /* Thursday */
	check_week("2027-01-01_00-00", "2026-W53");   /* Friday: still 2026's week 53 */
	check_week("2027-01-03_23-59", "2026-W53");   /* Sunday */
	check_week("2027-01-04_00-00", "2027-W01");   /* Monday */
	check_week("2024-12-29_12-00", "2024-W52");   /* Sunday */
	check_week("2024-12-30_00-00", "2025-W01");   /* Monday: 2025's week 1 */
	check_week("2025-01-01_00-00", "2025-W01");
	check_week("2020-12-31_00-00", "2020-W53");
	check_week("2021-01-03_00-00", "2020-W53");
	check_week("2021-01-04_00-00", "2021-W01");
	check_week("2026-01-01_00-00", "2026-W01");   /* a Thursday */
	check_week("2025-12-29_00-00", "2026-W01");
	check_week("2000-02-29_00-00", "2000-W09");
	check_week("1970-01-01_00-00", "1970-W01");
}

static void test_period_labels(void **state)
{
	struct prune_time t;
	char l[PRUNE_LABEL_MAX];

	(void)state;
	assert_true(prune_parse_name("2027-01-01_00-10-3", &t));
	prune_period(&t, PRUNE_HOURLY, l);
	assert_string_equal(l, "2027-01-01T00");
	prune_period(&t, PRUNE_DAILY, l);
	assert_string_equal(l, "2027-01-01");
	prune_period(&t, PRUNE_MONTHLY, l);
	assert_string_equal(l, "2027-01");
	prune_period(&t, PRUNE_YEARLY, l);
	assert_string_equal(l, "2027");
	assert_string_equal(prune_kind_name(PRUNE_WEEKLY), "weekly");
}

/* ---- the policy ---- */

static void test_hourly_boundary(void **state)
{
	static const char *const names[] = {
		"2026-12-31_22-05", "2026-12-31_22-59", "2026-12-31_23-00", "2026-12-31_23-59",
		"2027-01-01_00-00", "2027-01-01_00-01", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_HOURLY] = 2 };
	struct run r;

	/* oldest of each of the 2 newest hours (00h, 23h); 00-01 is the newest complete */
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-31_23-00 2027-01-01_00-00 2027-01-01_00-01");
	assert_string_equal(find(&r, "2027-01-01_00-00")->label[PRUNE_HOURLY], "2027-01-01T00");
	assert_string_equal(find(&r, "2026-12-31_23-00")->why, "hourly 2026-12-31T23");
	assert_string_equal(find(&r, "2027-01-01_00-01")->why, "restore pick, newest complete");
	assert_string_equal(find(&r, "2026-12-31_22-59")->why, "not kept by the policy");

	p.prefer_recent = true;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-31_23-59 2027-01-01_00-01");
	assert_string_equal(find(&r, "2027-01-01_00-01")->why,
			    "hourly 2027-01-01T00, restore pick, newest complete");
	assert_int_equal(r.res.kept, 2);
	assert_int_equal(r.res.pruned, 4);
}

static void test_daily_year_change(void **state)
{
	static const char *const names[] = {
		"2026-12-30_12-00", "2026-12-31_00-00", "2026-12-31_23-59",
		"2027-01-01_00-00", "2027-01-01_18-00", "2027-01-02_06-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_DAILY] = 3 };
	struct run r;

	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-31_00-00 2027-01-01_00-00 2027-01-02_06-00");
	p.prefer_recent = true;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-31_23-59 2027-01-01_18-00 2027-01-02_06-00");
	assert_string_equal(find(&r, "2026-12-31_23-59")->why, "daily 2026-12-31");
	/* more periods asked than there are: every day keeps one */
	p.keep[PRUNE_DAILY] = 100;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-30_12-00 2026-12-31_23-59 2027-01-01_18-00 2027-01-02_06-00");
}

static void test_weekly_iso_year_change(void **state)
{
	/* 2026-12-28 (Mon) .. 2027-01-03 (Sun) is 2026-W53; 2027-01-04 starts 2027-W01 */
	static const char *const names[] = {
		"2026-12-20_00-00",                       /* 2026-W51 */
		"2026-12-27_23-59",                       /* 2026-W52 (Sunday) */
		"2026-12-28_00-00", "2026-12-31_12-00", "2027-01-01_00-00", "2027-01-03_23-59",
		"2027-01-04_00-00", "2027-01-05_00-00",   /* 2027-W01 */
		NULL,
	};
	struct prune_policy p = { .keep[PRUNE_WEEKLY] = 3 };
	struct run r;

	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-27_23-59 2026-12-28_00-00 2027-01-04_00-00 2027-01-05_00-00");
	assert_string_equal(find(&r, "2026-12-28_00-00")->label[PRUNE_WEEKLY], "2026-W53");
	assert_string_equal(find(&r, "2027-01-04_00-00")->label[PRUNE_WEEKLY], "2027-W01");
	assert_string_equal(find(&r, "2026-12-27_23-59")->label[PRUNE_WEEKLY], "2026-W52");
	p.prefer_recent = true;
	plan(&r, &p, names);
	/* the year change inside W53 does not split the week */
	assert_string_equal(r.kept, "2026-12-27_23-59 2027-01-03_23-59 2027-01-05_00-00");
	/* whereas yearly does split there */
	p = (struct prune_policy){ .keep[PRUNE_YEARLY] = 2 };
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-12-20_00-00 2027-01-01_00-00 2027-01-05_00-00");
}

static void test_monthly_yearly(void **state)
{
	static const char *const names[] = {
		"2024-02-29_23-59", "2024-03-01_00-00", "2024-12-31_23-59", "2025-01-31_10-00",
		"2025-02-01_00-00", "2025-02-28_00-00", "2026-06-15_00-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_MONTHLY] = 4 };
	struct run r;

	plan(&r, &p, names);
	assert_string_equal(r.kept, "2024-12-31_23-59 2025-01-31_10-00 2025-02-01_00-00 2026-06-15_00-00");
	p.prefer_recent = true;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2024-12-31_23-59 2025-01-31_10-00 2025-02-28_00-00 2026-06-15_00-00");
	p = (struct prune_policy){ .keep[PRUNE_YEARLY] = 10 };
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2024-02-29_23-59 2025-01-31_10-00 2026-06-15_00-00");
	assert_string_equal(find(&r, "2024-02-29_23-59")->why, "yearly 2024");
	p.prefer_recent = true;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2024-12-31_23-59 2025-02-28_00-00 2026-06-15_00-00");
}

static void test_suffixed_names(void **state)
{
	static const char *const names[] = {
		"2026-05-05_05-05-2", "2026-05-05_05-05", "2026-05-05_05-05-10", "2026-05-05_05-05-3",
		"2026-05-05_04-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_HOURLY] = 1, .keep[PRUNE_LAST] = 2 };
	struct run r;

	/* newest: -10, -3, -2, (none), then 04-00; the oldest of 05h is the unsuffixed one */
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-05-05_05-05 2026-05-05_05-05-10 2026-05-05_05-05-3");
	assert_string_equal(find(&r, "2026-05-05_05-05-10")->why, "last #1, restore pick, newest complete");
	assert_string_equal(find(&r, "2026-05-05_05-05-3")->why, "last #2");
	assert_string_equal(find(&r, "2026-05-05_05-05")->why, "hourly 2026-05-05T05");
	p.prefer_recent = true;
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-05-05_05-05-10 2026-05-05_05-05-3");
	assert_string_equal(find(&r, "2026-05-05_05-05-10")->why,
			    "last #1, hourly 2026-05-05T05, restore pick, newest complete");
}

static void test_keep_last_with_others(void **state)
{
	static const char *const names[] = {
		"2026-03-01_00-00", "2026-03-02_00-00", "2026-03-03_00-00", "2026-03-03_12-00",
		"2026-03-04_00-00", "2026-03-04_06-00", "2026-03-04_12-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_LAST] = 2, .keep[PRUNE_DAILY] = 3, .prefer_recent = true };
	struct run r;

	plan(&r, &p, names);
	/* last 2: 04_12, 04_06; daily (newest of day): 04_12, 03_12, 02_00 -> union */
	assert_string_equal(r.kept, "2026-03-02_00-00 2026-03-03_12-00 2026-03-04_06-00 2026-03-04_12-00");
	assert_string_equal(find(&r, "2026-03-04_12-00")->why,
			    "last #1, daily 2026-03-04, restore pick, newest complete");
	assert_int_equal(find(&r, "2026-03-04_12-00")->flags & ((1u << PRUNE_LAST) | (1u << PRUNE_DAILY)),
			 (1u << PRUNE_LAST) | (1u << PRUNE_DAILY));
	p.keep[PRUNE_LAST] = 100;   /* more than there are */
	plan(&r, &p, names);
	assert_int_equal(r.res.pruned, 0);
}

static void test_incomplete_are_not_candidates(void **state)
{
	/* incomplete backups never count for a rule or represent a period */
	static const char *const names[] = {
		"2026-03-01_00-00", "!2026-03-01_06-00", "2026-03-02_00-00", "!2026-03-02_00-00-2",
		"2026-03-03_00-00", "!2026-03-03_01-00", "!2026-03-03_02-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_LAST] = 2 };
	struct run r;

	plan(&r, &p, names);
	/* newest complete 03_00; the incomplete ones after it may be in progress */
	assert_string_equal(r.kept, "2026-03-02_00-00 2026-03-03_00-00 2026-03-03_01-00 2026-03-03_02-00");
	assert_string_equal(find(&r, "2026-03-01_06-00")->why,
			    "incomplete, older than the newest complete backup");
	assert_true(find(&r, "2026-03-03_02-00")->flags & PRUNE_IN_PROGRESS);
	assert_int_equal(r.res.newest_complete, 4);
	assert_int_equal(r.res.restore_pick, 4);
	p = (struct prune_policy){ .keep[PRUNE_DAILY] = 2 };
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-03-02_00-00 2026-03-03_00-00 2026-03-03_01-00 2026-03-03_02-00");
}

static void test_protections(void **state)
{
	static const char *const names[] = {
		"2026-01-01_00-00", "2026-01-02_00-00", "!2026-01-03_00-00", "2026-01-04_00-00",
		"2026-01-05_00-00", "!2026-01-06_00-00", "manual", "!^2026-01-02_12-00", NULL,
	};
	struct prune_policy p = { .keep[PRUNE_LAST] = 1 };
	struct run r;

	/* restore.version names a complete older backup: that is the restore pick */
	plan_rv(&r, &p, "2026-01-02_00-00", false, names);
	assert_string_equal(r.kept, "2026-01-02_00-00 2026-01-05_00-00 2026-01-06_00-00 manual "
				    "2026-01-02_12-00");
	assert_string_equal(find(&r, "2026-01-02_00-00")->why, "restore pick, named by restore.version");
	assert_string_equal(find(&r, "2026-01-05_00-00")->why, "last #1, newest complete");
	assert_string_equal(find(&r, "manual")->why, "not a timestamp name");
	assert_string_equal(find(&r, "2026-01-02_12-00")->why, "held");
	assert_int_equal(r.res.restore_pick, 1);

	/* it names an incomplete backup: kept, and nothing would be restored */
	plan_rv(&r, &p, "2026-01-03_00-00", false, names);
	assert_string_equal(r.kept, "2026-01-03_00-00 2026-01-05_00-00 2026-01-06_00-00 manual "
				    "2026-01-02_12-00");
	assert_string_equal(find(&r, "2026-01-03_00-00")->why, "named by restore.version");
	assert_int_equal(r.res.restore_pick, -1);
	assert_int_equal(prune_restore_pick(r.it, r.n, "2026-01-03_00-00", false), -1);

	/* it names a backup that is not there: no restore, the newest complete kept */
	plan_rv(&r, &p, "2025-01-01_00-00", false, names);
	assert_int_equal(r.res.restore_pick, -1);
	assert_string_equal(r.kept, "2026-01-05_00-00 2026-01-06_00-00 manual 2026-01-02_12-00");
	plan_rv(&r, &p, NULL, true, names);
	assert_int_equal(r.res.restore_pick, -1);
	assert_string_equal(r.kept, "2026-01-05_00-00 2026-01-06_00-00 manual 2026-01-02_12-00");

	/* a policy that would keep nothing newer still keeps the newest complete */
	p = (struct prune_policy){ .keep[PRUNE_YEARLY] = 1 };
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2026-01-01_00-00 2026-01-05_00-00 2026-01-06_00-00 manual "
				    "2026-01-02_12-00");
	assert_string_equal(find(&r, "2026-01-05_00-00")->why, "restore pick, newest complete");

	/* nothing complete: every incomplete one may be in progress */
	static const char *const none[] = { "!2026-01-01_00-00", "!2026-01-02_00-00", NULL };
	plan(&r, &p, none);
	assert_string_equal(r.kept, "2026-01-01_00-00 2026-01-02_00-00");
	assert_int_equal(r.res.newest_complete, -1);
	assert_int_equal(r.res.restore_pick, -1);

	/* no backups at all */
	static const char *const empty[] = { NULL };
	plan(&r, &p, empty);
	assert_int_equal(r.res.kept + r.res.pruned, 0);
	assert_int_equal(r.res.restore_pick, -1);
}

static void test_restore_pick_order(void **state)
{
	static const char *const names[] = {
		"zzz-manual", "2026-01-01_00-00", "!2026-01-02_00-00", "2026-01-01_00-00-2", NULL,
	};
	static const char *const undated_only[] = { "!2026-01-02_00-00", "b", "a", NULL };
	struct prune_policy p = { .keep[PRUNE_LAST] = 1 };
	struct run r;

	plan(&r, &p, names);
	assert_int_equal(r.res.restore_pick, 3);       /* "-2" is newer; dated before undated */
	assert_int_equal(r.res.newest_complete, 3);
	/* only undated complete ones: the bytewise last is the pick (bk_list_backups' order) */
	plan(&r, &p, undated_only);
	assert_int_equal(r.res.restore_pick, 1);
	assert_string_equal(r.kept, "2026-01-02_00-00 b a");
}

/* The same plan whatever the local time zone: names are UTC. */
static void tz_plan(const char *tz, char *out, size_t len)
{
	static const char *const names[] = {
		"2026-12-31_10-59", "2026-12-31_11-00", "2026-12-31_11-30", "2026-12-31_23-59",
		"2027-01-01_00-00", "2027-01-03_23-59", "2027-01-04_00-00", "2027-03-28_01-30",
		"2027-03-28_02-30", "2027-09-26_01-59", "2027-09-26_03-00", "2027-12-31_23-59",
		"2028-01-01_00-00", NULL,
	};
	static const int policies[][7] = {   /* last, hourly, daily, weekly, monthly, yearly, recent */
		{ 0, 3, 0, 0, 0, 0, 0 }, { 0, 0, 4, 0, 0, 0, 0 }, { 0, 0, 0, 3, 0, 0, 1 },
		{ 0, 0, 0, 0, 3, 0, 0 }, { 0, 0, 0, 0, 0, 3, 1 }, { 1, 2, 2, 2, 2, 2, 0 },
	};
	struct run *r = malloc(sizeof(*r));
	size_t l = 0;

	assert_non_null(r);
	if (tz)
		setenv("TZ", tz, 1);
	else
		unsetenv("TZ");
	tzset();
	for (size_t k = 0; k < sizeof(policies) / sizeof(policies[0]); k++) {
		struct prune_policy p = { .prefer_recent = policies[k][6] };
		for (int j = 0; j < PRUNE_NKINDS; j++)
			p.keep[j] = (unsigned)policies[k][j];
		plan(r, &p, names);
		l += (size_t)snprintf(out + l, len - l, "[%s]", r->kept);
		for (size_t i = 0; i < r->n; i++)
			l += (size_t)snprintf(out + l, len - l, "%s;", r->it[i].why);
	}
	free(r);
}

static void test_no_local_time(void **state)
{
	static char utc[16384], chatham[16384], posix[16384], la[16384];
	const char *old = getenv("TZ");
	char *saved = old ? strdup(old) : NULL;
	time_t t = 1798761540;   /* 2026-12-31 23:59 UTC */
	struct tm tm;

	(void)state;
	tz_plan("UTC", utc, sizeof(utc));
	tz_plan("Pacific/Chatham", chatham, sizeof(chatham));      /* +13:45 in December */
	/* the zone is really in effect (tzdata installed): it is 2027 there */
	assert_non_null(localtime_r(&t, &tm));
	assert_int_equal(tm.tm_year + 1900, 2027);
	assert_int_equal(tm.tm_min, 44);
	tz_plan("<+1245>-12:45<+1345>,M9.5.0/2:45,M4.1.0/3:45", posix, sizeof(posix)); /* no tzdata needed */
	assert_non_null(localtime_r(&t, &tm));
	assert_int_equal(tm.tm_year + 1900, 2027);
	tz_plan("America/Los_Angeles", la, sizeof(la));
	assert_string_equal(chatham, utc);
	assert_string_equal(posix, utc);
	assert_string_equal(la, utc);
	/* and the answer is the UTC one: hourly keeps 2028-01-01T00 etc. */
	assert_non_null(strstr(utc, "[2027-09-26_03-00 2027-12-31_23-59 2028-01-01_00-00]"));
	if (saved) {
		setenv("TZ", saved, 1);
		free(saved);
	} else {
		unsetenv("TZ");
	}
	tzset();
}

/* --incomplete-older-than: failed attempts stop accumulating; never a
 * complete backup, never the newest attempt that may be uploading, never
 * restore.version's or a held one; a start exactly at the cutoff stays. */
static void test_incomplete_older_than(void **state)
{
	(void)state;
	struct run r;
	struct prune_time t;
	struct prune_policy p = { .keep = { [PRUNE_LAST] = 1 } };
	const char *const names[] = { "2027-01-01_00-00", "!2027-01-01_01-00", "!2027-01-01_02-00",
				      "!2027-01-01_02-00-2", "!2027-01-01_03-00", NULL };

	assert_true(prune_parse_name("2027-01-01_02-30", &t));
	assert_int_equal(prune_time_unix(&t), 1798770600);   /* date -u -d '2027-01-01 02:30' +%s */
	/* rule off: every attempt newer than the newest complete is kept */
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2027-01-01_00-00 2027-01-01_01-00 2027-01-01_02-00 "
			    "2027-01-01_02-00-2 2027-01-01_03-00");
	/* cutoff 02:30: 01-00 and both 02-00 go, 03-00 is newer */
	p.incomplete_before = prune_time_unix(&t);
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2027-01-01_00-00 2027-01-01_03-00");
	assert_int_equal(r.res.pruned, 3);
	assert_non_null(strstr(find(&r, "2027-01-01_01-00")->why, "started before the age limit"));
	assert_false(find(&r, "2027-01-01_03-00")->flags & ~PRUNE_IN_PROGRESS);
	/* cutoff exactly 02:00: a start at the cutoff is not older than it */
	assert_true(prune_parse_name("2027-01-01_02-00", &t));
	p.incomplete_before = prune_time_unix(&t);
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2027-01-01_00-00 2027-01-01_02-00 2027-01-01_02-00-2 "
			    "2027-01-01_03-00");
	/* everything old: the newest attempt still stays, the complete one too */
	assert_true(prune_parse_name("2030-01-01_00-00", &t));
	p.incomplete_before = prune_time_unix(&t);
	plan(&r, &p, names);
	assert_string_equal(r.kept, "2027-01-01_00-00 2027-01-01_03-00");
	assert_true(find(&r, "2027-01-01_03-00")->flags & PRUNE_IN_PROGRESS);
	/* no complete backup at all: only the newest attempt is kept */
	{
		const char *const inc[] = { "!2027-01-01_01-00", "!2027-01-01_03-00",
					    "!2027-01-01_02-00", NULL };
		plan(&r, &p, inc);
		assert_string_equal(r.kept, "2027-01-01_03-00");
	}
	/* complete backups are the policy's alone: keep-last 3 keeps all 3 */
	{
		const char *const comp[] = { "2027-01-01_01-00", "2027-01-01_02-00",
					     "2027-01-01_03-00", NULL };
		struct prune_policy p3 = p;
		p3.keep[PRUNE_LAST] = 3;
		plan(&r, &p3, comp);
		assert_string_equal(r.kept, "2027-01-01_01-00 2027-01-01_02-00 2027-01-01_03-00");
	}
	/* restore.version's, a held one and an undated name stay */
	{
		const char *const prot[] = { "2027-01-01_00-00", "!2027-01-01_01-00",
					     "!^2027-01-01_02-00", "!manual", "!2027-01-01_03-00",
					     "!2027-01-01_04-00", NULL };
		plan_rv(&r, &p, "2027-01-01_01-00", false, prot);
		assert_string_equal(r.kept, "2027-01-01_00-00 2027-01-01_01-00 2027-01-01_02-00 "
				    "manual 2027-01-01_04-00");
		assert_false(find(&r, "2027-01-01_03-00")->keep);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_names),
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_iso_weeks),
		cmocka_unit_test(test_period_labels),
		cmocka_unit_test(test_hourly_boundary),
		cmocka_unit_test(test_daily_year_change),
		cmocka_unit_test(test_weekly_iso_year_change),
		cmocka_unit_test(test_monthly_yearly),
		cmocka_unit_test(test_suffixed_names),
		cmocka_unit_test(test_keep_last_with_others),
		cmocka_unit_test(test_incomplete_are_not_candidates),
		cmocka_unit_test(test_protections),
		cmocka_unit_test(test_restore_pick_order),
		cmocka_unit_test(test_no_local_time),
		cmocka_unit_test(test_incomplete_older_than),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
