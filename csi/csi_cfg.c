/* csi_cfg.c: the ConfigMap form of CheckpointConfiguration. libyaml's
 * document API loads the (small) file; the walk below reads two fixed
 * levels (object -> spec -> field -> list item), never recursing on the
 * input's depth. */
#include "csi/csi_cfg.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define CFG_MAX_BYTES (1u << 20)

void csi_cfg_init(struct csi_cfg *c)
{
	memset(c, 0, sizeof(*c));
	c->peer_port = 8765;
}

static void map_free(struct csi_cfg_map *m)
{
	for (size_t i = 0; i < m->n; i++) {
		free(m->keys[i]);
		free(m->vals[i]);
	}
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

void csi_cfg_free(struct csi_cfg *c)
{
	if (!c)
		return;
	free(c->name);
	map_free(&c->node_selector);
	for (size_t i = 0; i < c->n_tolerations; i++)
		map_free(&c->tolerations[i]);
	free(c->tolerations);
	free(c->bucket);
	free(c->ram_size);
	free(c->secret_file);
	free(c->gcs_key_file);
	free(c->gcs_endpoint);
	for (size_t i = 0; i < c->n_mount_opts; i++)
		free(c->mount_opts[i]);
	free(c->mount_opts);
	csi_cfg_init(c);
}

int csi_fail(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static const char *scalar(yaml_node_t *n)
{
	return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A value that goes into a job mount's -o: no ',' (the next option) or
 * '\\' (escapes the character after it), nothing unprintable. */
static bool opt_value_ok(const char *s)
{
	for (; *s; s++)
		if (*s == ',' || *s == '\\' || (unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

static int set_str(char **dst, yaml_node_t *v, const char *key, char *err, size_t cap)
{
	const char *s = scalar(v);

	if (!s || !*s)
		return csi_fail(err, cap, "%s: expected a non-empty string", key);
	if (!opt_value_ok(s))
		return csi_fail(err, cap, "%s: ',', '\\' and control characters cannot be in a "
				"mount option", key);
	free(*dst);
	*dst = strdup(s);
	return *dst ? 0 : -ENOMEM;
}

static int set_uint(unsigned *dst, yaml_node_t *v, uint64_t max, const char *key,
		    char *err, size_t cap)
{
	const char *s = scalar(v);
	uint64_t u;

	if (!s || util_parse_u64(s, max, &u) < 0)
		return csi_fail(err, cap, "%s: expected an integer 0..%llu", key, (unsigned long long)max);
	*dst = (unsigned)u;
	return 0;
}

/* A gs:// URL from the bucket name GKE takes; mtcfs also accepts a whole
 * URL (file:///nfs/ckpt, gs://b/prefix) there. */
static int set_bucket(struct csi_cfg *c, yaml_node_t *v, char *err, size_t cap)
{
	const char *s = scalar(v);
	size_t n;

	if (!s || !*s)
		return csi_fail(err, cap, "cloudStorageBucketName: expected a bucket name");
	if (!opt_value_ok(s))
		return csi_fail(err, cap, "cloudStorageBucketName: a comma, '\\' or a control "
				"character cannot be in a mount option");
	free(c->bucket);
	if (strstr(s, "://")) {
		c->bucket = strdup(s);
		return c->bucket ? 0 : -ENOMEM;
	}
	n = strlen(s) + sizeof("gs://");
	c->bucket = malloc(n);
	if (!c->bucket)
		return -ENOMEM;
	snprintf(c->bucket, n, "gs://%s", s);
	return 0;
}

static int set_list(yaml_document_t *d, yaml_node_t *v, char ***dst, size_t *n,
		    const char *key, char *err, size_t cap)
{
	yaml_node_item_t *it;

	if (!v || v->type != YAML_SEQUENCE_NODE)
		return csi_fail(err, cap, "%s: expected a list of strings", key);
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
		const char *s = scalar(yaml_document_get_node(d, *it));
		char **grown;

		if (!s || !*s || (dst && !opt_value_ok(s)) || (!dst && strchr(s, ',')))
			return csi_fail(err, cap, "%s: items must be non-empty strings without ','%s",
					key, dst ? ", '\\' or control characters" : "");
		if (!dst) {             /* counted only */
			(*n)++;
			continue;
		}
		grown = realloc(*dst, (*n + 2) * sizeof(**dst));
		if (!grown)
			return -ENOMEM;
		*dst = grown;
		grown[*n] = strdup(s);
		if (!grown[*n])
			return -ENOMEM;
		grown[++*n] = NULL;
	}
	return 0;
}

static int map_add(struct csi_cfg_map *m, const char *k, const char *v)
{
	char **keys = realloc(m->keys, (m->n + 1) * sizeof(*keys)), **vals;

	if (!keys)
		return -ENOMEM;
	m->keys = keys;
	vals = realloc(m->vals, (m->n + 1) * sizeof(*vals));
	if (!vals)
		return -ENOMEM;
	m->vals = vals;
	keys[m->n] = strdup(k);
	vals[m->n] = strdup(v);
	if (!keys[m->n] || !vals[m->n]) {
		free(keys[m->n]);
		free(vals[m->n]);
		return -ENOMEM;
	}
	m->n++;
	return 0;
}

/* Printable, so that a rendered manifest cannot get a line of its own
 * from a value. */
static bool printable_(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/* A map of strings (nodeSelector, one toleration) into m; allowed: the
 * keys permitted (NULL: any). */
static int set_map(yaml_document_t *d, yaml_node_t *v, struct csi_cfg_map *m,
		   const char *const *allowed, const char *key, char *err, size_t cap)
{
	yaml_node_pair_t *p;

	if (v->type != YAML_MAPPING_NODE)
		return csi_fail(err, cap, "%s: expected a map", key);
	for (p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
		const char *k = scalar(yaml_document_get_node(d, p->key));
		const char *val = scalar(yaml_document_get_node(d, p->value));
		bool ok = !allowed;
		int rc;

		if (!k || !val || !*k || !printable_(k) || !printable_(val))
			return csi_fail(err, cap, "%s: expected a map of printable strings", key);
		for (size_t i = 0; allowed && allowed[i]; i++)
			ok = ok || !strcmp(allowed[i], k);
		if (!ok)
			return csi_fail(err, cap, "%s: unknown field %s", key, k);
		rc = map_add(m, k, val);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int set_tolerations(struct csi_cfg *c, yaml_document_t *d, yaml_node_t *v, char *err,
			   size_t cap)
{
	static const char *const fields[] = { "key", "operator", "value", "effect",
					      "tolerationSeconds", NULL };
	yaml_node_item_t *it;

	if (v->type != YAML_SEQUENCE_NODE)
		return csi_fail(err, cap, "tolerations: expected a list");
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
		struct csi_cfg_map *t = realloc(c->tolerations,
						(c->n_tolerations + 1) * sizeof(*t));
		if (!t)
			return -ENOMEM;
		c->tolerations = t;
		memset(&t[c->n_tolerations], 0, sizeof(*t));
		c->n_tolerations++;
		int rc = set_map(d, yaml_document_get_node(d, *it), &t[c->n_tolerations - 1], fields,
				 "tolerations", err, cap);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int apply(struct csi_cfg *c, yaml_document_t *d, const char *k, yaml_node_t *v,
		 char *err, size_t cap)
{
	if (!strcmp(k, "cloudStorageBucketName"))
		return set_bucket(c, v, err, cap);
	if (!strcmp(k, "inMemoryVolumeSize")) {
		int rc = set_str(&c->ram_size, v, k, err, cap);
		if (rc < 0)
			return rc;
		if (util_parse_size(c->ram_size, &c->ram_bytes) < 0 || !c->ram_bytes)
			return csi_fail(err, cap, "inMemoryVolumeSize: %s is not a size (200Gi, 512M)",
				    c->ram_size);
		return 0;
	}
	/* scheduling of the DaemonSet: kept for mtcfs-csi render */
	if (!strcmp(k, "nodeSelector"))
		return set_map(d, v, &c->node_selector, NULL, k, err, cap);
	if (!strcmp(k, "tolerations"))
		return set_tolerations(c, d, v, err, cap);
	if (!strcmp(k, "gcsFuseMountOptions"))
		return set_list(d, v, NULL, &c->n_gcsfuse_opts, k, err, cap);
	/* GKE's other spec fields (checkpointing.gke.io/v1), so that its
	 * documented objects apply unchanged; none changes what mtcfs does
	 * (csi_main logs that once) */
	if (!strcmp(k, "csiEphemeralLimit")) {
		/* the ephemeral-storage limit of GKE's driver container: a quantity */
		const char *s = scalar(v);
		if (!s || !*s)
			return csi_fail(err, cap, "csiEphemeralLimit: expected a quantity (50Mi)");
		c->n_gke_ignored++;
		return 0;
	}
	if (!strcmp(k, "enableExternalJaxProcessIds")) {
		const char *s = scalar(v);
		if (!s || (strcasecmp(s, "true") && strcasecmp(s, "false")))
			return csi_fail(err, cap, "enableExternalJaxProcessIds: expected true or false");
		c->external_jax_ids = !strcasecmp(s, "true");
		return 0;
	}
	if (!strcmp(k, "replicationOptions")) {
		size_t n = 0;
		int rc = set_list(d, v, NULL, &n, k, err, cap);
		if (rc == 0 && n)
			c->n_gke_ignored++;
		return rc;
	}
	if (!strcmp(k, "peerPort")) {
		int rc = set_uint(&c->peer_port, v, 65535, k, err, cap);
		return rc < 0 ? rc : c->peer_port ? 0 : csi_fail(err, cap, "peerPort: 0 is not a port");
	}
	if (!strcmp(k, "metricsPort"))
		return set_uint(&c->metrics_port, v, 65535, k, err, cap);
	if (!strcmp(k, "restoreTimeout"))
		return set_uint(&c->restore_timeout, v, 86400, k, err, cap);
	if (!strcmp(k, "secretFile"))
		return set_str(&c->secret_file, v, k, err, cap);
	if (!strcmp(k, "gcsKeyFile"))
		return set_str(&c->gcs_key_file, v, k, err, cap);
	if (!strcmp(k, "gcsEndpoint"))
		return set_str(&c->gcs_endpoint, v, k, err, cap);
	if (!strcmp(k, "mountOptions"))
		return set_list(d, v, &c->mount_opts, &c->n_mount_opts, k, err, cap);
	return csi_fail(err, cap, "unknown key %s", k);
}

static yaml_node_t *map_get(yaml_document_t *d, yaml_node_t *m, const char *key)
{
	yaml_node_pair_t *p;

	for (p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
		const char *k = scalar(yaml_document_get_node(d, p->key));
		if (k && !strcmp(k, key))
			return yaml_document_get_node(d, p->value);
	}
	return NULL;
}

/* One loaded document into c. */
static int parse_doc(struct csi_cfg *c, yaml_document_t *doc, char *err, size_t errcap)
{
	yaml_node_t *root, *spec, *meta, *name;
	yaml_node_pair_t *p;
	int rc = 0;

	root = yaml_document_get_root_node(doc);
	if (!root)              /* an empty file: all defaults */
		goto out;
	if (root->type != YAML_MAPPING_NODE) {
		rc = csi_fail(err, errcap, "expected a mapping (a CheckpointConfiguration or its spec)");
		goto out;
	}
	spec = map_get(doc, root, "spec");
	meta = map_get(doc, root, "metadata");
	name = meta && meta->type == YAML_MAPPING_NODE ? map_get(doc, meta, "name") : NULL;
	if (spec && scalar(name)) {
		free(c->name);
		c->name = strdup(scalar(name));
		if (!c->name) {
			rc = -ENOMEM;
			goto out;
		}
	}
	if (spec) {
		if (spec->type != YAML_MAPPING_NODE) {
			rc = csi_fail(err, errcap, "spec: expected a mapping");
			goto out;
		}
	} else {
		spec = root;
	}
	for (p = spec->data.mapping.pairs.start; p < spec->data.mapping.pairs.top; p++) {
		const char *k = scalar(yaml_document_get_node(doc, p->key));
		yaml_node_t *v = yaml_document_get_node(doc, p->value);

		if (!k || !v) {
			rc = csi_fail(err, errcap, "a key must be a string");
			goto out;
		}
		/* the object's envelope, when the whole resource was given */
		if (spec == root && (!strcmp(k, "apiVersion") || !strcmp(k, "kind") ||
				     !strcmp(k, "metadata")))
			continue;
		rc = apply(c, doc, k, v, err, errcap);
		if (rc < 0)
			goto out;
	}
	if (spec != root) {
		for (p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
			const char *k = scalar(yaml_document_get_node(doc, p->key));
			if (!k || (strcmp(k, "apiVersion") && strcmp(k, "kind") &&
				   strcmp(k, "metadata") && strcmp(k, "spec") && strcmp(k, "status"))) {
				rc = csi_fail(err, errcap, "unknown top-level key %s", k ? k : "?");
				goto out;
			}
		}
	}
out:
	return rc;
}

int csi_cfg_parse(struct csi_cfg *c, const char *buf, size_t len, char *err, size_t errcap)
{
	yaml_parser_t parser;
	yaml_document_t doc;
	int rc;

	err[0] = 0;
	if (!yaml_parser_initialize(&parser))
		return -ENOMEM;
	yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
	if (!yaml_parser_load(&parser, &doc)) {
		rc = csi_fail(err, errcap, "not YAML: %s at line %zu",
			  parser.problem ? parser.problem : "syntax error",
			  parser.problem_mark.line + 1);
		yaml_parser_delete(&parser);
		return rc;
	}
	rc = parse_doc(c, &doc, err, errcap);
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	return rc;
}

void csi_cfg_free_all(struct csi_cfg *c, size_t n)
{
	for (size_t i = 0; c && i < n; i++)
		csi_cfg_free(&c[i]);
	free(c);
}

int csi_cfg_parse_all(const char *buf, size_t len, struct csi_cfg **out, size_t *n,
		      char *err, size_t errcap)
{
	yaml_parser_t parser;
	yaml_document_t doc;
	struct csi_cfg *all = NULL;
	yaml_node_t *root;
	size_t cnt = 0;
	int rc = 0;

	err[0] = 0;
	*out = NULL;
	*n = 0;
	if (!yaml_parser_initialize(&parser))
		return -ENOMEM;
	yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
	for (size_t idx = 1;; idx++) {
		struct csi_cfg *grown;
		char why[400];

		if (!yaml_parser_load(&parser, &doc)) {
			rc = csi_fail(err, errcap, "not YAML: %s at line %zu",
				      parser.problem ? parser.problem : "syntax error",
				      parser.problem_mark.line + 1);
			break;
		}
		root = yaml_document_get_root_node(&doc);
		if (!root || (root->type == YAML_SCALAR_NODE && !root->data.scalar.length)) {
			/* the end, or an empty document ("---" twice) */
			yaml_document_delete(&doc);
			if (!root && parser.stream_end_produced)
				break;
			continue;
		}
		grown = realloc(all, (cnt + 1) * sizeof(*all));
		if (!grown) {
			yaml_document_delete(&doc);
			rc = -ENOMEM;
			break;
		}
		all = grown;
		csi_cfg_init(&all[cnt]);
		cnt++;
		rc = parse_doc(&all[cnt - 1], &doc, why, sizeof(why));
		yaml_document_delete(&doc);
		if (rc < 0) {
			if (rc == -EINVAL)
				csi_fail(err, errcap, "document %zu: %s", idx, why);
			break;
		}
	}
	yaml_parser_delete(&parser);
	if (rc < 0) {
		csi_cfg_free_all(all, cnt);
		return rc;
	}
	*out = all;
	*n = cnt;
	return 0;
}

int csi_cfg_load(struct csi_cfg *c, const char *path, char *err, size_t errcap)
{
	char *buf = NULL;
	size_t len = 0;
	int rc;

	rc = util_read_file_at(AT_FDCWD, path, CFG_MAX_BYTES, &buf, &len);
	if (rc < 0) {
		snprintf(err, errcap, "%s: %s", path, strerror(-rc));
		return rc;
	}
	rc = csi_cfg_parse(c, buf, len, err, errcap);
	free(buf);
	return rc;
}
