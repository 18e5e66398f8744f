# syntax=docker/dockerfile:1

# The same image as `make image` (hack/image), for hosts with a Docker
# engine: the static agent at /kube-apicache on the iptables userspace
# (iptables-legacy*, iptables-nft*, ip6tables-*) and the libraries it loads,
# unpacked from the Debian packages listed in hack/image/packages.txt. Both
# bases are build arguments so CI can bump them without editing this file;
# keep DEBIAN_IMAGE on the release hack/image's packages come from
# (bookworm).
#
# One image index for both architectures, as `make image` builds it (or
# --push it, instead of the OCI archive):
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     $(hack/version.sh build-args) -t kube-apicache:latest \
#     --output type=oci,dest=kube-apicache.oci.tar .
#
# hack/version.sh build-args stamps the agent with the checkout's release,
# commit and commit date (agent/version), which the build cannot read
# itself: .dockerignore keeps .git out of the context. Without them the
# agent reports v0.0.0-unset and no commit.
ARG GO_VERSION=1.26
ARG DEBIAN_IMAGE=debian:bookworm
ARG VERSION=v0.0.0-unset
ARG COMMIT=
ARG BUILD_DATE=

# Build on the builder's own platform and cross-compile; the binary is pure
# Go, so no emulation is needed for other architectures.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION
ARG COMMIT
ARG BUILD_DATE
WORKDIR /src

# Module downloads get their own layer, reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
# cgo off: a static binary that does not depend on the C libraries the
# image carries for iptables. hack/version.sh turns the build arguments
# into the same -X flags as `make build` and hack/image use.
RUN --mount=type=cache,target=/root/.cache/go-build \
    ldflags=$(KUBE_APICACHE_VERSION="${VERSION}" KUBE_APICACHE_COMMIT="${COMMIT}" \
      KUBE_APICACHE_BUILD_DATE="${BUILD_DATE}" hack/version.sh ldflags) \
 && CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w ${ldflags}" -o /kube-apicache ./cmd/kube-apicache

# The packages are downloaded for the target architecture and unpacked, not
# installed: no maintainer scripts (so no alternatives: the agent runs only
# the backend-specific names, which the iptables package ships as
# symlinks), no dpkg database. Nothing of the target architecture runs
# here, so this stage too stays on the builder's platform. A package built
# for all architectures (netbase) is listed under the builder's own only,
# so it is asked for as pkg:all, the others as pkg:TARGETARCH (as
# hack/image does). The paths in hack/image/rootfs-exclude.txt (man pages,
# gconv modules) are left out. /tmp is world-writable; /run is where the
# DaemonSet mounts the host's xtables lock.
#
# Each package is recorded as hack/image records it, for scanners (Trivy,
# Grype, Syft) to find with no dpkg database: its control file with
# "Status: install ok installed" after the Package field in
# /var/lib/dpkg/status.d/PACKAGE, and the lines of its md5sums whose files
# the image holds in /var/lib/dpkg/status.d/PACKAGE.md5sums. The SBOM that
# `make image` writes beside its archive has no counterpart here; `docker
# buildx build --sbom=true` attaches one from BuildKit's Syft scanner,
# which reads those files.
FROM --platform=$BUILDPLATFORM ${DEBIAN_IMAGE} AS rootfs
ARG TARGETARCH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY hack/image/packages.txt hack/image/rootfs-exclude.txt /tmp/
WORKDIR /tmp/debs
RUN dpkg --add-architecture "${TARGETARCH}" \
 && apt-get update -qq \
 && sed -e 's/#.*//' /tmp/packages.txt | awk 'NF { print $1 }' \
      | xargs apt-cache show --no-all-versions \
      | awk -v arch="${TARGETARCH}" '/^Package:/ { p = $2 } /^Architecture:/ { print p ":" ($2 == "all" ? "all" : arch) }' \
      | xargs apt-get download -qq \
 && mkdir /rootfs \
 && for deb in *.deb; do \
      dpkg-deb --fsys-tarfile "${deb}" | tar -x -C /rootfs --exclude-from=/tmp/rootfs-exclude.txt; \
    done \
 && mkdir -p /rootfs/var/lib/dpkg/status.d \
 && for deb in *.deb; do \
      pkg=$(dpkg-deb --field "${deb}" Package) \
      && status=/rootfs/var/lib/dpkg/status.d/${pkg} \
      && dpkg-deb --ctrl-tarfile "${deb}" | tar -xO ./control \
           | awk '{ print } /^Package:/ { print "Status: install ok installed" }' >"${status}" \
      && { dpkg-deb --ctrl-tarfile "${deb}" | tar -xO ./md5sums 2>/dev/null || true; } \
           | while IFS= read -r line; do \
               f=/rootfs/${line#*  }; if [ -e "${f}" ] || [ -L "${f}" ]; then printf '%s\n' "${line}"; fi; \
             done >"${status}.md5sums" \
      && { [ -s "${status}.md5sums" ] || rm "${status}.md5sums"; } || exit 1; \
    done \
 && install -d -m 1777 /rootfs/tmp \
 && install -d -m 0755 /rootfs/run

FROM scratch
COPY --from=rootfs /rootfs/ /
COPY --from=build /kube-apicache /kube-apicache
# The agent finds iptables-nft, iptables-legacy-save, ... in PATH.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Runs as root (no USER): iptables and netlink act on the host network
# namespace and need uid 0 there. The DaemonSet trims the capabilities down
# to NET_ADMIN and NET_RAW.
ENTRYPOINT ["/kube-apicache"]
