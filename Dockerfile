# syntax=docker/dockerfile:1

# Both bases are build arguments so CI can bump them without editing this
# file. distroless-iptables is the base kube-proxy's image is built on: it
# ships iptables-legacy, iptables-nft and the wrapper that picks whichever
# backend the node already uses, so our rules land in the same tables as
# kube-proxy's.
ARG GO_VERSION=1.26
ARG BASE_IMAGE=registry.k8s.io/build-image/distroless-iptables:v0.7.6

# Build on the builder's own platform and cross-compile; the binary is pure
# Go, so no emulation is needed for other architectures.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src

# Module downloads get their own layer, reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
# cgo off: a static binary that does not depend on the C libraries the base
# image carries for iptables.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /kube-apicache ./cmd/kube-apicache

FROM ${BASE_IMAGE}
COPY --from=build /kube-apicache /kube-apicache
# Runs as root (the base image's default): iptables and netlink act on the
# host network namespace and need uid 0 there. The DaemonSet trims the
# capabilities down to NET_ADMIN and NET_RAW.
ENTRYPOINT ["/kube-apicache"]
