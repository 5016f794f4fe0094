"""The readings: every way of reading a sealed spec (oracle, reverse and forward mode, plans)."""
