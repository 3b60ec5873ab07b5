/* replicator.yaml: a first pass over the libyaml events reports YAML syntax
 * errors ahead of anything else and bounds nesting; the second pass reads the
 * events against a fixed grammar (mapping of known keys -> scalar or sequence
 * of scalars), expanding $VARs per scalar; then the cross-key rules are
 * checked.  Only the first error is reported.
 */
#include "fs/rcfg.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#define VALUE_MAX   4096 /* a scalar after $VAR expansion, bytes */
#define VARNAME_MAX 255
#define DEPTH_MAX   8    /* collection nesting; the grammar needs 2 */
#define QUOTE_SHOW  64   /* value bytes shown in a message before "..." */
#define QBUF        (QUOTE_SHOW * 4 + 8)

#define TAG_STR "tag:yaml.org,2002:str"
#define TAG_INT "tag:yaml.org,2002:int"
#define TAG_SEQ "tag:yaml.org,2002:seq"
#define TAG_MAP "tag:yaml.org,2002:map"

enum key_id {
	K_JOB, K_FRAMEWORK, K_NODE_RANK, K_NODES, K_PEER_RANKS, K_PEERS_PER_NODE,
	K_MINUTES, K_STEPS, K_DP, K_WORKERS, K_COUNT
};

enum key_type { T_STR, T_INT, T_INTLIST };

/* min/max are checked as each value is read; limits that involve another key
 * (node-rank < nodes, ...) are checked once the whole mapping is read. */
static const struct key_def {
	const char *name;
	enum key_type type;
	long long min, max;
} keys[K_COUNT] = {
	[K_JOB]            = { "job-name",                T_STR,     0, 0 },
	[K_FRAMEWORK]      = { "framework",               T_STR,     0, 0 },
	[K_NODE_RANK]      = { "node-rank",               T_INT,     0, INT_MAX },
	[K_NODES]          = { "nodes",                   T_INT,     1, RCFG_NODES_MAX },
	[K_PEER_RANKS]     = { "peer-ranks",              T_INTLIST, 0, INT_MAX },
	[K_PEERS_PER_NODE] = { "peers-per-node",          T_INT,     0, RCFG_PEERS_MAX },
	[K_MINUTES]        = { "backup-interval-minutes", T_INT,     1, RCFG_MINUTES_MAX },
	[K_STEPS]          = { "backup-interval-steps",   T_INT,     1, RCFG_STEPS_MAX },
	[K_DP]             = { "assume-data-parallelism", T_INT,     1, RCFG_NODES_MAX },
	[K_WORKERS]        = { "workers-per-node",        T_INT,     1, RCFG_WORKERS_MAX },
};

static const char *const fw_names[] = {
	[RCFG_FW_ORBAX]               = "orbax",
	[RCFG_FW_PYTORCH_DISTRIBUTED] = "pytorch.distributed",
	[RCFG_FW_PYTORCH]             = "pytorch",
};
#define FW_COUNT ((int)(sizeof fw_names / sizeof fw_names[0]))

struct parse {
	yaml_parser_t yp;
	const char *(*getenv_fn)(const char *name);
	char *err;
	size_t errlen;
	int failed;

	unsigned seen;                  /* bit per enum key_id */
	size_t line[K_COUNT];           /* 1-based line of each key seen */
	long long ival[K_COUNT];
	int *list;                      /* peer-ranks, RCFG_PEERS_MAX slots */
	int nlist;
	char job[RCFG_JOB_MAX + 1];
	enum rcfg_framework fw;

	char val[VALUE_MAX + 1];        /* the current scalar, expanded */
	size_t vlen;
	char raw[QBUF];                 /* the current scalar as written, quoted,
	                                   when expansion changed it; else "" */
};

__attribute__((format(printf, 2, 3)))
static int fail(struct parse *p, const char *fmt, ...)
{
	if (!p->failed && p->err && p->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(p->err, p->errlen, fmt, ap);
		va_end(ap);
	}
	p->failed = 1;
	return -EINVAL;
}

