package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// readPackageList parses a package list such as packages.txt: one Debian
// package name a line; "#" starts a comment; blank lines are ignored. The
// Dockerfile parses the same file with sed and awk, so a line with more
// than one word is an error here rather than a silent difference there.
func readPackageList(r io.Reader) ([]string, error) {
	var pkgs []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		switch f := strings.Fields(line); len(f) {
		case 0:
		case 1:
			if strings.ContainsAny(f[0], ":=/") {
				return nil, fmt.Errorf("line %d: %q: want a bare package name (no architecture, version or release)", n, f[0])
			}
			pkgs = append(pkgs, f[0])
		default:
			return nil, fmt.Errorf("line %d: %q: want one package name", n, strings.TrimSpace(line))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(pkgs) == 0 {
		return nil, errors.New("no packages")
	}
	return pkgs, nil
}

// debFile is one package file as apt would download it.
type debFile struct {
	Package string
	File    string // apt's file name: name_version_arch.deb
	Size    int64
	SHA256  string
}

// parsePrintURIs parses `apt-get --print-uris download` output: one
// "'URI' FILE SIZE SHA256:HEX" line per package.
func parsePrintURIs(out []byte) ([]debFile, error) {
	var debs []debFile
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 || !strings.HasPrefix(f[3], "SHA256:") {
			return nil, fmt.Errorf("unexpected apt-get --print-uris line %q", line)
		}
		size, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("unexpected apt-get --print-uris line %q: %w", line, err)
		}
		name, _, ok := strings.Cut(f[1], "_")
		if !ok || filepath.Base(f[1]) != f[1] || !strings.HasSuffix(f[1], ".deb") {
			return nil, fmt.Errorf("unexpected package file name %q", f[1])
		}
		debs = append(debs, debFile{Package: name, File: f[1], Size: size, SHA256: strings.TrimPrefix(f[3], "SHA256:")})
	}
	return debs, nil
}

