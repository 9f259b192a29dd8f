package idempotency

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// errResponseTooLarge is what a handler's Write returns past
// [Config.MaxResponseBytes].
var errResponseTooLarge = errors.New("idempotency: response exceeds MaxResponseBytes")

// ProblemTypeBase prefixes the type (RFC 9457) of the problems the
// middleware answers with; the suffix names the problem: missing-key,
// malformed-key, key-reused, in-progress, needs-review, key-expired,
// cancelled, failed, body-too-large, response-too-large, unauthorized,
// unavailable, internal.
const ProblemTypeBase = "urn:pgonce:idempotency:"

// problem is an RFC 9457 problem detail.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, kind, title, detail string, retryAfter time.Duration) {
	body, _ := json.Marshal(problem{Type: ProblemTypeBase + kind, Title: title, Status: status, Detail: detail})
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
