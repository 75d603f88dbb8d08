#!/bin/sh
# One sentinel of deploy/compose.yaml ($1: its own service name). Sentinel
# rewrites its file, so it is written to the tmpfs /data at every start.
set -eu
cat > /data/sentinel.conf <<CONF
port 26379
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $1
sentinel monitor scheduler redis-primary 6379 2
sentinel down-after-milliseconds scheduler 5000
sentinel failover-timeout scheduler 60000
sentinel parallel-syncs scheduler 1
CONF
exec redis-sentinel /data/sentinel.conf
