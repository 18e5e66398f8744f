package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// The check that an SBOM lists what its image holds, read from the image
// itself rather than from what its builder meant to put there: the dpkg
// status entries scanners read and the build info of the agent binary.

// imagePURLs returns the package URLs of what img holds: each package
// recorded in statusDir (which must be installed), and the agent's module,
// the Go standard library and each module compiled into /kube-apicache.
// The result is sorted.
func imagePURLs(img v1.Image) ([]string, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	version := cf.Config.Labels[labelVersion]
	rc := mutate.Extract(img)
	defer rc.Close()
	var purls []string
	var agent bool
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(strings.TrimLeft(strings.TrimPrefix(h.Name, "./"), "/"))
		if h.Typeflag != tar.TypeReg {
			continue
		}
		switch {
		case name == agentPath:
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			bi, err := buildinfo.Read(bytes.NewReader(b))
			if err != nil {
				return nil, fmt.Errorf("/%s: build info: %w", agentPath, err)
			}
			purls = append(purls, agentPURLs(bi, version)...)
			agent = true
		case path.Dir(name) == statusDir && !strings.HasSuffix(name, ".md5sums"):
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			f, err := parseStanza(b)
			if err != nil {
				return nil, fmt.Errorf("/%s: %w", name, err)
			}
			if f["Package"] != path.Base(name) {
				return nil, fmt.Errorf("/%s: records package %q", name, f["Package"])
			}
			if f["Status"] != "install ok installed" {
				return nil, fmt.Errorf("/%s: status %q, want \"install ok installed\"", name, f["Status"])
			}
			purls = append(purls, debPURL(f["Package"], f["Version"], f["Architecture"]))
		}
	}
	if !agent {
		return nil, fmt.Errorf("no /%s in the image", agentPath)
	}
	slices.Sort(purls)
	return purls, nil
}

// agentPURLs are the package URLs of the agent's build info: its own
// module (at the version stamped, which the image's labels record), the
// standard library and every dependency (its replacement's, if
// replaced).
func agentPURLs(bi *debug.BuildInfo, stamped string) []string {
	purls := []string{goPURL(bi.Main.Path, mainVersion(bi, stamped)), stdlibPURL(bi.GoVersion)}
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		purls = append(purls, goPURL(m.Path, m.Version))
	}
	return purls
}

// sbomContents returns the manifest digest of the image doc describes and
// the package URLs of everything else it lists, sorted. Every package
// must have a purl.
func sbomContents(doc *spdxDocument) (digest string, purls []string, err error) {
	for _, p := range doc.Packages {
		if p.PrimaryPackagePurpose == "CONTAINER" {
			for _, c := range p.Checksums {
				if c.Algorithm == "SHA256" {
					digest = "sha256:" + c.ChecksumValue
				}
			}
			continue
		}
		var purl string
		for _, r := range p.ExternalRefs {
			if r.ReferenceType == "purl" {
				purl = r.ReferenceLocator
			}
		}
		if purl == "" {
			return "", nil, fmt.Errorf("package %s (%s) has no purl", p.Name, p.SPDXID)
		}
		purls = append(purls, purl)
	}
	if digest == "" {
		return "", nil, errors.New("no CONTAINER package with a SHA256 checksum")
	}
	slices.Sort(purls)
	return digest, purls, nil
}

// diffSorted returns the strings of the sorted want missing from the
// sorted got, and those of got not in want.
func diffSorted(want, got []string) (missing, extra []string) {
	for _, w := range want {
		if _, ok := slices.BinarySearch(got, w); !ok {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if _, ok := slices.BinarySearch(want, g); !ok {
			extra = append(extra, g)
		}
	}
	return missing, extra
}

// checkSBOM fails unless doc describes img (by its manifest digest) and
// lists exactly the packages img holds: none missing, none extra.
func checkSBOM(img v1.Image, doc *spdxDocument) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	sbomDigest, listed, err := sbomContents(doc)
	if err != nil {
		return err
	}
	if sbomDigest != digest.String() {
		return fmt.Errorf("the SBOM describes image %s, not %s", sbomDigest, digest)
	}
	held, err := imagePURLs(img)
	if err != nil {
		return err
	}
	missing, extra := diffSorted(held, listed)
	var errs []error
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("in the image but not in the SBOM: %s", strings.Join(missing, " ")))
	}
	if len(extra) > 0 {
		errs = append(errs, fmt.Errorf("in the SBOM but not in the image: %s", strings.Join(extra, " ")))
	}
	return errors.Join(errs...)
}

// checkArchiveSBOMs checks the SBOMs at sbomPaths against the images of
// the OCI archive at archive: each platform's image must have one SBOM that
// lists what it holds (checkSBOM), and each SBOM must describe one of them.
func checkArchiveSBOMs(archive string, sbomPaths []string) error {
	dir, err := os.MkdirTemp("", "hack-image-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	imgs, err := readArchiveImages(archive, dir)
	if err != nil {
		return err
	}
	docs := map[string]*spdxDocument{}
	for _, p := range sbomPaths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var doc spdxDocument
		if err := json.Unmarshal(b, &doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if doc.SPDXVersion != "SPDX-2.3" {
			return fmt.Errorf("%s: spdxVersion %q, want SPDX-2.3", p, doc.SPDXVersion)
		}
		digest, _, err := sbomContents(&doc)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if docs[digest] != nil {
			return fmt.Errorf("%s: a second SBOM of image %s", p, digest)
		}
		docs[digest] = &doc
	}
	for _, pi := range imgs {
		digest, err := pi.Image.Digest()
		if err != nil {
			return err
		}
		doc := docs[digest.String()]
		if doc == nil {
			return fmt.Errorf("%s: no SBOM of its %s image %s", archive, pi.Platform, digest)
		}
		delete(docs, digest.String())
		if err := checkSBOM(pi.Image, doc); err != nil {
			return fmt.Errorf("%s image %s: %w", pi.Platform, digest, err)
		}
	}
	for digest := range docs {
		return fmt.Errorf("an SBOM describes image %s, which %s does not hold", digest, archive)
	}
	return nil
}

// archiveImage is one platform's image in an OCI archive.
type archiveImage struct {
	Platform string
	Image    v1.Image
}

// readArchiveImages unpacks the OCI image layout archive at path into dir
// and returns the images its index.json names: the one image, or each of
// the image index's.
func readArchiveImages(archive, dir string) ([]archiveImage, error) {
	if err := untar(archive, dir); err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s: index.json holds %d descriptors, want 1", archive, len(m.Manifests))
	}
	d := m.Manifests[0]
	if !d.MediaType.IsIndex() {
		img, err := top.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		return []archiveImage{{Platform: platformName(d.Platform), Image: img}}, nil
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var imgs []archiveImage
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, archiveImage{Platform: platformName(d.Platform), Image: img})
	}
	return imgs, nil
}

func platformName(p *v1.Platform) string {
	if p == nil {
		return "unknown platform"
	}
	return p.OS + "/" + p.Architecture
}

// untar unpacks the directories and regular files of the tar at path
// into dir (an OCI layout has nothing else).
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.Create(target)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: %s: unexpected entry type %c in an OCI layout", archive, h.Name, h.Typeflag)
		}
	}
}
