package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// A Helm chart packaged for a release, as `helm package` would with
// --version and --app-version, without needing helm: its Chart.yaml's
// version and appVersion are the release's, its values pin the release's
// image by digest. The YAML is edited line by line (a top-level key, a key
// of the top-level image map), which keeps comments and order as the
// chart's authors wrote them; a chart whose files this cannot edit is an
// error, never a silently unpinned chart.

// chartRelease is what a packaged chart is pinned to.
type chartRelease struct {
	// Version is the release, "v0.1.0"; the chart's version and
	// appVersion are it without the "v".
	Version string
	// Repository, if set, is the image repository (values image.repository).
	Repository string
	// Digest is the image's digest, "sha256:..." (values image.digest).
	Digest string
}

var (
	releaseVersion = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	digestPattern  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	imageMapLine   = regexp.MustCompile(`^image:\s*(#.*)?$`)
)

// packageChart writes the chart in dir, pinned to rel, to outDir as
// NAME-VERSION.tgz (VERSION without its "v", as helm names it) and returns
// its path. Files matching a pattern of the chart's .helmignore are left
// out (glob patterns against the path and the base name; a trailing "/"
// matches directories).
func packageChart(dir, outDir string, rel chartRelease) (string, error) {
	if !releaseVersion.MatchString(rel.Version) {
		return "", fmt.Errorf("version %q: want vX.Y.Z", rel.Version)
	}
	if !digestPattern.MatchString(rel.Digest) {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", rel.Digest)
	}
	chartYAML, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	values, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return "", err
	}
	name := yamlScalar(topLevelValue(chartYAML, "name"))
	if name == "" || strings.ContainsAny(name, "/\\ ") {
		return "", fmt.Errorf("%s/Chart.yaml: chart name %q", dir, name)
	}
	semver := strings.TrimPrefix(rel.Version, "v")
	chartYAML = setTopLevel(chartYAML, "version", strconv.Quote(semver))
	chartYAML = setTopLevel(chartYAML, "appVersion", strconv.Quote(semver))
	image := map[string]string{"tag": rel.Version, "digest": rel.Digest}
	if rel.Repository != "" {
		image["repository"] = rel.Repository
	}
	for _, k := range []string{"repository", "tag", "digest"} {
		v, ok := image[k]
		if !ok {
			continue
		}
		if values, err = setImageValue(values, k, strconv.Quote(v)); err != nil {
			return "", fmt.Errorf("%s/values.yaml: %w", dir, err)
		}
	}
	ignore, err := readHelmIgnore(filepath.Join(dir, ".helmignore"))
	if err != nil {
		return "", err
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(outDir, name+"-"+semver+".tgz")
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	err = filepath.WalkDir(dir, func(host string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, host)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if ignored(ignore, rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil // tar entries for files only, as helm writes them
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file (helm package refuses symlinks too)", host)
		}
		var b []byte
		switch rel {
		case "Chart.yaml":
			b = chartYAML
		case "values.yaml":
			b = values
		default:
			if b, err = os.ReadFile(host); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name + "/" + rel, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		os.Remove(out)
		return "", err
	}
	return out, nil
}

// topLevelValue returns the raw value of the top-level key in y, "" if
// absent.
func topLevelValue(y []byte, key string) string {
	for _, line := range strings.Split(string(y), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v
		}
	}
	return ""
}

// yamlScalar returns a plain or quoted one-line YAML scalar's value
// (comment and quotes removed).
func yamlScalar(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
		if end := strings.IndexByte(v[1:], v[0]); end >= 0 {
			return v[1 : end+1]
		}
	}
	if i := strings.Index(v, " #"); i >= 0 {
		v = v[:i]
	}
	return strings.TrimSpace(v)
}

// setTopLevel sets the top-level key of y to value (YAML), replacing its
// line or adding one at the end.
func setTopLevel(y []byte, key, value string) []byte {
	lines := strings.Split(string(y), "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, key+":") {
			lines[i] = key + ": " + value
			return []byte(strings.Join(lines, "\n"))
		}
	}
	s := strings.TrimRight(string(y), "\n")
	return []byte(s + "\n" + key + ": " + value + "\n")
}

// setImageValue sets key of the top-level map image in values y to value
// (YAML): its line, at the indentation of the map's keys, is replaced, or
// added as the map's first key. y must have an image map.
func setImageValue(y []byte, key, value string) ([]byte, error) {
	lines := strings.Split(string(y), "\n")
	start := -1
	for i, line := range lines {
		if imageMapLine.MatchString(line) {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no top-level image map to set image.%s in", key)
	}
	indent := ""
	for i := start + 1; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimLeft(line, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if trimmed == line {
			break // the next top-level key
		}
		lineIndent := line[:len(line)-len(trimmed)]
		if indent == "" {
			indent = lineIndent
		}
		if lineIndent != indent {
			continue // deeper
		}
		if strings.HasPrefix(trimmed, key+":") {
			lines[i] = indent + key + ": " + value
			return []byte(strings.Join(lines, "\n")), nil
		}
	}
	if indent == "" {
		return nil, fmt.Errorf("the image map has no keys to set image.%s beside", key)
	}
	lines = append(lines[:start+1], append([]string{indent + key + ": " + value}, lines[start+1:]...)...)
	return []byte(strings.Join(lines, "\n")), nil
}

// readHelmIgnore reads the patterns of a .helmignore file; none if there
// is no file.
func readHelmIgnore(file string) ([]string, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	var pats []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "!") {
				return nil, fmt.Errorf("%s: negated pattern %q is not supported", file, l)
			}
			pats = append(pats, l)
		}
	}
	return pats, sc.Err()
}

// ignored reports whether the chart path rel matches one of pats.
func ignored(pats []string, rel string, dir bool) bool {
	for _, p := range pats {
		if strings.HasSuffix(p, "/") {
			if !dir {
				continue
			}
			p = strings.TrimSuffix(p, "/")
		}
		p = strings.TrimPrefix(p, "/")
		if ok, _ := path.Match(p, rel); ok {
			return true
		}
		if ok, _ := path.Match(p, path.Base(rel)); ok && !strings.Contains(p, "/") {
			return true
		}
	}
	return false
}
