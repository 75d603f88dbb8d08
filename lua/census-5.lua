--[[
  census-5.lua: one bounded step of the cell's node census, the count of
  nodes by derived status that the replicas' metrics show
  (agentenv_scheduler_observed_nodes).  Every replica's monitor calls it once
  a tick; the steps of all replicas share one cursor, so a pass over the
  fleet costs the same however many replicas run, and no call reads more than
  ARGV[1] nodes.

  A pass walks the node list in node-id byte order (ZRANGEBYLEX from the
  stored cursor: every node present for the whole pass is counted exactly
  once, a node added or removed meanwhile at most once), each node's status
  derived at the instant of the step that reads it (docs/contract.md).  The
  step that finishes a pass stores its counts as the census and starts the
  next pass.  A fleet of at most ARGV[1] nodes is counted whole in each call.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     step: the nodes read per step (1..10000)

  Returns {done_ms, passes, counts...}: the last finished pass and how many
          have finished, counts its status, count, status, count, ...
          (done_ms "", passes 0 and no counts before the first one)
  Errors: NO_POLICY (no policy)
  Writes: census (hash: cursor, p:<status> counts of the pass under way,
          d:<status> counts of the last finished pass, done_ms, passes)
]]
-- @include stages
local P = load_policy(ctx)
if not P then return fail(ERR.NO_POLICY, NO_POLICY) end
local step = tonumber(ARGV[1])
if not step or step < 1 or step > 10000 then
  return fail(ERR.BADARG, 'ARGV[1] (census step): want 1..10000')
end
step = math.floor(step)
local now = now_ms(P)
local CENSUS_KEY = BASE .. 'census'
local cursor = redis.call('HGET', CENSUS_KEY, 'cursor') or ''
local ids = node_page('', cursor, step)
-- What it reads of each node, and of the census (layouts)
-- @layout CENSUS_NODE
local CENSUS_NODE = { 'last_seen_ms', 'lingering', 'status' }
-- @layout CENSUS_HEAD
local CENSUS_HEAD = { 'done_ms', 'passes' }
local counts = {}
for _, id in ipairs(ids) do
  local v = redis.call('HMGET', node_key(id), unpack(CENSUS_NODE))
  local n = {
    last_seen = tonumber(v[CENSUS_NODE.last_seen_ms]),
    lingering = v[CENSUS_NODE.lingering] == '1',
    reported = v[CENSUS_NODE.status] or '',
  }
  local status = derive_status(n, P, now)
  counts[status] = (counts[status] or 0) + 1
end
for status, k in pairs(counts) do
  redis.call('HINCRBY', CENSUS_KEY, 'p:' .. status, fmt(k))
end
if #ids < step then
  -- the pass is done: its counts become the census, and the next pass starts
  local flat = redis.call('HGETALL', CENSUS_KEY)
  local drop, set = {}, { 'cursor', '', 'done_ms', fmt(now) }
  redis.call('HINCRBY', CENSUS_KEY, 'passes', '1')
  for i = 1, #flat, 2 do
    local f = flat[i]
    local kind, status = string.sub(f, 1, 2), string.sub(f, 3)
    if kind == 'p:' then
      drop[#drop + 1] = f
      set[#set + 1] = 'd:' .. status
      set[#set + 1] = flat[i + 1]
    elseif kind == 'd:' then
      drop[#drop + 1] = f
    end
  end
  if #drop > 0 then redis.call('HDEL', CENSUS_KEY, unpack(drop)) end
  redis.call('HSET', CENSUS_KEY, unpack(set))
else
  redis.call('HSET', CENSUS_KEY, 'cursor', ids[#ids])
end
local head = redis.call('HMGET', CENSUS_KEY, unpack(CENSUS_HEAD))
local out = { head[CENSUS_HEAD.done_ms] or '', head[CENSUS_HEAD.passes] or '0' }
local flat = redis.call('HGETALL', CENSUS_KEY)
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, 2) == 'd:' then
    out[#out + 1] = string.sub(flat[i], 3)
    out[#out + 1] = flat[i + 1]
  end
end
return out
