/* mtcfs-csi: the CSI node driver (Identity + Node) on a unix socket, over
 * gRPC's C core. Threads: main (flags, set-up, then sigwait for
 * SIGTERM/SIGINT), RPC_THREADS pollers of one completion queue. Each
 * registered method has CALLS_PER_METHOD slots; a slot is owned by whichever
 * poller got its tag, so slots need no lock. Handlers decode with
 * protobuf-c, call csi_node, and reply with one batch (initial metadata,
 * message, status, close). */
#include "csi/csi_cfg.h"
#include "csi/csi_node.h"
#include "csi/csi_kube.h"
#include "csi/csi_render.h"
#include "csi/csi_watch.h"
#include "csi/csi.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define DRIVER_NAME "mtcfs.csi.checkpoint.dev"
#define MOD "csi"
#define RPC_THREADS 8   /* a slow first publish must not hold up Probe */
#define CALLS_PER_METHOD 4
/* unregistered methods (Controller, GroupController, a newer spec's): without
 * a slot asking for them a call would hang until its deadline */
#define GENERIC_CALLS 2
#define ERR_MAX 512

#ifndef MTCFS_VERSION
#define MTCFS_VERSION "0"
#endif

static struct csi_node *g_node;
static const char *g_node_id;

struct reply {
	grpc_status_code code;
	char msg[ERR_MAX];
	ProtobufCMessage *resp;     /* packed when code is OK; static or on the stack */
};

typedef void (*handler_fn)(const ProtobufCBinaryData *in, struct reply *r);

struct method {
	const char *path;
	handler_fn fn;
	void *reg;                  /* grpc_server_register_method's handle */
};

static void status(struct reply *r, grpc_status_code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void status(struct reply *r, grpc_status_code code, const char *fmt, ...)
{
	va_list ap;

	r->code = code;
	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
}

/* One translation from csi_node's -errno to gRPC's codes (CSI spec's
 * meanings: ALREADY_EXISTS for an incompatible target, FAILED_PRECONDITION
 * for a state the caller must change). */
static grpc_status_code node_code(int rc)
{
	switch (-rc) {
	case EINVAL: case ENAMETOOLONG: return GRPC_STATUS_INVALID_ARGUMENT;
	case EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
	case EBUSY:  return GRPC_STATUS_FAILED_PRECONDITION;
	case ENOENT: return GRPC_STATUS_NOT_FOUND;
	case EAGAIN: return GRPC_STATUS_UNAVAILABLE;   /* kubelet retries */
	case ENOMEM: case ENOSPC: return GRPC_STATUS_RESOURCE_EXHAUSTED;
	case EPERM: case EACCES: return GRPC_STATUS_PERMISSION_DENIED;
	default:     return GRPC_STATUS_INTERNAL;
	}
}

/* An id that goes into our log lines as it is: printable only (a newline
 * would start a forged line). */
static bool printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/* ---- Identity ---------------------------------------------------------- */

static void h_plugin_info(const ProtobufCBinaryData *in, struct reply *r)
{
	static Csi__V1__GetPluginInfoResponse resp = CSI__V1__GET_PLUGIN_INFO_RESPONSE__INIT;

	(void)in;
	resp.name = DRIVER_NAME;
	resp.vendor_version = MTCFS_VERSION;
	r->resp = &resp.base;
}

static void h_plugin_caps(const ProtobufCBinaryData *in, struct reply *r)
{
	/* a node-only plugin: no CONTROLLER_SERVICE, no topology */
	static Csi__V1__GetPluginCapabilitiesResponse resp =
		CSI__V1__GET_PLUGIN_CAPABILITIES_RESPONSE__INIT;

	(void)in;
	r->resp = &resp.base;
}

static void h_probe(const ProtobufCBinaryData *in, struct reply *r)
{
	static Csi__V1__BoolValue ready = CSI__V1__BOOL_VALUE__INIT;
	static Csi__V1__ProbeResponse resp = CSI__V1__PROBE_RESPONSE__INIT;

	(void)in;
	ready.value = 1;
	resp.ready = &ready;
	r->resp = &resp.base;
}

/* ---- Node -------------------------------------------------------------- */

static void h_node_caps(const ProtobufCBinaryData *in, struct reply *r)
{
	/* no STAGE_UNSTAGE_VOLUME: kubelet goes straight to publish */
	static Csi__V1__NodeGetCapabilitiesResponse resp =
		CSI__V1__NODE_GET_CAPABILITIES_RESPONSE__INIT;

	(void)in;
	r->resp = &resp.base;
}

static void h_node_info(const ProtobufCBinaryData *in, struct reply *r)
{
	static Csi__V1__NodeGetInfoResponse resp = CSI__V1__NODE_GET_INFO_RESPONSE__INIT;

	(void)in;
	resp.node_id = (char *)g_node_id;
	r->resp = &resp.base;
}

static void h_publish(const ProtobufCBinaryData *in, struct reply *r)
{
	static Csi__V1__NodePublishVolumeResponse resp = CSI__V1__NODE_PUBLISH_VOLUME_RESPONSE__INIT;
	Csi__V1__NodePublishVolumeRequest *rq;
	struct csi_kv *kv = NULL;
	struct csi_publish p;
	int rc;

	rq = csi__v1__node_publish_volume_request__unpack(NULL, in->len, in->data);
	if (!rq) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "cannot decode NodePublishVolumeRequest");
		return;
	}
	if (!rq->volume_id || !*rq->volume_id) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "volume_id missing");
		goto out;
	}
	if (!printable(rq->volume_id)) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "volume_id: a control character in it");
		goto out;
	}
	if (!rq->target_path || !*rq->target_path) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "target_path missing");
		goto out;
	}
	if (!rq->volume_capability) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "volume_capability missing");
		goto out;
	}
	if (rq->volume_capability->access_type_case ==
	    CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "block access: mtcfs volumes are filesystems");
		goto out;
	}
	if (rq->volume_capability->mount && rq->volume_capability->mount->fs_type &&
	    *rq->volume_capability->mount->fs_type &&
	    strcmp(rq->volume_capability->mount->fs_type, "fuse.mtcfs")) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "fs_type %s: the volume is fuse.mtcfs",
		       rq->volume_capability->mount->fs_type);
		goto out;
	}
	kv = calloc(rq->n_volume_context + 1, sizeof(*kv));
	if (!kv) {
		status(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < rq->n_volume_context; i++) {
		kv[i].key = rq->volume_context[i]->key ? rq->volume_context[i]->key : "";
		kv[i].value = rq->volume_context[i]->value;
	}
	p = (struct csi_publish){ .volume_id = rq->volume_id, .target = rq->target_path,
				  .readonly = rq->readonly, .ctx = kv,
				  .n_ctx = rq->n_volume_context };
	rc = csi_node_publish(g_node, &p, r->msg, sizeof(r->msg));
	if (rc < 0) {
		r->code = node_code(rc);
		goto out;
	}
	r->resp = &resp.base;
out:
	free(kv);
	csi__v1__node_publish_volume_request__free_unpacked(rq, NULL);
}

