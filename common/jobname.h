/* jobname: the one rule for a job's name, wherever one arrives: the
 * job-name of replicator.yaml (cluster/rcfg), a shard key off the wire
 * (cluster/engine), a bucket path (tiers/backup), mtcfs-admin --job.
 * The name becomes the first component of store paths (JOB/STEP/...),
 * Cloud Storage object names and GKE's file names (JOB-sS-nN-wW.meta), so:
 * 1..JOB_NAME_MAX bytes of [A-Za-z0-9._-], not starting with '.' (hidden,
 * "." and "..") or '-' (read as an option). GKE's replicator checks nothing
 * itself; every name JobSet gives (a DNS-1123 label) passes.
 * Pure functions; any thread. */
#ifndef MTCFS_COMMON_JOBNAME_H
#define MTCFS_COMMON_JOBNAME_H

#include <stdbool.h>
#include <stddef.h>

#define JOB_NAME_MAX 128   /* bytes, without the NUL; a plain number (JOB_NAME_MAX_S) */

/* JOB_NAME_MAX spelled as a string literal: a scanf width ("%"
 * JOB_NAME_MAX_S "s" into char[JOB_NAME_MAX + 1]) and messages, so the
 * limit is written once */
#define JOB_NAME_STR_(n) #n
#define JOB_NAME_STR(n)  JOB_NAME_STR_(n)
#define JOB_NAME_MAX_S   JOB_NAME_STR(JOB_NAME_MAX)

/* NULL if s[0..n) is a valid job name (s need not be NUL-terminated; a NUL
 * inside is an invalid character), else a static reason for a message
 * ("it is empty", "it is longer than 128 bytes", "it must not start with
 * '.' or '-'", "it may contain only letters, digits, '.', '_' and '-'").
 * For the last one *bad receives the first offending byte; else *bad is
 * left alone. bad must not be NULL. */
const char *job_name_problem(const char *s, size_t n, char *bad);

/* job_name_problem() == NULL for the NUL-terminated s; false for NULL. */
bool job_name_ok(const char *s);

#endif /* MTCFS_COMMON_JOBNAME_H */
