package identity

import (
	"context"
	"errors"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// errCSRGone says the CSR waited for no longer exists (deleted, or
// replaced by another object of the same name).
var errCSRGone = errors.New("certificate signing request is gone")

// waitForCSR watches the CSR name (with uid) until it is denied, failed,
// or approved with a certificate, and returns it then. It returns an error
// wrapping errCSRGone if the CSR does not exist or is deleted, and ctx's
// error when ctx ends first. Unlike client-go's csr.WaitForCertificate it
// returns the object, so the caller can tell a denial from other ends.
func waitForCSR(ctx context.Context, client kubernetes.Interface, name string, uid types.UID) (*certificatesv1.CertificateSigningRequest, error) {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	csrs := client.CertificatesV1().CertificateSigningRequests()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return csrs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return csrs.Watch(ctx, o)
		},
	}, client)
	var out *certificatesv1.CertificateSigningRequest
	// After the first list, the CSR must be there.
	exists := func(store cache.Store) (bool, error) {
		if _, ok, err := store.GetByKey(name); err != nil || !ok {
			return false, fmt.Errorf("%w: %s not found", errCSRGone, name)
		}
		return false, nil
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &certificatesv1.CertificateSigningRequest{}, exists, func(ev watch.Event) (bool, error) {
		obj, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
		if !ok || obj.Name != name {
			return false, nil
		}
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("%w: %s was deleted", errCSRGone, name)
		}
		if ev.Type != watch.Added && ev.Type != watch.Modified {
			return false, nil
		}
		if uid != "" && obj.UID != uid {
			return false, fmt.Errorf("%w: %s now has UID %s, not %s", errCSRGone, name, obj.UID, uid)
		}
		if terminal(obj) {
			out = obj
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return out, nil
}

// terminal reports whether nothing more will happen to csr: denied,
// failed, or approved and issued.
func terminal(csr *certificatesv1.CertificateSigningRequest) bool {
	if condition(csr, certificatesv1.CertificateDenied) != nil || condition(csr, certificatesv1.CertificateFailed) != nil {
		return true
	}
	return condition(csr, certificatesv1.CertificateApproved) != nil && len(csr.Status.Certificate) > 0
}
