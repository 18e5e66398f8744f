package cache

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseResources: the --cache-resources syntax, and one-line errors for
// bad entries.
func TestParseResources(t *testing.T) {
	got, err := ParseResources(DefaultResources + ", widgets.example.com/v1beta1 ,secrets")
	if err != nil {
		t.Fatal(err)
	}
	want := []ResourceSpec{
		{Resource: "pods"}, {Resource: "nodes"}, {Resource: "services"},
		{Group: "discovery.k8s.io", Resource: "endpointslices"}, {Resource: "namespaces"},
		{Group: "example.com", Resource: "widgets", Version: "v1beta1"}, {Resource: "secrets"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parsed (-want +got):\n%s", diff)
	}
	if got, err := ParseResources(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"Pods", "pods,pods", "widgets.example.com/V1", "pods/v2", "widgets.-bad-", "a b"} {
		if _, err := ParseResources(bad); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want a one-line error", bad, err)
		}
	}
}
