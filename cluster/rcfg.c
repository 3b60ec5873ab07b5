/* replicator.yaml: a first pass over the libyaml events reports YAML syntax
 * errors ahead of anything else and bounds nesting; the second pass reads the
 * events against a fixed grammar (mapping of known keys -> scalar or sequence
 * of scalars), expanding $VARs per scalar; then the cross-key rules are
 * checked.  Only the first error is reported.  What GKE's replicator would
 * run (util.read_config: yaml.safe_load, os.path.expandvars, int()) is
 * accepted; where mtcfs reads it differently it says so in a warning.
 *
 * This file: the passes over the events, the grammar of keys, the cross-key
 * rules and derived fields, rcfg_to_yaml. A scalar's $VAR expansion and
 * number forms: rcfg_scalar.c; what both use: rcfg_i.h.
 */
#include "cluster/rcfg.h"
#include "cluster/rcfg_i.h"
#include "common/jobname.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	[K_PEERS_PER_NODE] = { "peers-per-node",          T_INT,     0, INT_MAX },
	[K_MINUTES]        = { "backup-interval-minutes", T_MINUTES, 0, RCFG_MINUTES_MAX },
	[K_STEPS]          = { "backup-interval-steps",   T_INT,     1, RCFG_STEPS_MAX },
	[K_DP]             = { "assume-data-parallelism", T_INT,     1, RCFG_NODES_MAX },
	[K_WORKERS]        = { "workers-per-node",        T_INT,     1, RCFG_WORKERS_MAX },
	[K_MASTER]         = { "master",                  T_IGNORED, 0, 0 },
	[K_MASTER_PORT]    = { "master-port",             T_IGNORED, 0, 0 },
	/* mtcfs's own (issue 17); GKE's replicator ignores unknown keys */
	[K_REDUNDANCY]     = { "redundancy",              T_STR,     0, 0 },
};

static const char *const fw_names[] = {
	[RCFG_FW_ORBAX]               = "orbax",
	[RCFG_FW_PYTORCH_DISTRIBUTED] = "pytorch.distributed",
	[RCFG_FW_PYTORCH]             = "pytorch",
};
#define FW_COUNT ((int)(sizeof fw_names / sizeof fw_names[0]))

__attribute__((format(printf, 2, 3)))
int rcfg_fail(struct parse *p, const char *fmt, ...)
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

