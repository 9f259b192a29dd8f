package httpstatus

import (
	"net/http"
	"strconv"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// ReplayedHeader is the response header that marks a replay, set to "true".
const ReplayedHeader = "Idempotent-Replayed"

// Status is the HTTP answer to one outcome: a status code and what the
// headers must say.
type Status struct {
	// Code is the HTTP status code, e.g. http.StatusCreated.
	Code int
	// RetryAfter, when positive, is when the client should ask again,
	// written as a Retry-After header of whole seconds, rounded up.
	RetryAfter time.Duration
	// Replayed reports that the response replays an outcome that belongs
	// to an earlier request, written as the [ReplayedHeader].
	Replayed bool
}

// For returns the HTTP answer to res and err, what a call of an
// [outbox.Client] returned; see the package documentation for the mapping.
func For(res outbox.Result, err error) Status {
	return forObservation(outbox.ObservationFor(res, err))
}

func forObservation(obs outbox.Observation) Status {
	s := Status{Code: http.StatusInternalServerError, Replayed: obs.Replayed}
	switch obs.Status {
	case outbox.ObservationSucceeded:
		s.Code = http.StatusCreated
		if obs.Replayed {
			s.Code = http.StatusOK
		}
	case outbox.ObservationFailed, outbox.ObservationCancelled:
		s.Code = http.StatusOK
	case outbox.ObservationInProgress:
		s.Code = http.StatusAccepted
		s.RetryAfter = time.Duration(obs.RetryAfterMS) * time.Millisecond
	case outbox.ObservationNeedsReview:
		s.Code = http.StatusAccepted
	case outbox.ObservationExpired:
		s.Code = http.StatusGone
	case outbox.ObservationConflict:
		s.Code = http.StatusConflict
	case outbox.ObservationInvalidArguments, outbox.ObservationUnknownTool:
		s.Code = http.StatusUnprocessableEntity
	case outbox.ObservationInvalidCall:
		s.Code = http.StatusBadRequest
	case outbox.ObservationNotFound:
		s.Code = http.StatusNotFound
	case outbox.ObservationUnavailable:
		s.Code = http.StatusServiceUnavailable
		s.RetryAfter = time.Duration(obs.RetryAfterMS) * time.Millisecond
	case outbox.ObservationError:
	default:
		// A state this version does not know is a finished outcome of the
		// request, reported by its observation.
		s.Code = http.StatusOK
	}
	return s
}

// SetHeaders sets the headers s calls for on h: Retry-After, in whole
// seconds rounded up and at least 1, when RetryAfter is positive, and the
// [ReplayedHeader] when Replayed.
func (s Status) SetHeaders(h http.Header) {
	if s.RetryAfter > 0 {
		seconds := (s.RetryAfter + time.Second - 1) / time.Second
		h.Set("Retry-After", strconv.FormatInt(int64(seconds), 10))
	}
	if s.Replayed {
		h.Set(ReplayedHeader, "true")
	}
}

// Write answers res and err on w: the headers of [For]'s Status,
// Content-Type application/json, the status code and the observation's
// JSON ([outbox.Observation.JSON]), so that the body embeds a stored
// response byte for byte. It returns the error of writing the body.
func Write(w http.ResponseWriter, res outbox.Result, err error) error {
	obs := outbox.ObservationFor(res, err)
	s := forObservation(obs)
	s.SetHeaders(w.Header())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(s.Code)
	_, writeErr := w.Write(obs.JSON())
	return writeErr
}
