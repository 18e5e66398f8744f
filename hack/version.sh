#!/usr/bin/env bash
# Prints the provenance that every build of the agent stamps into
# agent/version: the one place that knows the variables' names and how
# their values are derived.
#
#   hack/version.sh [ldflags]   the -X flags for go build -ldflags:
#                                 go build -trimpath -ldflags "$(hack/version.sh)" ./cmd/kube-apicache
#   hack/version.sh build-args  the same values as --build-arg flags for the
#                               Dockerfile:
#                                 docker buildx build $(hack/version.sh build-args) .
#
# Version: `git describe --tags --match 'v*' --dirty` (v0.4.0,
# v0.4.0-3-g1a2b3c4d5e6f, v0.4.0-dirty). Before the first release tag:
# v0.0.0-<commit>[-dirty], a semver pre-release. "-dirty" means that
# tracked files differ from HEAD; untracked files do not count, as for git
# describe. Commits are abbreviated to a fixed 12 digits, so that clones of
# any size agree on the string (more, in the rare case that all 12 are
# decimal digits: semver refuses such an identifier with a leading zero).
# Commit: the full hash of HEAD.
# Build date: HEAD's committer date in UTC (RFC 3339), not the clock, so
# that building a commit twice gives the same binary.
#
# KUBE_APICACHE_VERSION, KUBE_APICACHE_COMMIT and KUBE_APICACHE_BUILD_DATE
# are taken as they are when set, even to "", and then git is not asked:
# the Dockerfile sets them from its build arguments, as its build context
# has no .git.
set -euo pipefail

pkg=github.com/kube-apicache/kube-apicache/agent/version
mode=${1:-ldflags}
case $mode in
  ldflags | build-args) ;;
  *)
    echo "usage: $0 [ldflags|build-args]" >&2
    exit 2
    ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."

git_() {
  if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    echo "$0: $PWD is not a git checkout with a commit; set KUBE_APICACHE_VERSION, KUBE_APICACHE_COMMIT and KUBE_APICACHE_BUILD_DATE" >&2
    exit 1
  fi
  git "$@"
}

if [[ -z ${KUBE_APICACHE_VERSION+set} ]]; then
  if ! KUBE_APICACHE_VERSION=$(git_ describe --tags --match 'v*' --dirty --abbrev=12 2>/dev/null); then
    # A pre-release identifier of digits alone must not start with 0, so
    # an all-digit abbreviation is lengthened until it has a letter.
    commit=$(git_ rev-parse HEAD)
    n=12
    while [[ ${commit:0:n} =~ ^[0-9]+$ && $n -lt ${#commit} ]]; do n=$((n + 1)); done
    KUBE_APICACHE_VERSION=v0.0.0-${commit:0:n}
    git_ diff --quiet HEAD -- || KUBE_APICACHE_VERSION+=-dirty
  fi
fi
if [[ -z ${KUBE_APICACHE_COMMIT+set} ]]; then
  KUBE_APICACHE_COMMIT=$(git_ rev-parse HEAD)
fi
if [[ -z ${KUBE_APICACHE_BUILD_DATE+set} ]]; then
  KUBE_APICACHE_BUILD_DATE=$(TZ=UTC git_ log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
fi

# The values go unquoted into -ldflags and docker's arguments.
for v in "$KUBE_APICACHE_VERSION" "$KUBE_APICACHE_COMMIT" "$KUBE_APICACHE_BUILD_DATE"; do
  if [[ ! $v =~ ^[A-Za-z0-9._+:-]*$ ]]; then
    echo "$0: ${v@Q}: only letters, digits and ._+:- are allowed" >&2
    exit 1
  fi
done

case $mode in
  ldflags)
    echo "-X $pkg.gitVersion=$KUBE_APICACHE_VERSION -X $pkg.gitCommit=$KUBE_APICACHE_COMMIT -X $pkg.buildDate=$KUBE_APICACHE_BUILD_DATE"
    ;;
  build-args)
    echo "--build-arg VERSION=$KUBE_APICACHE_VERSION --build-arg COMMIT=$KUBE_APICACHE_COMMIT --build-arg BUILD_DATE=$KUBE_APICACHE_BUILD_DATE"
    ;;
esac
