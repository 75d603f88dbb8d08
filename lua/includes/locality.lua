--[[
  includes/locality.lua: locality-aware placement (docs/design.md,
  "Locality"), decided inside the Schedule that reserves.

  The least_loaded decision is made first, exactly as without locality (the
  index or the full scan): its node B is the coolest eligible one.  Then the
  warm set, nodes that hold the request's artifacts in the P2P artifact index
  (art-key:<sha1 key> -> digests, art:<digest> -> holders, of the holder's own
  cluster and backend) or, for a request with a template id or images and no
  artifact keys, the group's recent starters (aff:<group>), is evaluated
  through the same stages.  A warm node W that passes them, of B's kind of
  capacity, competes only while pressure(W) <= pressure(B) + max_pressure_gap;
  it wins when pressure(W) - bonus(W) < pressure(B) - bonus(B), where
  bonus = weight * coverage / (1 + starts of the same group pending on it)
  (ties: B, then rank, then node id).  So locality never brings back a
  filtered node, never piles load past the gap, and a burst spreads over the
  warm set before it grows it.  Cost: bounded by the request (32 keys, at
  most LOCALITY.HOLDERS holders a digest, LOCALITY.CANDIDATES nodes evaluated), flat
  in the fleet's size.

  Keys (all built from BASE): art-key:<kd>, art-kd, art:<digest>, art-names
  (read); aff:<group> (zset node -> last start, TTL locality_affinity_ttl_ms,
  at most locality_affinity_max_nodes members) and node-loc:<node> (hash
  group -> pending starts) written by the placement; the reservation keeps
  its group in `locality`, and end_reservation (includes/common.lua) counts
  it off node-loc.
]]
-- @exports LOCALITY
-- @include stages

