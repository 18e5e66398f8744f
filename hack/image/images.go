package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// agentCommands are the binaries the agent execs, looked up in PATH:
// Backend.Command (iptables-<backend>, ip6tables-<backend>) and
// DetectBackend's <name>-save calls in netrules/backend.go. The iptables
// package ships them all as symlinks to xtables-{legacy,nft}-multi; the
// alternatives-managed plain names (iptables, ...) are made by its
// postinst, which never runs here, and the agent does not use them.
var agentCommands = []string{
	"iptables-legacy", "iptables-legacy-save", "ip6tables-legacy", "ip6tables-legacy-save",
	"iptables-nft", "iptables-nft-save", "ip6tables-nft", "ip6tables-nft-save",
}

// pathDirs are the directories of defaultPath.
var pathDirs = strings.Split(strings.TrimPrefix(defaultPath, "PATH="), ":")

// builder builds the images of one platform. Its work directory holds the
// staging trees and binaries of the last run.
type builder struct {
	src      string // the kube-apicache repository
	work     string
	cacheDir string // downloaded .debs
	goCmd    string
	// agentLdflags are the -X flags that stamp the agent's provenance
	// (versionLdflags).
	agentLdflags string
	platform     platform
}

// agentImage stages the Debian userspace, checks it, builds the agent and
// returns the agent image's spec.
func (b *builder) agentImage(ctx context.Context, ref imageRef) (imageSpec, error) {
	listFile := filepath.Join(b.src, "hack/image/packages.txt")
	f, err := os.Open(listFile)
	if err != nil {
		return imageSpec{}, err
	}
	pkgs, err := readPackageList(f)
	f.Close()
	if err != nil {
		return imageSpec{}, fmt.Errorf("%s: %w", listFile, err)
	}
	debs, err := fetchDebs(ctx, b.cacheDir, b.platform.DebArch, pkgs)
	if err != nil {
		return imageSpec{}, err
	}
	rootfs := filepath.Join(b.work, "agent-rootfs")
	if err := os.RemoveAll(rootfs); err != nil {
		return imageSpec{}, err
	}
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return imageSpec{}, err
	}
	if err := extractDebs(ctx, debs, rootfs, filepath.Join(b.src, "hack/image/rootfs-exclude.txt")); err != nil {
		return imageSpec{}, err
	}
	if err := addRuntimeDirs(rootfs); err != nil {
		return imageSpec{}, err
	}
	// What scanners read to know the packages (status.d) and what the
	// SBOM lists of them.
	installed, err := readDebControls(ctx, debs)
	if err != nil {
		return imageSpec{}, err
	}
	if err := writeDpkgStatus(rootfs, installed); err != nil {
		return imageSpec{}, err
	}
	licenses := make(map[string]debLicense, len(installed))
	for _, p := range installed {
		expr, names := debianLicense(readCopyright(rootfs, p.Package))
		licenses[p.Package] = debLicense{Expr: expr, Names: names}
	}
	missing, err := missingLibraries(rootfs, b.platform)
	if err != nil {
		return imageSpec{}, err
	}
	if len(missing) > 0 {
		return imageSpec{}, fmt.Errorf("the packages in %s leave shared objects missing: %v; add the packages that ship them", listFile, missing)
	}
	if missing := findCommands(rootfs, pathDirs, agentCommands); len(missing) > 0 {
		return imageSpec{}, fmt.Errorf("the packages in %s leave commands the agent runs missing from PATH: %s", listFile, strings.Join(missing, ", "))
	}

	bin := filepath.Join(b.work, "kube-apicache")
	if err := b.goBuild(ctx, b.src, "./cmd/kube-apicache", bin, b.agentLdflags); err != nil {
		return imageSpec{}, err
	}
	stamp := parseStamp(b.agentLdflags)
	return imageSpec{
		Ref: ref,
		// Runs as root: iptables and netlink act on the host network
		// namespace; the DaemonSet keeps only NET_ADMIN and NET_RAW.
		Config: v1.Config{Entrypoint: []string{"/kube-apicache"}, Env: []string{defaultPath}, Labels: agentLabels(stamp)},
		Layers: []layerSpec{
			{CreatedBy: "hack/image: Debian packages from hack/image/packages.txt", Fill: func(w *treeWriter) error { return w.AddTree(rootfs) }},
			{CreatedBy: "hack/image: /kube-apicache", Fill: func(w *treeWriter) error { return w.AddFile(agentPath, bin, 0o755) }},
		},
		SBOM: &sbomInput{Binary: bin, Debs: installed, Licenses: licenses, License: repoLicense(b.src), Stamp: stamp},
	}, nil
}

