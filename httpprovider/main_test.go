package httpprovider_test

import (
	"os"
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	// The process test starts this binary again as a dispatcher.
	if os.Getenv(childSchemaEnv) != "" {
		os.Exit(runChildDispatcher())
	}
	pgoncetest.Main(m)
}
