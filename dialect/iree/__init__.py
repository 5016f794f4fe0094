"""IREE: targets, the compile cache, compiling and calling modules, export and conformance."""
