package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// TestREADMELayoutCurrent: the README's Layout table has one row for each
// package of the module (`go list ./...`), and every path it names exists.
func TestREADMELayoutCurrent(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the packages with")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	if end := strings.Index(layout, "\n## "); end >= 0 {
		layout = layout[:end]
	}
	rows := map[string]bool{}
	for line := range strings.Lines(layout) {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, f := range strings.Split(cells[1], ",") {
			path := strings.Trim(strings.TrimSpace(f), "`")
			rows[path] = true
			if _, err := os.Stat(filepath.Join("../..", path)); err != nil {
				t.Errorf("the Layout table names %s, which does not exist", path)
			}
		}
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{.Dir}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(out)) {
		_, dir, _ := strings.Cut(strings.TrimSpace(line), " ")
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !rows[filepath.ToSlash(rel)] {
			t.Errorf("package %s has no row in the README's Layout table", filepath.ToSlash(rel))
		}
	}
}

// TestHelpListsSubcommands: the agent's --help names each subcommand
// with its one-line summary, and not the hidden docs command.
func TestHelpListsSubcommands(t *testing.T) {
	cmd := newCommand()
	var b bytes.Buffer
	cmd.SetOut(&b)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, name := range []string{"approver", "cleanup", "status", "diff", "version"} {
		sub, _, err := cmd.Find([]string{name})
		if err != nil || sub == cmd {
			t.Fatalf("no subcommand %q", name)
		}
		if line := fmt.Sprintf("  %-10s %s\n", name, sub.Short); !strings.Contains(out, line) {
			t.Errorf("--help lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "  docs ") || !strings.Contains(out, "Node and cluster flags:") {
		t.Errorf("--help lists the hidden docs command, or lost its flag sections:\n%s", out)
	}
}
