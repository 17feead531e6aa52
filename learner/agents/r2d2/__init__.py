"""The R2D2 agent, ``--agent r2d2``: its knobs in :mod:`.config` (no torch: what parsing a
config reads), the agent in :mod:`.agent`, its network, policy, replay and targets
beside them."""
