#!/usr/bin/env bash
# Builds a release's artefacts from the checked-out commit:
#
#   hack/release.sh vX.Y.Z      (make release VERSION=vX.Y.Z)
#
# VERSION is taken as given: no git tag is needed (tag the commit once the
# artefacts are published). The tree must be clean, since the agent is
# stamped with VERSION and the commit, not with "-dirty". Nothing is
# fetched beyond what `make image` fetches (Go modules through GOPROXY,
# Debian packages from the host's apt sources). Into
# _output/release/VERSION/ ($RELEASE_DIR), replaced as a whole:
#
#   kube-apicache-VERSION.oci.tar      the agent image for $IMAGE_PLATFORMS
#                                      (an OCI image index), named
#                                      $IMAGE_REPO:VERSION, the agent stamped
#                                      VERSION (hack/version.sh)
#   kube-apicache-VERSION.OS-ARCH.spdx.json
#                                      each platform image's SBOM, checked
#                                      against the archive (check-sbom)
#   kube-apicache-VERSION.yaml         `kubectl kustomize manifests/` with
#                                      the image pinned:
#                                      $IMAGE_REPO:VERSION@sha256:...
#   kube-apicache-monitoring-VERSION.yaml
#                                      `kubectl kustomize manifests/monitoring/`
#   kube-apicache-X.Y.Z.tgz            the Helm chart of $CHART_DIR pinned to
#                                      the same digest, when the chart exists
#   release-notes.md                   CHANGELOG.md's "## VERSION" section
#                                      (or "## Unreleased" until it has one)
#   SHA256SUMS                         sha256sum of all the above
#
# Environment: GO, KUBECTL (kubectl, for kustomize), IMAGE_REPO
# (kube-apicache: the name manifests/ uses; set the registry's, e.g.
# ghcr.io/kube-apicache/kube-apicache, to publish there), IMAGE_PLATFORMS
# (linux/amd64,linux/arm64), CHART_DIR (manifests/helm/kube-apicache),
# RELEASE_DIR. Two for tests: KUBE_APICACHE_RELEASE_DIRTY=1 lets a dirty
# tree through (with a warning), KUBE_APICACHE_RELEASE_IMAGES=DIR takes the
# archive and SBOMs from DIR (kube-apicache.oci.tar and
# kube-apicache.*.spdx.json, as `make image` writes them) instead of
# building them.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

