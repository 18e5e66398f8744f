// Package apidiff compares two answers to the same Kubernetes API read: the
// one a kube-apicache agent gave and the one kube-apiserver gave directly.
// It knows nothing of how the answers were obtained.
//
// The rules, for answers given moments apart:
//
//   - The status codes must be equal; when they are not, nothing else is
//     compared.
//   - The media types must be equal. JSON bodies, and protobuf bodies of
//     built-in types (decoded to JSON), are compared field by field; any
//     other body byte for byte.
//   - A list (an object with items) or a Table (rows) is compared item by
//     item, each keyed by its namespace/name: an item on one side only, a
//     field that differs within an item, and a different order of the
//     items are differences. The list's own resourceVersion, and its
//     continue token when both have one, are those of each read: that they
//     differ is a note, not a difference. A Table's Age cells are not
//     compared.
//   - Any other object is compared as a whole, its resourceVersion
//     included.
//
// A difference inside an object whose resourceVersions differ, or an item
// on one side only, may come from a change made between the two reads
// rather than from a wrong answer: Difference.Changed says so, and
// Result.Changed tells the caller to read again.
package apidiff

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes/scheme"
)

// Response is one answer.
type Response struct {
	Code        int
	ContentType string
	Body        []byte
}

// Difference is one place where the answers differ.
type Difference struct {
	// Path names the place: "code", "Content-Type", "body", or a JSON path
	// such as items[default/web-1].metadata.labels.app.
	Path string
	// Agent and Direct are each answer's value there as compact JSON, or
	// Absent.
	Agent, Direct string
	// Changed: the difference is in an object whose resourceVersion differs
	// between the answers, or in an item only one answer has, so a change
	// between the two reads may explain it.
	Changed bool
}

// Absent stands for a value one answer does not have.
const Absent = "<absent>"

// Result is the outcome of Compare.
type Result struct {
	Differences []Difference
	// Notes say what differs legitimately, or how the bodies were compared.
	Notes []string
	// Items is the number of items (or rows) of each answer, -1 when an
	// answer is not a list.
	AgentItems, DirectItems int
}

// Changed reports whether some difference may come from a change between
// the two reads (Difference.Changed): a second read may not show it.
func (r Result) Changed() bool {
	return slices.ContainsFunc(r.Differences, func(d Difference) bool { return d.Changed })
}

// Compare compares the agent's answer with kube-apiserver's.
func Compare(agent, direct Response) Result {
	c := &comparer{res: Result{AgentItems: -1, DirectItems: -1}}
	if agent.Code != direct.Code {
		c.add("code", strconv.Itoa(agent.Code), strconv.Itoa(direct.Code), false)
		c.add("body", summary(agent), summary(direct), false)
		return c.res
	}
	am, dm := mediaType(agent.ContentType), mediaType(direct.ContentType)
	if am != dm {
		c.add("Content-Type", quote(agent.ContentType), quote(direct.ContentType), false)
		return c.res
	}
	a, aerr := decode(agent)
	d, derr := decode(direct)
	if aerr != nil || derr != nil {
		if !bytes.Equal(agent.Body, direct.Body) {
			c.add("body", fmt.Sprintf("%d bytes", len(agent.Body)), fmt.Sprintf("%d bytes", len(direct.Body)), false)
		}
		why := aerr
		if why == nil {
			why = derr
		}
		c.res.Notes = append(c.res.Notes, "bodies compared byte for byte: "+why.Error())
		return c.res
	}
	c.top(a, d)
	return c.res
}

type comparer struct {
	res Result
}

func (c *comparer) add(path, agent, direct string, changed bool) {
	c.res.Differences = append(c.res.Differences, Difference{Path: path, Agent: agent, Direct: direct, Changed: changed})
}

// top compares two decoded bodies: as lists or Tables where both are, else
// as objects.
func (c *comparer) top(a, d any) {
	am, aok := a.(map[string]any)
	dm, dok := d.(map[string]any)
	if aok && dok {
		for _, field := range []string{"items", "rows"} {
			ai, aList := am[field].([]any)
			di, dList := dm[field].([]any)
			if field == "rows" && (am["kind"] != "Table" || dm["kind"] != "Table") {
				continue
			}
			if (aList || am[field] == nil) && (dList || dm[field] == nil) && (aList || dList) {
				c.list(field, am, dm, ai, di)
				return
			}
		}
	}
	c.walk("", a, d, resourceVersion(a) != resourceVersion(d))
}

