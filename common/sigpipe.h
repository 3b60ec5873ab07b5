/* sigpipe: writes to a socket the peer reset raise SIGPIPE (sendfile(2)
 * and OpenSSL's socket BIO have no MSG_NOSIGNAL). A guard blocks it on the
 * calling thread for one transfer and swallows the signal the transfer
 * caused, leaving the process's disposition alone. Any thread; the guard
 * lives on the caller's stack. */
#ifndef MTCFS_COMMON_SIGPIPE_H
#define MTCFS_COMMON_SIGPIPE_H

#include <signal.h>
#include <stdbool.h>

struct sigpipe_guard {
	sigset_t old;
	bool was_pending;
};

void sigpipe_block(struct sigpipe_guard *g);
void sigpipe_restore(struct sigpipe_guard *g);

#endif
