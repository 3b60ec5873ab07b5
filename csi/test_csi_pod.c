/* Unit tests of the pure parts of mtcfs-csi: csi_pod (who the pod is in its
 * JobSet) and csi_cfg (the CheckpointConfiguration ConfigMap form). */
#include "csi/csi_cfg.h"
#include "csi/csi_pod.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#define KV(k, v) { k, v }
#define POD(n) KV("csi.storage.k8s.io/pod.name", n)
#define NS(n) KV("csi.storage.k8s.io/pod.namespace", n)
#define N(a) (sizeof(a) / sizeof((a)[0]))

static char err[512];

static void pod_name_gives_rank_and_coordinator(void **state)
{
	struct csi_kv kv[] = { POD("train-workers-1-2-abcde"), NS("ml"), KV("podsPerJob", "4"),
			       KV("csi.storage.k8s.io/pod.uid", "u"),
			       KV("csi.storage.k8s.io/ephemeral", "true") };
	struct csi_pod p;
	char c[512];

	(void)state;
	assert_int_equal(csi_pod_parse(&p, kv, N(kv), err, sizeof(err)), 0);
	assert_string_equal(p.jobset, "train");
	assert_string_equal(p.rjob, "workers");
	assert_string_equal(p.job, "train");
	assert_string_equal(p.namespace_, "ml");
	assert_int_equal(p.job_index, 1);
	assert_int_equal(p.pod_index, 2);
	assert_int_equal(p.rank, 6);
	assert_int_equal(csi_pod_coordinator(&p, 8765, c, sizeof(c)), 0);
	assert_string_equal(c, "train-workers-0-0.train.ml.svc:8765");
}

static void dashes_in_names(void **state)
{
	struct csi_kv a[] = { POD("my-big-job-workers-0-0-x1y2z") };
	struct csi_kv b[] = { POD("js-slice-a-3-0-abcde"), KV("replicatedJobName", "slice-a") };
	struct csi_kv c[] = { POD("a-b-c-d-1-0-xyz12"), KV("jobSetName", "a-b"),
			      KV("subdomain", "svc-x") };
	struct csi_kv bad[] = { POD("js-slice-a-3-0-abcde"), KV("jobSetName", "other") };
	struct csi_pod p;
	char co[512];

	(void)state;
	assert_int_equal(csi_pod_parse(&p, a, N(a), err, sizeof(err)), 0);
	assert_string_equal(p.jobset, "my-big-job");
	assert_string_equal(p.rjob, "workers");
	assert_string_equal(p.namespace_, "default");
	assert_int_equal(csi_pod_parse(&p, b, N(b), err, sizeof(err)), 0);
	assert_string_equal(p.jobset, "js");
	assert_string_equal(p.rjob, "slice-a");
	assert_int_equal(p.rank, 3);
	assert_int_equal(csi_pod_parse(&p, c, N(c), err, sizeof(err)), 0);
	assert_string_equal(p.jobset, "a-b");
	assert_string_equal(p.rjob, "c-d");
	assert_int_equal(csi_pod_coordinator(&p, 1, co, sizeof(co)), 0);
	assert_string_equal(co, "a-b-c-d-0-0.svc-x.default.svc:1");
	assert_int_equal(csi_pod_parse(&p, bad, N(bad), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "jobName and rank"));
}

/* Without podsPerJob (GKE's JobSet has none): job index 0 is rank =
 * podIndex, podIndex 0 of a later Job assumes one pod per Job, a later
 * podIndex has no rank until the yaml; the Job's parallelism learnt from
 * the API fixes it, and contradicts a pod index not below it. */