// list compares two lists (field "items") or Tables (field "rows").
func (c *comparer) list(field string, a, d map[string]any, aItems, dItems []any) {
	c.res.AgentItems, c.res.DirectItems = len(aItems), len(dItems)
	a, d = withoutReadState(a, field), withoutReadState(d, field)
	if rvA, rvD := listMeta(a, "resourceVersion"), listMeta(d, "resourceVersion"); rvA != rvD {
		c.res.Notes = append(c.res.Notes, fmt.Sprintf("list resourceVersion: agent %s, direct %s (each read's own; not a difference)", quote(rvA), quote(rvD)))
	}
	contA, contD := listMeta(a, "continue"), listMeta(d, "continue")
	if (contA == "") != (contD == "") {
		c.add("metadata.continue", quote(contA), quote(contD), false)
	}
	for _, m := range []map[string]any{a, d} {
		if md, ok := m["metadata"].(map[string]any); ok {
			delete(md, "resourceVersion")
			delete(md, "continue")
		}
	}
	if field == "rows" {
		aItems, dItems = withoutAge(a, aItems), withoutAge(d, dItems)
	}
	c.walk("", a, d, false)

	aKeys, aByKey := keyed(field, aItems)
	dKeys, dByKey := keyed(field, dItems)
	var aCommon, dCommon []string
	for _, k := range aKeys {
		if _, ok := dByKey[k]; !ok {
			c.add(itemPath(field, k), present(aByKey[k]), Absent, true)
			continue
		}
		aCommon = append(aCommon, k)
	}
	for _, k := range dKeys {
		if _, ok := aByKey[k]; !ok {
			c.add(itemPath(field, k), Absent, present(dByKey[k]), true)
			continue
		}
		dCommon = append(dCommon, k)
	}
	if !slices.Equal(aCommon, dCommon) {
		c.add(field+" (order)", orderSample(aCommon, dCommon), orderSample(dCommon, aCommon), false)
	}
	for _, k := range dCommon {
		ai, di := aByKey[k], dByKey[k]
		c.walk(itemPath(field, k), ai, di, resourceVersion(ai) != resourceVersion(di))
	}
}

// walk compares a and d at path; changed marks the differences it finds.
func (c *comparer) walk(path string, a, d any, changed bool) {
	am, aok := a.(map[string]any)
	dm, dok := d.(map[string]any)
	if aok && dok {
		keys := make([]string, 0, len(am)+len(dm))
		for k := range am {
			keys = append(keys, k)
		}
		for k := range dm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			av, ainside := am[k]
			dv, dinside := dm[k]
			p := fieldPath(path, k)
			switch {
			case !ainside:
				c.add(p, Absent, render(dv), changed)
			case !dinside:
				c.add(p, render(av), Absent, changed)
			default:
				c.walk(p, av, dv, changed)
			}
		}
		return
	}
	as, aok := a.([]any)
	ds, dok := d.([]any)
	if aok && dok {
		for i := range max(len(as), len(ds)) {
			p := path + "[" + strconv.Itoa(i) + "]"
			switch {
			case i >= len(as):
				c.add(p, Absent, render(ds[i]), changed)
			case i >= len(ds):
				c.add(p, render(as[i]), Absent, changed)
			default:
				c.walk(p, as[i], ds[i], changed)
			}
		}
		return
	}
	if ra, rd := render(a), render(d); ra != rd {
		if path == "" {
			path = "body"
		}
		c.add(path, ra, rd, changed)
	}
}

// keyed returns the keys of items in order and the items by key: their
// namespace/name (name alone when cluster-scoped), or for a Table's rows
// that of the row's object. An item without a name, or whose key repeats,
// is keyed by its index.
func keyed(field string, items []any) ([]string, map[string]any) {
	keys := make([]string, 0, len(items))
	byKey := make(map[string]any, len(items))
	for i, item := range items {
		obj := item
		if field == "rows" {
			if m, ok := item.(map[string]any); ok {
				obj = m["object"]
			}
		}
		k := objectKey(obj)
		if _, dup := byKey[k]; k == "" || dup {
			k = "#" + strconv.Itoa(i)
		}
		keys = append(keys, k)
		byKey[k] = item
	}
	return keys, byKey
}

func objectKey(obj any) string {
	m, _ := obj.(map[string]any)
	md, _ := m["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if name == "" {
		return ""
	}
	if ns, _ := md["namespace"].(string); ns != "" {
		return ns + "/" + name
	}
	return name
}

// itemPath is items[namespace/name], or items[3] for an item keyed by its
// index.
func itemPath(field, key string) string {
	if i, ok := strings.CutPrefix(key, "#"); ok {
		return field + "[" + i + "]"
	}
	return field + "[" + key + "]"
}

