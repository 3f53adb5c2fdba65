-- A shard's queue across its tenants, read only (the metrics). KEYS[1] = the shard's backlog ZSET.
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1], ARGV[A + 2] = the ranks (first, last) of the tenants of
-- the backlog index to sum (a scrape reads a large shard in several calls, none of them long);
-- ARGV[A + 3] = how many of the largest tenants to name (0: none).
-- Returns {per tier {tier, waiting, due now, in flight, earliest due of a waiting item or -1},
-- tenants summed, tenants in the index, now, the largest tenants {id, waiting, due, in flight}}.
fq_init(ARGV)
local A = FQ_HEADER
local first, last, top = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local index = fq_gkey('backlog')

local function tenant_tiers(tid)
  local flight = fq_tkey(tid, 'flight')
  local rows = {}
  for i, tier in ipairs(fq.tiers) do
    local wait = fq_tkey(tid, 'wait:' .. tier)
    local oldest = redis.call('ZRANGE', wait, 0, 0, 'WITHSCORES')
    rows[i] = {redis.call('ZCARD', wait), redis.call('ZCOUNT', wait, '-inf', fq.now),
      tonumber(redis.call('HGET', flight, tier)) or 0, tonumber(oldest[2]) or -1}
  end
  return rows
end

local sums = {}
for i, tier in ipairs(fq.tiers) do sums[i] = {tier, 0, 0, 0, -1} end
local tenants = redis.call('ZRANGE', index, first, last)
for _, tid in ipairs(tenants) do
  for i, row in ipairs(tenant_tiers(tid)) do
    local s = sums[i]
    s[2], s[3], s[4] = s[2] + row[1], s[3] + row[2], s[4] + row[3]
    if row[4] >= 0 and (s[5] < 0 or row[4] < s[5]) then s[5] = row[4] end
  end
end

local largest = {}
if top > 0 then
  for _, tid in ipairs(redis.call('ZREVRANGE', index, 0, top - 1)) do
    local waiting, due, flight = 0, 0, 0
    for _, row in ipairs(tenant_tiers(tid)) do
      waiting, due, flight = waiting + row[1], due + row[2], flight + row[3]
    end
    largest[#largest + 1] = {tid, waiting, due, flight}
  end
end
return {sums, #tenants, redis.call('ZCARD', index), fq.now, largest}
