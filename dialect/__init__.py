"""The topos MLIR dialect, its passes and the StableHLO lowering (imported as ``topos.dialect``).

Nothing here is imported by ``import topos``: the core stays pure NumPy and
loads MLIR only when a user asks for emission.
"""