static void h_unpublish(const ProtobufCBinaryData *in, struct reply *r)
{
	static Csi__V1__NodeUnpublishVolumeResponse resp =
		CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;
	Csi__V1__NodeUnpublishVolumeRequest *rq;
	int rc;

	rq = csi__v1__node_unpublish_volume_request__unpack(NULL, in->len, in->data);
	if (!rq) {
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "cannot decode NodeUnpublishVolumeRequest");
		return;
	}
	if (!rq->volume_id || !*rq->volume_id)
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "volume_id missing");
	else if (!printable(rq->volume_id))
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "volume_id: a control character in it");
	else if (!rq->target_path || !*rq->target_path)
		status(r, GRPC_STATUS_INVALID_ARGUMENT, "target_path missing");
	else if ((rc = csi_node_unpublish(g_node, rq->volume_id, rq->target_path, r->msg,
					  sizeof(r->msg))) < 0)
		r->code = node_code(rc);
	else
		r->resp = &resp.base;
	csi__v1__node_unpublish_volume_request__free_unpacked(rq, NULL);
}

static void h_unimplemented(const ProtobufCBinaryData *in, struct reply *r)
{
	(void)in;
	status(r, GRPC_STATUS_UNIMPLEMENTED, "not advertised by NodeGetCapabilities");
}

static struct method methods[] = {
	{ "/csi.v1.Identity/GetPluginInfo", h_plugin_info, NULL },
	{ "/csi.v1.Identity/GetPluginCapabilities", h_plugin_caps, NULL },
	{ "/csi.v1.Identity/Probe", h_probe, NULL },
	{ "/csi.v1.Node/NodeGetCapabilities", h_node_caps, NULL },
	{ "/csi.v1.Node/NodeGetInfo", h_node_info, NULL },
	{ "/csi.v1.Node/NodePublishVolume", h_publish, NULL },
	{ "/csi.v1.Node/NodeUnpublishVolume", h_unpublish, NULL },
	{ "/csi.v1.Node/NodeStageVolume", h_unimplemented, NULL },
	{ "/csi.v1.Node/NodeUnstageVolume", h_unimplemented, NULL },
	{ "/csi.v1.Node/NodeGetVolumeStats", h_unimplemented, NULL },
	{ "/csi.v1.Node/NodeExpandVolume", h_unimplemented, NULL },
};
#define N_METHODS (sizeof(methods) / sizeof(methods[0]))

