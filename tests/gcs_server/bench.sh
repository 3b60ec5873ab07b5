#!/usr/bin/env bash
# bench: a 2 GiB shard (3 x 600 MiB + 992 x 256 KiB, random bytes, on
# /dev/shm) through the test server on loopback:
#   upload   mtcfs bkt (bk_upload_shard, parallel)  vs  curl, one file at a time
#   download mtcfs bkt (bk_fetch_shard, parallel + ranged)  vs  gcloud storage cp -r
#            vs curl, one file at a time
# For each phase: wall time, MiB/s, the client's CPU seconds and the CPU
# seconds the Python server burnt (utime+stime from /proc): when the server's
# CPU is close to the wall time, the server is the limit, not the client.
# The server runs with --no-md5 (BENCH_MD5=1 keeps MD5, ~1.5 s of server CPU
# per GiB uploaded). BENCH_PARALLEL (8), BENCH_DIR (/dev/shm/mtcfs-bench).
# Usage: tests/gcs_server/bench.sh [BUILD_DIR]   (needs mtcfs-bucket-cli built)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${MTCFS_BUILD:-$top/build}}
cli=$build/mtcfs-bucket-cli
par=${BENCH_PARALLEL:-8}
work=${BENCH_DIR:-/dev/shm/mtcfs-bench}
[ -x "$cli" ] || { echo "no $cli" >&2; exit 2; }

rm -rf "$work"
mkdir -p "$work/shard/small"
for i in 0 1 2; do head -c $((600 << 20)) /dev/urandom > "$work/shard/large$i.bin"; done
head -c $((992 << 18)) /dev/urandom > "$work/blob"
split -b 262144 -a 4 -d "$work/blob" "$work/shard/small/s"
rm "$work/blob"
total=$(du -sb "$work/shard" | cut -f1)
nfiles=$(find "$work/shard" -type f | wc -l)
echo "shard: $nfiles files, $total bytes"

md5=--no-md5
[ "${BENCH_MD5:-0}" = 1 ] && md5=
coproc SRV { exec /usr/bin/python3 "$top/tests/gcs_server/gcs_server.py" --port 0 --exit-on-eof $md5; }
read -r line <&"${SRV[0]}"
port=${line#PORT=}
srvpid=$SRV_PID
trap 'kill $srvpid 2>/dev/null || true; rm -rf "$work"' EXIT
base=http://127.0.0.1:$port
export STORAGE_EMULATOR_HOST=127.0.0.1:$port

cpu() { awk '{print $14 + $15}' "/proc/$srvpid/stat"; }
hz=$(getconf CLK_TCK)
# run NAME COMMAND...: time the command (wall, client CPU) and the server's CPU
run() {
	local name=$1 c0 c1
	shift
	c0=$(cpu)
	/usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >/dev/null 2>"$work/stderr" || { echo "$name failed:"; tail -3 "$work/stderr"; }
	c1=$(cpu)
	read -r wall usr sys < "$work/time"
	awk -v n="$name" -v s="$wall" -v cu="$usr" -v cs="$sys" -v c0="$c0" -v c1="$c1" -v b="$total" -v hz="$hz" \
		'BEGIN { printf "%-36s %6.2f s %7.1f MiB/s   client CPU %6.2f s   server CPU %6.2f s\n", n, s, b / 1048576 / s, cu + cs, (c1 - c0) / hz }'
}
reset() { curl -sf -X POST -d '{"data": true}' "$base/_reset" >/dev/null; }
curl_up() {
	cd "$1" && find . -type f -printf '%P\n' | while read -r f; do
		curl -sSf -X POST -T "$f" -H 'Content-Type: application/octet-stream' -o /dev/null \
			"$2/upload/storage/v1/b/bench/o?uploadType=media&ifGenerationMatch=0&name=curl/$f"
	done
}
curl_down() {
	cd "$1" && find . -type f -printf '%P\n' | while read -r f; do
		mkdir -p "$3/$(dirname "$f")"
		curl -sSf -o "$3/$f" "$2/storage/v1/b/bench/o/p%2Fjob%2FB%2F$4.data%2F${f//\//%2F}?alt=media"
	done
}
export -f curl_up curl_down

# --- uploads ---
reset
run "upload: bkt, $par parallel" "$cli" --parallel "$par" gs://bench/p upload-shard job B 1 0 0 "$work/shard"
reset
run "upload: bkt, 1 at a time" "$cli" --parallel 1 gs://bench/p upload-shard job B 1 0 0 "$work/shard"
reset
run "upload: curl, 1 at a time" bash -c 'curl_up "$0" "$1"' "$work/shard" "$base"

# --- downloads (of bkt's upload) ---
reset
"$cli" --parallel "$par" gs://bench/p upload-shard job B 1 0 0 "$work/shard" >/dev/null
hash=$("$cli" gs://bench/p cat job/B/job-s1-n0-w0.meta)
same() { diff -rq "$work/shard" "$1" >/dev/null && echo "  (bytes equal)" || echo "  (BYTES DIFFER)"; }

rm -rf "$work/out"
run "download: bkt, $par parallel+ranged" "$cli" --parallel "$par" gs://bench/p fetch-shard job B 0 0 "$work/out"
same "$work/out"
rm -rf "$work/out"
run "download: bkt, 1 at a time" "$cli" --parallel 1 gs://bench/p fetch-shard job B 0 0 "$work/out"
same "$work/out"
rm -rf "$work/out"; mkdir -p "$work/out"
run "download: curl, 1 at a time" bash -c 'curl_down "$0" "$1" "$2" "$3"' "$work/shard" "$base" "$work/out" "$hash"
same "$work/out"
if command -v gcloud >/dev/null; then
	rm -rf "$work/out"; mkdir -p "$work/out"
	export CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE=$base/ CLOUDSDK_AUTH_DISABLE_CREDENTIALS=True \
		CLOUDSDK_CORE_PROJECT=bench CLOUDSDK_CONFIG=$work/gcloud CLOUDSDK_CORE_DISABLE_PROMPTS=1
	run "download: gcloud storage cp -r" gcloud storage cp -r "gs://bench/p/job/B/$hash.data" "$work/out/"
	same "$work/out/$hash.data"
fi
