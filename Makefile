# kube-apicache build, test and demo entry points.
#
#   make test    everything CI runs: unit, e2e (with the real node and the
#                demo), fuzz and conformance, with a table of what took how long
#   make test-quick
#                vet, unit tests and the core e2e scenarios (the inner loop)
#   make test-matrix
#                the compact matrix scenario on every supported Kubernetes
#                release (e2e/k8s), KUBE_MINOR picks the one the others run
#   make demo    sandbox + real node + the DaemonSet + a client pod; Ctrl-C tears
#                it down (DEMO_ARGS=--emulated: the emulated node)
#   make bench   cached reads through the agent vs direct kube-apiserver
#   make bench-scale
#                kube-apiserver's cost against the number of simulated nodes,
#                with the agent on each and without (BENCH_SCALE_ARGS=-help)
#   make conformance
#                upstream e2e conformance specs (e2e/conformance/specs.txt)
#                from a sandbox pod through the agent and directly, compared
#                spec by spec (CONFORMANCE_ARGS=-help lists its flags)
#   make release VERSION=vX.Y.Z
#                a release's artefacts in _output/release/VERSION
#                (docs/development/release.md)
#   make upgrade-images
#                the previous commit's agent image and rendered manifests
#                for the upgrade e2e (KUBE_APICACHE_UPGRADE_FROM=<rev>
#                picks another revision)
#
# Both install what they need on a fresh Debian machine (iptables, ipset,
# iproute2, nftables) and build the control plane (etcd, kube-apiserver,
# kube-controller-manager) from source on first use.

SHELL := /usr/bin/env bash
GO ?= go
BIN_DIR ?= $(CURDIR)/_output/bin
E2E_TIMEOUT ?= 50m
# The Kubernetes release the sandbox runs: one of e2e/k8s/1.*.
KUBE_MINOR ?= $(shell cat e2e/k8s/default)
DEMO_ARGS ?=
BENCH_ARGS ?=
CONFORMANCE_ARGS ?=
IMAGE ?= kube-apicache:latest

.PHONY: all build deps control-plane test unit e2e vet verify-manifests docs demo bench bench-scale fuzz image clean
.PHONY: node-deps node-binaries e2e-real-node e2e-images apt-lists conformance e2e-test test-quick test-matrix
.PHONY: upgrade-images

all: build

# The agent, stamped with its provenance (release, commit, commit date) by
# hack/version.sh, which hack/image and the Dockerfile use too.
build:
	ldflags=$$(./hack/version.sh) && \
	  CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$$ldflags" -o $(BIN_DIR)/kube-apicache ./cmd/kube-apicache

