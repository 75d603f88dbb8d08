--[[
  replica_seen-5.lua: a replica says it serves the cell (`schedctl replicas`).
  Each replica calls it from its monitor loop; the entry expires unless
  refreshed, so the roster lists the replicas heard from within the TTL.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     replica_id (host/pid)
  ARGV[2]     ttl_ms, the entry's TTL
  ARGV[3..]   fields: field, value pairs (version, commit, host, pid, grpc, started_ms)

  Returns {now_ms} (Redis time, the entry's seen_ms)
  Writes: replica:<id> (hash, with a TTL); needs no policy
]]
-- @include common
local key = BASE .. 'replica:' .. ARGV[1]
local now = server_ms()
local fields = { 'replica_id', ARGV[1], 'seen_ms', fmt(now) }
for i = 3, #ARGV - 1, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, ARGV[2])
return { fmt(now) }