__attribute__((format(printf, 2, 3)))
static void warn(struct parse *p, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (p->nwarn >= WARN_MAX) {
		p->warn_dropped++;
		return;
	}
	n = snprintf(p->warn[p->nwarn], WARN_LEN, "WARNING: replicator.yaml: ");
	va_start(ap, fmt);
	vsnprintf(p->warn[p->nwarn] + n, WARN_LEN - (size_t)n, fmt, ap);
	va_end(ap);
	p->nwarn++;
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

size_t rcfg_ev_line(const yaml_event_t *ev)
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
		rcfg_fail(p, "out of memory while parsing YAML");
		return -ENOMEM;
	case YAML_READER_ERROR:
		if (y->problem_value != -1)
			return rcfg_fail(p, "invalid YAML: %s (#%X at byte offset %zu)", problem,
			            (unsigned)y->problem_value, y->problem_offset);
		return rcfg_fail(p, "invalid YAML: %s (at byte offset %zu)", problem, y->problem_offset);
	default:
		if (y->context)
			return rcfg_fail(p, "invalid YAML at line %zu, column %zu: %s (%s at line %zu)",
			            y->problem_mark.line + 1, y->problem_mark.column + 1, problem,
			            y->context, y->context_mark.line + 1);
		return rcfg_fail(p, "invalid YAML at line %zu, column %zu: %s", y->problem_mark.line + 1,
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
		return rcfg_fail(p, "line %zu: %s: aliases are not supported (found alias %s)",
		            rcfg_ev_line(ev), subj, rcfg_quote_z(q, anchor));
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
		return rcfg_fail(p, "line %zu: %s: anchors are not supported (found anchor %s)",
		            rcfg_ev_line(ev), subj, rcfg_quote_z(q, anchor));
	if (!tag_ok)
		return rcfg_fail(p, "line %zu: %s: unsupported tag %s", rcfg_ev_line(ev), subj,
		            rcfg_quote_z(q, tag));
	return 0;
}

/* backup-interval-minutes: GKE reads any YAML number (0.5 = every 30 s).
 * Accepted: an integer as above, or a decimal fraction [+]D[.D][e[+-]D]. */
static int scalar_minutes(struct parse *p, const yaml_event_t *ev, const char *subj)
{
	char nb[VARNAME_MAX + 128], clean[64];
	long long iv;
	size_t o = 0, lo = 0, hi;
	double d;
	char *end;
	int rc, ndig = 0, plain, seen_e = 0;

	rc = rcfg_expand(p, ev, subj);
	if (rc)
		return rc;
	hi = p->vlen;
	rc = rcfg_scalar_to_int(p, ev, &iv);
	if (rc != -1) {
		/* integer: the int rules (and messages) */
		rc = rcfg_scalar_int(p, ev, subj, 0, keys[K_MINUTES].max, &iv);
		p->minutes = (double)iv;
		return rc;
	}
	/* Python's float() text: surrounding whitespace, '_' only between two
	 * digits; a plain scalar is a YAML 1.1 float: '_' anywhere after the
	 * first digit, before the exponent */
	plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !ev->data.scalar.tag &&
	        !p->expanded && !p->literal[0];
	while (lo < hi && rcfg_is_space(p->val[lo]))
		lo++;
	while (hi > lo && rcfg_is_space(p->val[hi - 1]))
		hi--;
	for (size_t i = lo; i < hi && o + 1 < sizeof clean; i++) {
		char c = p->val[i];
		if (c == '_') {
			if (plain ? !ndig || seen_e
			          : i == lo || i + 1 == hi || p->val[i - 1] < '0' ||
			                p->val[i - 1] > '9' || p->val[i + 1] < '0' || p->val[i + 1] > '9')
				goto bad;
			continue;
		}
		seen_e |= c == 'e' || c == 'E';
		if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' ||
		      c == '-'))
			goto bad;
		ndig += c >= '0' && c <= '9';
		clean[o++] = c;
	}
	clean[o] = '\0';
	if (!ndig || o + 1 >= sizeof clean)
		goto bad;
	errno = 0;
	d = strtod(clean, &end);
	if (*end || errno == ERANGE || d != d)
		goto bad;
	if (d < 0)
		return rcfg_fail(p, "line %zu: %s must not be negative, got %s%s", rcfg_ev_line(ev), subj,
		            p->raw, rcfg_note(p, nb));
	if (d > (double)keys[K_MINUTES].max)
		return rcfg_fail(p, "line %zu: %s must be at most %lld, got %s%s", rcfg_ev_line(ev), subj,
		            keys[K_MINUTES].max, p->raw, rcfg_note(p, nb));
	p->minutes = d;
	return 0;
bad:
	return rcfg_fail(p, "line %zu: %s expects a number of minutes, got %s%s", rcfg_ev_line(ev), subj,
	            p->raw, rcfg_note(p, nb));
}