/* "text" with C-style escapes for anything unprintable, cut after
 * QUOTE_SHOW bytes; returns dst. */
static const char *quote(char dst[QBUF], const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	dst[o++] = '"';
	for (size_t i = 0; i < n && i < QUOTE_SHOW; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\') {
			dst[o++] = '\\';
			dst[o++] = (char)c;
		} else if (c >= 0x20 && c < 0x7f) {
			dst[o++] = (char)c;
		} else {
			dst[o++] = '\\';
			dst[o++] = 'x';
			dst[o++] = hex[c >> 4];
			dst[o++] = hex[c & 15];
		}
	}
	if (n > QUOTE_SHOW) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o++] = '"';
	dst[o] = '\0';
	return dst;
}

static const char *quote_z(char dst[QBUF], const yaml_char_t *s)
{
	return quote(dst, (const char *)s, strlen((const char *)s));
}

static const char *node_kind(const yaml_event_t *ev)
{
	switch (ev->type) {
	case YAML_SEQUENCE_START_EVENT:
		return "a list";
	case YAML_MAPPING_START_EVENT:
		return "a mapping";
	case YAML_ALIAS_EVENT:
		return "an alias";
	case YAML_SCALAR_EVENT:
		return ev->data.scalar.length ? "a scalar" : "an empty value";
	default:
		return "no value";
	}
}

static size_t ev_line(const yaml_event_t *ev)
{
	return ev->start_mark.line + 1;
}

static int next_event(struct parse *p, yaml_event_t *ev)
{
	const yaml_parser_t *y = &p->yp;
	const char *problem;

	if (yaml_parser_parse(&p->yp, ev))
		return 0;
	problem = y->problem ? y->problem : "unknown error";
	switch (y->error) {
	case YAML_MEMORY_ERROR:
		fail(p, "out of memory while parsing YAML");
		return -ENOMEM;
	case YAML_READER_ERROR:
		if (y->problem_value != -1)
			return fail(p, "invalid YAML: %s (#%X at byte offset %zu)", problem,
			            (unsigned)y->problem_value, y->problem_offset);
		return fail(p, "invalid YAML: %s (at byte offset %zu)", problem, y->problem_offset);
	default:
		if (y->context)
			return fail(p, "invalid YAML at line %zu, column %zu: %s (%s at line %zu)",
			            y->problem_mark.line + 1, y->problem_mark.column + 1, problem,
			            y->context, y->context_mark.line + 1);
		return fail(p, "invalid YAML at line %zu, column %zu: %s", y->problem_mark.line + 1,
		            y->problem_mark.column + 1, problem);
	}
}

/* Rejects what this grammar has no use for: aliases, anchors, and tags
 * other than the standard ones of the expected node kind. */
static int check_node(struct parse *p, const yaml_event_t *ev, const char *subj)
{
	const yaml_char_t *anchor = NULL, *tag = NULL;
	char q[QBUF];
	int tag_ok = 1;

	switch (ev->type) {
	case YAML_ALIAS_EVENT:
		anchor = ev->data.alias.anchor;
		return fail(p, "line %zu: %s: aliases are not supported (found alias %s)",
		            ev_line(ev), subj, quote_z(q, anchor));
	case YAML_SCALAR_EVENT:
		anchor = ev->data.scalar.anchor;
		tag = ev->data.scalar.tag;
		tag_ok = !tag || !strcmp((const char *)tag, "!") ||
		         !strcmp((const char *)tag, TAG_STR) || !strcmp((const char *)tag, TAG_INT);
		break;
	case YAML_SEQUENCE_START_EVENT:
		anchor = ev->data.sequence_start.anchor;
		tag = ev->data.sequence_start.tag;
		tag_ok = !tag || !strcmp((const char *)tag, TAG_SEQ);
		break;
	case YAML_MAPPING_START_EVENT:
		anchor = ev->data.mapping_start.anchor;
		tag = ev->data.mapping_start.tag;
		tag_ok = !tag || !strcmp((const char *)tag, TAG_MAP);
		break;
	default:
		break;
	}
	if (anchor)
		return fail(p, "line %zu: %s: anchors are not supported (found anchor %s)",
		            ev_line(ev), subj, quote_z(q, anchor));
	if (!tag_ok)
		return fail(p, "line %zu: %s: unsupported tag %s", ev_line(ev), subj,
		            quote_z(q, tag));
	return 0;
}

