"""What runs inside a job's own processes: its environment (jobenv), the torchrun agent and
its warm workers, the elastic replacement supervisor, the client of the rendezvous service."""
