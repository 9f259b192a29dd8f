package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func BenchmarkDeriveKey(b *testing.B) {
	fiveMembers := json.RawMessage(`{"order_id":"ord_8842","amount":"42.00","currency":"EUR","reason":"damaged on arrival","notify":true}`)

	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := 0; sb.Len() < 10<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku":"SKU-%05d","qty":%d,"price":%d.%02d,"name":"Item n\u00b0%d","tags":["a","b"]}`, i, i%7+1, i%100, i%100, i)
	}
	sb.WriteString(`],"customer":{"id":"cus_123","email":"zo\u00eb@example.com"}}`)
	tenKB := json.RawMessage(sb.String())

	for _, bb := range []struct {
		name string
		args any
	}{
		{"FiveMembers", fiveMembers},
		{"TenKB", tenKB},
		{"FiveMembersGoMap", map[string]any{"order_id": "ord_8842", "amount": "42.00", "currency": "EUR", "reason": "damaged on arrival", "notify": true}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			call := Call{Tenant: "acme", RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: bb.args}
			_, err := DeriveKey(call)
			require.NoError(b, err)

			b.ReportAllocs()
			if raw, ok := bb.args.(json.RawMessage); ok {
				b.SetBytes(int64(len(raw)))
			}
			for b.Loop() {
				if _, err := DeriveKey(call); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