static int name_start(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int name_char(char c)
{
	return name_start(c) || (c >= '0' && c <= '9');
}

static const char *env_default(const char *name)
{
	return getenv(name);
}

/* Expands $NAME / ${NAME} of the scalar ev into p->val. */
static int expand(struct parse *p, const yaml_event_t *ev, const char *subj)
{
	const char *in = (const char *)ev->data.scalar.value;
	size_t n = ev->data.scalar.length, o = 0, line = ev_line(ev);
	char q[QBUF];

	p->raw[0] = '\0';
	if (memchr(in, '\0', n))
		return fail(p, "line %zu: %s: value %s contains a NUL character", line, subj,
		            quote(q, in, n));
	for (size_t i = 0; i < n;) {
		size_t ns, nl = 0, adv;
		char name[VARNAME_MAX + 1];
		const char *v;
		size_t vl;

		if (in[i] == '$' && i + 1 < n && in[i + 1] == '{') {
			ns = i + 2;
			while (ns + nl < n && in[ns + nl] != '}')
				nl++;
			if (ns + nl >= n)
				return fail(p, "line %zu: %s: unterminated \"${\" in %s", line,
				            subj, quote(q, in, n));
			for (size_t j = 0; j < nl; j++)
				if (!(j ? name_char(in[ns + j]) : name_start(in[ns + j])))
					nl = 0; /* an invalid name is treated like an empty one */
			if (nl == 0)
				return fail(p,
				            "line %zu: %s: invalid variable reference in %s "
				            "(names are [A-Za-z_][A-Za-z0-9_]*)",
				            line, subj, quote(q, in, n));
			adv = nl + 3;
		} else if (in[i] == '$' && i + 1 < n && name_start(in[i + 1])) {
			ns = i + 1;
			while (ns + nl < n && name_char(in[ns + nl]))
				nl++;
			adv = nl + 1;
		} else {
			if (o >= VALUE_MAX)
				goto toolong;
			p->val[o++] = in[i++];
			continue;
		}
		if (nl > VARNAME_MAX)
			return fail(p,
			            "line %zu: %s: variable name longer than %d characters in %s",
			            line, subj, VARNAME_MAX, quote(q, in, n));
		memcpy(name, in + ns, nl);
		name[nl] = '\0';
		v = p->getenv_fn(name);
		if (!v)
			return fail(p, "line %zu: %s: environment variable %s is not set", line,
			            subj, name);
		vl = strlen(v);
		if (vl > VALUE_MAX - o)
			goto toolong;
		memcpy(p->val + o, v, vl);
		o += vl;
		i += adv;
	}
	p->val[o] = '\0';
	p->vlen = o;
	if (o != n || memcmp(p->val, in, n) != 0)
		quote(p->raw, in, n);
	return 0;
toolong:
	return fail(p, "line %zu: %s: value %s is longer than %d bytes after expansion", line, subj,
	            quote(q, in, n), VALUE_MAX);
}

/* " (from "$X")" when the value came out of an expansion, else "". */
static const char *from(const struct parse *p, char buf[QBUF + 16])
{
	if (!p->raw[0])
		return "";
	snprintf(buf, QBUF + 16, " (from %s)", p->raw);
	return buf;
}

/* Reads the scalar ev as an integer in [min, max]; subj names it in messages. */
static int scalar_int(struct parse *p, const yaml_event_t *ev, const char *subj, long long min,
                      long long max, long long *out)
{
	char q[QBUF], f[QBUF + 16];
	const char *s;
	char *end;
	size_t i = 0;
	long long v;
	int rc;

	rc = expand(p, ev, subj);
	if (rc)
		return rc;
	s = p->val;
	if (p->vlen == 0)
		return fail(p, "line %zu: %s expects an integer, got an empty value%s", ev_line(ev),
		            subj, from(p, f));
	if (s[0] == '+' || s[0] == '-')
		i = 1;
	if (i == p->vlen)
		goto notint;
	for (; i < p->vlen; i++)
		if (s[i] < '0' || s[i] > '9')
			goto notint;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno == ERANGE || end != s + p->vlen || v > INT_MAX || v < INT_MIN)
		return fail(p, "line %zu: %s: %s is too large%s", ev_line(ev), subj,
		            quote(q, s, p->vlen), from(p, f));
	if (v < 0 || s[0] == '-')   /* "-0" too: the sign says what was meant */
		return fail(p, "line %zu: %s must not be negative, got %s%lld%s", ev_line(ev), subj,
		            v == 0 ? "-" : "", v, from(p, f));
	if (v < min)
		return fail(p, "line %zu: %s must be at least %lld, got %lld%s", ev_line(ev), subj,
		            min, v, from(p, f));
	if (v > max)
		return fail(p, "line %zu: %s must be at most %lld, got %lld%s", ev_line(ev), subj,
		            max, v, from(p, f));
	*out = v;
	return 0;
notint:
	return fail(p, "line %zu: %s expects a non-negative integer, got %s%s", ev_line(ev), subj,
	            quote(q, s, p->vlen), from(p, f));
}

