#include "common/sigpipe.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

void sigpipe_block(struct sigpipe_guard *g)
{
	sigset_t set, pending;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	sigpending(&pending);
	g->was_pending = sigismember(&pending, SIGPIPE) == 1;
	pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

void sigpipe_restore(struct sigpipe_guard *g)
{
	struct timespec zero = { 0, 0 };
	sigset_t set, pending;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	sigpending(&pending);
	/* ours only: one that was pending before the transfer stays */
	if (!g->was_pending && sigismember(&pending, SIGPIPE) == 1)
		while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
			;
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}
