#!/usr/bin/env bash
# Writes the module that pins one Kubernetes release for the sandbox:
#
#   hack/k8s-module.sh v1.37.2
#
# creates (or rewrites) e2e/k8s/1.37/go.mod and go.sum. The module names
# as tools the binaries the sandbox runs at that version: etcd,
# kube-apiserver and kube-controller-manager for the control plane
# (hack/build-control-plane.sh), kubelet, kube-proxy and kube-scheduler for
# the real node (hack/build-node.sh). k8s.io/kubernetes points its staging
# modules at ./staging/src, which does not exist outside its repository,
# so each one is replaced by its published release, read from that
# release's own go.mod. Run it when adding a minor version or moving to a
# newer patch release; commit the result.
set -euo pipefail

version=${1:-}
if [[ ! $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "usage: hack/k8s-module.sh v1.MINOR.PATCH" >&2
  exit 2
fi
minor=${BASH_REMATCH[1]}
patch=${BASH_REMATCH[2]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="$root/e2e/k8s/1.$minor"

gomod=$(go mod download -json "k8s.io/kubernetes@$version" |
  sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [[ ! -f $gomod ]]; then
  echo "k8s-module: cannot download k8s.io/kubernetes $version" >&2
  exit 1
fi
staging=$(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|\1|p' "$gomod" | sort -u)

mkdir -p "$dir"
{
  echo "// Module 1.$minor pins Kubernetes $version for the sandbox: the control plane"
  echo "// (etcd, kube-apiserver, kube-controller-manager) and the real node"
  echo "// (kubelet, kube-proxy, kube-scheduler), built from source by"
  echo "// hack/build-control-plane.sh and hack/build-node.sh with KUBE_MINOR=1.$minor."
  echo "// Written by hack/k8s-module.sh; it is a module of its own so that the"
  echo "// agent's dependency graph never has to agree with k8s.io/kubernetes."
  echo "module github.com/kube-apicache/kube-apicache/e2e/k8s/1.$minor"
  echo
  echo "go 1.26.0"
  echo
  echo "tool ("
  echo "	go.etcd.io/etcd/server/v3"
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
  echo "	k8s.io/kubernetes/cmd/kube-proxy"
  echo "	k8s.io/kubernetes/cmd/kube-scheduler"
  echo "	k8s.io/kubernetes/cmd/kubelet"
  echo ")"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  for m in $staging; do
    printf '\t%s => %s v0.%s.%s\n' "$m" "$m" "$minor" "$patch"
  done
  echo ")"
} >"$dir/go.mod"
rm -f "$dir/go.sum"
# etcd's server is not a dependency of k8s.io/kubernetes; take the release
# of the client that Kubernetes itself pins.
etcd=$(sed -n 's|^[[:space:]]*go.etcd.io/etcd/client/v3 \(v[0-9.]*\).*|\1|p' "$gomod" | head -n1)
(cd "$dir" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$etcd" >/dev/null && GOFLAGS=-mod=mod go mod tidy)
echo "wrote $dir (Kubernetes $version, etcd $etcd)"
