package attempt

import (
	"context"
	"log/slog"
)

// loggerKey is the context key of [WithLogger].
type loggerKey struct{}

// WithLogger returns ctx carrying logger, which the runner's calls under ctx
// log to instead of [Config.Logger]: the dispatcher and the reconciler have
// loggers of their own.
func WithLogger(ctx context.Context, logger *slog.Logger) context.Context {
	if logger == nil {
		return ctx
	}
	return context.WithValue(ctx, loggerKey{}, logger)
}

// logger returns the logger of ctx (see [WithLogger]), or the runner's.
func (r *Runner) logger(ctx context.Context) *slog.Logger {
	if logger, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return logger
	}
	return r.config.Logger
}

// logFinal logs a final outcome that an operator may have to act on, once
// it is recorded: a key that failed, for good or at the attempt limit, or
// that needs review. Each is a warning with the key, the tool, the attempt
// and the last error. Successes are not logged; retries are the caller's to
// log, at debug.
func (r *Runner) logFinal(ctx context.Context, o Outcome) {
	var msg string
	switch {
	case o.Kind == Failed && o.GaveUp:
		msg = "pgonce: key gave up after its last attempt and failed"
	case o.Kind == Failed:
		msg = "pgonce: key failed permanently"
	case o.Kind == NeedsReview:
		msg = "pgonce: key needs review; nothing runs until an operator resolves it"
	default:
		return
	}
	attrs := []any{"key", o.Key, "tool", o.Tool, "attempt", o.Attempt, "error", errorText(o.Err)}
	if o.GaveUp {
		attrs = append(attrs, "gave_up", true)
	}
	r.logger(ctx).WarnContext(ctx, msg, attrs...)
}
