// Package sdktest tests package telemetry with the OpenTelemetry SDK's
// in-memory exporters.
//
// It is a module of its own, the one nested inside pgonce's tree, and never
// released. telemetry depends on the OpenTelemetry API alone and users bring
// their own SDK; a test in the core module that imported the SDK would put it
// in pgonce's go.mod, where minimal version selection would make the version
// tested here a floor for every user. A recorder written over the API instead
// would test telemetry against a fake rather than against the span batching
// and metric aggregation users run. docs/development.md says more.
package sdktest