static int set_string(struct parse *p, enum key_id k, const yaml_event_t *ev)
{
	char nb[VARNAME_MAX + 128], bad = 0, subj[64];
	const char *why;
	long long iv;
	int rc;

	snprintf(subj, sizeof subj, "'%s'", keys[k].name);
	rc = rcfg_expand(p, ev, subj);
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
		return rcfg_fail(p, "line %zu: 'framework' %s%s is not one of orbax, "
		            "pytorch.distributed, pytorch",
		            rcfg_ev_line(ev), p->raw, rcfg_note(p, nb));
	}
	if (k == K_REDUNDANCY) {
		char e[160];
		if (ec_parse_redundancy(p->val, &p->red, e, sizeof e) == 0)
			return 0;
		/* ec's line quotes the value as it is; an expanded one is shown as
		 * written, and one with a control character (a folded scalar's
		 * newline) as rcfg quotes it: a message is one line */
		bool ctl = false;
		for (size_t i = 0; i < p->vlen; i++)
			ctl |= (unsigned char)p->val[i] < 0x20 || p->val[i] == 0x7f;
		if (p->expanded || ctl)
			return rcfg_fail(p, "line %zu: 'redundancy' %s%s is neither 'replication' nor "
			            "'rs:K+M' with K >= 1, M >= 1, K + M <= 32", rcfg_ev_line(ev), p->raw,
			            rcfg_note(p, nb));
		return rcfg_fail(p, "line %zu: %s", rcfg_ev_line(ev), e);
	}
	/* GKE: a job-name that reads as an integer (YAML's, or int() of the
	 * text: util.try_parse_int) is that integer, printed in decimal --
	 * job-name: 010 names its files 8-s..., "010" and 1_0 name them 10-s... */
	if (rcfg_scalar_to_int(p, ev, &iv) == 0) {
		char dec[32];
		int n = snprintf(dec, sizeof dec, "%lld", iv);
		if ((size_t)n != p->vlen || memcmp(dec, p->val, p->vlen)) {
			if (!p->expanded)
				warn(p, "line %zu: 'job-name' %s reads as the integer %s: the job is "
				     "named %s, as in GKE", rcfg_ev_line(ev), p->raw, dec, dec);
			memcpy(p->val, dec, (size_t)n + 1);
			p->vlen = (size_t)n;
		}
	}
	why = job_name_problem(p->val, p->vlen, &bad);
	if (why) {
		char ch[32] = "";
		/* the offending character only when the value is as written */
		if (!p->expanded && bad >= 0x20 && bad < 0x7f)
			snprintf(ch, sizeof ch, " (found '%c')", bad);
		else if (!p->expanded && bad)
			snprintf(ch, sizeof ch, " (found byte 0x%02X)", (unsigned char)bad);
		return rcfg_fail(p, "line %zu: 'job-name' %s cannot be used as a file name: %s%s%s",
		            rcfg_ev_line(ev), p->raw, why, ch, rcfg_note(p, nb));
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
			rcfg_fail(p, "out of memory");
			return -ENOMEM;
		}
	}
	p->nlist = 0;   /* a repeated key: the last one counts */
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
			rc = rcfg_fail(p, "line %zu: %s must be an integer, got %s", rcfg_ev_line(&ev), subj,
			          node_kind(&ev));
		if (!rc && p->nlist >= RCFG_PEERS_MAX)
			rc = rcfg_fail(p, "line %zu: '%s' has more than %d entries", rcfg_ev_line(&ev),
			          keys[k].name, RCFG_PEERS_MAX);
		if (!rc)
			rc = rcfg_scalar_int(p, &ev, subj, keys[k].min, keys[k].max, &v);
		yaml_event_delete(&ev);
		if (rc)
			return rc;
		p->list[p->nlist++] = (int)v;
	}
}

/* Consumes the value of an unknown key, whatever its shape (nesting is
 * bounded by the syntax pass; this loop counts, it does not recurse). */
static int skip_value(struct parse *p)
{
	int depth = 0, rc;

	do {
		yaml_event_t ev;
		rc = next_event(p, &ev);
		if (rc)
			return rc;
		if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT)
			depth++;
		else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT)
			depth--;
		yaml_event_delete(&ev);
	} while (depth > 0);
	return 0;
}

/* master-port: GKE's coordinator port; mtcfs's comes from mount options.
 * Whatever it holds is accepted; a value GKE could not bind is a warning. */
