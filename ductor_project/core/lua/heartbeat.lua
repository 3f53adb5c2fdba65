-- One process's heartbeat, stamped with Redis TIME (one clock for every machine).
-- KEYS[1] = the kind's ZSET (process -> last beat, ms); ARGV[1] = the process name;
-- ARGV[2] = forget beats older than this (ms). Returns the stamp.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return now
