package main

// The agent image's software bill of materials, one SPDX 2.3 JSON document
// a platform. SPDX rather than CycloneDX because it is what Kubernetes
// publishes for its own releases (bom, sigs.k8s.io/bom) and what Trivy,
// Grype and Syft all read; the document is small enough to write with
// encoding/json, which keeps SBOM libraries out of this module.

import (
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// SPDX 2.3 JSON (https://spdx.github.io/spdx-spec/v2.3/), the fields used.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
	Comment  string   `json:"comment,omitempty"`
}

type spdxPackage struct {
	SPDXID                string            `json:"SPDXID"`
	Name                  string            `json:"name"`
	VersionInfo           string            `json:"versionInfo,omitempty"`
	Supplier              string            `json:"supplier,omitempty"`
	DownloadLocation      string            `json:"downloadLocation"`
	FilesAnalyzed         bool              `json:"filesAnalyzed"`
	Checksums             []spdxChecksum    `json:"checksums,omitempty"`
	SourceInfo            string            `json:"sourceInfo,omitempty"`
	LicenseConcluded      string            `json:"licenseConcluded"`
	LicenseDeclared       string            `json:"licenseDeclared"`
	LicenseComments       string            `json:"licenseComments,omitempty"`
	CopyrightText         string            `json:"copyrightText"`
	Comment               string            `json:"comment,omitempty"`
	ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
	PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// debianDistro is the purl distro qualifier of the packages in
// packages.txt: Debian 12, bookworm.
const debianDistro = "debian-12"

// agentPath is the agent binary's path in its image.
const agentPath = "kube-apicache"

// sbomInput is what the agent image holds, as its builder knows it.
type sbomInput struct {
	// Binary is the agent binary on the host, read for its build info.
	Binary string
	// Debs are the Debian packages unpacked into the image; Licenses
	// their SPDX license expressions and Debian license names by package
	// (debianLicense), read from the staged root file system.
	Debs     []debPackage
	Licenses map[string]debLicense
	// License is the SPDX expression of the agent's own license.
	License string
	// Stamp is the agent's provenance (parseStamp): gitVersion,
	// gitCommit, buildDate.
	Stamp map[string]string
}

type debLicense struct {
	Expr  string
	Names []string
}

// writeSBOM writes the SPDX document of the image img, built for p and
// named ref, from in to path.
func writeSBOM(path string, in sbomInput, ref imageRef, p platform, img v1.Image) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	bi, err := buildinfo.ReadFile(in.Binary)
	if err != nil {
		return fmt.Errorf("build info of %s: %w", in.Binary, err)
	}
	doc, err := newSBOM(in, bi, ref, p, digest)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// newSBOM returns the SPDX document of an agent image for platform p with
// the manifest digest digest, holding in.Debs and the agent whose build
// info is bi. It is reproducible: its time is the agent's commit date (its
// build date stamp), not the clock, and its namespace is derived from the
// digest.
func newSBOM(in sbomInput, bi *debug.BuildInfo, ref imageRef, p platform, digest v1.Hash) (*spdxDocument, error) {
	stamp := in.Stamp
	version := mainVersion(bi, stamp["gitVersion"])
	created := stamp["buildDate"]
	if _, err := time.Parse(time.RFC3339, created); err != nil {
		created = epoch.Format(time.RFC3339)
	}
	repo := strings.TrimSuffix(ref.Name, ":"+ref.Tag)
	doc := &spdxDocument{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("%s (%s)", ref.Name, p),
		DocumentNamespace: fmt.Sprintf("https://kube-apicache.io/spdx/%s/%s-%s-%s", version, p.OS, p.Arch, digest.Hex),
		CreationInfo: spdxCreationInfo{
			Created:  created,
			Creators: []string{"Organization: kube-apicache", "Tool: kube-apicache-hack-image"},
			Comment:  "The Debian packages unpacked into the image (recorded in /var/lib/dpkg/status.d) and the Go modules compiled into /kube-apicache (its build info).",
		},
	}
	ids := map[string]int{}
	id := func(kind, name string) string {
		s := "SPDXRef-Package-" + kind + "-" + spdxIDChars.ReplaceAllString(name, "-")
		ids[s]++
		if n := ids[s]; n > 1 {
			s = fmt.Sprintf("%s-%d", s, n)
		}
		return s
	}
	rel := func(a, typ, b string) {
		doc.Relationships = append(doc.Relationships, spdxRelationship{SPDXElementID: a, RelationshipType: typ, RelatedSPDXElement: b})
	}

	image := spdxPackage{
		SPDXID:                id("image", p.OS+"-"+p.Arch),
		Name:                  repo,
		VersionInfo:           ref.Tag,
		DownloadLocation:      noAssertion,
		Checksums:             []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: digest.Hex}},
		LicenseConcluded:      noAssertion,
		LicenseDeclared:       noAssertion,
		CopyrightText:         noAssertion,
		Comment:               fmt.Sprintf("The %s image of %s; the checksum is its manifest's digest.", p, ref.Name),
		ExternalRefs:          []spdxExternalRef{purlRef(ociPURL(repo, ref.Tag, p, digest))},
		PrimaryPackagePurpose: "CONTAINER",
	}
	doc.Packages = append(doc.Packages, image)
	rel("SPDXRef-DOCUMENT", "DESCRIBES", image.SPDXID)

	agent := spdxPackage{
		SPDXID:                id("go-module", bi.Main.Path),
		Name:                  bi.Main.Path,
		VersionInfo:           version,
		DownloadLocation:      noAssertion,
		LicenseConcluded:      noAssertion,
		LicenseDeclared:       orNoAssertion(in.License),
		CopyrightText:         noAssertion,
		Comment:               fmt.Sprintf("/%s, built with %s from commit %s.", agentPath, bi.GoVersion, orNoAssertion(stamp["gitCommit"])),
		ExternalRefs:          []spdxExternalRef{purlRef(goPURL(bi.Main.Path, version))},
		PrimaryPackagePurpose: "APPLICATION",
	}
	doc.Packages = append(doc.Packages, agent)
	rel(image.SPDXID, "CONTAINS", agent.SPDXID)

	stdlib := spdxPackage{
		SPDXID:           id("go-module", "stdlib"),
		Name:             "stdlib",
		VersionInfo:      bi.GoVersion,
		DownloadLocation: noAssertion,
		LicenseConcluded: noAssertion,
		LicenseDeclared:  "BSD-3-Clause",
		CopyrightText:    noAssertion,
		Comment:          "The Go standard library and runtime of the toolchain that built the agent.",
		ExternalRefs: []spdxExternalRef{
			purlRef(stdlibPURL(bi.GoVersion)),
			{ReferenceCategory: "SECURITY", ReferenceType: "cpe23Type", ReferenceLocator: "cpe:2.3:a:golang:go:" + strings.TrimPrefix(bi.GoVersion, "go") + ":*:*:*:*:*:*:*"},
		},
		PrimaryPackagePurpose: "LIBRARY",
	}
	doc.Packages = append(doc.Packages, stdlib)
	rel(agent.SPDXID, "STATIC_LINK", stdlib.SPDXID)

	for _, m := range bi.Deps {
		mod, comment := m, ""
		if m.Replace != nil {
			mod = m.Replace
			comment = fmt.Sprintf("%s %s replaced by %s %s. ", m.Path, m.Version, mod.Path, mod.Version)
		}
		pkg := spdxPackage{
			SPDXID:                id("go-module", mod.Path),
			Name:                  mod.Path,
			VersionInfo:           mod.Version,
			DownloadLocation:      noAssertion,
			LicenseConcluded:      noAssertion,
			LicenseDeclared:       noAssertion,
			CopyrightText:         noAssertion,
			ExternalRefs:          []spdxExternalRef{purlRef(goPURL(mod.Path, mod.Version))},
			PrimaryPackagePurpose: "LIBRARY",
		}
		if sum, ok := h1SHA256(mod.Sum); ok {
			// As Syft writes it: the go.sum hash (h1:, a SHA-256 over the
			// module's file hashes) in hex.
			pkg.Checksums = []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: sum}}
			comment += "go.sum hash " + mod.Sum + "; the SHA256 checksum is that hash in hex."
		}
		pkg.Comment = strings.TrimSpace(comment)
		doc.Packages = append(doc.Packages, pkg)
		rel(agent.SPDXID, "STATIC_LINK", pkg.SPDXID)
	}

	for _, d := range in.Debs {
		lic := in.Licenses[d.Package]
		pkg := spdxPackage{
			SPDXID:                id("deb", d.Package),
			Name:                  d.Package,
			VersionInfo:           d.Version,
			DownloadLocation:      noAssertion,
			FilesAnalyzed:         false,
			LicenseConcluded:      noAssertion,
			LicenseDeclared:       orNoAssertion(lic.Expr),
			CopyrightText:         noAssertion,
			SourceInfo:            "built package from: " + d.Source,
			ExternalRefs:          []spdxExternalRef{purlRef(debPURL(d.Package, d.Version, d.Architecture))},
			PrimaryPackagePurpose: "LIBRARY",
		}
		if d.Maintainer != "" {
			pkg.Supplier = "Person: " + maintainerAsSupplier(d.Maintainer)
		}
		if d.SHA256 != "" {
			pkg.Checksums = []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: d.SHA256}}
			pkg.Comment = "The checksum is the .deb file's."
		}
		if len(lic.Names) > 0 {
			pkg.LicenseComments = "License fields of /usr/share/doc/" + d.Package + "/copyright: " + strings.Join(lic.Names, ", ")
		}
		doc.Packages = append(doc.Packages, pkg)
		rel(image.SPDXID, "CONTAINS", pkg.SPDXID)
	}
	return doc, nil
}

var spdxIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

// parseStamp returns the -X values of go build -ldflags flags (as
// hack/version.sh prints them) by the variable's name without its package:
// gitVersion, gitCommit and buildDate (agent/version). The go command
// does not record -ldflags in the build info of a -trimpath build, so the
// builder passes them on (sbomInput.Stamp) and writes them into the image's
// labels (agentLabels), where the check reads them.
func parseStamp(ldflags string) map[string]string {
	stamp := map[string]string{}
	f := strings.Fields(ldflags)
	for i := 0; i+1 < len(f); i++ {
		if f[i] != "-X" {
			continue
		}
		name, value, ok := strings.Cut(f[i+1], "=")
		if !ok {
			continue
		}
		stamp[name[strings.LastIndex(name, ".")+1:]] = value
	}
	return stamp
}

// OCI annotation keys of the agent image's labels.
const (
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelCreated  = "org.opencontainers.image.created"
	labelSource   = "org.opencontainers.image.source"
)

// agentLabels are the agent image's labels: the provenance it is stamped
// with (parseStamp) under the OCI annotation keys.
func agentLabels(stamp map[string]string) map[string]string {
	labels := map[string]string{labelSource: "https://github.com/kube-apicache/kube-apicache"}
	for k, v := range map[string]string{labelVersion: stamp["gitVersion"], labelRevision: stamp["gitCommit"], labelCreated: stamp["buildDate"]} {
		if v != "" {
			labels[k] = v
		}
	}
	return labels
}

