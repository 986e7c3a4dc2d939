"""`parley bench …`: commands that print figures (speed, memory, quality, reliability), never tests."""
