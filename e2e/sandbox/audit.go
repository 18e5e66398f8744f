package sandbox

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// AuditEvents reads every event kube-apiserver has logged so far.
func (c *Cluster) AuditEvents() ([]auditv1.Event, error) {
	return ReadAuditLog(c.AuditLog)
}

// ReadAuditLog reads the events of a JSON-lines audit log, kube-apiserver's
// or the agent's.
func ReadAuditLog(path string) ([]auditv1.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []auditv1.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("parsing audit event %.200q: %w", sc.Text(), err)
		}
		events = append(events, ev)
	}
	return events, sc.Err()
}
