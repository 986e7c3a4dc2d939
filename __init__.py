"""Parley: a local chat app for LLMs on your own machine."""

__version__ = "0.1.0"
