package rewrite

import (
	"fmt"
	"strings"
	"testing"
)

// typicalObject is a custom resource as an operator writes it: labels,
// annotations, a finalizer, an owner, managedFields and a small spec.
const typicalObject = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"vm-%d","namespace":"tenant","uid":"6f1c0f0e-%d","resourceVersion":"%d","generation":3,
"creationTimestamp":"2026-11-28T10:00:00Z",
"labels":{"kubevirt.io/vm":"vm-%d","app.kubernetes.io/name":"vm","example.com/tier":"gold"},
"annotations":{"kubevirt.io/latest-observed-api-version":"v1","kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"kubevirt.io/v1\"}"},
"finalizers":["kubevirt.io/virtualMachineControllerFinalize"],
"ownerReferences":[{"apiVersion":"example.com/v1","kind":"Widget","name":"w","uid":"1","controller":true}],
"managedFields":[{"manager":"virt-controller","operation":"Update","apiVersion":"kubevirt.io/v1","time":"2026-11-28T10:00:00Z","fieldsType":"FieldsV1",
 "fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:kubevirt.io/vm":{}},"f:finalizers":{".":{},"v:\"kubevirt.io/virtualMachineControllerFinalize\"":{}}},"f:spec":{"f:running":{}}}}]},
"spec":{"running":true,"template":{"metadata":{"labels":{"kubevirt.io/vm":"vm-%d"}},"spec":{"domain":{"cpu":{"cores":2},"memory":{"guest":"2Gi"},
"devices":{"disks":[{"name":"root","disk":{"bus":"virtio"}}]}},"volumes":[{"name":"root","containerDisk":{"image":"quay.io/containerdisks/fedora:40"}}]}}},
"status":{"printableStatus":"Running","ready":true,"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-11-28T10:01:00Z"}]}}`

func typical(i int) string { return fmt.Sprintf(typicalObject, i, i, i, i, i) }

// BenchmarkRewriteObject: one typical object, JSON in and out.
func BenchmarkRewriteObject(b *testing.B) {
	r := testRewriter(b)
	data := []byte(typical(1))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.ObjectJSON(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRewriteList500: a list of 500 typical objects, JSON in and out.
func BenchmarkRewriteList500(b *testing.B) {
	r := testRewriter(b)
	items := make([]string, 500)
	for i := range items {
		items[i] = typical(i)
	}
	data := []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineList","metadata":{"resourceVersion":"9"},"items":[` + strings.Join(items, ",") + `]}`)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.ObjectJSON(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeEncodeList500 is the floor under BenchmarkRewriteList500:
// decoding and encoding alone, with no rewrite.
func BenchmarkDecodeEncodeList500(b *testing.B) {
	items := make([]string, 500)
	for i := range items {
		items[i] = typical(i)
	}
	data := []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineList","items":[` + strings.Join(items, ",") + `]}`)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		v, err := Decode(data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Encode(v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRewriteDecodedObject: the rewrite alone, on a decoded object
// (renamed and restored in turn, so each round does the same work).
func BenchmarkRewriteDecodedObject(b *testing.B) {
	r := testRewriter(b)
	v, err := Decode([]byte(typical(1)))
	if err != nil {
		b.Fatal(err)
	}
	obj := v.(map[string]any)
	b.ReportAllocs()
	for b.Loop() {
		r.Object(obj)
	}
}
