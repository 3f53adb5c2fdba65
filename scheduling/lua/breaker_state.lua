-- Circuit breaker states and live leases of routing candidates, in one round trip.
-- KEYS: for each candidate i, KEYS[2i-1] = its breaker hash, KEYS[2i] = its capacity ZSET.
-- ARGV[1] = failures that open a breaker.
-- Returns a flat array: state (0 closed, 1 open, 2 half-open), live leases, per candidate.
local threshold = tonumber(ARGV[1])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local failures = tonumber(redis.call('HGET', KEYS[i], 'failures') or '0')
  local state = 0
  if failures >= threshold then
    local until_ms = tonumber(redis.call('HGET', KEYS[i], 'open_until') or '0')
    if now_ms < until_ms then state = 1 else state = 2 end
  end
  out[#out + 1] = state
  out[#out + 1] = redis.call('ZCOUNT', KEYS[i + 1], now_ms + 1, '+inf')
end
return out
