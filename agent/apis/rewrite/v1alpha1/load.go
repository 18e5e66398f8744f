package v1alpha1

import "github.com/kube-apicache/kube-apicache/agent/apis/internal/kindfile"

var decoder = kindfile.NewDecoder[*RewriteConfiguration](AddToScheme, SchemeGroupVersion, "RewriteConfiguration")

// Decode parses a RewriteConfiguration (YAML or JSON) and sets its
// defaults. apiVersion and kind are required; unknown and duplicate fields
// are errors. Decode does not validate: call Validate with what the
// cluster serves.
func Decode(data []byte) (*RewriteConfiguration, error) {
	c, err := decoder.Decode(data)
	if err != nil {
		return nil, err
	}
	SetDefaults(c)
	return c, nil
}

// Load reads and decodes the file at path.
func Load(path string) (*RewriteConfiguration, error) {
	c, err := decoder.Load(path)
	if err != nil {
		return nil, err
	}
	SetDefaults(c)
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