static int check_master_port(struct parse *p, const yaml_event_t *ev)
{
	char nb[VARNAME_MAX + 128];
	long long v = -1;
	int rc = rcfg_expand(p, ev, "'master-port'");

	if (rc)
		return rc;
	if (rcfg_scalar_to_int(p, ev, &v) != 0 || v < 1 || v > 65535)
		warn(p, "line %zu: 'master-port' %s%s is not a port number; ignored (mtcfs takes "
		     "the coordinator from its mount options)", rcfg_ev_line(ev), p->raw, rcfg_note(p, nb));
	return 0;
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
	if (keys[k].type == T_IGNORED) {
		if (ev.type != YAML_SCALAR_EVENT)
			rc = rcfg_fail(p, "line %zu: %s expects a scalar, got %s", rcfg_ev_line(&ev), subj,
			          node_kind(&ev));
		else if (k == K_MASTER_PORT)
			rc = check_master_port(p, &ev);
		else
			rc = rcfg_expand(p, &ev, subj);
		goto out;
	}
	if (ev.type != YAML_SCALAR_EVENT && keys[k].type != T_INTLIST) {
		rc = rcfg_fail(p, "line %zu: %s expects %s, got %s", rcfg_ev_line(&ev), subj,
		          keys[k].type == T_STR ? "a string" : "an integer", node_kind(&ev));
		goto out;
	}
	switch (keys[k].type) {
	case T_STR:
		rc = set_string(p, k, &ev);
		break;
	case T_INT:
		if (k == K_PEERS_PER_NODE) {
			/* GKE never reads peers-per-node when peer-ranks is given,
			 * which may come later: hold the error until then */
			char *err = p->err;
			size_t errlen = p->errlen;
			p->err = p->ppn_err;
			p->errlen = sizeof p->ppn_err;
			p->ppn_err[0] = '\0';
			rc = rcfg_scalar_int(p, &ev, subj, keys[k].min, keys[k].max, &p->ival[k]);
			p->err = err;
			p->errlen = errlen;
			if (rc == -EINVAL) {
				p->failed = 0;
				rc = 0;
			} else {
				p->ppn_err[0] = '\0';
			}
			break;
		}
		rc = rcfg_scalar_int(p, &ev, subj, keys[k].min, keys[k].max, &p->ival[k]);
		break;
	case T_MINUTES:
		rc = scalar_minutes(p, &ev, subj);
		break;
	case T_INTLIST:
		if (ev.type == YAML_SCALAR_EVENT)
			rc = rcfg_fail(p, "line %zu: %s expects a list of integers such as [1, 2], "
			          "got %s", rcfg_ev_line(&ev), subj,
			          rcfg_quote(q, (const char *)ev.data.scalar.value,
			                ev.data.scalar.length));
		else if (ev.type != YAML_SEQUENCE_START_EVENT)
			rc = rcfg_fail(p, "line %zu: %s expects a list of integers, got %s",
			          rcfg_ev_line(&ev), subj, node_kind(&ev));
		else
			rc = parse_list(p, k);
		break;
	case T_IGNORED:
		break;
	}
	/* a kept-literal $VAR in a value that was accepted anyway */
	if (!rc && ev.type == YAML_SCALAR_EVENT && p->literal[0] &&
	    !(k == K_PEERS_PER_NODE && p->ppn_err[0]))
		warn(p, "line %zu: %s: $%s %s; kept as written", rcfg_ev_line(&ev), subj, p->literal,
		     p->literal_allowed ? "is not set" : "is not a variable mtcfs expands (see README)");
out:
	if (!rc && keys[k].type == T_IGNORED && p->literal[0])
		warn(p, "line %zu: %s: $%s %s; kept as written", rcfg_ev_line(&ev), subj, p->literal,
		     p->literal_allowed ? "is not set" : "is not a variable mtcfs expands (see README)");
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
		line = rcfg_ev_line(&ev);
		rc = check_node(p, &ev, "key");
		if (!rc && ev.type != YAML_SCALAR_EVENT)
			rc = rcfg_fail(p, "line %zu: keys must be names, got %s", line, node_kind(&ev));
		if (rc) {
			yaml_event_delete(&ev);
			return rc;
		}
		kname = (const char *)ev.data.scalar.value;
		klen = ev.data.scalar.length;
		for (k = 0; k < K_COUNT; k++)
			if (strlen(keys[k].name) == klen && !memcmp(keys[k].name, kname, klen))
				break;
		if (k == K_COUNT) {
			/* GKE reads the keys it knows and ignores the rest */
			warn(p, "line %zu: unknown key %s ignored", line, rcfg_quote(q, kname, klen));
			yaml_event_delete(&ev);
			rc = skip_value(p);
			if (rc)
				return rc;
			continue;
		}
		if (p->seen & (1u << k))   /* PyYAML keeps the last one */
			warn(p, "line %zu: duplicate key '%s' (first given at line %zu): the last "
			     "one counts, as in GKE", line, keys[k].name, p->line[k]);
		yaml_event_delete(&ev);
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
			rc = rcfg_fail(p, "line %zu: collections are nested more than %d deep",
			          rcfg_ev_line(&ev), DEPTH_MAX);
		yaml_event_delete(&ev);
		if (rc || t == YAML_STREAM_END_EVENT)
			return rc;
	}
}

/* An event the grammar only expects (stream start, document end). */
static int skip_event(struct parse *p)
{
	yaml_event_t ev;
	int rc = next_event(p, &ev);

	if (!rc)
		yaml_event_delete(&ev);
	return rc;
}

