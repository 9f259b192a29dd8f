package failover_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/pgonce/pgonce/internal/failover"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) {
	pgoncetest.MainThen(m, func(code int) int {
		figuresMu.Lock()
		defer figuresMu.Unlock()
		// Sorted, so that the table reads the same from run to run.
		sort.Slice(figures, func(i, j int) bool { return figures[i].Mode < figures[j].Mode })
		if len(figures) == 0 {
			return code
		}
		lines := make([]string, 0, len(figures))
		for _, f := range figures {
			lines = append(lines, f.String()+" profile="+faults.ProfileName())
		}
		if faults.Long() {
			// make failover prints the table for the docs.
			lines = append(lines, failover.TableHeader)
			for _, f := range figures {
				lines = append(lines, f.Row())
			}
		}
		out := strings.Join(lines, "\n")
		fmt.Println(out)
		if path := os.Getenv(faults.SummaryFileEnv); path != "" {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				fmt.Fprintln(f, out)
				_ = f.Close()
			}
		}
		return code
	})
}
