--[[
  includes/cpu_config.lua: one step of a cluster's CPU config exchange
  (cpu_config-6.lua's ARGV as `A`, its KEYS[6] as `cfg_key`); cpu_config-6.lua
  runs one, heartbeat_batch-5.lua any number beside the heartbeats.
]]
-- @exports cpu_config_one cfg_depart cfg_moved
-- @include common

-- (Every step is O(1) in the cluster's size, and so is a round's computation
-- while the round's counts are exact: it reads the cluster's distinct configs,
-- kept by digest with how many members have each (cpucfg-configs:<cluster>),
-- not the members.  A new member joining with a config another member has
-- keeps the result: the intersection cannot change.
-- A round is left or advanced on the events that change it, a member's
-- config arriving or changing (ingest), a member joining or moving (ingest,
-- or its heartbeat: cfg_moved), a member removed (cfg_depart,
-- includes/nodes.lua).  Only members without a config hold a round back;
-- they are also kept in cpucfg-missing:<cluster>, and while the round waits
-- each ingest checks PRUNE_STEP of them at random, so one whose record went
-- without either event (deleted by hand) stops blocking the round soon.)
local PRUNE_STEP = '2' -- missing members the waiting round checks per ingest
local COMPUTE_LEASE_MS = 2000 -- one heartbeat computes a round; another may after this

-- What the exchange reads (layouts: names in the source, positions in the
-- built text): a member's record; this node's config fields; the round as one
-- ingest reads it, in the order of its HMGET ('m:<node>' and 'sent:<node>'
-- are this node's member and sent fields); the compute lease; what a round a
-- new config started is computed from.
-- @layout CFG_MEMBER
local CFG_MEMBER = { 'cluster_id', 'cpucfg_cluster' }
-- @layout CFG_NODE
local CFG_NODE = { 'cpu_config_json', 'cpu_config_digest', 'cpucfg_cluster' }
-- @layout CFG_ROUND
local CFG_ROUND = { 'member', 'missing', 'epoch', 'result_epoch', 'result', 'sent', 'counted' }
-- @layout CFG_LEAVER
local CFG_LEAVER = { 'member', 'epoch', 'counted' }
-- @layout CFG_LEASE
local CFG_LEASE = { 'compute_epoch', 'compute_until' }
-- @layout CFG_EXTEND
local CFG_EXTEND = { 'extend_epoch', 'extend_by', 'result', 'narrow' }

local function missing_key(cfg_key)
  return BASE .. 'cpucfg-missing:' .. string.sub(cfg_key, #BASE + 8)
end
local function configs_key(cfg_key)
  return BASE .. 'cpucfg-configs:' .. string.sub(cfg_key, #BASE + 8)
end

-- The round's counts: cpucfg-configs:<cluster> holds, per config digest,
-- n:<digest> (how many members have it) and c:<digest> (the config), and
-- they are exact while the round's `counted` is its epoch.  Each step of
-- this version keeps them so and moves `counted` along with the epoch; a
-- replica of an older version bumps the epoch without counting, which leaves
-- `counted` behind, and the next computation goes over every member and
-- counts them again.  (An older version's leave, or a record deleted by
-- hand, leaves a count too high: the config stays in the intersection,
-- which is then narrower than the members' own: safe, and `schedctl doctor`
-- has the round computed again.)  A config of unknown digest ('stored')
-- cannot be counted: while a member has one, every computation goes over
-- every member.
-- (epoch, counted: as the round holds them)
local function cfg_exact(epoch, counted) return counted ~= false and counted == (epoch or '0') end

-- One member more (by 1) or fewer (by -1) with config `digest`; returns how
-- many members have it after.  (json: the config, for a member more)
local function cfg_count(key, digest, by, json)
  local ckey = configs_key(key)
  local n = redis.call('HINCRBY', ckey, 'n:' .. digest, by)
  if n <= 0 then
    redis.call('HDEL', ckey, 'n:' .. digest, 'c:' .. digest)
  elseif n == 1 and by > 0 then
    redis.call('HSET', ckey, 'c:' .. digest, json)
  end
  return n
end

-- The member leaves the round without starting a new one (cfg_depart,
-- cfg_prune).  The result may then be narrower than the members'
-- intersection, unless another member has the leaver's config (its count):
-- the configs in the round are the same, and so is the result.  Otherwise
-- the round is `narrow` until it is computed again, and keeps no result for
-- a new member meanwhile.  (d:<digest> was an older version's witness of a
-- config: dropped with any member of it, so the older version computes.)
local function cfg_leave(key, id)
  local v = redis.call('HMGET', key, 'm:' .. id, 'epoch', 'counted')
  local cur = v[CFG_LEAVER.member]
  if cur == false then return end
  if cur == '' then
    redis.call('HINCRBY', key, 'missing', -1)
    redis.call('SREM', missing_key(key), id)
  else
    redis.call('HDEL', key, 'd:' .. cur)
    if cur == 'stored' or not cfg_exact(v[CFG_LEAVER.epoch], v[CFG_LEAVER.counted])
        or cfg_count(key, cur, -1) <= 0 then
      redis.call('HSET', key, 'narrow', '1')
    end
  end
  redis.call('HDEL', key, 'm:' .. id, 'sent:' .. id)
end

-- The fields of a round with no member in it (nor a member's mark): one
-- whose last member departs goes, with its sets.
local CFG_FIELDS = { missing = true, epoch = true, result = true, result_epoch = true,
  compute_epoch = true, compute_until = true, narrow = true, extend_epoch = true, extend_by = true,
  counted = true }
local CFG_FIELD_COUNT = 10

-- Node `node_id` departs `cluster`'s round: removed from the cell
-- (includes/nodes.lua) or moved to another cluster.
local function cfg_depart(node_id, cluster)
  local key = BASE .. 'cpucfg:' .. cluster
  cfg_leave(key, node_id)
  if redis.call('HLEN', key) <= CFG_FIELD_COUNT then
    for _, f in ipairs(redis.call('HKEYS', key)) do
      if not CFG_FIELDS[f] then return end
    end
    redis.call('DEL', key, missing_key(key), configs_key(key))
  end
end

-- A heartbeat moved node `node_id` to `cluster`: it departs the round of the
-- cluster it was a member of, if another (the next ingest joins it to this
-- one's), so a heartbeat without the CPU config step leaves no count behind.
local function cfg_moved(node_id, cluster)
  local was = redis.call('HGET', node_key(node_id), 'cpucfg_cluster')
  if was and was ~= cluster then
    cfg_depart(node_id, was)
    redis.call('HDEL', node_key(node_id), 'cpucfg_cluster')
  end
end

-- Is member `id` still in `cluster`'s round (its record says so)?
local function cfg_member(id, cluster)
  local v = redis.call('HMGET', node_key(id), unpack(CFG_MEMBER))
  return v[CFG_MEMBER.cluster_id] == cluster and v[CFG_MEMBER.cpucfg_cluster] == cluster
end

local cfg_prune

-- One bounded step of the prune while the round waits: PRUNE_STEP of the
-- members without a config, at random, dropped if they left or moved.  (A
-- round written before cpucfg-missing existed, or whose count drifted, has
-- no such set: it is built once, by one whole prune.)
local function cfg_prune_step(cfg_key, cluster)
  local mkey = missing_key(cfg_key)
  local some = redis.call('SRANDMEMBER', mkey, PRUNE_STEP)
  if #some == 0 then
    -- (and the count made exact from the members, so this runs once)
    local missing = 0
    local ids, digests = cfg_prune(cfg_key, cluster)
    for i, id in ipairs(ids) do
      if digests[i] == '' then
        redis.call('SADD', mkey, id)
        missing = missing + 1
      end
    end
    redis.call('HSET', cfg_key, 'missing', missing)
    return
  end
  for _, id in ipairs(some) do
    if not cfg_member(id, cluster) then cfg_leave(cfg_key, id) end
  end
end

-- Drop members that left or moved; returns the member ids that remain, and
-- their config digests.  (O(cluster): only for the round's one computation.)
cfg_prune = function(cfg_key, cluster)
  local members, digests = {}, {}
  local flat = redis.call('HGETALL', cfg_key)
  for i = 1, #flat, 2 do
    local f = flat[i]
    if string.sub(f, 1, 2) == 'm:' then
      local id = string.sub(f, 3)
      if cfg_member(id, cluster) then
        members[#members + 1] = id
        digests[#members] = flat[i + 1]
      else
        cfg_leave(cfg_key, id)
      end
    end
  end
  return members, digests
end

local function cfg_epoch(cfg_key) return redis.call('HGET', cfg_key, 'epoch') or '0' end

local function cfg_deliver(cfg_key, node_id)
  if redis.call('HGET', cfg_key, 'result_epoch') ~= cfg_epoch(cfg_key) then return nil end
  local result = redis.call('HGET', cfg_key, 'result')
  if result == '' or redis.call('HGET', cfg_key, 'sent:' .. node_id) == cfg_epoch(cfg_key) then
    return { 'none' }
  end
  redis.call('HSET', cfg_key, 'sent:' .. node_id, cfg_epoch(cfg_key))
  return { 'deliver', result }
end

local function cpu_config_one(ctx, A, cfg_key)
  local mode = A[1]
  local node_id = A[2]
  local cluster = A[3]

  local P = ctx[CTX.P] or load_policy(ctx)
  if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
  ctx[CTX.P] = P
  local nkey = node_key(node_id)
  if redis.call('EXISTS', nkey) == 0 then return { 'none' } end

  if mode == 'store' then
    if A[4] ~= cfg_epoch(cfg_key) then return { 'none' } end
    if redis.call('HGET', cfg_key, 'result_epoch') ~= A[4] then
      redis.call('HSET', cfg_key, 'result', A[5], 'result_epoch', A[4])
    end
    return cfg_deliver(cfg_key, node_id) or { 'none' }
  end

  -- mode ingest: membership and this node's digest.
  local n = redis.call('HMGET', nkey, unpack(CFG_NODE))
  local digest = A[4]
  if digest ~= '' then
    if digest ~= n[CFG_NODE.cpu_config_digest] then
      redis.call('HSET', nkey, 'cpu_config_digest', digest)
    end
  elseif n[CFG_NODE.cpu_config_digest] then
    digest = n[CFG_NODE.cpu_config_digest]
  elseif n[CFG_NODE.cpu_config_json] and n[CFG_NODE.cpu_config_json] ~= '' then
    digest = 'stored'
  end
  if n[CFG_NODE.cpucfg_cluster] ~= cluster then
    if n[CFG_NODE.cpucfg_cluster] then cfg_depart(node_id, n[CFG_NODE.cpucfg_cluster]) end
    redis.call('HSET', nkey, 'cpucfg_cluster', cluster)
  end
  -- (the round as it stands, in one read: most heartbeats change nothing in it)
  local c = redis.call('HMGET', cfg_key, 'm:' .. node_id, 'missing', 'epoch', 'result_epoch',
    'result', 'sent:' .. node_id, 'counted')
  local cur = c[CFG_ROUND.member]
  if cur == digest and A[5] ~= '1' and (tonumber(c[CFG_ROUND.missing]) or 0) <= 0 then
    -- a member with its config and nothing missing: cfg_deliver from that read
    local e = c[CFG_ROUND.epoch] or '0'
    if c[CFG_ROUND.result_epoch] == e then
      if c[CFG_ROUND.result] == '' or c[CFG_ROUND.sent] == e then return { 'none' } end
      redis.call('HSET', cfg_key, 'sent:' .. node_id, e)
      return { 'deliver', c[CFG_ROUND.result] }
    end
  end
  if cur ~= digest then
    local was_missing = cur == ''
    local is_missing = digest == ''
    if cur == false then was_missing = false end
    if is_missing and not was_missing then
      redis.call('HINCRBY', cfg_key, 'missing', 1)
      redis.call('SADD', missing_key(cfg_key), node_id)
    end
    if was_missing and not is_missing then
      redis.call('HINCRBY', cfg_key, 'missing', -1)
      redis.call('SREM', missing_key(cfg_key), node_id)
    end
    -- the counts follow (a new round's are exact: there is nothing to count)
    local known = digest ~= '' and digest ~= 'stored' -- (a config of known digest)
    local exact = cfg_exact(c[CFG_ROUND.epoch], c[CFG_ROUND.counted])
    if c[CFG_ROUND.epoch] == false then
      redis.call('DEL', configs_key(cfg_key))
      exact = true
    end
    local others = 0 -- (members besides this one with its config, if exact)
    if exact then
      if cur and cur ~= '' and cur ~= 'stored' then cfg_count(cfg_key, cur, -1) end
      local json = n[CFG_NODE.cpu_config_json]
      if known and json and json ~= '' then
        others = cfg_count(cfg_key, digest, 1, json) - 1
      elseif digest ~= '' then
        exact = false -- (a config that cannot be counted: see cfg_exact)
      end
    end
    if cur and cur ~= '' then redis.call('HDEL', cfg_key, 'd:' .. cur) end -- (see cfg_leave)
    -- a new round: a new member whose config another member has leaves the
    -- intersection as it was, so the round keeps its result; any other
    -- change (a member's config changing may widen it) is computed once
    -- nothing is missing
    local current = cur == false and known and c[CFG_ROUND.result_epoch] ~= false
      and c[CFG_ROUND.result_epoch] == (c[CFG_ROUND.epoch] or '0')
      and not redis.call('HGET', cfg_key, 'narrow')
    local kept = current and exact and others > 0
    -- (a new member with a config nobody is known to have: the new round's
    -- result is the current one narrowed by this config alone, computed from
    -- those two; `extend_by`, read when the round is computed)
    local extends = current and not kept
    redis.call('HSET', cfg_key, 'm:' .. node_id, digest)
    local epoch = redis.call('HINCRBY', cfg_key, 'epoch', 1)
    if exact then redis.call('HSET', cfg_key, 'counted', fmt(epoch)) end
    if kept then
      redis.call('HSET', cfg_key, 'result_epoch', fmt(epoch))
    elseif extends then
      redis.call('HDEL', cfg_key, 'result_epoch')
      redis.call('HSET', cfg_key, 'extend_epoch', fmt(epoch), 'extend_by', node_id)
    else
      redis.call('HDEL', cfg_key, 'result', 'result_epoch')
    end
  elseif A[5] == '1' then
    redis.call('HDEL', cfg_key, 'sent:' .. node_id)
  end

  if (tonumber(redis.call('HGET', cfg_key, 'missing')) or 0) > 0 then
    -- the round waits for a config; a member gone unnoticed must not block it
    cfg_prune_step(cfg_key, cluster)
    if (tonumber(redis.call('HGET', cfg_key, 'missing')) or 0) > 0 then return { 'none' } end
  end
  local done = cfg_deliver(cfg_key, node_id)
  if done then return done end
  -- one heartbeat computes the round (a lease of Redis time): the others of
  -- that moment answer none and get the result on their next heartbeat
  local epoch = cfg_epoch(cfg_key)
  local now = now_ms(P)
  local lease = redis.call('HMGET', cfg_key, unpack(CFG_LEASE))
  if lease[CFG_LEASE.compute_epoch] == epoch
    and (tonumber(lease[CFG_LEASE.compute_until]) or 0) > now then
    return { 'none' }
  end
  redis.call('HSET', cfg_key, 'compute_epoch', epoch, 'compute_until', fmt(now + COMPUTE_LEASE_MS))
  local out = { 'compute', epoch }
  -- a round one new member started from a current result: the intersection of
  -- that result (as a config of its own) and the member's config is the
  -- intersection of them all (nothing left since: not `narrow`)
  local ext = redis.call('HMGET', cfg_key, unpack(CFG_EXTEND))
  if ext[CFG_EXTEND.extend_epoch] == epoch and ext[CFG_EXTEND.result]
      and not ext[CFG_EXTEND.narrow] then
    local by = ext[CFG_EXTEND.extend_by]
    out[3], out[4] = '', ext[CFG_EXTEND.result]
    out[5], out[6] = by, redis.call('HGET', node_key(by), 'cpu_config_json') or ''
    return out
  end
  if cfg_exact(epoch, redis.call('HGET', cfg_key, 'counted')) then
    redis.call('HDEL', cfg_key, 'narrow') -- (computed over the members' configs)
    -- the distinct configs, as counted: O(configs), whatever the members
    local flat = redis.call('HGETALL', configs_key(cfg_key))
    for i = 1, #flat, 2 do
      if string.sub(flat[i], 1, 2) == 'c:' then
        out[#out + 1] = ''
        out[#out + 1] = flat[i + 1]
      end
    end
    return out
  end
  -- every member's record checked (O(cluster)), and the counts made again:
  -- one config per digest (the same config twice intersects to itself; a
  -- config of unknown digest, 'stored', goes each time)
  local members, digests = cfg_prune(cfg_key, cluster)
  redis.call('HDEL', cfg_key, 'narrow') -- (computed over the members that are left)
  local ckey = configs_key(cfg_key)
  redis.call('DEL', ckey)
  local listed, exact = {}, true
  for i, id in ipairs(members) do
    local d = digests[i]
    if listed[d] and d ~= 'stored' then
      if exact then redis.call('HINCRBY', ckey, 'n:' .. d, 1) end
    else
      listed[d] = true
      local json = redis.call('HGET', node_key(id), 'cpu_config_json') or ''
      out[#out + 1] = id
      out[#out + 1] = json
      if d == '' or d == 'stored' or json == '' then
        exact = false
      else
        redis.call('HSET', ckey, 'n:' .. d, 1, 'c:' .. d, json)
      end
    end
  end
  if exact then
    redis.call('HSET', cfg_key, 'counted', epoch)
  else
    redis.call('DEL', ckey)
  end
  return out
end
