package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// stateFileName is the file the CSR source keeps in its state directory.
const stateFileName = "serving-certificate.json"

// savedState is what a CSR source keeps in its state directory so that the
// next process in the same pod (after a crash or an OOM kill) continues
// where this one stopped instead of sending a new CSR. The directory is
// meant to be a memory-backed volume: the key is on no disk, but it does
// outlive the process.
type savedState struct {
	// Template is the hash of the request configuration (requestTemplate)
	// that Pending and Denied belong to.
	Template string `json:"template"`
	// Signer, Certificate and Key are the issued chain and its key (PEM),
	// and the signer that issued it; all empty before the first issue.
	Signer      string `json:"signer,omitempty"`
	Certificate string `json:"certificate,omitempty"`
	Key         string `json:"key,omitempty"`
	// Pending is the request sent (or about to be sent) and not answered.
	Pending *savedRequest `json:"pending,omitempty"`
	// Denied is the last denial of a request for Template.
	Denied *denial `json:"denied,omitempty"`
}

// savedRequest is a CSR the source waits for. Its key is written before
// the CSR is created, so a process that dies in between finds it (and the
// CSR, whose name derives from the key) again.
type savedRequest struct {
	Name    string    `json:"name"`
	UID     types.UID `json:"uid,omitempty"`
	Key     string    `json:"key"`
	Created time.Time `json:"created"`
}

// denial is an approver's Denied condition on one of the source's CSRs.
type denial struct {
	CSR     string `json:"csr"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// stateDir reads and writes savedState in one directory. A nil *stateDir
// keeps nothing.
type stateDir struct {
	path string
}

func newStateDir(path string) (*stateDir, error) {
	if path == "" {
		return nil, nil
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("certificate state directory: %w", err)
	}
	return &stateDir{path: path}, nil
}

func (d *stateDir) file() string { return filepath.Join(d.path, stateFileName) }

// load returns the saved state, or nil if there is none.
func (d *stateDir) load() (*savedState, error) {
	if d == nil {
		return nil, nil
	}
	data, err := os.ReadFile(d.file())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.file(), err)
	}
	var s savedState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", d.file(), err)
	}
	return &s, nil
}

// save replaces the saved state atomically: a reader (the next process)
// sees the old state or the new one, never a torn file. The file is 0600.
func (d *stateDir) save(s *savedState) error {
	if d == nil {
		return nil
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.path, "."+stateFileName+".*")
	if err != nil {
		return fmt.Errorf("writing certificate state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("writing certificate state: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing certificate state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing certificate state: %w", err)
	}
	if err := os.Rename(tmp.Name(), d.file()); err != nil {
		return fmt.Errorf("writing certificate state: %w", err)
	}
	return nil
}

// requestTemplate is what decides whether an approver would answer a
// request the same way twice: subject, names, IPs, signer, usages and
// lifetime. A denial holds for as long as this stays the same.
type requestTemplate struct {
	Signer      string   `json:"signer"`
	CommonName  string   `json:"cn"`
	Orgs        []string `json:"o"`
	DNSNames    []string `json:"dns"`
	IPs         []string `json:"ips"`
	Usages      []string `json:"usages"`
	LifetimeSec int64    `json:"lifetime"`
}

// hash returns a stable digest of t, independent of the order of names
// and IPs.
func (t requestTemplate) hash() string {
	t.DNSNames = slices.Sorted(slices.Values(t.DNSNames))
	t.IPs = slices.Sorted(slices.Values(t.IPs))
	data, _ := json.Marshal(t)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
