--[[
  includes/sync_pass.lua: a pass of a node-list sync (sync_begin-5.lua,
  sync_stage-5.lua, sync_walk-5.lua): making the cell's node list equal a
  given one (the static list, or the one Kubernetes discovery computed) in
  bounded steps.

  <base>sync-pass holds the pass under way: token, kind ("static" or
  "discovered"), digest (of the list, so a replica syncing the same list
  joins it), listed ("1" a non-empty list), cursor (of the removal walk),
  changed and removed (the pass's counts so far).  The step that commits a
  pass deletes it and names it in stats (sync_done its token,
  sync_done_changed and sync_done_removed its counts), so a replica that
  joined it learns it is done.
  <base>sync-stage:<token> is its staging set: the listed ids a chunk sent
  and the walk has not read yet.  Both expire PASS_TTL_MS after the pass's
  last step; nothing but the pass's own steps reads them.
]]
-- @exports PASS PASS_TTL_MS STAGE_MAX WALK_REMOVALS WALK_WORK pass_key stage_key static_key
-- @exports load_pass check_token
-- @include common
local PASS_TTL_MS = '60000' -- a pass no step touched for this long is gone
local STAGE_MAX = 1000 -- nodes a chunk may hold
local WALK_REMOVALS = 16 -- nodes a walk step removes at most (each as an unregister)
-- ...and bindings, reservations and artifacts those removals drop, at most:
-- a step ends after the removal that reaches it (a removal costs what its
-- node holds: 16 nodes of 25-45 sandboxes were a step of 8 ms at 100,000
-- nodes; one node listing more than this is a step of its own)
local WALK_WORK = 256
-- The pass under way (a layout)
-- @layout PASS
local PASS = { 'token', 'kind', 'digest', 'listed', 'cursor', 'changed', 'removed' }

-- The last pass committed, in stats (a layout)
-- @layout SYNC_DONE
local SYNC_DONE = { 'sync_done', 'sync_done_changed', 'sync_done_removed' }

local function pass_key() return BASE .. 'sync-pass' end
local function stage_key(token) return BASE .. 'sync-stage:' .. token end
-- (the static nodes as a set, see sync_walk-5.lua)
local function static_key() return BASE .. 'static' end

-- ARGV[1], the pass's token, checked: nil, or the error to answer.
local function check_token(token)
  if not token or #token < 1 or #token > 19 or string.find(token, '%D') then
    return fail(ERR.BADARG, 'ARGV[1] (token): want 1..19 digits')
  end
  return nil
end

-- The pass under way, read (fields by PASS); then, when `token` is not its
-- token: the pass's counts {changed =, removed =} when it committed (stats
-- sync_done names the last pass committed), else the error to answer
-- (another pass began since, or it expired).
local function load_pass(token)
  local pass = redis.call('HMGET', pass_key(), unpack(PASS))
  if pass[PASS.token] == token then return pass, nil, nil end
  local last = redis.call('HMGET', STATS_KEY, unpack(SYNC_DONE))
  if last[SYNC_DONE.sync_done] == token then
    return pass, nil,
      { changed = last[SYNC_DONE.sync_done_changed], removed = last[SYNC_DONE.sync_done_removed] }
  end
  return pass, fail(ERR.SUPERSEDED, 'sync pass ' .. token .. ' is not the one under way ('
    .. (pass[PASS.token] and ('pass ' .. pass[PASS.token] .. ' began since') or 'it expired')
    .. '): nothing written'), nil
end