/* NULL if s[0..n) may be a job name (it becomes a file and object name),
 * else what is wrong with it. */
static const char *job_name_problem(const char *s, size_t n, char *bad)
{
	if (n == 0)
		return "it is empty";
	if (n > RCFG_JOB_MAX)
		return "it is longer than 128 bytes";
	if (s[0] == '.' || s[0] == '-')
		return "it must not start with '.' or '-'";
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-')) {
			*bad = c;
			return "it may contain only letters, digits, '.', '_' and '-'";
		}
	}
	return NULL;
}

static int set_string(struct parse *p, enum key_id k, const yaml_event_t *ev)
{
	char q[QBUF], f[QBUF + 16], bad = 0, subj[64];
	const char *why;
	int rc;

	snprintf(subj, sizeof subj, "'%s'", keys[k].name);
	rc = expand(p, ev, subj);
	if (rc)
		return rc;
	if (k == K_FRAMEWORK) {
		for (int i = 0; i < FW_COUNT; i++) {
			if (strlen(fw_names[i]) == p->vlen &&
			    !memcmp(fw_names[i], p->val, p->vlen)) {
				p->fw = (enum rcfg_framework)i;
				return 0;
			}
		}
		return fail(p, "line %zu: 'framework' %s%s is not one of orbax, "
		            "pytorch.distributed, pytorch",
		            ev_line(ev), quote(q, p->val, p->vlen), from(p, f));
	}
	why = job_name_problem(p->val, p->vlen, &bad);
	if (why) {
		char ch[32] = "";
		if (bad >= 0x20 && bad < 0x7f)
			snprintf(ch, sizeof ch, " (found '%c')", bad);
		else if (bad)
			snprintf(ch, sizeof ch, " (found byte 0x%02X)", (unsigned char)bad);
		return fail(p, "line %zu: 'job-name' %s%s cannot be used as a file name: %s%s",
		            ev_line(ev), quote(q, p->val, p->vlen), from(p, f), why, ch);
	}
	memcpy(p->job, p->val, p->vlen);
	p->job[p->vlen] = '\0';
	return 0;
}

