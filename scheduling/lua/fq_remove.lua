-- Withdraw an item. KEYS[1] = the tenant's items HASH.
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id; ARGV[A + 2] = item id.
-- A waiting item is deleted. An item in flight keeps its lease, but a run again that was
-- asked for while it was in flight is cancelled. Returns 1 when something was withdrawn,
-- else 0.
fq_init(ARGV)
local A = FQ_HEADER
local tid, id = ARGV[A + 1], ARGV[A + 2]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local it = fq_item(tid, id)
if it == nil then return 0 end
if it.state ~= 'waiting' then
  if it.again == nil then return 0 end
  it.again, it.again_payload = nil, nil
  fq_save(tid, id, it)
  return 1
end
local tier, part, key = it.tier, it.partition, it.key or ''
local pkey, parts = fq_pkey(tid, tier, part), fq_parts(tid, tier, key)
redis.call('ZREM', pkey, id)
redis.call('ZREM', fq_tkey(tid, 'wait:' .. tier), id)
local head = redis.call('ZRANGE', pkey, 0, 0, 'WITHSCORES')
if head[1] == nil then
  redis.call('ZREM', parts, part)
elseif redis.call('HEXISTS', fq_tkey(tid, 'locks'), part) == 0 then
  redis.call('ZADD', parts, 'XX', head[2], part)
end
-- A key left without partitions leaves; a tenant left without keys in the tier is forgotten.
if redis.call('ZCARD', parts) == 0 then
  local tag = redis.call('ZSCORE', fq_tkey(tid, 'kready:' .. tier), key)
  if tag then fq_kleave(tid, tier, key, tonumber(tag)) end
  redis.call('ZREM', fq_tkey(tid, 'ktimers:' .. tier), key)
  local keys = redis.call('ZCARD', fq_tkey(tid, 'kready:' .. tier)) + redis.call('ZCARD', fq_tkey(tid, 'ktimers:' .. tier))
  if keys + redis.call('ZCARD', fq_parts(tid, tier, '')) == 0 then fq_forget(tier, tid) end
end
if redis.call('HEXISTS', fq_tkey(tid, 'locks'), part) == 0 then
  local left = 0
  for _, t in ipairs(fq.tiers) do left = left + redis.call('ZCARD', fq_pkey(tid, t, part)) end
  if left == 0 then redis.call('HDEL', fq_tkey(tid, 'pkey'), part) end
end
fq_delete(tid, id)
return 1
