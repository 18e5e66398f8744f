package docscheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRepositoryDocs: README.md and every page under docs/ have no broken
// relative link or anchor, and every page is reachable from README.md.
func TestRepositoryDocs(t *testing.T) {
	problems, err := Check("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheck runs the checker on small trees, each with a doc comment per
// scenario, and compares the problems it reports.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{{
		// A tree whose links, anchors and reachability all hold:
		// duplicate headings take -1, punctuation and code marks drop
		// out of anchors, a heading inside a code block is no heading,
		// links in code are no links, and other schemes are not checked.
		name: "clean",
		files: map[string]string{
			"README.md":                 "# Project\n\nSee [the docs](docs/README.md), [usage](#usage-and-more) and [again](#usage-and-more-1).\n\n## Usage, and more!\n\n## Usage and more\n\n`[not a link](nowhere.md)` and [a site](https://example.com/x.md#y).\n",
			"docs/README.md":            "# Index\n\n- [Alerts](operations/alerts.md#kubeapicachedown)\n- [Flags](reference/flags.md#kube-apicache-approver)\n- [Source](../main.go)\n",
			"docs/operations/alerts.md": "# Alerts\n\n[Index](../README.md)\n\n```\n# not a heading\n```\n\n## KubeApicacheDown\n",
			"docs/reference/flags.md":   "# Flags\n\n## `kube-apicache approver`\n\n[Index](../README.md#index)\n",
			"main.go":                   "package main\n",
		},
	}, {
		// A missing file, a missing anchor in another page and in the
		// same page, a heading that only exists in a code block, and
		// the duplicate suffix beyond the duplicates there are.
		name: "broken",
		files: map[string]string{
			"README.md":      "# Project\n\n[a](docs/README.md) [b](docs/missing.md) [c](docs/README.md#nope)\n[d](#project-1) [e](#in-code)\n\n```sh\n# in code\n```\n",
			"docs/README.md": "# Index\n",
		},
		want: []string{
			`README.md:3: link "docs/missing.md": docs/missing.md does not exist`,
			`README.md:3: link "docs/README.md#nope": no heading of docs/README.md has the anchor #nope`,
			`README.md:4: link "#project-1": no heading of README.md has the anchor #project-1`,
			`README.md:4: link "#in-code": no heading of README.md has the anchor #in-code`,
		},
	}, {
		// A page under docs/ that no chain of links from README.md
		// reaches, even though another unreachable page links to it.
		name: "unreachable",
		files: map[string]string{
			"README.md":          "# Project\n\n[Docs](docs/README.md)\n",
			"docs/README.md":     "# Index\n\n[Back](../README.md)\n",
			"docs/orphan.md":     "# Orphan\n\n[Other](other/page.md)\n",
			"docs/other/page.md": "# Page\n",
		},
		want: []string{
			"docs/orphan.md: not reachable from README.md by links",
			"docs/other/page.md: not reachable from README.md by links",
		},
	}, {
		// Links that leave the repository or are absolute paths.
		name: "outside",
		files: map[string]string{
			"README.md":      "# Project\n\n[Docs](docs/README.md) [up](../elsewhere.md) [abs](/docs/README.md)\n",
			"docs/README.md": "# Index\n",
		},
		want: []string{
			`README.md:3: link "../elsewhere.md" leaves the repository`,
			`README.md:3: link "/docs/README.md": an absolute path does not resolve on every forge; use a relative one`,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, text := range tc.files {
				p := filepath.Join(dir, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			problems, err := Check(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.String())
			}
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestAnchor: GitHub's anchors of headings.
func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Interception and fail-open":                   "interception-and-fail-open",
		"Degraded mode: every kube-apiserver down":     "degraded-mode-every-kube-apiserver-down",
		"The agent's own identity and RBAC":            "the-agents-own-identity-and-rbac",
		"Bring your own certificate (cert-manager)":    "bring-your-own-certificate-cert-manager",
		"`kube-apicache approver`":                     "kube-apicache-approver",
		"Is it working?":                               "is-it-working",
		"kube_apicache_intercepting":                   "kube_apicache_intercepting",
		"See [the signer](certificates.md#the-signer)": "see-the-signer",
	} {
		if got := Anchor(heading); got != want {
			t.Errorf("Anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}