/* ---- the gRPC core plumbing --------------------------------------------- */

struct slot {
	struct method *m;           /* NULL: takes the calls of any other method */
	grpc_call_details cd;       /* the method of such a call (m == NULL) */
	bool replying;              /* false: waiting for a call; true: batch sent */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;
	grpc_byte_buffer *out;
	grpc_slice details;
	int cancelled;
};

static grpc_server *g_server;
static grpc_completion_queue *g_cq;
static struct slot g_slots[N_METHODS * CALLS_PER_METHOD + GENERIC_CALLS];
static int g_shutdown_tag;
static _Atomic int g_stopping;   /* set before shutdown: no new requests */

static int slot_request(struct slot *s)
{
	grpc_call_error e;

	s->replying = false;
	s->call = NULL;
	s->payload = NULL;
	s->out = NULL;
	s->cancelled = 0;
	grpc_metadata_array_init(&s->md);
	if (s->m) {
		e = grpc_server_request_registered_call(g_server, s->m->reg, &s->call, &s->deadline,
							&s->md, &s->payload, g_cq, g_cq, s);
	} else {
		grpc_call_details_init(&s->cd);
		e = grpc_server_request_call(g_server, &s->call, &s->cd, &s->md, g_cq, g_cq, s);
		if (e != GRPC_CALL_OK)
			grpc_call_details_destroy(&s->cd);
	}
	if (e != GRPC_CALL_OK) {
		log_err(MOD, "request_call %s: %d", s->m ? s->m->path : "(other methods)", (int)e);
		grpc_metadata_array_destroy(&s->md);
		return -EIO;
	}
	return 0;
}

static void slot_release(struct slot *s)
{
	if (s->payload)
		grpc_byte_buffer_destroy(s->payload);
	if (s->out)
		grpc_byte_buffer_destroy(s->out);
	if (s->replying)
		grpc_slice_unref(s->details);
	if (s->call)
		grpc_call_unref(s->call);
	grpc_metadata_array_destroy(&s->md);
	if (!s->m)
		grpc_call_details_destroy(&s->cd);
	s->payload = s->out = NULL;
	s->call = NULL;
	s->replying = false;
}

/* A call arrived on s: run its handler, send the whole answer. */
static void slot_serve(struct slot *s)
{
	struct reply r = { .code = GRPC_STATUS_OK };
	ProtobufCBinaryData in = { 0, NULL };
	grpc_byte_buffer_reader rd;
	grpc_slice req = grpc_empty_slice();
	grpc_op ops[4];
	size_t nops = 0;
	grpc_call_error e;

	if (s->payload && grpc_byte_buffer_reader_init(&rd, s->payload)) {
		req = grpc_byte_buffer_reader_readall(&rd);
		grpc_byte_buffer_reader_destroy(&rd);
	}
	in.len = GRPC_SLICE_LENGTH(req);
	in.data = GRPC_SLICE_START_PTR(req);
	if (s->m)
		s->m->fn(&in, &r);
	else
		status(&r, GRPC_STATUS_UNIMPLEMENTED, "unknown method %.*s",
		       (int)GRPC_SLICE_LENGTH(s->cd.method),
		       (const char *)GRPC_SLICE_START_PTR(s->cd.method));
	grpc_slice_unref(req);
	if (r.code == GRPC_STATUS_OK && r.resp) {
		size_t len = protobuf_c_message_get_packed_size(r.resp);
		grpc_slice sl = grpc_slice_malloc(len);
		protobuf_c_message_pack(r.resp, GRPC_SLICE_START_PTR(sl));
		s->out = grpc_raw_byte_buffer_create(&sl, 1);
		grpc_slice_unref(sl);
	} else if (r.code == GRPC_STATUS_OK) {
		status(&r, GRPC_STATUS_INTERNAL, "no response");
	}
	if (r.code != GRPC_STATUS_OK)
		log_dbg(MOD, "%s -> status %d: %s", s->m ? s->m->path : "(other)", (int)r.code, r.msg);
	s->details = grpc_slice_from_copied_string(r.msg);
	s->replying = true;
	memset(ops, 0, sizeof(ops));
	ops[nops].op = GRPC_OP_SEND_INITIAL_METADATA;
	nops++;
	if (s->out) {
		ops[nops].op = GRPC_OP_SEND_MESSAGE;
		ops[nops].data.send_message.send_message = s->out;
		nops++;
	}
	ops[nops].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[nops].data.send_status_from_server.status = r.code;
	ops[nops].data.send_status_from_server.status_details = r.msg[0] ? &s->details : NULL;
	nops++;
	ops[nops].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[nops].data.recv_close_on_server.cancelled = &s->cancelled;
	nops++;
	e = grpc_call_start_batch(s->call, ops, nops, s, NULL);
	if (e != GRPC_CALL_OK) {
		log_err(MOD, "%s: start_batch: %d", s->m ? s->m->path : "(other)", (int)e);
		slot_release(s);
		slot_request(s);
	}
}

