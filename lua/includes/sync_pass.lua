--[[
  includes/sync_pass.lua: a pass of a node-list sync (sync_begin-5.lua,
  sync_stage-5.lua, sync_walk-5.lua): making the cell's node list equal a
  given one (the static list, or the one Kubernetes discovery computed) in
  bounded steps.

  <base>sync-pass holds the pass under way: token, kind ("static" or
  "discovered"), digest (of the list, so a replica syncing the same list
  joins it), listed ("1" a non-empty list), cursor (of the removal walk),
  changed and removed (the pass's counts so far), done ("1" once committed).
  <base>sync-stage:<token> is its staging set: the listed ids a chunk sent
  and the walk has not read yet.  Both expire PASS_TTL_MS after the pass's
  last step; nothing but the pass's own steps reads them.
]]
-- @exports PASS PASS_TTL_MS STAGE_MAX WALK_REMOVALS pass_key stage_key static_key
-- @exports load_pass check_token
-- @include common
local PASS_TTL_MS = '60000' -- a pass no step touched for this long is gone
local STAGE_MAX = 1000 -- nodes a chunk may hold
local WALK_REMOVALS = 32 -- nodes a walk step removes at most
-- The pass under way (a layout)
-- @layout PASS
local PASS = { 'token', 'kind', 'digest', 'listed', 'cursor', 'changed', 'removed', 'done' }

local function pass_key() return BASE .. 'sync-pass' end
local function stage_key(token) return BASE .. 'sync-stage:' .. token end
-- (the static nodes as a set, see sync_walk-5.lua)
local function static_key() return BASE .. 'static' end

-- ARGV[2], the pass's token, checked: nil, or the error to answer.
local function check_token(token)
  if not token or #token < 1 or #token > 64 or string.find(token, '[^0-9a-f]') then
    return fail(ERR.BADARG, 'ARGV[2] (token): want 1..64 of [0-9a-f]')
  end
  return nil
end

-- The pass under way, read (fields by PASS); the error to answer when
-- `token` is not its token (another pass began since, or it expired).
local function load_pass(token)
  local pass = redis.call('HMGET', pass_key(), unpack(PASS))
  if pass[PASS.token] ~= token then
    return pass, fail(ERR.SUPERSEDED, 'sync pass ' .. token .. ' is not the one under way ('
      .. (pass[PASS.token] and ('pass ' .. pass[PASS.token] .. ' began since') or 'it expired')
      .. '): nothing written')
  end
  return pass, nil
end
