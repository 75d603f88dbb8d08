#!/bin/sh
# One Redis of the StatefulSet: a replica of the primary the sentinels name,
# or, when no sentinel knows one yet (first start), redis-0 is the primary.
set -eu
self="${HOSTNAME}.redis"
primary=""
for s in redis-sentinel-0 redis-sentinel-1 redis-sentinel-2; do
  primary=$(redis-cli -h "$s.redis-sentinel" -p 26379 --raw \
    SENTINEL get-master-addr-by-name scheduler 2>/dev/null | head -n 1) || primary=""
  [ -n "$primary" ] && break
done
if [ -z "$primary" ] && [ "${HOSTNAME##*-}" != "0" ]; then
  primary="redis-0.redis"
fi
set -- --port 6379 --dir /data --appendonly yes --appendfsync everysec \
  --maxmemory-policy noeviction --protected-mode no --replica-announce-ip "$self"
if [ -n "$primary" ] && [ "$primary" != "$self" ]; then
  set -- "$@" --replicaof "$primary" 6379
fi
exec redis-server "$@"
