/* Unit tests for tiers/lifecycle: the retention plan over synthetic shard
 * records (single node and cluster, restored step, pytorch workers, pins,
 * RAM pressure and other jobs, the abandoned timeline after a restore) and
 * the record writes on a real catalog in a private temporary directory. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include <cmocka.h>

#define TESTTMP_NAME "lifecycle"
#include "testtmp.h"

#include "tiers/lifecycle.h"
#include "tiers/manifest.h"

#define MAXR 32

/* Records from a spec: "job:step:rank:worker:state[:flags[:time]]" with
 * state C(ommitted) R(eplicated) S(ealing) B(ad) K (backed up), flags a
 * string of o(wn) r(estored) d(irectory: ns_ino set) p(arity: the step's
 * erasure-code holding, its key life_parity_key's, rank and worker
 * ignored). */
struct set {
	struct shard_rec r[MAXR];
	size_t n;
	struct life_drop d[MAXR];
	size_t nd;
	char out[1024];
};

static void add(struct set *s, const char *spec)
{
	struct shard_rec *r = &s->r[s->n++];
	char f[7][64] = { "", "", "", "", "C", "", "0" };
	const char *p = spec;
	char st;

	/* split at ':' (empty fields allowed: "C::100" has no flags) */
	for (size_t i = 0; i < 7 && p; i++) {
		const char *c = strchr(p, ':');
		size_t l = c ? (size_t)(c - p) : strlen(p);
		assert_true(l < sizeof(f[i]));
		memcpy(f[i], p, l);
		f[i][l] = '\0';
		p = c ? c + 1 : NULL;
	}
	memset(r, 0, sizeof(*r));
	snprintf(r->key.job, sizeof(r->key.job), "%s", f[0]);
	r->key.step = strtoull(f[1], NULL, 10);
	r->key.rank = (uint32_t)strtoul(f[2], NULL, 10);
	r->key.worker = (uint32_t)strtoul(f[3], NULL, 10);
	st = f[4][0];
	r->state = st == 'S' ? SH_SEALING : st == 'B' ? SH_BAD : st == 'R' ? SH_REPLICATED
		 : st == 'K' ? SH_BACKED_UP : SH_COMMITTED;
	r->flags = (strchr(f[5], 'o') ? SHF_OWN : 0) | (strchr(f[5], 'r') ? SHF_RESTORED : 0);
	r->ns_ino = strchr(f[5], 'd') ? 42 : 0;
	r->commit_time = strtoull(f[6], NULL, 10);
	if (strchr(f[5], 'p')) {
		life_parity_key(f[0], r->key.step, &r->key);
		r->flags |= SHF_PARITY;
	}
}

/* The plan as "job/step/rank/worker[o|r|x]" in order (o own, r replica,
 * x other job), a parity holding as "job/step/P[p|x]". */
static const char *show(struct set *s)
{
	size_t l = 0;
	s->out[0] = '\0';
	for (size_t i = 0; i < s->nd; i++) {
		const struct shard_rec *r = s->d[i].rec;
		assert_true(r >= s->r && r < s->r + s->n);
		assert_int_equal(s->d[i].parity, life_is_parity(&r->key));
		if (s->d[i].parity) {
			assert_false(s->d[i].own);
			l += (size_t)snprintf(s->out + l, sizeof(s->out) - l, "%s%s/%llu/P%c",
					      l ? " " : "", r->key.job,
					      (unsigned long long)r->key.step,
					      s->d[i].why == LIFE_OTHER_JOB ? 'x' : 'p');
			continue;
		}
		l += (size_t)snprintf(s->out + l, sizeof(s->out) - l, "%s%s/%llu/%u/%u%c", l ? " " : "",
				      r->key.job, (unsigned long long)r->key.step, r->key.rank,
				      r->key.worker,
				      s->d[i].why == LIFE_OTHER_JOB ? 'x' : s->d[i].own ? 'o' : 'r');
	}
	return s->out;
}

static const char *plan(struct set *s, const struct life_in *in)
{
	assert_int_equal(life_plan_gc(in, s->r, s->n, s->d, &s->nd), 0);
	return show(s);
}

