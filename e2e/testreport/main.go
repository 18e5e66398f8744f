// Command testreport turns `go test -json` streams into what `make test`
// prints: the usual go test text while the tests run, and at the end a
// table of the phases of the run and of the slowest tests, so that each
// change sees what the suite costs and where.
//
//	go test -json ./... | testreport stream --json out.json
//	    prints what `go test` would print without -v (each package's
//	    ok/FAIL line, and the whole output of a test that failed), and
//	    copies the stream to out.json;
//	testreport summary --phases phases.tsv out.json...
//	    prints the phases (from the tab-separated lines "name, seconds,
//	    status" the test script writes), the slowest tests, what each failed
//	    test reported as errors (t.Error and t.Fatal lines, which go test
//	    -json marks apart from t.Log's), and the closing count "N passed,
//	    N failed, N skipped" over every file given.
//
// The error digest comes last but for the count because a failed run's
// test output runs to many thousand lines (sandbox logs dumped on
// failure), and whoever reads only its tail must still see why.
//
// It exits non-zero on a malformed phases file or an unreadable stream,
// never on a failed test: the test script decides the run's status.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
	// OutputType is "error" for the first line of a t.Error or t.Fatal
	// message and "error-continue" for its further lines (Go 1.25 and
	// later, with -test.v=test2json); empty for everything else.
	OutputType string
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "stream":
		err = runStream(os.Args[2:])
	case "summary":
		err = runSummary(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testreport stream [--json FILE] < go-test-json\n       testreport summary [--phases FILE] [--top N] FILE...")
	os.Exit(2)
}

func runStream(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	copyTo := fs.String("json", "", "file to copy the JSON stream to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	in := io.Reader(os.Stdin)
	if *copyTo != "" {
		f, err := os.Create(*copyTo)
		if err != nil {
			return err
		}
		defer f.Close()
		in = io.TeeReader(os.Stdin, f)
	}
	return stream(in, os.Stdout)
}

// stream writes what go test prints without -v: a test's output only when
// it failed (a parent's with its failed subtests), a package's own output
// (its ok/FAIL line, build errors, TestMain's messages) as it comes. Lines
// that are not JSON (a build failure before the test binary runs) are
// passed through.
func stream(in io.Reader, out io.Writer) error {
	held := map[string][]string{} // package + "\x00" + test -> output so far
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(out, string(line))
			continue
		}
		if e.Test == "" {
			if e.Action == "output" {
				fmt.Fprint(out, e.Output)
			}
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output":
			held[key] = append(held[key], e.Output)
		case "fail":
			// A subtest's output is printed with it; its parent's
			// follows when the parent fails in turn.
			for _, l := range held[key] {
				fmt.Fprint(out, l)
			}
			delete(held, key)
		case "pass", "skip":
			delete(held, key)
		}
	}
	return sc.Err()
}

// result is one test's outcome.
type result struct {
	Package, Test string
	Action        string
	Elapsed       time.Duration
}

// failure is a failed test, subtests included, with the error lines it
// reported.
type failure struct {
	Package, Test string
	Errors        []string
}

// phase is one line of the phases file.
type phase struct {
	Name    string
	Elapsed time.Duration
	Status  string
}

func runSummary(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ContinueOnError)
	phasesFile := fs.String("phases", "", "tab-separated phases file: name, seconds, status")
	top := fs.Int("top", 15, "number of slowest tests to list")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var phases []phase
	if *phasesFile != "" {
		var err error
		if phases, err = readPhases(*phasesFile); err != nil {
			return err
		}
	}
	var results []result
	var failures []failure
	for _, f := range fs.Args() {
		r, fl, err := readResults(f)
		if err != nil {
			return err
		}
		results = append(results, r...)
		failures = append(failures, fl...)
	}
	merged := merge(results)
	writeSummary(os.Stdout, phases, merged, *top)
	writeFailures(os.Stdout, failures)
	writeCounts(os.Stdout, merged)
	return nil
}

// merge keeps one result per test: a sharded run skips a test in every
// shard but the one that ran it, so a test's pass or fail wins over its
// skips.
func merge(results []result) []result {
	at := map[string]int{}
	var out []result
	for _, r := range results {
		key := r.Package + "\x00" + r.Test
		i, seen := at[key]
		switch {
		case !seen:
			at[key] = len(out)
			out = append(out, r)
		case out[i].Action == "skip" && r.Action != "skip":
			out[i] = r
		case r.Action == "fail":
			out[i] = r
		}
	}
	return out
}

