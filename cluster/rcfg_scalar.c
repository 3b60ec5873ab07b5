/* replicator.yaml: one scalar: quoting it for messages, $VAR expansion from
 * the allowed environment, and the integer forms of YAML 1.1 and Python's
 * int() (see rcfg.c, rcfg_i.h). */
#include "cluster/rcfg.h"
#include "cluster/rcfg_i.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variables a $VAR may read from the daemon's environment.  GKE expands
 * from the replicator's own environment; mtcfs's daemon environment may hold
 * credentials, and any mount user can write replicator.yaml and read what
 * it turns into (file names, messages).  So only names that describe a job
 * or a node are read -- those Kubernetes/JobSet and torchrun put in a
 * training pod -- plus any MTCFS_YAML_* an operator exports on purpose.
 * Every other reference stays literal, as an unset one does in GKE. */
static const char *const env_allowed[] = {
	"JOBSET_NAME", "JOB_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX",
	"JOB_COMPLETION_INDEX", "JOB_GLOBAL_INDEX", "NODE_RANK", "NNODES",
	"NUM_NODES", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
	"NODE_NAME", "KUBE_NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP",
	"HOSTNAME",
};
#define ENV_PREFIX "MTCFS_YAML_"

/* "text" with C-style escapes for anything unprintable, cut after
 * QUOTE_SHOW bytes; returns dst. */
const char *rcfg_quote(char dst[QBUF], const char *s, size_t n)
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

const char *rcfg_quote_z(char dst[QBUF], const yaml_char_t *s)
{
	return rcfg_quote(dst, (const char *)s, strlen((const char *)s));
}

static int name_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_';
}

static int plain_name(const char *s)
{
	for (; *s; s++)
		if (!name_char(*s))
			return 0;
	return 1;
}

const char *rcfg_env_default(const char *name)
{
	return getenv(name);
}

int rcfg_env_allowed(const char *name)
{
	if (!name)
		return 0;
	if (!strncmp(name, ENV_PREFIX, strlen(ENV_PREFIX)) && name[strlen(ENV_PREFIX)])
		return 1;
	for (size_t i = 0; i < sizeof env_allowed / sizeof env_allowed[0]; i++)
		if (!strcmp(name, env_allowed[i]))
			return 1;
	return 0;
}

/* Expands the scalar ev into p->val the way Python's os.path.expandvars
 * does (GKE: util.expand_env_variables): $NAME with NAME = [A-Za-z0-9_]+
 * (longest), or ${ANYTHING-BUT-'}'}; a reference that cannot be read -- the
 * variable is unset or not on the allow list -- stays as written; a '$'
 * starting neither form, or "${" without its '}', is literal.  Values are
 * not re-expanded. */
int rcfg_expand(struct parse *p, const yaml_event_t *ev, const char *subj)
{
	const char *in = (const char *)ev->data.scalar.value;
	size_t n = ev->data.scalar.length, o = 0, line = rcfg_ev_line(ev);

	rcfg_quote(p->raw, in, n);
	p->expanded = 0;
	p->literal[0] = '\0';
	if (memchr(in, '\0', n))
		return rcfg_fail(p, "line %zu: %s: value %s contains a NUL character", line, subj,
		            p->raw);
	for (size_t i = 0; i < n;) {
		size_t ns = 0, nl = 0, adv = 0;
		const char *v = NULL;
		int allowed;

		if (in[i] == '$' && i + 1 < n && in[i + 1] == '{') {
			const char *close = memchr(in + i + 2, '}', n - i - 2);
			if (close) {
				ns = i + 2;
				nl = (size_t)(close - (in + ns));
				adv = nl + 3;
			}
		} else if (in[i] == '$') {
			ns = i + 1;
			while (ns + nl < n && name_char(in[ns + nl]))
				nl++;
			adv = nl ? nl + 1 : 0;
		}
		if (adv && nl > 0 && nl <= VARNAME_MAX) {
			char name[VARNAME_MAX + 1];
			memcpy(name, in + ns, nl);
			name[nl] = '\0';
			allowed = rcfg_env_allowed(name);
			if (allowed)
				v = p->getenv_fn(name);
			if (v) {
				size_t vl = strlen(v);
				if (vl > VALUE_MAX - o)
					goto toolong;
				memcpy(p->val + o, v, vl);
				o += vl;
				i += adv;
				p->expanded = 1;
				continue;
			}
			/* named in messages only when it is a plain name: "${a\nb}"
			 * is a reference too, but not one to print */
			if (!p->literal[0] && plain_name(name)) {
				memcpy(p->literal, name, nl + 1);
				p->literal_allowed = allowed;
			}
		}
		if (!adv)
			adv = 1;
		/* kept as written */
		if (adv > VALUE_MAX - o)
			goto toolong;
		memcpy(p->val + o, in + i, adv);
		o += adv;
		i += adv;
	}
	p->val[o] = '\0';
	p->vlen = o;
	return 0;
toolong:
	return rcfg_fail(p, "line %zu: %s: value %s is longer than %d bytes after expansion", line, subj,
	            p->raw, VALUE_MAX);
}

