package main

import (
	"debug/elf"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
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

// platforms are the targets hack/image knows. The build host fetches each
// one's packages with apt-get download, so every DebArch other than the
// host's own needs `dpkg --add-architecture` and `apt-get update` there
// once (`make apt-lists` does both).
var platforms = map[string]platform{
	"linux/amd64": {OS: "linux", Arch: "amd64", DebArch: "amd64", Multiarch: "x86_64-linux-gnu", Machine: elf.EM_X86_64},
	"linux/arm64": {OS: "linux", Arch: "arm64", DebArch: "arm64", Multiarch: "aarch64-linux-gnu", Machine: elf.EM_AARCH64},
}

func (p platform) String() string { return p.OS + "/" + p.Arch }

// imagePlatform is p as image indexes and image configs name it.
func (p platform) imagePlatform() v1.Platform { return v1.Platform{OS: p.OS, Architecture: p.Arch} }

// libraryDirs are the directories the dynamic loader searches, in order,
// for a DT_NEEDED library when there is no /etc/ld.so.cache (the image has
// none): Debian's glibc puts the multiarch directories first.
func (p platform) libraryDirs() []string {
	return []string{"/lib/" + p.Multiarch, "/usr/lib/" + p.Multiarch, "/lib", "/usr/lib"}
}

// parsePlatforms parses a comma-separated list of platforms ("linux/amd64",
// "linux/amd64,linux/arm64"), in the order given: the order of the
// manifests in a multi-platform archive's image index.
func parsePlatforms(s string) ([]platform, error) {
	var ps []platform
	seen := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		p, ok := platforms[name]
		if !ok {
			known := slices.Sorted(maps.Keys(platforms))
			return nil, fmt.Errorf("platform %q: not supported (known: %s)", name, strings.Join(known, ", "))
		}
		if seen[name] {
			return nil, fmt.Errorf("platform %q: listed twice", name)
		}
		seen[name] = true
		ps = append(ps, p)
	}
	return ps, nil
}