func readPhases(path string) ([]phase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []phase
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		f := strings.Split(l, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: want name, seconds and status separated by tabs, got %q", path, i+1, l)
		}
		s, err := strconv.ParseFloat(f[1], 64)
		if err != nil || s < 0 {
			return nil, fmt.Errorf("%s:%d: bad seconds %q", path, i+1, f[1])
		}
		out = append(out, phase{Name: f[0], Elapsed: time.Duration(s * float64(time.Second)), Status: f[2]})
	}
	return out, nil
}

// readResults returns the outcome of every top-level test in a JSON
// stream, and the failed tests with their errors; a missing file (a phase
// that never ran) has none.
func readResults(path string) ([]result, []failure, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	return parseResults(f)
}

func parseResults(in io.Reader) ([]result, []failure, error) {
	var out []result
	var failed []failure
	errs := map[string][]string{} // package + "\x00" + test -> error lines
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output":
			if e.OutputType == "error" || e.OutputType == "error-continue" {
				errs[key] = append(errs[key], strings.TrimRight(e.Output, "\n"))
			}
			continue
		case "fail":
			failed = append(failed, failure{Package: e.Package, Test: e.Test, Errors: errs[key]})
		}
		delete(errs, key)
		if strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "pass", "fail", "skip":
			out = append(out, result{Package: e.Package, Test: e.Test, Action: e.Action,
				Elapsed: time.Duration(e.Elapsed * float64(time.Second))})
		}
	}
	return out, failed, sc.Err()
}

func writeSummary(w io.Writer, phases []phase, results []result, top int) {
	if len(phases) > 0 {
		fmt.Fprintln(w, "phases (wall clock; phases in one group ran at the same time):")
		fmt.Fprintf(w, "  %-36s %9s  %s\n", "PHASE", "TIME", "STATUS")
		for _, p := range phases {
			fmt.Fprintf(w, "  %-36s %9s  %s\n", p.Name, p.Elapsed.Round(time.Second), p.Status)
		}
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].Elapsed > results[j].Elapsed })
	if n := min(top, len(results)); n > 0 {
		fmt.Fprintf(w, "slowest tests (%d of %d):\n", n, len(results))
		fmt.Fprintf(w, "  %-52s %9s  %-4s  %s\n", "TEST", "TIME", "", "PACKAGE")
		for _, r := range results[:n] {
			fmt.Fprintf(w, "  %-52s %9s  %-4s  %s\n", r.Test, r.Elapsed.Round(100*time.Millisecond), r.Action, shortPackage(r.Package))
		}
	}
}

// The digest of failures is bounded, so that it stays a digest when a
// whole package fails: lines per test, tests, and characters per line.
const (
	maxErrorLines   = 12
	maxFailures     = 20
	maxErrorLineLen = 400
)

// writeFailures lists each failed test that reported errors with those
// errors, in the order the tests ended. A parent that failed only because
// a subtest did reports nothing of its own and is left out; a test that
// failed without an error line (a panic, a timeout, a build failure) is
// named with a pointer to its output.
func writeFailures(w io.Writer, failures []failure) {
	if len(failures) == 0 {
		return
	}
	parents := map[string]bool{}
	for _, f := range failures {
		for i := strings.LastIndex(f.Test, "/"); i > 0; i = strings.LastIndex(f.Test[:i], "/") {
			parents[f.Package+"\x00"+f.Test[:i]] = true
		}
	}
	fmt.Fprintln(w, "failures (t.Error and t.Fatal lines; the whole output is above):")
	shown := 0
	for _, f := range failures {
		if len(f.Errors) == 0 && parents[f.Package+"\x00"+f.Test] {
			continue
		}
		if shown == maxFailures {
			fmt.Fprintf(w, "  ... and more failed tests: see their output above\n")
			break
		}
		shown++
		fmt.Fprintf(w, "  %s (%s):\n", f.Test, shortPackage(f.Package))
		if len(f.Errors) == 0 {
			fmt.Fprintln(w, "    no error line: a panic, a timeout or a log.Fatal; see its output above")
		}
		for i, l := range f.Errors {
			if i == maxErrorLines {
				fmt.Fprintf(w, "    ... %d more lines\n", len(f.Errors)-i)
				break
			}
			l = strings.TrimSpace(l)
			if len(l) > maxErrorLineLen {
				l = l[:maxErrorLineLen] + " ..."
			}
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
}

// writeCounts writes the closing count, the last line of a run.
func writeCounts(w io.Writer, results []result) {
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Action]++
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts["pass"], counts["fail"], counts["skip"])
}

// shortPackage drops the module path.
func shortPackage(p string) string {
	return strings.TrimPrefix(strings.TrimPrefix(p, "github.com/kube-apicache/kube-apicache"), "/")
}
