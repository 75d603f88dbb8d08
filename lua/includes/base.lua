--[[
  includes/base.lua: what every script needs: the cell's keys, errors,
  number formatting and the clock.  Kept small: a script that needs nothing
  more (heartbeat_steady) pays for nothing more on every call.

  Key convention (scheduler/store/keys.py has the full layout):
    KEYS[1] base    "<prefix>:{<cell>}:"  typed keys are derived from it
    KEYS[2] policy  hash
    KEYS[3] nodes   zset of node ids, all scored 0 so ZRANGE is byte order by id
    KEYS[4] stats   hash of counters
    KEYS[5] expiry  zset reservation id -> expiry ms
  Error replies are "<CODE> <message>", codes from scheduler/domain/errors.py.
]]
-- @exports KEYS ARGV BASE POLICY_KEY NODES_KEY STATS_KEY EXPIRY_KEY IDX_SEEN
-- @exports SEEN_KEY IDX_SHAPES bind_call node_key node_res_key
-- @exports node_sbx_key node_roster_key res_key bind_key fail fmt instant_text
-- @exports kept_table keep TEXT PADDED num_text pad9 number_of UNPACK_CHUNK
-- @exports set_all ok_answer raw_policy load_clock server_ms now_ms seen_lags heard_ms
-- @exports corrupt_text count_ok node_page stamp_lead
-- @include constants
-- @include ctx
-- This call's keys and arguments: read-only for the call, bound on entry by
-- bind_call (the library is defined once per server, Redis Functions, so no
-- include may read them at load time: scheduler/store/scripts.py).  They are the
-- call's, like ctx, but every key a script names is built from BASE, so they
-- stay plain upvalues rather than ctx fields.
local KEYS, ARGV
local BASE, POLICY_KEY, NODES_KEY, STATS_KEY, EXPIRY_KEY, IDX_SEEN, SEEN_KEY
local IDX_SHAPES
-- Bind this call's keys; its per-call state is the ctx returned
-- (includes/ctx.lua), which the loader names `ctx` in every script.
local function bind_call(keys, args)
  KEYS, ARGV = keys, args
  BASE, POLICY_KEY, NODES_KEY, STATS_KEY, EXPIRY_KEY = keys[1], keys[2], keys[3], keys[4], keys[5]
  IDX_SEEN = BASE .. 'idx-seen' -- indexed node -> last heartbeat (includes/index.lua)
  SEEN_KEY = BASE .. 'seen' -- node -> last full heartbeat (the forget sweep, includes/nodes.lua)
  IDX_SHAPES = BASE .. 'idx-shapes' -- (includes/index.lua)
  return new_ctx()
end

local function node_key(id) return BASE .. 'node:' .. id end
local function node_res_key(id) return BASE .. 'node-res:' .. id end
local function node_sbx_key(id) return BASE .. 'node-sbx:' .. id end
local function node_roster_key(id) return BASE .. 'node-roster:' .. id end
local function res_key(id) return BASE .. 'res:' .. id end
local function bind_key(id) return BASE .. 'bind:' .. id end

-- `code`: one of ERR (includes/constants, from scheduler/domain/errors.py).
local function fail(code, message)
  return redis.error_reply(code .. ' ' .. message)
end

