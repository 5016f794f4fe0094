"""The spec: the closed vocabulary of opcodes, recording, and the sealed network it produces."""
