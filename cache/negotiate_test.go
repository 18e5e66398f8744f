package cache

import (
	"net/http/httptest"
	"testing"

	"github.com/kube-apicache/kube-apicache/cache/store"
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

// TestNegotiateShapePretty: a request kube-apiserver would answer with
// indented JSON (?pretty, or a curl, Wget or browser user agent) is
// forwarded, whether or not it asks for a transformation; so is an Accept
// header that mentions pretty printing. A plain request is answered in
// the negotiated type.
func TestNegotiateShapePretty(t *testing.T) {
	const metaJSON = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
	for _, tc := range []struct {
		name, accept, query, userAgent string
		wantMedia                      store.MediaType
		wantAs                         transform
		wantReason                     string
	}{
		{name: "plain", accept: "application/vnd.kubernetes.protobuf", wantMedia: store.MediaProtobuf},
		{name: "no Accept header", wantMedia: store.MediaJSON},
		{name: "metadata", accept: metaJSON, wantAs: asMetadata},
		{name: "?pretty", accept: "application/json", query: "pretty=true", wantReason: reasonPretty},
		{name: "?pretty, metadata", accept: metaJSON, query: "pretty=1", wantReason: reasonPretty},
		{name: "curl", accept: "application/json", userAgent: "curl/8.5.0", wantReason: reasonPretty},
		{name: "browser, metadata", accept: metaJSON, userAgent: "Mozilla/5.0 (X11)", wantReason: reasonPretty},
		{name: "Wget, no Accept header", userAgent: "Wget/1.21", wantReason: reasonPretty},
		{name: "pretty in the Accept header", accept: "application/json;as=pretty;g=meta.k8s.io;v=v1", wantReason: reasonMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api/v1/pods?"+tc.query, nil)
			if tc.accept != "" {
				r.Header.Set("Accept", tc.accept)
			}
			r.Header.Set("User-Agent", tc.userAgent)
			m, as, reason := negotiateShape(r, true, "watch")
			if m != tc.wantMedia || as != tc.wantAs || reason != tc.wantReason {
				t.Errorf("negotiateShape = %v, %v, %q; want %v, %v, %q", m, as, reason, tc.wantMedia, tc.wantAs, tc.wantReason)
			}
		})
	}
}
