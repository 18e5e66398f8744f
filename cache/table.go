package cache

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

var tableGVK = metav1.SchemeGroupVersion.WithKind("Table")

// tableOptions decodes a Table request's options as kube-apiserver does,
// and returns false for an includeObject value it would reject (the
// request is then forwarded, for kube-apiserver's own 400).
func tableOptions(query url.Values) (*metav1.TableOptions, bool) {
	opts := &metav1.TableOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, opts); err != nil {
		return nil, false
	}
	if errs := metav1validation.ValidateTableOptions(opts); len(errs) > 0 {
		return nil, false
	}
	return opts, true
}

// table builds the Table of a custom resource object or list with the
// CRD version's printer columns, then shapes each row's object as
// kube-apiserver does for includeObject: the object itself, its
// PartialObjectMetadata (the default) or nothing.
func table(ctx context.Context, p *plan, obj runtime.Object) (*metav1.Table, error) {
	t, err := p.table.ConvertToTable(ctx, obj, p.tableOpts)
	if err != nil {
		return nil, err
	}
	for i := range t.Rows {
		row := &t.Rows[i]
		switch p.tableOpts.IncludeObject {
		case metav1.IncludeObject:
		case metav1.IncludeMetadata, "":
			pm, err := store.AsPartialObjectMetadata(row.Object.Object)
			if err != nil {
				return nil, err
			}
			row.Object.Object = pm
		case metav1.IncludeNone:
			row.Object.Object = nil
		default:
			return nil, apierrors.NewBadRequest(fmt.Sprintf("unrecognized includeObject value: %q", p.tableOpts.IncludeObject))
		}
	}
	t.SetGroupVersionKind(tableGVK)
	return t, nil
}

// serveTable answers a Table get or list of a custom resource.
func (c *Cache) serveTable(w http.ResponseWriter, r *http.Request, p *plan) {
	res := p.res
	var obj runtime.Object
	var err error
	if p.verb == "get" {
		o, _, ok := res.store.Get(p.namespace, p.name)
		if !ok {
			writeStatus(w, r, apierrors.NewNotFound(res.gvr.GroupResource(), p.name))
			return
		}
		if obj, err = o.Decoded(); err != nil {
			c.encodingFailed(w, r, res, err)
			return
		}
	} else {
		objs, rv := p.snapshot()
		list := &unstructured.UnstructuredList{Items: make([]unstructured.Unstructured, 0, len(objs))}
		list.SetGroupVersionKind(res.gvk.GroupVersion().WithKind(res.gvk.Kind + "List"))
		list.SetResourceVersion(fmt.Sprint(rv))
		for _, o := range objs {
			// A custom resource's Object keeps its decoded object, which
			// Decoded returns as it is.
			d, err := o.Decoded()
			if err != nil {
				c.encodingFailed(w, r, res, err)
				return
			}
			u, ok := d.(*unstructured.Unstructured)
			if !ok {
				c.encodingFailed(w, r, res, fmt.Errorf("unexpected cached type %T", d))
				return
			}
			// A shallow copy: the row only reads the shared content.
			list.Items = append(list.Items, unstructured.Unstructured{Object: u.Object})
		}
		obj = list
	}
	t, err := table(r.Context(), p, obj)
	if err != nil {
		if apierrors.IsBadRequest(err) {
			writeStatus(w, r, err)
			return
		}
		c.encodingFailed(w, r, res, err)
		return
	}
	b, err := res.encoder.EncodeJSON(t)
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.Header().Set("Cache-Control", "no-cache, private")
	_, _ = w.Write(append(b, '\n'))
}

// planShape completes a transformed plan: a Table needs the CRD version's
// columns and the request's TableOptions.
func (c *Cache) planShape(p *plan, query url.Values) string {
	if p.as != asTable {
		return ""
	}
	var v *crdVersion
	if c.crds != nil {
		v = c.crds.version(p.res.gvr)
	}
	if v == nil {
		return reasonNotCached
	}
	opts, ok := tableOptions(query)
	if !ok {
		return reasonParameters
	}
	p.table, p.tableOpts = v.table, opts
	return ""
}
