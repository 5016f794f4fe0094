"""The views: what shows a reading to a person (drawings, notebook cards, bisect, backends)."""
