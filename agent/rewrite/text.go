package rewrite

import (
	"regexp"
	"strings"
)

// Text rewrites the names in a message or a Warning header's text:
// "<resource>.<group>" (widgets.example.com "x" not found),
// "<Kind>.<group>" (Widget.example.com "x" is invalid), a bare group, and
// "<group>/<version> <Kind>" (example.com/v1 Widget is deprecated), and
// the resource of a Forbidden message (cannot get resource "widgets" in
// API group "example.com"). Words
// are runs of letters, digits, '.', '-', '/' and '*'; a sentence's final dot is
// not part of one. Text of other groups is returned as it is.
//
// A Warning header's whole value (299 - "text") may be passed as it is.
//
// Text is free-form, so this is a best effort: a word that is both a
// renamed group and "<resource>.<other renamed group>" is read as the
// group.
func (r *Rewriter) Text(s string) string {
	if len(r.groups) == 0 {
		return s
	}
	// The resource of a Forbidden phrase is swapped apart, and the words
	// around it as words: a resource read as a word could be taken for a
	// group on the way back.
	var b strings.Builder
	last := 0
	if strings.Contains(s, "in API group") {
		for _, m := range forbiddenRE.FindAllStringSubmatchIndex(s, -1) {
			res, group := s[m[2]:m[3]], s[m[4]:m[5]]
			b.WriteString(r.words(s[last:m[2]]))
			if r.Renamed(group) {
				res = r.resourceName(res)
			}
			b.WriteString(res)
			last = m[3]
		}
	}
	b.WriteString(r.words(s[last:]))
	return b.String()
}

// words rewrites the words of a text.
func (r *Rewriter) words(s string) string {
	var b strings.Builder
	kindNext := false // the previous word was a renamed group/version
	i := 0
	for i < len(s) {
		if !isWordChar(s[i]) {
			if s[i] != ' ' {
				kindNext = false
			}
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && isWordChar(s[j]) {
			j++
		}
		word := s[i:j]
		trail := ""
		for strings.HasSuffix(word, ".") {
			word = word[:len(word)-1]
			trail += "."
		}
		out, gv := r.word(word, kindNext)
		b.WriteString(out)
		b.WriteString(trail)
		kindNext = gv && trail == ""
		i = j
	}
	return b.String()
}

// word rewrites one word of a text; gv says whether it was a renamed
// group/version, after which a kind may follow.
func (r *Rewriter) word(w string, kindNext bool) (string, bool) {
	if kindNext && w != "" && isUpper(w[0]) && !strings.ContainsAny(w, "./") {
		return r.kinds.swap(w), false
	}
	if r.Renamed(w) {
		return r.groups[w], false
	}
	if g, rest, ok := strings.Cut(w, "/"); ok && r.Renamed(g) {
		return r.groups[g] + "/" + rest, !strings.Contains(rest, "/")
	}
	for _, g := range r.groupNames {
		if name, ok := strings.CutSuffix(w, "."+g); ok && name != "" && !strings.ContainsAny(name, "./") {
			if isUpper(name[0]) {
				return r.kinds.swap(name) + "." + r.groups[g], false
			}
			return r.resources.swap(name) + "." + r.groups[g], false
		}
	}
	return w, false
}

func isWordChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '/' || c == '*'
}

// forbiddenRE matches the resource and group of kube-apiserver's
// Forbidden message: cannot list resource "widgets" in API group
// "example.com".
var forbiddenRE = regexp.MustCompile(`resource "([^"]*)" in API group "([^"]*)"`)