/* What a message may say about the current value besides quoting it as
 * written: never the expanded text (it may come from the environment). */
const char *rcfg_note(const struct parse *p, char buf[VARNAME_MAX + 128])
{
	if (p->literal[0])
		snprintf(buf, VARNAME_MAX + 128,
		         p->literal_allowed ? " ($%s is not set)"
		                            : " ($%s is not expanded: not a variable mtcfs reads, see README)",
		         p->literal);
	else if (p->expanded)
		snprintf(buf, VARNAME_MAX + 128, " (after $VAR expansion)");
	else
		buf[0] = '\0';
	return buf;
}

static int digit_ok(char c, int base)
{
	if (base == 16)
		return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
	return c >= '0' && c < '0' + base;
}

/* Accumulates digits of s[0..n) in base, '_' skipped when us (underscores
 * allowed anywhere, YAML 1.1) or only between digits (Python int()).
 * 0 = ok, -1 = not a number, -ERANGE = above LLONG_MAX/2. */
int rcfg_digits(const char *s, size_t n, int base, int yaml_us, long long *out)
{
	long long v = 0;
	int nd = 0;

	for (size_t i = 0; i < n; i++) {
		int d;
		if (s[i] == '_') {
			if (!yaml_us && (i == 0 || i + 1 == n || s[i + 1] == '_'))
				return -1;
			continue;
		}
		if (!digit_ok(s[i], base))
			return -1;
		d = s[i] <= '9' ? s[i] - '0' : (s[i] | 0x20) - 'a' + 10;
		if (v > (LLONG_MAX / 2 - d) / base)
			return -ERANGE;
		v = v * base + d;
		nd++;
	}
	if (!nd)
		return -1;
	*out = v;
	return 0;
}

/* A plain scalar YAML 1.1 resolves as an int (PyYAML's resolver and
 * construct_yaml_int): 0b.., 0x.., 0<octal>, decimal, sexagesimal a:b:c,
 * '_' ignored.  0 = *out set, -1 = not such an int, -ERANGE. */
static int yaml11_int(const char *s, size_t n, long long *out)
{
	int neg = 0, rc;
	long long v = 0;

	if (n && (s[0] == '-' || s[0] == '+')) {
		neg = s[0] == '-';
		s++;
		n--;
	}
	if (n == 0)
		return -1;
	if (n > 2 && s[0] == '0' && s[1] == 'b')
		rc = rcfg_digits(s + 2, n - 2, 2, 1, &v);
	else if (n > 2 && s[0] == '0' && s[1] == 'x')
		rc = rcfg_digits(s + 2, n - 2, 16, 1, &v);
	else if (memchr(s, ':', n)) {
		/* [1-9][0-9_]*(:[0-5]?[0-9])+ */
		const char *c = memchr(s, ':', n);
		size_t hl = (size_t)(c - s);
		if (s[0] < '1' || s[0] > '9' || rcfg_digits(s, hl, 10, 1, &v) < 0)
			return -1;
		for (size_t i = hl; i < n;) {
			size_t j = i + 1, k = j;
			long long part = 0;
			while (k < n && s[k] != ':')
				k++;
			if (k - j < 1 || k - j > 2 || rcfg_digits(s + j, k - j, 10, 0, &part) < 0 ||
			    (k - j == 2 && s[j] > '5'))
				return -1;
			if (v > LLONG_MAX / 120)
				return -ERANGE;
			v = v * 60 + part;
			i = k;
		}
		rc = 0;
	} else if (s[0] == '0' && n > 1) {
		rc = rcfg_digits(s + 1, n - 1, 8, 1, &v);
	} else {
		if (s[0] == '_')
			return -1;
		rc = rcfg_digits(s, n, 10, 1, &v);
	}
	if (rc)
		return rc;
	*out = neg ? -v : v;
	return 0;
}

