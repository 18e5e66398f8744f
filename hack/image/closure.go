package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// missingLib is a shared object that an ELF file in a root file system
// needs and that the dynamic loader would not find there.
type missingLib struct {
	Name     string // the DT_NEEDED soname, or the PT_INTERP path
	NeededBy string // the needing file, as a path inside the root
}

func (m missingLib) String() string { return m.Name + " (needed by " + m.NeededBy + ")" }

// missingLibraries checks that the ELF files under root form a closed set,
// as `ldd`/`objdump -p` on each of them would show: every DT_NEEDED library
// must be found in one of p's library directories and every program
// interpreter (PT_INTERP) must exist, both resolved inside root. Because
// every ELF file under root is checked, including the libraries found and
// the plugins iptables dlopens (xtables extensions), a nil result means the
// closure is complete; there is nothing left to iterate over.
//
// RPATH and RUNPATH are not honoured (no package here uses them), which can
// only report a library missing that is not, never the reverse. Every ELF
// file must also be built for p's machine.
func missingLibraries(root string, p platform) ([]missingLib, error) {
	var missing []missingLib
	err := filepath.WalkDir(root, func(host string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(root, host)
		if err != nil {
			return err
		}
		inRoot := "/" + filepath.ToSlash(rel)
		needed, interp, err := elfDeps(host, p.Machine)
		if err != nil {
			return fmt.Errorf("%s: %w", inRoot, err)
		}
		if interp != "" {
			if _, err := resolveIn(root, interp); err != nil {
				missing = append(missing, missingLib{Name: interp, NeededBy: inRoot})
			}
		}
		for _, lib := range needed {
			if !findLibrary(root, lib, p.libraryDirs()) {
				missing = append(missing, missingLib{Name: lib, NeededBy: inRoot})
			}
		}
		return nil
	})
	return missing, err
}

// elfDeps returns the DT_NEEDED entries and the program interpreter of the
// file at path, or nothing if it is not an ELF file.
func elfDeps(path string, machine elf.Machine) (needed []string, interp string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(f, magic); err != nil || !bytes.Equal(magic, []byte(elf.ELFMAG)) {
		return nil, "", nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, "", err
	}
	if ef.Machine != machine {
		return nil, "", fmt.Errorf("ELF machine %v, want %v", ef.Machine, machine)
	}
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return nil, "", fmt.Errorf("reading PT_INTERP: %w", err)
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	needed, err = ef.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, "", fmt.Errorf("reading DT_NEEDED: %w", err)
	}
	return needed, interp, nil
}

// findLibrary reports whether the library soname exists as a regular file
// (after symlinks) in one of dirs inside root.
func findLibrary(root, soname string, dirs []string) bool {
	if strings.Contains(soname, "/") {
		_, err := resolveIn(root, soname)
		return err == nil
	}
	for _, dir := range dirs {
		host, err := resolveIn(root, path.Join(dir, soname))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(host); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// findCommands returns the names among cmds that are not an executable
// regular file (after symlinks) in any of the PATH directories pathDirs
// inside root.
func findCommands(root string, pathDirs, cmds []string) []string {
	var missing []string
	for _, c := range cmds {
		found := slices.ContainsFunc(pathDirs, func(dir string) bool {
			host, err := resolveIn(root, path.Join(dir, c))
			if err != nil {
				return false
			}
			fi, err := os.Stat(host)
			return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
		})
		if !found {
			missing = append(missing, c)
		}
	}
	return missing
}

// resolveIn returns the host path of name, an absolute path inside root,
// with every symlink on the way followed as if root were "/": an absolute
// target starts again at root and ".." never climbs above it. The result
// exists.
func resolveIn(root, name string) (string, error) {
	const maxLinks = 40 // as Linux's MAXSYMLINKS
	links := 0
	resolved := "/"
	rest := strings.Split(name, "/")
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, c)
		host := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", name)
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, filepath.FromSlash(resolved)), nil
}
