package idempotency

import (
	"bytes"
	"net/http"
)

// recorder holds a handler's response until it is stored. It implements no
// http.Flusher: a streaming handler's flushes fail with
// http.ErrNotSupported through http.ResponseController, and its response is
// sent whole at the end.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int
	tooLarge bool
}

func newRecorder(maxBytes int) *recorder {
	return &recorder{header: http.Header{}, max: maxBytes}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.body.Len()+len(p) > r.max {
		r.tooLarge = true
		return 0, errResponseTooLarge
	}
	return r.body.Write(p)
}

// finish closes the response once the handler returned: a handler that
// wrote nothing answered 200 with an empty body, as net/http sends it, and
// that is the response stored and replayed.
func (r *recorder) finish() {
	if r.status == 0 {
		r.status = http.StatusOK
	}
}

// send writes the recorded response to w with header.
func (r *recorder) send(w http.ResponseWriter, header http.Header) {
	for name, values := range header {
		w.Header()[name] = values
	}
	r.finish()
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
