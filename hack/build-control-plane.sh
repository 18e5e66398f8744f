#!/usr/bin/env bash
# Builds the sandbox control plane (etcd, kube-apiserver,
# kube-controller-manager) at one Kubernetes release, from its module in
# e2e/k8s, into BIN_DIR.
#
# A cold build takes several minutes, so results are reused twice over:
#   - BIN_DIR (gitignored, in the work tree) is skipped when its stamp matches;
#   - a per-user cache directory keeps a copy keyed by the same stamp, so a
#     fresh clone on the same machine reuses it too.
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
bins=(etcd kube-apiserver kube-controller-manager)

stamp=$(cat "$tools/go.mod" "$tools/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
cached="$CACHE_DIR/control-plane-$stamp"

have() {
  local dir=$1
  [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]] || return 1
  for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}

if have "$BIN_DIR"; then
  exit 0
fi
mkdir -p "$BIN_DIR"
if have "$cached"; then
  echo "control plane: reusing $KUBE_VERSION binaries from the cache"
  for b in "${bins[@]}"; do cp -f "$cached/$b" "$BIN_DIR/$b"; done
  echo "$stamp" >"$BIN_DIR/.stamp"
  exit 0
fi

echo "control plane: building etcd and kube $KUBE_VERSION from source (several minutes when cold)"
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
GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3
echo "$stamp" >"$BIN_DIR/.stamp"

mkdir -p "$cached.tmp"
for b in "${bins[@]}"; do cp -f "$BIN_DIR/$b" "$cached.tmp/$b"; done
echo "$stamp" >"$cached.tmp/.stamp"
rm -rf "$cached" && mv "$cached.tmp" "$cached"
