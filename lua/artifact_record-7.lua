--[[
  artifact_record-7.lua: a node holds a P2P artifact (RecordP2pArtifact).

  The artifact index is an LRU over (cluster, backend, key), named by a digest
  the client computes (scheduler/store/p2p.py).  Recording refreshes recency; past
  the capacity the least recently used artifacts are forgotten, at most
  EVICT_BATCH per call (one call adds at most one, so the index converges).

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     art-lru    zset digest -> recency sequence
  KEYS[7]     art-names  hash digest -> "cluster\nbackend\nkey"
  ARGV[1]     digest
  ARGV[2]     name ("cluster\nbackend\nkey", for operators)
  ARGV[3]     node_id
  ARGV[4]     capacity (artifact_store_capacity, >= 1)
  ARGV[5]     key_sha1: the sha1 of the key alone ("" = none): art-key / art-kd, which
              locality-aware placement reads (includes/art_keys.lua)

  Returns {evicted (artifacts), now_ms}
  Errors: UNKNOWN_NODE node is not in scheduler node list, NO_POLICY (no policy),
          BADARG key is longer than the policy's artifact_key_max_bytes
  Writes: art:<digest>, node-art:<node>, art-lru, art-names, art-key:<kd>,
          art-kd, stats art_seq; evictions delete art:<d>, remove d from each
          holder's node-art and from art-key / art-kd
]]
-- @include common
-- @include art_keys
local LRU_KEY = KEYS[6]
local NAMES_KEY = KEYS[7]
local digest = ARGV[1]
local name = ARGV[2]
local node_id = ARGV[3]
local capacity = tonumber(ARGV[4])
local EVICT_BATCH = 64

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
if not redis.call('ZSCORE', NODES_KEY, node_id) then
  return fail(ERR.UNKNOWN_NODE, 'node is not in scheduler node list')
end
if not capacity or capacity < 1 then return fail(ERR.BADARG, 'capacity must be at least 1') end
local key = string.match(name, '^[^\n]*\n[^\n]*\n(.*)$') or name
if #key > P.artifact_key_max_bytes then
  return fail(ERR.BADARG, 'key is longer than ' .. P.artifact_key_max_bytes
    .. ' bytes (artifact_key_max_bytes)')
end
local now = now_ms(P)

redis.call('SADD', BASE .. 'art:' .. digest, node_id)
redis.call('SADD', BASE .. 'node-art:' .. node_id, digest)
redis.call('ZADD', LRU_KEY, redis.call('HINCRBY', STATS_KEY, 'art_seq', 1), digest)
redis.call('HSET', NAMES_KEY, digest, name)
art_key_add(digest, ARGV[5])

local evicted = 0
while evicted < EVICT_BATCH and redis.call('ZCARD', LRU_KEY) > capacity do
  local old = redis.call('ZPOPMIN', LRU_KEY)[1]
  local akey = BASE .. 'art:' .. old
  for _, holder in ipairs(redis.call('SMEMBERS', akey)) do
    redis.call('SREM', BASE .. 'node-art:' .. holder, old)
  end
  redis.call('DEL', akey)
  redis.call('HDEL', NAMES_KEY, old)
  art_key_drop(old)
  evicted = evicted + 1
end
return { evicted, fmt(now) }
