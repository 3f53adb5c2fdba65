-- KEYS[1] = the limiter's TAT. ARGV[1] = emission interval (µs), ARGV[2] = burst,
-- ARGV[3] = cost, ARGV[4] = "1" to consume, "0" to peek. KEYS[2] = the tenant's fence.
local fenced = fence_check(KEYS[2])
if fenced then return fenced end
return cap_gcra(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1', cap_now_us())
