"""A run's life outside the engine: rows <-> engine state and the one commit of a
transition (store), the written-out reads (rows), export, replay verification, evals."""
