#!/usr/bin/env bash
# bench/instructions.sh counts the CPU instructions PostgreSQL's backend
# spends on pgonce's statements, with valgrind's callgrind: a count that is
# the same on a quiet machine and a noisy one, where throughput is not. It
# runs a private cluster under callgrind (never the one on 5432) and
# measures, in schemas migrated as shipped and without the row-invariant
# constraint (pgonce_key_invariants_check):
#
#   submit   the key insert of a submit, one statement and one transaction
#            per key, as SubmitTx's own statement runs (1,000 keys)
#   drain    the claim and the batch completion of bench/compare's pgbench
#            model, in batches of 500 (2,000 calls)
#   business the one-row insert of bench/compare's bare caller transaction
#
# and prints instructions per key, call or row, each session's start-up
# subtracted. Run it as root, from the repository (make bench-instructions);
# it takes about two minutes.
set -euo pipefail

port=${PGONCE_INSTRUCTIONS_PORT:-5496}
cluster=pgonce_instructions
version=$(ls /etc/postgresql | sort -V | tail -1)
bin=/usr/lib/postgresql/$version/bin
keys=1000
calls=2000
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/pgonce-instructions-XXXXXX)
chmod 755 "$work"
url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
psql_=(psql -X -q -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1 postgres)

command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install -y valgrind" >&2; exit 1; }

cleanup() {
	if [[ -f $work/postmaster.pid ]]; then
		kill -INT "$(cat "$work/postmaster.pid")" 2>/dev/null || true
		for _ in $(seq 1 60); do kill -0 "$(cat "$work/postmaster.pid")" 2>/dev/null || break; sleep 1; done
	fi
	pg_dropcluster --stop "$version" "$cluster" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

pg_dropcluster --stop "$version" "$cluster" 2>/dev/null || true
pg_createcluster "$version" "$cluster" --port "$port" -- --auth=trust >/dev/null
pg_ctlcluster "$version" "$cluster" start

(cd "$root" && go build -o "$work/pgonce" ./cmd/pgonce)
for schema in shipped unchecked; do
	"$work/pgonce" --database-url "$url" --schema "$schema" migrate up >/dev/null
done
"${psql_[@]}" -c 'ALTER TABLE unchecked.pgonce_key DROP CONSTRAINT pgonce_key_invariants_check' \
	-c 'CREATE SCHEMA app' \
	-c 'CREATE TABLE app.business (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())'
pg_ctlcluster "$version" "$cluster" stop

# The cluster again, every backend under callgrind.
chown postgres "$work"
su postgres -s /bin/bash -c "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$work/callgrind.%p \
	$bin/postgres -D /var/lib/postgresql/$version/$cluster -c config_file=/etc/postgresql/$version/$cluster/postgresql.conf \
	>$work/postmaster.log 2>&1 & echo \$! >$work/postmaster.pid"
for _ in $(seq 1 120); do
	"${psql_[@]}" -c 'SELECT 1' >/dev/null 2>&1 && break
	sleep 1
done

# session runs the script $1 in a session of its own and prints the
# instructions its backend executed.
session() {
	{
		echo "\\o $work/pid"
		echo 'SELECT pg_backend_pid();'
		echo '\o'
		cat "$1"
	} >"$work/session.sql"
	"${psql_[@]}" -At -f "$work/session.sql" >/dev/null
	local pid file
	pid=$(tr -d ' \n' <"$work/pid")
	file=$work/callgrind.$pid
	for _ in $(seq 1 120); do
		grep -q '^summary:' "$file" 2>/dev/null && break
		sleep 1
	done
	awk '/^summary:/ { print $2 }' "$file"
}

submit_script() {
	echo "PREPARE submit(int) AS INSERT INTO $1.pgonce_key (key, scope, run_id, step, tool, args, attempt, available_at, created_at, updated_at)
		VALUES (sha256(convert_to('key/' || \$1, 'UTF8')), sha256(convert_to('scope/' || \$1, 'UTF8')), 'instructions', \$1, 'noop',
			convert_to('{\"n\":' || \$1 || '}', 'UTF8'), 0, now(), now(), now())
		ON CONFLICT DO NOTHING
		RETURNING created_at, available_at, attempt, lease_until, now();"
	for i in $(seq 1 "$keys"); do echo "EXECUTE submit($i);"; done
}

business_script() {
	echo "PREPARE business(int) AS INSERT INTO app.business (account, amount) VALUES ('account-' || \$1, \$1);"
	for i in $(seq 1 "$keys"); do echo "EXECUTE business($i);"; done
}

# drain_script is the pgbench model's claim and completion, for psql.
drain_script() {
	local one
	one=$(sed -e "s|/\\* TEMPLATE: schema \\*/|$1.|g" -e "s|:client_id::text|'1'|" -e 's|:batch|500|g' \
		-e 's|:lease_ms|60000|g' -e "s|:channel::text|'instructions'::text|g" \
		-e "s|:keys::|:'keys'::|" -e "s|:attempts::|:'attempts'::|" "$root/bench/compare/claim_finish.pgbench")
	for _ in $(seq 1 $((calls / 500))); do echo "$one"; done
}

fill() {
	"${psql_[@]}" -c "TRUNCATE $1.pgonce_key" -c "INSERT INTO $1.pgonce_key (key, scope, run_id, step, tool, args)
		SELECT sha256(convert_to('key/' || i, 'UTF8')), sha256(convert_to('scope/' || i, 'UTF8')), 'instructions', i, 'noop',
			convert_to('{\"n\":' || i || '}', 'UTF8')
		FROM generate_series(1, $calls) AS i" -c "ANALYZE $1.pgonce_key"
}

: >"$work/empty.sql"
empty=$(session "$work/empty.sql")
per() { echo $(( ($1 - empty) / $2 )); }

business_script >"$work/business.sql"
business=$(per "$(session "$work/business.sql")" "$keys")
declare -A submit drain
for schema in shipped unchecked; do
	submit_script "$schema" >"$work/submit.sql"
	"${psql_[@]}" -c "TRUNCATE $schema.pgonce_key"
	submit[$schema]=$(per "$(session "$work/submit.sql")" "$keys")
	drain_script "$schema" >"$work/drain.sql"
	fill "$schema"
	drain[$schema]=$(per "$(session "$work/drain.sql")" "$calls")
	left=$("${psql_[@]}" -At -c "SELECT count(*) FROM $schema.pgonce_key WHERE state <> 'succeeded'")
	[[ $left == 0 ]] || { echo "drain in $schema left $left keys unfinished" >&2; exit 1; }
done

echo "PostgreSQL instructions per statement row, callgrind, PostgreSQL $version (psql sessions, start-up subtracted)"
printf '  %-52s %12s\n' "business row insert (one statement, one transaction)" "$business"
printf '  %-52s %12s\n' "submit: key insert, as shipped" "${submit[shipped]}"
printf '  %-52s %12s\n' "submit: key insert, without the invariants" "${submit[unchecked]}"
printf '  %-52s %12s\n' "drain: claim + completion per call, as shipped" "${drain[shipped]}"
printf '  %-52s %12s\n' "drain: claim + completion per call, without" "${drain[unchecked]}"
printf '  %-52s %12s\n' "the invariants' share of a submit" "$(( 100 * (submit[shipped] - submit[unchecked]) / submit[shipped] ))%"
printf '  %-52s %12s\n' "the invariants' share of a drained call" "$(( 100 * (drain[shipped] - drain[unchecked]) / drain[shipped] ))%"
