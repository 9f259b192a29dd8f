// Package sdktest tests package telemetry with the OpenTelemetry SDK's
// in-memory exporters. It is a module of its own, never released, so that
// the SDK stays out of pgonce's go.mod: users bring their own.
package sdktest
