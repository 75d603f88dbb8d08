#!/bin/sh
# One sentinel: monitor the primary another sentinel already knows, else
# redis-0 (first start). Sentinel rewrites its file, so it lives in DATA_DIR.
# The environment may move what the StatefulSet fixes (tests do):
#   SENTINELS "host:port ..." (the others), SENTINEL_PORT, DATA_DIR, SELF,
#   FIRST_PRIMARY (host:port, the primary before any sentinel knows one)
set -eu
port="${SENTINEL_PORT:-26379}"
self="${SELF:-${HOSTNAME}.redis-sentinel}"
sentinels="${SENTINELS:-redis-sentinel-0.redis-sentinel:26379 redis-sentinel-1.redis-sentinel:26379 redis-sentinel-2.redis-sentinel:26379}"
data="${DATA_DIR:-/data}"
primary=""
primary_port=""
for s in $sentinels; do
  [ "$s" = "$self:$port" ] && continue
  answer=$(redis-cli -h "${s%:*}" -p "${s##*:}" --raw \
    SENTINEL get-master-addr-by-name scheduler 2>/dev/null) || answer=""
  primary=$(echo "$answer" | sed -n 1p)
  primary_port=$(echo "$answer" | sed -n 2p)
  [ -n "$primary" ] && [ -n "$primary_port" ] && break
  primary=""
done
if [ -z "$primary" ]; then
  first="${FIRST_PRIMARY:-redis-0.redis:6379}"
  primary="${first%:*}"
  primary_port="${first##*:}"
fi
cat > "$data/sentinel.conf" <<CONF
port ${port}
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip ${self}
sentinel monitor scheduler ${primary} ${primary_port} 2
sentinel down-after-milliseconds scheduler 5000
sentinel failover-timeout scheduler 60000
sentinel parallel-syncs scheduler 1
CONF
exec redis-sentinel "$data/sentinel.conf"
