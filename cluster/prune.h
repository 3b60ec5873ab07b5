/* prune: the retention policy for a job's backups (mtcfs-admin prune, like
 * restic/borg "forget"), as a pure function of the backups' names, their
 * completeness and restore.version: no I/O, no clock, no time zone. Names
 * are UTC timestamps "YYYY-MM-DD_HH-MM[-N]" and are read as such (integer
 * calendar arithmetic, never localtime/mktime). Any thread may call it; the
 * caller owns the items and every string they point to.
 *
 * The plan (prune_plan):
 *   - Policy candidates are the COMPLETE backups with a timestamp name.
 *     --keep-last N keeps the newest N of them. --keep-hourly/daily/weekly/
 *     monthly/yearly N: the candidates are grouped by UTC hour, day, ISO 8601
 *     week (Monday..Sunday, the week-based year: 2027-01-01 is in 2026-W53),
 *     month, year; the N newest periods that hold a candidate each keep one
 *     representative: its OLDEST backup by default (the first backup of the
 *     period stays its representative as newer ones arrive), its NEWEST with
 *     prefer_recent (restic's and borg's choice). "-N" names order after the
 *     name without a suffix of the same minute, and "-3" after "-2".
 *   - Never pruned, whatever the policy: the backup a restore from the bucket
 *     would use (restore.version's backup if it names a complete one, else
 *     the newest complete backup); the backup restore.version names (even if
 *     incomplete or missing); the newest complete backup; incomplete backups
 *     newer than the newest complete one (they may still be uploading; all
 *     incomplete ones when none is complete); names that are not timestamps;
 *     items the caller holds.
 *   - incomplete_before (--incomplete-older-than): an incomplete backup that
 *     started (its name's minute) before that Unix time loses the "may be
 *     in progress" protection: failed attempts newer than the newest
 *     complete backup (or with none complete) stop accumulating. Never a
 *     complete one, and never the newest incomplete backup newer than the
 *     newest complete one (the attempt that may be uploading now), nor one
 *     the protections above keep (restore.version's, held, undated).
 *   - Everything else is pruned: complete backups no rule keeps, and
 *     incomplete ones older than the newest complete backup. */
#ifndef MTCFS_TIERS_PRUNE_H
#define MTCFS_TIERS_PRUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum prune_kind {
	PRUNE_LAST,
	PRUNE_HOURLY,
	PRUNE_DAILY,
	PRUNE_WEEKLY,
	PRUNE_MONTHLY,
	PRUNE_YEARLY,
	PRUNE_NKINDS
};

/* "last", "hourly", ..., "yearly" (static strings). */
const char *prune_kind_name(enum prune_kind k);

struct prune_policy {
	unsigned keep[PRUNE_NKINDS];   /* periods (backups for LAST) to keep; 0: rule off */
	bool prefer_recent;            /* a period's newest backup represents it, not its oldest */
	int64_t incomplete_before;     /* Unix time (UTC); 0: rule off (see above) */
};

/* Why a backup is kept: bit (1u << kind) for each policy rule that keeps it,
 * and these protections. */
#define PRUNE_RESTORE_PICK      (1u << 8)    /* a restore from the bucket would use it */
#define PRUNE_RESTORE_VERSION   (1u << 9)    /* restore.version names it */
#define PRUNE_NEWEST_COMPLETE   (1u << 10)
#define PRUNE_IN_PROGRESS       (1u << 11)   /* incomplete, newer than the newest complete */
#define PRUNE_UNDATED           (1u << 12)   /* not a timestamp name */
#define PRUNE_HELD              (1u << 13)   /* the caller's hold */

#define PRUNE_LABEL_MAX 16

struct prune_item {
	/* in */
	const char *name;
	bool complete;
	bool hold;                     /* never prune (the caller's reason) */
	const char *hold_why;          /* that reason in words for why[] (NULL: "held") */
	/* out */
	bool keep;
	unsigned flags;                /* the PRUNE_* reasons it is kept (0 when pruned) */
	unsigned last_rank;            /* with PRUNE_LAST: 1 = the newest candidate */
	char label[PRUNE_NKINDS][PRUNE_LABEL_MAX]; /* the period it represents, per rule that keeps it:
						    * "2027-01-01T00", "2027-01-01", "2026-W53",
						    * "2027-01", "2027" */
	char why[256];                 /* the reasons in words, e.g. "last #1, daily 2027-01-01,
					* restore pick" or "not kept by the policy" */
};

struct prune_result {
	long restore_pick;             /* index of the backup a restore would use, or -1 */
	long newest_complete;          /* index, or -1 */
	size_t kept, pruned;
};

/* A timestamp name, its UTC parts (n: the "-N" suffix, 1 without). */
struct prune_time {
	int year, month, day, hour, minute;
	unsigned n;
};

/* Parse "YYYY-MM-DD_HH-MM[-N]" (N in 2..9999, no leading zero; a real date
 * and time of day). False for anything else. */
bool prune_parse_name(const char *name, struct prune_time *t);
/* The period of kind k (not PRUNE_LAST) holding t, as a number that orders
 * periods (larger = newer), and its label into label[PRUNE_LABEL_MAX]
 * (may be NULL). ISO weeks belong to their week-based year. */
int64_t prune_period(const struct prune_time *t, enum prune_kind k, char *label);
/* The Unix time (UTC) of t's minute (the "-N" suffix does not count). */
int64_t prune_time_unix(const struct prune_time *t);
/* Newest first: timestamp names by (minute, N) descending, then the other
 * names in descending byte order (the order of bk_list_backups). */
int prune_name_cmp(const char *a, const char *b);

/* Decide, for v[0..n) in any order (names distinct), which backups to keep.
 * restore_version: the name restore.version holds, or NULL when it is
 * absent; rv_invalid: it exists but names no backup (nothing would be
 * restored). Fills every item's outputs and *r (may be NULL).
 * 0, or -ENOMEM (outputs undefined). */
int prune_plan(const struct prune_policy *p, const char *restore_version, bool rv_invalid,
	       struct prune_item *v, size_t n, struct prune_result *r);

/* The backup a restore from the bucket would use (same rule as above, without
 * a policy): its index or -1. Allocates nothing. */
long prune_restore_pick(const struct prune_item *v, size_t n, const char *restore_version,
			bool rv_invalid);

#endif