// present describes an item one answer has and the other does not.
func present(item any) string {
	if rv := resourceVersion(item); rv != "" {
		return "present (resourceVersion " + rv + ")"
	}
	if m, ok := item.(map[string]any); ok {
		if rv := resourceVersion(m["object"]); rv != "" {
			return "present (resourceVersion " + rv + ")"
		}
	}
	return "present"
}

// orderSample shows where the order of keys first departs from other's.
func orderSample(keys, other []string) string {
	i := 0
	for i < len(keys) && i < len(other) && keys[i] == other[i] {
		i++
	}
	end := min(i+3, len(keys))
	s := strings.Join(keys[i:end], ", ")
	if end < len(keys) {
		s += ", ..."
	}
	return fmt.Sprintf("from item %d: %s", i, s)
}

// withoutReadState returns a shallow copy of a list without its items and
// with a copy of its metadata, which list then edits.
func withoutReadState(list map[string]any, field string) map[string]any {
	out := make(map[string]any, len(list))
	for k, v := range list {
		if k == field {
			continue
		}
		out[k] = v
	}
	if md, ok := list["metadata"].(map[string]any); ok {
		cp := make(map[string]any, len(md))
		for k, v := range md {
			cp[k] = v
		}
		out["metadata"] = cp
	}
	return out
}

// withoutAge returns rows without the cells of the Table's Age column,
// which tells the time of each read.
func withoutAge(table map[string]any, rows []any) []any {
	cols, _ := table["columnDefinitions"].([]any)
	age := slices.IndexFunc(cols, func(c any) bool {
		m, _ := c.(map[string]any)
		return m["name"] == "Age"
	})
	if age < 0 {
		return rows
	}
	out := make([]any, len(rows))
	for i, r := range rows {
		m, ok := r.(map[string]any)
		cells, cok := m["cells"].([]any)
		if !ok || !cok || age >= len(cells) {
			out[i] = r
			continue
		}
		cp := make(map[string]any, len(m))
		for k, v := range m {
			cp[k] = v
		}
		cp["cells"] = slices.Delete(slices.Clone(cells), age, age+1)
		out[i] = cp
	}
	return out
}

func listMeta(list map[string]any, field string) string {
	md, _ := list["metadata"].(map[string]any)
	s, _ := md[field].(string)
	return s
}

func resourceVersion(obj any) string {
	m, _ := obj.(map[string]any)
	md, _ := m["metadata"].(map[string]any)
	s, _ := md["resourceVersion"].(string)
	return s
}

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// fieldPath appends key to path: .key, or ["key"] where key has dots,
// slashes or the like (label keys).
func fieldPath(path, key string) string {
	if !plainKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// maxValue bounds a rendered value.
const maxValue = 200

// render is v as compact JSON, shortened to maxValue bytes.
func render(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return shorten(string(b))
}

func quote(s string) string { return shorten(strconv.Quote(s)) }

func shorten(s string) string {
	if len(s) <= maxValue {
		return s
	}
	return s[:maxValue] + "..."
}

// summary describes a body for a differing status code: a Status's reason
// and message, another object's kind, else the body's first bytes.
func summary(r Response) string {
	var st struct {
		Kind    string `json:"kind"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	switch {
	case json.Unmarshal(r.Body, &st) != nil:
		return quote(string(r.Body))
	case st.Kind == "Status":
		return shorten(fmt.Sprintf("Status %s: %s", st.Reason, st.Message))
	case st.Kind != "":
		return fmt.Sprintf("%s, %d bytes", st.Kind, len(r.Body))
	}
	return quote(string(r.Body))
}

func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(contentType))
	}
	return mt
}

// errNotStructured: the body is neither JSON nor protobuf of a built-in
// type.
type errNotStructured string

func (e errNotStructured) Error() string { return string(e) }

// decode returns a JSON or protobuf body as generic JSON (numbers kept
// as json.Number, so they compare as written).
func decode(r Response) (any, error) {
	mt := mediaType(r.ContentType)
	var body []byte
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		body = r.Body
	case mt == "application/vnd.kubernetes.protobuf":
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(r.Body, nil, nil)
		if err != nil {
			return nil, errNotStructured("protobuf not decodable as a built-in type: " + err.Error())
		}
		obj.GetObjectKind().SetGroupVersionKind(*gvk)
		if body, err = json.Marshal(obj); err != nil {
			return nil, err
		}
	default:
		return nil, errNotStructured(fmt.Sprintf("media type %q is neither JSON nor protobuf", mt))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, errNotStructured("body is not JSON: " + err.Error())
	}
	return v, nil
}
