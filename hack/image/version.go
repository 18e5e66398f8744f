package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// versionLdflags returns the -X linker flags that stamp the agent's
// provenance (agent/version: release, commit, build date), as
// hack/version.sh in the source tree src derives them from git, so that
// the image's agent says what `make build`'s does.
func versionLdflags(ctx context.Context, src string) (string, error) {
	out, err := run(ctx, src, nil, filepath.Join(src, "hack/version.sh"), "ldflags")
	if err != nil {
		return "", fmt.Errorf("build provenance: %w", err)
	}
	flags := strings.TrimSpace(string(out))
	if !strings.HasPrefix(flags, "-X ") {
		return "", fmt.Errorf("build provenance: hack/version.sh printed %q, want -X flags", flags)
	}
	return flags, nil
}
