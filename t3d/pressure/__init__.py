"""Memory pressure: how short the host is on memory, which agents use the most (issue 9)."""