static void *poller(void *arg)
{
	(void)arg;
	for (;;) {
		grpc_event ev = grpc_completion_queue_next(g_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
		struct slot *s;

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type != GRPC_OP_COMPLETE)
			continue;
		if (ev.tag == &g_shutdown_tag) {
			/* every call is finished: let all pollers out */
			grpc_completion_queue_shutdown(g_cq);
			continue;
		}
		s = ev.tag;
		if (!s->replying) {
			if (!ev.success || g_stopping) {
				/* shutting down, or the request itself failed: a slot
				 * not asked again would be lost for good */
				slot_release(s);
				if (!g_stopping)
					slot_request(s);
				continue;
			}
			slot_serve(s);
		} else {
			slot_release(s);
			if (!g_stopping)
				slot_request(s);
		}
	}
	return NULL;
}

/* gRPC core's own messages go through our log, so --log-format json holds
 * for every line. Its ERRORs are mostly a client gone mid-call: WARN. */
static void grpc_log(gpr_log_func_args *a)
{
	enum log_level lvl = a->severity == GPR_LOG_SEVERITY_ERROR ? LOG_WARN : LOG_DEBUG;

	if (lvl == LOG_DEBUG && log_get_level() < LOG_DEBUG)
		return;
	log_msg(lvl, "grpc", "%s (%s:%d)", a->message, a->file, a->line);
}

/* ---- main --------------------------------------------------------------- */

/* The job mounts inherit this process's open-file limit, and rank 0's
 * mtcfs needs one descriptor per node of its job (and FUSE up to an eighth
 * of the limit): Kubernetes has no nofile setting for a container, so the
 * driver sets it (a privileged node pod may raise its hard limit): want
 * (soft and hard), else at least the soft limit raised to the hard one. */
static void raise_nofile(rlim_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (want) {
		struct rlimit up = { want, want };
		if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
			log_info("csi", "open-file limit %llu (--nofile)", (unsigned long long)want);
			return;
		}
		log_warn("csi", "cannot raise the open-file limit to %llu (%s): %llu stays; "
			 "a job's coordinator then takes fewer nodes (its log says how many)",
			 (unsigned long long)want, strerror(errno), (unsigned long long)rl.rlim_max);
	}
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mtcfs-csi --endpoint unix:///csi/csi.sock --node-id NODE [options]\n"
		"       mtcfs-csi render [--config FILE|-]...   the node DaemonSet of each\n"
		"                       CheckpointConfiguration (stdin without --config)\n"
		"  --config FILE        CheckpointConfiguration (or its spec) as YAML/JSON\n"
		"  --ram-root DIR       the node's RAM tier (tmpfs mounted here; default /var/lib/mtcfs/ram)\n"
		"  --state-dir DIR      per-job mounts and logs (default /var/lib/mtcfs/jobs)\n"
		"  --node-address ADDR  peer listen address of the job mounts (default $NODE_IP or 127.0.0.1)\n"
		"  --mtcfs PATH         the mtcfs binary (default: mtcfs on PATH)\n"
		"  --kubelet-dir DIR    kubelet's root: targets must be under DIR/pods (default\n"
		"                       /var/lib/kubelet)\n"
		"  --idle-timeout S     a job mount no pod uses stops after S seconds, its RAMDIR\n"
		"                       kept for the job's next pods (default 600)\n"
		"  --free-above PCT     RAM tier more than PCT%% full while a job runs: free the\n"
		"                       RAMDIRs of stopped jobs, oldest first (default 50; 0: never)\n"
		"  --nofile N           open-file limit for the job mounts (rank 0's coordinator\n"
		"                       needs one per node); default: the soft limit raised to the hard\n"
		"  --no-tmpfs           use --ram-root as it is, mount nothing there\n"
		"  --status             what each job holds in the RAM tier (published, idle,\n"
		"                       stopped; bytes; pods) and exit; beside a running driver too\n"
		"  --release            unmount the job mounts and the RAM tier (frees the node's\n"
		"                       checkpoint RAM, data included) and exit; no driver may run\n"
		"  --watch-config KIND/NAME  checkpointconfiguration/NAME or configmap/NS/NAME: poll it\n"
		"                       in the cluster; deleted -> refuse publishes, free the RAM tier\n"
		"                       (@FILE: the KIND/NAME written in FILE; empty: no watch)\n"
		"  --watch-interval S   seconds between polls (default 10)\n"
		"  --watch-grace N      not-found polls in a row that mean deleted (default 2)\n"
		"  --kube-api URL       API server (default https://$KUBERNETES_SERVICE_HOST:$..._PORT)\n"
		"  --kube-token FILE    bearer token (default the service account's)\n"
		"  --kube-ca FILE       CA of the API server (default the service account's ca.crt)\n"
		"  --no-kube-lookups    never ask the API for a Job's parallelism or rank 0's node\n"
		"  --log-format FMT     text (default) or json (also for the job mounts)\n"
		"  -d                   debug log (also for the job mounts)\n"
		"  --version\n");
}

