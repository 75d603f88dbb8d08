--[[
  includes/ctx.lua: the per-call context.  Every call (one FCALL or EVALSHA)
  makes one, bind_call (includes/base.lua) returns it as `ctx`, and it is
  passed explicitly, as the first argument, to every function that reads or
  writes per-call state; no per-call state lives anywhere else.  (The library
  keeps only state that never goes stale from call to call: kept_table,
  includes/base.lua.)  Every field is in the constructor, with a value (false
  for "not yet"): a table made at its full size is never rebuilt as it grows.
]]
-- @exports new_ctx

local function new_ctx()
  return {
    -- The cell's policy, typed and shared read-only (load_policy,
    -- includes/common.lua): what the decisions of the call share, and what
    -- end_reservation keeps tombstones by.  false until loaded.
    P = false,
    -- The instant a Schedule decides at (schedule_one), false until taken:
    -- a batch decides as if its requests came within one millisecond.
    now = false,
    -- The instant a heartbeat is heard at (heartbeat_one, heard_ms).
    heard = false,
    -- Must the next decision or heartbeat sweep due expiries?  false once a
    -- sweep at this call's instant left nothing due.
    more_due = true,
    -- The placement index has no stale node left (sweep_stale ran and found
    -- less than a batch), includes/index.lua.
    fresh = false,
    -- A batch of Schedules (schedule_batch-5.lua): the rotation counter and
    -- the reservation count are read once and written once (finish_batch),
    -- and the index keeps bucket members and picks from one decision to
    -- the next.
    batch = false,
    rr = false, -- the batch's rotation counter, once read
    seq = false, -- the batch's count of reservations made, once read
    -- The reservation ids this batch reserved itself (when Redis held none
    -- of its ids: a replay need read only these), or false.
    new_ids = false,
    -- Outcome -> reservations ended, in a batch call (flush_counts writes
    -- them at its end), or false: each end counted at once.
    counts = false,
    -- Nodes whose load changed in this call; reindex_touched (includes/index)
    -- brings their index entries up to date before the script returns
    -- (node id -> true, or 'registered': known to be in the cell).
    touched = {},
    -- The node record a heartbeat holds in hand, to write once at its end
    -- (a read_node table, plus `acked`): ending one of its reservations
    -- changes the held numbers (and sets `dirty`), not Redis.  Or false.
    held = false,
    -- fmt(x) of this call's instants (instant_text, includes/base.lua).
    instants = {},
    -- The placement index as this call read and moved it (includes/index):
    shapes = false, -- the shapes with buckets, once read (SMEMBERS idx-shapes)
    shape_set = false, -- the same as a set
    -- Each stream's first members (firsts[key]: exactly the first #list
    -- members of that zset, in its order; firsts_more[key]: it may hold
    -- more); a move of this call updates what it changes.
    firsts = {},
    firsts_more = {},
    sizes = {}, -- bucket -> its size, known
    -- Bucket -> its members, in byte order, when small and known (a batch).
    members = {},
    -- What this call's picks found (picks[cpu][mem]: the buckets of the best
    -- rank; false: none), kept while the index moves only by placements, or
    -- false.
    picks = false,
    -- Shape -> its description (capacities, stream keys, pick streams).
    shape_desc = {},
  }
end