// repoLicense is the SPDX identifier of the license in src's LICENSE file,
// if it is one this knows (Apache 2.0), else "".
func repoLicense(src string) string {
	b, err := os.ReadFile(filepath.Join(src, "LICENSE"))
	if err == nil && strings.Contains(strings.Join(strings.Fields(string(b[:min(len(b), 400)])), " "), "Apache License Version 2.0") {
		return "Apache-2.0"
	}
	return ""
}

// pauseImage builds hack/image/pause and returns the pause image's spec.
// Like registry.k8s.io/pause it runs as 65535:65535.
func (b *builder) pauseImage(ctx context.Context, ref imageRef) (imageSpec, error) {
	bin := filepath.Join(b.work, "pause")
	if err := b.goBuild(ctx, filepath.Join(b.src, "hack/image"), "./pause", bin, ""); err != nil {
		return imageSpec{}, err
	}
	return imageSpec{
		Ref:    ref,
		Config: v1.Config{Entrypoint: []string{"/pause"}, Env: []string{defaultPath}, User: "65535:65535"},
		Layers: []layerSpec{
			{CreatedBy: "hack/image: /pause", Fill: func(w *treeWriter) error { return w.AddFile("pause", bin, 0o755) }},
		},
	}, nil
}

// clientImage builds e2e/podclient and returns the spec of the e2e sandbox
// pods' client image: /podclient (the entrypoint), the kubectl binary at
// /usr/bin/kubectl and a world-writable /tmp, which is also HOME so that
// kubectl can keep its discovery cache. There is no /etc/passwd: pods run
// it under numeric users.
func (b *builder) clientImage(ctx context.Context, ref imageRef, kubectl string) (imageSpec, error) {
	if fi, err := os.Stat(kubectl); err != nil {
		return imageSpec{}, fmt.Errorf("kubectl: %w", err)
	} else if !fi.Mode().IsRegular() {
		return imageSpec{}, errors.New("kubectl: " + kubectl + " is not a regular file")
	}
	if _, interp, err := elfDeps(kubectl, b.platform.Machine); err != nil {
		return imageSpec{}, fmt.Errorf("kubectl %s: %w", kubectl, err)
	} else if interp != "" {
		return imageSpec{}, fmt.Errorf("kubectl %s: dynamically linked (%s); the client image has no libraries", kubectl, interp)
	}
	warnIfDispatcher(ctx, kubectl)
	bin := filepath.Join(b.work, "podclient")
	if err := b.goBuild(ctx, b.src, "./e2e/podclient", bin, ""); err != nil {
		return imageSpec{}, err
	}
	return imageSpec{
		Ref:    ref,
		Config: v1.Config{Entrypoint: []string{"/podclient"}, Env: []string{defaultPath, "HOME=/tmp"}},
		Layers: []layerSpec{
			{CreatedBy: "hack/image: /tmp, /usr/bin/kubectl", Fill: func(w *treeWriter) error {
				if err := w.AddDir("tmp", 0o777|os.ModeSticky); err != nil {
					return err
				}
				return w.AddFile("usr/bin/kubectl", kubectl, 0o755)
			}},
			{CreatedBy: "hack/image: /podclient", Fill: func(w *treeWriter) error { return w.AddFile("podclient", bin, 0o755) }},
		},
	}, nil
}

// warnIfDispatcher logs when kubectl is the Google Cloud SDK's version
// dispatcher (client version "v1.32.4-dispatcher"), which asks the server
// for GET /version before every command to pick a kubectl release: one
// more request per command than the tests mean to send.
func warnIfDispatcher(ctx context.Context, kubectl string) {
	out, err := run(ctx, "", nil, kubectl, "version", "--client", "-o", "json")
	if err == nil && strings.Contains(string(out), "-dispatcher") {
		slog.Warn("kubectl is a version dispatcher that sends GET /version before every command; pass --kubectl with a plain kubectl (for example the SDK's kubectl.1.32)", "kubectl", kubectl)
	}
}

// goBuild builds pkg in the module at dir into out as a static binary for
// the builder's platform, as the Dockerfile does: cross-compiled, since
// nothing needs cgo. ldflags are added to the linker flags.
func (b *builder) goBuild(ctx context.Context, dir, pkg, out, ldflags string) error {
	env := []string{"CGO_ENABLED=0", "GOOS=" + b.platform.OS, "GOARCH=" + b.platform.Arch}
	_, err := run(ctx, dir, env, b.goCmd, "build", "-trimpath", "-ldflags=-s -w "+ldflags, "-o", out, pkg)
	return err
}
