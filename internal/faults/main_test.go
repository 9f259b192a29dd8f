package faults_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// tally adds up the campaigns of this test binary for the summary line.
var tally faults.Tally

func TestMain(m *testing.M) {
	// The crash loop starts this binary again as a dispatcher.
	if os.Getenv(childSchemaEnv) != "" {
		os.Exit(runChild())
	}
	pgoncetest.MainThen(m, func(code int) int {
		line := tally.Summary() + " profile=" + faults.ProfileName()
		fmt.Println(line)
		if path := os.Getenv(faults.SummaryFileEnv); path != "" {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				fmt.Fprintln(f, line)
				_ = f.Close()
			}
		}
		return code
	})
}
