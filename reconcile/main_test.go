package reconcile_test

import (
	"os"
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	// The crash test starts this binary again as dispatcher processes.
	if os.Getenv(childSchemaEnv) != "" {
		os.Exit(runChildDispatcher())
	}
	pgoncetest.Main(m)
}
