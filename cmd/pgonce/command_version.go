package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
)

func versionCommand() *command {
	return &command{
		name:       "version",
		synopsis:   "version [--json]",
		summary:    "print the pgonce build and the schema version it needs",
		noSchema:   true,
		noDatabase: true,
		help: `Prints the version of this pgonce build (its Go module version, or the
VCS revision of a build from a checkout), the Go version it was built with,
and the newest migration it embeds: the schema version its commands need.
Needs no database.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(_ context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				return e.version(*asJSON)
			}
		},
	}
}

// buildVersion is the module version of this binary, or the VCS revision
// (and "+dirty") of a build from a checkout, or "(devel)".
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	version := info.Main.Version
	if version != "" && version != "(devel)" {
		return version
	}
	var revision, modified string
	for _, setting := range info.Settings {
		switch setting.Key {
		case "vcs.revision":
			revision = setting.Value
		case "vcs.modified":
			modified = setting.Value
		}
	}
	if revision == "" {
		return "(devel)"
	}
	if len(revision) > 12 {
		revision = revision[:12]
	}
	if modified == "true" {
		revision += "+dirty"
	}
	return "(devel) " + revision
}

func (e *env) version(asJSON bool) error {
	versions := slices.Sorted(maps.Keys(migrationFiles()))
	var schemaVersion int64
	if len(versions) > 0 {
		schemaVersion = versions[len(versions)-1]
	}
	if asJSON {
		return writeJSON(e.stdout, struct {
			Version       string `json:"version"`
			Go            string `json:"go"`
			SchemaVersion int64  `json:"schema_version"`
		}{buildVersion(), runtime.Version(), schemaVersion})
	}
	fmt.Fprintf(e.stdout, "pgonce %s (%s)\nschema version %d\n", buildVersion(), runtime.Version(), schemaVersion)
	return nil
}
