// Command conformance runs a selection of the upstream Kubernetes e2e
// conformance specs (make conformance) twice, from a sandbox pod: once
// through kube-apicache, which intercepts the kubernetes Service VIP and
// caches a wide set of resources, and once straight to kube-apiserver; then
// compares the results spec by spec.
//
// Each run gets a fresh sandbox with the same objects and the agent
// running; only the suite's server differs (the VIP or kube-apiserver's own
// address). The suite authenticates as a ServiceAccount bound to
// cluster-admin. specs.txt says which specs run and why the others do not:
// the sandbox has no kubelet, so specs that run containers stay out.
//
// It prints, per run, the specs passed, failed and skipped and the wall
// time, the requests the cache answered during the agent run, and every
// spec whose result differs. It exits 1 if a spec that passed directly did
// not pass through the agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

type options struct {
	binDir  string
	outDir  string
	procs   int
	timeout time.Duration
	// focus narrows the selection to the specs it matches.
	focus *regexp.Regexp
	// runs are the runs to make, by name, in order.
	runs []Run
	// include names exclusion groups of specs.txt whose specs run anyway
	// ("all" for every group): for the slow specs, or for revisiting
	// specs.txt.
	include map[string]bool
	// list prints the selection and exits.
	list bool
	// baselineDir keeps direct runs by their stamp (baseline.go); empty:
	// the direct run always runs.
	baselineDir string
	// parallel makes the runs that run at the same time, each in its own
	// sandbox.
	parallel bool
}

