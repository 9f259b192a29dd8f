package console_test

import (
	"testing"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	pgoncetest.Main(m)
}
