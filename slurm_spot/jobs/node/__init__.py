"""Prolog, TaskProlog and Epilog: run by slurmd on each node of a job (Prolog and Epilog as
root, TaskProlog as the job user)."""
