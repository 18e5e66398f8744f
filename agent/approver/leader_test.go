package approver

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRunAsLeader: of two replicas one leads and the other stands by; when
// the leader stops, it releases the Lease and the standby takes over well
// before the lease would have expired.
func TestRunAsLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := fake.NewClientset()
	le := LeaderElection{Namespace: "kube-apicache", Name: "approver", LeaseDuration: 10 * time.Second,
		RenewDeadline: 5 * time.Second, RetryPeriod: 50 * time.Millisecond}
	var leading [2]atomic.Bool
	var metrics [2]*Metrics
	var stops [2]context.CancelFunc
	done := make(chan int, 2)
	for i := range 2 {
		rctx, stop := context.WithCancel(ctx)
		stops[i] = stop
		metrics[i] = NewMetrics()
		l := le
		l.Identity = []string{"a", "b"}[i]
		go func() {
			_ = RunAsLeader(rctx, client, l, metrics[i], nil, func(ctx context.Context) {
				leading[i].Store(true)
				<-ctx.Done()
				leading[i].Store(false)
			})
			done <- i
		}()
		if i == 0 {
			// a first, so it is the leader.
			if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
				return leading[0].Load(), nil
			}); err != nil {
				t.Fatal("a never led")
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	if !leading[0].Load() || leading[1].Load() {
		t.Fatalf("leading a=%v b=%v, want a only", leading[0].Load(), leading[1].Load())
	}
	if got := testutil.ToFloat64(metrics[0].leader); got != 1 {
		t.Errorf("a's leader gauge %v, want 1", got)
	}

	stops[0]()
	start := time.Now()
	if i := <-done; i != 0 {
		t.Fatalf("replica %d returned, want a", i)
	}
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return leading[1].Load(), nil
	}); err != nil {
		t.Fatal("b never took over")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("b took over after %v; a released lease is taken within a retry period", d)
	}
	lease, err := client.CoordinationV1().Leases("kube-apicache").Get(ctx, "approver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *lease.Spec.HolderIdentity != "b" {
		t.Errorf("lease holder %q, want b", *lease.Spec.HolderIdentity)
	}
	stops[1]()
	<-done
}