static void pods_per_job_absent_or_learnt(void **state)
{
	struct csi_kv a[] = { POD("js-w-0-3-abcde") };
	struct csi_kv b[] = { POD("js-w-2-1-abcde") };
	struct csi_kv c[] = { POD("js-w-2-0-abcde") };
	struct csi_kv d[] = { POD("js-w-2-1-abcde"), KV("rank", "17") };
	struct csi_pod p;

	(void)state;
	assert_int_equal(csi_pod_parse(&p, a, N(a), err, sizeof(err)), 0);
	assert_int_equal(p.rank, 3);
	assert_int_equal(csi_pod_parse(&p, b, N(b), err, sizeof(err)), 0);
	assert_int_equal(p.rank, CSI_RANK_NONE);
	assert_int_equal(csi_pod_set_pods_per_job(&p, 4, err, sizeof(err)), 0);
	assert_int_equal(p.rank, 9);
	assert_int_equal(csi_pod_parse(&p, c, N(c), err, sizeof(err)), 0);
	assert_int_equal(p.rank, 2);
	assert_int_equal(csi_pod_set_pods_per_job(&p, 2, err, sizeof(err)), 0);
	assert_int_equal(p.rank, 4);
	assert_int_equal(csi_pod_parse(&p, b, N(b), err, sizeof(err)), 0);
	assert_int_equal(csi_pod_set_pods_per_job(&p, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "pod index 1 >= podsPerJob 1"));
	assert_int_equal(csi_pod_parse(&p, d, N(d), err, sizeof(err)), 0);
	assert_int_equal(csi_pod_set_pods_per_job(&p, 4, err, sizeof(err)), 0);
	assert_int_equal(p.rank, 17);
}

static void attributes_override(void **state)
{
	struct csi_kv kv[] = { POD("whatever"), KV("jobName", "Job_1.x"), KV("rank", "9"),
			       KV("coordinator", "10.0.0.1:7000"), KV("peerPort", "7001"),
			       KV("ramSize", "4Gi") };
	struct csi_kv none[] = { KV("jobName", "j"), KV("rank", "0"), KV("coordinator", "h:1") };
	struct csi_pod p;
	char c[512];

	(void)state;
	assert_int_equal(csi_pod_parse(&p, kv, N(kv), err, sizeof(err)), 0);
	assert_string_equal(p.job, "Job_1.x");
	assert_int_equal(p.rank, 9);
	assert_int_equal(p.peer_port, 7001);
	assert_string_equal(p.ram_size, "4Gi");
	assert_int_equal(csi_pod_coordinator(&p, 1, c, sizeof(c)), 0);
	assert_string_equal(c, "10.0.0.1:7000");
	/* no pod info at all (a PersistentVolume without podInfoOnMount) */
	assert_int_equal(csi_pod_parse(&p, none, N(none), err, sizeof(err)), 0);
	assert_string_equal(p.job, "j");
}

static void bad_attributes(void **state)
{
	static const struct { struct csi_kv kv[3]; size_t n; const char *want; } cases[] = {
		{ { POD("t-w-0-0-a"), KV("jobname", "x") }, 2, "unknown volume attribute jobname" },
		{ { POD("t-w-0-0-a"), KV("podsPerJob", "0") }, 2, "podsPerJob" },
		{ { POD("t-w-0-3-a"), KV("podsPerJob", "2") }, 2, "pod index 3 >= podsPerJob 2" },
		{ { POD("t-w-0-0-a"), KV("rank", "-1") }, 2, "rank" },
		{ { POD("t-w-0-0-a"), KV("jobName", "../x") }, 2, "jobName" },
		{ { POD("t-w-0-0-a"), NS("a/b") }, 2, "namespace" },
		{ { POD("t-w-0-0-a"), KV("coordinator", "h:1,bucket=x") }, 2, "coordinator" },
		{ { POD("t-w-0-0-a"), KV("ramSize", "lots") }, 2, "ramSize" },
		{ { POD("t-w-0-0-a"), KV("peerPort", "70000") }, 2, "peerPort" },
		{ { POD("t-w-x-0-a") }, 1, "not named" },
		{ { KV("jobName", "j") }, 1, "jobName and rank" },
		{ { KV("jobName", "j"), KV("rank", "1") }, 2, "coordinator" },
		/* a trailing '\\' escapes the ',' before the next mount option */
		{ { POD("t-w-0-0-a"), KV("coordinator", "h:1\\") }, 2, "coordinator" },
		{ { POD("t-w-0-0-a"), KV("coordinator", "h:1 x") }, 2, "coordinator" },
		/* "a.b" + job "c" and "a" + job "b.c" would share the key a.b.c */
		{ { POD("t-w-0-0-a"), NS("a.b") }, 2, "namespace a.b" },
		/* a newline anywhere would forge a log line where it is echoed */
		{ { POD("t-w-0-0-a\nERROR x") }, 1, "control character" },
		{ { POD("t-w-0-0-a"), KV("jobName\r", "j") }, 2, "control character in an attribute" },
	};
	struct csi_pod p;

	(void)state;
	for (size_t i = 0; i < N(cases); i++) {
		err[0] = 0;
		assert_int_equal(csi_pod_parse(&p, cases[i].kv, cases[i].n, err, sizeof(err)), -EINVAL);
		if (!strstr(err, cases[i].want))
			fail_msg("case %zu: %s lacks %s", i, err, cases[i].want);
	}
}

