/* crc32c: CRC32C (Castagnoli), the checksum of every file byte mtcfs moves:
 * manifests (tiers/), frame and file headers (net/), Cloud Storage objects.
 * It lives at the bottom so net/ need not reach up into tiers/ for it.
 * Pure functions over caller-owned memory; any thread may call them.
 * (The mf_ prefix is the one these had in tiers/manifest.h; a rename is
 * left for after the parallel work on their callers has landed.) */
#ifndef MTCFS_COMMON_CRC32C_H
#define MTCFS_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C (Castagnoli) of a buffer, continuing from crc (start with 0). */
uint32_t mf_crc32c(uint32_t crc, const void *buf, size_t len);
/* CRC32C of a whole file by fd; also returns its size. 0 or -errno. */
int mf_crc32c_fd(int fd, uint32_t *crc, uint64_t *size);

#endif /* MTCFS_COMMON_CRC32C_H */
