package faults

import "os"

// ProfileEnv selects the campaign's profile: "long" for the long one (make
// faults); anything else, or nothing, for the quick one that CI runs.
const ProfileEnv = "PGONCE_FAULTS"

// SummaryFileEnv names a file the test binary appends its summary line to,
// so that a run of many packages can show it (make test does).
const SummaryFileEnv = "PGONCE_FAULTS_SUMMARY"

// Long reports whether the long profile was selected.
func Long() bool { return os.Getenv(ProfileEnv) == "long" }

// Scale returns quick in the quick profile and long in the long one.
func Scale[T any](quick, long T) T {
	if Long() {
		return long
	}
	return quick
}

// ProfileName names the selected profile.
func ProfileName() string { return Scale("quick", "long") }
