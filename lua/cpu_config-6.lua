--[[
  cpu_config-6.lua: per-cluster CPU config intersection bookkeeping, run
  after each heartbeat (docs/contract.md, "CPU configs").

  Runtimes send their CPU template only until their first successful
  heartbeat; heartbeat-5.lua keeps it in node:<id> cpu_config_json.  Here each
  cluster tracks which nodes it has and the digest of each node's config.
  Once every member has one, the client computes the intersection (in
  Python, scheduler/cpuconfig.py) and stores it for the current epoch; each
  member then gets it exactly once, on its next heartbeat.  A node joining
  the cluster or changing its config bumps the epoch, which drops the result
  and every delivery mark at once; a restarted node (new service instance)
  loses only its own mark.  Members whose node left or moved are pruned
  without a new epoch.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     cpucfg:<cluster>  hash:
                m:<node>     digest of the member's config, "" = none yet,
                             "stored" = has one of unknown digest
                missing      members without a config
                epoch        bumped on join / change
                result       intersection JSON for result_epoch ("" = invalid input)
                result_epoch the epoch result belongs to
                sent:<node>  epoch last delivered to the member
  ARGV[1]     "ingest" (after a heartbeat) | "store" (a computed result)
  ARGV[2]     node_id
  ARGV[3]     cluster_id
  ARGV[4]     ingest: digest of the config this heartbeat carried ("" = none)
              store:  the epoch the result was computed for
  ARGV[5]     ingest: "1" when the node restarted;  store: result JSON ("" = invalid)

  Returns {"deliver", json} | {"none"} | {"compute", epoch, node, config, node, config, ...}
  Errors: PRECONDITION (no policy)
  Writes: KEYS[6]; node:<id> cpu_config_digest, cpucfg_cluster
]]
-- @include common
local CFG_KEY = KEYS[6]
local mode = ARGV[1]
local node_id = ARGV[2]
local cluster = ARGV[3]

local P = load_policy()
if not P then return fail('PRECONDITION', NO_POLICY) end
local nkey = node_key(node_id)
if redis.call('EXISTS', nkey) == 0 then return { 'none' } end

local function leave(key, id)
  local cur = redis.call('HGET', key, 'm:' .. id)
  if cur == false then return end
  if cur == '' then redis.call('HINCRBY', key, 'missing', -1) end
  redis.call('HDEL', key, 'm:' .. id, 'sent:' .. id)
end

-- Drop members that left or moved; returns the member ids that remain.
local function prune()
  local members = {}
  local flat = redis.call('HGETALL', CFG_KEY)
  for i = 1, #flat, 2 do
    local f = flat[i]
    if string.sub(f, 1, 2) == 'm:' then
      local id = string.sub(f, 3)
      local v = redis.call('HMGET', node_key(id), 'cluster_id', 'cpucfg_cluster')
      if v[1] == cluster and v[2] == cluster then
        members[#members + 1] = id
      else
        leave(CFG_KEY, id)
      end
    end
  end
  return members
end

local function epoch() return redis.call('HGET', CFG_KEY, 'epoch') or '0' end

local function deliver()
  if redis.call('HGET', CFG_KEY, 'result_epoch') ~= epoch() then return nil end
  local result = redis.call('HGET', CFG_KEY, 'result')
  if result == '' or redis.call('HGET', CFG_KEY, 'sent:' .. node_id) == epoch() then
    return { 'none' }
  end
  redis.call('HSET', CFG_KEY, 'sent:' .. node_id, epoch())
  return { 'deliver', result }
end

if mode == 'store' then
  if ARGV[4] ~= epoch() then return { 'none' } end
  if redis.call('HGET', CFG_KEY, 'result_epoch') ~= ARGV[4] then
    redis.call('HSET', CFG_KEY, 'result', ARGV[5], 'result_epoch', ARGV[4])
  end
  return deliver() or { 'none' }
end

-- mode ingest: membership and this node's digest.
local n = redis.call('HMGET', nkey, 'cpu_config_json', 'cpu_config_digest', 'cpucfg_cluster')
local digest = ARGV[4]
if digest ~= '' then
  redis.call('HSET', nkey, 'cpu_config_digest', digest)
elseif n[2] then
  digest = n[2]
elseif n[1] and n[1] ~= '' then
  digest = 'stored'
end
if n[3] and n[3] ~= cluster then leave(BASE .. 'cpucfg:' .. n[3], node_id) end
redis.call('HSET', nkey, 'cpucfg_cluster', cluster)
local cur = redis.call('HGET', CFG_KEY, 'm:' .. node_id)
if cur ~= digest then
  local was_missing = cur == ''
  local is_missing = digest == ''
  if cur == false then was_missing = false end
  if is_missing and not was_missing then redis.call('HINCRBY', CFG_KEY, 'missing', 1) end
  if was_missing and not is_missing then redis.call('HINCRBY', CFG_KEY, 'missing', -1) end
  redis.call('HSET', CFG_KEY, 'm:' .. node_id, digest)
  redis.call('HINCRBY', CFG_KEY, 'epoch', 1)
  redis.call('HDEL', CFG_KEY, 'result', 'result_epoch')
elseif ARGV[5] == '1' then
  redis.call('HDEL', CFG_KEY, 'sent:' .. node_id)
end

if (tonumber(redis.call('HGET', CFG_KEY, 'missing')) or 0) > 0 then
  prune()
  if (tonumber(redis.call('HGET', CFG_KEY, 'missing')) or 0) > 0 then return { 'none' } end
end
local done = deliver()
if done then return done end
local out = { 'compute', epoch() }
for _, id in ipairs(prune()) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', node_key(id), 'cpu_config_json') or ''
end
return out
