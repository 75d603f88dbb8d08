--[[
  schedule-5.lua: select a node and, for creations, reserve room on it.

  One atomic decision over the whole cell: sweep due expiries, evaluate the
  nodes through the stages of includes/stages.lua (status, ceilings after the
  placement, capacity), pick by strategy, reserve.  least_loaded reads the
  placement index, round_robin and random a bounded walk or sample
  (includes/schedule.lua SPREAD); the full scan decides when they cannot,
  but for least_loaded on a fleet of at most FULL_SCAN_MAX nodes only
  (larger: BEHIND, retry while the index catches up).

  KEYS[1..5]  base, policy, nodes, stats, expiry (see includes/base.lua)
  KEYS[6]     rr: the cell's round-robin counter
  ARGV[1]     kind: "create" (reserve cpu, memory and one sandbox) or
              "route" (rank only; no reservation, no capacity test)
  ARGV[2]     dry_run: "1" = explain, write nothing (not even the sweep)
  ARGV[3]     strategy override, "" = the policy's
  ARGV[4]     cpu requested (whole CPUs), "" = absent (policy default_cpu)
  ARGV[5]     memory_bytes requested, "" = absent (policy default_memory_bytes)
  ARGV[6]     reservation_id to create (kind "create", not dry run); an id that
              exists already answers its placement again (an idempotent retry)
  ARGV[7]     random: a uniform random number in [0, 1) for strategy "random"
  ARGV[8]     locality ("" or absent = none; includes/locality.lua): the
              group's sha1 (template or first image, "" = none), a newline,
              then per requirement "weight\tsize_bytes\tsha1(key)\n"

  Returns (decision): {node_id, endpoint, reservation_id or "", pressure,
                       cpu, memory_bytes, status, now_ms[, warmth, pull_bytes]}
                      (the last two with locality on and a locality ARGV)
  Returns (dry run):  {now_ms, strategy, chosen id or "", rotation (rr value
                       used), cpu, memory_bytes, refusal message or "", verdict...}
                      verdict = {id, status, reason or "", pressure, known 1/0,
                       starting, running, paused, projected_cpu,
                       projected_memory, cpu_capacity, memory_capacity, endpoint[,
                       coverage, bonus, locality: why a warm node lost or ""]}
  Errors: BADARG <field> ..., NO_NODES no nodes available: 0/N ..., BEHIND no
          decision without reading all N nodes ... (least_loaded, the index
          catching up: nothing reserved), NO_POLICY (no policy),
          PRECONDITION (the reservation id was cancelled before this call ran)
  Writes: res:<id>, node-res:<node>, expiry, node:<node> pending_*, stats, rr,
          rr-cursor (strategy round_robin: the node chosen);
          with locality: node-loc:<node>, aff:<group> (includes/locality.lua)
]]
-- @include schedule
return schedule_one(ctx, KEYS[6], ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4], ARGV[5], ARGV[6],
  tonumber(ARGV[7]), ARGV[8])
