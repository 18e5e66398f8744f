package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A kept direct run is found again under its stamp only, and a run that
// proves nothing is not fit to keep.
func TestBaselineKeep(t *testing.T) {
	dir := t.TempDir()
	res := &RunResult{
		Results: map[string]SpecResult{"a": {State: "passed", Duration: time.Second}, "b": {State: "failed", Message: "boom"}},
		Setup:   time.Minute, Suite: 5 * time.Minute, Cache: map[string]float64{"hit": 0},
	}
	if err := saveBaseline(dir, "s1", res); err != nil {
		t.Fatal(err)
	}
	k := loadBaseline(dir, "s1")
	if k == nil || k.Result.Results["a"].State != "passed" || k.Result.Results["b"].Message != "boom" || k.Result.Suite != 5*time.Minute {
		t.Fatalf("loadBaseline(s1) = %+v", k)
	}
	if k := loadBaseline(dir, "s2"); k != nil {
		t.Errorf("loadBaseline(s2) = %+v, want none", k)
	}
	// A damaged file is no baseline (a new direct run), not an error.
	if err := os.WriteFile(filepath.Join(dir, "s1", baselineFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k := loadBaseline(dir, "s1"); k != nil {
		t.Errorf("loadBaseline(damaged) = %+v, want none", k)
	}
	if err := saveBaseline(dir, "s3", &RunResult{}); err == nil {
		t.Error("saveBaseline kept a run with no results")
	}

	if why := unfitBaseline(res, []string{"a", "b"}); why != "" {
		t.Errorf("unfitBaseline = %q, want fit (a spec passed, none required)", why)
	}
	if why := unfitBaseline(res, []string{"b"}); why == "" {
		t.Error("a run where no selected spec passed was fit to keep")
	}
	required := "[sig-auth] Certificates API [Privileged:ClusterAdmin] should support building a client with a CSR"
	res.Results[required] = SpecResult{State: "failed"}
	if why := unfitBaseline(res, []string{"a", required}); why == "" {
		t.Error("a run where a required spec failed was fit to keep")
	}
}

// The stamp changes with the selection and the binaries.
func TestBaselineStamp(t *testing.T) {
	bin := t.TempDir()
	for _, b := range []string{"e2e.test", "ginkgo", "kube-apiserver", "kube-controller-manager", "etcd"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte(b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s1, err := baselineStamp(bin, []string{"a", "b"}, 8)
	if err != nil {
		t.Fatal(err)
	}
	if s2, _ := baselineStamp(bin, []string{"a"}, 8); s2 == s1 {
		t.Error("stamp unchanged by the selection")
	}
	if s2, _ := baselineStamp(bin, []string{"a", "b"}, 4); s2 == s1 {
		t.Error("stamp unchanged by -procs")
	}
	if err := os.WriteFile(filepath.Join(bin, "kube-apiserver"), []byte("rebuilt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if s2, _ := baselineStamp(bin, []string{"a", "b"}, 8); s2 == s1 {
		t.Error("stamp unchanged by a new kube-apiserver")
	}
	if err := os.Remove(filepath.Join(bin, "etcd")); err != nil {
		t.Fatal(err)
	}
	if _, err := baselineStamp(bin, nil, 8); err == nil {
		t.Error("stamp without etcd: want an error")
	}
}
