package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDebianLicense(t *testing.T) {
	tests := []struct {
		name      string
		copyright string
		wantExpr  string
		wantNames []string
	}{
		{
			// libmnl0's: each License once, in order, ANDed.
			name:      "DEP-5, known names",
			copyright: dep5Format + "\n\nFiles: *\nLicense: LGPL-2.1\n\nFiles: debian/*\nLicense: GPL-2+\n\nLicense: LGPL-2.1\n text\n\nLicense: GPL-2+\n text\n",
			wantExpr:  "LGPL-2.1-only AND GPL-2.0-or-later",
			wantNames: []string{"LGPL-2.1", "GPL-2+"},
		},
		{
			name:      "one name",
			copyright: dep5Format + "\n\nFiles: *\nLicense: GPL-2\n",
			wantExpr:  "GPL-2.0-only",
			wantNames: []string{"GPL-2"},
		},
		{
			// iptables': "Artistic" has no version, "custom" no identifier.
			name:      "unknown names",
			copyright: dep5Format + "\n\nFiles: *\nLicense: GPL-2\n\nFiles: x\nLicense: Artistic\n\nFiles: y\nLicense: custom\n",
			wantExpr:  noAssertion,
			wantNames: []string{"GPL-2", "Artistic", "custom"},
		},
		{
			name:      "a disjunction",
			copyright: dep5Format + "\n\nFiles: *\nLicense: GPL-2+ or BSD-3-clause\n\nFiles: x\nLicense: ISC\n",
			wantExpr:  "(GPL-2.0-or-later OR BSD-3-Clause) AND ISC",
			wantNames: []string{"GPL-2+ or BSD-3-clause", "ISC"},
		},
		{
			name:      "an exception",
			copyright: dep5Format + "\n\nFiles: *\nLicense: GPL-3+ with GCC-exception-3.1\n",
			wantExpr:  noAssertion,
			wantNames: []string{"GPL-3+ with GCC-exception-3.1"},
		},
		{
			// glibc's and gcc's copyright files are prose.
			name:      "not DEP-5",
			copyright: "This is the Debian prepackaged version of the GNU C Library.\nLicense: LGPL-2.1\n",
			wantExpr:  noAssertion,
		},
		{
			name:     "no file",
			wantExpr: noAssertion,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expr, names := debianLicense([]byte(tt.copyright))
			if expr != tt.wantExpr {
				t.Errorf("expression %q, want %q", expr, tt.wantExpr)
			}
			if diff := cmp.Diff(tt.wantNames, names); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
		})
	}
}
