package dispatcher

import (
	"context"
	"strings"

	"github.com/pgonce/pgonce/internal/attempt"
)

// toolNotificationPrefix starts the payload of a work notification that a
// tool's flow control changed (see queries/tool.sql).
const toolNotificationPrefix = "tool:"

// isToolNotification reports whether a work notification's payload says
// that a tool's flow control changed.
func isToolNotification(payload string) bool {
	return strings.HasPrefix(payload, toolNotificationPrefix)
}

// throttle applies a provider's slow down of out (out.SlowDown > 0): the
// tool is slowed down for every dispatcher, and a Retry outcome's key goes
// back to pending without spending its attempt. It reports whether the
// outcome needs no recording: false when out is another kind (recorded as
// usual) or when the throttle statement failed (out is then recorded as
// an ordinary retry, after its delay).
func (d *Dispatcher[TTx]) throttle(ctx context.Context, out *attempt.Outcome) bool {
	res, err := d.claimer.Throttle(ctx, out)
	if err != nil {
		d.logger.ErrorContext(ctx, "pgonce: slowing the tool down failed; the key is retried after its delay",
			"tool", out.Tool, "key", out.Key, "error", err)
		return false
	}
	d.logger.InfoContext(ctx, "pgonce: the provider asked to slow down; no call of the tool until not_before",
		"tool", out.Tool, "key", out.Key, "not_before", res.NotBefore, "delay", out.SlowDown)
	return out.Kind == attempt.Retry && res.Released
}
