package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsReferenceCurrent: the reference pages' generated sections (each
// command's --help and the configuration reference) are what the code
// generates now; `make docs` rewrites them.
func TestDocsReferenceCurrent(t *testing.T) {
	for page, sections := range pageSections(generatedDocs(newCommand())) {
		path := filepath.Join("../../docs", filepath.FromSlash(page))
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		updated, err := updateDocs(old, sections)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !bytes.Equal(old, updated) {
			t.Errorf("docs/%s's generated reference is out of date: run `make docs`", page)
		}
	}
}

// TestDocsStale: a page whose generated section differs from the code's is
// rewritten, so TestDocsReferenceCurrent can fail; a page without the
// markers is an error.
func TestDocsStale(t *testing.T) {
	stale := []byte("# Flags\n\n<!-- BEGIN GENERATED flags (make docs) -->\nold\n<!-- END GENERATED flags -->\n")
	updated, err := updateDocs(stale, map[string]string{docsFlags: "new\n"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Flags\n\n<!-- BEGIN GENERATED flags (make docs) -->\nnew\n<!-- END GENERATED flags -->\n"; string(updated) != want {
		t.Errorf("updated page:\n%s\nwant:\n%s", updated, want)
	}
	if _, err := updateDocs([]byte("# Flags\n"), map[string]string{docsFlags: "new\n"}); err == nil {
		t.Error("a page without the generated section's markers: no error")
	}
}

// TestDocsCommand: `kube-apicache docs --dir` writes every generated page
// of a copy of the documentation, which then passes the check above.
func TestDocsCommand(t *testing.T) {
	dir := t.TempDir()
	for _, page := range docsPages {
		b, err := os.ReadFile(filepath.Join("../../docs", filepath.FromSlash(page)))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("```\n<!-- END"), []byte("stale\n```\n<!-- END"))
		path := filepath.Join(dir, filepath.FromSlash(page))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := newCommand()
	cmd.SetArgs([]string{"docs", "--dir", dir})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for page, sections := range pageSections(generatedDocs(newCommand())) {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(page)))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("stale")) {
			t.Errorf("%s still holds the stale text", page)
		}
		updated, err := updateDocs(b, sections)
		if err != nil || !bytes.Equal(b, updated) {
			t.Errorf("%s is not current after kube-apicache docs (%v)", page, err)
		}
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

// TestLayoutCurrent: the Layout table of docs/development/design.md has one
// row for each package of the module (`go list ./...`), and every path it
// names exists.
func TestLayoutCurrent(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the packages with")
	}
	design, err := os.ReadFile("../../docs/development/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(design), "\n## Layout\n")
	if !ok {
		t.Fatal("docs/development/design.md has no Layout section")
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
			t.Errorf("package %s has no row in the Layout table of docs/development/design.md", filepath.ToSlash(rel))
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
	for _, name := range []string{"approver", "cleanup", "status", "diff", "version", "webhook-proxy"} {
		sub, _, err := cmd.Find([]string{name})
		if err != nil || sub == cmd {
			t.Fatalf("no subcommand %q", name)
		}
		// The summaries start in one column, after the longest name.
		line := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` +` + regexp.QuoteMeta(sub.Short) + `$`)
		if !line.MatchString(out) {
			t.Errorf("--help lacks %q's line with its summary %q:\n%s", name, sub.Short, out)
		}
	}
	if !strings.Contains(out, "  approver      Approve") {
		t.Errorf("--help's summaries are not in one column:\n%s", out)
	}
	if strings.Contains(out, "  docs ") || !strings.Contains(out, "Node and cluster flags:") {
		t.Errorf("--help lists the hidden docs command, or lost its flag sections:\n%s", out)
	}
}
