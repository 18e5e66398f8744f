package rewriting

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkUnselectedCaller is what the filter costs a caller no profile
// selects, against the same request without the filter: the look at its
// token's claims.
func BenchmarkUnselectedCaller(b *testing.B) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	f, err := New(Options{Profiles: testProfiles(b), Identify: (&reviewer{}).identify})
	if err != nil {
		b.Fatal(err)
	}
	tok := serviceAccountShapedToken(otherSA)
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"without profiles", next}, {"with profiles", f.Wrap(next)}} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest("GET", "/api/v1/namespaces/ns/configmaps/c", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(w, r)
			}
		})
	}
}

// serviceAccountShapedToken is a token with the claims and size of a
// kubelet-issued ServiceAccount token (about 1 kB).
func serviceAccountShapedToken(sub string) string {
	claims, _ := json.Marshal(map[string]any{
		"aud": []string{"https://kubernetes.default.svc.cluster.local"},
		"exp": 1795000000, "iat": 1794996400, "nbf": 1794996400,
		"iss": "https://kubernetes.default.svc.cluster.local",
		"jti": "3f0c6a2e-52a4-4c7b-9d0e-7b1f2a9c4e11",
		"kubernetes.io": map[string]any{
			"namespace":      "widgets",
			"node":           map[string]string{"name": "node-1", "uid": "8e7c2d8a-0a51-4a55-a1b7-2f4c9b6d0c33"},
			"pod":            map[string]string{"name": "other-7d9f8b6c5d-x2k4q", "uid": "1b2c3d4e-5f60-4718-92a3-b4c5d6e7f809"},
			"serviceaccount": map[string]string{"name": "other", "uid": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"},
			"warnafter":      1794999000,
		},
		"sub": sub,
	})
	sig := base64.RawURLEncoding.EncodeToString(make([]byte, 256))
	return "eyJhbGciOiJSUzI1NiIsImtpZCI6ImtleS0xIn0." + base64.RawURLEncoding.EncodeToString(claims) + "." + sig
}
