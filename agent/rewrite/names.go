package rewrite

import "strings"

// swapper exchanges names with their prefixed form: s with prefix+s, and
// back. Plain prefixing is not a permutation of all strings (nothing
// would map to a name that already starts with the prefix), so a name is
// seen as prefix repeated n times before a root that does not start with
// the prefix, and n is swapped within pairs: 0↔1, 2↔3 and so on. Roots the
// swapper must leave alone (keep) shift the pairs by one: n=0 stays, 1↔2,
// 3↔4. Either way swap(swap(x)) == x for every x, and for every ordinary
// name (no prefix) swap is plain prefixing. Names containing "*" are
// wildcards and never change.
type swapper struct {
	prefix string
	// keep says which roots stay as they are (n=0).
	keep func(root string) bool
}

func (s swapper) swap(x string) string {
	if s.prefix == "" || strings.Contains(x, "*") {
		return x
	}
	n, root := 0, x
	for strings.HasPrefix(root, s.prefix) {
		root = root[len(s.prefix):]
		n++
	}
	var m int
	if s.keep(root) {
		switch {
		case n == 0:
			return x
		case n%2 == 1:
			m = n + 1
		default:
			m = n - 1
		}
	} else if n%2 == 0 {
		m = n + 1
	} else {
		m = n - 1
	}
	return strings.Repeat(s.prefix, m) + root
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// kindSwapper swaps kinds: names that start with an upper-case letter.
// Other strings in a kind's place are left alone, so that a kind stays a
// kind.
func kindSwapper(prefix string) swapper {
	return swapper{prefix: prefix, keep: func(root string) bool {
		return root == "" || !isUpper(root[0])
	}}
}

// resourceSwapper swaps resource names, singular and short names and
// categories: names that do not start with an upper-case letter, except
// the kept ones.
func resourceSwapper(prefix string, keep map[string]bool) swapper {
	return swapper{prefix: prefix, keep: func(root string) bool {
		return root == "" || isUpper(root[0]) || keep[root]
	}}
}
