"""Passes over topos IR and StableHLO: the registry, plans and fusion, raising, the lowering table."""
