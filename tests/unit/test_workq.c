/* Unit tests for common/workq: jobs run one at a time, in submission order,
 * on the queue's own thread; drain waits for jobs submitted by jobs; the
 * pending count; stop runs whatever is queued and then refuses new work.
 * Waits are on semaphores or bounded by a deadline, never a fixed sleep. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/workq.h"

#define DEADLINE_NS (20ULL * 1000000000ULL)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* sem_wait with the deadline; false on timeout. */
static bool sem_wait_deadline(sem_t *s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(DEADLINE_NS / 1000000000ULL);
	while (sem_timedwait(s, &ts) < 0) {
		if (errno != EINTR)
			return false;
	}
	return true;
}

/* ---- order ---- */

#define NORDER 20000

struct order_log {
	int seen[NORDER];
	int n;              /* written by the worker only */
	atomic_int running; /* jobs inside fn at once */
	atomic_int max_running;
};

struct order_job {
	struct order_log *log;
	int id;
};

static void order_fn(void *arg)
{
	struct order_job *j = arg;
	struct order_log *l = j->log;
	int r = atomic_fetch_add(&l->running, 1) + 1;

	if (r > atomic_load(&l->max_running))
		atomic_store(&l->max_running, r);
	if (l->n < NORDER)
		l->seen[l->n] = j->id;
	l->n++;
	atomic_fetch_sub(&l->running, 1);
	free(j);   /* the job owns its argument */
}

static void test_submission_order(void **state)
{
	struct workq *q = NULL;
	struct order_log *l = calloc(1, sizeof(*l));
	(void)state;

	assert_non_null(l);
	assert_int_equal(workq_start("test-order", &q), 0);
	assert_non_null(q);
	for (int i = 0; i < NORDER; i++) {
		struct order_job *j = malloc(sizeof(*j));
		assert_non_null(j);
		j->log = l;
		j->id = i;
		assert_int_equal(workq_submit(q, order_fn, j), 0);
	}
	workq_drain(q);
	assert_int_equal(workq_pending(q), 0);
	assert_int_equal(l->n, NORDER);
	for (int i = 0; i < NORDER; i++) {
		if (l->seen[i] != i) {
			print_error("job %d ran in position %d\n", l->seen[i], i);
			fail();
		}
	}
	assert_int_equal(atomic_load(&l->max_running), 1);
	workq_stop(q);
	free(l);
}

/* Several submitting threads: each one's jobs run in its own order. */
#define NSUBMITTERS 4
#define PER_THREAD 3000

struct multi {
	struct workq *q;
	int log[NSUBMITTERS * PER_THREAD];
	int n;                      /* worker only */
	atomic_int failed;
};

struct multi_sub {
	struct multi *m;
	int tid;
};

struct multi_arg {
	struct multi *m;
	int tag;
};

static void multi_fn(void *arg)
{
	struct multi_arg *a = arg;
	struct multi *m = a->m;

	if (m->n < NSUBMITTERS * PER_THREAD)
		m->log[m->n] = a->tag;
	m->n++;
	free(a);
}

static void *submitter(void *p)
{
	struct multi_sub *s = p;

	for (int i = 0; i < PER_THREAD; i++) {
		struct multi_arg *a = malloc(sizeof(*a));
		if (!a) {
			atomic_store(&s->m->failed, 1);
			return NULL;
		}
		a->m = s->m;
		a->tag = s->tid * PER_THREAD + i;
		if (workq_submit(s->m->q, multi_fn, a) != 0) {
			free(a);
			atomic_store(&s->m->failed, 1);
			return NULL;
		}
	}
	return NULL;
}

static void test_concurrent_submitters(void **state)
{
	struct multi *m = calloc(1, sizeof(*m));
	struct multi_sub subs[NSUBMITTERS];
	pthread_t thr[NSUBMITTERS];
	int next[NSUBMITTERS] = { 0 };
	(void)state;

	assert_non_null(m);
	assert_int_equal(workq_start("test-multi", &m->q), 0);
	for (int t = 0; t < NSUBMITTERS; t++) {
		subs[t].m = m;
		subs[t].tid = t;
		assert_int_equal(pthread_create(&thr[t], NULL, submitter, &subs[t]), 0);
	}
	for (int t = 0; t < NSUBMITTERS; t++)
		assert_int_equal(pthread_join(thr[t], NULL), 0);
	workq_drain(m->q);
	assert_int_equal(atomic_load(&m->failed), 0);
	assert_int_equal(m->n, NSUBMITTERS * PER_THREAD);
	for (int i = 0; i < m->n; i++) {
		int t = m->log[i] / PER_THREAD, seq = m->log[i] % PER_THREAD;
		if (seq != next[t]) {
			print_error("thread %d: job %d ran where %d was due\n", t, seq, next[t]);
			fail();
		}
		next[t]++;
	}
	workq_stop(m->q);
	free(m);
}

/* ---- the worker thread ---- */

struct who {
	pthread_t thr;
	char name[32];
	sem_t done;
};

