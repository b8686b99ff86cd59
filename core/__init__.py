"""Bottom layer: errors, name registries, atomic file writes, checkpoint reading (imports nothing of ours)."""
