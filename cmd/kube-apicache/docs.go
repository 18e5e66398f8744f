package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
)

// helpColumns is the width --help and the generated reference wrap at.
const helpColumns = 100

// Generated sections of the documentation, each between a begin and an end
// marker in the page docsPages names.
const (
	docsFlags  = "flags"
	docsConfig = "config"
	docsCLI    = "cli"
)

// docsPages is the page, relative to the documentation's directory, that
// holds each generated section.
var docsPages = map[string]string{
	docsFlags:  "reference/flags.md",
	docsConfig: "reference/config.md",
	docsCLI:    "reference/cli.md",
}

// newDocsCommand returns `kube-apicache docs`, which writes the reference
// pages' generated sections from the code: the --help of each command and
// the configuration file's fields. `make docs` runs it; a unit test fails
// when a page is out of date.
func newDocsCommand(root *cobra.Command) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:           "docs",
		Short:         "Regenerate the flag, configuration and command references under docs/",
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sections := generatedDocs(root)
			for _, page := range slices.Sorted(maps.Keys(pageSections(sections))) {
				path := filepath.Join(dir, filepath.FromSlash(page))
				old, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				updated, err := updateDocs(old, pageSections(sections)[page])
				if err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				if bytes.Equal(old, updated) {
					continue
				}
				if err := os.WriteFile(path, updated, 0o644); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "docs", "The documentation's directory, whose reference pages are updated in place.")
	return cmd
}

// pageSections groups the generated sections by the page that holds them.
func pageSections(sections map[string]string) map[string]map[string]string {
	pages := map[string]map[string]string{}
	for name, body := range sections {
		page := docsPages[name]
		if pages[page] == nil {
			pages[page] = map[string]string{}
		}
		pages[page][name] = body
	}
	return pages
}

// generatedDocs renders each generated section.
func generatedDocs(root *cobra.Command) map[string]string {
	sub := func(name string) *cobra.Command {
		c, _, err := root.Find([]string{name})
		if err != nil || c == root {
			panic(fmt.Sprintf("no subcommand %q", name))
		}
		return c
	}
	approver, cleanup := sub("approver"), sub("cleanup")
	var flags strings.Builder
	writeHelp(&flags, root)
	var cli strings.Builder
	for _, c := range root.Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		fmt.Fprintf(&cli, "## `%s`\n\n%s.", c.CommandPath(), c.Short)
		if c.Hidden {
			cli.WriteString(" Hidden from `kube-apicache --help`.")
		}
		cli.WriteString("\n\n")
		writeHelp(&cli, c)
	}
	config := configv1alpha1.Reference([]configv1alpha1.Reader{
		{Name: "agent", Flags: root.Flags()},
		{Name: "approver", Flags: approver.Flags(), Sections: approverSections},
		{Name: "cleanup", Flags: cleanup.Flags(), Sections: cleanupSections},
	})
	return map[string]string{
		docsFlags:  strings.TrimRight(flags.String(), "\n") + "\n",
		docsConfig: config,
		docsCLI:    strings.TrimRight(cli.String(), "\n") + "\n",
	}
}

// writeHelp writes c's --help as a code block, trailing spaces trimmed.
func writeHelp(w *strings.Builder, c *cobra.Command) {
	fmt.Fprintf(w, "`%s --help`:\n\n```\n", c.CommandPath())
	var b bytes.Buffer
	c.SetOut(&b)
	_ = c.Help()
	c.SetOut(nil)
	for line := range strings.Lines(strings.Trim(b.String(), "\n")) {
		w.WriteString(strings.TrimRight(line, " \n") + "\n")
	}
	w.WriteString("```\n\n")
}

// updateDocs replaces the body of each generated section of page.
func updateDocs(page []byte, sections map[string]string) ([]byte, error) {
	out := string(page)
	for name, body := range sections {
		re := regexp.MustCompile(`(?s)(<!-- BEGIN GENERATED ` + name + ` [^>]*-->\n).*?(<!-- END GENERATED ` + name + ` -->)`)
		if !re.MatchString(out) {
			return nil, fmt.Errorf("no generated section %q (<!-- BEGIN GENERATED %s ... --> ... <!-- END GENERATED %s -->)", name, name, name)
		}
		out = re.ReplaceAllStringFunc(out, func(m string) string {
			sub := re.FindStringSubmatch(m)
			return sub[1] + body + sub[2]
		})
	}
	return []byte(out), nil
}
