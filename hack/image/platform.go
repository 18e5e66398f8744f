package main

import (
	"debug/elf"
	"fmt"
	"slices"
	"strings"
)

// platform is one target the images are built for.
type platform struct {
	OS, Arch string // GOOS and GOARCH, also the image config's os and architecture
	// DebArch is Debian's name for the architecture (apt-get download
	// pkg:DebArch).
	DebArch string
	// Multiarch is Debian's multiarch tuple: shared libraries live in
	// /lib/<Multiarch> and /usr/lib/<Multiarch>.
	Multiarch string
	// Machine is the ELF machine of the platform's binaries.
	Machine elf.Machine
}

// platforms are the targets hack/image knows. Adding one (linux/arm64:
// arm64, aarch64-linux-gnu, EM_AARCH64) also needs `dpkg
// --add-architecture` on the build host and, for more than one target per
// run, an image index per archive.
var platforms = map[string]platform{
	"linux/amd64": {OS: "linux", Arch: "amd64", DebArch: "amd64", Multiarch: "x86_64-linux-gnu", Machine: elf.EM_X86_64},
}

func (p platform) String() string { return p.OS + "/" + p.Arch }

// libraryDirs are the directories the dynamic loader searches, in order,
// for a DT_NEEDED library when there is no /etc/ld.so.cache (the image has
// none): Debian's glibc puts the multiarch directories first.
func (p platform) libraryDirs() []string {
	return []string{"/lib/" + p.Multiarch, "/usr/lib/" + p.Multiarch, "/lib", "/usr/lib"}
}

func parsePlatform(s string) (platform, error) {
	p, ok := platforms[s]
	if !ok {
		known := make([]string, 0, len(platforms))
		for k := range platforms {
			known = append(known, k)
		}
		slices.Sort(known)
		return platform{}, fmt.Errorf("platform %q: not supported (known: %s)", s, strings.Join(known, ", "))
	}
	return p, nil
}
