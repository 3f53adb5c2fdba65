-- An item's work is done. KEYS[1] = the tenant's items HASH.
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id; ARGV[A + 2] = item id; ARGV[A + 3] = the delivery
-- token, or "" for whichever delivery is in flight; ARGV[A + 4] = the work it did (ms, measured by its
-- worker), or "" for its time in flight.
-- Ends the lease, gives the capacity slot back and unlocks the partition. The item is
-- deleted, unless it was enqueued again while in flight: then it waits again, its failures in a
-- row (`fails`, counted by fq_nack) cleared.
-- Returns 1, or 0 (changing nothing) when that item is not in flight.
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local it = fq_in_flight(tid, id, ARGV[A + 3])
if it == nil then return 0 end
fq_settle(tid, it, tonumber(ARGV[A + 4]))
fq_end_lease(tid, id, it)
if it.again ~= nil then
  it.fails = nil
  fq_requeue(tid, id, it, it.again)
else
  fq_delete(tid, id)
end
fq_unlock(tid, it.partition)
fq_unblock(tid)
return 1
