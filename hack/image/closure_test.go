package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var (
	amd64 = platforms["linux/amd64"]
	arm64 = platforms["linux/arm64"]
)

// writeELF writes a minimal 64-bit little-endian shared object for machine
// with an optional program interpreter and DT_NEEDED entries: just enough
// for debug/elf, and for `objdump -p` to show the same.
func writeELF(t *testing.T, path string, machine elf.Machine, interp string, needed ...string) {
	t.Helper()
	const (
		ehSize = 64
		phSize = 56
		shSize = 64
	)
	phnum := 0
	if interp != "" {
		phnum = 1
	}
	// Section contents, laid out after the headers.
	interpData := []byte(interp + "\x00")
	dynstr := []byte{0}
	var dyn bytes.Buffer
	for _, n := range needed {
		binary.Write(&dyn, binary.LittleEndian, elf.Dyn64{Tag: int64(elf.DT_NEEDED), Val: uint64(len(dynstr))})
		dynstr = append(dynstr, n+"\x00"...)
	}
	binary.Write(&dyn, binary.LittleEndian, elf.Dyn64{Tag: int64(elf.DT_NULL)})
	shstrtab := []byte("\x00.interp\x00.dynstr\x00.dynamic\x00.shstrtab\x00")
	name := func(s string) uint32 { return uint32(bytes.Index(shstrtab, []byte("\x00"+s+"\x00")) + 1) }

	off := uint64(ehSize + phSize*phnum)
	interpOff := off
	off += uint64(len(interpData))
	dynstrOff := off
	off += uint64(len(dynstr))
	off = (off + 7) &^ 7
	dynOff := off
	off += uint64(dyn.Len())
	shstrOff := off
	off += uint64(len(shstrtab))
	off = (off + 7) &^ 7
	shOff := off

	var b bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_DYN), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Phoff: ehSize, Shoff: shOff, Ehsize: ehSize, Phentsize: phSize, Phnum: uint16(phnum),
		Shentsize: shSize, Shnum: 5, Shstrndx: 4,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&b, binary.LittleEndian, hdr)
	if phnum == 1 {
		binary.Write(&b, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: interpOff, Filesz: uint64(len(interpData)), Memsz: uint64(len(interpData)), Align: 1})
	}
	b.Write(interpData)
	b.Write(dynstr)
	b.Write(make([]byte, dynOff-uint64(b.Len())))
	b.Write(dyn.Bytes())
	b.Write(shstrtab)
	b.Write(make([]byte, shOff-uint64(b.Len())))
	for _, sh := range []elf.Section64{
		{},
		{Name: name(".interp"), Type: uint32(elf.SHT_PROGBITS), Off: interpOff, Size: uint64(len(interpData)), Addralign: 1},
		{Name: name(".dynstr"), Type: uint32(elf.SHT_STRTAB), Off: dynstrOff, Size: uint64(len(dynstr)), Addralign: 1},
		{Name: name(".dynamic"), Type: uint32(elf.SHT_DYNAMIC), Off: dynOff, Size: uint64(dyn.Len()), Link: 2, Addralign: 8, Entsize: 16},
		{Name: name(".shstrtab"), Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstrtab)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, sh)
	}
	mkfile(t, path, b.Bytes(), 0o755)
}

func mkfile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func mklink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func TestELFDeps(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bin")
	writeELF(t, p, elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2", "libxtables.so.12", "libc.so.6")
	needed, interp, err := elfDeps(p, elf.EM_X86_64)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"libxtables.so.12", "libc.so.6"}, needed); diff != "" {
		t.Errorf("needed (-want +got):\n%s", diff)
	}
	if interp != "/lib64/ld-linux-x86-64.so.2" {
		t.Errorf("interp = %q", interp)
	}
	if _, _, err := elfDeps(p, elf.EM_AARCH64); err == nil || !strings.Contains(err.Error(), "EM_X86_64") {
		t.Errorf("elfDeps for the wrong machine: err = %v, want a machine mismatch", err)
	}
	script := filepath.Join(dir, "script")
	mkfile(t, script, []byte("#!/bin/sh\n"), 0o755)
	if needed, interp, err := elfDeps(script, elf.EM_X86_64); err != nil || needed != nil || interp != "" {
		t.Errorf("elfDeps(script) = %v, %q, %v; want nothing", needed, interp, err)
	}
}