var allRuns = map[string]Run{
	"direct": {Name: "direct"},
	"agent":  {Name: "agent", ViaAgent: true},
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", sandbox.DefaultBinDir(), "directory holding the control plane (make control-plane) and e2e.test, ginkgo and kubectl (hack/build-e2e-test.sh)")
	flag.StringVar(&o.outDir, "out", filepath.Join(sandbox.RepoRoot(), "_output", "conformance"), "directory for each run's JUnit report, suite output and agent log, and the summary")
	flag.IntVar(&o.procs, "procs", 8, "ginkgo processes running specs in parallel ([Serial] specs run alone at the end)")
	flag.DurationVar(&o.timeout, "timeout", time.Hour, "overall time limit; the runs share what set-up leaves of it")
	focus := flag.String("focus", "", "regular expression narrowing the selection to the specs whose full names it matches")
	runs := flag.String("runs", "direct,agent", "runs to make, in order: direct (kube-apiserver's address), agent (the Service VIP)")
	include := flag.String("include", "", "comma-separated reasons of specs.txt whose excluded specs run anyway, e.g. slow; all for every reason")
	flag.BoolVar(&o.list, "list", false, "print the selected specs and the excluded ones by reason, and exit (needs no sandbox)")
	flag.StringVar(&o.baselineDir, "baseline-cache", defaultBaselineDir(), "directory keeping direct runs by the stamp of what decides their results (e2e.test, ginkgo, the control plane, the selected specs, -procs, the sandbox's and this program's sources): a kept run with the current stamp is reused instead of a new direct run; empty: always run")
	flag.BoolVar(&o.parallel, "parallel", false, "make the runs at the same time, each in its own sandbox (each with -procs processes)")
	flag.Parse()
	var err error
	if o.focus, err = regexp.Compile(*focus); err != nil {
		fatalf(2, "-focus: %v", err)
	}
	for _, name := range strings.Split(*runs, ",") {
		r, ok := allRuns[strings.TrimSpace(name)]
		if !ok {
			fatalf(2, "-runs: unknown run %q (want direct, agent)", name)
		}
		o.runs = append(o.runs, r)
	}
	o.include = map[string]bool{}
	for _, r := range strings.Split(*include, ",") {
		if r = strings.TrimSpace(r); r != "" {
			o.include[r] = true
		}
	}
	if o.procs < 1 || o.timeout <= 0 {
		fatalf(2, "-procs and -timeout must be positive")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	code, err := run(ctx, o)
	if err != nil {
		fatalf(1, "%v", err)
	}
	os.Exit(code)
}

func fatalf(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s conformance: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// run makes the runs and reports; it returns the exit code.
func run(ctx context.Context, o options) (int, error) {
	if os.Geteuid() != 0 && !o.list {
		return 0, fmt.Errorf("needs root for the sandbox's network namespaces")
	}
	for _, b := range []string{"e2e.test", "ginkgo", "kubectl"} {
		if _, err := os.Stat(filepath.Join(o.binDir, b)); err != nil {
			return 0, fmt.Errorf("%s missing (run hack/build-e2e-test.sh): %w", b, err)
		}
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return 0, err
	}
	sel, err := ParseSelection(specsFile)
	if err != nil {
		return 0, err
	}
	if err := sel.Include(o.include); err != nil {
		return 0, err
	}
	specs, err := ListSpecs(ctx, filepath.Join(o.binDir, "e2e.test"))
	if err != nil {
		return 0, err
	}
	applied := sel.Apply(specs)
	for _, p := range applied.Unused {
		logf("specs.txt: %q matches no candidate spec", p)
	}
	if missing := missingRequired(applied.Selected); len(missing) > 0 {
		return 0, fmt.Errorf("specs.txt selects no spec for %q: the specs that found the agent's bugs must stay in the selection", missing)
	}
	var selected []string
	for _, s := range applied.Selected {
		if o.focus.MatchString(s) {
			selected = append(selected, s)
		}
	}
	if len(selected) == 0 {
		return 0, fmt.Errorf("no spec selected")
	}
	var report strings.Builder
	writeSelection(&report, applied, len(selected))
	if o.list {
		listSelection(applied, selected)
		fmt.Print(report.String())
		return 0, nil
	}
	fmt.Fprint(os.Stderr, report.String())

	tmp, err := os.MkdirTemp("", "kube-apicache-conformance-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	logf("building the agent")
	bins, err := sandbox.BuildBinaries(tmp)
	if err != nil {
		return 0, err
	}
	cfg := RunConfig{BinDir: o.binDir, AgentBin: bins.Agent, OutDir: o.outDir, Selected: selected, Procs: o.procs}
	results := map[string]*RunResult{}
	stamp := ""
	var toRun []Run
	for _, r := range o.runs {
		if r.Name == "direct" && o.baselineDir != "" {
			if stamp, err = baselineStamp(o.binDir, selected, o.procs); err != nil {
				return 0, fmt.Errorf("stamp of the direct run: %w", err)
			}
			if k := loadBaseline(o.baselineDir, stamp); k != nil {
				logf("direct run: reusing the run of %s kept under stamp %s (%s; -baseline-cache= runs it again)",
					k.Recorded.Format(time.RFC3339), stamp, o.baselineDir)
				results[r.Name] = k.Result
				continue
			}
		}
		toRun = append(toRun, r)
	}
	if err := runAll(ctx, cfg, toRun, o.parallel, results); err != nil {
		return 0, err
	}
	if res, ran := results["direct"]; ran && stamp != "" && slices.ContainsFunc(toRun, func(r Run) bool { return r.Name == "direct" }) {
		// A direct run that proves nothing (no spec passed, a required
		// spec failed) is not kept: the next run makes a new one.
		if why := unfitBaseline(res, selected); why != "" {
			logf("direct run: not kept (%s)", why)
		} else if err := saveBaseline(o.baselineDir, stamp, res); err != nil {
			logf("direct run: keeping it: %v", err)
		} else {
			logf("direct run: kept under stamp %s in %s", stamp, o.baselineDir)
		}
	}

	code := writeResults(&report, o.runs, results, selected)
	fmt.Print(report.String())
	if err := os.WriteFile(filepath.Join(o.outDir, "summary.txt"), []byte(report.String()), 0o644); err != nil {
		return 0, err
	}
	return code, nil
}

// runAll makes runs, one after another or all at once, into results. Each
// run gets an equal share of the time left (all of it when parallel), less
// what set-up and teardown take.
func runAll(ctx context.Context, cfg RunConfig, runs []Run, parallel bool, results map[string]*RunResult) error {
	timeout := func(left int) (time.Duration, error) {
		deadline, _ := ctx.Deadline()
		d := (time.Until(deadline) - 5*time.Minute) / time.Duration(left)
		if d < time.Minute {
			return 0, fmt.Errorf("no time left for %d run(s)", left)
		}
		return d, nil
	}
	if !parallel {
		for i, r := range runs {
			var err error
			if cfg.Timeout, err = timeout(len(runs) - i); err != nil {
				return err
			}
			res, err := runSuite(ctx, cfg, r)
			if err != nil {
				return fmt.Errorf("%s run: %w", r.Name, err)
			}
			results[r.Name] = res
		}
		return nil
	}
	var err error
	if cfg.Timeout, err = timeout(1); err != nil {
		return err
	}
	type done struct {
		name string
		res  *RunResult
		err  error
	}
	ch := make(chan done, len(runs))
	for _, r := range runs {
		go func() {
			res, err := runSuite(ctx, cfg, r)
			ch <- done{r.Name, res, err}
		}()
	}
	var errs []error
	for range runs {
		d := <-ch
		if d.err != nil {
			errs = append(errs, fmt.Errorf("%s run: %w", d.name, d.err))
			continue
		}
		results[d.name] = d.res
	}
	return errors.Join(errs...)
}

// unfitBaseline says why a direct run must not be kept, or "".
func unfitBaseline(res *RunResult, selected []string) string {
	passed := 0
	for _, s := range selected {
		r := res.Results[s]
		if r.Passed() {
			passed++
		} else if slices.ContainsFunc(requiredSpecs, func(re *regexp.Regexp) bool { return re.MatchString(s) }) {
			return fmt.Sprintf("required spec %q: %s", s, stateOf(r))
		}
	}
	if passed == 0 {
		return "no spec passed"
	}
	return ""
}

// writeSelection describes the selection: candidates, exclusions by reason,
// what runs.
func writeSelection(w *strings.Builder, a Applied, selected int) {
	reasons := make([]string, 0, len(a.Excluded))
	excluded := 0
	for r, specs := range a.Excluded {
		reasons = append(reasons, r)
		excluded += len(specs)
	}
	sort.Slice(reasons, func(i, j int) bool { return len(a.Excluded[reasons[i]]) > len(a.Excluded[reasons[j]]) })
	fmt.Fprintf(w, "selection: %d candidate specs, %d excluded", a.Candidates, excluded)
	for _, r := range reasons {
		fmt.Fprintf(w, " (%s %d)", r, len(a.Excluded[r]))
	}
	fmt.Fprintf(w, ", %d selected", len(a.Selected))
	if selected != len(a.Selected) {
		fmt.Fprintf(w, ", %d of them matching -focus", selected)
	}
	fmt.Fprintln(w)
}

// listSelection prints the excluded specs by reason and the selected ones.
func listSelection(a Applied, selected []string) {
	reasons := make([]string, 0, len(a.Excluded))
	for r := range a.Excluded {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Printf("excluded (%s):\n", r)
		for _, s := range a.Excluded[r] {
			fmt.Printf("  %s\n", s)
		}
	}
	fmt.Println("selected:")
	for _, s := range selected {
		fmt.Printf("  %s\n", s)
	}
}

// requiredSpecs match the specs that must run and pass in both runs: the
// two that once passed directly and failed through the agent (a cached
// list's field selector on Events, a caller with a client certificate).
var requiredSpecs = []*regexp.Regexp{
	regexp.MustCompile(`\[sig-instrumentation\] Events API should ensure that an event can be fetched, patched, deleted, and listed`),
	regexp.MustCompile(`\[sig-auth\] Certificates API \[Privileged:ClusterAdmin\] should support building a client with a CSR`),
}

// missingRequired returns the expressions of requiredSpecs that match no
// spec of selected.
func missingRequired(selected []string) []string {
	var missing []string
	for _, re := range requiredSpecs {
		if !slices.ContainsFunc(selected, re.MatchString) {
			missing = append(missing, re.String())
		}
	}
	return missing
}

// writeResults compares the runs spec by spec and returns the exit code: 1
// if a spec passed directly but not through the agent, or if the
// comparison proves nothing: the agent answered no request from its cache
// or forwarded none (the suite did not go through it), no spec passed
// directly, or a required spec (requiredSpecs) that was selected failed in
// either run.
func writeResults(w *strings.Builder, runs []Run, results map[string]*RunResult, selected []string) int {
	fmt.Fprintf(w, "\n%-7s %6s %7s %7s %8s %8s %10s\n", "run", "specs", "passed", "failed", "skipped", "set-up", "suite")
	for _, r := range runs {
		res := results[r.Name]
		var passed, failed, skipped int
		for _, s := range selected {
			switch st := res.Results[s].State; {
			case st == "passed":
				passed++
			case st == "skipped" || st == "pending":
				skipped++
			default: // failed, timedout, interrupted, panicked, aborted, or not run
				failed++
			}
		}
		fmt.Fprintf(w, "%-7s %6d %7d %7d %8d %8s %10s\n", r.Name, len(selected), passed, failed, skipped,
			res.Setup.Round(time.Second), res.Suite.Round(time.Second))
	}
	if res, ok := results["agent"]; ok {
		fmt.Fprintf(w, "\ncache (agent run): %.0f requests answered from the cache (outcome=\"hit\"), %.0f forwarded, %.0f denied\n",
			res.Cache["hit"], res.Cache["forwarded"], res.Cache["denied"])
		fmt.Fprintf(w, "  hits by resource: %s\n", topCounts(res.CacheHits, 12))
		fmt.Fprintf(w, "  forwarded by reason: %s\n", topCounts(res.Forwarded, 8))
	}
	if res, ok := results["direct"]; ok && len(results) > 1 {
		fmt.Fprintf(w, "cache (direct run, the suite bypasses the agent): %.0f hits\n", res.Cache["hit"])
	}
	direct, agent := results["direct"], results["agent"]
	if direct == nil || agent == nil {
		return 0
	}
	var regressions, gains, bothFail, vacuous []string
	passedDirect, passedAgent := 0, 0
	for _, s := range selected {
		d, a := direct.Results[s], agent.Results[s]
		if d.Passed() {
			passedDirect++
		}
		if a.Passed() {
			passedAgent++
		}
		switch {
		case d.Passed() && !a.Passed():
			regressions = append(regressions, s)
		case !d.Passed() && a.Passed():
			gains = append(gains, s)
		case !d.Passed() && !a.Passed():
			bothFail = append(bothFail, s)
		}
		if (!d.Passed() || !a.Passed()) && slices.ContainsFunc(requiredSpecs, func(re *regexp.Regexp) bool { return re.MatchString(s) }) {
			vacuous = append(vacuous, fmt.Sprintf("required spec %q did not pass in both runs (direct %s, agent %s)", s, stateOf(d), stateOf(a)))
		}
	}
	if agent.Cache["hit"] == 0 {
		vacuous = append(vacuous, "the agent answered no request from its cache")
	}
	if agent.Cache["forwarded"] == 0 {
		vacuous = append(vacuous, "the agent forwarded no request: the suite did not go through it")
	}
	if passedDirect == 0 {
		vacuous = append(vacuous, "no spec passed directly")
	}
	fmt.Fprintln(w)
	if len(regressions) == 0 && len(gains) == 0 {
		fmt.Fprintf(w, "%d specs, passed through the agent = passed directly (%d)\n", len(selected), passedAgent)
	} else {
		fmt.Fprintf(w, "%d specs, passed through the agent (%d) != passed directly (%d)\n", len(selected), passedAgent, passedDirect)
	}
	describe := func(title string, specs []string) {
		if len(specs) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s (%d):\n", title, len(specs))
		for _, s := range specs {
			fmt.Fprintf(w, "- %s\n", s)
			for _, r := range []struct {
				name string
				res  SpecResult
			}{{"direct", direct.Results[s]}, {"agent", agent.Results[s]}} {
				if !r.res.Passed() {
					fmt.Fprintf(w, "    %s: %s: %s\n", r.name, stateOf(r.res), r.res.Message)
				}
			}
		}
	}
	describe("passed directly, not through the agent", regressions)
	describe("passed through the agent, not directly", gains)
	describe("passed in neither run (specs.txt may need an entry)", bothFail)
	if len(vacuous) > 0 {
		fmt.Fprintf(w, "\nthe comparison proves nothing:\n")
		for _, v := range vacuous {
			fmt.Fprintf(w, "- %s\n", v)
		}
	}
	if len(regressions) > 0 || len(vacuous) > 0 {
		return 1
	}
	return 0
}

func stateOf(r SpecResult) string {
	if r.State == "" {
		return "not run"
	}
	return r.State
}

// topCounts formats the n largest counts, largest first.
func topCounts(m map[string]float64, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for i, k := range keys {
		if i == n {
			parts = append(parts, fmt.Sprintf("... (%d more)", len(keys)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