static int parse_list(struct parse *p, enum key_id k)
{
	char subj[64];
	int rc = 0;

	snprintf(subj, sizeof subj, "'%s' entry", keys[k].name);
	if (!p->list) {
		p->list = calloc(RCFG_PEERS_MAX, sizeof *p->list);
		if (!p->list) {
			fail(p, "out of memory");
			return -ENOMEM;
		}
	}
	for (;;) {
		yaml_event_t ev;
		long long v = 0;

		rc = next_event(p, &ev);
		if (rc)
			return rc;
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			return 0;
		}
		rc = check_node(p, &ev, subj);
		if (!rc && ev.type != YAML_SCALAR_EVENT)
			rc = fail(p, "line %zu: %s must be an integer, got %s", ev_line(&ev), subj,
			          node_kind(&ev));
		if (!rc && p->nlist >= RCFG_PEERS_MAX)
			rc = fail(p, "line %zu: '%s' has more than %d entries", ev_line(&ev),
			          keys[k].name, RCFG_PEERS_MAX);
		if (!rc)
			rc = scalar_int(p, &ev, subj, keys[k].min, keys[k].max, &v);
		yaml_event_delete(&ev);
		if (rc)
			return rc;
		p->list[p->nlist++] = (int)v;
	}
}

static int parse_value(struct parse *p, enum key_id k)
{
	yaml_event_t ev;
	char subj[64], q[QBUF] = "";
	int rc;

	snprintf(subj, sizeof subj, "'%s'", keys[k].name);
	rc = next_event(p, &ev);
	if (rc)
		return rc;
	rc = check_node(p, &ev, subj);
	if (rc)
		goto out;
	switch (keys[k].type) {
	case T_STR:
		if (ev.type != YAML_SCALAR_EVENT)
			rc = fail(p, "line %zu: %s expects a string, got %s", ev_line(&ev), subj,
			          node_kind(&ev));
		else
			rc = set_string(p, k, &ev);
		break;
	case T_INT:
		if (ev.type != YAML_SCALAR_EVENT)
			rc = fail(p, "line %zu: %s expects an integer, got %s", ev_line(&ev), subj,
			          node_kind(&ev));
		else
			rc = scalar_int(p, &ev, subj, keys[k].min, keys[k].max, &p->ival[k]);
		break;
	case T_INTLIST:
		if (ev.type == YAML_SCALAR_EVENT)
			rc = fail(p, "line %zu: %s expects a list of integers such as [1, 2], "
			          "got %s", ev_line(&ev), subj,
			          quote(q, (const char *)ev.data.scalar.value,
			                ev.data.scalar.length));
		else if (ev.type != YAML_SEQUENCE_START_EVENT)
			rc = fail(p, "line %zu: %s expects a list of integers, got %s",
			          ev_line(&ev), subj, node_kind(&ev));
		else
			rc = parse_list(p, k);
		break;
	}
out:
	yaml_event_delete(&ev);
	return rc;
}

static int parse_mapping(struct parse *p)
{
	for (;;) {
		yaml_event_t ev;
		char q[QBUF];
		const char *kname;
		size_t klen, line;
		int rc, k;

		rc = next_event(p, &ev);
		if (rc)
			return rc;
		if (ev.type == YAML_MAPPING_END_EVENT) {
			yaml_event_delete(&ev);
			return 0;
		}
		line = ev_line(&ev);
		rc = check_node(p, &ev, "key");
		if (!rc && ev.type != YAML_SCALAR_EVENT)
			rc = fail(p, "line %zu: keys must be names, got %s", line, node_kind(&ev));
		if (rc) {
			yaml_event_delete(&ev);
			return rc;
		}
		kname = (const char *)ev.data.scalar.value;
		klen = ev.data.scalar.length;
		for (k = 0; k < K_COUNT; k++)
			if (strlen(keys[k].name) == klen && !memcmp(keys[k].name, kname, klen))
				break;
		if (k == K_COUNT)
			rc = fail(p, "line %zu: unknown key %s (known keys: job-name, framework, "
			          "node-rank, nodes, peer-ranks, peers-per-node, "
			          "backup-interval-minutes, backup-interval-steps, "
			          "assume-data-parallelism, workers-per-node)",
			          line, quote(q, kname, klen));
		else if (p->seen & (1u << k))
			rc = fail(p, "line %zu: duplicate key '%s' (first given at line %zu)", line,
			          keys[k].name, p->line[k]);
		yaml_event_delete(&ev);
		if (rc)
			return rc;
		p->seen |= 1u << k;
		p->line[k] = line;
		rc = parse_value(p, (enum key_id)k);
		if (rc)
			return rc;
	}
}

