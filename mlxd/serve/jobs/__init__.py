"""Managed jobs on the server: uploaded files, the job table and its event logs, the job
processes, and the HTTP APIs (`/v1/files`, `/v1/fine_tuning/jobs`, `/v1/jobs`)."""
