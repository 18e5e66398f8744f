package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"strings"
	"time"
)

// SpecResult is one spec's outcome in a run.
type SpecResult struct {
	// State is ginkgo's: passed, failed, skipped, timedout, interrupted,
	// panicked, aborted or pending.
	State string
	// Message is the first lines of the failure, or the skip's reason.
	Message  string
	Duration time.Duration
}

// Passed reports whether the spec ran and passed.
func (r SpecResult) Passed() bool { return r.State == "passed" }

// junitSuites is the part of ginkgo's JUnit report read here.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *junitProblem `xml:"failure"`
			Error   *junitProblem `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitProblem struct {
	Message     string `xml:"message,attr"`
	Description string `xml:",chardata"`
}

// ReadJUnit returns the results of the It specs of a JUnit report written
// by the e2e suite (--report-dir), by full name. Specs the focus left out
// are in the report as skipped; callers look up the ones they ran. A
// failed suite node (BeforeSuite and the like, which make ginkgo skip
// every spec) is an error.
func ReadJUnit(path string) (map[string]SpecResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r junitSuites
	if err := xml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	out := map[string]SpecResult{}
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			name, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				if c.Failure != nil && strings.Contains(c.Name, "BeforeSuite") {
					return nil, fmt.Errorf("%s failed: %s", c.Name, failureSummary(c.Failure))
				}
				continue // other suite nodes: reports, AfterSuite
			}
			res := SpecResult{State: c.Status, Duration: time.Duration(c.Time * float64(time.Second))}
			switch {
			case c.Failure != nil:
				res.Message = failureSummary(c.Failure)
			case c.Error != nil:
				res.Message = failureSummary(c.Error)
			case c.Skipped != nil:
				res.Message = c.Skipped.Message
			}
			out[name] = res
		}
	}
	return out, nil
}

// failureSummary returns the failure's message without ginkgo's framing
// ("[FAILED] ...", then "In [It] at: <location>" and the stack), on one
// line and at most a few hundred characters long.
func failureSummary(p *junitProblem) string {
	text := p.Message
	if text == "" {
		text = p.Description
	}
	if i := strings.Index(text, "\nIn ["); i >= 0 {
		text = text[:i]
	}
	for _, prefix := range []string{"[FAILED] ", "[TIMEDOUT] ", "[INTERRUPTED] ", "[PANICKED] "} {
		text = strings.TrimPrefix(text, prefix)
	}
	text = strings.Join(strings.Fields(text), " ")
	const maxLen = 400
	if len(text) > maxLen {
		text = text[:maxLen] + "..."
	}
	return text
}
