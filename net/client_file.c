/* client_file.c — NT_FILE bodies of net/client (see client.h): sending a
 * file whole (sendfile, or pread + send through TLS) or as sparse extents,
 * and receiving one into an fd (recv + CRC32C + pwrite, or splice and the
 * CRC read back), holes written as zeros or left as holes. */
#include "net/client_i.h"
#include "net/tls.h"
#include "common/log.h"
#include "common/sigpipe.h"
#include "common/crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static _Atomic int rx_mode = NCONN_RX_AUTO;

void nconn_set_rx_mode(int mode)
{
	rx_mode = mode;
}

/* pread + send, for files sendfile(2) refuses. */
static int send_file_copy(struct nconn *c, int fd, uint64_t off, uint64_t size)
{
	const size_t bufsz = 1u << 20;
	uint8_t *buf = malloc(bufsz);
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	while (off < size) {
		size_t want = size - off > bufsz ? bufsz : (size_t)(size - off), sent;
		ssize_t n = pread(fd, buf, want, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		if (n == 0) {
			rc = -EIO;
			break;
		}
		rc = nconn_write_all(c, buf, (size_t)n, &sent);
		if (rc < 0)
			break;
		off += (uint64_t)n;
	}
	free(buf);
	return rc;
}

/* size bytes of fd from off to the socket: sendfile, or pread + send
 * under TLS or where sendfile refuses. -EIO when fd ends early. */
static int send_range(struct nconn *c, const char *path, int fd, uint64_t off, uint64_t size)
{
	struct sigpipe_guard g;
	off_t o = (off_t)off;
	uint64_t end = off + size;
	int rc = 0;

	if (c->ssl)
		return send_file_copy(c, fd, off, end);   /* encrypted in user space */
	sigpipe_block(&g);
	while ((uint64_t)o < end) {
		uint64_t left = end - (uint64_t)o;
		ssize_t n = sendfile(c->fd, fd, &o, left > (1u << 30) ? (1u << 30) : (size_t)left);
		if (n > 0)
			continue;
		if (n == 0) {
			rc = -EIO;
			log_err("net", "%s: %s is shorter than the %llu bytes announced",
				c->addr, path, (unsigned long long)end);
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN) {
			rc = nconn_wait_fd(c->fd, POLLOUT, nconn_deadline_after(c->io_timeout_ms));
			if (rc < 0)
				break;
			continue;
		}
		if ((errno == EINVAL || errno == ENOSYS) && (uint64_t)o == off) {
			rc = send_file_copy(c, fd, off, end);
			break;
		}
		rc = -errno;
		break;
	}
	sigpipe_restore(&g);
	return rc;
}

/* The next data extent of fd in [from, size): 1 with *off and *len, 0 when only
 * holes are left. A filesystem without SEEK_DATA reports all data. */
static int next_extent(int fd, uint64_t from, uint64_t size, uint64_t *off, uint64_t *len)
{
	off_t d, h;

	if (from >= size)
		return 0;
	d = lseek(fd, (off_t)from, SEEK_DATA);
	if (d < 0) {
		if (errno == ENXIO)
			return 0;
		if (errno != EINVAL && errno != EOPNOTSUPP)
			return -errno;
		d = (off_t)from;   /* no hole support: one extent */
		h = (off_t)size;
	} else {
		h = lseek(fd, d, SEEK_HOLE);
		if (h < 0)
			return -errno;
	}
	if ((uint64_t)d >= size)
		return 0;
	if ((uint64_t)h > size)
		h = (off_t)size;
	*off = (uint64_t)d;
	*len = (uint64_t)(h - d);
	return *len > 0;
}

/* Bytes of data extents of fd in [0, size) (holes not counted). */
static int count_data(int fd, uint64_t size, uint64_t *data)
{
	uint64_t pos = 0, off, len;
	int rc;

	*data = 0;
	while ((rc = next_extent(fd, pos, size, &off, &len)) > 0) {
		*data += len;
		pos = off + len;
	}
	return rc;
}

int nconn_send_file(struct nconn *c, const char *path, int fd, uint64_t size,
		    uint32_t crc32c)
{
	bool sparse = c->peer_sparse;
	json_t *hdr = NULL;
	uint8_t *frame = NULL;
	uint64_t data = size;
	struct stat st;
	size_t flen;
	int rc;

	if (fd < 0)
		return -EINVAL;
	/* a file shorter than announced goes the dense way, which fails it
	 * as before: a hole past its end would read as zeros it does not have */
	if (sparse && (fstat(fd, &st) < 0 || (uint64_t)st.st_size < size))
		sparse = false;
	if (sparse) {
		rc = count_data(fd, size, &data);
		if (rc < 0)
			return rc;
		rc = net_file_hdr_build_sparse(path, size, crc32c, data, &hdr);
	} else {
		rc = net_file_hdr_build(path, size, crc32c, &hdr);
	}
	if (rc < 0)
		return rc;
	rc = net_frame_build(NT_FILE, 0, hdr, &frame, &flen);
	json_decref(hdr);
	if (rc < 0)
		return rc;

	pthread_mutex_lock(&c->send_mu);
	rc = nconn_send_frame_locked(c, frame, flen);
	free(frame);
	if (rc < 0) {
		pthread_mutex_unlock(&c->send_mu);
		return rc;
	}
	if (!sparse) {
		rc = send_range(c, path, fd, 0, size);
	} else {
		uint64_t pos = 0, sent = 0, off, len;
		uint8_t eh[NET_EXT_LEN];
		size_t w;

		while (sent < data && (rc = next_extent(fd, pos, size, &off, &len)) > 0) {
			if (len > data - sent)
				len = data - sent;
			net_ext_encode(eh, off, len);
			rc = nconn_write_all(c, eh, sizeof(eh), &w);
			if (rc == 0)
				rc = send_range(c, path, fd, off, len);
			if (rc < 0)
				break;
			sent += len;
			pos = off + len;
		}
		/* the extents changed under us (the file is not immutable?): the
		 * header promised data bytes, so the stream is broken now */
		if (rc >= 0 && sent != data) {
			log_err("net", "%s: %s changed while it was sent", c->addr, path);
			rc = -EIO;
		}
		if (rc > 0)
			rc = 0;
	}
	/* the NT_FILE header promised its bytes: any shortfall breaks the stream */
	if (rc < 0)
		c->send_err = rc;
	pthread_mutex_unlock(&c->send_mu);
	return rc;
}

/* ---- receiving ---- */

static int pwrite_all(int fd, const uint8_t *p, size_t len, uint64_t off)
{
	while (len > 0) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* recv into a 1 MiB buffer as far as the socket has data, CRC it while it
 * is hot in cache, pwrite it. */
static int rx_copy(struct nconn *c, int fd, uint64_t off, uint64_t size, int timeout_ms,
		   uint32_t *crc)
{
	int rc = 0;

	if (!c->rxbuf) {
		c->rxbuf = malloc(RX_CHUNK);
		if (!c->rxbuf)
			return -ENOMEM;
	}
	while (off < size) {
		size_t want = size - off > RX_CHUNK ? RX_CHUNK : (size_t)(size - off);
		size_t have = 0;

		while (have < want) {
			short ev = POLLIN;
			ssize_t n = nconn_io_recv(c, c->rxbuf + have, want - have, &ev);
			if (n > 0) {
				have += (size_t)n;
				continue;
			}
			if (n == 0)
				return -ECONNRESET;
			if (n != -EAGAIN)
				return (int)n;
			if (have > 0)
				break;   /* write what we have while more arrives */
			rc = nconn_wait_fd(c->fd, ev, nconn_deadline_after(timeout_ms));
			if (rc < 0)
				return rc;
		}
		*crc = mf_crc32c(*crc, c->rxbuf, have);
		if (fd >= 0) {
			rc = pwrite_all(fd, c->rxbuf, have, off);
			if (rc < 0)
				return rc;
		}
		off += have;
	}
	return 0;
}

static int pipe_setup(struct nconn *c)
{
	int sz;

	if (c->pipefd[0] >= 0)
		return 0;
	if (pipe2(c->pipefd, O_CLOEXEC) < 0) {
		c->pipefd[0] = c->pipefd[1] = -1;
		return -errno;
	}
	sz = fcntl(c->pipefd[1], F_SETPIPE_SZ, (int)RX_PIPE_SZ);
	if (sz < 0)
		sz = fcntl(c->pipefd[1], F_GETPIPE_SZ);
	c->pipe_sz = sz > 0 ? (size_t)sz : 65536;
	return 0;
}

void nconn_pipe_drop(struct nconn *c)
{
	if (c->pipefd[0] >= 0) {
		close(c->pipefd[0]);
		close(c->pipefd[1]);
	}
	c->pipefd[0] = c->pipefd[1] = -1;
}

/* The destination refuses splice (O_APPEND, odd filesystems): move the n
 * bytes already in the pipe by hand, then go on with the copy path. */
static int rx_unsplice(struct nconn *c, int fd, uint64_t off, uint64_t size, size_t n,
		       int timeout_ms, uint32_t *crc)
{
	size_t have = 0;
	int rc;

	if (!c->rxbuf) {
		c->rxbuf = malloc(RX_CHUNK);
		if (!c->rxbuf)
			return -ENOMEM;
	}
	while (have < n) {
		size_t want = n - have > RX_CHUNK ? RX_CHUNK : n - have;
		ssize_t k = read(c->pipefd[0], c->rxbuf, want);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			nconn_pipe_drop(c);
			return k < 0 ? -errno : -EIO;
		}
		*crc = mf_crc32c(*crc, c->rxbuf, (size_t)k);
		rc = pwrite_all(fd, c->rxbuf, (size_t)k, off + have);
		if (rc < 0) {
			nconn_pipe_drop(c);
			return rc;
		}
		have += (size_t)k;
	}
	return rx_copy(c, fd, off + n, size, timeout_ms, crc);
}

/* socket -> pipe -> file with no copy through user space; the CRC is
 * computed afterwards from the page cache through a read-only mapping of
 * the destination (it is still in cache: the cheapest second look). */
static int rx_splice(struct nconn *c, int fd, uint64_t off, uint64_t size, int timeout_ms,
		     const uint8_t *map, uint32_t *crc)
{
	int rc;

	while (off < size) {
		uint64_t left = size - off;
		size_t want = left > c->pipe_sz ? c->pipe_sz : (size_t)left;
		ssize_t n = splice(c->fd, NULL, c->pipefd[1], NULL, want,
				   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		loff_t woff = (loff_t)off;
		size_t m;

		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -errno;
			rc = nconn_wait_fd(c->fd, POLLIN, nconn_deadline_after(timeout_ms));
			if (rc < 0)
				return rc;
			continue;
		}
		for (m = (size_t)n; m > 0;) {
			ssize_t k = splice(c->pipefd[0], NULL, fd, &woff, m, SPLICE_F_MOVE);
			if (k > 0) {
				m -= (size_t)k;
				continue;
			}
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0 && errno == EINVAL && m == (size_t)n)
				return rx_unsplice(c, fd, off, size, (size_t)n, timeout_ms, crc);
			rc = k < 0 ? -errno : -EIO;
			nconn_pipe_drop(c);   /* may hold bytes: never reuse it */
			return rc;
		}
		*crc = mf_crc32c(*crc, map + off, (size_t)n);
		off += (uint64_t)n;
	}
	return 0;
}