/* --watch-config @FILE: the KIND/NAME in FILE (the DaemonSet's init
 * container writes which object it read the configuration from); an empty
 * or missing file is no watch (a WARN: the driver still serves, as it did
 * before the watch existed, e.g. outside a cluster). */
static int read_watch_file(const char *path, const char **out)
{
	static char buf[600];
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f && errno == ENOENT) {
		log_warn(MOD, "--watch-config @%s: no such file: not watching the configuration "
			 "(deleting it will not free the RAM tier)", path);
		*out = NULL;
		return 0;
	}
	if (!f) {
		fprintf(stderr, "mtcfs-csi: --watch-config @%s: %s\n", path, strerror(errno));
		return -errno;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r'))
		n--;
	buf[n] = 0;
	*out = n ? buf : NULL;
	return 0;
}

/* Read all of fd 0 (render's "-"). */
static int read_stdin(char **buf, size_t *len)
{
	size_t cap = 0;

	*buf = NULL;
	*len = 0;
	for (;;) {
		ssize_t r;

		if (*len + 4096 > cap) {
			size_t ncap = cap ? cap * 2 : 65536;
			char *p;

			if (ncap > (16u << 20))
				return -EFBIG;
			p = realloc(*buf, ncap);
			if (!p)
				return -ENOMEM;
			*buf = p;
			cap = ncap;
		}
		r = read(0, *buf + *len, cap - *len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (!r)
			return 0;
		*len += (size_t)r;
	}
}

/* mtcfs-csi render [--config FILE|-]...: every configuration of every
 * file (several documents each), one DaemonSet each, to stdout. */
static int render_main(int argc, char **argv)
{
	struct csi_cfg *all = NULL;
	size_t n_all = 0;
	char err[ERR_MAX];
	int rc = 0, files = 0;

	for (int i = 1; i <= argc && !rc; i++) {
		const char *path = NULL;
		struct csi_cfg *some, *grown;
		char *buf = NULL;
		size_t len = 0, n = 0;

		if (i == argc && files)
			break;
		if (i < argc) {
			if (strcmp(argv[i], "--config") || i + 1 >= argc) {
				fprintf(stderr, "usage: mtcfs-csi render [--config FILE|-]...\n");
				rc = 2;
				break;
			}
			path = argv[++i];
		}
		files++;
		if (!path || !strcmp(path, "-")) {
			path = "-";
			rc = read_stdin(&buf, &len);
		} else {
			rc = util_read_file_at(AT_FDCWD, path, 16u << 20, &buf, &len);
		}
		if (rc < 0) {
			fprintf(stderr, "mtcfs-csi render: %s: %s\n", path, strerror(-rc));
			free(buf);
			rc = 1;
			break;
		}
		rc = csi_cfg_parse_all(buf, len, &some, &n, err, sizeof(err));
		free(buf);
		if (rc < 0) {
			fprintf(stderr, "mtcfs-csi render: %s: %s\n", path, err);
			rc = 1;
			break;
		}
		grown = realloc(all, (n_all + n + 1) * sizeof(*all));
		if (!grown) {
			csi_cfg_free_all(some, n);
			rc = 1;
			break;
		}
		all = grown;
		memcpy(all + n_all, some, n * sizeof(*some));
		n_all += n;
		free(some);     /* its members now belong to all */
	}
	if (!rc && csi_render(all, n_all, stdout, err, sizeof(err)) < 0) {
		fprintf(stderr, "mtcfs-csi render: %s\n", err);
		rc = 1;
	}
	csi_cfg_free_all(all, n_all);
	return rc;
}

/* The command line as given. */
struct cli {
	const char *endpoint, *cfg_path;
	struct csi_node_opts o;
	struct csi_watch_opts wo;
	bool release, show_status, no_kube;
	const char *interval, *grace, *idle, *free_above, *nofile;
	char kubelet_dir[PATH_MAX];     /* o.kubelet_dir once checked */
};

/* argv's flags into *c. -1: go on; else the exit code (0 after --version
 * or --help; 2: a bad flag, usage on stderr). */
static int parse_cli(int argc, char **argv, struct cli *c)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name, dst) if (!strcmp(a, name)) { if (!v) goto bad; dst = v; i++; continue; }
		ARG("--endpoint", c->endpoint);
		ARG("--node-id", c->o.node_id);
		ARG("--config", c->cfg_path);
		ARG("--ram-root", c->o.ram_root);
		ARG("--state-dir", c->o.state_dir);
		ARG("--node-address", c->o.node_address);
		ARG("--mtcfs", c->o.mtcfs_bin);
		ARG("--kubelet-dir", c->o.kubelet_dir);
		ARG("--idle-timeout", c->idle);
		ARG("--free-above", c->free_above);
		ARG("--nofile", c->nofile);
		ARG("--watch-config", c->wo.what);
		ARG("--watch-interval", c->interval);
		ARG("--watch-grace", c->grace);
		ARG("--kube-api", c->wo.api_url);
		ARG("--kube-token", c->wo.token_file);
		ARG("--kube-ca", c->wo.ca_file);
