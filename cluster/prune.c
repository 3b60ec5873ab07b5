/* prune: the retention policy for backups (see prune.h). */
#include "cluster/prune.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[PRUNE_NKINDS] = {
	"last", "hourly", "daily", "weekly", "monthly", "yearly",
};

const char *prune_kind_name(enum prune_kind k)
{
	return (unsigned)k < PRUNE_NKINDS ? kind_names[k] : "?";
}

/* ---- calendar arithmetic (proleptic Gregorian, UTC; no libc time zone) ---- */

static bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static int month_days(int y, int m)
{
	static const int d[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	return m == 2 && leap(y) ? 29 : d[m - 1];
}

/* Days since 1970-01-01 (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static int64_t year_of_days(int64_t z)
{
	int64_t era, doe, yoe, doy, mp;

	z += 719468;
	era = (z >= 0 ? z : z - 146096) / 146097;
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	return yoe + era * 400 + (mp >= 10);   /* months from March: Jan, Feb are next year's */
}

/* ISO 8601 week: the week-based year and the week 1..53. */
static void iso_week(const struct prune_time *t, int64_t *wyear, int *week)
{
	int64_t days = days_from_civil(t->year, t->month, t->day);
	int64_t wd = ((days % 7) + 7 + 3) % 7 + 1;    /* 1970-01-01 was a Thursday (4); Monday = 1 */
	int64_t thursday = days + (4 - wd);           /* the week belongs to its Thursday's year */
	int64_t y = year_of_days(thursday);

	*wyear = y;
	*week = (int)((thursday - days_from_civil(y, 1, 1)) / 7 + 1);
}

static bool digits(const char *s, size_t n, int *out)
{
	int v = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	*out = v;
	return true;
}

bool prune_parse_name(const char *s, struct prune_time *t)
{
	struct prune_time x = { 0 };
	int suffix = 0;
	size_t sl;

	if (!s || strnlen(s, 24) < 16 || s[4] != '-' || s[7] != '-' || s[10] != '_' || s[13] != '-' ||
	    !digits(s, 4, &x.year) || !digits(s + 5, 2, &x.month) || !digits(s + 8, 2, &x.day) ||
	    !digits(s + 11, 2, &x.hour) || !digits(s + 14, 2, &x.minute))
		return false;
	if (x.month < 1 || x.month > 12 || x.day < 1 || x.day > month_days(x.year, x.month) ||
	    x.hour > 23 || x.minute > 59)
		return false;
	x.n = 1;
	if (s[16] != '\0') {
		sl = strnlen(s + 17, 6);
		if (s[16] != '-' || sl < 1 || sl > 4 || s[17] == '0' || !digits(s + 17, sl, &suffix) ||
		    suffix < 2)
			return false;
		x.n = (unsigned)suffix;
	}
	if (t)
		*t = x;
	return true;
}

int64_t prune_period(const struct prune_time *t, enum prune_kind k, char *label)
{
	char tmp[PRUNE_LABEL_MAX];
	char *l = label ? label : tmp;
	int64_t wy;
	int w;

	switch (k) {
	case PRUNE_HOURLY:
		snprintf(l, PRUNE_LABEL_MAX, "%04d-%02d-%02dT%02d", t->year, t->month, t->day, t->hour);
		return days_from_civil(t->year, t->month, t->day) * 24 + t->hour;
	case PRUNE_DAILY:
		snprintf(l, PRUNE_LABEL_MAX, "%04d-%02d-%02d", t->year, t->month, t->day);
		return days_from_civil(t->year, t->month, t->day);
	case PRUNE_WEEKLY:
		iso_week(t, &wy, &w);
		snprintf(l, PRUNE_LABEL_MAX, "%04d-W%02d", (int)wy, w);
		return wy * 100 + w;
	case PRUNE_MONTHLY:
		snprintf(l, PRUNE_LABEL_MAX, "%04d-%02d", t->year, t->month);
		return (int64_t)t->year * 12 + t->month - 1;
	case PRUNE_YEARLY:
		snprintf(l, PRUNE_LABEL_MAX, "%04d", t->year);
		return t->year;
	default:
		l[0] = '\0';
		return 0;
	}
}

int64_t prune_time_unix(const struct prune_time *t)
{
	return days_from_civil(t->year, t->month, t->day) * 86400 + t->hour * 3600 + t->minute * 60;
}

int prune_name_cmp(const char *a, const char *b)
{
	struct prune_time ta = { 0 }, tb = { 0 };
	bool da = prune_parse_name(a, &ta), db = prune_parse_name(b, &tb);
	int c;

	if (da != db)
		return da ? -1 : 1;
	if (!da)
		return strcmp(b, a);
	c = strncmp(b, a, 16);                 /* fixed-width digits: bytewise = chronological */
	if (c)
		return c;
	return ta.n < tb.n ? 1 : ta.n > tb.n ? -1 : 0;
}

