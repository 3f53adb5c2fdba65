-- KEYS[1] = the holder's lease record. ARGV[1] = holder id.
return cap_release(KEYS[1], ARGV[1], cap_now_ms())