#undef ARG
		if (!strcmp(a, "--log-format") && v) {
			if (log_set_format_name(v) < 0)
				goto bad;
			c->o.log_json = !strcmp(v, "json");
			i++;
		} else if (!strcmp(a, "--release")) {
			c->release = true;
		} else if (!strcmp(a, "--status")) {
			c->show_status = true;
		} else if (!strcmp(a, "--no-kube-lookups")) {
			c->no_kube = true;
		} else if (!strcmp(a, "--no-tmpfs")) {
			c->o.no_tmpfs = true;
		} else if (!strcmp(a, "-d")) {
			c->o.debug = true;
			log_set_level(LOG_DEBUG);
		} else if (!strcmp(a, "--version")) {
			printf("mtcfs-csi %s (%s)\n", MTCFS_VERSION, DRIVER_NAME);
			return 0;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else {
			goto bad;
		}
	}
	return -1;
bad:
	usage(stderr);
	return 2;
}

/* The flags' values checked and applied: the directories, the numbers,
 * the open-files limit, the watch list. -1: go on; else the exit code (2,
 * said on stderr). */
static int check_cli(struct cli *c)
{
	struct csi_node_opts *o = &c->o;
	uint64_t u;

	if (o->ram_root[0] != '/' || o->state_dir[0] != '/') {
		fprintf(stderr, "mtcfs-csi: --ram-root and --state-dir must be absolute\n");
		return 2;
	}
	{
		/* targets are compared as kubelet spells them: no trailing '/' */
		size_t kl = strlen(o->kubelet_dir);

		while (kl > 1 && o->kubelet_dir[kl - 1] == '/')
			kl--;
		if (o->kubelet_dir[0] != '/' || kl >= sizeof(c->kubelet_dir) || strstr(o->kubelet_dir, "/.")) {
			fprintf(stderr, "mtcfs-csi: --kubelet-dir must be an absolute, normalized path\n");
			return 2;
		}
		memcpy(c->kubelet_dir, o->kubelet_dir, kl);
		c->kubelet_dir[kl] = 0;
		o->kubelet_dir = c->kubelet_dir;
	}
	if (c->idle) {
		if (util_parse_u64(c->idle, 86400 * 365, &u) < 0)
			goto bad;
		o->idle_s = (unsigned)u;
	}
	if (c->free_above) {
		if (util_parse_u64(c->free_above, 100, &u) < 0)
			goto bad;
		o->free_pct = (unsigned)u;
	}
	if (c->nofile && (util_parse_u64(c->nofile, 1u << 30, &u) < 0 || u < 1024))
		goto bad;
	raise_nofile(c->nofile ? (rlim_t)u : 0);
	if (c->interval) {
		if (util_parse_u64(c->interval, 86400, &u) < 0 || !u)
			goto bad;
		c->wo.interval_s = (unsigned)u;
	}
	if (c->grace) {
		if (util_parse_u64(c->grace, 1000, &u) < 0 || !u)
			goto bad;
		c->wo.grace = (unsigned)u;
	}
	if (c->wo.what && c->wo.what[0] == '@' && read_watch_file(c->wo.what + 1, &c->wo.what) < 0)
		return 2;
	o->watch = c->wo.what;
	return -1;
bad:
	usage(stderr);
	return 2;
}

/* The driver's configuration file (path, or none) into *cfg; what of it
 * mtcfs ignores, logged. 0, or 2 (logged; *cfg freed). */
