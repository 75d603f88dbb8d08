--[[
  includes/art_keys.lua: the artifact index by key alone, for locality
  (includes/locality.lua): art-key:<sha1 of the key> is the set of the
  index's digests of that key (one per cluster and backend that holds it),
  and art-kd maps each such digest back to its key's sha1, so a digest that
  leaves the index (forgotten, evicted, its last holder removed) leaves the
  set too.  Both are bounded by the index (art-lru's capacity).
]]
-- @exports art_key_add art_key_drop
-- @include base

-- Digest `digest` is the index entry of the key whose sha1 is `kd` ("" = a
-- client that sends none: the entry is found by locality only once recorded
-- again by a client that does).
local function art_key_add(digest, kd)
  if kd == nil or kd == '' then return end
  redis.call('SADD', BASE .. 'art-key:' .. kd, digest)
  redis.call('HSET', BASE .. 'art-kd', digest, kd)
end

-- Digest `digest` left the index.
local function art_key_drop(digest)
  local kd = redis.call('HGET', BASE .. 'art-kd', digest)
  if not kd then return end
  redis.call('SREM', BASE .. 'art-key:' .. kd, digest)
  redis.call('HDEL', BASE .. 'art-kd', digest)
end
