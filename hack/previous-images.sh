#!/usr/bin/env bash
# Builds the previous release's artefacts for the upgrade e2e
# (TestRealNodeUpgrade): its agent image and its rendered manifests, each
# from that revision's own tree, so that the test rolls from exactly what
# that revision shipped to this tree's and back.
#
#   hack/previous-images.sh     (make upgrade-images)
#
# "Previous" is the first parent of HEAD, or $KUBE_APICACHE_UPGRADE_FROM
# (any revision git names: a tag, a hash). The revision is checked out
# into a temporary git worktree (removed on exit, failure included), whose
# own Makefile builds its agent image (`make image`, named
# kube-apicache:previous, linux/amd64 only: the real node is this machine)
# and whose manifests/ render with that image set, as an operator's
# overlay would. Into $UPGRADE_DIR (_output/upgrade):
#
#   previous.oci.tar   the agent image, docker.io/library/kube-apicache:previous
#   previous.yaml      `kubectl kustomize` of its manifests with that image
#   revision           the revision's full hash, written last: the stamp
#
# A second run for the same revision reuses them. Downloaded .debs are
# shared with this tree's cache (_output/cache/debs).
#
# A shallow clone may lack the previous revision. Under CI=true (CI clones
# fully) that fails; otherwise the reason goes to $UPGRADE_DIR/skip, the
# script exits 0 and the test skips with that reason.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
GO=${GO:-go}
KUBECTL=${KUBECTL:-kubectl}
UPGRADE_DIR=${UPGRADE_DIR:-$root/_output/upgrade}
from=${KUBE_APICACHE_UPGRADE_FROM:-HEAD^1}
name=kube-apicache
tag=previous

die() {
  echo "previous-images: $*" >&2
  exit 1
}

mkdir -p "$UPGRADE_DIR"
rm -f "$UPGRADE_DIR/skip"
if ! rev=$(git rev-parse --verify -q "$from^{commit}"); then
  reason="no revision $from in this clone (a shallow clone? git fetch --unshallow, or set KUBE_APICACHE_UPGRADE_FROM)"
  if [ "${CI:-}" = true ] || [ -n "${KUBE_APICACHE_UPGRADE_FROM:-}" ]; then
    die "$reason"
  fi
  echo "previous-images: $reason; TestRealNodeUpgrade will skip" >&2
  echo "$reason" >"$UPGRADE_DIR/skip"
  exit 0
fi

if [ "$(cat "$UPGRADE_DIR/revision" 2>/dev/null)" = "$rev" ] &&
  [ -s "$UPGRADE_DIR/previous.oci.tar" ] && [ -s "$UPGRADE_DIR/previous.yaml" ]; then
  echo "previous-images: reusing $UPGRADE_DIR ($from = $rev)"
  exit 0
fi
rm -f "$UPGRADE_DIR/revision" "$UPGRADE_DIR/previous.oci.tar" "$UPGRADE_DIR/previous.yaml"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kube-apicache-previous.XXXXXX")
cleanup() {
  git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  git worktree prune
}
trap cleanup EXIT
git worktree add --quiet --detach "$tmp/src" "$rev"
src=$tmp/src

for f in Makefile hack/image/main.go manifests/kustomization.yaml; do
  [ -e "$src/$f" ] || die "revision $rev has no $f: it cannot be the previous release of this upgrade test (set KUBE_APICACHE_UPGRADE_FROM)"
done
grep -q '^image:' "$src/Makefile" || die "revision $rev's Makefile has no image target"

# Its own image rule, as `make image` runs it there, with the .deb cache
# shared.
mkdir -p "$root/_output/cache/debs" "$src/_output/cache"
ln -s "$root/_output/cache/debs" "$src/_output/cache/debs"
echo "previous-images: building the agent image of $rev ($from) as $name:$tag"
make -C "$src" --no-print-directory image GO="$GO" IMAGE="$name:$tag" \
  IMAGE_PLATFORMS=linux/amd64 IMAGES_DIR="$tmp/images" ||
  die "revision $rev: make image failed"
archive=$tmp/images/kube-apicache.oci.tar
[ -s "$archive" ] || die "revision $rev: make image wrote no kube-apicache.oci.tar"
tar -xOf "$archive" index.json | grep -q "docker.io/library/$name:$tag" ||
  die "revision $rev: its make image does not name the image $name:$tag (no IMAGE variable or --agent-name?)"

# Its manifests, with the image set as an operator's overlay sets it
# (kustomize takes the base by a relative path).
mkdir "$src/_upgrade"
cat >"$src/_upgrade/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../manifests
images:
  - name: kube-apicache
    newName: $name
    newTag: $tag
EOF
"$KUBECTL" kustomize "$src/_upgrade" >"$tmp/previous.yaml" ||
  die "revision $rev: its manifests do not render"
grep -q "image: $name:$tag\$" "$tmp/previous.yaml" ||
  die "revision $rev: its manifests do not take the image kube-apicache from the kustomization's images"

mv "$archive" "$UPGRADE_DIR/previous.oci.tar"
mv "$tmp/previous.yaml" "$UPGRADE_DIR/previous.yaml"
echo "$rev" >"$UPGRADE_DIR/revision"
echo "previous-images: $from = $rev in $UPGRADE_DIR"
