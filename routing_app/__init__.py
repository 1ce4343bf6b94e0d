"""Model catalogue, topology epochs, route enumeration, route statistics and choice."""
