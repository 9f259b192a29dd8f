#!/usr/bin/env bash
# scale_cluster.sh runs BenchmarkScale against a private PostgreSQL cluster
# made for the run, the same as the one on 5432 here but for
# shared_buffers (PGONCE_BENCH_SHARED_BUFFERS, default 2GB) and any
# settings in PGONCE_BENCH_CLUSTER_SETTINGS (lines of postgresql.conf, such
# as "max_wal_size = '16GB'"): it shows what the history costs on a server
# sized for it. PGONCE_BENCH_SCALE_BENCH narrows -bench (default
# ^BenchmarkScale$; ^BenchmarkScale$/Claim for the claim alone). It needs Debian's postgresql-common and root
# (pg_createcluster runs the server as the postgres user); the cluster is
# dropped when the script ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")"

buffers=${PGONCE_BENCH_SHARED_BUFFERS:-2GB}
port=${PGONCE_BENCH_CLUSTER_PORT:-5439}
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
name=pgonce_scale_$$

drop() { pg_dropcluster --stop "$version" "$name" >/dev/null 2>&1 || true; }
trap drop EXIT

pg_createcluster "$version" "$name" --port "$port" -- --auth=trust >/dev/null
conf=/etc/postgresql/$version/$name/conf.d/scale.conf
# The settings of the cluster on 5432 that are not PostgreSQL's defaults
# (autovacuum off among them), then the one under study.
psql -h 127.0.0.1 -p 5432 -U postgres -Atc \
	"SELECT name || ' = ' || quote_literal(setting || coalesce(unit, ''))
	 FROM pg_settings
	 WHERE source = 'configuration file'
	     AND name IN ('autovacuum', 'fsync', 'max_connections', 'max_wal_size', 'min_wal_size', 'synchronous_commit')" >"$conf"
printf "listen_addresses = '127.0.0.1'\nshared_buffers = '%s'\n%s\n" "$buffers" "${PGONCE_BENCH_CLUSTER_SETTINGS:-}" >>"$conf"
pg_ctlcluster "$version" "$name" start
for _ in $(seq 1 100); do
	pg_isready -q -h 127.0.0.1 -p "$port" && break
	sleep 0.1
done
echo "scale: cluster $name on port $port, shared_buffers $buffers:" >&2
sed 's/^/scale:   /' "$conf" >&2

PGONCE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" \
	go test -run='^$' -bench="${PGONCE_BENCH_SCALE_BENCH:-^BenchmarkScale\$}" -count=1 -timeout=0 .
