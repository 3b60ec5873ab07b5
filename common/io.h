/* io: whole-buffer read/write/pread/pwrite. A system call may move fewer
 * bytes than asked, or be interrupted by a signal (EINTR) before moving
 * any; these loops retry both, so that a caller sees only "all of it", an
 * early end of file, or a real error. Thread-safe, no global state. */
#ifndef MTCFS_COMMON_IO_H
#define MTCFS_COMMON_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Write all len bytes. 0 or -errno. */
int io_write_full(int fd, const void *buf, size_t len);
/* Write all len bytes at off (the file offset is not moved). 0 or -errno. */
int io_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
/* Read exactly len bytes; an end of file before that is -EBADMSG (the data
 * is shorter than its header or size said). 0 or -errno. */
int io_read_full(int fd, void *buf, size_t len);
/* Read exactly len bytes at off; an early end of file is -EBADMSG. */
int io_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* Read until len bytes or end of file: the bytes read (< len only at end
 * of file), or -errno. For callers that size the data themselves. */
ssize_t io_read_upto(int fd, void *buf, size_t len);

#endif
