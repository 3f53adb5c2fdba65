-- Withdraw an item. KEYS[1] = the tenant's items HASH.
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id; ARGV[A + 2] = item id.
-- A waiting item is deleted. An item in flight keeps its lease, but a run again that was
-- asked for while it was in flight is cancelled. Returns 1 when something was withdrawn,
-- else 0.
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local it = fq_item(tid, id)
if it == nil then return 0 end
if it.state ~= 'waiting' then
  if it.again == nil then return 0 end
  it.again, it.again_payload = nil, nil
  fq_save(tid, id, it)
  return 1
end
local tier, part = it.tier, it.partition
local pkey, parts = fq_pkey(tid, tier, part), fq_tkey(tid, 'parts:' .. tier)
fq_delete(tid, id)
redis.call('ZREM', pkey, id)
redis.call('ZREM', fq_tkey(tid, 'wait:' .. tier), id)
local head = redis.call('ZRANGE', pkey, 0, 0, 'WITHSCORES')
if head[1] == nil then
  redis.call('ZREM', parts, part)
elseif redis.call('HEXISTS', fq_tkey(tid, 'locks'), part) == 0 then
  redis.call('ZADD', parts, 'XX', head[2], part)
end
if redis.call('ZCARD', parts) == 0 then fq_forget(tier, tid) end
return 1
