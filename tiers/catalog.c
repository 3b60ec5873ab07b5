#include "tiers/catalog.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lmdb.h>

struct idx {
	MDB_env *env;
	MDB_dbi shards, meta;
	bool ro;
};

/* Record header stored before the manifest bytes; fixed layout, versioned. */
struct rec_v1 {
	uint32_t version;
	uint32_t state, flags, nfiles;
	uint64_t bytes, commit_time, ns_ino;
	uint8_t hash[32];
};

static int idx_errno(int rc)
{
	switch (rc) {
	case MDB_SUCCESS: return 0;
	case MDB_NOTFOUND: return -ENOENT;
	case MDB_MAP_FULL: return -ENOSPC;
	case MDB_KEYEXIST: return -EEXIST;
	case MDB_INVALID: case MDB_CORRUPTED: case MDB_VERSION_MISMATCH: return -EBADMSG;
	default: return rc > 0 ? -rc : -EIO;
	}
}

const char *shard_state_name(uint32_t s)
{
	switch (s) {
	case SH_SEALING: return "sealing";
	case SH_COMMITTED: return "committed";
	case SH_REPLICATED: return "replicated";
	case SH_BACKED_UP: return "backed-up";
	case SH_BAD: return "bad";
	case SH_DROPPING: return "dropping";
	default: return "unknown";
	}
}

int idx_open(const char *dir, bool readonly, struct idx **out)
{
	struct idx *x;
	MDB_txn *txn = NULL;
	int rc;

	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->ro = readonly;
	if (!readonly)
		mkdir(dir, 0700);
	rc = mdb_env_create(&x->env);
	if (rc)
		goto fail;
	mdb_env_set_maxdbs(x->env, 4);
	mdb_env_set_mapsize(x->env, 1ULL << 30);
	mdb_env_set_maxreaders(x->env, 256);
	/* RAMDIR is tmpfs: fsync buys nothing, and LMDB stays consistent across
	 * a crash of the process without it. */
	rc = mdb_env_open(x->env, dir, MDB_NOTLS | MDB_NOSYNC | MDB_NOMETASYNC |
			  (readonly ? MDB_RDONLY : 0), 0600);
	if (rc)
		goto fail;
	rc = mdb_txn_begin(x->env, NULL, readonly ? MDB_RDONLY : 0, &txn);
	if (rc)
		goto fail;
	rc = mdb_dbi_open(txn, "shards", readonly ? 0 : MDB_CREATE, &x->shards);
	if (!rc)
		rc = mdb_dbi_open(txn, "meta", readonly ? 0 : MDB_CREATE, &x->meta);
	if (rc) {
		mdb_txn_abort(txn);
		goto fail;
	}
	rc = mdb_txn_commit(txn);
	if (rc)
		goto fail;
	*out = x;
	return 0;
fail:
	log_err("catalog", "open %s: %s", dir, mdb_strerror(rc));
	if (x->env)
		mdb_env_close(x->env);
	free(x);
	return idx_errno(rc);
}

void idx_close(struct idx *x)
{
	if (!x)
		return;
	mdb_env_close(x->env);
	free(x);
}

/* key: job bytes, NUL, step (BE64), rank (BE32), worker (BE32): sorts by job then step */
static size_t make_key(const struct shard_key *k, uint8_t *buf)
{
	size_t jl = strnlen(k->job, IDX_JOB_MAX), o;
	memcpy(buf, k->job, jl);
	buf[jl] = 0;
	o = jl + 1;
	for (int i = 7; i >= 0; i--)
		buf[o++] = (uint8_t)(k->step >> (8 * i));
	for (int i = 3; i >= 0; i--)
		buf[o++] = (uint8_t)(k->rank >> (8 * i));
	for (int i = 3; i >= 0; i--)
		buf[o++] = (uint8_t)(k->worker >> (8 * i));
	return o;
}