/* [off, end) of the file from the stream: read-ahead bytes first, then
 * the copy path. */
static int rx_range(struct nconn *c, int fd, uint64_t off, uint64_t end, int timeout_ms,
		    uint32_t *crc)
{
	if (c->pre_off < c->pre_len && off < end) {
		size_t k = c->pre_len - c->pre_off;
		int rc;

		if (k > end - off)
			k = (size_t)(end - off);
		*crc = mf_crc32c(*crc, c->pre + c->pre_off, k);
		if (fd >= 0) {
			rc = pwrite_all(fd, c->pre + c->pre_off, k, off);
			if (rc < 0)
				return rc;
		}
		c->pre_off += k;
		off += k;
	}
	return rx_copy(c, fd, off, end, timeout_ms, crc);
}

static int write_zeros(struct nconn *c, int fd, uint64_t off, uint64_t n)
{
	if (!c->rxbuf) {
		c->rxbuf = malloc(RX_CHUNK);
		if (!c->rxbuf)
			return -ENOMEM;
	}
	memset(c->rxbuf, 0, RX_CHUNK);
	while (n > 0) {
		size_t k = n > RX_CHUNK ? RX_CHUNK : (size_t)n;
		int rc = pwrite_all(fd, c->rxbuf, k, off);
		if (rc < 0)
			return rc;
		off += k;
		n -= k;
	}
	return 0;
}

