package main

import (
	"bytes"
	"cmp"
	"os"
	"strings"
	"testing"
)

// TestRefund runs the example and checks its story: one refund, and the same
// tool result on every ask that got one.
func TestRefund(t *testing.T) {
	t.Parallel()
	url := cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault)
	var out bytes.Buffer
	if err := run(t.Context(), &out, url); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"refunds made by the server:        1 (its tool ran 1 time)\n",
		"the same tool result on each ask:  true\n",
		"pgonce:           in_progress;",
	} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the story lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