-- Corrupt state (an old version's or an operator's write): what names it,
-- "corrupt record node:n1: field sandbox_count is 'abc', not ..." (the words
-- of scheduler/store/replies.py corrupt(), so Lua and Python name it alike).
-- `key`: the full key; `value`: false when the field is missing.
local function corrupt_text(key, field, value, want)
  local is = value and ("is '" .. value .. "', not " .. want) or 'is missing'
  return 'corrupt record ' .. string.sub(key, #BASE + 1) .. ': field ' .. field .. ' ' .. is
    .. '; `schedctl doctor` checks the cell'
end
-- Raised from inside a helper, before the call's first write, as
-- error({ err = ERR.CORRUPT .. ' ' .. corrupt_text(...) }): Redis answers
-- it as it is, with " script: <name>, on @<line>." appended, which
-- scheduler/domain/errors.py takes off (CORRUPT: FAILED_PRECONDITION).

-- Is x (a record's number, tonumber'd) a count or size the scheduler could
-- have written: whole, >= 0, below 10^16?  (NaN and the infinities fail it.)
local function count_ok(x)
  return x ~= nil and x >= 0 and x < 1e16 and x % 1 == 0
end

-- A number as a string that round-trips exactly (tostring keeps 14 digits only).
-- (x % 1, not math.floor: arithmetic, no call; NaN and infinities fail it)
local function fmt(x)
  if x % 1 == 0 and x < 1e15 and x > -1e15 then
    return string.format('%d', x)
  end
  return string.format('%.17g', x)
end

-- A node's stamp lead (the heartbeat's phase "stamp lead", and steady_one):
-- where a stamped heartbeat of the node's instance was taken, on the cell's
-- clock.  Its stamp less the instant heard is the node clock's offset less
-- its transit; the largest seen (the stamp lead, kept on the record per
-- instance in two windows of STAMP_WINDOW_MS, so that a clock stepped or
-- drifting either way is followed within two windows) is the offset less
-- the smallest transit seen.  So stamp - lead is at most the instant heard
-- and at most the smallest transit seen after the snapshot was taken.
-- `cur`, `was`, `at`: the record's stamp_lead, stamp_lead_was and
-- stamp_lead_at (cur nil: a new instance).  The lead, from the instance's
-- second stamped heartbeat on (the first alone is its own transit), or
-- nil; the fields that change planned into hset.
local function stamp_lead(cur, was, at, hset, order, now)
  local sample = (tonumber(order) or 0) - now
  cur, was, at = tonumber(cur), tonumber(was), tonumber(at)
  local k = #hset
  if not cur or not at then
    hset[k + 1], hset[k + 2] = 'stamp_lead', fmt(sample)
    hset[k + 3], hset[k + 4] = 'stamp_lead_at', fmt(now)
    hset[k + 5], hset[k + 6] = 'stamp_lead_was', ''
    return nil
  end
  if now - at >= STAMP_WINDOW_MS or now < at then
    was, cur = cur, sample
    hset[k + 1], hset[k + 2] = 'stamp_lead_was', fmt(was)
    hset[k + 3], hset[k + 4] = 'stamp_lead', fmt(cur)
    hset[k + 5], hset[k + 6] = 'stamp_lead_at', fmt(now)
  elseif sample > cur then
    cur = sample
    hset[k + 1], hset[k + 2] = 'stamp_lead', fmt(cur)
  end
  if was and was > cur then return was end
  return cur
end

-- fmt(x) for an instant of this call (its clock, or the clock plus a TTL):
-- the requests of one call share their instant, so each text is made once.
local function instant_text(ctx, x)
  local instants = ctx[CTX.instants]
  local s = instants[x]
  if s == nil then
    s = fmt(x)
    instants[x] = s
  end
  return s
end

-- Library state kept from call to call (Redis Functions keep a library's
-- state; under EVAL every call starts empty): a table `t` of at most `max`
-- entries, all dropped when full.  Only for values that never go stale, each
-- fully determined by its key.
local function kept_table(max) return { t = {}, n = 0, max = max } end
local function keep(kept, key, value)
  if kept.n >= kept.max then kept.t, kept.n = {}, 0 end
  kept.t[key], kept.n = value, kept.n + 1
  return value
end

-- fmt(x), and a whole number padded to 9 digits, kept: string.format goes
-- through the C library's printf (a pressure's %.17g through its
-- arbitrary-precision one), and the same counts, capacities, loads and
-- pressures come back call after call.  For those, not for clocks or ids.
local TEXT, PADDED = kept_table(4096), kept_table(4096)
local function num_text(x)
  local s = TEXT.t[x]
  if s then return s end
  s = fmt(x)
  if x ~= x then return s end -- (NaN cannot be a key)
  return keep(TEXT, x, s)
end
local function pad9(x)
  return PADDED.t[x] or keep(PADDED, x, string.format('%09d', x))
end
-- tonumber(s), kept the same way (tonumber runs strtod twice): for the
-- counts, capacities and sizes that come back call after call; not for
-- clocks or ids.
local NUMBERS = kept_table(4096)
local function number_of(s)
  local x = NUMBERS.t[s]
  if x then return x end
  x = tonumber(s)
  if x == nil then return nil end
  return keep(NUMBERS, s, x)
end

-- SADD or SREM (`add`) every member of `list`, UNPACK_CHUNK at a time:
-- unpack() of a long table fails past Lua's stack limit (about 8,000).  (Each
-- command is spelled at its call: an ACL refusal names the line, and
-- scheduler/store/acl.py reads the command there.)
local UNPACK_CHUNK = 1000
local function set_all(add, key, list)
  for i = 1, #list, UNPACK_CHUNK do
    local last = i + UNPACK_CHUNK - 1
    if last > #list then last = #list end
    if add then
      redis.call('SADD', key, unpack(list, i, last))
    else
      redis.call('SREM', key, unpack(list, i, last))
    end
  end
end

