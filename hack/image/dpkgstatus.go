package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// statusDir is where the image records its Debian packages: one file a
// package, as distroless images do, instead of dpkg's one status file. The
// images have no dpkg, so nothing reads or updates it there; Trivy, Grype
// and Syft read it to know which packages (and, from the .md5sums files
// beside them, which files) the image holds.
const statusDir = "var/lib/dpkg/status.d"

// debPackage is one Debian package unpacked into an image, as its control
// archive describes it.
type debPackage struct {
	// Control is the package's control file, verbatim.
	Control []byte
	// MD5Sums is the control archive's md5sums file ("MD5  PATH" lines,
	// paths relative to the root), nil if the package has none.
	MD5Sums []byte
	// SHA256 is the hex SHA-256 of the .deb file.
	SHA256 string

	// Fields of Control.
	Package, Version, Architecture, Maintainer string
	// Source is the source package ("glibc", "gcc-12 (12.2.0-14)"), or
	// Package when the control file names none.
	Source string
}

// readDebControl reads the control archive of the .deb at path (the files
// `dpkg-deb -e` would unpack) through `dpkg-deb --ctrl-tarfile`.
func readDebControl(ctx context.Context, deb string) (debPackage, error) {
	out, err := run(ctx, "", nil, "dpkg-deb", "--ctrl-tarfile", deb)
	if err != nil {
		return debPackage{}, err
	}
	var p debPackage
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return debPackage{}, fmt.Errorf("%s: control archive: %w", filepath.Base(deb), err)
		}
		var dst *[]byte
		switch path.Clean(h.Name) {
		case "control":
			dst = &p.Control
		case "md5sums":
			dst = &p.MD5Sums
		default:
			continue
		}
		if *dst, err = io.ReadAll(tr); err != nil {
			return debPackage{}, fmt.Errorf("%s: control archive: %w", filepath.Base(deb), err)
		}
	}
	if p.Control == nil {
		return debPackage{}, fmt.Errorf("%s: no control file in its control archive", filepath.Base(deb))
	}
	if err := p.parseControl(); err != nil {
		return debPackage{}, fmt.Errorf("%s: %w", filepath.Base(deb), err)
	}
	if p.SHA256, err = fileSHA256(deb); err != nil {
		return debPackage{}, err
	}
	return p, nil
}

// parseControl sets the fields of p taken from p.Control, which must name
// the package, its version and its architecture.
func (p *debPackage) parseControl() error {
	f, err := parseStanza(p.Control)
	if err != nil {
		return err
	}
	p.Package, p.Version, p.Architecture, p.Maintainer = f["Package"], f["Version"], f["Architecture"], f["Maintainer"]
	p.Source = f["Source"]
	if p.Source == "" {
		p.Source = p.Package
	}
	if p.Package == "" || p.Version == "" || p.Architecture == "" {
		return fmt.Errorf("control file without Package, Version or Architecture: %q", oneLine(p.Control))
	}
	if strings.ContainsAny(p.Package, "/ ") || strings.HasPrefix(p.Package, ".") {
		return fmt.Errorf("control file: bad package name %q", p.Package)
	}
	return nil
}

// parseStanza parses one deb822 stanza ("Field: value" lines; lines that
// start with a space or tab continue the field before) into the first
// line of each field's value. Field names are kept as written, as Debian's
// tools write them ("Package", "Installed-Size").
func parseStanza(b []byte) (map[string]string, error) {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			if len(fields) > 0 {
				return fields, nil // the end of the first stanza
			}
		case line[0] == ' ' || line[0] == '\t':
			if len(fields) == 0 {
				return nil, fmt.Errorf("continuation line before any field: %q", line)
			}
		default:
			name, value, ok := strings.Cut(line, ":")
			if !ok || name == "" {
				return nil, fmt.Errorf("not a field: %q", line)
			}
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields, sc.Err()
}

// statusStanza is p's dpkg status stanza: its control file with the
// Status field of an installed package after the Package field, as dpkg
// writes it to /var/lib/dpkg/status on an install.
func (p debPackage) statusStanza() []byte {
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(p.Control, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		out.Write(line)
		if line[len(line)-1] != '\n' {
			out.WriteByte('\n')
		}
		if bytes.HasPrefix(line, []byte("Package:")) {
			out.WriteString("Status: install ok installed\n")
		}
	}
	return out.Bytes()
}

// presentMD5Sums returns the lines of p's md5sums whose file exists under
// root: paths that the image leaves out (hack/image/rootfs-exclude.txt:
// man pages, gconv modules) are not the image's files.
func (p debPackage) presentMD5Sums(root string) ([]byte, error) {
	var out bytes.Buffer
	for _, line := range strings.Split(string(p.MD5Sums), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		_, name, ok := strings.Cut(line, "  ")
		if !ok {
			return nil, fmt.Errorf("package %s: unexpected md5sums line %q", p.Package, line)
		}
		name, err := entryName(name)
		if err != nil {
			return nil, fmt.Errorf("package %s: md5sums: %w", p.Package, err)
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(name))); errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, err
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes(), nil
}

// writeDpkgStatus records pkgs, unpacked into root, in root's statusDir:
// each package's status stanza in status.d/PACKAGE and the md5sums of its
// files present in root in status.d/PACKAGE.md5sums (left out when there
// are none). The Dockerfile writes the same files with dpkg-deb, tar and
// awk.
func writeDpkgStatus(root string, pkgs []debPackage) error {
	dir := filepath.Join(root, filepath.FromSlash(statusDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, p := range pkgs {
		if seen[p.Package] {
			return fmt.Errorf("package %s listed twice", p.Package)
		}
		seen[p.Package] = true
		if err := os.WriteFile(filepath.Join(dir, p.Package), p.statusStanza(), 0o644); err != nil {
			return err
		}
		sums, err := p.presentMD5Sums(root)
		if err != nil {
			return err
		}
		if len(sums) > 0 {
			if err := os.WriteFile(filepath.Join(dir, p.Package+".md5sums"), sums, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// readDebControls reads the control archives of debs, in the order given.
func readDebControls(ctx context.Context, debs []string) ([]debPackage, error) {
	pkgs := make([]debPackage, 0, len(debs))
	for _, deb := range debs {
		p, err := readDebControl(ctx, deb)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	slices.SortFunc(pkgs, func(a, b debPackage) int { return strings.Compare(a.Package, b.Package) })
	return pkgs, nil
}