static int parse_key(const MDB_val *v, struct shard_key *k)
{
	const uint8_t *p = v->mv_data;
	const uint8_t *z = memchr(p, 0, v->mv_size);
	size_t jl, o;

	if (!z || (size_t)(z - p) > IDX_JOB_MAX || v->mv_size != (size_t)(z - p) + 1 + 16)
		return -EBADMSG;
	jl = (size_t)(z - p);
	memcpy(k->job, p, jl);
	k->job[jl] = 0;
	o = jl + 1;
	k->step = 0;
	for (int i = 0; i < 8; i++)
		k->step = k->step << 8 | p[o++];
	k->rank = 0;
	for (int i = 0; i < 4; i++)
		k->rank = k->rank << 8 | p[o++];
	k->worker = 0;
	for (int i = 0; i < 4; i++)
		k->worker = k->worker << 8 | p[o++];
	return 0;
}

static int decode_val(const MDB_val *v, struct shard_rec *rec)
{
	struct rec_v1 h;
	if (v->mv_size < sizeof(h))
		return -EBADMSG;
	memcpy(&h, v->mv_data, sizeof(h));
	if (h.version != 1)
		return -EBADMSG;
	rec->state = h.state;
	rec->flags = h.flags;
	rec->nfiles = h.nfiles;
	rec->bytes = h.bytes;
	rec->commit_time = h.commit_time;
	rec->ns_ino = h.ns_ino;
	memcpy(rec->hash, h.hash, 32);
	rec->mflen = v->mv_size - sizeof(h);
	rec->mf = NULL;
	if (rec->mflen) {
		rec->mf = malloc(rec->mflen);
		if (!rec->mf)
			return -ENOMEM;
		memcpy(rec->mf, (const uint8_t *)v->mv_data + sizeof(h), rec->mflen);
	}
	return 0;
}

