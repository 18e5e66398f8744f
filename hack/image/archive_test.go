package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// testImage builds a one-layer image for p whose /platform file names p.
func testImage(t *testing.T, p platform) platformImage {
	t.Helper()
	src := filepath.Join(t.TempDir(), "platform")
	mkfile(t, src, []byte(p.String()+"\n"), 0o644)
	img, err := buildImage(imageSpec{
		Config: v1.Config{Entrypoint: []string{"/kube-apicache"}, Env: []string{defaultPath}},
		Layers: []layerSpec{{CreatedBy: "test", Fill: func(w *treeWriter) error { return w.AddFile("platform", src, 0o644) }}},
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	return platformImage{Platform: p, Image: img}
}

// readArchive unpacks the archive at path and returns its layout's
// index.json and the one descriptor in it, checked to carry ref's names.
func readArchive(t *testing.T, path string, ref imageRef) (v1.ImageIndex, v1.Descriptor) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			mkfile(t, target, b, 0o644)
		default:
			t.Fatalf("%s: unexpected tar entry type %c in an OCI layout", h.Name, h.Typeflag)
		}
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("index.json has %d descriptors, want 1", len(m.Manifests))
	}
	desc := m.Manifests[0]
	wantNames := map[string]string{annotationContainerdName: ref.Name, annotationRefName: ref.Tag}
	if diff := cmp.Diff(wantNames, desc.Annotations); diff != "" {
		t.Errorf("index.json annotations (-want +got):\n%s", diff)
	}
	return top, desc
}

func TestWriteArchive(t *testing.T) {
	ref, err := parseImageRef("kube-apicache:test")
	if err != nil {
		t.Fatal(err)
	}
	// One platform: index.json names the image itself, with its platform,
	// as a single-platform build always has.
	t.Run("one platform", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "one.oci.tar")
		digest, err := writeArchive(path, t.TempDir(), []platformImage{testImage(t, amd64)}, ref)
		if err != nil {
			t.Fatal(err)
		}
		top, desc := readArchive(t, path, ref)
		if desc.MediaType != types.OCIManifestSchema1 || desc.Digest != digest {
			t.Errorf("index.json names %s %s, want the image manifest %s", desc.MediaType, desc.Digest, digest)
		}
		if diff := cmp.Diff(&v1.Platform{OS: "linux", Architecture: "amd64"}, desc.Platform); diff != "" {
			t.Errorf("platform (-want +got):\n%s", diff)
		}
		img, err := top.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Error(err)
		}
	})

	// Two platforms: index.json names an image index holding one complete
	// image per platform, in the order built, each descriptor with the
	// platform its config says.
	t.Run("two platforms", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "two.oci.tar")
		imgs := []platformImage{testImage(t, amd64), testImage(t, arm64)}
		digest, err := writeArchive(path, t.TempDir(), imgs, ref)
		if err != nil {
			t.Fatal(err)
		}
		top, desc := readArchive(t, path, ref)
		if desc.MediaType != types.OCIImageIndex || desc.Digest != digest {
			t.Fatalf("index.json names %s %s, want the image index %s", desc.MediaType, desc.Digest, digest)
		}
		if desc.Platform != nil {
			t.Errorf("the image index's descriptor has platform %v, want none", desc.Platform)
		}
		idx, err := top.ImageIndex(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Index(idx); err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, md := range m.Manifests {
			if md.MediaType != types.OCIManifestSchema1 || md.Platform == nil {
				t.Fatalf("index entry %s: media type %s, platform %v; want an image manifest with a platform", md.Digest, md.MediaType, md.Platform)
			}
			img, err := idx.Image(md.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, md.Platform.OS+"/"+md.Platform.Architecture+" config "+cf.OS+"/"+cf.Architecture)
		}
		want := []string{"linux/amd64 config linux/amd64", "linux/arm64 config linux/arm64"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("index entries (-want +got):\n%s", diff)
		}

		// The same images give the same index.
		again, err := writeArchive(filepath.Join(t.TempDir(), "again.oci.tar"), t.TempDir(), imgs, ref)
		if err != nil {
			t.Fatal(err)
		}
		if again != digest {
			t.Errorf("rewriting the same images: index %s, then %s", digest, again)
		}
	})

	t.Run("no images", func(t *testing.T) {
		if _, err := writeArchive(filepath.Join(t.TempDir(), "none.oci.tar"), t.TempDir(), nil, ref); err == nil {
			t.Error("no error")
		}
	})
}
