// Package failover is pgonce's high-availability campaign: a primary and a
// streaming standby of PostgreSQL's own replication, synchronous or not,
// and the fault campaign's load run through a failover from one to the
// other.
package failover