/* Pass 1: the whole stream is well-formed YAML, nested at most DEPTH_MAX. */
static int syntax_pass(struct parse *p)
{
	int depth = 0, rc;

	for (;;) {
		yaml_event_t ev;
		yaml_event_type_t t;

		rc = next_event(p, &ev);
		if (rc)
			return rc;
		t = ev.type;
		if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT)
			depth++;
		else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT)
			depth--;
		if (depth > DEPTH_MAX)
			rc = fail(p, "line %zu: collections are nested more than %d deep",
			          ev_line(&ev), DEPTH_MAX);
		yaml_event_delete(&ev);
		if (rc || t == YAML_STREAM_END_EVENT)
			return rc;
	}
}

/* Pass 2: the grammar. */
static int parse_stream(struct parse *p)
{
	yaml_event_t ev;
	int rc;

	rc = next_event(p, &ev); /* STREAM-START */
	if (rc)
		return rc;
	yaml_event_delete(&ev);
	rc = next_event(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_DOCUMENT_START_EVENT) {
		yaml_event_delete(&ev);
		return fail(p, "no YAML document: the file holds only comments or directives");
	}
	yaml_event_delete(&ev);

	rc = next_event(p, &ev);
	if (rc)
		return rc;
	rc = check_node(p, &ev, "top level");
	if (!rc && ev.type != YAML_MAPPING_START_EVENT)
		rc = fail(p,
		          "line %zu: the top level must be a mapping of keys (job-name: ..., "
		          "nodes: ...), got %s",
		          ev_line(&ev), node_kind(&ev));
	yaml_event_delete(&ev);
	if (rc)
		return rc;
	rc = parse_mapping(p);
	if (rc)
		return rc;

	rc = next_event(p, &ev); /* DOCUMENT-END */
	if (rc)
		return rc;
	yaml_event_delete(&ev);
	rc = next_event(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_STREAM_END_EVENT)
		rc = fail(p, "line %zu: only one YAML document is allowed", ev_line(&ev));
	yaml_event_delete(&ev);
	return rc;
}

#define HAS(p, k) ((p)->seen & (1u << (k)))

