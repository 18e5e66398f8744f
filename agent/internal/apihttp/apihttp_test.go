package apihttp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRequestKinds: a request's kind as kube-apiserver tells it, from the
// RequestInfo WithRequestInfo puts in its context and from its headers.
func TestRequestKinds(t *testing.T) {
	for _, tc := range []struct {
		method, target, upgrade  string
		watch, longRunning, upgr bool
	}{
		{http.MethodGet, "/api/v1/namespaces/a/pods", "", false, false, false},
		{http.MethodGet, "/api/v1/namespaces/a/pods?watch=true", "", true, true, false},
		{http.MethodGet, "/api/v1/namespaces/a/pods/p/log", "", false, true, false},
		{http.MethodPost, "/api/v1/namespaces/a/pods/p/exec", "SPDY/3.1", false, true, true},
		{http.MethodPost, "/api/v1/namespaces/a/configmaps", "", false, false, false},
		{http.MethodGet, "/healthz", "", false, false, false},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if tc.upgrade != "" {
			r.Header.Set("Connection", "keep-alive, Upgrade")
			r.Header.Set("Upgrade", tc.upgrade)
		}
		var watch, longRunning bool
		WithRequestInfo(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			watch, longRunning = IsWatch(r), IsLongRunning(r)
		})).ServeHTTP(httptest.NewRecorder(), r)
		if watch != tc.watch || longRunning != tc.longRunning || IsUpgrade(r) != tc.upgr {
			t.Errorf("%s %s: watch %t, long-running %t, upgrade %t; want %t, %t, %t",
				tc.method, tc.target, watch, longRunning, IsUpgrade(r), tc.watch, tc.longRunning, tc.upgr)
		}
	}
}

// TestWriteStatus: an error is answered as kube-apiserver answers it, a
// metav1.Status with its code, in the negotiated encoding.
func TestWriteStatus(t *testing.T) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/a/pods", nil)
	r.Header.Set("Accept", "application/json")
	WriteStatus(w, r, apierrors.NewTooManyRequests("slow down", 1))
	var st metav1.Status
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("not a Status: %v: %s", err, w.Body)
	}
	if w.Code != http.StatusTooManyRequests || st.Code != http.StatusTooManyRequests || st.Reason != metav1.StatusReasonTooManyRequests ||
		w.Header().Get("Retry-After") != "1" || st.Kind != "Status" {
		t.Errorf("got %d %+v (Retry-After %q)", w.Code, st, w.Header().Get("Retry-After"))
	}
}

// TestStatusRecorder: the first final code is the one recorded; a body
// without one is a 200.
func TestStatusRecorder(t *testing.T) {
	rec := &StatusRecorder{ResponseWriter: httptest.NewRecorder()}
	if rec.Code() != 0 {
		t.Fatalf("code %d before any", rec.Code())
	}
	rec.WriteHeader(http.StatusContinue)
	rec.WriteHeader(http.StatusNotFound)
	if rec.Code() != http.StatusNotFound {
		t.Errorf("code %d, want 404 (a 100 is not final)", rec.Code())
	}
	rec = &StatusRecorder{ResponseWriter: httptest.NewRecorder()}
	_, _ = rec.Write([]byte("ok"))
	if rec.Code() != http.StatusOK {
		t.Errorf("code %d after a body, want 200", rec.Code())
	}
}
