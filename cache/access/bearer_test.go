package access

import (
	"context"
	"net/http"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
)

// TestBearerTokenMatchesKubeAPIServer: the token the cache reviews is the one
// kube-apiserver's own bearer token authenticator would authenticate, for
// every spelling of the Authorization header; where kube-apiserver would
// review no token, neither does the cache.
func TestBearerTokenMatchesKubeAPIServer(t *testing.T) {
	headers := [][]string{
		nil,
		{""},
		{"Bearer tok"},
		{"bearer tok"},
		{"BEARER tok"},
		{"BeArEr tok"},
		{"Bearer "},
		{"Bearer"},
		{"Bearer  tok"},
		{"Bearer tok extra"},
		{"  Bearer tok  "},
		{"Bearer\ttok"},
		{"Basic dXNlcjpwYXNz"},
		{"Bearertok"},
		{"Bearer tok", "Bearer other"},
		{"Bearer a.b.c"},
	}
	for _, values := range headers {
		h := http.Header{}
		for _, v := range values {
			h.Add("Authorization", v)
		}
		var seen string
		var called bool
		oracle := bearertoken.New(authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
			seen, called = token, true
			return &authenticator.Response{User: &user.DefaultInfo{Name: "x"}}, true, nil
		}))
		// The authenticator removes the header it accepted; give it a copy.
		req := (&http.Request{Header: h.Clone()}).WithContext(context.Background())
		_, _, _ = oracle.AuthenticateRequest(req)

		got, ok := BearerToken(h)
		if ok != called || got != seen {
			t.Errorf("Authorization %q: BearerToken = %q, %v; kube-apiserver reviews %q, %v", values, got, ok, seen, called)
		}
	}
}
