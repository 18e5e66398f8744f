#!/usr/bin/env bash
# The test suite behind `make test` (what CI runs) and `make test-quick`
# (the inner loop while developing).
#
#   hack/test.sh          builds, vet, then at the same time: the unit
#                         tests and fuzz targets, the e2e suite in
#                         $E2E_SHARDS shards (each its own sandbox; the
#                         tests are shared out as a work queue, the
#                         real-node scenarios and the demo all in one
#                         shard), and the conformance comparison (after
#                         building e2e.test); then the figures, the
#                         results and a table of the phases and the
#                         slowest tests
#   hack/test.sh quick    builds the agent only, vet, the unit tests and
#                         the core e2e scenarios ($QUICK_TESTS) in one
#                         shard: no real node, no conformance, no fuzz
#   hack/test.sh matrix   the compact matrix scenario ($MATRIX_TESTS) on
#                         every release in e2e/k8s ($MATRIX_RELEASES),
#                         one after another, each on its own control plane
#
# The full suite also runs the matrix scenario on the oldest release
# ($MATRIX_OLDEST), beside the e2e shards once conformance has ended.
#
# Everything lands in _output/test: a log per job, the go test JSON
# streams, the phases (phases.tsv) and the figures. The exit status is
# non-zero when any phase failed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mode=${1:-full}
case $mode in full | quick | matrix) ;; *)
  echo "usage: hack/test.sh [full|quick|matrix]" >&2
  exit 2
  ;;
esac

GO=${GO:-go}
BIN_DIR=${BIN_DIR:-$root/_output/bin}
IMAGES_DIR=${IMAGES_DIR:-$root/_output/images}
# The previous commit's agent image and manifests (make upgrade-images),
# for the upgrade scenario of the real node.
UPGRADE_DIR=${UPGRADE_DIR:-$root/_output/upgrade}
E2E_SHARDS=${E2E_SHARDS:-2}
E2E_TIMEOUT=${E2E_TIMEOUT:-45m}
CONFORMANCE_ARGS=${CONFORMANCE_ARGS:-}
# The core e2e scenarios of the inner loop (about 3 minutes of the suite's
# 34): fail-open in both dataplanes and the graceful hand-off, authorized
# cached reads, on-demand caches, the watch cache against kube-apiserver,
# slow watchers, the CSR identity, forwarding, field labels, bad start-up
# input, and the suite's own claim check.
QUICK_TESTS=${QUICK_TESTS:-'^(TestNFTablesKilledAgentFailsOpen|TestHungAgentFailsOpen|TestGracefulHandoff|TestAccessDecisions|TestCacheDifferential|TestCacheOnDemand|TestWatchFormsMatchKubeAPIServer|TestSlowWatcher|TestServingIdentity|TestPassThrough|TestFieldLabelsMatchKubeAPIServer|TestBadStartupInput|TestEveryTestClaims)$'}
# The compact scenario that runs on every supported release: cached reads
# for each kind of caller (ServiceAccount tokens, users and groups, client
# certificates), watches and their fan-out, watch-list informers, a
# consistent read across clients, the CSR path to the serving
# certificate, the field label tables against that kube-apiserver,
# degraded mode in and out, a watch from resourceVersion 1, and the
# node's pods followed when node impersonation is refused.
MATRIX_TESTS=${MATRIX_TESTS:-'^(TestAccessDecisions|TestClientCertificateCaller|TestWatchFormsMatchKubeAPIServer|TestWatchListInformers|TestConsistentReadsAcrossClients|TestServingIdentity|TestFieldLabelsMatchKubeAPIServer|TestDegradedMode|TestDifferentialForms|TestNodeImpersonationRefused|TestEveryTestClaims)$'}
MATRIX_RELEASES=${MATRIX_RELEASES:-$(cd "$root/e2e/k8s" && echo 1.*)}
MATRIX_OLDEST=${MATRIX_OLDEST:-${MATRIX_RELEASES%% *}}
pkg=github.com/kube-apicache/kube-apicache/e2e

out=$root/_output/test
rm -rf "$out"
mkdir -p "$out"
phases=$out/phases.tsv
: >"$phases"
status=0