/* Pass 2: the grammar. */
static int parse_stream(struct parse *p)
{
	yaml_event_t ev;
	int rc;

	rc = skip_event(p); /* STREAM-START */
	if (rc)
		return rc;
	rc = next_event(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_DOCUMENT_START_EVENT) {
		yaml_event_delete(&ev);
		return rcfg_fail(p, "no YAML document: the file holds only comments or directives");
	}
	yaml_event_delete(&ev);

	rc = next_event(p, &ev);
	if (rc)
		return rc;
	rc = check_node(p, &ev, "top level");
	if (!rc && ev.type != YAML_MAPPING_START_EVENT)
		rc = rcfg_fail(p,
		          "line %zu: the top level must be a mapping of keys (job-name: ..., "
		          "nodes: ...), got %s",
		          rcfg_ev_line(&ev), node_kind(&ev));
	yaml_event_delete(&ev);
	if (rc)
		return rc;
	rc = parse_mapping(p);
	if (rc)
		return rc;

	rc = skip_event(p); /* DOCUMENT-END */
	if (rc)
		return rc;
	rc = next_event(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_STREAM_END_EVENT)
		rc = rcfg_fail(p, "line %zu: only one YAML document is allowed", rcfg_ev_line(&ev));
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
	int nmissing = 0, kept = 0;
	long long nodes, rank;

	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
		if (HAS(p, required[i]))
			continue;
		mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%s",
		                         nmissing ? ", " : "", keys[required[i]].name);
		nmissing++;
	}
	if (nmissing)
		return rcfg_fail(p, "missing required key%s: %s", nmissing > 1 ? "s" : "", missing);

	nodes = p->ival[K_NODES];
	rank = p->ival[K_NODE_RANK];
	if (rank >= nodes)
		return rcfg_fail(p,
		            "line %zu: 'node-rank' %lld must be less than 'nodes' %lld "
		            "(ranks are 0..%lld)",
		            p->line[K_NODE_RANK], rank, nodes, nodes - 1);

	/* GKE: the node sends peer-ranks to the coordinator when given, which
	 * then uses them instead of peers-per-node, and the node takes the
	 * number of peers it got back as its peers-per-node (restore.py,
	 * coordinator._get_replication_peers_for_node).  The NeMo reference
	 * writes both keys. */
	for (int i = 0; i < p->nlist; i++) {
		int v = p->list[i], dup = 0;
		if (v >= nodes)   /* GKE: KeyError in the coordinator */
			return rcfg_fail(p,
			            "line %zu: 'peer-ranks' entry %d is out of range: with 'nodes' "
			            "%lld ranks are 0..%lld",
			            p->line[K_PEER_RANKS], v, nodes, nodes - 1);
		for (int j = 0; j < kept; j++)
			dup |= p->list[j] == v;
		if (v == rank)   /* GKE would replicate to itself */
			warn(p, "line %zu: 'peer-ranks' entry %d is this node's own 'node-rank': "
			     "ignored", p->line[K_PEER_RANKS], v);
		else if (dup)
			warn(p, "line %zu: 'peer-ranks' lists %d twice: once is used",
			     p->line[K_PEER_RANKS], v);
		else
			p->list[kept++] = v;
	}
	p->nlist = kept;
	if (p->ppn_err[0] && HAS(p, K_PEER_RANKS))
		warn(p, "'peers-per-node' (line %zu) ignored: peer-ranks is given (%s)",
		     p->line[K_PEERS_PER_NODE], p->ppn_err);
	else if (p->ppn_err[0])
		return rcfg_fail(p, "%s", p->ppn_err);
	if (HAS(p, K_PEERS_PER_NODE) && !HAS(p, K_PEER_RANKS) && nodes > 1) {
		long long k = p->ival[K_PEERS_PER_NODE], lim = nodes - 1;
		if (lim > RCFG_PEERS_MAX)
			lim = RCFG_PEERS_MAX;
		/* GKE: k = nodes gives every other node; k > nodes gives the XOR
		 * neighbour and the node itself (dist = nodes // k = 0) */
		if (k > nodes || (k > lim && lim == RCFG_PEERS_MAX))
			warn(p, "line %zu: 'peers-per-node' %lld is more than this job can use: "
			     "clamped to %lld", p->line[K_PEERS_PER_NODE], k, lim);
		if (k > lim)
			p->ival[K_PEERS_PER_NODE] = lim;
	}
	if (HAS(p, K_PEERS_PER_NODE) && p->ival[K_PEERS_PER_NODE] > RCFG_PEERS_MAX)
		p->ival[K_PEERS_PER_NODE] = RCFG_PEERS_MAX;   /* nodes == 1: no peers anyway */

	if (HAS(p, K_MINUTES) && HAS(p, K_STEPS)) {
		/* GKE's coordinator reads only backup-interval-minutes */
		warn(p, "'backup-interval-minutes' (line %zu) and 'backup-interval-steps' (line "
		     "%zu) are both given: the minutes are used, as in GKE",
		     p->line[K_MINUTES], p->line[K_STEPS]);
		p->seen &= ~(1u << K_STEPS);
	}
	if (HAS(p, K_MINUTES)) {
		double m = p->minutes, c = (double)(long long)m;
		long long whole = (long long)(c < m ? c + 1 : c);
		/* backups are named by the UTC minute, so one a minute at most;
		 * 0 is GKE's "every step" (fill(): backup-interval-steps 1) */
		if (whole < 1 && m > 0)
			whole = 1;
		if ((double)whole != m)
			warn(p, "line %zu: 'backup-interval-minutes' %g is rounded up to %lld: mtcfs "
			     "backs up at most once a minute", p->line[K_MINUTES], m, whole);
		p->ival[K_MINUTES] = whole;
	}

	if (HAS(p, K_DP) && nodes % p->ival[K_DP] != 0) {
		/* GKE logs an error and infers nothing; mtcfs assumes nothing */
		warn(p, "line %zu: 'nodes' %lld is not divisible by 'assume-data-parallelism' "
		     "%lld: data parallelism is not assumed", p->line[K_DP], nodes, p->ival[K_DP]);
		p->seen &= ~(1u << K_DP);
	}
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
	else if (HAS(p, K_MINUTES) && p->ival[K_MINUTES] == 0)
		/* GKE backs up every step; so does mtcfs, at most one backup
		 * per UTC minute (the names are minutes): the same as
		 * backup-interval-steps: 1 */
		out->backup_interval_steps = 1;
	else
		out->backup_interval_minutes = HAS(p, K_MINUTES) ? (int)p->ival[K_MINUTES] : 30;
	out->assume_dp = HAS(p, K_DP) ? (int)p->ival[K_DP] : 0;
	out->workers_per_node = HAS(p, K_WORKERS) ? (int)p->ival[K_WORKERS] : 1;
	out->has_redundancy = HAS(p, K_REDUNDANCY);
	if (out->has_redundancy)
		out->redundancy = p->red;
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
	return rcfg_parse_warn(buf, len, getenv_fn, NULL, NULL, out, err, errlen);
}