/* The rules that involve more than one key. */
static int validate(struct parse *p)
{
	static const enum key_id required[] = { K_JOB, K_NODE_RANK, K_NODES };
	char missing[128] = "";
	size_t mlen = 0;
	int nmissing = 0;
	long long nodes, rank;

	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
		if (HAS(p, required[i]))
			continue;
		mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%s",
		                         nmissing ? ", " : "", keys[required[i]].name);
		nmissing++;
	}
	if (nmissing)
		return fail(p, "missing required key%s: %s", nmissing > 1 ? "s" : "", missing);

	nodes = p->ival[K_NODES];
	rank = p->ival[K_NODE_RANK];
	if (rank >= nodes)
		return fail(p,
		            "line %zu: 'node-rank' %lld must be less than 'nodes' %lld "
		            "(ranks are 0..%lld)",
		            p->line[K_NODE_RANK], rank, nodes, nodes - 1);

	if (HAS(p, K_PEER_RANKS) && HAS(p, K_PEERS_PER_NODE))
		return fail(p,
		            "'peer-ranks' (line %zu) and 'peers-per-node' (line %zu) are mutually "
		            "exclusive: give one of them",
		            p->line[K_PEER_RANKS], p->line[K_PEERS_PER_NODE]);
	for (int i = 0; i < p->nlist; i++) {
		int v = p->list[i];
		if (v >= nodes)
			return fail(p,
			            "line %zu: 'peer-ranks' entry %d is out of range: with 'nodes' "
			            "%lld ranks are 0..%lld",
			            p->line[K_PEER_RANKS], v, nodes, nodes - 1);
		if (v == rank)
			return fail(p, "line %zu: 'peer-ranks' entry %d is this node's own "
			            "'node-rank'", p->line[K_PEER_RANKS], v);
		for (int j = 0; j < i; j++)
			if (p->list[j] == v)
				return fail(p, "line %zu: 'peer-ranks' lists %d twice",
				            p->line[K_PEER_RANKS], v);
	}
	if (HAS(p, K_PEERS_PER_NODE) && nodes > 1 && p->ival[K_PEERS_PER_NODE] >= nodes)
		return fail(p,
		            "line %zu: 'peers-per-node' %lld must be less than 'nodes' %lld: a "
		            "node cannot be its own peer, so at most %lld peers",
		            p->line[K_PEERS_PER_NODE], p->ival[K_PEERS_PER_NODE], nodes, nodes - 1);

	if (HAS(p, K_MINUTES) && HAS(p, K_STEPS))
		return fail(p,
		            "'backup-interval-minutes' (line %zu) and 'backup-interval-steps' "
		            "(line %zu) are mutually exclusive: give one of them",
		            p->line[K_MINUTES], p->line[K_STEPS]);

	if (HAS(p, K_DP) && nodes % p->ival[K_DP] != 0)
		return fail(p,
		            "line %zu: 'nodes' %lld is not divisible by "
		            "'assume-data-parallelism' %lld",
		            p->line[K_DP], nodes, p->ival[K_DP]);
	return 0;
}

static void fill(struct parse *p, struct rcfg *out)
{
	size_t jl = strlen(p->job);

	memcpy(out->job, p->job, jl + 1);
	out->framework = HAS(p, K_FRAMEWORK) ? p->fw : RCFG_FW_ORBAX;
	out->node_rank = (int)p->ival[K_NODE_RANK];
	out->nodes = (int)p->ival[K_NODES];
	if (HAS(p, K_PEER_RANKS)) {
		out->peers_per_node = p->nlist;
		if (p->nlist > 0) {
			out->peer_ranks = p->list;
			out->n_peer_ranks = p->nlist;
			p->list = NULL;
		}
	} else {
		out->peers_per_node = HAS(p, K_PEERS_PER_NODE) ? (int)p->ival[K_PEERS_PER_NODE] : 1;
	}
	if (HAS(p, K_STEPS))
		out->backup_interval_steps = (int)p->ival[K_STEPS];
	else
		out->backup_interval_minutes = HAS(p, K_MINUTES) ? (int)p->ival[K_MINUTES] : 30;
	out->assume_dp = HAS(p, K_DP) ? (int)p->ival[K_DP] : 0;
	out->workers_per_node = HAS(p, K_WORKERS) ? (int)p->ival[K_WORKERS] : 1;
}

static int blank(const char *buf, size_t len)
{
	size_t i = 0;

	if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3))
		i = 3;
	for (; i < len; i++) {
		switch (buf[i]) {
		case ' ':
		case '\t':
		case '\r':
		case '\n':
		case '\v':
		case '\f':
			break;
		default:
			return 0;
		}
	}
	return 1;
}

