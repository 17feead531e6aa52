"""What the learner keeps: trajectory slots and unrolls, checkpoints, normalisers, statistics."""
