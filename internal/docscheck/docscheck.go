// Package docscheck checks the project's Markdown documentation as a
// reader walks it on a git forge: README.md and every page under docs/.
// A relative link must name a file that exists, an #anchor must be a
// heading of the page it points into (with GitHub's anchor rules), and
// every page under docs/ must be reachable from README.md by links.
//
// It reads files only; it knows nothing of the agent.
package docscheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Entry is the page every other page must be reachable from.
const Entry = "README.md"

// Dir is the directory whose pages must all be reachable from Entry.
const Dir = "docs"

// Problem is one broken link or unreachable page.
type Problem struct {
	// Page is the page, relative to the repository root, with slashes.
	Page string
	// Line is the 1-based line of the link, or 0 for the page itself.
	Line int
	// Msg says what is wrong.
	Msg string
}

func (p Problem) String() string {
	if p.Line == 0 {
		return fmt.Sprintf("%s: %s", p.Page, p.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", p.Page, p.Line, p.Msg)
}

// link is one link of a page.
type link struct {
	line   int
	target string
}

// page is what Check needs of one Markdown file.
type page struct {
	anchors map[string]bool
	links   []link
}

// Check reads Entry and every .md file under Dir in the repository at root
// and returns its problems, ordered by page and line. An error is returned
// only when the files cannot be read.
func Check(root string) ([]Problem, error) {
	names := []string{Entry}
	err := filepath.WalkDir(filepath.Join(root, Dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	pages := map[string]*page{}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		pages[name] = parse(b)
	}

	var problems []Problem
	edges := map[string][]string{}
	for _, name := range names {
		for _, l := range pages[name].links {
			to, msg := resolve(root, name, l.target, pages)
			if msg != "" {
				problems = append(problems, Problem{name, l.line, msg})
			}
			if to != "" {
				edges[name] = append(edges[name], to)
			}
		}
	}

	reached := map[string]bool{Entry: true}
	queue := []string{Entry}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, to := range edges[p] {
			if !reached[to] {
				reached[to] = true
				queue = append(queue, to)
			}
		}
	}
	for _, name := range names {
		if !reached[name] {
			problems = append(problems, Problem{name, 0, "not reachable from " + Entry + " by links"})
		}
	}
	slices.SortStableFunc(problems, func(a, b Problem) int {
		if c := strings.Compare(a.Page, b.Page); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return problems, nil
}

// resolve checks target, a link of the page from, and returns the page it
// leads to (a checked .md file, for reachability) and what is wrong with
// it, if anything. Links with a scheme (https:, mailto:) are not checked.
func resolve(root, from, target string, pages map[string]*page) (string, string) {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return "", ""
	}
	file, anchor, hasAnchor := strings.Cut(target, "#")
	if strings.HasPrefix(file, "/") {
		return "", fmt.Sprintf("link %q: an absolute path does not resolve on every forge; use a relative one", target)
	}
	if file != "" {
		if f, err := url.PathUnescape(file); err == nil {
			file = f
		}
	}
	to := from
	if file != "" {
		to = path.Clean(path.Join(path.Dir(from), file))
		if to == ".." || strings.HasPrefix(to, "../") {
			return "", fmt.Sprintf("link %q leaves the repository", target)
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(to))); err != nil {
			return "", fmt.Sprintf("link %q: %s does not exist", target, to)
		}
	}
	p, ok := pages[to]
	if !ok {
		if strings.HasSuffix(to, ".md") && hasAnchor {
			// A Markdown file outside the checked set: read it for
			// its anchors.
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(to)))
			if err != nil {
				return "", fmt.Sprintf("link %q: %v", target, err)
			}
			p = parse(b)
		} else {
			return "", ""
		}
	}
	if hasAnchor && !p.anchors[anchor] {
		return to, fmt.Sprintf("link %q: no heading of %s has the anchor #%s", target, to, anchor)
	}
	if _, ok := pages[to]; !ok {
		return "", ""
	}
	return to, ""
}

var (
	// inlineLink is [text](target) or ![alt](target "title").
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// referenceDef is [label]: target.
	referenceDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	// atxHeading is a heading line: 1 to 6 #, a space, the text.
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	// headingLink is a link inside a heading, whose text is the anchor's.
	headingLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	// htmlAnchor is an explicit <a name="..."> or id="..." anchor.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// parse returns the anchors and links of a Markdown file. Lines inside
// fenced code blocks are neither headings nor links.
func parse(b []byte) *page {
	p := &page{anchors: map[string]bool{}}
	count := map[string]int{}
	var fence string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			}
			continue
		}
		if f := fenceOpening(trimmed); f != "" {
			fence = f
			continue
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			a := Anchor(m[2])
			if c := count[a]; c > 0 {
				count[a]++
				a = fmt.Sprintf("%s-%d", a, c)
			} else {
				count[a] = 1
			}
			p.anchors[a] = true
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		text := stripCodeSpans(line)
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			p.links = append(p.links, link{n, m[1]})
		}
		if m := referenceDef.FindStringSubmatch(text); m != nil {
			p.links = append(p.links, link{n, m[1]})
		}
	}
	return p
}

// stripCodeSpans returns line without its inline code, whose text is not
// Markdown: a run of backticks up to the next run of the same length.
func stripCodeSpans(line string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return b.String()
		}
		b.WriteString(line[:i])
		n := len(line[i:]) - len(strings.TrimLeft(line[i:], "`"))
		ticks, rest := line[i:i+n], line[i+n:]
		end := -1
		for j := 0; j < len(rest); {
			k := strings.Index(rest[j:], ticks)
			if k < 0 {
				break
			}
			k += j
			m := len(rest[k:]) - len(strings.TrimLeft(rest[k:], "`"))
			if m == n {
				end = k
				break
			}
			j = k + m
		}
		if end < 0 {
			// No closing run: the backticks are literal.
			b.WriteString(ticks)
			line = rest
			continue
		}
		line = rest[end+n:]
	}
}

// fenceOpening returns the fence a line opens (three or more backticks or
// tildes), or "".
func fenceOpening(trimmed string) string {
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(trimmed, c+c+c) {
			return strings.Repeat(c, len(trimmed)-len(strings.TrimLeft(trimmed, c)))
		}
	}
	return ""
}

// Anchor is the anchor GitHub gives a heading's text: the text as
// rendered (links replaced by their text, code spans by their content),
// lower case, spaces as hyphens, punctuation other than hyphens and
// underscores dropped. Duplicates get -1, -2, ... in the page's order,
// which parse adds.
func Anchor(heading string) string {
	heading = headingLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
