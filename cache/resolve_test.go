package cache

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
)

// TestResolveVersion: a resource named without a version is cached at its
// group's preferred version, or, when that version does not serve it, at
// the first version of the group that does (a beta resource of a group
// whose preferred version is GA); a version in the spec is taken as given;
// a resource no version serves is an error naming the versions tried.
func TestResolveVersion(t *testing.T) {
	verbs := metav1.Verbs{"get", "list", "watch"}
	dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: []*metav1.APIResourceList{
		// The first list of a group is its preferred version.
		{GroupVersion: "certificates.k8s.io/v1", APIResources: []metav1.APIResource{
			{Name: "certificatesigningrequests", Kind: "CertificateSigningRequest", Verbs: verbs},
		}},
		{GroupVersion: "certificates.k8s.io/v1beta1", APIResources: []metav1.APIResource{
			{Name: "clustertrustbundles", Kind: "ClusterTrustBundle", Verbs: verbs},
			{Name: "podcertificaterequests", Kind: "PodCertificateRequest", Namespaced: true, Verbs: verbs},
		}},
		{GroupVersion: "certificates.k8s.io/v1alpha1", APIResources: []metav1.APIResource{
			{Name: "clustertrustbundles", Kind: "ClusterTrustBundle", Verbs: verbs},
		}},
	}}}
	for _, tc := range []struct {
		spec    ResourceSpec
		want    schema.GroupVersionResource
		wantErr string
	}{
		{spec: ResourceSpec{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"},
			want: schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1", Resource: "certificatesigningrequests"}},
		// v1 does not serve it; v1beta1 comes before v1alpha1.
		{spec: ResourceSpec{Group: "certificates.k8s.io", Resource: "clustertrustbundles"},
			want: schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1beta1", Resource: "clustertrustbundles"}},
		{spec: ResourceSpec{Group: "certificates.k8s.io", Resource: "podcertificaterequests"},
			want: schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1beta1", Resource: "podcertificaterequests"}},
		{spec: ResourceSpec{Group: "certificates.k8s.io", Version: "v1alpha1", Resource: "clustertrustbundles"},
			want: schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1alpha1", Resource: "clustertrustbundles"}},
		{spec: ResourceSpec{Group: "certificates.k8s.io", Resource: "widgets"},
			wantErr: "certificates.k8s.io/v1, certificates.k8s.io/v1beta1, certificates.k8s.io/v1alpha1 does not serve widgets"},
		{spec: ResourceSpec{Group: "example.com", Resource: "widgets"}, wantErr: `API group "example.com" is not served`},
	} {
		r := &informer{resource: &resource{spec: tc.spec}}
		err := r.resolve(dc)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: err %v, want %q", tc.spec, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%+v: %v", tc.spec, err)
		case r.gvr != tc.want:
			t.Errorf("%+v: resolved to %v, want %v", tc.spec, r.gvr, tc.want)
		}
	}
}
