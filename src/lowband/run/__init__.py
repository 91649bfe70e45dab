"""One run: resolve it once (spec), start or resume it (session, runconfig), its K worker processes
(workers starts them, launch supervises them), the training loop (trainer), its records (reporter,
metrics, loggers), its directory and checkpoints (rundir, checkpoint, reshard), the learning-rate
schedule (schedule), and elastic jobs whose workers come and go (elastic_job starts them;
elastic_worker drives the rounds around an epoch's order, elastic_order, writes and resumes from the
job's files, elastic_files, whose epoch records are elastic_records, and meets the faults tests plan,
elastic_faults); `lowband` commands run many times, forked from a server that has imported torch
(warm). The map of every folder: docs/ARCHITECTURE.md."""
