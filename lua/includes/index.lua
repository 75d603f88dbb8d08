--[[
  includes/index.lua: the least-loaded index, so a decision looks at few nodes.

  Nodes whose every decision input is identical are interchangeable: same
  shape (cpu, memory capacity), same allocated / paused / pending load, same
  running / starting / paused / pending counts.  Such nodes form a bucket:

    <base>idx-bucket:<bucket>  zset  node ids, all scored 0 (byte order = rotation order)
    <base>idx-cpu:<C>:<M>      zset  bucket ids of shape C:M scored by CPU load Lc
    <base>idx-mem:<C>:<M>      zset  the same buckets scored by memory load Lm
    <base>idx-shapes           set   shapes that have (or lately had) buckets
    <base>idx-seen             zset  indexed node -> last heartbeat (ms), for the stale sweep

  The bucket id spells its inputs, ranking counts first:
  "SSSSSSSSSRRRRRRRRRPPPPPPPPP:C:M:Lc:Lm:acpu:rcpu:amem:rmem:start:pending"
  (starting incl. pending, running, paused, 9 digits each; Lc and Lm are
  allocated + paused + pending).  So a bucket is evaluated by the same
  stages as a node without reading any node, its pressure is screened from
  C:M:Lc:Lm alone, and among buckets of equal load a zset's byte order is
  rank order.  Only nodes that are schedulable whatever the request (status
  READY or CONNECTING, an endpoint, observed-utilisation ceilings met) are
  indexed; the node record's `idx` field names its bucket, and the policy's
  index_format names the layout (a Schedule reads no other layout).

  The scan (pick_indexed) walks all shapes at once, least lower bound first,
  while a bucket could still match the best found.  Per shape it follows the
  dimension where the request weighs more: (L + requested) / capacity is
  exactly that dimension's projected share, and pressure is never below it,
  so a stream ends when that bound passes the best pressure, or when at the
  best pressure a bucket's counts rank after the best's.  Stale nodes left
  after a bounded sweep are picked around (a pick is checked against its
  record; a stale one leaves with its bucket's stale members, a bounded
  number of times); any other doubt (every pick stale, nothing eligible
  while rebuilding, a chosen node whose record is not in the buckets it was
  chosen among) falls back to the full scan, which is the truth.

  The index is three includes: index_bucket (the bucket codec),
  index_moves (its upkeep) and index_pick (the pick); this one names them,
  for what decides (includes/schedule.lua) and what moves nodes.
]]
-- @exports
-- @include index_moves
-- @include index_pick