static int load_config(struct csi_cfg *cfg, const char *path)
{
	char err[ERR_MAX];

	if (path && csi_cfg_load(cfg, path, err, sizeof(err)) < 0) {
		log_err(MOD, "config %s: %s", path, err);
		csi_cfg_free(cfg);     /* what parsed before the bad key */
		return 2;
	}
	if (cfg->n_gcsfuse_opts)
		log_info(MOD, "config: %zu gcsFuseMountOptions ignored (mtcfs talks to Cloud Storage itself)",
			 cfg->n_gcsfuse_opts);
	if (cfg->n_gke_ignored)
		log_info(MOD, "config: csiEphemeralLimit/replicationOptions accepted and ignored "
			 "(GKE's driver container and replicator flags; nothing of mtcfs)");
	if (cfg->external_jax_ids)
		log_info(MOD, "config: enableExternalJaxProcessIds: mtcfs writes jax-init-info.txt "
			 "for every job (the mount option no_jax_init_info turns it off)");
	if (!cfg->bucket)
		log_info(MOD, "config: no cloudStorageBucketName: the job mounts have no backup tier");
	return 0;
}

/* The Kubernetes API for the lookups, when in a pod (o->kube then set).
 * 0, or 2: its flags are bad (logged). */
static int kube_setup(struct cli *c, struct csi_kube *kube)
{
	char err[ERR_MAX];
	int rc = csi_kube_init(kube, c->wo.api_url, c->wo.token_file, c->wo.ca_file, err, sizeof(err));

	if (rc == 0 && curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) {
		c->o.kube = kube;
		log_info(MOD, "Kubernetes API %s: podsPerJob and rank 0's node are looked up "
			 "when the volume attributes do not give them", kube->base);
	} else if (rc == -EINVAL) {
		log_err(MOD, "%s", err);
		return 2;
	} else {
		log_info(MOD, "no Kubernetes API (not in a pod): podsPerJob and the coordinator "
			 "only from the volume attributes and the pod's name");
	}
	return 0;
}

/* gRPC's methods registered and its socket sock made, kubelet's only
 * (addr: "unix:" sock; *creds to release). 0, or -1 (logged). */
