"""Keyed state: immutable versioned files per key group, their encoding, and the files a
checkpoint references (backend)."""
