"""Interop: the same plan on other engines (XLA through jax), and arrays exchanged with jax and torch.

Nothing here is imported by ``import topos``; each module imports its
peer (jax, torch) only when called, and names the package to install
when it is missing.

``topos.interop.jax.to_jax(plan)``: the plan's StableHLO, unchanged, as a jax callable on XLA (docs/scale-out.md).
"""
