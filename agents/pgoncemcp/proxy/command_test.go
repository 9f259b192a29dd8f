package proxy_test

import "os/exec"

// newCommand is exec.Command, for the tests' own programs.
func newCommand(name string, args ...string) *exec.Cmd {
	return exec.Command(name, args...) //nolint:gosec // the tests' own programs
}