/* A sparse NT_FILE: the file gets its length first (holes cost nothing),
 * then each extent at its offset; the CRC runs over the holes as zeros. */
static int recv_sparse(struct nconn *c, int fd, uint64_t size, uint64_t data, int timeout_ms,
		       uint32_t *crc)
{
	uint64_t done_to = 0, left = data, off, len;
	uint8_t eh[NET_EXT_LEN];
	size_t got;
	int rc, fl = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
	/* O_APPEND ignores offsets: there the holes are written as zeros */
	bool append = fl >= 0 && (fl & O_APPEND);

	if (fd >= 0 && !append && ftruncate(fd, (off_t)size) < 0)
		return -errno;
	while (left > 0 || (append && done_to < size)) {
		if (left == 0) {
			off = size;   /* the trailing hole */
			len = 0;
		} else {
			rc = nconn_read_exact(c, eh, sizeof(eh), nconn_deadline_after(timeout_ms), &got);
			if (rc < 0)
				return rc;
			if (net_ext_decode(eh, size, done_to, left, &off, &len) < 0) {
				log_warn("net", "%s: bad extent in a sparse file", c->addr);
				return -EBADMSG;
			}
		}
		if (append && off > done_to) {
			rc = write_zeros(c, fd, done_to, off - done_to);
			if (rc < 0)
				return rc;
		}
		*crc = net_crc32c_zeros(*crc, off - done_to);
		done_to = off;
		if (len == 0)
			continue;
		rc = rx_range(c, fd, off, off + len, timeout_ms, crc);
		if (rc < 0)
			return rc;
		done_to = off + len;
		left -= len;
	}
	*crc = net_crc32c_zeros(*crc, size - done_to);
	return 0;
}