static void single_node_keeps_newest(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .rank = 0, .workers = 1 };
	(void)state;
	add(&s, "j:1:0:0:C:o");
	add(&s, "j:2:0:0:R:o");
	add(&s, "j:3:0:0:C:o");
	add(&s, "j:4:0:0:B:o");      /* bad: not the newest */
	add(&s, "j:5:0:0:S:o");      /* sealing: not the newest, never dropped */
	add(&s, "j:0:0:0:S:o");
	add(&s, "j:1:1:0:C:");       /* a replica: a single node keeps it */
	add(&s, "j:2:1:0:C:o");      /* own flag, other rank: not own */
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/2/0/0o");
}

static void single_node_restored_step(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .workers = 1, .have_restored = true, .restored_step = 2 };
	(void)state;
	add(&s, "j:1:0:0:C:o");
	add(&s, "j:2:0:0:C:or");
	assert_string_equal(plan(&s, &in), "j/1/0/0o");
	/* kept while it is the newest; a newer commit supersedes it */
	add(&s, "j:3:0:0:C:o");
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/2/0/0o");
	/* a restored step newer than every commit protects itself only */
	in.restored_step = 7;
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/2/0/0o");
}

static void cluster_keeps_from_step(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .rank = 1, .workers = 1, .cluster = true };
	(void)state;
	add(&s, "j:3:0:0:R:");       /* replica of node 0 */
	add(&s, "j:3:1:0:R:o");
	add(&s, "j:5:0:0:R:");
	add(&s, "j:5:1:0:R:o");
	add(&s, "j:6:1:0:C:o");
	add(&s, "j:4:1:0:S:o");
	/* nothing known job-wide: keep all */
	assert_string_equal(plan(&s, &in), "");
	in.have_step = true;
	in.step = 5;
	assert_string_equal(plan(&s, &in), "j/3/0/0r j/3/1/0o");
	/* the restored step does not protect below the job-wide step */
	in.have_restored = true;
	in.restored_step = 3;
	assert_string_equal(plan(&s, &in), "j/3/0/0r j/3/1/0o");
}

static bool pin_step3(void *arg, const char *job, uint64_t step)
{
	int *calls = arg;
	(*calls)++;
	return !strcmp(job, "j") && step == 3;
}

static void pins_keep_their_shard(void **state)
{
	struct set s = { 0 };
	int calls = 0;
	struct life_in in = { .job = "j", .workers = 1, .pinned = pin_step3, .pin_arg = &calls };
	(void)state;
	add(&s, "j:2:0:0:C:o");
	add(&s, "j:3:0:0:C:o");
	add(&s, "j:9:0:0:C:o");
	assert_string_equal(plan(&s, &in), "j/2/0/0o");
	assert_true(calls >= 2);
}

static void pytorch_workers_complete_step(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .workers = 2 };
	(void)state;
	add(&s, "j:1:0:0:C:o");
	add(&s, "j:1:0:1:C:o");
	add(&s, "j:2:0:0:C:o");
	add(&s, "j:2:0:1:C:o");
	add(&s, "j:3:0:0:C:o");      /* worker 1 of step 3 not committed yet */
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/1/0/1o");
	/* worker 1 is bad: still incomplete */
	add(&s, "j:3:0:1:B:o");
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/1/0/1o");
	/* a restored worker-0 shard (all files in one) is complete alone */
	add(&s, "j:4:0:0:C:or");
	/* older shards go whatever their state (a bad one too) */
	assert_string_equal(plan(&s, &in), "j/1/0/0o j/1/0/1o j/2/0/0o j/2/0/1o j/3/0/0o j/3/0/1o");
}

