--[[
  includes/peers.lua: the P2P peer filter of peer_list's rows (ListP2pPeers,
  and the holders LookupP2pArtifact's first step, artifact_lookup, lists).

  A peer is a node that is READY (status derived with Redis time), advertises
  a non-empty P2P address, and matches the cluster / backend filters when
  they are given ("" = any).
]]
-- @exports peer_row
-- @include stages

-- What a peer row reads of a node: its P2P fields and what its status is
-- derived from (a layout)
-- @layout PEER_READ
local PEER_READ = { 'cluster_id', 'p2p_backend', 'p2p_address', 'last_seen_ms', 'lingering',
  'status' }

-- {node_id, backend, address} when `id` passes the filter, else nil.  (One
-- read of six fields: a cluster's list reads every member, and a node asks
-- for it every few seconds.)
local function peer_row(id, P, now, cluster, backend, exclude)
  if id == exclude then return nil end
  local v = redis.call('HMGET', node_key(id), unpack(PEER_READ))
  if not v[PEER_READ.p2p_address] or v[PEER_READ.p2p_address] == '' then return nil end
  if cluster ~= '' and v[PEER_READ.cluster_id] ~= cluster then return nil end
  if backend ~= '' and v[PEER_READ.p2p_backend] ~= backend then return nil end
  local status = status_of(v[PEER_READ.last_seen_ms], v[PEER_READ.lingering],
    v[PEER_READ.status], P, now)
  if status ~= 'READY' then return nil end
  return { id, v[PEER_READ.p2p_backend] or '', v[PEER_READ.p2p_address] }
end