# record NAME SECONDS RC appends a phase to the table.
record() {
  local result=ok
  [ "$3" -eq 0 ] || result="FAIL (exit $3)"
  printf '%s\t%s\t%s\n' "$1" "$2" "$result" >>"$phases"
}

since() { echo "$1 $EPOCHREALTIME" | awk '{printf "%.1f", $2 - $1}'; }

# phase NAME CMD... runs a step in the foreground and records it.
phase() {
  local name=$1 start=$EPOCHREALTIME rc=0
  shift
  echo "=== phase: $name"
  "$@" || rc=$?
  record "$name" "$(since "$start")" "$rc"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

# job NAME CMD... starts a step in the background, its output in
# $out/NAME.log; wait_jobs waits for them all, printing each job's output
# as it ends.
declare -A job_name job_start
job() {
  local name=$1
  shift
  echo "=== started: $name (log: _output/test/$name.log)"
  "$@" >"$out/$name.log" 2>&1 &
  job_name[$!]=$name
  job_start[$!]=$EPOCHREALTIME
}
wait_jobs() {
  local pid rc name
  while [ ${#job_name[@]} -gt 0 ]; do
    rc=0
    wait -n -p pid "${!job_name[@]}" || rc=$?
    name=${job_name[$pid]}
    record "$name" "$(since "${job_start[$pid]}")" "$rc"
    [ "$rc" -eq 0 ] || status=1
    echo "=== finished: $name ($(tail -n1 "$phases" | cut -f2-3 | tr '\t' ' '))"
    cat "$out/$name.log"
    unset "job_name[$pid]" "job_start[$pid]"
  done
}

# e2e_shard I TESTS [BIN_DIR] runs the prebuilt e2e binary as shard I (of
# the processes sharing $out/claims) through test2json, against the
# control plane in BIN_DIR ($BIN_DIR by default).
e2e_shard() {
  local i=$1 run=$2 bin=${3:-$BIN_DIR} claims=$out/claims
  if [ "$bin" != "$BIN_DIR" ]; then
    # Another release: a process of its own, which shares out no tests.
    claims=$out/claims-$i
    mkdir -p "$claims"
  fi
  (
    cd "$root/e2e" &&
      KUBE_APICACHE_E2E_CLAIMS=$claims KUBE_APICACHE_E2E_SHARD=$i \
        KUBE_APICACHE_FIGURES=$out/figures-$i.txt KUBE_APICACHE_BIN_DIR=$bin \
        KUBE_APICACHE_IMAGES_DIR=$IMAGES_DIR KUBE_APICACHE_UPGRADE_DIR=$UPGRADE_DIR \
        "$out/e2e.test" -test.v=test2json -test.count=1 -test.timeout "$E2E_TIMEOUT" -test.run "$run" 2>&1
  ) | "$GO" tool test2json -t -p "$pkg" | "$out/testreport" stream --json "$out/e2e-$i.json"
  return "${PIPESTATUS[0]}"
}

unit() {
  local pkgs
  pkgs=$("$GO" list ./... | grep -v "^$pkg\$") || return 1
  # shellcheck disable=SC2086
  "$GO" test -json -count=1 $pkgs 2>&1 | "$out/testreport" stream --json "$out/unit.json"
  return "${PIPESTATUS[0]}"
}

unit_and_fuzz() {
  local rc=0
  unit || rc=$?
  make --no-print-directory fuzz || rc=$?
  return "$rc"
}

# conformance builds e2e.test first (several minutes when cold, nothing
# when cached): only this job needs it, so on a fresh machine its build
# overlaps the e2e shards rather than delaying them.
conformance() {
  make --no-print-directory e2e-test || return
  # shellcheck disable=SC2086
  "$GO" run ./e2e/conformance --bin-dir "$BIN_DIR" --parallel $CONFORMANCE_ARGS
}

# release_bin MINOR is where that release's control plane is built.
release_bin() {
  if [ "$1" = "$(cat "$root/e2e/k8s/default")" ]; then
    echo "$BIN_DIR"
  else
    echo "$root/_output/k8s-$1/bin"
  fi
}

# matrix_shard MINOR runs the matrix scenario on that release, with no
# real node (the matrix needs none).
matrix_shard() {
  KUBE_APICACHE_REAL_NODE= e2e_shard "k8s-$1" "$MATRIX_TESTS" "$(release_bin "$1")"
}

# after_conformance CMD... runs CMD once the conformance job has ended
# (its time in the phase table includes that wait).
after_conformance() {
  while kill -0 "$conformance_pid" 2>/dev/null; do sleep 5; done
  "$@"
}

mkdir -p "$out/claims"
if [ "$mode" = matrix ]; then
  phase "build: system packages" make --no-print-directory deps
  for minor in $MATRIX_RELEASES; do
    phase "build: control plane $minor" make --no-print-directory control-plane KUBE_MINOR="$minor" BIN_DIR="$(release_bin "$minor")"
  done
  phase "build: test binaries" bash -c "'$GO' build -o '$out/testreport' ./e2e/testreport && '$GO' test -c -o '$out/e2e.test' ./e2e"
  for minor in $MATRIX_RELEASES; do
    phase "e2e: Kubernetes $minor" matrix_shard "$minor"
  done
  echo
  echo "--- results"
  grep -hE '^(ok|FAIL|panic:)' "$out"/e2e-*.log 2>/dev/null || true
  echo
  "$out/testreport" summary --phases "$phases" "$out"/e2e-*.json || status=1
  exit "$status"
fi
if [ "$mode" = full ]; then
  phase "build: system packages" make --no-print-directory deps node-deps apt-lists
  phase "build: control plane" make --no-print-directory control-plane
  phase "build: control plane $MATRIX_OLDEST" make --no-print-directory control-plane KUBE_MINOR="$MATRIX_OLDEST" BIN_DIR="$(release_bin "$MATRIX_OLDEST")"
  phase "build: node binaries" make --no-print-directory node-binaries
  phase "build: images" make --no-print-directory image e2e-images
  phase "build: previous images" make --no-print-directory upgrade-images UPGRADE_DIR="$UPGRADE_DIR"
  # The release as a team would cut it, offline: its image archive, SBOMs
  # (checked against the archive), pinned manifests and chart, notes and
  # checksums. A developer's uncommitted changes are let through here.
  phase "build: release v0.1.0" env KUBE_APICACHE_RELEASE_DIRTY=1 RELEASE_DIR="$out/release-v0.1.0" \
    make --no-print-directory release VERSION=v0.1.0
else
  phase "build: system packages" make --no-print-directory deps
  phase "build: control plane" make --no-print-directory control-plane
fi
phase "vet, manifests" make --no-print-directory vet verify-manifests
phase "build: test binaries" bash -c "'$GO' build -o '$out/testreport' ./e2e/testreport && '$GO' test -c -o '$out/e2e.test' ./e2e"
if [ ! -x "$out/e2e.test" ] || [ ! -x "$out/testreport" ]; then
  echo "test: the test binaries did not build" >&2
  exit 1
fi

if [ "$mode" = full ]; then
  export KUBE_APICACHE_REAL_NODE=1
  job unit unit_and_fuzz
  for i in $(seq 1 "$E2E_SHARDS"); do
    job "e2e-$i" e2e_shard "$i" .
  done
  job conformance conformance
  conformance_pid=$!
  # Once conformance is done, in its place: a third control plane beside
  # the two shards and conformance's would slow every scenario's
  # deadlines, and one after the shards would add its whole length.
  job "e2e-k8s-$MATRIX_OLDEST" after_conformance matrix_shard "$MATRIX_OLDEST"
else
  job unit unit
  job e2e-1 e2e_shard 1 "$QUICK_TESTS"
fi
wait_jobs

figures=$(cat "$out"/figures-*.txt 2>/dev/null)
if [ -n "$figures" ]; then
  echo
  echo "--- measured figures (e2e)"
  echo "$figures"
fi
if [ -f "$out/conformance.log" ]; then
  echo
  echo "--- upstream conformance specs, through the agent and directly"
  grep -E 'specs, passed through the agent|cache \(agent run\)|direct run: (reusing|kept)' "$out/conformance.log" || {
    echo "conformance: no verdict"
    status=1
  }
fi
echo
echo "--- results"
grep -hE '^(ok|FAIL|panic:)' "$out"/unit.log "$out"/e2e-*.log 2>/dev/null || true
echo
"$out/testreport" summary --phases "$phases" "$out"/unit.json "$out"/e2e-*.json || status=1
exit "$status"
