--[[
  includes/ctx.lua: the per-call context.  Every call (one FCALL or EVALSHA)
  makes one, bind_call (includes/base.lua) returns it as `ctx`, and it is
  passed explicitly, as the first argument, to every function that reads or
  writes per-call state; no per-call state lives anywhere else.  (The library
  keeps only state that never goes stale from call to call: kept_table,
  includes/base.lua.)  ctx is an array whose slots are read by name (the
  layout CTX below); every slot is in the constructor, with a value (false
  for "not yet"), so the table is made once at its size, with no hash part.
]]
-- @exports CTX new_ctx

-- The fields, by name (a layout: ctx[CTX.P] is ctx[1] in the built text, an
-- array slot, which a call makes and reads for less than a named key).
-- @layout CTX
local CTX = {
  'P', 'now', 'heard', 'more_due', 'fresh', 'batch', 'rr', 'seq', 'new_ids',
  'counts', 'touched', 'held', 'instants', 'shapes', 'shape_set', 'firsts',
  'firsts_more', 'sizes', 'members', 'picks', 'shape_desc', 'rebuilt', 'checked',
  'stale_left', 'stale_tries',
}

local function new_ctx()
  return {
    -- The cell's policy, typed and shared read-only (load_policy,
    -- includes/common.lua): what the decisions of the call share, and what
    -- end_reservation keeps tombstones by.  false until loaded.
    false, -- ctx[CTX.P]
    -- The instant a Schedule decides at (schedule_one), false until taken:
    -- a batch decides as if its requests came within one millisecond.
    false, -- ctx[CTX.now]
    -- The instant a heartbeat is heard at (heartbeat_one, heard_ms).
    false, -- ctx[CTX.heard]
    -- Must the next decision or heartbeat sweep due expiries?  false once a
    -- sweep at this call's instant left nothing due.
    true, -- ctx[CTX.more_due]
    -- The placement index has no stale node left (true: sweep_stale ran and
    -- found less than a batch), or has some ('behind': it ran this call and
    -- left some; false: not run yet), includes/index.lua.
    false, -- ctx[CTX.fresh]
    -- A batch of Schedules (schedule_batch-5.lua): the rotation counter and
    -- the reservation count are read once and written once (finish_batch),
    -- and the index keeps bucket members and picks from one decision to
    -- the next.
    false, -- ctx[CTX.batch]
    false, -- ctx[CTX.rr]: the batch's rotation counter, once read
    false, -- ctx[CTX.seq]: the batch's count of reservations made, once read
    -- The reservation ids this batch reserved itself (when Redis held none
    -- of its ids: a replay need read only these), or false.
    false, -- ctx[CTX.new_ids]
    -- Outcome -> reservations ended, in a batch call (flush_counts writes
    -- them at its end), or false: each end counted at once.
    false, -- ctx[CTX.counts]
    -- Nodes whose load changed in this call; reindex_touched (includes/index)
    -- brings their index entries up to date before the script returns
    -- (node id -> true, or 'registered': known to be in the cell).
    {}, -- ctx[CTX.touched]
    -- The node record a heartbeat holds in hand, to write once at its end
    -- (a read_node table, plus `acked`): ending one of its reservations
    -- changes the held numbers (and sets `dirty`), not Redis.  Or false.
    false, -- ctx[CTX.held]
    -- fmt(x) of this call's instants (instant_text, includes/base.lua).
    {}, -- ctx[CTX.instants]
    -- The placement index as this call read and moved it (includes/index):
    false, -- ctx[CTX.shapes]: the shapes with buckets, once read (SMEMBERS idx-shapes)
    false, -- ctx[CTX.shape_set]: the same as a set
    -- Each stream's first members (firsts[key]: exactly the first #list
    -- members of that zset, in its order; firsts_more[key]: it may hold
    -- more); a move of this call updates what it changes.
    {}, -- ctx[CTX.firsts]
    {}, -- ctx[CTX.firsts_more]
    {}, -- ctx[CTX.sizes]: bucket -> its size, known
    -- Bucket -> its members, in byte order, when small and known (a batch).
    {}, -- ctx[CTX.members]
    -- What this call's picks found (picks[cpu][mem]: the buckets of the best
    -- rank; false: none), kept while the index moves only by placements, or
    -- false.
    false, -- ctx[CTX.picks]
    -- Shape -> its description (capacities, stream keys, pick streams).
    {}, -- ctx[CTX.shape_desc]
    -- This call took its step of the index rebuild under way (schedule_one).
    false, -- ctx[CTX.rebuilt]
    -- While the index is rebuilt: the buckets whose members this call
    -- checked (REBUILD.check, includes/index_moves.lua), or false.
    false, -- ctx[CTX.checked]
    -- Stale members the picks may still take out of their buckets this
    -- call, once sweep_stale ran (sweep_stale_bucket), or false.
    false, -- ctx[CTX.stale_left]
    -- Picks that met a stale node this call may still make (index_chosen,
    -- includes/schedule.lua: a batch's decisions share them), or false
    -- before the first.
    false, -- ctx[CTX.stale_tries]
  }
end
