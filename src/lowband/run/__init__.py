"""One run: resolve it once (spec), start or resume it (session, runconfig), its K worker processes
(workers starts them, launch supervises them), the one training loop (trainer) and the teams it
trains with: `lowband train`'s fixed ranks (ranks) or an elastic job's worker (elastic_worker, which
meets a quorum between the slices of an epoch's order, elastic_order, writes and resumes from the
job's files, elastic_files, whose epoch records are elastic_records, and meets the faults tests plan,
elastic_faults; elastic_job starts the job); its records (reporter, metrics, loggers), its directory
and checkpoints (rundir, checkpoint, reshard), the learning-rate schedule (schedule); `lowband`
commands run many times, forked from a server that has imported torch (warm). The map of every
folder: docs/ARCHITECTURE.md."""
