package outbox_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestObservationIsAlwaysValidUTF8JSON(t *testing.T) {
	t.Parallel()

	key := outbox.Key("k1_" + strings.Repeat("cd", 32))
	for _, tt := range []struct {
		name  string
		bytes string
		// want is the string the observation embeds instead of the bytes.
		want string
	}{
		{"InvalidByteInString", "{\"s\":\"\xff\"}", "{\"s\":\"\uFFFD\"}"},
		{"InvalidByteInMemberName", "{\"\xfe\":1}", "{\"\uFFFD\":1}"},
		{"TruncatedSequence", "[\"caf\xc3\"]", "[\"caf\uFFFD\"]"},
		{"SurrogateEncodedAsUTF8", "\"\xed\xa0\x80\"", "\"\uFFFD\uFFFD\uFFFD\""},
	} {
		for _, state := range []outbox.State{outbox.StateSucceeded, outbox.StateFailed} {
			t.Run(tt.name+string(state), func(t *testing.T) {
				t.Parallel()
				require.True(t, json.Valid([]byte(tt.bytes)), "json.Valid accepts %q", tt.bytes)

				res := outbox.Result{Key: key, State: state}
				field := "response"
				if state == outbox.StateSucceeded {
					res.Response = json.RawMessage(tt.bytes)
				} else {
					res.Failure, field = json.RawMessage(tt.bytes), "failure"
				}
				obs := res.Observation()
				marshalled, err := json.Marshal(obs)
				require.NoError(t, err)
				for _, doc := range [][]byte{obs.JSON(), marshalled} {
					require.True(t, utf8.Valid(doc), "%q", doc)
					require.True(t, json.Valid(doc), "%q", doc)
					var decoded map[string]any
					require.NoError(t, json.Unmarshal(doc, &decoded))
					require.Equal(t, tt.want, decoded[field])
				}
				// The result keeps the stored bytes verbatim.
				require.Equal(t, tt.bytes, string(res.Response)+string(res.Failure))
			})
		}
	}

	t.Run("ValidUTF8JSONStaysVerbatim", func(t *testing.T) {
		t.Parallel()
		raw := `{"s": "caf\u00e9", "t":"café"}`
		res := outbox.Result{Key: key, State: outbox.StateSucceeded, Created: true, Response: json.RawMessage(raw)}
		require.Equal(t, `{"status":"succeeded","key":"`+string(key)+`","response":`+raw+`}`, string(res.Observation().JSON()))
	})

	t.Run("StoredBytesReplayVerbatim", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		stored := "{\"s\":\"\xff\"}"
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(stored)}, outbox.IdempotentByKey))
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
		require.NoError(t, err)

		_, err = client.Do(t.Context(), refundCall("run-utf8"), nil)
		require.NoError(t, err)
		res, err := client.Do(t.Context(), refundCall("run-utf8"), nil)
		require.NoError(t, err)
		require.True(t, res.Replayed())
		require.Equal(t, stored, string(res.Response))
		doc := res.Observation().JSON()
		require.True(t, utf8.Valid(doc), "%q", doc)
		require.True(t, json.Valid(doc), "%q", doc)
	})
}
