package dispatcher_test

import (
	"os"
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	// The multi-process test starts this binary again as a dispatcher.
	if os.Getenv(childSchemaEnv) != "" {
		os.Exit(runChildDispatcher())
	}
	// TestDevelopmentPreset starts it again as a process that crashes.
	if os.Getenv(presetChildSchemaEnv) != "" {
		os.Exit(runPresetChild())
	}
	// BenchmarkDrainMemory starts it again as a dispatcher of its own.
	if os.Getenv(memoryChildSchemaEnv) != "" {
		os.Exit(runMemoryChild())
	}
	pgoncetest.Main(m)
}
