// Command image builds kube-apicache's container images without a Docker
// engine, as OCI image layout archives that `ctr images import` (and
// skopeo, podman, crane) read:
//
//	--agent   kube-apicache.oci.tar: the agent at /kube-apicache on the
//	          iptables userspace (both backends) and its libraries,
//	          unpacked from the Debian packages in packages.txt with
//	          apt-get download and dpkg-deb and recorded for scanners in
//	          /var/lib/dpkg/status.d (dpkgstatus.go); the same contents
//	          as the Dockerfile's image
//	--pause   pause.oci.tar: registry.k8s.io/pause:3.10 for the real-node
//	          e2e sandbox, built from ./pause
//	--client  client.oci.tar: kube-apicache-client:e2e, /podclient
//	          (e2e/podclient) and the host's kubectl
//
// --platform lists the platforms to build for (linux/amd64, linux/arm64),
// each from its own Debian packages and a cross-compiled Go binary. With
// one, index.json names that platform's image; with more, it names an OCI
// image index holding one image a platform, of which `ctr images import`
// unpacks the node's own. The agent is stamped with its provenance by
// hack/version.sh, as `make build` does.
//
// It lives in its own module so that go-containerregistry and its
// dependencies never enter the agent's module graph (they would raise the
// versions the agent is built with). Run it from this directory:
//
//	go -C hack/image run . --agent --out "$PWD/_output/images"
//
// Besides the images, it writes kube-apicache.OS-ARCH.spdx.json beside
// the agent's archive: each platform image's SBOM (sbom.go). Two more
// commands serve hack/release.sh:
//
//	check-sbom --archive A SBOM...   fails unless the SBOMs list exactly
//	                                 what A's images hold
//	chart --version V --digest D ... CHART
//	                                 packages a Helm chart pinned to D
//
// Relative paths in flags are relative to the working directory, which
// `go -C` makes hack/image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// mainModule is the module path of the repository the images are built
// from; its go.mod marks the source tree's root.
const mainModule = "github.com/kube-apicache/kube-apicache"

type options struct {
	src, out, work, cacheDir, platform string
	goCmd, kubectl                     string
	agent, pause, client               bool
	agentName, pauseName, clientName   string
}

func main() {
	if len(os.Args) > 1 {
		if cmd := commands[os.Args[1]]; cmd != nil {
			failOn(cmd(os.Args[2:]))
			return
		}
	}
	var o options
	flag.StringVar(&o.src, "src", "", "kube-apicache source tree (default: the directory above with its go.mod)")
	flag.StringVar(&o.out, "out", "", "directory for the archives (default: SRC/_output/images)")
	flag.StringVar(&o.work, "work", "", "staging directory, rebuilt on each run (default: SRC/_output/image-build)")
	flag.StringVar(&o.cacheDir, "deb-cache", "", "cache of downloaded .deb files, keyed by version (default: SRC/_output/cache/debs)")
	flag.StringVar(&o.platform, "platform", "linux/amd64", "target platforms, comma-separated; more than one make each archive an image index")
	flag.StringVar(&o.goCmd, "go", "go", "go command used to build the binaries")
	flag.BoolVar(&o.agent, "agent", false, "build the agent image, kube-apicache.oci.tar")
	flag.BoolVar(&o.pause, "pause", false, "build the e2e pause image, pause.oci.tar")
	flag.BoolVar(&o.client, "client", false, "build the e2e client image, client.oci.tar")
	flag.StringVar(&o.agentName, "agent-name", "kube-apicache:latest", "agent image name")
	flag.StringVar(&o.pauseName, "pause-name", "registry.k8s.io/pause:3.10", "pause image name")
	flag.StringVar(&o.clientName, "client-name", "kube-apicache-client:e2e", "client image name")
	flag.StringVar(&o.kubectl, "kubectl", "/usr/bin/kubectl", "static kubectl binary for the client image (symlinks followed)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := buildAll(ctx, o)
	stop()
	failOn(err)
}

// commands are the commands besides building images, by name.
var commands = map[string]func(args []string) error{
	"check-sbom": checkSBOMCommand,
	"chart":      chartCommand,
}

// failOn exits with the error on one line, if there is one.
func failOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "hack/image:", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(1)
	}
}

// checkSBOMCommand is `check-sbom --archive A SBOM...`: it fails unless the
// SPDX documents list exactly what the images of the OCI archive A hold,
// one document an image (checkArchiveSBOMs).
func checkSBOMCommand(args []string) error {
	fs := flag.NewFlagSet("check-sbom", flag.ContinueOnError)
	archive := fs.String("archive", "", "OCI image layout archive")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *archive == "" || fs.NArg() == 0 {
		return errors.New("usage: check-sbom --archive ARCHIVE SBOM...")
	}
	if err := checkArchiveSBOMs(*archive, fs.Args()); err != nil {
		return err
	}
	slog.Info("SBOMs list what the images hold", "archive", *archive, "sboms", len(fs.Args()))
	return nil
}

