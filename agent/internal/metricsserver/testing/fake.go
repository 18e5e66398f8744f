// Package testing has a fake kube-apiserver for tests of metrics
// listeners: one that answers TokenReviews and SubjectAccessReviews only.
package testing

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
)

// Reviewer is a kube-apiserver that answers TokenReviews and
// SubjectAccessReviews only, and counts them.
type Reviewer struct {
	// Users maps a token to the user it authenticates as; any other token
	// is rejected with an error, as kube-apiserver rejects a made-up one.
	Users map[string]string
	// Allowed maps a user to the non-resource paths it may get; a path
	// ending in * allows every path it prefixes.
	Allowed map[string][]string

	mu                 sync.Mutex // protects the fields below
	tokenReviews, sars int
	reviewedUsers      []string
}

// Start serves f until the test ends and returns a client configuration
// for it.
func (f *Reviewer) Start(t testing.TB) *rest.Config {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

func (f *Reviewer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		f.tokenReviews++
		var tr authenticationv1.TokenReview
		_ = json.NewDecoder(r.Body).Decode(&tr)
		if name, ok := f.Users[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: name, Groups: []string{"system:authenticated"}}}
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		_ = json.NewEncoder(w).Encode(&tr)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		f.sars++
		var sar authorizationv1.SubjectAccessReview
		_ = json.NewDecoder(r.Body).Decode(&sar)
		f.reviewedUsers = append(f.reviewedUsers, sar.Spec.User)
		if a := sar.Spec.NonResourceAttributes; a != nil && a.Verb == "get" {
			for _, p := range f.Allowed[sar.Spec.User] {
				if p == a.Path || (strings.HasSuffix(p, "*") && strings.HasPrefix(a.Path, strings.TrimSuffix(p, "*"))) {
					sar.Status.Allowed = true
				}
			}
		}
		_ = json.NewEncoder(w).Encode(&sar)
	default:
		http.NotFound(w, r)
	}
}

// Counts returns the TokenReviews and SubjectAccessReviews answered so far.
func (f *Reviewer) Counts() (tokenReviews, sars int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenReviews, f.sars
}

// ReviewedUsers returns the users of the SubjectAccessReviews answered so
// far, in order.
func (f *Reviewer) ReviewedUsers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reviewedUsers)
}
