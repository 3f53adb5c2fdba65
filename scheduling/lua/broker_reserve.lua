-- Reserve dispatch credits for several Celery queues in one atomic step, so that any number of
-- dispatchers together never publish more than a queue's live worker slots plus the buffer.
-- For queue i (1..n): KEYS[3i-2] = its workers ZSET ("<worker>/<pid>|<slots>" -> registration expiry),
-- KEYS[3i-1] = its outstanding ZSET (credit -> expiry: published, not yet seen running),
-- KEYS[3i] = its running ZSET (credit -> expiry: running, renewed with the item's lease);
-- KEYS[3n+1] = the credit sequence STRING.
-- ARGV[1] = buffer; ARGV[2] = lifetime of a new credit (s); then per queue, in KEYS order:
-- the credits wanted, the number g of credits given back, and those g credits (a dispatcher's
-- unused ones: they are freed first, in the same step, so holding them costs no extra call).
-- Scores are seconds of Redis TIME; expired entries (a crashed worker's, a lost message's) are
-- dropped first. Returns, per queue, the credits taken (new members of its outstanding set):
-- at most slots + buffer - (outstanding + running), and at most what was wanted.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local buffer, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = (#KEYS - 1) / 3
local taken = {}
local a = 3
for i = 1, n do
  local workers, outstanding, running = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local want, given = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  for j = a + 2, a + 1 + given do
    redis.call('ZREM', outstanding, ARGV[j])
  end
  a = a + 2 + given
  local credits = {}
  if want > 0 then
    redis.call('ZREMRANGEBYSCORE', workers, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', outstanding, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
    local slots = 0
    for _, member in ipairs(redis.call('ZRANGE', workers, 0, -1)) do
      slots = slots + (tonumber(string.match(member, '|(%d+)$')) or 0)
    end
    local free = slots + buffer - redis.call('ZCARD', outstanding) - redis.call('ZCARD', running)
    for _ = 1, math.min(want, free) do
      local credit = tostring(redis.call('INCR', KEYS[#KEYS]))
      redis.call('ZADD', outstanding, string.format('%.6f', now + ttl), credit)
      credits[#credits + 1] = credit
    end
  end
  taken[i] = credits
end
return taken
