package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kube-apicache/kube-apicache/agent/version"
)

// newVersionCommand returns `kube-apicache version`.
func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:           "version",
		Short:         "Print the version, commit and Go version",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "":
				fmt.Fprintln(cmd.OutOrStdout(), info)
			case "json":
				b, err := json.MarshalIndent(info, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			default:
				return fmt.Errorf("--output %q: must be json or empty", output)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: empty for one line, or json.")
	return cmd
}