static void who_fn(void *arg)
{
	struct who *w = arg;

	w->thr = pthread_self();
	pthread_getname_np(w->thr, w->name, sizeof(w->name));
	sem_post(&w->done);
}

static void test_runs_on_worker(void **state)
{
	struct workq *q = NULL;
	struct who w;
	(void)state;

	memset(&w, 0, sizeof(w));
	sem_init(&w.done, 0, 0);
	/* the thread name is cut to what the kernel keeps (15 bytes) */
	assert_int_equal(workq_start("a-very-long-queue-name", &q), 0);
	assert_int_equal(workq_submit(q, who_fn, &w), 0);
	assert_true(sem_wait_deadline(&w.done));
	assert_false(pthread_equal(w.thr, pthread_self()));
	assert_string_equal(w.name, "a-very-long-que");
	workq_stop(q);
	sem_destroy(&w.done);
}

/* ---- drain and pending ---- */

struct gate {
	sem_t entered;     /* posted when the gate job starts */
	sem_t open;        /* the gate job waits on this */
	atomic_int ok;
};

static void gate_fn(void *arg)
{
	struct gate *g = arg;

	sem_post(&g->entered);
	atomic_store(&g->ok, sem_wait_deadline(&g->open));
}

static void count_fn(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_pending(void **state)
{
	struct workq *q = NULL;
	struct gate g;
	atomic_int ran = 0;
	(void)state;

	sem_init(&g.entered, 0, 0);
	sem_init(&g.open, 0, 0);
	atomic_init(&g.ok, 0);
	assert_int_equal(workq_start("test-pending", &q), 0);
	assert_int_equal(workq_pending(q), 0);
	workq_drain(q);                           /* nothing to wait for */

	assert_int_equal(workq_submit(q, gate_fn, &g), 0);
	assert_true(sem_wait_deadline(&g.entered));
	assert_int_equal(workq_pending(q), 1);    /* running counts */
	for (int i = 0; i < 5; i++)
		assert_int_equal(workq_submit(q, count_fn, &ran), 0);
	assert_int_equal(workq_pending(q), 6);
	assert_int_equal(atomic_load(&ran), 0);   /* nothing overtakes the gate */
	sem_post(&g.open);
	workq_drain(q);
	assert_int_equal(workq_pending(q), 0);
	assert_int_equal(atomic_load(&ran), 5);
	assert_int_equal(atomic_load(&g.ok), 1);
	workq_stop(q);
	sem_destroy(&g.entered);
	sem_destroy(&g.open);
}

/* A slow job: drain must not return before it finished. */
struct slow {
	atomic_int done;
};

static void slow_fn(void *arg)
{
	struct slow *s = arg;
	uint64_t until = now_ns() + 20000000ULL;   /* busy for 20 ms */

	while (now_ns() < until)
		;
	atomic_store(&s->done, 1);
}

/* A chain: each link submits the next from the worker. */
struct chain {
	struct workq *q;
	int left;           /* worker only */
	int ran;            /* worker only */
	int submit_errors;  /* worker only */
};

static void chain_fn(void *arg)
{
	struct chain *c = arg;

	c->ran++;
	if (c->left-- > 0 && workq_submit(c->q, chain_fn, c) != 0)
		c->submit_errors++;
}

static void test_drain_waits(void **state)
{
	struct workq *q = NULL;
	struct slow s[3];
	struct chain c = { 0 };
	(void)state;

	assert_int_equal(workq_start("test-drain", &q), 0);
	for (int i = 0; i < 3; i++) {
		atomic_init(&s[i].done, 0);
		assert_int_equal(workq_submit(q, slow_fn, &s[i]), 0);
	}
	workq_drain(q);
	for (int i = 0; i < 3; i++)
		assert_int_equal(atomic_load(&s[i].done), 1);
	assert_int_equal(workq_pending(q), 0);

	/* jobs submitted by jobs are waited for too */
	c.q = q;
	c.left = 500;
	assert_int_equal(workq_submit(q, chain_fn, &c), 0);
	workq_drain(q);
	assert_int_equal(c.ran, 501);
	assert_int_equal(c.submit_errors, 0);
	assert_int_equal(workq_pending(q), 0);
	workq_stop(q);
}

struct drainer {
	struct workq *q;
	struct slow *s;
	int n;
	atomic_int bad;
};

static void *drain_thread(void *p)
{
	struct drainer *d = p;

	workq_drain(d->q);
	for (int i = 0; i < d->n; i++)
		if (!atomic_load(&d->s[i].done))
			atomic_store(&d->bad, 1);
	return NULL;
}

static void test_drain_concurrent(void **state)
{
	struct workq *q = NULL;
	struct slow s[4];
	struct drainer d;
	pthread_t thr[3];
	(void)state;

	assert_int_equal(workq_start("test-drain2", &q), 0);
	for (int i = 0; i < 4; i++) {
		atomic_init(&s[i].done, 0);
		assert_int_equal(workq_submit(q, slow_fn, &s[i]), 0);
	}
	d.q = q;
	d.s = s;
	d.n = 4;
	atomic_init(&d.bad, 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&thr[i], NULL, drain_thread, &d), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_join(thr[i], NULL), 0);
	assert_int_equal(atomic_load(&d.bad), 0);
	workq_stop(q);
}

