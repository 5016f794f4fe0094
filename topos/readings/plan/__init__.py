"""Entries and plans: declared reads (entry), postures and fast kernels (numerics), the schedule and
liveness (plan), who serves each node (tally), and the fusion catalog (patterns)."""