long prune_restore_pick(const struct prune_item *v, size_t n, const char *restore_version,
			bool rv_invalid)
{
	long best = -1;

	if (rv_invalid)
		return -1;                     /* the daemon restores nothing then */
	if (restore_version) {
		for (size_t i = 0; i < n; i++)
			if (!strcmp(v[i].name, restore_version))
				return v[i].complete ? (long)i : -1;   /* no fallback */
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		if (v[i].complete && (best < 0 || prune_name_cmp(v[i].name, v[best].name) < 0))
			best = (long)i;
	return best;
}

/* ---- the plan ---- */

struct ent {
	struct prune_item *it;
	struct prune_time t;
	bool dated;
};

static int ent_cmp(const void *pa, const void *pb)
{
	return prune_name_cmp(((const struct ent *)pa)->it->name, ((const struct ent *)pb)->it->name);
}

static void add_why(struct prune_item *it, const char *words)
{
	size_t l = strlen(it->why);

	if (l >= sizeof(it->why) - 1)
		return;
	if (l)
		l += (size_t)snprintf(it->why + l, sizeof(it->why) - l, ", ");
	if (l < sizeof(it->why))
		snprintf(it->why + l, sizeof(it->why) - l, "%s", words);
}

int prune_plan(const struct prune_policy *p, const char *restore_version, bool rv_invalid,
	       struct prune_item *v, size_t n, struct prune_result *r)
{
	struct ent *e = NULL, **cand = NULL;
	bool *stale = NULL;          /* [index in v]: incomplete, past incomplete_before */
	size_t nc = 0, newest = n;   /* newest: position in e[] of the newest complete backup */
	size_t newest_ip = n;        /* position in e[] of the newest dated incomplete before it */
	long pick;
	struct prune_result res = { .restore_pick = -1, .newest_complete = -1 };

	e = calloc(n ? n : 1, sizeof(*e));
	cand = calloc(n ? n : 1, sizeof(*cand));
	stale = calloc(n ? n : 1, sizeof(*stale));
	if (!e || !cand || !stale) {
		free(e);
		free(cand);
		free(stale);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		struct prune_item *it = &v[i];
		it->keep = false;
		it->flags = 0;
		it->last_rank = 0;
		memset(it->label, 0, sizeof(it->label));
		it->why[0] = '\0';
		e[i].it = it;
		e[i].dated = prune_parse_name(it->name, &e[i].t);
	}
	if (n)
		qsort(e, n, sizeof(*e), ent_cmp);
	for (size_t i = 0; i < n; i++) {
		if (e[i].it->complete && newest == n)
			newest = i;
		if (e[i].it->complete && e[i].dated)
			cand[nc++] = &e[i];
	}
	for (size_t i = 0; i < newest && newest_ip == n; i++)
		if (!e[i].it->complete && e[i].dated)
			newest_ip = i;

	/* the policy, over complete timestamped backups, newest first */
	for (size_t i = 0; i < nc && i < p->keep[PRUNE_LAST]; i++) {
		cand[i]->it->flags |= 1u << PRUNE_LAST;
		cand[i]->it->last_rank = (unsigned)i + 1;
	}
	for (int k = PRUNE_HOURLY; k < PRUNE_NKINDS; k++) {
		unsigned periods = 0;
		size_t i = 0;

		while (i < nc && periods < p->keep[k]) {
			char label[PRUNE_LABEL_MAX];
			int64_t per = prune_period(&cand[i]->t, (enum prune_kind)k, label);
			size_t j = i;
			struct prune_item *rep;

			/* newest first: one period's backups are adjacent */
			while (j + 1 < nc && prune_period(&cand[j + 1]->t, (enum prune_kind)k, NULL) == per)
				j++;
			rep = (p->prefer_recent ? cand[i] : cand[j])->it;
			rep->flags |= 1u << k;
			snprintf(rep->label[k], PRUNE_LABEL_MAX, "%s", label);
			periods++;
			i = j + 1;
		}
	}

	/* the protections */
	pick = prune_restore_pick(v, n, restore_version, rv_invalid);
	res.restore_pick = pick;
	if (pick >= 0)
		v[pick].flags |= PRUNE_RESTORE_PICK;
	for (size_t i = 0; i < n; i++) {
		struct prune_item *it = e[i].it;
		if (restore_version && !strcmp(it->name, restore_version))
			it->flags |= PRUNE_RESTORE_VERSION;
		if (i == newest) {
			it->flags |= PRUNE_NEWEST_COMPLETE;
			res.newest_complete = it - v;
		}
		if (!it->complete && i < newest) {
			if (p->incomplete_before && e[i].dated && i != newest_ip &&
			    prune_time_unix(&e[i].t) < p->incomplete_before)
				stale[it - v] = true;
			else
				it->flags |= PRUNE_IN_PROGRESS;
		}
		if (!e[i].dated)
			it->flags |= PRUNE_UNDATED;
		if (it->hold)
			it->flags |= PRUNE_HELD;
	}

	/* verdicts and words */
	for (size_t i = 0; i < n; i++) {
		struct prune_item *it = &v[i];
		char buf[32];

		it->keep = it->flags != 0;
		if (it->flags & (1u << PRUNE_LAST)) {
			snprintf(buf, sizeof(buf), "last #%u", it->last_rank);
			add_why(it, buf);
		}
		for (int k = PRUNE_HOURLY; k < PRUNE_NKINDS; k++) {
			if (it->flags & (1u << k)) {
				snprintf(buf, sizeof(buf), "%s %s", kind_names[k], it->label[k]);
				add_why(it, buf);
			}
		}
		if (it->flags & PRUNE_RESTORE_PICK)
			add_why(it, "restore pick");
		if (it->flags & PRUNE_RESTORE_VERSION)
			add_why(it, "named by restore.version");
		if (it->flags & PRUNE_NEWEST_COMPLETE)
			add_why(it, "newest complete");
		if (it->flags & PRUNE_IN_PROGRESS)
			add_why(it, "incomplete but newer than the newest complete (may be in progress)");
		if (it->flags & PRUNE_UNDATED)
			add_why(it, "not a timestamp name");
		if (it->flags & PRUNE_HELD)
			add_why(it, it->hold_why ? it->hold_why : "held");
		if (!it->keep)
			add_why(it, it->complete ? "not kept by the policy"
				    : stale[i] ? "incomplete, started before the age limit "
						 "(a failed attempt, not the newest)"
					       : "incomplete, older than the newest complete backup");
		if (it->keep)
			res.kept++;
		else
			res.pruned++;
	}
	if (r)
		*r = res;
	free(e);
	free(cand);
	free(stale);
	return 0;
}