# System packages the sandbox needs; installed only when missing.
deps:
	@missing=(); \
	for t in iptables:iptables ipset:ipset ip:iproute2 nft:nftables; do \
	  command -v $${t%%:*} >/dev/null 2>&1 || missing+=($${t#*:}); \
	done; \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "installing $${missing[*]}"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq "$${missing[@]}" >/dev/null; \
	fi
	@command -v kubectl >/dev/null 2>&1 || { echo "kubectl is required on PATH" >&2; exit 1; }

control-plane:
	BIN_DIR=$(BIN_DIR) KUBE_MINOR=$(KUBE_MINOR) ./hack/build-control-plane.sh

# The optional real node (kubelet, kube-proxy, containerd) beside the
# emulated pods; see e2e/sandbox/node.go. Debian bookworm's containerd 1.6.20,
# runc 1.1.5, CNI plugins 1.1.1 (in /usr/lib/cni) and conntrack. A
# policy-rc.d that denies every start keeps the packages from starting a
# containerd of their own during the install.
node-deps:
	@missing=(); \
	for t in containerd:containerd ctr:containerd runc:runc conntrack:conntrack nsenter:util-linux nft:nftables /usr/lib/cni/bridge:containernetworking-plugins; do \
	  f=$${t%%:*}; \
	  if [[ $$f == /* ]]; then [ -x $$f ] || missing+=($${t#*:}); \
	  else command -v $$f >/dev/null 2>&1 || missing+=($${t#*:}); fi; \
	done; \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "installing $${missing[*]}"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1; fi; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$(printf '%s\n' "$${missing[@]}" | sort -u) >/dev/null; \
	  status=$$?; [ -n "$$guard" ] && rm -f /usr/sbin/policy-rc.d; exit $$status; \
	fi

node-binaries:
	BIN_DIR=$(BIN_DIR) KUBE_MINOR=$(KUBE_MINOR) ./hack/build-node.sh

# The real-node scenarios alone (needs root): the smoke test, the
# DaemonSet's acceptance scenarios and the upgrade from the previous
# commit, with the images of `make e2e-images`, `make image` and `make
# upgrade-images`.
e2e-real-node: deps node-deps node-binaries control-plane e2e-images image upgrade-images
	KUBE_APICACHE_REAL_NODE=1 KUBE_APICACHE_BIN_DIR=$(BIN_DIR) KUBE_APICACHE_IMAGES_DIR=$(IMAGES_DIR) \
	  KUBE_APICACHE_UPGRADE_DIR=$(UPGRADE_DIR) \
	  $(GO) test -count=1 -timeout 60m -run '^TestRealNode(DaemonSet|NFTables|Upgrade)?$$' -v ./e2e/

# The main module, and hack/image, hack/alerttest and hack/helmtest,
# modules of their own (go-containerregistry, Prometheus, Helm and
# kustomize stay out of the agent's dependency graph), whose unit tests run
# here too. hack/helmtest lints the Helm chart and checks that it renders
# the same objects as the kustomize manifests and their components.
vet:
	$(GO) vet ./...
	$(GO) -C hack/image vet ./...
	$(GO) -C hack/image test -count=1 ./...
	$(GO) -C hack/alerttest vet ./...
	$(GO) -C hack/alerttest test -count=1 ./...
	$(GO) -C hack/helmtest vet ./...
	$(GO) -C hack/helmtest test -count=1 ./...

# Each component under manifests/components renders in an overlay of the
# shipped manifests, as an operator's would use it (kustomize refuses an
# overlay inside its base's directory, so the overlay is a temporary one
# beside it).
verify-manifests:
	kubectl kustomize manifests/ >/dev/null
	kubectl kustomize manifests/monitoring/ >/dev/null
	@set -e; d=$$(mktemp -d _output.components.XXXXXX); trap 'rm -rf "$$d"' EXIT; \
	for c in manifests/components/*/; do \
	  printf 'resources: [../manifests]\ncomponents: [../%s]\n' "$$c" >"$$d/kustomization.yaml"; \
	  kubectl kustomize "$$d" >/dev/null || { echo "$$c does not render"; exit 1; }; \
	done
	@echo "manifests render"

# The flag, configuration and command references under docs/reference,
# generated from the code (a unit test in cmd/kube-apicache fails when they
# are out of date).
docs:
	$(GO) run ./cmd/kube-apicache docs --dir docs

unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /e2e)

e2e: deps control-plane
	KUBE_APICACHE_BIN_DIR=$(BIN_DIR) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) ./e2e/...

# The one command CI runs: hack/test.sh. It builds what is missing, runs
# go vet and the manifest check, then at the same time the unit tests and
# fuzz targets, the e2e suite in $(E2E_SHARDS) shards (each with its own
# sandbox, sharing the tests as a work queue; the real-node scenarios and
# the demo in one of them) and the conformance comparison (make
# conformance, with the direct run reused while its stamp matches). It ends
# with the e2e figures, the results, and a table of the phases and the
# slowest tests. Logs and JSON streams are in _output/test.
E2E_SHARDS ?= 2
test:
	GO=$(GO) BIN_DIR=$(BIN_DIR) IMAGES_DIR=$(IMAGES_DIR) UPGRADE_DIR=$(UPGRADE_DIR) E2E_SHARDS=$(E2E_SHARDS) \
	  CONFORMANCE_ARGS='$(CONFORMANCE_ARGS)' ./hack/test.sh

# The compact matrix scenario (hack/test.sh's MATRIX_TESTS) on every
# release in e2e/k8s, each on its own control plane, built on first use
# (MATRIX_RELEASES="1.35 1.36" picks some).
test-matrix:
	GO=$(GO) BIN_DIR=$(BIN_DIR) ./hack/test.sh matrix

# The inner loop while developing: vet, the unit tests and the core e2e
# scenarios (hack/test.sh's QUICK_TESTS) in one sandbox; no real node,
# conformance or fuzzing. CI runs make test.
test-quick:
	GO=$(GO) BIN_DIR=$(BIN_DIR) ./hack/test.sh quick

# The suite's timing-sensitive tests, run REPEAT times each: the kernel
# tests of the dataplanes (unit, go test -count) and the e2e fail-open
# scenarios (a new go test process and sandbox per run: the scenarios
# create named objects, so they run once per cluster). Run it beside `make test` to check that their
# bounds hold on a loaded machine (a flaky bound fails here first).
REPEAT ?= 20
REPEAT_KERNEL ?= Kernel
REPEAT_E2E ?= ^(TestKilledAgentFailsOpen|TestNFTablesKilledAgentFailsOpen|TestHungAgentFailsOpen|TestNFTablesHungAgentFailsOpen|TestRulesRestored|TestPodPathBlocked)$$
.PHONY: test-repeat-kernel test-repeat-e2e
test-repeat-kernel:
	$(GO) test -count=$(REPEAT) -run '$(REPEAT_KERNEL)' ./netrules/ ./agent/interception/
test-repeat-e2e: deps control-plane
	@fails=0; for i in $$(seq 1 $(REPEAT)); do \
	  echo "=== run $$i of $(REPEAT)"; \
	  KUBE_APICACHE_BIN_DIR=$(BIN_DIR) $(GO) test -count=1 -timeout 30m -run '$(REPEAT_E2E)' ./e2e/ || fails=$$((fails+1)); \
	done; echo "$(REPEAT) runs of $(REPEAT_E2E): $$fails failed"; [ $$fails -eq 0 ]

# Go native fuzz targets, package:target, each run for FUZZ_EXECS inputs
# (an execution count, not a duration: the fuzz coordinator can fail with a
# bare "context deadline exceeded" at a duration's deadline). New crashers
# land in the package's testdata/fuzz and are kept as regression seeds.
FUZZ_EXECS ?= 3000
FUZZ_TARGETS ?= ./agent/serving:FuzzForwardRequest ./cache:FuzzCacheDecision \
	./agent/rewrite:FuzzRoundTripGenerated ./agent/rewrite:FuzzRoundTrip \
	./agent/rewriting:FuzzSelectedRequest ./agent/rewrite:FuzzOpenAPIV3
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $$t ($(FUZZ_EXECS) inputs)"; \
	  $(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime=$(FUZZ_EXECS)x "$${t%%:*}"; \
	done

# The demo runs on a real node (needs root): kubectl installs the DaemonSet
# from manifests/ with the images built here. DEMO_ARGS=--emulated runs it
# on the emulated node instead (pods are processes, the agent a process).
demo: deps node-deps control-plane node-binaries image e2e-images
	KUBE_APICACHE_IMAGES_DIR=$(IMAGES_DIR) $(GO) run ./e2e/demo --bin-dir $(BIN_DIR) --images-dir $(IMAGES_DIR) $(DEMO_ARGS)

# Cached reads through the agent against direct kube-apiserver reads, side
# by side in one sandbox run (needs root). Prints figures, asserts nothing.
bench: deps control-plane
	$(GO) run ./e2e/bench --bin-dir $(BIN_DIR) $(BENCH_ARGS)

# kube-apiserver's cost against the number of nodes, with and without the
# agent (not part of make test; see docs/development/benchmarks.md).
bench-scale: deps control-plane
	$(GO) run ./e2e/benchscale --bin-dir $(BIN_DIR) $(BENCH_SCALE_ARGS)

# The upstream Kubernetes e2e conformance specs that need no kubelet, run
# from a sandbox pod twice, in a fresh sandbox each time: through the agent
# (the Service VIP, with a wide --cache-resources) and straight to
# kube-apiserver; prints both results and the specs whose results differ,
# and fails if a spec passed directly but not through the agent (needs
# root). `make test` runs it after the Go tests. e2e.test, ginkgo and
# kubectl v1.37.2 are built from e2e/tools/e2etest on first use.
conformance: deps control-plane e2e-test
	$(GO) run ./e2e/conformance --bin-dir $(BIN_DIR) $(CONFORMANCE_ARGS)

e2e-test:
	BIN_DIR=$(BIN_DIR) ./hack/build-e2e-test.sh

# Container images as OCI image layout archives in $(IMAGES_DIR), built
# without a Docker engine by hack/image (its own Go module) from the Debian
# packages in hack/image/packages.txt (apt-get download, dpkg-deb; the
# .debs are cached in _output/cache/debs; each package is recorded in
# /var/lib/dpkg/status.d, where Trivy, Grype and Syft look for the packages
# of an image without a dpkg database) and static Go binaries,
# cross-compiled for each platform. Load one into a node's containerd with
#   ctr -n k8s.io images import $(IMAGES_DIR)/kube-apicache.oci.tar
# which unpacks the node's own platform. The Dockerfile builds the same
# agent image where there is an engine.
#   make image       the agent, named $(IMAGE), for $(IMAGE_PLATFORMS): one
#                    archive whose index.json points to an image index with
#                    a manifest per platform (IMAGE_PLATFORMS=linux/amd64:
#                    that platform's image alone), and beside it each
#                    platform image's SBOM, kube-apicache.linux-amd64.spdx.json
#                    and so on (SPDX 2.3: the Debian packages and the Go
#                    modules of the agent's build info; checked against
#                    the archive by `go -C hack/image run . check-sbom`)
#   make e2e-images  registry.k8s.io/pause:3.10 and kube-apicache-client:e2e
#                    (/podclient, and $(KUBECTL)) for the real-node e2e,
#                    linux/amd64 only: the sandbox's node is this machine,
#                    and the client image carries this machine's kubectl
IMAGES_DIR ?= $(CURDIR)/_output/images
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
KUBECTL ?= /usr/bin/kubectl
IMAGE_BUILD = $(GO) -C hack/image run . --go $(GO) --out $(IMAGES_DIR)
.PHONY: e2e-images
image: apt-lists
	$(IMAGE_BUILD) --platform $(IMAGE_PLATFORMS) --agent --agent-name $(IMAGE)

e2e-images: apt-lists
	$(IMAGE_BUILD) --platform linux/amd64 --pause --client --kubectl $(KUBECTL)

# The previous release's artefacts for the upgrade e2e
# (TestRealNodeUpgrade) in $(UPGRADE_DIR): hack/previous-images.sh checks
# out the first parent of HEAD (or KUBE_APICACHE_UPGRADE_FROM) in a
# temporary git worktree and builds its agent image with that tree's own
# `make image`, as kube-apicache:previous for linux/amd64, and renders its
# manifests with that image. Kept while the revision is the same.
UPGRADE_DIR ?= $(CURDIR)/_output/upgrade
upgrade-images: apt-lists
	GO=$(GO) KUBECTL=$(KUBECTL) UPGRADE_DIR=$(UPGRADE_DIR) ./hack/previous-images.sh

# A release's artefacts, built from the checked-out commit without a git
# tag, into _output/release/$(VERSION) (hack/release.sh says what each is):
#   make release VERSION=v0.1.0 [IMAGE_REPO=ghcr.io/kube-apicache/kube-apicache]
# the agent image archive for $(IMAGE_PLATFORMS) stamped VERSION, its SBOMs
# (checked against the archive), the manifests rendered with the image
# pinned by digest, the Helm chart when manifests/helm/kube-apicache
# exists, the CHANGELOG section as release-notes.md, and SHA256SUMS.
# docs/development/release.md is the whole procedure.
.PHONY: release
release:
	GO=$(GO) KUBECTL=$(KUBECTL) MAKE=$(MAKE) IMAGE_PLATFORMS=$(IMAGE_PLATFORMS) ./hack/release.sh $(VERSION)

# apt-get download needs dpkg to take each platform's Debian architecture
# (the same name as GOARCH for amd64 and arm64) and apt's package lists for
# it, which a fresh machine lacks: the missing architectures are added and
# the lists fetched once; later runs change nothing. amd64 is always among
# them, for e2e-images.
comma := ,
IMAGE_DEB_ARCHS = $(sort amd64 $(foreach p,$(subst $(comma), ,$(IMAGE_PLATFORMS)),$(lastword $(subst /, ,$(p)))))
apt-lists:
	@set -e; update=; native=$$(dpkg --print-architecture); \
	for arch in $(IMAGE_DEB_ARCHS); do \
	  if [ "$$arch" != "$$native" ] && ! dpkg --print-foreign-architectures | grep -qx "$$arch"; then \
	    echo "dpkg --add-architecture $$arch"; dpkg --add-architecture "$$arch"; update=1; \
	  fi; \
	  ls /var/lib/apt/lists/*_binary-$${arch}_Packages* >/dev/null 2>&1 || update=1; \
	done; \
	if [ -n "$$update" ]; then echo "apt-get update"; apt-get update -qq; fi

clean:
	rm -rf _output
