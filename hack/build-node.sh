#!/usr/bin/env bash
# Builds the sandbox's optional real node (kubelet, kube-proxy, and the
# kube-scheduler that places DaemonSet and Deployment pods on it) from the
# release's module in e2e/k8s (the one the control plane uses) into
# BIN_DIR, with the same version stamping as hack/build-control-plane.sh.
#
# The node's stamp is its own (this script is part of it), so building the
# node never invalidates the control plane's binaries. Results are reused
# twice over, as for the control plane:
#   - BIN_DIR is skipped when its node stamp (.node-stamp) matches;
#   - a per-user cache directory keeps a copy keyed by the same stamp.
#
# Both are built with CGO_ENABLED=0. Upstream release builds link kubelet
# dynamically (it is not in KUBE_STATIC_BINARIES, hack/lib/golang.sh) and
# kube-proxy statically; the only cgo code in kubelet's import graph is the
# standard library's net and os/user, whose pure-Go fallbacks serve here.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN_DIR=${BIN_DIR:-$root/_output/bin}
CACHE_DIR=${KUBE_APICACHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-apicache}
# KUBE_MINOR picks the release; e2e/k8s/$KUBE_MINOR pins it (written by
# hack/k8s-module.sh) and e2e/k8s/default names the one the suite runs.
KUBE_MINOR=${KUBE_MINOR:-$(cat "$root/e2e/k8s/default")}
tools="$root/e2e/k8s/$KUBE_MINOR"
if [[ ! -f $tools/go.mod ]]; then
  echo "no Kubernetes $KUBE_MINOR here; e2e/k8s has: $(cd "$root/e2e/k8s" && echo 1.*)" >&2
  exit 2
fi
KUBE_VERSION=$(sed -n 's|^require k8s.io/kubernetes \(v[0-9.]*\).*|\1|p' "$tools/go.mod")
bins=(kubelet kube-proxy kube-scheduler)

stamp=$(cat "$tools/go.mod" "$tools/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
cached="$CACHE_DIR/node-$stamp"

have() {
  local dir=$1 file=$2
  [[ -f "$dir/$file" && "$(cat "$dir/$file")" == "$stamp" ]] || return 1
  for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}

if have "$BIN_DIR" .node-stamp; then
  exit 0
fi
mkdir -p "$BIN_DIR"
if have "$cached" .stamp; then
  echo "node: reusing $KUBE_VERSION kubelet, kube-proxy and kube-scheduler from the cache"
  for b in "${bins[@]}"; do cp -f "$cached/$b" "$BIN_DIR/$b"; done
  echo "$stamp" >"$BIN_DIR/.node-stamp"
  exit 0
fi

echo "node: building kubelet, kube-proxy and kube-scheduler $KUBE_VERSION from source (several minutes when cold)"
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
for b in "${bins[@]}"; do
  GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/$b" "k8s.io/kubernetes/cmd/$b"
done
echo "$stamp" >"$BIN_DIR/.node-stamp"

mkdir -p "$cached.tmp"
for b in "${bins[@]}"; do cp -f "$BIN_DIR/$b" "$cached.tmp/$b"; done
echo "$stamp" >"$cached.tmp/.stamp"
rm -rf "$cached" && mv "$cached.tmp" "$cached"
