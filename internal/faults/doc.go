// Package faults is pgonce's fault campaign: a history checker, ledger providers, a TCP proxy, private clusters and backend killers.
package faults
