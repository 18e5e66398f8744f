package rewriting

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
)

// maxTokenBytes bounds the tokens whose claims are read: a ServiceAccount
// token is about a kilobyte; anything far larger is not one.
const maxTokenBytes = 16 << 10

// claimBuffers hold decoded token payloads: every request of every
// caller passes here once profiles exist, so it must not allocate.
var claimBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

var subjectKey = []byte(`"sub":"`)

// unverifiedSubject returns the "sub" claim of a JWT without verifying
// it, or "" when token is not a JWT with one. It only decides whether a
// token is worth a TokenReview: a ServiceAccount token's subject is its
// user name (system:serviceaccount:<namespace>:<name>), and a token whose
// claims were altered fails the review. kube-apiserver writes its tokens'
// claims as compact JSON, where the subject is found as it is; any other
// form is read with a JSON decoder.
func unverifiedSubject(token string) string {
	if len(token) > maxTokenBytes {
		return ""
	}
	_, rest, ok := strings.Cut(token, ".")
	if !ok {
		return ""
	}
	payload, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	payload = strings.TrimRight(payload, "=")
	bp := claimBuffers.Get().(*[]byte)
	defer claimBuffers.Put(bp)
	n := base64.RawURLEncoding.DecodedLen(len(payload))
	if cap(*bp) < n {
		*bp = make([]byte, 0, n)
	}
	raw := (*bp)[:n]
	if _, err := base64.RawURLEncoding.Decode(raw, []byte(payload)); err != nil {
		return ""
	}
	if i := bytes.Index(raw, subjectKey); i >= 0 {
		v := raw[i+len(subjectKey):]
		if end := bytes.IndexByte(v, '"'); end >= 0 && bytes.IndexByte(v[:end], '\\') < 0 {
			return string(v[:end])
		}
	}
	var claims struct {
		Subject string `json:"sub"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return ""
	}
	return claims.Subject
}