static int grpc_listen(const char *sock, char *addr, size_t addr_len,
		       grpc_server_credentials **creds)
{
	struct stat sst;
	mode_t um;

	for (size_t i = 0; i < N_METHODS; i++) {
		methods[i].reg = grpc_server_register_method(g_server, methods[i].path, NULL,
							     GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
		if (!methods[i].reg) {
			log_err(MOD, "cannot register %s", methods[i].path);
			return -1;
		}
	}
	if (unlink(sock) < 0 && errno != ENOENT) {
		log_err(MOD, "remove stale socket %s: %s", sock, strerror(errno));
		return -1;
	}
	snprintf(addr, addr_len, "unix:%s", sock);
	*creds = grpc_insecure_server_credentials_create();
	/* the socket is kubelet's (root) only: whoever can call publish binds
	 * mounts as root. bind(2) gives it 0777 & ~umask; no other thread
	 * creates files now (the job mounts start at the first publish) */
	um = umask(0177);
	if (!grpc_server_add_http2_port(g_server, addr, *creds)) {
		umask(um);
		log_err(MOD, "cannot listen on %s", addr);
		return -1;
	}
	umask(um);
	if (chmod(sock, 0600) < 0 || stat(sock, &sst) < 0 || (sst.st_mode & 0777) != 0600) {
		log_err(MOD, "%s: cannot make it 0600: %s", sock, strerror(errno));
		return -1;
	}
	return 0;
}

/* The server shut down, its calls cancelled, the nth pollers th joined
 * (with none, the queue drained here). */
static void grpc_stop(pthread_t *th, size_t nth)
{
	g_stopping = 1;
	grpc_server_shutdown_and_notify(g_server, g_cq, &g_shutdown_tag);
	grpc_server_cancel_all_calls(g_server);
	if (nth) {
		/* a poller shuts the queue down when the shutdown tag arrives */
		for (size_t i = 0; i < nth; i++)
			pthread_join(th[i], NULL);
	} else {
		for (;;) {
			grpc_event ev = grpc_completion_queue_next(g_cq,
				gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
			if (ev.type == GRPC_QUEUE_SHUTDOWN)
				break;
			if (ev.type == GRPC_OP_COMPLETE && ev.tag == &g_shutdown_tag)
				grpc_completion_queue_shutdown(g_cq);
			else if (ev.type == GRPC_OP_COMPLETE)
				slot_release(ev.tag);
		}
	}
}

/* The driver on unix socket sock until SIGTERM/SIGINT: the node, the
 * configuration watch, gRPC's server and its pollers; all stopped again.
 * 0 after a signal, 1 when it could not start (logged). */
static int serve(const struct csi_node_opts *o, const struct csi_watch_opts *wo, const char *sock)
{
	char err[ERR_MAX], addr[PATH_MAX + 8];
	pthread_t th[RPC_THREADS];
	size_t nth = 0;
	sigset_t sigs;
	int rc = 1, sig;
	grpc_server_credentials *creds = NULL;
	struct csi_watch *watch = NULL;

	/* signals go to sigwait below, never to the gRPC or job threads */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (csi_node_create(o, &g_node, err, sizeof(err)) < 0) {
		log_err(MOD, "%s", err);
		return 1;
	}
	/* before the RPC threads: the first poll may find it gone already */
	if (wo->what && csi_watch_start(wo, g_node, &watch, err, sizeof(err)) < 0) {
		log_err(MOD, "%s", err);
		csi_node_destroy(g_node);
		return 1;
	}
	gpr_set_log_function(grpc_log);
	grpc_init();
	g_cq = grpc_completion_queue_create_for_next(NULL);
	g_server = grpc_server_create(NULL, NULL);
	grpc_server_register_completion_queue(g_server, g_cq, NULL);
	if (grpc_listen(sock, addr, sizeof(addr), &creds) < 0)
		goto out_grpc;
	grpc_server_start(g_server);
	for (size_t i = 0; i < sizeof(g_slots) / sizeof(g_slots[0]); i++) {
		struct slot *s = &g_slots[i];
		s->m = i < N_METHODS * CALLS_PER_METHOD ? &methods[i / CALLS_PER_METHOD] : NULL;
		if (slot_request(s) < 0)
			goto out_stop;
	}
	for (; nth < RPC_THREADS; nth++)
		if (pthread_create(&th[nth], NULL, poller, NULL) != 0) {
			log_err(MOD, "pthread_create failed");
			goto out_stop;
		}
	log_info(MOD, "%s %s serving on %s node_id=%s ram_root=%s state_dir=%s", DRIVER_NAME,
		 MTCFS_VERSION, addr, o->node_id, o->ram_root, o->state_dir);
	do {
		if (sigwait(&sigs, &sig) != 0)
			sig = SIGTERM;
	} while (sig != SIGTERM && sig != SIGINT);
	log_info(MOD, "signal %d: stopping", sig);
	rc = 0;
out_stop:
	grpc_stop(th, nth);
out_grpc:
	if (g_server)
		grpc_server_destroy(g_server);
	if (g_cq)
		grpc_completion_queue_destroy(g_cq);
	if (creds)
		grpc_server_credentials_release(creds);
	grpc_shutdown();
	csi_watch_stop(watch);      /* before the node it calls into */
	csi_node_destroy(g_node);
	unlink(sock);
	return rc;
}

int main(int argc, char **argv)
{
	struct cli c = {
		.o = {
			.ram_root = "/var/lib/mtcfs/ram", .state_dir = "/var/lib/mtcfs/jobs",
			.mtcfs_bin = "mtcfs", .kubelet_dir = "/var/lib/kubelet", .idle_s = 600,
			.free_pct = 50,
		},
		.wo = { .interval_s = 10, .grace = 2 },
	};
	struct csi_cfg cfg;
	struct csi_kube kube;
	char err[ERR_MAX];
	const char *sock;
	int rc;

	if (argc > 1 && !strcmp(argv[1], "render"))
		return render_main(argc - 1, argv + 1);
	csi_cfg_init(&cfg);
	c.o.node_address = getenv("NODE_IP") && *getenv("NODE_IP") ? getenv("NODE_IP") : "127.0.0.1";
	if ((rc = parse_cli(argc, argv, &c)) >= 0 || (rc = check_cli(&c)) >= 0)
		return rc;
	if (c.show_status) {
		if (csi_node_status(&c.o, stdout, err, sizeof(err)) < 0) {
			log_err(MOD, "status: %s", err);
			return 1;
		}
		return 0;
	}
	if (c.release) {
		if (csi_node_release(&c.o, err, sizeof(err)) < 0) {
			log_err(MOD, "release: %s", err);
			return 1;
		}
		return 0;
	}
	if (!c.endpoint || !c.o.node_id || !*c.o.node_id) {
		usage(stderr);
		return 2;
	}
	sock = !strncmp(c.endpoint, "unix://", 7) ? c.endpoint + 7 : c.endpoint;
	if (sock[0] != '/') {
		fprintf(stderr, "mtcfs-csi: --endpoint %s: expected unix:///ABS/PATH\n", c.endpoint);
		return 2;
	}
	if ((rc = load_config(&cfg, c.cfg_path)) != 0)
		return rc;
	c.o.cfg = &cfg;
	g_node_id = c.o.node_id;
	if (!c.no_kube && (rc = kube_setup(&c, &kube)) != 0) {
		csi_cfg_free(&cfg);
		return rc;
	}
	rc = serve(&c.o, &c.wo, sock);
	csi_cfg_free(&cfg);
	return rc;
}
