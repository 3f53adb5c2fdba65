-- Return the items whose lease has ended (their worker died or stalled) to their
-- partitions, at their old due time so the partition keeps its order. Their capacity slots
-- were freed by the lease's end already; the partitions are unlocked. Each is charged its lease.
-- KEYS[1] = the shard's inflight ZSET. ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = at most this many.
-- Returns how many items were returned.
fq_init(ARGV)
local A = FQ_HEADER
local inflight = fq_gkey('inflight')
local count = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', inflight, '-inf', fq.now, 'LIMIT', 0, tonumber(ARGV[A + 1]))) do
  redis.call('ZREM', inflight, member)
  local tid, id = fq_split(member)
  local it = fq_in_flight(tid, id, '')
  if it ~= nil then
    fq_settle(tid, it, it.at and (it.lease - it.at / 1000))
    fq_end_lease(tid, id, it)
    fq_requeue(tid, id, it, it.due)
    fq_unlock(tid, it.partition)
    fq_unblock(tid)
    count = count + 1
  end
end
return count
