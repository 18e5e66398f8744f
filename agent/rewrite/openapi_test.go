package rewrite

import (
	"bytes"
	"testing"
)

// TestOpenAPIV3Path: a renamed group's document is asked for under the
// group's other name; the index is rewritten in place; other documents
// are left alone.
func TestOpenAPIV3Path(t *testing.T) {
	r := testRewriter(t)
	for _, c := range []struct {
		path, want string
		what       OpenAPIV3
	}{
		{"/openapi/v3", "/openapi/v3", OpenAPIV3Index},
		{"/openapi/v3/", "/openapi/v3/", OpenAPIV3Index},
		{"/openapi/v3/apis/example.com/v1", "/openapi/v3/apis/renamed.example.io/v1", OpenAPIV3Document},
		{"/openapi/v3/apis/renamed.example.io/v2", "/openapi/v3/apis/example.com/v2", OpenAPIV3Document},
		{"/openapi/v3/apis/apps/v1", "/openapi/v3/apis/apps/v1", OpenAPIV3None},
		{"/openapi/v3/api/v1", "/openapi/v3/api/v1", OpenAPIV3None},
		{"/openapi/v3/apis/example.com", "/openapi/v3/apis/example.com", OpenAPIV3None},
		{"/openapi/v3/apis/example.com/v1/x", "/openapi/v3/apis/example.com/v1/x", OpenAPIV3None},
		{"/openapi/v2", "/openapi/v2", OpenAPIV3None},
	} {
		if got, what := r.OpenAPIV3Path(c.path); got != c.want || what != c.what {
			t.Errorf("%s: %s (%d), want %s (%d)", c.path, got, what, c.want, c.what)
		}
	}
	if got := r.OpenAPIV3Location("/openapi/v3/apis/renamed.example.io/v1?hash=AB12"); got != "/openapi/v3/apis/example.com/v1?hash=AB12" {
		t.Errorf("a redirect's location: %s", got)
	}
}

// openAPIIndexCase is an index of OpenAPI v3 documents, original and
// renamed.
var openAPIIndexCase = [2]string{`{"paths": {
		"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=01"},
		"apis/apps/v1": {"serverRelativeURL": "/openapi/v3/apis/apps/v1?hash=02"},
		"apis/example.com/v1": {"serverRelativeURL": "/openapi/v3/apis/example.com/v1?hash=03"},
		"apis/example.com/v2": {"serverRelativeURL": "/openapi/v3/apis/example.com/v2?hash=04"}}}`,
	`{"paths": {
		"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=01"},
		"apis/apps/v1": {"serverRelativeURL": "/openapi/v3/apis/apps/v1?hash=02"},
		"apis/renamed.example.io/v1": {"serverRelativeURL": "/openapi/v3/apis/renamed.example.io/v1?hash=03"},
		"apis/renamed.example.io/v2": {"serverRelativeURL": "/openapi/v3/apis/renamed.example.io/v2?hash=04"}}}`}

// openAPIDocumentCase is a custom resource's document as kube-apiserver
// serves it, cut down to one of each part, original and renamed.
var openAPIDocumentCase = [2]string{`{
	"openapi": "3.0.0",
	"info": {"title": "Kubernetes", "version": "v1.37.2"},
	"paths": {
		"/apis/example.com/v1/": {"get": {"operationId": "getExampleComV1APIResources",
			"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"}}}}}}},
		"/apis/example.com/v1/namespaces/{namespace}/widgets/{name}": {
			"get": {"operationId": "readExampleComV1NamespacedWidget",
				"x-kubernetes-action": "get",
				"x-kubernetes-group-version-kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
				"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/com.example.v1.Widget"}}}}}},
			"parameters": [{"$ref": "#/components/parameters/namespace-vxn"}]},
		"/apis/example.com/v1/namespaces/{namespace}/widgets/{name}/scale": {
			"get": {"x-kubernetes-group-version-kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}}},
		"/apis/example.com/v1/widgets": {
			"get": {"x-kubernetes-group-version-kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
				"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/com.example.v1.WidgetList"}}}}}}}
	},
	"components": {
		"parameters": {"namespace-vxn": {"name": "namespace", "in": "path", "required": true}},
		"schemas": {
			"com.example.v1.Widget": {"type": "object",
				"properties": {"metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
					"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
				"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}]},
			"com.example.v1.WidgetList": {"type": "object",
				"properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/com.example.v1.Widget"}}},
				"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "WidgetList"}]},
			"com.example.v1.Other": {"type": "object",
				"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Gadget"}]},
			"io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {"type": "object",
				"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "DeleteOptions"}, {"group": "example.com", "version": "v1", "kind": "DeleteOptions"}]},
			"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object"}
		}
	}}`, `{
	"openapi": "3.0.0",
	"info": {"title": "Kubernetes", "version": "v1.37.2"},
	"paths": {
		"/apis/renamed.example.io/v1/": {"get": {"operationId": "getExampleComV1APIResources",
			"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"}}}}}}},
		"/apis/renamed.example.io/v1/namespaces/{namespace}/renamedwidgets/{name}": {
			"get": {"operationId": "readExampleComV1NamespacedWidget",
				"x-kubernetes-action": "get",
				"x-kubernetes-group-version-kind": {"group": "renamed.example.io", "version": "v1", "kind": "RenamedWidget"},
				"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/io.example.renamed.v1.RenamedWidget"}}}}}},
			"parameters": [{"$ref": "#/components/parameters/namespace-vxn"}]},
		"/apis/renamed.example.io/v1/namespaces/{namespace}/renamedwidgets/{name}/scale": {
			"get": {"x-kubernetes-group-version-kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}}},
		"/apis/renamed.example.io/v1/renamedwidgets": {
			"get": {"x-kubernetes-group-version-kind": {"group": "renamed.example.io", "version": "v1", "kind": "RenamedWidget"},
				"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/io.example.renamed.v1.RenamedWidgetList"}}}}}}}
	},
	"components": {
		"parameters": {"namespace-vxn": {"name": "namespace", "in": "path", "required": true}},
		"schemas": {
			"io.example.renamed.v1.RenamedWidget": {"type": "object",
				"properties": {"metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
					"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
				"x-kubernetes-group-version-kind": [{"group": "renamed.example.io", "version": "v1", "kind": "RenamedWidget"}]},
			"io.example.renamed.v1.RenamedWidgetList": {"type": "object",
				"properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/io.example.renamed.v1.RenamedWidget"}}},
				"x-kubernetes-group-version-kind": [{"group": "renamed.example.io", "version": "v1", "kind": "RenamedWidgetList"}]},
			"com.example.v1.Other": {"type": "object",
				"x-kubernetes-group-version-kind": [{"group": "renamed.example.io", "version": "v1", "kind": "Gadget"}]},
			"io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {"type": "object",
				"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "DeleteOptions"}, {"group": "renamed.example.io", "version": "v1", "kind": "DeleteOptions"}]},
			"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object"}
		}
	}}`}