int rcfg_parse_warn(const char *buf, size_t len, const char *(*getenv_fn)(const char *name),
                    rcfg_warn_fn warn_fn, void *warn_arg, struct rcfg *out, char *err,
                    size_t errlen)
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
	p->getenv_fn = getenv_fn ? getenv_fn : rcfg_env_default;
	p->err = err;
	p->errlen = errlen;
	rc = 0;
	for (int pass = 1; pass <= 2 && !rc; pass++) {
		if (!yaml_parser_initialize(&p->yp)) {
			rcfg_fail(p, "out of memory");
			rc = -ENOMEM;
			break;
		}
		yaml_parser_set_input_string(&p->yp, (const unsigned char *)buf, len);
		rc = pass == 1 ? syntax_pass(p) : parse_stream(p);
		yaml_parser_delete(&p->yp);
	}
	if (!rc && p->failed)   /* an error set on a path that did not return it */
		rc = -EINVAL;
	if (!rc)
		rc = validate(p);
	if (!rc) {
		fill(p, out);
		for (int i = 0; warn_fn && i < p->nwarn; i++)
			warn_fn(warn_arg, p->warn[i]);
		if (warn_fn && p->warn_dropped) {
			char more[96];
			snprintf(more, sizeof more, "WARNING: replicator.yaml: %d more warnings "
			         "not shown", p->warn_dropped);
			warn_fn(warn_arg, more);
		}
	}
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
	if (c->has_redundancy) {
		char r[32];
		put(&s, "redundancy: %s\n", ec_redundancy_str(&c->redundancy, r, sizeof r));
	}
	if (s.full || s.pos > INT_MAX)
		return -ENOSPC;
	return (int)s.pos;
}

uint32_t rcfg_workers(const struct rcfg *c)
{
	/* other frameworks write one shard per node whatever
	 * workers-per-node says */
	return c->framework == RCFG_FW_PYTORCH && c->workers_per_node > 1 ?
	       (uint32_t)c->workers_per_node : 1;
}

void rcfg_job_now(const struct rcfg *c, struct job_now *out)
{
	*out = (struct job_now){
		.set = true,
		.rank = c->node_rank,
		.nodes = (uint32_t)c->nodes,
		.dp = (uint32_t)c->assume_dp,
		.workers = rcfg_workers(c),
		.save_files = c->framework == RCFG_FW_PYTORCH,
	};
	snprintf(out->job, sizeof(out->job), "%s", c->job);
}
