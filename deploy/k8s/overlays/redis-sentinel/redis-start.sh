#!/bin/sh
# One Redis of the StatefulSet: a replica of the primary the sentinels name,
# or, when no sentinel knows one yet (first start), redis-0 is the primary.
# The environment may move what the StatefulSet fixes (tests do):
#   SENTINELS "host:port ..." to ask, REDIS_PORT, DATA_DIR, SELF (the announced
#   name), FIRST_PRIMARY (host:port, the primary before any sentinel knows one)
set -eu
port="${REDIS_PORT:-6379}"
self="${SELF:-${HOSTNAME}.redis}"
sentinels="${SENTINELS:-redis-sentinel-0.redis-sentinel:26379 redis-sentinel-1.redis-sentinel:26379 redis-sentinel-2.redis-sentinel:26379}"
primary=""
primary_port=""
for s in $sentinels; do
  answer=$(redis-cli -h "${s%:*}" -p "${s##*:}" --raw \
    SENTINEL get-master-addr-by-name scheduler 2>/dev/null) || answer=""
  primary=$(echo "$answer" | sed -n 1p)
  primary_port=$(echo "$answer" | sed -n 2p)
  [ -n "$primary" ] && [ -n "$primary_port" ] && break
  primary=""
done
first="${FIRST_PRIMARY:-redis-0.redis:6379}"
if [ -z "$primary" ] && [ "${HOSTNAME##*-}" != "0" ]; then
  primary="${first%:*}"
  primary_port="${first##*:}"
fi
set -- --port "$port" --dir "${DATA_DIR:-/data}" --appendonly yes --appendfsync everysec \
  --maxmemory-policy noeviction --protected-mode no --replica-announce-ip "$self"
if [ -n "$primary" ] && ! { [ "$primary" = "$self" ] && [ "$primary_port" = "$port" ]; }; then
  set -- "$@" --replicaof "$primary" "$primary_port"
fi
exec redis-server "$@"
