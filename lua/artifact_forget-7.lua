--[[
  artifact_forget-7.lua: a node no longer holds a P2P artifact
  (ForgetP2pArtifact).  Idempotent; an artifact nobody holds leaves the index.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     art-lru
  KEYS[7]     art-names
  ARGV[1]     digest
  ARGV[2]     node_id

  Returns {held: 1 if the node held it else 0}
  Writes: art:<digest>, node-art:<node>, art-lru, art-names, art-key:<kd>, art-kd
]]
-- @include common
-- @include art_keys
local LRU_KEY = KEYS[6]
local NAMES_KEY = KEYS[7]
local digest = ARGV[1]
local node_id = ARGV[2]

local akey = BASE .. 'art:' .. digest
local held = redis.call('SREM', akey, node_id)
redis.call('SREM', BASE .. 'node-art:' .. node_id, digest)
if redis.call('SCARD', akey) == 0 then
  redis.call('ZREM', LRU_KEY, digest)
  redis.call('HDEL', NAMES_KEY, digest)
  art_key_drop(digest)
end
return { held }
