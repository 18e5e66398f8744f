package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeDeb is a Debian package for tests: its control file, and files by
// path (relative to the root) with their contents.
type fakeDeb struct {
	control string
	files   map[string]string
}

// buildFakeDeb builds d with `dpkg-deb --build` (md5sums written for its
// files, as debhelper does) and returns the .deb's path. It skips the test
// without dpkg-deb.
func buildFakeDeb(t *testing.T, d fakeDeb) string {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb:", err)
	}
	root := t.TempDir()
	var sums strings.Builder
	for name, data := range d.files {
		mkfile(t, filepath.Join(root, name), []byte(data), 0o644)
		// Not the real MD5: the tests check that lines are kept, not
		// their sums.
		sums.WriteString("0123456789abcdef0123456789abcdef  " + name + "\n")
	}
	mkfile(t, filepath.Join(root, "DEBIAN/control"), []byte(d.control), 0o644)
	mkfile(t, filepath.Join(root, "DEBIAN/md5sums"), []byte(sums.String()), 0o644)
	f, _ := parseStanza([]byte(d.control))
	deb := filepath.Join(t.TempDir(), f["Package"]+".deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v: %s", err, out)
	}
	return deb
}

const libfooControl = `Package: libfoo1
Source: foo (1.2-3)
Version: 1.2-3+deb12u1
Architecture: amd64
Maintainer: Foo Maintainers <foo@example.org>
Installed-Size: 12
Depends: libc6
Description: the foo library
 Continued: not a field.
`

func TestReadDebControlAndWriteStatus(t *testing.T) {
	deb := buildFakeDeb(t, fakeDeb{control: libfooControl, files: map[string]string{
		"usr/lib/x86_64-linux-gnu/libfoo.so.1": "ELF?",
		"usr/share/man/man3/foo.3.gz":          "manual",
	}})
	p, err := readDebControl(context.Background(), deb)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(libfooControl, string(p.Control)); diff != "" {
		t.Errorf("control (-want +got):\n%s", diff)
	}
	got := [5]string{p.Package, p.Version, p.Architecture, p.Source, p.Maintainer}
	want := [5]string{"libfoo1", "1.2-3+deb12u1", "amd64", "foo (1.2-3)", "Foo Maintainers <foo@example.org>"}
	if got != want {
		t.Errorf("fields %q, want %q", got, want)
	}
	if sum, _ := fileSHA256(deb); p.SHA256 != sum {
		t.Errorf("SHA256 %s, want the .deb's %s", p.SHA256, sum)
	}

	// Unpacked as the image leaves it: the man page excluded.
	root := t.TempDir()
	mkfile(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/libfoo.so.1"), []byte("ELF?"), 0o644)
	if err := writeDpkgStatus(root, []debPackage{p}); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(filepath.Join(root, statusDir, "libfoo1"))
	if err != nil {
		t.Fatal(err)
	}
	wantStatus := strings.Replace(libfooControl, "Package: libfoo1\n", "Package: libfoo1\nStatus: install ok installed\n", 1)
	if diff := cmp.Diff(wantStatus, string(status)); diff != "" {
		t.Errorf("status.d/libfoo1 (-want +got):\n%s", diff)
	}
	sums, err := os.ReadFile(filepath.Join(root, statusDir, "libfoo1.md5sums"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("0123456789abcdef0123456789abcdef  usr/lib/x86_64-linux-gnu/libfoo.so.1\n", string(sums)); diff != "" {
		t.Errorf("status.d/libfoo1.md5sums keeps the files present only (-want +got):\n%s", diff)
	}
}

func TestStatusStanza(t *testing.T) {
	tests := []struct {
		name          string
		control, want string
	}{
		{
			// dpkg puts Status right after Package.
			name:    "Status follows Package",
			control: "Package: a\nVersion: 1\nArchitecture: all\n",
			want:    "Package: a\nStatus: install ok installed\nVersion: 1\nArchitecture: all\n",
		},
		{
			// Package need not come first in a control file.
			name:    "Package not first",
			control: "Version: 1\nPackage: a\nArchitecture: all",
			want:    "Version: 1\nPackage: a\nStatus: install ok installed\nArchitecture: all\n",
		},
		{
			// A description line that mentions a package is no field.
			name:    "continuation lines untouched",
			control: "Package: a\nDescription: x\n Package: b\n",
			want:    "Package: a\nStatus: install ok installed\nDescription: x\n Package: b\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := debPackage{Control: []byte(tt.control)}
			if diff := cmp.Diff(tt.want, string(p.statusStanza())); diff != "" {
				t.Errorf("stanza (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseControlErrors(t *testing.T) {
	for _, control := range []string{
		"Version: 1\nArchitecture: all\n",                // no Package
		"Package: a\nArchitecture: all\n",                // no Version
		"Package: ../a\nVersion: 1\nArchitecture: all\n", // a path, not a name
		" continuation first\n",
		"no colon\n",
	} {
		p := debPackage{Control: []byte(control)}
		if err := p.parseControl(); err == nil {
			t.Errorf("control %q: no error", control)
		}
	}
}

func TestWriteDpkgStatusTwice(t *testing.T) {
	p := debPackage{Package: "a", Control: []byte("Package: a\n")}
	if err := writeDpkgStatus(t.TempDir(), []debPackage{p, p}); err == nil {
		t.Error("a package listed twice: no error")
	}
}
