package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

var widgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

func widgetCRD(versions ...string) *apiextensionsv1.CustomResourceDefinition {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Kind: "Widget", ListKind: "WidgetList"}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
			{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}},
	}
	for _, v := range versions {
		crd.Spec.Versions = append(crd.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{
			Name: v, Served: true, Storage: v == "v1",
			AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
				{Name: "Color", Type: "string", JSONPath: ".spec.color"},
				{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
			},
			SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}},
		})
	}
	return crd
}

func widget(name, rv, color string, size int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": "ns", "resourceVersion": rv, "creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec":     map[string]any{"color": color, "size": size},
	}}
	return u
}

// testCustomCache returns a Cache holding widgets at RV 50, whose CRD is
// crd, and a client configuration for it. Forwarded requests get 418.
func testCustomCache(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition, objs ...*unstructured.Unstructured) (*Cache, *rest.Config) {
	t.Helper()
	c, err := New(Config{NodeName: "node-a", Resources: []ResourceSpec{{Group: "example.com", Resource: "widgets", Version: "v1"}},
		RESTConfig: &rest.Config{}, Reviewer: &fakeReviewer{}, WaitTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if c.crds == nil {
		t.Fatal("no CRD index for a custom resource")
	}
	c.crds.update(c.crds.gen, crd)
	c.crds.synced = true
	r := testInformer(c.resources[0])
	r.gvr, r.gvk, r.namespaced = widgets, widgets.GroupVersion().WithKind("Widget"), true
	r.fields = store.FieldLabelsFor(widgets.GroupResource(), false, true)
	if err := r.resolveCRD(); err != nil {
		t.Fatal(err)
	}
	r.encoder = store.NewEncoder(r.gvk, false)
	r.store = store.NewStore(store.AttrsFor(r.fields, true), r.prepare, nil)
	items := make([]any, 0, len(objs))
	for _, o := range objs {
		items = append(items, o.DeepCopy())
	}
	if err := r.store.Replace(items, "50"); err != nil {
		t.Fatal(err)
	}
	r.watchState.Store(1<<1 | 1)
	r.ready.Store(true)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		info, _ := testInfoFactory.NewRequestInfo(req)
		req = req.WithContext(request.WithRequestInfo(req.Context(), info))
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return c, &rest.Config{Host: srv.URL, BearerToken: "token-a"}
}

func getRaw(t *testing.T, cfg *rest.Config, path, accept string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, cfg.Host+path, nil)
	req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

const kubectlTableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"

// TestCustomResourceTable: a custom resource's Table has the CRD's printer
// columns (never just NAME and AGE) and cells from each object, and its
// rows carry the object, its metadata or nothing as includeObject asks.
func TestCustomResourceTable(t *testing.T) {
	_, cfg := testCustomCache(t, widgetCRD("v1"), widget("w2", "42", "blue", 2), widget("w1", "41", "red", 1))
	for _, tc := range []struct {
		name, query string
		wantKind    string // of each row's object; "" for none
	}{
		{"default", "", "PartialObjectMetadata"},
		{"includeObject=Metadata", "&includeObject=Metadata", "PartialObjectMetadata"},
		{"includeObject=Object", "&includeObject=Object", "Widget"},
		{"includeObject=None", "&includeObject=None", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, raw := getRaw(t, cfg, "/apis/example.com/v1/namespaces/ns/widgets?limit=500"+tc.query, kubectlTableAccept)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, raw)
			}
			var table metav1.Table
			if err := json.Unmarshal(raw, &table); err != nil {
				t.Fatal(err)
			}
			var cols []string
			for _, c := range table.ColumnDefinitions {
				cols = append(cols, c.Name)
			}
			if diff := cmp.Diff([]string{"Name", "Color", "Size"}, cols); diff != "" {
				t.Errorf("columns (-want +got):\n%s", diff)
			}
			var cells [][]any
			for _, r := range table.Rows {
				cells = append(cells, r.Cells)
				var meta struct{ Kind string }
				if len(r.Object.Raw) > 0 && string(r.Object.Raw) != "null" {
					if err := json.Unmarshal(r.Object.Raw, &meta); err != nil {
						t.Fatal(err)
					}
				}
				if meta.Kind != tc.wantKind {
					t.Errorf("row object kind %q, want %q", meta.Kind, tc.wantKind)
				}
			}
			if diff := cmp.Diff([][]any{{"w1", "red", float64(1)}, {"w2", "blue", float64(2)}}, cells); diff != "" {
				t.Errorf("cells (-want +got):\n%s", diff)
			}
			if table.Kind != "Table" || table.APIVersion != "meta.k8s.io/v1" || table.ResourceVersion != "50" {
				t.Errorf("table %s %s at %q", table.APIVersion, table.Kind, table.ResourceVersion)
			}
		})
	}
	code, raw := getRaw(t, cfg, "/apis/example.com/v1/namespaces/ns/widgets/w2", kubectlTableAccept)
	var one metav1.Table
	if err := json.Unmarshal(raw, &one); err != nil || code != http.StatusOK || len(one.Rows) != 1 || one.Rows[0].Cells[1] != "blue" || one.ResourceVersion != "42" {
		t.Errorf("get Table: %d %s", code, raw)
	}
	if code, _ := getRaw(t, cfg, "/apis/example.com/v1/namespaces/ns/widgets?includeObject=Bogus", kubectlTableAccept); code != http.StatusTeapot {
		t.Errorf("a bad includeObject got %d, want it forwarded for kube-apiserver's 400", code)
	}
}