func TestOpenAPIV3Index(t *testing.T) {
	checkSwap(t, openAPIIndexCase[0], openAPIIndexCase[1], testRewriter(t).OpenAPIV3IndexJSON)
}

func TestOpenAPIV3Document(t *testing.T) {
	checkSwap(t, openAPIDocumentCase[0], openAPIDocumentCase[1], testRewriter(t).OpenAPIV3DocumentJSON)
}

// FuzzOpenAPIV3 feeds JSON (mutated from the fixtures) to the index's and
// the documents' rewrites twice: the second must give back the canonical
// input, byte for byte.
func FuzzOpenAPIV3(f *testing.F) {
	for _, c := range [][2]string{openAPIIndexCase, openAPIDocumentCase} {
		for _, s := range c {
			f.Add([]byte(s))
		}
	}
	f.Add([]byte(`{"components":{"schemas":{"com.example.v1.Widget":{"x-kubernetes-group-version-kind":[{"group":"example.com","kind":"Widget","version":"v1"}]},"io.example.renamed.v1.Widget":{"x-kubernetes-group-version-kind":[{"group":"example.com","kind":"Widget","version":"v1"}]}}},"paths":{"/x":{"$ref":"#/components/schemas/io.example.renamed.v1.RenamedWidget"}}}`))
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		v, canonical, ok := canonicalJSON(t, data)
		if !ok {
			return
		}
		_, isObject := v.(map[string]any)
		for name, fn := range map[string]func([]byte) ([]byte, error){"index": r.OpenAPIV3IndexJSON, "document": r.OpenAPIV3DocumentJSON} {
			if _, err := swapTwice(fn, canonical); err != nil && isObject {
				t.Fatalf("%s: %v", name, err)
			}
		}
	})
}

// TestOpenAPIV3DocumentOddInputs: inputs kube-apiserver does not serve
// still swap back exactly. A kind's schema whose other name is taken by a
// schema that stays is left whole; a reference to the other side's name
// of a kind follows the swap; a schema named as the other side's kind is
// left as it is; kinds and versions with dots are not read as kinds.
func TestOpenAPIV3DocumentOddInputs(t *testing.T) {
	r := testRewriter(t)
	for name, in := range map[string]string{
		"taken name": `{"components": {"schemas": {
			"com.example.v1.Widget": {"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}]},
			"io.example.renamed.v1.RenamedWidget": {"type": "string"}}}}`,
		"reference to the other name": `{"components": {"schemas": {
			"com.example.v1.Widget": {"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}]}}},
			"paths": {"/x": {"$ref": "#/components/schemas/io.example.renamed.v1.RenamedWidget"}}}`,
		"named as the other side": `{"components": {"schemas": {
			"io.example.renamed.v1.Widget": {"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}]}}}}`,
		"dots": `{"components": {"schemas": {
			"com.example.v1.Foo.Bar": {"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Foo.Bar"}]},
			"com.example.v1.RenamedFoo.RenamedBar": {"x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1.RenamedFoo", "kind": "RenamedBar"}]}}}}`,
	} {
		_, canonical, ok := canonicalJSON(t, []byte(in))
		if !ok {
			t.Fatalf("%s: not JSON", name)
		}
		renamed, err := swapTwice(r.OpenAPIV3DocumentJSON, canonical)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if name == "taken name" && err == nil && !bytes.Equal(renamed, canonical) {
			t.Errorf("%s: %s, want it left as it is", name, renamed)
		}
	}
}
