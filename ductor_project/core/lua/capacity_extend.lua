-- KEYS[1] = the holder's lease record. ARGV[1] = holder id, ARGV[2] = lease (ms).
return cap_extend(KEYS[1], ARGV[1], tonumber(ARGV[2]), cap_now_ms())
