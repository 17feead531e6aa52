"""The SAC agent, ``--agent sac``: its knobs in :mod:`.config` (no torch: what parsing a
config reads), the agent in :mod:`.agent`, its networks, head and losses beside them."""
