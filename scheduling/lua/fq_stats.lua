-- One tenant's queue, read only. KEYS[1] = the tenant's items HASH.
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant id. Returns per tier (in fq.tiers order):
-- {tier, waiting, due now, in flight, age of the oldest due item (ms)}.
fq_init(ARGV)
local A = FQ_HEADER
local tid = ARGV[A + 1]
local fenced = fq_fenced(tid)
if fenced then return fenced end
local flight = fq_tkey(tid, 'flight')
local out = {}
for _, tier in ipairs(fq.tiers) do
  local wait = fq_tkey(tid, 'wait:' .. tier)
  local oldest = redis.call('ZRANGE', wait, 0, 0, 'WITHSCORES')
  local age = 0
  if oldest[2] ~= nil then age = math.max(0, fq.now - tonumber(oldest[2])) end
  out[#out + 1] = {tier, redis.call('ZCARD', wait), redis.call('ZCOUNT', wait, '-inf', fq.now),
    tonumber(redis.call('HGET', flight, tier)) or 0, age}
end
return out
