package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The previous release's artefacts (make upgrade-images,
// hack/previous-images.sh) and the rendered manifests an upgrade applies
// part by part.

// PreviousAgentImage is the previous release's agent image, as
// hack/previous-images.sh names it.
const PreviousAgentImage = "docker.io/library/kube-apicache:previous"

// PreviousRelease is what hack/previous-images.sh wrote.
type PreviousRelease struct {
	// Revision is the full hash of the commit it was built from.
	Revision string
	// Image is the agent image's OCI archive (PreviousAgentImage).
	Image string
	// Manifests is that commit's manifests, rendered with the image.
	Manifests string
}

// UpgradeDir is $KUBE_APICACHE_UPGRADE_DIR, or the repository's
// _output/upgrade (make upgrade-images).
func UpgradeDir() string {
	if d := os.Getenv("KUBE_APICACHE_UPGRADE_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "_output", "upgrade")
}

// ErrNoPreviousRevision is returned, wrapped with the reason
// hack/previous-images.sh gave, when the clone lacks the previous
// revision (a shallow clone).
var ErrNoPreviousRevision = errors.New("no previous revision")

// LoadPreviousRelease reads what hack/previous-images.sh wrote into dir.
func LoadPreviousRelease(dir string) (*PreviousRelease, error) {
	if reason, err := os.ReadFile(filepath.Join(dir, "skip")); err == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoPreviousRevision, strings.TrimSpace(string(reason)))
	}
	rev, err := os.ReadFile(filepath.Join(dir, "revision"))
	if err != nil {
		return nil, fmt.Errorf("no previous release in %s (make upgrade-images, or set KUBE_APICACHE_UPGRADE_DIR): %w", dir, err)
	}
	p := &PreviousRelease{
		Revision:  strings.TrimSpace(string(rev)),
		Image:     filepath.Join(dir, "previous.oci.tar"),
		Manifests: filepath.Join(dir, "previous.yaml"),
	}
	for _, f := range []string{p.Image, p.Manifests} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("previous release %s: %w (make upgrade-images)", p.Revision, err)
		}
	}
	return p, nil
}

// WantedPreviousRevision is the revision make upgrade-images builds now:
// $KUBE_APICACHE_UPGRADE_FROM, or the first parent of HEAD, as a full
// hash.
func WantedPreviousRevision(ctx context.Context) (string, error) {
	from := os.Getenv("KUBE_APICACHE_UPGRADE_FROM")
	if from == "" {
		from = "HEAD^1"
	}
	cmd := exec.CommandContext(ctx, "git", "rev-parse", "--verify", "-q", from+"^{commit}")
	cmd.Dir = RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse %s: %w", from, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// RenderOverlay renders the kustomization in dir with the machine's
// kubectl ($KUBECTL, or kubectl), as `kubectl kustomize` prints it.
func RenderOverlay(ctx context.Context, dir string) ([]byte, error) {
	bin := os.Getenv("KUBECTL")
	if bin == "" {
		bin = "kubectl"
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w\n%s", dir, err, stderr.String())
	}
	return out, nil
}

// ManifestObject is one document of a rendered manifest.
type ManifestObject struct {
	Kind, Namespace, Name string
	// YAML is the document as rendered.
	YAML []byte
}

// SplitManifest splits a multi-document manifest into its objects, in
// order, so that an upgrade can apply some before the others.
func SplitManifest(data []byte) ([]ManifestObject, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []ManifestObject
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("decoding a manifest document: %w", err)
		}
		if meta.Kind == "" || meta.Metadata.Name == "" {
			return nil, fmt.Errorf("a manifest document without kind or name:\n%.300s", doc)
		}
		out = append(out, ManifestObject{Kind: meta.Kind, Namespace: meta.Metadata.Namespace, Name: meta.Metadata.Name, YAML: doc})
	}
}

// JoinManifest writes the objects keep selects as one multi-document
// manifest to path, and returns how many it wrote.
func JoinManifest(path string, objs []ManifestObject, keep func(ManifestObject) bool) (int, error) {
	var b bytes.Buffer
	n := 0
	for _, o := range objs {
		if !keep(o) {
			continue
		}
		b.WriteString("---\n")
		b.Write(bytes.TrimRight(o.YAML, "\n"))
		b.WriteString("\n")
		n++
	}
	return n, os.WriteFile(path, b.Bytes(), 0o644)
}
