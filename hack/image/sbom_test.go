package main

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// fakeAgentImage builds an image the way agentImage does, from a small
// package set (two fake .debs, one of them with a DEP-5 copyright file)
// and, as the agent binary, this test binary, which carries build info
// with this module's dependencies. It returns the image and its SBOM
// input.
func fakeAgentImage(t *testing.T, p platform) (v1.Image, sbomInput) {
	t.Helper()
	ctx := context.Background()
	debs := []string{
		buildFakeDeb(t, fakeDeb{control: libfooControl, files: map[string]string{
			"usr/lib/x86_64-linux-gnu/libfoo.so.1": "ELF?",
			"usr/share/doc/libfoo1/copyright":      dep5Format + "\n\nFiles: *\nLicense: GPL-2+\n",
		}}),
		buildFakeDeb(t, fakeDeb{control: "Package: fakebase\nVersion: 2:6.4~rc1\nArchitecture: all\nMaintainer: Someone <s@example.org>\nDescription: data\n", files: map[string]string{
			"etc/protocols": "tcp 6 TCP\n",
		}}),
	}
	root := t.TempDir()
	if err := extractDebs(ctx, debs, root, "rootfs-exclude.txt"); err != nil {
		t.Fatal(err)
	}
	pkgs, err := readDebControls(ctx, debs)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeDpkgStatus(root, pkgs); err != nil {
		t.Fatal(err)
	}
	licenses := map[string]debLicense{}
	for _, p := range pkgs {
		expr, names := debianLicense(readCopyright(root, p.Package))
		licenses[p.Package] = debLicense{Expr: expr, Names: names}
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stamp := map[string]string{"gitVersion": "v0.1.0", "gitCommit": "0123abcd", "buildDate": "2026-11-28T22:00:00Z"}
	img, err := buildImage(imageSpec{
		Config: v1.Config{Entrypoint: []string{"/kube-apicache"}, Labels: agentLabels(stamp)},
		Layers: []layerSpec{
			{CreatedBy: "packages", Fill: func(w *treeWriter) error { return w.AddTree(root) }},
			{CreatedBy: "agent", Fill: func(w *treeWriter) error { return w.AddFile(agentPath, bin, 0o755) }},
		},
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	return img, sbomInput{Binary: bin, Debs: pkgs, Licenses: licenses, License: "Apache-2.0", Stamp: stamp}
}

func fakeSBOM(t *testing.T, in sbomInput, ref imageRef, p platform, img v1.Image) *spdxDocument {
	t.Helper()
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.ReadFile(in.Binary)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := newSBOM(in, bi, ref, p, digest)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestSBOMListsWhatTheImageHolds builds an image from a small package set
// and checks its SBOM against what the image holds, read from the image
// (status.d, the binary's build info): nothing missing, nothing extra.
func TestSBOMListsWhatTheImageHolds(t *testing.T) {
	p := platforms["linux/amd64"]
	ref := imageRef{Name: "docker.io/library/kube-apicache:v0.1.0", Tag: "v0.1.0"}
	img, in := fakeAgentImage(t, p)
	doc := fakeSBOM(t, in, ref, p, img)

	held, err := imagePURLs(img)
	if err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.ReadFile(in.Binary)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"pkg:deb/debian/libfoo1@1.2-3%2Bdeb12u1?arch=amd64&distro=debian-12",
		"pkg:deb/debian/fakebase@2%3A6.4~rc1?arch=all&distro=debian-12",
		stdlibPURL(bi.GoVersion),
		"pkg:golang/github.com/google/go-containerregistry@v0.22.1",
	} {
		if !contains(held, want) {
			t.Errorf("the image holds %q, which imagePURLs does not list: %q", want, held)
		}
	}
	if err := checkSBOM(img, doc); err != nil {
		t.Fatalf("the SBOM of the image: %v", err)
	}

	tests := []struct {
		name    string
		edit    func(*spdxDocument)
		wantErr string
	}{
		{
			name: "a Debian package missing",
			edit: func(d *spdxDocument) {
				d.Packages = deletePackage(d.Packages, "libfoo1")
			},
			wantErr: "in the image but not in the SBOM: pkg:deb/debian/libfoo1@",
		},
		{
			name: "a Go module missing",
			edit: func(d *spdxDocument) {
				d.Packages = deletePackage(d.Packages, "golang.org/x/sync")
			},
			wantErr: "in the image but not in the SBOM: pkg:golang/golang.org/x/sync@",
		},
		{
			// The agent's version is its stamp, which the image's
			// labels record.
			name: "the agent at another version",
			edit: func(d *spdxDocument) {
				for i := range d.Packages {
					if d.Packages[i].PrimaryPackagePurpose == "APPLICATION" {
						d.Packages[i].ExternalRefs = []spdxExternalRef{purlRef(goPURL(d.Packages[i].Name, "v0.0.9"))}
					}
				}
			},
			wantErr: "in the image but not in the SBOM: pkg:golang/" + mainModule + "/hack/image@v0.1.0",
		},
		{
			name: "a package the image lacks",
			edit: func(d *spdxDocument) {
				d.Packages = append(d.Packages, spdxPackage{Name: "libc6", ExternalRefs: []spdxExternalRef{purlRef(debPURL("libc6", "2.36", "amd64"))}})
			},
			wantErr: "in the SBOM but not in the image: pkg:deb/debian/libc6@2.36",
		},
		{
			name: "another version",
			edit: func(d *spdxDocument) {
				for i := range d.Packages {
					if d.Packages[i].Name == "fakebase" {
						d.Packages[i].ExternalRefs = []spdxExternalRef{purlRef(debPURL("fakebase", "6.3", "all"))}
					}
				}
			},
			wantErr: "in the SBOM but not in the image: pkg:deb/debian/fakebase@6.3",
		},
		{
			name: "another image",
			edit: func(d *spdxDocument) {
				d.Packages[0].Checksums[0].ChecksumValue = strings.Repeat("0", 64)
			},
			wantErr: "the SBOM describes image sha256:000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := json.Marshal(doc)
			var edited spdxDocument
			if err := json.Unmarshal(b, &edited); err != nil {
				t.Fatal(err)
			}
			tt.edit(&edited)
			err := checkSBOM(img, &edited)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkSBOM: %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}

// TestSBOMDocument checks the document's own consistency and the fields
// scanners read.
func TestSBOMDocument(t *testing.T) {
	p := platforms["linux/arm64"]
	ref := imageRef{Name: "docker.io/library/kube-apicache:v0.1.0", Tag: "v0.1.0"}
	img, in := fakeAgentImage(t, p)
	doc := fakeSBOM(t, in, ref, p, img)
	digest, _ := img.Digest()

	ids := map[string]spdxPackage{}
	for _, pkg := range doc.Packages {
		if _, dup := ids[pkg.SPDXID]; dup {
			t.Errorf("SPDXID %s used twice", pkg.SPDXID)
		}
		if !strings.HasPrefix(pkg.SPDXID, "SPDXRef-") || spdxIDChars.MatchString(strings.TrimPrefix(pkg.SPDXID, "SPDXRef-")) {
			t.Errorf("SPDXID %q: not SPDXRef- and [A-Za-z0-9.-]", pkg.SPDXID)
		}
		ids[pkg.SPDXID] = pkg
	}
	for _, r := range doc.Relationships {
		for _, id := range []string{r.SPDXElementID, r.RelatedSPDXElement} {
			if _, ok := ids[id]; !ok && id != doc.SPDXID {
				t.Errorf("relationship %v names %s, which is no package", r, id)
			}
		}
	}
	image := doc.Packages[0]
	wantImage := "pkg:oci/kube-apicache@sha256%3A" + digest.Hex + "?arch=arm64&os=linux&tag=v0.1.0"
	if image.PrimaryPackagePurpose != "CONTAINER" || image.ExternalRefs[0].ReferenceLocator != wantImage {
		t.Errorf("first package %+v, want the CONTAINER %s", image, wantImage)
	}
	if doc.DocumentNamespace != "https://kube-apicache.io/spdx/v0.1.0/linux-arm64-"+digest.Hex || doc.CreationInfo.Created != "2026-11-28T22:00:00Z" {
		t.Errorf("namespace %q, created %q: want the stamp's version and date, the platform and digest", doc.DocumentNamespace, doc.CreationInfo.Created)
	}
	if !strings.HasSuffix(doc.DocumentNamespace, "/linux-arm64-"+digest.Hex) {
		t.Errorf("namespace %q does not name the platform and digest", doc.DocumentNamespace)
	}
	byName := map[string]spdxPackage{}
	for _, pkg := range doc.Packages {
		byName[pkg.Name] = pkg
	}
	foo := byName["libfoo1"]
	if foo.LicenseDeclared != "GPL-2.0-or-later" || foo.Supplier != "Person: Foo Maintainers (foo@example.org)" || foo.SourceInfo != "built package from: foo (1.2-3)" {
		t.Errorf("libfoo1: %+v", foo)
	}
	if len(foo.Checksums) != 1 || foo.Checksums[0].ChecksumValue != in.Debs[1].SHA256 {
		t.Errorf("libfoo1 checksums %v, want the .deb's %s", foo.Checksums, in.Debs[1].SHA256)
	}
	if base := byName["fakebase"]; base.LicenseDeclared != noAssertion {
		t.Errorf("fakebase, without a copyright file: license %q", base.LicenseDeclared)
	}
	ggcr := byName["github.com/google/go-containerregistry"]
	// h1:RZuuSYhTvlDvtsK+NkutoCZ//C0X2ebLK8X8l3ULs84= in hex.
	if len(ggcr.Checksums) != 1 || ggcr.Checksums[0].ChecksumValue != "459bae498853be50efb6c2be364bada0267ffc2d17d9e6cb2bc5fc97750bb3ce" ||
		!strings.Contains(ggcr.Comment, "h1:RZuuSYhTvlDvtsK+NkutoCZ//C0X2ebLK8X8l3ULs84=") {
		t.Errorf("go-containerregistry: %+v", ggcr)
	}
}

// TestCheckArchiveSBOMs writes a two-platform archive and its SBOMs as
// `make image` does and checks them as hack/release.sh does.
func TestCheckArchiveSBOMs(t *testing.T) {
	ref := imageRef{Name: "docker.io/library/kube-apicache:v0.1.0", Tag: "v0.1.0"}
	dir := t.TempDir()
	var imgs []platformImage
	var sboms []string
	for _, name := range []string{"linux/amd64", "linux/arm64"} {
		p := platforms[name]
		img, in := fakeAgentImage(t, p)
		path := filepath.Join(dir, sbomFile("kube-apicache.oci.tar", p))
		if err := writeSBOM(path, in, ref, p, img); err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, platformImage{Platform: p, Image: img})
		sboms = append(sboms, path)
	}
	archive := filepath.Join(dir, "kube-apicache.oci.tar")
	if _, err := writeArchive(archive, dir, imgs, ref); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{filepath.Join(dir, "kube-apicache.linux-amd64.spdx.json"), filepath.Join(dir, "kube-apicache.linux-arm64.spdx.json")}, sboms); diff != "" {
		t.Errorf("SBOM files (-want +got):\n%s", diff)
	}
	if err := checkArchiveSBOMs(archive, sboms); err != nil {
		t.Fatal(err)
	}
	if err := checkArchiveSBOMs(archive, sboms[:1]); err == nil || !strings.Contains(err.Error(), "no SBOM of its linux/arm64 image") {
		t.Errorf("one platform's SBOM missing: %v", err)
	}
}

func TestPURLs(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{debPURL("libc6", "2.36-9+deb12u14", "amd64"), "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=debian-12"},
		{debPURL("netbase", "6.4", "all"), "pkg:deb/debian/netbase@6.4?arch=all&distro=debian-12"},
		{goPURL("github.com/BurntSushi/toml", "v0.3.1+incompatible"), "pkg:golang/github.com/BurntSushi/toml@v0.3.1%2Bincompatible"},
		{stdlibPURL("go1.26.8"), "pkg:golang/stdlib@1.26.8"},
	} {
		if tt.got != tt.want {
			t.Errorf("purl %q, want %q", tt.got, tt.want)
		}
	}
}

// TestParseStamp reads the release, commit and build date from the -X
// flags of hack/version.sh.
func TestParseStamp(t *testing.T) {
	stamp := parseStamp("-s -w -X github.com/kube-apicache/kube-apicache/agent/version.gitVersion=v0.1.0 -X github.com/kube-apicache/kube-apicache/agent/version.gitCommit=abc -X github.com/kube-apicache/kube-apicache/agent/version.buildDate=2026-11-28T22:00:00Z")
	want := map[string]string{"gitVersion": "v0.1.0", "gitCommit": "abc", "buildDate": "2026-11-28T22:00:00Z"}
	if diff := cmp.Diff(want, stamp); diff != "" {
		t.Errorf("stamp (-want +got):\n%s", diff)
	}
	bi := &debug.BuildInfo{Main: debug.Module{Path: mainModule, Version: "(devel)"}}
	if v := mainVersion(bi, "v0.1.0"); v != "v0.1.0" {
		t.Errorf("stamped main version %q, want v0.1.0", v)
	}
	if v := mainVersion(bi, ""); v != "(devel)" {
		t.Errorf("unstamped main version %q, want (devel)", v)
	}
}

func deletePackage(pkgs []spdxPackage, name string) []spdxPackage {
	var out []spdxPackage
	for _, p := range pkgs {
		if p.Name != name {
			out = append(out, p)
		}
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