/* ---- stop ---- */

static void *stop_thread(void *p)
{
	workq_stop(p);
	return NULL;
}

static void test_stop_runs_queued(void **state)
{
	struct workq *q = NULL;
	struct gate g;
	atomic_int ran = 0;
	pthread_t thr;
	(void)state;

	workq_stop(NULL);

	/* stop with nothing queued */
	assert_int_equal(workq_start("test-stop0", &q), 0);
	workq_stop(q);

	/* stop while the worker is busy and 100 jobs wait behind it */
	sem_init(&g.entered, 0, 0);
	sem_init(&g.open, 0, 0);
	atomic_init(&g.ok, 0);
	assert_int_equal(workq_start("test-stop", &q), 0);
	assert_int_equal(workq_submit(q, gate_fn, &g), 0);
	assert_true(sem_wait_deadline(&g.entered));
	for (int i = 0; i < 100; i++)
		assert_int_equal(workq_submit(q, count_fn, &ran), 0);
	assert_int_equal(pthread_create(&thr, NULL, stop_thread, q), 0);
	sem_post(&g.open);
	assert_int_equal(pthread_join(thr, NULL), 0);
	assert_int_equal(atomic_load(&ran), 100);
	assert_int_equal(atomic_load(&g.ok), 1);
	sem_destroy(&g.entered);
	sem_destroy(&g.open);

	/* stop right after submitting, no gate */
	atomic_store(&ran, 0);
	assert_int_equal(workq_start("test-stop2", &q), 0);
	for (int i = 0; i < 1000; i++)
		assert_int_equal(workq_submit(q, count_fn, &ran), 0);
	workq_stop(q);
	assert_int_equal(atomic_load(&ran), 1000);
}

/* Once stop has begun, submit returns -ESHUTDOWN; what it accepted before
 * still runs. The submitting job keeps trying until refused. */
struct late {
	struct workq *q;
	sem_t go;
	atomic_int accepted;
	atomic_int ran;
	int refused_rc;     /* worker only */
	bool timed_out;     /* worker only */
};

static void late_count(void *arg)
{
	atomic_fetch_add(&((struct late *)arg)->ran, 1);
}

static void late_fn(void *arg)
{
	struct late *l = arg;
	uint64_t deadline = now_ns() + DEADLINE_NS;

	if (!sem_wait_deadline(&l->go)) {
		l->timed_out = true;
		return;
	}
	for (;;) {
		int rc = workq_submit(l->q, late_count, l);
		if (rc != 0) {
			l->refused_rc = rc;
			return;
		}
		atomic_fetch_add(&l->accepted, 1);
		if (now_ns() > deadline) {
			l->timed_out = true;
			return;
		}
		sched_yield();
	}
}

static void test_submit_after_stop(void **state)
{
	struct late *l = calloc(1, sizeof(*l));
	pthread_t thr;
	(void)state;

	assert_non_null(l);
	sem_init(&l->go, 0, 0);
	assert_int_equal(workq_start("test-late", &l->q), 0);
	assert_int_equal(workq_submit(l->q, late_fn, l), 0);
	assert_int_equal(pthread_create(&thr, NULL, stop_thread, l->q), 0);
	sem_post(&l->go);
	assert_int_equal(pthread_join(thr, NULL), 0);
	assert_false(l->timed_out);
	assert_int_equal(l->refused_rc, -ESHUTDOWN);
	assert_int_equal(atomic_load(&l->ran), atomic_load(&l->accepted));
	sem_destroy(&l->go);
	free(l);
}

static void bump(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

/* workq_close: what was queued runs, later submits are refused with
 * -ESHUTDOWN while the queue is still valid (a submitter racing the
 * daemon's stop), a second close and workq_pending/drain are harmless, and
 * workq_free frees it. */
static void test_close_then_free(void **state)
{
	struct workq *q;
	atomic_int n = 0;
	(void)state;

	assert_int_equal(workq_start("test-close", &q), 0);
	for (int i = 0; i < 50; i++)
		assert_int_equal(workq_submit(q, bump, &n), 0);
	workq_close(q);
	assert_int_equal(atomic_load(&n), 50);
	assert_int_equal(workq_submit(q, bump, &n), -ESHUTDOWN);
	workq_close(q);
	workq_drain(q);
	assert_int_equal(workq_pending(q), 0);
	assert_int_equal(atomic_load(&n), 50);
	workq_free(q);
	workq_free(NULL);
	workq_close(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_submission_order),
		cmocka_unit_test(test_concurrent_submitters),
		cmocka_unit_test(test_runs_on_worker),
		cmocka_unit_test(test_pending),
		cmocka_unit_test(test_drain_waits),
		cmocka_unit_test(test_drain_concurrent),
		cmocka_unit_test(test_stop_runs_queued),
		cmocka_unit_test(test_submit_after_stop),
		cmocka_unit_test(test_close_then_free),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
