"""Launchers that start the replicas of a run (the XLA one here; torchrun/SLURM are scripts in launch/)."""