static void pressure_takes_other_jobs_oldest_first(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .workers = 1, .cluster = true };
	(void)state;
	add(&s, "a:1:0:0:C:o:300");
	add(&s, "a:2:0:0:C::100");
	add(&s, "a:3:0:0:S:o:50");   /* sealing: never */
	add(&s, "b:7:0:0:C:o:100");  /* same time as a/2: lower step first */
	add(&s, "j:1:0:0:C:o:10");
	add(&s, "j:2:0:0:C:o:20");
	/* routine GC never touches other jobs */
	in.have_step = true;
	in.step = 2;
	assert_string_equal(plan(&s, &in), "j/1/0/0o");
	/* under pressure: the current job first, then other jobs by age */
	in.want = 1;
	assert_string_equal(plan(&s, &in), "j/1/0/0o a/2/0/0x b/7/0/0x a/1/0/0x");
	assert_false(s.d[1].own);
	assert_true(s.d[2].own);
	/* LKG unknown: other jobs still go */
	in.have_step = false;
	assert_string_equal(plan(&s, &in), "a/2/0/0x b/7/0/0x a/1/0/0x");
}

static void other_jobs_ties_keep_catalog_order(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .workers = 1, .want = 1 };
	(void)state;
	add(&s, "a:4:0:0:C:o:100");
	add(&s, "a:4:1:0:C::100");
	add(&s, "a:4:2:0:C::100");
	add(&s, "a:3:5:0:C::100");
	add(&s, "a:9:0:0:C:o:99");
	assert_string_equal(plan(&s, &in), "a/9/0/0x a/3/5/0x a/4/0/0x a/4/1/0x a/4/2/0x");
}

static void newer_than_restored(void **state)
{
	struct set s = { 0 };
	(void)state;
	add(&s, "j:3:0:0:C:o");
	add(&s, "j:4:0:0:C:o");
	add(&s, "j:5:1:0:R:");
	add(&s, "j:6:0:0:B:o");      /* bad: kept for inspection */
	add(&s, "j:7:0:0:S:o");
	add(&s, "k:9:0:0:C:o");      /* another job */
	assert_int_equal(life_plan_newer("j", 0, 3, s.r, s.n, s.d, &s.nd), 0);
	assert_string_equal(show(&s), "j/4/0/0o j/5/1/0r");
}

/* A step's parity holding goes when its step may go, as the step's
 * replicas do: by routine GC below the job-wide step, under RAM pressure
 * below the LKG (never the step the plan keeps, nor a newer one), as an
 * earlier job's record for room, after a restore when newer. */
static void parity_goes_with_its_step(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .rank = 1, .workers = 1, .cluster = true };
	(void)state;
	add(&s, "j:3:0:0:R:");
	add(&s, "j:3:1:0:R:o");
	add(&s, "j:3:0:0:C:p");
	add(&s, "j:5:1:0:R:o");
	add(&s, "j:5:0:0:C:p");
	add(&s, "j:6:0:0:C:p");      /* being encoded: newer than the LKG */
	add(&s, "a:2:0:0:C:p:5");    /* an earlier job's */
	/* nothing known job-wide: keep all */
	assert_string_equal(plan(&s, &in), "");
	in.have_step = true;
	in.step = 5;
	assert_string_equal(plan(&s, &in), "j/3/0/0r j/3/1/0o j/3/Pp");
	/* RAM pressure: the LKG is kept with its parity, the other job's goes */
	in.want = 1;
	assert_string_equal(plan(&s, &in), "j/3/0/0r j/3/1/0o j/3/Pp a/2/Px");
	/* pinned (a backup uploads step 3): its parity stays too */
	int calls = 0;
	in.pinned = pin_step3;
	in.pin_arg = &calls;
	in.want = 0;
	assert_string_equal(plan(&s, &in), "");
	/* after a restore of step 5: step 6's holding is of the timeline left */
	assert_int_equal(life_plan_newer("j", 1, 5, s.r, s.n, s.d, &s.nd), 0);
	assert_string_equal(show(&s), "j/6/Pp");
}

/* A holding is never this node's commit of its step: a single node's
 * newest step is its own shard's, and a single node keeps what it did not
 * write (a holding there is an earlier cluster run's). */
