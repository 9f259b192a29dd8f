package idempotency_test

import (
	"os"
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	// The kill test starts this binary again as the server it kills.
	if os.Getenv(childSchemaEnv) != "" {
		os.Exit(runChildServer())
	}
	pgoncetest.Main(m)
}
