--[[
  artifact_lookup-7.lua: peers holding a P2P artifact (LookupP2pArtifact).

  Holders are filtered like ListP2pPeers (READY, P2P address, cluster and
  backend of the request, minus the excluded node), in node-id byte order,
  then cut to the limit.  Without a limit they come in the holder set's
  order and the client sorts them (a sort in Lua was 40 % of a call's time
  where an artifact had thousands of holders).  A hit refreshes the
  artifact's recency.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     art-lru
  KEYS[7]     art-names
  ARGV[1]     digest
  ARGV[2]     cluster_id
  ARGV[3]     backend
  ARGV[4]     exclude: a node id to leave out ("" = none)
  ARGV[5]     limit (artifact_lookup_node_limit; <= 0 = all)

  Returns {now_ms, peer...}; peer = {node_id, backend, address} (in node-id
          byte order with a limit)
  Errors: NO_POLICY (no policy)
  Writes: art-lru (recency), stats art_seq
]]
-- @include common
-- @include peers
local LRU_KEY = KEYS[6]
local digest = ARGV[1]
local cluster = ARGV[2]
local backend = ARGV[3]
local exclude = ARGV[4]
local limit = tonumber(ARGV[5]) or 0

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local now = now_ms(P)
local out = { fmt(now) }
if not redis.call('ZSCORE', LRU_KEY, digest) then return out end
redis.call('ZADD', LRU_KEY, redis.call('HINCRBY', STATS_KEY, 'art_seq', 1), digest)
local holders = redis.call('SMEMBERS', BASE .. 'art:' .. digest)
if limit > 0 then holders = sorted_bytes(holders) end
for _, id in ipairs(holders) do
  if limit > 0 and #out - 1 >= limit then break end
  local row = peer_row(id, P, now, cluster, backend, exclude)
  if row then out[#out + 1] = row end
end
return out
