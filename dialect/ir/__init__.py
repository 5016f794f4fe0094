"""The topos dialect itself: op classes, emission and parsing, IRDL, contexts and diagnostics."""
