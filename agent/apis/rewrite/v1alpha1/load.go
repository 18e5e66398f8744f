package v1alpha1

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		panic(err)
	}
	// Strict: a misspelt or misplaced field is an error naming it, not a
	// silently ignored rule.
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// Decode parses a RewriteConfiguration (YAML or JSON) and sets its
// defaults. apiVersion and kind are required; unknown and duplicate fields
// are errors. Decode does not validate: call Validate with what the
// cluster serves.
func Decode(data []byte) (*RewriteConfiguration, error) {
	obj, gvk, err := codecs.UniversalDecoder(SchemeGroupVersion).Decode(data, nil, nil)
	switch {
	case runtime.IsMissingVersion(err):
		return nil, fmt.Errorf("apiVersion is required (%s)", SchemeGroupVersion)
	case runtime.IsMissingKind(err):
		return nil, errors.New("kind is required (RewriteConfiguration)")
	case err != nil:
		return nil, err
	}
	c, ok := obj.(*RewriteConfiguration)
	if !ok {
		return nil, fmt.Errorf("kind %s: want RewriteConfiguration (%s)", gvk, SchemeGroupVersion)
	}
	SetDefaults(c)
	return c, nil
}

// Load reads and decodes the file at path.
func Load(path string) (*RewriteConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// DefaultKeepCategories are the categories a profile leaves as they are
// unless it says otherwise: `kubectl get all` keeps listing the renamed
// resources that asked to be in it.
var DefaultKeepCategories = []string{"all"}

// SetDefaults fills the fields c leaves unset.
func SetDefaults(c *RewriteConfiguration) {
	for i := range c.Profiles {
		p := &c.Profiles[i]
		if p.KeepCategories == nil {
			p.KeepCategories = append([]string(nil), DefaultKeepCategories...)
		}
	}
}
