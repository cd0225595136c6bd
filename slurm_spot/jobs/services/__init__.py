"""Long-running services that jobs connect to, on a machine that is not reclaimed: the
rendezvous service of elastic jobs and its store, the torchft lighthouse."""
