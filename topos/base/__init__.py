"""The base: what every layer stands on (errors, element types, reference math, files, argument checks)."""
