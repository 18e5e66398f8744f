package apidiff

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func jsonResponse(body string) Response {
	return Response{Code: 200, ContentType: "application/json", Body: []byte(body)}
}

const (
	podsAt100 = `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"100"},"items":[
		{"metadata":{"name":"web-0","namespace":"default","resourceVersion":"7","labels":{"app":"x"}}},
		{"metadata":{"name":"web-1","namespace":"default","resourceVersion":"8","labels":{"app":"x","app.kubernetes.io/name":"web"}}}]}`
	podsAt105 = `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"105"},"items":[
		{"metadata":{"name":"web-0","namespace":"default","resourceVersion":"7","labels":{"app":"x"}}},
		{"metadata":{"name":"web-1","namespace":"default","resourceVersion":"8","labels":{"app":"x","app.kubernetes.io/name":"web"}}}]}`
)

// TestCompare: each rule of Compare, one scenario each.
func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name          string
		agent, direct Response
		want          []Difference
		// note is a substring of a note, when one is expected.
		note string
	}{{
		// A list's own resourceVersion is each read's: only a note.
		name:   "list resourceVersion only",
		agent:  jsonResponse(podsAt100),
		direct: jsonResponse(podsAt105),
		note:   `list resourceVersion: agent "100", direct "105"`,
	}, {
		// A label that differs in an item of the same resourceVersion is
		// a difference at its path, not taken for a concurrent change.
		name:   "planted label",
		agent:  jsonResponse(strings.Replace(podsAt100, `"labels":{"app":"x","app.kubernetes`, `"labels":{"app":"z","app.kubernetes`, 1)),
		direct: jsonResponse(podsAt105),
		want:   []Difference{{Path: "items[default/web-1].metadata.labels.app", Agent: `"z"`, Direct: `"x"`}},
	}, {
		// A key with dots and slashes is quoted in the path.
		name:   "label key with a slash",
		agent:  jsonResponse(strings.Replace(podsAt100, `"app.kubernetes.io/name":"web"`, `"app.kubernetes.io/name":"api"`, 1)),
		direct: jsonResponse(podsAt100),
		want:   []Difference{{Path: `items[default/web-1].metadata.labels["app.kubernetes.io/name"]`, Agent: `"api"`, Direct: `"web"`}},
	}, {
		// An item whose resourceVersion differs: its differences are
		// marked Changed, so that the caller reads again.
		name:   "concurrent change",
		agent:  jsonResponse(podsAt100),
		direct: jsonResponse(strings.Replace(podsAt105, `"resourceVersion":"8","labels":{"app":"x"`, `"resourceVersion":"9","labels":{"app":"y"`, 1)),
		want: []Difference{
			{Path: "items[default/web-1].metadata.labels.app", Agent: `"x"`, Direct: `"y"`, Changed: true},
			{Path: "items[default/web-1].metadata.resourceVersion", Agent: `"8"`, Direct: `"9"`, Changed: true},
		},
	}, {
		// An item on one side only.
		name:  "missing item",
		agent: jsonResponse(`{"kind":"PodList","metadata":{},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"3"}}]}`),
		direct: jsonResponse(`{"kind":"PodList","metadata":{},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"3"}},
			{"metadata":{"name":"b","namespace":"n","resourceVersion":"4"}}]}`),
		want: []Difference{{Path: "items[n/b]", Agent: Absent, Direct: "present (resourceVersion 4)", Changed: true}},
	}, {
		// The same items in another order.
		name:   "order",
		agent:  jsonResponse(`{"kind":"NodeList","metadata":{},"items":[{"metadata":{"name":"b"}},{"metadata":{"name":"a"}}]}`),
		direct: jsonResponse(`{"kind":"NodeList","metadata":{},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}`),
		want:   []Difference{{Path: "items (order)", Agent: "from item 0: b, a", Direct: "from item 0: a, b"}},
	}, {
		// Different status codes: the code and each body's Status.
		name:   "status codes",
		agent:  Response{Code: 403, ContentType: "application/json", Body: []byte(`{"kind":"Status","reason":"Forbidden","message":"no"}`)},
		direct: jsonResponse(`{"kind":"ConfigMap"}`),
		want: []Difference{
			{Path: "code", Agent: "403", Direct: "200"},
			{Path: "body", Agent: "Status Forbidden: no", Direct: "ConfigMap, 20 bytes"},
		},
	}, {
		// A single object is compared whole, its resourceVersion too.
		name:   "object",
		agent:  jsonResponse(`{"kind":"ConfigMap","metadata":{"name":"c","resourceVersion":"5"},"data":{"k":"v"}}`),
		direct: jsonResponse(`{"kind":"ConfigMap","metadata":{"name":"c","resourceVersion":"5"},"data":{"k":"v","l":"w"}}`),
		want:   []Difference{{Path: `data.l`, Agent: Absent, Direct: `"w"`}},
	}, {
		// A Table's Age cells tell the time of each read.
		name: "table ages",
		agent: jsonResponse(`{"kind":"Table","metadata":{"resourceVersion":"1"},"columnDefinitions":[{"name":"Name"},{"name":"Age"}],
			"rows":[{"cells":["a","5m"],"object":{"metadata":{"name":"a","resourceVersion":"2"}}}]}`),
		direct: jsonResponse(`{"kind":"Table","metadata":{"resourceVersion":"3"},"columnDefinitions":[{"name":"Name"},{"name":"Age"}],
			"rows":[{"cells":["a","6m"],"object":{"metadata":{"name":"a","resourceVersion":"2"}}}]}`),
		note: "list resourceVersion",
	}, {
		// Bodies that are not JSON are compared byte for byte.
		name:   "text",
		agent:  Response{Code: 200, ContentType: "text/plain", Body: []byte("ok")},
		direct: Response{Code: 200, ContentType: "text/plain", Body: []byte("ok!")},
		want:   []Difference{{Path: "body", Agent: "2 bytes", Direct: "3 bytes"}},
		note:   "byte for byte",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			res := Compare(tc.agent, tc.direct)
			if diff := cmp.Diff(tc.want, res.Differences); diff != "" {
				t.Errorf("differences (-want +got):\n%s", diff)
			}
			if tc.note != "" && !strings.Contains(strings.Join(res.Notes, "\n"), tc.note) {
				t.Errorf("notes %q lack %q", res.Notes, tc.note)
			}
		})
	}
}

// Changed: true only when a difference may be a change between the reads.
func TestResultChanged(t *testing.T) {
	if (Result{Differences: []Difference{{Path: "a"}}}).Changed() {
		t.Error("a plain difference reads as a change between the reads")
	}
	if !(Result{Differences: []Difference{{Path: "a"}, {Path: "b", Changed: true}}}).Changed() {
		t.Error("a difference in a changed object does not")
	}
}
