-- Record the outcome of a call through a connection.
-- KEYS[1] = the breaker hash, KEYS[2] = the tenant's fence (fence_lib.lua). ARGV[1] = 1 success /
-- 0 failure, ARGV[2] = threshold, ARGV[3] = cooldown in ms, ARGV[4] = key TTL in seconds.
-- A success closes the breaker. The threshold-th consecutive failure opens it for the
-- cooldown; a failure while half-open (cooldown over) opens it again.
-- Returns the state after the call: 0 closed (and it was closed), -1 closed by this success
-- (it had been open), or the time (ms) until which it is open.
local fenced = fence_check(KEYS[2])
if fenced then return fenced end
if ARGV[1] == '1' then
  local was_open = redis.call('HEXISTS', KEYS[1], 'open_until')
  redis.call('DEL', KEYS[1])
  if was_open == 1 then return -1 end
  return 0
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if failures >= tonumber(ARGV[2]) then
  local open_until = now_ms + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'open_until', open_until)
  return open_until
end
return 0
