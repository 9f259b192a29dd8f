package httpprovider_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/httpprovider"
)

// TestDefaultClientIsApartFromTheDefaultTransport checks that a provider
// without a Client of its own keeps its connections when other code closes
// the idle connections of http.DefaultTransport, as every closing
// httptest.Server does: a request that was taking such a connection would
// fail as "connection broken", an unknown outcome.
func TestDefaultClientIsApartFromTheDefaultTransport(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	server := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"id":"re_1"}`))
	}))
	server.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			conns.Add(1)
		}
	}
	server.Start()
	t.Cleanup(server.Close)
	p, err := httpprovider.New(httpprovider.Config{URL: server.URL + "/v1/refunds"})
	require.NoError(t, err)

	_, err = p.Call(t.Context(), testRequest())
	require.NoError(t, err)
	transport, ok := http.DefaultTransport.(*http.Transport)
	require.True(t, ok, "http.DefaultTransport is an *http.Transport")
	transport.CloseIdleConnections()
	_, err = p.Call(t.Context(), testRequest())
	require.NoError(t, err)

	require.Equal(t, int32(1), conns.Load(), "the second call reuses the first one's connection")
}
