package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A stream of two packages: one passing with a passing test, one failing
// with a failed subtest (two error lines and a log line), a passing test,
// a test that panicked and a skipped one.
const sample = `{"Action":"start","Package":"example.com/m/a"}
{"Action":"run","Package":"example.com/m/a","Test":"TestOK"}
{"Action":"output","Package":"example.com/m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"example.com/m/a","Test":"TestOK","Output":"    ok_test.go:9: quiet\n"}
{"Action":"pass","Package":"example.com/m/a","Test":"TestOK","Elapsed":1.5}
{"Action":"output","Package":"example.com/m/a","Output":"ok  \texample.com/m/a\t1.6s\n"}
{"Action":"pass","Package":"example.com/m/a","Elapsed":1.6}
{"Action":"run","Package":"example.com/m/b","Test":"TestBad"}
{"Action":"output","Package":"example.com/m/b","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"run","Package":"example.com/m/b","Test":"TestBad/sub"}
{"Action":"output","Package":"example.com/m/b","Test":"TestBad/sub","Output":"    bad_test.go:12: want 1, got 2\n","OutputType":"error"}
{"Action":"output","Package":"example.com/m/b","Test":"TestBad/sub","Output":"        and a second line\n","OutputType":"error-continue"}
{"Action":"output","Package":"example.com/m/b","Test":"TestBad/sub","Output":"    bad_test.go:13: logged, not an error\n"}
{"Action":"fail","Package":"example.com/m/b","Test":"TestBad/sub","Elapsed":0.2}
{"Action":"output","Package":"example.com/m/b","Test":"TestBad","Output":"--- FAIL: TestBad (30.00s)\n"}
{"Action":"fail","Package":"example.com/m/b","Test":"TestBad","Elapsed":30}
{"Action":"pass","Package":"example.com/m/b","Test":"TestFine","Elapsed":3}
{"Action":"run","Package":"example.com/m/b","Test":"TestPanics"}
{"Action":"output","Package":"example.com/m/b","Test":"TestPanics","Output":"panic: boom\n"}
{"Action":"fail","Package":"example.com/m/b","Test":"TestPanics","Elapsed":0.1}
{"Action":"skip","Package":"example.com/m/b","Test":"TestSkipped","Elapsed":0}
{"Action":"output","Package":"example.com/m/b","Output":"FAIL\texample.com/m/b\t33.3s\n"}
{"Action":"fail","Package":"example.com/m/b","Elapsed":33.3}
not json: a build error
`

// stream prints package lines and a failed test's output, never a passing
// test's, and passes lines that are not JSON through.
func TestStream(t *testing.T) {
	var out strings.Builder
	if err := stream(strings.NewReader(sample), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"ok  \texample.com/m/a\t1.6s\n", "bad_test.go:12: want 1, got 2", "--- FAIL: TestBad (30.00s)", "FAIL\texample.com/m/b", "not json: a build error"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
}

// The summary lists phases, the slowest top-level tests first, and the
// closing count.
func TestSummary(t *testing.T) {
	results, _, err := parseResults(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 5 {
		t.Fatalf("results = %+v, want 5 top-level tests", results)
	}
	var out strings.Builder
	writeSummary(&out, []phase{{Name: "builds", Elapsed: 90 * time.Second, Status: "ok"}}, results, 2)
	got := out.String()
	bad, fine := strings.Index(got, "TestBad"), strings.Index(got, "TestFine")
	if bad < 0 || fine < 0 || fine < bad {
		t.Errorf("want TestBad listed before TestFine:\n%s", got)
	}
	if strings.Contains(got, "TestOK") {
		t.Errorf("want only the 2 slowest tests:\n%s", got)
	}
	writeCounts(&out, results)
	got = out.String()
	for _, want := range []string{"builds", "1m30s", "2 passed, 2 failed, 1 skipped\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

// A malformed phases line is an error naming the line; a missing stream
// file is no result.
func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "phases.tsv")
	if err := os.WriteFile(p, []byte("builds\t12.5\tok\nunit\tx\tok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readPhases(p); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("readPhases = %v, want an error for line 2", err)
	}
	if r, f, err := readResults(filepath.Join(dir, "missing.json")); err != nil || r != nil || f != nil {
		t.Errorf("readResults(missing) = %v, %v, %v", r, f, err)
	}
}

// A test skipped by the shards that did not run it counts once, with the
// result of the shard that did.
func TestMergeShards(t *testing.T) {
	got := merge([]result{
		{Package: "p", Test: "TestA", Action: "skip"},
		{Package: "p", Test: "TestB", Action: "pass", Elapsed: time.Second},
		{Package: "p", Test: "TestA", Action: "pass", Elapsed: time.Minute},
		{Package: "p", Test: "TestB", Action: "skip"},
		{Package: "p", Test: "TestC", Action: "skip"},
		{Package: "p", Test: "TestC", Action: "skip"},
	})
	want := []result{
		{Package: "p", Test: "TestA", Action: "pass", Elapsed: time.Minute},
		{Package: "p", Test: "TestB", Action: "pass", Elapsed: time.Second},
		{Package: "p", Test: "TestC", Action: "skip"},
	}
	if len(got) != len(want) {
		t.Fatalf("merge = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("merge[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// The digest names each failed test with its error lines and nothing it
// only logged; a parent failed only by its subtest is left out, a test
// that failed without an error line is named.
func TestFailures(t *testing.T) {
	_, failures, err := parseResults(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	writeFailures(&out, failures)
	got := out.String()
	want := `failures (t.Error and t.Fatal lines; the whole output is above):
  TestBad/sub (m/b):
    bad_test.go:12: want 1, got 2
    and a second line
  TestPanics (m/b):
    no error line: a panic, a timeout or a log.Fatal; see its output above
`
	got = strings.ReplaceAll(got, "example.com/", "")
	if got != want {
		t.Errorf("digest:\n%s\nwant:\n%s", got, want)
	}

	// Bounded: lines per test, and tests.
	var many []failure
	for i := range 30 {
		many = append(many, failure{Package: "p", Test: fmt.Sprintf("Test%d", i), Errors: make([]string, 20)})
	}
	out.Reset()
	writeFailures(&out, many)
	got = out.String()
	if n := strings.Count(got, "... 8 more lines"); n != maxFailures {
		t.Errorf("%d tests had their lines cut, want %d:\n%s", n, maxFailures, got)
	}
	if !strings.Contains(got, "and more failed tests") || strings.Contains(got, "Test20 ") {
		t.Errorf("want the digest cut after %d tests:\n%s", maxFailures, got)
	}
}