-- (one export, its functions as fields: the library's main chunk has room
-- for few more locals, and a block's own names count while it loads)
local LOCALITY = {
  HOLDERS = 64, -- holders read per artifact digest, at most
  CANDIDATES = 32, -- warm nodes evaluated per decision, at most
}

function LOCALITY.p3(x) return string.format('%.3f', x) end
function LOCALITY.loc_key(id) return BASE .. 'node-loc:' .. id end
function LOCALITY.aff_key(group) return BASE .. 'aff:' .. group end

-- ARGV[8] as a table {group, keys = {{w, size, kd}...}, total}, nil when
-- locality is off (weight 0, or nothing to go by), or false on a bad text.
function LOCALITY.parse(P, arg)
  if arg == nil or arg == '' or not (P.locality_weight > 0) then return nil end
  local L = { group = false, keys = {}, total = 0, pull_total = 0 }
  local first = true
  for line in string.gmatch(arg, '([^\n]*)\n') do
    if first then
      first = false
      if line ~= '' then
        if not string.find(line, '^%x+$') then return false end
        L.group = line
      end
    else
      local w, size, kd = string.match(line, '^(%d+)\t(%d+)\t(%x+)$')
      if not w then return false end
      w, size = tonumber(w), tonumber(size)
      L.keys[#L.keys + 1] = { w, size, kd }
      L.total = L.total + w
    end
  end
  if first or #L.keys > 32 then return false end
  if #L.keys == 0 and not L.group then return nil end
  return L
end

-- cov[id] = {sum of weights held, held key positions (a set)}: the request's
-- keys the node holds in the index of its own cluster and backend (`ns` is
-- checked when the node is read: holders of every namespace are gathered).
function LOCALITY.gather_keys(L)
  local by = {} -- id -> ns -> {weight, held}
  local ids = {}
  local names = BASE .. 'art-names'
  for i, k in ipairs(L.keys) do
    for _, digest in ipairs(redis.call('SMEMBERS', BASE .. 'art-key:' .. k[3])) do
      local name = redis.call('HGET', names, digest)
      local ns = name and string.match(name, '^([^\n]*\n[^\n]*)\n')
      if ns then
        local akey = BASE .. 'art:' .. digest
        local holders
        if redis.call('SCARD', akey) <= LOCALITY.HOLDERS then
          holders = redis.call('SMEMBERS', akey)
        else
          holders = redis.call('SRANDMEMBER', akey, LOCALITY.HOLDERS)
        end
        for _, id in ipairs(holders) do
          local t = by[id]
          if not t then
            t = {}
            by[id] = t
            ids[#ids + 1] = id
          end
          local c = t[ns]
          if not c then
            c = { 0, {} }
            t[ns] = c
          end
          if not c[2][i] then c[1], c[2][i] = c[1] + k[1], true end
        end
      end
    end
  end
  return by, ids
end

-- The warm set: {id, by-namespace coverage or true (affinity)} in the order
-- they are evaluated (most weight held first, then node id), at most
-- LOCALITY.CANDIDATES.
function LOCALITY.warm_set(P, L, now)
  local out = {}
  if #L.keys > 0 then
    local by, ids = LOCALITY.gather_keys(L)
    local best = {}
    for _, id in ipairs(ids) do
      local m = 0
      for _, c in pairs(by[id]) do
        if c[1] > m then m = c[1] end
      end
      best[id] = m
    end
    table.sort(ids, function(a, b)
      if best[a] ~= best[b] then return best[a] > best[b] end
      return bytes_lt(a, b)
    end)
    for i = 1, math.min(#ids, LOCALITY.CANDIDATES) do out[i] = { ids[i], by[ids[i]] } end
    return out
  end
  -- affinity: the group's starters within the TTL, most recent first
  local ids = redis.call('ZREVRANGEBYSCORE', LOCALITY.aff_key(L.group), '+inf',
    '(' .. fmt(now - P.locality_affinity_ttl_ms), 'LIMIT', '0', fmt(LOCALITY.CANDIDATES))
  table.sort(ids, bytes_lt)
  for i, id in ipairs(ids) do out[i] = { id, true } end
  return out
end

-- Node n's coverage (0..1) and the bytes it would pull, from what warm_set
-- gathered for it (`c`: by namespace, true for affinity, nil: read exactly).
function LOCALITY.coverage_of(L, n, c)
  if #L.keys == 0 then
    if c == nil then
      c = redis.call('ZSCORE', LOCALITY.aff_key(L.group), n.id)
      c = c and tonumber(c) > n.now_floor
    end
    return c and 1 or 0, 0
  end
  local v = redis.call('HMGET', node_key(n.id), 'cluster_id', 'p2p_backend')
  if not v[1] or v[1] == '' or not v[2] or v[2] == '' then return 0, L.pull_all end
  local ns = v[1] .. '\n' .. v[2]
  local held
  if c == nil then
    held = { 0, {} }
    for i, k in ipairs(L.keys) do
      for _, digest in ipairs(redis.call('SMEMBERS', BASE .. 'art-key:' .. k[3])) do
        local name = redis.call('HGET', BASE .. 'art-names', digest)
        if name and string.sub(name, 1, #ns + 1) == ns .. '\n'
            and redis.call('SISMEMBER', BASE .. 'art:' .. digest, n.id) == 1 then
          held[1], held[2][i] = held[1] + k[1], true
        end
      end
    end
  else
    held = c[ns] or { 0, {} }
  end
  local pull = 0
  for i, k in ipairs(L.keys) do
    if not held[2][i] then pull = pull + k[2] end
  end
  return held[1] / L.total, pull
end

-- Fill n's coverage, bonus and pull (n: an evaluated or indexed node).
function LOCALITY.score(P, L, n, c)
  n.coverage, n.pull = LOCALITY.coverage_of(L, n, c)
  n.same = 0
  if L.group and n.coverage > 0 then
    n.same = tonumber(redis.call('HGET', LOCALITY.loc_key(n.id), L.group)) or 0
  end
  n.bonus = P.locality_weight * n.coverage / (1 + n.same)
end

-- The placement among B (the decision without locality) and the warm set:
-- the chosen node (B or a warm one, each with coverage, bonus and pull), and
-- the warm nodes evaluated, each with `lost` (why it did not win) set.
function LOCALITY.choose(P, req, now, L, B)
  L.pull_all = 0
  for _, k in ipairs(L.keys) do L.pull_all = L.pull_all + k[2] end
  local floor = now - P.locality_affinity_ttl_ms
  local warm = LOCALITY.warm_set(P, L, now)
  local seen, evaluated = {}, {}
  for _, w in ipairs(warm) do
    local n
    if w[1] == B.id then n = B else n = evaluate(w[1], P, req, now) end
    n.now_floor = floor
    LOCALITY.score(P, L, n, w[2])
    seen[n.id] = true
    evaluated[#evaluated + 1] = n
  end
  if not seen[B.id] then
    B.now_floor = floor
    LOCALITY.score(P, L, B, nil)
  end
  local best, best_score = B, B.pressure - B.bonus
  local limit = B.pressure + P.locality_max_pressure_gap
  for _, n in ipairs(evaluated) do
    if n ~= B then
      local s = n.pressure - n.bonus
      if n.reason then
        n.lost = n.reason
      elseif n.known ~= B.known then
        n.lost = 'capacity unknown'
      elseif n.coverage == 0 then
        n.lost = 'holds none of it here'
      elseif n.pressure > limit then
        n.lost = 'pressure ' .. LOCALITY.p3(n.pressure) .. ' over ' .. LOCALITY.p3(B.pressure)
          .. ' + max_pressure_gap ' .. LOCALITY.p3(P.locality_max_pressure_gap)
      elseif s < best_score or (s == best_score and best ~= B
          and (ranks_before(n, best) or (not ranks_before(best, n) and bytes_lt(n.id, best.id)))) then
        if best ~= B then best.lost = 'a warmer or cooler node won' end
        best, best_score = n, s
      else
        n.lost = 'pressure - bonus ' .. LOCALITY.p3(s) .. ' not below ' .. LOCALITY.p3(best_score)
      end
    end
  end
  if best ~= B and B.coverage > 0 then B.lost = 'a warmer or cooler node won' end
  return best, evaluated
end

-- "full", "partial" or "cold": what the chosen node holds.
function LOCALITY.note(n)
  if n.coverage >= 1 then return 'full' end
  if n.coverage > 0 then return 'partial' end
  return 'cold'
end

-- The placement's locality writes: the group's recent starters and the
-- node's pending starts of the group (and the reservation's `locality`,
-- written by the caller).
function LOCALITY.reserve(P, L, n, now)
  if not L.group then return end
  local key = LOCALITY.aff_key(L.group)
  redis.call('ZADD', key, fmt(now), n.id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - P.locality_affinity_ttl_ms))
  redis.call('ZREMRANGEBYRANK', key, '0', fmt(-(P.locality_affinity_max_nodes + 1)))
  redis.call('PEXPIRE', key, fmt(P.locality_affinity_ttl_ms))
  redis.call('HINCRBY', LOCALITY.loc_key(n.id), L.group, '1')
end

