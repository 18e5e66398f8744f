#!/usr/bin/env bash
# Builds the upstream Kubernetes e2e suite (e2e.test), the ginkgo CLI that
# runs it in parallel and the kubectl its sig-cli specs call, from the
# pinned e2e/tools/e2etest module, into BIN_DIR, with the same version
# stamping as hack/build-control-plane.sh. `make conformance` runs them.
#
# The suite has a module of its own so that its test-only dependencies never
# move the control plane's pins, and its stamp changes only when its own
# pins do. Results are reused twice over, as for the control plane:
#   - BIN_DIR is skipped when its stamp (.e2e-test-stamp) matches;
#   - a per-user cache directory keeps a copy keyed by the same stamp.
#
# A cold build of e2e.test takes several minutes; ginkgo and kubectl take
# seconds once its packages are built.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/e2e/tools/e2etest"
BIN_DIR=${BIN_DIR:-$root/_output/bin}
CACHE_DIR=${KUBE_APICACHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-apicache}
KUBE_VERSION=v1.37.2
bins=(e2e.test ginkgo kubectl)

stamp=$(cat "$tools/go.mod" "$tools/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
cached="$CACHE_DIR/e2e-test-$stamp"

have() {
  local dir=$1 file=$2
  [[ -f "$dir/$file" && "$(cat "$dir/$file")" == "$stamp" ]] || return 1
  for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}

if have "$BIN_DIR" .e2e-test-stamp; then
  exit 0
fi
mkdir -p "$BIN_DIR"
if have "$cached" .stamp; then
  echo "e2e.test: reusing the $KUBE_VERSION suite, ginkgo and kubectl from the cache"
  for b in "${bins[@]}"; do cp -f "$cached/$b" "$BIN_DIR/$b"; done
  echo "$stamp" >"$BIN_DIR/.e2e-test-stamp"
  exit 0
fi

echo "e2e.test: building the $KUBE_VERSION e2e suite from source (several minutes when cold)"
start=$SECONDS
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
cd "$tools"
export CGO_ENABLED=0
# The module lists the suite's imports (imports.go) but has no package that
# imports it; go test -c builds the test binary of k8s.io/kubernetes/test/e2e
# itself. The ginkgo CLI must be the version the suite links, and kubectl
# the suite's release; the module's tool directive pins both.
GOFLAGS=-mod=mod go test -c -trimpath -ldflags "$ldflags" -o "$BIN_DIR/e2e.test" k8s.io/kubernetes/test/e2e
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/kubectl" k8s.io/kubernetes/cmd/kubectl
echo "$stamp" >"$BIN_DIR/.e2e-test-stamp"
echo "e2e.test: built in $((SECONDS - start))s"

mkdir -p "$cached.tmp"
for b in "${bins[@]}"; do cp -f "$BIN_DIR/$b" "$cached.tmp/$b"; done
echo "$stamp" >"$cached.tmp/.stamp"
rm -rf "$cached" && mv "$cached.tmp" "$cached"
