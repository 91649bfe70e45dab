"""A run's files and processes, which the training layer, methods and services use: its directory and
checkpoints (rundir, checkpoint, reshard), its K worker processes (workers starts them, launch watches
them), its records (reporter, metrics, loggers) and the learning-rate schedule (schedule). Training
itself (the loop, its teams, elastic jobs) is lowband.training's. The map of every folder:
docs/ARCHITECTURE.md."""