int rcfg_is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Python's int(text): surrounding whitespace, a sign, decimal digits with
 * single '_' between them ("010" is 10). */
static int python_int(const char *s, size_t n, long long *out)
{
	int neg = 0, rc;
	long long v;

	while (n && rcfg_is_space(*s)) {
		s++;
		n--;
	}
	while (n && rcfg_is_space(s[n - 1]))
		n--;
	if (n && (s[0] == '-' || s[0] == '+')) {
		neg = s[0] == '-';
		s++;
		n--;
	}
	rc = rcfg_digits(s, n, 10, 0, &v);
	if (rc)
		return rc;
	*out = neg ? -v : v;
	return 0;
}

/* GKE's reading of an integer-valued scalar: a plain one YAML resolves as
 * an int is that int; any other string (quoted, or after $VAR expansion)
 * goes through Python's int(). */
int rcfg_scalar_to_int(const struct parse *p, const yaml_event_t *ev, long long *out)
{
	const char *tag = (const char *)ev->data.scalar.tag;
	int plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !tag;
	int rc = -1;

	if ((plain || (tag && !strcmp(tag, TAG_INT))) && !p->expanded && !p->literal[0])
		rc = yaml11_int(p->val, p->vlen, out);
	if (rc == -1)
		rc = python_int(p->val, p->vlen, out);
	return rc;
}

/* Reads the scalar ev as an integer in [min, max]; subj names it in messages. */
int rcfg_scalar_int(struct parse *p, const yaml_event_t *ev, const char *subj, long long min,
		    long long max, long long *out)
{
	char nb[VARNAME_MAX + 128], num[QBUF + VARNAME_MAX + 128];
	long long v = 0;
	int rc;

	rc = rcfg_expand(p, ev, subj);
	if (rc)
		return rc;
	if (p->vlen == 0 && !p->expanded)
		return rcfg_fail(p, "line %zu: %s expects an integer, got an empty value", rcfg_ev_line(ev),
		            subj);
	rc = rcfg_scalar_to_int(p, ev, &v);
	if (rc == -1)
		return rcfg_fail(p, "line %zu: %s expects a non-negative integer, got %s%s",
		            rcfg_ev_line(ev), subj, p->raw, rcfg_note(p, nb));
	if (rc == -ERANGE || v > INT_MAX || v < INT_MIN)
		return rcfg_fail(p, "line %zu: %s: %s is too large%s", rcfg_ev_line(ev), subj, p->raw,
		            rcfg_note(p, nb));
	/* the number itself only when it is what was written */
	rcfg_note(p, nb);
	if (p->expanded)
		snprintf(num, sizeof num, "%s%s", p->raw, nb);
	else
		snprintf(num, sizeof num, "%lld", v);
	if (v < 0)
		return rcfg_fail(p, "line %zu: %s must not be negative, got %s", rcfg_ev_line(ev), subj, num);
	if (v < min)
		return rcfg_fail(p, "line %zu: %s must be at least %lld, got %s", rcfg_ev_line(ev), subj, min,
		            num);
	if (v > max)
		return rcfg_fail(p, "line %zu: %s must be at most %lld, got %s", rcfg_ev_line(ev), subj, max,
		            num);
	*out = v;
	return 0;
}
