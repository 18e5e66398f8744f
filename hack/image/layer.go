package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is the time of every entry in the tars hack/image writes, so that
// the same inputs always give the same layer and image digests.
var epoch = time.Unix(0, 0).UTC()

// treeWriter writes a reproducible tar: owner root, times at epoch, no
// user or group names, entries in the order added, and every parent
// directory of an entry written (0755) before it unless already written.
type treeWriter struct {
	tw *tar.Writer
	// written holds the names written so far, to add parents once.
	written map[string]bool
	// inodes maps a multiply-linked file's inode to the first name it was
	// written under; later names become hard links to it.
	inodes map[[2]uint64]string
}

func newTreeWriter(w io.Writer) *treeWriter {
	return &treeWriter{tw: tar.NewWriter(w), written: map[string]bool{}, inodes: map[[2]uint64]string{}}
}

// Close writes the tar's end-of-archive marker.
func (w *treeWriter) Close() error { return w.tw.Close() }

// AddDir adds the directory name (a slash-separated path inside the image)
// with mode, and its missing parents with 0755.
func (w *treeWriter) AddDir(name string, mode fs.FileMode) error {
	name, err := entryName(name)
	if err != nil {
		return err
	}
	if err := w.addParents(name); err != nil {
		return err
	}
	return w.writeHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: tarMode(mode)})
}

// AddFile adds the host file src, following symlinks as `cp -L` does, as
// the regular file name with mode.
func (w *treeWriter) AddFile(name, src string, mode fs.FileMode) error {
	name, err := entryName(name)
	if err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	if err := w.addParents(name); err != nil {
		return err
	}
	if err := w.writeHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: tarMode(mode), Size: fi.Size()}); err != nil {
		return err
	}
	if _, err := io.Copy(w.tw, f); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}

// AddTree adds everything under the host directory root at the same path
// under the image's "/", in lexical order: directories, regular files,
// symlinks (kept as symlinks) and hard links (the second and later names of
// a file become tar hard links). Other file types are an error.
func (w *treeWriter) AddTree(root string) error {
	return filepath.WalkDir(root, func(host string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, host)
		if err != nil || rel == "." {
			return err
		}
		name, err := entryName(filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if err := w.addParents(name); err != nil {
			return err
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			return w.writeHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: tarMode(mode)})
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return err
			}
			return w.writeHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
		case mode.IsRegular():
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				key := [2]uint64{uint64(st.Dev), st.Ino}
				if first, ok := w.inodes[key]; ok {
					return w.writeHeader(&tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: first, Mode: tarMode(mode)})
				}
				w.inodes[key] = name
			}
			return w.AddFile(name, host, mode)
		default:
			return fmt.Errorf("%s: unsupported file type %v", host, mode.Type())
		}
	})
}

func (w *treeWriter) addParents(name string) error {
	var parents []string
	for dir := path.Dir(name); dir != "." && !w.written[dir]; dir = path.Dir(dir) {
		parents = append(parents, dir)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		if err := w.writeHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755}); err != nil {
			return err
		}
	}
	return nil
}

func (w *treeWriter) writeHeader(h *tar.Header) error {
	name := strings.TrimSuffix(h.Name, "/")
	if w.written[name] {
		return fmt.Errorf("%s: added twice", name)
	}
	w.written[name] = true
	h.ModTime = epoch
	return w.tw.WriteHeader(h)
}

// entryName cleans a path inside the image to tar's relative form
// ("usr/bin/kubectl"), refusing the root itself and ".." components.
func entryName(name string) (string, error) {
	rel := strings.TrimLeft(name, "/")
	if slices.Contains(strings.Split(rel, "/"), "..") || path.Clean(rel) == "." {
		return "", fmt.Errorf("bad path in image %q", name)
	}
	return path.Clean(rel), nil
}

// tarMode converts permission, setuid, setgid and sticky bits to tar's
// octal mode.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// newLayer returns an OCI layer (gzip, types.OCILayer) whose contents fill
// writes. The compressed layer is built once, in memory.
func newLayer(fill func(*treeWriter) error) (v1.Layer, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := newTreeWriter(zw)
	if err := fill(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
