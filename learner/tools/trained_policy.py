"""The old home of :class:`learner.agents.trained_policy.Policy`, kept so notebooks,
tests and benchmarks that import it from here go on working."""

from learner.agents.trained_policy import Policy, model_spec_from_dict

__all__ = ["Policy", "model_spec_from_dict"]
