package cache

import (
	"net/http/httptest"
	"testing"
)

// TestAnswerableAccept: only the Accept forms the cache negotiates exactly
// as kube-apiserver does are answered; every other form is forwarded.
func TestAnswerableAccept(t *testing.T) {
	cases := []struct {
		accept    string
		transform bool
		want      bool
	}{
		{"", false, true},
		{"application/json", false, true},
		{"application/json, */*", false, true},
		{"application/vnd.kubernetes.protobuf, application/json", false, true},
		{"application/vnd.kubernetes.protobuf;q=0.5, application/json;q=0.9", false, true},
		{"*/*", false, true},
		{"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", true, true},
		// kube-apiserver answers 406 for a wildcard subtype.
		{"application/*", false, false},
		{"application/json;charset=utf-8", false, false},
		// A parameter of a newer API (KEP-5958) must reach kube-apiserver.
		{"application/json;drop=metadata.managedFields", false, false},
		{"application/json;as=Table;g=meta.k8s.io;v=v1", false, false},
		{"Application/JSON", false, false},
		{"application/yaml", false, false},
		{"text/plain", false, false},
		{"application/json,", false, false},
		{"application/json;stream=watch", false, false},
		{"application/cbor", false, false},
	}
	for _, tt := range cases {
		if got := answerableAccept(tt.accept, tt.transform); got != tt.want {
			t.Errorf("answerableAccept(%q, transform %v) = %v, want %v", tt.accept, tt.transform, got, tt.want)
		}
	}

	// Two Accept headers: kube-apiserver reads the first; the cache does
	// not guess.
	r := httptest.NewRequest("GET", "/api/v1/services", nil)
	r.Header.Add("Accept", "application/json")
	r.Header.Add("Accept", "application/yaml")
	if _, _, reason := negotiateShape(r, true, "list"); reason != reasonMediaType {
		t.Errorf("two Accept headers: reason %q, want %q", reason, reasonMediaType)
	}
}