int nconn_recv_file(struct nconn *c, int fd, uint64_t size, int timeout_ms,
		    uint32_t *crc_out)
{
	uint32_t crc = 0;
	uint64_t off = 0;
	uint8_t *map = MAP_FAILED;
	int mode = rx_mode, rc = 0;

	if (c->recv_err)
		return c->recv_err;
	if (!c->file_pending)
		return -EPROTO;
	if (size != c->file_left)
		return -EINVAL;
	c->file_pending = false;
	if (c->file_sparse) {
		rc = recv_sparse(c, fd, size, c->file_data, timeout_ms, &crc);
		goto out;
	}

	if (c->pre_off < c->pre_len) {
		size_t k = c->pre_len - c->pre_off;
		if (k > size)
			k = (size_t)size;
		crc = mf_crc32c(crc, c->pre + c->pre_off, k);
		if (fd >= 0) {
			rc = pwrite_all(fd, c->pre + c->pre_off, k, 0);
			if (rc < 0)
				goto out;
		}
		c->pre_off += k;
		off = k;
	}
	if (fd >= 0 && mode == NCONN_RX_SPLICE && !c->ssl && size - off >= RX_SPLICE_MIN &&
	    pipe_setup(c) == 0) {
		map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
		if (map != MAP_FAILED)
			madvise(map, (size_t)size, MADV_SEQUENTIAL);
	}
	if (map != MAP_FAILED) {
		rc = rx_splice(c, fd, off, size, timeout_ms, map, &crc);
		munmap(map, (size_t)size);
	} else {
		rc = rx_copy(c, fd, off, size, timeout_ms, &crc);
	}
out:
	if (rc < 0) {
		c->recv_err = rc;
		return rc;
	}
	*crc_out = crc;
	return 0;
}