int rcfg_parse(const char *buf, size_t len, const char *(*getenv_fn)(const char *name),
               struct rcfg *out, char *err, size_t errlen)
{
	struct parse *p;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (out)
		memset(out, 0, sizeof *out);
	if (!out || (!buf && len)) {
		if (err && errlen)
			snprintf(err, errlen, "rcfg_parse: invalid arguments");
		return -EINVAL;
	}
	if (len > RCFG_INPUT_MAX) {
		if (err && errlen)
			snprintf(err, errlen, "replicator.yaml is too large: %zu bytes (limit %d)",
			         len, RCFG_INPUT_MAX);
		return -EINVAL;
	}
	if (blank(buf, len))
		return -ENODATA;

	p = calloc(1, sizeof *p);
	if (!p) {
		if (err && errlen)
			snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->getenv_fn = getenv_fn ? getenv_fn : env_default;
	p->err = err;
	p->errlen = errlen;
	rc = 0;
	for (int pass = 1; pass <= 2 && !rc; pass++) {
		if (!yaml_parser_initialize(&p->yp)) {
			fail(p, "out of memory");
			rc = -ENOMEM;
			break;
		}
		yaml_parser_set_input_string(&p->yp, (const unsigned char *)buf, len);
		rc = pass == 1 ? syntax_pass(p) : parse_stream(p);
		yaml_parser_delete(&p->yp);
	}
	if (!rc)
		rc = validate(p);
	if (!rc)
		fill(p, out);
	free(p->list);
	free(p);
	return rc;
}

void rcfg_free(struct rcfg *c)
{
	if (!c)
		return;
	free(c->peer_ranks);
	c->peer_ranks = NULL;
	c->n_peer_ranks = 0;
}

const char *rcfg_framework_name(enum rcfg_framework f)
{
	if ((int)f < 0 || (int)f >= FW_COUNT)
		return "unknown";
	return fw_names[f];
}

struct sink {
	char *buf;
	size_t len, pos;
	int full;
};

__attribute__((format(printf, 2, 3))) static void put(struct sink *s, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (s->full)
		return;
	va_start(ap, fmt);
	n = vsnprintf(s->buf + s->pos, s->len - s->pos, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= s->len - s->pos)
		s->full = 1;
	else
		s->pos += (size_t)n;
}

int rcfg_to_yaml(const struct rcfg *c, char *buf, size_t len)
{
	struct sink s = { .buf = buf, .len = len };
	size_t jl;
	char bad;

	if (!c || !buf)
		return -EINVAL;
	jl = strnlen(c->job, sizeof c->job);
	if (jl == sizeof c->job || job_name_problem(c->job, jl, &bad) ||
	    (c->n_peer_ranks > 0 && !c->peer_ranks))
		return -EINVAL;
	if (len == 0)
		return -ENOSPC;

	put(&s, "job-name: \"%s\"\n", c->job);
	put(&s, "framework: %s\n", rcfg_framework_name(c->framework));
	put(&s, "node-rank: %d\n", c->node_rank);
	put(&s, "nodes: %d\n", c->nodes);
	if (c->n_peer_ranks > 0) {
		put(&s, "peer-ranks: [");
		for (int i = 0; i < c->n_peer_ranks; i++)
			put(&s, "%s%d", i ? ", " : "", c->peer_ranks[i]);
		put(&s, "]\n");
	} else {
		put(&s, "peers-per-node: %d\n", c->peers_per_node);
	}
	if (c->backup_interval_steps > 0)
		put(&s, "backup-interval-steps: %d\n", c->backup_interval_steps);
	else
		put(&s, "backup-interval-minutes: %d\n", c->backup_interval_minutes);
	if (c->assume_dp > 0)
		put(&s, "assume-data-parallelism: %d\n", c->assume_dp);
	put(&s, "workers-per-node: %d\n", c->workers_per_node);
	if (s.full || s.pos > INT_MAX)
		return -ENOSPC;
	return (int)s.pos;
}
