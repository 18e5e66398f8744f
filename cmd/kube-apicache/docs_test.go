package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestREADMEReferenceCurrent: the README's generated sections (each
// command's --help and the configuration reference) are what the code
// generates now; `make docs` rewrites them.
func TestREADMEReferenceCurrent(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	updated, err := updateDocs(readme, generatedDocs(newCommand()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readme, updated) {
		t.Errorf("README.md's generated reference is out of date: run `make docs`")
	}
}

// TestHelpSections: --help groups the flags into named sections, and every
// flag a configuration field names exists on the agent or the approver.
func TestHelpSections(t *testing.T) {
	docs := generatedDocs(newCommand())
	for _, section := range []string{"Node and cluster flags:", "Interception flags:", "Cache flags:", "Metrics and health flags:", "Logging flags:"} {
		if !strings.Contains(docs[docsFlags], section) {
			t.Errorf("--help has no section %q", section)
		}
	}
	if strings.Contains(docs[docsFlags], "--liveness-timeout") {
		t.Errorf("--help lists the deprecated --liveness-timeout")
	}
	if !strings.Contains(docs[docsConfig], "`cluster.serviceVIPs`") || !strings.Contains(docs[docsConfig], "agent, approver") {
		t.Errorf("configuration reference lacks cluster.serviceVIPs read by both commands:\n%s", docs[docsConfig])
	}
}
