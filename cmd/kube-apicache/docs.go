package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
)

// helpColumns is the width --help and the generated reference wrap at.
const helpColumns = 100

// Generated sections of README.md, each between a begin and an end marker.
const (
	docsFlags  = "flags"
	docsConfig = "config"
)

// newDocsCommand returns `kube-apicache docs`, which writes the reference
// sections of README.md from the code: the --help of each command and the
// configuration file's fields. `make docs` runs it; a unit test fails when
// the README is out of date.
func newDocsCommand(root *cobra.Command) *cobra.Command {
	var readme string
	cmd := &cobra.Command{
		Use:           "docs",
		Short:         "Regenerate the flag and configuration references in README.md",
		Hidden:        true,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			old, err := os.ReadFile(readme)
			if err != nil {
				return err
			}
			updated, err := updateDocs(old, generatedDocs(root))
			if err != nil {
				return fmt.Errorf("%s: %w", readme, err)
			}
			if bytes.Equal(old, updated) {
				return nil
			}
			return os.WriteFile(readme, updated, 0o644)
		},
	}
	cmd.Flags().StringVar(&readme, "readme", "README.md", "The README to update in place.")
	return cmd
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
	approver, cleanup, diff := sub("approver"), sub("cleanup"), sub("diff")
	var flags strings.Builder
	for _, c := range []*cobra.Command{root, approver, cleanup, diff} {
		fmt.Fprintf(&flags, "`%s --help`:\n\n```\n", c.CommandPath())
		var b bytes.Buffer
		c.SetOut(&b)
		_ = c.Help()
		c.SetOut(nil)
		for line := range strings.Lines(strings.TrimRight(b.String(), "\n")) {
			flags.WriteString(strings.TrimRight(line, " \n") + "\n")
		}
		flags.WriteString("```\n\n")
	}
	config := configv1alpha1.Reference([]configv1alpha1.Reader{
		{Name: "agent", Flags: root.Flags()},
		{Name: "approver", Flags: approver.Flags(), Sections: approverSections},
		{Name: "cleanup", Flags: cleanup.Flags(), Sections: cleanupSections},
	})
	return map[string]string{
		docsFlags:  strings.TrimRight(flags.String(), "\n") + "\n",
		docsConfig: config,
	}
}

// updateDocs replaces the body of each generated section of readme.
func updateDocs(readme []byte, sections map[string]string) ([]byte, error) {
	out := string(readme)
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
