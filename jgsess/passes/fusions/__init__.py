"""Fusions: one file each, holding its patterns, guard and replacement."""
