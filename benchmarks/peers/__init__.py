"""Peers run as their own docs run them, each in its own environment."""
