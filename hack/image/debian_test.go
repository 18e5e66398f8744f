package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReadPackageList(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // nil for an error
	}{
		{"comments and blank lines are skipped", "# userspace\niptables\n\n  libc6  # the C library\n", []string{"iptables", "libc6"}},
		// The Dockerfile's awk would take the first word; refuse instead.
		{"two words on a line", "iptables libc6\n", nil},
		{"an architecture qualifier", "libc6:amd64\n", nil},
		{"a version pin", "libc6=2.36-9\n", nil},
		{"no packages", "# nothing\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readPackageList(strings.NewReader(tt.in))
			if tt.want == nil {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("packages (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParsePrintURIs(t *testing.T) {
	out := `'http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb' libc6_2.36-9+deb12u14_amd64.deb 2759320 SHA256:ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf
'http://deb.debian.org/debian/pool/main/n/netbase/netbase_6.4_all.deb' netbase_6.4_all.deb 12800 SHA256:29b23c48c0fe6f878e56c5ddc9f65d1c05d729360f3690a593a8c795031cd867
`
	got, err := parsePrintURIs([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []debFile{
		{Package: "libc6", File: "libc6_2.36-9+deb12u14_amd64.deb", Size: 2759320, SHA256: "ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf"},
		{Package: "netbase", File: "netbase_6.4_all.deb", Size: 12800, SHA256: "29b23c48c0fe6f878e56c5ddc9f65d1c05d729360f3690a593a8c795031cd867"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("debs (-want +got):\n%s", diff)
	}
	for _, bad := range []string{
		"'http://x/a.deb' a_1_amd64.deb 10 MD5Sum:abc",
		"'http://x/a.deb' ../a_1_amd64.deb 10 SHA256:abc",
		"'http://x/a.deb' a_1_amd64.deb ten SHA256:abc",
	} {
		if _, err := parsePrintURIs([]byte(bad)); err == nil {
			t.Errorf("parsePrintURIs(%q): no error", bad)
		}
	}
}

func TestParseArchitectures(t *testing.T) {
	// Abridged `apt-cache show --no-all-versions libc6 netbase` on amd64;
	// the description's continuation lines must not be taken for fields.
	out := `Package: libc6
Version: 2.36-9+deb12u14
Architecture: amd64
Multi-Arch: same
Description: GNU C Library: Shared libraries
 Package: not a field
 Architecture: nor this

Package: netbase
Version: 6.4
Architecture: all

`
	got, err := parseArchitectures([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"libc6": "amd64", "netbase": "all"}, got); diff != "" {
		t.Errorf("architectures (-want +got):\n%s", diff)
	}
	if _, err := parseArchitectures([]byte("Package: libc6\nVersion: 2.36\n")); err == nil {
		t.Error("a stanza without Architecture: no error")
	}
}
