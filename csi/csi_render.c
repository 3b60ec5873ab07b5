/* csi_render.c: see csi_render.h. */
#include "csi/csi_render.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern const char csi_ds_template[];    /* generated from daemonset.yaml.in (CMake) */

#define DEFAULT_NAME "mtcfs"

static const char *cfg_name(const struct csi_cfg *c)
{
	return c->name ? c->name : DEFAULT_NAME;
}

/* A DNS label (the name goes into a label value and the DaemonSet's
 * name, both at most 63 characters). */
static bool dns_label(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (!n || n > max || s[0] == '-' || s[n - 1] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
			return false;
	return true;
}

/* A scalar as YAML: plain when it cannot be read as anything but that
 * string, else double-quoted (JSON escapes, valid YAML). */
static void put_scalar(FILE *f, const char *s)
{
	static const char *const special[] = { "true", "false", "yes", "no", "on", "off", "null",
					       "y", "n", "~", NULL };
	bool plain = *s && ((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'));

	for (const char *p = s; plain && *p; p++)
		plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			(*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.' || *p == '/';
	for (size_t i = 0; plain && special[i]; i++)
		plain = strcasecmp(s, special[i]) != 0;
	if (plain) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (const char *p = s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fputc('\\', f);
		fputc(*p, f);
	}
	fputc('"', f);
}

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

static void put_scheduling(FILE *f, const struct csi_cfg *c)
{
	if (c->node_selector.n) {
		fputs("      nodeSelector:\n", f);
		for (size_t i = 0; i < c->node_selector.n; i++) {
			fputs("        ", f);
			put_scalar(f, c->node_selector.keys[i]);
			fputs(": ", f);
			put_scalar(f, c->node_selector.vals[i]);
			fputc('\n', f);
		}
	}
	if (c->n_tolerations)
		fputs("      tolerations:\n", f);
	for (size_t t = 0; t < c->n_tolerations; t++) {
		const struct csi_cfg_map *m = &c->tolerations[t];

		if (!m->n)
			fputs("      - {}\n", f);
		for (size_t i = 0; i < m->n; i++) {
			fputs(i ? "        " : "      - ", f);
			fputs(m->keys[i], f);       /* one of csi_cfg's fields */
			fputs(": ", f);
			if (!strcmp(m->keys[i], "tolerationSeconds"))
				fputs(m->vals[i], f);   /* checked: digits */
			else
				put_scalar(f, m->vals[i]);
			fputc('\n', f);
		}
	}
}

/* inMemoryVolumeSize + the overhead, in the largest binary unit that
 * divides it. */
static void memory_str(uint64_t bytes, char *out, size_t cap)
{
	static const char *const unit[] = { "", "Ki", "Mi", "Gi", "Ti" };
	int u = 0;

	while (u < 4 && bytes && bytes % 1024 == 0) {
		bytes /= 1024;
		u++;
	}
	snprintf(out, cap, "%llu%s", (unsigned long long)bytes, unit[u]);
}

/* Can one node carry the labels both selectors ask for? Only when no key
 * of one has another value in the other. */
static bool overlap(const struct csi_cfg *a, const struct csi_cfg *b)
{
	for (size_t i = 0; i < a->node_selector.n; i++)
		for (size_t j = 0; j < b->node_selector.n; j++)
			if (!strcmp(a->node_selector.keys[i], b->node_selector.keys[j]) &&
			    strcmp(a->node_selector.vals[i], b->node_selector.vals[j]))
				return false;
	return true;
}

static int check(const struct csi_cfg *cfgs, size_t n, char *err, size_t cap)
{
	if (!n)
		return csi_fail(err, cap, "no configuration to render");
	for (size_t i = 0; i < n; i++) {
		const struct csi_cfg *c = &cfgs[i];

		if (!dns_label(cfg_name(c), 52))
			return csi_fail(err, cap, "CheckpointConfiguration %s: the name must be a DNS "
					"label of at most 52 characters (it names the DaemonSet "
					"mtcfs-node-NAME)", cfg_name(c));
		if (!c->ram_bytes)
			return csi_fail(err, cap, "CheckpointConfiguration %s: no inMemoryVolumeSize "
					"(the DaemonSet's memory is that + 6Gi)", cfg_name(c));
		for (size_t t = 0; t < c->n_tolerations; t++)
			for (size_t k = 0; k < c->tolerations[t].n; k++)
				if (!strcmp(c->tolerations[t].keys[k], "tolerationSeconds") &&
				    !all_digits(c->tolerations[t].vals[k]))
					return csi_fail(err, cap, "CheckpointConfiguration %s: "
							"tolerationSeconds %s is not an integer",
							cfg_name(c), c->tolerations[t].vals[k]);
		for (size_t j = 0; j < i; j++) {
			const struct csi_cfg *o = &cfgs[j];

			if (!strcmp(cfg_name(c), cfg_name(o)))
				return csi_fail(err, cap, "two CheckpointConfigurations named %s",
						cfg_name(c));
			if (overlap(c, o))
				return csi_fail(err, cap, "CheckpointConfigurations %s and %s overlap: "
						"their nodeSelectors can select the same node (no "
						"label key on which their values differ); give each "
						"a value of a common key (e.g. node.kubernetes.io/"
						"instance-type) that the other does not have",
						cfg_name(o), cfg_name(c));
		}
	}
	return 0;
}

static void render_one(FILE *f, const struct csi_cfg *c)
{
	char ds[80], mem[32];
	const char *t = csi_ds_template;

	if (!strcmp(cfg_name(c), DEFAULT_NAME))
		snprintf(ds, sizeof(ds), "mtcfs-node");
	else
		snprintf(ds, sizeof(ds), "mtcfs-node-%s", cfg_name(c));
	memory_str(c->ram_bytes + CSI_RENDER_OVERHEAD, mem, sizeof(mem));
	while (*t) {
		const char *at = strchr(t, '@');

		if (!at) {
			fputs(t, f);
			break;
		}
		fwrite(t, 1, (size_t)(at - t), f);
		t = at;
		if (!strncmp(t, "@NAME@", 6)) {
			fputs(ds, f);
			t += 6;
		} else if (!strncmp(t, "@CONFIG@", 8)) {
			fputs(cfg_name(c), f);
			t += 8;
		} else if (!strncmp(t, "@MEMORY@", 8)) {
			fputs(mem, f);
			t += 8;
		} else if (!strncmp(t, "@SCHEDULING@\n", 13)) {
			put_scheduling(f, c);
			t += 13;
		} else {
			fputc('@', f);  /* the template's own ("@/run/mtcfs/watch") */
			t++;
		}
	}
}

int csi_render(const struct csi_cfg *cfgs, size_t n, FILE *out, char *err, size_t errcap)
{
	int rc = check(cfgs, n, err, errcap);

	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (i)
			fputs("---\n", out);
		render_one(out, &cfgs[i]);
	}
	return fflush(out) == 0 && !ferror(out) ? 0 : -EIO;
}
