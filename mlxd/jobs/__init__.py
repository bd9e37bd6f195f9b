"""Managed jobs that run in a process of their own: fine-tuning a LoRA adapter and quantizing a
model. The server queues and supervises them (serve/jobs/); this package is what the job process
runs: one driver per kind, reporting through `Reporter`."""
