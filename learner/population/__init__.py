"""Population-based training in one learner (docs/pbt.md): the members' share of the env
slots (:mod:`.assignment`), exploit and explore on schedule (:mod:`.pbt`), and the
lineage plot (:mod:`.lineage`)."""
