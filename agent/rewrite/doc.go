// Package rewrite renames API groups, kinds, resources and metadata keys
// in Kubernetes API requests and answers, for the callers of a rewrite
// profile (agent/apis/rewrite/v1alpha1), so that a vendored operator can
// run against renamed copies of its custom resources.
//
// The mapping is a swap, its own inverse: a renamed group's original
// and target exchange places, every kind K of either side exchanges with
// Prefix+K, every resource r with prefix+r, and the keys of one domain with
// those of another. Renaming a request and restoring an answer are
// therefore one and the same function, and restoring what was renamed
// gives back the input exactly, for every input, by construction (the
// fuzz tests check it). The few names a plain prefix cannot swap (a kind
// that already starts with the prefix) are escaped by the number of
// prefixes: see swapper.
//
// The functions work on JSON decoded as map[string]any (numbers as
// json.Number) and on JSON bytes, one object, patch or watch event at a
// time, so that a proxy can rewrite a stream frame by frame. The package
// knows nothing of HTTP: which callers, which content types and which
// requests are rewritten is the caller's decision. It imports no net/http
// (a test keeps it so); RequestPath uses net/url's Values only.
package rewrite
