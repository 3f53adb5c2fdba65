"""``manage.py demo``: the whole platform under a noisy-neighbour workload, shown live (see README.md)."""
