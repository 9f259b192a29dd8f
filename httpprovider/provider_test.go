package httpprovider_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/outbox"
)

const testKey = outbox.Key("k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa")

func testRequest() outbox.Request {
	return outbox.Request{Key: testKey, Tool: "refund", Args: json.RawMessage(`{"amount":42,"order":8842}`), Attempt: 1}
}

// answering returns a provider over a server that answers every request
// with handler.
func answering(t *testing.T, config httpprovider.Config, handler http.HandlerFunc) *httpprovider.Provider {
	t.Helper()
	server := httptest.NewServer(handler)
	t.Cleanup(server.Close)
	config.URL = server.URL + "/v1/refunds"
	p, err := httpprovider.New(config)
	require.NoError(t, err)
	return p
}

// retryDelay is the wait err asks for: a retry-after's, or a slow down's.
func retryDelay(err error) time.Duration {
	var hinted *outbox.RetryAfterError
	if errors.As(err, &hinted) {
		return hinted.Delay
	}
	var slow *outbox.SlowDownError
	if errors.As(err, &slow) {
		return slow.Delay
	}
	return 0
}

func TestCall(t *testing.T) {
	t.Parallel()

	t.Run("SendsKeyHeaderAndCanonicalArgs", func(t *testing.T) {
		t.Parallel()
		var gotKey, gotType, gotBody, gotMethod string
		p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, r *http.Request) {
			gotKey, gotType, gotMethod = r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type"), r.Method
			body := make([]byte, 100)
			n, _ := r.Body.Read(body)
			gotBody = string(body[:n])
			w.WriteHeader(http.StatusOK)
		})
		_, err := p.Call(t.Context(), testRequest())
		require.NoError(t, err)
		require.Equal(t, string(testKey), gotKey)
		require.Equal(t, "application/json", gotType)
		require.Equal(t, http.MethodPost, gotMethod)
		require.JSONEq(t, `{"amount":42,"order":8842}`, gotBody)
		require.Equal(t, `{"amount":42,"order":8842}`, gotBody)
	})

	t.Run("ConfiguredHeaderKeyFuncAndBody", func(t *testing.T) {
		t.Parallel()
		var gotKey, gotBody, gotAuth string
		p := answering(t, httpprovider.Config{
			KeyHeader: "X-Request-Key",
			KeyFunc:   httpprovider.Truncate(40),
			BodyFunc: func(req outbox.Request) ([]byte, string, error) {
				return []byte("amount=42"), "application/x-www-form-urlencoded", nil
			},
			RequestFunc: func(r *http.Request, _ outbox.Request) error {
				r.Header.Set("Authorization", "Bearer sk_test")
				return nil
			},
		}, func(w http.ResponseWriter, r *http.Request) {
			gotKey, gotAuth = r.Header.Get("X-Request-Key"), r.Header.Get("Authorization")
			body := make([]byte, 100)
			n, _ := r.Body.Read(body)
			gotBody = string(body[:n])
		})
		_, err := p.Call(t.Context(), testRequest())
		require.NoError(t, err)
		require.Equal(t, string(testKey)[:40], gotKey)
		require.Equal(t, "amount=42", gotBody)
		require.Equal(t, "Bearer sk_test", gotAuth)
	})

	t.Run("SuccessStoresStatusKeptHeadersAndBodyVerbatim", func(t *testing.T) {
		t.Parallel()
		body := "{\"id\": \"re_1\",   \"amount\": 42}\n"
		p := answering(t, httpprovider.Config{KeepHeaders: []string{"request-id"}}, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Request-Id", "req_9")
			w.Header().Set("Set-Cookie", "not=kept")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(body))
		})
		stored, err := p.Call(t.Context(), testRequest())
		require.NoError(t, err)
		resp, err := httpprovider.Decode(stored)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.Status)
		require.Equal(t, http.Header{"Request-Id": {"req_9"}}, resp.Header)
		require.Equal(t, body, string(resp.Body))
	})

	t.Run("ClientErrorIsPermanentWithBodyVerbatim", func(t *testing.T) {
		t.Parallel()
		for _, code := range []int{http.StatusBadRequest, http.StatusPaymentRequired, http.StatusNotFound, http.StatusUnprocessableEntity} {
			body := `{"error": {"code": "card_declined"}}`
			p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(code)
				_, _ = w.Write([]byte(body))
			})
			_, err := p.Call(t.Context(), testRequest())
			var permanent *outbox.PermanentError
			require.ErrorAs(t, err, &permanent, "status %d", code)
			resp, err := httpprovider.Decode(permanent.Body())
			require.NoError(t, err)
			require.Equal(t, code, resp.Status)
			require.Equal(t, body, string(resp.Body))
			// The envelope keeps the body's bytes in place.
			require.Contains(t, string(permanent.Body()), body)
		}
	})

	t.Run("RetryableStatusesHonourRetryAfter", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			code      int
			ambiguous bool
		}{
			{http.StatusConflict, false},
			{http.StatusRequestTimeout, false},
			{http.StatusTooEarly, false},
			{http.StatusTooManyRequests, false},
			{http.StatusInternalServerError, true},
			{http.StatusBadGateway, true},
			{http.StatusServiceUnavailable, true},
		} {
			p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(tt.code)
			})
			_, err := p.Call(t.Context(), testRequest())
			require.Error(t, err)
			var permanent *outbox.PermanentError
			require.NotErrorAs(t, err, &permanent, "status %d", tt.code)
			require.Equal(t, tt.ambiguous, outbox.IsAmbiguous(err), "status %d", tt.code)
			require.Equal(t, 7*time.Second, retryDelay(err), "status %d", tt.code)
			var slow *outbox.SlowDownError
			require.Equal(t, tt.code == http.StatusTooManyRequests || tt.code == http.StatusServiceUnavailable,
				errors.As(err, &slow), "status %d slows the whole tool down", tt.code)
		}
	})

	t.Run("TooManyRequestsWithoutRetryAfterSlowsOnlyTheKey", func(t *testing.T) {
		t.Parallel()
		p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests)
		})
		_, err := p.Call(t.Context(), testRequest())
		require.Error(t, err)
		var slow *outbox.SlowDownError
		require.NotErrorAs(t, err, &slow)
	})

	t.Run("RetryAfterDateAndCap", func(t *testing.T) {
		t.Parallel()
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		for _, tt := range []struct {
			header string
			want   time.Duration
		}{
			{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
			{now.Add(-time.Minute).Format(http.TimeFormat), 0},
			{"86400", 2 * time.Minute},
			{"soon", 0},
			{"", 0},
		} {
			p := answering(t, httpprovider.Config{RetryAfterMax: 2 * time.Minute, NowFunc: func() time.Time { return now }},
				func(w http.ResponseWriter, _ *http.Request) {
					if tt.header != "" {
						w.Header().Set("Retry-After", tt.header)
					}
					w.WriteHeader(http.StatusTooManyRequests)
				})
			_, err := p.Call(t.Context(), testRequest())
			require.Error(t, err)
			require.Equal(t, tt.want, retryDelay(err), "Retry-After %q", tt.header)
		}
	})

	t.Run("DroppedAfterWriteIsAmbiguous", func(t *testing.T) {
		t.Parallel()
		p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		})
		_, err := p.Call(t.Context(), testRequest())
		require.Error(t, err)
		require.True(t, outbox.IsAmbiguous(err), "%v", err)
	})

	t.Run("TimeoutAfterWriteIsAmbiguous", func(t *testing.T) {
		t.Parallel()
		done := make(chan struct{})
		// Long enough for the request to be written on a busy machine.
		p := answering(t, httpprovider.Config{Timeout: time.Second}, func(_ http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-done:
			}
		})
		defer close(done)
		_, err := p.Call(t.Context(), testRequest())
		require.Error(t, err)
		require.True(t, outbox.IsAmbiguous(err), "%v", err)
	})

	t.Run("NotSentIsAPlainRetry", func(t *testing.T) {
		t.Parallel()
		// A port nobody listens on: the connection is refused, nothing
		// was written.
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := listener.Addr().String()
		require.NoError(t, listener.Close())
		p, err := httpprovider.New(httpprovider.Config{URL: "http://" + addr + "/v1/refunds"})
		require.NoError(t, err)
		_, err = p.Call(t.Context(), testRequest())
		require.Error(t, err)
		require.False(t, outbox.IsAmbiguous(err), "%v", err)
		var permanent *outbox.PermanentError
		require.NotErrorAs(t, err, &permanent)
	})

	t.Run("TooLargeResponseIsAmbiguousNeverTruncated", func(t *testing.T) {
		t.Parallel()
		p := answering(t, httpprovider.Config{MaxResponseBytes: 16}, func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"id":"re_1","padding":"xxxxxxxxxxxx"}`))
		})
		stored, err := p.Call(t.Context(), testRequest())
		require.Nil(t, stored)
		require.ErrorIs(t, err, httpprovider.ErrResponseTooLarge)
		require.True(t, outbox.IsAmbiguous(err))
	})

	t.Run("BadKeyFuncIsPermanentAndSendsNothing", func(t *testing.T) {
		t.Parallel()
		sent := false
		p := answering(t, httpprovider.Config{KeyFunc: func(outbox.Key) (string, error) { return "a\nb", nil }},
			func(http.ResponseWriter, *http.Request) { sent = true })
		_, err := p.Call(t.Context(), testRequest())
		var permanent *outbox.PermanentError
		require.ErrorAs(t, err, &permanent)
		require.False(t, sent)
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		config httpprovider.Config
	}{
		{"NoURL", httpprovider.Config{}},
		{"RelativeURL", httpprovider.Config{URL: "/v1/refunds"}},
		{"NotHTTP", httpprovider.Config{URL: "ftp://example.com/x"}},
		{"BadHeader", httpprovider.Config{URL: "http://example.com", KeyHeader: "Idempotency Key"}},
		{"BadMethod", httpprovider.Config{URL: "http://example.com", Method: "PO ST"}},
		{"NegativeTimeout", httpprovider.Config{URL: "http://example.com", Timeout: -time.Second}},
		{"NegativeKeyRetention", httpprovider.Config{URL: "http://example.com", KeyRetention: -time.Hour}},
		{"BadKeptHeader", httpprovider.Config{URL: "http://example.com", KeepHeaders: []string{"a:b"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := httpprovider.New(tt.config)
			require.ErrorIs(t, err, httpprovider.ErrInvalidConfig)
			require.Nil(t, p)
		})
	}
	_, err := httpprovider.NewLookup(httpprovider.Config{URL: "http://example.com"}, httpprovider.LookupConfig{})
	require.ErrorIs(t, err, httpprovider.ErrInvalidConfig)
}

func TestEnvelopeRoundTrips(t *testing.T) {
	t.Parallel()
	for _, body := range [][]byte{
		nil,
		[]byte(`{"id": "re_1",  "n": 1.50}`),
		[]byte("{\"id\":\"re_1\"}\n"),
		[]byte("plain <text> & more"),
		{0xff, 0x00, 0xfe},
		[]byte(`"a string"`),
	} {
		resp := &httpprovider.Response{Status: 201, Header: http.Header{"Request-Id": {"req_1"}}, Body: body}
		stored, err := resp.Encode()
		require.NoError(t, err)
		require.True(t, json.Valid(stored), "%s", stored)
		back, err := httpprovider.Decode(stored)
		require.NoError(t, err)
		require.Equal(t, resp.Status, back.Status)
		require.Equal(t, resp.Header, back.Header)
		require.Equal(t, string(body), string(back.Body))
	}
	_, err := httpprovider.Decode(json.RawMessage(`{"ok":true}`))
	require.ErrorIs(t, err, httpprovider.ErrNotEnvelope)
}

func TestTransforms(t *testing.T) {
	t.Parallel()
	hex, err := httpprovider.HexOnly(testKey)
	require.NoError(t, err)
	require.Equal(t, string(testKey)[3:], hex)
	short, err := httpprovider.Truncate(httpprovider.TruncateMin)(testKey)
	require.NoError(t, err)
	require.Equal(t, string(testKey)[:19], short)
	whole, err := httpprovider.Truncate(255)(testKey)
	require.NoError(t, err)
	require.Equal(t, string(testKey), whole)
	require.Panics(t, func() { httpprovider.Truncate(8) })
	_ = context.Background
}

func TestInvalidUTF8JSONBodyIsStoredAsBase64(t *testing.T) {
	t.Parallel()
	body := []byte("{\"s\":\"\xff\"}")
	require.True(t, json.Valid(body), "encoding/json calls it valid")
	p := answering(t, httpprovider.Config{}, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	})
	stored, err := p.Call(t.Context(), testRequest())
	require.NoError(t, err)
	require.True(t, utf8.Valid(stored), "the envelope is valid UTF-8: %q", stored)
	require.True(t, json.Valid(stored), "%s", stored)
	var env map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(stored, &env))
	require.Contains(t, env, "body_base64")
	require.NotContains(t, env, "body")
	resp, err := httpprovider.Decode(stored)
	require.NoError(t, err)
	require.Equal(t, body, resp.Body, "byte for byte")
}

func TestRedirects(t *testing.T) {
	t.Parallel()

	type bundle struct {
		elsewhere     *httptest.Server
		elsewhereHits atomic.Int64
		origin        *httptest.Server
		originHits    atomic.Int64
	}
	setup := func(t *testing.T, status int, sameOrigin bool) *bundle {
		t.Helper()
		b := &bundle{}
		b.elsewhere = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.elsewhereHits.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"stolen_key":"` + r.Header.Get("Idempotency-Key") + `"}`))
		}))
		t.Cleanup(b.elsewhere.Close)
		b.origin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.originHits.Add(1)
			switch {
			case r.URL.Path == "/v1/refunds" && sameOrigin:
				http.Redirect(w, r, "/v1/refunds/new", status)
			case r.URL.Path == "/v1/refunds":
				http.Redirect(w, r, b.elsewhere.URL+"/v1/refunds", status)
			default:
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"id":"re_1","key":"` + r.Header.Get("Idempotency-Key") + `"}`))
			}
		}))
		t.Cleanup(b.origin.Close)
		return b
	}

	for name, redirects := range map[string]httpprovider.Redirects{"None": httpprovider.RedirectsNone, "SameOrigin": httpprovider.RedirectsSameOrigin} {
		t.Run("AnotherOriginIsNeverFollowedWithRedirects"+name, func(t *testing.T) {
			t.Parallel()
			for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
				b := setup(t, status, false)
				p, err := httpprovider.New(httpprovider.Config{
					URL: b.origin.URL + "/v1/refunds", KeepHeaders: []string{"Location"}, Redirects: redirects,
				})
				require.NoError(t, err)
				_, err = p.Call(t.Context(), testRequest())
				var permanent *outbox.PermanentError
				require.ErrorAs(t, err, &permanent, "the redirect is the outcome")
				resp, err := httpprovider.Decode(permanent.Body())
				require.NoError(t, err)
				require.Equal(t, status, resp.Status)
				require.Equal(t, b.elsewhere.URL+"/v1/refunds", resp.Header.Get("Location"))
				require.Equal(t, int64(0), b.elsewhereHits.Load(), "neither the request nor its key left the origin")
			}
		})
	}

	t.Run("SameOriginOnlyWhenAsked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, http.StatusTemporaryRedirect, true)
		p, err := httpprovider.New(httpprovider.Config{URL: b.origin.URL + "/v1/refunds"})
		require.NoError(t, err)
		_, err = p.Call(t.Context(), testRequest())
		var permanent *outbox.PermanentError
		require.ErrorAs(t, err, &permanent, "not followed by default")
		require.Equal(t, int64(1), b.originHits.Load())

		followed := 0
		p, err = httpprovider.New(httpprovider.Config{
			URL: b.origin.URL + "/v1/refunds", Redirects: httpprovider.RedirectsSameOrigin,
			Client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
				followed++ // the client's own policy still has its say
				return nil
			}},
		})
		require.NoError(t, err)
		stored, err := p.Call(t.Context(), testRequest())
		require.NoError(t, err)
		resp, err := httpprovider.Decode(stored)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.Status)
		require.JSONEq(t, `{"id":"re_1","key":"`+string(testKey)+`"}`, string(resp.Body))
		require.Equal(t, 1, followed)
	})

	t.Run("UnknownRedirectsRefused", func(t *testing.T) {
		t.Parallel()
		_, err := httpprovider.New(httpprovider.Config{URL: "http://example.com", Redirects: 7})
		require.ErrorIs(t, err, httpprovider.ErrInvalidConfig)
	})
}
