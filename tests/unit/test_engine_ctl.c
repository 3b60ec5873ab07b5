/* Unit tests for cluster/engine_ctl.c, the engine's control connection to
 * the coordinator, against a fake coordinator (a real net/server on
 * 127.0.0.1 whose handler answers, stays silent or hangs up): calls matched
 * to their answers by id, events both ways (the LKG and report events the
 * reader thread hands to the engine), timeouts, a restore's calls ended at
 * once by eng_restore_interrupt(), a new connection after the
 * coordinator hung up, and retry waits bounded by a budget and ended by
 * the daemon's stop (eng_retry_wait). The engine is a struct eng of just
 * what the control code reads, stopped with eng_stop(). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster/engine_int.h"
#include "common/util.h"

enum fake_mode { ANSWER, SILENT, HANG_UP };

struct fake {
	struct nsrv *srv;
	char addr[64];
	pthread_mutex_t mu;
	enum fake_mode mode;
	uint64_t conn;              /* the node's newest control connection */
	int conns;                  /* control connections seen */
	int peer_rank;
	char last_req[32], last_event[32];
	int events;
};

static void fake_on_msg(void *arg, uint64_t conn, int peer_rank, uint8_t type, uint32_t req_id,
			json_t *msg)
{
	struct fake *f = arg;
	const char *op = json_string_value(json_object_get(msg, "op"));
	enum fake_mode mode;

	pthread_mutex_lock(&f->mu);
	if (conn != f->conn) {
		f->conn = conn;
		f->conns++;
	}
	f->peer_rank = peer_rank;
	if (type == NT_EVENT) {
		snprintf(f->last_event, sizeof(f->last_event), "%s", op ? op : "");
		f->events++;
	} else if (type == NT_REQ) {
		snprintf(f->last_req, sizeof(f->last_req), "%s", op ? op : "");
	}
	mode = f->mode;
	pthread_mutex_unlock(&f->mu);
	if (type == NT_REQ && mode == ANSWER)
		nsrv_send(f->srv, conn, NT_RESP, req_id, json_pack("{s:s}", "echo", op ? op : ""));
	else if (type == NT_REQ && mode == HANG_UP)
		nsrv_close_conn(f->srv, conn);
	json_decref(msg);
}

static const struct nsrv_ops fake_ops = { .on_msg = fake_on_msg };

struct seen {
	pthread_mutex_t mu;
	char lkg_job[64];
	uint64_t lkg_step;
	int lkgs;
	char report[256];
};

static void on_lkg(void *arg, const char *job, uint64_t step)
{
	struct seen *s = arg;
	pthread_mutex_lock(&s->mu);
	snprintf(s->lkg_job, sizeof(s->lkg_job), "%s", job);
	s->lkg_step = step;
	s->lkgs++;
	pthread_mutex_unlock(&s->mu);
}

static void on_report(void *arg, const char *line)
{
	struct seen *s = arg;
	pthread_mutex_lock(&s->mu);
	snprintf(s->report, sizeof(s->report), "%s", line);
	pthread_mutex_unlock(&s->mu);
}

struct fixture {
	struct fake f;
	struct seen seen;
	struct eng *e;
};

