package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/kube-apicache/kube-apicache/agent/status"
)

// kube-apiserver's pods proxy takes port numbers only: names are resolved
// from the pod's container ports, and an unknown name is an error.
func TestPodPort(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kube-apicache-x"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Ports: []corev1.ContainerPort{{Name: "apicache", ContainerPort: 10443}, {Name: "metrics", ContainerPort: 10445}},
	}}}}
	for port, want := range map[string]string{"metrics": "10445", "10445": "10445", "apicache": "10443"} {
		if got, err := podPort(p, port); err != nil || got != want {
			t.Errorf("podPort(%q) = %q, %v; want %q", port, got, err, want)
		}
	}
	if _, err := podPort(p, "nope"); err == nil || !strings.Contains(err.Error(), `no container port named "nope"`) {
		t.Errorf("podPort(nope) error = %v", err)
	}
}

// The table has a line per node with the hit ratio over the reads the
// cache considered, the agents that did not answer, and a total; an agent
// whose node's pods are listed as the agent says why, and one that lists
// none is not shown as intercepting pods.
func TestStatusTable(t *testing.T) {
	until := time.Now().Add(5 * time.Hour)
	rows := []statusRow{
		{Pod: "a", Node: "n1", Status: &status.Status{Intercepting: true, Ready: true,
			Upstreams:           []status.UpstreamStatus{{Endpoint: "10.0.0.1:6443", Healthy: true}, {Endpoint: "10.0.0.2:6443"}},
			CertificateNotAfter: &until, Cache: map[string]float64{"hit": 3, "forwarded": 1}}},
		{Pod: "b", Node: "n2", Status: &status.Status{Ready: true, InterceptingReason: "interception turned off (test)", Cache: map[string]float64{}}},
		{Pod: "c", Node: "n3", Error: "connection refused"},
		{Pod: "d", Node: "n4", Status: &status.Status{Intercepting: true, Ready: true, PodsSource: "agent",
			PodsSourceReason: "kube-apiserver refused to list them as the node: bind it", Cache: map[string]float64{}}},
		{Pod: "e", Node: "n5", Status: &status.Status{Intercepting: true, Ready: true, PodsSource: "none", HostNetworkOnly: true,
			PodsSourceReason: "refused as the node and as the agent", Cache: map[string]float64{}}},
	}
	var b bytes.Buffer
	if err := (&statusOptions{}).print(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"75.0%", "1/2 healthy", "interception turned off (test)", "connection refused",
		"pods source agent: kube-apiserver refused to list them as the node: bind it",
		"host-network only", "pods source none: refused as the node and as the agent",
		"5 agents: 3 intercepting, 1 not, 1 not answering; 1 of them host-network traffic only"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// --node keeps to the agent on that node; a node without one is an error
// that names it, and a name that cannot be a node's is refused before any
// request.
func TestStatusNode(t *testing.T) {
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-apicache",
			Labels: map[string]string{"app.kubernetes.io/name": "kube-apicache"}}, Spec: corev1.PodSpec{NodeName: node}}
	}
	client := fake.NewClientset(pod("a", "n1"), pod("b", "n2"), pod("c", "n3"))
	client.PrependReactor("create", "serviceaccounts", func(action clienttesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{Token: "t"}}, nil
	})
	o := &statusOptions{namespace: "kube-apicache", selector: "app.kubernetes.io/name=kube-apicache", node: "n2", serviceAccount: "kube-apicache-status"}
	rows, err := o.collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Pod != "b" || rows[0].Node != "n2" {
		t.Errorf("--node n2 rows = %+v, want pod b only", rows)
	}
	o.node = "n4"
	if _, err := o.collect(context.Background(), client); err == nil || !strings.Contains(err.Error(), "on node n4") {
		t.Errorf("--node n4 error = %v, want one naming the node", err)
	}
	o.node = ""
	if rows, err := o.collect(context.Background(), client); err != nil || len(rows) != 3 {
		t.Errorf("without --node: %d rows, %v; want 3", len(rows), err)
	}

	cmd := newStatusCommand()
	cmd.SetArgs([]string{"--node", "Not_A_Node"})
	cmd.SetOut(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `--node "Not_A_Node"`) || strings.Contains(err.Error(), "\n") {
		t.Errorf("--node Not_A_Node error = %v, want one line naming the flag", err)
	}
}

// status shows the agents a ten-minute token of its own ServiceAccount,
// never the caller's credentials; a caller who may not request one, or a
// missing ServiceAccount, gets one line that says what to do.
func TestStatusToken(t *testing.T) {
	o := &statusOptions{namespace: "kube-apicache", serviceAccount: "kube-apicache-status"}
	client := fake.NewClientset()
	var asked *authenticationv1.TokenRequest
	client.PrependReactor("create", "serviceaccounts", func(action clienttesting.Action) (bool, runtime.Object, error) {
		create := action.(clienttesting.CreateAction)
		if create.GetSubresource() != "token" {
			return false, nil, nil
		}
		asked = create.GetObject().(*authenticationv1.TokenRequest)
		switch name := create.(clienttesting.CreateActionImpl).Name; {
		case action.GetNamespace() != "kube-apicache":
			return true, nil, apierrors.NewBadRequest("wrong namespace " + action.GetNamespace())
		case name == "kube-apicache-status":
			return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{Token: "status-token"}}, nil
		default:
			return true, nil, apierrors.NewBadRequest("unexpected name " + name)
		}
	})
	token, err := o.statusToken(context.Background(), client)
	if err != nil || token != "status-token" {
		t.Fatalf("statusToken = %q, %v; want status-token", token, err)
	}
	if got := asked.Spec.ExpirationSeconds; got == nil || *got != statusTokenSeconds {
		t.Errorf("token asked for %v seconds, want %d", got, statusTokenSeconds)
	}

	gr := schema.GroupResource{Resource: "serviceaccounts"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{apierrors.NewForbidden(gr, "kube-apicache-status", nil), "kube-apicache:status-user"},
		{apierrors.NewNotFound(gr, "kube-apicache-status"), "does not exist"},
	} {
		client := fake.NewClientset()
		client.PrependReactor("create", "serviceaccounts", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
		_, err := o.statusToken(context.Background(), client)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("statusToken with %v = %v, want one line with %q", tc.err, err, tc.want)
		}
	}
}
