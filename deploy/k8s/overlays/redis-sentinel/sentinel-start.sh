#!/bin/sh
# One sentinel: monitor the primary another sentinel already knows, else
# redis-0 (first start). Sentinel rewrites its file, so it lives in /data.
set -eu
primary=""
for s in redis-sentinel-0 redis-sentinel-1 redis-sentinel-2; do
  [ "$s" = "$HOSTNAME" ] && continue
  primary=$(redis-cli -h "$s.redis-sentinel" -p 26379 --raw \
    SENTINEL get-master-addr-by-name scheduler 2>/dev/null | head -n 1) || primary=""
  [ -n "$primary" ] && break
done
[ -n "$primary" ] || primary="redis-0.redis"
cat > /data/sentinel.conf <<CONF
port 26379
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip ${HOSTNAME}.redis-sentinel
sentinel monitor scheduler ${primary} 6379 2
sentinel down-after-milliseconds scheduler 5000
sentinel failover-timeout scheduler 60000
sentinel parallel-syncs scheduler 1
CONF
exec redis-sentinel /data/sentinel.conf