static void cfg_resource_and_spec_forms(void **state)
{
	static const char res[] =
		"apiVersion: checkpointing.gke.io/v1\nkind: CheckpointConfiguration\n"
		"metadata:\n  name: c\nspec:\n  cloudStorageBucketName: my-bucket\n"
		"  inMemoryVolumeSize: 200Gi\n  nodeSelector: {a: b}\n"
		"  tolerations: [{key: k, operator: Exists}]\n"
		"  gcsFuseMountOptions: [implicit-dirs, 'metadata-cache:ttl-secs:-1']\n"
		"  peerPort: 9000\n  mountOptions: [jax_init_info, jax_port=1234]\n";
	static const char json[] = "{\"cloudStorageBucketName\": \"file:///nfs/ckpt\", "
				   "\"metricsPort\": 9311, \"restoreTimeout\": 60}";
	struct csi_cfg c;

	(void)state;
	csi_cfg_init(&c);
	assert_int_equal(csi_cfg_parse(&c, res, sizeof(res) - 1, err, sizeof(err)), 0);
	assert_string_equal(c.bucket, "gs://my-bucket");
	assert_string_equal(c.ram_size, "200Gi");
	assert_true(c.ram_bytes == 200ull << 30);
	assert_int_equal(c.peer_port, 9000);
	assert_int_equal(c.n_gcsfuse_opts, 2);
	assert_int_equal(c.n_mount_opts, 2);
	assert_string_equal(c.mount_opts[1], "jax_port=1234");
	assert_null(c.mount_opts[2]);
	csi_cfg_free(&c);
	assert_int_equal(csi_cfg_parse(&c, json, sizeof(json) - 1, err, sizeof(err)), 0);
	assert_string_equal(c.bucket, "file:///nfs/ckpt");
	assert_int_equal(c.metrics_port, 9311);
	assert_int_equal(c.restore_timeout, 60);
	assert_int_equal(c.peer_port, 8765);
	csi_cfg_free(&c);
	assert_int_equal(csi_cfg_parse(&c, "", 0, err, sizeof(err)), 0);
	assert_null(c.bucket);
	csi_cfg_free(&c);
}

/* GKE's own spec fields apply unchanged (its documented example) */
static void cfg_gke_fields(void **state)
{
	static const char gke[] =
		"apiVersion: checkpointing.gke.io/v1\nkind: CheckpointConfiguration\n"
		"metadata:\n  name: my-checkpointconfiguration\nspec:\n"
		"  cloudStorageBucketName: b\n  nodeSelector:\n    node.kubernetes.io/instance-type: x\n"
		"  tolerations:\n  - key: google.com/tpu\n    operator: Exists\n    effect: NoSchedule\n"
		"  inMemoryVolumeSize: 50Gi\n  csiEphemeralLimit: 50Mi\n"
		"  enableExternalJaxProcessIds: true\n  replicationOptions: [verbose-logs]\n"
		"  gcsFuseMountOptions: [implicit-dirs]\n";
	struct csi_cfg c;

	(void)state;
	csi_cfg_init(&c);
	assert_int_equal(csi_cfg_parse(&c, gke, sizeof(gke) - 1, err, sizeof(err)), 0);
	assert_string_equal(c.bucket, "gs://b");
	assert_true(c.external_jax_ids);
	assert_int_equal(c.n_gke_ignored, 2);
	assert_int_equal(c.n_mount_opts, 0);
	csi_cfg_free(&c);
}