die() {
  echo "release: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: $0 vX.Y.Z (make release VERSION=vX.Y.Z)"
version=$1
[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] ||
  die "VERSION ${version@Q} is not vX.Y.Z (for example v0.1.0)"
semver=${version#v}

GO=${GO:-go}
KUBECTL=${KUBECTL:-kubectl}
IMAGE_REPO=${IMAGE_REPO:-kube-apicache}
IMAGE_PLATFORMS=${IMAGE_PLATFORMS:-linux/amd64,linux/arm64}
CHART_DIR=${CHART_DIR:-manifests/helm/kube-apicache}
RELEASE_DIR=${RELEASE_DIR:-$root/_output/release/$version}
start=$SECONDS

commit=$(git rev-parse --verify HEAD) || die "not a git checkout with a commit"
if ! git diff --quiet HEAD --; then
  [ "${KUBE_APICACHE_RELEASE_DIRTY:-}" = 1 ] ||
    die "tracked files differ from HEAD ($commit): commit or stash them first"
  echo "release: warning: tracked files differ from HEAD; the artefacts are not those of $commit" >&2
fi
echo "release: $version from $commit"

mkdir -p "$(dirname "$RELEASE_DIR")" "$root/_output"
stage=$(mktemp -d "$(dirname "$RELEASE_DIR")/.stage.XXXXXX")
overlay=$(mktemp -d "$root/_output/release-overlay.XXXXXX")
trap 'rm -rf "$stage" "$overlay"' EXIT

# hack/image's commands, built once.
tool=$stage/.hack-image
"$GO" -C hack/image build -o "$tool" .

# The image and its SBOMs.
images=$stage/.images
if [ -n "${KUBE_APICACHE_RELEASE_IMAGES:-}" ]; then
  echo "release: taking the image from $KUBE_APICACHE_RELEASE_IMAGES (KUBE_APICACHE_RELEASE_IMAGES)" >&2
  cp -r "$KUBE_APICACHE_RELEASE_IMAGES" "$images"
else
  # hack/version.sh takes KUBE_APICACHE_VERSION as given and the commit and
  # its date from git.
  KUBE_APICACHE_VERSION=$version "${MAKE:-make}" --no-print-directory image GO="$GO" \
    IMAGE="$IMAGE_REPO:$version" IMAGE_PLATFORMS="$IMAGE_PLATFORMS" IMAGES_DIR="$images"
fi
archive=kube-apicache-$version.oci.tar
mv "$images/kube-apicache.oci.tar" "$stage/$archive"
sboms=()
for f in "$images"/kube-apicache.*.spdx.json; do
  [ -e "$f" ] || die "no SBOM beside the image archive"
  name=$(basename "$f")
  mv "$f" "$stage/kube-apicache-$version.${name#kube-apicache.}"
  sboms+=("$stage/kube-apicache-$version.${name#kube-apicache.}")
done
"$tool" check-sbom --archive "$stage/$archive" "${sboms[@]}"

# The digest of what the archive's index.json names: the image index (or
# the one image) that a registry serves for the tag once the archive is
# copied there as is (skopeo copy --all --preserve-digests, crane push).
digests=$(tar -xOf "$stage/$archive" index.json | grep -oE '"digest": ?"sha256:[0-9a-f]{64}"' | grep -oE 'sha256:[0-9a-f]{64}')
[ "$(wc -l <<<"$digests")" -eq 1 ] || die "$archive: index.json names $(wc -l <<<"$digests") digests, want 1"
digest=$digests
pinned=$IMAGE_REPO:$version@$digest
echo "release: image $pinned"

# The manifests, with the image pinned as an operator's overlay pins it
# (kustomize takes the base by a relative path).
cat >"$overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../manifests
images:
  - name: kube-apicache
    newName: $IMAGE_REPO
    newTag: $version
    digest: $digest
EOF
manifests=kube-apicache-$version.yaml
"$KUBECTL" kustomize "$overlay" >"$stage/$manifests" || die "manifests/ does not render"
unpinned=$(grep -E '^\s*image:' "$stage/$manifests" | grep -vF "image: $pinned" || true)
[ -z "$unpinned" ] || die "$manifests: images other than $pinned: $unpinned"
grep -qF "image: $pinned" "$stage/$manifests" || die "$manifests: no image $pinned"
"$KUBECTL" kustomize manifests/monitoring >"$stage/kube-apicache-monitoring-$version.yaml" ||
  die "manifests/monitoring does not render"

# The Helm chart, once the repository has one.
if [ -d "$CHART_DIR" ]; then
  "$tool" chart --version "$version" --digest "$digest" --repository "$IMAGE_REPO" --out "$stage" "$CHART_DIR" >/dev/null
else
  echo "release: no Helm chart at $CHART_DIR; none packaged"
fi

# The release notes: CHANGELOG.md's section of VERSION, else Unreleased.
notes() {
  awk -v want="$1" '
    /^## / { if (found) exit; h = $2; gsub(/[][]/, "", h); if (h == want) { found = 1; next } }
    found { print }
    END { exit !found }
  ' CHANGELOG.md
}
if body=$(notes "$version"); then
  :
elif body=$(notes Unreleased); then
  echo "release: CHANGELOG.md has no \"## $version\" section; release-notes.md has the Unreleased one (rename it to \"## $version\" when tagging)" >&2
else
  die "CHANGELOG.md has neither a \"## $version\" nor an \"## Unreleased\" section"
fi
{
  echo "# kube-apicache $version"
  echo
  echo "Commit: $commit"
  echo "Image: $pinned"
  echo
  sed -e '/./,$!d' <<<"$body"
} >"$stage/release-notes.md"

# Checksums of everything else, and the release in its place.
rm -rf "$tool" "$images"
(cd "$stage" && LC_ALL=C sha256sum -- * >.SHA256SUMS && mv .SHA256SUMS SHA256SUMS)
rm -rf "$RELEASE_DIR"
mv "$stage" "$RELEASE_DIR"
chmod 755 "$RELEASE_DIR"
echo "release: $version in $RELEASE_DIR ($((SECONDS - start))s):"
(cd "$RELEASE_DIR" && ls -l)
