"""One run: start or resume it (session), its K worker processes (launch), the training loop
(trainer), its records (reporter, metrics, loggers), its directory and checkpoints (rundir,
checkpoint, reshard) and the learning-rate schedule (schedule)."""
