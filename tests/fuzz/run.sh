#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a
# while; fails if any target finds a crash, a leak, a timeout or a sanitizer
# report. The seeds (corpus/<target>/) and past findings
# (regressions/<target>/) are replayed first, so a finding that comes back
# fails at once.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     # default 20 s, all targets
#
# Needs: clang, libclang-rt-14-dev (libFuzzer + sanitizer runtimes),
# llvm-14 for symbolized reports (optional). Environment:
#   MTCFS_FUZZ_BUILD  build directory        (default build-fuzz)
#   MTCFS_FUZZ_WORK   corpora/logs/artifacts (default $MTCFS_FUZZ_BUILD/fuzz-work)
#   CC                the compiler           (default clang)
# New inputs go to $MTCFS_FUZZ_WORK/<target>/corpus, crashes to
# .../artifacts/; the committed corpus is never written.
set -euo pipefail

secs=${1:-20}
if [ $# -gt 0 ]; then shift; fi
case $secs in ''|*[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2 ;; esac
top=$(cd "$(dirname "$0")/../.." && pwd)
fuzzdir=$top/tests/fuzz
build=${MTCFS_FUZZ_BUILD:-$top/build-fuzz}
work=${MTCFS_FUZZ_WORK:-$build/fuzz-work}
cc=${CC:-clang}
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(fuzz_replicator_yaml fuzz_peer_frame fuzz_manifest fuzz_gcs_json)

if ! command -v "$cc" >/dev/null; then
  echo "fuzz: $cc not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' \
  > "$probe/p.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz: $cc cannot link libFuzzer (Debian: apt-get install libclang-rt-14-dev):" >&2
  cat "$probe/err" >&2
  exit 2
fi

echo "=== fuzz build ($build)"
start=$SECONDS
cmake -S "$top" -B "$build" -DCMAKE_C_COMPILER="$cc" -DMTCFS_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target "${targets[@]}" -j"$(nproc)" >"$probe/build.log" 2>&1 || {
  tail -n 50 "$probe/build.log" >&2; exit 1; }
echo "built in $((SECONDS - start)) s"

sym=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0${sym:+:external_symbolizer_path=$sym}}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1${sym:+:external_symbolizer_path=$sym}}

rc=0
for t in "${targets[@]}"; do
  dirs=("$work/$t/corpus" "$fuzzdir/corpus/$t")
  [ -d "$fuzzdir/regressions/$t" ] && dirs+=("$fuzzdir/regressions/$t")
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  log=$work/$t/log
  dict=()
  [ -f "$fuzzdir/$t.dict" ] && dict=(-dict="$fuzzdir/$t.dict")
  echo "=== $t: ${secs} s"
  if "$build/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" ${dict[@]+"${dict[@]}"} \
       "${dirs[@]}" \
       >"$log" 2>&1; then
    grep -aE '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
    grep -aE '^stat::number_of_executed_units|^stat::new_units_added' "$log" | tr '\n' ' '
    echo
  else
    rc=1
    echo "!!! $t FAILED; last lines of $log:"
    grep -av -E '^(INFO:|#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD))' "$log" | tail -n 80
    echo "!!! reproducer(s) in $work/$t/artifacts/:"
    ls -l "$work/$t/artifacts/"
    echo "!!! replay: $build/$t <file>   (copy it to tests/fuzz/regressions/$t/ once understood)"
  fi
done
echo "=== fuzz done in $((SECONDS - start)) s: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
exit $rc
