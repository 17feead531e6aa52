"""The wire protocol's conformance suite, for actors and learners in any language.

``python -m seedrl.conformance actor -- CMD`` runs an actor command against a scripted
learner (:mod:`~seedrl.conformance.actor_suite`); ``python -m seedrl.conformance learner
HOST:PORT`` runs a scripted actor against a learner (:mod:`~seedrl.conformance.learner_suite`).
Every rule of docs/wire-protocol.md is a named case (:mod:`~seedrl.conformance.cases`)
with a clear failure message, after DeepMind's ``dm_env_rpc`` compliance tests. It
imports neither ``learner`` nor torch: it is the contract, not an implementation of it.
"""
