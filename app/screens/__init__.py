"""Screens of the chat app: first run, help, history, dialogs."""
