package storagebench_test

import (
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	pgoncetest.MainThen(m, func(code int) int {
		// The scale fixtures outlive every repetition of BenchmarkScale, so
		// they are summarised and dropped here, whether the run passed or
		// failed.
		scaleFinish()
		return code
	})
}