// TestCustomResourceSelectableFields: a CRD version's selectableFields
// select from the cache; other field labels are forwarded.
func TestCustomResourceSelectableFields(t *testing.T) {
	_, cfg := testCustomCache(t, widgetCRD("v1"), widget("w2", "42", "blue", 2), widget("w1", "41", "red", 1))
	dc := dynamic.NewForConfigOrDie(cfg).Resource(widgets).Namespace("ns")
	list, err := dc.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.color=blue", ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].GetName() != "w2" {
		t.Errorf("spec.color=blue selected %d items, want w2", len(list.Items))
	}
	// Not a selectable field: forwarded (the fake upstream answers 418).
	_, err = dc.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.size=2", ResourceVersion: "0"})
	if !apierrors.IsUnexpectedServerError(err) || !strings.Contains(err.Error(), "418") {
		t.Errorf("unknown field label: err %v, want the upstream's answer", err)
	}
}

// TestCustomResourceCRDChanges: once the CRD stops serving the cached
// version, changes its selectable fields, or is deleted, requests are
// forwarded, without errors.
func TestCustomResourceCRDChanges(t *testing.T) {
	changed := widgetCRD("v1")
	changed.Spec.Versions[0].SelectableFields = nil
	for _, tc := range []struct {
		name   string
		change func(x *crdIndex)
	}{
		{"version no longer served", func(x *crdIndex) { x.update(x.gen, widgetCRD("v2")) }},
		{"selectable fields changed", func(x *crdIndex) { x.update(x.gen, changed) }},
		{"CRD deleted", func(x *crdIndex) { x.remove(x.gen, widgetCRD("v1")) }},
		{"CRD being deleted", func(x *crdIndex) {
			crd := widgetCRD("v1")
			crd.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			x.update(x.gen, crd)
		}},
		{"CRD no longer established", func(x *crdIndex) {
			crd := widgetCRD("v1")
			crd.Status.Conditions = nil
			x.update(x.gen, crd)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, cfg := testCustomCache(t, widgetCRD("v1"), widget("w1", "41", "red", 1))
			if code, _ := getRaw(t, cfg, "/apis/example.com/v1/namespaces/ns/widgets/w1", "application/json"); code != http.StatusOK {
				t.Fatalf("before the change: %d, want 200 from the cache", code)
			}
			tc.change(c.crds)
			if code, _ := getRaw(t, cfg, "/apis/example.com/v1/namespaces/ns/widgets/w1", "application/json"); code != http.StatusTeapot {
				t.Errorf("after the change: %d, want it forwarded", code)
			}
		})
	}
}

// TestCustomResourceWatchList: a custom resource's watch-list is answered
// from the cache in JSON, its bookmark an empty object of the resource's
// kind, and its later events come from the Store through the CRD's
// selectable field: a widget turning red is ADDED for a spec.color=red
// watch.
func TestCustomResourceWatchList(t *testing.T) {
	c, cfg := testCustomCache(t, widgetCRD("v1"), widget("w2", "42", "blue", 2), widget("w1", "41", "red", 1))
	dc := dynamic.NewForConfigOrDie(cfg).Resource(widgets)
	opts := watchListOptions("0")
	opts.FieldSelector = "spec.color=red"
	w, err := dc.Watch(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	evs := next(t, w, 2)
	mustDo(t, c.resources[0].current.Load().store.Update(widget("w2", "51", "red", 2)))
	evs = append(evs, next(t, w, 1)...)
	var got []string
	for _, ev := range evs {
		if st, ok := ev.Object.(*metav1.Status); ok {
			got = append(got, fmt.Sprintf("%s %d", ev.Type, st.Code))
			continue
		}
		u, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			t.Fatalf("%s event with %T", ev.Type, ev.Object)
		}
		s := string(ev.Type) + " " + u.GetKind() + " " + u.GetName() + "@" + u.GetResourceVersion()
		if u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
			s += " initial-events-end"
		}
		got = append(got, s)
	}
	want := []string{"ADDED Widget w1@41", "BOOKMARK Widget @50 initial-events-end", "ADDED Widget w2@51"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
