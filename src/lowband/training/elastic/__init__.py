"""Elastic jobs: workers that leave and join while the job trains. Starting, joining and watching a job
(job), one worker as the trainer's team (worker), an epoch's order cut into slices (order), the data plan
that hands them out round by round (plan), the job's files and how a worker resumes from them (files),
its records and checkpoint (records), faults a test plans (faults). Who meets at an outer step is
comm/elastic_quorum.py's. See docs/ARCHITECTURE.md."""
