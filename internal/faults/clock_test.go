package faults_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/outbox"
)

// TestClockSkew runs the campaign against a database whose clock is far
// from the workers': libfaketime under a private cluster's postmaster.
// Leases, backoffs and the key-retention window must all hold although the
// two clocks disagree by hours.
func TestClockSkew(t *testing.T) {
	t.Parallel()
	cluster := faults.NewCluster(t, nil)

	for _, tt := range []struct {
		name   string
		offset time.Duration
	}{
		{name: "DatabaseAhead", offset: time.Hour},
		{name: "DatabaseBehind", offset: -2 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cluster.SetEnv(map[string]string{
				"LD_PRELOAD": faults.FaketimeLibrary(t),
				"FAKETIME":   faketime(tt.offset),
			})
			cluster.Restart("fast")
			tally.Fault("clock_skew")

			// One call in ten acts and then times out, so that keyed calls
			// are retried within their provider's key retention of an hour,
			// and the other tools settle as their delivery says. (Each
			// timeout holds a call slot for the whole call timeout.)
			b := setup(t, &bundleOpts{
				cluster:  cluster,
				toolOpts: &outbox.ToolOpts{KeyRetention: time.Hour},
				mode: func(req outbox.Request) faults.Mode {
					if req.Attempt == 1 && strings.HasSuffix(req.NaturalID, "0") {
						return faults.ModeActThenTimeout
					}
					return faults.ModeReturn
				},
			})
			var dbNow time.Time
			require.NoError(t, b.direct.QueryRow(t.Context(), `SELECT now()`).Scan(&dbNow))
			skew := time.Until(dbNow)
			t.Logf("database clock %s, skew %s", dbNow.UTC().Format(time.RFC3339), skew.Round(time.Second))
			require.InDelta(t, tt.offset.Seconds(), skew.Seconds(), 60, "libfaketime moves the database's clock")

			stopSubmit := b.submit(t, 2, 10*time.Millisecond)
			stopDispatch := b.runDispatcher(t)
			time.Sleep(faults.Scale(2*time.Second, 20*time.Second))
			stopSubmit()
			stopDispatch()
			b.finish(t, faults.CheckOpts{})
		})
	}
}

// faketime spells offset as libfaketime's FAKETIME wants it: "+3600s".
func faketime(offset time.Duration) string {
	sign := "+"
	if offset < 0 {
		sign, offset = "-", -offset
	}
	return sign + strconv.FormatInt(int64(offset/time.Second), 10) + "s"
}
