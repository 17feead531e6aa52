"""Commands around a run: the demo, evaluation of a checkpoint, plots, local actors."""