static void parity_is_not_a_commit(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = "j", .rank = 0, .workers = 1 };
	(void)state;
	add(&s, "j:1:0:0:C:o");
	add(&s, "j:2:0:0:C:o");
	add(&s, "j:9:0:0:C:po");     /* even flagged own by mistake */
	add(&s, "j:1:0:0:C:p");
	assert_string_equal(plan(&s, &in), "j/1/0/0o");
}

static void bad_input(void **state)
{
	struct set s = { 0 };
	struct life_in in = { .job = NULL };
	(void)state;
	add(&s, "j:1:0:0:C:o");
	assert_int_equal(life_plan_gc(&in, s.r, s.n, s.d, &s.nd), -EINVAL);
	assert_int_equal(life_plan_gc(NULL, s.r, s.n, s.d, &s.nd), -EINVAL);
	in.job = "j";
	assert_int_equal(life_plan_gc(&in, s.r, s.n, NULL, &s.nd), -EINVAL);
	assert_int_equal(life_plan_newer(NULL, 0, 0, s.r, s.n, s.d, &s.nd), -EINVAL);
	assert_int_equal(life_plan_newer("j", 0, 0, s.r, s.n, s.d, NULL), -EINVAL);
	assert_int_equal(life_plan_gc(&in, NULL, 0, NULL, &s.nd), 0);
	assert_int_equal(s.nd, 0);
}

/* ---- record writes on a real catalog ---- */

static void get(struct idx *x, const struct shard_key *k, uint32_t state, uint32_t flags)
{
	struct shard_rec r = { 0 };
	assert_int_equal(idx_get_shard(x, k, &r), 0);
	assert_string_equal(shard_state_name(r.state), shard_state_name(state));
	assert_int_equal(r.flags, flags);
	idx_rec_clear(&r);
}

/* A parity holding's record: made COMMITTED and flagged once (a second
 * begin keeps it), only for its key form; the catalog lists it with the
 * records, never with the shards; it goes as a record does. */
static void parity_record(void **state)
{
	struct tmp *t = *state;
	struct idx *x = NULL;
	struct shard_key k, notp = { .job = "j", .step = 5, .rank = 0, .worker = 0 };
	struct shard_rec *recs = NULL;
	size_t n = 0;
	char db[PATH_MAX + 8];

	snprintf(db, sizeof(db), "%s/db", t->path);
	assert_int_equal(idx_open(db, false, &x), 0);
	life_parity_key("j", 5, &k);
	assert_true(life_is_parity(&k));
	assert_false(life_is_parity(&notp));
	assert_int_equal(life_parity_begin(x, &notp), -EINVAL);
	assert_int_equal(life_parity_begin(x, &k), 0);
	get(x, &k, SH_COMMITTED, SHF_PARITY);
	assert_int_equal(life_parity_begin(x, &k), 0);
	get(x, &k, SH_COMMITTED, SHF_PARITY);
	assert_int_equal(life_committed(x, &notp, NULL, SHF_OWN, 0), 0);
	assert_int_equal(idx_list_shards(x, "j", &recs, &n), 0);
	assert_int_equal(n, 1);
	assert_false(life_is_parity(&recs[0].key));
	idx_recs_free(recs, n);
	assert_int_equal(idx_list_records(x, NULL, &recs, &n), 0);
	assert_int_equal(n, 2);
	assert_true(life_is_parity(&recs[1].key));   /* after the shards of its step */
	idx_recs_free(recs, n);
	assert_int_equal(life_drop_mark(x, &k), 0);
	assert_int_equal(idx_list_records(x, NULL, &recs, &n), 0);
	assert_int_equal(n, 1);
	idx_recs_free(recs, n);
	assert_int_equal(life_drop_done(x, &k), 0);
	assert_int_equal(idx_get_shard(x, &k, &(struct shard_rec){ 0 }), -ENOENT);
	idx_close(x);
}

