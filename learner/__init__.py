"""Learner, in three rooms: `algorithms` (pure tensor math), `config` (the arms and shared
settings), `runtime` (loop, step, checkpoints); `vocabulary` holds the names all three share."""
