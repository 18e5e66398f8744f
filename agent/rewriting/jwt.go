package rewriting

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
)

// maxTokenBytes bounds the tokens whose claims are read: a ServiceAccount
// token is about a kilobyte; anything far larger is not one.
const maxTokenBytes = 16 << 10

// unverifiedSubject returns the "sub" claim of a JWT without verifying
// it, or "" when token is not a JWT with one. It only decides whether a
// token is worth a TokenReview: a ServiceAccount token's subject is its
// user name (system:serviceaccount:<namespace>:<name>), and a token whose
// claims were altered fails the review.
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
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(payload, "="))
	if err != nil {
		return ""
	}
	var claims struct {
		Subject string `json:"sub"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return ""
	}
	return claims.Subject
}

// bearerToken reads the token as kube-apiserver's bearer token
// authenticator does: the first Authorization header, "Bearer <token>",
// scheme case-insensitive.
func bearerToken(h http.Header) (string, bool) {
	auth := strings.TrimSpace(h.Get("Authorization"))
	parts := strings.SplitN(auth, " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}
