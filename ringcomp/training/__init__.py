"""The training wing: the trainer, its options, engine, planning, timing and checkpoints."""