// fetchDebs returns the paths of the .deb files of pkgs for the Debian
// architecture arch, in the order of pkgs, at the versions the host's apt
// indexes list as candidates. Files are kept in cacheDir under apt's own
// names (name_version_arch.deb), so the cache is keyed by version; a cached
// file is reused only if it matches the SHA256 the index lists, and a
// download is checked against it too.
func fetchDebs(ctx context.Context, cacheDir, arch string, pkgs []string) ([]string, error) {
	if err := checkDebArch(ctx, arch); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	names, err := downloadNames(ctx, arch, pkgs)
	if err != nil {
		return nil, err
	}
	args := append([]string{"-q", "--print-uris", "download"}, names...)
	// apt-get prints nothing for a package whose file is already in the
	// working directory, so ask from an empty one.
	empty, err := os.MkdirTemp("", "hack-image-apt-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(empty)
	out, err := run(ctx, empty, nil, "apt-get", args...)
	if err != nil {
		return nil, err
	}
	debs, err := parsePrintURIs(out)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]debFile, len(debs))
	for _, d := range debs {
		byName[d.Package] = d
	}

	var missing []string
	for i, p := range pkgs {
		d, ok := byName[p]
		if !ok {
			return nil, fmt.Errorf("apt-get listed no file for package %s", names[i])
		}
		if err := checkSHA256(filepath.Join(cacheDir, d.File), d.SHA256); err != nil {
			missing = append(missing, names[i])
		}
	}
	if len(missing) > 0 {
		if _, err := run(ctx, cacheDir, nil, "apt-get", append([]string{"-q", "download"}, missing...)...); err != nil {
			return nil, err
		}
	}

	paths := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		d := byName[p]
		path := filepath.Join(cacheDir, d.File)
		if err := checkSHA256(path, d.SHA256); err != nil {
			return nil, fmt.Errorf("package %s: %w", p, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// downloadNames returns pkgs as apt-get download names for the Debian
// architecture arch: pkg:arch, or pkg:all for a package whose candidate is
// built for all architectures (netbase), which apt lists under the host's
// own architecture alone: on an amd64 host, netbase:arm64 has no
// candidate.
func downloadNames(ctx context.Context, arch string, pkgs []string) ([]string, error) {
	out, err := run(ctx, "", nil, "apt-cache", append([]string{"show", "--no-all-versions"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	archOf, err := parseArchitectures(out)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(pkgs))
	for i, p := range pkgs {
		switch a, ok := archOf[p]; {
		case !ok:
			return nil, fmt.Errorf("apt-cache show listed no candidate of package %s", p)
		case a == "all":
			names[i] = p + ":all"
		default:
			names[i] = p + ":" + arch
		}
	}
	return names, nil
}

// parseArchitectures parses `apt-cache show` output, stanzas of "Field:
// value" lines separated by blank lines, into each package's
// Architecture.
func parseArchitectures(out []byte) (map[string]string, error) {
	archOf := map[string]string{}
	for _, stanza := range strings.Split(strings.TrimSpace(string(out)), "\n\n") {
		if strings.TrimSpace(stanza) == "" {
			continue
		}
		var pkg, arch string
		for _, line := range strings.Split(stanza, "\n") {
			if v, ok := strings.CutPrefix(line, "Package:"); ok {
				pkg = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "Architecture:"); ok {
				arch = strings.TrimSpace(v)
			}
		}
		if pkg == "" || arch == "" {
			return nil, fmt.Errorf("unexpected apt-cache show stanza without Package or Architecture: %q", oneLine([]byte(stanza)))
		}
		archOf[pkg] = arch
	}
	return archOf, nil
}

// checkDebArch fails, saying how to fix it, unless dpkg on this host
// takes packages of the Debian architecture arch: its own, or one added
// with `dpkg --add-architecture`. apt lists and downloads no other.
func checkDebArch(ctx context.Context, arch string) error {
	native, err := run(ctx, "", nil, "dpkg", "--print-architecture")
	if err != nil {
		return err
	}
	foreign, err := run(ctx, "", nil, "dpkg", "--print-foreign-architectures")
	if err != nil {
		return err
	}
	if arch == strings.TrimSpace(string(native)) || slices.Contains(strings.Fields(string(foreign)), arch) {
		return nil
	}
	return fmt.Errorf("packages for %s: dpkg on this host does not take that architecture; run `dpkg --add-architecture %s && apt-get update` once (make apt-lists does)", arch, arch)
}

func checkSHA256(path, want string) error {
	got, err := fileSHA256(path)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s: sha256 %s, apt lists %s", path, got, want)
	}
	return nil
}

// fileSHA256 returns the hex SHA-256 of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// extractDebs unpacks the data of each .deb into root as `dpkg-deb -x`
// does, minus the paths that match a GNU tar pattern in excludeFile, in
// file name order (the Dockerfile's shell glob order). Nothing is
// installed: no maintainer scripts run and no dpkg database is written.
func extractDebs(ctx context.Context, debs []string, root, excludeFile string) error {
	debs = slices.Clone(debs)
	slices.SortFunc(debs, func(a, b string) int { return strings.Compare(filepath.Base(a), filepath.Base(b)) })
	for _, deb := range debs {
		if err := extractDeb(ctx, deb, root, excludeFile); err != nil {
			return err
		}
	}
	return nil
}

// extractDeb runs `dpkg-deb --fsys-tarfile DEB | tar -x -C ROOT
// --exclude-from=EXCLUDE`.
func extractDeb(ctx context.Context, deb, root, excludeFile string) error {
	dpkg := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", root, "--exclude-from="+excludeFile)
	pipe, err := dpkg.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var dpkgErr, tarErr bytes.Buffer
	dpkg.Stderr, untar.Stderr = &dpkgErr, &tarErr
	if err := untar.Start(); err != nil {
		return err
	}
	// untar holds its own copy of the pipe's read end; dpkg's Wait closes
	// only ours.
	dpkgRunErr := dpkg.Run()
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("extracting %s: %w", filepath.Base(deb), commandError(untar, err, tarErr.Bytes()))
	}
	if dpkgRunErr != nil {
		return commandError(dpkg, dpkgRunErr, dpkgErr.Bytes())
	}
	return nil
}

// addRuntimeDirs creates the directories the image needs beyond the
// packages': /tmp (world-writable, sticky) and /run, where the DaemonSet
// mounts the host's xtables lock.
func addRuntimeDirs(root string) error {
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{{"tmp", 0o777 | fs.ModeSticky}, {"run", 0o755}} {
		p := filepath.Join(root, d.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	return nil
}