-- A batch's answer to one call that succeeded: {'ok', r...}, made at its
-- size by unpack() (an insert at the front would grow r), or copied when r
-- is past unpack()'s limit: a CPU config round's "compute" lists every
-- member of the cluster, 2 + 2N values.
local function ok_answer(r)
  if #r <= UNPACK_CHUNK then return { 'ok', unpack(r) } end
  local out = { 'ok' }
  for j = 1, #r do out[j + 1] = r[j] end
  return out
end

-- The policy hash also keeps its fields packed into one string, `packed`,
-- in PACKED order (includes/constants): reading one value and one match
-- costs a fraction of HGETALL.  The named fields stay the truth;
-- repack_policy() (includes/common.lua) rebuilds the packed copy after every
-- write (scripts only: sync_policy, advance_clock).  The policy's fields as
-- text (absent or "" = unset), from the packed copy `packed` when it is of
-- this layout, else from the named fields; nil when the cell has no policy.
local function raw_policy(packed)
  local raw = {}
  local v = packed and {}
  local rest = packed
  for j = 1, v and #PACKED_RES or 0 do
    local got = { string.match(rest, PACKED_RES[j]) }
    if not got[1] then v = nil break end
    if j < #PACKED_RES then rest = table.remove(got) end
    for k = 1, #got do v[#v + 1] = got[k] end
  end
  if v and v[1] then
    for i, name in ipairs(PACKED) do
      if v[i] ~= '' then raw[name] = v[i] end
    end
    return raw
  end
  -- no packed copy, or one packed by an earlier version: the named fields
  local flat = redis.call('HGETALL', POLICY_KEY)
  if #flat == 0 then return nil end
  for i = 1, #flat, 2 do raw[flat[i]] = flat[i + 1] end
  return raw
end

-- Just the clock fields of the policy (nil when the cell has no policy),
-- kept by its packed string as load_policy (includes/common.lua) keeps whole
-- policies (the string is the key: nothing goes stale).
local CLOCKS = kept_table(64)
local function load_clock()
  local packed = redis.call('HGET', POLICY_KEY, 'packed')
  local C = packed and CLOCKS.t[packed]
  if C then return C end
  local raw = raw_policy(packed)
  if raw == nil then return nil end
  C = { time_offset_ms = tonumber(raw.time_offset_ms) or 0,
    frozen_now_ms = tonumber(raw.frozen_now_ms), settle_ms = tonumber(raw.settle_ms),
    report_ttl_ms = tonumber(raw.report_ttl_ms) or 0 }
  if packed then keep(CLOCKS, packed, C) end
  return C
end

-- Redis server time in whole ms, no drill offset: the one reader of TIME's
-- reply (seconds, then microseconds within the second).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Redis server time in ms, plus the cell's drill offset (0 outside drills and
-- tests), or the drill's frozen instant when one is set.
local function now_ms(P)
  if P.frozen_now_ms then return P.frozen_now_ms end
  return server_ms() + P.time_offset_ms
end

-- Must a heartbeat heard at `now` write its node's score in idx-seen (or
-- seen) again, given the score it last wrote there (`written`, the record's
-- idx_seen_ms or seen_ms)?  Only when that lags by more than a quarter of
-- report_ttl (or the clock went back): a score that lags only makes a sweep
-- look at a node early, and the sweep reads the record, the truth, and writes
-- the score anew; a score is never ahead of the node's last heartbeat.  A
-- steady heartbeat is five calls instead of six.
local function seen_lags(written, now, P)
  local w = tonumber(written)
  return w == nil or now < w or now - w > P.report_ttl_ms / 4
end

-- The instant a heartbeat is heard at: now, but never at or before the
-- cell's settle mark (settle-5.lua): a heartbeat ingested after a settle
-- must count as heard since it, even within the same millisecond, where the
-- timestamps alone cannot order the two.
local function heard_ms(P)
  local now = now_ms(P)
  if P.settle_ms and now <= P.settle_ms then now = P.settle_ms + 1 end
  return now
end

-- The node ids one read of a list lists, in node-id byte order: `one` alone
-- when it names a node of the cell (a node that is not: none), else at most
-- `page` nodes after node id `after` ("" = from the first; `page` nil:
-- every node, one call); and the next page's `after` ("" after the last).
local function node_page(one, after, page)
  if one ~= '' then
    return redis.call('ZSCORE', NODES_KEY, one) and { one } or {}, ''
  end
  if not page then return redis.call('ZRANGE', NODES_KEY, 0, -1), '' end
  local ids = redis.call('ZRANGEBYLEX', NODES_KEY, after == '' and '-' or '(' .. after, '+',
    'LIMIT', '0', fmt(page))
  return ids, #ids >= page and ids[#ids] or ''
end
