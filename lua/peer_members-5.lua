--[[
  peer_members-5.lua: the ids of a cluster's P2P member set, the nodes that
  advertise a P2P endpoint there.  A cluster's ListP2pPeers list is this,
  then its rows read a page of ids at a time (peer_list-5.lua with ids), so
  no call reads a large cluster's records at once.  Read-only.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  ARGV[1]     cluster_id

  Returns {ids...} in the set's order (the client sorts what it lists)
]]
-- @include common
return redis.call('SMEMBERS', BASE .. 'p2p:' .. ARGV[1])