static void writes_walk_the_states(void **state)
{
	struct tmp *t = *state;
	struct idx *x = NULL;
	struct shard_key k = { .job = "j", .step = 5, .rank = 2, .worker = 0 };
	struct manifest *mf = NULL;
	struct shard_rec r = { 0 };
	char db[PATH_MAX + 8];
	int fd;

	snprintf(db, sizeof(db), "%s/db", t->path);
	assert_int_equal(idx_open(db, false, &x), 0);
	assert_int_equal(life_seal_begin(x, &k, SHF_OWN, 77), 0);
	assert_int_equal(idx_get_shard(x, &k, &r), 0);
	assert_int_equal(r.state, SH_SEALING);
	assert_int_equal(r.ns_ino, 77);
	assert_null(r.mf);
	assert_true(r.commit_time > 0);
	idx_rec_clear(&r);

	/* a tree of one 3-byte file */
	assert_int_equal(mkdirat(t->fd, "tree", 0755), 0);
	fd = openat(t->fd, "tree/f", O_WRONLY | O_CREAT | O_EXCL, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "abc", 3), 3);
	close(fd);
	fd = openat(t->fd, "tree", O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(mf_build(fd, &mf), 0);
	close(fd);
	assert_int_equal(life_committed(x, &k, mf, SHF_OWN, 77), 0);
	assert_int_equal(idx_get_shard(x, &k, &r), 0);
	assert_int_equal(r.state, SH_COMMITTED);
	assert_int_equal(r.bytes, 3);
	assert_int_equal(r.nfiles, 1);
	assert_memory_equal(r.hash, mf->hash, 32);
	assert_non_null(r.mf);
	idx_rec_clear(&r);

	assert_int_equal(life_replicated(x, &k), 0);
	get(x, &k, SH_REPLICATED, SHF_OWN);
	assert_int_equal(life_backed_up(x, &k), 0);
	get(x, &k, SH_BACKED_UP, SHF_OWN);
	assert_int_equal(life_hide(x, &k), 0);
	assert_int_equal(life_restored(x, &k), 0);
	get(x, &k, SH_BACKED_UP, SHF_OWN | SHF_HIDDEN | SHF_RESTORED);
	assert_int_equal(life_bad(x, &k), 0);
	get(x, &k, SH_BAD, SHF_OWN | SHF_HIDDEN | SHF_RESTORED);

	/* a drop: invisible once marked, gone once done */
	assert_int_equal(life_drop_mark(x, &k), 0);
	assert_int_equal(idx_get_shard(x, &k, &r), -ENOENT);
	assert_int_equal(life_replicated(x, &k), -ENOENT);
	assert_int_equal(life_drop_done(x, &k), 0);
	assert_int_equal(life_drop_done(x, &k), -ENOENT);

	/* a replica adopted as own; an unsealable tree; forget */
	assert_int_equal(life_committed(x, &k, mf, 0, 0), 0);
	assert_int_equal(life_adopt(x, &k), 0);
	get(x, &k, SH_COMMITTED, SHF_OWN | SHF_RESTORED);
	assert_int_equal(life_unsealable(x, &k, SHF_OWN, 0), 0);
	assert_int_equal(idx_get_shard(x, &k, &r), 0);
	assert_int_equal(r.state, SH_BAD);
	assert_null(r.mf);
	idx_rec_clear(&r);
	assert_int_equal(life_forget(x, &k), 0);
	assert_int_equal(idx_get_shard(x, &k, &r), -ENOENT);
	mf_free(mf);
	idx_close(x);
}