static int setup(void **state)
{
	struct fixture *x = calloc(1, sizeof(*x));
	struct eng *e;

	if (!x)
		return -1;
	pthread_mutex_init(&x->f.mu, NULL);
	pthread_mutex_init(&x->seen.mu, NULL);
	if (nsrv_start("127.0.0.1:0", 0, NULL, &fake_ops, &x->f, &x->f.srv) < 0)
		return -1;
	snprintf(x->f.addr, sizeof(x->f.addr), "127.0.0.1:%d", nsrv_port(x->f.srv));
	e = x->e = calloc(1, sizeof(*e));
	if (!e)
		return -1;
	pthread_mutex_init(&e->mu, NULL);
	pthread_mutex_init(&e->ctl_mu, NULL);
	pthread_cond_init(&e->ctl_cv, NULL);
	{
		pthread_condattr_t ca;   /* as eng_start makes it */
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&e->quit_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	if (jobid_new(&e->jid) < 0)
		return -1;
	e->jid_own = true;   /* eng_stop frees it */
	jobid_set_rank(e->jid, 3);
	snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", x->f.addr);
	e->cb.on_lkg = on_lkg;
	e->cb.report = on_report;
	e->cb.arg = &x->seen;
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	eng_stop(x->e);
	nsrv_stop(x->f.srv);
	pthread_mutex_destroy(&x->f.mu);
	pthread_mutex_destroy(&x->seen.mu);
	free(x);
	return 0;
}

static void set_mode(struct fake *f, enum fake_mode m)
{
	pthread_mutex_lock(&f->mu);
	f->mode = m;
	pthread_mutex_unlock(&f->mu);
}

static uint64_t fake_conn(struct fake *f, int *conns)
{
	uint64_t c;
	pthread_mutex_lock(&f->mu);
	c = f->conn;
	if (conns)
		*conns = f->conns;
	pthread_mutex_unlock(&f->mu);
	return c;
}

static int call(struct eng *e, const char *op, int timeout_ms, char *echo, size_t echolen)
{
	json_t *req = json_pack("{s:s}", "op", op), *resp = NULL;
	int rc = eng_ctl_call(e, req, &resp, timeout_ms);

	if (echo)
		snprintf(echo, echolen, "%s", json_string_value(json_object_get(resp, "echo")) ?: "");
	json_decref(req);
	json_decref(resp);
	return rc;
}

/* Poll cond(arg) every 10 ms for up to ms. */
static bool wait_for(bool (*cond)(void *), void *arg, int ms)
{
	uint64_t end = util_now_ns() + (uint64_t)ms * 1000000u;
	struct timespec ts = { 0, 10 * 1000000L };

	while (!cond(arg)) {
		if (util_now_ns() > end)
			return false;
		nanosleep(&ts, NULL);
	}
	return true;
}

static bool event_arrived(void *arg)
{
	struct fake *f = arg;
	bool r;
	pthread_mutex_lock(&f->mu);
	r = f->events > 0;
	pthread_mutex_unlock(&f->mu);
	return r;
}

static bool lkg_arrived(void *arg)
{
	struct seen *s = arg;
	bool r;
	pthread_mutex_lock(&s->mu);
	r = s->lkgs > 0 && s->report[0];
	pthread_mutex_unlock(&s->mu);
	return r;
}

static bool ctl_down(void *arg)
{
	uint32_t nodes;
	bool up;
	eng_status(arg, &nodes, &up);
	return !up;
}

/* A call connects (as this node's rank) and gets its own answer; an event
 * reaches the coordinator; the coordinator's lkg and report events reach
 * the engine (eng_lkg, eng_gc_step, the callbacks). */
static void test_calls_and_events(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	char echo[32];
	json_t *ev;
	uint64_t step = 0;

	assert_int_equal(call(e, "ping", 5000, echo, sizeof(echo)), 0);
	assert_string_equal(echo, "ping");
	assert_int_equal(call(e, "catalog", 5000, echo, sizeof(echo)), 0);
	assert_string_equal(echo, "catalog");
	assert_int_equal(x->f.peer_rank, 3);
	assert_string_equal(x->f.last_req, "catalog");

	ev = json_pack("{s:s}", "op", "committed");
	assert_int_equal(eng_ctl_event(e, ev), 0);
	json_decref(ev);
	assert_true(wait_for(event_arrived, &x->f, 5000));
	assert_string_equal(x->f.last_event, "committed");

	assert_false(eng_lkg(e, "job", &step));
	assert_int_equal(nsrv_send(x->f.srv, fake_conn(&x->f, NULL), NT_EVENT, 0,
				   json_pack("{s:s,s:s,s:i,s:i}", "op", "lkg", "job", "job", "step", 7,
					     "safe", 5)), 0);
	assert_int_equal(nsrv_send(x->f.srv, fake_conn(&x->f, NULL), NT_EVENT, 0,
				   json_pack("{s:s,s:s}", "op", "report", "text", "node 2 is slow")), 0);
	assert_true(wait_for(lkg_arrived, &x->seen, 5000));
	assert_string_equal(x->seen.lkg_job, "job");
	assert_int_equal(x->seen.lkg_step, 7);
	assert_string_equal(x->seen.report, "node 2 is slow");
	assert_true(eng_lkg(e, "job", &step));
	assert_int_equal(step, 7);
	assert_true(eng_gc_step(e, "job", &step));
	assert_int_equal(step, 5);
	assert_false(eng_lkg(e, "other", &step));
}

struct interrupter {
	struct eng *e;
	struct fake *f;
	void (*how)(struct eng *e);   /* eng_restore_interrupt or eng_restore_stop */
};

static bool request_arrived(void *arg)
{
	struct fake *f = arg;
	bool r;
	pthread_mutex_lock(&f->mu);
	r = !strcmp(f->last_req, "ready");
	pthread_mutex_unlock(&f->mu);
	return r;
}

static void *interrupt_later(void *arg)
{
	struct interrupter *i = arg;
	wait_for(request_arrived, i->f, 5000);
	i->how(i->e);
	return NULL;
}

static void set_restoring(struct eng *e, bool on)
{
	pthread_mutex_lock(&e->ctl_mu);
	e->restoring = on;
	e->restore_cancel = false;
	e->restore_thr = pthread_self();
	pthread_mutex_unlock(&e->ctl_mu);
}

/* This thread's restore waits in a call the coordinator never answers;
 * another thread ends the restore with how() once the request is out: the
 * call returns -ECANCELED at once, not at its 20 s timeout. */
static void call_ended_by(struct fixture *x, void (*how)(struct eng *e))
{
	struct interrupter in = { x->e, &x->f, how };
	uint64_t t0;
	pthread_t thr;

	set_mode(&x->f, SILENT);
	set_restoring(x->e, true);
	assert_int_equal(pthread_create(&thr, NULL, interrupt_later, &in), 0);
	t0 = util_now_ns();
	assert_int_equal(call(x->e, "ready", 20000, NULL, 0), -ECANCELED);
	assert_true(util_now_ns() - t0 < 10000 * 1000000ull);
	assert_int_equal(pthread_join(thr, NULL), 0);
}

/* An unanswered call ends at its timeout; a restore's call ends at once
 * when a new replicator.yaml interrupts the restore, and so does every
 * later call of that restore. */
static void test_timeout_and_interrupt(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	uint64_t t0;

	set_mode(&x->f, SILENT);
	t0 = util_now_ns();
	assert_int_equal(call(e, "slow", 300, NULL, 0), -ETIMEDOUT);
	assert_true(util_now_ns() - t0 >= 290 * 1000000ull);

	call_ended_by(x, eng_restore_interrupt);
	assert_int_equal(call(e, "ready", 20000, NULL, 0), -ECANCELED);

	/* another thread's calls are not the restore's */
	set_restoring(e, false);
	set_mode(&x->f, ANSWER);
	assert_int_equal(call(e, "ping", 5000, NULL, 0), 0);
}

/* The daemon stops (unmount) while a restore's call waits for an answer
 * that does not come: the call ends at once, not at its timeout, and the
 * stop is sticky: it also ends the calls of a restore that begins later
 * (eng_restore itself then refuses to start). */
static void test_stop_ends_restore_call(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	uint64_t t0;

	call_ended_by(x, eng_restore_stop);
	set_restoring(e, true);   /* a new restore: its flags reset, the stop holds */
	t0 = util_now_ns();
	assert_int_equal(call(e, "ready", 20000, NULL, 0), -ECANCELED);
	assert_true(util_now_ns() - t0 < 1000 * 1000000ull);
	/* calls that are not a restore's still work */
	set_restoring(e, false);
	set_mode(&x->f, ANSWER);
	assert_int_equal(call(e, "ping", 5000, NULL, 0), 0);
}

/* The coordinator hangs up during a call: the call fails, the connection
 * is gone (eng_status), and the next call connects again. */
static void test_reconnect_after_hang_up(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	char echo[32];
	int conns;

	assert_int_equal(call(e, "ping", 5000, NULL, 0), 0);
	set_mode(&x->f, HANG_UP);
	assert_int_equal(call(e, "ping", 5000, NULL, 0), -ECONNRESET);
	assert_true(wait_for(ctl_down, e, 5000));
	set_mode(&x->f, ANSWER);
	assert_int_equal(call(e, "again", 5000, echo, sizeof(echo)), 0);
	assert_string_equal(echo, "again");
	fake_conn(&x->f, &conns);
	assert_int_equal(conns, 2);
}

/* Retries wait (eng_retry_wait) 1 s, 2 s, 4 s, then 8 s each, within a
 * time budget from the first attempt, and the daemon's stop ends a wait at
 * once: an unmount with retries queued on the replication worker is quick
 * (issue 22: 41 s of 1+2+4+8 s sleeps before). */
static void *stop_later(void *arg)
{
	struct timespec ts = { 0, 200 * 1000000L };
	nanosleep(&ts, NULL);
	eng_restore_stop(arg);
	return NULL;
}

static void test_retry_wait_budget_and_stop(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	pthread_t th;
	uint64_t t0, dt;

	/* past the budget: no wait at all */
	t0 = util_now_ns();
	assert_false(eng_retry_wait(e, 0, t0, 500));
	assert_true(util_now_ns() - t0 < 100 * 1000000ull);
	/* within it: the attempt's wait (1 s), then go on */
	t0 = util_now_ns();
	assert_true(eng_retry_wait(e, 0, t0, 5000));
	dt = util_now_ns() - t0;
	assert_true(dt >= 900 * 1000000ull && dt < 3000 * 1000000ull);
	assert_false(eng_quitting(e));
	/* an 8 s wait ended by the stop 200 ms in */
	assert_int_equal(pthread_create(&th, NULL, stop_later, e), 0);
	t0 = util_now_ns();
	assert_false(eng_retry_wait(e, 5, t0, 60000));
	dt = util_now_ns() - t0;
	pthread_join(th, NULL);
	assert_true(dt < 1500 * 1000000ull);
	/* and no retry waits after it */
	assert_true(eng_quitting(e));
	t0 = util_now_ns();
	assert_false(eng_retry_wait(e, 0, t0, 60000));
	assert_true(util_now_ns() - t0 < 100 * 1000000ull);
}

/* A yaml is checked against the mount before it becomes the job record
 * the engine shares with the front (eng_take_job; eng_set_job is it and
 * the registration): refused, the record is as it was, rank included. */
static void test_take_job_checks_first(void **state)
{
	struct fixture *x = *state;
	struct eng *e = x->e;
	struct rcfg c = { .job = "j1", .framework = RCFG_FW_PYTORCH, .node_rank = 2, .nodes = 4,
			  .peers_per_node = 1, .workers_per_node = 2 };
	struct job_now now;
	char err[256] = "";

	e->rank_fixed = true;   /* as rank=3 on the mount */
	assert_int_equal(eng_take_job(e, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "node-rank: 2, but this node is rank 3"));
	jobid_get(e->jid, &now);
	assert_false(now.set);
	assert_int_equal(now.rank, 3);
	assert_int_equal(eng_rank(e), 3);

	c.node_rank = 3;
	assert_int_equal(eng_take_job(e, &c, err, sizeof(err)), 0);
	jobid_get(e->jid, &now);
	assert_true(now.set);
	assert_string_equal(now.job, "j1");
	assert_int_equal(now.rank, 3);
	assert_int_equal(now.nodes, 4);
	assert_int_equal(now.workers, 2);
	assert_true(now.save_files);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_calls_and_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout_and_interrupt, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stop_ends_restore_call, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reconnect_after_hang_up, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_wait_budget_and_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_take_job_checks_first, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
