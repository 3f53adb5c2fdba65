"""The example shop project (run from this directory: ``shop_project`` and ``shop`` are top-level there)."""
