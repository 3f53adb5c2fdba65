-- Move dispatch credits of one Celery queue along: KEYS[1] = its outstanding ZSET, KEYS[2] = its
-- running ZSET, KEYS[3] = its freed-credit signal LIST (dispatchers waiting for a credit BLPOP it).
-- ARGV[1] = 'run': the task started (or still runs): out of outstanding, into running until
--           ARGV[2] seconds from now (Redis TIME);
--           'sent': the credits' messages were published: they stay outstanding, now until
--           ARGV[2] seconds from now (a credit already seen running stays running);
--           'free': the task finished: out of both sets, and one signal when that freed anything;
--           'unused': a dispatcher gives back credits it did not use: out of both, no signal
--           (the only dispatcher it could wake would be itself).
-- ARGV[3..] = the credits. Returns how many credits were freed ('free', 'unused'), newly
-- counted as running ('run') or kept outstanding longer ('sent').
local changed = 0
if ARGV[1] == 'run' or ARGV[1] == 'sent' then
  local t = redis.call('TIME')
  local expiry = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[2]))
  for i = 3, #ARGV do
    if ARGV[1] == 'run' then
      redis.call('ZREM', KEYS[1], ARGV[i])
      changed = changed + redis.call('ZADD', KEYS[2], expiry, ARGV[i])
    else
      changed = changed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
    end
  end
  return changed
end
for i = 3, #ARGV do
  changed = changed + redis.call('ZREM', KEYS[1], ARGV[i]) + redis.call('ZREM', KEYS[2], ARGV[i])
end
if changed > 0 and ARGV[1] == 'free' then
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, 0)
end
return changed
