package cache

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
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

// TestParsePinned: --cache-pinned-resources has the --cache-resources
// syntax and names only cached resources (at their version, if it names
// one); errors name the flag.
func TestParsePinned(t *testing.T) {
	cached, err := ParseResources(DefaultResources + ",widgets.example.com/v1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePinned("pods, nodes,widgets.example.com", cached)
	if err != nil {
		t.Fatal(err)
	}
	want := []ResourceSpec{{Resource: "pods"}, {Resource: "nodes"}, {Group: "example.com", Resource: "widgets"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parsed (-want +got):\n%s", diff)
	}
	if got, err := ParsePinned("", cached); err != nil || len(got) != 0 {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"secrets", "widgets.example.com/v2", "Pods", "pods,pods"} {
		if _, err := ParsePinned(bad, cached); err == nil || !strings.Contains(err.Error(), "--cache-pinned-resources") {
			t.Errorf("%q: error %v, want one naming --cache-pinned-resources", bad, err)
		}
	}
	if _, err := New(Config{NodeName: "n", RESTConfig: &rest.Config{}, Resources: cached[:1], Pinned: cached[1:2]}); err == nil {
		t.Errorf("New accepted a pinned resource that is not cached")
	}
}
