"""Self-play on the learner: a pool of frozen past selves, their ratings, scripted
opponents and the two-player evaluation (docs/self-play.md)."""
