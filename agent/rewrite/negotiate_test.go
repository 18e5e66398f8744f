package rewrite

import "testing"

// TestAcceptJSON: what a selected caller of a renamed group may be
// answered with.
func TestAcceptJSON(t *testing.T) {
	for _, c := range []struct {
		accept, want string
		ok           bool
	}{
		{"", "application/json", true},
		{"application/json", "application/json", true},
		{"application/vnd.kubernetes.protobuf, application/json", "application/json", true},
		{"application/vnd.kubernetes.protobuf;stream=watch, application/json;stream=watch", "application/json;stream=watch", true},
		{"application/json;as=Table;v=v1;g=meta.k8s.io, application/json", "application/json;as=Table;v=v1;g=meta.k8s.io, application/json", true},
		{"application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json", true},
		{"application/cbor", "", false},
		{"application/vnd.kubernetes.protobuf", "", false},
		{"application/json;q=0, application/cbor", "", false},
		{"*/*", "*/*", true},
		{"application/yaml", "application/yaml", true},
		{"garbage;;", "", false},
	} {
		got, ok := AcceptJSON(c.accept)
		if got != c.want || ok != c.ok {
			t.Errorf("AcceptJSON(%q) = %q, %v; want %q, %v", c.accept, got, ok, c.want, c.ok)
		}
	}
}

// TestBodyOf: request bodies by Content-Type.
func TestBodyOf(t *testing.T) {
	for ct, want := range map[string]Body{
		"application/json":                       BodyObject,
		"application/json; charset=utf-8":        BodyObject,
		"application/merge-patch+json":           BodyMergePatch,
		"application/strategic-merge-patch+json": BodyMergePatch,
		"application/json-patch+json":            BodyJSONPatch,
		"application/apply-patch+yaml":           BodyApplyPatch,
		"application/apply-patch+cbor":           BodyUnsupported,
		"application/vnd.kubernetes.protobuf":    BodyUnsupported,
		"application/cbor":                       BodyUnsupported,
		"":                                       BodyUnsupported,
	} {
		if got := BodyOf(ct); got != want {
			t.Errorf("BodyOf(%q) = %v, want %v", ct, got, want)
		}
	}
}