// A root file system in Debian's unmerged layout, as the packages unpack:
// the interpreter under /lib64 as an absolute symlink, libraries under
// /lib/<multiarch> and /usr/lib/<multiarch> as soname symlinks.
func debianLikeRoot(t *testing.T) string {
	root := t.TempDir()
	lib := filepath.Join(root, "lib/x86_64-linux-gnu")
	usrlib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	writeELF(t, filepath.Join(lib, "ld-linux-x86-64.so.2"), elf.EM_X86_64, "")
	mklink(t, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(root, "lib64/ld-linux-x86-64.so.2"))
	writeELF(t, filepath.Join(lib, "libc.so.6"), elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2")
	writeELF(t, filepath.Join(usrlib, "libxtables.so.12.7.0"), elf.EM_X86_64, "", "libc.so.6")
	mklink(t, "libxtables.so.12.7.0", filepath.Join(usrlib, "libxtables.so.12"))
	writeELF(t, filepath.Join(root, "usr/sbin/xtables-nft-multi"), elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2", "libxtables.so.12", "libc.so.6")
	mklink(t, "xtables-nft-multi", filepath.Join(root, "usr/sbin/iptables-nft"))
	mkfile(t, filepath.Join(root, "etc/protocols"), []byte("tcp 6 TCP\n"), 0o644)
	return root
}

func TestMissingLibraries(t *testing.T) {
	tests := []struct {
		name string
		// change turns the Debian-like root into the case under test.
		change func(t *testing.T, root string)
		want   []missingLib
	}{{
		name:   "a complete root is closed",
		change: func(*testing.T, string) {},
	}, {
		name: "a library needed only by a dlopened plugin is reported",
		change: func(t *testing.T, root string) {
			writeELF(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/xtables/libxt_connlabel.so"), elf.EM_X86_64, "", "libnetfilter_conntrack.so.3")
		},
		want: []missingLib{{Name: "libnetfilter_conntrack.so.3", NeededBy: "/usr/lib/x86_64-linux-gnu/xtables/libxt_connlabel.so"}},
	}, {
		name: "a dangling soname symlink is missing, for its every user",
		change: func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "usr/lib/x86_64-linux-gnu/libxtables.so.12.7.0"))
		},
		want: []missingLib{{Name: "libxtables.so.12", NeededBy: "/usr/sbin/xtables-nft-multi"}},
	}, {
		name: "a missing interpreter is reported",
		change: func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
		},
		want: []missingLib{
			{Name: "/lib64/ld-linux-x86-64.so.2", NeededBy: "/lib/x86_64-linux-gnu/libc.so.6"},
			{Name: "/lib64/ld-linux-x86-64.so.2", NeededBy: "/usr/sbin/xtables-nft-multi"},
		},
	}, {
		name: "a library outside the loader's default directories is not found",
		change: func(t *testing.T, root string) {
			writeELF(t, filepath.Join(root, "usr/sbin/tool"), elf.EM_X86_64, "", "libextra.so.1")
			writeELF(t, filepath.Join(root, "opt/lib/libextra.so.1"), elf.EM_X86_64, "")
		},
		want: []missingLib{{Name: "libextra.so.1", NeededBy: "/usr/sbin/tool"}},
	}, {
		name: "a symlink escaping the root is resolved inside it",
		change: func(t *testing.T, root string) {
			writeELF(t, filepath.Join(root, "usr/sbin/tool"), elf.EM_X86_64, "", "libhost.so.1")
			// On the host this would reach /usr/lib/...; in the root it
			// must not.
			mklink(t, "../../../../../../usr/lib/x86_64-linux-gnu/libhost.so.1", filepath.Join(root, "lib/x86_64-linux-gnu/libhost.so.1"))
		},
		want: []missingLib{{Name: "libhost.so.1", NeededBy: "/usr/sbin/tool"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := debianLikeRoot(t)
			tt.change(t, root)
			got, err := missingLibraries(root, amd64)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("missingLibraries (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMissingLibrariesWrongMachine(t *testing.T) {
	root := debianLikeRoot(t)
	writeELF(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/libarm.so.1"), elf.EM_AARCH64, "")
	if _, err := missingLibraries(root, amd64); err == nil || !strings.Contains(err.Error(), "/usr/lib/x86_64-linux-gnu/libarm.so.1") {
		t.Errorf("err = %v, want one naming the aarch64 library", err)
	}
}

// The same checks hold per platform: an arm64 root is closed in its own
// multiarch directories, with its own interpreter and machine.
func TestMissingLibrariesArm64(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "lib/aarch64-linux-gnu")
	usrlib := filepath.Join(root, "usr/lib/aarch64-linux-gnu")
	writeELF(t, filepath.Join(lib, "ld-linux-aarch64.so.1"), elf.EM_AARCH64, "")
	mklink(t, "aarch64-linux-gnu/ld-linux-aarch64.so.1", filepath.Join(root, "lib/ld-linux-aarch64.so.1"))
	writeELF(t, filepath.Join(lib, "libc.so.6"), elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1")
	writeELF(t, filepath.Join(usrlib, "libxtables.so.12"), elf.EM_AARCH64, "", "libc.so.6")
	writeELF(t, filepath.Join(root, "usr/sbin/xtables-nft-multi"), elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1", "libxtables.so.12", "libc.so.6")

	if got, err := missingLibraries(root, arm64); err != nil || got != nil {
		t.Errorf("missingLibraries(arm64) = %v, %v; want a closed root", got, err)
	}
	if _, err := missingLibraries(root, amd64); err == nil || !strings.Contains(err.Error(), "EM_AARCH64") {
		t.Errorf("missingLibraries(amd64) of an arm64 root: err = %v, want a machine mismatch", err)
	}
	// amd64's multiarch directory is not searched for arm64.
	writeELF(t, filepath.Join(root, "usr/sbin/tool"), elf.EM_AARCH64, "", "libmnl.so.0")
	writeELF(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu/libmnl.so.0"), elf.EM_AARCH64, "")
	want := []missingLib{{Name: "libmnl.so.0", NeededBy: "/usr/sbin/tool"}}
	got, err := missingLibraries(root, arm64)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("missingLibraries (-want +got):\n%s", diff)
	}
}

func TestFindCommands(t *testing.T) {
	root := debianLikeRoot(t)
	mkfile(t, filepath.Join(root, "usr/sbin/not-executable"), nil, 0o644)
	mklink(t, "missing-multi", filepath.Join(root, "usr/sbin/dangling"))
	got := findCommands(root, pathDirs, []string{"iptables-nft", "xtables-nft-multi", "not-executable", "dangling", "iptables-legacy"})
	if diff := cmp.Diff([]string{"not-executable", "dangling", "iptables-legacy"}, got); diff != "" {
		t.Errorf("findCommands (-want +got):\n%s", diff)
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	mkfile(t, filepath.Join(root, "usr/lib/x/libc.so.6"), nil, 0o644)
	mklink(t, "usr/lib", filepath.Join(root, "lib"))
	mklink(t, "/lib/x/libc.so.6", filepath.Join(root, "abs"))
	mklink(t, "../../../../etc/passwd", filepath.Join(root, "usr/lib/x/escape"))
	mklink(t, "loop2", filepath.Join(root, "loop1"))
	mklink(t, "loop1", filepath.Join(root, "loop2"))
	tests := []struct {
		name, path string
		want       string // inside root; "" for an error
	}{
		{"a plain file", "/usr/lib/x/libc.so.6", "/usr/lib/x/libc.so.6"},
		{"a relative directory symlink on the way", "/lib/x/libc.so.6", "/usr/lib/x/libc.so.6"},
		{"an absolute symlink restarts at the root", "/abs", "/usr/lib/x/libc.so.6"},
		{"dot-dot stops at the root", "/../../usr/lib/x/libc.so.6", "/usr/lib/x/libc.so.6"},
		{"a symlink climbing out stays inside", "/usr/lib/x/escape", ""},
		{"a symlink loop is an error", "/loop1", ""},
		{"a missing file is an error", "/usr/lib/x/libm.so.6", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveIn(root, tt.path)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("resolveIn(%q) = %q, want an error", tt.path, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tt.want); got != want {
				t.Errorf("resolveIn(%q) = %q, want %q", tt.path, got, want)
			}
		})
	}
}
