package outbox

import "time"

// SetWaitPolledFunc makes c's waits call f each time they arm their timer,
// with the key and how long until they re-read it. Call it before the first
// wait.
func SetWaitPolledFunc[TTx any](c *Client[TTx], f func(key Key, next time.Duration)) {
	c.waitPolledFunc = f
}
