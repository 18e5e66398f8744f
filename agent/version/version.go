// Package version holds what the build stamps into the binary: the release
// (from `git describe`), the commit and the build date. The Makefile, the
// image builder (hack/image) and the Dockerfile set them with
//
//	-ldflags "-X github.com/kube-apicache/kube-apicache/agent/version.gitVersion=v0.4.0 ..."
//
// A plain `go build` leaves the defaults, which say so.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by -ldflags -X at build time.
var (
	gitVersion = "v0.0.0-unset"
	gitCommit  = ""
	buildDate  = ""
)

// Info is the build's provenance, as `kube-apicache version -o json` prints
// it and the kube_apicache_build_info metric labels it.
type Info struct {
	GitVersion string `json:"gitVersion"`
	GitCommit  string `json:"gitCommit"`
	BuildDate  string `json:"buildDate"`
	GoVersion  string `json:"goVersion"`
	Compiler   string `json:"compiler"`
	Platform   string `json:"platform"`
}

// Get returns the build's Info. Without ldflags, the commit comes from the
// VCS stamp the go command records (when built inside the repository).
func Get() Info {
	commit, date := gitCommit, buildDate
	if commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					commit = s.Value
				case "vcs.time":
					if date == "" {
						date = s.Value
					}
				}
			}
		}
	}
	return Info{
		GitVersion: gitVersion,
		GitCommit:  commit,
		BuildDate:  date,
		GoVersion:  runtime.Version(),
		Compiler:   runtime.Compiler,
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String is the one-line form `kube-apicache --version` prints.
func (i Info) String() string {
	s := "kube-apicache " + i.GitVersion
	if i.GitCommit != "" {
		s += fmt.Sprintf(" (commit %s", i.GitCommit)
		if i.BuildDate != "" {
			s += ", built " + i.BuildDate
		}
		s += ")"
	}
	return s + fmt.Sprintf(" %s %s", i.GoVersion, i.Platform)
}
