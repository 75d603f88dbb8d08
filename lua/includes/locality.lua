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
  most LOCALITY.HOLDERS holders a digest, LOCALITY.SCREEN warm nodes
  considered), flat in the fleet's size.  Decided through the index, each
  warm node's pressure comes from its bucket (one HGET) and the least score
  it could reach bounds it: records are read only for the nodes that could
  still win, least bound first (LOCALITY.choose).

  Keys (all built from BASE): art-key:<kd>, art-kd, art:<digest>, art-names
  (read); aff:<group> (zset node -> last start, TTL locality_affinity_ttl_ms,
  at most locality_affinity_max_nodes members) and node-loc:<node> (hash
  group -> pending starts) written by the placement; the reservation keeps
  its group in `locality`, and end_reservation (includes/common.lua) counts
  it off node-loc.
]]
-- @exports LOCALITY
-- @include index_bucket

-- (one export, its functions as fields: the library's main chunk has room
-- for few more locals, and a block's own names count while it loads)
local LOCALITY = {
  HOLDERS = 16, -- holders read per artifact digest, at most
  SCREEN = 32, -- warm nodes considered per decision, at most
}

function LOCALITY.p3(x) return string.format('%.3f', x) end
function LOCALITY.loc_key(id) return BASE .. 'node-loc:' .. id end
function LOCALITY.aff_key(group) return BASE .. 'aff:' .. group end

-- A request's key (L.keys[i]): its weight, its size in bytes, its digest
-- @layout LOC_KEY
local LOC_KEY = { 'weight', 'size', 'digest' }
-- An index entry of a key (LOCALITY.digests): its digest, its namespace
-- @layout LOC_ENTRY
local LOC_ENTRY = { 'digest', 'ns' }
-- A warm candidate (LOCALITY.warm_set): its node id, what it holds (by[id],
-- or true for an affinity starter)
-- @layout LOC_WARM
local LOC_WARM = { 'id', 'held' }

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

-- The request's digests, read once a call (cached in L.dig): for key i,
-- {{digest, "cluster\nbackend"}...} of the index entries that have a name.
-- (one SMEMBERS a key, one HMGET of every name)
function LOCALITY.digests(L)
  if L.dig then return L.dig end
  local per, all = {}, {}
  for i, k in ipairs(L.keys) do
    per[i] = redis.call('SMEMBERS', BASE .. 'art-key:' .. k[LOC_KEY.digest])
    for _, digest in ipairs(per[i]) do all[#all + 1] = digest end
  end
  local names = #all > 0 and redis.call('HMGET', BASE .. 'art-names', unpack(all)) or {}
  local dig, j = {}, 0
  for i, digests in ipairs(per) do
    local list = {}
    for _, digest in ipairs(digests) do
      j = j + 1
      local ns = names[j] and string.match(names[j], '^([^\n]*\n[^\n]*)\n')
      if ns then list[#list + 1] = { digest, ns } end
    end
    dig[i] = list
  end
  L.dig = dig
  return dig
end

-- by[id] = {ns, weight held, keys held, ns, ...}: per cluster and backend
-- (a packed list of triples, one per namespace, walked with a stride of 3:
-- not a record, so no layout)
-- of an index entry (a node's own is checked when it is read), the sum of
-- the request's key weights the holder holds there and the keys as a bit
-- set (key i: 2^(i-1); at most 32 keys, exact in a double): one table a
-- holder.  `ids` the holders found; `sampled`: some digest had more holders
-- than were read.
local BIT = {}
for i = 1, 32 do BIT[i] = 2 ^ (i - 1) end
function LOCALITY.gather_keys(L)
  local by, ids, sampled = {}, {}, false
  local dig = LOCALITY.digests(L)
  for i, k in ipairs(L.keys) do
    local w, bit = k[LOC_KEY.weight], BIT[i]
    for _, d in ipairs(dig[i]) do
      local ns = d[LOC_ENTRY.ns]
      do
        -- (one call: the whole set when it has at most HOLDERS, else
        -- HOLDERS + 1 distinct ones at random, one dropped)
        local holders = redis.call('SRANDMEMBER', BASE .. 'art:' .. d[LOC_ENTRY.digest],
          LOCALITY.HOLDERS + 1)
        if #holders > LOCALITY.HOLDERS then holders[#holders], sampled = nil, true end
        for _, id in ipairs(holders) do
          local t = by[id]
          if not t then
            by[id] = { ns, w, bit }
            ids[#ids + 1] = id
          elseif t[1] == ns then -- (the common case: one namespace)
            t[2], t[3] = t[2] + w, t[3] + bit
          else
            local found = false
            for x = 4, #t, 3 do
              if t[x] == ns then t[x + 1], t[x + 2], found = t[x + 1] + w, t[x + 2] + bit, true end
            end
            if not found then t[#t + 1], t[#t + 2], t[#t + 3] = ns, w, bit end
          end
        end
      end
    end
  end
  return by, ids, sampled
end

-- The warm set: {id, by-namespace coverage or true (affinity)}, most weight
-- held first (among equals, the order the index's sets gave), at most
-- LOCALITY.SCREEN; and what a node left out of it holds: `by` (keys), and
-- whether one not found holds nothing (`complete`).
function LOCALITY.warm_set(P, L, now)
  local out = {}
  if #L.keys > 0 then
    local by, ids, sampled = LOCALITY.gather_keys(L)
    local K = LOCALITY.SCREEN
    if #ids <= K then
      for i = 1, #ids do out[i] = { ids[i], by[ids[i]] } end
    else
      -- the most weight held first (few distinct sums: one pass per sum);
      -- among equals, the order the index's sets gave (no sort)
      local best, sums = {}, {}
      for i, id in ipairs(ids) do
        local t, m = by[id], 0
        for x = 2, #t, 3 do
          if t[x] > m then m = t[x] end
        end
        best[i] = m
        sums[m] = true
      end
      local order = {}
      for m, _ in pairs(sums) do order[#order + 1] = m end
      table.sort(order, function(a, b) return a > b end)
      for _, m in ipairs(order) do
        for i, id in ipairs(ids) do
          if #out >= K then break end
          if best[i] == m then out[#out + 1] = { id, by[id] } end
        end
      end
    end
    return out, by, not sampled
  end
  -- affinity: the group's starters within the TTL, most recent first
  local ids = redis.call('ZREVRANGEBYSCORE', LOCALITY.aff_key(L.group), '+inf',
    '(' .. fmt(now - P.locality_affinity_ttl_ms), 'LIMIT', '0', fmt(LOCALITY.SCREEN))
  for i, id in ipairs(ids) do out[i] = { id, true } end
  return out, nil, #ids < LOCALITY.SCREEN
end

-- "cluster\nbackend" of a node's P2P index, or false (it has none).
function LOCALITY.ns_of(cluster, backend)
  if not cluster or cluster == '' or not backend or backend == '' then return false end
  return cluster .. '\n' .. backend
end

-- What locality reads of a node for its namespace (a layout)
-- @layout LOCALITY_NS
local LOCALITY_NS = { 'cluster_id', 'p2p_backend' }
-- What a candidate decided through the index reads of its node, its bucket
-- (`idx`) read already: the decision inputs the bucket does not hold, then
-- its namespace (a layout)
-- @layout CANDIDATE_REST
local CANDIDATE_REST = { 'endpoint', 'last_seen_ms', 'lingering', 'status', 'cluster_id',
  'p2p_backend' }

-- Warm node `id` through the decision stages.  Decided through the index
-- (`idx`: its bucket, read by the screen), the bucket holds every decision
-- input, as for the index's own pick: one more read (a stale node the sweeps
-- have not taken out yet is still listed: the status check on its own
-- last_seen_ms excludes it).  Otherwise (`idx` nil: the full scan, a dry
-- run) the whole record is read.
function LOCALITY.candidate(P, req, now, id, idx)
  if not idx then
    local n = evaluate(id, P, req, now)
    local v = redis.call('HMGET', node_key(id), unpack(LOCALITY_NS))
    n.ns = LOCALITY.ns_of(v[LOCALITY_NS.cluster_id], v[LOCALITY_NS.p2p_backend])
    return n
  end
  local v = redis.call('HMGET', node_key(id), unpack(CANDIDATE_REST))
  -- (not indexed: schedulable for no request)
  local n = idx ~= '' and node_of_bucket(idx)
  if not n then
    return { id = id, reason = 'not schedulable', ns = false, pressure = 0, known = false }
  end
  n.id, n.idx, n.endpoint = id, idx, v[CANDIDATE_REST.endpoint] or ''
  n.last_seen, n.lingering, n.reported = tonumber(v[CANDIDATE_REST.last_seen_ms]),
    v[CANDIDATE_REST.lingering] == '1', v[CANDIDATE_REST.status] or ''
  read_status(n, P, now)
  project(n, req)
  n.reason = check_status(n) or check_ceilings(n, P, req) or check_capacity(n, P, req)
  n.ns = LOCALITY.ns_of(v[CANDIDATE_REST.cluster_id], v[CANDIDATE_REST.p2p_backend])
  return n
end

-- A warm node's place in the screen (LOCALITY.choose): from its bucket `b`
-- (a parse), its pressure with the request placed (as the index's own pick
-- works it out from a bucket) and its rank's other inputs; `least` the
-- least score it could reach (pressure less the most bonus it could have).
function LOCALITY.screened(w, idx, b, req, most_bonus)
  local x = { w = w, idx = idx, id = w[LOC_WARM.id], known = b.known, cpu_cap = b.cpu_cap,
    mem_cap = b.mem_cap, proj_cpu = b.lc + req.cpu, proj_mem = b.lm + req.mem,
    starting = b.starting, running = b.running, paused = b.paused }
  x.pressure = pressure_of(x)
  x.least = x.pressure - most_bonus
  return x
end

-- Of two nodes of equal score, does x win: the better rank, then node id.
function LOCALITY.first(x, y)
  return ranks_before(x, y) or (not ranks_before(y, x) and bytes_lt(x.id, y.id))
end

-- The screen's order: least possible score, then LOCALITY.first.
function LOCALITY.before(x, y)
  if x.least ~= y.least then return x.least < y.least end
  return LOCALITY.first(x, y)
end

-- Node n's coverage (0..1) and the bytes it would pull (n.ns: its
-- namespace, read), from what warm_set gathered for it (`c`: by namespace,
-- true for affinity, nil: read exactly).
function LOCALITY.coverage_of(L, n, c)
  if #L.keys == 0 then
    if c == nil then
      c = redis.call('ZSCORE', LOCALITY.aff_key(L.group), n.id)
      c = c and tonumber(c) > n.now_floor
    end
    return c and 1 or 0, 0
  end
  local ns = n.ns
  if not ns then return 0, L.pull_all end
  local got, mask = 0, 0
  if c == nil then
    local dig = LOCALITY.digests(L)
    for i, k in ipairs(L.keys) do
      for _, d in ipairs(dig[i]) do
        if d[LOC_ENTRY.ns] == ns
          and redis.call('SISMEMBER', BASE .. 'art:' .. d[LOC_ENTRY.digest], n.id) == 1 then
          got, mask = got + k[LOC_KEY.weight], mask + BIT[i]
          break
        end
      end
    end
  else
    for x = 1, #c, 3 do
      if c[x] == ns then got, mask = c[x + 1], c[x + 2] end
    end
  end
  local pull = 0
  for i, k in ipairs(L.keys) do
    if math.floor(mask / BIT[i]) % 2 == 0 then pull = pull + k[LOC_KEY.size] end
  end
  return got / L.total, pull
end

-- The most bonus a warm node can have, from what warm_set gathered for it
-- (`c`: by namespace, or true for affinity): weight x its most held.
function LOCALITY.most_bonus(P, L, c)
  if c == true then return P.locality_weight end
  local m = 0
  for x = 2, #c, 3 do
    if c[x] > m then m = c[x] end
  end
  return P.locality_weight * (m / L.total)
end

-- How far above B a warm node may be: max_pressure_gap, and with
-- headroom_share > 0 at most that share of B's headroom (1 - its pressure);
-- and the name of the bound that applies (for explain).
function LOCALITY.margin(P, B)
  local gap, share = P.locality_max_pressure_gap, P.locality_headroom_share
  if share > 0 then
    local room = share * (1 - B.pressure)
    if room < 0 then room = 0 end
    if room < gap then return room, 'headroom_share' end
  end
  return gap, 'max_pressure_gap'
end

-- n's bonus: weight x coverage, decayed by the group's starts pending on it.
function LOCALITY.bonus(P, L, n)
  n.same = 0
  if L.group and n.coverage > 0 then
    n.same = tonumber(redis.call('HGET', LOCALITY.loc_key(n.id), L.group)) or 0
  end
  n.bonus = P.locality_weight * n.coverage / (1 + P.locality_pending_decay * n.same)
end

-- The placement among B (the decision without locality) and the warm set:
-- the chosen node (B or a warm one, each with coverage, bonus and pull), and
-- the warm nodes evaluated, each with `lost` (why it did not win) set.
-- `via_index`: B was decided through a fresh index.  `explain`: every warm
-- node's bonus is worked out (a decision needs only the competitors').
function LOCALITY.choose(P, req, now, L, B, via_index, explain)
  L.pull_all = 0
  for _, k in ipairs(L.keys) do L.pull_all = L.pull_all + k[LOC_KEY.size] end
  local floor = now - P.locality_affinity_ttl_ms
  -- B first, read exactly (its namespace comes with its record's read)
  B.now_floor = floor
  if B.ns == nil and #L.keys > 0 then
    local v = redis.call('HMGET', node_key(B.id), unpack(LOCALITY_NS))
    B.ns = LOCALITY.ns_of(v[LOCALITY_NS.cluster_id], v[LOCALITY_NS.p2p_backend])
  end
  B.coverage, B.pull = LOCALITY.coverage_of(L, B, nil)
  LOCALITY.bonus(P, L, B)
  -- No node of B's kind is cooler than B (least_loaded's pick), and a warm
  -- node's bonus is at most weight x what it holds, so a node whose most is
  -- not above B's bonus cannot score below B: a decision does not read it.
  -- Holding all of it with none of its group's starts pending, B's bonus
  -- is the most any node gets: decided without the warm set (the common case).
  if not explain and B.bonus >= P.locality_weight then return B, {} end
  local warm = LOCALITY.warm_set(P, L, now)
  local evaluated, limit = {}, B.pressure + (LOCALITY.margin(P, B))
  local best, best_score = B, B.pressure - B.bonus
  local in_warm = false
  -- One warm node against the best so far: coverage, bonus, and whether it
  -- wins (lower pressure - bonus; ties: B, then rank, then node id) or why
  -- it lost.
  local function judge(n, c)
    n.now_floor = floor
    n.coverage, n.pull = LOCALITY.coverage_of(L, n, c)
    evaluated[#evaluated + 1] = n
    if explain then LOCALITY.bonus(P, L, n) end
    if n.reason then
      n.lost = n.reason
    elseif n.known ~= B.known then
      n.lost = 'capacity unknown'
    elseif n.coverage == 0 then
      n.lost = 'holds none of it here'
    elseif n.pressure > limit then
      local margin, bound = LOCALITY.margin(P, B)
      n.lost = 'pressure ' .. LOCALITY.p3(n.pressure) .. ' over ' .. LOCALITY.p3(B.pressure)
        .. ' + ' .. bound .. ' ' .. LOCALITY.p3(margin)
    else
      if not explain then LOCALITY.bonus(P, L, n) end
      local s = n.pressure - n.bonus
      if s < best_score or (s == best_score and best ~= B and LOCALITY.first(n, best)) then
        if best ~= B then best.lost = 'a warmer or cooler node won' end
        best, best_score = n, s
      else
        n.lost = 'pressure - bonus ' .. LOCALITY.p3(s) .. ' not below ' .. LOCALITY.p3(best_score)
      end
    end
  end
  -- (the warm nodes that could win: not B, their most possible bonus above B's)
  local rivals = {}
  if not explain then
    for _, w in ipairs(warm) do
      local most = w[LOC_WARM.id] ~= B.id and LOCALITY.most_bonus(P, L, w[LOC_WARM.held])
      if most and most > B.bonus then rivals[#rivals + 1] = { w, most } end
    end
  end
  if via_index and not explain then
    -- The screen: each rival's bucket (its index entry, one HGET) gives its
    -- pressure and rank, so one past the margin, or of another kind of
    -- capacity, is not read further; the others are judged least possible
    -- score first, and once that is past the best score found (or equal,
    -- ranking after it) none left can win.  The same choice as judging
    -- every one (below), with records read only for those that could still
    -- win: an HGET a rival is cheaper than reading each whole.
    local screen = {}
    for _, r in ipairs(rivals) do
      local w, most = r[1], r[2]
      local idx = redis.call('HGET', node_key(w[LOC_WARM.id]), 'idx')
      local b = idx and idx ~= '' and parse_bucket(idx)
      if b and b.known == B.known then
        local x = LOCALITY.screened(w, idx, b, req, most)
        if x.pressure <= limit then screen[#screen + 1] = x end
      end
    end
    table.sort(screen, LOCALITY.before)
    for _, x in ipairs(screen) do
      if x.least > best_score
          or (x.least == best_score and (best == B or not LOCALITY.first(x, best))) then
        break
      end
      judge(LOCALITY.candidate(P, req, now, x.id, x.idx), x.w[LOC_WARM.held])
    end
  elseif not explain then
    for _, r in ipairs(rivals) do
      judge(LOCALITY.candidate(P, req, now, r[1][LOC_WARM.id]), r[1][LOC_WARM.held])
    end
  else
    for _, w in ipairs(warm) do
      if w[LOC_WARM.id] == B.id then
        in_warm = true
      else
        judge(LOCALITY.candidate(P, req, now, w[LOC_WARM.id]), w[LOC_WARM.held])
      end
    end
  end
  if best ~= B and B.coverage > 0 then B.lost = 'a warmer or cooler node won' end
  if explain and in_warm then evaluated[#evaluated + 1] = B end
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

