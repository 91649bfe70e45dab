"""Training: one run of lowband train or one worker of an elastic job. The one training loop (trainer) and
its teams: who trains together (ranks: lowband train's fixed ranks; elastic: an elastic job's workers);
a run resolved before it starts (spec), its config.toml (runconfig), starting or resuming it (session), and
`lowband` commands forked from a server that has imported torch and lowband (warm, for tuning trials).
See docs/ARCHITECTURE.md."""
