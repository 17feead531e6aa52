"""The V-trace agent, ``--agent vtrace``: its knobs in :mod:`.config` (no torch: what
parsing a config reads), the agent in :mod:`.agent`, its targets and loss beside them."""
