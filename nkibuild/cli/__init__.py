"""Command-line interface: parses options once, renders errors and progress."""
