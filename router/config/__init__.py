"""Configuration, the ground floor: settings, presets, policies.

Imports nothing of ours above it.
"""
