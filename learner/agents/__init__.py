"""Agents: what differs between learning algorithms (network heads, action choice, what
is kept for training, the loss)."""
