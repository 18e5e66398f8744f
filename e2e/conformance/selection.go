package main

import (
	"bufio"
	"context"
	_ "embed"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// specsFile is the checked-in selection: which upstream specs run, and why
// the others do not. See the file's header for its syntax.
//
//go:embed specs.txt
var specsFile string

// suiteDescription is what the e2e suite passes to ginkgo.RunSpecs. Ginkgo
// matches --focus against it and a spec's full name, joined by a space.
const suiteDescription = "Kubernetes e2e suite"

// Selection is a parsed specs.txt.
type Selection struct {
	// Focus selects the candidate specs: a spec is a candidate if any
	// expression matches it.
	Focus []string
	// Exclusions take candidates out again, each for its reason.
	Exclusions []Exclusion
}

// Exclusion is one reason to leave specs out, with the expressions of the
// specs it applies to.
type Exclusion struct {
	// Reason is a short name, Summary one line of why.
	Reason, Summary string
	Patterns        []string
}

// ParseSelection parses the syntax of specs.txt:
//
//	# a comment (only at the start of a line)
//	focus REGEXP
//	skip REASON: SUMMARY
//	REGEXP
//	REGEXP
//
// Every line after a skip line, up to the next focus or skip line, is an
// expression of that exclusion. Expressions are Go regular expressions,
// matched against a spec's full name as e2e.test --list-tests prints it.
func ParseSelection(text string) (*Selection, error) {
	s := &Selection{}
	var cur *Exclusion
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var pattern string
		switch {
		case strings.HasPrefix(line, "focus "):
			pattern, cur = strings.TrimSpace(strings.TrimPrefix(line, "focus ")), nil
			s.Focus = append(s.Focus, pattern)
		case strings.HasPrefix(line, "skip "):
			reason, summary, ok := strings.Cut(strings.TrimPrefix(line, "skip "), ":")
			if !ok || strings.TrimSpace(reason) == "" {
				return nil, fmt.Errorf("specs.txt:%d: want \"skip REASON: SUMMARY\"", n)
			}
			s.Exclusions = append(s.Exclusions, Exclusion{Reason: strings.TrimSpace(reason), Summary: strings.TrimSpace(summary)})
			cur = &s.Exclusions[len(s.Exclusions)-1]
			continue
		case cur == nil:
			return nil, fmt.Errorf("specs.txt:%d: an expression outside a skip group", n)
		default:
			pattern = line
			cur.Patterns = append(cur.Patterns, pattern)
		}
		if _, err := regexp.Compile(pattern); err != nil {
			return nil, fmt.Errorf("specs.txt:%d: %w", n, err)
		}
	}
	if len(s.Focus) == 0 {
		return nil, fmt.Errorf("specs.txt: no focus line")
	}
	return s, sc.Err()
}

// Include drops the exclusions whose reasons are in reasons, or every one
// if reasons has "all", so that their specs run.
func (s *Selection) Include(reasons map[string]bool) error {
	known := map[string]bool{"all": true}
	var kept []Exclusion
	for _, e := range s.Exclusions {
		known[e.Reason] = true
		if !reasons[e.Reason] && !reasons["all"] {
			kept = append(kept, e)
		}
	}
	for r := range reasons {
		if !known[r] {
			return fmt.Errorf("no exclusion reason %q in specs.txt", r)
		}
	}
	s.Exclusions = kept
	return nil
}

// FocusExpr returns the ginkgo --focus expression that runs exactly specs
// (full names).
func FocusExpr(specs []string) string {
	alts := make([]string, len(specs))
	for i, spec := range specs {
		alts[i] = "^" + regexp.QuoteMeta(suiteDescription+" "+spec) + "$"
	}
	return strings.Join(alts, "|")
}

// Applied is a selection applied to the suite's specs.
type Applied struct {
	// Candidates is how many specs the focus matched.
	Candidates int
	// Selected are the specs that run, sorted.
	Selected []string
	// Excluded maps a reason to the candidates it took out (each under the
	// first exclusion that matches it).
	Excluded map[string][]string
	// Unused lists expressions that match no candidate: stale entries.
	Unused []string
}

// Apply selects among specs (full names).
func (s *Selection) Apply(specs []string) Applied {
	focus := regexp.MustCompile(strings.Join(s.Focus, "|"))
	type compiled struct {
		reason, pattern string
		re              *regexp.Regexp
		used            bool
	}
	var skips []*compiled
	for _, e := range s.Exclusions {
		for _, p := range e.Patterns {
			skips = append(skips, &compiled{reason: e.Reason, pattern: p, re: regexp.MustCompile(p)})
		}
	}
	a := Applied{Excluded: map[string][]string{}}
	for _, spec := range specs {
		if !focus.MatchString(spec) {
			continue
		}
		a.Candidates++
		excluded := false
		for _, sk := range skips {
			if !sk.re.MatchString(spec) {
				continue
			}
			if !excluded {
				a.Excluded[sk.reason] = append(a.Excluded[sk.reason], spec)
				excluded = true
			}
			sk.used = true
		}
		if !excluded {
			a.Selected = append(a.Selected, spec)
		}
	}
	for _, sk := range skips {
		if !sk.used {
			a.Unused = append(a.Unused, sk.pattern)
		}
	}
	sort.Strings(a.Selected)
	return a
}

// listLine is one line of e2e.test --list-tests: "  file.go:123: full name".
var listLine = regexp.MustCompile(`^\s*\S+\.go:\d+: (.+)$`)

// ListSpecs returns the full names of every spec e2e.test holds. Listing
// needs no cluster.
func ListSpecs(ctx context.Context, e2eTest string) ([]string, error) {
	out, err := exec.CommandContext(ctx, e2eTest, "--list-tests").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-tests: %w", e2eTest, err)
	}
	var specs []string
	for _, line := range strings.Split(string(out), "\n") {
		if m := listLine.FindStringSubmatch(line); m != nil {
			specs = append(specs, m[1])
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%s --list-tests listed no specs", e2eTest)
	}
	return specs, nil
}
