"""Package (being implemented)."""