// mainVersion is the version of the agent's own module: the release it
// is stamped with (hack/version.sh), else what the go command recorded
// ("(devel)" when built without VCS information).
func mainVersion(bi *debug.BuildInfo, stamped string) string {
	if stamped != "" {
		return stamped
	}
	return bi.Main.Version
}

// h1SHA256 returns the hex of a go.sum "h1:" hash (base64 SHA-256).
func h1SHA256(sum string) (string, bool) {
	b64, ok := strings.CutPrefix(sum, "h1:")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != 32 {
		return "", false
	}
	return hex.EncodeToString(b), true
}

// maintainerAsSupplier turns "Name <mail>" into SPDX's "Name (mail)".
func maintainerAsSupplier(m string) string {
	name, mail, ok := strings.Cut(m, "<")
	if !ok {
		return m
	}
	return strings.TrimSpace(name) + " (" + strings.TrimSuffix(strings.TrimSpace(mail), ">") + ")"
}

func orNoAssertion(s string) string {
	if s == "" {
		return noAssertion
	}
	return s
}

func purlRef(purl string) spdxExternalRef {
	return spdxExternalRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: purl}
}

// debPURL is a Debian package's package URL, as Syft and Trivy write it.
func debPURL(name, version, arch string) string {
	return "pkg:deb/debian/" + purlEscape(name) + "@" + purlEscape(version) + "?arch=" + purlEscape(arch) + "&distro=" + debianDistro
}

// goPURL is a Go module's package URL: each path segment escaped, the
// version as the module graph names it ("v1.2.3").
func goPURL(path, version string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = purlEscape(s)
	}
	return "pkg:golang/" + strings.Join(segs, "/") + "@" + purlEscape(version)
}

// stdlibPURL is the Go standard library's package URL, with the version
// without its "go" prefix, as Syft writes it and Grype matches it.
func stdlibPURL(goVersion string) string {
	return goPURL("stdlib", strings.TrimPrefix(goVersion, "go"))
}

// ociPURL is the package URL of an image manifest.
func ociPURL(repo, tag string, p platform, digest v1.Hash) string {
	name := repo[strings.LastIndex(repo, "/")+1:]
	return "pkg:oci/" + purlEscape(name) + "@" + purlEscape(digest.String()) +
		"?arch=" + purlEscape(p.Arch) + "&os=" + purlEscape(p.OS) + "&tag=" + purlEscape(tag)
}

// purlEscape percent-encodes everything in s but ASCII letters, digits and
// ".-_~" (the purl spec's unreserved characters): "+" becomes %2B, ":"
// %3A.
func purlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == '_', c == '~':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
