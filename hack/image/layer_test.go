package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// listTar renders a tar's entries one a line, as `tar -tv` would show what
// matters in a layer: type, mode, owner, time, name, link target, size.
func listTar(t *testing.T, r io.Reader) []string {
	t.Helper()
	var lines []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return lines
		}
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%c %04o %d:%d %d %s", h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime.Unix(), h.Name)
		if h.Linkname != "" {
			line += " -> " + h.Linkname
		}
		if h.Typeflag == tar.TypeReg {
			line += fmt.Sprintf(" (%d bytes)", h.Size)
		}
		lines = append(lines, line)
	}
}

func TestTreeWriter(t *testing.T) {
	src := t.TempDir()
	mkfile(t, filepath.Join(src, "usr/sbin/xtables-nft-multi"), []byte("elf"), 0o755)
	mklink(t, "xtables-nft-multi", filepath.Join(src, "usr/sbin/iptables-nft"))
	mkfile(t, filepath.Join(src, "etc/protocols"), []byte("tcp 6\n"), 0o644)
	if err := os.Link(filepath.Join(src, "etc/protocols"), filepath.Join(src, "etc/protocols.hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "tmp"), 0o777|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kube-apicache")
	mkfile(t, bin, []byte("static"), 0o600)

	var buf bytes.Buffer
	w := newTreeWriter(&buf)
	if err := w.AddTree(src); err != nil {
		t.Fatal(err)
	}
	// A file whose parents are not in the tree yet, and one whose are.
	if err := w.AddFile("/opt/bin/kube-apicache", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.AddFile("usr/sbin/extra", bin, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := w.AddDir("run", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	want := []string{
		"5 0755 0:0 0 etc/",
		"0 0644 0:0 0 etc/protocols (6 bytes)",
		"1 0644 0:0 0 etc/protocols.hard -> etc/protocols",
		"5 1777 0:0 0 tmp/",
		"5 0755 0:0 0 usr/",
		"5 0755 0:0 0 usr/sbin/",
		"2 0777 0:0 0 usr/sbin/iptables-nft -> xtables-nft-multi",
		"0 0755 0:0 0 usr/sbin/xtables-nft-multi (3 bytes)",
		"5 0755 0:0 0 opt/",
		"5 0755 0:0 0 opt/bin/",
		"0 0755 0:0 0 opt/bin/kube-apicache (6 bytes)",
		"0 0700 0:0 0 usr/sbin/extra (6 bytes)",
		"5 0755 0:0 0 run/",
	}
	if diff := cmp.Diff(want, listTar(t, &buf)); diff != "" {
		t.Errorf("tar entries (-want +got):\n%s", diff)
	}
}

func TestTreeWriterRefuses(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	mkfile(t, bin, nil, 0o755)
	tests := []struct {
		name string
		add  func(t *testing.T, w *treeWriter) error
	}{
		{"the same path twice", func(t *testing.T, w *treeWriter) error {
			if err := w.AddFile("pause", bin, 0o755); err != nil {
				t.Fatal(err)
			}
			return w.AddFile("/pause", bin, 0o755)
		}},
		{"a path climbing out of the root", func(t *testing.T, w *treeWriter) error { return w.AddFile("usr/../../pause", bin, 0o755) }},
		{"the root itself", func(t *testing.T, w *treeWriter) error { return w.AddDir("/", 0o755) }},
		{"a directory as a file", func(t *testing.T, w *treeWriter) error { return w.AddFile("pause", filepath.Dir(bin), 0o755) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.add(t, newTreeWriter(io.Discard)); err == nil {
				t.Error("no error")
			}
		})
	}
}

// The same inputs give the same layer digest, whatever the files' times and
// owners, so rebuilding an unchanged image changes nothing in containerd.
func TestNewLayerIsReproducible(t *testing.T) {
	digest := func(mtime int64) string {
		t.Helper()
		src := t.TempDir()
		mkfile(t, filepath.Join(src, "usr/bin/tool"), []byte("tool"), 0o755)
		for _, p := range []string{"usr/bin/tool", "usr/bin", "usr"} {
			tm := time.Unix(mtime, 0)
			if err := os.Chtimes(filepath.Join(src, p), tm, tm); err != nil {
				t.Fatal(err)
			}
		}
		l, err := newLayer(func(w *treeWriter) error { return w.AddTree(src) })
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	if a, b := digest(1e9), digest(2e9); a != b {
		t.Errorf("layer digests differ with file times: %s, %s", a, b)
	}
}
