"""How the admin writes dates and times (``FORMAT_MODULE_PATH``): ISO 8601's order, and a time names its
zone (``2026-12-07 14:05:09 UTC``), where Django's English default (``Dec. 7, 2026, 2:05 p.m.``)
said neither which zone nor the seconds that tell two attempts apart."""