// chartCommand is `chart --version vX.Y.Z --digest sha256:... [--repository R]
// --out DIR CHART`: packages the Helm chart in CHART pinned to that image
// (packageChart) and prints the archive's path.
func chartCommand(args []string) error {
	fs := flag.NewFlagSet("chart", flag.ContinueOnError)
	var rel chartRelease
	fs.StringVar(&rel.Version, "version", "", "release, vX.Y.Z")
	fs.StringVar(&rel.Digest, "digest", "", "image digest, sha256:...")
	fs.StringVar(&rel.Repository, "repository", "", "image repository (default: the chart's)")
	out := fs.String("out", ".", "directory for the chart archive")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: chart --version vX.Y.Z --digest sha256:... [--repository R] --out DIR CHART")
	}
	path, err := packageChart(fs.Arg(0), *out, rel)
	if err != nil {
		return err
	}
	fmt.Println(path)
	return nil
}

func buildAll(ctx context.Context, o options) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if !o.agent && !o.pause && !o.client {
		return errors.New("nothing to build: pass --agent, --pause and/or --client")
	}
	ps, err := parsePlatforms(o.platform)
	if err != nil {
		return err
	}
	if o.src == "" {
		if o.src, err = findSourceRoot(); err != nil {
			return err
		}
	}
	if o.src, err = filepath.Abs(o.src); err != nil {
		return err
	}
	o.out = orDefault(o.out, filepath.Join(o.src, "_output/images"))
	o.work = orDefault(o.work, filepath.Join(o.src, "_output/image-build"))
	o.cacheDir = orDefault(o.cacheDir, filepath.Join(o.src, "_output/cache/debs"))
	var ldflags string
	if o.agent {
		if ldflags, err = versionLdflags(ctx, o.src); err != nil {
			return err
		}
	}
	builders := make([]*builder, 0, len(ps))
	for _, p := range ps {
		b := &builder{src: o.src, work: filepath.Join(o.work, p.OS+"-"+p.Arch), cacheDir: o.cacheDir, goCmd: o.goCmd, agentLdflags: ldflags, platform: p}
		if err := os.MkdirAll(b.work, 0o755); err != nil {
			return err
		}
		builders = append(builders, b)
	}

	type target struct {
		enabled bool
		name    string
		file    string
		spec    func(*builder, imageRef) (imageSpec, error)
	}
	targets := []target{
		{o.agent, o.agentName, "kube-apicache.oci.tar", func(b *builder, r imageRef) (imageSpec, error) { return b.agentImage(ctx, r) }},
		{o.pause, o.pauseName, "pause.oci.tar", func(b *builder, r imageRef) (imageSpec, error) { return b.pauseImage(ctx, r) }},
		{o.client, o.clientName, "client.oci.tar", func(b *builder, r imageRef) (imageSpec, error) { return b.clientImage(ctx, r, o.kubectl) }},
	}
	for _, t := range targets {
		if !t.enabled {
			continue
		}
		ref, err := parseImageRef(t.name)
		if err != nil {
			return err
		}
		var imgs []platformImage
		for _, b := range builders {
			spec, err := t.spec(b, ref)
			if err != nil {
				return fmt.Errorf("%s (%s): %w", t.file, b.platform, err)
			}
			img, err := buildImage(spec, b.platform)
			if err != nil {
				return fmt.Errorf("%s (%s): %w", t.file, b.platform, err)
			}
			if spec.SBOM != nil {
				path := filepath.Join(o.out, sbomFile(t.file, b.platform))
				if err := os.MkdirAll(o.out, 0o755); err != nil {
					return err
				}
				if err := writeSBOM(path, *spec.SBOM, ref, b.platform, img); err != nil {
					return fmt.Errorf("%s (%s): SBOM: %w", t.file, b.platform, err)
				}
				slog.Info("Wrote SBOM", "image", ref.Name, "platform", b.platform.String(), "path", path)
			}
			imgs = append(imgs, platformImage{Platform: b.platform, Image: img})
		}
		path := filepath.Join(o.out, t.file)
		digest, err := writeArchive(path, o.work, imgs, ref)
		if err != nil {
			return fmt.Errorf("%s: %w", t.file, err)
		}
		logBuilt(path, ref, imgs, digest)
	}
	return nil
}

// sbomFile is the name of the SPDX document of the image of archive (a
// file name) for p: kube-apicache.oci.tar's linux/amd64 image has
// kube-apicache.linux-amd64.spdx.json.
func sbomFile(archive string, p platform) string {
	return strings.TrimSuffix(archive, ".oci.tar") + "." + p.OS + "-" + p.Arch + ".spdx.json"
}

func logBuilt(path string, ref imageRef, imgs []platformImage, digest v1.Hash) {
	ps := make([]string, len(imgs))
	for i, pi := range imgs {
		ps[i] = pi.Platform.String()
	}
	attrs := []any{"image", ref.Name, "platforms", strings.Join(ps, ","), "path", path, "digest", digest.String()}
	if fi, err := os.Stat(path); err == nil {
		attrs = append(attrs, "bytes", fi.Size())
	}
	slog.Info("Wrote image archive", attrs...)
}

// findSourceRoot returns the nearest directory at or above the working
// directory whose go.mod declares mainModule.
func findSourceRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(b) == mainModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s at or above the working directory; pass --src", mainModule)
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
