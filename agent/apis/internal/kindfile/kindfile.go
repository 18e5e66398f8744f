// Package kindfile reads the agent's configuration kinds from YAML or
// JSON, strictly: apiVersion and kind are required, and an unknown,
// misspelt or repeated field is an error that names it rather than a
// setting silently ignored.
package kindfile

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// Decoder decodes one kind of one group version into T.
type Decoder[T runtime.Object] struct {
	decoder runtime.Decoder
	gv      schema.GroupVersion
	kind    string
}

// NewDecoder returns the strict decoder of kind, registered in gv by
// addToScheme. It panics if addToScheme fails, a programming error.
func NewDecoder[T runtime.Object](addToScheme func(*runtime.Scheme) error, gv schema.GroupVersion, kind string) *Decoder[T] {
	s := runtime.NewScheme()
	if err := addToScheme(s); err != nil {
		panic(err)
	}
	codecs := serializer.NewCodecFactory(s, serializer.EnableStrict)
	return &Decoder[T]{decoder: codecs.UniversalDecoder(gv), gv: gv, kind: kind}
}

// Decode parses data as the decoder's kind.
func (d *Decoder[T]) Decode(data []byte) (T, error) {
	var zero T
	obj, gvk, err := d.decoder.Decode(data, nil, nil)
	switch {
	case runtime.IsMissingVersion(err):
		return zero, fmt.Errorf("apiVersion is required (%s)", d.gv)
	case runtime.IsMissingKind(err):
		return zero, fmt.Errorf("kind is required (%s)", d.kind)
	case err != nil:
		return zero, err
	}
	c, ok := obj.(T)
	if !ok {
		return zero, fmt.Errorf("kind %s: want %s (%s)", gvk, d.kind, d.gv)
	}
	return c, nil
}

// Load reads and decodes the file at path; a decoding error names the
// file.
func (d *Decoder[T]) Load(path string) (T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, err
	}
	c, err := d.Decode(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
