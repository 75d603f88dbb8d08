--[[
  artifact_lookup-7.lua: the nodes holding a P2P artifact
  (LookupP2pArtifact), the first of its two steps.  A hit refreshes the
  artifact's recency.  The client then reads the holders' rows in pages of
  ids (peer_list-5.lua with ids: READY, P2P address, cluster and backend of
  the request, minus the excluded node), in node-id byte order, and cuts them
  at the limit, so no call reads an artifact of thousands of holders whole.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     art-lru
  KEYS[7]     art-names
  ARGV[1]     digest

  Returns {now_ms, ids...} (the holders, in the set's order; none when the
          index has no such artifact)
  Errors: NO_POLICY (no policy)
  Writes: art-lru (recency), stats art_seq
]]
-- @include common
local LRU_KEY = KEYS[6]
local digest = ARGV[1]

local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local out = { fmt(now_ms(P)) }
if not redis.call('ZSCORE', LRU_KEY, digest) then return out end
redis.call('ZADD', LRU_KEY, redis.call('HINCRBY', STATS_KEY, 'art_seq', 1), digest)
for _, id in ipairs(redis.call('SMEMBERS', BASE .. 'art:' .. digest)) do out[#out + 1] = id end
return out
