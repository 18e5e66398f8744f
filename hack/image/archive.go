package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on the image's descriptor in index.json. containerd (ctr
// images import, 1.6 and later) names the image after
// io.containerd.image.name when present, otherwise after the OCI ref name,
// which by the image-layout spec is usually only a tag ("latest") and then
// gets an "import-DATE" or --base-name prefix. Both are set, as `docker
// save` and containerd's own Docker-archive importer do.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// defaultPath is the image's PATH: the agent looks up iptables-nft and
// friends in it, and kubectl is found by name in the client image.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// imageSpec describes one image to build.
type imageSpec struct {
	Ref    imageRef
	Config v1.Config
	Layers []layerSpec
	// SBOM, if set, is what the image holds for its SBOM (writeSBOM).
	SBOM *sbomInput
}

// layerSpec is one layer: CreatedBy goes to the image's history.
type layerSpec struct {
	CreatedBy string
	Fill      func(*treeWriter) error
}

// buildImage assembles spec for p as an OCI image (OCI manifest, config
// and layer media types), reproducibly: created at epoch.
func buildImage(spec imageSpec, p platform) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, ls := range spec.Layers {
		layer, err := newLayer(ls.Fill)
		if err != nil {
			return nil, fmt.Errorf("layer %q: %w", ls.CreatedBy, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{CreatedBy: ls.CreatedBy, Created: v1.Time{Time: epoch}},
		})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config = spec.Config
	return mutate.ConfigFile(img, cf)
}

// platformImage is an image built for one platform.
type platformImage struct {
	Platform platform
	Image    v1.Image
}

// imageIndex returns an OCI image index of imgs, one manifest a platform
// in the order given, each descriptor with its platform so that a runtime
// picks its own without reading the configs.
func imageIndex(imgs []platformImage) v1.ImageIndex {
	adds := make([]mutate.IndexAddendum, 0, len(imgs))
	for _, pi := range imgs {
		p := pi.Platform.imagePlatform()
		adds = append(adds, mutate.IndexAddendum{Add: pi.Image, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
}

// writeArchive writes imgs as an OCI image layout archive (a tar of the
// layout directory: oci-layout, index.json, blobs/sha256/...) to path,
// named by ref through the annotations of index.json's one descriptor. A
// single image is that descriptor itself (with its platform); more than
// one are gathered in an image index (imageIndex) that it points to, as a
// registry serves a multi-platform tag. The layout is staged in work, and
// path is replaced only once the archive is complete. It returns the
// digest of what index.json points to.
func writeArchive(path, work string, imgs []platformImage, ref imageRef) (v1.Hash, error) {
	if len(imgs) == 0 {
		return v1.Hash{}, errors.New("no images to write")
	}
	dir, err := os.MkdirTemp(work, "layout-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	named := layout.WithAnnotations(map[string]string{
		annotationContainerdName: ref.Name,
		annotationRefName:        ref.Tag,
	})
	var root interface{ Digest() (v1.Hash, error) }
	if len(imgs) == 1 {
		root = imgs[0].Image
		err = lp.AppendImage(imgs[0].Image, named, layout.WithPlatform(imgs[0].Platform.imagePlatform()))
	} else {
		idx := imageIndex(imgs)
		root = idx
		err = lp.AppendIndex(idx, named)
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing OCI layout: %w", err)
	}
	digest, err := root.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	return digest, writeTar(path, dir)
}

// writeTar writes the tree at dir as a tar to path, atomically.
func writeTar(path, dir string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename, a no-op
	tw := newTreeWriter(f)
	if err := tw.AddTree(dir); err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