static void cfg_errors(void **state)
{
	static const struct { const char *text, *want; } cases[] = {
		{ "spec:\n  inMemoryVolumeSize: lots\n", "inMemoryVolumeSize" },
		{ "cloudStorageBucket: b\n", "unknown key cloudStorageBucket" },
		{ "spec: {a: 1}\nextra: 2\n", "unknown" },
		{ "spec: [1]\n", "spec: expected a mapping" },
		{ "- a\n", "expected a mapping" },
		{ "peerPort: 0\n", "peerPort" },
		{ "peerPort: 65536\n", "peerPort" },
		{ "mountOptions: [a, 'b,c']\n", "mountOptions" },
		{ "mountOptions: a\n", "mountOptions" },
		{ "cloudStorageBucketName: 'a,b'\n", "comma" },
		{ "secretFile: '/etc/s\\\\'\n", "secretFile" },
		{ "mountOptions: ['a\\\\']\n", "mountOptions" },
		{ "enableExternalJaxProcessIds: maybe\n", "enableExternalJaxProcessIds" },
		{ "csiEphemeralLimit: ''\n", "csiEphemeralLimit" },
		{ "spec: {\n", "not YAML" },
	};
	struct csi_cfg c;

	(void)state;
	for (size_t i = 0; i < N(cases); i++) {
		csi_cfg_init(&c);
		err[0] = 0;
		assert_int_equal(csi_cfg_parse(&c, cases[i].text, strlen(cases[i].text), err,
					       sizeof(err)), -EINVAL);
		if (!strstr(err, cases[i].want))
			fail_msg("case %zu: %s lacks %s", i, err, cases[i].want);
		csi_cfg_free(&c);
	}
}

/* Several documents: one configuration each, its name, nodeSelector and
 * tolerations kept in order (mtcfs-csi render); a bad one names its
 * document. */
static void cfg_several_documents(void **state)
{
	static const char two[] =
		"apiVersion: checkpointing.mtcfs.dev/v1\nkind: CheckpointConfiguration\n"
		"metadata: {name: a}\nspec:\n  inMemoryVolumeSize: 1Gi\n"
		"  nodeSelector: {pool: x, zone: z1}\n"
		"  tolerations: [{key: k, operator: Exists}, {effect: NoSchedule}]\n"
		"---\n---\nspec: {inMemoryVolumeSize: 2Gi}\n";
	static const char bad[] = "spec: {}\n---\nspec: {nodeSelector: [x]}\n";
	struct csi_cfg *c;
	size_t n;

	(void)state;
	assert_int_equal(csi_cfg_parse_all(two, strlen(two), &c, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_string_equal(c[0].name, "a");
	assert_int_equal(c[0].node_selector.n, 2);
	assert_string_equal(c[0].node_selector.keys[1], "zone");
	assert_string_equal(c[0].node_selector.vals[1], "z1");
	assert_int_equal(c[0].n_tolerations, 2);
	assert_string_equal(c[0].tolerations[0].keys[1], "operator");
	assert_string_equal(c[0].tolerations[1].vals[0], "NoSchedule");
	assert_null(c[1].name);
	assert_int_equal(c[1].ram_bytes, 2ull << 30);
	csi_cfg_free_all(c, n);
	assert_int_equal(csi_cfg_parse_all(bad, strlen(bad), &c, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "document 2: nodeSelector: expected a map"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pod_name_gives_rank_and_coordinator),
		cmocka_unit_test(dashes_in_names),
		cmocka_unit_test(pods_per_job_absent_or_learnt),
		cmocka_unit_test(attributes_override),
		cmocka_unit_test(bad_attributes),
		cmocka_unit_test(cfg_resource_and_spec_forms),
		cmocka_unit_test(cfg_gke_fields),
		cmocka_unit_test(cfg_errors),
		cmocka_unit_test(cfg_several_documents),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