int idx_put_shard(struct idx *x, const struct shard_rec *rec)
{
	uint8_t kb[IDX_JOB_MAX + 32];
	struct rec_v1 h = { 0 };
	MDB_val k, v;
	MDB_txn *txn;
	int rc;

	if (x->ro)
		return -EROFS;
	h.version = 1;
	h.state = rec->state;
	h.flags = rec->flags;
	h.nfiles = rec->nfiles;
	h.bytes = rec->bytes;
	h.commit_time = rec->commit_time;
	h.ns_ino = rec->ns_ino;
	memcpy(h.hash, rec->hash, 32);
	k.mv_data = kb;
	k.mv_size = make_key(&rec->key, kb);
	v.mv_size = sizeof(h) + rec->mflen;
	rc = mdb_txn_begin(x->env, NULL, 0, &txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_put(txn, x->shards, &k, &v, MDB_RESERVE);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	memcpy(v.mv_data, &h, sizeof(h));
	if (rec->mflen)
		memcpy((uint8_t *)v.mv_data + sizeof(h), rec->mf, rec->mflen);
	return idx_errno(mdb_txn_commit(txn));
}

int idx_get_shard(struct idx *x, const struct shard_key *key, struct shard_rec *rec)
{
	uint8_t kb[IDX_JOB_MAX + 32];
	MDB_val k, v;
	MDB_txn *txn;
	int rc;

	k.mv_data = kb;
	k.mv_size = make_key(key, kb);
	rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_get(txn, x->shards, &k, &v);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	rec->key = *key;
	rc = decode_val(&v, rec);
	mdb_txn_abort(txn);
	if (rc == 0 && rec->state == SH_DROPPING) {
		idx_rec_clear(rec);
		return -ENOENT;   /* gone, as far as readers are concerned */
	}
	return rc;
}

int idx_del_shard(struct idx *x, const struct shard_key *key)
{
	uint8_t kb[IDX_JOB_MAX + 32];
	MDB_val k;
	MDB_txn *txn;
	int rc;

	if (x->ro)
		return -EROFS;
	k.mv_data = kb;
	k.mv_size = make_key(key, kb);
	rc = mdb_txn_begin(x->env, NULL, 0, &txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_del(txn, x->shards, &k, NULL);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	return idx_errno(mdb_txn_commit(txn));
}

/* Begin a write transaction and find key's record (at least its header):
 * on 0 the caller owns *txn (commit or abort) and v points into it; on
 * -errno nothing is left open. kb holds the encoded key (IDX_JOB_MAX + 32). */
static int rec_begin(struct idx *x, const struct shard_key *key, uint8_t *kb, MDB_val *k,
		     MDB_txn **txn, MDB_val *v)
{
	int rc;

	if (x->ro)
		return -EROFS;
	k->mv_data = kb;
	k->mv_size = make_key(key, kb);
	rc = mdb_txn_begin(x->env, NULL, 0, txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_get(*txn, x->shards, k, v);
	if (rc || v->mv_size < sizeof(struct rec_v1)) {
		mdb_txn_abort(*txn);
		return rc ? idx_errno(rc) : -EBADMSG;
	}
	return 0;
}

int idx_set_state(struct idx *x, const struct shard_key *key, uint32_t state,
		  uint32_t set_flags, uint32_t clear_flags)
{
	uint8_t kb[IDX_JOB_MAX + 32];
	MDB_val k, v;
	MDB_txn *txn;
	struct rec_v1 h;
	void *copy;
	int rc;

	if ((rc = rec_begin(x, key, kb, &k, &txn, &v)) < 0)
		return rc;
	copy = malloc(v.mv_size);
	if (!copy) {
		mdb_txn_abort(txn);
		return -ENOMEM;
	}
	memcpy(copy, v.mv_data, v.mv_size);
	memcpy(&h, copy, sizeof(h));
	if (h.state == SH_DROPPING && state != SH_DROPPING) {
		/* a shard being dropped cannot be brought back by a state change */
		free(copy);
		mdb_txn_abort(txn);
		return -ENOENT;
	}
	if (state)
		h.state = state;
	h.flags = (h.flags | set_flags) & ~clear_flags;
	memcpy(copy, &h, sizeof(h));
	v.mv_data = copy;
	rc = mdb_put(txn, x->shards, &k, &v, 0);
	free(copy);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	return idx_errno(mdb_txn_commit(txn));
}

void idx_rec_clear(struct shard_rec *rec)
{
	if (!rec)
		return;
	free(rec->mf);
	rec->mf = NULL;
	rec->mflen = 0;
}

void idx_recs_free(struct shard_rec *recs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		idx_rec_clear(&recs[i]);
	free(recs);
}

/* One read transaction over every shard record: fn(arg, key, value) for
 * each, in key order; fn returns 0 to go on or -errno to stop with it.
 * 0, fn's error, or the LMDB error as -errno. */
static int shards_scan(struct idx *x, int (*fn)(void *arg, const MDB_val *k, const MDB_val *v),
		       void *arg)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	int rc, err = 0, op = MDB_FIRST;

	rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_cursor_open(txn, x->shards, &cur);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	while ((rc = mdb_cursor_get(cur, &k, &v, (MDB_cursor_op)op)) == 0) {
		op = MDB_NEXT;
		if ((err = fn(arg, &k, &v)) < 0)
			break;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (err < 0)
		return err;
	return rc == MDB_NOTFOUND ? 0 : idx_errno(rc);
}

struct list_acc {
	const char *job;
	bool parity;         /* parity holdings too */
	struct shard_rec *recs;
	size_t n, cap;
};

static int list_one(void *arg, const MDB_val *k, const MDB_val *v)
{
	struct list_acc *a = arg;
	struct shard_rec r = { 0 }, *nr;

	if (parse_key(k, &r.key) < 0)
		return 0;
	if (a->job && strcmp(a->job, r.key.job))
		return 0;
	nr = util_grow(a->recs, a->n, &a->cap, sizeof(*nr), 16);
	if (!nr)
		return -ENOMEM;
	a->recs = nr;
	if (decode_val(v, &r) < 0)
		return 0;
	if (r.state == SH_DROPPING || (!a->parity && (r.flags & SHF_PARITY))) {
		idx_rec_clear(&r);
		return 0;
	}
	a->recs[a->n++] = r;
	return 0;
}

static int list_recs(struct idx *x, const char *job, bool parity, struct shard_rec **recsp,
		     size_t *np)
{
	struct list_acc a = { .job = job, .parity = parity };
	int rc = shards_scan(x, list_one, &a);

	if (rc < 0) {
		idx_recs_free(a.recs, a.n);
		return rc;
	}
	*recsp = a.recs;
	*np = a.n;
	return 0;
}

int idx_list_shards(struct idx *x, const char *job, struct shard_rec **recsp, size_t *np)
{
	return list_recs(x, job, false, recsp, np);
}

int idx_list_records(struct idx *x, const char *job, struct shard_rec **recsp, size_t *np)
{
	return list_recs(x, job, true, recsp, np);
}

int idx_forget_dropping(struct idx *x, const struct shard_key *key)
{
	uint8_t kb[IDX_JOB_MAX + 32];
	struct rec_v1 h;
	MDB_val k, v;
	MDB_txn *txn;
	int rc;

	if ((rc = rec_begin(x, key, kb, &k, &txn, &v)) < 0)
		return rc;
	memcpy(&h, v.mv_data, sizeof(h));
	if (h.state != SH_DROPPING) {
		mdb_txn_abort(txn);
		return -EBUSY;
	}
	rc = mdb_del(txn, x->shards, &k, NULL);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	return idx_errno(mdb_txn_commit(txn));
}

struct dropping_acc {
	struct shard_key *keys;
	size_t n, cap;
};

static int dropping_one(void *arg, const MDB_val *k, const MDB_val *v)
{
	struct dropping_acc *a = arg;
	struct shard_key key, *nk;
	struct rec_v1 h;

	if (v->mv_size < sizeof(h) || parse_key(k, &key) < 0)
		return 0;
	memcpy(&h, v->mv_data, sizeof(h));
	if (h.version != 1 || h.state != SH_DROPPING)
		return 0;
	nk = util_grow(a->keys, a->n, &a->cap, sizeof(*nk), 8);
	if (!nk)
		return -ENOMEM;
	a->keys = nk;
	a->keys[a->n++] = key;
	return 0;
}

int idx_list_dropping(struct idx *x, struct shard_key **keysp, size_t *np)
{
	struct dropping_acc a = { 0 };
	int rc = shards_scan(x, dropping_one, &a);

	if (rc < 0) {
		free(a.keys);
		return rc;
	}
	*keysp = a.keys;
	*np = a.n;
	return 0;
}

/* One write transaction on the meta table: put name = val, or (del) remove
 * name, a missing name not being an error. */
static int meta_write(struct idx *x, const char *name, bool del, const void *val, size_t len)
{
	MDB_val k = { strlen(name), (void *)name }, v = { len, (void *)val };
	MDB_txn *txn;
	int rc;

	if (x->ro)
		return -EROFS;
	rc = mdb_txn_begin(x->env, NULL, 0, &txn);
	if (rc)
		return idx_errno(rc);
	rc = del ? mdb_del(txn, x->meta, &k, NULL) : mdb_put(txn, x->meta, &k, &v, 0);
	if (rc && !(del && rc == MDB_NOTFOUND)) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	return idx_errno(mdb_txn_commit(txn));
}

int idx_put_meta(struct idx *x, const char *name, const void *val, size_t len)
{
	return meta_write(x, name, false, val, len);
}

int idx_get_meta(struct idx *x, const char *name, void **valp, size_t *lenp)
{
	MDB_val k = { strlen(name), (void *)name }, v;
	MDB_txn *txn;
	int rc;

	rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return idx_errno(rc);
	rc = mdb_get(txn, x->meta, &k, &v);
	if (rc) {
		mdb_txn_abort(txn);
		return idx_errno(rc);
	}
	*valp = malloc(v.mv_size + 1);
	if (!*valp) {
		mdb_txn_abort(txn);
		return -ENOMEM;
	}
	memcpy(*valp, v.mv_data, v.mv_size);
	((char *)*valp)[v.mv_size] = 0;
	*lenp = v.mv_size;
	mdb_txn_abort(txn);
	return 0;
}

int idx_del_meta(struct idx *x, const char *name)
{
	return meta_write(x, name, true, NULL, 0);
}