static void step_names(void **state)
{
	struct tmp *t = *state;
	struct idx *x = NULL;
	struct shard_key k = { .job = "j", .step = 5, .rank = 1, .worker = 0 };
	struct shard_key w1 = { .job = "j", .step = 5, .rank = 1, .worker = 1 };
	char db[PATH_MAX + 8], buf[65];
	void *v = NULL;
	size_t vl = 0;

	snprintf(db, sizeof(db), "%s/db", t->path);
	assert_int_equal(idx_open(db, false, &x), 0);
	life_name_get(x, &k, buf, sizeof(buf));
	assert_string_equal(buf, "5");              /* nothing stored: the decimal */
	assert_int_equal(life_name_set(x, &k, "0005"), 0);
	life_name_get(x, &k, buf, sizeof(buf));
	assert_string_equal(buf, "0005");
	life_name_get(x, &w1, buf, sizeof(buf));
	assert_string_equal(buf, "5");              /* per worker */
	assert_int_equal(idx_get_meta(x, "stepname/j/1/5", &v, &vl), 0);
	assert_int_equal(vl, 4);
	free(v);
	/* the plain decimal is not stored: it forgets a spelling */
	assert_int_equal(life_name_set(x, &k, "5"), 0);
	assert_int_equal(idx_get_meta(x, "stepname/j/1/5", &v, &vl), -ENOENT);
	/* a stored value that is not this step is ignored */
	assert_int_equal(idx_put_meta(x, "stepname/j/1/5", "06", 2), 0);
	life_name_get(x, &k, buf, sizeof(buf));
	assert_string_equal(buf, "5");
	assert_int_equal(life_name_set(x, &w1, "05"), 0);
	life_name_get(x, &w1, buf, sizeof(buf));
	assert_string_equal(buf, "05");
	assert_int_equal(life_name_forget(x, &w1), 0);
	life_name_get(x, &w1, buf, sizeof(buf));
	assert_string_equal(buf, "5");
	idx_close(x);
}

/* ---- the only writer ---- */

#ifdef MTCFS_SRC
/* Calls of the catalog's shard writes in one source file (a crude scan:
 * the name followed by "("). */
static int writes_in(const char *path, char *where, size_t wlen)
{
	static const char *const calls[] = { "idx_put_shard(", "idx_del_shard(", "idx_set_state(",
					     "idx_forget_dropping(" };
	char line[1024];
	int n = 0, ln = 0;
	FILE *f = fopen(path, "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		ln++;
		for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
			if (strstr(line, calls[i])) {
				size_t l = strlen(where);
				snprintf(where + l, wlen - l, " %.200s:%d", path, ln);
				n++;
			}
		}
	}
	fclose(f);
	return n;
}

/* Every shard record write outside tests goes through tiers/lifecycle.c:
 * no other source file calls the catalog's shard writes. */
static void only_lifecycle_writes_shard_records(void **state)
{
	static const char *const dirs[] = { "common", "net", "tiers", "cluster", "fs", "tools", "csi" };
	char where[4096] = "";
	int found = 0, scanned = 0;
	(void)state;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char dir[PATH_MAX];
		struct dirent *de;
		DIR *d;
		snprintf(dir, sizeof(dir), "%s/%s", MTCFS_SRC, dirs[i]);
		d = opendir(dir);
		if (!d)
			continue;
		while ((de = readdir(d)) != NULL) {
			char path[PATH_MAX + 256];
			size_t l = strlen(de->d_name);
			if (l < 3 || strcmp(de->d_name + l - 2, ".c") ||
			    (!strcmp(dirs[i], "tiers") &&
			     (!strcmp(de->d_name, "catalog.c") || !strcmp(de->d_name, "lifecycle.c"))))
				continue;
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			found += writes_in(path, where, sizeof(where));
			scanned++;
		}
		closedir(d);
	}
	assert_true(scanned > 20);
	if (found)
		fail_msg("shard records written outside tiers/lifecycle.c:%s", where);
}
#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(single_node_keeps_newest),
		cmocka_unit_test(single_node_restored_step),
		cmocka_unit_test(cluster_keeps_from_step),
		cmocka_unit_test(pins_keep_their_shard),
		cmocka_unit_test(pytorch_workers_complete_step),
		cmocka_unit_test(pressure_takes_other_jobs_oldest_first),
		cmocka_unit_test(other_jobs_ties_keep_catalog_order),
		cmocka_unit_test(newer_than_restored),
		cmocka_unit_test(parity_goes_with_its_step),
		cmocka_unit_test(parity_is_not_a_commit),
		cmocka_unit_test(bad_input),
		cmocka_unit_test_setup_teardown(writes_walk_the_states, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(step_names, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(parity_record, tmp_setup, tmp_teardown),
#ifdef MTCFS_SRC
		cmocka_unit_test(only_lifecycle_writes_shard_records),
#endif
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
