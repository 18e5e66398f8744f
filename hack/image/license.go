package main

import (
	"bufio"
	"bytes"
	"os"
	"slices"
	"strings"
)

// noAssertion is SPDX's "nothing is claimed" value.
const noAssertion = "NOASSERTION"

// dep5Format starts a machine-readable Debian copyright file (DEP-5).
const dep5Format = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"

// debianToSPDX maps the license short names Debian's copyright files use
// to SPDX identifiers, for the names whose meaning is fixed. Others
// ("Artistic": which version?, "custom", "public-domain") have no SPDX
// identifier, and a package naming one gets NOASSERTION.
var debianToSPDX = map[string]string{
	"Apache-2.0":   "Apache-2.0",
	"BSD-2-clause": "BSD-2-Clause",
	"BSD-3-clause": "BSD-3-Clause",
	"Expat":        "MIT",
	"MIT":          "MIT",
	"ISC":          "ISC",
	"Zlib":         "Zlib",
	"GPL-2":        "GPL-2.0-only",
	"GPL-2.0":      "GPL-2.0-only",
	"GPL-2+":       "GPL-2.0-or-later",
	"GPL-2.0+":     "GPL-2.0-or-later",
	"GPL-3":        "GPL-3.0-only",
	"GPL-3.0":      "GPL-3.0-only",
	"GPL-3+":       "GPL-3.0-or-later",
	"GPL-3.0+":     "GPL-3.0-or-later",
	"LGPL-2":       "LGPL-2.0-only",
	"LGPL-2+":      "LGPL-2.0-or-later",
	"LGPL-2.1":     "LGPL-2.1-only",
	"LGPL-2.1+":    "LGPL-2.1-or-later",
	"LGPL-3":       "LGPL-3.0-only",
	"LGPL-3+":      "LGPL-3.0-or-later",
}

// debianLicense reads a package's copyright file (usr/share/doc/PKG/copyright)
// and returns the license short names of its License fields in order of
// first appearance, and their conjunction as an SPDX license expression
// ("GPL-2.0-or-later AND LGPL-2.1-only"). Only DEP-5 files are read: the
// others (glibc's, gcc's) are prose, and their packages get NOASSERTION
// and no names. So does a package with a name debianToSPDX does not know;
// its names are still returned, for a comment.
func debianLicense(copyright []byte) (expr string, names []string) {
	if !bytes.HasPrefix(copyright, []byte(dep5Format)) && !bytes.HasPrefix(copyright, []byte(strings.Replace(dep5Format, "https:", "http:", 1))) {
		return noAssertion, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(copyright))
	sc.Buffer(nil, 1<<20)
	var terms []string
	known := true
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "License:")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "" || slices.Contains(names, v) {
			continue
		}
		names = append(names, v)
		term, ok := spdxTerm(v)
		if !ok {
			known = false
			continue
		}
		if !slices.Contains(terms, term) {
			terms = append(terms, term)
		}
	}
	if !known || len(terms) == 0 {
		return noAssertion, names
	}
	if len(terms) == 1 {
		return strings.Trim(terms[0], "()"), names
	}
	return strings.Join(terms, " AND "), names
}

// spdxTerm translates one DEP-5 License value ("GPL-2+", "GPL-2+ or
// Artistic-2.0", "LGPL-2.1 and BSD-3-clause") into an SPDX expression,
// parenthesized when compound. Exceptions ("with ... exception") and
// unknown names fail.
func spdxTerm(v string) (string, bool) {
	words := strings.Fields(strings.ReplaceAll(v, ",", " "))
	var out []string
	for i, w := range words {
		if i%2 == 1 {
			switch strings.ToLower(w) {
			case "or":
				out = append(out, "OR")
			case "and":
				out = append(out, "AND")
			default:
				return "", false
			}
			continue
		}
		id, ok := debianToSPDX[w]
		if !ok {
			return "", false
		}
		out = append(out, id)
	}
	if len(out) == 0 || len(out)%2 == 0 {
		return "", false
	}
	if len(out) == 1 {
		return out[0], true
	}
	return "(" + strings.Join(out, " ") + ")", true
}

// readCopyright returns the copyright file of package pkg in the root file
// system root (symlinks resolved inside it: libgcc-s1's doc directory is a
// link to gcc-12-base's), or nil if there is none.
func readCopyright(root, pkg string) []byte {
	host, err := resolveIn(root, "/usr/share/doc/"+pkg+"/copyright")
	if err != nil {
		return nil
	}
	b, err := os.ReadFile(host)
	if err != nil {
		return nil
	}
	return b
}
