package proxy

import "errors"

// ErrInvalidConfig is returned by [ParseConfig], [LoadConfig] and [New] for a
// configuration that cannot run: no upstream or two, an unknown delivery, a
// negative duration, an unknown field. Nothing is started.
var ErrInvalidConfig = errors.New("invalid MCP proxy config")

// ErrUpstream is returned by [New] when the upstream MCP server cannot be
// started, reached or initialised, or its tools cannot be listed.
var ErrUpstream = errors.New("MCP proxy upstream")
