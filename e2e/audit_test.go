package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const (
	auditNS = "e2e-audit"
	uaAudit = "kube-apicache-e2e/audit"
	// agentAuditPolicy is the sandbox kube-apiserver's own policy: every
	// request at Metadata level, RequestReceived omitted.
	agentAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`
)

// auditCase is one read of the audit scenario, sent through the agent and
// straight to kube-apiserver.
type auditCase struct {
	name   string
	caller *sandbox.Pod
	path   string
	// cached: the agent answers it itself (and so records it).
	cached bool
	// stream: a watch-list, whose whole stream (initial events and the
	// events after them) the agent serves from its cache.
	stream bool
	code   int
	// auditIDs are the Audit-Id response headers: through the agent, and
	// direct.
	viaAgent, direct string
}

// auditRecord is what must be the same in the agent's and kube-apiserver's
// event of one request.
type auditRecord struct {
	Verb        string
	RequestURI  string
	UserAgent   string
	SourceIPs   []string
	User        authnv1.UserInfo
	ObjectRef   *auditv1.ObjectReference
	Code        int32
	Annotations map[string]string
}

func auditRecordOf(ev auditv1.Event) auditRecord {
	r := auditRecord{Verb: ev.Verb, RequestURI: ev.RequestURI, UserAgent: ev.UserAgent, SourceIPs: ev.SourceIPs,
		User: ev.User, ObjectRef: ev.ObjectRef, Annotations: map[string]string{}}
	if ev.ResponseStatus != nil {
		r.Code = ev.ResponseStatus.Code
	}
	for _, k := range []string{"authorization.k8s.io/decision", "authorization.k8s.io/reason"} {
		if v, ok := ev.Annotations[k]; ok {
			r.Annotations[k] = v
		}
	}
	return r
}

// TestAudit is the audit parity scenario: given an agent started with
// kube-apiserver's audit flags (a policy recording every request at
// Metadata level, a log file), when pods read through the agent (a
// cached list, get and watch-list, a list the cache denies, a forwarded
// list) and send the same reads straight to kube-apiserver, then:
//   - for every read the agent answered, its log has the event
//     kube-apiserver recorded for the direct read: same user, verb,
//     objectRef, requestURI, sourceIPs, userAgent, response code and
//     authorization decision and reason, under the Audit-Id the client
//     got;
//   - the forwarded read is in kube-apiserver's log only;
//   - the watch-list's whole stream is the agent's: its log has the
//     ResponseStarted and ResponseComplete stages, kube-apiserver's
//     nothing under its Audit-Id;
//   - the agent's log has one complete event per request its cache
//     answered, as its metrics count them.
func TestAudit(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Given a pod that may edit its namespace, one allowed nothing, a
	// service to read,
	reader := newClientPod(t, ctx, c, auditNS, "reader")
	nobody, err := c.NewPod(ctx, sandbox.PodSpec{Name: "nobody", Namespace: auditNS, ServiceAccount: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc-a"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := c.Admin.CoreV1().Services(auditNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// and an agent auditing with kube-apiserver's flags, its cache synced,
	dir := t.TempDir()
	policy, logPath := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "audit", "audit.log")
	if err := os.WriteFile(policy, []byte(agentAuditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	agent := startAgent(t, ctx, c, "--audit-policy-file="+policy, "--audit-log-path="+logPath, "--audit-log-format=json")
	waitCacheSynced(t, ctx, agent)
	if fi, err := os.Stat(logPath); err != nil {
		t.Fatalf("agent audit log: %v", err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("agent audit log has mode %v, want 0600", fi.Mode().Perm())
	}

	// when the pods read through the agent and directly,
	svcs := "/api/v1/namespaces/" + auditNS + "/services"
	cases := []*auditCase{
		{name: "cached list", caller: reader, path: svcs + "?resourceVersion=0", cached: true, code: 200},
		{name: "cached get", caller: reader, path: svcs + "/svc-a?resourceVersion=0", cached: true, code: 200},
		{name: "cached watch-list", caller: reader, path: svcs + "?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=3", cached: true, stream: true, code: 200},
		{name: "denied list", caller: nobody, path: svcs + "?resourceVersion=0", cached: true, code: 403},
		{name: "forwarded list", caller: reader, path: "/api/v1/namespaces/" + auditNS + "/configmaps", code: 200},
	}
	for _, tc := range cases {
		hc := vipClient(t, tc.caller, true)
		var codes [2]int
		codes[0], tc.viaAgent = auditedGet(t, ctx, hc, vipURL(tc.path), tc.caller.Token)
		codes[1], tc.direct = auditedGet(t, ctx, hc, c.APIServers()[0].URL+tc.path, tc.caller.Token)
		if codes[0] != tc.code || codes[1] != tc.code {
			t.Errorf("%s: code through the agent %d, direct %d, want %d", tc.name, codes[0], codes[1], tc.code)
		}
		if tc.viaAgent == "" || tc.direct == "" {
			t.Errorf("%s: Audit-Id through the agent %q, direct %q; want both", tc.name, tc.viaAgent, tc.direct)
		}
	}

	// then each read the agent answered is in its log as kube-apiserver
	// recorded the direct one.
	agentComplete, apiserverComplete := map[string]auditv1.Event{}, map[string]auditv1.Event{}
	agentStages := map[string][]auditv1.Stage{}
	var agentEvents []auditv1.Event
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		agentEvents = readAuditLog(t, logPath)
		clear(agentComplete)
		clear(agentStages)
		for _, ev := range agentEvents {
			agentStages[string(ev.AuditID)] = append(agentStages[string(ev.AuditID)], ev.Stage)
			if ev.Stage == auditv1.StageResponseComplete {
				agentComplete[string(ev.AuditID)] = ev
			}
		}
		clear(apiserverComplete)
		for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool { return ev.Stage == auditv1.StageResponseComplete }) {
			apiserverComplete[string(ev.AuditID)] = ev
		}
		for _, tc := range cases {
			if _, ok := apiserverComplete[tc.direct]; !ok {
				return false, nil
			}
			if _, ok := agentComplete[tc.viaAgent]; tc.cached && !ok {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for the events of every read: %v\nagent's log: %d events", err, len(agentEvents))
	}
	matched := 0
	for _, tc := range cases {
		direct := apiserverComplete[tc.direct]
		got, inAgentLog := agentComplete[tc.viaAgent]
		if !tc.cached {
			if inAgentLog {
				t.Errorf("%s: the forwarded read is in the agent's log: %+v", tc.name, got)
			}
			if _, ok := apiserverComplete[tc.viaAgent]; !ok {
				t.Errorf("%s: the forwarded read (Audit-Id %s) is not in kube-apiserver's log", tc.name, tc.viaAgent)
			}
			continue
		}
		if diff := cmp.Diff(auditRecordOf(direct), auditRecordOf(got)); diff != "" {
			t.Errorf("%s: the agent's event differs from kube-apiserver's (-kube-apiserver +agent):\n%s", tc.name, diff)
		} else {
			matched++
		}
		t.Logf("%s: the agent's event %s: %+v", tc.name, got.AuditID, auditRecordOf(got))
		wantDecision := map[int]string{200: "allow", 403: "forbid"}[tc.code]
		if d := got.Annotations["authorization.k8s.io/decision"]; d != wantDecision {
			t.Errorf("%s: decision %q, want %q", tc.name, d, wantDecision)
		}
		if len(got.SourceIPs) == 0 || got.SourceIPs[0] != tc.caller.IP {
			t.Errorf("%s: sourceIPs %v, want the pod's %s", tc.name, got.SourceIPs, tc.caller.IP)
		}
		if _, ok := apiserverComplete[tc.viaAgent]; ok {
			t.Errorf("%s: the cached read (Audit-Id %s) reached kube-apiserver", tc.name, tc.viaAgent)
		}
		if tc.stream {
			// A watch is recorded when its response starts, too.
			if want := []auditv1.Stage{auditv1.StageResponseStarted, auditv1.StageResponseComplete}; !cmp.Equal(agentStages[tc.viaAgent], want) {
				t.Errorf("%s: the agent recorded stages %v, want %v", tc.name, agentStages[tc.viaAgent], want)
			}
		}
	}

	// And the agent's log has a complete event for every request its
	// cache answered.
	var answered, handled float64
	complete := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		m := readCacheMetrics(t, ctx, agent)
		answered = m.outcomes["hit"] + m.outcomes["denied"]
		handled = sumWhere(scrapeAgent(t, ctx, agent)["kube_apicache_requests_total"], map[string]string{"handler": "cache"})
		complete = 0
		for _, ev := range readAuditLog(t, logPath) {
			if ev.Stage == auditv1.StageResponseComplete {
				complete++
			}
		}
		return float64(complete) == answered && answered == handled, nil
	})
	if err != nil {
		t.Errorf("agent's log has %d complete events; its cache answered %v requests (hits and denials), its cache handler served %v", complete, answered, handled)
	}
	figuref(t, "agent audit log: %d complete events for %v cache answers (%v served by the cache handler); %d of %d cached reads match kube-apiserver's event field for field",
		complete, answered, handled, matched, len(cases)-1)
}

// auditedGet sends a GET with token and returns the response's code and
// Audit-Id, after reading the whole body (a watch until it ends).
func auditedGet(t *testing.T, ctx context.Context, hc *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", acceptJSON)
	req.Header.Set("User-Agent", uaAudit)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Audit-Id")
}

// readAuditLog reads the agent's audit log.
func readAuditLog(t *testing.T, path string) []auditv1.Event {
	t.Helper()
	events, err := sandbox.ReadAuditLog(path)
	if err != nil {
		t.Fatalf("reading the agent's audit log: %v", err)
	}
	return events
}
