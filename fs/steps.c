/* steps.c: the step table, this node's committed steps as the namespace
 * shows them (struct fs_step, fs->steps). One entry per (step, worker): a
 * step directory is worker 0; in framework: pytorch each worker's .save
 * file is its own shard, committed, replicated and restored on its own (as
 * GKE's replicator treats each <job>-s<S>-n<r>-w<w>.save). The commit
 * (commit.c) adds and seals entries, the retention's release (retain.c)
 * removes them; every call here wants fs->mu held, except fs_steps_free. */
#include "fs/fs_i.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fs_step *fs_step_find(struct fs *fs, uint64_t step)
{
	for (size_t i = 0; i < fs->nsteps; i++)
		if (fs->steps[i].step == step)
			return &fs->steps[i];
	return NULL;
}

struct fs_step *fs_step_find_w(struct fs *fs, uint64_t step, uint32_t w)
{
	for (size_t i = 0; i < fs->nsteps; i++)
		if (fs->steps[i].step == step && fs->steps[i].worker == w)
			return &fs->steps[i];
	return NULL;
}

struct fs_step *fs_step_add(struct fs *fs, uint64_t step, uint32_t w)
{
	struct fs_step *s = fs_step_find_w(fs, step, w);
	if (s)
		return s;
	if (fs->nsteps == fs->capsteps) {
		size_t ncap = fs->capsteps ? fs->capsteps * 2 : 16;
		struct fs_step *ns = realloc(fs->steps, ncap * sizeof(*ns));
		if (!ns)
			return NULL;
		fs->steps = ns;
		fs->capsteps = ncap;
	}
	s = &fs->steps[fs->nsteps++];
	memset(s, 0, sizeof(*s));
	s->step = step;
	s->worker = w;
	return s;
}

void fs_step_remove(struct fs *fs, uint64_t step, uint32_t w)
{
	for (size_t i = 0; i < fs->nsteps; i++) {
		if (fs->steps[i].step == step && fs->steps[i].worker == w) {
			free(fs->steps[i].files);
			fs->steps[i] = fs->steps[--fs->nsteps];
			return;
		}
	}
}

void fs_step_key(const struct fs_step *s, struct shard_key *k)
{
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", s->job);
	k->step = s->step;
	k->rank = s->rank;
	k->worker = s->worker;
}

void fs_steps_free(struct fs *fs)
{
	for (size_t i = 0; i < fs->nsteps; i++)
		free(fs->steps[i].files);
	free(fs->steps);
	fs->steps = NULL;
	fs->nsteps = fs->capsteps = 0;
}
